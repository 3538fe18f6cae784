/*
 * msnap_internal.h -- the cross-file index of memsnap's core.  Every
 * function with external linkage that is not public is declared here,
 * grouped under the file that defines it.  Internal names are msnap__*.
 *
 * Lock order (checked in debug builds): device allocator lock ->
 * history/recorder lock -> stack-table lock.  The dump lock is never held
 * together with a device lock: snapshots copy under the device lock and
 * serialize after releasing it.  The pinned host allocator's lock
 * (host_alloc.c) is never held with a device lock; its host history ring
 * and the stack table are taken inside it.
 */
#ifndef MSNAP_INTERNAL_H
#define MSNAP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap.h"
#include "sink.h"
#include "snapshot.h"

#if defined(__GNUC__)
#define msnap_likely(x) __builtin_expect(!!(x), 1)
#define msnap_unlikely(x) __builtin_expect(!!(x), 0)
#else
#define msnap_likely(x) (x)
#define msnap_unlikely(x) (x)
#endif

/* Debug tiers (debug code always compiles; `if` on a constant). */
#ifndef MSNAP_DEBUG
#define MSNAP_DEBUG 0
#endif
static const int msnap_debug_level = MSNAP_DEBUG;

/* ---- error.c ------------------------------------------------------------ */
/* Set this thread's last-error text (printf format); returns err. */
int msnap__set_error(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same, and remember the system errno `sys_errno` (msnap_last_errno());
 * msnap__set_error resets it to 0. */
int msnap__set_error_errno(int err, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- conf.c: alloc-conf parsing (PYTORCH_{CUDA,NPU}_ALLOC_CONF) --------- */
#define MSNAP_ROUNDUP_INTERVALS 16
typedef struct msnap_conf_s {
  msnap_profile_t profile;
  char *raw;                          /* last applied string ("" if none) */
  uint64_t max_split_size;            /* SIZE_MAX = unlimited            */
  uint64_t max_non_split_rounding_size;
  uint64_t large_segment_size;        /* default 20 MiB                  */
  double garbage_collection_threshold;
  uint64_t roundup_power2_divisions[MSNAP_ROUNDUP_INTERVALS];
  bool expandable_segments;
  bool release_lock_on_malloc;        /* release_lock_on_{cuda,npu}malloc */
  bool pinned_use_host_register;
  uint64_t pinned_num_register_threads;
  bool pinned_use_background_threads;
  bool graph_capture_record_stream_reuse;
  double per_process_memory_fraction; /* 1.0 default                     */
  bool throw_on_malloc_oom;           /* throw_on_{cuda,npu}malloc_oom   */
  /* npu-only */
  bool page_size_1g;                  /* page_size:1g                    */
  uint64_t base_addr_aligned_kb;      /* default 16                      */
  uint64_t segment_size_mb;           /* 0 = unset                       */
  bool multi_stream_lazy_reclaim;
  bool large_segment_size_set;
  /* pinned host allocator (recorded for allocator_settings; 0 = unset) */
  uint64_t pinned_max_round_threshold; /* pinned_max_round_threshold_mb  */
  uint64_t pinned_max_cached_size;     /* pinned_max_cached_size_mb      */
  uint64_t pinned_reserve_segment_size; /* pinned_reserve_segment_size_mb */
} msnap_conf_t;
/* Defaults of a profile. */
void msnap__conf_init(msnap_conf_t *c, msnap_profile_t profile);
void msnap__conf_destroy(msnap_conf_t *c);
/* Parse `s` into *c with PyTorch's reset semantics (allocator-algorithm
 * §17).  On error returns MSNAP_ECONF, leaves *c unchanged and writes a
 * message naming the offending token into err. */
int msnap__conf_parse(msnap_conf_t *c, const char *s, char *err,
                      size_t errlen);
/* The alloc-conf string from the environment for a profile (NULL if none);
 * MSNAP_ECONF when both NPU variables are set. */
int msnap__conf_from_env(msnap_profile_t profile, const char **out,
                         char *err, size_t errlen);
/* msnap__conf_parse for a run-time change (_set_allocator_settings): in
 * the npu profile only the keys torch_npu accepts at run time are allowed
 * (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
 * release_lock_on_npumalloc, throw_on_npumalloc_oom,
 * per_process_memory_fraction, pinned_max_round_threshold_mb,
 * pinned_max_cached_size_mb); the cuda profile accepts every key. */
int msnap__conf_parse_runtime(msnap_conf_t *c, const char *s, char *err,
                              size_t errlen);
/* roundup_power2_divisions entry for a (>= 512) size: the size class is
 * floor(log2(size)) - 20 clamped to [0, 15] (allocator-algorithm §3.1). */
uint64_t msnap__roundup_divisions(const msnap_conf_t *c, size_t size);
/* Invariant checker of a conf: 0, or MSNAP_ESTATE with the violation. */
int msnap__conf_check(const msnap_conf_t *c, char *msg, size_t msg_len);

/* ---- env.c: environment options ---------------------------------------- */
/* MEMSNAP_PROFILE, MEMSNAP_RUNTIME, MEMSNAP_SIM_DEVICES, MEMSNAP_SIM_MEMORY
 * (with K/M/G/T suffixes), PYTORCH_NO_*_MEMORY_CACHING. */
int msnap__env_profile(msnap_profile_t *out);
const char *msnap__env_runtime(void);
uint64_t msnap__env_size(const char *name, uint64_t dflt);
uint64_t msnap__env_count(const char *name, uint64_t dflt, uint64_t lo,
                          uint64_t hi);
uint64_t msnap__env_size_min(const char *name, uint64_t dflt, uint64_t min);
/* MEMSNAP_SIM_DEVICES accepts 1..MSNAP_SIM_MAX_DEVICES. */
#define MSNAP_SIM_MAX_DEVICES 64
bool msnap__env_no_caching(msnap_profile_t profile);
/* A 0/1 switch (MEMSNAP_SIM_HOST_BACKED); bad values warn once. */
bool msnap__env_bool(const char *name, bool dflt);

/* ---- runtime_sim.c ------------------------------------------------------ */
/* Host (pinned) memory is also simulated: no host RAM behind it. */
/* Create a sim runtime context with explicit parameters (the ops table's
 * init reads MEMSNAP_SIM_DEVICES / MEMSNAP_SIM_MEMORY instead); devices is
 * clamped to [1, 64], memory to [2 MiB, 256 TiB].  Free with the sim ops
 * table's fini. */
int msnap__sim_create(int devices, uint64_t memory, void **ctx);
/* The same with the host-backed option (real host memory behind device
 * and pinned addresses; see runtime_sim.c).  MSNAP_EOOM when the address
 * space cannot be reserved. */
int msnap__sim_create_ex(int devices, uint64_t memory, bool host_backed,
                         void **ctx);
/* Invariant checker of a sim context: 0, or MSNAP_ESTATE with the first
 * violation in msg. */
int msnap__sim_check(void *ctx, char *msg, size_t msg_len);

/* ---- clock.c: time stamps ----------------------------------------------- */
/* Raw cycle counter (rdtsc / cntvct_el0 / clock_gettime fallback). */
uint64_t msnap__clock_raw(void);
/* Convert a raw reading to microseconds since the Unix epoch (calibrated
 * against CLOCK_REALTIME; monotone). */
int64_t msnap__clock_to_us(uint64_t raw);
int64_t msnap__clock_now_us(void);
/* First use: pick the counter, take the first anchor (idempotent). */
void msnap__clock_init(void);
/* Refresh the conversion anchor against CLOCK_REALTIME (snapshot time). */
void msnap__clock_calibrate(void);
/* "tsc", "cntvct" or "clock_gettime". */
const char *msnap__clock_source(void);
int msnap__clock_check(char *msg, size_t len);

/* ---- history.c / stack.c: the recorder ---------------------------------- */
/* A recording context, captured at the start of malloc/free/empty_cache
 * OUTSIDE the allocator lock, consumed under it.  stack is an id in the
 * process-wide stack table (0 = none), holding one reference that the
 * consumer takes over (msnap__stack_ref/unref). */
typedef struct msnap_rctx_s {
  uint32_t stack;           /* interned stack id, 0 = none          */
  uint32_t user_metadata;   /* interned string id in stack table, 0 = "" */
  uint32_t compile_context; /* interned string id, 0 = "N/A"         */
  uint8_t level;            /* msnap_record_context_t at capture      */
  /* Serial of the capturing call, unique per thread and call (0: none).
   * Entries that one call records back to back in a ring share one clock
   * read (history.c, ring_record). */
  uint64_t call;
} msnap_rctx_t;

/* True when history (or STATE context) is on for the allocator: the only
 * check on the hot path when recording is off. */
bool msnap__history_active(const msnap_allocator_t *a);
/* Capture the calling thread's context.  is_free_site: a free()/
 * empty_cache() call site (captured only at context level ALL). */
void msnap__rctx_capture(msnap_allocator_t *a, msnap_rctx_t *ctx,
                         bool is_free_site);
/* Drop the references a context still holds. */
void msnap__rctx_release(msnap_rctx_t *ctx);
void msnap__stack_ref(uint32_t stack);
void msnap__stack_unref(uint32_t stack);
/* Append a trace entry to device's ring (skips skip_actions; takes a
 * reference on ctx->stack if kept).  The caller holds the device lock.
 * `stack_override` is used instead of ctx->stack when non-zero (free_* of
 * a block at levels below ALL use the block's alloc stack). */
void msnap__history_record_locked(msnap_allocator_t *a, int device,
                                  msnap_action_t action, uint64_t addr,
                                  uint64_t size, uint64_t stream,
                                  msnap_mempool_id_t pool,
                                  const msnap_rctx_t *ctx,
                                  uint32_t stack_override);
/* Per-allocator recorder state (created lazily by msnap_record_history). */
struct msnap_recorder_s;
void msnap__recorder_destroy(struct msnap_recorder_s *r);

/* ---- alloc.c: what the recorder and snapshots need from the allocator -- */
/* Lock/unlock one device's allocator. */
void msnap__device_lock(msnap_allocator_t *a, int device);
void msnap__device_unlock(msnap_allocator_t *a, int device);
struct msnap_recorder_s **msnap__allocator_recorder(msnap_allocator_t *a);
/* Append the device's segments (sorted by address; expandable segments one
 * per contiguous mapped range) and their blocks to `out`, filtered by pool
 * ({0,0} = every pool).  Stack fields hold RAW recorder stack ids (with a
 * reference taken each) -- msnap__snap_import_stacks converts them after
 * the lock is released.  Caller holds the device lock.  Returns the total
 * active bytes of the reported segments (the `snapshot` entry's size) in
 * *active_bytes. */
int msnap__device_collect_segments_locked(msnap_allocator_t *a, int device,
                                          msnap_mempool_id_t pool,
                                          msnap_snap_t *out,
                                          uint64_t *active_bytes);
/* Live allocation lookup (annotate, traceback): block stack id and
 * requested size, caller holds no lock. */
int msnap__allocation_info(msnap_allocator_t *a, uint64_t ptr, int *device,
                           uint64_t *requested_size, uint64_t *stream,
                           msnap_mempool_id_t *pool, uint32_t *stack);
/* getBaseAllocation: the segment holding the live allocation at ptr (its
 * first block's address and the sum of its blocks' sizes; for expandable
 * segments the whole VA, as PyTorch walks prev/next over unmapped blocks
 * too).  MSNAP_EBADPTR when ptr is not a live base pointer; caller holds
 * no lock. */
int msnap__allocation_base(msnap_allocator_t *a, uint64_t ptr,
                           uint64_t *base, uint64_t *size);
/* The allocator's conf.  Read it while holding a device lock (e.g.
 * msnap__device_lock(a, 0)): msnap_set_allocator_settings rewrites it, and
 * frees conf.raw, under every device lock. */
const msnap_conf_t *msnap__allocator_conf(msnap_allocator_t *a);

/* ---- snapshot_take.c ---------------------------------------------------- */
/* Build the snapshot model of a live allocator (copies under the locks,
 * resolves stacks and symbols outside them). */
int msnap__snapshot_take(msnap_allocator_t *a,
                         const msnap_snapshot_options_t *o,
                         msnap_snap_t **out);
/* Replace raw recorder stack ids in every frames field of s by model stacks
 * (resolving Python frames and C symbols once per unique address), and
 * drop the references taken during collection. */
int msnap__snap_import_stacks(msnap_snap_t *s);
/* Test hook: every later dump/report write fails with `err` (e.g.
 * MSNAP_ENOSPC) once `after_bytes` bytes were written; UINT64_MAX
 * disarms. */
void msnap__dump_set_fault(uint64_t after_bytes, int err);
/* Write len bytes to path atomically (temporary file + rename; the fault
 * hook applies). */
int msnap__write_file_atomic(const char *path, const void *p, size_t len);

/* ---- host_alloc.c: the pinned host caching allocator -------------------- */
/* Its internal functions (lock, snapshot collection, destruction, checker)
 * and history.c's host recording entry points are declared in
 * host_alloc.h. */

/* ---- oom.c: OOM observers and OOM_SNAPSHOT_ENABLE auto-dump ------------- */
void msnap__oom_notify(msnap_allocator_t *a, int device, uint64_t alloc_size,
                       uint64_t device_total, uint64_t device_free);
/* Read OOM_SNAPSHOT_ENABLE / OOM_SNAPSHOT_PATH for a new allocator (turns
 * history on when set).  alloc.c calls it at the end of
 * msnap_allocator_create. */
void msnap__oom_env_init(msnap_allocator_t *a);

/* ---- fork.c: fork safety (pthread_atfork) -------------------------------- */
/* Phases of a fork.  PREPARE takes locks (in fork.c's order), PARENT and
 * CHILD release them: the child's only thread is the one that forked and
 * still owns them.  Each module below exposes one hook for its locks. */
enum { MSNAP_FORK_PREPARE = 0, MSNAP_FORK_PARENT = 1, MSNAP_FORK_CHILD = 2 };
static inline void msnap__fork_mutex(pthread_mutex_t *m, int phase) {
  if (phase == MSNAP_FORK_PREPARE)
    pthread_mutex_lock(m);
  else
    pthread_mutex_unlock(m);
}
/* Register a new allocator for the fork handlers (installed on first
 * call) / forget it before it is destroyed. */
void msnap__fork_register(msnap_allocator_t *a);
void msnap__fork_unregister(msnap_allocator_t *a);
/* MSNAP_ESTATE with torch's "bad fork" advice when `a` (a real device
 * runtime) was inherited through fork(); 0 otherwise.  `what` names the
 * call in the message. */
int msnap__fork_check(msnap_allocator_t *a, const char *what);
/* The modules' hooks.  a == NULL: the module's process-wide locks. */
void msnap__history_atfork(msnap_allocator_t *a, int phase);   /* history.c */
void msnap__workspace_atfork(msnap_allocator_t *a, int phase); /* workspace.c */
void msnap__host_atfork(msnap_allocator_t *a, int phase);      /* host_alloc.c */
void msnap__oom_atfork(int phase);                             /* oom.c */
void msnap__stack_atfork(int phase);                           /* stack.c */
void msnap__clock_atfork(int phase);                           /* clock.c */
void msnap__env_atfork(int phase);                             /* env.c */
void msnap__sim_atfork(void *ctx, int phase);                  /* runtime_sim.c */

#endif /* MSNAP_INTERNAL_H */
