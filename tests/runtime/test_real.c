/*
 * test_real.c -- smoke test of the acl and cuda runtimes against the REAL
 * vendor libraries (libascendcl.so / libcudart.so + libcuda.so found by the
 * loader, or MEMSNAP_REAL_ACL_LIBRARY / MEMSNAP_REAL_CUDA_LIBRARY).  On a
 * machine without an NPU or GPU it prints why and exits 77 (meson's SKIP);
 * it never passes silently.
 *
 * Per runtime with at least one device: device_count, mem_get_info,
 * malloc(2 MiB) lowers the free bytes, free, an event recorded on the
 * default stream completes after event_synchronize, and (when the VMM API
 * exists) reserve / map 2 MiB / unmap / release.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "runtime/runtime.h"

#define MiB ((uint64_t)1 << 20)

static int failures;

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: FAILED: %s (last error: %s)\n", __FILE__,       \
              __LINE__, #cond, msnap_last_error());                           \
      failures++;                                                             \
    }                                                                         \
  } while (0)

/* 1 = ran, 0 = skipped. */
static int smoke(const char *name, const char *env, const char *real) {
  const msnap_runtime_ops_t *ops = msnap_runtime_by_name(name);
  if (real != NULL && *real) setenv(env, real, 1);
  else unsetenv(env);
  void *ctx = NULL;
  int rc = ops->init(&ctx);
  if (rc != 0) {
    printf("SKIP %s: %s\n", name, msnap_last_error());
    return 0;
  }
  int n = 0;
  rc = ops->device_count(ctx, &n);
  if (rc != 0 || n < 1) {
    printf("SKIP %s: no device (%s)\n", name,
           rc ? msnap_last_error() : "device_count is 0");
    ops->fini(ctx);
    return 0;
  }
  size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0;
  EXPECT(ops->mem_get_info(ctx, 0, &f0, &t0) == 0 && t0 > 0 && f0 <= t0);
  uint64_t p = 0;
  EXPECT(ops->malloc(ctx, 0, 64 * MiB, &p) == 0 && p != 0);
  EXPECT(ops->mem_get_info(ctx, 0, &f1, &t1) == 0 && t1 == t0);
  EXPECT(f1 < f0);
  EXPECT(ops->free(ctx, 0, p) == 0);
  uint64_t ev = 0;
  bool done = false;
  EXPECT(ops->event_create(ctx, 0, &ev) == 0);
  EXPECT(ops->event_record(ctx, 0, ev, 0) == 0);
  EXPECT(ops->event_synchronize(ctx, 0, ev) == 0);
  EXPECT(ops->event_query(ctx, 0, ev, &done) == 0 && done);
  EXPECT(ops->event_destroy(ctx, 0, ev) == 0);
  EXPECT(ops->device_synchronize(ctx, 0) == 0);
  uint64_t va = 0, h = 0;
  rc = ops->vmm_reserve(ctx, 0, 64 * MiB, 0, &va);
  if (rc == MSNAP_ENOTSUP) {
    printf("note %s: no VMM API (%s)\n", name, msnap_last_error());
  } else {
    EXPECT(rc == 0);
    EXPECT(ops->vmm_map(ctx, 0, va, 2 * MiB, &h) == 0);
    EXPECT(ops->vmm_unmap(ctx, 0, va, 2 * MiB, h) == 0);
    EXPECT(ops->vmm_release(ctx, 0, va, 64 * MiB) == 0);
  }
  uint64_t hp = 0;
  if (ops->host_malloc(ctx, 4096, &hp) == 0) {
    memset((void *)(uintptr_t)hp, 0, 4096);
    EXPECT(ops->host_free(ctx, hp) == 0);
  }
  printf("ran %s: %d device(s), %zu bytes total on device 0\n", name, n, t0);
  ops->fini(ctx);
  return 1;
}

int main(void) {
  int ran = smoke("acl", "MEMSNAP_ACL_LIBRARY",
                  getenv("MEMSNAP_REAL_ACL_LIBRARY"));
  ran += smoke("cuda", "MEMSNAP_CUDA_LIBRARY",
               getenv("MEMSNAP_REAL_CUDA_LIBRARY"));
  if (failures) return 1;
  if (ran == 0) {
    printf("SKIP: neither a real ACL nor a real CUDA runtime is usable here "
           "(this is expected on CPU-only machines)\n");
    return 77;
  }
  return 0;
}
