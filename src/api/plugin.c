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
 * set_reset_fn / empty_cache, set_memory_fraction_fn, set_record_stream_fn,
 * set_begin/end_allocate_to_pool..., set_get_base_allocation_fn).  These
 * are msnap_plugin_* below; every one works on msnap_default(), the
 * process-wide allocator that the _memsnap Python module uses too, so
 * memsnap.memory sees the allocations torch makes.
 *
 * The loaders give no way to report an error: malloc returns NULL on any
 * failure (torch then raises its own OutOfMemoryError; memsnap has already
 * recorded the `oom` trace entry, run the OOM observers and, with
 * OOM_SNAPSHOT_ENABLE, written the OOM dump); the other hooks keep the
 * error text in msnap_last_error() and print it once to stderr, so that a
 * bad pointer never passes silently.
 *
 * No state lives here: nothing to check beyond what the allocator checks.
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
 * msnap_plugin_malloc -- alloc_fn.  size < 0 is refused; size 0 returns
 * NULL without allocator work (as msnap_malloc).  Returns the device
 * address, or NULL when the allocator could not be created or the device
 * is out of memory.
 */
void *msnap_plugin_malloc(ssize_t size, int device, void *stream) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL || size < 0)
    return NULL;
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

/* msnap_plugin_empty_cache -- reset_fn / empty_cache on every device. */
void msnap_plugin_empty_cache(void) {
  msnap_allocator_t *a = msnap_default();
  if (a == NULL)
    return;
  int rc = msnap_empty_cache(a, -1);
  if (rc < 0)
    report("empty_cache", rc);
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

/*
 * msnap_plugin_get_base_allocation -- get_base_allocation_fn(ptr, &size):
 * for a live base pointer, its block size in *size and ptr itself;
 * otherwise NULL and *size = 0 (interior pointers are not resolved).
 */
void *msnap_plugin_get_base_allocation(void *ptr, size_t *size) {
  msnap_allocator_t *a = msnap_default();
  size_t sz = 0;
  if (a == NULL || ptr == NULL ||
      msnap_allocation_size(a, (uint64_t)(uintptr_t)ptr, &sz) < 0) {
    if (size != NULL)
      *size = 0;
    return NULL;
  }
  if (size != NULL)
    *size = sz;
  return ptr;
}
