/*
 * cmd_summary.c -- `memsnap summary FILE`: per-device figures of a
 * snapshot.
 *
 * Definitions (the test recomputes the first group with Python's pickle):
 *   segments         segments of the device
 *   reserved_bytes   sum of segment total_size
 *   allocated_bytes  sum of sizes of active_allocated blocks
 *   active_bytes     sum of sizes of active_allocated + active_pending_free
 *   requested_bytes  sum of requested_size of those active blocks
 *   blocks           number of blocks of the device's segments
 *   trace_entries    length of device_traces[device] (0 when absent)
 * and, from the trace: entries by action, the time span, the peak of
 * allocated memory (in requested bytes: what the trace records) and of
 * reserved memory, both starting from the state at the start of the trace:
 * the final figures (requested bytes of active blocks, reserved bytes)
 * minus the trace's net effect, so one pass over the trace gives them.  Sites are the innermost user
 * frame (cli_site) of the stack the resolver of cli_stacks.c gives a live
 * block (its own frames, its 2.0 history, or its live alloc entry in the
 * trace); blocks that predate the trace are counted in live_before_trace.
 * The text form prints allocator_settings as key=value items
 * (cli_settings_items) and record_function ranges counted per name.
 * Fragmentation (final state and at the peak) and the explanation of the
 * last OOM come from cli_explain.c.
 */
#include <limits.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define TOPN_DEFAULT 10

typedef struct live_blk_s {
  uint32_t block;
  uint64_t addr; /* recorded or computed (2.0) address */
  cli_site_t site;
} live_blk_t;

typedef struct dev_fig_s {
  int64_t device;
  uint64_t segments, large, reserved, allocated, active, requested, blocks;
  uint64_t by_state[4];
  uint64_t trace_entries;
  uint64_t by_action[MSNAP_ACTION_COUNT + 1];
  bool have_time;
  int64_t t0, t1;
  uint64_t peak_alloc, peak_reserved;
  bool have_peak;
  /* entries the history ring dropped before the trace's first
   * (allocator_settings' trace_alloc_dropped[device]: memsnap's files);
   * -1 unknown */
  int64_t dropped;
  /* largest live allocations: block indexes and sites */
  live_blk_t *largest;
  uint32_t nlargest;
  cli_site_sum_t *sites;
  uint32_t nsites;
  /* live blocks allocated before the first trace entry */
  uint64_t before_bytes, before_count;
  /* fragmentation and the OOM (cli_explain.c) */
  cli_explain_t x;
  /* final segments starting inside the one before them (a segment list
   * written twice, say): the figures above count that memory twice */
  uint32_t overlapping;
} dev_fig_t;

static bool count_overlap(void *arg, uint32_t prev, uint32_t next) {
  (void)arg, (void)prev, (void)next;
  return true;
}

static const msnap_snap_t *g_sort_snap;

static int cmp_block_size(const void *a, const void *b) {
  const live_blk_t *p = a, *q = b;
  const msnap_sblock_t *x = &g_sort_snap->blocks[p->block];
  const msnap_sblock_t *y = &g_sort_snap->blocks[q->block];
  if (x->size != y->size)
    return x->size > y->size ? -1 : 1;
  return p->addr < q->addr ? -1 : p->addr > q->addr;
}

static int cmp_site(cli_site_t x, cli_site_t y) {
  if (x.frame != y.frame)
    return x.frame < y.frame ? -1 : 1;
  return x.via < y.via ? -1 : x.via > y.via;
}

static int cmp_site_frame(const void *a, const void *b) {
  return cmp_site(((const cli_site_sum_t *)a)->site,
                  ((const cli_site_sum_t *)b)->site);
}

/* Figures of one device; the caller frees f->largest and f->sites. */
static int device_figures(const msnap_snap_t *s, const cli_stacks_t *stk,
                          int64_t dev, dev_fig_t *f, uint32_t topn) {
  memset(f, 0, sizeof *f);
  f->device = dev;
  uint32_t nlive = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    f->segments++;
    f->large += g->is_large != 0;
    f->reserved += g->total_size;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      f->blocks++;
      f->by_state[b->state <= 3 ? b->state : 3]++;
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED) {
        f->allocated += b->size;
        nlive++;
      }
      if (cli_block_active(b)) {
        f->active += b->size;
        f->requested += b->requested_size;
      }
    }
  }
  int ov = cli_segment_overlaps(s, dev, count_overlap, NULL);
  if (ov < 0)
    return -1;
  f->overlapping = (uint32_t)ov;
  /* Live allocations, largest first, and their sites. */
  live_blk_t *idx = malloc((nlive + 1) * sizeof *idx);
  cli_site_sum_t *sites = malloc((nlive + 1) * sizeof *sites);
  if (!idx || !sites) {
    free(idx);
    free(sites);
    return -1;
  }
  uint32_t n = 0;
  for (cli_bwalk_t it = cli_bwalk(s, dev); n < nlive && cli_bwalk_next(&it);) {
    const msnap_sblock_t *b = it.b;
    if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
      continue;
    idx[n].block = (uint32_t)(b - s->blocks);
    idx[n].addr = it.addr;
    idx[n].site = cli_stacks_site(stk, dev, it.addr, b);
    sites[n].site = idx[n].site;
    sites[n].bytes = b->size;
    sites[n].count = 1;
    n++;
  }
  g_sort_snap = s;
  qsort(idx, n, sizeof *idx, cmp_block_size);
  f->largest = idx;
  f->nlargest = topn == 0 || n < topn ? n : topn;
  qsort(sites, n, sizeof *sites, cmp_site_frame);
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (m > 0 && cli_site_eq(sites[m - 1].site, sites[i].site)) {
      sites[m - 1].bytes += sites[i].bytes;
      sites[m - 1].count++;
    } else {
      sites[m++] = sites[i];
    }
  }
  cli_site_sums_rank(s, sites, m);
  f->sites = sites;
  f->nsites = topn == 0 || m < topn ? m : topn;
  for (uint32_t i = 0; i < m; i++)
    if (sites[i].site.frame == CLI_SITE_BEFORE_TRACE) {
      f->before_bytes = sites[i].bytes;
      f->before_count = sites[i].count;
    }

  /* Trace figures, in one pass: entries by action, the time span, and
   * the peaks.  The state at the start of the trace is the final one
   * minus the trace's net effect (start = final - sum of deltas), so
   * peak = start + the highest prefix sum of the deltas; no replay. */
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  if (tl && tl->n) {
    f->trace_entries = tl->n;
    __int128 da = 0, dr = 0, ma = 0, mr = 0; /* sums, highest prefixes */
    uint32_t last_attr = UINT32_MAX;
    bool timed = false;
    for (uint32_t i = 0; i < tl->n; i++) {
      const msnap_strace_t *e = &tl->v[i];
      f->by_action[e->action < MSNAP_ACTION_COUNT ? e->action
                                                  : MSNAP_ACTION_COUNT]++;
      if (e->attr != last_attr) {
        last_attr = e->attr;
        timed = (msnap__tattr(s, e)->keys & MSNAP_K_TIME) != 0;
      }
      if (timed) {
        if (!f->have_time) {
          f->t0 = e->time_us;
          f->have_time = true;
        }
        f->t1 = e->time_us;
      }
      switch (cli_workspace_synthetic(tl, i) ? MSNAP_ACTION_COUNT
                                             : e->action) {
      case MSNAP_ACTION_ALLOC: da += e->size; break;
      case MSNAP_ACTION_FREE_COMPLETED: da -= e->size; break;
      case MSNAP_ACTION_SEGMENT_ALLOC:
      case MSNAP_ACTION_SEGMENT_MAP: dr += e->size; break;
      case MSNAP_ACTION_SEGMENT_FREE:
      case MSNAP_ACTION_SEGMENT_UNMAP: dr -= e->size; break;
      default: break;
      }
      if (da > ma)
        ma = da;
      if (dr > mr)
        mr = dr;
    }
    __int128 pa = (__int128)f->requested - da + ma;
    __int128 pr = (__int128)f->reserved - dr + mr;
    f->peak_alloc = pa < 0 ? 0 : pa > UINT64_MAX ? UINT64_MAX : (uint64_t)pa;
    f->peak_reserved =
        pr < 0 ? 0 : pr > UINT64_MAX ? UINT64_MAX : (uint64_t)pr;
    /* (a trace where nothing is allocated or freed -- a lone `snapshot`
     * entry -- has no peaks: the final state is all it says) */
    f->have_peak = cli_trace_moves(tl);
  }
  f->dropped = -1;
  const msnap_gv_t *dl =
      cli_gv_get(s, &s->allocator_settings, "trace_alloc_dropped");
  if (dl && dl->kind == MSNAP_GV_LIST && dev >= 0 &&
      (uint64_t)dev < dl->u.seq.n &&
      dl->u.seq.items[dev].kind == MSNAP_GV_INT &&
      dl->u.seq.items[dev].u.i >= 0)
    f->dropped = dl->u.seq.items[dev].u.i;
  return 0;
}

static const char *state_names[4] = {"inactive", "active_allocated",
                                     "active_pending_free", "other"};

/* fragmentation: the final state's figures, and the same at the peak. */
static void json_fragmentation(cli_json_t *j, const cli_explain_t *x) {
  cj_key(j, "fragmentation");
  cj_obj(j);
  cli_frag_json_fields(j, &x->final);
  cj_key(j, "peak_state");
  cj_u64_or_null(j, x->have_peak_state, x->peak_state);
  cj_key(j, "at_peak");
  if (x->have_at_peak) {
    cli_frag_json(j, &x->at_peak);
  } else {
    cj_null(j);
  }
  cj_key(j, "at_peak_source");
  if (x->have_at_peak)
    cj_cstr(j, x->peak_source);
  else
    cj_null(j);
  cj_key(j, "at_peak_unavailable");
  if (x->have_at_peak)
    cj_null(j);
  else
    cj_cstr(j, x->peak_why);
  cj_obj_end(j);
}

/* The OOM to explain: the latest by time, else the last device's. */
static const cli_oom_t *latest_oom(const dev_fig_t *figs, uint32_t nd) {
  const cli_oom_t *best = NULL;
  for (uint32_t d = 0; d < nd; d++) {
    const cli_oom_t *o = &figs[d].x.oom;
    if (!o->present)
      continue;
    if (!best || !best->have_time || !o->have_time ||
        o->time_us >= best->time_us)
      best = o;
  }
  return best;
}

static void json_frames(cli_json_t *j, const msnap_snap_t *s,
                        msnap_stack_t st) {
  uint32_t n;
  const uint32_t *fr = cli_stack(s, st, &n);
  cj_arr(j);
  for (uint32_t i = 0; i < n; i++) {
    if (fr[i] >= s->nframes)
      continue;
    const msnap_frame_t *f = &s->frames[fr[i]];
    size_t l;
    const char *p;
    cj_obj(j);
    cj_key(j, "name");
    p = cli_str(s, f->name, &l);
    cj_str(j, p, l);
    cj_key(j, "filename");
    p = cli_str(s, f->filename, &l);
    cj_str(j, p, l);
    cj_key(j, "line");
    cj_i64(j, f->line);
    cj_obj_end(j);
  }
  cj_arr_end(j);
}

/* Why the request failed: its kind ("inconsistent", "cached_block",
 * "unconfirmed_cap",
 * "out_of_memory", "segment_size", "fragmentation") and one sentence in
 * buf. */
static const char *oom_verdict(const cli_oom_t *o, char *buf, size_t len) {
  if (o->have_total && o->device_free > o->device_total) {
    char f[32], t[32];
    snprintf(buf, len,
             "inconsistent: the oom entry reports %s free on a device of %s "
             "(process_info); the file does not describe a real OOM, so no "
             "cause is given",
             cli_bytes(o->device_free, f, sizeof f),
             cli_bytes(o->device_total, t, sizeof t));
    return "inconsistent";
  }
  if (o->have_at && o->fits_largest) {
    snprintf(buf, len, "the cache held a free block large enough (of "
                       "another stream, or freed after the OOM)");
    return "cached_block";
  }
  bool capped = o->avail < o->device_free;
  char a[32];
  cli_bytes(o->have_allowed ? o->allowed : 0, a, sizeof a);
  if (!o->fits_unfragmented) {
    uint64_t need = o->segment_size ? o->segment_size : o->requested;
    /* the request against the device's whole memory, or against all the
     * process could still use (free memory plus cached free blocks) */
    bool whole = o->have_total && o->requested > o->device_total;
    char r[64], t[64], u[80], f[32], c[48];
    cli_bytes_apart(o->requested, r, sizeof r,
                    whole ? o->device_total : o->avail + o->cached, t,
                    sizeof t);
    /* without the blocks at the OOM, the cached bytes are reserved minus
     * requested: an upper bound (blocks round their requests up) */
    const char *bound = o->have_at ? "" : "at most ";
    snprintf(u, sizeof u, "%s%s", bound, t);
    cli_bytes(o->avail, f, sizeof f);
    snprintf(c, sizeof c, "%s", bound);
    cli_bytes(o->cached, c + strlen(c), sizeof c - strlen(c));
    if (whole) {
      snprintf(buf, len, "out of memory: the request (%s) is larger than "
                         "the device's whole memory (%s), so no cache, "
                         "setting or layout can serve it; check the size "
                         "the failing allocation asks for (a shape, batch "
                         "or dtype larger than meant)",
               r, t);
    } else if (capped)
      snprintf(buf, len, "out of memory: the request (%s) exceeds everything "
                         "the process could still use (%s: what its "
                         "per-process memory fraction still allowed, %s "
                         "more of the %s it may reserve, plus its cached "
                         "free blocks, %s)%s",
               r, u, f, a, c,
               o->device_free >= need
                   ? ", though the device had enough free"
                   : "");
    else
      snprintf(buf, len, "out of memory: the request (%s) exceeds everything "
                         "the process could still use (%s: free device "
                         "memory, %s, plus its cached free blocks, %s)",
               r, u, f, c);
    return "out_of_memory";
  }
  /* Free device memory and cached blocks would have held the request,
   * a cap the file suggests would not: that cap is the likelier cause,
   * though the file does not tie it to the OOM. */
  if (!o->cap_known && o->hint_source && o->have_hint_bytes &&
      !o->hint_fits) {
    char h[32];
    snprintf(buf, len,
             "probably the memory-fraction cap: under the %s the file "
             "suggests (from %s) the request did not fit, while free device "
             "memory plus cached free blocks would have held it; the file "
             "does not record whether that cap held at the OOM",
             cli_bytes(o->hint_bytes, h, sizeof h),
             strcmp(o->hint_source, "process_info") == 0
                 ? "process_info's allowed_bytes, at the dump"
                 : o->hint_source);
    return "unconfirmed_cap";
  }
  if (o->segment_size > o->avail && o->requested <= o->avail) {
    char r[32], f[32], g[32], where[96];
    cli_bytes(o->requested, r, sizeof r);
    cli_bytes(o->avail, f, sizeof f);
    cli_bytes(o->segment_size, g, sizeof g);
    if (capped)
      snprintf(where, sizeof where, "what the memory fraction still allowed "
                                    "(%s", f);
    else
      snprintf(where, sizeof where, "the device's free memory (%s", f);
    snprintf(buf, len,
             "segment size: the request (%s) would fit in %s), but no cached "
             "block served it and the allocator asks the device for a whole "
             "new segment of %s (%s), which did not fit",
             r, where, g,
             o->requested <= (1ull << 20)
                 ? "requests up to 1 MiB get a 2 MiB segment"
             : o->requested < (10ull << 20)
                 ? "requests from 1 MiB to 10 MiB get a kLargeBuffer segment"
                 : "the request rounded up to the segment granularity");
    return "segment_size";
  }
  snprintf(buf, len, "fragmentation: free device memory plus cached free "
                     "blocks would hold the request, but no single free "
                     "block or free device range did");
  return "fragmentation";
}

static void json_oom(cli_json_t *j, const msnap_snap_t *s,
                     const cli_oom_t *o) {
  char site[512];
  cj_obj(j);
  cj_key(j, "device");
  cj_i64(j, o->device);
  cj_key(j, "entry");
  cj_u64(j, o->entry);
  cj_key(j, "count");
  cj_u64(j, o->count);
  cj_key(j, "time_us");
  if (o->have_time)
    cj_i64(j, o->time_us);
  else
    cj_null(j);
  cj_key(j, "requested_bytes");
  cj_u64(j, o->requested);
  cj_key(j, "pool");
  cj_cstr(j, o->small_pool ? "small" : "large");
  cj_key(j, "device_free_bytes");
  cj_u64(j, o->device_free);
  cj_key(j, "device_total_bytes");
  cj_u64_or_null(j, o->have_total, o->device_total);
  cj_key(j, "cap_known");
  cj_bool(j, o->cap_known);
  cj_key(j, "allowed_bytes");
  cj_u64_or_null(j, o->have_allowed, o->allowed);
  cj_key(j, "unconfirmed_cap");
  if (o->hint_source) {
    cj_obj(j);
    cj_key(j, "source");
    cj_cstr(j, o->hint_source);
    cj_key(j, "bytes");
    cj_u64_or_null(j, o->have_hint_bytes, o->hint_bytes);
    cj_key(j, "fraction");
    if (o->hint_fraction > 0)
      cj_dbl(j, o->hint_fraction);
    else
      cj_null(j);
    cj_key(j, "would_fit");
    if (o->have_hint_bytes)
      cj_bool(j, o->hint_fits);
    else
      cj_null(j);
    cj_obj_end(j);
  } else {
    cj_null(j);
  }
  cj_key(j, "available_bytes");
  cj_u64(j, o->avail);
  cj_key(j, "reserved_bytes");
  cj_u64(j, o->reserved);
  cj_key(j, "active_requested_bytes");
  cj_u64(j, o->active_requested);
  cj_key(j, "state_source");
  if (o->have_at)
    cj_cstr(j, o->source);
  else
    cj_null(j);
  cj_key(j, "state_unavailable");
  if (o->have_at)
    cj_null(j);
  else
    cj_cstr(j, o->why);
  const cli_u64_field_t at[] = {
      {"allocated_bytes", o->at.allocated},
      {"active_bytes", o->at.active},
      {"cached_free_bytes", o->at.reserved - o->at.active},
      {"inactive_split_bytes", o->at.inactive_split},
      {"largest_free_block_bytes", o->at.largest_free}};
  for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
    cj_key(j, at[k].key);
    cj_u64_or_null(j, o->have_at, at[k].v);
  }
  cj_key(j, "largest_free_block_by_pool");
  if (o->have_at) {
    cj_obj(j);
    cj_key(j, "small");
    cj_u64(j, o->at.largest_free_small);
    cj_key(j, "large");
    cj_u64(j, o->at.largest_free_large);
    cj_obj_end(j);
  } else {
    cj_null(j);
  }
  cj_key(j, "fits_in_largest_free_block");
  if (o->have_at)
    cj_bool(j, o->fits_largest);
  else
    cj_null(j);
  cj_key(j, "fits_without_fragmentation");
  cj_bool(j, o->fits_unfragmented);
  cj_key(j, "fits_with_expandable_segments");
  if (o->expandable >= 0)
    cj_bool(j, o->expandable == 1);
  else
    cj_null(j);
  cj_key(j, "expandable_segments_replay");
  cj_cstr(j, o->expandable_why);
  cj_key(j, "segment_size_bytes");
  cj_u64_or_null(j, o->segment_size != 0, o->segment_size);
  char why[512];
  const char *kind = oom_verdict(o, why, sizeof why);
  cj_key(j, "verdict_kind");
  cj_cstr(j, kind);
  cj_key(j, "verdict");
  cj_cstr(j, why);
  cli_site_format(s, o->site, site, sizeof site);
  cj_key(j, "site");
  cj_cstr(j, site);
  cj_key(j, "frames");
  json_frames(j, s, o->stack);
  cj_key(j, "top_live_sites");
  cj_arr(j);
  for (uint32_t i = 0; i < o->ntop; i++) {
    cli_site_format(s, o->top[i].site, site, sizeof site);
    cj_obj(j);
    cj_key(j, "site");
    cj_cstr(j, site);
    cj_key(j, "bytes");
    cj_u64(j, o->top[i].bytes);
    cj_key(j, "count");
    cj_u64(j, o->top[i].count);
    cj_obj_end(j);
  }
  cj_arr_end(j);
  cj_obj_end(j);
}

static void print_json(cli_json_t *j, const char *file, const msnap_snap_t *s,
                       dev_fig_t *figs, uint32_t nd) {
  char site[512];
  cj_obj(j);
  cj_key(j, "file");
  cj_cstr(j, file);
  cj_key(j, "generation");
  cj_cstr(j, cli_generation_name(s->generation));
  const char *why;
  const char *profile = cli_recording_profile_why(s, &why);
  cj_key(j, "profile");
  cj_cstr(j, profile);
  cj_key(j, "profile_source");
  cj_cstr(j, why);
  cj_key(j, "devices");
  cj_arr(j);
  for (uint32_t d = 0; d < nd; d++) {
    dev_fig_t *f = &figs[d];
    cj_obj(j);
    cj_key(j, "device");
    cj_i64(j, f->device);
    const cli_u64_field_t sums[] = {{"segments", f->segments},
                                    {"large_segments", f->large},
                                    {"reserved_bytes", f->reserved},
                                    {"allocated_bytes", f->allocated},
                                    {"active_bytes", f->active},
                                    {"requested_bytes", f->requested},
                                    {"blocks", f->blocks}};
    cj_u64_fields(j, sums, sizeof sums / sizeof sums[0]);
    cj_key(j, "blocks_by_state");
    cj_obj(j);
    for (int k = 0; k < 4; k++)
      if (f->by_state[k]) {
        cj_key(j, state_names[k]);
        cj_u64(j, f->by_state[k]);
      }
    cj_obj_end(j);
    cj_key(j, "trace_entries");
    cj_u64(j, f->trace_entries);
    cj_key(j, "trace_by_action");
    cj_obj(j);
    for (int k = 0; k <= MSNAP_ACTION_COUNT; k++)
      if (f->by_action[k]) {
        cj_key(j, k < MSNAP_ACTION_COUNT ? msnap_action_name(k) : "other");
        cj_u64(j, f->by_action[k]);
      }
    cj_obj_end(j);
    /* null when the trace has no times / no replayable history */
    const struct {
      const char *key;
      bool have;
      int64_t v;
    } opt[] = {{"time_first_us", f->have_time, f->t0},
               {"time_last_us", f->have_time, f->t1},
               {"peak_requested_bytes", f->have_peak,
                (int64_t)f->peak_alloc},
               /* (the same figure under its first name, for scripts
                * written before peak_requested_bytes) */
               {"peak_allocated_bytes", f->have_peak, (int64_t)f->peak_alloc},
               {"peak_reserved_bytes", f->have_peak,
                (int64_t)f->peak_reserved},
               {"trace_alloc_dropped", f->dropped >= 0, f->dropped}};
    for (size_t k = 0; k < sizeof opt / sizeof opt[0]; k++) {
      cj_key(j, opt[k].key);
      if (opt[k].have)
        cj_i64(j, opt[k].v);
      else
        cj_null(j);
    }
    /* the other caveat of the peaks: the trace contradicts the final
     * state (the text's "see memsnap check" note) */
    cj_key(j, "trace_violations");
    cj_u64(j, (uint64_t)f->x.trace_violations);
    cj_key(j, "overlapping_segments");
    cj_u64(j, f->overlapping);
    cj_key(j, "live_before_trace");
    cj_obj(j);
    cj_key(j, "count");
    cj_u64(j, f->before_count);
    cj_key(j, "bytes");
    cj_u64(j, f->before_bytes);
    cj_obj_end(j);
    cj_key(j, "largest_live");
    cj_arr(j);
    for (uint32_t i = 0; i < f->nlargest; i++) {
      const msnap_sblock_t *b = &s->blocks[f->largest[i].block];
      cj_obj(j);
      cj_key(j, "address");
      cj_u64(j, f->largest[i].addr);
      cj_key(j, "size");
      cj_u64(j, b->size);
      cj_key(j, "requested_size");
      cj_u64(j, b->requested_size);
      cli_site_format(s, f->largest[i].site, site, sizeof site);
      cj_key(j, "site");
      cj_cstr(j, site);
      cj_obj_end(j);
    }
    cj_arr_end(j);
    cj_key(j, "top_sites");
    cj_arr(j);
    for (uint32_t i = 0; i < f->nsites; i++) {
      cli_site_format(s, f->sites[i].site, site, sizeof site);
      cj_obj(j);
      cj_key(j, "site");
      cj_cstr(j, site);
      cj_key(j, "bytes");
      cj_u64(j, f->sites[i].bytes);
      cj_key(j, "count");
      cj_u64(j, f->sites[i].count);
      cj_obj_end(j);
    }
    cj_arr_end(j);
    json_fragmentation(j, &f->x);
    cj_key(j, "ooms");
    cj_u64(j, f->x.oom.count);
    cj_obj_end(j);
  }
  cj_arr_end(j);
  const cli_oom_t *oom = latest_oom(figs, nd);
  cj_key(j, "oom");
  if (oom)
    json_oom(j, s, oom);
  else
    cj_null(j);
  cj_key(j, "annotations");
  cj_u64(j, s->nannotations);
  if (s->top_keys & MSNAP_TOP_ALLOCATOR_SETTINGS) {
    cj_key(j, "allocator_settings");
    cj_gv(j, s, &s->allocator_settings);
  }
  cj_obj_end(j);
}

/* allocator_settings as "key=value" items wrapped at 79 columns, those
 * of cli_settings_shown (--json keeps every key). */
static void print_settings(const msnap_snap_t *s, const msnap_gv_t *d) {
  const char *head = "\nallocator settings:";
  size_t col = strlen(head) - 1;
  uint32_t n = 0;
  char **items = cli_settings_shown(s, d, &n);
  if (!items)
    return;
  fputs(head, stdout);
  for (uint32_t i = 0; i < n; i++) {
    size_t len = strlen(items[i]);
    if (col + 1 + len > 79 && col > 2) {
      fputs("\n ", stdout);
      col = 1;
    }
    printf(" %s", items[i]);
    col += 1 + len;
  }
  for (uint32_t i = 0; i < n; i++)
    free(items[i]);
  free(items);
  fputc('\n', stdout);
}

/* record_function annotations: the START count per (name, device), the
 * first 10 names in order of appearance. */
static void print_annotations(const msnap_snap_t *s) {
  enum { SHOWN = 10 };
  struct {
    msnap_str_t name;
    int64_t device;
    uint32_t n;
  } g[SHOWN];
  uint32_t ng = 0, starts = 0, rest = 0;
  for (uint32_t i = 0; i < s->nannotations; i++) {
    const msnap_sannotation_t *a = &s->annotations[i];
    if (!a->is_start)
      continue;
    starts++;
    uint32_t k = 0;
    while (k < ng && (g[k].name != a->name || g[k].device != a->device))
      k++;
    if (k < ng) {
      g[k].n++;
    } else if (ng < SHOWN) {
      g[ng].name = a->name;
      g[ng].device = a->device;
      g[ng++].n = 1;
    } else {
      rest++;
    }
  }
  printf("\nannotations: %u (%u record_function range%s)\n",
         s->nannotations, starts, starts == 1 ? "" : "s");
  for (uint32_t k = 0; k < ng; k++) {
    size_t nl;
    const char *nm = cli_str(s, g[k].name, &nl);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(nl < 255 ? nl : 255), nm);
    cli_sanitize(name);
    printf("  %5u x  %s (device %" PRId64 ")\n", g[k].n, name, g[k].device);
  }
  if (rest)
    printf("  ... %u more %s of other names\n", rest,
           cli_plural(rest, "range", "ranges"));
}

static void print_fragmentation(const cli_explain_t *x) {
  char b1[32], b2[32], b3[32], b4[32];
  const cli_frag_t *f = &x->final;
  printf("  fragmentation    inactive in split segments %s (%" PRIu64
         " block%s); free segments %s (%" PRIu64 ")\n",
         cli_bytes(f->inactive_split, b1, sizeof b1),
         f->inactive_split_blocks, f->inactive_split_blocks == 1 ? "" : "s",
         cli_bytes(f->free_segments_bytes, b2, sizeof b2), f->free_segments);
  printf("                   largest free block %s (small pool %s, large "
         "pool %s)\n",
         cli_bytes(f->largest_free, b1, sizeof b1),
         cli_bytes(f->largest_free_small, b2, sizeof b2),
         cli_bytes(f->largest_free_large, b3, sizeof b3));
  if (x->have_at_peak) {
    const cli_frag_t *p = &x->at_peak;
    printf("  at the peak      of reserved memory, %s: allocated %s, "
           "inactive split %s,\n                   largest free block %s "
           "(state %u, from the %s)\n",
           cli_bytes(p->reserved, b1, sizeof b1),
           cli_bytes(p->allocated, b2, sizeof b2),
           cli_bytes(p->inactive_split, b3, sizeof b3),
           cli_bytes(p->largest_free, b4, sizeof b4), x->peak_state,
           x->peak_source);
  } else if (x->peak_why[0]) {
    printf("  at the peak      of reserved memory: unknown: %s\n", x->peak_why);
  }
}

/* "  label            text" with text wrapped at 79 columns under itself
 * (words longer than a line are not split). */
static void print_wrapped(const char *label, const char *text) {
  enum { INDENT = 19, WIDTH = 79 };
  int col = printf("  %-*s", INDENT - 3, label);
  if (col < INDENT) {
    printf("%*s", INDENT - col, "");
    col = INDENT;
  } else {
    putchar(' ');
    col++;
  }
  const char *p = text;
  bool first = true;
  while (*p) {
    while (*p == ' ')
      p++;
    size_t w = strcspn(p, " ");
    if (!w)
      break;
    /* keep "400.00 MiB" on one line */
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    for (int u = 0; u < 5 && p[w] == ' '; u++) {
      size_t ul = strlen(units[u]);
      if (!strncmp(p + w + 1, units[u], ul) &&
          (p[w + 1 + ul] == 0 || strchr(" ,;)", p[w + 1 + ul]))) {
        w += 1 + strcspn(p + w + 1, " ");
        break;
      }
    }
    if (!first && col + 1 + (int)w > WIDTH) {
      printf("\n%*s", INDENT, "");
      col = INDENT;
    } else if (!first) {
      putchar(' ');
      col++;
    }
    printf("%.*s", (int)w, p);
    col += (int)w;
    p += w;
    first = false;
  }
  putchar('\n');
}

/* A frame of the failing allocation's stack, the site marked. */
static void oom_frame(const msnap_snap_t *s, uint32_t frame, uint32_t site) {
  char buf[512];
  cli_site_t one = {frame, CLI_SITE_NONE};
  cli_site_format(s, one, buf, sizeof buf);
  printf("    %s%s\n", buf,
         frame != site                  ? ""
         : cli_frame_is_user(s, frame) ? "   <- your code"
                                       : "   <- the allocation site");
}

static void print_oom(const msnap_snap_t *s, const cli_oom_t *o) {
  char b1[32], b2[32], b3[32], b4[512], b5[32], b6[32];
  printf("\nout of memory on device %" PRId64 " (trace entry %u", o->device,
         o->entry);
  if (o->count > 1)
    printf("; the last of %u OOMs", o->count);
  printf(")\n");
  cli_site_format(s, o->site, b4, sizeof b4);
  printf("  failing allocation  %s\n", b4);
  printf("  requested        %s (%" PRIu64 " B, rounded; %s pool)\n",
         cli_bytes(o->requested, b1, sizeof b1), o->requested,
         o->small_pool ? "small" : "large");
  char buf[700];
  if (o->segment_size && o->segment_size != o->requested) {
    /* PyTorch's message names this size, not the request:
     * "Tried to allocate <get_allocation_size(size)>" */
    snprintf(buf, sizeof buf,
             "%s (%" PRIu64 " B): the allocation size of the new segment "
             "(get_allocation_size), the size PyTorch's \"Tried to "
             "allocate\" names",
             cli_bytes(o->segment_size, b1, sizeof b1), o->segment_size);
    print_wrapped("new segment", buf);
  }
  if (o->have_total)
    printf("  device           %s free of %s\n",
           cli_bytes(o->device_free, b1, sizeof b1),
           cli_bytes(o->device_total, b2, sizeof b2));
  else
    printf("  device           %s free (total not recorded in this file)\n",
           cli_bytes(o->device_free, b1, sizeof b1));
  if (o->have_allowed) {
    snprintf(buf, sizeof buf,
             "%s reserved at most (per-process memory fraction, recorded "
             "with the OOM); the process could still reserve %s",
             cli_bytes(o->allowed, b1, sizeof b1),
             cli_bytes(o->avail, b2, sizeof b2));
    print_wrapped("allowed", buf);
  } else if (o->hint_source) {
    char what[160];
    if (o->hint_fraction > 0 && o->have_hint_bytes)
      snprintf(what, sizeof what,
               "the recorded %s sets per_process_memory_fraction %g (%s of "
               "%s)",
               o->hint_source, o->hint_fraction,
               cli_bytes(o->hint_bytes, b1, sizeof b1),
               cli_bytes(o->device_total, b2, sizeof b2));
    else if (o->hint_fraction > 0)
      snprintf(what, sizeof what,
               "the recorded %s sets per_process_memory_fraction %g (the "
               "device total is not recorded)",
               o->hint_source, o->hint_fraction);
    else
      snprintf(what, sizeof what,
               "the process was capped at %s when the snapshot was taken",
               cli_bytes(o->hint_bytes, b1, sizeof b1));
    snprintf(buf, sizeof buf,
             "unknown at the OOM: %s, but the file does not record the cap "
             "in force at the OOM (set_per_process_memory_fraction can "
             "change it), so the verdict assumes none%s",
             what,
             !o->have_hint_bytes ? ""
             : o->hint_fits      ? "; under that cap the request would "
                                   "still have fit"
                                 : "; under that cap the request would not "
                                   "have fit (see the verdict)");
    print_wrapped("allowed", buf);
  }
  snprintf(buf, sizeof buf, "reserved %s, live allocations %s requested",
           cli_bytes(o->reserved, b1, sizeof b1),
           cli_bytes(o->active_requested, b2, sizeof b2));
  print_wrapped("at the OOM", buf);
  if (o->have_at) {
    cli_bytes(o->at.largest_free_small, b5, sizeof b5);
    cli_bytes(o->at.largest_free_large, b6, sizeof b6);
    /* The request's pool's largest block reads as the request itself
     * ("4.00 MiB" both) yet did not serve it: the bytes say why. */
    char rq[32];
    cli_bytes(o->requested, rq, sizeof rq);
    char *pool = o->small_pool ? b5 : b6;
    uint64_t lf = o->small_pool ? o->at.largest_free_small
                                : o->at.largest_free_large;
    if (lf != o->requested && strcmp(pool, rq) == 0)
      snprintf(pool + strlen(pool), sizeof b5 - strlen(pool),
               " = %" PRIu64 " B", lf);
    snprintf(buf, sizeof buf,
             "allocated %s; cached free %s, of it %s inactive in split "
             "segments; largest free block: small pool %s, large pool %s "
             "(blocks from the %s)",
             cli_bytes(o->at.allocated, b1, sizeof b1),
             cli_bytes(o->at.reserved - o->at.active, b2, sizeof b2),
             cli_bytes(o->at.inactive_split, b3, sizeof b3), b5, b6,
             o->source);
  } else {
    snprintf(buf, sizeof buf, "blocks at the OOM unknown: %s", o->why);
  }
  print_wrapped("", buf);
  {
    char why[512];
    (void)oom_verdict(o, why, sizeof why);
    print_wrapped("verdict", why);
  }
  print_wrapped("unfragmented", o->fits_unfragmented
                                    ? "the request would have fit"
                                    : "the request would not have fit");
  if (o->expandable >= 0 || o->expandable_why[0]) {
    snprintf(buf, sizeof buf, "with expandable_segments:True the request %s: %s",
             o->expandable == 1   ? "would have fit"
             : o->expandable == 0 ? "would not have fit"
                                  : "may or may not have fit",
             o->expandable_why);
    print_wrapped("expandable", buf);
  }
  uint32_t n;
  const uint32_t *fr = cli_stack(s, o->stack, &n);
  if (n) {
    printf("  stack of the failing allocation (innermost first):\n");
    /* The first 12 frames; when the site lies deeper, the frames between
     * them and it are one elision line, and the site is listed after it
     * (the marked line is the one to read).  Then the count of the
     * frames left. */
    uint32_t at = UINT32_MAX; /* the site's first position in the stack */
    for (uint32_t i = 0; i < n && at == UINT32_MAX; i++)
      if (fr[i] == o->site.frame)
        at = i;
    uint32_t shown = 0, i = 0;
    for (; i < n && shown < 12; i++) {
      if (fr[i] >= s->nframes)
        continue;
      oom_frame(s, fr[i], o->site.frame);
      shown++;
    }
    uint32_t left = n - shown; /* (frames not listed) */
    if (at != UINT32_MAX && at >= i) {
      if (at > i)
        printf("    ... %u more %s\n", at - i,
               cli_plural(at - i, "frame", "frames"));
      oom_frame(s, fr[at], o->site.frame);
      left = n - at - 1;
    }
    if (left)
      printf("    ... %u more %s\n", left,
             cli_plural(left, "frame", "frames"));
  }
  if (o->ntop) {
    printf("  live at the OOM (top sites, requested bytes):\n");
    for (uint32_t i = 0; i < o->ntop; i++) {
      cli_site_format(s, o->top[i].site, b4, sizeof b4);
      printf("    %12s  %5" PRIu64 " x  %s\n",
             cli_bytes(o->top[i].bytes, b1, sizeof b1), o->top[i].count, b4);
    }
  }
}

static void print_text(const char *file, const msnap_snap_t *s,
                       dev_fig_t *figs, uint32_t nd) {
  char b1[32], b2[512];
  const char *why;
  const char *profile = cli_recording_profile_why(s, &why);
  printf("%s: snapshot format %s, %s allocator (%s)\n", cli_shown(file),
         cli_generation_name(s->generation), profile, why);
  if (nd == 0)
    printf("\nThe snapshot has no segments: no device memory was reserved "
           "when it was taken.\nNo trace either: %s.\n",
           s->generation == MSNAP_GEN_SEGMENT_LIST
               ? "a bare list of segments (before PyTorch 2.0) has none"
               : "no allocation history was recorded");
  for (uint32_t d = 0; d < nd; d++) {
    dev_fig_t *f = &figs[d];
    printf("\ndevice %" PRId64 "\n", f->device);
    printf("  segments         %" PRIu64 " (%" PRIu64 " large, %" PRIu64
           " small)\n",
           f->segments, f->large, f->segments - f->large);
    if (f->overlapping) {
      char buf[384];
      snprintf(buf, sizeof buf,
               "%u %s overlap%s the one before %s (a segment list written "
               "twice?): the figures below count that memory more than "
               "once and the peaks are not to be trusted; see memsnap "
               "check",
               f->overlapping,
               cli_plural(f->overlapping, "segment", "segments"),
               f->overlapping == 1 ? "s" : "",
               f->overlapping == 1 ? "it" : "them");
      print_wrapped("overlapping", buf);
    }
    printf("  reserved         %s (%" PRIu64 " B)\n",
           cli_bytes(f->reserved, b1, sizeof b1), f->reserved);
    printf("  allocated        %s (%" PRIu64 " B)\n",
           cli_bytes(f->allocated, b1, sizeof b1), f->allocated);
    printf("  active           %s (%" PRIu64 " B)\n",
           cli_bytes(f->active, b1, sizeof b1), f->active);
    printf("  requested        %s (%" PRIu64 " B)\n",
           cli_bytes(f->requested, b1, sizeof b1), f->requested);
    printf("  blocks           %" PRIu64 ":", f->blocks);
    for (int k = 0; k < 4; k++)
      if (f->by_state[k])
        printf(" %s %" PRIu64, state_names[k], f->by_state[k]);
    printf("\n  trace entries    %" PRIu64, f->trace_entries);
    const char *sep = ":";
    for (int k = 0; k <= MSNAP_ACTION_COUNT; k++)
      if (f->by_action[k]) {
        printf("%s %s %" PRIu64, sep,
               k < MSNAP_ACTION_COUNT ? msnap_action_name(k) : "other",
               f->by_action[k]);
        sep = ",";
      }
    printf("\n");
    if (f->have_time)
      printf("  time span        %s\n",
             cli_duration(f->t1 - f->t0, b1, sizeof b1));
    else if (f->trace_entries)
      printf("  time span        (no time_us in this format)\n");
    if (!f->have_peak && f->trace_entries) {
      printf("  peaks            unknown: no entry of the trace allocates or "
             "frees memory\n");
    } else if (f->have_peak) {
      printf("  peak requested   %s over the trace (requested bytes of live "
             "allocations,\n                   as memory_viz plots them; "
             "allocated bytes round each up)\n",
             cli_bytes(f->peak_alloc, b1, sizeof b1));
      printf("  peak reserved    %s over the trace\n",
             cli_bytes(f->peak_reserved, b1, sizeof b1));
      if (f->dropped > 0) {
        char buf[256];
        snprintf(buf, sizeof buf,
                 "the history ring dropped %" PRId64 " earlier %s "
                 "(trace_alloc_dropped): both peaks are of the entries "
                 "kept; the dropped ones may have held higher ones",
                 f->dropped, cli_plural((uint64_t)f->dropped, "entry",
                                        "entries"));
        print_wrapped("", buf);
      }
      char skipped[384];
      if (cli_skipped_history(s, skipped, sizeof skipped)) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "the recording skipped its %s: both peaks add up the "
                 "entries kept", skipped);
        print_wrapped("", buf);
      } else if (f->x.trace_violations > 0) {
        char buf[256];
        snprintf(buf, sizeof buf,
                 "the trace is inconsistent with the final state (%ld %s; "
                 "see memsnap check): both peaks add up the entries as "
                 "recorded and may be wrong",
                 f->x.trace_violations,
                 cli_plural((uint64_t)f->x.trace_violations, "violation",
                            "violations"));
        print_wrapped("", buf);
      }
    }
    print_fragmentation(&f->x);
    if (f->nlargest) {
      printf("  largest live allocations:\n");
      for (uint32_t i = 0; i < f->nlargest; i++) {
        const msnap_sblock_t *b = &s->blocks[f->largest[i].block];
        cli_site_format(s, f->largest[i].site, b2, sizeof b2);
        printf("    %12s  0x%012" PRIx64 "  %s\n",
               cli_bytes(b->size, b1, sizeof b1), f->largest[i].addr, b2);
      }
    }
    if (f->nsites) {
      printf("  top allocation sites (live bytes):\n");
      for (uint32_t i = 0; i < f->nsites; i++) {
        cli_site_format(s, f->sites[i].site, b2, sizeof b2);
        printf("    %12s  %5" PRIu64 " x  %s\n",
               cli_bytes(f->sites[i].bytes, b1, sizeof b1),
               f->sites[i].count, b2);
      }
    }
    if (f->before_count)
      printf("  %" PRIu64 " live block%s (%s) predate%s the first trace "
             "entry, so the file\n  holds no stack for %s: start "
             "_record_memory_history() before\n  allocating them (or raise "
             "max_entries) to see where they come from.\n",
             f->before_count, f->before_count == 1 ? "" : "s",
             cli_bytes(f->before_bytes, b1, sizeof b1),
             f->before_count == 1 ? "s" : "",
             f->before_count == 1 ? "it" : "them");
  }
  const cli_oom_t *oom = latest_oom(figs, nd);
  if (oom)
    print_oom(s, oom);
  if (s->nannotations)
    print_annotations(s);
  if ((s->top_keys & MSNAP_TOP_ALLOCATOR_SETTINGS) &&
      s->allocator_settings.kind == MSNAP_GV_DICT)
    print_settings(s, &s->allocator_settings);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap summary [--json] [--top N] [--no-whatif] FILE\n"
          "\n"
          "Per device: segments; reserved, allocated, active and requested\n"
          "bytes (sums over the blocks); blocks by state; trace entries by\n"
          "action; time span; peak requested (the requested bytes of live\n"
          "allocations, what the trace records) and peak reserved over the\n"
          "trace (unknown when no entry allocates or frees memory),\n"
          "starting from\n"
          "the state at the trace start (the final one minus the trace's\n"
          "net effect);\n"
          "the largest live allocations and the top allocation sites by\n"
          "live bytes; fragmentation (inactive blocks of split segments,\n"
          "free segments, the largest free block per pool) at the end and\n"
          "at the peak of reserved memory; annotations and allocator\n"
          "settings.\n"
          "\n"
          "An OOM (the last `oom` trace entry) is explained: the request,\n"
          "free and total device memory, reserved/allocated/cached bytes\n"
          "and the largest free block per pool at the OOM, whether the\n"
          "request would have fit without fragmentation and with\n"
          "expandable_segments (a replay of the trace), the segment the\n"
          "allocator needed (a 4 MiB request asks for 20 MiB), a verdict\n"
          "(cached block, out of memory, segment size, fragmentation, or an\n"
          "inconsistent entry), the\n"
          "failing allocation's stack (12 frames, and the site after\n"
          "them when it lies deeper) and the live allocations by site.\n"
          "States other than the final one come from an exact replay of\n"
          "the trace (memsnap replay); when none is possible they are\n"
          "reported unknown, with the reason.\n"
          "\n"
          "A site is the innermost user frame of the allocation's stack:\n"
          "C/C++ frames, frames under a torch/, torch_npu/ or memsnap/\n"
          "directory, Python standard library frames and (when a frame of\n"
          "your own code is present) installed packages are skipped; the\n"
          "innermost installed-package frame it called is shown as\n"
          "\"(via ...)\".  Code typed with no file of its own is your\n"
          "code: <stdin> (python -), <python-input-N> (the REPL),\n"
          "<ipython-input-N-HASH> (IPython); <string> (python -c, exec)\n"
          "is the site when no other frame of your code is on the stack.\n"
          "A stack of native frames only (autograd's engine thread) is\n"
          "named by its autograd node (e.g. MmBackward0::apply).\n"
          "A live block whose own frames are empty takes the stack of its\n"
          "alloc entry in the trace; one allocated before the first trace\n"
          "entry shows as \"" CLI_SITE_BEFORE_TEXT "\".\n"
          "\n"
          "  --json     one JSON object {file, generation, profile,\n"
          "              profile_source,\n"
          "              devices: [{device, segments, large_segments,\n"
          "                reserved_bytes, allocated_bytes, active_bytes,\n"
          "                requested_bytes, blocks,\n"
          "                blocks_by_state: {<state>: count},\n"
          "                trace_entries,\n"
          "                trace_by_action: {<action>: count},\n"
          "                time_first_us, time_last_us,\n"
          "                peak_requested_bytes, peak_allocated_bytes,\n"
          "                peak_reserved_bytes,\n"
          "                trace_alloc_dropped, trace_violations,\n"
          "                overlapping_segments,\n"
          "                live_before_trace: {count, bytes},\n"
          "                largest_live: [{address, size,\n"
          "                  requested_size, site}],\n"
          "                top_sites: [{site, bytes, count}],\n"
          "                fragmentation: {inactive_split_bytes,\n"
          "                  inactive_split_blocks,\n"
          "                  largest_free_block_bytes,\n"
          "                  largest_free_block_by_pool: {small, large},\n"
          "                  free_segments, free_segments_bytes,\n"
          "                  inactive_bytes, peak_state,\n"
          "                  at_peak: {reserved_bytes, allocated_bytes,\n"
          "                    active_bytes, inactive_split_bytes,\n"
          "                    inactive_split_blocks,\n"
          "                    largest_free_block_bytes,\n"
          "                    largest_free_block_by_pool: {small,\n"
          "                    large}, free_segments,\n"
          "                    free_segments_bytes, inactive_bytes}\n"
          "                    | null,\n"
          "                  at_peak_source, at_peak_unavailable},\n"
          "                ooms}],\n"
          "              oom: {device, entry, count, time_us,\n"
          "                requested_bytes, pool, device_free_bytes,\n"
          "                device_total_bytes, cap_known, allowed_bytes,\n"
          "                unconfirmed_cap: {source, bytes, fraction,\n"
          "                  would_fit} | null,\n"
          "                available_bytes, reserved_bytes,\n"
          "                active_requested_bytes, state_source,\n"
          "                state_unavailable, allocated_bytes,\n"
          "                active_bytes, cached_free_bytes,\n"
          "                inactive_split_bytes, largest_free_block_bytes,\n"
          "                largest_free_block_by_pool: {small, large},\n"
          "                fits_in_largest_free_block,\n"
          "                fits_without_fragmentation,\n"
          "                fits_with_expandable_segments,\n"
          "                expandable_segments_replay, segment_size_bytes,\n"
          "                verdict_kind, verdict, site,\n"
          "                frames: [{name, filename, line}],\n"
          "                top_live_sites: [{site, bytes, count}]} | null,\n"
          "              annotations,\n"
          "              allocator_settings: {<key>: value}}\n"
          "             (allocator_settings: the file's, when it has them)\n"
          "  --no-whatif  skip the expandable_segments replay of an OOM\n"
          "  --top N    show N largest allocations and sites, 0..100000\n"
          "             (default 10, 0 = all, as in diff)\n"
          "  -h, --help this text\n"
          "\nExit status: 0 ok, 2 unusable input.\n");
}

/* Out of memory after the file was read: the file is named, as the
 * reader's errors name it (the reader's own say where in the file). */
static void summary_oom(const char *path) {
  cli_err("%s: out of memory while summarizing the snapshot [%s]", path,
          msnap_err_name(MSNAP_ENOMEM));
}

int cli_cmd_summary(int argc, char **argv) {
  bool json = false, no_whatif = false;
  long topn = TOPN_DEFAULT;
  const cli_opt_t opts[] = {CLI_LONG("top", 't', &topn, 0, 100000,
                                     "--top needs a number 0..100000"),
                            CLI_FLAG("no-whatif", 0, &no_whatif),
                            CLI_OPT_END};
  const cli_cmd_t cmd = {"summary", usage, opts, 1,
                         "expects exactly one FILE", &json, NULL, NULL, false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  bool whatif = !no_whatif;
  msnap_snap_t *s;
  if (cli_load(argv[first], &s) != CLI_OK) {
    if (json)
      cli_json_unusable(argv[first], NULL);
    return CLI_UNUSABLE;
  }
  uint32_t nd;
  int64_t *devs = cli_devices(s, &nd);
  dev_fig_t *figs = calloc(nd + 1, sizeof *figs);
  int rc = CLI_OK;
  if (!figs || (!devs && nd)) {
    summary_oom(argv[first]);
    rc = CLI_UNUSABLE;
    goto out;
  }
  cli_stacks_t stk;
  if (cli_stacks_init(&stk, s) != 0) {
    summary_oom(argv[first]);
    rc = CLI_UNUSABLE;
    goto out;
  }
  /* Sites of every stack: only the OOM explanation needs them (a file of
   * many distinct stacks pays for them only when it holds an OOM). */
  bool any_oom = false;
  for (uint32_t d = 0; d < s->ndevices && !any_oom; d++)
    for (uint32_t i = 0; i < s->device_traces[d].n && !any_oom; i++)
      any_oom = s->device_traces[d].v[i].action == MSNAP_ACTION_OOM;
  cli_sites_t sites;
  memset(&sites, 0, sizeof sites);
  if (any_oom && cli_sites_init(&sites, s) != 0) {
    cli_stacks_free(&stk);
    summary_oom(argv[first]);
    rc = CLI_UNUSABLE;
    goto out;
  }
  for (uint32_t d = 0; d < nd; d++)
    if (device_figures(s, &stk, devs[d], &figs[d], (uint32_t)topn) ||
        cli_explain_device(s, &stk, &sites, devs[d], (uint32_t)topn, whatif,
                           &figs[d].x)) {
      cli_stacks_free(&stk);
      cli_sites_free(&sites);
      summary_oom(argv[first]);
      rc = CLI_UNUSABLE;
      goto out;
    }
  cli_stacks_free(&stk);
  cli_sites_free(&sites);
  if (json) {
    cli_json_t j;
    cj_init(&j, stdout);
    print_json(&j, argv[first], s, figs, nd);
    cj_end(&j);
  } else {
    print_text(argv[first], s, figs, nd);
  }
out:
  if (figs)
    for (uint32_t d = 0; d < nd; d++) {
      free(figs[d].largest);
      free(figs[d].sites);
      cli_explain_free(&figs[d].x);
    }
  free(figs);
  free(devs);
  msnap__snap_free(s);
  return rc;
}
