/*
 * memsnap.h -- the one public header of memsnap.
 *
 * memsnap is a device caching allocator that makes the decisions PyTorch's
 * CUDA caching allocator makes (c10/cuda/CUDACachingAllocator.cpp) and, in
 * the "npu" profile, the decisions torch_npu's NPUCachingAllocator makes;
 * plus the memory-history recorder and the snapshot writer/reader of
 * torch.cuda.memory, in C11.
 *
 * Conventions (read once, they hold for every function below):
 *   - Functions that can fail return int: 0 on success, a negative MSNAP_E*
 *     code otherwise.  msnap_strerror() / msnap_err_name() describe a code.
 *   - Out-parameters are left untouched when a call fails.
 *   - Sizes are bytes.  Device addresses and stream handles are uint64_t
 *     values (a stream is the runtime's stream handle as an integer; 0 is the
 *     default stream).  Times are microseconds since the Unix epoch.
 *   - A msnap_allocator_t is thread safe: one lock per device, as PyTorch's
 *     DeviceCachingAllocator.  Snapshots copy state under the lock and
 *     serialize outside it.
 *   - Strings returned by the library are NUL-terminated UTF-8; "owned by the
 *     caller" means free them with msnap_free_string().
 */
#ifndef MEMSNAP_H
#define MEMSNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MSNAP_API __declspec(dllexport)
#else
#define MSNAP_API __attribute__((visibility("default")))
#endif

#define MSNAP_VERSION_MAJOR 0
#define MSNAP_VERSION_MINOR 1
#define MSNAP_VERSION_PATCH 0
#define MSNAP_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------
 * Errors.  One X-macro table gives the enum, msnap_strerror and
 * msnap_err_name (the libuv UV_ERRNO_MAP pattern).
 * ------------------------------------------------------------------------ */
#define MSNAP_ERRNO_MAP(XX)                                                   \
  XX(ENOMEM, -1, "out of host memory")                                        \
  XX(EOOM, -2, "device out of memory")                                        \
  XX(EINVAL, -3, "invalid argument")                                          \
  XX(EBADPTR, -4, "pointer is not a live allocation of this allocator")       \
  XX(ECONF, -5, "invalid allocator configuration")                            \
  XX(ERUNTIME, -6, "device runtime call failed")                              \
  XX(ENORUNTIME, -7, "device runtime library could not be loaded")            \
  XX(ENOTSUP, -8, "operation not supported")                                  \
  XX(EIO, -9, "input/output error")                                           \
  XX(EFORMAT, -10, "malformed input")                                         \
  XX(EUNSAFE, -11, "input would execute code; refused")                       \
  XX(ELIMIT, -12, "size or nesting limit exceeded")                           \
  XX(ESTATE, -13, "operation not valid in the current state")                 \
  XX(ENOENT, -14, "no such item")                                             \
  XX(EREJECTED, -15, "allocation rejected by the memory limit policy")        \
  XX(ENOSPC, -16, "no space left on the dump target")

typedef enum msnap_errno_e {
  MSNAP_OK = 0,
#define MSNAP_ERRNO_ENUM_(name, value, text) MSNAP_##name = (value),
  MSNAP_ERRNO_MAP(MSNAP_ERRNO_ENUM_)
#undef MSNAP_ERRNO_ENUM_
} msnap_errno_t;

/* Text for an error code ("unknown error" for codes outside the table). */
MSNAP_API const char *msnap_strerror(int err);
/* Symbolic name of an error code, e.g. "MSNAP_EOOM". */
MSNAP_API const char *msnap_err_name(int err);
/* Free a string returned by the library (memory_summary, last_error...). */
MSNAP_API void msnap_free_string(char *s);

/* ------------------------------------------------------------------------
 * Device runtimes: one const ops table per runtime.  "sim" runs everywhere
 * (MEMSNAP_SIM_DEVICES devices of MEMSNAP_SIM_MEMORY bytes, no host RAM
 * used unless host-backed: MEMSNAP_SIM_HOST_BACKED=1); "acl" and "cuda"
 * are loaded with dlopen.
 * ------------------------------------------------------------------------ */
/* One row of CANN's per-module device memory report (aclrtMemUsageInfo:
 * name[32] as ACL gives it, not always NUL-terminated; bytes). */
typedef struct msnap_mem_usage_s {
  char name[32];
  uint64_t cur_bytes, peak_bytes;
} msnap_mem_usage_t;
/* One process using a device (NVML nvmlProcessInfo_v1_t: pid, bytes). */
typedef struct msnap_proc_mem_s {
  uint32_t pid;
  uint64_t used_bytes;
} msnap_proc_mem_t;

typedef struct msnap_runtime_ops_s {
  const char *name; /* "sim", "acl", "cuda" */
  /* Load/initialise; *ctx receives the runtime's context.  MSNAP_ENORUNTIME
   * when the library is missing. */
  int (*init)(void **ctx);
  void (*fini)(void *ctx);
  int (*device_count)(void *ctx, int *count);
  /* Device memory.  malloc returns MSNAP_EOOM when the device is full. */
  int (*malloc)(void *ctx, int device, size_t size, uint64_t *ptr);
  int (*free)(void *ctx, int device, uint64_t ptr);
  int (*mem_get_info)(void *ctx, int device, size_t *free_bytes,
                      size_t *total_bytes);
  /* Events on streams (record_stream). */
  int (*event_create)(void *ctx, int device, uint64_t *event);
  int (*event_destroy)(void *ctx, int device, uint64_t event);
  int (*event_record)(void *ctx, int device, uint64_t event, uint64_t stream);
  /* *done = true when every work item recorded before the event finished. */
  int (*event_query)(void *ctx, int device, uint64_t event, bool *done);
  int (*event_synchronize)(void *ctx, int device, uint64_t event);
  int (*device_synchronize)(void *ctx, int device);
  /* Virtual memory for expandable segments.  reserve/release a VA range;
   * map creates one physical allocation of `size` bytes and maps it at va
   * (*handle identifies it); unmap unmaps it and frees the physical memory.
   * alignment 0 means the runtime's granule; other values are rounded up to
   * a power of two (a 20 MiB granule asks for 32 MiB alignment).
   * Returns MSNAP_ENOTSUP when the runtime has no VMM API. */
  int (*vmm_reserve)(void *ctx, int device, size_t size, size_t alignment,
                     uint64_t *va);
  int (*vmm_release)(void *ctx, int device, uint64_t va, size_t size);
  int (*vmm_map)(void *ctx, int device, uint64_t va, size_t size,
                 uint64_t *handle);
  int (*vmm_unmap)(void *ctx, int device, uint64_t va, size_t size,
                   uint64_t handle);
  /* Pinned host memory (host_segments/host_traces). */
  int (*host_malloc)(void *ctx, size_t size, uint64_t *ptr);
  int (*host_free)(void *ctx, uint64_t ptr);
  /* Optional platform queries; NULL or MSNAP_ENOTSUP when the runtime
   * cannot say.  soc_name / cann_version: the SoC name (aclrtGetSocName,
   * e.g. "Ascend910B1") and the CANN package version
   * (aclsysGetCANNVersion(ACL_PKG_NAME_CANN), e.g. "8.5.0") written
   * NUL-terminated into buf; the npu profile's request pad follows them
   * (torch_npu AddPadSize).  mem_usage_info: CANN's per-module usage of a
   * device (aclrtGetMemUsageInfo): up to cap rows into out, *n = rows the
   * runtime reported (may exceed cap).  process_memory: the processes
   * using a device (NVML), up to cap into out, *n = processes reported. */
  int (*soc_name)(void *ctx, char *buf, size_t len);
  int (*cann_version)(void *ctx, char *buf, size_t len);
  int (*mem_usage_info)(void *ctx, int device, msnap_mem_usage_t *out,
                        size_t cap, size_t *n);
  int (*process_memory)(void *ctx, int device, msnap_proc_mem_t *out,
                        size_t cap, size_t *n);
} msnap_runtime_ops_t;

MSNAP_API const msnap_runtime_ops_t *msnap_runtime_sim(void);
MSNAP_API const msnap_runtime_ops_t *msnap_runtime_acl(void);
MSNAP_API const msnap_runtime_ops_t *msnap_runtime_cuda(void);
/* The table for a name, NULL if unknown: "sim", "acl" (also "npu",
 * "ascend"), "cuda"; letter case ignored. */
MSNAP_API const msnap_runtime_ops_t *msnap_runtime_by_name(const char *name);

/* ------------------------------------------------------------------------
 * Allocator creation.
 * ------------------------------------------------------------------------ */
typedef struct msnap_allocator_s msnap_allocator_t;

typedef enum msnap_profile_e {
  MSNAP_PROFILE_NPU = 0, /* torch_npu NPUCachingAllocator behaviour */
  MSNAP_PROFILE_CUDA = 1 /* PyTorch CUDACachingAllocator behaviour   */
} msnap_profile_t;

typedef struct msnap_options_s {
  uint32_t size;    /* sizeof(msnap_options_t); set by msnap_options_init */
  uint32_t version; /* MSNAP_OPTIONS_VERSION */
  /* -1: from MEMSNAP_PROFILE, else the runtime's own profile (acl: npu;
   * cuda and sim: cuda). */
  int profile;
  /* NULL: from MEMSNAP_RUNTIME ("sim" default).  Or an explicit table. */
  const char *runtime_name;
  const msnap_runtime_ops_t *runtime;
  /* NULL: from PYTORCH_NPU_ALLOC_CONF/PYTORCH_ALLOC_CONF (npu) or
   * PYTORCH_CUDA_ALLOC_CONF/PYTORCH_ALLOC_CONF (cuda). */
  const char *alloc_conf;
  /* -1: from PYTORCH_NO_NPU_MEMORY_CACHING / PYTORCH_NO_CUDA_MEMORY_CACHING
   * ("1" disables caching). */
  int caching_disabled;
  /* sim runtime parameters; 0: from MEMSNAP_SIM_DEVICES (1) and
   * MEMSNAP_SIM_MEMORY (64 GiB); else devices (more than 64 are 64) and
   * 2 MiB..256 TiB per device (MSNAP_EINVAL outside, as a negative
   * sim_devices and caching_disabled other than -1, 0, 1). */
  int sim_devices;
  uint64_t sim_memory;
  /* Error text of a failed msnap_allocator_create (e.g. the offending
   * alloc-conf token); may be NULL. */
  char *error_buf;
  size_t error_buf_len;
  /* sim runtime: 1 = host-backed (device and pinned memory are real host
   * memory, so its bytes can be read and written), 0 = address ranges
   * only, -1 = from MEMSNAP_SIM_HOST_BACKED (default 0).  Read only when
   * `size` covers it (callers built against an older header get -1). */
  int sim_host_backed;
} msnap_options_t;

#define MSNAP_OPTIONS_VERSION 1
/* Fill *o with "take everything from the environment". */
MSNAP_API void msnap_options_init(msnap_options_t *o);

/* Create an allocator.  Errors: MSNAP_ECONF (bad alloc conf, message in
 * o->error_buf naming the token), MSNAP_ENORUNTIME, MSNAP_EINVAL (also
 * options whose size or version msnap_options_init did not set). */
MSNAP_API int msnap_allocator_create(const msnap_options_t *o,
                                     msnap_allocator_t **out);
/* Release every cached segment and the runtime.  Live allocations are
 * returned to the runtime too. */
MSNAP_API void msnap_allocator_destroy(msnap_allocator_t *a);
/* True in a child process forked from a process that used `a` on a real
 * device runtime (acl, cuda): its device calls then fail with
 * MSNAP_ESTATE, as torch's "bad fork" (the sim runtime is never in a bad
 * fork: the child works on a copy).  Every lock of every allocator is
 * taken around fork() (pthread_atfork), so a child never inherits a held
 * lock. */
MSNAP_API bool msnap_in_bad_fork(msnap_allocator_t *a);
/* The process-wide allocator (created from the environment on first use;
 * the pluggable-allocator entry points and the Python package use it).
 * NULL if creation failed (see msnap_default_error()). */
MSNAP_API msnap_allocator_t *msnap_default(void);
MSNAP_API const char *msnap_default_error(void);
/* Make msnap_default() use this ops table instead of the runtime
 * MEMSNAP_RUNTIME names (e.g. memsnap's torch_npu shim: the acl runtime
 * with torch_npu's task queue drained before device synchronizations and
 * event records).  The table must outlive the process.  MSNAP_ESTATE when
 * the default allocator already exists; MSNAP_EINVAL for NULL. */
MSNAP_API int msnap_set_default_runtime(const msnap_runtime_ops_t *ops);

/* Whether msnap_default() has created the process-wide allocator yet
 * (never creates it). */
MSNAP_API bool msnap_default_exists(void);

MSNAP_API int msnap_device_count(msnap_allocator_t *a);
MSNAP_API msnap_profile_t msnap_profile(msnap_allocator_t *a);
MSNAP_API const msnap_runtime_ops_t *msnap_runtime(msnap_allocator_t *a);
/* The runtime context (e.g. for msnap_sim_* control calls). */
MSNAP_API void *msnap_runtime_ctx(msnap_allocator_t *a);
/* Text of the last error on this thread (OOM message as PyTorch's,
 * "invalid device pointer: 0x...", bad conf token...).  Owned by the
 * library, valid until the next call on this thread. */
MSNAP_API const char *msnap_last_error(void);
/* The errno of the last error on this thread when it came from a system
 * call (open, write, rename: MSNAP_EIO / MSNAP_ENOSPC), else 0. */
MSNAP_API int msnap_last_errno(void);

/* ------------------------------------------------------------------------
 * Allocation.  Mirrors NativeCachingAllocator::malloc/free/recordStream.
 * ------------------------------------------------------------------------ */
/* Allocate `size` bytes on `device` for `stream`.  size 0 yields *ptr = 0
 * and no allocator work.  MSNAP_EOOM after the full OOM sequence (the text
 * is in msnap_last_error(), shaped as PyTorch's OutOfMemoryError message),
 * or at once for 1 EB or more ("... Tried to allocate more than 1EB
 * memory.", no oom entry, no observers, as PyTorch's guard);
 * MSNAP_EREJECTED for throw_on_*malloc_oom rejections; MSNAP_EINVAL for a
 * device that is not one of a's or a NULL ptr. */
MSNAP_API int msnap_malloc(msnap_allocator_t *a, int device, size_t size,
                           uint64_t stream, uint64_t *ptr);
/* Free a pointer returned by msnap_malloc.  0 is a no-op.  An unknown
 * pointer gives MSNAP_EBADPTR ("invalid device pointer: 0x...") and leaves
 * the allocator unchanged. */
MSNAP_API int msnap_free(msnap_allocator_t *a, uint64_t ptr);
/* Mark that the live allocation at ptr is used on `stream` (record_stream):
 * its free then waits for an event recorded on that stream.  The cuda
 * profile ignores the allocation's own stream (PyTorch's recordStream);
 * the npu profile records it too (torch_npu's). */
MSNAP_API int msnap_record_stream(msnap_allocator_t *a, uint64_t ptr,
                                  uint64_t stream);
/* Forget that the live allocation at ptr is used on `stream` (torch_npu's
 * NPUCachingAllocator::eraseStream, after HCCL synchronized that stream):
 * its free then waits for no event on it.  Unknown streams are ignored;
 * MSNAP_EBADPTR for an unknown pointer. */
MSNAP_API int msnap_erase_stream(msnap_allocator_t *a, uint64_t ptr,
                                 uint64_t stream);
/* Release cached memory (release_cached_blocks({0,0}) on every device, or
 * only `device` when >= 0). */
MSNAP_API int msnap_empty_cache(msnap_allocator_t *a, int device);
/* Size (rounded block size) of the live allocation at ptr. */
MSNAP_API int msnap_allocation_size(msnap_allocator_t *a, uint64_t ptr,
                                    size_t *size);
/* Runtime alloc-conf change (torch.cuda.memory._set_allocator_settings).
 * MSNAP_ECONF with the offending token in msnap_last_error(). */
MSNAP_API int msnap_set_allocator_settings(msnap_allocator_t *a,
                                           const char *conf);
/* Current alloc-conf string as last applied ("" if none). */
MSNAP_API const char *msnap_allocator_settings(msnap_allocator_t *a);
/* set/get_per_process_memory_fraction (fraction in [0,1]). */
MSNAP_API int msnap_set_memory_fraction(msnap_allocator_t *a, int device,
                                        double fraction);
MSNAP_API int msnap_get_memory_fraction(msnap_allocator_t *a, int device,
                                        double *fraction);
/* caching_allocator_enable(value) at run time; disabled = raw runtime
 * malloc/free, no stats, no history. */
MSNAP_API int msnap_set_caching_enabled(msnap_allocator_t *a, bool enabled);
MSNAP_API bool msnap_caching_enabled(msnap_allocator_t *a);
/* mem_get_info: free and total bytes of the device from the runtime. */
MSNAP_API int msnap_mem_get_info(msnap_allocator_t *a, int device,
                                 size_t *free_bytes, size_t *total_bytes);

/* Private pools (torch.cuda.MemPool / graph pools).  Ids are pairs;
 * {0,0} is the default pool. */
typedef struct msnap_mempool_id_s {
  uint64_t first, second;
} msnap_mempool_id_t;
/* Create (or incref) a private pool with a fresh id {0, n} as MemPool. */
MSNAP_API int msnap_mempool_create(msnap_allocator_t *a, int device,
                                   bool use_on_oom, bool no_split,
                                   msnap_mempool_id_t *id);
MSNAP_API int msnap_mempool_release(msnap_allocator_t *a, int device,
                                    msnap_mempool_id_t id);
/* Route allocations of `stream` (or every stream when all_streams) to the
 * pool until msnap_end_allocate_to_pool (beginAllocateToPool).  Takes a
 * reference on the pool (drop it with msnap_mempool_release).  Routing
 * only: it does not make the device behave as during a graph capture
 * (see msnap_mark_capture_begin).  MSNAP_ESTATE if the pool already has a
 * scope. */
MSNAP_API int msnap_begin_allocate_to_pool(msnap_allocator_t *a, int device,
                                           msnap_mempool_id_t id,
                                           uint64_t stream, bool all_streams);
/* Route the calling thread's allocations (any stream) to the pool until
 * msnap_end_allocate_to_pool: torch.cuda.use_mem_pool's filter
 * (_cuda_beginAllocateCurrentThreadToPool).  Other threads keep using the
 * default pools. */
MSNAP_API int msnap_begin_allocate_current_thread_to_pool(
    msnap_allocator_t *a, int device, msnap_mempool_id_t id);
MSNAP_API int msnap_end_allocate_to_pool(msnap_allocator_t *a, int device,
                                         msnap_mempool_id_t id);
/* A graph capture on `stream` begins / ends (PyTorch's markCaptureBegin /
 * markCaptureEnd, called by CUDAGraph / NPUGraph around the real stream
 * capture).  While one is in progress, allocations and frees on that
 * stream follow the capture rules: no event queries, frees of blocks with
 * stream uses deferred until the capture ends (streams recorded during
 * the capture are then dropped), no free-cache-and-retry on OOM;
 * empty_cache leaves the default pools alone.  Captures nest (a count per
 * stream).  end: MSNAP_ESTATE when no capture is in progress there. */
/* setExpandableSegmentReserveClassForStream (cuda,
 * expandable_segments_reserve_by_class): the class of `stream` for the VA
 * reservation of its next expandable segments; "" or NULL clears.
 * MSNAP_EINVAL for a class of 48 bytes or more. */
MSNAP_API int msnap_set_expandable_segment_reserve_class(
    msnap_allocator_t *a, uint64_t stream, const char *reserve_class);
MSNAP_API int msnap_mark_capture_begin(msnap_allocator_t *a, int device,
                                       uint64_t stream);
MSNAP_API int msnap_mark_capture_end(msnap_allocator_t *a, int device,
                                     uint64_t stream);
MSNAP_API int msnap_mempool_use_count(msnap_allocator_t *a, int device,
                                      msnap_mempool_id_t id, int *count);

/* ------------------------------------------------------------------------
 * Statistics (memory_stats()).  Every StatArray has the AGGREGATE ("all"),
 * SMALL_POOL and LARGE_POOL entries.  Field lists are X-macros so that the
 * struct, the Python dict and the summary come from one list.
 * ------------------------------------------------------------------------ */
typedef struct msnap_stat_s {
  int64_t current, peak, allocated, freed;
} msnap_stat_t;

enum {
  MSNAP_STAT_ALL = 0,
  MSNAP_STAT_SMALL_POOL = 1,
  MSNAP_STAT_LARGE_POOL = 2,
  MSNAP_STAT_TYPES = 3
};

#define MSNAP_STAT_ARRAY_FIELDS(X)                                            \
  X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes)     \
  X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)
#define MSNAP_STAT_FIELDS(X) X(oversize_allocations) X(oversize_segments)
#define MSNAP_COUNTER_FIELDS(X)                                               \
  X(num_alloc_retries) X(num_ooms) X(max_split_size) X(num_sync_all_streams)  \
  X(num_device_alloc) X(num_device_free) X(num_oom_rejections)

typedef struct msnap_stats_s {
  uint32_t size;    /* sizeof(msnap_stats_t) */
  uint32_t version; /* MSNAP_STATS_VERSION */
#define MSNAP_STATS_ARRAY_(n) msnap_stat_t n[MSNAP_STAT_TYPES];
  MSNAP_STAT_ARRAY_FIELDS(MSNAP_STATS_ARRAY_)
#undef MSNAP_STATS_ARRAY_
#define MSNAP_STATS_ONE_(n) msnap_stat_t n;
  MSNAP_STAT_FIELDS(MSNAP_STATS_ONE_)
#undef MSNAP_STATS_ONE_
#define MSNAP_STATS_COUNTER_(n) int64_t n;
  MSNAP_COUNTER_FIELDS(MSNAP_STATS_COUNTER_)
#undef MSNAP_STATS_COUNTER_
} msnap_stats_t;
#define MSNAP_STATS_VERSION 1

/* Fill *out (caller sets out->size = sizeof *out and version). */
MSNAP_API int msnap_stats_get(msnap_allocator_t *a, int device,
                              msnap_stats_t *out);
MSNAP_API int msnap_reset_peak_stats(msnap_allocator_t *a, int device);
MSNAP_API int msnap_reset_accumulated_stats(msnap_allocator_t *a, int device);
/* reserved_bytes of one private pool (memory_stats()'s
 * reserved_bytes_by_private_pools, torch 2.13).  A deleted pool keeps its
 * entry (current 0; peak, allocated, freed as they were) until the resets
 * bring all four fields of every type to 0. */
typedef struct msnap_pool_stats_s {
  msnap_mempool_id_t id;
  msnap_stat_t reserved_bytes[MSNAP_STAT_TYPES];
} msnap_pool_stats_t;
/* The private pools of a device with a non-zero entry (a pool appears with
 * its first reserved byte): live pools in creation order, then deleted
 * ones.  Fills out[0 .. min(cap, total)) and
 * sets *n to the total (call with cap 0 to size the array). */
MSNAP_API int msnap_pool_stats_get(msnap_allocator_t *a, int device,
                                   msnap_pool_stats_t *out, size_t cap,
                                   size_t *n);
/* memory_summary() text exactly as torch.cuda.memory.memory_summary prints
 * it; *out owned by the caller. */
MSNAP_API int msnap_memory_summary(msnap_allocator_t *a, int device,
                                   bool abbreviated, char **out);
/* Invariant checker: walks every device and pool (chains contiguous, block
 * sizes sum to segments, pool membership, stats equal recomputed sums),
 * then the pinned host allocator (src/alloc/host.c).
 * Returns 0, or MSNAP_ESTATE with the first violation in msg. */
MSNAP_API int msnap_check_invariants(msnap_allocator_t *a, char *msg,
                                     size_t msg_len);

/* ------------------------------------------------------------------------
 * Pinned host memory (PyTorch's CachingHostAllocator): blocks of the
 * runtime's host_malloc, request sizes rounded up to a power of two
 * (above pinned_max_round_threshold, to a multiple of 2 MiB), cached by
 * size and reused once freed and their record_stream events completed.
 * Thread safe (one host lock).  With history on and record_host, the
 * blocks appear in host_segments and their events in host_traces.
 * Behaviour details and the alloc-conf keys honoured: src/alloc/host.c.
 * ------------------------------------------------------------------------ */
/* size 0 gives *ptr = 0.  MSNAP_EOOM when the runtime has no pinned memory
 * left, and for a size too large to round up to a block size (SIZE_MAX;
 * nothing is recorded), as msnap_malloc gives MSNAP_EOOM for 1 EB and
 * more: torch's CachingHostAllocator passes such a size to cudaHostAlloc,
 * which fails with out of memory.  MSNAP_EINVAL for a NULL a or ptr;
 * MSNAP_ENOTSUP when the runtime has no host allocation calls. */
MSNAP_API int msnap_host_malloc(msnap_allocator_t *a, size_t size,
                                uint64_t *ptr);
/* 0 is a no-op; anything but a live host block gives MSNAP_EBADPTR
 * ("invalid pinned host pointer: 0x...") and changes nothing. */
MSNAP_API int msnap_host_free(msnap_allocator_t *a, uint64_t ptr);
/* The live host block at ptr is used on `stream`: its reuse after free
 * waits for the work queued on stream so far (one event per stream). */
MSNAP_API int msnap_host_record_stream(msnap_allocator_t *a, uint64_t ptr,
                                       uint64_t stream);
/* Return every cached (free, no pending event) host block to the runtime. */
MSNAP_API int msnap_host_empty_cache(msnap_allocator_t *a);
/* Host stats in msnap_stats_t (out->size/version set by the caller).
 * segment/reserved_bytes: blocks owned (torch "allocations"/
 * "allocated_bytes"); allocation/allocated_bytes/requested_bytes: blocks
 * held by callers; active/active_bytes: held or waiting for events (torch
 * "active_requests"/"active_bytes"); num_device_alloc/num_device_free:
 * runtime host_malloc/host_free calls (torch num_host_alloc/free).  The
 * SMALL_POOL entries equal ALL (host segments are "small"); LARGE_POOL
 * and the other fields are 0. */
MSNAP_API int msnap_host_stats_get(msnap_allocator_t *a, msnap_stats_t *out);
MSNAP_API int msnap_host_reset_peak_stats(msnap_allocator_t *a);
MSNAP_API int msnap_host_reset_accumulated_stats(msnap_allocator_t *a);
/* Time spent in the runtime's host_malloc / host_free (microseconds),
 * torch's host_alloc_time / host_free_time.  min is 0 until the first
 * call; reset_peak zeroes min and max, reset_accumulated total and
 * count. */
typedef struct msnap_duration_stat_s {
  int64_t total, max, min, count;
} msnap_duration_stat_t;
MSNAP_API int msnap_host_timing_get(msnap_allocator_t *a,
                                    msnap_duration_stat_t *alloc_time,
                                    msnap_duration_stat_t *free_time);

/* ------------------------------------------------------------------------
 * Memory history (torch.cuda.memory._record_memory_history).
 * ------------------------------------------------------------------------ */
#define MSNAP_ACTION_MAP(XX)                                                  \
  XX(ALLOC, "alloc")                                                          \
  XX(FREE_REQUESTED, "free_requested")                                        \
  XX(FREE_COMPLETED, "free_completed")                                        \
  XX(SEGMENT_ALLOC, "segment_alloc")                                          \
  XX(SEGMENT_FREE, "segment_free")                                            \
  XX(SEGMENT_MAP, "segment_map")                                              \
  XX(SEGMENT_UNMAP, "segment_unmap")                                          \
  XX(SNAPSHOT, "snapshot")                                                    \
  XX(OOM, "oom")                                                              \
  XX(ANNOTATE, "annotate")                                                    \
  XX(WORKSPACE_SNAPSHOT, "workspace_snapshot")

typedef enum msnap_action_e {
#define MSNAP_ACTION_ENUM_(name, str) MSNAP_ACTION_##name,
  MSNAP_ACTION_MAP(MSNAP_ACTION_ENUM_)
#undef MSNAP_ACTION_ENUM_
  MSNAP_ACTION_COUNT
} msnap_action_t;

/* "alloc" etc.; NULL for an out-of-range value. */
MSNAP_API const char *msnap_action_name(int action);
/* Parse an action name; MSNAP_EINVAL for unknown names. */
MSNAP_API int msnap_action_parse(const char *name, msnap_action_t *out);

typedef enum msnap_record_context_e {
  MSNAP_CONTEXT_NEVER = 0, /* context=None    */
  MSNAP_CONTEXT_STATE = 1, /* context="state" */
  MSNAP_CONTEXT_ALLOC = 2, /* context="alloc" */
  MSNAP_CONTEXT_ALL = 3    /* context="all"   */
} msnap_record_context_t;

enum { MSNAP_STACKS_PYTHON = 1u, MSNAP_STACKS_CPP = 2u };

typedef struct msnap_history_options_s {
  uint32_t size, version;
  bool enabled;                   /* enabled != None                       */
  msnap_record_context_t context; /* who gets a stack (cuda-reference §4.3) */
  unsigned stacks;                /* MSNAP_STACKS_* bits: PYTHON, CPP, or
                                   * both ("all"); 0 (no frames) only with
                                   * context NEVER, else MSNAP_EINVAL      */
  uint64_t max_entries;           /* ring capacity, clamped to >= 1         */
  bool clear_history;
  bool compile_context;
  bool global_record_annotations;
  uint32_t skip_actions;          /* bit (1u << MSNAP_ACTION_x) = skip      */
  bool record_device;             /* record_cuda                           */
  bool record_host;               /* record_pinned_host_memory             */
} msnap_history_options_t;
#define MSNAP_HISTORY_OPTIONS_VERSION 1
/* Defaults of _record_memory_history_impl: enabled, context all, stacks
 * python|cpp, max_entries UINT64_MAX, record_device. */
MSNAP_API void msnap_history_options_init(msnap_history_options_t *o);
/* recordHistory on every device (cuda-reference §4.1 order of effects). */
MSNAP_API int msnap_record_history(msnap_allocator_t *a,
                                   const msnap_history_options_t *o);
MSNAP_API bool msnap_history_enabled(msnap_allocator_t *a);

/* Python (or other interpreter) frames.  The extension installs a hook:
 * capture() writes up to max raw frames of the calling thread, innermost
 * first, each two words (e.g. code object, instruction offset), and returns
 * how many; it runs outside the allocator lock.  retain/release are called
 * when a raw frame is first interned / finally dropped.  resolve() is called
 * once per unique frame at snapshot time and fills name/filename (copied by
 * the library) and line.
 *
 * capture_token (optional, NULL: capture is used) is capture that also
 * names what it wrote: *token 0 names nothing; any other value promises
 * that every capture returning that token, on any thread, gives the
 * same count of the same frames -- so the library recognises a repeated
 * stack by the token instead of comparing its frames.  A hook never
 * reuses a token for other frames (a 64-bit counter bumped whenever the
 * frames it stands for may change).  On entry *token is 0 or a token the
 * library already holds the frames of: a capture that returns that token
 * may leave the frames unwritten (the count is still returned).
 * Initialise the struct with a designated initializer (or zero it) so
 * members a hook does not set are NULL. */
typedef struct msnap_frame_hook_s {
  void *ctx;
  int (*capture)(void *ctx, uintptr_t (*frames)[2], int max);
  void (*retain)(void *ctx, const uintptr_t frame[2]);
  void (*release)(void *ctx, const uintptr_t frame[2]);
  int (*resolve)(void *ctx, const uintptr_t frame[2], const char **name,
                 const char **filename, int64_t *line);
  int (*capture_token)(void *ctx, uintptr_t (*frames)[2], int max,
                       uint64_t *token);
} msnap_frame_hook_t;
/* Install (or remove with NULL) the process-wide interpreter frame hook. */
MSNAP_API int msnap_set_frame_hook(const msnap_frame_hook_t *hook);

/* Thread-local user metadata copied into user_metadata of later trace
 * entries of this thread (_set_memory_metadata); "" clears. */
MSNAP_API int msnap_set_memory_metadata(const char *metadata);
MSNAP_API const char *msnap_get_memory_metadata(void);
/* record an `annotate` trace entry on the live allocation at ptr
 * (_annotate_memory): its user_metadata is `metadata` ("" for none; the
 * thread's msnap_set_memory_metadata text is not used), recorded only
 * while history is on.  MSNAP_EINVAL for a NULL a or metadata (the Python
 * binding takes a str only); MSNAP_EBADPTR ("annotateMemory: no live
 * allocation found at pointer 0x...") if ptr is not a live base pointer,
 * history on or off; MSNAP_ENOMEM, nothing recorded, when host memory for
 * the metadata text runs out. */
MSNAP_API int msnap_annotate_memory(msnap_allocator_t *a, uint64_t ptr,
                                    const char *metadata);
/* record_function START/END markers for external_annotations; device -1
 * (none) or a device of a; MSNAP_EINVAL for another. */
MSNAP_API int msnap_record_annotation(msnap_allocator_t *a, int device,
                                      const char *name, bool is_start);
/* Thread-local compile-context stack ("Torch-Compiled Region..."). */
MSNAP_API int msnap_compile_context_push(const char *name);
MSNAP_API int msnap_compile_context_pop(void);
/* Frames recorded for the live allocation at ptr (_allocation_traceback):
 * *out is a pickled list of frame dicts (protocol 4), NULL with len 0 when
 * the allocation has no recorded stack (history off or context None when
 * it was made); owned by the caller.  MSNAP_EBADPTR ("allocation_traceback:
 * no live allocation found at pointer 0x...") when ptr is not a live base
 * pointer of a, as msnap_annotate_memory; torch's _allocation_traceback
 * returns None for such a pointer, and so does the Python package's. */
MSNAP_API int msnap_allocation_traceback(msnap_allocator_t *a, uint64_t ptr,
                                         char **out, size_t *len);

/* ------------------------------------------------------------------------
 * Snapshots (torch.cuda.memory._snapshot / _dump_snapshot).
 * ------------------------------------------------------------------------ */
typedef struct msnap_snapshot_options_s {
  uint32_t size, version;
  int device;                  /* -1: every device                       */
  msnap_mempool_id_t mempool;  /* {0,0}: every pool                      */
  bool include_traces;         /* false: no trace copying at all         */
  bool segments_only;          /* memory_snapshot(): list of segments    */
} msnap_snapshot_options_t;
#define MSNAP_SNAPSHOT_OPTIONS_VERSION 1
MSNAP_API void msnap_snapshot_options_init(msnap_snapshot_options_t *o);

/* Pickle (protocol 4, the MemoryViz opcode subset) of the snapshot dict,
 * in memory; *out owned by the caller (msnap_free_string). */
MSNAP_API int msnap_snapshot_pickle(msnap_allocator_t *a,
                                    const msnap_snapshot_options_t *o,
                                    char **out, size_t *len);
/* Write the snapshot to `path` via a temporary file in the same directory
 * and rename(2): a crash never leaves a truncated file.  MSNAP_EIO /
 * MSNAP_ENOSPC on write failures (the temporary file is removed).  Every
 * file the library writes (this, msnap_write_file, the usage report, the
 * OOM dump) follows the kernel's protected_symlinks rule: a symbolic link
 * in a sticky world-writable directory (/tmp) is followed only when it
 * belongs to the user or to the directory's owner, else MSNAP_EIO with
 * msnap_last_errno() EACCES and nothing is written; a replaced file keeps
 * its permission bits; a device, FIFO or /dev/stdout is written directly;
 * temporaries that killed processes of this host left in the directory
 * ("<name>.tmp.<tag>.<pid>.<n>") are removed first.  An empty path is
 * MSNAP_EIO with msnap_last_errno() ENOENT, as open(2) takes it; a NULL
 * path MSNAP_EINVAL. */
MSNAP_API int msnap_dump_snapshot(msnap_allocator_t *a,
                                  const msnap_snapshot_options_t *o,
                                  const char *path);
/* Write `len` bytes to `path` as msnap_dump_snapshot writes its file
 * (same rules and errors). */
MSNAP_API int msnap_write_file(const char *path, const void *data,
                               size_t len);
/* Check, before any work, that `path` can be written by
 * msnap_write_file / msnap_dump_snapshot: it is resolved as the write
 * resolves it (the protected_symlinks rule, a dangling link, a name ending
 * in '/', every directory on the way), a directory is refused, a new or
 * regular file needs a directory that takes a new file (the write's
 * temporary is created there and removed at once: access(2) lets root
 * pass where the creation fails, in /proc or on a read-only file system),
 * a device or FIFO must be writable itself.  Nothing is left behind.
 * 0, or the error the write would give (MSNAP_EIO with msnap_last_errno():
 * EACCES for a refused link, ENOENT for a dangling one, EISDIR...).  What
 * only the write can tell (a full disk) is not checked. */
MSNAP_API int msnap_check_output(const char *path);

/* The process's place in a distributed job, recorded in every snapshot's
 * `process_info` (a top-level key memory_viz ignores) and in OOM dump
 * names: global rank, world size, local rank, each -1 = unknown (then the
 * RANK / WORLD_SIZE / LOCAL_RANK environment variables are used).  The
 * Python package calls it from torch.distributed once the default process
 * group exists.  MSNAP_EINVAL for a value below -1, a world size of 0,
 * or a rank or local rank not below a known world size (torchrun's
 * LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE); nothing is changed then. */
MSNAP_API int msnap_set_process_rank(int rank, int world_size,
                                     int local_rank);

/* OOM observers (_attach_out_of_memory_observer): called as
 * fn(device, alloc_size, device_allowed_or_total, device_free, arg) after
 * the oom trace entry and outside the allocator lock, before the error is
 * returned. */
typedef void (*msnap_oom_observer_cb)(int device, uint64_t alloc_size,
                                      uint64_t device_total,
                                      uint64_t device_free, void *arg);
MSNAP_API int msnap_attach_oom_observer(msnap_allocator_t *a,
                                        msnap_oom_observer_cb cb, void *arg);

/* A framework reports the text of a failed device call (torch_npu:
 * NPU_CHECK_ERROR, the task queue's error paths).  When it is CANN's OOM
 * (torch_npu isCannOOM: contains "EL0004" or "Failed to allocate") the
 * OOM_SNAPSHOT_ENABLE dump runs (user observers do not) and 1 is
 * returned; otherwise 0.  memsnap calls it itself when aclrtMallocHost
 * fails that way.  MSNAP_EINVAL for a bad device or NULL. */
MSNAP_API int msnap_notify_device_error(msnap_allocator_t *a, int device,
                                        const char *message);

/* torch_npu saveDevMemUsageInfo: CANN's per-module memory usage of
 * `device` (aclrtGetMemUsageInfo) as CSV, header
 * "moduleName,curMemSize(MB),memPeakSize(MB)", sizes in MiB with 4
 * decimals, at most 128 rows, written atomically to
 * <dir>/device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv (local time).  dir
 * NULL: OOM_SNAPSHOT_PATH, else "." (torch_npu's GetOomSnapshotDumpPath).
 * *path (optional) receives the file's path (free with
 * msnap_free_string).  MSNAP_ENOTSUP when the runtime has no
 * aclrtGetMemUsageInfo (older CANN, sim, cuda): nothing is written;
 * MSNAP_EIO when dir is not a directory or the write fails. */
MSNAP_API int msnap_save_dev_mem_usage_info(msnap_allocator_t *a, int device,
                                            const char *dir, char **path);
/* The usage CSV files a dump writes (what _dump_snapshot does in the npu
 * profile after the pickle, and the OOM_SNAPSHOT dump), as
 * MEMSNAP_USAGE_REPORT selects: "cann" (default) CANN's report as
 * msnap_save_dev_mem_usage_info; "memsnap" memsnap's statistics report
 * (msnap_write_usage_report's columns) as
 * device_<dev>_memsnapUsage_<stamp>.csv; "both"; "none".  Returns the
 * result of CANN's report when it was wanted (MSNAP_ENOTSUP: the caller
 * may fall back to torch_npu's profiler), else 0 or the error. */
MSNAP_API int msnap_dump_usage_reports(msnap_allocator_t *a, int device,
                                       const char *dir);

/* Device memory-usage report (CSV, one row per device and pool) written to
 * `path` atomically. */
MSNAP_API int msnap_write_usage_report(msnap_allocator_t *a,
                                       const char *path);

/* ------------------------------------------------------------------------
 * NPU workspace allocator (torch_npu NPUWorkspaceAllocator): one grow-only
 * buffer per stream.
 * ------------------------------------------------------------------------ */
MSNAP_API int msnap_workspace_malloc(msnap_allocator_t *a, int device,
                                     size_t size, uint64_t stream,
                                     uint64_t *ptr);
MSNAP_API int msnap_workspace_free(msnap_allocator_t *a, uint64_t ptr);
MSNAP_API int msnap_workspace_empty_cache(msnap_allocator_t *a, int device);

/* ------------------------------------------------------------------------
 * Simulated runtime controls (tests, replay).  ctx is msnap_runtime_ctx()
 * of an allocator on the sim runtime.
 * ------------------------------------------------------------------------ */
/* Events complete at once (default) or only when msnap_sim_complete_events
 * is called. */
MSNAP_API void msnap_sim_set_manual_events(void *ctx, bool manual);
/* Complete every event recorded on `stream` so far (all streams if
 * all_streams). */
MSNAP_API void msnap_sim_complete_events(void *ctx, uint64_t stream,
                                         bool all_streams);
/* Fault switch: the nth runtime call from now (1 = the next one) fails; 0
 * disarms.  `call` restricts it to one call site name ("malloc", "free",
 * "event_create", "event_record", "event_query", "vmm_reserve", "vmm_map",
 * "vmm_unmap", ...) or NULL for any. */
MSNAP_API void msnap_sim_fail_nth(void *ctx, const char *call, uint64_t nth);
/* Force the next device malloc on `device` to return `address` (replay
 * placement): a 512-aligned address whose range is free, else that malloc
 * fails with MSNAP_EINVAL.  The override holds until a device malloc of a
 * nonzero size uses it; `address` 0 cancels it. */
MSNAP_API void msnap_sim_set_next_address(void *ctx, int device,
                                          uint64_t address);
/* Live runtime allocations and handles (leak checks). */
MSNAP_API uint64_t msnap_sim_live_allocations(void *ctx);
/* True when ctx is a host-backed sim context (its device addresses are
 * host memory the process can read and write). */
MSNAP_API bool msnap_sim_host_backed(void *ctx);

/* ------------------------------------------------------------------------
 * Pluggable-allocator entry points (torch.cuda.memory.CUDAPluggableAllocator
 * and torch_npu NPUPluggableAllocator load these names from libmemsnap.so).
 * They use msnap_default().
 * ------------------------------------------------------------------------ */
/* The device address, or NULL with the reason in msnap_last_error(): a
 * negative size or a device that is not one of the allocator's
 * ("plugin_malloc: invalid ..."), an allocator that could not be created,
 * or msnap_malloc's error (the OOM message).  size 0 on a valid device
 * returns NULL without an error.  Neither torch loader checks for NULL
 * (src/api/plugin.c: memsnap.torch.use_allocator registers the C++
 * shim's allocation function, which raises OutOfMemoryError). */
MSNAP_API void *msnap_plugin_malloc(ssize_t size, int device, void *stream);
MSNAP_API void msnap_plugin_free(void *ptr, ssize_t size, int device,
                                 void *stream);
MSNAP_API void msnap_plugin_init(int device_count);
MSNAP_API void msnap_plugin_empty_cache(void);
MSNAP_API void msnap_plugin_reset(bool check_error);
MSNAP_API void msnap_plugin_memory_fraction(double fraction, int device);
MSNAP_API void msnap_plugin_record_stream(void *ptr, void *stream);
MSNAP_API void msnap_plugin_erase_stream(void *ptr, void *stream);
MSNAP_API void *msnap_plugin_get_base_allocation(void *ptr, size_t *size);

#ifdef __cplusplus
}
#endif
#endif /* MEMSNAP_H */
