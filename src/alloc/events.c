/*
 * events.c -- cross-stream frees (allocator-algorithm.md §10): the per-
 * device pool of runtime events, the per-stream FIFOs of (event, block),
 * insert_events / process_events / synchronize_and_free_events, and the
 * frees deferred while a graph capture is on (msnap__capturing).
 *
 * Invariants (checked by msnap_check_invariants): d->pending_events is the
 * number of queued items; a block's event_count is the number of items
 * naming it; a block with event_count > 0, stream uses or `deferred` is
 * "active" and in no free set.  Idle events wait in d->event_pool and are
 * destroyed with the allocator.  Callers hold the device lock.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_core.h"

static int event_get(msnap_device_t *d, uint64_t *ev) {
  if (d->nevent_pool > 0) {
    *ev = d->event_pool[--d->nevent_pool];
    return 0;
  }
  msnap_allocator_t *a = d->a;
  return a->rt->event_create(a->rt_ctx, d->id, ev);
}

static void event_put(msnap_device_t *d, uint64_t ev) {
  if (MSNAP_GROW(d->event_pool, d->event_pool_cap, d->nevent_pool + 1) != 0) {
    d->a->rt->event_destroy(d->a->rt_ctx, d->id, ev);
    return;
  }
  d->event_pool[d->nevent_pool++] = ev;
}

static msnap_evq_t *evq_for(msnap_device_t *d, uint64_t stream) {
  for (uint32_t i = 0; i < d->nevqs; i++)
    if (d->evqs[i].stream == stream)
      return &d->evqs[i];
  if (MSNAP_GROW(d->evqs, d->evqs_cap, d->nevqs + 1) != 0)
    return NULL;
  msnap_evq_t *q = &d->evqs[d->nevqs++];
  memset(q, 0, sizeof *q);
  q->stream = stream;
  return q;
}

static int evq_push(msnap_evq_t *q, uint64_t ev, msnap_block_t *b) {
  if (q->n == q->cap) {
    /* Grow, then move the items from head to the old end to the new end
     * so that the FIFO stays in order. */
    uint32_t old = q->cap;
    if (MSNAP_GROW(q->v, q->cap, (uint64_t)q->n + 1) != 0)
      return MSNAP_ENOMEM;
    uint32_t tail = old - q->head;
    memmove(q->v + (q->cap - tail), q->v + q->head, tail * sizeof *q->v);
    q->head = q->cap - tail;
    if (q->head == q->cap) q->head = 0;
  }
  q->v[(q->head + q->n) % q->cap] = (msnap_evitem_t){ev, b};
  q->n++;
  return 0;
}


/*
 * insert_events (§10.2): record one event per stream in b->stream_uses and
 * queue (event, b); the set becomes empty.  A stream whose event cannot be
 * created or recorded is handled by synchronising the device instead.  If
 * no event was queued the block is freed at once.
 */
void msnap__insert_events(msnap_device_t *d, msnap_block_t *b,
                          const msnap_call_t *c) {
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  msnap_allocator_t *a = d->a;
  bool synced = false;
  for (uint32_t i = 0; i < b->nuses; i++) {
    uint64_t s = b->stream_uses[i], ev;
    msnap_evq_t *q;
    if (event_get(d, &ev) != 0)
      goto fallback;
    if (a->rt->event_record(a->rt_ctx, d->id, ev, s) != 0) {
      event_put(d, ev);
      goto fallback;
    }
    q = evq_for(d, s);
    if (!q || evq_push(q, ev, b) != 0) {
      a->rt->event_synchronize(a->rt_ctx, d->id, ev);
      event_put(d, ev);
      continue;
    }
    b->event_count++;
    d->pending_events++;
    continue;
  fallback:
    if (!synced) {
      a->rt->device_synchronize(a->rt_ctx, d->id);
      synced = true;
    }
  }
  b->nuses = 0;
  b->graph_uses = 0;
  if (b->event_count == 0)
    msnap__free_block(d, b, c);
}

/* remove_cudagraph_stream_uses: drop the streams recorded during a graph
 * capture (their work is part of the graph: no event is needed). */
static void remove_graph_uses(msnap_block_t *b) {
  if (b->graph_uses == 0)
    return;
  uint32_t k = 0;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (i >= 64 || !(b->graph_uses & (1ull << i)))
      b->stream_uses[k++] = b->stream_uses[i];
  b->nuses = k;
  b->graph_uses = 0;
}

/* insert_events_deferred_until_no_capture: stream uses recorded during
 * the capture are dropped first; a block left with none is freed. */
static void insert_deferred(msnap_device_t *d, const msnap_call_t *c) {
  while (msnap_unlikely(d->deferred != NULL)) {
    msnap_block_t *b = d->deferred;
    d->deferred = b->link;
    b->link = NULL;
    b->deferred = 0;
    remove_graph_uses(b);
    msnap__insert_events(d, b, c);
  }
}

/* process_events (§10.3): pop completed events per stream, FIFO. */
void msnap__process_events(msnap_device_t *d, const msnap_call_t *c) {
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  msnap_allocator_t *a = d->a;
  insert_deferred(d, c);
  for (uint32_t i = 0; i < d->nevqs; i++) {
    msnap_evq_t *q = &d->evqs[i];
    while (q->n > 0) {
      msnap_evitem_t it = q->v[q->head];
      bool done = false;
      if (a->rt->event_query(a->rt_ctx, d->id, it.event, &done) != 0 || !done)
        break;
      q->head = (q->head + 1) % q->cap;
      q->n--;
      d->pending_events--;
      event_put(d, it.event);
      if (--it.block->event_count == 0)
        msnap__free_block(d, it.block, c);
    }
  }
}

/*
 * synchronize_and_free_events (§10.3): wait for every queued event (only
 * those of blocks in `only` when non-NULL) and complete the frees;
 * num_sync_all_streams += 1.
 */
void msnap__sync_and_free_events(msnap_device_t *d, const msnap_call_t *c,
                                 const msnap_ppool_t *only) {
  msnap_allocator_t *a = d->a;
  d->stats.num_sync_all_streams++;
  insert_deferred(d, c);
  for (uint32_t i = 0; i < d->nevqs; i++) {
    msnap_evq_t *q = &d->evqs[i];
    uint32_t n = q->n, kept = 0;
    for (uint32_t k = 0; k < n; k++) {
      msnap_evitem_t it = q->v[(q->head + k) % q->cap];
      if (only && it.block->pool->owner != only) {
        q->v[(q->head + kept) % q->cap] = it;
        kept++;
        continue;
      }
      if (a->rt->event_synchronize(a->rt_ctx, d->id, it.event) != 0)
        a->rt->device_synchronize(a->rt_ctx, d->id);
      event_put(d, it.event);
      d->pending_events--;
      if (--it.block->event_count == 0)
        msnap__free_block(d, it.block, c);
    }
    q->n = kept;
    if (kept == 0)
      q->head = 0;
  }
}

