/*
 * test_acl.c -- the "acl" runtime (src/runtime/acl.c) through the fake
 * libascendcl.so of tests/fakes (paths come from the test environment).
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
static int (*fake_set_device)(int32_t);
static void *fake_lib;

static int setup(void **state) {
  (void)state;
  const char *path = getenv("MEMSNAP_ACL_LIBRARY");
  if (path == NULL) {
    fprintf(stderr, "MEMSNAP_ACL_LIBRARY is not set: run through meson test\n");
    return -1;
  }
  fake_lib = dlopen(path, RTLD_NOW);
  if (fake_lib == NULL) return -1;
  *(void **)&control = dlsym(fake_lib, "fake_acl_control");
  *(void **)&fake_set_device = dlsym(fake_lib, "aclrtSetDevice");
  ops = msnap_runtime_acl();
  return control && fake_set_device ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (fake_lib != NULL) dlclose(fake_lib);
  return 0;
}

static void *open_rt(void) {
  void *ctx = NULL;
  int rc = ops->init(&ctx);
  if (rc != 0) fail_msg("acl init: %s", msnap_last_error());
  return ctx;
}

static void test_missing_library(void **state) {
  (void)state;
  char *saved = strdup(getenv("MEMSNAP_ACL_LIBRARY"));
  void *ctx = (void *)0x1;
  setenv("MEMSNAP_ACL_LIBRARY", "/nonexistent/libascendcl.so", 1);
  assert_int_equal(ops->init(&ctx), MSNAP_ENORUNTIME);
  assert_ptr_equal(ctx, (void *)0x1);
  assert_non_null(strstr(msnap_last_error(), "/nonexistent/libascendcl.so"));
  assert_non_null(strstr(msnap_last_error(), "MEMSNAP_ACL_LIBRARY"));
  /* A library without the ACL symbols. */
  setenv("MEMSNAP_ACL_LIBRARY", getenv("MEMSNAP_CUDA_LIBRARY"), 1);
  assert_int_equal(ops->init(&ctx), MSNAP_ENORUNTIME);
  assert_non_null(strstr(msnap_last_error(), "has no symbol aclrtSetDevice"));
  /* By name through msnap_runtime_by_name too. */
  assert_ptr_equal(msnap_runtime_by_name("npu"), ops);
  setenv("MEMSNAP_ACL_LIBRARY", saved, 1);
  free(saved);
}

static void test_memory(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  assert_true(control("init_calls", 0) >= 1);
  int n = 0;
  assert_int_equal(ops->device_count(ctx, &n), 0);
  assert_int_equal(n, 2);
  /* The caller's device is restored around every call. */
  assert_int_equal(fake_set_device(0), 0);
  uint64_t p = 0;
  assert_int_equal(ops->malloc(ctx, 1, 4096, &p), 0);
  assert_int_not_equal(p, 0);
  assert_int_equal(control("current_device", 0), 0);
  memset((void *)(uintptr_t)p, 0xab, 4096); /* real memory behind it */
  assert_int_equal(control("used", 1), 4096);
  assert_int_equal(control("used", 0), 0);
  size_t f = 0, t = 0;
  assert_int_equal(ops->mem_get_info(ctx, 1, &f, &t), 0);
  assert_int_equal(t, CAP);
  assert_int_equal(f, CAP - 4096);
  assert_int_equal(ops->mem_get_info(ctx, 0, &f, &t), 0);
  assert_int_equal(f, CAP);
  /* size 0: no call, address 0. */
  uint64_t z = 5;
  assert_int_equal(ops->malloc(ctx, 0, 0, &z), 0);
  assert_int_equal(z, 0);
  assert_int_equal(ops->free(ctx, 0, 0), 0);
  /* OOM maps to MSNAP_EOOM; the out-param is untouched. */
  uint64_t q = 77;
  assert_int_equal(ops->malloc(ctx, 1, CAP, &q), MSNAP_EOOM);
  assert_int_equal(q, 77);
  assert_non_null(strstr(msnap_last_error(), "out of device memory"));
  assert_non_null(strstr(msnap_last_error(), "207001"));
  /* Other errors: MSNAP_ERUNTIME naming the call and code. */
  control("fail_next", 507899);
  assert_int_equal(ops->malloc(ctx, 0, 512, &q), MSNAP_ERUNTIME);
  assert_int_equal(q, 77);
  assert_non_null(strstr(msnap_last_error(), "507899"));
  control("fail_next", 207001);
  assert_int_equal(ops->mem_get_info(ctx, 0, &f, &t), MSNAP_EOOM);
  assert_int_equal(ops->free(ctx, 1, p + 8), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "aclrtFree"));
  assert_int_equal(ops->free(ctx, 1, p), 0);
  assert_int_equal(control("used", 1), 0);
  /* Bad device. */
  assert_int_equal(ops->malloc(ctx, 5, 512, &q), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "aclrtSetDevice"));
  /* Host memory. */
  uint64_t h = 0;
  assert_int_equal(ops->host_malloc(ctx, 1000, &h), 0);
  memset((void *)(uintptr_t)h, 1, 1000);
  assert_int_equal(ops->host_free(ctx, h), 0);
  assert_int_equal(ops->host_free(ctx, h), MSNAP_ERUNTIME);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
  /* A second init meets "repeat initialize" from aclInit: fine. */
  ctx = open_rt();
  assert_true(control("init_calls", 0) >= 2);
  ops->fini(ctx);
}

static void test_events(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  uint64_t e1 = 0, e2 = 0;
  bool done = false;
  assert_int_equal(ops->event_create(ctx, 0, &e1), 0);
  assert_int_equal(ops->event_create(ctx, 1, &e2), 0);
  assert_int_equal(ops->event_record(ctx, 0, e1, 0), 0);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  control("pending_events", 1);
  assert_int_equal(ops->event_record(ctx, 0, e1, 0), 0);
  assert_int_equal(ops->event_record(ctx, 1, e2, 0x1234), 0);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_false(done);
  assert_int_equal(ops->event_synchronize(ctx, 0, e1), 0);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_query(ctx, 1, e2, &done), 0);
  assert_false(done);
  assert_int_equal(ops->device_synchronize(ctx, 1), 0);
  assert_int_equal(ops->event_query(ctx, 1, e2, &done), 0);
  assert_true(done);
  control("pending_events", 0);
  control("fail_next", 107000);
  assert_int_equal(ops->event_record(ctx, 0, e1, 0), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "aclrtRecordEvent"));
  assert_int_equal(ops->event_destroy(ctx, 0, e1), 0);
  assert_int_equal(ops->event_destroy(ctx, 1, e2), 0);
  assert_int_equal(ops->event_destroy(ctx, 1, e2), MSNAP_ERUNTIME);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
}

static void test_vmm(void **state) {
  (void)state;
  long live0 = control("live", 0);
  void *ctx = open_rt();
  uint64_t va = 0, h1 = 0, h2 = 0, h3 = 9;
  assert_int_equal(ops->vmm_reserve(ctx, 1, 400 * MiB, 2 * MiB, &va), 0);
  assert_int_equal(va % (2 * MiB), 0);
  assert_int_equal(ops->vmm_map(ctx, 1, va, 20 * MiB, &h1), 0);
  assert_int_equal(ops->vmm_map(ctx, 1, va + 20 * MiB, 20 * MiB, &h2), 0);
  /* Mapped memory is usable. */
  memset((void *)(uintptr_t)(va + 20 * MiB - 8), 0x5a, 16);
  assert_int_equal(control("used", 1), 40 * MiB);
  size_t f, t;
  assert_int_equal(ops->mem_get_info(ctx, 1, &f, &t), 0);
  assert_int_equal(f, CAP - 40 * MiB);
  /* Physical memory beyond capacity: EOOM, nothing left behind. */
  assert_int_equal(ops->vmm_map(ctx, 1, va + 40 * MiB, 240 * MiB, &h3),
                   MSNAP_EOOM);
  assert_int_equal(h3, 9);
  assert_non_null(strstr(msnap_last_error(), "aclrtMallocPhysical"));
  /* A failing map frees the physical allocation it made. */
  assert_int_equal(ops->vmm_map(ctx, 1, va + 390 * MiB, 20 * MiB, &h3),
                   MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "aclrtMapMem"));
  assert_int_equal(control("used", 1), 40 * MiB);
  /* Release while mapped fails, then the orderly teardown. */
  assert_int_equal(ops->vmm_release(ctx, 1, va, 400 * MiB), MSNAP_ERUNTIME);
  assert_int_equal(ops->vmm_unmap(ctx, 1, va, 20 * MiB, h1), 0);
  assert_int_equal(ops->vmm_unmap(ctx, 1, va + 20 * MiB, 20 * MiB, h2), 0);
  assert_int_equal(ops->vmm_unmap(ctx, 1, va, 20 * MiB, h1), MSNAP_ERUNTIME);
  assert_int_equal(control("used", 1), 0);
  assert_int_equal(ops->vmm_release(ctx, 1, va, 400 * MiB), 0);
  /* Feature-not-supported code maps to MSNAP_ENOTSUP. */
  control("fail_next", 207000);
  assert_int_equal(ops->vmm_reserve(ctx, 0, 20 * MiB, 0, &va), MSNAP_ENOTSUP);
  assert_int_equal(control("live", 0), live0);
  ops->fini(ctx);
}

static void test_vmm_missing(void **state) {
  (void)state;
  char *saved = strdup(getenv("MEMSNAP_ACL_LIBRARY"));
  setenv("MEMSNAP_ACL_LIBRARY", getenv("FAKE_ACL_NOVMM_LIBRARY"), 1);
  void *ctx = open_rt();
  uint64_t va = 3, h = 4;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 20 * MiB, 0, &va), MSNAP_ENOTSUP);
  assert_non_null(strstr(msnap_last_error(), "virtual memory API"));
  assert_int_equal(ops->vmm_map(ctx, 0, 0x1000000, 20 * MiB, &h),
                   MSNAP_ENOTSUP);
  assert_int_equal(ops->vmm_unmap(ctx, 0, 0x1000000, 20 * MiB, 1),
                   MSNAP_ENOTSUP);
  assert_int_equal(ops->vmm_release(ctx, 0, 0x1000000, 20 * MiB),
                   MSNAP_ENOTSUP);
  assert_int_equal(va, 3);
  assert_int_equal(h, 4);
  /* Plain memory still works. */
  uint64_t p;
  assert_int_equal(ops->malloc(ctx, 0, 512, &p), 0);
  assert_int_equal(ops->free(ctx, 0, p), 0);
  ops->fini(ctx);
  setenv("MEMSNAP_ACL_LIBRARY", saved, 1);
  free(saved);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_vmm),
      cmocka_unit_test(test_vmm_missing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
