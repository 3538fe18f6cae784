/*
 * plugin.c -- the pluggable-allocator entry points of libmemsnap.so.
 *
 * torch.cuda.memory.CUDAPluggableAllocator(path, alloc_fn_name,
 * free_fn_name) and torch_npu's NPUPluggableAllocator dlopen a shared
 * library and look up two functions by name:
 *
 *   void *alloc(ssize_t size, int device, stream_t stream);
 *   void  free(void *ptr, ssize_t size, int device, stream_t stream);
 *
 * plus optional hooks set through the allocator object (set_init_fn,
 * set_reset_fn, set_memory_fraction_fn, set_base_alloc_fn,
 * set_record_stream_fn, torch_npu's set_erase_stream_fn...).  These are
 * msnap_plugin_* below; every one works on msnap_default(), the
 * process-wide allocator that the _memsnap Python module uses too, so
 * memsnap.memory sees the allocations torch makes.
 *
 * These C functions cannot raise: msnap_plugin_malloc returns NULL on any
 * failure (after memsnap recorded the `oom` trace entry, ran the OOM
 * observers and, with OOM_SNAPSHOT_ENABLE, wrote the OOM dump), and
 * neither loader checks for NULL: torch_npu's NPUPluggableAllocator builds
 * a DataPtr on nullptr (a device fault later) and PyTorch's
 * CUDAPluggableAllocator raises no OutOfMemoryError
 * (pytorch/pytorch#133280).  memsnap.torch.use_allocator() therefore
 * registers msnap_torch_malloc of the C++ shim (python/memsnap/csrc/),
 * which throws c10::OutOfMemoryError, and these functions serve C and
 * ctypes callers, which find the reason of a NULL in msnap_last_error().
 * Likewise torch_npu versions whose record_stream_fn takes a
 * c10_npu::NPUStream (a class passed by invisible reference) need the
 * shim's msnap_npu_record_stream; msnap_plugin_record_stream takes the
 * stream handle itself (cudaStream_t, aclrtStream).  The other hooks keep
 * the error text in msnap_last_error() and print it to stderr, so that a
 * bad pointer never passes silently.
 *
 * No state lives here: beyond msnap_plugin_malloc's own argument checks
 * (so that its error names it), the checks are the allocator's.
 */
#include "api/api.h"

#include <stdio.h>

/* Print a failing hook's error (the library's text names the pointer). */
static void report(const char *hook, int rc) {
  const char *text = msnap_last_error();
  fprintf(stderr, "memsnap: %s failed: %s\n", hook,
          text != NULL && text[0] != '\0' ? text : msnap_strerror(rc));
}

/*
 * msnap_plugin_malloc -- alloc_fn.  Returns the device address, or NULL
 * with the reason in msnap_last_error(): "plugin_malloc: invalid size"
 * for size < 0, "plugin_malloc: invalid device" for a device that is not
 * one of the allocator's, "plugin_malloc: allocator could not be created:
 * " and msnap_default_error()'s text, else msnap_malloc's text (the OOM
 * message included).  size 0 on a valid device returns NULL without
 * allocator work and without an error (as msnap_malloc).
 */
void *msnap_plugin_malloc(ssize_t size, int device, void *stream) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL) {
    const char *e = msnap_default_error();
    msnap__set_error(MSNAP_ESTATE,
                     "plugin_malloc: allocator could not be created: %s",
                     e != NULL && e[0] != '\0' ? e : "unknown error");
    return NULL;
  }
  if (size < 0) {
    msnap__set_error(MSNAP_EINVAL,
                     "plugin_malloc: invalid size %zd (must be >= 0)", size);
    return NULL;
  }
  int n = msnap_device_count(a);
  if (device < 0 || device >= n) {
    msnap__set_error(MSNAP_EINVAL,
                     "plugin_malloc: invalid device %d (0..%d)", device,
                     n - 1);
    return NULL;
  }
  uint64_t ptr = 0;
  int rc = msnap_malloc(a, device, (size_t)size, (uint64_t)(uintptr_t)stream,
                        &ptr);
  if (rc < 0)
    return NULL;
  return (void *)(uintptr_t)ptr;
}

/*
 * msnap_plugin_free -- free_fn.  size/device/stream are what the loader
 * remembers of the allocation; the allocator knows them already, so they
 * are not used.  NULL is a no-op.  An unknown pointer is reported.
 */
void msnap_plugin_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)size;
  (void)device;
  (void)stream;
  if (ptr == NULL)
    return;
  msnap_allocator_t *a = msnap_default();
  if (a == NULL)
    return;
  int rc = msnap_free(a, (uint64_t)(uintptr_t)ptr);
  if (rc < 0)
    report("free", rc);
}

/*
 * msnap_plugin_init -- init_fn(device_count): create the allocator now
 * (torch_npu passes the current device index here, not a count; the
 * argument is therefore ignored and the runtime is asked instead).
 */
void msnap_plugin_init(int device_count) {
  (void)device_count;
  if (msnap_default() == NULL) {
    const char *e = msnap_default_error();
    fprintf(stderr, "memsnap: allocator could not be created: %s\n",
            e != NULL ? e : "unknown error");
  }
}

/* msnap_plugin_empty_cache -- CUDAPluggableAllocator's reset_fn():
 * empty_cache on every device. */
void msnap_plugin_empty_cache(void) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL)
    return;
  int rc = msnap_empty_cache(a, -1);
  if (rc < 0)
    report("empty_cache", rc);
}

/* msnap_plugin_reset -- torch_npu's reset_fn(check_error) (emptyCache):
 * empty_cache on every device; an error is printed either way (a hook
 * cannot raise). */
void msnap_plugin_reset(bool check_error) {
  (void)check_error;
  msnap_plugin_empty_cache();
}

/* msnap_plugin_memory_fraction -- memory_fraction_fn(fraction, device). */
void msnap_plugin_memory_fraction(double fraction, int device) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL)
    return;
  int rc = msnap_set_memory_fraction(a, device, fraction);
  if (rc < 0)
    report("memory_fraction", rc);
}

/* msnap_plugin_record_stream -- record_stream_fn(ptr, stream). */
void msnap_plugin_record_stream(void *ptr, void *stream) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL || ptr == NULL)
    return;
  int rc = msnap_record_stream(a, (uint64_t)(uintptr_t)ptr,
                               (uint64_t)(uintptr_t)stream);
  if (rc < 0)
    report("record_stream", rc);
}

/* msnap_plugin_erase_stream -- erase_stream_fn(ptr, stream) of the
 * torch_npu versions that pass the aclrtStream itself. */
void msnap_plugin_erase_stream(void *ptr, void *stream) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL || ptr == NULL)
    return;
  int rc = msnap_erase_stream(a, (uint64_t)(uintptr_t)ptr,
                              (uint64_t)(uintptr_t)stream);
  if (rc < 0)
    report("erase_stream", rc);
}

/*
 * msnap_plugin_get_base_allocation -- base_alloc_fn(ptr, &size), PyTorch's
 * getBaseAllocation: for a live allocation, the start of its segment and
 * the segment's size in *size (the whole reservation for expandable
 * segments); otherwise NULL and *size = 0 (interior pointers are not
 * resolved).
 */
void *msnap_plugin_get_base_allocation(void *ptr, size_t *size) {
  msnap_allocator_t *a = msnap_default();
  uint64_t base = 0, sz = 0;
  if (a == NULL || ptr == NULL ||
      msnap__allocation_base(a, (uint64_t)(uintptr_t)ptr, &base, &sz) < 0) {
    if (size != NULL)
      *size = 0;
    return NULL;
  }
  if (size != NULL)
    *size = (size_t)sz;
  return (void *)(uintptr_t)base;
}
