/*
 * cli_stacks.c -- which stack to show for a live block.
 *
 * A block's own `frames` are the first choice.  Several real files leave
 * them empty ([]) for some or all live blocks while their trace entries
 * carry stacks, and 2.0 files keep stacks only in the block `history`
 * (newest element first).  The resolver therefore answers, for a live
 * block at address A of device D:
 *
 *   1. the block's own frames when they hold at least one frame;
 *   2. (2.0) the frames of its first history element;
 *   3. the frames of the latest `alloc` entry at A in D's trace, provided
 *      no `free_completed` at A follows it (that entry is the allocation
 *      that is still live);
 *   4. otherwise, when D has a non-empty trace and no such entry exists,
 *      the block was allocated before the first recorded entry (before
 *      recording began, or in entries the ring buffer dropped): there is no
 *      stack for it anywhere in the file, and the answer says so;
 *   5. otherwise no stack.
 *
 * Invariants of cli_stacks_t: per device, `addr` is strictly increasing
 * and `entry[i]` is the index in the device trace of the live alloc entry
 * at addr[i]; only addresses of the device's active blocks are indexed
 * (the only ones rule 3 is asked about).  cli_stacks_check() verifies them, after every
 * cli_stacks_init() in builds with MSNAP_DEBUG >= 2.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/base.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/*
 * Live alloc entries of one device, for the addresses of its active
 * blocks only (the only ones ever asked about): the trace is walked from
 * its newest entry back, and the first alloc or free_completed met at
 * such an address decides it -- an alloc is the live entry, a free says
 * the block predates what the trace holds of it.  The walk stops when
 * every address is decided.  Memory: a few words per active block.
 */
static int index_device(cli_stacks_dev_t *d, const msnap_snap_t *s,
                        int64_t dev, const msnap_trace_list_t *tl) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    for (uint32_t k = 0; k < g->nblocks; k++)
      n += cli_block_active(&s->blocks[g->first_block + k]);
  }
  d->addr = malloc(((size_t)n + 1) * sizeof *d->addr);
  d->entry = malloc(((size_t)n + 1) * sizeof *d->entry);
  if (!d->addr || !d->entry)
    return -1;
  uint32_t k = 0;
  for (cli_bwalk_t it = cli_bwalk(s, dev); cli_bwalk_next(&it);)
    if (cli_block_active(it.b) && k < n)
      d->addr[k++] = it.addr;
  qsort(d->addr, k, sizeof *d->addr, cmp_u64);
  uint32_t m = 0;
  for (uint32_t i = 0; i < k; i++)
    if (m == 0 || d->addr[m - 1] != d->addr[i])
      d->addr[m++] = d->addr[i];
  /* an open-addressing table: address -> position in addr[] */
  uint32_t cap = 16;
  while (cap < 2 * m + 2)
    cap *= 2;
  uint32_t *slot = malloc((size_t)cap * sizeof *slot);
  if (!slot)
    return -1;
  memset(slot, 0xff, (size_t)cap * sizeof *slot);
  for (uint32_t i = 0; i < m; i++) {
    uint32_t h = (uint32_t)((d->addr[i] * 0x9e3779b97f4a7c15ull) >> 32) &
                 (cap - 1);
    while (slot[h] != UINT32_MAX)
      h = (h + 1) & (cap - 1);
    slot[h] = i;
    d->entry[i] = UINT32_MAX; /* undecided */
  }
  uint32_t left = m;
  for (uint32_t ii = tl->n; ii > 0 && left > 0; ii--) {
    const msnap_strace_t *e = &tl->v[ii - 1];
    if (e->action != MSNAP_ACTION_ALLOC &&
        e->action != MSNAP_ACTION_FREE_COMPLETED)
      continue;
    uint32_t h = (uint32_t)((e->addr * 0x9e3779b97f4a7c15ull) >> 32) &
                 (cap - 1);
    while (slot[h] != UINT32_MAX && d->addr[slot[h]] != e->addr)
      h = (h + 1) & (cap - 1);
    if (slot[h] == UINT32_MAX || d->entry[slot[h]] != UINT32_MAX)
      continue;
    /* the newest event at this address: an alloc is live; a free means
     * the live block was allocated before the trace */
    d->entry[slot[h]] = e->action == MSNAP_ACTION_ALLOC ? ii - 1
                                                        : UINT32_MAX - 1;
    left--;
  }
  free(slot);
  d->n = 0;
  for (uint32_t i = 0; i < m; i++)
    if (d->entry[i] < UINT32_MAX - 1) {
      d->addr[d->n] = d->addr[i];
      d->entry[d->n] = d->entry[i];
      d->n++;
    }
  return 0;
}

int cli_stacks_init(cli_stacks_t *x, const msnap_snap_t *s) {
  memset(x, 0, sizeof *x);
  x->s = s;
  x->ndev = s->ndevices;
  x->empty_site = cli_empty_site(s);
  x->dev = calloc((size_t)x->ndev + 1, sizeof *x->dev);
  if (!x->dev)
    return -1;
  for (uint32_t d = 0; d < x->ndev; d++) {
    x->dev[d].has_trace = s->device_traces[d].n > 0;
    if (index_device(&x->dev[d], s, d, &s->device_traces[d]) != 0) {
      cli_stacks_free(x);
      return -1;
    }
  }
  /* MSNAP_DEBUG >= 2 (meson -Ddebug_level=2): internal invariants. */
  if (msnap_debug_level >= 2 && !cli_stacks_check(x)) {
    fprintf(stderr, "memsnap: internal error: cli_stacks invariants\n");
    abort();
  }
  return 0;
}

void cli_stacks_free(cli_stacks_t *x) {
  for (uint32_t d = 0; x->dev && d < x->ndev; d++) {
    free(x->dev[d].addr);
    free(x->dev[d].entry);
  }
  free(x->dev);
  memset(x, 0, sizeof *x);
}

bool cli_stacks_check(const cli_stacks_t *x) {
  for (uint32_t d = 0; d < x->ndev; d++) {
    const cli_stacks_dev_t *v = &x->dev[d];
    const msnap_trace_list_t *tl = &x->s->device_traces[d];
    for (uint32_t i = 0; i < v->n; i++) {
      if (i > 0 && v->addr[i - 1] >= v->addr[i])
        return false;
      if (v->entry[i] >= tl->n ||
          tl->v[v->entry[i]].action != MSNAP_ACTION_ALLOC ||
          tl->v[v->entry[i]].addr != v->addr[i])
        return false;
    }
  }
  return true;
}

long cli_stacks_live_entry(const cli_stacks_t *x, int64_t dev,
                           uint64_t addr) {
  if (dev < 0 || (uint64_t)dev >= x->ndev)
    return -1;
  const cli_stacks_dev_t *v = &x->dev[dev];
  uint32_t lo = 0, hi = v->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (v->addr[mid] < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < v->n && v->addr[lo] == addr ? (long)v->entry[lo] : -1;
}

static bool has_frames(const msnap_snap_t *s, msnap_stack_t st) {
  uint32_t n;
  return cli_stack(s, st, &n) != NULL && n > 0;
}

msnap_stack_t cli_stacks_block(const cli_stacks_t *x, int64_t dev,
                               uint64_t addr, const msnap_sblock_t *b,
                               cli_stack_src_t *src) {
  const msnap_snap_t *s = x->s;
  cli_stack_src_t why = CLI_SRC_NONE;
  msnap_stack_t st = MSNAP_STACK_ABSENT;
  if ((b->keys & MSNAP_K_FRAMES) && has_frames(s, b->frames)) {
    st = b->frames;
    why = CLI_SRC_BLOCK;
  } else if (b->history.n > 0 &&
             (uint64_t)b->history.first + b->history.n <= s->nhistories &&
             has_frames(s, s->histories[b->history.first].frames)) {
    st = s->histories[b->history.first].frames;
    why = CLI_SRC_HISTORY;
  } else if (dev >= 0 && (uint64_t)dev < x->ndev && x->dev[dev].has_trace) {
    long e = cli_block_active(b) ? cli_stacks_live_entry(x, dev, addr) : -1;
    if (e >= 0) {
      st = s->device_traces[dev].v[e].frames;
      why = has_frames(s, st) ? CLI_SRC_TRACE : CLI_SRC_NONE;
    } else if (cli_block_active(b)) {
      why = CLI_SRC_BEFORE_TRACE;
    }
  }
  if (src)
    *src = why;
  return why == CLI_SRC_NONE || why == CLI_SRC_BEFORE_TRACE
             ? MSNAP_STACK_ABSENT
             : st;
}

cli_site_t cli_stacks_site(const cli_stacks_t *x, int64_t dev,
                           uint64_t addr, const msnap_sblock_t *b) {
  cli_stack_src_t src;
  msnap_stack_t st = cli_stacks_block(x, dev, addr, b, &src);
  if (src == CLI_SRC_BEFORE_TRACE)
    return (cli_site_t){CLI_SITE_BEFORE_TRACE, CLI_SITE_NONE};
  /* no frames of its own, and its live alloc entry has none either */
  if (src == CLI_SRC_NONE && cli_block_active(b) && dev >= 0 &&
      (uint64_t)dev < x->ndev && x->dev[dev].has_trace &&
      cli_stacks_live_entry(x, dev, addr) >= 0)
    return (cli_site_t){x->empty_site, CLI_SITE_NONE};
  return cli_site(x->s, st);
}
