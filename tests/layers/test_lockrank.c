/*
 * test_lockrank.c -- the lock-rank checker (base/lockrank.c).
 *
 * The checker's rules are tested directly in every build (the functions
 * always exist): order by (rank, sub), device locks by index, the host
 * lock never with a device lock, releases of locks not held.  Then, in
 * builds with MSNAP_DEBUG >= 1 (meson -Ddebug_level=1 or more; the
 * sanitizer gate builds with 2), the library's real locks: taking device
 * lock 0 while holding the host allocator's lock is caught, and a normal
 * run (malloc, free, history, snapshot, workspace, host memory) reports
 * nothing.  Without debug checks that part is skipped, saying why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc/host.h"
#include "api/api.h"

static int nviolations;
static char last[512];

static void hook(const char *msg) {
  nviolations++;
  snprintf(last, sizeof last, "%s", msg);
}

static void reset(void) {
  nviolations = 0;
  last[0] = '\0';
}

static int setup(void **state) {
  (void)state;
  msnap__rank_set_hook(hook);
  reset();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  msnap__rank_set_hook(NULL);
  return 0;
}

static void test_rules(void **state) {
  (void)state;
  reset();
  /* Legal: outer to inner, device locks in index order. */
  msnap__rank_acquire(MSNAP_RANK_OOM_DUMP, 0);
  msnap__rank_acquire(MSNAP_RANK_DEVICE, 0);
  msnap__rank_acquire(MSNAP_RANK_DEVICE, 3);
  msnap__rank_acquire(MSNAP_RANK_WORKSPACE, 0);
  msnap__rank_acquire(MSNAP_RANK_STACK_TABLE, 0);
  assert_true(msnap__rank_held(MSNAP_RANK_DEVICE, 3));
  assert_true(msnap__rank_held(MSNAP_RANK_DEVICE, UINT32_MAX));
  assert_false(msnap__rank_held(MSNAP_RANK_DEVICE, 1));
  assert_int_equal(nviolations, 0);
  /* Inner then outer. */
  msnap__rank_acquire(MSNAP_RANK_RUNTIME, 0);
  assert_int_equal(nviolations, 1);
  assert_non_null(strstr(last, "taking the sim runtime lock while holding "
                               "the stack table lock"));
  msnap__rank_release(MSNAP_RANK_RUNTIME, 0);
  /* Releases in any order. */
  msnap__rank_release(MSNAP_RANK_DEVICE, 0);
  msnap__rank_release(MSNAP_RANK_STACK_TABLE, 0);
  msnap__rank_release(MSNAP_RANK_WORKSPACE, 0);
  /* A lower device index after a higher one. */
  msnap__rank_acquire(MSNAP_RANK_DEVICE, 2);
  assert_int_equal(nviolations, 2);
  assert_non_null(strstr(last, "taking the device lock 2 while holding the "
                               "device lock 3"));
  msnap__rank_release(MSNAP_RANK_DEVICE, 2);
  msnap__rank_release(MSNAP_RANK_DEVICE, 3);
  /* The host lock is never held with a device lock, in either order. */
  msnap__rank_acquire(MSNAP_RANK_DEVICE, 0);
  msnap__rank_acquire(MSNAP_RANK_HOST, 0);
  assert_int_equal(nviolations, 3);
  assert_non_null(strstr(last, "taking the host allocator lock while "
                               "holding the device lock 0"));
  msnap__rank_release(MSNAP_RANK_HOST, 0);
  msnap__rank_release(MSNAP_RANK_DEVICE, 0);
  /* Releasing a lock not held. */
  msnap__rank_release(MSNAP_RANK_CLOCK, 0);
  assert_int_equal(nviolations, 4);
  assert_non_null(strstr(last, "releasing the clock lock"));
  msnap__rank_release(MSNAP_RANK_OOM_DUMP, 0);
  assert_false(msnap__rank_held(MSNAP_RANK_OOM_DUMP, 0));
  assert_int_equal(nviolations, 4);
}

static msnap_allocator_t *make(void) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_NPU;
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = 2;
  o.sim_memory = 1ull << 30;
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  return a;
}

/* The real locks: host lock, then device lock 0 -- a violation. */
static void test_real_violation_caught(void **state) {
  (void)state;
  if (msnap_debug_level < 1)
    skip(); /* lock ranks are checked only with -Ddebug_level >= 1 */
  msnap_allocator_t *a = make();
  reset();
  assert_int_equal(msnap__host_lock(a), 0);
  msnap__device_lock(a, 0);
  assert_int_equal(nviolations, 1);
  assert_non_null(strstr(last, "taking the device lock 0 while holding the "
                               "host allocator lock"));
  msnap__device_unlock(a, 0);
  msnap__host_unlock(a);
  /* Device locks out of index order. */
  reset();
  msnap__device_lock(a, 1);
  msnap__device_lock(a, 0);
  assert_int_equal(nviolations, 1);
  msnap__device_unlock(a, 0);
  msnap__device_unlock(a, 1);
  msnap_allocator_destroy(a);
}

/* Everything the library does in a normal run respects the order. */
static void test_normal_run_clean(void **state) {
  (void)state;
  if (msnap_debug_level < 1)
    skip(); /* lock ranks are checked only with -Ddebug_level >= 1 */
  msnap_allocator_t *a = make();
  reset();
  msnap_history_options_t ho;
  msnap_history_options_init(&ho);
  ho.stacks = MSNAP_STACKS_CPP;
  ho.record_host = true;
  assert_int_equal(msnap_record_history(a, &ho), 0);
  uint64_t p[8], w, h;
  for (int i = 0; i < 8; i++)
    assert_int_equal(msnap_malloc(a, i % 2, (size_t)1000 << i, 0, &p[i]), 0);
  assert_int_equal(msnap_annotate_memory(a, p[0], "x"), 0);
  assert_int_equal(msnap_record_annotation(a, 0, "step", true), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 1 << 20, 0, &w), 0);
  assert_int_equal(msnap_host_malloc(a, 4096, &h), 0);
  assert_int_equal(msnap_set_allocator_settings(a, "expandable_segments:True"),
                   0);
  for (int i = 0; i < 8; i += 2) assert_int_equal(msnap_free(a, p[i]), 0);
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(msnap_snapshot_pickle(a, NULL, &buf, &len), 0);
  free(buf);
  assert_int_equal(msnap_workspace_free(a, w), 0);
  assert_int_equal(msnap_host_free(a, h), 0);
  assert_int_equal(msnap_empty_cache(a, -1), 0);
  for (int i = 1; i < 8; i += 2) assert_int_equal(msnap_free(a, p[i]), 0);
  char msg[256];
  assert_int_equal(msnap_check_invariants(a, msg, sizeof msg), 0);
  msnap_allocator_destroy(a);
  if (nviolations != 0) fail_msg("%d violations, last: %s", nviolations, last);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rules),
      cmocka_unit_test(test_real_violation_caught),
      cmocka_unit_test(test_normal_run_clean),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
