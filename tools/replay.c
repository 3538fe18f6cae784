/*
 * replay.c -- the replay engine of `memsnap replay FILE` (replay.h): run
 * a recording's alloc/free stream through memsnap's allocator on the
 * simulated device.  The command line and the report are cmd_replay.c's.
 *
 * What is replayable.  A device trace is replayed from the state at its
 * first entry, which the backward replay (cli_back.c) rebuilds from the
 * final segments.  That state is exact when every block live at the start
 * of the trace is still live at the end (its size is then in the final
 * segments) -- true for every real input with a history, because the ring
 * buffers never wrapped: the trace simply began while memory was already
 * in use (cranberrii: 63 of its 215 segments and 622 blocks predate the
 * first entry).  A trace is not replayable when it holds no alloc/free
 * history, is inconsistent with the final state (see `memsnap check`),
 * or uses expandable segments or private pools (their addresses cannot be
 * forced).  Blocks allocated before the trace and freed in it (a ring
 * buffer that dropped old entries) only tell their requested size; their
 * block size is inferred (infer_sizes) and the start state is reported as
 * "inferred" -- a wrong guess shows up as mismatches.
 *
 * Rebuilding the start state in the allocator ("carving").  For each
 * segment, in address order: the sim runtime is told to return the
 * segment's recorded address (msnap_sim_set_next_address), the segment is
 * created by one allocation of its whole size (large) or of its first
 * piece (small), and then the recorded layout is cut out of it piece by
 * piece -- live blocks with their exact size, free gaps as placeholders in
 * pieces of at most 1 MiB in small segments.  Best fit can only use the
 * segment being carved because every earlier one is fully allocated.
 * When all segments are carved the placeholders are freed, which merges
 * the free gaps exactly as the caching allocator keeps them.
 *
 * Replaying.  alloc -> msnap_malloc(requested size, stream), with the
 * address of a segment_alloc recorded just before it forced on the sim;
 * free_completed -> msnap_free (free_requested is only a marker: a
 * deferred free is performed when it completed in the recording); a run
 * of segment_free -> msnap_empty_cache.  After each call the decision is
 * compared with the recording: same address (exact mode), a segment
 * allocated exactly when the recording allocated one, of the same size.
 * At the end the replayed segments and blocks are compared with the
 * file's, both sides in address order (compare_final: the file's list may
 * be in another order).
 *
 * Modes.  "exact": the recording's own profile (cli_recording_profile)
 * and no --alloc-conf (the recording's own PYTORCH_CUDA_ALLOC_CONF, or
 * PYTORCH_NPU_ALLOC_CONF for npu, is applied): matches_recording says
 * whether every decision matched.  "what-if": another profile or alloc conf;
 * addresses are the sim's own and only segment decisions are compared, to
 * answer "what would my peak reserved be with ...".
 */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "replay.h"

/* ---- recorded address -> replayed pointer ------------------------------ */
/* Open addressing, linear probing, backward-shift deletion; key 0 = empty
 * (address 0 is never a block). */
typedef struct amap_s {
  uint64_t *k, *v;
  size_t cap, n;
} amap_t;

static size_t amap_slot(const amap_t *m, uint64_t k) {
  uint64_t h = k * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 17) & (m->cap - 1);
}

static int amap_put(amap_t *m, uint64_t k, uint64_t v);

static int amap_grow(amap_t *m) {
  amap_t n = {0};
  n.cap = m->cap ? m->cap * 2 : 1024;
  n.k = calloc(n.cap, sizeof *n.k);
  n.v = calloc(n.cap, sizeof *n.v);
  if (!n.k || !n.v) {
    free(n.k);
    free(n.v);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->k[i])
      amap_put(&n, m->k[i], m->v[i]);
  free(m->k);
  free(m->v);
  *m = n;
  return 0;
}

static int amap_put(amap_t *m, uint64_t k, uint64_t v) {
  if ((m->n + 1) * 2 > m->cap && amap_grow(m))
    return -1;
  size_t i = amap_slot(m, k);
  while (m->k[i] && m->k[i] != k)
    i = (i + 1) & (m->cap - 1);
  if (!m->k[i])
    m->n++;
  m->k[i] = k;
  m->v[i] = v;
  return 0;
}

static bool amap_take(amap_t *m, uint64_t k, uint64_t *v) {
  if (!m->cap)
    return false;
  size_t i = amap_slot(m, k);
  while (m->k[i] && m->k[i] != k)
    i = (i + 1) & (m->cap - 1);
  if (!m->k[i])
    return false;
  *v = m->v[i];
  /* backward-shift deletion */
  size_t j = i;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->k[j])
      break;
    size_t h = amap_slot(m, m->k[j]);
    bool move = (j > i) ? (h <= i || h > j) : (h <= i && h > j);
    if (move) {
      m->k[i] = m->k[j];
      m->v[i] = m->v[j];
      i = j;
    }
  }
  m->k[i] = 0;
  m->n--;
  return true;
}

static void amap_free(amap_t *m) {
  free(m->k);
  free(m->v);
  memset(m, 0, sizeof *m);
}

static void mismatch(replay_t *r, dev_replay_t *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void mismatch(replay_t *r, dev_replay_t *d, const char *fmt, ...) {
  d->mismatch_count++;
  if (d->nkept >= r->max_keep || d->nkept >= REPLAY_MAX_MISMATCHES)
    return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  cli_sanitize(buf);
  d->mismatches[d->nkept] = strdup(buf);
  if (d->mismatches[d->nkept])
    d->nkept++;
}

/* Bytes the device holds from the runtime (segments, mapped pages): what
 * an allocation adds to it is the segment it created.  mem_get_info is a
 * runtime query, far cheaper per event than a full msnap_stats_get. */
static uint64_t runtime_used(replay_t *r, int dev) {
  size_t free_b = 0, total_b = 0;
  if (msnap_mem_get_info(r->a, dev, &free_b, &total_b) != 0) return 0;
  return (uint64_t)(total_b - free_b);
}

static int get_stats(replay_t *r, int dev, msnap_stats_t *st) {
  memset(st, 0, sizeof *st);
  st->size = sizeof *st;
  st->version = MSNAP_STATS_VERSION;
  return msnap_stats_get(r->a, dev, st);
}

/* Rounded block size of a request under the profile's default rounding
 * (512-byte multiples, after the NPU padding). */
static uint64_t round_req(const replay_t *r, uint64_t req) {
  uint64_t n = req + r->pad;
  if (n < MSNAP_MIN_BLOCK_SIZE)
    return MSNAP_MIN_BLOCK_SIZE;
  return (n + MSNAP_MIN_BLOCK_SIZE - 1) & ~(MSNAP_MIN_BLOCK_SIZE - 1);
}

/* The request that gives a block of exactly `size` bytes; prefers the
 * recorded requested size when it rounds to the block size. */
static uint64_t req_for(const replay_t *r, uint64_t size, uint64_t requested) {
  if (requested && round_req(r, requested) == size)
    return requested;
  return size > r->pad ? size - r->pad : size;
}

typedef struct piece_s {
  uint64_t addr, size, req;
  bool placeholder;
} piece_t;


/*
 * Blocks live before the first entry and freed in the trace only tell
 * their requested size.  Their block size is inferred: round_size of the
 * request (exact in small segments, where sizes are multiples of 512 and
 * a remainder is always split); in a large segment a free gap of at most
 * 1 MiB cannot exist (every free large-pool block is larger), so a gap
 * that short between the rounded end and the next live block or the
 * segment end belongs to the block.  A wrong guess shows up as replay
 * mismatches.  Returns the number of blocks inferred.
 */
static uint32_t infer_sizes(const replay_t *r, cli_state_t *st) {
  uint32_t n = 0, gi = 0;
  for (uint32_t i = 0; i < st->nb; i++) {
    cli_lblock_t *b = &st->b[i];
    if (b->size != 0)
      continue;
    while (gi < st->ng && st->g[gi].addr + st->g[gi].size <= b->addr)
      gi++;
    uint64_t size = round_req(r, b->requested);
    if (gi < st->ng && st->g[gi].addr <= b->addr) {
      const cli_lseg_t *g = &st->g[gi];
      uint64_t next = g->addr + g->size;
      if (i + 1 < st->nb && st->b[i + 1].addr < next)
        next = st->b[i + 1].addr;
      if (b->addr + size < next && g->is_large &&
          next - (b->addr + size) <= MSNAP_SMALL_SIZE)
        size = next - b->addr;
    }
    b->size = size;
    n++;
  }
  return n;
}

/* A carved piece at replayed pointer p: a placeholder is kept in
 * holders (freed once every segment is carved), a live block goes into
 * the map.  0 or -1 (ENOMEM). */
static int keep_piece(const piece_t *pc, uint64_t p, uint64_t **holders,
                      size_t *nh, size_t *caph, amap_t *map) {
  if (!pc->placeholder)
    return amap_put(map, pc->addr, p);
  if (MSNAP_GROW(*holders, *caph, *nh + 1) != 0)
    return -1;
  (*holders)[(*nh)++] = p;
  return 0;
}

/*
 * Rebuild the start state `st` of device `dev` in the allocator (see the
 * top of the file).  Returns 0, or -1 with the reason in d->reason.
 * Initial live blocks are entered in `map` (recorded -> replayed).
 */
static int carve(replay_t *r, dev_replay_t *d, const cli_state_t *st,
                 amap_t *map) {
  int dev = (int)d->device;
  uint64_t *holders = NULL;
  size_t nh = 0, caph = 0;
  int rc = -1;
  for (uint32_t gi = 0; gi < st->ng; gi++) {
    const cli_lseg_t *g = &st->g[gi];
    bool small = g->size <= MSNAP_SMALL_BUFFER && !g->is_large;
    /* Pieces of this segment: live blocks and gaps between them. */
    piece_t *pc = NULL;
    size_t np = 0, capp = 0;
    uint64_t pos = g->addr, end = g->addr + g->size;
    uint32_t bi = 0;
    while (bi < st->nb && st->b[bi].addr < g->addr)
      bi++;
    while (pos < end) {
      uint64_t next = end;
      const cli_lblock_t *b = NULL;
      if (bi < st->nb && st->b[bi].addr < end) {
        b = &st->b[bi];
        next = b->addr;
      }
      if (b && b->addr < pos) {
        snprintf(d->reason, sizeof d->reason,
                 "blocks overlap in the start state at 0x%" PRIx64, b->addr);
        free(pc);
        goto out;
      }
      while (pos < next) { /* gap */
        uint64_t n = next - pos;
        if (small && n > MSNAP_SMALL_SIZE)
          n = MSNAP_SMALL_SIZE;
        if (MSNAP_GROW(pc, capp, np + 1) != 0) {
          free(pc);
          snprintf(d->reason, sizeof d->reason, "out of memory");
          goto out;
        }
        pc[np++] = (piece_t){pos, n, req_for(r, n, 0), true};
        pos += n;
      }
      if (!b)
        break;
      if (b->size > end - b->addr) {
        snprintf(d->reason, sizeof d->reason,
                 "the block at 0x%" PRIx64 " (%" PRIu64 " B) extends past "
                 "its segment",
                 b->addr, b->size);
        free(pc);
        goto out;
      }
      if (b->size == 0) {
        snprintf(d->reason, sizeof d->reason,
                 "the block at 0x%" PRIx64 " was live before the first trace "
                 "entry and freed in the trace: its block size is unknown",
                 b->addr);
        free(pc);
        goto out;
      }
      if (MSNAP_GROW(pc, capp, np + 1) != 0) {
        free(pc);
        snprintf(d->reason, sizeof d->reason, "out of memory");
        goto out;
      }
      pc[np++] = (piece_t){b->addr, b->size,
                           req_for(r, b->size, b->requested), false};
      pos = b->addr + b->size;
      bi++;
    }
    /* Create the segment at its recorded address. */
    msnap_stats_t s0, s1;
    get_stats(r, dev, &s0);
    msnap_sim_set_next_address(r->ctx, dev, g->addr);
    uint64_t p = 0;
    size_t first = 0;
    int e;
    if (small) {
      e = msnap_malloc(r->a, dev, pc[0].req, (uint64_t)g->stream, &p);
      first = 1;
    } else {
      e = msnap_malloc(r->a, dev, g->size - r->pad, (uint64_t)g->stream, &p);
      if (e == 0)
        e = msnap_free(r->a, p);
    }
    msnap_sim_set_next_address(r->ctx, dev, 0); /* (unused: from cache) */
    get_stats(r, dev, &s1);
    if (e != 0 || p != g->addr ||
        s1.reserved_bytes[MSNAP_STAT_ALL].current -
                s0.reserved_bytes[MSNAP_STAT_ALL].current !=
            (int64_t)g->size) {
      int w = snprintf(
          d->reason, sizeof d->reason,
          "could not recreate the segment 0x%" PRIx64 " of %" PRIu64
          " B that predates the trace (%s; got 0x%" PRIx64 ", +%" PRId64
          " B reserved)",
          g->addr, g->size, e ? msnap_strerror(e) : "wrong placement", p,
          s1.reserved_bytes[MSNAP_STAT_ALL].current -
              s0.reserved_bytes[MSNAP_STAT_ALL].current);
      uint64_t start_reserved = 0;
      for (uint32_t k = 0; k < st->ng; k++)
        start_reserved += st->g[k].size;
      if (e == MSNAP_EOOM && start_reserved > r->device_memory && w > 0 &&
          (size_t)w < sizeof d->reason) {
        /* the cause, with the figure to give --device-memory */
        char need[32], have[32];
        snprintf(d->reason + w, sizeof d->reason - (size_t)w,
                 ": the state at the trace start reserves %s (%" PRIu64
                 " B) in %u segments, more than the simulated device's %s "
                 "(%" PRIu64 " B)",
                 cli_bytes(start_reserved, need, sizeof need),
                 start_reserved, st->ng,
                 cli_bytes(r->device_memory, have, sizeof have),
                 r->device_memory);
      }
      if (small && e == 0 && p)
        msnap_free(r->a, p);
      free(pc);
      goto out;
    }
    if (small) {
      if (keep_piece(&pc[0], p, &holders, &nh, &caph, map) != 0) {
        free(pc);
        goto out;
      }
    }
    for (size_t k = first; k < np; k++) {
      size_t got = 0;
      e = msnap_malloc(r->a, dev, pc[k].req, (uint64_t)g->stream, &p);
      if (e == 0)
        e = msnap_allocation_size(r->a, p, &got);
      if (e != 0 || p != pc[k].addr || got != pc[k].size) {
        snprintf(d->reason, sizeof d->reason,
                 "could not recreate the %s of %" PRIu64 " B at 0x%" PRIx64
                 " that predates the trace (%s; got %zu B at 0x%" PRIx64 ")",
                 pc[k].placeholder ? "free gap" : "block", pc[k].size,
                 pc[k].addr, e ? msnap_strerror(e) : "different layout", got,
                 p);
        if (p && (e == 0 || got == 0))
          msnap_free(r->a, p);
        free(pc);
        goto out;
      }
      if (keep_piece(&pc[k], p, &holders, &nh, &caph, map) != 0) {
        free(pc);
        goto out;
      }
    }
    free(pc);
  }
  rc = 0;
out:
  for (size_t k = 0; k < nh; k++)
    msnap_free(r->a, holders[k]);
  free(holders);
  return rc;
}

/* Approximate start state for what-if runs whose allocator cannot be
 * carved (expandable segments, other rounding): allocate each live block
 * with its requested size, in address order. */
static int approximate(replay_t *r, dev_replay_t *d, const cli_state_t *st,
                       amap_t *map) {
  for (uint32_t i = 0; i < st->nb; i++) {
    uint64_t p;
    uint64_t req = st->b[i].requested ? st->b[i].requested : st->b[i].size;
    int e = msnap_malloc(r->a, (int)d->device, req,
                         (uint64_t)st->b[i].stream, &p);
    if (e) {
      snprintf(d->reason, sizeof d->reason,
               "allocating the %" PRIu64 " B live before the trace failed: "
               "%s",
               req, msnap_strerror(e));
      return -1;
    }
    if (amap_put(map, st->b[i].addr, p))
      return -1;
  }
  return 0;
}

/* The segments of device dev in s, by address (the index breaks ties:
 * two segments at one address, which `memsnap check` reports): a
 * malloc'ed array of *n {address, segment index} (the caller frees it),
 * or NULL when out of memory.  A file's list may be in any order
 * (reversed, or torch_npu's workspace segments appended at its end),
 * which `memsnap check` accepts. */
static cli_key_ix_t *segments_by_address(const msnap_snap_t *s, int64_t dev,
                                         uint32_t *n) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    k += s->segments[i].device == dev;
  cli_key_ix_t *v = malloc((k ? k : 1) * sizeof *v);
  if (v == NULL) return NULL;
  k = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device == dev)
      v[k++] = (cli_key_ix_t){s->segments[i].address, i};
  cli_sort_key_ix(v, k);
  *n = k;
  return v;
}

static bool is_workspace(const dev_replay_t *d, uint64_t addr);

/* Compare the replayed final segments of a device with the file's, both
 * taken in address order.  When the comparison cannot be made (no memory
 * for the replay's snapshot or the sorted lists), d->final_compared stays
 * false and d->final_why says why. */
static void compare_final(replay_t *r, dev_replay_t *d) {
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  so.device = (int)d->device;
  so.include_traces = false;
  msnap_snap_t *m = NULL;
  int e = msnap__snapshot_take(r->a, &so, &m);
  if (e != 0 || !m) {
    snprintf(d->final_why, sizeof d->final_why,
             "the replay's snapshot could not be taken: %s",
             msnap_strerror(e ? e : MSNAP_ENOMEM));
    return;
  }
  const msnap_snap_t *s = r->s;
  uint32_t ns = 0, nm = 0;
  cli_key_ix_t *vs = segments_by_address(s, d->device, &ns);
  cli_key_ix_t *vm = vs ? segments_by_address(m, d->device, &nm) : NULL;
  if (vm == NULL) {
    snprintf(d->final_why, sizeof d->final_why,
             "sorting the segments by address failed: %s",
             msnap_strerror(MSNAP_ENOMEM));
    free(vs);
    msnap__snap_free(m);
    return;
  }
  d->final_compared = true;
  uint32_t i = 0, k = 0;
  while (i < ns || k < nm) {
    if (i < ns && is_workspace(d, s->segments[vs[i].ix].address)) {
      i++; /* torch_npu's workspace: the replay has none */
      continue;
    }
    const msnap_ssegment_t *a = i < ns ? &s->segments[vs[i].ix] : NULL;
    const msnap_ssegment_t *b = k < nm ? &m->segments[vm[k].ix] : NULL;
    if (!b || (a && a->address < b->address)) {
      mismatch(r, d,
               "final state: recorded segment 0x%" PRIx64 " (%" PRIu64
               " B) is not in the replay",
               a->address, a->total_size);
      i++;
      continue;
    }
    if (!a || b->address < a->address) {
      mismatch(r, d,
               "final state: the replay has a segment 0x%" PRIx64
               " (%" PRIu64 " B) the recording has not",
               b->address, b->total_size);
      k++;
      continue;
    }
    if (a->total_size != b->total_size || a->nblocks != b->nblocks) {
      mismatch(r, d,
               "final state: segment 0x%" PRIx64 ": recorded %" PRIu64
               " B in %u %s, replayed %" PRIu64 " B in %u %s",
               a->address, a->total_size, a->nblocks,
               cli_plural(a->nblocks, "block", "blocks"), b->total_size,
               b->nblocks, cli_plural(b->nblocks, "block", "blocks"));
    } else {
      for (uint32_t j = 0; j < a->nblocks; j++) {
        const msnap_sblock_t *x = &s->blocks[a->first_block + j];
        const msnap_sblock_t *y = &m->blocks[b->first_block + j];
        if (x->size != y->size ||
            cli_block_active(x) != cli_block_active(y)) {
          mismatch(r, d,
                   "final state: segment 0x%" PRIx64 " block %u: recorded "
                   "%" PRIu64 " B %s, replayed %" PRIu64 " B %s",
                   a->address, j, x->size, cli_state_name(s, x), y->size,
                   cli_state_name(m, y));
          break;
        }
      }
    }
    i++;
    k++;
  }
  free(vs);
  free(vm);
  msnap__snap_free(m);
}


/* Two final segments of `dev` that overlap (a file whose segment list
 * is repeated, say: `check` reports it): no allocator state has them, so
 * there is nothing to replay.  1 with the reason in why, 0 when none
 * overlap, -1 on ENOMEM. */
typedef struct overlap_why_s {
  const msnap_snap_t *s;
  char *why;
  size_t len;
} overlap_why_t;

static bool overlap_why(void *arg, uint32_t prev, uint32_t next) {
  overlap_why_t *o = arg;
  const msnap_ssegment_t *p = &o->s->segments[prev];
  snprintf(o->why, o->len,
           "the final state is inconsistent: the segment at 0x%" PRIx64
           " overlaps the one at 0x%" PRIx64 " (%" PRIu64 " B; see "
           "memsnap check)",
           o->s->segments[next].address, p->address, p->total_size);
  return false; /* the first is enough */
}

static int overlapping_segments(const msnap_snap_t *s, int64_t dev,
                                char *why, size_t len) {
  overlap_why_t o = {s, why, len};
  int rc = cli_segment_overlaps(s, dev, overlap_why, &o);
  return rc < 0 ? -1 : rc > 0;
}

/* torch_npu's workspace buffers of the device (cli_workspace_addrs) into
 * d->ws: no caching-allocator memory.  The backward replay leaves them out
 * of the start state; the replay also leaves them out of the recorded
 * figures and the final layout.  -1 on ENOMEM. */
static int find_workspace(const msnap_snap_t *s, dev_replay_t *d) {
  free(d->ws);
  return cli_workspace_addrs(s, d->device, &d->ws, &d->nws);
}

static bool is_workspace(const dev_replay_t *d, uint64_t addr) {
  return cli_is_workspace(d->ws, d->nws, addr);
}

/* Why a device trace is not replayable; "" if it is. */
static void replayable(const msnap_snap_t *s, int64_t dev, dev_replay_t *d) {
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  if (!tl || tl->n == 0) {
    snprintf(d->reason, sizeof d->reason,
             s->generation == MSNAP_GEN_SEGMENT_LIST
                 ? "the file is a bare list of segments: it holds no trace"
                 : "the device trace is empty (history was not recorded)");
    return;
  }
  uint64_t allocs = 0, maps = 0, other_pool = 0;
  for (uint32_t i = 0; i < tl->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    allocs += e->action == MSNAP_ACTION_ALLOC;
    maps += e->action == MSNAP_ACTION_SEGMENT_MAP ||
            e->action == MSNAP_ACTION_SEGMENT_UNMAP;
    const msnap_tattr_t *at = msnap__tattr(s, e);
    other_pool += (at->keys & MSNAP_K_POOL_ID) &&
                  (at->pool_id.first || at->pool_id.second);
  }
  char skipped[384];
  if (cli_skipped_history(s, skipped, sizeof skipped)) {
    snprintf(d->reason, sizeof d->reason,
             "the recording skipped its %s: the alloc history has holes",
             skipped);
    return;
  }
  if (allocs == 0) {
    const char *no = "the trace holds no alloc history";
    if (tl->n == 1) {
      const char *an = cli_action_name(s, &tl->v[0]);
      snprintf(d->reason, sizeof d->reason, "%s (its only entry is %s '%s')",
               no, strchr("aeio", an[0]) && an[0] ? "an" : "a", an);
      return;
    }
    /* what it holds instead, by action: "(10 entries: 5 free_requested,
     * 5 free_completed)" */
    uint32_t by[MSNAP_ACTION_COUNT + 1] = {0};
    for (uint32_t i = 0; i < tl->n; i++)
      by[tl->v[i].action < MSNAP_ACTION_COUNT ? tl->v[i].action
                                              : MSNAP_ACTION_COUNT]++;
    int w = snprintf(d->reason, sizeof d->reason, "%s (%u entries", no,
                     tl->n);
    const char *sep = ": ";
    for (int k = 0; k <= MSNAP_ACTION_COUNT; k++) {
      if (!by[k] || w < 0 || (size_t)w >= sizeof d->reason)
        continue;
      w += snprintf(d->reason + w, sizeof d->reason - (size_t)w, "%s%u %s",
                    sep, by[k],
                    k < MSNAP_ACTION_COUNT ? msnap_action_name(k)
                                           : "of other actions");
      sep = ", ";
    }
    if (w >= 0 && (size_t)w < sizeof d->reason)
      snprintf(d->reason + w, sizeof d->reason - (size_t)w, ")");
    return;
  }
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    if (g->is_expandable)
      maps++;
    if (g->pool_id.first || g->pool_id.second)
      other_pool++;
  }
  if (maps) {
    snprintf(d->reason, sizeof d->reason,
             "the recording uses expandable segments (segment_map/unmap): "
             "their virtual addresses cannot be forced on the sim");
    return;
  }
  if (other_pool) {
    snprintf(d->reason, sizeof d->reason,
             "the recording uses private memory pools (CUDA graphs / "
             "MemPool), which the trace does not describe");
    return;
  }
  int ov = overlapping_segments(s, dev, d->reason, sizeof d->reason);
  if (ov != 0) {
    if (ov < 0)
      snprintf(d->reason, sizeof d->reason, "out of memory");
    return;
  }
  if (find_workspace(s, d) != 0) {
    snprintf(d->reason, sizeof d->reason, "out of memory");
    return;
  }
  long v = cli_backward(s, dev, NULL, NULL, &d->start);
  if (v != 0) {
    d->violations = v;
    cli_state_free(&d->start);
    snprintf(d->reason, sizeof d->reason,
             "the trace is inconsistent with the final state (%ld "
             "violations; see memsnap check)",
             v);
    return;
  }
  d->have_start = true; /* replay_device starts from it */
  d->replayable = true;
}

/* The recording's own figures (backward start state + forward walk). */
static void recorded_figures(const msnap_snap_t *s, dev_replay_t *d,
                             const cli_state_t *st) {
  const msnap_trace_list_t *tl = cli_trace(s, d->device);
  uint64_t res = 0;
  for (uint32_t i = 0; i < st->ng; i++)
    res += st->g[i].size;
  uint64_t peak = res;
  for (uint32_t i = 0; tl && i < tl->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (cli_workspace_synthetic(tl, i))
      continue;
    if (e->action == MSNAP_ACTION_SEGMENT_ALLOC) {
      d->rec_segment_allocs++;
      res += e->size;
    } else if (e->action == MSNAP_ACTION_SEGMENT_FREE) {
      d->rec_segment_frees++;
      res -= res >= e->size ? e->size : res;
    }
    if (res > peak)
      peak = res;
  }
  d->rec_peak_reserved = peak;
  d->rec_final_reserved = 0;
  d->rec_inactive_split = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != d->device || is_workspace(d, g->address))
      continue;
    d->rec_final_reserved += g->total_size;
    /* A block is split when its segment holds more than one block. */
    for (uint32_t k = 0; g->nblocks > 1 && k < g->nblocks; k++)
      if (s->blocks[g->first_block + k].state == MSNAP_BLOCK_INACTIVE)
        d->rec_inactive_split += s->blocks[g->first_block + k].size;
  }
}

/* Undo a start state carve or approximate left half made: the blocks it
 * kept (map) freed and the device's segments released, so that a device
 * that is not replayable holds nothing in the replayed snapshot. */
static void release_start(replay_t *r, int dev, amap_t *map) {
  for (size_t k = 0; k < map->cap; k++)
    if (map->k[k])
      msnap_free(r->a, map->v[k]);
  amap_free(map);
  msnap_empty_cache(r->a, dev);
}

/* The history of the written snapshot (keep_history): every device's
 * entries from its first replayed entry on, no stacks.  It is turned on
 * once the first device's start state is built, and paused (every action
 * in msnap_record_history's skip set, which keeps the rings) while a
 * later device's start state is built or released, so that a trace holds
 * only the replay of its own recorded entries, and the trace of a device
 * that is not replayable stays empty. */
static void record_history(replay_t *r, bool paused) {
  msnap_history_options_t ho;
  msnap_history_options_init(&ho);
  ho.context = MSNAP_CONTEXT_NEVER;
  ho.stacks = 0;
  if (paused)
    ho.skip_actions = (1u << MSNAP_ACTION_COUNT) - 1;
  msnap_record_history(r->a, &ho);
}

/* The start state of d in the allocator (carve, or approximate for a
 * what-if replay): 0 when built, 1 when d is not replayable (what was
 * built is released). */
static int build_start(replay_t *r, dev_replay_t *d, cli_state_t *st,
                       amap_t *map) {
  int dev = (int)d->device;
  if (st->ng == 0 && st->nb == 0) {
    d->initial = "empty";
  } else if (carve(r, d, st, map) == 0) {
    d->initial = d->inferred_blocks ? "inferred" : "exact";
  } else if (!r->exact) {
    /* What-if allocators may not reproduce the recorded layout. */
    d->reason[0] = 0;
    release_start(r, dev, map);
    if (approximate(r, d, st, map) != 0) {
      d->replayable = false;
      release_start(r, dev, map);
      return 1;
    }
    d->initial = "approximate";
  } else {
    d->replayable = false;
    release_start(r, dev, map);
    return 1;
  }
  return 0;
}

static int replay_device(replay_t *r, dev_replay_t *d, cli_progress_t *pr) {
  const msnap_snap_t *s = r->s;
  int dev = (int)d->device;
  cli_state_t st;
  amap_t map = {0};
  if (d->have_start) { /* from the replayability check */
    st = d->start;
    memset(&d->start, 0, sizeof d->start);
    d->have_start = false;
  } else if (cli_backward(s, d->device, NULL, NULL, &st) < 0) {
    return -1;
  }
  recorded_figures(s, d, &st);
  d->initial_segments = st.ng;
  d->initial_blocks = st.nb;
  d->inferred_blocks = infer_sizes(r, &st);
  bool paused = r->keep_history && msnap_history_enabled(r->a);
  if (paused)
    record_history(r, true);
  int built = build_start(r, d, &st, &map);
  cli_state_free(&st);
  if (built != 0) {
    if (paused)
      record_history(r, false);
    return 0;
  }
  msnap_reset_peak_stats(r->a, dev);
  if (r->keep_history)
    record_history(r, false);

  msnap_stats_t s0, s1;
  get_stats(r, dev, &s0);
  const msnap_trace_list_t *tl = cli_trace(s, d->device);
  d->entries = tl->n;
  bool seg_pending = false;
  uint64_t seg_addr = 0, seg_size = 0;
  uint32_t seg_entry = 0;
  d->first_failed = CLI_NO_PAIR;
  d->failed_allocs = 0;
  d->oom_failed = 0;
  for (uint32_t i = 0; i < tl->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    cli_progress_tick(pr, i, tl->n);
    if (r->visit && !r->visit(r->visit_arg, i, r->a, dev)) {
      d->stopped = true;
      break;
    }
    if (cli_workspace_synthetic(tl, i))
      continue; /* torch_npu's workspace: not the caching allocator's */
    switch (e->action) {
    case MSNAP_ACTION_SEGMENT_ALLOC:
      if (seg_pending)
        mismatch(r, d,
                 "entry %u: two segment_alloc entries in a row (0x%" PRIx64
                 ", 0x%" PRIx64 "); replay creates at most one per alloc",
                 i, seg_addr, e->addr);
      seg_pending = true;
      seg_addr = e->addr;
      seg_size = e->size;
      seg_entry = i;
      break;
    case MSNAP_ACTION_ALLOC: {
      uint64_t used0 = runtime_used(r, dev);
      bool forced = seg_pending && r->exact;
      if (forced)
        msnap_sim_set_next_address(r->ctx, dev, seg_addr);
      uint64_t p = 0;
      uint64_t stream = (uint64_t)msnap__tattr(s, e)->stream;
      int rc = msnap_malloc(r->a, dev, e->size, stream, &p);
      bool replaced = false;
      if (rc == MSNAP_EINVAL && forced) {
        /* The sim refuses a forced address that is not a free, aligned
         * range: after an earlier divergence the replay may hold memory
         * where the recording made this segment (or the file's address
         * is one no device gives).  A hard runtime error leaves the
         * allocator as it was (alloc.c), so the same alloc again, placed
         * by the runtime, is the replay of this entry; the placement is
         * one mismatch, not a failed alloc. */
        rc = msnap_malloc(r->a, dev, e->size, stream, &p);
        if (rc == 0) {
          replaced = true;
          mismatch(r, d,
                   "entry %u: the recording's new segment at 0x%" PRIx64
                   " is not a free 512-aligned range in the replay (memory "
                   "the replay holds after an earlier divergence, or an "
                   "address no device gives): placed at 0x%" PRIx64
                   " by the runtime",
                   i, seg_addr, p);
        }
      }
      /* An alloc the replay served from cached memory left the override
       * unused: it must not place a later entry's segment. */
      if (forced)
        msnap_sim_set_next_address(r->ctx, dev, 0);
      /* A new segment (or, with expandable segments, newly mapped
       * pages) is seen as growth of the memory held from the runtime. */
      int64_t grew = (int64_t)(runtime_used(r, dev) - used0);
      int64_t made = grew > 0;
      d->segment_allocs += grew > 0;
      if (rc != 0) {
        if (d->first_failed == CLI_NO_PAIR) {
          d->first_failed = i;
          d->first_failed_rc = rc;
        }
        d->failed_allocs++;
        d->oom_failed += rc == MSNAP_EOOM || rc == MSNAP_EREJECTED;
        mismatch(r, d, "entry %u: alloc of %" PRIu64 " B failed in the "
                       "replay: %s",
                 i, e->size, msnap_strerror(rc));
      } else {
        if (seg_pending && made == 0)
          mismatch(r, d,
                   "entry %u: the recording allocated a segment of %" PRIu64
                   " B (entry %u) for this alloc of %" PRIu64
                   " B; the replay reused cached memory",
                   i, seg_size, seg_entry, e->size);
        else if (!seg_pending && made > 0)
          mismatch(r, d,
                   "entry %u: the replay allocated a new segment of %" PRId64
                   " B for this alloc of %" PRIu64
                   " B; the recording reused cached memory",
                   i, grew, e->size);
        else if (seg_pending && made > 0 && (uint64_t)grew != seg_size)
          mismatch(r, d,
                   "entry %u: segment size %" PRId64 " B in the replay, %"
                   PRIu64 " B in the recording (alloc of %" PRIu64 " B)",
                   i, grew, seg_size, e->size);
        if (r->exact && p != e->addr && !replaced)
          mismatch(r, d,
                   "entry %u: alloc of %" PRIu64 " B placed at 0x%" PRIx64
                   " in the replay, 0x%" PRIx64 " in the recording",
                   i, e->size, p, e->addr);
        if (amap_put(&map, e->addr, p))
          return -1;
      }
      /* (the override was cancelled above when no segment used it) */
      seg_pending = false;
      break;
    }
    case MSNAP_ACTION_FREE_COMPLETED: {
      uint64_t p;
      if (!amap_take(&map, e->addr, &p)) {
        mismatch(r, d, "entry %u: free_completed of 0x%" PRIx64
                       " which the replay never allocated",
                 i, e->addr);
        break;
      }
      int rc = msnap_free(r->a, p);
      if (rc)
        mismatch(r, d, "entry %u: free of 0x%" PRIx64 " failed: %s", i, p,
                 msnap_strerror(rc));
      break;
    }
    case MSNAP_ACTION_SEGMENT_FREE: {
      /* A run of segment_free entries is one release of cached blocks. */
      uint32_t k = i;
      while (k < tl->n && tl->v[k].action == MSNAP_ACTION_SEGMENT_FREE)
        k++;
      msnap_stats_t f0, f1;
      get_stats(r, dev, &f0);
      msnap_empty_cache(r->a, dev);
      get_stats(r, dev, &f1);
      int64_t freed = f1.segment[MSNAP_STAT_ALL].freed -
                      f0.segment[MSNAP_STAT_ALL].freed;
      if (freed != (int64_t)(k - i))
        mismatch(r, d,
                 "entries %u-%u: the recording released %u cached %s, "
                 "the replay's empty_cache released %" PRId64,
                 i, k - 1, k - i, cli_plural(k - i, "segment", "segments"),
                 freed);
      i = k - 1;
      break;
    }
    default:
      break;
    }
  }
  if (r->visit && !d->stopped)
    r->visit(r->visit_arg, tl->n, r->a, dev);
  get_stats(r, dev, &s1);
  d->segment_frees = (uint64_t)(s1.segment[MSNAP_STAT_ALL].freed -
                                s0.segment[MSNAP_STAT_ALL].freed);
  d->peak_reserved = (uint64_t)s1.reserved_bytes[MSNAP_STAT_ALL].peak;
  d->final_reserved = (uint64_t)s1.reserved_bytes[MSNAP_STAT_ALL].current;
  d->inactive_split = (uint64_t)s1.inactive_split_bytes[MSNAP_STAT_ALL].current;
  d->peak_inactive_split =
      (uint64_t)s1.inactive_split_bytes[MSNAP_STAT_ALL].peak;
  d->peak_allocated = (uint64_t)s1.allocated_bytes[MSNAP_STAT_ALL].peak;
  d->final_allocated = (uint64_t)s1.allocated_bytes[MSNAP_STAT_ALL].current;
  if (r->exact && !d->stopped)
    compare_final(r, d);
  else
    snprintf(d->final_why, sizeof d->final_why, "%s",
             d->stopped ? "the replay stopped early"
                        : "what-if mode compares segment decisions only");
  char msg[256];
  if (msnap_check_invariants(r->a, msg, sizeof msg) != 0)
    mismatch(r, d, "allocator invariant violated after the replay: %s", msg);
  amap_free(&map);
  return 0;
}


/* ---- the replayed snapshot, with the recording's stacks ----------------- */

typedef struct xfer_s {
  const msnap_snap_t *src;
  msnap_snap_t *dst;
  msnap_stack_t *memo; /* src stack id -> dst stack id + 1 */
} xfer_t;

static msnap_str_t xstr(xfer_t *x, msnap_str_t id) {
  if (id == MSNAP_STR_ABSENT)
    return MSNAP_STR_ABSENT;
  size_t len;
  const char *p = cli_str(x->src, id, &len);
  return msnap__snap_intern(x->dst, p, len);
}

/* Copy a stack of the recording into the replayed model (memoized). */
static msnap_stack_t xstack(xfer_t *x, msnap_stack_t st) {
  if (st <= MSNAP_STACK_EMPTY || st >= x->src->nstacks)
    return st <= MSNAP_STACK_EMPTY ? st : MSNAP_STACK_ABSENT;
  if (x->memo[st])
    return x->memo[st] - 1;
  uint32_t n;
  const uint32_t *fr = cli_stack(x->src, st, &n);
  uint32_t *ids = malloc((n + 1) * sizeof *ids);
  if (!ids)
    return MSNAP_STACK_ABSENT;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (fr[i] >= x->src->nframes)
      continue;
    const msnap_frame_t *f = &x->src->frames[fr[i]];
    msnap_frame_t g = {.name = xstr(x, f->name),
                       .filename = xstr(x, f->filename),
                       .line = f->line,
                       .fx_node_op = xstr(x, f->fx_node_op),
                       .fx_node_name = xstr(x, f->fx_node_name),
                       .fx_node_target = xstr(x, f->fx_node_target),
                       .fx_original_trace = xstr(x, f->fx_original_trace)};
    uint32_t id = msnap__snap_frame(x->dst, &g);
    if (id != UINT32_MAX)
      ids[k++] = id;
  }
  msnap_stack_t out = msnap__snap_stack(x->dst, ids, k);
  free(ids);
  x->memo[st] = out + 1;
  return out;
}

/* A generic value of the recording, copied into the replayed model. */
static int xgv(xfer_t *x, const msnap_gv_t *v, msnap_gv_t *out) {
  *out = *v;
  if (v->kind == MSNAP_GV_STR) {
    out->u.s = xstr(x, v->u.s);
    return out->u.s ? 0 : -1;
  }
  if (v->kind != MSNAP_GV_LIST && v->kind != MSNAP_GV_TUPLE &&
      v->kind != MSNAP_GV_DICT)
    return 0;
  out->u.seq.n = 0;
  out->u.seq.items = calloc((size_t)v->u.seq.n + 1, sizeof *out->u.seq.items);
  if (!out->u.seq.items) {
    out->kind = MSNAP_GV_NONE;
    return -1;
  }
  for (uint32_t i = 0; i < v->u.seq.n; i++) {
    out->u.seq.n = i + 1;
    if (xgv(x, &v->u.seq.items[i], &out->u.seq.items[i]) != 0)
      return -1;
  }
  return 0;
}

/*
 * process_info of the replayed snapshot: who made the recording (pid,
 * host, rank, world_size, local_rank, devices: the recording's when it
 * has them), what made this file (runtime "sim", the replay's profile),
 * and replayed: true.
 */
static int replayed_process_info(xfer_t *x, const replay_t *r) {
  static const char *const keep[] = {"pid", "host", "rank", "world_size",
                                     "local_rank", "devices"};
  const msnap_gv_t *src = &x->src->process_info;
  msnap_snap_t *m = x->dst;
  msnap_gv_t d = {.kind = MSNAP_GV_DICT};
  d.u.seq.items = calloc(2 * 10, sizeof *d.u.seq.items);
  if (!d.u.seq.items)
    return -1;
  int rc = 0;
#define PUT_(k, v)                                                            \
  do {                                                                        \
    d.u.seq.items[d.u.seq.n].kind = MSNAP_GV_STR;                             \
    d.u.seq.items[d.u.seq.n++].u.s = msnap__snap_intern(m, k, strlen(k));     \
    d.u.seq.items[d.u.seq.n++] = (v);                                         \
  } while (0)
  for (size_t i = 0; i < sizeof keep / sizeof *keep && rc == 0; i++) {
    const msnap_gv_t *v = cli_gv_get(x->src, src, keep[i]);
    msnap_gv_t c;
    if (v && (rc = xgv(x, v, &c)) == 0)
      PUT_(keep[i], c);
    else if (v)
      msnap__gv_free(&c);
  }
  msnap_gv_t sv = {.kind = MSNAP_GV_STR};
  sv.u.s = msnap__snap_intern(m, "sim", 3);
  PUT_("runtime", sv);
  sv.u.s = msnap__snap_intern(m, r->profile_name, strlen(r->profile_name));
  PUT_("profile", sv);
  msnap_gv_t bv = {.kind = MSNAP_GV_BOOL, .u.b = true};
  PUT_("replayed", bv);
#undef PUT_
  for (uint32_t i = 0; i < d.u.seq.n; i += 2)
    if (d.u.seq.items[i].u.s == 0)
      rc = -1; /* a key not interned: ENOMEM */
  msnap__gv_free(&m->process_info);
  m->process_info = d;
  m->top_keys |= MSNAP_TOP_PROCESS_INFO;
  return rc;
}

/*
 * Take the replayed allocator's snapshot and make it as faithful to the
 * recording as the replay allows.  Its key bits are settled first
 * (msnap__snap_settle_keys), so that what the recording does not give is
 * left out rather than made up:
 *   - entries, blocks and segments take the recording's stacks: the
 *     replay trace is matched to the recorded one in order by action (and
 *     address in exact mode); blocks and segments by address and size;
 *   - times: the recorded ones where matched, never decreasing; an entry
 *     of the replay's own takes the time of the last recorded entry
 *     matched before it (the call that caused it); a recording without
 *     time_us (2.1 and older) gives entries without time_us;
 *   - live blocks keep the recording's requested_size (not the request
 *     the replay made to recreate a block that predates the trace), or
 *     none when the recording has none; segments' requested_size is the
 *     sum over their active blocks;
 *   - process_info names the recording's process (replayed_process_info).
 * A device that was not replayed has an empty trace (record_history).
 * Returns 0 and the model in *out, or an error (then the caller dumps
 * without stacks).
 */
static int replayed_model(replay_t *r, msnap_snap_t **out) {
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  msnap_snap_t *m = NULL;
  int rc = msnap__snapshot_take(r->a, &so, &m);
  if (rc != 0 || !m)
    return rc ? rc : MSNAP_ENOMEM;
  const msnap_snap_t *s = r->s;
  xfer_t x = {s, m, calloc(s->nstacks + 1, sizeof *x.memo)};
  if (!x.memo || msnap__snap_settle_keys(m) != 0 ||
      replayed_process_info(&x, r) != 0) {
    free(x.memo);
    msnap__snap_free(m);
    return MSNAP_ENOMEM;
  }
  for (uint32_t d = 0; d < m->ndevices; d++) {
    const msnap_trace_list_t *rt = cli_trace(s, d);
    msnap_trace_list_t *mt = &m->device_traces[d];
    uint32_t i = 0;
    bool have_t = false;
    int64_t last_t = 0;
    for (uint32_t q = 0; rt && q < rt->n && !have_t; q++)
      if (msnap__tattr(s, &rt->v[q])->keys & MSNAP_K_TIME) {
        have_t = true;
        last_t = rt->v[q].time_us;
      }
    for (uint32_t k = 0; k < mt->n; k++) {
      msnap_strace_t *e = &mt->v[k];
      msnap_tattr_t at = *msnap__tattr(m, e);
      if (have_t) {
        e->time_us = last_t;
        at.keys |= MSNAP_K_TIME;
      } else {
        /* the replay's own clock says nothing about the recording */
        e->time_us = 0;
        at.keys &= (uint16_t)~MSNAP_K_TIME;
      }
      for (uint32_t look = i; rt && look < rt->n && look < i + 64; look++) {
        const msnap_strace_t *f = &rt->v[look];
        if (f->action != e->action || (r->exact && f->addr != e->addr))
          continue;
        if (f->frames != MSNAP_STACK_ABSENT) {
          e->frames = xstack(&x, f->frames);
          at.keys |= MSNAP_K_FRAMES;
        }
        if ((msnap__tattr(s, f)->keys & MSNAP_K_TIME) &&
            f->time_us > last_t) {
          e->time_us = f->time_us;
          last_t = f->time_us;
        }
        i = look + 1;
        break;
      }
      if (msnap__snap_trace_set_attr(m, e, &at) < 0) {
        free(x.memo);
        msnap__snap_free(m);
        return MSNAP_ENOMEM;
      }
    }
  }
  for (uint32_t gi = 0; gi < m->nsegments; gi++) {
    msnap_ssegment_t *g = &m->segments[gi];
    for (uint32_t si = 0; si < s->nsegments; si++) {
      const msnap_ssegment_t *h = &s->segments[si];
      if (h->device != g->device || h->address != g->address)
        continue;
      if (h->keys & MSNAP_K_FRAMES)
        g->frames = xstack(&x, h->frames);
      for (uint32_t k = 0; k < g->nblocks; k++) {
        msnap_sblock_t *b = &m->blocks[g->first_block + k];
        if (!cli_block_active(b))
          continue;
        uint64_t ba = cli_block_addr(m, g, k);
        for (uint32_t j = 0; j < h->nblocks; j++) {
          const msnap_sblock_t *c = &s->blocks[h->first_block + j];
          if (cli_block_addr(s, h, j) == ba && c->size == b->size) {
            msnap_stack_t st = cli_block_stack(s, c);
            if (st != MSNAP_STACK_ABSENT) {
              b->frames = xstack(&x, st);
              b->keys |= MSNAP_K_FRAMES;
            }
            /* The recording's requested_size, not the request the
             * replay had to make to recreate a block that predates the
             * trace; none when the recording has none. */
            if (c->keys & MSNAP_K_REQUESTED)
              b->requested_size = c->requested_size;
            else
              b->keys &= (uint16_t)~MSNAP_K_REQUESTED;
            break;
          }
        }
      }
      break;
    }
    uint64_t req = 0;
    for (uint32_t k = 0; k < g->nblocks; k++)
      if (cli_block_active(&m->blocks[g->first_block + k]))
        req += m->blocks[g->first_block + k].requested_size;
    g->requested_size = req;
  }
  free(x.memo);
  *out = m;
  return 0;
}

/* ---- the engine's entry points -------------------------------------------- */

/* A failure of replay_init / replay_run: the reason in r->why, and on
 * stderr unless r->quiet. */
static void fail(replay_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail(replay_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
  if (!r->quiet)
    cli_err("%s", r->why);
}

int replay_init(replay_t *r, const msnap_snap_t *s, const char *file,
                const char *profile, const char *conf, uint32_t max_keep) {
  memset(r, 0, sizeof *r);
  r->s = s;
  r->file = file;
  r->max_keep = max_keep;
  r->device_memory = REPLAY_DEVICE_MEMORY;
  r->only_device = -1;
  /* Unless told, replay with the profile the recording was made with. */
  if (profile == NULL) {
    r->profile_from_file = true;
    profile = cli_recording_profile_why(s, &r->profile_why);
  }
  r->profile_name = profile;
  r->profile = strcmp(profile, "npu") == 0 ? MSNAP_PROFILE_NPU
                                           : MSNAP_PROFILE_CUDA;
  r->pad = r->profile == MSNAP_PROFILE_NPU ? MSNAP_NPU_PAD : 0;
  r->exact = conf == NULL && strcmp(profile, cli_recording_profile(s)) == 0;
  if (r->exact) {
    const char *rc_conf = cli_gv_str(s, &s->allocator_settings,
                                     r->profile == MSNAP_PROFILE_NPU
                                         ? "PYTORCH_NPU_ALLOC_CONF"
                                         : "PYTORCH_CUDA_ALLOC_CONF");
    conf = rc_conf ? rc_conf : "";
  }
  r->conf = conf;

  /* Devices: every device with segments or a trace. */
  r->devs = cli_devices(s, &r->nd);
  r->dr = calloc(r->nd + 1, sizeof *r->dr);
  if (!r->dr || (r->nd && !r->devs)) {
    fail(r, "out of memory");
    return CLI_UNUSABLE;
  }
  for (uint32_t k = 0; k < r->nd; k++) {
    r->dr[k].device = r->devs[k];
    r->dr[k].first_failed = CLI_NO_PAIR;
    replayable(s, r->devs[k], &r->dr[k]);
  }
  if (r->nd == 0)
    snprintf(r->dr[0].reason, sizeof r->dr[0].reason,
             "the file holds no segments and no trace");
  return CLI_OK;
}

int replay_run(replay_t *r) {
  bool any = false;
  int64_t maxdev = 0;
  for (uint32_t k = 0; k < r->nd; k++) {
    dev_replay_t *d = &r->dr[k];
    if (r->only_device >= 0 && d->device != r->only_device)
      d->replayable = false;
    if (!d->replayable)
      continue;
    any = true;
    if (d->device > maxdev)
      maxdev = d->device;
  }
  if (any && maxdev >= MSNAP_SIM_MAX_DEVICES) {
    fail(r, "%s: device index %" PRId64 " is out of range for the sim",
         r->file ? r->file : "replay", maxdev);
    for (uint32_t k = 0; k < r->nd; k++)
      if (r->dr[k].replayable) {
        r->dr[k].replayable = false;
        snprintf(r->dr[k].reason, sizeof r->dr[k].reason,
                 "device index %" PRId64 " is out of range for the sim "
                 "(at most %d devices)", maxdev, MSNAP_SIM_MAX_DEVICES);
      }
    return CLI_OK;
  }
  if (!any)
    return CLI_OK; /* nothing to replay */
  msnap_options_t mo;
  char ebuf[256] = "";
  msnap_options_init(&mo);
  mo.profile = (int)r->profile;
  mo.runtime_name = "sim";
  mo.alloc_conf = r->conf;
  mo.caching_disabled = 0;
  mo.sim_devices = (int)maxdev + 1;
  mo.sim_memory = r->device_memory;
  mo.error_buf = ebuf;
  mo.error_buf_len = sizeof ebuf;
  int e = msnap_allocator_create(&mo, &r->a);
  if (e == MSNAP_ECONF && r->conf_given) {
    /* the caller's alloc conf: its reason alone ("alloc conf: " off) */
    char why[sizeof ebuf + 16];
    replay_conf_reason(ebuf, why, sizeof why);
    snprintf(r->why, sizeof r->why,
             "--alloc-conf is not valid for the %s profile: %s",
             r->profile_name, why[0] ? why : msnap_strerror(e));
    r->conf_invalid = true;
    return CLI_UNUSABLE;
  }
  if (e == MSNAP_ECONF && r->exact) {
    /* the recording's own alloc conf (a value memsnap's parser refuses,
     * such as backend:cudaMallocAsync): not replayable as recorded, said
     * per device as every other reason (the JSON report too) */
    char why[sizeof ebuf + 16];
    replay_conf_reason(ebuf, why, sizeof why);
    for (uint32_t k = 0; k < r->nd; k++)
      if (r->dr[k].replayable) {
        r->dr[k].replayable = false;
        snprintf(r->dr[k].reason, sizeof r->dr[k].reason,
                 "the recording's alloc conf \"%.120s%s\" is not valid for "
                 "the %s profile (%s); give one with --alloc-conf for a "
                 "what-if replay",
                 r->conf, strlen(r->conf) > 120 ? "..." : "",
                 r->profile_name, why[0] ? why : msnap_strerror(e));
      }
    return CLI_OK;
  }
  if (e != 0) {
    const char *conf = r->conf;
    fail(r, "cannot create the %s allocator%s%s: %s%s%s", r->profile_name,
         conf && *conf ? " with alloc conf " : "", conf ? conf : "",
         msnap_strerror(e), ebuf[0] ? ": " : "", ebuf);
    return CLI_UNUSABLE;
  }
  r->ctx = msnap_runtime_ctx(r->a);
  r->pad = msnap__npu_pad(r->a);
  cli_progress_t pr;
  cli_progress_init(&pr, "replay");
  int rc = CLI_OK;
  for (uint32_t k = 0; k < r->nd && rc == CLI_OK; k++)
    if (r->dr[k].replayable && replay_device(r, &r->dr[k], &pr) < 0) {
      r->nomem = true;
      fail(r, "out of memory during the replay");
      rc = CLI_UNUSABLE;
    }
  cli_progress_end(&pr);
  return rc;
}

int replay_write(replay_t *r, const char *out) {
  msnap_snap_t *m = NULL;
  int e = replayed_model(r, &m);
  if (e == 0) {
    e = msnap__snap_write_file(m, out, false);
    msnap__snap_free(m);
  } else {
    msnap_snapshot_options_t so;
    msnap_snapshot_options_init(&so);
    e = msnap_dump_snapshot(r->a, &so, out);
  }
  if (e != 0) {
    cli_write_failed(out, "the replayed snapshot", e, msnap_last_error());
    return CLI_UNUSABLE;
  }
  fprintf(stderr, "memsnap: wrote the replayed snapshot to %s\n",
          cli_output_shown(out));
  return CLI_OK;
}

void replay_conf_reason(const char *msg, char *out, size_t n) {
  static const char env[] = "MEMSNAP_PROFILE=npu";
  if (strncmp(msg, "alloc conf: ", 12) == 0)
    msg += 12;
  const char *at = strstr(msg, env);
  if (at == NULL)
    snprintf(out, n, "%s", msg);
  else
    snprintf(out, n, "%.*s--profile npu%s", (int)(at - msg), msg,
             at + sizeof env - 1);
}

void replay_totals(const replay_t *r, replay_totals_t *t) {
  memset(t, 0, sizeof *t);
  t->matches = true;
  for (uint32_t k = 0; k < r->nd; k++) {
    const dev_replay_t *d = &r->dr[k];
    if (!d->replayable)
      continue;
    t->replayed = true;
    t->matches &= d->mismatch_count == 0;
    t->failed_allocs += d->failed_allocs;
    t->oom_failed += d->oom_failed;
    t->segment_allocs += d->segment_allocs;
    t->segment_frees += d->segment_frees;
    t->peak_reserved += d->peak_reserved;
    t->final_reserved += d->final_reserved;
    t->inactive_split += d->inactive_split;
  }
}

void replay_free(replay_t *r) {
  if (r->a)
    msnap_allocator_destroy(r->a);
  for (uint32_t k = 0; r->dr && k < r->nd; k++) {
    for (uint32_t i = 0; i < r->dr[k].nkept; i++)
      free(r->dr[k].mismatches[i]);
    cli_state_free(&r->dr[k].start);
    free(r->dr[k].ws);
  }
  free(r->dr);
  free(r->devs);
  memset(r, 0, sizeof *r);
}

/*
 * The engine for the other commands (summary's fragmentation at the peak
 * and its OOM what-if): device dev of s through a fresh allocator on the
 * sim, as `memsnap replay` does it, with cfg->visit called in every state
 * (cli.h).  Exact mode (recorded addresses) with the cuda profile and no
 * alloc conf, else what-if.  Nothing is printed: failures are reasons.
 */
int cli_replay_run(const msnap_snap_t *s, int64_t dev,
                   const cli_replay_cfg_t *cfg, cli_replay_res_t *res) {
  memset(res, 0, sizeof *res);
  res->first_failed = CLI_NO_PAIR;
  replay_t r;
  if (replay_init(&r, s, NULL, cfg->profile, cfg->alloc_conf, 0) !=
      CLI_OK) {
    replay_free(&r);
    return -1; /* only ENOMEM fails here */
  }
  r.quiet = true;
  r.only_device = dev;
  r.visit = cfg->visit;
  r.visit_arg = cfg->arg;
  if (cfg->sim_memory)
    r.device_memory = cfg->sim_memory;
  res->exact = r.exact;
  const dev_replay_t *d = NULL;
  for (uint32_t k = 0; k < r.nd && !d; k++)
    if (r.dr[k].device == dev)
      d = &r.dr[k];
  if (!d) {
    snprintf(res->reason, sizeof res->reason,
             "device %" PRId64 " has no segments and no trace", dev);
    replay_free(&r);
    return 0;
  }
  int rc = 0;
  if (d->replayable && replay_run(&r) != CLI_OK) {
    rc = r.nomem ? -1 : 0;
    snprintf(res->reason, sizeof res->reason, "%s", r.why);
  } else if (!d->replayable) {
    /* not replayable from the start, or the start state could not be
     * rebuilt (replay_device says why) */
    res->violations = d->violations;
    snprintf(res->reason, sizeof res->reason, "%s",
             d->reason[0] ? d->reason : r.why);
  } else {
    res->replayable = true;
    res->initial = d->initial;
    res->mismatches = d->mismatch_count;
    res->matches = d->mismatch_count == 0;
    res->first_failed = d->first_failed;
  }
  replay_free(&r);
  return rc;
}
