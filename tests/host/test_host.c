/*
 * test_host.c -- the pinned host caching allocator (src/alloc/host.c) on
 * the sim runtime: power-of-two rounding, reuse by size, record_stream
 * events delaying reuse, empty_cache, the pinned_* alloc-conf keys, bad
 * pointers, runtime faults at every call (no leak, invariants hold),
 * threads, and the recording into host_segments/host_traces (checked on
 * the snapshot model and, through CPython's pickle, on a dump).
 *
 * The invariant checker (msnap__host_check) runs after every operation.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc/alloc.h"
#include "alloc/host.h"
#include "api/api.h"
#include "runtime/runtime.h"
#include "record/stack.h"

#define MiB (1ull << 20)

/* ---- helpers ------------------------------------------------------------- */

static msnap_allocator_t *make_conf(int profile, const char *conf) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = profile;
  o.runtime_name = "sim";
  o.alloc_conf = conf;
  o.caching_disabled = 0;
  o.sim_devices = 1;
  o.sim_memory = 8ull << 30;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("allocator_create: %s %s", msnap_strerror(rc), err);
  return a;
}

static msnap_allocator_t *make(void) {
  return make_conf(MSNAP_PROFILE_CUDA, "");
}

static void check(msnap_allocator_t *a) {
  char msg[256] = "";
  int rc = msnap__host_check(a, msg, sizeof msg);
  if (rc != 0) fail_msg("host invariants: %s", msg);
  /* The public checker includes the host allocator. */
  rc = msnap_check_invariants(a, msg, sizeof msg);
  if (rc != 0) fail_msg("invariants: %s", msg);
}

static msnap_stats_t stats(msnap_allocator_t *a) {
  msnap_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  s.version = MSNAP_STATS_VERSION;
  assert_int_equal(msnap_host_stats_get(a, &s), 0);
  return s;
}

static uint64_t hmalloc(msnap_allocator_t *a, size_t n) {
  uint64_t p = 0;
  int rc = msnap_host_malloc(a, n, &p);
  if (rc != 0) fail_msg("host_malloc(%zu): %s", n, msnap_last_error());
  assert_true(p != 0);
  check(a);
  return p;
}

static void hfree(msnap_allocator_t *a, uint64_t p) {
  int rc = msnap_host_free(a, p);
  if (rc != 0) fail_msg("host_free: %s", msnap_last_error());
  check(a);
}

static uint64_t live(msnap_allocator_t *a) {
  return msnap_sim_live_allocations(msnap_runtime_ctx(a));
}

/* ---- allocator behaviour ------------------------------------------------- */

static void test_rounding(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  uint64_t base = live(a);
  size_t req[] = {1, 1000, 1024, 1025, 4097, 3 * MiB};
  uint64_t want[] = {1, 1024, 1024, 2048, 8192, 4 * MiB};
  uint64_t p[6], total = 0;
  int64_t reqsum = 0;
  for (int i = 0; i < 6; i++) {
    p[i] = hmalloc(a, req[i]);
    total += want[i];
    reqsum += (int64_t)req[i];
    msnap_stats_t s = stats(a);
    assert_int_equal(s.reserved_bytes[MSNAP_STAT_ALL].current, total);
    assert_int_equal(s.segment[MSNAP_STAT_ALL].current, i + 1);
    assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].current, total);
    assert_int_equal(s.requested_bytes[MSNAP_STAT_ALL].current, reqsum);
    assert_int_equal(s.reserved_bytes[MSNAP_STAT_SMALL_POOL].current, total);
    assert_int_equal(s.reserved_bytes[MSNAP_STAT_LARGE_POOL].current, 0);
  }
  assert_int_equal(live(a), base + 6);
  /* size 0: no block. */
  uint64_t z = 99;
  assert_int_equal(msnap_host_malloc(a, 0, &z), 0);
  assert_int_equal(z, 0);
  assert_int_equal(msnap_host_free(a, 0), 0);
  for (int i = 0; i < 6; i++) hfree(a, p[i]);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.active[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 6); /* cached */
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].peak, 6);
  assert_int_equal(s.num_device_alloc, 6);
  msnap_allocator_destroy(a);
}

static void test_reuse(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  uint64_t base = live(a);
  uint64_t p = hmalloc(a, 1000);
  hfree(a, p);
  /* 600 rounds to 1024 too: the cached block comes back. */
  uint64_t q = hmalloc(a, 600);
  assert_int_equal(q, p);
  /* 513 rounds to 1024, but the only 1024 block is taken: a new one. */
  uint64_t r = hmalloc(a, 513);
  assert_true(r != p);
  /* A different size never takes a cached block of another size. */
  hfree(a, r);
  uint64_t t = hmalloc(a, 2000);
  assert_true(t != r && t != p);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.num_device_alloc, 3);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 3);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 2);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].current, 1024 + 2048);
  assert_int_equal(live(a), base + 3);
  hfree(a, q);
  hfree(a, t);
  msnap_allocator_destroy(a);
}

static void test_stream_events(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  void *ctx = msnap_runtime_ctx(a);
  msnap_sim_set_manual_events(ctx, true);
  uint64_t p = hmalloc(a, 4096);
  assert_int_equal(msnap_host_record_stream(a, p, 7), 0);
  assert_int_equal(msnap_host_record_stream(a, p, 7), 0); /* once */
  assert_int_equal(msnap_host_record_stream(a, p, 9), 0);
  check(a);
  hfree(a, p);
  msnap_stats_t s = stats(a);
  /* Freed by the caller, still in use on streams 7 and 9. */
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.active[MSNAP_STAT_ALL].current, 1);
  assert_int_equal(s.active_bytes[MSNAP_STAT_ALL].current, 4096);
  /* Not reusable yet: the same size gets a new block. */
  uint64_t q = hmalloc(a, 4096);
  assert_true(q != p);
  hfree(a, q); /* no streams: cached at once */
  /* empty_cache leaves the pending block alone. */
  assert_int_equal(msnap_host_empty_cache(a), 0);
  check(a);
  s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 1);
  assert_int_equal(s.active[MSNAP_STAT_ALL].current, 1);
  /* Stream 7 done, 9 not: still pending. */
  msnap_sim_complete_events(ctx, 7, false);
  uint64_t r = hmalloc(a, 4096);
  assert_true(r != p);
  hfree(a, r);
  msnap_sim_complete_events(ctx, 9, false);
  /* Now p is reusable; it was completed last, so it is handed out first. */
  uint64_t t = hmalloc(a, 4096);
  assert_int_equal(t, p);
  s = stats(a);
  assert_int_equal(s.active[MSNAP_STAT_ALL].current, 1);
  hfree(a, t);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  check(a);
  s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.reserved_bytes[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.num_device_free, s.num_device_alloc);
  msnap_allocator_destroy(a);
}

static void test_empty_cache(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  uint64_t base = live(a);
  uint64_t p[5];
  for (int i = 0; i < 5; i++) p[i] = hmalloc(a, (size_t)(1000 << i));
  assert_int_equal(live(a), base + 5);
  for (int i = 0; i < 3; i++) hfree(a, p[i]);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  check(a);
  /* The two live blocks stay, the three cached ones went back. */
  assert_int_equal(live(a), base + 2);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 2);
  assert_int_equal(s.num_device_free, 3);
  msnap_duration_stat_t at, ft;
  assert_int_equal(msnap_host_timing_get(a, &at, &ft), 0);
  assert_int_equal(at.count, 5);
  assert_int_equal(ft.count, 3);
  assert_true(at.max >= at.min && at.total >= at.max);
  assert_int_equal(msnap_host_reset_peak_stats(a), 0);
  s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].peak, 2);
  assert_int_equal(msnap_host_reset_accumulated_stats(a), 0);
  s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].allocated, 0);
  assert_int_equal(s.num_device_alloc, 0);
  assert_int_equal(msnap_host_timing_get(a, &at, &ft), 0);
  assert_int_equal(at.count, 0);
  check(a);
  hfree(a, p[3]);
  hfree(a, p[4]);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  assert_int_equal(live(a), base);
  msnap_allocator_destroy(a);
}

static void test_bad_pointers(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  uint64_t p = hmalloc(a, 100);
  assert_int_equal(msnap_host_free(a, p + 8), MSNAP_EBADPTR);
  assert_non_null(strstr(msnap_last_error(), "invalid pinned host pointer"));
  assert_int_equal(msnap_host_record_stream(a, 12345, 1), MSNAP_EBADPTR);
  /* A device pointer is not a host block. */
  uint64_t d = 0;
  assert_int_equal(msnap_malloc(a, 0, 1000, 0, &d), 0);
  assert_int_equal(msnap_host_free(a, d), MSNAP_EBADPTR);
  assert_int_equal(msnap_free(a, d), 0);
  check(a);
  hfree(a, p);
  /* Double free and record_stream after free. */
  assert_int_equal(msnap_host_free(a, p), MSNAP_EBADPTR);
  assert_int_equal(msnap_host_record_stream(a, p, 1), MSNAP_EBADPTR);
  check(a);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 1);
  assert_int_equal(msnap_host_malloc(NULL, 10, &p), MSNAP_EINVAL);
  assert_int_equal(msnap_host_malloc(a, 10, NULL), MSNAP_EINVAL);
  /* A size no block can hold: out of memory, as msnap_malloc's 1 EB
   * guard (not an invalid argument); *ptr untouched, nothing allocated. */
  uint64_t q = 77;
  assert_int_equal(msnap_host_malloc(a, SIZE_MAX, &q), MSNAP_EOOM);
  assert_int_equal(q, 77);
  char want[128];
  snprintf(want, sizeof want,
           "host allocator: out of pinned host memory: %zu bytes cannot be "
           "rounded up to a block size", (size_t)SIZE_MAX);
  assert_string_equal(msnap_last_error(), want);
  assert_int_equal(msnap_host_malloc(a, ((size_t)1 << 63) + 1, &q),
                   MSNAP_EOOM);
  assert_int_equal(q, 77);
  assert_int_equal(msnap_malloc(a, 0, SIZE_MAX, 0, &q), MSNAP_EOOM);
  assert_int_equal(q, 77);
  s = stats(a);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 1);
  check(a);
  msnap_allocator_destroy(a);
}

/* pinned_max_round_threshold_mb:1 -> above 1 MiB, multiples of 2 MiB. */
static void test_conf_round_threshold(void **state) {
  (void)state;
  msnap_allocator_t *a =
      make_conf(MSNAP_PROFILE_CUDA, "pinned_max_round_threshold_mb:1");
  uint64_t p = hmalloc(a, 5 * MiB);
  uint64_t q = hmalloc(a, 1000);
  uint64_t r = hmalloc(a, MiB); /* at the threshold: power of two */
  msnap_stats_t s = stats(a);
  assert_int_equal(s.reserved_bytes[MSNAP_STAT_ALL].current,
                   6 * MiB + 1024 + MiB);
  hfree(a, p);
  hfree(a, q);
  hfree(a, r);
  msnap_allocator_destroy(a);
  /* Without it: 8 MiB. */
  a = make();
  p = hmalloc(a, 5 * MiB);
  s = stats(a);
  assert_int_equal(s.reserved_bytes[MSNAP_STAT_ALL].current, 8 * MiB);
  hfree(a, p);
  msnap_allocator_destroy(a);
}

/* pinned_max_cached_size_mb:1 -> cached bytes stay <= 1 MiB. */
static void test_conf_max_cached(void **state) {
  (void)state;
  msnap_allocator_t *a =
      make_conf(MSNAP_PROFILE_CUDA, "pinned_max_cached_size_mb:1");
  uint64_t base = live(a);
  uint64_t p = hmalloc(a, 512 * 1024);
  uint64_t q = hmalloc(a, 512 * 1024);
  uint64_t r = hmalloc(a, 512 * 1024);
  hfree(a, p); /* 512 KiB cached */
  hfree(a, q); /* 1 MiB cached: at the limit */
  hfree(a, r); /* over: back to the runtime */
  msnap_stats_t s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 2);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(live(a), base + 2);
  msnap_allocator_destroy(a);
}

/* pinned_reserve_segment_size_mb:1 -> one runtime call for small blocks. */
static void test_conf_reserve(void **state) {
  (void)state;
  msnap_allocator_t *a =
      make_conf(MSNAP_PROFILE_CUDA, "pinned_reserve_segment_size_mb:1");
  uint64_t base = live(a);
  uint64_t p = hmalloc(a, 256 * 1024);
  uint64_t q = hmalloc(a, 256 * 1024);
  uint64_t r = hmalloc(a, 512 * 1024);
  assert_int_equal(live(a), base + 1); /* the reserve only */
  assert_int_equal(q, p + 256 * 1024);
  assert_int_equal(r, q + 256 * 1024);
  uint64_t t = hmalloc(a, 1000); /* reserve full: a runtime block */
  assert_int_equal(live(a), base + 2);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 4);
  assert_int_equal(s.num_device_alloc, 2);
  hfree(a, p);
  hfree(a, q);
  hfree(a, r);
  hfree(a, t);
  /* Carved blocks stay cached; the runtime block goes. */
  assert_int_equal(msnap_host_empty_cache(a), 0);
  check(a);
  assert_int_equal(live(a), base + 1);
  s = stats(a);
  assert_int_equal(s.segment[MSNAP_STAT_ALL].current, 3);
  /* ... and are reused. */
  uint64_t u = hmalloc(a, 300 * 1024);
  assert_int_equal(u, r);
  hfree(a, u);
  msnap_allocator_destroy(a);
}

/* The checker catches a wrong stat, a wrong cached-bytes total and an
 * event count that the queue does not back. */
static void test_checker_catches(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  uint64_t p = hmalloc(a, 100), q = hmalloc(a, 5000);
  hfree(a, q);
  const char *want[] = {"stat segment", "cached_bytes", "events"};
  for (int w = 0; w < 3; w++) {
    char msg[256] = "";
    msnap__host_test_poke(a, w, 1);
    assert_int_equal(msnap__host_check(a, msg, sizeof msg), MSNAP_ESTATE);
    if (strstr(msg, want[w]) == NULL)
      fail_msg("poke %d: message '%s' lacks '%s'", w, msg, want[w]);
    assert_int_equal(msnap_check_invariants(a, msg, sizeof msg),
                     MSNAP_ESTATE);
    msnap__host_test_poke(a, w, -1);
    check(a);
  }
  hfree(a, p);
  msnap_allocator_destroy(a);
}

/* ---- faults -------------------------------------------------------------- */

static void test_faults_direct(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  void *ctx = msnap_runtime_ctx(a);
  uint64_t base = live(a);
  uint64_t p = 0;
  msnap_sim_fail_nth(ctx, "host_malloc", 1);
  assert_int_equal(msnap_host_malloc(a, 100, &p), MSNAP_EOOM);
  assert_int_equal(p, 0);
  check(a);
  assert_int_equal(stats(a).segment[MSNAP_STAT_ALL].current, 0);
  p = hmalloc(a, 100);
  hfree(a, p);
  msnap_sim_fail_nth(ctx, "host_free", 1);
  assert_int_equal(msnap_host_empty_cache(a), MSNAP_ERUNTIME);
  check(a);
  assert_int_equal(stats(a).segment[MSNAP_STAT_ALL].current, 1);
  assert_int_equal(msnap_host_malloc(a, 100, &p), 0); /* still cached */
  hfree(a, p);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  assert_int_equal(live(a), base);
  /* Event creation / recording failures: the free synchronises instead. */
  const char *calls[] = {"event_create", "event_record"};
  for (int i = 0; i < 2; i++) {
    p = hmalloc(a, 100);
    assert_int_equal(msnap_host_record_stream(a, p, 3), 0);
    msnap_sim_fail_nth(ctx, calls[i], 1);
    hfree(a, p);
    msnap_stats_t s = stats(a);
    assert_int_equal(s.active[MSNAP_STAT_ALL].current, 0);
    assert_int_equal(msnap_host_empty_cache(a), 0);
    check(a);
  }
  msnap_sim_fail_nth(ctx, NULL, 0);
  assert_int_equal(live(a), base);
  msnap_allocator_destroy(a);
}

/* A scripted workload with the nth runtime call failing, for every n until
 * the workload runs clean: every error leaves valid invariants, and after
 * freeing what succeeded and emptying the cache nothing is left. */
static void test_fault_sweep(void **state) {
  (void)state;
  uint64_t nth;
  int total_failures = 0;
  for (nth = 1; nth <= 150; nth++) {
    msnap_allocator_t *a = make_conf(MSNAP_PROFILE_CUDA,
                                     "pinned_max_cached_size_mb:1,"
                                     "pinned_reserve_segment_size_mb:1");
    void *ctx = msnap_runtime_ctx(a);
    uint64_t base = live(a);
    msnap_history_options_t ho;
    msnap_history_options_init(&ho);
    ho.record_host = true;
    assert_int_equal(msnap_record_history(a, &ho), 0);
    msnap_sim_fail_nth(ctx, NULL, nth);
    uint64_t ptrs[16] = {0};
    int failures = 0;
    for (int round = 0; round < 3; round++) {
      for (int i = 0; i < 16; i++) {
        if (ptrs[i] == 0) {
          int rc = msnap_host_malloc(a, (size_t)(700 * 1024) >> (i % 8),
                                     &ptrs[i]);
          if (rc != 0) {
            failures++;
            ptrs[i] = 0;
          } else if (i % 3 == 0) {
            assert_int_equal(msnap_host_record_stream(a, ptrs[i], i), 0);
          }
        } else if ((i + round) % 2 == 0) {
          assert_int_equal(msnap_host_free(a, ptrs[i]), 0);
          ptrs[i] = 0;
        }
        check(a);
      }
      if (msnap_host_empty_cache(a) != 0) failures++;
      check(a);
    }
    msnap_sim_fail_nth(ctx, NULL, 0);
    for (int i = 0; i < 16; i++)
      if (ptrs[i]) assert_int_equal(msnap_host_free(a, ptrs[i]), 0);
    assert_int_equal(msnap_host_empty_cache(a), 0);
    check(a);
    msnap_stats_t s = stats(a);
    /* Only carved blocks can stay (the reserve is one runtime range). */
    assert_int_equal(s.active[MSNAP_STAT_ALL].current, 0);
    /* Runtime ranges held = host_malloc calls - host_free calls (no event
     * handle left); at most the reserve stays. */
    assert_int_equal(live(a) - base,
                     (uint64_t)(s.num_device_alloc - s.num_device_free));
    assert_true(live(a) <= base + 1);
    msnap_allocator_destroy(a);
    total_failures += failures;
  }
  /* Many of the injected faults surfaced as errors (others were absorbed:
   * a failed reserve falls back to a plain block, a failed event to a
   * synchronisation). */
  print_message("fault sweep: %d failed calls\n", total_failures);
  assert_true(total_failures > 20);
}

/* ---- threads ------------------------------------------------------------- */

typedef struct targ_s {
  msnap_allocator_t *a;
  unsigned seed;
} targ_t;

static void *thread_main(void *p) {
  targ_t *t = p;
  uint64_t ptrs[8] = {0};
  for (int k = 0; k < 2000; k++) {
    int i = (int)(rand_r(&t->seed) % 8);
    if (ptrs[i]) {
      if (rand_r(&t->seed) % 4 == 0)
        (void)msnap_host_record_stream(t->a, ptrs[i], (uint64_t)i);
      if (msnap_host_free(t->a, ptrs[i]) != 0) abort();
      ptrs[i] = 0;
    } else if (msnap_host_malloc(t->a, 1 + rand_r(&t->seed) % 100000,
                                 &ptrs[i]) != 0) {
      abort();
    }
    if (k % 500 == 0) (void)msnap_host_empty_cache(t->a);
  }
  for (int i = 0; i < 8; i++)
    if (ptrs[i] && msnap_host_free(t->a, ptrs[i]) != 0) abort();
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  msnap_history_options_t ho;
  msnap_history_options_init(&ho);
  ho.record_host = true;
  ho.max_entries = 1000;
  assert_int_equal(msnap_record_history(a, &ho), 0);
  pthread_t th[4];
  targ_t args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (targ_t){a, 17u + (unsigned)i};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  check(a);
  msnap_stats_t s = stats(a);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].current, 0);
  assert_true(s.allocation[MSNAP_STAT_ALL].allocated > 0);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].allocated,
                   s.allocation[MSNAP_STAT_ALL].freed);
  assert_int_equal(s.active[MSNAP_STAT_ALL].current, 0);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  msnap_allocator_destroy(a);
}

/* ---- recording ----------------------------------------------------------- */

static void record(msnap_allocator_t *a, bool enabled, bool dev, bool host,
                   msnap_record_context_t ctx) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = enabled;
  o.record_device = dev;
  o.record_host = host;
  o.context = ctx;
  int rc = msnap_record_history(a, &o);
  if (rc != 0) fail_msg("record_history: %s", msnap_last_error());
}

static msnap_snap_t *take(msnap_allocator_t *a) {
  msnap_snap_t *s = NULL;
  int rc = msnap__snapshot_take(a, NULL, &s);
  if (rc != 0) fail_msg("snapshot_take: %s", msnap_last_error());
  char msg[256];
  if (msnap__snap_check_model(s, msg, sizeof msg) != 0)
    fail_msg("model: %s", msg);
  return s;
}

/* "segment_alloc,alloc,..." of the host trace. */
static void host_actions(const msnap_snap_t *s, char *buf, size_t len) {
  buf[0] = '\0';
  for (uint32_t i = 0; i < s->host_traces.n; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, len - l, "%s%s", i ? "," : "",
             msnap_action_name(s->host_traces.v[i].action));
  }
}

/* Whether this build's C unwinder yields frames (the frame-pointer
 * unwinder in a build without frame pointers does not): the checks that
 * entries carry stacks need it. */
static bool can_unwind(void) {
  uint32_t id = msnap__stack_capture(MSNAP_STACKS_CPP, 0);
  msnap__stack_unref(id);
  if (id == 0) print_message("NOTE: no C frames here; stack checks off\n");
  return id != 0;
}

static void test_record_model(void **state) {
  (void)state;
  bool unwind = can_unwind();
  msnap_allocator_t *a = make();
  void *ctx = msnap_runtime_ctx(a);
  msnap_sim_set_manual_events(ctx, true);
  record(a, true, true, true, MSNAP_CONTEXT_ALL);
  uint64_t p = hmalloc(a, 1000);
  uint64_t q = hmalloc(a, 5000);
  uint64_t d = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &d), 0);
  assert_int_equal(msnap_host_record_stream(a, q, 3), 0);
  hfree(a, p);
  hfree(a, q);
  msnap_snap_t *s = take(a);
  char acts[1024];
  host_actions(s, acts, sizeof acts);
  assert_string_equal(acts, "segment_alloc,alloc,segment_alloc,alloc,"
                            "free_requested,free_completed,free_requested");
  const msnap_strace_t *t = s->host_traces.v;
  assert_int_equal(t[0].addr, p);
  assert_int_equal(t[0].size, 1024); /* segment: rounded */
  assert_int_equal(t[1].size, 1000); /* alloc: requested */
  assert_int_equal(t[3].size, 5000);
  assert_int_equal(t[6].addr, q);
  for (uint32_t i = 0; i < s->host_traces.n; i++) {
    assert_int_equal(msnap__tattr(s, &t[i])->stream, 0);
    assert_true(t[i].time_us > 1000000000000000ll);
    assert_true(i == 0 || t[i].time_us >= t[i - 1].time_us);
    /* context "all": every entry carries a stack. */
    if (unwind) assert_true(t[i].frames != MSNAP_STACK_ABSENT);
  }
  /* host_segments: one per block, sorted, §2.8 values. */
  assert_int_equal(s->nhost_segments, 2);
  assert_int_equal(s->nhost_blocks, 2);
  const msnap_ssegment_t *g = s->host_segments;
  assert_true(g[0].address < g[1].address);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(g[i].device, -1);
    assert_int_equal(g[i].nblocks, 1);
    assert_int_equal(g[i].stream, 0);
    assert_int_equal(g[i].is_large, 0);
    assert_int_equal(g[i].requested_size, g[i].total_size);
    const msnap_sblock_t *b = &s->host_blocks[g[i].first_block];
    assert_int_equal(b->address, g[i].address);
    assert_int_equal(b->size, g[i].total_size);
    assert_int_equal(b->requested_size, g[i].total_size);
    if (g[i].address == p) {
      assert_int_equal(b->state, MSNAP_BLOCK_INACTIVE);
      assert_int_equal(g[i].active_size, 0);
      assert_int_equal(g[i].total_size, 1024);
    } else {
      assert_int_equal(g[i].address, q);
      assert_int_equal(b->state, MSNAP_BLOCK_ACTIVE_PENDING_FREE);
      assert_int_equal(g[i].active_size, 8192);
      assert_int_equal(g[i].allocated_size, 0);
    }
  }
  /* The device ring is separate: segment_alloc + alloc of d. */
  assert_int_equal(s->ndevices, 1);
  assert_int_equal(s->device_traces[0].n, 2);
  msnap__snap_free(s);

  /* The event completes: the next malloc notices (free_completed), then
   * reuses q's block; empty_cache returns p's block. */
  msnap_sim_complete_events(ctx, 3, false);
  uint64_t r = hmalloc(a, 8000);
  assert_int_equal(r, q);
  hfree(a, r);
  assert_int_equal(msnap_host_empty_cache(a), 0);
  s = take(a);
  host_actions(s, acts, sizeof acts);
  assert_string_equal(acts, "segment_alloc,alloc,segment_alloc,alloc,"
                            "free_requested,free_completed,free_requested,"
                            "free_completed,alloc,free_requested,"
                            "free_completed,segment_free,segment_free");
  assert_int_equal(s->nhost_segments, 0);
  msnap__snap_free(s);
  assert_int_equal(msnap_free(a, d), 0);

  /* Disabling turns host recording off and clears its ring. */
  record(a, false, true, false, MSNAP_CONTEXT_ALL);
  p = hmalloc(a, 10);
  s = take(a);
  assert_int_equal(s->host_traces.n, 0);
  assert_int_equal(s->nhost_segments, 0);
  msnap__snap_free(s);
  hfree(a, p);
  msnap_allocator_destroy(a);
}

static void test_record_options(void **state) {
  (void)state;
  msnap_allocator_t *a = make();
  /* record_host needs enabled. */
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = false;
  o.record_host = true;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(),
                      "record_pinned_host_memory requires memory history "
                      "recording to be enabled");
  /* record_device=false: host only. */
  record(a, true, false, true, MSNAP_CONTEXT_STATE);
  assert_false(msnap_history_enabled(a));
  uint64_t d = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &d), 0);
  uint64_t p = hmalloc(a, 3000);
  msnap_snap_t *s = take(a);
  assert_int_equal(s->device_traces[0].n, 0);
  assert_int_equal(s->host_traces.n, 2);
  assert_int_equal(s->nhost_segments, 1);
  /* context "state": no frames on entries, the block has its stack. */
  assert_int_equal(s->host_traces.v[1].frames, MSNAP_STACK_ABSENT);
  if (can_unwind()) assert_true(s->host_blocks[0].frames > MSNAP_STACK_EMPTY);
  msnap__snap_free(s);
  /* Device only again: the host ring is cleared, host_segments []. */
  record(a, true, true, false, MSNAP_CONTEXT_ALL);
  hfree(a, p);
  s = take(a);
  assert_int_equal(s->host_traces.n, 0);
  assert_int_equal(s->nhost_segments, 0);
  msnap__snap_free(s);
  /* max_entries bounds the host ring too. */
  msnap_history_options_init(&o);
  o.record_host = true;
  o.max_entries = 3;
  assert_int_equal(msnap_record_history(a, &o), 0);
  for (int i = 0; i < 4; i++) hfree(a, hmalloc(a, 100));
  s = take(a);
  assert_int_equal(s->host_traces.n, 3);
  msnap__snap_free(s);
  /* skip_actions applies to the host ring as well. */
  o.max_entries = 100;
  o.clear_history = true;
  o.skip_actions = 1u << MSNAP_ACTION_ALLOC;
  assert_int_equal(msnap_record_history(a, &o), 0);
  hfree(a, hmalloc(a, 100));
  s = take(a);
  char acts[256];
  host_actions(s, acts, sizeof acts);
  assert_string_equal(acts, "free_requested,free_completed");
  msnap__snap_free(s);
  assert_int_equal(msnap_free(a, d), 0);
  msnap_allocator_destroy(a);
}

static bool have_python(void) {
  static int have = -1;
  if (have < 0) have = system("python3 -c 'import pickle' 2>/dev/null") == 0;
  return have;
}

/* A dump with host recording, loaded by CPython's pickle (check_host.py);
 * `python -m torch.cuda._memory_viz stats` too when torch is importable. */
static void test_dump_pickle(void **state) {
  (void)state;
  if (!have_python()) {
    print_error("SKIP: python3 not found; CPython pickle checks skipped\n");
    skip();
  }
  msnap_allocator_t *a = make();
  record(a, true, true, true, MSNAP_CONTEXT_ALL);
  uint64_t p = hmalloc(a, 1000), q = hmalloc(a, 70000), d = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &d), 0);
  hfree(a, p);
  char path[] = "/tmp/msnap_host_XXXXXX.pickle";
  int fd = mkstemps(path, 7);
  assert_true(fd >= 0);
  close(fd);
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  assert_int_equal(msnap_dump_snapshot(a, &so, path), 0);
  bool torch = system("python3 -c 'import torch' 2>/dev/null") == 0;
  if (!torch)
    print_message("NOTE: torch not importable by python3: the _memory_viz "
                  "check runs in tests/python/test_host.py instead\n");
  const char *root = getenv("MEMSNAP_SOURCE_ROOT");
  char cmd[1024], out[4096];
  snprintf(cmd, sizeof cmd, "python3 %s/tests/host/check_host.py %s %s",
           root ? root : "..", path, torch ? "--viz" : "");
  FILE *pp = popen(cmd, "r");
  assert_non_null(pp);
  size_t n = fread(out, 1, sizeof out - 1, pp);
  out[n] = '\0';
  int st = pclose(pp);
  unlink(path);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("check_host.py failed: %s", out);
  assert_non_null(strstr(out, "\"nseg\": 2"));
  assert_non_null(strstr(out, "\"states\": [\"inactive\", "
                              "\"active_allocated\"]"));
  assert_non_null(strstr(out, "\"actions\": [\"segment_alloc\", \"alloc\", "
                              "\"segment_alloc\", \"alloc\", "
                              "\"free_requested\", \"free_completed\"]"));
  assert_non_null(strstr(out, "\"device_entries\": 2"));
  assert_non_null(strstr(out, "\"sizes\": [1024, 131072]"));
  hfree(a, q);
  assert_int_equal(msnap_free(a, d), 0);
  msnap_allocator_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_reuse),
      cmocka_unit_test(test_stream_events),
      cmocka_unit_test(test_empty_cache),
      cmocka_unit_test(test_bad_pointers),
      cmocka_unit_test(test_conf_round_threshold),
      cmocka_unit_test(test_conf_max_cached),
      cmocka_unit_test(test_conf_reserve),
      cmocka_unit_test(test_checker_catches),
      cmocka_unit_test(test_faults_direct),
      cmocka_unit_test(test_fault_sweep),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_record_model),
      cmocka_unit_test(test_record_options),
      cmocka_unit_test(test_dump_pickle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
