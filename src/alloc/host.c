/*
 * host.c -- the pinned host caching allocator (PyTorch's
 * CachingHostAllocator): msnap_host_malloc/free/record_stream/empty_cache,
 * its statistics, its ring of host trace entries, and what snapshots need
 * to put it into host_segments/host_traces.
 *
 * Behaviour (memsnap's reading of CachingHostAllocator; allocator-algorithm
 * does not cover it):
 *   - A request of n > 0 bytes is rounded up to the next power of two
 *     (n <= pinned_max_round_threshold, which is unlimited unless set) or,
 *     above the threshold, to a multiple of 2 MiB.  Every block is one
 *     runtime host_malloc of its rounded size (or a piece of the reserve
 *     segment, below); blocks are never split or merged.
 *   - A freed block is cached in the free list of its exact size and
 *     handed out again by the next request of that rounded size.  If
 *     record_stream marked it used on streams, free records one event per
 *     stream (on device 0: host memory has no device, the runtime's events
 *     do) and the block becomes reusable only when every event completed.
 *     Events are polled in FIFO order, stopping at the first one not done,
 *     at every malloc, free and empty_cache.  An event that cannot be
 *     created or recorded is replaced by a device synchronisation.
 *   - pinned_max_cached_size (bytes, unlimited unless set; 0 caches
 *     nothing, as in PyTorch where no block is <= 0 bytes): a block whose free
 *     completes while the cached (free) bytes plus its size would exceed
 *     the limit goes back to the runtime at once.
 *   - pinned_reserve_segment_size (bytes, 0 = none): the first request
 *     that needs new memory first allocates one reserve segment of that
 *     size; later new blocks that fit in what is left of it are carved
 *     from it (bump allocation) instead of calling the runtime.  Carved
 *     blocks are cached as others but never returned to the runtime by
 *     empty_cache or the cache limit; the reserve goes at destruction.
 *   - empty_cache polls the events, then returns every free block (except
 *     carved ones) to the runtime.
 *
 * Data structures, all guarded by h->lock:
 *   blocks   every block the allocator owns, sorted by ptr (binary search
 *            for free/record_stream; host blocks are few and large);
 *   bins     one free list per block size (sizes unique, unsorted);
 *   evq      FIFO of (event, block) for pending frees.
 *
 * Invariants (msnap__host_check):
 *   - blocks is sorted by ptr and the blocks do not overlap;
 *   - a block is ALLOCATED, PENDING (event_count > 0) or FREE; FREE blocks
 *     are in exactly the free list of their size, others in none; PENDING
 *     blocks have exactly event_count entries in evq, others none;
 *   - carved blocks lie inside the reserve segment, below reserve_used;
 *   - stats equal the sums recomputed from the blocks (segment = blocks,
 *     reserved_bytes = their sizes, allocation/allocated_bytes/
 *     requested_bytes = ALLOCATED blocks, active/active_bytes = ALLOCATED
 *     or PENDING), the SMALL_POOL entries equal ALL, LARGE_POOL is 0;
 *   - cached_bytes = sizes of FREE blocks.
 *
 * Recording (h->ring, a record-layer trace ring, guarded by h->lock too;
 * a->host_hist says what to record):
 *   new block          segment_alloc(ptr, rounded size), then alloc
 *   reused block       alloc(ptr, requested size)
 *   msnap_host_free    free_requested(ptr, requested size); then
 *                      free_completed at once when no event is pending,
 *                      else when the last event completes
 *   block to runtime   segment_free(ptr, rounded size)
 * Stream is 0 in every entry (host blocks have no allocation stream) and
 * pool_id is (0, 0).  Stacks follow the device rules (cuda-reference
 * §4.3): malloc stack on alloc/segment_alloc; free-site stack at level ALL
 * else the block's alloc stack for free_*; segment_free carries the
 * empty_cache site stack at ALL, else the block's creation stack.
 *
 * Locking: h->lock (MSNAP_RANK_HOST) is never held with a device lock;
 * the sim runtime and the stack table are taken inside it.  Stacks are
 * captured before taking it.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"
#include "alloc/host.h"

#define HOST_ROUND_LARGE (2ull << 20)

enum { HB_ALLOCATED = 0, HB_PENDING = 1, HB_FREE = 2 };

typedef struct hblock_s {
  uint64_t ptr, size, requested;
  uint32_t stack;     /* alloc stack (raw id, one reference), 0 = none */
  uint32_t seg_stack; /* creation stack (raw id, one reference)        */
  uint64_t *streams;  /* record_stream uses since the last alloc       */
  uint32_t nstreams, streams_cap;
  uint32_t event_count;
  uint8_t state;
  bool carved;               /* piece of the reserve segment       */
  struct hblock_s *free_next; /* free list of its bin               */
} hblock_t;

typedef struct hbin_s {
  uint64_t size;
  hblock_t *head;
} hbin_t;

typedef struct hevent_s {
  uint64_t event;
  hblock_t *b;
} hevent_t;

struct msnap_host_s {
  msnap_allocator_t *a;
  pthread_mutex_t lock;
  hblock_t **blocks; /* sorted by ptr */
  size_t nblocks, blocks_cap;
  hbin_t *bins;
  size_t nbins, bins_cap;
  hevent_t *evq; /* FIFO: evq[evq_head .. nevq) */
  size_t evq_head, nevq, evq_cap;
  uint64_t cached_bytes;
  uint64_t reserve_base, reserve_size, reserve_used;
  bool reserve_tried;
  msnap_stats_t stats;
  msnap_duration_stat_t alloc_time, free_time;
  msnap_ring_t ring; /* host trace entries (record/ring.c)              */
};

static pthread_mutex_t host_create_lock = PTHREAD_MUTEX_INITIALIZER;

/* The allocator's host state, created on first use.  NULL on ENOMEM. */
static msnap_host_t *host_get(msnap_allocator_t *a) {
  msnap_host_t **slot = &a->host;
  msnap_host_t *h = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (h != NULL) return h;
  msnap__mutex_lock(&host_create_lock, MSNAP_RANK_HOST_CREATE);
  h = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (h == NULL) {
    h = calloc(1, sizeof *h);
    if (h != NULL) {
      h->a = a;
      pthread_mutex_init(&h->lock, NULL);
      h->stats.size = sizeof h->stats;
      h->stats.version = MSNAP_STATS_VERSION;
      msnap__ring_init(&h->ring);
      __atomic_store_n(slot, h, __ATOMIC_RELEASE);
    }
  }
  msnap__mutex_unlock(&host_create_lock, MSNAP_RANK_HOST_CREATE);
  if (h == NULL) msnap__set_error(MSNAP_ENOMEM, "host allocator: out of "
                                  "host memory creating its state");
  return h;
}

void msnap__host_atfork(msnap_allocator_t *a, int phase) {
  if (a == NULL) {
    msnap__fork_mutex(&host_create_lock, phase);
    return;
  }
  msnap_host_t *h = __atomic_load_n(&a->host, __ATOMIC_ACQUIRE);
  if (h != NULL) msnap__fork_mutex(&h->lock, phase);
}

/* Start a host call that records: the state, this thread's recording
 * context (captured before the lock: a free site or not) and the lock.
 * Inlined, so that the captured stack starts at the public entry point. */
static inline __attribute__((always_inline)) int host_enter(
    msnap_allocator_t *a, msnap_host_t **h, msnap_rctx_t *ctx,
    bool free_site) {
  *h = host_get(a);
  if (*h == NULL) return MSNAP_ENOMEM;
  msnap__rctx_capture(&a->host_hist, ctx, free_site);
  msnap__mutex_lock(&(*h)->lock, MSNAP_RANK_HOST);
  return 0;
}

int msnap__host_lock(msnap_allocator_t *a) {
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  return 0;
}

void msnap__host_unlock(msnap_allocator_t *a) {
  msnap__mutex_unlock(&a->host->lock, MSNAP_RANK_HOST);
}

msnap_ring_t *msnap__host_ring_locked(msnap_allocator_t *a) {
  return &a->host->ring;
}

int msnap__host_ring_copy_locked(msnap_allocator_t *a, msnap_hcopy_t *out,
                                 uint64_t *dropped) {
  int rc = msnap__ring_copy(&a->host->ring, out);
  if (rc == 0) *dropped = a->host->ring.dropped;
  return rc;
}

/* ---- helpers ------------------------------------------------------------- */

static uint64_t next_pow2(uint64_t n) {
  if (n <= 1) return 1;
  return 1ull << (64 - __builtin_clzll(n - 1));
}

/* Rounded block size of a request (0 when it cannot be represented). */
static uint64_t host_round(msnap_allocator_t *a, uint64_t n) {
  const msnap_conf_t *c = msnap__allocator_conf(a);
  uint64_t thr = __atomic_load_n(&c->pinned_max_round_threshold,
                                 __ATOMIC_RELAXED);
  if (n > thr) {
    if (n > UINT64_MAX - HOST_ROUND_LARGE) return 0;
    return (n + HOST_ROUND_LARGE - 1) & ~(HOST_ROUND_LARGE - 1);
  }
  if (n > (1ull << 63)) return 0;
  return next_pow2(n);
}

static int64_t now_us(void) { return msnap__clock_now_us(); }

static void dur_add(msnap_duration_stat_t *d, int64_t us) {
  if (us < 0) us = 0;
  d->total += us;
  d->count++;
  if (us > d->max) d->max = us;
  if (d->min == 0 || us < d->min) d->min = us;
}

/* Index of the first block with ptr >= p. */
static size_t blocks_lower(const msnap_host_t *h, uint64_t p) {
  size_t lo = 0, hi = h->nblocks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->blocks[mid]->ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static hblock_t *blocks_find(const msnap_host_t *h, uint64_t p) {
  size_t i = blocks_lower(h, p);
  return i < h->nblocks && h->blocks[i]->ptr == p ? h->blocks[i] : NULL;
}

static int blocks_reserve(msnap_host_t *h) {
  return MSNAP_GROW(h->blocks, h->blocks_cap, h->nblocks + 1);
}

/* Insert b (capacity reserved by blocks_reserve). */
static void blocks_insert(msnap_host_t *h, hblock_t *b) {
  size_t i = blocks_lower(h, b->ptr);
  memmove(h->blocks + i + 1, h->blocks + i,
          (h->nblocks - i) * sizeof *h->blocks);
  h->blocks[i] = b;
  h->nblocks++;
}

static void blocks_remove(msnap_host_t *h, hblock_t *b) {
  size_t i = blocks_lower(h, b->ptr);
  memmove(h->blocks + i, h->blocks + i + 1,
          (h->nblocks - i - 1) * sizeof *h->blocks);
  h->nblocks--;
}

/* The bin of a size; created when create (NULL on ENOMEM or absent). */
static hbin_t *bin_get(msnap_host_t *h, uint64_t size, bool create) {
  for (size_t i = 0; i < h->nbins; i++)
    if (h->bins[i].size == size) return &h->bins[i];
  if (!create) return NULL;
  if (MSNAP_GROW(h->bins, h->bins_cap, h->nbins + 1) != 0) return NULL;
  h->bins[h->nbins] = (hbin_t){size, NULL};
  return &h->bins[h->nbins++];
}

/* Unlink a FREE block from its bin. */
static void bin_unlink(msnap_host_t *h, hblock_t *b) {
  hbin_t *bin = bin_get(h, b->size, false);
  for (hblock_t **pp = &bin->head; *pp; pp = &(*pp)->free_next) {
    if (*pp == b) {
      *pp = b->free_next;
      break;
    }
  }
  b->free_next = NULL;
  h->cached_bytes -= b->size;
}

/* Stats change of a block entering/leaving a state (ALL and SMALL_POOL). */
static void stat_add(msnap_stat_t *arr, int64_t n) {
  if (n >= 0) {
    msnap__stat2_inc(arr, MSNAP_STAT_SMALL_POOL, n);
  } else {
    msnap__stat2_dec(arr, MSNAP_STAT_SMALL_POOL, -n);
  }
}

/* ---- recording helpers --------------------------------------------------- */

static void rec(msnap_host_t *h, msnap_action_t act, uint64_t addr,
                uint64_t size, const msnap_rctx_t *ctx, uint32_t over) {
  msnap__ring_record(&h->ring, &h->a->host_hist, act, addr, size, 0,
                     (msnap_mempool_id_t){0, 0}, ctx, over);
}

/* Give a free (unlinked, not carved) block back to the runtime and forget
 * it.  h->lock held.  On a runtime failure the block is left as it was
 * (the caller re-links it) and the error is returned. */
static int release_block(msnap_host_t *h, hblock_t *b, const msnap_rctx_t *ctx,
                         bool free_site_stack) {
  msnap_allocator_t *a = h->a;
  int64_t t0 = now_us();
  int rc = a->rt->host_free(a->rt_ctx, b->ptr);
  if (rc != 0) return rc;
  dur_add(&h->free_time, now_us() - t0);
  h->stats.num_device_free++;
  rec(h, MSNAP_ACTION_SEGMENT_FREE, b->ptr, b->size, ctx,
      free_site_stack && ctx && ctx->stack &&
              ctx->level == MSNAP_CONTEXT_ALL
          ? 0
          : b->seg_stack);
  stat_add(h->stats.segment, -1);
  stat_add(h->stats.reserved_bytes, -(int64_t)b->size);
  blocks_remove(h, b);
  msnap__stack_unref(b->stack);
  msnap__stack_unref(b->seg_stack);
  free(b->streams);
  free(b);
  return 0;
}

/* A block whose last use finished: free_completed, then cache it or (over
 * the cache limit) release it.  ctx: the context of the call that noticed
 * (free site for immediate frees).  h->lock held. */
static void complete_free(msnap_host_t *h, hblock_t *b,
                          const msnap_rctx_t *ctx, bool at_free_site) {
  (void)at_free_site; /* deferred completions use the caller's context too */
  uint32_t over =
      ctx && ctx->level == MSNAP_CONTEXT_ALL && ctx->stack ? 0 : b->stack;
  rec(h, MSNAP_ACTION_FREE_COMPLETED, b->ptr, b->requested, ctx, over);
  stat_add(h->stats.active, -1);
  stat_add(h->stats.active_bytes, -(int64_t)b->size);
  msnap__stack_unref(b->stack);
  b->stack = 0;
  b->state = HB_FREE;
  const msnap_conf_t *c = msnap__allocator_conf(h->a);
  uint64_t lim = __atomic_load_n(&c->pinned_max_cached_size, __ATOMIC_RELAXED);
  if (!b->carved && h->cached_bytes + b->size > lim &&
      release_block(h, b, ctx, false) == 0)
    return;
  /* The bin exists: the malloc that created b made it, and bins are never
   * removed. */
  hbin_t *bin = bin_get(h, b->size, false);
  b->free_next = bin->head;
  bin->head = b;
  h->cached_bytes += b->size;
}

/* Destroy a runtime event; a failure is retried once, so that a transient
 * runtime error does not leak the handle. */
static void event_drop(msnap_allocator_t *a, uint64_t ev) {
  if (a->rt->event_destroy(a->rt_ctx, 0, ev) != 0)
    (void)a->rt->event_destroy(a->rt_ctx, 0, ev);
}

/* Poll the event FIFO; complete blocks whose last event finished.  Stops
 * at the first event not done.  h->lock held. */
static void process_events(msnap_host_t *h, const msnap_rctx_t *ctx) {
  msnap_allocator_t *a = h->a;
  while (h->evq_head < h->nevq) {
    hevent_t *e = &h->evq[h->evq_head];
    bool done = false;
    if (a->rt->event_query(a->rt_ctx, 0, e->event, &done) != 0 || !done)
      break;
    event_drop(a, e->event);
    hblock_t *b = e->b;
    h->evq_head++;
    if (--b->event_count == 0) complete_free(h, b, ctx, false);
  }
  if (h->evq_head == h->nevq) h->evq_head = h->nevq = 0;
}

static int evq_push(msnap_host_t *h, uint64_t ev, hblock_t *b) {
  if (h->nevq == h->evq_cap) {
    if (h->evq_head > 0) {
      memmove(h->evq, h->evq + h->evq_head,
              (h->nevq - h->evq_head) * sizeof *h->evq);
      h->nevq -= h->evq_head;
      h->evq_head = 0;
    } else if (MSNAP_GROW(h->evq, h->evq_cap, h->nevq + 1) != 0) {
      return MSNAP_ENOMEM;
    }
  }
  h->evq[h->nevq++] = (hevent_t){ev, b};
  return 0;
}

/* ---- the public API ------------------------------------------------------ */

static int check_a(msnap_allocator_t *a, const char *fn) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "%s: NULL allocator", fn);
  if (a->rt->host_malloc == NULL || a->rt->host_free == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "%s: runtime '%s' has no pinned "
                            "host memory", fn, a->rt->name);
  return msnap__fork_check(a, fn);
}

/* A new block of `size` bytes: carved from the reserve segment when it
 * fits, else one runtime host_malloc.  h->lock held.  *out is not yet
 * inserted anywhere. */
static int new_block(msnap_host_t *h, uint64_t size, hblock_t **out,
                     bool *cann_oom) {
  msnap_allocator_t *a = h->a;
  int rc = blocks_reserve(h);
  if (rc != 0) return msnap__set_error(rc, "host allocator: out of host "
                                       "memory");
  hblock_t *b = calloc(1, sizeof *b);
  if (b == NULL)
    return msnap__set_error(MSNAP_ENOMEM, "host allocator: out of host "
                            "memory");
  const msnap_conf_t *c = msnap__allocator_conf(a);
  uint64_t rsv = __atomic_load_n(&c->pinned_reserve_segment_size,
                                 __ATOMIC_RELAXED);
  if (!h->reserve_tried && rsv != 0) {
    h->reserve_tried = true;
    uint64_t base = 0;
    int64_t t0 = now_us();
    if (a->rt->host_malloc(a->rt_ctx, (size_t)rsv, &base) == 0) {
      dur_add(&h->alloc_time, now_us() - t0);
      h->stats.num_device_alloc++;
      h->reserve_base = base;
      h->reserve_size = rsv;
    } else {
      h->reserve_tried = false; /* try again next time */
    }
  }
  if (h->reserve_size - h->reserve_used >= size && h->reserve_size) {
    b->ptr = h->reserve_base + h->reserve_used;
    h->reserve_used += size;
    b->carved = true;
  } else {
    int64_t t0 = now_us();
    rc = a->rt->host_malloc(a->rt_ctx, (size_t)size, &b->ptr);
    if (rc != 0) {
      free(b);
      *cann_oom = msnap__is_cann_oom_text(msnap_last_error());
      if (rc == MSNAP_EOOM) {
        char why[400];
        snprintf(why, sizeof why, "%s", msnap_last_error());
        return msnap__set_error(rc, "host allocator: pinned host memory "
                                "exhausted allocating %" PRIu64 " bytes (%s)",
                                size, why);
      }
      return rc;
    }
    dur_add(&h->alloc_time, now_us() - t0);
    h->stats.num_device_alloc++;
  }
  b->size = size;
  *out = b;
  return 0;
}

/*
 * msnap_host_malloc: a pinned block of at least size bytes.  size 0 gives
 * *ptr = 0.  Captures the stack before taking the host lock.  Errors:
 * MSNAP_EINVAL (NULL arguments), MSNAP_EOOM (runtime out of pinned
 * memory, or a size too large to round up to a block size, which no
 * runtime could give), MSNAP_ENOMEM, or the runtime's error; the
 * allocator is unchanged on error.
 */
int msnap_host_malloc(msnap_allocator_t *a, size_t size, uint64_t *ptr) {
  int rc = check_a(a, "host_malloc");
  if (rc != 0) return rc;
  if (ptr == NULL)
    return msnap__set_error(MSNAP_EINVAL, "host_malloc: NULL ptr");
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  /* A size no block can hold (SIZE_MAX) is out of memory, as msnap_malloc's
   * 1 EB guard and as torch's CachingHostAllocator, whose cudaHostAlloc of
   * it fails with out of memory; nothing is recorded. */
  uint64_t rounded = host_round(a, size);
  if (rounded == 0)
    return msnap__set_error(MSNAP_EOOM,
                            "host allocator: out of pinned host memory: %zu "
                            "bytes cannot be rounded up to a block size",
                            size);
  msnap_host_t *h;
  bool cann_oom = false;
  msnap_rctx_t ctx;
  if (host_enter(a, &h, &ctx, false) != 0) return MSNAP_ENOMEM;
  process_events(h, &ctx);
  hbin_t *bin = bin_get(h, rounded, false);
  hblock_t *b = bin ? bin->head : NULL;
  if (b != NULL) {
    bin_unlink(h, b);
  } else {
    /* Make sure the bin exists before memory is taken, so that a later
     * free can always cache the block. */
    if (bin_get(h, rounded, true) == NULL) {
      rc = msnap__set_error(MSNAP_ENOMEM, "host allocator: out of host "
                            "memory");
      goto out;
    }
    rc = new_block(h, rounded, &b, &cann_oom);
    if (rc != 0) goto out;
    blocks_insert(h, b);
    b->seg_stack = ctx.stack;
    msnap__stack_ref(ctx.stack);
    stat_add(h->stats.segment, 1);
    stat_add(h->stats.reserved_bytes, (int64_t)b->size);
    rec(h, MSNAP_ACTION_SEGMENT_ALLOC, b->ptr, b->size, &ctx, 0);
  }
  b->state = HB_ALLOCATED;
  b->requested = size;
  b->nstreams = 0;
  b->stack = ctx.stack;
  msnap__stack_ref(ctx.stack);
  stat_add(h->stats.allocation, 1);
  stat_add(h->stats.active, 1);
  stat_add(h->stats.allocated_bytes, (int64_t)b->size);
  stat_add(h->stats.active_bytes, (int64_t)b->size);
  stat_add(h->stats.requested_bytes, (int64_t)size);
  rec(h, MSNAP_ACTION_ALLOC, b->ptr, size, &ctx, 0);
  *ptr = b->ptr;
out:
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  msnap__rctx_release(&ctx);
  if (cann_oom) {
    /* aclrtMallocHost failed with CANN's OOM text: torch_npu's
     * NPU_CHECK_ERROR would run oom_observer() (the OOM_SNAPSHOT dump). */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", msnap_last_error());
    msnap__oom_notify_device_error(a, 0);
    msnap__set_error(rc, "%s", msg);
  }
  return rc;
}

/*
 * msnap_host_free: give back a block of msnap_host_malloc.  0 is a no-op;
 * a pointer that is not an allocated host block gives MSNAP_EBADPTR and
 * changes nothing.  Streams marked by record_stream get one event each;
 * the block is reusable once they completed.
 */
int msnap_host_free(msnap_allocator_t *a, uint64_t ptr) {
  if (a != NULL && msnap__bad_fork(a)) return 0; /* as msnap_free */
  int rc = check_a(a, "host_free");
  if (rc != 0) return rc;
  if (ptr == 0) return 0;
  msnap_host_t *h;
  msnap_rctx_t ctx;
  if (host_enter(a, &h, &ctx, true) != 0) return MSNAP_ENOMEM;
  hblock_t *b = blocks_find(h, ptr);
  if (b == NULL || b->state != HB_ALLOCATED) {
    rc = msnap__set_error(MSNAP_EBADPTR,
                          "invalid pinned host pointer: 0x%" PRIx64, ptr);
    goto out;
  }
  rec(h, MSNAP_ACTION_FREE_REQUESTED, b->ptr, b->requested, &ctx,
      ctx.level == MSNAP_CONTEXT_ALL && ctx.stack ? 0 : b->stack);
  stat_add(h->stats.allocation, -1);
  stat_add(h->stats.allocated_bytes, -(int64_t)b->size);
  stat_add(h->stats.requested_bytes, -(int64_t)b->requested);
  b->state = HB_PENDING;
  bool synced = false;
  for (uint32_t i = 0; i < b->nstreams; i++) {
    uint64_t ev;
    if (a->rt->event_create(a->rt_ctx, 0, &ev) != 0) goto sync;
    if (a->rt->event_record(a->rt_ctx, 0, ev, b->streams[i]) != 0 ||
        evq_push(h, ev, b) != 0) {
      event_drop(a, ev);
      goto sync;
    }
    b->event_count++;
    continue;
  sync:
    if (!synced) (void)a->rt->device_synchronize(a->rt_ctx, 0);
    synced = true;
  }
  b->nstreams = 0;
  if (b->event_count == 0) complete_free(h, b, &ctx, true);
  process_events(h, &ctx);
out:
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  msnap__rctx_release(&ctx);
  return rc;
}

/* msnap_host_record_stream: the allocated block at ptr is used on stream
 * (each stream once).  MSNAP_EBADPTR for an unknown pointer. */
int msnap_host_record_stream(msnap_allocator_t *a, uint64_t ptr,
                             uint64_t stream) {
  int rc = check_a(a, "host_record_stream");
  if (rc != 0) return rc;
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  hblock_t *b = blocks_find(h, ptr);
  if (b == NULL || b->state != HB_ALLOCATED) {
    rc = msnap__set_error(MSNAP_EBADPTR,
                          "invalid pinned host pointer: 0x%" PRIx64, ptr);
    goto out;
  }
  for (uint32_t i = 0; i < b->nstreams; i++)
    if (b->streams[i] == stream) goto out;
  if (MSNAP_GROW(b->streams, b->streams_cap, b->nstreams + 1) != 0) {
    rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    goto out;
  }
  b->streams[b->nstreams++] = stream;
out:
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return rc;
}

/* msnap_host_empty_cache: poll events, then return every cached block
 * (except pieces of the reserve segment) to the runtime.  The first
 * runtime failure stops it (that block stays cached) and is returned. */
int msnap_host_empty_cache(msnap_allocator_t *a) {
  int rc = check_a(a, "host_empty_cache");
  if (rc != 0) return rc;
  msnap_host_t *h;
  msnap_rctx_t ctx;
  if (host_enter(a, &h, &ctx, true) != 0) return MSNAP_ENOMEM;
  process_events(h, &ctx);
  for (size_t i = 0; i < h->nbins && rc == 0; i++) {
    hblock_t **pp = &h->bins[i].head;
    while (*pp != NULL) {
      hblock_t *b = *pp;
      if (b->carved) {
        pp = &b->free_next;
        continue;
      }
      *pp = b->free_next;
      h->cached_bytes -= b->size;
      b->free_next = NULL;
      rc = release_block(h, b, &ctx, true);
      if (rc != 0) { /* put it back where it was */
        b->free_next = *pp;
        *pp = b;
        h->cached_bytes += b->size;
        break;
      }
    }
  }
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  msnap__rctx_release(&ctx);
  return rc;
}

int msnap_host_stats_get(msnap_allocator_t *a, msnap_stats_t *out) {
  if (a == NULL || out == NULL)
    return msnap__set_error(MSNAP_EINVAL, "host_stats_get: NULL argument");
  if (out->size < sizeof *out || out->version != MSNAP_STATS_VERSION)
    return msnap__set_error(MSNAP_EINVAL, "host_stats_get: stats size %u / "
                            "version %u not supported", out->size,
                            out->version);
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  *out = h->stats;
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return 0;
}

int msnap_host_timing_get(msnap_allocator_t *a,
                          msnap_duration_stat_t *alloc_time,
                          msnap_duration_stat_t *free_time) {
  if (a == NULL || alloc_time == NULL || free_time == NULL)
    return msnap__set_error(MSNAP_EINVAL, "host_timing_get: NULL argument");
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  *alloc_time = h->alloc_time;
  *free_time = h->free_time;
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return 0;
}

#define HOST_STAT_ARRAYS_(n) &h->stats.n[0], &h->stats.n[1], &h->stats.n[2],

int msnap_host_reset_peak_stats(msnap_allocator_t *a) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "host_reset_peak_stats: NULL");
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  msnap_stat_t *all[] = {MSNAP_STAT_ARRAY_FIELDS(HOST_STAT_ARRAYS_)};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    all[i]->peak = all[i]->current;
  h->alloc_time.max = h->alloc_time.min = 0;
  h->free_time.max = h->free_time.min = 0;
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return 0;
}

int msnap_host_reset_accumulated_stats(msnap_allocator_t *a) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "host_reset_accumulated_stats: NULL");
  msnap_host_t *h = host_get(a);
  if (h == NULL) return MSNAP_ENOMEM;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  msnap_stat_t *all[] = {MSNAP_STAT_ARRAY_FIELDS(HOST_STAT_ARRAYS_)};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    all[i]->allocated = all[i]->freed = 0;
  h->stats.num_device_alloc = h->stats.num_device_free = 0;
  h->alloc_time.total = h->alloc_time.count = 0;
  h->free_time.total = h->free_time.count = 0;
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return 0;
}

/* ---- destruction --------------------------------------------------------- */

/* Return everything to the runtime (allocator destruction: no other thread
 * uses the allocator).  Pending events are destroyed without waiting. */
void msnap__host_destroy(msnap_allocator_t *a) {
  msnap_host_t **slot = &a->host;
  msnap_host_t *h = *slot;
  if (h == NULL) return;
  msnap__ring_destroy(&h->ring);
  for (size_t i = h->evq_head; i < h->nevq; i++)
    event_drop(a, h->evq[i].event);
  for (size_t i = 0; i < h->nblocks; i++) {
    hblock_t *b = h->blocks[i];
    if (!b->carved) (void)a->rt->host_free(a->rt_ctx, b->ptr);
    msnap__stack_unref(b->stack);
    msnap__stack_unref(b->seg_stack);
    free(b->streams);
    free(b);
  }
  if (h->reserve_size) (void)a->rt->host_free(a->rt_ctx, h->reserve_base);
  free(h->blocks);
  free(h->bins);
  free(h->evq);
  pthread_mutex_destroy(&h->lock);
  free(h);
  *slot = NULL;
}

/* ---- snapshots ----------------------------------------------------------- */

int msnap__host_collect_locked(msnap_allocator_t *a, msnap_snap_t *s) {
  msnap_host_t *h = a->host;
  if (h == NULL || h->nblocks == 0) return 0;
  msnap_ssegment_t *segs = calloc(h->nblocks, sizeof *segs);
  msnap_sblock_t *blks = calloc(h->nblocks, sizeof *blks);
  if (segs == NULL || blks == NULL) {
    free(segs);
    free(blks);
    return MSNAP_ENOMEM;
  }
  for (size_t i = 0; i < h->nblocks; i++) {
    const hblock_t *b = h->blocks[i];
    bool allocated = b->state == HB_ALLOCATED;
    bool active = b->state != HB_FREE;
    msnap_sblock_t *k = &blks[i];
    k->address = b->ptr;
    k->size = b->size;
    k->requested_size = b->size;
    k->frames = b->stack; /* raw id; reference taken below */
    msnap__stack_ref(b->stack);
    k->keys = MSNAP_K_ADDRESS | MSNAP_K_REQUESTED | MSNAP_K_FRAMES;
    k->state = allocated ? MSNAP_BLOCK_ACTIVE_ALLOCATED
               : active  ? MSNAP_BLOCK_ACTIVE_PENDING_FREE
                         : MSNAP_BLOCK_INACTIVE;
    msnap_ssegment_t *g = &segs[i];
    g->device = -1;
    g->address = b->ptr;
    g->total_size = b->size;
    g->allocated_size = allocated ? b->size : 0;
    g->active_size = active ? b->size : 0;
    g->requested_size = b->size;
    g->stream = 0;
    g->pool_id = (msnap_mempool_id_t){0, 0};
    g->frames = b->seg_stack;
    msnap__stack_ref(b->seg_stack);
    g->first_block = (uint32_t)i;
    g->nblocks = 1;
    g->keys = MSNAP_K_REQUESTED | MSNAP_K_FRAMES | MSNAP_K_POOL_ID |
              MSNAP_K_EXPANDABLE | MSNAP_K_STREAM | MSNAP_K_SEGMENT_TYPE;
    g->is_large = 0;
    g->is_expandable = 0;
  }
  free(s->host_segments);
  free(s->host_blocks);
  s->host_segments = segs;
  s->nhost_segments = s->host_segments_cap = (uint32_t)h->nblocks;
  s->host_blocks = blks;
  s->nhost_blocks = s->host_blocks_cap = (uint32_t)h->nblocks;
  return 0;
}

/* ---- invariants ---------------------------------------------------------- */

#define HFAIL(...)                                                          \
  do {                                                                      \
    if (msg && len) snprintf(msg, len, "host allocator: " __VA_ARGS__);    \
    rc = MSNAP_ESTATE;                                                      \
    goto out;                                                               \
  } while (0)

int msnap__host_check(msnap_allocator_t *a, char *msg, size_t len) {
  msnap_host_t *h = a->host;
  if (h == NULL) return 0;
  int rc = 0;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  int64_t nseg = 0, res = 0, nalloc = 0, abytes = 0, nact = 0, actb = 0;
  uint64_t cached = 0;
  size_t nfree = 0, nev = 0;
  for (size_t i = 0; i < h->nblocks; i++) {
    const hblock_t *b = h->blocks[i];
    if (i > 0 && h->blocks[i - 1]->ptr + h->blocks[i - 1]->size > b->ptr)
      HFAIL("block 0x%" PRIx64 " overlaps or is out of order",
            h->blocks[i - 1]->ptr);
    if (b->size == 0) HFAIL("block 0x%" PRIx64 " has size 0", b->ptr);
    if (b->carved && (b->ptr < h->reserve_base ||
                      b->ptr + b->size > h->reserve_base + h->reserve_used))
      HFAIL("carved block 0x%" PRIx64 " outside the reserve", b->ptr);
    if ((b->state == HB_PENDING) != (b->event_count > 0))
      HFAIL("block 0x%" PRIx64 " state %d with %u events", b->ptr, b->state,
            b->event_count);
    nseg++;
    res += (int64_t)b->size;
    if (b->state == HB_ALLOCATED) {
      nalloc++;
      abytes += (int64_t)b->size;
    }
    if (b->state != HB_FREE) {
      nact++;
      actb += (int64_t)b->size;
    } else {
      cached += b->size;
      nfree++;
      const hbin_t *bin = NULL;
      for (size_t k = 0; k < h->nbins; k++)
        if (h->bins[k].size == b->size) bin = &h->bins[k];
      bool found = false;
      for (const hblock_t *f = bin ? bin->head : NULL; f; f = f->free_next)
        found |= f == b;
      if (!found)
        HFAIL("free block 0x%" PRIx64 " not in the list of size %" PRIu64,
              b->ptr, b->size);
    }
    size_t ne = 0;
    for (size_t k = h->evq_head; k < h->nevq; k++) ne += h->evq[k].b == b;
    if (ne != b->event_count)
      HFAIL("block 0x%" PRIx64 " has %u events but %zu queued", b->ptr,
            b->event_count, ne);
    nev += ne;
  }
  size_t listed = 0;
  for (size_t k = 0; k < h->nbins; k++) {
    for (size_t j = k + 1; j < h->nbins; j++)
      if (h->bins[j].size == h->bins[k].size) HFAIL("two bins of one size");
    for (const hblock_t *f = h->bins[k].head; f; f = f->free_next) {
      if (f->state != HB_FREE || f->size != h->bins[k].size)
        HFAIL("free list of size %" PRIu64 " holds block 0x%" PRIx64,
              h->bins[k].size, f->ptr);
      if (++listed > nfree) HFAIL("free lists hold more than the free "
                                  "blocks (cycle?)");
    }
  }
  if (listed != nfree) HFAIL("%zu free blocks, %zu listed", nfree, listed);
  if (nev != h->nevq - h->evq_head) HFAIL("events for unknown blocks");
  if (cached != h->cached_bytes)
    HFAIL("cached_bytes %" PRIu64 " != %" PRIu64, h->cached_bytes, cached);
  if (h->reserve_used > h->reserve_size) HFAIL("reserve over-used");
  struct {
    const char *name;
    const msnap_stat_t *arr;
    int64_t want;
  } chk[] = {{"segment", h->stats.segment, nseg},
             {"reserved_bytes", h->stats.reserved_bytes, res},
             {"allocation", h->stats.allocation, nalloc},
             {"allocated_bytes", h->stats.allocated_bytes, abytes},
             {"active", h->stats.active, nact},
             {"active_bytes", h->stats.active_bytes, actb}};
  for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
    const msnap_stat_t *s = chk[i].arr;
    if (s[MSNAP_STAT_ALL].current != chk[i].want)
      HFAIL("stat %s is %" PRId64 ", blocks say %" PRId64, chk[i].name,
            s[MSNAP_STAT_ALL].current, chk[i].want);
    if (s[MSNAP_STAT_SMALL_POOL].current != s[MSNAP_STAT_ALL].current ||
        s[MSNAP_STAT_LARGE_POOL].current != 0)
      HFAIL("stat %s: pool split wrong", chk[i].name);
    if (s[MSNAP_STAT_ALL].peak < s[MSNAP_STAT_ALL].current)
      HFAIL("stat %s: peak below current", chk[i].name);
  }
out:
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
  return rc;
}

void msnap__host_test_poke(msnap_allocator_t *a, int what, int64_t delta) {
  msnap_host_t *h = a->host;
  if (h == NULL) return;
  msnap__mutex_lock(&h->lock, MSNAP_RANK_HOST);
  if (what == 0)
    h->stats.segment[MSNAP_STAT_ALL].current += delta;
  else if (what == 1)
    h->cached_bytes += (uint64_t)delta;
  else if (what == 2 && h->nblocks > 0)
    h->blocks[0]->event_count += (uint32_t)delta;
  msnap__mutex_unlock(&h->lock, MSNAP_RANK_HOST);
}
