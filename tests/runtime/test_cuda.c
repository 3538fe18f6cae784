/*
 * test_cuda.c -- the "cuda" runtime (src/runtime/cuda.c) through the fake
 * libcudart.so / libcuda.so of tests/fakes.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api.h"
#include "runtime/runtime.h"

#define MiB ((uint64_t)1 << 20)
#define CAP (256 * MiB)

static const msnap_runtime_ops_t *ops;
static long (*control)(const char *, long);
static long (*driver_control)(const char *, long);
static int (*fake_set_device)(int);
static void *rt_lib, *drv_lib;

static int setup(void **state) {
  (void)state;
  const char *rt = getenv("MEMSNAP_CUDA_LIBRARY");
  const char *drv = getenv("MEMSNAP_CUDA_DRIVER_LIBRARY");
  if (rt == NULL || drv == NULL) {
    fprintf(stderr, "MEMSNAP_CUDA_LIBRARY / MEMSNAP_CUDA_DRIVER_LIBRARY are "
                    "not set: run through meson test\n");
    return -1;
  }
  rt_lib = dlopen(rt, RTLD_NOW);
  drv_lib = dlopen(drv, RTLD_NOW);
  if (rt_lib == NULL || drv_lib == NULL) return -1;
  *(void **)&control = dlsym(rt_lib, "fake_cuda_control");
  *(void **)&fake_set_device = dlsym(rt_lib, "cudaSetDevice");
  *(void **)&driver_control = dlsym(drv_lib, "fake_cuda_driver_control");
  ops = msnap_runtime_cuda();
  return control && fake_set_device && driver_control ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (drv_lib != NULL) dlclose(drv_lib);
  if (rt_lib != NULL) dlclose(rt_lib);
  return 0;
}

static void *open_rt(void) {
  void *ctx = NULL;
  int rc = ops->init(&ctx);
  if (rc != 0) fail_msg("cuda init: %s", msnap_last_error());
  return ctx;
}

static void test_missing_library(void **state) {
  (void)state;
  char *saved = strdup(getenv("MEMSNAP_CUDA_LIBRARY"));
  void *ctx = (void *)0x1;
  setenv("MEMSNAP_CUDA_LIBRARY", "/nonexistent/libcudart.so", 1);
  assert_int_equal(ops->init(&ctx), MSNAP_ENORUNTIME);
  assert_ptr_equal(ctx, (void *)0x1);
  assert_non_null(strstr(msnap_last_error(), "/nonexistent/libcudart.so"));
  assert_non_null(strstr(msnap_last_error(), "MEMSNAP_CUDA_LIBRARY"));
  setenv("MEMSNAP_CUDA_LIBRARY", getenv("MEMSNAP_ACL_LIBRARY"), 1);
  assert_int_equal(ops->init(&ctx), MSNAP_ENORUNTIME);
  assert_non_null(strstr(msnap_last_error(), "has no symbol cudaSetDevice"));
  setenv("MEMSNAP_CUDA_LIBRARY", saved, 1);
  free(saved);
}

static void test_memory(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  int n = 0;
  assert_int_equal(ops->device_count(ctx, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(fake_set_device(0), 0);
  uint64_t p = 0;
  assert_int_equal(ops->malloc(ctx, 1, 2 * MiB, &p), 0);
  assert_int_equal(control("current_device", 0), 0); /* restored */
  memset((void *)(uintptr_t)p, 7, 2 * MiB);
  assert_int_equal(control("used", 1), 2 * MiB);
  size_t f, t;
  assert_int_equal(ops->mem_get_info(ctx, 1, &f, &t), 0);
  assert_int_equal(f, CAP - 2 * MiB);
  assert_int_equal(t, CAP);
  /* OOM: EOOM, sticky error cleared (cudaGetLastError). */
  uint64_t q = 11;
  assert_int_equal(ops->malloc(ctx, 1, CAP, &q), MSNAP_EOOM);
  assert_int_equal(q, 11);
  assert_non_null(strstr(msnap_last_error(), "out of device memory"));
  assert_int_equal(control("last_error", 0), 0);
  control("fail_next", 719);
  assert_int_equal(ops->malloc(ctx, 0, 512, &q), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "719"));
  assert_int_equal(ops->free(ctx, 1, p + 512), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "cudaFree"));
  assert_int_equal(ops->free(ctx, 1, p), 0);
  assert_int_equal(ops->malloc(ctx, 9, 512, &q), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "cudaSetDevice"));
  uint64_t h;
  assert_int_equal(ops->host_malloc(ctx, 100, &h), 0);
  memset((void *)(uintptr_t)h, 1, 100);
  assert_int_equal(ops->host_free(ctx, h), 0);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
}

static void test_events(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  uint64_t e1;
  bool done = false;
  assert_int_equal(ops->event_create(ctx, 1, &e1), 0);
  assert_int_equal(ops->event_record(ctx, 1, e1, 0), 0);
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), 0);
  assert_true(done);
  control("pending_events", 1);
  assert_int_equal(ops->event_record(ctx, 1, e1, 0x77), 0);
  /* cudaErrorNotReady is "not done", not an error. */
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), 0);
  assert_false(done);
  assert_int_equal(ops->device_synchronize(ctx, 1), 0);
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_record(ctx, 1, e1, 0x77), 0);
  assert_int_equal(ops->event_synchronize(ctx, 1, e1), 0);
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), 0);
  assert_true(done);
  control("pending_events", 0);
  control("fail_next", 400);
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "cudaEventQuery"));
  assert_int_equal(ops->event_destroy(ctx, 1, e1), 0);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
}

static void test_vmm(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  uint64_t va, h1, h2, h3 = 5;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 200 * MiB, 0, &va), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va, 20 * MiB, &h1), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va + 20 * MiB, 2 * MiB, &h2), 0);
  memset((void *)(uintptr_t)va, 3, 22 * MiB);
  assert_int_equal(control("used", 0), 22 * MiB);
  /* cudaMalloc and cuMemCreate share the capacity. */
  uint64_t p, q = 8;
  assert_int_equal(ops->malloc(ctx, 0, 200 * MiB, &p), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va + 22 * MiB, 40 * MiB, &h3),
                   MSNAP_EOOM);
  assert_non_null(strstr(msnap_last_error(), "cuMemCreate"));
  assert_int_equal(ops->malloc(ctx, 0, 40 * MiB, &q), MSNAP_EOOM);
  assert_int_equal(q, 8);
  assert_int_equal(ops->free(ctx, 0, p), 0);
  /* A failing cuMemMap releases the handle it created. */
  driver_control("fail_next", 0); /* cuMemCreate succeeds... */
  assert_int_equal(ops->vmm_map(ctx, 0, va + 198 * MiB, 4 * MiB, &h3),
                   MSNAP_ERUNTIME); /* ...outside the reservation */
  assert_non_null(strstr(msnap_last_error(), "cuMemMap"));
  assert_int_equal(h3, 5);
  assert_int_equal(control("used", 0), 22 * MiB);
  driver_control("fail_next", 801);
  assert_int_equal(ops->vmm_reserve(ctx, 0, 20 * MiB, 0, &h3), MSNAP_ENOTSUP);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va, 20 * MiB, h1), 0);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va + 20 * MiB, 2 * MiB, h2), 0);
  assert_int_equal(control("used", 0), 0);
  assert_int_equal(ops->vmm_release(ctx, 0, va, 200 * MiB), 0);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
}

static void test_no_driver(void **state) {
  (void)state;
  char *saved = strdup(getenv("MEMSNAP_CUDA_DRIVER_LIBRARY"));
  setenv("MEMSNAP_CUDA_DRIVER_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  void *ctx = open_rt();
  uint64_t va = 1;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 20 * MiB, 0, &va), MSNAP_ENOTSUP);
  assert_int_equal(va, 1);
  assert_non_null(strstr(msnap_last_error(), "MEMSNAP_CUDA_DRIVER_LIBRARY"));
  assert_non_null(strstr(msnap_last_error(), "/nonexistent/libcuda.so.1"));
  uint64_t p;
  assert_int_equal(ops->malloc(ctx, 0, 512, &p), 0);
  assert_int_equal(ops->free(ctx, 0, p), 0);
  ops->fini(ctx);
  /* A driver library without the cuMem* symbols. */
  setenv("MEMSNAP_CUDA_DRIVER_LIBRARY", getenv("MEMSNAP_ACL_LIBRARY"), 1);
  ctx = open_rt();
  assert_int_equal(ops->vmm_map(ctx, 0, 0x200000, 2 * MiB, &va), MSNAP_ENOTSUP);
  assert_non_null(strstr(msnap_last_error(), "has no symbol cuInit"));
  ops->fini(ctx);
  setenv("MEMSNAP_CUDA_DRIVER_LIBRARY", saved, 1);
  free(saved);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_vmm),
      cmocka_unit_test(test_no_driver),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
