/*
 * history.c (alloc layer) -- memory history of one allocator: the public
 * torch.cuda.memory._record_memory_history API (msnap_record_history),
 * _annotate_memory, _record_annotation, and the entry points the
 * allocator's files and the api layer's snapshots use.
 *
 * The pieces are record-layer types embedded in the allocator (alloc.h):
 * a->hist (device settings), one msnap_ring_t per device (d->ring, under
 * that device's lock), a->host_hist and the host ring (host.c, under the
 * host lock), a->ann (annotation ring, own lock).  Nothing is created
 * lazily: they exist from allocator creation, off and empty.
 *
 * record_history follows cuda-reference §4.1 on every device, in order:
 * enabled flag, skip set (replaced on every call), ring capacity
 * max(1, max_entries) without clearing, context level, then clear the
 * ring when disabling or clear_history.  The annotation ring follows the
 * same rules.  Each device's ring is changed under its device lock, the
 * host ring under the host lock (never together).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"
#include "alloc/host.h"
#include "record/stack.h"

/* ---- what the allocator and snapshots use --------------------------------- */

bool msnap__history_active(const msnap_allocator_t *a) {
  return msnap__hsettings_on(&a->hist);
}

void msnap__history_record_locked(msnap_allocator_t *a, int device,
                                  msnap_action_t action, uint64_t addr,
                                  uint64_t size, uint64_t stream,
                                  msnap_mempool_id_t pool,
                                  const msnap_rctx_t *ctx,
                                  uint32_t stack_override) {
  if (device < 0 || device >= a->ndevices) return;
  msnap_device_t *d = &a->devices[device];
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  msnap__ring_record(&d->ring, &a->hist, action, addr, size, stream, pool,
                     ctx, stack_override);
}

int msnap__history_copy_locked(msnap_allocator_t *a, int device,
                               msnap_hcopy_t *out, uint64_t *dropped,
                               uint64_t *capacity) {
  msnap_device_t *d = &a->devices[device];
  MSNAP_ASSERT_DEVICE_LOCKED(d);
  int rc = msnap__ring_copy(&d->ring, out);
  if (rc != 0) return rc;
  *dropped = d->ring.dropped;
  *capacity = d->ring.capacity;
  return 0;
}

uint64_t msnap__history_max_entries(msnap_allocator_t *a) {
  return atomic_load(&a->hist_max_entries);
}

uint32_t msnap__history_skip(const msnap_allocator_t *a) {
  return msnap__hsettings_on(&a->hist)
             ? atomic_load_explicit(&a->hist.skip, memory_order_relaxed)
             : 0;
}

bool msnap__host_history_active(const msnap_allocator_t *a) {
  return msnap__hsettings_on(&a->host_hist);
}

int msnap__annotations_copy(msnap_allocator_t *a, msnap_aentry_t **out,
                            size_t *n) {
  return msnap__ann_copy(&a->ann, out, n);
}

/* ---- configuration -------------------------------------------------------- */

void msnap_history_options_init(msnap_history_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_HISTORY_OPTIONS_VERSION;
  o->enabled = true;
  o->context = MSNAP_CONTEXT_ALL;
  o->stacks = MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP;
  o->max_entries = UINT64_MAX;
  o->record_device = true;
}

int msnap_record_history(msnap_allocator_t *a,
                         const msnap_history_options_t *o) {
  if (a == NULL || o == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_history: NULL allocator or options");
  if (o->size < sizeof *o || o->version != MSNAP_HISTORY_OPTIONS_VERSION)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_history: options size %u / version %u "
                            "not supported (use msnap_history_options_init)",
                            o->size, o->version);
  if (o->record_host && !o->enabled)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_pinned_host_memory requires memory "
                            "history recording to be enabled");
  if ((unsigned)o->context > MSNAP_CONTEXT_ALL)
    return msnap__set_error(MSNAP_EINVAL,
                            "expected context to be 'state', 'alloc', 'all', "
                            "or None (got %d)", (int)o->context);
  if ((o->stacks & ~(unsigned)(MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP)) ||
      (o->enabled && o->context != MSNAP_CONTEXT_NEVER &&
       o->stacks == 0))
    return msnap__set_error(MSNAP_EINVAL,
                            "expected stacks to be 'python', or 'all' "
                            "(MSNAP_STACKS_PYTHON and/or MSNAP_STACKS_CPP; 0 "
                            "only with context None) (got bits 0x%x)",
                            o->stacks);
  if (o->skip_actions >> MSNAP_ACTION_COUNT)
    return msnap__set_error(MSNAP_EINVAL,
                            "Unknown TraceEntry action: bit 0x%x",
                            o->skip_actions);
  msnap_hsettings_t *hs = &a->hist, *hh = &a->host_hist;
  bool hon = o->enabled && o->record_host;
  if (hon || atomic_load(&hh->enabled)) {
    /* Create the host allocator state now: once it exists taking its lock
     * cannot fail, so nothing below fails half-way. */
    int hrc = msnap__host_lock(a);
    if (hrc != 0) return hrc;
    msnap__host_unlock(a);
  }
  msnap__clock_init();

  bool on = o->enabled && o->record_device;
  uint64_t cap = o->max_entries ? o->max_entries : 1;
  int level = on ? (int)o->context : MSNAP_CONTEXT_NEVER;
  unsigned stacks = on && o->context != MSNAP_CONTEXT_NEVER ? o->stacks : 0;
  for (int d = 0; d < a->ndevices; d++) {
    msnap__device_lock(a, d);
    if (d == 0) {
      atomic_store(&hs->enabled, on);
      atomic_store(&hs->skip, o->skip_actions);
      atomic_store(&hs->stacks, stacks);
    }
    msnap_ring_t *ring = &a->devices[d].ring;
    msnap__ring_set_capacity(ring, cap);
    if (d == 0) atomic_store(&hs->level, level);
    if (!on || o->clear_history) msnap__ring_clear(ring);
    msnap__device_unlock(a, d);
  }
  if (a->ndevices == 0) {
    atomic_store(&hs->enabled, on);
    atomic_store(&hs->skip, o->skip_actions);
    atomic_store(&hs->stacks, stacks);
    atomic_store(&hs->level, level);
  }

  /* Pinned host memory (cuda-reference §4.2 (d)): on when enabled and
   * record_host, whatever record_device says; otherwise turned off (ring
   * cleared) if it was on.  The host ring records with the same skip
   * set. */
  if (hon || atomic_load(&hh->enabled)) {
    (void)msnap__host_lock(a); /* state exists: cannot fail */
    msnap_ring_t *ring = msnap__host_ring_locked(a);
    atomic_store(&hh->enabled, hon);
    atomic_store(&hh->skip, o->skip_actions);
    atomic_store(&hh->stacks,
                 hon && o->context != MSNAP_CONTEXT_NEVER ? o->stacks : 0u);
    msnap__ring_set_capacity(ring, cap);
    atomic_store(&hh->level, hon ? (int)o->context : MSNAP_CONTEXT_NEVER);
    if (!hon || o->clear_history) msnap__ring_clear(ring);
    msnap__host_unlock(a);
  }

  atomic_store(&a->hist_max_entries, cap);
  msnap__ann_configure(&a->ann, cap, !on || o->clear_history);
  return 0;
}

bool msnap_history_enabled(msnap_allocator_t *a) {
  return a != NULL && msnap__history_active(a);
}

/* ---- annotations ---------------------------------------------------------- */

int msnap_record_annotation(msnap_allocator_t *a, int device,
                            const char *name, bool is_start) {
  if (a == NULL || name == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_annotation: NULL allocator or name");
  if (device < -1 || device >= a->ndevices)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_annotation: invalid device %d (-1 or "
                            "0..%d)", device, a->ndevices - 1);
  if (!msnap__history_active(a)) return 0;
  return msnap__ann_record(&a->ann, device, name, is_start);
}

/*
 * _annotate_memory(ptr, text): an `annotate` entry on the live allocation
 * whose base pointer is ptr (size = its requested size, user_metadata =
 * text, "" for none, replacing the thread's _set_memory_metadata text;
 * the annotation site's stack at level >= ALLOC).  The arguments and the
 * pointer are checked even when history is off.  A NULL text is
 * MSNAP_EINVAL, as record_annotation's NULL name: the Python binding
 * always passes a str (None is its TypeError).
 */
int msnap_annotate_memory(msnap_allocator_t *a, uint64_t ptr,
                          const char *metadata) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "annotateMemory: NULL allocator");
  if (metadata == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "annotateMemory: NULL metadata (\"\" for none)");
  int device = -1;
  uint64_t req = 0, stream = 0;
  msnap_mempool_id_t pool = {0, 0};
  uint32_t bstack = 0;
  int rc = msnap__allocation_info(a, ptr, &device, &req, &stream, &pool,
                                  &bstack);
  if (rc != 0)
    return msnap__set_error(MSNAP_EBADPTR,
                            "annotateMemory: no live allocation found at "
                            "pointer 0x%" PRIx64, ptr);
  msnap__stack_unref(bstack); /* allocation_info hands out a reference */
  if (!msnap__history_active(a)) return 0;
  msnap_rctx_t ctx;
  uint32_t meta = msnap__str_intern(metadata, strlen(metadata));
  if (meta == 0 && metadata[0] != '\0')
    return msnap__set_error(MSNAP_ENOMEM, "annotateMemory: out of host "
                            "memory storing the metadata");
  msnap__rctx_capture(&a->hist, &ctx, false);
  msnap__rctx_set_metadata(&ctx, meta);
  msnap__device_lock(a, device);
  msnap__history_record_locked(a, device, MSNAP_ACTION_ANNOTATE, ptr, req,
                               stream, pool, &ctx, 0);
  msnap__device_unlock(a, device);
  msnap__rctx_release(&ctx);
  return 0;
}
