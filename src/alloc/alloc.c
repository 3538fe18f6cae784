/*
 * alloc.c -- the device caching allocator: PyTorch's
 * DeviceCachingAllocator / NativeCachingAllocator decisions
 * (allocator-algorithm.md §3-§12, §16, §19) in the "cuda" profile and
 * torch_npu's NPUCachingAllocator differences (§20) in the "npu" profile.
 *
 * Entry points (msnap_malloc, msnap_free, msnap_record_stream,
 * msnap_empty_cache, ...) take the device lock once, run the algorithm on
 * the data structures described in alloc.h, and release it.  Recording
 * contexts are captured before the lock; OOM observers run after it.
 *
 * Hot path (a cached malloc + free pair, history off): one lock/unlock per
 * call, a red-black lower_bound, one block object from the recycled list,
 * one ptr-map insert/remove, no system calls and no malloc.
 *
 * Runtime failures: a device malloc / VMM map that reports MSNAP_EOOM is
 * an allocation failure and continues PyTorch's OOM chain; any other
 * runtime error aborts the call with that code (PyTorch would throw) and
 * leaves the state consistent.  A failed device free leaves the segment
 * cached (it is retried by the next release or by destroy).  A failed
 * event create/record falls back to a device synchronisation, so the block
 * is freed at once.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc/alloc_core.h"
#include "alloc/host.h"

/* ------------------------------------------------------------------------
 * Small helpers.
 * ------------------------------------------------------------------------ */

static inline uint64_t round_up(uint64_t x, uint64_t m) {
  return ((x + m - 1) / m) * m;
}

static inline int floor_log2(uint64_t x) { return 63 - __builtin_clzll(x); }

static const char *prof_dev(const msnap_allocator_t *a) {
  return a->profile == MSNAP_PROFILE_NPU ? "NPU" : "CUDA";
}

msnap_block_t *msnap__block_new(msnap_device_t *d) {
  msnap_block_t *b = d->free_objs;
  if (msnap_likely(b != NULL)) {
    /* Field by field: a memset of the whole object is a `rep stos` that
     * costs more than the rest of a cached malloc. stream_uses/cap_uses
     * keep their buffer for reuse. */
    d->free_objs = b->link;
    b->node.child[0] = b->node.child[1] = b->node.parent = NULL;
    b->node.red = 0;
    b->stream = b->size = b->ptr = b->requested_size = 0;
    b->prev = b->next = b->hnext = b->link = NULL;
    b->pool = NULL;
    b->seg = NULL;
    b->nuses = 0;
    b->graph_uses = 0;
    b->event_count = 0;
    b->gc_count_base = 0;
    b->stack = 0;
    b->allocated = b->mapped = b->in_set = b->deferred = 0;
    return b;
  }
  return calloc(1, sizeof *b);
}

void msnap__block_delete(msnap_device_t *d, msnap_block_t *b) {
  if (b->stack) {
    msnap__stack_unref(b->stack);
    b->stack = 0;
  }
  b->link = d->free_objs;
  d->free_objs = b;
}

void msnap__pool_insert_blocks(msnap_bpool_t *pool, msnap_block_t *b) {
  b->gc_count_base = pool->get_free_blocks_call_count;
  msnap__rb_insert(&pool->blocks, b);
  b->in_set = MSNAP_IN_BLOCKS;
}

void msnap__pool_insert_unmapped(msnap_bpool_t *pool, msnap_block_t *b) {
  msnap__rb_insert(&pool->unmapped, b);
  b->in_set = MSNAP_IN_UNMAPPED;
}

void msnap__pool_erase(msnap_block_t *b) {
  if (b->in_set == MSNAP_IN_BLOCKS)
    msnap__rb_erase(&b->pool->blocks, b);
  else if (b->in_set == MSNAP_IN_UNMAPPED)
    msnap__rb_erase(&b->pool->unmapped, b);
  b->in_set = MSNAP_IN_NONE;
}

void msnap__link_before(msnap_block_t *nb, msnap_block_t *b) {
  nb->prev = b->prev;
  if (nb->prev)
    nb->prev->next = nb;
  else
    b->seg->head = nb;
  nb->next = b;
  b->prev = nb;
}

void msnap__link_after(msnap_block_t *nb, msnap_block_t *b) {
  if (b->next) {
    msnap__link_before(nb, b->next);
    return;
  }
  nb->next = NULL; /* b is the segment's last block */
  nb->prev = b;
  b->next = nb;
}

msnap_segment_t *msnap__segment_new(msnap_device_t *d, msnap_bpool_t *pool,
                                    uint64_t stream) {
  msnap_segment_t *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->pool = pool;
  s->stream = stream;
  s->snext = d->segments;
  if (d->segments)
    d->segments->sprev = s;
  d->segments = s;
  d->nsegments++;
  if (pool->owner)
    pool->owner->malloc_count++;
  return s;
}

void msnap__segment_delete(msnap_device_t *d, msnap_segment_t *s) {
  if (s->sprev)
    s->sprev->snext = s->snext;
  else
    d->segments = s->snext;
  if (s->snext)
    s->snext->sprev = s->sprev;
  d->nsegments--;
  if (s->pool->owner)
    s->pool->owner->malloc_count--;
  if (s->stack)
    msnap__stack_unref(s->stack);
  free(s->handles);
  free(s->is_mapped);
  free(s);
}

/* ---- device lock slow paths (alloc.h) ----------------------------------- */

#if defined(__linux__)
static void futex_wait(_Atomic uint32_t *v, uint32_t val) {
  syscall(SYS_futex, (uint32_t *)v, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *v) {
  syscall(SYS_futex, (uint32_t *)v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void msnap__lock_slow(msnap_lock_t *l) {
  for (int i = 0; i < 64; i++) {
    uint32_t c = 0;
    if (atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(&l->v, &c, 1,
                                              memory_order_acquire,
                                              memory_order_relaxed))
      return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  uint32_t c = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
  while (c != 0) {
    futex_wait(&l->v, 2);
    c = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
  }
}

void msnap__unlock_slow(msnap_lock_t *l) {
  atomic_store_explicit(&l->v, 0, memory_order_release);
  futex_wake(&l->v);
}
#endif

/* ---- ptr -> block map --------------------------------------------------- */

static inline uint64_t ptr_hash(uint64_t ptr) {
  return XXH3_64bits(&ptr, sizeof ptr);
}

static int ptrmap_grow(msnap_ptrmap_t *m) {
  uint64_t nb = m->buckets ? (m->mask + 1) * 2 : 64;
  msnap_block_t **nbk = calloc(nb, sizeof *nbk);
  if (!nbk)
    return MSNAP_ENOMEM;
  if (m->buckets) {
    for (uint64_t i = 0; i <= m->mask; i++) {
      msnap_block_t *b = m->buckets[i];
      while (b) {
        msnap_block_t *nx = b->hnext;
        uint64_t h = ptr_hash(b->ptr) & (nb - 1);
        b->hnext = nbk[h];
        nbk[h] = b;
        b = nx;
      }
    }
    free(m->buckets);
  }
  m->buckets = nbk;
  m->mask = nb - 1;
  return 0;
}

/* Make room for one more entry (called before any state change, so that
 * a host allocation failure leaves everything untouched). */
static inline int ptrmap_reserve(msnap_ptrmap_t *m) {
  if (msnap_unlikely(!m->buckets || m->count + 1 > m->mask + 1))
    return ptrmap_grow(m);
  return 0;
}

static inline void ptrmap_insert(msnap_ptrmap_t *m, msnap_block_t *b) {
  uint64_t h = ptr_hash(b->ptr) & m->mask;
  b->hnext = m->buckets[h];
  m->buckets[h] = b;
  m->count++;
}

static inline msnap_block_t *ptrmap_find(const msnap_ptrmap_t *m,
                                         uint64_t ptr) {
  if (!m->buckets)
    return NULL;
  msnap_block_t *b = m->buckets[ptr_hash(ptr) & m->mask];
  while (b && b->ptr != ptr)
    b = b->hnext;
  return b;
}

static inline msnap_block_t *ptrmap_remove(msnap_ptrmap_t *m, uint64_t ptr) {
  if (!m->buckets)
    return NULL;
  msnap_block_t **pp = &m->buckets[ptr_hash(ptr) & m->mask];
  while (*pp && (*pp)->ptr != ptr)
    pp = &(*pp)->hnext;
  msnap_block_t *b = *pp;
  if (b) {
    *pp = b->hnext;
    b->hnext = NULL;
    m->count--;
  }
  return b;
}

/* ------------------------------------------------------------------------
 * Size arithmetic (§3).
 * ------------------------------------------------------------------------ */

/* roundup_power2_divisions(size): the table entry of size's class. */
static inline uint64_t divisions_for(const msnap_conf_t *conf, uint64_t size) {
  int lg = floor_log2(size);
  int idx = lg > 20 ? lg - 20 : 0;
  if (idx > MSNAP_ROUNDUP_INTERVALS - 1)
    idx = MSNAP_ROUNDUP_INTERVALS - 1;
  return conf->roundup_power2_divisions[idx];
}

/* roundup_power2_next_division (CCA L2565-2583). */
static uint64_t next_division(uint64_t size, uint64_t divisions) {
  if ((size & (size - 1)) == 0)
    return size;
  int lg = floor_log2(size);
  uint64_t floor2 = 1ull << lg;
  uint64_t step = floor2 >> floor_log2(divisions);
  if (step == 0)
    return floor2 * 2;
  return round_up(size, step);
}

/*
 * round_size (§3.1; npu: the AddPadSize pad first, §20.1: 32 bytes, or 0
 * on Ascend950 with CANN >= 9.1.0, pad.c).  Pure function of the
 * conf; the caller holds a device lock (or the conf is not changing).
 */
static inline uint64_t round_size(const msnap_allocator_t *a, uint64_t size) {
  if (a->profile == MSNAP_PROFILE_NPU)
    size += a->npu_pad;
  if (size < MSNAP_MIN_BLOCK_SIZE)
    return MSNAP_MIN_BLOCK_SIZE;
  uint64_t d = divisions_for(&a->conf, size);
  if (d > 1 && size > MSNAP_MIN_BLOCK_SIZE * d)
    return next_division(size, d);
  return round_up(size, MSNAP_MIN_BLOCK_SIZE);
}

uint64_t msnap__round_size(const msnap_allocator_t *a, uint64_t size) {
  return round_size(a, size);
}

/* get_allocation_size (§3.3); size is the rounded request. */
uint64_t msnap__allocation_size(const msnap_conf_t *c, uint64_t size) {
  if (size <= MSNAP_SMALL_SIZE)
    return MSNAP_SMALL_BUFFER;
  if (size < MSNAP_MIN_LARGE_ALLOC)
    return c->large_segment_size;
  return round_up(size, MSNAP_ROUND_LARGE);
}

/* get_pool (§3.2): the newest allocate-to-pool scope whose filter accepts
 * the allocation (its stream, or the calling thread for use_mem_pool's
 * thread filter), else the default pools. */
static inline msnap_bpool_t *get_pool(msnap_device_t *d, uint64_t size,
                                      uint64_t stream) {
  if (msnap_unlikely(d->nscopes > 0)) {
    uint64_t tkey = 0;
    for (uint32_t i = d->nscopes; i-- > 0;) {
      const msnap_scope_t *sc = &d->scopes[i];
      bool match;
      if (sc->kind == MSNAP_SCOPE_ALL) {
        match = true;
      } else if (sc->kind == MSNAP_SCOPE_STREAM) {
        match = sc->key == stream;
      } else {
        if (tkey == 0)
          tkey = msnap__thread_key();
        match = sc->key == tkey;
      }
      if (match) {
        msnap_ppool_t *pp = msnap__ppool_find(d, sc->id);
        if (pp)
          return size <= MSNAP_SMALL_SIZE ? &pp->small : &pp->large;
      }
    }
  }
  return size <= MSNAP_SMALL_SIZE ? &d->small : &d->large;
}

/* ------------------------------------------------------------------------
 * Recording contexts.
 * ------------------------------------------------------------------------ */

void msnap__call_begin(msnap_allocator_t *a, msnap_call_t *c,
                       bool is_free_site) {
  c->rec = msnap__hsettings_on(&a->hist);
  memset(&c->r, 0, sizeof c->r);
  if (msnap_unlikely(c->rec))
    msnap__rctx_capture(&a->hist, &c->r, is_free_site);
}

void msnap__call_end(msnap_call_t *c) {
  if (msnap_unlikely(c->rec))
    msnap__rctx_release(&c->r);
}

/* ------------------------------------------------------------------------
 * Search, split, merge (§5, §6, §9).
 * ------------------------------------------------------------------------ */

static inline uint64_t esize(const msnap_block_t *b) {
  return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* get_free_block (§5): best fit by one lower_bound. */
static bool get_free_block(msnap_device_t *d, msnap_params_t *p) {
  const msnap_conf_t *conf = &d->a->conf;
  msnap_bpool_t *pool = p->pool;
  if (msnap_unlikely(d->has_allowed &&
                     conf->garbage_collection_threshold > 0))
    pool->get_free_blocks_call_count++;
  msnap_block_t *b =
      msnap__rb_lower_bound(&pool->blocks, p->stream, p->size, 0);
  if (!b || b->stream != p->stream)
    return false;
  if (msnap_unlikely(b->seg->expandable)) {
    if (p->expandable_active) {
      msnap_block_t *n = msnap__rb_next(b);
      while (b->seg->expandable && n && n->stream == p->stream &&
             esize(n) < esize(b)) {
        b = n;
        n = msnap__rb_next(n);
      }
    } else {
      do {
        b = msnap__rb_next(b);
      } while (b && b->seg->expandable && b->stream == p->stream);
      if (!b || b->stream != p->stream)
        return false;
    }
  }
  uint64_t mss = conf->max_split_size;
  if (p->size < mss && b->size >= mss)
    return false;
  if (p->size >= mss && b->size - p->size >= conf->max_non_split_rounding_size)
    return false;
  msnap__rb_erase(&pool->blocks, b);
  b->in_set = MSNAP_IN_NONE;
  p->block = b;
  return true;
}

/* should_split (§6.1; npu uses the global expandable flag, §20.5). */
static inline bool should_split(const msnap_device_t *d,
                                const msnap_block_t *b, uint64_t size,
                                bool expandable_active) {
  const msnap_allocator_t *a = d->a;
  if (b->pool->owner && b->pool->owner->no_split)
    return false;
  uint64_t remaining = b->size - size;
  bool exp = a->profile == MSNAP_PROFILE_NPU ? a->conf.expandable_segments
                                             : expandable_active;
  if (b->pool->is_small || exp)
    return remaining >= MSNAP_MIN_BLOCK_SIZE;
  return size < a->conf.max_split_size && remaining > MSNAP_SMALL_SIZE;
}

/*
 * alloc_found_block (§6.2).  `spare` is a block object reserved by the
 * caller for the split (consumed only when split).  Returns the allocated
 * block (a new object when split).
 */
static msnap_block_t *alloc_found_block(msnap_device_t *d, msnap_params_t *p,
                                        uint64_t orig_size, bool split,
                                        msnap_block_t *spare,
                                        const msnap_call_t *c) {
  msnap_block_t *block = p->block;
  msnap_bpool_t *pool = p->pool;
  int type = msnap__pool_stat_type(pool);
  msnap_stats_t *st = &d->stats;
  bool already_split = block->prev || block->next;
  bool exp = block->seg->expandable;
  uint64_t size = p->size;

  if (split) {
    msnap_block_t *remaining = block;
    block = spare;
    block->stream = remaining->stream;
    block->size = size;
    block->ptr = remaining->ptr;
    block->pool = pool;
    block->seg = remaining->seg;
    block->mapped = 1;
    msnap__link_before(block, remaining);
    remaining->ptr += size;
    remaining->size -= size;
    msnap__pool_insert_blocks(pool, remaining);
    if (!exp) {
      if (already_split) {
        msnap__stat2_dec(st->inactive_split_bytes, type, (int64_t)size);
      } else {
        msnap__stat2_inc(st->inactive_split_bytes, type,
                         (int64_t)remaining->size);
        msnap__stat2_inc(st->inactive_split, type, 1);
      }
    }
  } else if (already_split && !exp) {
    msnap__stat2_dec(st->inactive_split_bytes, type, (int64_t)block->size);
    msnap__stat2_dec(st->inactive_split, type, 1);
  }

  block->allocated = 1;
  block->requested_size = orig_size;
  if (msnap_unlikely(c->r.stack != 0)) {
    msnap__stack_ref(c->r.stack);
    block->stack = c->r.stack;
  }
  msnap__trace(d, c, MSNAP_ACTION_ALLOC, block->ptr, orig_size, block->stream,
               pool, 0);
  ptrmap_insert(&d->map, block);
  msnap__stat2_inc(st->allocation, type, 1);
  msnap__stat2_inc(st->allocated_bytes, type, (int64_t)block->size);
  msnap__stat2_inc(st->active, type, 1);
  msnap__stat2_inc(st->active_bytes, type, (int64_t)block->size);
  msnap__stat2_inc(st->requested_bytes, type, (int64_t)orig_size);
  if (block->size >= d->a->conf.max_split_size)
    msnap__stat_inc(&st->oversize_allocations, 1);
  return block;
}

static inline uint64_t try_merge(msnap_device_t *d, msnap_block_t *dst,
                                 msnap_block_t *src) {
  if (!src || src->allocated || src->event_count > 0 || src->nuses > 0 ||
      src->deferred || dst->mapped != src->mapped)
    return 0;
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev)
      dst->prev->next = dst;
    else
      dst->seg->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next)
      dst->next->prev = dst;
  }
  uint64_t subsumed = src->size;
  dst->size += subsumed;
  msnap__pool_erase(src);
  msnap__block_delete(d, src);
  return subsumed;
}

uint64_t msnap__try_merge(msnap_device_t *d, msnap_block_t *dst,
                          msnap_block_t *src) {
  return try_merge(d, dst, src);
}

/* free_block (§9.2): the block enters its pool, merged with free
 * neighbours; active/requested stats drop. */
void msnap__free_block(msnap_device_t *d, msnap_block_t *b,
                       const msnap_call_t *c) {
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  MSNAP_ASSERT(b->event_count == 0 && b->in_set == MSNAP_IN_NONE);
  msnap_bpool_t *pool = b->pool;
  msnap_stats_t *st = &d->stats;
  msnap__trace(d, c, MSNAP_ACTION_FREE_COMPLETED, b->ptr, b->requested_size,
               b->stream, pool, b->stack);
  if (msnap_unlikely(b->stack != 0)) {
    msnap__stack_unref(b->stack);
    b->stack = 0;
  }
  uint64_t original_size = b->size;
  uint64_t req = b->requested_size;
  int64_t net_blocks = 0, net_size = 0;
  msnap_block_t *prev = b->prev, *next = b->next;
  uint64_t s = try_merge(d, b, prev);
  if (s) {
    net_blocks--;
    net_size -= (int64_t)s;
  }
  s = try_merge(d, b, next);
  if (s) {
    net_blocks--;
    net_size -= (int64_t)s;
  }
  msnap__pool_insert_blocks(pool, b);
  if (b->prev || b->next) {
    net_blocks++;
    net_size += (int64_t)b->size;
  }
  int type = msnap__pool_stat_type(pool);
  if (!b->seg->expandable) {
    if (net_blocks > 0)
      msnap__stat2_inc(st->inactive_split, type, net_blocks);
    else if (net_blocks < 0)
      msnap__stat2_dec(st->inactive_split, type, -net_blocks);
    if (net_size > 0)
      msnap__stat2_inc(st->inactive_split_bytes, type, net_size);
    else if (net_size < 0)
      msnap__stat2_dec(st->inactive_split_bytes, type, -net_size);
  }
  msnap__stat2_dec(st->active, type, 1);
  msnap__stat2_dec(st->active_bytes, type, (int64_t)original_size);
  msnap__stat2_dec(st->requested_bytes, type, (int64_t)req);
}

/* free (device part, §9.1). */
static void free_locked(msnap_device_t *d, msnap_block_t *b,
                        const msnap_call_t *c) {
  msnap_stats_t *st = &d->stats;
  int type = msnap__pool_stat_type(b->pool);
  b->allocated = 0;
  msnap__stat2_dec(st->allocation, type, 1);
  msnap__stat2_dec(st->allocated_bytes, type, (int64_t)b->size);
  msnap__trace(d, c, MSNAP_ACTION_FREE_REQUESTED, b->ptr, b->requested_size,
               b->stream, b->pool, b->stack);
  if (b->size >= d->a->conf.max_split_size)
    msnap__stat_dec(&st->oversize_allocations, 1);
  if (msnap_unlikely(b->nuses > 0)) {
    if (msnap__capturing(d, b->stream)) {
      b->deferred = 1;
      b->link = d->deferred;
      d->deferred = b;
    } else {
      msnap__insert_events(d, b, c);
    }
  } else {
    msnap__free_block(d, b, c);
  }
}

/* ------------------------------------------------------------------------
 * Segments: creation and release (§7, §8).
 * ------------------------------------------------------------------------ */

/*
 * release_block (§8.2): cudaFree an unsplit, non-expandable free block and
 * its segment.  On a runtime failure nothing changes and the error is
 * returned (the segment stays cached).
 */
static int release_block(msnap_device_t *d, msnap_block_t *b,
                         const msnap_call_t *c) {
  msnap_allocator_t *a = d->a;
  msnap_stats_t *st = &d->stats;
  int rc = a->rt->free(a->rt_ctx, d->id, b->ptr);
  if (rc != 0)
    return msnap__set_error(rc,
                            "device runtime free of segment 0x%" PRIx64
                            " on device %d failed: %s",
                            b->ptr, d->id, msnap_strerror(rc));
  st->num_device_free++;
  msnap__trace(d, c, MSNAP_ACTION_SEGMENT_FREE, b->ptr, b->size, b->stream,
               b->pool, b->seg->stack);
  d->total_allocated_memory -= b->size;
  int type = msnap__pool_stat_type(b->pool);
  msnap__stat2_dec(st->segment, type, 1);
  msnap__reserved_dec(d, b->pool, (int64_t)b->size);
  if (b->size >= a->conf.max_split_size)
    msnap__stat_dec(&st->oversize_segments, 1);
  msnap__pool_erase(b);
  msnap__segment_delete(d, b->seg);
  msnap__block_delete(d, b);
  return 0;
}

/*
 * release_blocks (§8.2): release every unsplit non-expandable free block
 * of the pool, then unmap the free granules of expandable blocks (set
 * order) and destroy expandable segments left fully unmapped.  Returns the
 * first runtime error (0 if none); releasing continues past errors.
 */
static int release_blocks(msnap_device_t *d, msnap_bpool_t *pool,
                          const msnap_call_t *c) {
  int first_err = 0;
  msnap_block_t *to_unmap = NULL, **tail = &to_unmap;
  msnap_block_t *b = msnap__rb_first(&pool->blocks);
  while (b) {
    msnap_block_t *nx = msnap__rb_next(b);
    if (b->seg->expandable) {
      b->link = NULL;
      *tail = b;
      tail = &b->link;
    } else if (!b->prev && !b->next) {
      int rc = release_block(d, b, c);
      if (rc && !first_err)
        first_err = rc;
    }
    b = nx;
  }
  while (to_unmap) {
    b = to_unmap;
    to_unmap = b->link;
    b->link = NULL;
    msnap__unmap_block(d, b, c);
    if (!b->mapped && !b->prev && !b->next) {
      int rc = msnap__release_expandable_segment(d, b);
      if (rc && !first_err)
        first_err = rc;
    }
  }
  return first_err;
}

/*
 * alloc_block (§7): a new segment for p (or more mapped granules of an
 * expandable segment).  Returns true with p->block set (not in any set);
 * false with p->err = MSNAP_EOOM (limit, rejection or device OOM) or a hard
 * runtime / host error.
 */
static bool alloc_block(msnap_device_t *d, msnap_params_t *p, bool is_retry,
                        const msnap_call_t *c) {
  msnap_allocator_t *a = d->a;
  msnap_stats_t *st = &d->stats;
  uint64_t size = p->alloc_size;
  if (is_retry)
    st->num_alloc_retries++;
  if (d->has_allowed &&
      d->total_allocated_memory + size > d->allowed_memory_maximum) {
    p->err = MSNAP_EOOM;
    return false;
  }
  if (a->conf.throw_on_malloc_oom) {
    /* §8.4: the configured per_process_memory_fraction times the device
     * total, checked after the set_memory_fraction limit above. */
    uint64_t max_allowed = (uint64_t)(a->conf.per_process_memory_fraction *
                                      (double)d->device_total);
    if (d->total_allocated_memory + size > max_allowed) {
      st->num_oom_rejections++;
      p->rejected = true;
      p->err = MSNAP_EOOM;
      return false;
    }
  }
  if (p->expandable_active) {
    msnap_block_t *b = msnap__try_allocate_expandable(d, p, c);
    if (!b)
      return false;
    p->block = b;
    p->err = 0;
    return true;
  }
  msnap_block_t *b = msnap__block_new(d);
  if (!b) {
    p->err = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    return false;
  }
  msnap_segment_t *seg = msnap__segment_new(d, p->pool, p->stream);
  if (!seg) {
    msnap__block_delete(d, b);
    p->err = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    return false;
  }
  uint64_t ptr = 0;
  int rc = a->rt->malloc(a->rt_ctx, d->id, size, &ptr);
  if (rc != 0) {
    msnap__segment_delete(d, seg);
    msnap__block_delete(d, b);
    if (rc == MSNAP_EOOM) {
      p->err = MSNAP_EOOM;
    } else {
      p->err = msnap__set_error(rc,
                                "device runtime malloc of %" PRIu64
                                " bytes on device %d failed: %s",
                                size, d->id, msnap_strerror(rc));
    }
    return false;
  }
  d->total_allocated_memory += size;
  seg->base = ptr;
  seg->size = size;
  seg->head = b;
  b->stream = p->stream;
  b->size = size;
  b->ptr = ptr;
  b->pool = p->pool;
  b->seg = seg;
  b->mapped = 1;
  int type = msnap__pool_stat_type(p->pool);
  msnap__stat2_inc(st->segment, type, 1);
  msnap__reserved_inc(d, p->pool, (int64_t)size);
  if (size >= a->conf.max_split_size)
    msnap__stat_inc(&st->oversize_segments, 1);
  st->num_device_alloc++;
  msnap__trace(d, c, MSNAP_ACTION_SEGMENT_ALLOC, ptr, size, p->stream,
               p->pool, 0);
  if (msnap_unlikely(c->r.stack != 0)) {
    msnap__stack_ref(c->r.stack);
    seg->stack = c->r.stack;
  }
  p->block = b;
  p->err = 0;
  return true;
}

static inline void device_sync(msnap_device_t *d) {
  d->a->rt->device_synchronize(d->a->rt_ctx, d->id);
}

/* release_available_cached_blocks (§8.1). */
static bool release_available_cached_blocks(msnap_device_t *d,
                                            msnap_params_t *p,
                                            const msnap_call_t *c) {
  const msnap_conf_t *conf = &d->a->conf;
  uint64_t mss = conf->max_split_size;
  if (mss == UINT64_MAX)
    return false;
  if (d->a->profile == MSNAP_PROFILE_NPU)
    device_sync(d);
  msnap_bpool_t *pool = p->pool;
  uint64_t key = p->size > mss ? p->size : mss;
  msnap_block_t *it = msnap__rb_lower_bound(&pool->blocks, p->stream, key, 0);
  if (it && it->stream == p->stream && !it->seg->expandable) {
    if (it->prev || it->next)
      return false; /* never: blocks >= MSS are unsplit */
    return release_block(d, it, c) == 0;
  }
  msnap_block_t *first = msnap__rb_first(&pool->blocks);
  if (it == first)
    return false;
  msnap_block_t *cur = it ? msnap__rb_prev(it) : msnap__rb_last(&pool->blocks);
  uint64_t released = 0;
  while (released < key && cur->size >= mss && cur->stream == p->stream) {
    msnap_block_t *prevb = cur == first ? NULL : msnap__rb_prev(cur);
    if (!cur->seg->expandable && !cur->prev && !cur->next) {
      uint64_t sz = cur->size;
      if (release_block(d, cur, c) == 0)
        released += sz;
    }
    if (!prevb)
      break;
    cur = prevb;
  }
  return released >= key;
}

/* gc_count() (§2.1): truncated to int, then widened. */
static inline uint64_t gc_count(const msnap_block_t *b) {
  return (uint64_t)(int)(b->pool->get_free_blocks_call_count -
                         b->gc_count_base);
}

/*
 * garbage_collect_cached_blocks (§11), default large pool only.
 *
 * Ages: torch_npu keeps a per-block gc_count that every get_free_block
 * (GC on) increments on every block of the pool and resets on the block
 * it hands out (§20.6); CUDA stores the pool counter at insertion and
 * subtracts.  Both give "get_free_block calls on this pool since the block
 * last entered the free set" (a block enters only after being handed out,
 * split off, merged or created, all of which start at 0), so one
 * implementation serves both profiles.  npu: the device is synchronized
 * first; its "does not skip expandable blocks" cannot matter because its
 * config rejects expandable segments together with a GC threshold.
 */
static void garbage_collect(msnap_device_t *d, const msnap_call_t *c) {
  const msnap_conf_t *conf = &d->a->conf;
  uint64_t thr = (uint64_t)(conf->garbage_collection_threshold *
                            (double)d->allowed_memory_maximum);
  if (d->total_allocated_memory <= thr)
    return;
  if (d->a->profile == MSNAP_PROFILE_NPU)
    device_sync(d);
  uint64_t target = d->total_allocated_memory - thr;
  uint64_t reclaimed = 0;
  double total_age = 0.0;
  int64_t count = 0;
  for (msnap_block_t *b = msnap__rb_first(&d->large.blocks); b;
       b = msnap__rb_next(b)) {
    if (!b->prev && !b->next) {
      total_age += (double)gc_count(b);
      count++;
    }
  }
  if (count == 0)
    return;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    double age_thr = total_age / (double)count;
    freed = false;
    msnap_block_t *b = msnap__rb_first(&d->large.blocks);
    while (b) {
      msnap_block_t *nx = msnap__rb_next(b);
      if (!b->prev && !b->next && !b->seg->expandable &&
          (double)gc_count(b) >= age_thr) {
        uint64_t sz = b->size;
        double age = (double)gc_count(b);
        if (release_block(d, b, c) == 0) {
          freed = true;
          reclaimed += sz;
          total_age -= age;
          count--;
        }
      }
      b = nx;
    }
  }
}

/*
 * try_mempool_fallback (§18; CCA / NPUCachingAllocator.cpp
 * try_mempool_fallback): a cached block of a use_on_oom pool, tried in the
 * iteration order of use_on_oom_pools (a ska::flat_hash_set, emulated in
 * mempool.c) with expandable segments off for the search
 * (AllocParams(..., false)).  Only from a default pool.
 */
static bool try_mempool_fallback(msnap_device_t *d, msnap_params_t *p) {
  if (p->pool->owner)
    return false;
  const msnap_idset_t *set = &d->oom_pools;
  uint64_t end = msnap__idset_end(set);
  for (uint64_t i = 0; i < end; i++) {
    if (set->dist[i] < 0)
      continue;
    msnap_ppool_t *pp = msnap__ppool_find(d, set->v[i]);
    if (!pp)
      continue; /* ids leave the set with their pool's last reference */
    msnap_params_t q = *p;
    q.pool = p->size <= MSNAP_SMALL_SIZE ? &pp->small : &pp->large;
    q.expandable_active = false;
    if (get_free_block(d, &q)) {
      *p = q;
      return true;
    }
  }
  return false;
}

/* release_blocks of two pools in this order; the first error stays. */
static void release_pair(msnap_device_t *d, msnap_bpool_t *p1,
                         msnap_bpool_t *p2, const msnap_call_t *c,
                         int *first_err) {
  int rc = release_blocks(d, p1, c);
  if (rc && !*first_err)
    *first_err = rc;
  rc = release_blocks(d, p2, c);
  if (rc && !*first_err)
    *first_err = rc;
}

/*
 * release_cached_blocks (§8.2) -- also empty_cache.  id {0,0}: sync every
 * event and release the default pools (unless `capturing`); then the
 * freeable private pools (only `id` when non-zero).  Returns the first
 * runtime error (0 if none).
 */
int msnap__release_cached_blocks(msnap_device_t *d, msnap_mempool_id_t id,
                                 bool capturing, const msnap_call_t *c) {
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  int first_err = 0;
  if (msnap__id_zero(id) && !capturing) {
    msnap__sync_and_free_events(d, c, NULL);
    release_pair(d, &d->large, &d->small, c, &first_err);
  }
  msnap_ppool_t *pp = d->ppools;
  while (pp) {
    msnap_ppool_t *nx = pp->next;
    if (!pp->freeable) {
      pp = nx;
      continue;
    }
    if (!msnap__id_zero(id)) {
      if (!msnap__id_eq(pp->id, id)) {
        pp = nx;
        continue;
      }
      msnap__sync_and_free_events(d, c, pp);
    }
    release_pair(d, &pp->small, &pp->large, c, &first_err);
    if (pp->malloc_count == 0)
      msnap__ppool_free(d, pp);
    pp = nx;
  }
  return first_err;
}

/* ------------------------------------------------------------------------
 * OOM (§8.3, §20.7).
 * ------------------------------------------------------------------------ */

typedef struct oom_info_s {
  char msg[1024];
  uint64_t alloc_size, total_or_allowed, device_free;
} oom_info_t;

static uint64_t private_pool_free_bytes(const msnap_device_t *d) {
  uint64_t sum = 0;
  for (const msnap_ppool_t *pp = d->ppools; pp; pp = pp->next) {
    for (const msnap_block_t *b = msnap__rb_first(&pp->large.blocks); b;
         b = msnap__rb_next(b))
      sum += b->size;
    for (const msnap_block_t *b = msnap__rb_first(&pp->small.blocks); b;
         b = msnap__rb_next(b))
      sum += b->size;
  }
  return sum;
}

/*
 * reportProcessMemoryInfo (CCA): the processes using the device as the
 * runtime's process_memory op (NVML) reports them, "Process <pid> has
 * <size> memory in use. " each, this process as "Including non-PyTorch
 * memory, this process has ...".  Empty when the runtime cannot say.
 */
static void process_info(const msnap_device_t *d, char *out, size_t len) {
  const msnap_allocator_t *a = d->a;
  out[0] = '\0';
  if (a->rt->process_memory == NULL)
    return;
  msnap_proc_mem_t procs[16];
  size_t n = 0;
  if (a->rt->process_memory(a->rt_ctx, d->id, procs, 16, &n) != 0)
    return;
  size_t at = 0;
  uint32_t self = (uint32_t)getpid();
  for (size_t i = 0; i < n && i < 16 && at < len; i++) {
    char sz[32];
    msnap__format_size(procs[i].used_bytes, sz, sizeof sz);
    int w = procs[i].pid == self
                ? snprintf(out + at, len - at,
                           "Including non-PyTorch memory, this process has "
                           "%s memory in use. ", sz)
                : snprintf(out + at, len - at,
                           "Process %u has %s memory in use. ", procs[i].pid,
                           sz);
    if (w < 0 || (size_t)w >= len - at) {
      out[at] = '\0';
      return;
    }
    at += (size_t)w;
  }
}

static const char reserve_hint[] =
    " The request is larger than the virtual address range an expandable "
    "segment reserves on this stream: raise expandable_segments_reserve "
    "(or the stream's class in expandable_segments_reserve_by_class).";

static void build_oom(msnap_device_t *d, const msnap_params_t *p,
                      const msnap_call_t *c, oom_info_t *oom) {
  msnap_allocator_t *a = d->a;
  size_t dfree = 0, dtotal = 0;
  if (a->rt->mem_get_info(a->rt_ctx, d->id, &dfree, &dtotal) != 0) {
    dfree = 0;
    dtotal = d->device_total;
  }
  if (msnap__trace(d, c, MSNAP_ACTION_OOM, dfree, p->size, p->stream, p->pool,
                   0)) {
    d->oom_raw_time = d->ring.last_time;
    d->oom_capped = d->has_allowed;
    d->oom_allowed = d->has_allowed ? d->allowed_memory_maximum : 0;
  }
  d->stats.num_ooms++;
  char s_alloc[32], s_total[32], s_free[32], s_allowed[64] = "";
  msnap__format_size(p->alloc_size, s_alloc, sizeof s_alloc);
  msnap__format_size(dtotal, s_total, sizeof s_total);
  msnap__format_size(dfree, s_free, sizeof s_free);
  if (d->has_allowed) {
    msnap__format_size(d->allowed_memory_maximum, s_allowed,
                       sizeof s_allowed);
    strcat(s_allowed, " allowed; ");
  }
  uint64_t allocated =
      (uint64_t)d->stats.allocated_bytes[MSNAP_STAT_ALL].current;
  uint64_t reserved = (uint64_t)d->stats.reserved_bytes[MSNAP_STAT_ALL].current;
  if (a->profile == MSNAP_PROFILE_NPU) {
    char s_a[32], s_act[32], s_res[32];
    msnap__format_size(allocated, s_a, sizeof s_a);
    msnap__format_size((uint64_t)d->stats.active_bytes[MSNAP_STAT_ALL].current,
                       s_act, sizeof s_act);
    msnap__format_size(reserved, s_res, sizeof s_res);
    snprintf(oom->msg, sizeof oom->msg,
             "NPU out of memory. Tried to allocate %s (NPU %d; %s total "
             "capacity; %s already allocated; %s current active; %s free; "
             "%s%s reserved in total by PyTorch).If reserved memory is >> "
             "allocated memory try setting max_split_size_mb to avoid "
             "fragmentation.",
             s_alloc, d->id, s_total, s_a, s_act, s_free, s_allowed, s_res);
  } else {
    uint64_t priv = private_pool_free_bytes(d);
    char s_a[32], s_un[32], s_priv[32], priv_msg[128] = "";
    char procs[512] = "";
    process_info(d, procs, sizeof procs);
    msnap__format_size(allocated + priv, s_a, sizeof s_a);
    msnap__format_size(reserved - allocated - priv, s_un, sizeof s_un);
    if (priv > 0) {
      msnap__format_size(priv, s_priv, sizeof s_priv);
      snprintf(priv_msg, sizeof priv_msg,
               "with %s allocated in private pools (e.g., CUDA Graphs), ",
               s_priv);
    }
    /* The expandable-segments suggestion only while they are off
     * (pytorch#191105). */
    const char *hint =
        a->conf.expandable_segments
            ? ""
            : " If reserved but unallocated memory is large try setting "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
              "fragmentation.";
    snprintf(oom->msg, sizeof oom->msg,
             "CUDA out of memory. Tried to allocate %s. GPU %d has a total "
             "capacity of %s of which %s is free. %s%sOf the allocated "
             "memory %s is allocated by PyTorch, %sand %s is reserved by "
             "PyTorch but unallocated.%s%s  See documentation for Memory "
             "Management  (https://docs.pytorch.org/docs/stable/notes/"
             "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-"
             "conf)",
             s_alloc, d->id, s_total, s_free, procs, s_allowed, s_a, priv_msg,
             s_un, hint, p->reserve_short ? reserve_hint : "");
  }
  oom->alloc_size = p->alloc_size;
  oom->total_or_allowed =
      d->has_allowed ? d->allowed_memory_maximum : (uint64_t)dtotal;
  oom->device_free = dfree;
}

/* ------------------------------------------------------------------------
 * malloc (§4; npu §20.7-9).
 * ------------------------------------------------------------------------ */

enum { MALLOC_OK = 0, MALLOC_OOM = 1, MALLOC_REJECTED = 2 };

/*
 * The device part of malloc.  Caller holds d->lock.  Returns 0 with *out,
 * or MSNAP_EOOM with *oom filled (trace and num_ooms done; observers not
 * yet called), or MSNAP_EREJECTED, or another error (message set).
 */
static int malloc_locked(msnap_device_t *d, uint64_t orig, uint64_t stream,
                         const msnap_call_t *c, msnap_block_t **out,
                         oom_info_t *oom) {
  msnap_allocator_t *a = d->a;
  const msnap_conf_t *conf = &a->conf;
  bool npu = a->profile == MSNAP_PROFILE_NPU;
  /* Only a real capture on this stream (not an allocate-to-pool scope)
   * skips event processing and the free-cache-and-retry step
   * (is_capture_context, NPUCachingAllocator.cpp malloc). */
  bool capture = msnap__capturing(d, stream);
  bool lazy = npu && conf->multi_stream_lazy_reclaim;

  if (msnap_unlikely((d->pending_events || d->deferred) && !capture && !lazy))
    msnap__process_events(d, c);

  /* Reserve everything that needs host memory first. */
  if (msnap_unlikely(ptrmap_reserve(&d->map) != 0))
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  msnap_block_t *spare = msnap__block_new(d);
  if (msnap_unlikely(!spare))
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");

  msnap_params_t p;
  p.stream = stream;
  p.size = round_size(a, orig);
  p.pool = get_pool(d, p.size, stream);
  p.alloc_size = msnap__allocation_size(&a->conf, p.size);
  if (npu && conf->page_size_1g && !p.pool->is_small)
    p.alloc_size = round_up(p.alloc_size, MSNAP_EXTRA_LARGE_BUFFER);
  p.block = NULL;
  p.err = 0;
  p.rejected = false;
  p.reserve_short = false;
  p.expandable_active =
      conf->expandable_segments && a->rt->vmm_reserve != NULL;

  if (lazy && d->pending_events > MSNAP_LAZY_QUERY_SIZE && !capture)
    msnap__process_events(d, c);

  bool found = get_free_block(d, &p);
  if (!found && lazy && !capture && (d->pending_events || d->deferred)) {
    msnap__process_events(d, c);
    found = get_free_block(d, &p);
  }
  if (msnap_unlikely(!found)) {
    if (d->has_allowed && conf->garbage_collection_threshold > 0)
      garbage_collect(d, c);
    found = alloc_block(d, &p, false, c);
    if (!found && p.err != MSNAP_EOOM)
      goto hard_error;
    if (!found && !p.rejected) {
      found = try_mempool_fallback(d, &p);
      if (!found && release_available_cached_blocks(d, &p, c)) {
        found = alloc_block(d, &p, false, c);
        if (!found && p.err != MSNAP_EOOM)
          goto hard_error;
      }
      if (!found && !p.rejected && !capture) {
        if (npu) {
          /* torch_npu: device sync, then empty the workspace allocator
           * (workspace.c takes only its own lock: safe under ours). */
          device_sync(d);
          msnap_workspace_empty_cache(a, d->id);
        }
        msnap__release_cached_blocks(d, (msnap_mempool_id_t){0, 0}, false,
                                     c);
        found = alloc_block(d, &p, true, c);
        if (!found && p.err != MSNAP_EOOM)
          goto hard_error;
      }
    }
    if (!found) {
      msnap__block_delete(d, spare);
      if (p.rejected) {
        char s_alloc[32];
        msnap__format_size(p.alloc_size, s_alloc, sizeof s_alloc);
        return msnap__set_error(
            MSNAP_EREJECTED,
            "%s out of memory: allocation of %s on device %d preemptively "
            "rejected by throw_on_%smalloc_oom (per_process_memory_fraction "
            "%g of the device)",
            prof_dev(a), s_alloc, d->id, npu ? "npu" : "cuda",
            conf->per_process_memory_fraction);
      }
      build_oom(d, &p, c, oom);
      return MSNAP_EOOM;
    }
  }

  /* npu base_addr_aligned_kb (§20.4): as torch_npu, the found block's
   * object keeps the unaligned head (and goes back to the pool); a new
   * object starts at the aligned address and is the one allocated (split
   * below as usual).  torch_npu decides by the global expandable flag, so
   * after a run-time switch to expandable segments the found block can
   * belong to a non-expandable segment.  inactive_split* count the free
   * split blocks of non-expandable segments (§6.2, §9.2: a per-segment
   * test), so there the head is counted, and so is the aligned block
   * (split now, alloc_found_block takes it back out): from (1, S) or
   * (0, 0) to (2, S) for the S bytes of the found block.  In an expandable
   * segment nothing is counted, as in torch_npu. */
  if (npu && conf->expandable_segments && conf->base_addr_aligned_kb > 0 &&
      p.size >= MSNAP_ROUND_LARGE) {
    uint64_t g = conf->base_addr_aligned_kb * 1024;
    uint64_t mis = p.block->ptr % g;
    if (mis) {
      uint64_t gap = g - mis;
      if (gap + p.size <= p.block->size) {
        msnap_block_t *aligned = msnap__block_new(d);
        if (aligned) {
          msnap_block_t *head = p.block;
          if (!head->seg->expandable) {
            msnap_stats_t *st = &d->stats;
            int type = msnap__pool_stat_type(head->pool);
            if (head->prev || head->next) {
              msnap__stat2_inc(st->inactive_split, type, 1);
            } else {
              msnap__stat2_inc(st->inactive_split, type, 2);
              msnap__stat2_inc(st->inactive_split_bytes, type,
                               (int64_t)head->size);
            }
          }
          aligned->stream = head->stream;
          aligned->size = head->size - gap;
          aligned->ptr = head->ptr + gap;
          aligned->pool = head->pool;
          aligned->seg = head->seg;
          aligned->mapped = 1;
          msnap__link_after(aligned, head);
          head->size = gap;
          msnap__pool_insert_blocks(head->pool, head);
          p.block = aligned;
        }
      }
    }
  }

  bool split = should_split(d, p.block, p.size, p.expandable_active);
  *out = alloc_found_block(d, &p, orig, split, spare, c);
  if (!split)
    msnap__block_delete(d, spare);
  return 0;

hard_error:
  msnap__block_delete(d, spare);
  return p.err;
}

/* ------------------------------------------------------------------------
 * Public entry points.
 * ------------------------------------------------------------------------ */

static _Thread_local int tl_device_hint;

/* MSNAP_DEBUG >= 3: the device's invariants after every malloc / free. */
static void debug_check_locked(msnap_device_t *d) {
  char msg[512];
  if (msnap__device_check_locked(d, msg, sizeof msg) != 0)
    msnap__assert_fail(msg, __FILE__, __LINE__);
}

static inline msnap_device_t *get_device(msnap_allocator_t *a, int device) {
  if (msnap_unlikely(!a || device < 0 || device >= a->ndevices))
    return NULL;
  return &a->devices[device];
}

void msnap__device_lock(msnap_allocator_t *a, int device) {
  msnap__lock(&a->devices[device].lock);
}

void msnap__device_unlock(msnap_allocator_t *a, int device) {
  msnap__unlock(&a->devices[device].lock);
}

const msnap_conf_t *msnap__allocator_conf(msnap_allocator_t *a) {
  return &a->conf;
}

msnap_conf_t *msnap__allocator_conf_mut(msnap_allocator_t *a) {
  return &a->conf;
}

msnap_device_t *msnap__device(msnap_allocator_t *a, int device) {
  return get_device(a, device);
}

int msnap_device_count(msnap_allocator_t *a) { return a ? a->ndevices : 0; }

msnap_profile_t msnap_profile(msnap_allocator_t *a) { return a->profile; }

const msnap_runtime_ops_t *msnap_runtime(msnap_allocator_t *a) {
  return a->rt;
}

void *msnap_runtime_ctx(msnap_allocator_t *a) { return a->rt_ctx; }

int msnap_malloc(msnap_allocator_t *a, int device, size_t size,
                 uint64_t stream, uint64_t *ptr) {
  msnap_device_t *d = get_device(a, device);
  if (msnap_unlikely(!d || !ptr))
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_malloc: invalid device %d or NULL ptr",
                            device);
  if (msnap_unlikely(size >= MSNAP_ONE_EB))
    return msnap__set_error(MSNAP_EOOM,
                            "%s out of memory. Tried to allocate more than "
                            "1EB memory.",
                            prof_dev(a));
  if (msnap_unlikely(size == 0)) {
    *ptr = 0;
    return 0;
  }
  if (msnap_unlikely(msnap__bad_fork(a)))
    return msnap__fork_check(a, "msnap_malloc");
  if (msnap_unlikely(!atomic_load_explicit(&a->caching_enabled,
                                           memory_order_relaxed)))
    return msnap__raw_malloc(a, device, size, ptr);

  msnap_call_t c;
  msnap__call_begin(a, &c, false);
  msnap_block_t *b = NULL;
  oom_info_t oom;
  msnap__lock(&d->lock);
  int rc = malloc_locked(d, size, stream, &c, &b, &oom);
  if (msnap_debug_level >= 3) debug_check_locked(d);
  msnap__unlock(&d->lock);
  msnap__call_end(&c);
  if (msnap_likely(rc == 0)) {
    tl_device_hint = device;
    *ptr = b->ptr;
    return 0;
  }
  if (rc == MSNAP_EOOM) {
    msnap__oom_notify(a, device, oom.alloc_size, oom.total_or_allowed,
                      oom.device_free);
    return msnap__set_error(MSNAP_EOOM, "%s", oom.msg);
  }
  return rc;
}

/* Find the device holding live allocation ptr and lock it (NULL if none);
 * with take, the block also leaves the pointer map (free). */
static msnap_device_t *lock_owner(msnap_allocator_t *a, uint64_t ptr,
                                  msnap_block_t **out, bool take) {
  int n = a->ndevices, start = tl_device_hint;
  if (start >= n)
    start = 0;
  for (int k = 0, i = start; k < n; k++, i = i + 1 == n ? 0 : i + 1) {
    msnap_device_t *d = &a->devices[i];
    msnap__lock(&d->lock);
    msnap_block_t *b = take ? ptrmap_remove(&d->map, ptr)
                            : ptrmap_find(&d->map, ptr);
    if (b) {
      *out = b;
      return d;
    }
    msnap__unlock(&d->lock);
  }
  return NULL;
}

static int bad_pointer(uint64_t ptr) {
  return msnap__set_error(MSNAP_EBADPTR, "invalid device pointer: 0x%" PRIx64,
                          ptr);
}

int msnap_free(msnap_allocator_t *a, uint64_t ptr) {
  if (msnap_unlikely(!a))
    return msnap__set_error(MSNAP_EINVAL, "msnap_free: NULL allocator");
  if (msnap_unlikely(ptr == 0))
    return 0;
  /* A forked child on a real runtime forgets inherited allocations. */
  if (msnap_unlikely(msnap__bad_fork(a)))
    return 0;
  msnap_call_t c;
  msnap__call_begin(a, &c, true);
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, true);
  if (msnap_likely(d != NULL)) {
    free_locked(d, b, &c);
    if (msnap_debug_level >= 3) debug_check_locked(d);
    msnap__unlock(&d->lock);
    msnap__call_end(&c);
    return 0;
  }
  msnap__call_end(&c);
  if (__atomic_load_n(&a->raw_count, __ATOMIC_RELAXED) > 0) {
    int rc = msnap__raw_free(a, ptr);
    if (rc <= 0)
      return rc;
  }
  return bad_pointer(ptr);
}


/*
 * recordStream.  cuda: a use on the block's own stream is ignored (CCA
 * DeviceCachingAllocator::recordStream, "ignore uses on the allocation
 * stream").  npu: every stream is inserted, the block's own included
 * (NPUCachingAllocator.cpp DeviceCachingAllocator::recordStream), so the
 * free of such a block waits for an event on its own stream.  A stream
 * recorded while a graph capture is on is remembered as a graph use
 * (block_to_cudagraph_stream_uses): it is dropped before the deferred
 * free inserts its events.
 */
int msnap_record_stream(msnap_allocator_t *a, uint64_t ptr, uint64_t stream) {
  if (!a)
    return msnap__set_error(MSNAP_EINVAL, "msnap_record_stream: NULL");
  if (ptr == 0)
    return 0;
  if (msnap__bad_fork(a))
    return msnap__fork_check(a, "msnap_record_stream");
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, false);
  if (!d) {
    if (msnap__raw_lookup(a, ptr, NULL))
      return 0; /* raw allocations ignore record_stream (§19) */
    return msnap__set_error(MSNAP_EBADPTR,
                            "invalid device pointer: 0x%" PRIx64, ptr);
  }
  int rc = 0;
  if (stream != b->stream || a->profile == MSNAP_PROFILE_NPU) {
    uint32_t at = b->nuses;
    for (uint32_t i = 0; i < b->nuses; i++)
      if (b->stream_uses[i] == stream)
        at = i;
    if (at == b->nuses) {
      if (MSNAP_GROW(b->stream_uses, b->cap_uses, b->nuses + 1) != 0) {
        rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
        goto out;
      }
      b->stream_uses[b->nuses++] = stream;
    }
    if (msnap_unlikely(msnap__capturing_any(d)) && at < 64)
      b->graph_uses |= 1ull << at;
  }
out:
  msnap__unlock(&d->lock);
  return rc;
}

int msnap_erase_stream(msnap_allocator_t *a, uint64_t ptr, uint64_t stream) {
  if (!a)
    return msnap__set_error(MSNAP_EINVAL, "msnap_erase_stream: NULL");
  if (ptr == 0)
    return 0;
  if (msnap__bad_fork(a))
    return msnap__fork_check(a, "msnap_erase_stream");
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, false);
  if (!d) {
    if (msnap__raw_lookup(a, ptr, NULL))
      return 0;
    return msnap__set_error(MSNAP_EBADPTR,
                            "invalid device pointer: 0x%" PRIx64, ptr);
  }
  for (uint32_t i = 0; i < b->nuses; i++) {
    if (b->stream_uses[i] == stream) {
      b->stream_uses[i] = b->stream_uses[--b->nuses];
      break;
    }
  }
  msnap__unlock(&d->lock);
  return 0;
}

int msnap_empty_cache(msnap_allocator_t *a, int device) {
  if (!a || device >= a->ndevices)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_empty_cache: invalid device %d", device);
  if (msnap__bad_fork(a))
    return msnap__fork_check(a, "msnap_empty_cache");
  msnap_call_t c;
  msnap__call_begin(a, &c, true);
  int first_err = 0;
  for (int i = 0; i < a->ndevices; i++) {
    if (device >= 0 && i != device)
      continue;
    msnap_device_t *d = &a->devices[i];
    if (a->profile == MSNAP_PROFILE_NPU) {
      /* torch_npu: sync before locking; the workspace is emptied too. */
      device_sync(d);
      int wrc = msnap_workspace_empty_cache(a, i);
      if (wrc && !first_err)
        first_err = wrc;
    }
    msnap__lock(&d->lock);
    int rc = msnap__release_cached_blocks(d, (msnap_mempool_id_t){0, 0},
                                          msnap__capturing_any(d), &c);
    msnap__unlock(&d->lock);
    if (rc && !first_err)
      first_err = rc;
  }
  msnap__call_end(&c);
  return first_err;
}

int msnap_allocation_size(msnap_allocator_t *a, uint64_t ptr, size_t *size) {
  if (!a || !size)
    return msnap__set_error(MSNAP_EINVAL, "msnap_allocation_size: NULL");
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, false);
  if (d) {
    *size = b->size;
    msnap__unlock(&d->lock);
    return 0;
  }
  uint64_t rsz = 0;
  if (msnap__raw_lookup(a, ptr, &rsz)) {
    *size = rsz;
    return 0;
  }
  return bad_pointer(ptr);
}

int msnap__allocation_base(msnap_allocator_t *a, uint64_t ptr,
                           uint64_t *base, uint64_t *size) {
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, false);
  if (!d)
    return bad_pointer(ptr);
  const msnap_block_t *h = b->seg->head;
  uint64_t sum = 0;
  for (const msnap_block_t *x = h; x; x = x->next)
    sum += x->size;
  if (base)
    *base = h->ptr;
  if (size)
    *size = sum;
  msnap__unlock(&d->lock);
  return 0;
}

int msnap__allocation_info(msnap_allocator_t *a, uint64_t ptr, int *device,
                           uint64_t *requested_size, uint64_t *stream,
                           msnap_mempool_id_t *pool, uint32_t *stack) {
  msnap_block_t *b;
  msnap_device_t *d = lock_owner(a, ptr, &b, false);
  if (!d)
    return bad_pointer(ptr);
  if (device)
    *device = d->id;
  if (requested_size)
    *requested_size = b->requested_size;
  if (stream)
    *stream = b->stream;
  if (pool)
    *pool = msnap__pool_id(b->pool);
  if (stack) {
    *stack = b->stack;
    if (b->stack)
      msnap__stack_ref(b->stack);
  }
  msnap__unlock(&d->lock);
  return 0;
}

/* Lock every device in index order (settings changes). */
static void lock_all(msnap_allocator_t *a) {
  for (int i = 0; i < a->ndevices; i++)
    msnap__lock(&a->devices[i].lock);
}

static void unlock_all(msnap_allocator_t *a) {
  for (int i = a->ndevices; i-- > 0;)
    msnap__unlock(&a->devices[i].lock);
}

int msnap_set_allocator_settings(msnap_allocator_t *a, const char *conf) {
  if (!a || !conf)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_set_allocator_settings: NULL argument");
  char err[512] = "";
  lock_all(a);
  uint64_t mss = a->conf.max_split_size;
  int rc = msnap__conf_parse_runtime(&a->conf, conf, err, sizeof err);
  if (a->conf.max_split_size != mss)
    a->mss_changed = true;
  unlock_all(a);
  if (rc != 0)
    return msnap__set_error(rc, "%s", err[0] ? err : "invalid alloc conf");
  return 0;
}

/* setExpandableSegmentReserveClassForStream (pytorch#192269): tag a
 * stream with a reserve class; "" or NULL clears the tag.  Taken into
 * account by the stream's next new expandable segment. */
int msnap_set_expandable_segment_reserve_class(msnap_allocator_t *a,
                                               uint64_t stream,
                                               const char *reserve_class) {
  if (!a)
    return msnap__set_error(MSNAP_EINVAL,
                            "set_expandable_segment_reserve_class: NULL");
  const char *cls = reserve_class ? reserve_class : "";
  if (strlen(cls) >= MSNAP_RESERVE_CLASS_LEN)
    return msnap__set_error(MSNAP_EINVAL,
                            "expandable segment reserve class '%.60s' is "
                            "longer than %d bytes",
                            cls, MSNAP_RESERVE_CLASS_LEN - 1);
  int rc = 0;
  lock_all(a);
  uint32_t i = 0;
  while (i < a->nstream_classes && a->stream_classes[i].stream != stream)
    i++;
  if (cls[0] == '\0') {
    if (i < a->nstream_classes)
      a->stream_classes[i] = a->stream_classes[--a->nstream_classes];
  } else {
    if (i == a->nstream_classes &&
        msnap__grow((void **)&a->stream_classes, &a->stream_classes_cap,
                    a->nstream_classes, 1, sizeof *a->stream_classes) != 0) {
      rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
      goto out;
    }
    a->stream_classes[i].stream = stream;
    snprintf(a->stream_classes[i].name, MSNAP_RESERVE_CLASS_LEN, "%s", cls);
    if (i == a->nstream_classes)
      a->nstream_classes++;
  }
out:
  unlock_all(a);
  return rc;
}

/*
 * The conf string as last applied.  msnap_set_allocator_settings replaces
 * (and frees) conf.raw under every device lock, so the string is copied
 * under device 0's lock into a per-thread buffer, valid until this
 * thread's next call.
 */
static _Thread_local char *tl_settings;
static _Thread_local size_t tl_settings_cap;

const char *msnap_allocator_settings(msnap_allocator_t *a) {
  if (!a || a->ndevices <= 0)
    return "";
  const char *out = "";
  msnap__lock(&a->devices[0].lock);
  const char *raw = a->conf.raw ? a->conf.raw : "";
  size_t n = strlen(raw) + 1;
  if (n > tl_settings_cap) {
    char *nb = realloc(tl_settings, n);
    if (nb) {
      tl_settings = nb;
      tl_settings_cap = n;
    }
  }
  if (n <= tl_settings_cap) {
    memcpy(tl_settings, raw, n);
    out = tl_settings;
  }
  msnap__unlock(&a->devices[0].lock);
  return out;
}

/* setMemoryFraction (§16); caller holds d->lock. */
void msnap__set_fraction_locked(msnap_device_t *d, double fraction) {
  d->fraction = fraction;
  if (fraction < 1.0) {
    d->has_allowed = true;
    d->allowed_memory_maximum =
        (uint64_t)(fraction * (double)d->device_total);
  } else {
    d->has_allowed = false;
    d->allowed_memory_maximum = 0;
  }
}

int msnap_set_memory_fraction(msnap_allocator_t *a, int device,
                              double fraction) {
  msnap_device_t *d = get_device(a, device);
  if (!d)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_set_memory_fraction: invalid device %d",
                            device);
  if (!(fraction >= 0.0 && fraction <= 1.0))
    return msnap__set_error(MSNAP_EINVAL,
                            "invalid fraction:%g. Please set within [0, 1].",
                            fraction);
  msnap__lock(&d->lock);
  msnap__set_fraction_locked(d, fraction);
  msnap__unlock(&d->lock);
  return 0;
}

int msnap__cap_info(msnap_allocator_t *a, int device, msnap_cap_info_t *out) {
  msnap_device_t *d = get_device(a, device);
  memset(out, 0, sizeof *out);
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  out->capped = d->has_allowed;
  out->allowed = d->has_allowed ? d->allowed_memory_maximum : 0;
  out->have_oom = d->oom_raw_time != 0;
  out->oom_raw_time = d->oom_raw_time;
  out->oom_capped = d->oom_capped;
  out->oom_allowed = d->oom_allowed;
  msnap__unlock(&d->lock);
  return 0;
}

int msnap_get_memory_fraction(msnap_allocator_t *a, int device,
                              double *fraction) {
  msnap_device_t *d = get_device(a, device);
  if (!d || !fraction)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_get_memory_fraction: invalid device %d",
                            device);
  msnap__lock(&d->lock);
  *fraction = d->has_allowed && d->device_total
                  ? (double)d->allowed_memory_maximum / (double)d->device_total
                  : 1.0;
  msnap__unlock(&d->lock);
  return 0;
}

int msnap_set_caching_enabled(msnap_allocator_t *a, bool enabled) {
  if (!a)
    return msnap__set_error(MSNAP_EINVAL, "msnap_set_caching_enabled: NULL");
  atomic_store(&a->caching_enabled, enabled);
  return 0;
}

bool msnap_caching_enabled(msnap_allocator_t *a) {
  return a && atomic_load(&a->caching_enabled);
}

int msnap_mem_get_info(msnap_allocator_t *a, int device, size_t *free_bytes,
                       size_t *total_bytes) {
  if (!get_device(a, device) || !free_bytes || !total_bytes)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_mem_get_info: invalid device %d", device);
  if (msnap__bad_fork(a))
    return msnap__fork_check(a, "msnap_mem_get_info");
  size_t f = 0, t = 0;
  int rc = a->rt->mem_get_info(a->rt_ctx, device, &f, &t);
  if (rc != 0)
    return msnap__set_error(rc, "device runtime mem_get_info failed: %s",
                            msnap_strerror(rc));
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

