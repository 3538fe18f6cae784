/*
 * test_workspace_empty.c -- the npu profile empties the workspace
 * allocator (workspace.c) together with the caching allocator, as
 * torch_npu's emptyCache does for the default pool (torch-npu-today §3.1,
 * allocator-algorithm §20.7):
 *   - msnap_empty_cache returns the unused workspace buffers (and keeps a
 *     buffer still handed out); a private pool's release does not;
 *   - the last OOM retry of malloc empties the workspace before releasing
 *     the cache, so a request that only fits without the workspace's
 *     unused buffer succeeds (the cuda profile has no workspace step: OOM);
 *   - threads mixing workspace grows, empty_cache and OOM-ing mallocs
 *     finish (device lock and workspace lock always taken in that order;
 *     suite `threads` runs this under ThreadSanitizer, which also reports
 *     lock-order inversions).
 * Every check reads the sim runtime's own bookkeeping (live allocations,
 * free bytes), not only the allocator's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"

#define MiB (1ull << 20)

static msnap_allocator_t *make(int profile, uint64_t memory) {
  char v[32];
  snprintf(v, sizeof v, "%llu", (unsigned long long)memory);
  setenv("MEMSNAP_SIM_DEVICES", "1", 1);
  setenv("MEMSNAP_SIM_MEMORY", v, 1);
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = profile;
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = 1;
  o.sim_memory = memory;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("allocator_create: %s %s", msnap_strerror(rc), err);
  return a;
}

static void check(msnap_allocator_t *a) {
  char msg[512];
  if (msnap_check_invariants(a, msg, sizeof msg) != 0) fail_msg("%s", msg);
  if (msnap__ws_check(a, msg, sizeof msg) != 0) fail_msg("%s", msg);
}

static uint64_t ws_reserved(msnap_allocator_t *a) {
  uint64_t r = 0, al = 0;
  msnap__ws_totals(a, 0, &r, &al);
  return r;
}

/* msnap_empty_cache (npu) frees the unused workspace buffers. */
static void empty_cache_empties_workspace(void **state) {
  (void)state;
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, 1ull << 30);
  void *rt = msnap_runtime_ctx(a);
  uint64_t live0 = msnap_sim_live_allocations(rt);
  uint64_t w0, w1, p;
  /* Two streams: a 4 MiB buffer (unused after free), a 2 MiB one kept. */
  assert_int_equal(msnap_workspace_malloc(a, 0, 3 * MiB, 0, &w0), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 1000, 0x42, &w1), 0);
  assert_int_equal(msnap_workspace_free(a, w0), 0);
  assert_int_equal(msnap_malloc(a, 0, 5 * MiB, 0, &p), 0);
  assert_int_equal(msnap_free(a, p), 0);
  assert_int_equal(ws_reserved(a), 6 * MiB);
  assert_int_equal(msnap_sim_live_allocations(rt), live0 + 3);

  /* A private pool's release (emptyCache(id)) leaves the workspace. */
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(ws_reserved(a), 6 * MiB);

  assert_int_equal(msnap_empty_cache(a, 0), 0);
  check(a);
  /* The 20 MiB segment and the unused 4 MiB buffer are gone; the buffer
   * still handed out (stream 0x42) stays. */
  assert_int_equal(ws_reserved(a), 2 * MiB);
  assert_int_equal(msnap_sim_live_allocations(rt), live0 + 1);
  size_t fr = 0, tot = 0;
  assert_int_equal(msnap_mem_get_info(a, 0, &fr, &tot), 0);
  assert_int_equal(tot - fr, 2 * MiB);

  assert_int_equal(msnap_workspace_free(a, w1), 0);
  assert_int_equal(msnap_empty_cache(a, -1), 0);
  check(a);
  assert_int_equal(ws_reserved(a), 0);
  assert_int_equal(msnap_sim_live_allocations(rt), live0);
  msnap_allocator_destroy(a);
}

/* The last OOM retry: 64 MiB device, an unused 40 MiB workspace buffer,
 * then a 30 MiB request (a 30 MiB+ segment).  Only the workspace stands
 * in the way. */
static void oom_retry_empties_workspace(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == MSNAP_PROFILE_NPU;
    msnap_allocator_t *a = make(prof, 64 * MiB);
    uint64_t w, p = 0;
    assert_int_equal(msnap_workspace_malloc(a, 0, 39 * MiB, 0, &w), 0);
    assert_int_equal(msnap_workspace_free(a, w), 0);
    assert_int_equal(ws_reserved(a), 40 * MiB);
    int rc = msnap_malloc(a, 0, 30 * MiB, 0, &p);
    check(a);
    if (npu) {
      assert_int_equal(rc, 0);
      assert_int_equal(ws_reserved(a), 0);
      msnap_stats_t s;
      s.size = sizeof s;
      s.version = MSNAP_STATS_VERSION;
      assert_int_equal(msnap_stats_get(a, 0, &s), 0);
      assert_int_equal(s.num_alloc_retries, 1);
      assert_int_equal(s.num_ooms, 0);
      assert_int_equal(msnap_free(a, p), 0);
    } else {
      /* CUDA has no workspace allocator: out of memory, buffer kept. */
      assert_int_equal(rc, MSNAP_EOOM);
      assert_int_equal(ws_reserved(a), 40 * MiB);
      assert_int_equal(msnap_workspace_empty_cache(a, -1), 0);
    }
    assert_int_equal(msnap_empty_cache(a, -1), 0);
    check(a);
    assert_int_equal(msnap_sim_live_allocations(msnap_runtime_ctx(a)), 0);
    msnap_allocator_destroy(a);
  }
}

/* ---- threads: no deadlock between the device and workspace locks ------- */

typedef struct shared_s {
  msnap_allocator_t *a;
  int iters;
  atomic_int failures;
} shared_t;

static void *ws_main(void *arg) {
  shared_t *sh = arg;
  for (int i = 0; i < sh->iters; i++) {
    uint64_t w = 0;
    /* Growing sizes force a sync + free + malloc under the ws lock. */
    size_t size = (size_t)(1 + i % 12) * MiB;
    int rc = msnap_workspace_malloc(sh->a, 0, size, (uint64_t)(i % 3), &w);
    if (rc == 0)
      rc = msnap_workspace_free(sh->a, w);
    else if (rc == MSNAP_EOOM)
      rc = 0;
    if (rc != 0) atomic_fetch_add(&sh->failures, 1);
  }
  return NULL;
}

static void *alloc_main(void *arg) {
  shared_t *sh = arg;
  for (int i = 0; i < sh->iters; i++) {
    uint64_t p = 0;
    /* Half the device: the OOM chain (with its workspace step) often
     * runs while the other thread holds the workspace lock. */
    size_t size = (size_t)(8 + i % 24) * MiB;
    int rc = msnap_malloc(sh->a, 0, size, 0, &p);
    if (rc == 0)
      rc = msnap_free(sh->a, p);
    else if (rc == MSNAP_EOOM)
      rc = 0;
    if (rc == 0 && i % 5 == 0) rc = msnap_empty_cache(sh->a, -1);
    if (rc != 0) atomic_fetch_add(&sh->failures, 1);
  }
  return NULL;
}

static void concurrent_workspace_and_oom(void **state) {
  (void)state;
  shared_t sh;
  memset(&sh, 0, sizeof sh);
  sh.a = make(MSNAP_PROFILE_NPU, 48 * MiB);
  const char *e = getenv("MEMSNAP_STRESS_OPS");
  sh.iters = e && atoi(e) > 0 ? atoi(e) : 500;
  pthread_t t[3];
  assert_int_equal(pthread_create(&t[0], NULL, ws_main, &sh), 0);
  assert_int_equal(pthread_create(&t[1], NULL, alloc_main, &sh), 0);
  assert_int_equal(pthread_create(&t[2], NULL, alloc_main, &sh), 0);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  assert_int_equal(atomic_load(&sh.failures), 0);
  check(sh.a);
  assert_int_equal(msnap_empty_cache(sh.a, -1), 0);
  assert_int_equal(ws_reserved(sh.a), 0);
  assert_int_equal(msnap_sim_live_allocations(msnap_runtime_ctx(sh.a)), 0);
  msnap_allocator_destroy(sh.a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(empty_cache_empties_workspace),
      cmocka_unit_test(oom_retry_empties_workspace),
      cmocka_unit_test(concurrent_workspace_and_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
