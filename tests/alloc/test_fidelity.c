/*
 * test_fidelity.c -- the divergences of issue 16, each against the
 * PyTorch (c10/cuda/CUDACachingAllocator.cpp, "CCA") or torch_npu
 * (torch_npu/csrc/core/npu/NPUCachingAllocator.cpp, "NCA") function it
 * mirrors, on the deterministic fake runtime (fake_rt.c).  Every helper
 * of talloc.h runs the invariant checker after each operation.
 */
#include <pthread.h>

#include "talloc.h"
#include "api/api.h"

static const msnap_profile_t profiles[2] = {NPU, CUDA};

static uint64_t pool_of(msnap_allocator_t *a, uint64_t p, bool *is_private) {
  const msnap_block_t *b = blk(a, p);
  assert_non_null(b);
  *is_private = b->pool->owner != NULL;
  return b->pool->owner ? b->pool->owner->id.second : 0;
}

/* ---- MemPool scope vs graph capture ----------------------------------------
 * CCA / NCA malloc: the free-cache-and-retry step runs unless
 * is_capture_context() (a real capture, markCaptureBegin); an
 * allocate-to-pool scope (use_mem_pool) is no capture.  The repro of the
 * issue: 1 GiB device, 600 MiB cached in the default pool, a 600 MiB
 * allocation inside use_mem_pool. */
static void mempool_scope_frees_cache_and_retries(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    fake_cfg_t cfg = {.total = 1024 * MiB};
    msnap_allocator_t *a = mk_cfg(profiles[k], NULL, &cfg);
    uint64_t cached = M(a, 600 * MiB);
    F(a, cached);
    assert_true(CUR(S(a), reserved_bytes, ALL) >= (int64_t)(600 * MiB));
    msnap_mempool_id_t id;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_begin_allocate_current_thread_to_pool(a, 0, id), 0);
    uint64_t p = 0;
    int rc = msnap_malloc(a, 0, 600 * MiB, 0, &p);
    assert_int_equal(rc, 0);
    INV(a);
    bool priv;
    assert_int_equal(pool_of(a, p, &priv), id.second);
    assert_true(priv);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_alloc_retries, 1); /* alloc_block(isRetry) */
    assert_int_equal(s.num_device_free, 1);   /* the cached 600 MiB */
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    F(a, p);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    done(a);
  }
}

/* The same inside a real capture on the stream: no free-cache-and-retry,
 * so the allocation fails (CCA/NCA malloc: C10_LIKELY(!is_capture_context())
 * guards release_cached_blocks). */
static void real_capture_skips_the_retry(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    fake_cfg_t cfg = {.total = 1024 * MiB};
    msnap_allocator_t *a = mk_cfg(profiles[k], NULL, &cfg);
    uint64_t cached = M(a, 600 * MiB);
    F(a, cached);
    msnap_mempool_id_t id;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
    assert_int_equal(msnap_mark_capture_begin(a, 0, 0), 0);
    uint64_t p = 0;
    assert_int_equal(msnap_malloc(a, 0, 600 * MiB, 0, &p), MSNAP_EOOM);
    INV(a);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_device_free, 0);
    /* A capture on another stream does not stop this stream's retry
     * (is_capture_context asks about the current stream). */
    assert_int_equal(msnap_mark_capture_end(a, 0, 0), 0);
    assert_int_equal(msnap_mark_capture_begin(a, 0, 77), 0);
    assert_int_equal(msnap_malloc(a, 0, 600 * MiB, 0, &p), 0);
    INV(a);
    assert_int_equal(msnap_mark_capture_end(a, 0, 77), 0);
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    F(a, p);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    done(a);
  }
}

/* empty_cache inside a use_mem_pool scope releases the default pools
 * (release_cached_blocks: mempool_id {0,0} && !is_capture_context()); in a
 * capture it leaves them alone. */
static void empty_cache_in_scope(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    msnap_allocator_t *a = mk(profiles[k], NULL);
    F(a, M(a, 30 * MiB));
    msnap_mempool_id_t id;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_begin_allocate_current_thread_to_pool(a, 0, id), 0);
    EC(a);
    assert_int_equal(CUR(S(a), reserved_bytes, ALL), 0);
    F(a, M(a, 30 * MiB)); /* routed: cached in the pool */
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    F(a, M(a, 30 * MiB)); /* default pool */
    assert_int_equal(msnap_mark_capture_begin(a, 0, 5), 0);
    EC(a);
    /* the default pool's 30 MiB and the live pool's 30 MiB stay */
    assert_int_equal(CUR(S(a), segment, ALL), 2);
    assert_int_equal(msnap_mark_capture_end(a, 0, 5), 0);
    EC(a);
    assert_int_equal(CUR(S(a), segment, ALL), 1); /* the live pool's */
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(CUR(S(a), segment, ALL), 0);
    done(a);
  }
}

/* A cross-stream free inside a use_mem_pool scope inserts its event at
 * once (CCA/NCA free: deferred only if is_capture_context()), and the
 * next malloc processes events (no capture). */
static void cross_stream_free_in_scope_not_deferred(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    msnap_allocator_t *a = mk(profiles[k], NULL);
    msnap_mempool_id_t id;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_begin_allocate_current_thread_to_pool(a, 0, id), 0);
    fake_set_manual_events(true);
    uint64_t p = M(a, 4096);
    R(a, p, 9);
    uint64_t ev = fake_calls("event_record");
    F(a, p);
    assert_false(blk(a, p)->deferred);
    assert_int_equal(fake_calls("event_record"), ev + 1);
    fake_complete_events(9);
    uint64_t q = M(a, 4096); /* events processed: p's block is reused */
    assert_int_equal(q, p);
    F(a, q);
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    done(a);
  }
}

/* Streams recorded during a capture are dropped before the deferred
 * events are inserted (CCA insert_events_deferred_until_no_capture ->
 * remove_cudagraph_stream_uses; NCA remove_npugraph_stream_uses). */
static void capture_stream_uses_dropped(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  fake_set_manual_events(true);
  uint64_t p = M(a, 4096);
  R(a, p, 9); /* before the capture: kept */
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
  assert_int_equal(msnap_mark_capture_begin(a, 0, 0), 0);
  R(a, p, 11); /* during the capture: part of the graph */
  uint64_t ev = fake_calls("event_record");
  F(a, p);
  assert_true(blk(a, p)->deferred);
  assert_int_equal(msnap_mark_capture_end(a, 0, 0), 0);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  uint64_t x = M(a, 4096); /* process_events: deferred -> one event */
  assert_int_equal(fake_calls("event_record"), ev + 1);
  assert_int_equal(blk(a, p)->event_count, 1);
  fake_complete_events(9);
  uint64_t y = M(a, 4096);
  assert_int_equal(y, p);
  F(a, x);
  F(a, y);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  done(a);
}

/* ---- use_mem_pool routes only the current thread --------------------------
 * torch.cuda.use_mem_pool -> _cuda_beginAllocateCurrentThreadToPool: the
 * filter is std::this_thread::get_id() == tid. */
typedef struct thread_arg_s {
  msnap_allocator_t *a;
  uint64_t ptr;
  int rc;
} thread_arg_t;

static void *other_thread(void *arg) {
  thread_arg_t *t = arg;
  t->rc = msnap_malloc(t->a, 0, 4096, 0, &t->ptr);
  return NULL;
}

static void use_mem_pool_routes_current_thread_only(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    msnap_allocator_t *a = mk(profiles[k], NULL);
    msnap_mempool_id_t id;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_begin_allocate_current_thread_to_pool(a, 0, id), 0);
    uint64_t mine = M2(a, 4096, 3); /* any stream of this thread */
    thread_arg_t t = {a, 0, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(t.rc, 0);
    INV(a);
    bool priv;
    assert_int_equal(pool_of(a, mine, &priv), id.second);
    assert_true(priv);
    pool_of(a, t.ptr, &priv);
    assert_false(priv); /* the other thread kept the default pool */
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    F(a, mine);
    F(a, t.ptr);
    /* A stream filter (graph capture's) routes every thread on it. */
    assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
    assert_int_equal(pthread_create(&th, NULL, other_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(pool_of(a, t.ptr, &priv), id.second);
    assert_true(priv);
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    F(a, t.ptr);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    done(a);
  }
}

/* ---- recordStream on the block's own stream --------------------------------
 * CCA DeviceCachingAllocator::recordStream ignores the allocation stream;
 * NCA's inserts every stream, so the free waits for an event recorded on
 * the block's own stream. */
static void record_stream_own_stream(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    bool npu = profiles[k] == NPU;
    msnap_allocator_t *a = mk(profiles[k], NULL);
    fake_set_manual_events(true);
    uint64_t p = M2(a, 4096, 5);
    R(a, p, 5);
    assert_int_equal(blk(a, p)->nuses, npu ? 1 : 0);
    uint64_t ev = fake_calls("event_record");
    F(a, p);
    assert_int_equal(fake_calls("event_record"), ev + (npu ? 1 : 0));
    if (npu) {
      BLK(a, p, msnap__round_size(a, 4096), ST_PENDING);
      assert_int_equal(blk(a, p)->event_count, 1);
      uint64_t q = M2(a, 4096, 5); /* the event is pending: not reused */
      assert_int_not_equal(q, p);
      fake_complete_events(5);
      uint64_t r = M2(a, 4096, 5);
      assert_int_equal(r, p);
      F(a, q);
      F(a, r);
    } else {
      BLK(a, p, 2 * MiB, ST_FREE); /* merged back: no event */
      uint64_t q = M2(a, 4096, 5);
      assert_int_equal(q, p);
      F(a, q);
    }
    done(a);
  }
}

/* ---- the npu pad: AddPadSize() --------------------------------------------
 * NCA AddPadSize: 0 when GetSocVersion() >= Ascend950 and
 * IsGteCANNVersion("9.1.0", "CANN") (GetCANNInfo.cpp
 * CompareVersionsByDispatch), else 32. */
static void cann_version_compare(void **state) {
  (void)state;
  static const struct {
    const char *v;
    bool ge;
  } cases[] = {
      {"9.1.0", true},         {"9.1.1", true},       {"9.2.0", true},
      {"10.0.0", true},        {"9.1.0.beta1", false}, {"9.1.0-rc1", false},
      {"9.1.0.alpha2", false}, {"9.0.9", false},      {"9.0.0", false},
      {"8.5.0", false},        {"8.1.RC1", false},    {"8.3.T10", false},
      {"", false},             {"9.1", false},        {"x.1.0", false},
      {"9.1.0-", false},       {"9.1.1-alpha", true}, {"9.1.0.rc", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (msnap__cann_version_at_least_9_1_0(cases[i].v) != cases[i].ge)
      fail_msg("CANN %s: expected %s", cases[i].v,
               cases[i].ge ? ">= 9.1.0" : "< 9.1.0");
  assert_true(msnap__soc_is_ascend950("Ascend950PR_9579"));
  assert_true(msnap__soc_is_ascend950("Ascend950"));
  assert_false(msnap__soc_is_ascend950("Ascend910B1"));
  assert_false(msnap__soc_is_ascend950("Ascend910_9391"));
  assert_false(msnap__soc_is_ascend950(NULL));
}

static void npu_pad_from_runtime(void **state) {
  (void)state;
  static const struct {
    const char *soc, *cann;
    uint64_t pad;
  } cases[] = {
      {"Ascend950PR_9579", "9.1.0", 0}, {"Ascend950DT", "9.2.0", 0},
      {"Ascend950PR_9579", "9.0.0", 32}, {"Ascend910B1", "9.1.0", 32},
      {"Ascend950PR_9579", NULL, 32},    {NULL, "9.1.0", 32},
      {NULL, NULL, 32},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_cfg_t cfg = {.soc_name = cases[i].soc,
                      .cann_version = cases[i].cann};
    msnap_allocator_t *a = mk_cfg(NPU, NULL, &cfg);
    assert_int_equal(a->npu_pad, cases[i].pad);
    if (cases[i].pad == 0) {
      /* round_size without the pad: 512 stays 512, a 1 MiB request is
       * small-pool (with the pad it is 1 MiB + 512, large). */
      assert_int_equal(msnap__round_size(a, 512), 512);
      assert_int_equal(msnap__round_size(a, 481), 512);
      uint64_t p = M(a, MiB);
      assert_true(blk(a, p)->pool->is_small);
      F(a, p);
    } else {
      assert_int_equal(msnap__round_size(a, 512), 1024);
      assert_int_equal(msnap__round_size(a, 481), 1024);
      uint64_t p = M(a, MiB);
      assert_false(blk(a, p)->pool->is_small);
      F(a, p);
    }
    done(a);
  }
  /* cuda: no pad whatever the runtime says */
  fake_cfg_t cfg = {.soc_name = "Ascend910B1", .cann_version = "8.5.0"};
  msnap_allocator_t *a = mk_cfg(CUDA, NULL, &cfg);
  assert_int_equal(msnap__round_size(a, 512), 512);
  done(a);
}

/* ---- try_mempool_fallback -------------------------------------------------
 * CCA/NCA try_mempool_fallback iterates use_on_oom_pools, a
 * ska::flat_hash_set<MempoolId_t, MempoolIdHash>.  The orders below were
 * printed by a program using c10/util/flat_hash_map.h of torch 2.13
 * (inserting {0,1}..{0,12}, erasing {0,3}, {0,7}, {0,1}, inserting
 * {0,13}, {0,14}). */
static void order_of(msnap_allocator_t *a, uint64_t *out, size_t *n) {
  const msnap_idset_t *s = &msnap__device(a, 0)->oom_pools;
  *n = 0;
  for (uint64_t i = 0; i < msnap__idset_end(s); i++)
    if (s->dist[i] >= 0)
      out[(*n)++] = s->v[i].second;
}

static void use_on_oom_set_order(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  msnap_mempool_id_t ids[15];
  uint64_t got[16];
  size_t n;
  static const uint64_t after1[] = {1}, after2[] = {2, 1},
                        after4[] = {2, 4, 1, 3},
                        after12[] = {5, 10, 2, 7, 12, 4, 9, 1, 6, 11, 3, 8};
  for (int i = 1; i <= 12; i++) {
    assert_int_equal(msnap_mempool_create(a, 0, true, false, &ids[i]), 0);
    assert_int_equal(ids[i].second, (uint64_t)i);
    INV(a);
    order_of(a, got, &n);
    const uint64_t *want = i == 1   ? after1
                           : i == 2 ? after2
                           : i == 4 ? after4
                                    : i == 12 ? after12 : NULL;
    if (want) {
      assert_int_equal(n, (size_t)i);
      assert_memory_equal(got, want, n * sizeof *got);
    }
  }
  /* the last reference of a pool takes it out (MemPool's destructor:
   * setUseOnOOM(false)) */
  assert_int_equal(msnap_mempool_release(a, 0, ids[3]), 0);
  assert_int_equal(msnap_mempool_release(a, 0, ids[7]), 0);
  assert_int_equal(msnap_mempool_release(a, 0, ids[1]), 0);
  INV(a);
  static const uint64_t erased[] = {5, 10, 2, 12, 4, 9, 6, 11, 8};
  order_of(a, got, &n);
  assert_int_equal(n, 9);
  assert_memory_equal(got, erased, sizeof erased);
  assert_int_equal(msnap_mempool_create(a, 0, true, false, &ids[13]), 0);
  assert_int_equal(msnap_mempool_create(a, 0, true, false, &ids[14]), 0);
  INV(a);
  static const uint64_t again[] = {13, 5, 10, 2, 12, 4, 9, 14, 6, 11, 8};
  order_of(a, got, &n);
  assert_int_equal(n, 11);
  assert_memory_equal(got, again, sizeof again);
  for (int i = 2; i <= 14; i++)
    if (i != 3 && i != 7)
      assert_int_equal(msnap_mempool_release(a, 0, ids[i]), 0);
  order_of(a, got, &n);
  assert_int_equal(n, 0);
  done(a);
}

/* Two use_on_oom pools with a fitting cached block: the fallback takes the
 * one first in the set's order ({0,2} before {0,1}), not the older one. */
static void fallback_takes_set_order(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  msnap_mempool_id_t p1, p2;
  assert_int_equal(msnap_mempool_create(a, 0, true, false, &p1), 0);
  assert_int_equal(msnap_mempool_create(a, 0, true, false, &p2), 0);
  msnap_mempool_id_t both[2] = {p1, p2};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(msnap_begin_allocate_to_pool(a, 0, both[i], 0, false), 0);
    F(a, M(a, 12 * MiB));
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, both[i]), 0);
  }
  /* no room for a new default-pool segment */
  assert_int_equal(msnap_set_memory_fraction(a, 0, 30.0 / 65536.0), 0);
  uint64_t r = M(a, 12 * MiB);
  bool priv;
  assert_int_equal(pool_of(a, r, &priv), p2.second);
  assert_true(priv);
  assert_int_equal(S(a).num_ooms, 0);
  F(a, r);
  for (int i = 0; i < 2; i++) { /* begin's reference, create's */
    assert_int_equal(msnap_mempool_release(a, 0, both[i]), 0);
    assert_int_equal(msnap_mempool_release(a, 0, both[i]), 0);
  }
  done(a);
}

/* The fallback searches with expandable segments off
 * (AllocParams(..., false)): a use_on_oom pool's expandable block is not
 * taken. */
static void tweak_expandable(msnap_conf_t *c) { c->expandable_segments = true; }

static void fallback_skips_expandable_blocks(void **state) {
  (void)state;
  fake_cfg_t cfg = {.total = 100 * MiB};
  msnap_allocator_t *a = mk_cfg(CUDA, tweak_expandable, &cfg);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, true, false, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
  uint64_t big = M(a, 60 * MiB);
  assert_true(blk(a, big)->seg->expandable);
  F(a, big);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  uint64_t p = 0;
  assert_int_equal(msnap_malloc(a, 0, 50 * MiB, 0, &p), MSNAP_EOOM);
  INV(a);
  assert_int_equal(S(a).num_ooms, 1);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  done(a);
}

/* ---- expandable_segments_reserve -------------------------------------------
 * CUDAAllocatorConfig expandable_segments_reserve_decision +
 * clamp_reserve_bytes (pytorch#192269): a segment's VA is the configured
 * reserve of the stream's class, else the default reserve, capped at
 * total + total / 8; ExpandableSegment reserves numSegments(reserve)
 * granules. */
static void expandable_reserve(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, CUDA);
  char err[256];
  uint64_t total = 80ull << 30;
  assert_int_equal(msnap__conf_reserve_bytes(&c, "", total),
                   total + total / 8);
  assert_int_equal(msnap__conf_parse(&c,
                                     "expandable_segments_reserve:0.5,"
                                     "expandable_segments_reserve_by_class:"
                                     "[serving:0.25,big:4G,huge:1e20G,bad:12X]",
                                     err, sizeof err),
                   0);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "", total), total / 2);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "other", total), total / 2);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "serving", total), total / 4);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "big", total), 4ull << 30);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "huge", total),
                   total + total / 8);
  assert_int_equal(c.nreserve_classes, 3); /* bad:12X warned, skipped */
  /* a bad value is ignored: the previous one stays */
  assert_int_equal(msnap__conf_parse(&c, "expandable_segments_reserve:0",
                                     err, sizeof err),
                   0);
  assert_int_equal(msnap__conf_reserve_bytes(&c, "", total), total / 2);
  assert_int_equal(msnap__conf_check(&c, err, sizeof err), 0);
  msnap__conf_destroy(&c);
  /* npu: torch_npu has no such key */
  msnap__conf_init(&c, NPU);
  assert_int_equal(msnap__conf_parse(&c, "expandable_segments_reserve:0.5",
                                     err, sizeof err),
                   MSNAP_ECONF);
  msnap__conf_destroy(&c);

  /* On the allocator: 1 GiB device, large granule 20 MiB. */
  fake_cfg_t cfg = {.total = 1024 * MiB};
  msnap_allocator_t *a = mk_cfg(CUDA, NULL, &cfg);
  assert_int_equal(msnap_set_allocator_settings(
                       a, "expandable_segments:True,"
                          "expandable_segments_reserve:0.25,"
                          "expandable_segments_reserve_by_class:[small:0.05]"),
                   0);
  uint64_t p = M2(a, 30 * MiB, 1);
  /* ceil(256 MiB / 20 MiB) = 13 granules */
  assert_int_equal(blk(a, p)->seg->size, 13 * 20 * MiB);
  assert_int_equal(msnap_set_expandable_segment_reserve_class(a, 2, "small"),
                   0);
  uint64_t q = M2(a, 30 * MiB, 2);
  /* ceil(51.2 MiB / 20 MiB) = 3 granules */
  assert_int_equal(blk(a, q)->seg->size, 3 * 20 * MiB);
  /* a request larger than the class's reserve: OOM naming the knob */
  uint64_t r = 0;
  assert_int_equal(msnap_malloc(a, 0, 70 * MiB, 2, &r), MSNAP_EOOM);
  INV(a);
  assert_non_null(strstr(msnap_last_error(), "expandable_segments_reserve"));
  assert_int_equal(msnap_set_expandable_segment_reserve_class(a, 2, ""), 0);
  uint64_t t = M2(a, 70 * MiB, 2); /* untagged: the default 0.25 */
  assert_int_equal(blk(a, t)->seg->size, 13 * 20 * MiB);
  F(a, p);
  F(a, q);
  F(a, t);
  done(a);
}

/* ---- OOM message ------------------------------------------------------------
 * CCA malloc: "... is free. " + reportProcessMemoryInfo + allowed_info +
 * "Of the allocated memory ..."; the expandable-segments suggestion only
 * while they are off (pytorch#191105).  The fake runtime has no process
 * query (reportProcessMemoryInfo without NVML: ""). */
static void oom_message_expandable_hint(void **state) {
  (void)state;
  for (int on = 0; on < 2; on++) {
    fake_cfg_t cfg = {.total = 100 * MiB};
    msnap_allocator_t *a = mk_cfg(CUDA, on ? tweak_expandable : NULL, &cfg);
    uint64_t p = 0;
    assert_int_equal(msnap_malloc(a, 0, 200 * MiB, 0, &p), MSNAP_EOOM);
    const char *m = msnap_last_error();
    assert_non_null(strstr(m, "CUDA out of memory. Tried to allocate 200.00 "
                              "MiB. GPU 0 has a total capacity of 100.00 MiB "
                              "of which 100.00 MiB is free. Of the allocated"));
    bool hint = strstr(m, "expandable_segments:True") != NULL;
    assert_int_equal(hint, !on);
    assert_non_null(strstr(m, "is reserved by PyTorch but unallocated."));
    assert_non_null(strstr(m, "See documentation for Memory Management"));
    done(a);
  }
}

/* ---- pinned thresholds default to SIZE_MAX ---------------------------------
 * AcceleratorAllocatorConfig: pinned_max_round_threshold_ and
 * pinned_max_cached_size_ are std::numeric_limits<size_t>::max(). */
static void pinned_defaults(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, CUDA);
  assert_int_equal(c.pinned_max_round_threshold, UINT64_MAX);
  assert_int_equal(c.pinned_max_cached_size, UINT64_MAX);
  char err[128];
  assert_int_equal(msnap__conf_parse(&c, "pinned_max_cached_size_mb:0", err,
                                     sizeof err),
                   0);
  assert_int_equal(c.pinned_max_cached_size, 0); /* a real limit */
  msnap__conf_destroy(&c);
  /* _snapshot()["allocator_settings"]: SIZE_MAX, written as -1 like every
   * limit above 2^53 - 1 (docs/design.md). */
  msnap_allocator_t *a = mk(CUDA, NULL);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  const msnap_gv_t *d = &s->allocator_settings;
  int found = 0;
  for (uint32_t i = 0; i + 1 < d->u.seq.n; i += 2) {
    size_t n;
    const char *k = msnap__snap_str(s, d->u.seq.items[i].u.s, &n);
    if ((n == 19 && !memcmp(k, "max_round_threshold", 19)) ||
        (n == 15 && !memcmp(k, "max_cached_size", 15))) {
      assert_int_equal(d->u.seq.items[i + 1].u.i, -1);
      found++;
    }
  }
  assert_int_equal(found, 2);
  msnap__snap_free(s);
  done(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mempool_scope_frees_cache_and_retries),
      cmocka_unit_test(real_capture_skips_the_retry),
      cmocka_unit_test(empty_cache_in_scope),
      cmocka_unit_test(cross_stream_free_in_scope_not_deferred),
      cmocka_unit_test(capture_stream_uses_dropped),
      cmocka_unit_test(use_mem_pool_routes_current_thread_only),
      cmocka_unit_test(record_stream_own_stream),
      cmocka_unit_test(cann_version_compare),
      cmocka_unit_test(npu_pad_from_runtime),
      cmocka_unit_test(use_on_oom_set_order),
      cmocka_unit_test(fallback_takes_set_order),
      cmocka_unit_test(fallback_skips_expandable_blocks),
      cmocka_unit_test(expandable_reserve),
      cmocka_unit_test(oom_message_expandable_hint),
      cmocka_unit_test(pinned_defaults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
