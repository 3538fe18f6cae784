/*
 * test_alloc_runtimes.c -- the allocator (msnap_malloc/msnap_free...) over
 * the acl and cuda runtimes, through the fake vendor libraries.  The fake's
 * byte accounting must equal the allocator's reserved memory after every
 * step, and msnap_check_invariants runs after every operation.
 *
 * acl runs the npu profile (32-byte pad), cuda the cuda profile.
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

#include "memsnap.h"

#define MiB ((uint64_t)1 << 20)

typedef struct rt_case_s {
  const char *runtime;
  msnap_profile_t profile;
  const char *lib_env;
  const char *control_sym;
  const char *oom_prefix;
  long (*control)(const char *, long);
  void *lib;
} rt_case_t;

static rt_case_t cases[2] = {
    {"acl", MSNAP_PROFILE_NPU, "MEMSNAP_ACL_LIBRARY", "fake_acl_control",
     "NPU out of memory", NULL, NULL},
    {"cuda", MSNAP_PROFILE_CUDA, "MEMSNAP_CUDA_LIBRARY", "fake_cuda_control",
     "CUDA out of memory", NULL, NULL},
};

#define CHECK(a)                                                              \
  do {                                                                        \
    char m_[512];                                                             \
    if (msnap_check_invariants((a), m_, sizeof m_) != 0)                      \
      fail_msg("allocator invariant: %s", m_);                                \
  } while (0)

static int setup(void **state) {
  for (int i = 0; i < 2; i++) {
    const char *path = getenv(cases[i].lib_env);
    if (path == NULL) return -1;
    cases[i].lib = dlopen(path, RTLD_NOW);
    if (cases[i].lib == NULL) return -1;
    *(void **)&cases[i].control = dlsym(cases[i].lib, cases[i].control_sym);
    if (cases[i].control == NULL) return -1;
  }
  (void)state;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++)
    if (cases[i].lib != NULL) dlclose(cases[i].lib);
  return 0;
}

static msnap_allocator_t *make(const rt_case_t *c, const char *conf,
                               int caching_disabled) {
  msnap_options_t o;
  char err[512] = "";
  msnap_options_init(&o);
  o.profile = (int)c->profile;
  o.runtime_name = c->runtime;
  o.alloc_conf = conf;
  o.caching_disabled = caching_disabled;
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("%s: create: %s (%s)", c->runtime, err,
                        msnap_err_name(rc));
  CHECK(a);
  return a;
}

static uint64_t xmalloc(msnap_allocator_t *a, int dev, size_t size,
                        uint64_t stream) {
  uint64_t p = 0;
  int rc = msnap_malloc(a, dev, size, stream, &p);
  if (rc != 0) fail_msg("malloc(%zu): %s", size, msnap_last_error());
  CHECK(a);
  return p;
}

static void xfree(msnap_allocator_t *a, uint64_t p) {
  int rc = msnap_free(a, p);
  if (rc != 0) fail_msg("free(0x%llx): %s", (unsigned long long)p,
                        msnap_last_error());
  CHECK(a);
}

static void run_basics(rt_case_t *c) {
  long live0 = c->control("live", 0);
  msnap_allocator_t *a = make(c, "", 0);
  assert_int_equal(msnap_device_count(a), 2);
  /* 480 bytes: one 2 MiB small segment. */
  uint64_t p1 = xmalloc(a, 0, 480, 0);
  assert_int_equal(c->control("used", 0), 2 * MiB);
  /* 5 MiB: one 20 MiB large segment. */
  uint64_t p2 = xmalloc(a, 0, 5 * MiB, 0);
  assert_int_equal(c->control("used", 0), 22 * MiB);
  /* 12 MiB: rounded to 2 MiB; with the npu pad (32 bytes) 14 MiB. */
  uint64_t p3 = xmalloc(a, 1, 12 * MiB, 0);
  assert_int_equal(c->control("used", 1),
                   c->profile == MSNAP_PROFILE_NPU ? 14 * MiB : 12 * MiB);
  /* The memory behind the pointers is real host memory in the fake. */
  memset((void *)(uintptr_t)p2, 0x11, 5 * MiB);
  size_t f, t;
  assert_int_equal(msnap_mem_get_info(a, 0, &f, &t), 0);
  assert_int_equal(t, 256 * MiB);
  assert_int_equal(f, 256 * MiB - 22 * MiB);
  xfree(a, p1);
  xfree(a, p2);
  xfree(a, p3);
  /* Cached, not returned. */
  assert_int_equal(c->control("used", 0), 22 * MiB);
  assert_int_equal(msnap_empty_cache(a, -1), 0);
  CHECK(a);
  assert_int_equal(c->control("used", 0), 0);
  assert_int_equal(c->control("used", 1), 0);
  /* OOM through the runtime's OOM code. */
  uint64_t q = 99;
  assert_int_equal(msnap_malloc(a, 0, 300 * MiB, 0, &q), MSNAP_EOOM);
  assert_int_equal(q, 99);
  assert_non_null(strstr(msnap_last_error(), c->oom_prefix));
  CHECK(a);
  assert_int_equal(c->control("used", 0), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(c->control("live", 0), live0);
}

static void run_streams(rt_case_t *c) {
  long live0 = c->control("live", 0);
  msnap_allocator_t *a = make(c, "", 0);
  c->control("pending_events", 1);
  uint64_t x = xmalloc(a, 0, 4 * MiB, 0);
  assert_int_equal(msnap_record_stream(a, x, 0x55), 0);
  CHECK(a);
  xfree(a, x);
  /* The freed block waits for its event: y lands after it. */
  uint64_t y = xmalloc(a, 0, 4 * MiB, 0);
  assert_true(y != x);
  assert_true(c->control("pending_count", 0) >= 1);
  c->control("complete_all", 0);
  /* Once the event completed the block is reused (best fit). */
  uint64_t z = xmalloc(a, 0, 4 * MiB, 0);
  assert_int_equal(z, x);
  c->control("pending_events", 0);
  xfree(a, y);
  xfree(a, z);
  assert_int_equal(msnap_empty_cache(a, -1), 0);
  CHECK(a);
  assert_int_equal(c->control("used", 0), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(c->control("live", 0), live0);
}

static void run_expandable(rt_case_t *c) {
  long live0 = c->control("live", 0);
  msnap_allocator_t *a = make(c, "expandable_segments:True", 0);
  uint64_t p = xmalloc(a, 0, 5 * MiB, 0);
  assert_int_equal(c->control("used", 0), 20 * MiB);
  uint64_t q = xmalloc(a, 0, 25 * MiB, 0);
  assert_int_equal(c->control("used", 0), 40 * MiB);
  memset((void *)(uintptr_t)q, 0x22, 25 * MiB); /* mapped for real */
  xfree(a, p);
  xfree(a, q);
  assert_int_equal(msnap_empty_cache(a, -1), 0);
  CHECK(a);
  assert_int_equal(c->control("used", 0), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(c->control("live", 0), live0);
}

static void run_no_caching(rt_case_t *c) {
  long live0 = c->control("live", 0);
  msnap_allocator_t *a = make(c, "", 1);
  uint64_t p = xmalloc(a, 0, 1000, 0);
  assert_true(c->control("used", 0) >= 1000);
  assert_true(c->control("used", 0) < (long)(2 * MiB));
  xfree(a, p);
  assert_int_equal(c->control("used", 0), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(c->control("live", 0), live0);
}

static void test_acl_basics(void **s) { (void)s; run_basics(&cases[0]); }
static void test_cuda_basics(void **s) { (void)s; run_basics(&cases[1]); }
static void test_acl_streams(void **s) { (void)s; run_streams(&cases[0]); }
static void test_cuda_streams(void **s) { (void)s; run_streams(&cases[1]); }
static void test_acl_expandable(void **s) { (void)s; run_expandable(&cases[0]); }
static void test_cuda_expandable(void **s) {
  (void)s;
  run_expandable(&cases[1]);
}
static void test_acl_no_caching(void **s) { (void)s; run_no_caching(&cases[0]); }
static void test_cuda_no_caching(void **s) {
  (void)s;
  run_no_caching(&cases[1]);
}

/* A missing vendor library: msnap_allocator_create fails with
 * MSNAP_ENORUNTIME, names the runtime and leaves *out untouched. */
static void test_missing_library(void **s) {
  (void)s;
  char *saved = strdup(getenv("MEMSNAP_ACL_LIBRARY"));
  setenv("MEMSNAP_ACL_LIBRARY", "/nonexistent/libascendcl.so", 1);
  msnap_options_t o;
  char err[512] = "";
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_NPU;
  o.runtime_name = "acl";
  o.alloc_conf = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = (msnap_allocator_t *)0x1;
  assert_int_equal(msnap_allocator_create(&o, &a), MSNAP_ENORUNTIME);
  assert_ptr_equal(a, (msnap_allocator_t *)0x1);
  assert_non_null(strstr(err, "acl"));
  setenv("MEMSNAP_ACL_LIBRARY", saved, 1);
  free(saved);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acl_basics),
      cmocka_unit_test(test_cuda_basics),
      cmocka_unit_test(test_acl_streams),
      cmocka_unit_test(test_cuda_streams),
      cmocka_unit_test(test_acl_expandable),
      cmocka_unit_test(test_cuda_expandable),
      cmocka_unit_test(test_acl_no_caching),
      cmocka_unit_test(test_cuda_no_caching),
      cmocka_unit_test(test_missing_library),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
