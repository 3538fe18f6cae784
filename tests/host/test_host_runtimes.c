/*
 * test_host_runtimes.c -- the pinned host allocator over the acl and cuda
 * runtimes (aclrtMallocHost/aclrtFreeHost, cudaHostAlloc/cudaFreeHost)
 * through the fake vendor libraries of tests/fakes: the blocks are real,
 * writable host memory; reuse waits for pending events; empty_cache and
 * allocator destruction leave no live fake allocation; a failing vendor
 * call leaves the allocator unchanged.  msnap_check_invariants (which
 * includes the host allocator) runs after every operation.
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

typedef struct rt_case_s {
  const char *runtime;
  msnap_profile_t profile;
  const char *lib_env;
  const char *control_sym;
  long (*control)(const char *, long);
  void *lib;
} rt_case_t;

static rt_case_t cases[2] = {
    {"acl", MSNAP_PROFILE_NPU, "MEMSNAP_ACL_LIBRARY", "fake_acl_control",
     NULL, NULL},
    {"cuda", MSNAP_PROFILE_CUDA, "MEMSNAP_CUDA_LIBRARY", "fake_cuda_control",
     NULL, NULL},
};

#define CHECK(a)                                                              \
  do {                                                                        \
    char m_[512];                                                             \
    if (msnap_check_invariants((a), m_, sizeof m_) != 0)                      \
      fail_msg("invariant: %s", m_);                                          \
  } while (0)

static int setup(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    const char *path = getenv(cases[i].lib_env);
    if (path == NULL) return -1;
    cases[i].lib = dlopen(path, RTLD_NOW);
    if (cases[i].lib == NULL) return -1;
    *(void **)&cases[i].control = dlsym(cases[i].lib, cases[i].control_sym);
    if (cases[i].control == NULL) return -1;
  }
  return 0;
}

static msnap_allocator_t *make(const rt_case_t *c) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = c->profile;
  o.runtime_name = c->runtime;
  o.alloc_conf = "";
  o.caching_disabled = 0;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("%s: %s %s", c->runtime, msnap_strerror(rc), err);
  return a;
}

static void run_case(const rt_case_t *c) {
  long live0 = c->control("live", 0);
  msnap_allocator_t *a = make(c);
  uint64_t p = 0, q = 0;
  assert_int_equal(msnap_host_malloc(a, 1000, &p), 0);
  CHECK(a);
  /* Real memory: the whole rounded block is writable. */
  memset((void *)(uintptr_t)p, 0xab, 1024);
  assert_int_equal(((unsigned char *)(uintptr_t)p)[1023], 0xab);
  assert_int_equal(c->control("live", 0), live0 + 1);
  /* An event pending on the stream delays reuse. */
  c->control("pending_events", 1);
  assert_int_equal(msnap_host_record_stream(a, p, 0), 0);
  assert_int_equal(msnap_host_free(a, p), 0);
  CHECK(a);
  assert_int_equal(c->control("pending_count", 0), 1);
  assert_int_equal(msnap_host_malloc(a, 900, &q), 0);
  assert_true(q != p);
  assert_int_equal(msnap_host_free(a, q), 0);
  c->control("complete_all", 0);
  c->control("pending_events", 0);
  uint64_t r = 0;
  assert_int_equal(msnap_host_malloc(a, 1024, &r), 0);
  assert_int_equal(r, p); /* p completed last: first in its free list */
  CHECK(a);
  /* A failing vendor allocation: error, nothing changes. */
  msnap_stats_t s0, s1;
  memset(&s0, 0, sizeof s0);
  s0.size = sizeof s0;
  s0.version = MSNAP_STATS_VERSION;
  s1 = s0;
  assert_int_equal(msnap_host_stats_get(a, &s0), 0);
  c->control("fail_next", 2);
  uint64_t t = 0;
  assert_true(msnap_host_malloc(a, 1 << 20, &t) < 0);
  assert_int_equal(t, 0);
  assert_int_equal(msnap_host_stats_get(a, &s1), 0);
  assert_memory_equal(&s0, &s1, sizeof s0);
  CHECK(a);
  assert_int_equal(msnap_host_free(a, r), 0);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  CHECK(a);
  assert_int_equal(c->control("live", 0), live0);
  /* Destruction returns a live block too. */
  assert_int_equal(msnap_host_malloc(a, 10, &p), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(c->control("live", 0), live0);
}

static void test_acl(void **state) {
  (void)state;
  run_case(&cases[0]);
}

static void test_cuda(void **state) {
  (void)state;
  run_case(&cases[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acl),
      cmocka_unit_test(test_cuda),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
