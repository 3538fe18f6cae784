/*
 * test_alloc_sim.c -- the allocator on the real "sim" runtime with real
 * alloc-conf strings (conf.c's parser): the frozen max_split_size stat,
 * roundup_power2_divisions through malloc, expandable segments and GC
 * configured by string, msnap_set_allocator_settings, and fault injection
 * through msnap_sim_fail_nth at every runtime call site the allocator
 * uses, with msnap_sim_live_allocations back to its baseline.
 */
#include "talloc.h"
#include "workload.h"

static msnap_allocator_t *mk_sim(msnap_profile_t prof, const char *conf,
                                 uint64_t memory) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = (int)prof;
  o.runtime_name = "sim";
  o.sim_devices = 1;
  o.sim_memory = memory;
  o.caching_disabled = 0;
  o.alloc_conf = conf;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0)
    fail_msg("create(%s): %d %s", conf, rc, err);
  INV(a);
  return a;
}

static void sim_done(msnap_allocator_t *a) {
  INV(a);
  char msg[256];
  assert_int_equal(msnap__sim_check(msnap_runtime_ctx(a), msg, sizeof msg), 0);
  msnap_allocator_destroy(a);
}

static void conf_strings(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk_sim(prof, "max_split_size_mb:40", 64ull << 30);
    assert_int_equal(S(a).max_split_size, 41943040);
    uint64_t p = M(a, 50 * MiB);
    assert_int_equal(S(a).oversize_segments.current, 1);
    F(a, p);
    uint64_t q = M(a, 30 * MiB); /* refuses the oversize cached block */
    assert_int_not_equal(q, p);
    assert_int_equal(CUR(S(a), segment, ALL), 2);
    F(a, q);
    /* Run-time change: MSS re-parsed, the stat stays frozen. */
    assert_int_equal(msnap_set_allocator_settings(a, "max_split_size_mb:100"),
                     0);
    assert_int_equal(msnap__allocator_conf(a)->max_split_size, 100 * MiB);
    assert_int_equal(S(a).max_split_size, 41943040);
    assert_string_equal(msnap_allocator_settings(a), "max_split_size_mb:100");
    assert_int_equal(msnap_set_allocator_settings(a, "no_such_key:1"),
                     MSNAP_ECONF);
    assert_non_null(strstr(msnap_last_error(), "no_such_key"));
    assert_int_equal(msnap__allocator_conf(a)->max_split_size, 100 * MiB);
    sim_done(a);

    a = mk_sim(prof, "roundup_power2_divisions:[1:4,>:8]", 64ull << 30);
    p = M(a, 1100000);
    BLK(a, p, 1310720, ST_ALLOC);
    assert_int_equal(msnap__round_size(a, 3000000), 3145728);
    assert_int_equal(msnap__round_size(a, 33554432), npu ? 37748736 : 33554432);
    F(a, p);
    sim_done(a);
  }
}

/* Example 13 on the sim with the string config. */
static void expandable_on_sim(void **state) {
  (void)state;
  msnap_allocator_t *a = mk_sim(CUDA, "expandable_segments:True", 64ull << 30);
  uint64_t pa = M(a, 5 * MiB), E = pa;
  uint64_t pb = M(a, 25 * MiB);
  assert_int_equal(pb, E + 5 * MiB);
  assert_int_equal(CUR(S(a), reserved_bytes, ALL), 40 * MiB);
  F(a, pa);
  uint64_t pc = M(a, 8 * MiB);
  assert_int_equal(pc, E + 30 * MiB);
  F(a, pb);
  F(a, pc);
  void *ctx = msnap_runtime_ctx(a);
  assert_int_equal(msnap_sim_live_allocations(ctx), 3); /* VA + 2 maps */
  EC(a);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  assert_int_equal(S(a).num_device_free, 1);
  sim_done(a);
}

/* Example 11 with the string config and the sim's lowest-fit addresses. */
static void gc_on_sim(void **state) {
  (void)state;
  msnap_allocator_t *a =
      mk_sim(CUDA, "garbage_collection_threshold:0.5", 64ull << 30);
  assert_int_equal(msnap_set_memory_fraction(a, 0, 100.0 / 65536.0), 0);
  uint64_t A = M(a, 30 * MiB), B = M(a, 30 * MiB);
  assert_true(A < B);
  F(a, A);
  F(a, B);
  uint64_t D = M(a, 30 * MiB);
  assert_int_equal(D, A);
  F(a, D);
  uint64_t E = M(a, 40 * MiB);
  assert_int_equal(S(a).num_device_free, 1);
  BLK(a, A, 30 * MiB, ST_FREE); /* S1 stays cached */
  assert_int_equal(E, B);       /* GC freed S2; the sim reuses its range */
  BLK(a, B, 40 * MiB, ST_ALLOC);
  F(a, E);
  sim_done(a);
}

static void *g_ctx;
static void sim_complete(uint64_t stream) {
  msnap_sim_complete_events(g_ctx, stream, false);
}

static const char *sites[] = {"malloc",       "free",
                              "event_create", "event_record",
                              "event_query",  "event_synchronize",
                              "vmm_reserve",  "vmm_map",
                              "vmm_unmap",    "vmm_release"};

/* The nth call (1..40) of each site fails once; afterwards the cache is
 * emptied: no allocation, no reserved byte, and the sim holds nothing but
 * the allocator's idle pooled events. */
static void sim_fault_injection(void **state) {
  (void)state;
  uint64_t runs = 0;
  for (size_t si = 0; si < sizeof sites / sizeof sites[0]; si++) {
    for (int exp = 0; exp < 2; exp++) {
      bool vmm = strncmp(sites[si], "vmm", 3) == 0;
      bool dev = !strcmp(sites[si], "malloc") || !strcmp(sites[si], "free");
      if ((vmm && !exp) || (dev && exp))
        continue; /* the site is not used in this mode */
      for (uint64_t nth = 1; nth <= 40; nth++) {
        msnap_allocator_t *a =
            mk_sim(exp ? CUDA : NPU, exp ? "expandable_segments:True" : "",
                   64ull << 30);
        g_ctx = msnap_runtime_ctx(a);
        msnap_sim_set_manual_events(g_ctx, true);
        uint64_t base = msnap_sim_live_allocations(g_ctx);
        msnap_sim_fail_nth(g_ctx, sites[si], nth);
        fi_workload(a, sim_complete);
        msnap_sim_fail_nth(g_ctx, NULL, 0); /* disarm if never reached */
        EC(a);
        msnap_stats_t s = S(a);
        assert_int_equal(CUR(s, allocation, ALL), 0);
        assert_int_equal(CUR(s, active, ALL), 0);
        assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
        /* Only the allocator's idle event pool is still live. */
        uint64_t pooled = msnap__device(a, 0)->nevent_pool;
        assert_int_equal(msnap_sim_live_allocations(g_ctx), base + pooled);
        runs++;
        sim_done(a);
      }
    }
  }
  print_message("sim fault injection: %llu runs\n", (unsigned long long)runs);
}


static void create_errors_and_default(void **state) {
  (void)state;
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = CUDA;
  o.runtime_name = "sim";
  o.alloc_conf = "max_split_size_mb:5";
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = (msnap_allocator_t *)0x1;
  assert_int_equal(msnap_allocator_create(&o, &a), MSNAP_ECONF);
  assert_ptr_equal(a, (msnap_allocator_t *)0x1); /* untouched */
  assert_non_null(strstr(err, "max_split_size_mb"));
  o.alloc_conf = "";
  o.runtime_name = "nosuch";
  assert_int_equal(msnap_allocator_create(&o, &a), MSNAP_EINVAL);
  assert_non_null(strstr(err, "nosuch"));
  o.runtime_name = "sim";
  o.profile = 7;
  assert_int_equal(msnap_allocator_create(&o, &a), MSNAP_EINVAL);

  /* The process-wide allocator comes from the environment. */
  setenv("MEMSNAP_PROFILE", "cuda", 1);
  setenv("MEMSNAP_RUNTIME", "sim", 1);
  setenv("MEMSNAP_SIM_MEMORY", "1G", 1);
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64", 1);
  /* msnap_set_default_runtime: before the default allocator exists only. */
  assert_int_equal(msnap_set_default_runtime(NULL), MSNAP_EINVAL);
  assert_int_equal(msnap_set_default_runtime(msnap_runtime_sim()), 0);
  msnap_allocator_t *d = msnap_default();
  assert_non_null(d);
  assert_null(msnap_default_error());
  assert_ptr_equal(msnap_runtime(d), msnap_runtime_sim());
  assert_int_equal(msnap_set_default_runtime(msnap_runtime_sim()),
                   MSNAP_ESTATE);
  assert_non_null(strstr(msnap_last_error(), "already exists"));
  assert_ptr_equal(msnap_default(), d);
  assert_int_equal(msnap_profile(d), CUDA);
  assert_string_equal(msnap_runtime(d)->name, "sim");
  assert_int_equal(msnap_device_count(d), 1);
  assert_string_equal(msnap_allocator_settings(d), "max_split_size_mb:64");
  size_t fr = 0, tot = 0;
  assert_int_equal(msnap_mem_get_info(d, 0, &fr, &tot), 0);
  assert_int_equal(tot, 1ull << 30);
  uint64_t p = 0;
  assert_int_equal(msnap_malloc(d, 0, 1000, 0, &p), 0);
  size_t sz = 0;
  assert_int_equal(msnap_allocation_size(d, p, &sz), 0);
  assert_int_equal(sz, 1024);
  assert_int_equal(msnap_free(d, p), 0);
  INV(d);
}


/* As torch_npu's test_preemptive_rejection_with_low_fraction: the policy
 * set at run time rejects a 1 GiB request on a 1% budget. */
static void rejection_by_settings(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk_sim(prof, "", 64ull << 30);
    assert_int_equal(
        msnap_set_allocator_settings(
            a, prof == NPU ? "throw_on_npumalloc_oom:True,"
                             "per_process_memory_fraction:0.01"
                           : "throw_on_cudamalloc_oom:True,"
                             "per_process_memory_fraction:0.01"),
        0);
    uint64_t p = 0;
    assert_int_equal(msnap_malloc(a, 0, 1ull << 30, 0, &p), MSNAP_EREJECTED);
    INV(a);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_oom_rejections, 1);
    assert_int_equal(s.num_ooms, 0);
    uint64_t q = M(a, 100 * MiB); /* within the budget */
    F(a, q);
    sim_done(a);
  }
}

/* Fuzz find (tests/corpus/alloc_trace/known-expandable-switch, replayed
 * by corpus_alloc_trace): npu profile, a split non-expandable segment, then
 * expandable_segments switched on at run time.  The next >= 2 MiB request
 * reuses the non-expandable remainder, and torch_npu's base-address
 * alignment (decided by the global flag, §20.4) splits a 14848-byte head
 * off it.  That head is a free split block of a non-expandable segment, so
 * inactive_split must count it (§6.2, §9.2: the test is per segment).
 * Then the reverse: blocks of an expandable segment while the flag is off
 * again never enter inactive_split. */
static void expandable_switch_inactive_split(void **state) {
  (void)state;
  msnap_allocator_t *a = mk_sim(NPU, "", 64ull << 30);
  uint64_t p = M(a, 1115419); /* 1115419 + 32 pad -> 1115648 */
  uint64_t base = p;
  assert_int_equal(base % (2 * MiB), 0);
  BLK(a, p, 1115648, ST_ALLOC);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 1115648);

  assert_int_equal(
      msnap_set_allocator_settings(a, "expandable_segments:True"), 0);
  INV(a);
  /* 2097152 + 32 -> 2097664; the remainder at base + 1115648 is 1536
   * bytes past a 16 KiB boundary: a 14848-byte head stays behind. */
  uint64_t q = M(a, 2097152);
  assert_int_equal(q, base + 1130496);
  BLK(a, base + 1115648, 14848, ST_FREE);
  BLK(a, q, 2097664, ST_ALLOC);
  BLK(a, q + 2097664, 20 * MiB - 1130496 - 2097664, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL),
                   14848 + 20 * MiB - 1130496 - 2097664);
  assert_int_equal(CUR(s, inactive_split, LARGE_POOL), 2);

  /* Freeing q merges it with the head and the remainder. */
  F(a, q);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 1115648);

  /* A fresh expandable segment while the flag is on: never counted.  The
   * next request (3 MiB + 32 -> 3146240) is again carved, aligned, from
   * the non-expandable segment: a head and a remainder counted. */
  uint64_t e = M(a, 30 * MiB);
  assert_true(blk(a, e)->seg->expandable);
  uint64_t e2 = M(a, 3 * MiB);
  assert_int_equal(e2, base + 1130496);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL),
                   14848 + 20 * MiB - 1130496 - 3146240);

  /* Flag off again with expandable blocks live; the expandable segment's
   * free block is then skipped and 5 MiB + 32 -> 5243392 is split from
   * the non-expandable remainder, unaligned. */
  assert_int_equal(
      msnap_set_allocator_settings(a, "expandable_segments:False"), 0);
  INV(a);
  F(a, e);
  uint64_t e3 = M(a, 5 * MiB);
  assert_int_equal(e3, base + 1130496 + 3146240);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL),
                   14848 + 20 * MiB - 1130496 - 3146240 - 5243392);
  F(a, e2);
  F(a, e3);
  F(a, p);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);
  EC(a);
  assert_int_equal(CUR(S(a), reserved_bytes, ALL), 0);
  sim_done(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(conf_strings),
      cmocka_unit_test(expandable_on_sim),
      cmocka_unit_test(gc_on_sim),
      cmocka_unit_test(sim_fault_injection),
      cmocka_unit_test(create_errors_and_default),
      cmocka_unit_test(rejection_by_settings),
      cmocka_unit_test(expandable_switch_inactive_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
