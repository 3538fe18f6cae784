/*
 * allocator.h -- what the alloc layer offers the layers above it (api,
 * tools) and the tests, beyond the public msnap_* functions: the device
 * lock, live-allocation lookups, snapshot collection, the history rings
 * and the workspace buffers as seen by a snapshot, the OOM observer list,
 * and allocator creation without the api layer's additions.  The
 * allocator's own types and module-private helpers are in alloc.h and
 * alloc_core.h; the pinned host allocator's in host.h; the conf in conf.h.
 *
 * The alloc layer calls record, runtime, model and base, never api: the
 * OOM auto-dump (api/oom_dump.c) is an observer registered at creation,
 * and files are written through base/sink.c.
 */
#ifndef MSNAP_ALLOCATOR_H
#define MSNAP_ALLOCATOR_H

#include "alloc/conf.h"
#include "base/base.h"
#include "model/snapshot.h"
#include "record/history.h"

/* ---- size constants (allocator-algorithm.md §1; also the CLI's replay) -- */
#define MSNAP_MIN_BLOCK_SIZE 512ull
#define MSNAP_SMALL_SIZE 1048576ull       /* kSmallSize                    */
#define MSNAP_SMALL_BUFFER 2097152ull     /* kSmallBuffer                  */
#define MSNAP_MIN_LARGE_ALLOC 10485760ull /* kMinLargeAlloc                */
#define MSNAP_ROUND_LARGE 2097152ull      /* kRoundLarge                   */
#define MSNAP_EXTRA_LARGE_BUFFER 1073741824ull /* npu page_size:1g         */
#define MSNAP_ONE_EB (1ull << 60)         /* allocate() guard              */
#define MSNAP_NPU_PAD 32ull               /* AddPadSize()                  */
#define MSNAP_LAZY_QUERY_SIZE 512u        /* kLazyQuerySize (npu)          */
#define MSNAP_MIB 1048576ull

/* get_allocation_size (allocator-algorithm.md §3.3): the segment a
 * rounded request `size` asks the device for under conf c (kSmallBuffer,
 * c->large_segment_size below kMinLargeAlloc, else rounded up to
 * kRoundLarge); npu page_size:1g rounds large-pool segments further
 * (msnap_malloc).  alloc.c; also the CLI's OOM explanation. */
uint64_t msnap__allocation_size(const msnap_conf_t *c, uint64_t size);

/* ---- create.c ------------------------------------------------------------ */
/* msnap_allocator_create without what the api layer adds (the OOM
 * auto-dump observer): profile, runtime, conf, caching switch, devices. */
int msnap__allocator_new(const msnap_options_t *opts, msnap_allocator_t **out);

/* A device's per-process cap (set_per_process_memory_fraction or the
 * conf's per_process_memory_fraction: allowed_memory_maximum) now, and at
 * its newest recorded oom trace entry (raw clock time of that entry): the
 * fraction may change after an OOM.  MSNAP_EINVAL for a bad device. */
typedef struct msnap_cap_info_s {
  bool capped;
  uint64_t allowed;
  bool have_oom;
  uint64_t oom_raw_time;
  bool oom_capped;
  uint64_t oom_allowed;
} msnap_cap_info_t;
int msnap__cap_info(msnap_allocator_t *a, int device, msnap_cap_info_t *out);
/* The profile an allocator on runtime rt gets when neither the options
 * nor MEMSNAP_PROFILE name one: acl -> npu, cuda and sim -> cuda. */
msnap_profile_t msnap__runtime_profile(const msnap_runtime_ops_t *rt);

/* ---- alloc.c ------------------------------------------------------------- */
/* Lock/unlock one device's allocator (MSNAP_RANK_DEVICE, sub = device). */
void msnap__device_lock(msnap_allocator_t *a, int device);
void msnap__device_unlock(msnap_allocator_t *a, int device);
/* Live allocation lookup (annotate, traceback): block stack id (with one
 * reference for the caller) and requested size; caller holds no lock. */
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

/* ---- check.c ------------------------------------------------------------- */
/* Append the device's segments (sorted by address; expandable segments one
 * per contiguous mapped range) and their blocks to `out`, filtered by pool
 * ({0,0} = every pool).  Stack fields hold RAW recorder stack ids (with a
 * reference taken each) -- the api layer converts them after the lock is
 * released.  Caller holds the device lock.  Returns the total active
 * bytes of the reported segments (the `snapshot` entry's size) in
 * *active_bytes. */
int msnap__device_collect_segments_locked(msnap_allocator_t *a, int device,
                                          msnap_mempool_id_t pool,
                                          msnap_snap_t *out,
                                          uint64_t *active_bytes);

/* ---- history.c: memory history of the allocator --------------------------- */
/* True when device history is on: the only check on the hot path when
 * recording is off. */
bool msnap__history_active(const msnap_allocator_t *a);
/* Append a trace entry to device's ring (record/ring.c rules).  The
 * caller holds the device lock. */
void msnap__history_record_locked(msnap_allocator_t *a, int device,
                                  msnap_action_t action, uint64_t addr,
                                  uint64_t size, uint64_t stream,
                                  msnap_mempool_id_t pool,
                                  const msnap_rctx_t *ctx,
                                  uint32_t stack_override);
/* Copy device's ring (record/ring.c, msnap__ring_copy) with its overflow
 * count and capacity.  Caller holds the device lock. */
int msnap__history_copy_locked(msnap_allocator_t *a, int device,
                               msnap_hcopy_t *out, uint64_t *dropped,
                               uint64_t *capacity);
/* The ring capacity last set by msnap_record_history (0: never called). */
uint64_t msnap__history_max_entries(msnap_allocator_t *a);
/* The device history's skip set (1u << action; 0 when history is off). */
uint32_t msnap__history_skip(const msnap_allocator_t *a);
/* True when pinned host history is on. */
bool msnap__host_history_active(const msnap_allocator_t *a);
/* Copy the annotation ring (names with a reference each). */
int msnap__annotations_copy(msnap_allocator_t *a, msnap_aentry_t **out,
                            size_t *n);

/* ---- workspace.c ---------------------------------------------------------- */
/* A workspace buffer as seen by a snapshot. */
typedef struct msnap_ws_info_s {
  uint64_t stream, ptr, size, requested;
  uint64_t raw_created;
  bool allocated;
} msnap_ws_info_t;
/* Copy the device's live workspace buffers (sorted by address). */
int msnap__ws_collect(msnap_allocator_t *a, int device,
                      msnap_ws_info_t **out, size_t *n);
/* Reserved/allocated workspace bytes of a device (-1: all). */
void msnap__ws_totals(msnap_allocator_t *a, int device, uint64_t *reserved,
                      uint64_t *allocated);
/* Workspace invariants (tests): 0 or MSNAP_ESTATE with msg. */
int msnap__ws_check(msnap_allocator_t *a, char *msg, size_t len);

/* The bytes the npu profile adds to every request (torch_npu AddPadSize,
 * alloc/pad.c); 0 in the cuda profile. */
uint64_t msnap__npu_pad(const msnap_allocator_t *a);

/* ---- oom.c: OOM observers and the usage report ----------------------------- */
/* Called by the allocator after an allocation failed for good (after the
 * `oom` trace entry), with no library lock held: every observer in
 * attachment order. */
void msnap__oom_notify(msnap_allocator_t *a, int device, uint64_t alloc_size,
                       uint64_t device_total, uint64_t device_free);
/* Attach an observer owned by the library: `release(arg)` runs when the
 * allocator is destroyed.  With unique, an observer with the same cb is
 * not attached twice (returns 1).  With on_device_error it also runs on
 * device errors CANN reports as OOM (msnap__oom_notify_device_error).
 * 0, 1 or MSNAP_ENOMEM. */
int msnap__oom_observer_add(msnap_allocator_t *a, msnap_oom_observer_cb cb,
                            void *arg, void (*release)(void *arg),
                            bool unique, bool on_device_error);
/* A device call failed with CANN's OOM text (torch_npu isCannOOM, e.g. an
 * operator's allocation): the on_device_error observers run, as
 * torch_npu's NPU_CHECK_ERROR calls oom_observer() before throwing.  No
 * library lock may be held. */
void msnap__oom_notify_device_error(msnap_allocator_t *a, int device);
/* Write the usage-report CSV of one device (-1 = all) to path (atomic). */
int msnap__usage_report(msnap_allocator_t *a, int device, const char *path);
/* CANN's per-module usage CSV text of a device (aclrtGetMemUsageInfo,
 * torch_npu saveDevMemUsageInfo's format), malloc'ed (caller frees);
 * MSNAP_ENOTSUP when the runtime has no such report. */
int msnap__cann_usage_text(msnap_allocator_t *a, int device, char **text,
                           size_t *len);
/* memsnap's report text, malloc'ed (caller frees). */
int msnap__usage_report_text(msnap_allocator_t *a, int device, char **text,
                             size_t *len);

#endif /* MSNAP_ALLOCATOR_H */
