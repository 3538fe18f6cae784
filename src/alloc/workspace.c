/*
 * workspace.c -- torch_npu's NPUWorkspaceAllocator: scratch memory for
 * kernels, one grow-only buffer per (device, stream).
 *
 * Model (torch-npu-today §3.1):
 *   - a request of n bytes needs n + 32 (pad); if the stream's buffer is
 *     smaller, the device is synchronized, the old buffer is returned to
 *     the runtime and a new one of round_up(n + 32, 2 MiB) bytes is taken
 *     with the raw runtime malloc; otherwise the buffer is reused as is;
 *   - free only marks the buffer unused (stream order makes reuse safe);
 *   - empty_cache synchronizes and returns the unused buffers;
 *   - with caching disabled every request is its own raw runtime
 *     allocation, returned by free.
 *
 * Decisions where torch_npu has quirks (and why):
 *   - `allocated` is tracked honestly: a buffer is active_allocated in a
 *     snapshot between workspace_malloc and workspace_free (torch_npu never
 *     sets it, so its snapshots show inactive blocks with ALLOC entries);
 *   - empty_cache keeps buffers that are still allocated (the caller holds
 *     the pointer) instead of freeing them under it;
 *   - a failed grow releases the caching allocator's free cache of the
 *     device and retries once; a final failure records an `oom` entry in
 *     the device trace and calls the OOM observers (torch_npu does none of
 *     this, so workspace OOMs never produced a dump);
 *   - the workspace is not part of msnap_stats_get (as in torch_npu), but
 *     snapshots report it: every buffer is a large one-block segment in the
 *     default pool, and allocator_settings carries workspace_reserved_bytes
 *     / workspace_allocated_bytes / workspace_segments so that a reader can
 *     reconcile segment sums with memory_stats().
 *
 * Invariants (ws_check): at most one buffer per (device, stream); sizes
 * are multiples of 2 MiB; requested + 32 <= size for allocated buffers.
 * The state lives in the allocator (a->ws, created with it).
 * Locking: ws->lock (MSNAP_RANK_WORKSPACE) is taken alone or inside a
 * device lock (alloc.c's last OOM retry in the npu profile calls
 * msnap_workspace_empty_cache under the device lock; msnap_empty_cache
 * calls it before taking the device lock, after the device sync, as
 * torch_npu's emptyCache).  The order is always device lock, then
 * ws->lock: this file never takes a device lock (nor calls into the
 * caching allocator) while holding ws->lock.
 * tests/recorder/test_workspace_empty runs both paths from several threads
 * (under TSan in make test-threads).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"

#define WS_PAD 32u
#define WS_ROUND (2u << 20)

typedef struct ws_buf_s {
  int device;
  uint64_t stream, ptr, size, requested, raw_created;
  bool allocated;
} ws_buf_t;

typedef struct ws_raw_s {
  int device;
  uint64_t ptr, size;
} ws_raw_t;

typedef struct msnap_workspace_s {
  pthread_mutex_t lock;
  ws_buf_t *v; /* cached buffers */
  uint32_t n, cap;
  ws_raw_t *raw; /* uncached allocations */
  uint32_t nraw, rawcap;
} msnap_workspace_t;

int msnap__ws_create(msnap_allocator_t *a) {
  msnap_workspace_t *ws = calloc(1, sizeof *ws);
  if (ws == NULL) return MSNAP_ENOMEM;
  pthread_mutex_init(&ws->lock, NULL);
  a->ws = ws;
  return 0;
}

static void ws_lock(msnap_workspace_t *ws) {
  msnap__mutex_lock(&ws->lock, MSNAP_RANK_WORKSPACE);
}

static void ws_unlock(msnap_workspace_t *ws) {
  msnap__mutex_unlock(&ws->lock, MSNAP_RANK_WORKSPACE);
}

void msnap__workspace_atfork(msnap_allocator_t *a, int phase) {
  if (a->ws != NULL) msnap__fork_mutex(&a->ws->lock, phase);
}

static ws_buf_t *ws_find(msnap_workspace_t *ws, int device, uint64_t stream) {
  for (uint32_t i = 0; i < ws->n; i++)
    if (ws->v[i].device == device && ws->v[i].stream == stream)
      return &ws->v[i];
  return NULL;
}

static void ws_remove(msnap_workspace_t *ws, ws_buf_t *b) {
  *b = ws->v[--ws->n];
}

/* Record an `oom` entry for a failed workspace grow and notify observers.
 * Called with no lock held. */
static void ws_oom(msnap_allocator_t *a, int device, uint64_t stream,
                   uint64_t size) {
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  void *rctx = msnap_runtime_ctx(a);
  size_t free_b = 0, total_b = 0;
  if (ops->mem_get_info(rctx, device, &free_b, &total_b) != 0)
    free_b = total_b = 0;
  if (msnap__history_active(a)) {
    msnap_rctx_t ctx;
    msnap__rctx_capture(&a->hist, &ctx, false);
    msnap_mempool_id_t pool = {0, 0};
    msnap__device_lock(a, device);
    msnap__history_record_locked(a, device, MSNAP_ACTION_OOM, free_b, size,
                                 stream, pool, &ctx, 0);
    msnap__device_unlock(a, device);
    msnap__rctx_release(&ctx);
  }
  msnap__oom_notify(a, device, size, total_b, free_b);
}

/*
 * Hand out the (device, stream) workspace buffer, growing it to hold size
 * bytes (+ the 32-byte pad).  size 0 gives *ptr = 0.  Errors: MSNAP_EINVAL
 * (bad device), MSNAP_EOOM (message in msnap_last_error), MSNAP_ENOMEM,
 * runtime errors.
 */
int msnap_workspace_malloc(msnap_allocator_t *a, int device, size_t size,
                           uint64_t stream, uint64_t *ptr) {
  if (a == NULL || ptr == NULL)
    return msnap__set_error(MSNAP_EINVAL, "workspace_malloc: NULL argument");
  if (msnap_in_bad_fork(a))
    return msnap__fork_check(a, "workspace_malloc");
  int nd = msnap_device_count(a);
  if (device < 0 || device >= nd)
    return msnap__set_error(MSNAP_EINVAL,
                            "workspace_malloc: device %d out of range "
                            "(%d devices)", device, nd);
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  if (size > UINT64_MAX - WS_ROUND - WS_PAD)
    return msnap__set_error(MSNAP_EOOM,
                            "NPUWorkspaceAllocator tried to allocate %zu "
                            "bytes: too large", size);
  msnap_workspace_t *ws = a->ws;
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  void *rctx = msnap_runtime_ctx(a);
  uint64_t need = (uint64_t)size + WS_PAD;

  if (!msnap_caching_enabled(a)) {
    uint64_t p = 0;
    int rc = ops->malloc(rctx, device, need, &p);
    if (rc != 0) {
      ws_oom(a, device, stream, need);
      return msnap__set_error(rc == MSNAP_EOOM ? MSNAP_EOOM : rc,
                              "NPUWorkspaceAllocator tried to allocate %" PRIu64
                              " bytes on device %d (caching disabled) and "
                              "the runtime failed: %s", need, device,
                              msnap_strerror(rc));
    }
    ws_lock(ws);
    if (MSNAP_GROW(ws->raw, ws->rawcap, ws->nraw + 1) != 0) {
      ws_unlock(ws);
      ops->free(rctx, device, p);
      return MSNAP_ENOMEM;
    }
    ws->raw[ws->nraw++] = (ws_raw_t){device, p, need};
    ws_unlock(ws);
    *ptr = p;
    return 0;
  }

  uint64_t rounded = (need + WS_ROUND - 1) / WS_ROUND * WS_ROUND;
  for (int attempt = 0; attempt < 2; attempt++) {
    ws_lock(ws);
    ws_buf_t *b = ws_find(ws, device, stream);
    if (b != NULL && b->size >= need) {
      b->allocated = true;
      b->requested = size;
      *ptr = b->ptr;
      ws_unlock(ws);
      return 0;
    }
    if (b != NULL) {
      /* Too small: wait for the stream's work, then drop it. */
      ops->device_synchronize(rctx, device);
      ops->free(rctx, device, b->ptr);
      ws_remove(ws, b);
    }
    if (MSNAP_GROW(ws->v, ws->cap, ws->n + 1) != 0) {
      ws_unlock(ws);
      return MSNAP_ENOMEM;
    }
    uint64_t p = 0;
    int rc = ops->malloc(rctx, device, rounded, &p);
    if (rc == 0) {
      ws->v[ws->n++] = (ws_buf_t){device, stream, p, rounded, size,
                                  msnap__clock_raw(), true};
      *ptr = p;
      ws_unlock(ws);
      return 0;
    }
    ws_unlock(ws);
    if (rc != MSNAP_EOOM) return rc;
    /* Out of memory: release the caching allocator's free cache of this
     * device once and retry. */
    if (attempt == 0) (void)msnap_empty_cache(a, device);
  }
  size_t free_b = 0, total_b = 0;
  (void)ops->mem_get_info(rctx, device, &free_b, &total_b);
  ws_oom(a, device, stream, rounded);
  /* torch_npu's words (NPUWorkspaceAllocator.cpp, the allocator's
   * malloc after its one retry): the request, then the device's total
   * and free memory, each as format_size */
  char req[32], tot[32], fre[32];
  msnap__format_size(size, req, sizeof req);
  msnap__format_size(total_b, tot, sizeof tot);
  msnap__format_size(free_b, fre, sizeof fre);
  return msnap__set_error(MSNAP_EOOM,
                          "NPU out of memory. NPUWorkspaceAllocator tried to "
                          "allocate %s(NPU %d; %s total capacity; %s free). "
                          "If you want to reduce memory usage, take a try to "
                          "set the environment variable TASK_QUEUE_ENABLE=1.",
                          req, device, tot, fre);
}

/* Mark the buffer at ptr unused (cached) or return an uncached one.
 * MSNAP_EBADPTR for a pointer that is not a live workspace allocation. */
int msnap_workspace_free(msnap_allocator_t *a, uint64_t ptr) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "workspace_free: NULL allocator");
  if (ptr == 0 || msnap_in_bad_fork(a)) return 0;
  msnap_workspace_t *ws = a->ws;
  ws_lock(ws);
  for (uint32_t i = 0; i < ws->n; i++) {
    if (ws->v[i].ptr == ptr && ws->v[i].allocated) {
      ws->v[i].allocated = false;
      ws_unlock(ws);
      return 0;
    }
  }
  for (uint32_t i = 0; i < ws->nraw; i++) {
    if (ws->raw[i].ptr == ptr) {
      ws_raw_t r = ws->raw[i];
      ws->raw[i] = ws->raw[--ws->nraw];
      ws_unlock(ws);
      const msnap_runtime_ops_t *ops = msnap_runtime(a);
      void *rctx = msnap_runtime_ctx(a);
      ops->device_synchronize(rctx, r.device);
      return ops->free(rctx, r.device, r.ptr);
    }
  }
  ws_unlock(ws);
  return msnap__set_error(MSNAP_EBADPTR,
                          "workspace_free: 0x%" PRIx64 " is not a live "
                          "workspace allocation", ptr);
}

/* Return the unused buffers of device (every device when < 0). */
int msnap_workspace_empty_cache(msnap_allocator_t *a, int device) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "workspace_empty_cache: NULL allocator");
  if (device >= msnap_device_count(a))
    return msnap__set_error(MSNAP_EINVAL,
                            "workspace_empty_cache: invalid device %d",
                            device);
  if (msnap_in_bad_fork(a))
    return msnap__fork_check(a, "workspace_empty_cache");
  msnap_workspace_t *ws = a->ws;
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  void *rctx = msnap_runtime_ctx(a);
  int rc = 0;
  ws_lock(ws);
  bool synced[64] = {false};
  for (uint32_t i = 0; i < ws->n;) {
    ws_buf_t *b = &ws->v[i];
    if ((device >= 0 && b->device != device) || b->allocated) {
      i++;
      continue;
    }
    if (b->device >= 64 || !synced[b->device]) {
      ops->device_synchronize(rctx, b->device);
      if (b->device < 64) synced[b->device] = true;
    }
    int frc = ops->free(rctx, b->device, b->ptr);
    if (frc != 0 && rc == 0) rc = frc;
    ws_remove(ws, b);
  }
  ws_unlock(ws);
  return rc;
}

static int ws_cmp_addr(const void *x, const void *y) {
  const msnap_ws_info_t *a = x, *b = y;
  return a->ptr < b->ptr ? -1 : a->ptr > b->ptr;
}

int msnap__ws_collect(msnap_allocator_t *a, int device, msnap_ws_info_t **out,
                      size_t *n) {
  *out = NULL;
  *n = 0;
  msnap_workspace_t *ws = a->ws;
  ws_lock(ws);
  msnap_ws_info_t *v = ws->n ? malloc(ws->n * sizeof *v) : NULL;
  if (ws->n && v == NULL) {
    ws_unlock(ws);
    return MSNAP_ENOMEM;
  }
  size_t k = 0;
  for (uint32_t i = 0; i < ws->n; i++) {
    const ws_buf_t *b = &ws->v[i];
    if (b->device != device) continue;
    v[k++] = (msnap_ws_info_t){b->stream, b->ptr, b->size, b->requested,
                               b->raw_created, b->allocated};
  }
  ws_unlock(ws);
  if (k > 1) qsort(v, k, sizeof *v, ws_cmp_addr);
  *out = v;
  *n = k;
  return 0;
}

void msnap__ws_totals(msnap_allocator_t *a, int device, uint64_t *reserved,
                      uint64_t *allocated) {
  *reserved = *allocated = 0;
  msnap_workspace_t *ws = a->ws;
  ws_lock(ws);
  for (uint32_t i = 0; i < ws->n; i++) {
    if (device >= 0 && ws->v[i].device != device) continue;
    *reserved += ws->v[i].size;
    if (ws->v[i].allocated) *allocated += ws->v[i].size;
  }
  ws_unlock(ws);
}

/* Invariants (top of file): 0 or MSNAP_ESTATE naming the buffer. */
int msnap__ws_check(msnap_allocator_t *a, char *msg, size_t len) {
  msnap_workspace_t *ws = a->ws;
  int rc = 0;
  ws_lock(ws);
  for (uint32_t i = 0; i < ws->n && rc == 0; i++) {
    const ws_buf_t *b = &ws->v[i];
    const char *bad = NULL;
    if (b->size == 0 || b->size % WS_ROUND != 0)
      bad = "size is not a positive multiple of 2 MiB";
    else if (b->allocated && b->requested + WS_PAD > b->size)
      bad = "requested + pad exceeds the buffer";
    for (uint32_t j = i + 1; bad == NULL && j < ws->n; j++)
      if (ws->v[j].device == b->device && ws->v[j].stream == b->stream)
        bad = "two buffers for one (device, stream)";
    if (bad) {
      if (msg && len)
        snprintf(msg, len, "workspace buffer 0x%" PRIx64 " (device %d, "
                 "stream 0x%" PRIx64 "): %s", b->ptr, b->device, b->stream,
                 bad);
      rc = MSNAP_ESTATE;
    }
  }
  ws_unlock(ws);
  return rc;
}

/* Return every buffer to the runtime (allocator destruction; the runtime
 * must still be alive). */
void msnap__ws_destroy(msnap_allocator_t *a) {
  msnap_workspace_t *ws = a->ws;
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  void *rctx = msnap_runtime_ctx(a);
  for (uint32_t i = 0; i < ws->n; i++)
    ops->free(rctx, ws->v[i].device, ws->v[i].ptr);
  for (uint32_t i = 0; i < ws->nraw; i++)
    ops->free(rctx, ws->raw[i].device, ws->raw[i].ptr);
  free(ws->v);
  free(ws->raw);
  pthread_mutex_destroy(&ws->lock);
  free(ws);
  a->ws = NULL;
}
