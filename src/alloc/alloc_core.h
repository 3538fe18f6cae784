/*
 * alloc_core.h -- helpers shared by the allocator module's source files
 * (alloc.c, events.c, expandable.c, mempool.c, raw.c, create.c, check.c)
 * and the allocator's white-box tests.  Everything here runs
 * with the device lock held unless the comment says otherwise.
 */
#ifndef MSNAP_ALLOC_CORE_H
#define MSNAP_ALLOC_CORE_H

#include "alloc/alloc.h"

/* A stream's expandable-segment reserve class (alloc.h stream_classes). */
typedef struct msnap_stream_class_s {
  uint64_t stream;
  char name[MSNAP_RESERVE_CLASS_LEN];
} msnap_stream_class_t;

/* One allocator call's recording context: captured outside the lock. */
typedef struct msnap_call_s {
  msnap_rctx_t r;
  bool rec; /* msnap__history_active() at the start of the call */
} msnap_call_t;

/* Allocation parameters (PyTorch's AllocParams). */
typedef struct msnap_params_s {
  uint64_t stream;
  uint64_t size;       /* rounded request                                */
  uint64_t alloc_size; /* segment size (get_allocation_size)            */
  msnap_bpool_t *pool;
  msnap_block_t *block; /* found or created block                       */
  int err;              /* 0, MSNAP_EOOM (allocation failure) or hard    */
  bool rejected;        /* throw_on_*malloc_oom                          */
  bool expandable_active;
  bool reserve_short;   /* request > the stream's expandable VA reserve */
} msnap_params_t;

static inline msnap_mempool_id_t msnap__pool_id(const msnap_bpool_t *p) {
  msnap_mempool_id_t zero = {0, 0};
  return p->owner ? p->owner->id : zero;
}

static inline bool msnap__id_eq(msnap_mempool_id_t x, msnap_mempool_id_t y) {
  return x.first == y.first && x.second == y.second;
}

static inline bool msnap__id_zero(msnap_mempool_id_t x) {
  return x.first == 0 && x.second == 0;
}

/* Record a trace entry when history is on.  fallback_stack is the stack
 * PyTorch uses when the call's context has none (the block's alloc stack
 * for free_*, the segment's creation stack for segment_free/unmap).
 * Whether history is on is decided here, under the device lock, as
 * PyTorch's record_trace decides it: a call that began before history
 * was switched on (c->rec false: no context gathered) still records what
 * it changes once it holds the lock, with an empty context -- else a
 * trace would miss an alloc between two frees of one address.
 * True when the entry was recorded (its raw time: d->ring.last_time). */
static inline bool msnap__trace(msnap_device_t *d, const msnap_call_t *c,
                                msnap_action_t act, uint64_t addr,
                                uint64_t size, uint64_t stream,
                                const msnap_bpool_t *pool,
                                uint32_t fallback_stack) {
  if (msnap_unlikely(c->rec || msnap__hsettings_on(&d->a->hist))) {
    uint32_t ovr = c->r.stack ? 0 : fallback_stack;
    return msnap__ring_record(&d->ring, &d->a->hist, act, addr, size,
                              stream, msnap__pool_id(pool), &c->r, ovr);
  }
  return false;
}

/* Block objects: recycled through d->free_objs (no malloc in steady
 * state).  msnap__block_new returns a zeroed block or NULL (ENOMEM). */
msnap_block_t *msnap__block_new(msnap_device_t *d);
void msnap__block_delete(msnap_device_t *d, msnap_block_t *b);

/* Set membership. */
void msnap__pool_insert_blocks(msnap_bpool_t *pool, msnap_block_t *b);
void msnap__pool_insert_unmapped(msnap_bpool_t *pool, msnap_block_t *b);
void msnap__pool_erase(msnap_block_t *b);

/* Link nb into b's segment immediately before / after b. */
void msnap__link_before(msnap_block_t *nb, msnap_block_t *b);
void msnap__link_after(msnap_block_t *nb, msnap_block_t *b);

/* try_merge_blocks (§9.3): returns the subsumed size (0: refused). */
uint64_t msnap__try_merge(msnap_device_t *d, msnap_block_t *dst,
                          msnap_block_t *src);

msnap_segment_t *msnap__segment_new(msnap_device_t *d, msnap_bpool_t *pool,
                                    uint64_t stream);
void msnap__segment_delete(msnap_device_t *d, msnap_segment_t *s);

/* expandable.c */
msnap_block_t *msnap__try_allocate_expandable(msnap_device_t *d,
                                              msnap_params_t *p,
                                              const msnap_call_t *c);
void msnap__unmap_block(msnap_device_t *d, msnap_block_t *b,
                        const msnap_call_t *c);
int msnap__release_expandable_segment(msnap_device_t *d, msnap_block_t *b);
/* Unmap and release every mapping and the VA of s (destroy). */
void msnap__expandable_teardown(msnap_device_t *d, msnap_segment_t *s);

/* mempool.c */
msnap_ppool_t *msnap__ppool_find(msnap_device_t *d, msnap_mempool_id_t id);
/* The calling thread's key for MSNAP_SCOPE_THREAD scopes: assigned on
 * first use from a process-wide counter, never 0, never reused (a pthread
 * id can be reused after the thread exits). */
uint64_t msnap__thread_key(void);
/* The use_on_oom pool set (alloc.h msnap_idset_t): one past its last
 * slot (iterate slots [0, end) with dist >= 0), its checker, free. */
uint64_t msnap__idset_end(const msnap_idset_t *s);
int msnap__idset_check(const msnap_idset_t *s, char *msg, size_t len);
void msnap__idset_free(msnap_idset_t *s);

/*
 * is_capture_context (CCA / NPUCachingAllocator.cpp is_capture_context):
 * a graph capture (markCaptureBegin) is in progress on `stream`.  PyTorch
 * asks about the calling thread's current stream; memsnap has no current
 * stream, so callers pass the stream the call is about (the malloc's
 * stream, the freed block's stream).  Allocate-to-pool scopes alone
 * (use_mem_pool, MemPool routing) never count.
 */
static inline bool msnap__capturing(const msnap_device_t *d,
                                    uint64_t stream) {
  if (msnap_likely(d->ncaptures == 0))
    return false;
  for (uint32_t i = 0; i < d->ncaptures; i++)
    if (d->capture_streams[i] == stream)
      return true;
  return false;
}

/* Some graph capture is in progress on the device (calls that name no
 * stream: empty_cache, releasePool). */
static inline bool msnap__capturing_any(const msnap_device_t *d) {
  return d->ncaptures > 0;
}
void msnap__ppool_free(msnap_device_t *d, msnap_ppool_t *pp);

/* events.c (§10) */
void msnap__insert_events(msnap_device_t *d, msnap_block_t *b,
                          const msnap_call_t *c);
void msnap__process_events(msnap_device_t *d, const msnap_call_t *c);
/* Wait for every queued event (only those of `only`'s blocks when non-NULL)
 * and complete the frees; num_sync_all_streams += 1. */
void msnap__sync_and_free_events(msnap_device_t *d, const msnap_call_t *c,
                                 const msnap_ppool_t *only);

/* raw.c (§19): caching disabled.  raw_free returns 1 when ptr is not
 * a raw allocation. */
int msnap__raw_malloc(msnap_allocator_t *a, int device, uint64_t size,
                      uint64_t *ptr);
int msnap__raw_free(msnap_allocator_t *a, uint64_t ptr);
bool msnap__raw_lookup(msnap_allocator_t *a, uint64_t ptr, uint64_t *size);
void msnap__raw_release_all(msnap_allocator_t *a);

/* alloc.c: used by the other allocator files */
/* free_block (§9.2): the block enters its pool, merged with free
 * neighbours. */
void msnap__free_block(msnap_device_t *d, msnap_block_t *b,
                       const msnap_call_t *c);
/* setMemoryFraction (§16). */
void msnap__set_fraction_locked(msnap_device_t *d, double fraction);
/* release_cached_blocks; `capturing`: the caller is in a capture context
 * (the default pools are then left alone). */
int msnap__release_cached_blocks(msnap_device_t *d, msnap_mempool_id_t id,
                                 bool capturing, const msnap_call_t *c);
void msnap__call_begin(msnap_allocator_t *a, msnap_call_t *c,
                       bool is_free_site);
void msnap__call_end(msnap_call_t *c);

#endif /* MSNAP_ALLOC_CORE_H */
