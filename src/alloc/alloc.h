/*
 * alloc.h -- internal types of the device caching allocator: blocks,
 * segments, block pools, private pools, the per-device allocator and
 * struct msnap_allocator_s, and the functions the allocator's files share
 * with its white-box tests.  Only the alloc layer's files and its tests
 * include it (the layers above use allocator.h).  The files:
 *   pool.c          ordered free-block sets (intrusive red-black trees)
 *   alloc.c         malloc / free / record_stream / empty_cache, search,
 *                   split, merge, segment creation and release, OOM
 *   events.c        cross-stream frees (events, deferred frees)
 *   expandable.c    expandable segments (VMM granules)
 *   mempool.c       private pools (MemPool, begin/end allocate to pool)
 *   raw.c           caching disabled (direct runtime malloc/free)
 *   create.c        create / destroy (msnap_allocator_create is api's)
 *   check.c         msnap_check_invariants, snapshot segment collection
 *   stats.c         memory_stats, resets, memory_summary
 *   conf.c          alloc-conf parsing (conf.h)
 *   history.c       memory history: record_history, annotations (the
 *                   rings and settings are record-layer types embedded
 *                   here: one ring per device, host ring in host.c)
 *   workspace.c     torch_npu's workspace allocator
 *   host.c          pinned host caching allocator (host.h)
 *   oom.c           OOM observers, the usage report
 *
 * The model is PyTorch's DeviceCachingAllocator (allocator-algorithm.md §2):
 *
 *   segment   one runtime allocation (cudaMalloc/aclrtMalloc), or one
 *             expandable VA reservation whose granules are mapped on
 *             demand.  msnap_segment_t records its base, size and creation
 *             stack; its blocks form a doubly linked list in address order
 *             (prev/next), starting at seg->head.
 *   block     a contiguous piece of a segment.  State machine:
 *
 *               free (in pool->blocks) --alloc_found_block--> allocated
 *               allocated --free, no stream uses--> free (merged)
 *               allocated --free, stream uses--> pending (event_count > 0,
 *                                  or deferred during a graph capture)
 *               pending --events complete--> free (merged)
 *               free --release_block / unmap_block--> gone / unmapped
 *               unmapped (in pool->unmapped) --map_block--> free
 *
 *   Must hold (checked by msnap_check_invariants):
 *     - a segment's blocks are contiguous: b->ptr + b->size == b->next->ptr,
 *       the first starts at seg->base and the sizes sum to seg->size;
 *     - every block of a segment has b->seg == seg, b->pool == seg->pool and
 *       b->stream == seg->stream;
 *     - a free mapped block is in exactly pool->blocks, an unmapped block in
 *       exactly pool->unmapped, allocated and pending blocks in neither;
 *     - two adjacent free blocks with the same `mapped` never coexist
 *       (they would have been merged), unless one of them has stream uses;
 *     - the ptr map holds exactly the allocated blocks;
 *     - the stats equal the sums recomputed from the blocks;
 *     - a live private pool's reserved.*.current is the mapped bytes of its
 *       segments; a retired (deleted) pool's entry has current 0, its id is
 *       no live pool's and appears once.
 *
 * Object identity follows PyTorch (§6.2, §9.3): a split creates a NEW block
 * for the allocated low part and the old object becomes the remainder; a
 * merge keeps the block being freed (or mapped) and deletes its neighbour.
 *
 * Locking: every field of msnap_device_t below `lock` is protected by that
 * lock, the device's trace ring included.  The allocator-wide conf is
 * written only while every device lock is held
 * (msnap_set_allocator_settings), so reading it under any one device lock
 * is safe.  Lock ranks (base.h, checked when MSNAP_DEBUG >= 1): device
 * locks in device order, then the workspace, raw, observer and annotation
 * locks, the sim runtime, the stack table; the host lock is never held
 * with a device lock.
 */
#ifndef MSNAP_ALLOC_H
#define MSNAP_ALLOC_H

#include <pthread.h>
#include <stdatomic.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "alloc/allocator.h"
#include "record/history.h"
#include "record/stack.h"
#include "runtime/runtime.h"

/* ---- the device lock ---------------------------------------------------- */
/*
 * A futex mutex (Drepper, "Futexes Are Tricky", mutex 3): 0 = free, 1 =
 * held, 2 = held with possible waiters.  Uncontended lock and unlock are
 * one atomic each (a pthread mutex costs several times that on the cached
 * malloc path).  After a short spin a contended locker sleeps in the
 * kernel.  Not recursive.  Elsewhere than Linux: a pthread mutex.  `sub`
 * is the device index: the lock's place among the device locks for the
 * lock-rank checker (MSNAP_DEBUG >= 1).
 */
typedef struct msnap_lock_s {
#if defined(__linux__)
  _Atomic uint32_t v;
#else
  pthread_mutex_t m;
#endif
  uint32_t sub;
} msnap_lock_t;

static inline void msnap__lock_init(msnap_lock_t *l, uint32_t sub) {
  l->sub = sub;
#if defined(__linux__)
  atomic_init(&l->v, 0);
#else
  pthread_mutex_init(&l->m, NULL);
#endif
}

static inline void msnap__lock_destroy(msnap_lock_t *l) {
#if !defined(__linux__)
  pthread_mutex_destroy(&l->m);
#else
  (void)l;
#endif
}

#if defined(__linux__)
void msnap__lock_slow(msnap_lock_t *l);
void msnap__unlock_slow(msnap_lock_t *l);
#endif

/* Take / drop the lock without the rank bookkeeping (the fork handlers,
 * alloc/fork.c, which hold every lock at once). */
static inline void msnap__lock_raw(msnap_lock_t *l) {
#if defined(__linux__)
  uint32_t c = 0;
  if (msnap_likely(atomic_compare_exchange_strong_explicit(
          &l->v, &c, 1, memory_order_acquire, memory_order_relaxed)))
    return;
  msnap__lock_slow(l);
#else
  pthread_mutex_lock(&l->m);
#endif
}

static inline void msnap__unlock_raw(msnap_lock_t *l) {
#if defined(__linux__)
  if (msnap_unlikely(atomic_fetch_sub_explicit(&l->v, 1,
                                               memory_order_release) != 1))
    msnap__unlock_slow(l);
#else
  pthread_mutex_unlock(&l->m);
#endif
}

static inline void msnap__lock(msnap_lock_t *l) {
  if (msnap_debug_level >= 1) msnap__rank_acquire(MSNAP_RANK_DEVICE, l->sub);
  msnap__lock_raw(l);
}

static inline void msnap__unlock(msnap_lock_t *l) {
  msnap__unlock_raw(l);
  if (msnap_debug_level >= 1) msnap__rank_release(MSNAP_RANK_DEVICE, l->sub);
}

/* MSNAP_DEBUG >= 2: the calling thread holds device d's lock. */
#define MSNAP_ASSERT_DEVICE_LOCKED(d)                                        \
  MSNAP_ASSERT(msnap_debug_level < 1 ||                                      \
               msnap__rank_held(MSNAP_RANK_DEVICE, (uint32_t)(d)->id))

/* ---- ordered block sets (pool.c) ---------------------------------------- */
/* child[0]: the subtree of smaller keys, child[1]: of larger keys.  One
 * index for the direction lets pool.c write each mirrored case once. */
typedef struct msnap_rbnode_s {
  struct msnap_rbnode_s *child[2], *parent;
  int red;
} msnap_rbnode_t;

/* A red-black tree of blocks.  by_addr = false: key (stream, size, ptr), the
 * BlockComparatorSize of `blocks`; by_addr = true: key (stream, ptr), the
 * BlockComparatorAddress of `unmapped`.  Streams compare as unsigned. */
typedef struct msnap_rbtree_s {
  msnap_rbnode_t *root;
  size_t count;
  bool by_addr;
} msnap_rbtree_t;

typedef struct msnap_block_s msnap_block_t;
typedef struct msnap_bpool_s msnap_bpool_t;
typedef struct msnap_ppool_s msnap_ppool_t;
typedef struct msnap_segment_s msnap_segment_t;
typedef struct msnap_device_s msnap_device_t;

enum { MSNAP_IN_NONE = 0, MSNAP_IN_BLOCKS = 1, MSNAP_IN_UNMAPPED = 2 };

struct msnap_block_s {
  msnap_rbnode_t node; /* first: a node pointer is a block pointer */
  uint64_t stream;
  uint64_t size;
  uint64_t ptr;
  uint64_t requested_size; /* never cleared (§9.4)                    */
  msnap_block_t *prev, *next; /* neighbours in the segment             */
  msnap_block_t *hnext;       /* ptr-map chain while allocated          */
  msnap_block_t *link;        /* scratch list (deferred, to-unmap, free) */
  msnap_bpool_t *pool;
  msnap_segment_t *seg;
  uint64_t *stream_uses; /* set of extra streams (record_stream)       */
  uint32_t nuses, cap_uses;
  /* Bit i: stream_uses[i] was recorded while a graph capture was on
   * (block_to_cudagraph_stream_uses); dropped before the deferred
   * events are inserted.  Entries past 64 are never graph uses. */
  uint64_t graph_uses;
  int32_t event_count;
  int64_t gc_count_base;
  uint32_t stack; /* alloc stack id (recorder), 0 = none              */
  uint8_t allocated;
  uint8_t mapped;
  uint8_t in_set; /* MSNAP_IN_*                                      */
  uint8_t deferred;
};

struct msnap_bpool_s {
  msnap_rbtree_t blocks;   /* free, mapped                             */
  msnap_rbtree_t unmapped; /* unmapped expandable VA                   */
  int64_t get_free_blocks_call_count;
  bool is_small;
  msnap_ppool_t *owner; /* NULL for the two default pools              */
};

struct msnap_ppool_s {
  msnap_mempool_id_t id;
  int use_count;
  int64_t malloc_count; /* live segments (PyTorch: cudaMalloc_count)   */
  bool use_on_oom, no_split, freeable;
  msnap_bpool_t large, small;
  msnap_ppool_t *next; /* device list, creation order                  */
  /* reserved_bytes of this pool's segments (reserved_bytes_by_private_
   * pools); current == the mapped bytes of its segments. */
  msnap_stat_t reserved[MSNAP_STAT_TYPES];
};

struct msnap_segment_s {
  msnap_segment_t *sprev, *snext; /* device segment list                */
  msnap_block_t *head;            /* lowest-address block               */
  uint64_t base, size;            /* expandable: the whole VA           */
  uint64_t stream;
  msnap_bpool_t *pool;
  uint32_t stack; /* segment creation stack id                         */
  bool expandable;
  /* expandable only */
  uint64_t granule;
  uint64_t nhandles;    /* VA size / granule                           */
  uint64_t *handles;    /* per granule, valid where is_mapped[i]       */
  uint8_t *is_mapped;
  uint64_t handles_cap; /* allocated entries (grown lazily)            */
  uint64_t mapped_bytes;
};

typedef struct msnap_evitem_s {
  uint64_t event;
  msnap_block_t *block;
} msnap_evitem_t;

/* FIFO of (event, block) for one stream; a ring buffer. */
typedef struct msnap_evq_s {
  uint64_t stream;
  msnap_evitem_t *v;
  uint32_t head, n, cap;
} msnap_evq_t;

/* An allocate-to-pool scope (PyTorch's allocation scopes, the
 * (mempool_id, filter) pairs of beginAllocateToPool): the filter accepts
 * one stream, every stream, or the allocations of one thread (the filter
 * use_mem_pool installs, _cuda_beginAllocateCurrentThreadToPool). */
enum {
  MSNAP_SCOPE_STREAM = 0, /* key: the stream                           */
  MSNAP_SCOPE_ALL = 1,    /* every allocation of the device            */
  MSNAP_SCOPE_THREAD = 2  /* key: msnap__thread_key() of the thread    */
};
typedef struct msnap_scope_s {
  msnap_mempool_id_t id;
  uint64_t key;
  uint8_t kind;
} msnap_scope_t;

/*
 * The set of use_on_oom pool ids (PyTorch's use_on_oom_pools, a
 * ska::flat_hash_set<MempoolId_t, MempoolIdHash>).  try_mempool_fallback
 * tries the pools in the set's iteration order, so the set reproduces
 * ska's sherwood_v3_table exactly (fibonacci hashing of MempoolIdHash,
 * robin-hood insertion, growth at load factor 0.5 or max_lookups, erase
 * by backward shift; c10/util/flat_hash_map.h): v/dist hold the
 * num_slots + max_lookups entries (dist -1 = empty; the last entry is the
 * end marker with dist 0).  nslots_m1 == 0 and v == NULL: ska's empty
 * default table.  Checked by msnap__idset_check.
 */
typedef struct msnap_idset_s {
  msnap_mempool_id_t *v;
  int8_t *dist;
  uint64_t nslots_m1;
  uint64_t n;
  int8_t max_lookups, shift;
} msnap_idset_t;

/* ptr -> allocated block, chained through block->hnext. */
typedef struct msnap_ptrmap_s {
  msnap_block_t **buckets;
  uint64_t mask;
  uint64_t count;
} msnap_ptrmap_t;

struct msnap_device_s {
  msnap_lock_t lock;
  int id;
  msnap_allocator_t *a;
  msnap_stats_t stats;
  msnap_bpool_t large, small;
  msnap_ptrmap_t map;
  msnap_segment_t *segments; /* every live segment                   */
  uint64_t nsegments;
  msnap_ppool_t *ppools;
  msnap_idset_t oom_pools; /* use_on_oom pool ids (mempool.c)         */
  /* Allocate-to-pool scopes, oldest first (get_pool scans newest first).
   * Routing only: a scope alone is no graph capture. */
  msnap_scope_t *scopes;
  uint32_t nscopes, scopes_cap;
  /* Real graph captures (markCaptureBegin/End): the stream of each
   * capture in progress, a multiset.  Only these make a call a "capture
   * context" (events not queried, frees with stream uses deferred, no
   * free-cache-and-retry). */
  uint64_t *capture_streams;
  uint32_t ncaptures, captures_cap;
  msnap_evq_t *evqs;
  uint32_t nevqs, evqs_cap;
  uint64_t pending_events; /* total items in every evq                 */
  msnap_block_t *deferred; /* frees deferred while a capture is on    */
  uint64_t *event_pool;    /* created, idle runtime events             */
  uint32_t nevent_pool, event_pool_cap;
  msnap_block_t *free_objs; /* recycled block objects (via link)      */
  uint64_t total_allocated_memory;
  uint64_t allowed_memory_maximum;
  bool has_allowed;
  double fraction;
  /* The newest oom trace entry (raw clock; 0: none recorded) and the cap
   * in force then (oom_capped: allowed_memory_maximum was set), for
   * process_info: the fraction may change after the OOM. */
  uint64_t oom_raw_time;
  bool oom_capped;
  uint64_t oom_allowed;
  uint64_t device_total; /* cached from mem_get_info at creation     */
  uint64_t next_pool_id;
  /* reserved_bytes of deleted private pools (current 0), kept until the
   * resets zero them; taken back if a pool with the same id is made. */
  msnap_pool_stats_t *retired;
  uint32_t nretired, retired_cap;
  /* This device's trace ring (record/ring.c), under this lock. */
  msnap_ring_t ring;
};

typedef struct msnap_oom_observer_s {
  msnap_oom_observer_cb cb;
  void *arg;
  void (*release)(void *arg); /* library-owned observers (oom.c) */
  /* also called on device errors CANN reports as OOM (api's
   * OOM_SNAPSHOT dump, as torch_npu's NPU_CHECK_ERROR oom_observer()) */
  bool on_device_error;
} msnap_oom_observer_t;

/* Raw (caching disabled) allocations: ptr -> (device, size). */
typedef struct msnap_rawent_s {
  uint64_t ptr, size;
  int device;
  bool used;
} msnap_rawent_t;

struct msnap_allocator_s {
  msnap_profile_t profile;
  /* npu: bytes added to every request before rounding (pad.c, torch_npu
   * AddPadSize: 32, or 0 on Ascend950 with CANN >= 9.1.0). */
  uint64_t npu_pad;
  const msnap_runtime_ops_t *rt;
  void *rt_ctx;
  msnap_conf_t conf;
  int ndevices;
  msnap_device_t *devices;
  _Atomic bool caching_enabled;
  /* Memory history (history.c): device settings (the rings are in the
   * devices), pinned host settings (the ring is in the host state), the
   * capacity last set (0: never), the annotation ring (own lock). */
  msnap_hsettings_t hist, host_hist;
  _Atomic uint64_t hist_max_entries;
  msnap_annring_t ann;
  struct msnap_host_s *host;      /* pinned host allocator (host.c)     */
  struct msnap_workspace_s *ws;   /* workspace allocator (workspace.c)  */
  /* OOM observers (oom.c), under obs_lock, in attachment order. */
  pthread_mutex_t obs_lock;
  msnap_oom_observer_t *observers;
  uint32_t nobservers, observers_cap;
  /* max_split_size changed at run time (msnap_set_allocator_settings):
   * oversize_* counters then mix old and new thresholds as in PyTorch, so
   * the invariant checker stops recomputing them.  Under every device
   * lock. */
  bool mss_changed;
  /* Raw allocations made while caching is disabled. */
  pthread_mutex_t raw_lock;
  msnap_rawent_t *raw;
  uint64_t raw_cap, raw_count;
  uint64_t next_mempool_id;
  /* fork.c: the registry link (under its lock) and the "bad fork" mark of
   * a forked child on a real device runtime. */
  struct msnap_allocator_s *fork_next;
  _Atomic bool bad_fork;
  /* setExpandableSegmentReserveClassForStream: stream -> reserve class,
   * written under every device lock, read under one. */
  struct msnap_stream_class_s *stream_classes;
  uint32_t nstream_classes, stream_classes_cap;
};

/* fork.c: true in a forked child of a process that used a real runtime. */
static inline bool msnap__bad_fork(const msnap_allocator_t *a) {
  return atomic_load_explicit(&a->bad_fork, memory_order_relaxed);
}

/* ---- pool.c ------------------------------------------------------------- */
void msnap__rb_init(msnap_rbtree_t *t, bool by_addr);
/* An empty block pool: both sets, small or large, owned by a private pool
 * (owner) or by the device (NULL). */
void msnap__bpool_init(msnap_bpool_t *p, bool is_small,
                       msnap_ppool_t *owner);
void msnap__rb_insert(msnap_rbtree_t *t, msnap_block_t *b);
void msnap__rb_erase(msnap_rbtree_t *t, msnap_block_t *b);
/* First block with key >= (stream, size, ptr) (size ignored by_addr). */
msnap_block_t *msnap__rb_lower_bound(const msnap_rbtree_t *t, uint64_t stream,
                                     uint64_t size, uint64_t ptr);
msnap_block_t *msnap__rb_first(const msnap_rbtree_t *t);
msnap_block_t *msnap__rb_last(const msnap_rbtree_t *t);
msnap_block_t *msnap__rb_next(const msnap_block_t *b);
msnap_block_t *msnap__rb_prev(const msnap_block_t *b);
/* Red-black and order properties; 0 or MSNAP_ESTATE with msg. */
int msnap__rb_check(const msnap_rbtree_t *t, char *msg, size_t len);

/* ---- stats.c ------------------------------------------------------------ */
static inline void msnap__stat_inc(msnap_stat_t *s, int64_t n) {
  s->current += n;
  if (s->current > s->peak)
    s->peak = s->current;
  s->allocated += n;
}
static inline void msnap__stat_dec(msnap_stat_t *s, int64_t n) {
  s->current -= n;
  s->freed += n;
}
/* Update AGGREGATE and the pool's type. */
static inline void msnap__stat2_inc(msnap_stat_t *arr, int type, int64_t n) {
  msnap__stat_inc(&arr[MSNAP_STAT_ALL], n);
  msnap__stat_inc(&arr[type], n);
}
static inline void msnap__stat2_dec(msnap_stat_t *arr, int type, int64_t n) {
  msnap__stat_dec(&arr[MSNAP_STAT_ALL], n);
  msnap__stat_dec(&arr[type], n);
}
static inline int msnap__pool_stat_type(const msnap_bpool_t *p) {
  return p->is_small ? MSNAP_STAT_SMALL_POOL : MSNAP_STAT_LARGE_POOL;
}

/* ---- workspace.c, oom.c: life cycle (create.c) ---------------------------- */
/* The workspace allocator's state (a->ws): 0 or MSNAP_ENOMEM. */
int msnap__ws_create(msnap_allocator_t *a);
/* Return every workspace buffer to the runtime and free the state (the
 * runtime must still be alive). */
void msnap__ws_destroy(msnap_allocator_t *a);
/* Free the observer list, releasing library-owned arguments. */
void msnap__oom_observers_destroy(msnap_allocator_t *a);

/* ---- fork.c: fork safety (pthread_atfork) -------------------------------- */
/* Register a new allocator for the fork handlers (installed on the first
 * call) / forget it before it is destroyed. */
void msnap__fork_register(msnap_allocator_t *a);
void msnap__fork_unregister(msnap_allocator_t *a);
/* MSNAP_ESTATE with torch's "bad fork" advice when `a` (a real device
 * runtime) was inherited through fork(); 0 otherwise.  `what` names the
 * call in the message. */
int msnap__fork_check(msnap_allocator_t *a, const char *what);
/* The modules' hooks for their locks, called by fork.c in rank order:
 * host.c (a == NULL: the creation lock; else a's host lock), workspace.c
 * (a's workspace lock). */
void msnap__host_atfork(msnap_allocator_t *a, int phase);
void msnap__workspace_atfork(msnap_allocator_t *a, int phase);
/* ---- pad.c ---------------------------------------------------------------- */
/* AddPadSize from the runtime's soc_name / cann_version ops. */
uint64_t msnap__npu_pad_from(const msnap_runtime_ops_t *rt, void *ctx);
bool msnap__soc_is_ascend950(const char *soc);
/* IsGteCANNVersion("9.1.0", "CANN") for a reported version string. */
bool msnap__cann_version_at_least_9_1_0(const char *current);

/* ---- check.c -------------------------------------------------------------- */
/* The invariants above for one device (msnap_check_invariants runs it on
 * every device; alloc.c after every malloc/free when MSNAP_DEBUG >= 3).
 * Caller holds d's lock.  0 or MSNAP_ESTATE with the violation. */
int msnap__device_check_locked(msnap_device_t *d, char *msg, size_t len);

/* ---- alloc.c: pieces shared with tests and the expandable code ---------- */
uint64_t msnap__round_size(const msnap_allocator_t *a, uint64_t size);
/* Test hook: mutable conf (tests set fields directly). Caller must hold no
 * device lock and no allocation may be running concurrently. */
msnap_conf_t *msnap__allocator_conf_mut(msnap_allocator_t *a);
/* Test accessor: the live segments of a device as (base, size,
 * expandable) and their blocks (ptr, size, allocated/pending/free).  Used
 * by the worked-example tests; caller holds the device lock. */
msnap_device_t *msnap__device(msnap_allocator_t *a, int device);

/* ---- reserved bytes (device and private pool) ---------------------------- */
/* mempool.c: drop the retired pool stats that the resets brought to all
 * zeros.  Caller holds the device lock. */
void msnap__ppool_retired_prune(msnap_device_t *d);
/* Reserved bytes of a pool's segments changed (segment alloc / free, map /
 * unmap): the device-wide reserved_bytes and, for a private pool, its own
 * reserved stat (reserved_bytes_by_private_pools).  Caller holds the
 * device lock. */
static inline void msnap__reserved_change(msnap_device_t *d,
                                          msnap_bpool_t *p, int64_t n,
                                          bool grow) {
  void (*change)(msnap_stat_t *, int, int64_t) =
      grow ? msnap__stat2_inc : msnap__stat2_dec;
  int type = msnap__pool_stat_type(p);
  change(d->stats.reserved_bytes, type, n);
  if (p->owner) change(p->owner->reserved, type, n);
}
static inline void msnap__reserved_inc(msnap_device_t *d, msnap_bpool_t *p,
                                       int64_t n) {
  msnap__reserved_change(d, p, n, true);
}
static inline void msnap__reserved_dec(msnap_device_t *d, msnap_bpool_t *p,
                                       int64_t n) {
  msnap__reserved_change(d, p, n, false);
}

#endif /* MSNAP_ALLOC_H */
