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
 * at addr[i].  cli_stacks_check() verifies them, after every
 * cli_stacks_init() in builds with MSNAP_DEBUG >= 2.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/base.h"

typedef cli_ev_t ev_t;

static int cmp_ev(const void *a, const void *b) {
  const ev_t *x = a, *y = b;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/*
 * Sort ev[0..n) by (addr, idx) as cmp_ev does, in linear time: the events
 * are made in trace order (idx increasing), so a stable LSD radix sort on
 * addr alone gives the same order.  11-bit digits; digits that are equal
 * in every address (the high bits of device addresses) cost no pass.
 * Returns -1 when the scratch array cannot be had (the caller then uses
 * qsort).
 */
static int sort_ev(ev_t *ev, uint32_t n) {
  enum { BITS = 11, NB = 1 << BITS };
  if (n < 2)
    return 0;
  uint64_t lo = ev[0].addr, hi = ev[0].addr;
  for (uint32_t i = 1; i < n; i++) {
    lo &= ev[i].addr;
    hi |= ev[i].addr;
  }
  uint64_t varying = lo ^ hi; /* bits that differ somewhere */
  ev_t *tmp = NULL;
  ev_t *src = ev, *dst = NULL;
  uint32_t count[NB];
  for (int shift = 0; shift < 64; shift += BITS) {
    if (((varying >> shift) & (NB - 1)) == 0)
      continue;
    if (tmp == NULL) {
      tmp = malloc((size_t)n * sizeof *tmp);
      if (tmp == NULL)
        return -1;
      dst = tmp;
    }
    memset(count, 0, sizeof count);
    for (uint32_t i = 0; i < n; i++)
      count[(src[i].addr >> shift) & (NB - 1)]++;
    uint32_t sum = 0;
    for (uint32_t b = 0; b < NB; b++) {
      uint32_t c = count[b];
      count[b] = sum;
      sum += c;
    }
    for (uint32_t i = 0; i < n; i++)
      dst[count[(src[i].addr >> shift) & (NB - 1)]++] = src[i];
    ev_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != ev)
    memcpy(ev, src, (size_t)n * sizeof *ev);
  free(tmp);
  return 0;
}

void cli_sort_ev(cli_ev_t *ev, uint32_t n) {
  if (sort_ev(ev, n) != 0)
    qsort(ev, n, sizeof *ev, cmp_ev);
}

/* Live alloc entries of one trace, sorted by address. */
static int index_device(cli_stacks_dev_t *d, const msnap_trace_list_t *tl) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < tl->n; i++)
    n += tl->v[i].action == MSNAP_ACTION_ALLOC ||
         tl->v[i].action == MSNAP_ACTION_FREE_COMPLETED;
  ev_t *ev = malloc(((size_t)n + 1) * sizeof *ev);
  d->addr = malloc(((size_t)n + 1) * sizeof *d->addr);
  d->entry = malloc(((size_t)n + 1) * sizeof *d->entry);
  if (!ev || !d->addr || !d->entry) {
    free(ev);
    return -1;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < tl->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (e->action != MSNAP_ACTION_ALLOC &&
        e->action != MSNAP_ACTION_FREE_COMPLETED)
      continue;
    ev[k].addr = e->addr;
    ev[k].idx = i;
    ev[k].alloc = e->action == MSNAP_ACTION_ALLOC;
    k++;
  }
  cli_sort_ev(ev, k);
  d->n = 0;
  for (uint32_t i = 0; i < k; i++) {
    /* The last event of each address decides. */
    if (i + 1 < k && ev[i + 1].addr == ev[i].addr)
      continue;
    if (!ev[i].alloc)
      continue;
    d->addr[d->n] = ev[i].addr;
    d->entry[d->n] = ev[i].idx;
    d->n++;
  }
  free(ev);
  return 0;
}

int cli_stacks_init(cli_stacks_t *x, const msnap_snap_t *s) {
  memset(x, 0, sizeof *x);
  x->s = s;
  x->ndev = s->ndevices;
  x->dev = calloc((size_t)x->ndev + 1, sizeof *x->dev);
  if (!x->dev)
    return -1;
  for (uint32_t d = 0; d < x->ndev; d++) {
    x->dev[d].has_trace = s->device_traces[d].n > 0;
    if (index_device(&x->dev[d], &s->device_traces[d]) != 0) {
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
  return cli_site(x->s, st);
}
