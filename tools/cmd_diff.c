/*
 * cmd_diff.c -- `memsnap diff A B`: what changed from snapshot A to B.
 *
 * Live blocks (active_allocated) of each file carry their allocation site
 * (cli_stacks_site: the block's frames, else its live alloc entry in the
 * trace), compared as text since the two files have their own strings.
 *
 * Lifetimes through the traces.  A block live in both files at the same
 * address may be one allocation kept all along, or one freed and
 * allocated again in between (a training loop does that every step).
 * Where both files have a trace of the device, B's trace is aligned with
 * A's end (align(): the cut c is the first entry of B recorded after A
 * was taken):
 *   - by time: the B entries with time_us <= A's last time_us, then
 *     checked (and adjusted within 64 entries) by matching A's last
 *     alloc/free/segment entries (action, address, size) in B;
 *   - without times (2.1 files): by the latest place where A's last such
 *     entries occur in B, preferring one followed by B's `snapshot` entry
 *     (PyTorch records one when a snapshot is taken); several candidates
 *     make the alignment "ambiguous" (reported);
 *   - when B's trace begins after A's last entry and process_info shows
 *     the same process (pid and host), c = 0;
 *   - never when both traces are timed and B's ends before A's: B was
 *     taken first (the files given in the wrong order).  A training
 *     loop repeats its entries, so A's last ones would be found in B a
 *     step or more back, a false cut.  A warning says so and no leak
 *     candidate is reported (what A holds and B does not would read as
 *     freed, B's older blocks as new).
 * Then a live block of B whose live alloc entry is at or after c is NEW
 * (allocated after A was taken, even at an address A also had: A's block
 * there was freed); one allocated before c, or before B's trace began
 * while B's trace reaches back to A, is KEPT and pairs with A's block at
 * the same address and size.  Without an alignment blocks are matched by
 * (device, address, size) and site, as a snapshot alone allows (a side
 * that cannot name a site takes the other's).  A's blocks that pair with
 * no kept block of B are FREED.
 *
 * Leak candidates.  A site whose live bytes grew from A to B and that has
 * NEW blocks in B: allocations from it survive and there are more of them
 * (growth = B's live bytes of the site minus A's, in requested bytes: the
 * rounded block sizes of equal requests differ with the allocator's split
 * decisions).  A loop dumped twice at
 * the same point has equal live bytes per site: no candidate.  Pseudo
 * sites ("<no stack...>") name no place and are never candidates.  Exit
 * status 1 when there is a candidate.
 *
 * Files that share nothing (no alignment, no kept block, no common
 * segment -- or process_info naming two processes) come from different
 * runs: a warning says so and no leak candidate is reported.
 * Segments are keyed by (device, address, total_size): opened / closed.
 */
#include <limits.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct live_s {
  int64_t device;
  uint64_t addr, size;
  uint64_t req; /* requested_size (the block size when the file has none) */
  char *site; /* owned */
  long entry; /* live alloc entry in the file's trace, -1 none   */
  int side;   /* 0 only A (freed), 1 only B (new), 2 both (kept) */
} live_t;

typedef struct seg_s {
  int64_t device;
  uint64_t addr, size;
} segk_t;

/* Order of live blocks: (device, address, size); sites do not take part,
 * since one side may know the site of a block the other cannot name. */
static int cmp_live(const void *a, const void *b) {
  const live_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->size < y->size ? -1 : x->size > y->size;
}

static int cmp_seg(const void *a, const void *b) {
  const segk_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->size < y->size ? -1 : x->size > y->size;
}

/* The live blocks of s, sorted by cmp_live, with their sites (the stack
 * resolver of cli_stacks.c: own frames, else the live alloc entry of the
 * trace).  NULL on ENOMEM; the caller frees each site and the array. */
static live_t *collect_live(const msnap_snap_t *s, uint32_t *n) {
  uint32_t cap = 0;
  for (uint32_t i = 0; i < s->nblocks; i++)
    cap += s->blocks[i].state == MSNAP_BLOCK_ACTIVE_ALLOCATED;
  live_t *v = calloc(cap + 1, sizeof *v);
  cli_stacks_t stk;
  if (!v)
    return NULL;
  if (cli_stacks_init(&stk, s) != 0) {
    free(v);
    return NULL;
  }
  uint32_t k = 0;
  char buf[512];
  bool oom = false;
  for (cli_bwalk_t it = cli_bwalk_all(s); k < cap && cli_bwalk_next(&it);) {
    const msnap_sblock_t *b = it.b;
    int64_t dev = it.g->device;
    if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
      continue;
    cli_site_format(s, cli_stacks_site(&stk, dev, it.addr, b), buf,
                    sizeof buf);
    v[k].device = dev;
    v[k].addr = it.addr;
    v[k].size = b->size;
    v[k].req = (b->keys & MSNAP_K_REQUESTED) ? b->requested_size : b->size;
    v[k].entry = cli_stacks_live_entry(&stk, dev, it.addr);
    v[k].site = strdup(buf);
    if (!v[k].site) {
      oom = true;
      break;
    }
    k++;
  }
  cli_stacks_free(&stk);
  if (oom) {
    for (uint32_t i = 0; i < k; i++)
      free(v[i].site);
    free(v);
    return NULL;
  }
  *n = k;
  qsort(v, k, sizeof *v, cmp_live);
  return v;
}

static segk_t *collect_segs(const msnap_snap_t *s) {
  segk_t *v = calloc(s->nsegments + 1, sizeof *v);
  if (!v)
    return NULL;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    v[i].device = s->segments[i].device;
    v[i].addr = s->segments[i].address;
    v[i].size = s->segments[i].total_size;
  }
  qsort(v, s->nsegments, sizeof *v, cmp_seg);
  return v;
}

/* ---- alignment of B's trace with A's end --------------------------------- */

typedef struct align_s {
  bool aligned, ambiguous;
  const char *method; /* "time", "trace", "process", "address"           */
  uint32_t cut;       /* first entry of B's trace recorded after A        */
  bool b_reaches_a;   /* B's trace began before A was taken               */
  bool reversed;      /* both timed, B's trace ends before A's: B is older */
} align_t;

static bool kind_of_change(uint8_t a) {
  return a == MSNAP_ACTION_ALLOC || a == MSNAP_ACTION_FREE_REQUESTED ||
         a == MSNAP_ACTION_FREE_COMPLETED || a == MSNAP_ACTION_SEGMENT_ALLOC ||
         a == MSNAP_ACTION_SEGMENT_FREE || a == MSNAP_ACTION_SEGMENT_MAP ||
         a == MSNAP_ACTION_SEGMENT_UNMAP;
}

static bool same_entry(const msnap_strace_t *x, const msnap_strace_t *y) {
  return x->action == y->action && x->addr == y->addr && x->size == y->size;
}

/* Indices of the change entries of tl (alloc/free/segment; not torch_npu's
 * synthetic workspace entries, which are no history). */
static uint32_t *changes(const msnap_trace_list_t *tl, uint32_t *n) {
  uint32_t *v = malloc(((size_t)(tl ? tl->n : 0) + 1) * sizeof *v), k = 0;
  if (!v)
    return NULL;
  for (uint32_t i = 0; tl && i < tl->n; i++)
    if (kind_of_change(tl->v[i].action) && !cli_workspace_synthetic(tl, i))
      v[k++] = i;
  *n = k;
  return v;
}

/* Do B's change entries before position p equal A's last change
 * entries?  m of them, or as many as B holds before p (B's ring may have
 * dropped the older ones), at least `least`. */
static bool tail_at(const msnap_trace_list_t *ta, const uint32_t *fa,
                    uint32_t na, const msnap_trace_list_t *tb,
                    const uint32_t *fb, uint32_t nb, uint32_t p, uint32_t m,
                    uint32_t least) {
  if (p < m)
    m = p;
  if (m < least || m == 0 || na < m || p > nb)
    return false;
  for (uint32_t q = 0; q < m; q++)
    if (!same_entry(&ta->v[fa[na - m + q]], &tb->v[fb[p - m + q]]))
      return false;
  return true;
}

static bool all_timed(const msnap_snap_t *s, const msnap_trace_list_t *tl) {
  return tl && tl->n && (msnap__tattr(s, &tl->v[0])->keys & MSNAP_K_TIME) &&
         (msnap__tattr(s, &tl->v[tl->n - 1])->keys & MSNAP_K_TIME);
}

/* Is there a `snapshot` entry after B entry i, before the next change? */
static bool snapshot_follows(const msnap_trace_list_t *tb, uint32_t i) {
  for (uint32_t k = i + 1; k < tb->n; k++) {
    if (tb->v[k].action == MSNAP_ACTION_SNAPSHOT)
      return true;
    if (kind_of_change(tb->v[k].action))
      return false;
  }
  return false;
}

static int align(const msnap_snap_t *sa, const msnap_trace_list_t *ta,
                 const msnap_snap_t *sb, const msnap_trace_list_t *tb,
                 bool same_process, align_t *al) {
  memset(al, 0, sizeof *al);
  al->method = "address";
  if (!ta || !tb || ta->n == 0 || tb->n == 0)
    return 0;
  uint32_t na = 0, nb = 0;
  uint32_t *fa = changes(ta, &na), *fb = changes(tb, &nb);
  if (!fa || !fb) {
    free(fa);
    free(fb);
    return -1;
  }
  if (all_timed(sa, ta) && all_timed(sb, tb) &&
      tb->v[tb->n - 1].time_us < ta->v[ta->n - 1].time_us) {
    al->reversed = true; /* B was taken before A: no cut */
  } else if (all_timed(sa, ta) && all_timed(sb, tb)) {
    int64_t tend = ta->v[ta->n - 1].time_us;
    uint32_t c0 = cli_entry_at_time(tb, tend + 1); /* entries <= tend */
    al->b_reaches_a = tb->v[0].time_us <= tend;
    /* c0 in change-entry positions */
    uint32_t p0 = 0;
    while (p0 < nb && fb[p0] < c0)
      p0++;
    uint32_t m = na < 8 ? na : 8;
    if (m == 0) {
      al->aligned = al->b_reaches_a || same_process;
      al->cut = c0;
      al->method = "time";
    } else {
      for (uint32_t d = 0; d <= 64 && !al->aligned; d++) {
        if (tail_at(ta, fa, na, tb, fb, nb, p0 + d, m, 1)) {
          al->cut = fb[p0 + d - 1] + 1;
          al->aligned = true;
        } else if (d && d <= p0 && tail_at(ta, fa, na, tb, fb, nb, p0 - d, m, 1)) {
          al->cut = fb[p0 - d - 1] + 1;
          al->aligned = true;
        }
      }
      if (al->aligned) {
        al->method = "time";
        al->b_reaches_a = true;
      } else if (!al->b_reaches_a && same_process) {
        al->aligned = true; /* B's trace begins after A was taken */
        al->cut = 0;
        al->method = "process";
      }
    }
  } else {
    /* A's last (up to 32) change entries; where B holds fewer before a
     * place, as many as it holds: at least 8, or any number when B's
     * `snapshot` entry follows (the dump of A itself). */
    uint32_t m = na < 32 ? na : 32, found = 0, best = 0, nsnap = 0,
             best_snap = 0;
    uint32_t least = m < 8 ? m : 8;
    for (uint32_t p = 1; m && p <= nb; p++) {
      bool snap = snapshot_follows(tb, fb[p - 1]);
      if (!tail_at(ta, fa, na, tb, fb, nb, p, m, snap ? 1 : least))
        continue;
      found++;
      best = p;
      if (snap) {
        nsnap++;
        best_snap = p;
      }
    }
    if (found) {
      uint32_t p = nsnap ? best_snap : best;
      al->aligned = true;
      al->ambiguous = nsnap ? nsnap > 1 : found > 1;
      al->cut = fb[p - 1] + 1;
      al->method = "trace";
      al->b_reaches_a = true;
    }
  }
  free(fa);
  free(fb);
  return 0;
}

/* Same pid and host in both process_info keys: 1; different: 0; -1 when
 * a file does not say. */
static int same_process(const msnap_snap_t *a, const msnap_snap_t *b) {
  int64_t pa, pb;
  const char *ha = cli_gv_str(a, &a->process_info, "host");
  const char *hb = cli_gv_str(b, &b->process_info, "host");
  if (!cli_gv_int(a, &a->process_info, "pid", &pa) ||
      !cli_gv_int(b, &b->process_info, "pid", &pb) || !ha || !hb)
    return -1;
  return pa == pb && !strcmp(ha, hb);
}

/* ---- grouping ------------------------------------------------------------- */

typedef struct group_s {
  const char *site;
  int64_t device;
  uint64_t bytes, count;
  /* leak candidates: live bytes of the site in A and B, new blocks */
  uint64_t a_bytes, b_bytes, new_bytes, new_count;
} group_t;

static int cmp_group_site(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  return strcmp(x->site, y->site);
}

static int cmp_group_bytes(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  return strcmp(x->site, y->site);
}

/* Sort g[0..k) by (device, site) and fold the entries of one site into
 * one (every counter summed: each caller fills only its own); returns the
 * number of groups. */
static uint32_t fold_sites(group_t *g, uint32_t k) {
  qsort(g, k, sizeof *g, cmp_group_site);
  uint32_t m = 0;
  for (uint32_t i = 0; i < k; i++) {
    group_t *t = m ? &g[m - 1] : NULL;
    if (t && t->device == g[i].device && !strcmp(t->site, g[i].site)) {
      t->bytes += g[i].bytes;
      t->count += g[i].count;
      t->a_bytes += g[i].a_bytes;
      t->b_bytes += g[i].b_bytes;
      t->new_bytes += g[i].new_bytes;
      t->new_count += g[i].new_count;
    } else {
      g[m++] = g[i];
    }
  }
  return m;
}

/* Group the entries of `side` by (device, site); *n groups. */
static group_t *group(const live_t *v, uint32_t nv, int side, uint32_t *n) {
  group_t *g = calloc(nv + 1, sizeof *g);
  uint32_t k = 0;
  if (!g)
    return NULL;
  for (uint32_t i = 0; i < nv; i++)
    if (v[i].side == side) {
      g[k].site = v[i].site;
      g[k].device = v[i].device;
      g[k].bytes = v[i].size;
      g[k].count = 1;
      k++;
    }
  *n = fold_sites(g, k);
  return g;
}

/* Leak candidates: per (device, site) the live bytes in A (freed + kept)
 * and in B (new + kept) and the new blocks, in requested bytes (what the
 * program asked for: block sizes also vary with the allocator's split
 * decisions); kept are sites that grew and have new blocks.  *n
 * candidates. */
static group_t *leak_candidates(const live_t *v, uint32_t nv, uint32_t *n) {
  group_t *g = calloc(nv + 1, sizeof *g);
  uint32_t k = 0;
  if (!g)
    return NULL;
  for (uint32_t i = 0; i < nv; i++) {
    if (cli_site_is_pseudo(v[i].site))
      continue;
    g[k].site = v[i].site;
    g[k].device = v[i].device;
    if (v[i].side != 1)
      g[k].a_bytes = v[i].req;
    if (v[i].side != 0)
      g[k].b_bytes = v[i].req;
    if (v[i].side == 1) {
      g[k].new_bytes = v[i].req;
      g[k].new_count = 1;
    }
    k++;
  }
  uint32_t m = fold_sites(g, k);
  uint32_t c = 0;
  for (uint32_t i = 0; i < m; i++)
    if (g[i].b_bytes > g[i].a_bytes && g[i].new_count > 0) {
      g[c] = g[i];
      g[c].bytes = g[i].b_bytes - g[i].a_bytes;
      g[c].count = g[i].new_count;
      c++;
    }
  *n = c;
  return g;
}

static void dev_totals(const msnap_snap_t *s, int64_t dev, uint64_t *res,
                       uint64_t *alloc, uint64_t *nseg) {
  *res = *alloc = *nseg = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    (*nseg)++;
    *res += g->total_size;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED)
        *alloc += b->size;
    }
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap diff [--json] [--top N] A B\n"
          "\n"
          "Compare two snapshots of one process (e.g. two steps of a\n"
          "training loop): reserved and allocated deltas per device,\n"
          "segments opened and closed, and live blocks grouped by\n"
          "allocation site: new (allocated after A was taken), freed (live\n"
          "in A, gone or freed in between), kept (the same allocation in\n"
          "both).  Where both files have a trace, B's trace is aligned with\n"
          "A's end (time_us, checked against the entries themselves; or\n"
          "the entries alone), so a block freed and allocated again at the\n"
          "same address counts as freed + new, not kept; otherwise blocks\n"
          "match by address, size and site.\n"
          "\n"
          "Leak candidates: sites whose live bytes grew from A to B and\n"
          "that have new blocks in B (bytes = the growth, in requested\n"
          "bytes; the other lists count block sizes).  Two files\n"
          "that share nothing (no common trace, block or segment, or two\n"
          "processes by their process_info) get a warning and no\n"
          "candidates.\n"
          "\n"
          "  --json     JSON object {a, b, same_process, shared, warnings,\n"
          "             devices: [{device, alignment: {method (time,\n"
          "             trace, process or address), b_first_entry_after_a\n"
          "             (null without a trace alignment), ambiguous},\n"
          "             reserved_bytes_a, reserved_bytes_b, reserved_delta,\n"
          "             allocated_bytes_a, allocated_bytes_b,\n"
          "             allocated_delta, segments_opened,\n"
          "             segments_opened_bytes, segments_closed,\n"
          "             segments_closed_bytes, new_by_site: [{site, bytes,\n"
          "             count}], freed_by_site: [{site, bytes, count}],\n"
          "             kept_by_site: [{site, bytes, count}],\n"
          "             leak_candidates: [{site, bytes, count, a_bytes,\n"
          "             b_bytes, new_bytes, growing}]}],\n"
          "             leak_candidates: [{device, site, bytes, count,\n"
          "             a_bytes, b_bytes, new_bytes, growing}] (every\n"
          "             device's, all of them), leak_candidate_count,\n"
          "             growing_leak_candidates}\n"
          "  --top N    sites shown per list (default 10, 0 = all)\n"
          "  -h, --help this text\n"
          "\nExit status: 0 no leak candidate, 1 leak candidates found,\n"
          "2 unusable input.\n");
}

/* One site group as a JSON object (with its device for the top-level
 * list of leak candidates). */
static void group_json(cli_json_t *j, const group_t *g, bool leak,
                       bool with_device) {
  cj_obj(j);
  if (with_device) {
    cj_key(j, "device");
    cj_i64(j, g->device);
  }
  cj_key(j, "site");
  cj_cstr(j, g->site);
  cj_key(j, "bytes");
  cj_u64(j, g->bytes);
  cj_key(j, "count");
  cj_u64(j, g->count);
  if (leak) {
    cj_key(j, "a_bytes");
    cj_u64(j, g->a_bytes);
    cj_key(j, "b_bytes");
    cj_u64(j, g->b_bytes);
    cj_key(j, "new_bytes");
    cj_u64(j, g->new_bytes);
    cj_key(j, "growing");
    cj_bool(j, true);
  }
  cj_obj_end(j);
}

static void print_groups(cli_json_t *j, bool json, const char *title,
                         group_t *g, uint32_t n, int64_t dev, long topn,
                         bool leak) {
  char b1[32], b2[32], b3[32];
  uint32_t shown = 0, total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += g[i].device == dev;
  if (json) {
    cj_key(j, title);
    cj_arr(j);
  } else if (total) {
    printf("  %s (%u site%s):\n", title, total, total == 1 ? "" : "s");
  }
  for (uint32_t i = 0; i < n; i++) {
    if (g[i].device != dev)
      continue;
    if (topn > 0 && shown >= (uint32_t)topn)
      break;
    shown++;
    if (json) {
      group_json(j, &g[i], leak, false);
    } else if (leak) {
      printf("    %12s  +%u new  %s  (live %s -> %s)\n",
             cli_bytes(g[i].bytes, b1, sizeof b1), (unsigned)g[i].count,
             g[i].site, cli_bytes(g[i].a_bytes, b2, sizeof b2),
             cli_bytes(g[i].b_bytes, b3, sizeof b3));
    } else {
      printf("    %12s  %5" PRIu64 " x  %s\n",
             cli_bytes(g[i].bytes, b1, sizeof b1), g[i].count, g[i].site);
    }
  }
  if (json)
    cj_arr_end(j);
  else if (total > shown)
    printf("    ... %u more\n", total - shown);
}

/* Devices of either side, sorted. */
static int64_t *union_devices(const msnap_snap_t *sa, const msnap_snap_t *sb,
                              uint32_t *nd) {
  uint32_t nda, ndb;
  int64_t *da = cli_devices(sa, &nda), *db = cli_devices(sb, &ndb);
  int64_t *devs = calloc((size_t)nda + ndb + 1, sizeof *devs);
  *nd = 0;
  if (devs) {
    for (uint32_t i = 0; i < nda; i++)
      devs[(*nd)++] = da[i];
    for (uint32_t i = 0; i < ndb; i++) {
      bool seen = false;
      for (uint32_t k = 0; k < nda; k++)
        seen |= da[k] == db[i];
      if (!seen)
        devs[(*nd)++] = db[i];
    }
  }
  free(da);
  free(db);
  return devs;
}

/*
 * Merge the live blocks of A and B (both sorted by cmp_live) into `all`,
 * each with its side (0 freed, 1 new, 2 kept); kept pairs take the site
 * the side that can name it gives.  al[] is the alignment of each device
 * (indexed like devs).  Returns the number of kept blocks.
 */
static uint64_t merge(live_t *la, uint32_t na, live_t *lb, uint32_t nb,
                      const int64_t *devs, const align_t *al, uint32_t nd,
                      live_t *all, uint32_t *nall) {
  uint64_t kept = 0;
  uint32_t n = 0;
  for (uint32_t i = 0, k = 0; i < na || k < nb;) {
    int c = i >= na ? 1 : k >= nb ? -1 : cmp_live(&la[i], &lb[k]);
    if (c < 0) {
      all[n] = la[i++];
      all[n++].side = 0;
      continue;
    }
    const align_t *a = NULL;
    for (uint32_t d = 0; d < nd; d++)
      if (devs[d] == lb[k].device)
        a = &al[d];
    bool is_new;
    if (a && a->aligned)
      is_new = lb[k].entry >= 0 ? (uint32_t)lb[k].entry >= a->cut
                                : !a->b_reaches_a && c != 0;
    else
      is_new = c != 0 || (strcmp(la[i].site, lb[k].site) &&
                          !cli_site_is_pseudo(la[i].site) &&
                          !cli_site_is_pseudo(lb[k].site));
    if (c == 0 && !is_new) {
      all[n] = la[i++];
      if (cli_site_is_pseudo(all[n].site))
        all[n].site = lb[k].site;
      all[n++].side = 2;
      k++;
      kept++;
      continue;
    }
    if (c == 0) {
      all[n] = la[i++];
      all[n++].side = 0;
    }
    all[n] = lb[k++];
    all[n++].side = 1;
  }
  *nall = n;
  return kept;
}

int cli_cmd_diff(int argc, char **argv) {
  bool json = false;
  long topn = 10;
  const cli_opt_t opts[] = {
      CLI_LONG("top", 't', &topn, 0, LONG_MAX, "--top needs a number >= 0"),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"diff", usage, opts, 2, "expects two files A B",
                         &json, NULL, NULL, false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  msnap_snap_t *sa = NULL, *sb = NULL;
  /* --json: the unusable document names the file that failed (A is
   * loaded first; B is not read when A fails) */
  if (cli_load(argv[first], &sa) != CLI_OK) {
    if (json)
      cli_json_unusable(argv[first], NULL);
    return CLI_UNUSABLE;
  }
  if (cli_load(argv[first + 1], &sb) != CLI_OK) {
    if (json)
      cli_json_unusable(argv[first + 1], NULL);
    msnap__snap_free(sa);
    return CLI_UNUSABLE;
  }
  int rc = CLI_OK;
  uint32_t na = 0, nb = 0, nd = 0;
  live_t *la = collect_live(sa, &na), *lb = collect_live(sb, &nb);
  segk_t *ga = collect_segs(sa), *gb = collect_segs(sb);
  live_t *all = calloc((size_t)na + nb + 1, sizeof *all);
  int64_t *devs = union_devices(sa, sb, &nd);
  align_t *al = calloc((size_t)nd + 1, sizeof *al);
  group_t *gnew = NULL, *gfreed = NULL, *gkept = NULL, *gleak = NULL;
  uint32_t nnew = 0, nfreed = 0, nkept = 0, nleak = 0, nall = 0;
  if (!la || !lb || !ga || !gb || !all || !devs || !al) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
    goto out;
  }
  int same = same_process(sa, sb);
  bool any_aligned = false, reversed = false;
  for (uint32_t d = 0; d < nd; d++) {
    if (align(sa, cli_trace(sa, devs[d]), sb, cli_trace(sb, devs[d]),
              same == 1, &al[d]) != 0) {
      cli_err("out of memory");
      rc = CLI_UNUSABLE;
      goto out;
    }
    any_aligned |= al[d].aligned;
    reversed |= al[d].reversed;
  }
  uint64_t kept = merge(la, na, lb, nb, devs, al, nd, all, &nall);
  uint64_t common_segs = 0;
  for (uint32_t i = 0, k = 0; i < sa->nsegments && k < sb->nsegments;) {
    int c = cmp_seg(&ga[i], &gb[k]);
    common_segs += c == 0;
    i += c <= 0;
    k += c >= 0;
  }
  /* Different processes, or nothing in common at all. */
  bool shared = same != 0 && (any_aligned || kept || common_segs);
  gnew = group(all, nall, 1, &nnew);
  gfreed = group(all, nall, 0, &nfreed);
  gkept = group(all, nall, 2, &nkept);
  gleak = leak_candidates(all, nall, &nleak);
  if (!gnew || !gfreed || !gkept || !gleak) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
    goto out;
  }
  if (!shared || reversed)
    nleak = 0;
  qsort(gnew, nnew, sizeof *gnew, cmp_group_bytes);
  qsort(gfreed, nfreed, sizeof *gfreed, cmp_group_bytes);
  qsort(gkept, nkept, sizeof *gkept, cmp_group_bytes);
  qsort(gleak, nleak, sizeof *gleak, cmp_group_bytes);
  if (nleak)
    rc = CLI_FINDING;

  char warn[4][512];
  uint32_t nwarn = 0;
  if (same == 0)
    snprintf(warn[nwarn++], sizeof warn[0],
             "A and B were written by different processes (process_info: "
             "pid/host differ): no block can be the same allocation; leak "
             "candidates are not reported");
  else if (!shared && same == 1)
    snprintf(warn[nwarn++], sizeof warn[0],
             "A and B share nothing (no common trace entries, no live "
             "block at the same address and size, no common segment) "
             "though process_info names one process%s",
             reversed ? "" : "; leak candidates are not reported");
  else if (!shared)
    snprintf(warn[nwarn++], sizeof warn[0],
             "A and B share nothing: no common trace entries, no live "
             "block at the same address and size, no common segment -- "
             "they look like two different runs; leak candidates are not "
             "reported");
  /* (the order matters only between two snapshots of one run: of two
   * runs, "swap them" would not help.  One run: process_info says so,
   * or, when it does not say, the files share something) */
  bool one_run = same == 1 || (same != 0 && shared);
  if (reversed && one_run)
    snprintf(warn[nwarn++], sizeof warn[0],
             "B's trace ends before A's (time_us): B was taken before A -- "
             "`memsnap diff` compares an older A with a newer B, so run it "
             "with the files swapped; leak candidates are not reported");
  bool ambiguous = false;
  for (uint32_t d = 0; d < nd; d++)
    ambiguous |= al[d].ambiguous;
  if (shared && ambiguous)
    snprintf(warn[nwarn++], sizeof warn[0],
             "B's trace holds A's last entries more than once (a repeating "
             "loop without time_us): the alignment may be a step off");
  /* Devices A knows nothing of (no segment, no trace entry) but B has
   * live blocks on: every one of them is new, its site grew from 0. */
  char absent[256] = "";
  size_t alen = 0;
  uint32_t nabsent = 0;
  /* the devices of B's new blocks, each once (all is in cmp_live order:
   * device first) */
  bool have_last = false;
  int64_t last = 0;
  for (uint32_t i = 0; i < nall; i++) {
    if (all[i].side != 1 || (have_last && all[i].device == last))
      continue;
    have_last = true;
    last = all[i].device;
    int64_t dev = last;
    uint64_t res, alloc, nseg;
    dev_totals(sa, dev, &res, &alloc, &nseg);
    const msnap_trace_list_t *ta = cli_trace(sa, dev);
    if (nseg || (ta && ta->n))
      continue;
    if (nabsent++ < 8 && alen < sizeof absent - 32)
      alen += (size_t)snprintf(absent + alen, sizeof absent - alen,
                               "%s%" PRId64, alen ? ", " : "", dev);
  }
  if (nabsent)
    snprintf(warn[nwarn++], sizeof warn[0],
             "A holds nothing on device%s %s%s (no segment, no trace "
             "entry): B's live blocks there are all new, and their sites "
             "count as grown from 0",
             nabsent > 1 ? "s" : "", absent, nabsent > 8 ? ", ..." : "");

  cli_json_t j;
  cj_init(&j, stdout);
  if (json) {
    cj_obj(&j);
    cj_key(&j, "a");
    cj_cstr(&j, argv[first]);
    cj_key(&j, "b");
    cj_cstr(&j, argv[first + 1]);
    cj_key(&j, "same_process");
    if (same < 0)
      cj_null(&j);
    else
      cj_bool(&j, same == 1);
    cj_key(&j, "shared");
    cj_bool(&j, shared);
    cj_key(&j, "warnings");
    cj_arr(&j);
    for (uint32_t w = 0; w < nwarn; w++)
      cj_cstr(&j, warn[w]);
    cj_arr_end(&j);
    cj_key(&j, "devices");
    cj_arr(&j);
  } else {
    printf("diff %s -> %s\n", cli_shown(argv[first]),
           cli_shown(argv[first + 1]));
    for (uint32_t w = 0; w < nwarn; w++)
      printf("warning: %s\n", warn[w]);
  }
  char b1[32], b2[32], b3[32];
  for (uint32_t d = 0; d < nd; d++) {
    int64_t dev = devs[d];
    uint64_t ra, aa, sga, rb, ab, sgb;
    dev_totals(sa, dev, &ra, &aa, &sga);
    dev_totals(sb, dev, &rb, &ab, &sgb);
    uint64_t opened = 0, closed = 0, obytes = 0, cbytes = 0;
    for (uint32_t i = 0, k = 0; i < sa->nsegments || k < sb->nsegments;) {
      int c = i >= sa->nsegments   ? 1
              : k >= sb->nsegments ? -1
                                   : cmp_seg(&ga[i], &gb[k]);
      if (c == 0) {
        i++;
        k++;
      } else if (c < 0) {
        if (ga[i].device == dev) {
          closed++;
          cbytes += ga[i].size;
        }
        i++;
      } else {
        if (gb[k].device == dev) {
          opened++;
          obytes += gb[k].size;
        }
        k++;
      }
    }
    const align_t *a = &al[d];
    if (json) {
      cj_obj(&j);
      cj_key(&j, "device");
      cj_i64(&j, dev);
      cj_key(&j, "alignment");
      cj_obj(&j);
      cj_key(&j, "method");
      cj_cstr(&j, a->aligned ? a->method : "address");
      cj_key(&j, "b_first_entry_after_a");
      cj_u64_or_null(&j, a->aligned, a->cut);
      cj_key(&j, "ambiguous");
      cj_bool(&j, a->ambiguous);
      cj_obj_end(&j);
      cj_key(&j, "reserved_bytes_a");
      cj_u64(&j, ra);
      cj_key(&j, "reserved_bytes_b");
      cj_u64(&j, rb);
      cj_key(&j, "reserved_delta");
      cj_i64(&j, (int64_t)(rb - ra));
      cj_key(&j, "allocated_bytes_a");
      cj_u64(&j, aa);
      cj_key(&j, "allocated_bytes_b");
      cj_u64(&j, ab);
      cj_key(&j, "allocated_delta");
      cj_i64(&j, (int64_t)(ab - aa));
      cj_key(&j, "segments_opened");
      cj_u64(&j, opened);
      cj_key(&j, "segments_opened_bytes");
      cj_u64(&j, obytes);
      cj_key(&j, "segments_closed");
      cj_u64(&j, closed);
      cj_key(&j, "segments_closed_bytes");
      cj_u64(&j, cbytes);
    } else {
      printf("\ndevice %" PRId64 "\n", dev);
      if (a->aligned)
        printf("  lifetimes  from the traces (B's entry %u is the first "
               "after A; aligned by %s%s)\n",
               a->cut, a->method, a->ambiguous ? ", ambiguous" : "");
      else
        printf("  lifetimes  unknown (%s): blocks matched by address, size "
               "and site\n",
               a->reversed && one_run ? "B was taken before A: the files "
                                        "in the wrong order"
                                      : "no common trace");
      printf("  reserved   %s -> %s (%s%s)\n", cli_bytes(ra, b1, sizeof b1),
             cli_bytes(rb, b2, sizeof b2), rb >= ra ? "+" : "-",
             cli_bytes(rb >= ra ? rb - ra : ra - rb, b3, sizeof b3));
      printf("  allocated  %s -> %s (%s%s)\n", cli_bytes(aa, b1, sizeof b1),
             cli_bytes(ab, b2, sizeof b2), ab >= aa ? "+" : "-",
             cli_bytes(ab >= aa ? ab - aa : aa - ab, b3, sizeof b3));
      printf("  segments   %" PRIu64 " -> %" PRIu64 ": %" PRIu64
             " opened (%s), %" PRIu64 " closed (%s)\n",
             sga, sgb, opened, cli_bytes(obytes, b1, sizeof b1), closed,
             cli_bytes(cbytes, b2, sizeof b2));
    }
    print_groups(&j, json, json ? "new_by_site" : "new live blocks", gnew,
                 nnew, dev, topn, false);
    print_groups(&j, json, json ? "freed_by_site" : "freed live blocks",
                 gfreed, nfreed, dev, topn, false);
    print_groups(&j, json, json ? "kept_by_site" : "kept (live in both)",
                 gkept, nkept, dev, topn, false);
    print_groups(&j, json,
                 json ? "leak_candidates"
                      : "leak candidates (live bytes grew, new blocks "
                        "survive)",
                 gleak, nleak, dev, topn, true);
    if (!json) {
      uint32_t nl = 0;
      for (uint32_t i = 0; i < nleak; i++)
        nl += gleak[i].device == dev;
      if (!nl && shared)
        printf("  leak candidates: none\n");
    }
    if (json)
      cj_obj_end(&j);
  }
  if (json) {
    cj_arr_end(&j);
    /* every device's, largest first, whatever --top */
    cj_key(&j, "leak_candidates");
    cj_arr(&j);
    for (uint32_t i = 0; i < nleak; i++)
      group_json(&j, &gleak[i], true, true);
    cj_arr_end(&j);
    cj_key(&j, "leak_candidate_count");
    cj_u64(&j, nleak);
    cj_key(&j, "growing_leak_candidates");
    cj_bool(&j, nleak > 0);
    cj_obj_end(&j);
    cj_end(&j);
  }
out:
  for (uint32_t i = 0; la && i < na; i++)
    free(la[i].site);
  for (uint32_t i = 0; lb && i < nb; i++)
    free(lb[i].site);
  free(la);
  free(lb);
  free(ga);
  free(gb);
  free(all);
  free(devs);
  free(al);
  free(gnew);
  free(gfreed);
  free(gkept);
  free(gleak);
  msnap__snap_free(sa);
  msnap__snap_free(sb);
  return rc;
}
