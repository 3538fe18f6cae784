/*
 * cli_back.c -- backward replay of one device trace over the final state.
 *
 * The final state (the snapshot's segments and active blocks of a device)
 * is complete; the trace may have lost its oldest entries to the ring
 * buffer.  Undoing entries from the newest to the oldest therefore never
 * needs the lost part, and every rule below is checkable on any file:
 *
 *   alloc A          the block at A is live after the entry (in the final
 *                    state or re-created by a later free_completed) and
 *                    lies in a live segment; undo: remove it.  Its size
 *                    equals the block's requested_size.
 *   free_completed A the block is NOT live after the entry (else a double
 *                    free or a missing alloc); it lies in a live segment;
 *                    undo: re-create it, pending.
 *   free_requested A the block is live after the entry and pending (its
 *                    free_completed comes later, or it is
 *                    active_pending_free at the end; cuda-reference §7.3
 *                    rule 1); undo: it is allocated again.
 *   segment_alloc A  a segment starts at A with that size after the entry
 *                    (rule 2) and holds no live block once the blocks
 *                    allocated after it are undone (rule 3); undo: remove.
 *   segment_free A   no segment at A after the entry and no live block in
 *                    its range; undo: re-create it.
 *   segment_map R    R lies inside a live range; undo: unmap R.
 *   segment_unmap R  R overlaps no live range; undo: map R.
 *   annotate A       the block at A is live.
 * What is left at the end is the state at the start of the trace: empty
 * for a trace that began with an empty allocator.
 *
 * cli_timeline runs the other way from that start state: active and
 * reserved bytes after each entry (the data of `memsnap plot`).
 *
 * Invariants of cli_state_t: b[] sorted by addr with distinct addresses;
 * g[] sorted by addr, ranges disjoint.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_state_free(cli_state_t *st) {
  free(st->b);
  free(st->g);
  memset(st, 0, sizeof *st);
}

/* Index of the first block / segment with addr >= a. */
static uint32_t lb_block(const cli_state_t *st, uint64_t a) {
  return cli_lower_bound(st->b, st->nb, sizeof *st->b,
                         offsetof(cli_lblock_t, addr), a, false);
}

static uint32_t lb_seg(const cli_state_t *st, uint64_t a) {
  return cli_lower_bound(st->g, st->ng, sizeof *st->g,
                         offsetof(cli_lseg_t, addr), a, false);
}

static long find_block(const cli_state_t *st, uint64_t a) {
  uint32_t i = lb_block(st, a);
  return (i < st->nb && st->b[i].addr == a) ? (long)i : -1;
}

static int insert_block(cli_state_t *st, const cli_lblock_t *b) {
  if (MSNAP_GROW(st->b, st->capb, st->nb + 1) != 0)
    return -1;
  uint32_t i = lb_block(st, b->addr);
  memmove(st->b + i + 1, st->b + i, (st->nb - i) * sizeof *st->b);
  st->b[i] = *b;
  st->nb++;
  return 0;
}

static void remove_block(cli_state_t *st, uint32_t i) {
  memmove(st->b + i, st->b + i + 1, (st->nb - i - 1) * sizeof *st->b);
  st->nb--;
}

static int insert_seg(cli_state_t *st, const cli_lseg_t *g) {
  if (MSNAP_GROW(st->g, st->capg, st->ng + 1) != 0)
    return -1;
  uint32_t i = lb_seg(st, g->addr);
  memmove(st->g + i + 1, st->g + i, (st->ng - i) * sizeof *st->g);
  st->g[i] = *g;
  st->ng++;
  return 0;
}

static void remove_seg(cli_state_t *st, uint32_t i) {
  memmove(st->g + i, st->g + i + 1, (st->ng - i - 1) * sizeof *st->g);
  st->ng--;
}

/* Segment containing [a, a+n), or -1. */
static long seg_containing(const cli_state_t *st, uint64_t a, uint64_t n) {
  uint32_t i = lb_seg(st, a + 1);
  if (i == 0)
    return -1;
  const cli_lseg_t *g = &st->g[i - 1];
  if (g->addr <= a && a + n <= g->addr + g->size)
    return (long)(i - 1);
  return -1;
}

/* Any segment overlapping [a, a+n)? */
static bool seg_overlaps(const cli_state_t *st, uint64_t a, uint64_t n) {
  uint32_t i = lb_seg(st, a);
  if (i < st->ng && st->g[i].addr < a + n)
    return true;
  if (i > 0 && st->g[i - 1].addr + st->g[i - 1].size > a)
    return true;
  return false;
}

/* First live block inside [a, a+n), or -1. */
static long block_in(const cli_state_t *st, uint64_t a, uint64_t n) {
  uint32_t i = lb_block(st, a);
  if (i < st->nb && st->b[i].addr < a + n)
    return (long)i;
  return -1;
}

int cli_state_final(const msnap_snap_t *s, int64_t device, cli_state_t *st) {
  memset(st, 0, sizeof *st);
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *seg = &s->segments[i];
    if (seg->device != device)
      continue;
    cli_lseg_t g = {.addr = seg->address,
                    .size = seg->total_size,
                    .stream = seg->stream,
                    .from_final = true,
                    .is_large = seg->is_large != 0,
                    .is_expandable = seg->is_expandable != 0};
    if (insert_seg(st, &g))
      return -1;
    uint64_t a = seg->address;
    for (uint32_t k = 0; k < seg->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[seg->first_block + k];
      uint64_t ba = (b->keys & MSNAP_K_ADDRESS) ? b->address : a;
      a += b->size;
      if (!cli_block_active(b) || find_block(st, ba) >= 0)
        continue;
      cli_lblock_t lb = {.addr = ba,
                         .size = b->size,
                         .requested = b->requested_size,
                         .stream = seg->stream,
                         .from_final = true,
                         .pending =
                             b->state == MSNAP_BLOCK_ACTIVE_PENDING_FREE,
                         .has_requested = (b->keys & MSNAP_K_REQUESTED) != 0};
      if (insert_block(st, &lb))
        return -1;
    }
  }
  return 0;
}

typedef struct bctx_s {
  cli_violation_cb cb;
  void *arg;
  long n;
} bctx_t;

static void viol(bctx_t *c, uint32_t entry, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void viol(bctx_t *c, uint32_t entry, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  c->n++;
  if (!c->cb)
    return; /* only counted: no message to format */
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->cb(c->arg, entry, msg);
}

/* Extent used for overlap tests: a block re-created from a free only
 * knows its requested size (a lower bound of its block size). */
static uint64_t extent(const cli_lblock_t *b) {
  uint64_t n = b->size ? b->size : b->requested;
  return n ? n : 1;
}

/*
 * Undo the trace of `device` (see the top of the file).  The caller owns
 * *start afterwards.  Returns the number of violations, -1 on ENOMEM.
 */
long cli_backward(const msnap_snap_t *s, int64_t device, cli_violation_cb cb,
                  void *arg, cli_state_t *start) {
  cli_state_t st;
  bctx_t c = {cb, arg, 0};
  if (cli_state_final(s, device, &st)) {
    cli_state_free(&st);
    return -1;
  }
  const msnap_trace_list_t *tl = cli_trace(s, device);
  uint32_t n = tl ? tl->n : 0;
  for (uint32_t ii = n; ii > 0; ii--) {
    uint32_t i = ii - 1;
    const msnap_strace_t *e = &tl->v[i];
    uint64_t a = e->addr, sz = e->size;
    long bi;
    switch (e->action) {
    case MSNAP_ACTION_ALLOC:
      bi = find_block(&st, a);
      if (bi < 0) {
        viol(&c, i,
             "alloc of 0x%" PRIx64 " (%" PRIu64 " B): the block is neither "
             "live at the end nor freed later in the trace",
             a, sz);
        break;
      }
      if (st.b[bi].pending && !st.b[bi].from_final)
        viol(&c, i,
             "alloc of 0x%" PRIx64 ": a free_completed follows with no "
             "free_requested in between",
             a);
      if (st.b[bi].from_final && st.b[bi].has_requested &&
          st.b[bi].requested != sz)
        viol(&c, i,
             "alloc size %" PRIu64 " differs from the live block's "
             "requested_size %" PRIu64 " at 0x%" PRIx64,
             sz, st.b[bi].requested, a);
      else if (!st.b[bi].from_final && st.b[bi].requested != sz)
        viol(&c, i,
             "alloc size %" PRIu64 " differs from the size %" PRIu64
             " of its later free at 0x%" PRIx64,
             sz, st.b[bi].requested, a);
      if (seg_containing(&st, a, extent(&st.b[bi])) < 0)
        viol(&c, i,
             "alloc at 0x%" PRIx64 " lies outside every live segment "
             "(segment_alloc missing or after it)",
             a);
      remove_block(&st, (uint32_t)bi);
      break;
    case MSNAP_ACTION_FREE_COMPLETED: {
      bi = find_block(&st, a);
      if (bi >= 0) {
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " but the block is live right "
             "after it (double free, or an alloc is missing)",
             a);
        break;
      }
      cli_lblock_t b = {.addr = a, .requested = sz, .stream = e->stream,
                        .pending = true, .has_requested = true};
      uint32_t k = lb_block(&st, a);
      if (k > 0 && st.b[k - 1].addr + extent(&st.b[k - 1]) > a)
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " overlaps the live block at "
             "0x%" PRIx64,
             a, st.b[k - 1].addr);
      else if (k < st.nb && a + (sz ? sz : 1) > st.b[k].addr)
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " (%" PRIu64 " B) overlaps the "
             "live block at 0x%" PRIx64,
             a, sz, st.b[k].addr);
      if (seg_containing(&st, a, sz ? sz : 1) < 0)
        viol(&c, i,
             "free_completed at 0x%" PRIx64 " lies outside every live "
             "segment (segment_free before free_completed?)",
             a);
      if (insert_block(&st, &b))
        goto nomem;
      break;
    }
    case MSNAP_ACTION_FREE_REQUESTED:
      bi = find_block(&st, a);
      if (bi < 0) {
        viol(&c, i,
             "free_requested of 0x%" PRIx64 " with no later free_completed "
             "and no active_pending_free block at the end",
             a);
        break;
      }
      if (!st.b[bi].pending)
        viol(&c, i,
             "free_requested of 0x%" PRIx64 " but the block is still "
             "allocated (not pending) afterwards",
             a);
      else if (st.b[bi].requested != sz &&
               (st.b[bi].has_requested || !st.b[bi].from_final))
        viol(&c, i,
             "free_requested size %" PRIu64 " differs from requested_size "
             "%" PRIu64 " at 0x%" PRIx64,
             sz, st.b[bi].requested, a);
      st.b[bi].pending = false;
      break;
    case MSNAP_ACTION_SEGMENT_ALLOC: {
      uint32_t k = lb_seg(&st, a);
      if (k >= st.ng || st.g[k].addr != a) {
        viol(&c, i,
             "segment_alloc of 0x%" PRIx64 " (%" PRIu64 " B): no such "
             "segment afterwards (neither at the end nor freed later)",
             a, sz);
        break;
      }
      if (st.g[k].size != sz)
        viol(&c, i,
             "segment_alloc size %" PRIu64 " differs from the segment's "
             "size %" PRIu64 " at 0x%" PRIx64,
             sz, st.g[k].size, a);
      long in = block_in(&st, a, st.g[k].size);
      if (in >= 0)
        viol(&c, i,
             "segment_alloc of 0x%" PRIx64 " comes after the alloc of the "
             "block 0x%" PRIx64 " inside it (or that block is never "
             "allocated in the trace)",
             a, st.b[in].addr);
      remove_seg(&st, k);
      break;
    }
    case MSNAP_ACTION_SEGMENT_FREE: {
      if (seg_overlaps(&st, a, sz ? sz : 1)) {
        viol(&c, i,
             "segment_free of 0x%" PRIx64 " (%" PRIu64 " B) but a live "
             "segment overlaps it right after",
             a, sz);
        break;
      }
      long in = block_in(&st, a, sz);
      if (in >= 0)
        viol(&c, i,
             "segment_free of 0x%" PRIx64 " while the block 0x%" PRIx64
             " inside it is live",
             a, st.b[in].addr);
      cli_lseg_t g = {.addr = a, .size = sz, .stream = e->stream,
                      .is_large = sz != (2u << 20)};
      if (insert_seg(&st, &g))
        goto nomem;
      break;
    }
    case MSNAP_ACTION_SEGMENT_MAP: {
      long k = seg_containing(&st, a, sz ? sz : 1);
      if (k < 0) {
        viol(&c, i,
             "segment_map of [0x%" PRIx64 ", +%" PRIu64 ") not inside a "
             "live segment afterwards",
             a, sz);
        break;
      }
      long in = block_in(&st, a, sz);
      if (in >= 0)
        viol(&c, i,
             "segment_map of 0x%" PRIx64 " comes after the alloc of the "
             "block 0x%" PRIx64 " inside it",
             a, st.b[in].addr);
      cli_lseg_t g = st.g[k];
      remove_seg(&st, (uint32_t)k);
      if (g.addr < a) {
        cli_lseg_t l = g;
        l.size = a - g.addr;
        if (insert_seg(&st, &l))
          goto nomem;
      }
      if (a + sz < g.addr + g.size) {
        cli_lseg_t r = g;
        r.addr = a + sz;
        r.size = g.addr + g.size - (a + sz);
        if (insert_seg(&st, &r))
          goto nomem;
      }
      break;
    }
    case MSNAP_ACTION_SEGMENT_UNMAP: {
      if (seg_overlaps(&st, a, sz ? sz : 1)) {
        viol(&c, i,
             "segment_unmap of [0x%" PRIx64 ", +%" PRIu64 ") but a live "
             "range overlaps it right after",
             a, sz);
        break;
      }
      cli_lseg_t g = {.addr = a, .size = sz, .stream = e->stream,
                      .is_large = true, .is_expandable = true};
      if (insert_seg(&st, &g))
        goto nomem;
      /* Mapped ranges of an expandable segment are one segment when they
       * touch: merge with the neighbours. */
      uint32_t k = lb_seg(&st, a);
      if (k + 1 < st.ng && st.g[k + 1].is_expandable &&
          st.g[k + 1].addr == a + sz) {
        st.g[k].size += st.g[k + 1].size;
        remove_seg(&st, k + 1);
      }
      if (k > 0 && st.g[k - 1].is_expandable &&
          st.g[k - 1].addr + st.g[k - 1].size == a) {
        st.g[k - 1].size += st.g[k].size;
        remove_seg(&st, k);
      }
      break;
    }
    case MSNAP_ACTION_ANNOTATE:
      if (find_block(&st, a) < 0)
        viol(&c, i, "annotate of 0x%" PRIx64 ": no live block there", a);
      break;
    default:
      break;
    }
  }
  if (start)
    *start = st;
  else
    cli_state_free(&st);
  return c.n;
nomem:
  cli_state_free(&st);
  return -1;
}

/*
 * Active (requested bytes of live allocations) and reserved bytes after
 * each entry of a device trace, starting from the state at the start of
 * the trace that the backward replay rebuilds.  Arrays of tl->n + 1
 * values (index 0 = before the first entry); caller frees both.
 */
int cli_timeline(const msnap_snap_t *s, int64_t dev, uint64_t **act,
                 uint64_t **res, uint32_t *n) {
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  uint32_t m = tl ? tl->n : 0;
  cli_state_t st;
  *act = *res = NULL;
  *n = 0;
  if (cli_backward(s, dev, NULL, NULL, &st) < 0)
    return -1;
  uint64_t a = 0, r = 0;
  for (uint32_t i = 0; i < st.nb; i++)
    a += st.b[i].requested ? st.b[i].requested : st.b[i].size;
  for (uint32_t i = 0; i < st.ng; i++)
    r += st.g[i].size;
  cli_state_free(&st);
  uint64_t *va = malloc((m + 1) * sizeof *va);
  uint64_t *vr = malloc((m + 1) * sizeof *vr);
  if (!va || !vr) {
    free(va);
    free(vr);
    return -1;
  }
  va[0] = a;
  vr[0] = r;
  for (uint32_t i = 0; i < m; i++) {
    const msnap_strace_t *e = &tl->v[i];
    switch (e->action) {
    case MSNAP_ACTION_ALLOC: a += e->size; break;
    case MSNAP_ACTION_FREE_COMPLETED: a -= a >= e->size ? e->size : a; break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP: r += e->size; break;
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP: r -= r >= e->size ? e->size : r; break;
    default: break;
    }
    va[i + 1] = a;
    vr[i + 1] = r;
  }
  *act = va;
  *res = vr;
  *n = m + 1;
  return 0;
}
