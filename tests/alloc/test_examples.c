/*
 * test_examples.c -- every worked example of allocator-algorithm.md §21,
 * in the "cuda" profile with the values the spec gives, and the same call
 * sequence in the "npu" profile with the values torch_npu's rules give
 * (§20: +32-byte pad before rounding, page rules, base-address alignment
 * with expandable segments).  NPU values are derived in the comments.
 *
 * Segment bases come from the fake runtime: the first device malloc is at
 * fake_next_address(0), later ones follow, 2 MiB aligned, never reused.
 */
#include "talloc.h"

/* ---- Example 1: small pool packing, best fit, coalescing, empty_cache -- */

static void ex1_cuda(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t pa = M(a, 1);
  assert_int_equal(pa, S1);
  BLK(a, S1, 512, ST_ALLOC);
  BLK(a, S1 + 512, 2096640, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, segment, ALL), 1);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 2097152);
  assert_int_equal(CUR(s, allocation, ALL), 1);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 512);
  assert_int_equal(CUR(s, active_bytes, ALL), 512);
  assert_int_equal(CUR(s, requested_bytes, ALL), 1);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2096640);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(CUR(s, allocated_bytes, SMALL_POOL), 512);
  assert_int_equal(CUR(s, inactive_split_bytes, SMALL_POOL), 2096640);
  assert_int_equal(CUR(s, reserved_bytes, LARGE_POOL), 0);
  assert_int_equal(CUR(s, segment, LARGE_POOL), 0);

  uint64_t pb = M(a, 1000);
  assert_int_equal(pb, S1 + 512);
  BLK(a, S1 + 512, 1024, ST_ALLOC);
  BLK(a, S1 + 1536, 2095616, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2095616);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 1536);
  assert_int_equal(CUR(s, requested_bytes, ALL), 1001);

  F(a, pa);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2096128);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 1024);
  assert_int_equal(CUR(s, active_bytes, ALL), 1024);
  assert_int_equal(CUR(s, requested_bytes, ALL), 1000);

  uint64_t pc = M(a, 512);
  assert_int_equal(pc, S1);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2095616);

  F(a, pb);
  BLK(a, S1 + 512, 2096640, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2096640);

  F(a, pc);
  BLK(a, S1, 2097152, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 2097152);

  EC(a);
  s = S(a);
  assert_int_equal(s.num_sync_all_streams, 1);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(CUR(s, segment, ALL), 0);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].peak, 1536);
  assert_int_equal(s.reserved_bytes[MSNAP_STAT_ALL].peak, 2097152);
  assert_int_equal(s.max_split_size, -1);
  done(a);
}

/*
 * NPU: 1 -> 33 -> 512; 1000 -> 1032 -> 1536 (not 1024); 512 -> 544 -> 1024,
 * so step 4 cannot reuse the 512-byte hole and splits the tail instead.
 */
static void ex1_npu(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t pa = M(a, 1);
  assert_int_equal(pa, S1);
  BLK(a, S1 + 512, 2096640, ST_FREE);
  uint64_t pb = M(a, 1000);
  assert_int_equal(pb, S1 + 512);
  BLK(a, S1 + 512, 1536, ST_ALLOC);
  BLK(a, S1 + 2048, 2095104, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2095104);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 2048);
  assert_int_equal(CUR(s, requested_bytes, ALL), 1001);
  F(a, pa);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2095616);
  uint64_t pc = M(a, 512); /* 544 -> 1024: the 512-byte hole is too small */
  assert_int_equal(pc, S1 + 2048);
  BLK(a, S1 + 2048, 1024, ST_ALLOC);
  BLK(a, S1 + 3072, 2094080, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2094592);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 2560);
  F(a, pb); /* merges with the free S1+0 (512): S1+0 is 2048 */
  BLK(a, S1, 2048, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2096128);
  F(a, pc);
  BLK(a, S1, 2097152, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  EC(a);
  s = S(a);
  assert_int_equal(s.num_sync_all_streams, 1);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].peak, 2560);
  done(a);
}

/* ---- Example 2: 1-10 MiB requests, split needs remainder > 1 MiB ------- */

static void ex2_cuda(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t pa = M(a, 9437184);
  assert_int_equal(pa, S1);
  BLK(a, S1 + 9437184, 11534336, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, inactive_split, LARGE_POOL), 1);
  assert_int_equal(CUR(s, inactive_split_bytes, LARGE_POOL), 11534336);
  uint64_t pb = M(a, 10485760);
  assert_int_equal(pb, S1 + 9437184);
  BLK(a, pb, 11534336, ST_ALLOC);
  s = S(a);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 20971520);
  assert_int_equal(CUR(s, requested_bytes, ALL), 19922944);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);
  assert_int_equal(nsegs(a), 1);
  uint64_t S2 = fake_next_address(0);
  uint64_t pc = M(a, 10485759);
  assert_int_equal(pc, S2);
  BLK(a, S2, 10485760, ST_ALLOC);
  uint64_t S3 = fake_next_address(0);
  uint64_t pd = M(a, 10485248);
  assert_int_equal(pd, S3);
  BLK(a, S3 + 10485248, 10486272, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, segment, LARGE_POOL), 3);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 52428800);
  F(a, pa);
  F(a, pb);
  F(a, pc);
  F(a, pd);
  done(a);
}

/*
 * NPU (also Example 14): 9437184 -> 9437696, tail 11533824; 10485760 ->
 * 10486272 takes the tail unsplit (remainder 1047552).  10485759 ->
 * 10486272 >= 10 MiB -> 12 MiB segment, remainder 2096640 > 1 MiB: split.
 * 10485248 -> 10485760 -> exactly 10 MiB segment.
 */
static void ex2_npu(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t pa = M(a, 9437184);
  BLK(a, S1, 9437696, ST_ALLOC);
  BLK(a, S1 + 9437696, 11533824, ST_FREE);
  uint64_t pb = M(a, 10485760);
  assert_int_equal(pb, S1 + 9437696);
  BLK(a, pb, 11533824, ST_ALLOC);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, allocated_bytes, ALL), 20971520);
  assert_int_equal(CUR(s, requested_bytes, ALL), 19922944);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  uint64_t S2 = fake_next_address(0);
  uint64_t pc = M(a, 10485759);
  assert_int_equal(pc, S2);
  BLK(a, S2, 10486272, ST_ALLOC);
  BLK(a, S2 + 10486272, 2096640, ST_FREE);
  uint64_t S3 = fake_next_address(0);
  uint64_t pd = M(a, 10485248);
  assert_int_equal(pd, S3);
  BLK(a, S3, 10485760, ST_ALLOC);
  s = S(a);
  assert_int_equal(CUR(s, segment, LARGE_POOL), 3);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 20971520 + 12582912 +
                                                    10485760);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 2096640);
  F(a, pa);
  F(a, pb);
  F(a, pc);
  F(a, pd);
  done(a);
}

/* ---- Example 3: >= 10 MiB rounding, reuse of a big cached block -------- */

static void ex3(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk(prof, NULL);
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M(a, 11534336);
    /* npu: 11534368 -> 11534848; remainder 1048064 is not > 1 MiB */
    BLK(a, S1, 12582912, ST_ALLOC);
    msnap_stats_t s = S(a);
    assert_int_equal(CUR(s, allocated_bytes, ALL), 12582912);
    assert_int_equal(CUR(s, requested_bytes, ALL), 11534336);
    F(a, pa);
    BLK(a, S1, 12582912, ST_FREE);
    assert_int_equal(CUR(S(a), inactive_split, ALL), 0);
    uint64_t pc = M(a, 1572864);
    assert_int_equal(pc, S1);
    uint64_t csz = npu ? 1573376 : 1572864; /* 1572896 -> 1573376 */
    BLK(a, S1, csz, ST_ALLOC);
    BLK(a, S1 + csz, 12582912 - csz, ST_FREE);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 1);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 12582912 - csz);
    assert_int_equal(s.num_device_alloc, 1);
    F(a, pc);
    done(a);
  }
}

/* ---- Example 4: the 1 MiB boundary ------------------------------------- */

static void ex4_cuda(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t p1 = M(a, 1048576);
  assert_int_equal(p1, S1);
  BLK(a, S1 + MiB, MiB, ST_FREE);
  uint64_t p2 = M(a, 1048576);
  assert_int_equal(p2, S1 + MiB);
  assert_int_equal(CUR(S(a), inactive_split, SMALL_POOL), 0);
  uint64_t S2 = fake_next_address(0);
  uint64_t p3 = M(a, 1048577);
  assert_int_equal(p3, S2);
  BLK(a, S2, 1049088, ST_ALLOC);
  BLK(a, S2 + 1049088, 19922432, ST_FREE);
  uint64_t S3 = fake_next_address(0);
  uint64_t p4 = M(a, 1048576);
  assert_int_equal(p4, S3);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, segment, SMALL_POOL), 2);
  assert_int_equal(CUR(s, segment, LARGE_POOL), 1);
  assert_int_equal(CUR(s, reserved_bytes, SMALL_POOL), 2 * 2097152);
  F(a, p1);
  F(a, p2);
  F(a, p3);
  F(a, p4);
  EC(a);
  assert_int_equal(nsegs(a), 0);
  done(a);
}

/*
 * NPU: 1048576 + 32 -> 1049088 is already LARGE, so all four requests
 * share one 20 MiB segment, each split off the front of the tail.
 */
static void ex4_npu(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, NULL);
  uint64_t S1 = fake_next_address(0);
  uint64_t p[4];
  uint64_t sizes[4] = {1048576, 1048576, 1048577, 1048576};
  for (int i = 0; i < 4; i++) {
    p[i] = M(a, sizes[i]);
    assert_int_equal(p[i], S1 + (uint64_t)i * 1049088);
    BLK(a, p[i], 1049088, ST_ALLOC);
  }
  BLK(a, S1 + 4 * 1049088, 20971520 - 4 * 1049088, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, segment, LARGE_POOL), 1);
  assert_int_equal(CUR(s, segment, SMALL_POOL), 0);
  for (int i = 0; i < 4; i++)
    F(a, p[i]);
  done(a);
}

/* ---- Example 5: placement and merge order in one 20 MiB segment -------- */

static void ex5(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk(prof, NULL);
    /* npu: 5 MiB + 32 -> 5243392 (5 MiB + 512); 8 MiB -> 8389120 */
    uint64_t f = npu ? 5243392 : 5 * MiB;
    uint64_t e8 = npu ? 8389120 : 8 * MiB;
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M(a, 5 * MiB);
    assert_int_equal(CUR(S(a), inactive_split_bytes, ALL), 20 * MiB - f);
    uint64_t pb = M(a, 5 * MiB);
    assert_int_equal(CUR(S(a), inactive_split_bytes, ALL), 20 * MiB - 2 * f);
    uint64_t pc = M(a, 5 * MiB);
    msnap_stats_t s = S(a);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 3 * f);
    assert_int_equal(CUR(s, inactive_split, ALL), 1);
    assert_int_equal(pa, S1);
    assert_int_equal(pb, S1 + f);
    assert_int_equal(pc, S1 + 2 * f);
    uint64_t T = S1 + 3 * f;
    BLK(a, T, 20 * MiB - 3 * f, ST_FREE);

    F(a, pb);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 2);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 2 * f);
    F(a, pa);
    BLK(a, S1, 2 * f, ST_FREE);
    /* the object of `a` survives the merge: its requested_size */
    assert_int_equal(blk(a, S1)->requested_size, 5242880);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 2);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - f);

    uint64_t pe = M(a, 8 * MiB);
    assert_int_equal(pe, S1);
    BLK(a, S1 + e8, 2 * f - e8, ST_FREE);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 2);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL),
                     (2 * f - e8) + (20 * MiB - 3 * f));
    if (!npu)
      assert_int_equal(CUR(s, inactive_split_bytes, ALL), 7 * MiB);

    F(a, pc);
    BLK(a, S1 + e8, 20 * MiB - e8, ST_FREE);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 1);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - e8);
    if (!npu)
      assert_int_equal(CUR(s, inactive_split_bytes, ALL), 12 * MiB);
    F(a, pe);
    BLK(a, S1, 20 * MiB, ST_FREE);
    s = S(a);
    assert_int_equal(CUR(s, inactive_split, ALL), 0);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);
    assert_int_equal(CUR(s, reserved_bytes, ALL), 20 * MiB);
    done(a);
  }
}

/* ---- Example 6: streams never share cached blocks ---------------------- */

static void ex6(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof, NULL);
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M2(a, 512, 100);
    F(a, pa);
    BLK(a, S1, 2097152, ST_FREE);
    uint64_t S2 = fake_next_address(0);
    uint64_t pb = M2(a, 512, 200);
    assert_int_equal(pb, S2);
    msnap_stats_t s = S(a);
    assert_int_equal(CUR(s, segment, ALL), 2);
    assert_int_equal(CUR(s, reserved_bytes, ALL), 4194304);
    assert_int_equal(blk(a, S2)->stream, 200);
    F(a, pb);
    /* Equal-size free blocks on one stream: the lower address wins. */
    uint64_t X = fake_next_address(0);
    uint64_t px = M2(a, 12 * MiB, 100);
    uint64_t py = M2(a, 12 * MiB, 100);
    assert_true(px == X && py > px);
    F(a, py);
    F(a, px);
    uint64_t pz = M2(a, 12 * MiB, 100);
    assert_int_equal(pz, X);
    F(a, pz);
    done(a);
  }
}

/* ---- Example 7: record_stream and delayed reuse ------------------------ */

static void ex7(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    uint64_t f = npu ? 5243392 : 5 * MiB;
    msnap_allocator_t *a = mk(prof, NULL);
    fake_set_manual_events(true);
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M2(a, 5 * MiB, 10);
    assert_int_equal(pa, S1);
    R(a, pa, 11);
    R(a, pa, 11); /* set */
    /* Own stream: ignored by CUDA (CUDACachingAllocator.cpp
     * DeviceCachingAllocator::recordStream), inserted by torch_npu
     * (NPUCachingAllocator.cpp DeviceCachingAllocator::recordStream), so
     * the npu free also waits for an event on stream 10. */
    R(a, pa, 10);
    F(a, pa);
    msnap_stats_t s = S(a);
    assert_int_equal(CUR(s, allocation, ALL), 0);
    assert_int_equal(CUR(s, allocated_bytes, ALL), 0);
    assert_int_equal(CUR(s, active, ALL), 1);
    assert_int_equal(CUR(s, active_bytes, ALL), f);
    assert_int_equal(CUR(s, requested_bytes, ALL), 5242880);
    BLK(a, S1, f, ST_PENDING);
    assert_int_equal(blk(a, S1)->event_count, npu ? 2 : 1);

    uint64_t pb = M2(a, 5 * MiB, 10);
    assert_int_equal(pb, S1 + f);
    BLK(a, S1 + 2 * f, 20 * MiB - 2 * f, ST_FREE);
    BLK(a, S1, f, ST_PENDING);

    fake_complete_events(11);
    if (npu) {
      uint64_t pw = M2(a, 5 * MiB, 10); /* stream 10's event pending */
      assert_int_equal(pw, S1 + 2 * f);
      BLK(a, S1, f, ST_PENDING);
      F(a, pw);
      fake_complete_events(10);
    }
    uint64_t pc = M2(a, 5 * MiB, 10);
    assert_int_equal(pc, S1); /* a's range, freed by process_events */
    BLK(a, S1, f, ST_ALLOC);
    s = S(a);
    assert_int_equal(CUR(s, active, ALL), 2);
    assert_int_equal(CUR(s, inactive_split, ALL), 1);
    assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 2 * f);
    assert_int_equal(CUR(s, requested_bytes, ALL), 2 * 5242880);

    /* Variant: empty_cache while an event is pending blocks on it,
     * completes the free and releases nothing (S1 is still split). */
    R(a, pc, 12);
    F(a, pc);
    BLK(a, S1, f, ST_PENDING);
    EC(a);
    BLK(a, S1, f, ST_FREE);
    s = S(a);
    assert_int_equal(s.num_sync_all_streams, 1);
    assert_int_equal(CUR(s, reserved_bytes, ALL), 20 * MiB);
    assert_int_equal(CUR(s, active, ALL), 1);
    F(a, pb);
    EC(a);
    assert_int_equal(CUR(S(a), reserved_bytes, ALL), 0);
    done(a);
  }
}

/* ---- Example 8: oversize blocks, max_split_size_mb:40 ------------------ */

static void tw_mss40(msnap_conf_t *c) {
  c->max_split_size = 40 * MiB;
  c->max_non_split_rounding_size = 20 * MiB;
}

static void ex8(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk(prof, tw_mss40);
    assert_int_equal(S(a).max_split_size, 41943040);
    /* npu: 50 MiB + 32 -> 52429312 -> 52 MiB segment */
    uint64_t seg1 = npu ? 52 * MiB : 50 * MiB;
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M(a, 50 * MiB);
    BLK(a, S1, seg1, ST_ALLOC);
    msnap_stats_t s = S(a);
    assert_int_equal(s.oversize_segments.current, 1);
    assert_int_equal(s.oversize_allocations.current, 1);
    F(a, pa);
    s = S(a);
    assert_int_equal(s.oversize_allocations.current, 0);
    assert_int_equal(s.oversize_allocations.freed, 1);

    uint64_t pb = M(a, 47185920);
    assert_int_equal(pb, S1);
    BLK(a, S1, seg1, ST_ALLOC);
    s = S(a);
    assert_int_equal(CUR(s, allocated_bytes, ALL), seg1);
    assert_int_equal(CUR(s, requested_bytes, ALL), 47185920);
    F(a, pb);

    uint64_t S2 = fake_next_address(0);
    uint64_t pc = M(a, 30 * MiB);
    assert_int_equal(pc, S2);
    /* npu: 31457792 -> 32 MiB segment, remainder 2096640 > 1 MiB: split */
    BLK(a, S2, npu ? 31457792 : 31457280, ST_ALLOC);
    if (npu)
      BLK(a, S2 + 31457792, 2096640, ST_FREE);
    s = S(a);
    assert_int_equal(s.oversize_segments.current, 1);
    assert_int_equal(CUR(s, segment, ALL), 2);
    F(a, pc);
    EC(a);

    /* A cached 70 MiB (npu 72 MiB) block is too big for 41 MiB. */
    uint64_t px = M(a, 70 * MiB);
    F(a, px);
    uint64_t S3 = fake_next_address(0);
    uint64_t py = M(a, 42991616);
    assert_int_equal(py, S3);
    BLK(a, S3, 44040192, ST_ALLOC);
    s = S(a);
    assert_int_equal(s.oversize_segments.current, 2);
    assert_int_equal(s.oversize_allocations.current, 1);
    F(a, py);
    done(a);
  }
}

/* ---- Example 9: release_available_cached_blocks under a fraction ------- */

static void set_allowed_mib(msnap_allocator_t *a, uint64_t mib) {
  /* fake total 64 GiB: fraction mib/65536 is exact in binary */
  assert_int_equal(msnap_set_memory_fraction(a, 0, (double)mib / 65536.0), 0);
  assert_int_equal(msnap__device(a, 0)->allowed_memory_maximum, mib * MiB);
}

static void ex9(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    /* (a) */
    msnap_allocator_t *a = mk(prof, tw_mss40);
    set_allowed_mib(a, 100);
    uint64_t S1 = fake_next_address(0);
    uint64_t p1 = M(a, 50 * MiB);
    uint64_t p2 = M(a, 40 * MiB);
    F(a, p1);
    uint64_t p3 = M(a, 30 * MiB);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_device_free, 1);
    assert_null(blk(a, S1));
    assert_int_equal(s.oversize_segments.current, 1); /* S2 only */
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_sync_all_streams, 0);
    /* npu: 42 MiB + 32 MiB segments */
    assert_int_equal(CUR(s, reserved_bytes, ALL),
                     npu ? 74 * MiB : 70 * MiB);
    F(a, p2);
    F(a, p3);
    done(a);

    /* (b) */
    a = mk(prof, tw_mss40);
    set_allowed_mib(a, 100);
    uint64_t px = M(a, 44 * MiB);
    uint64_t py = M(a, 42 * MiB);
    F(a, px);
    F(a, py);
    uint64_t pz = M(a, 60 * MiB);
    s = S(a);
    assert_int_equal(s.num_device_free, 2);
    assert_int_equal(CUR(s, segment, ALL), 1);
    assert_int_equal(CUR(s, reserved_bytes, ALL), npu ? 62 * MiB : 60 * MiB);
    assert_int_equal(s.num_alloc_retries, 0);
    F(a, pz);
    done(a);
  }
}

/* ---- Example 10: OOM after a full cache flush, allowed = 64 MiB -------- */

static void ex10(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk(prof, NULL);
    set_allowed_mib(a, 64);
    uint64_t pa = M(a, 30 * MiB);
    uint64_t pb = M(a, 30 * MiB);
    F(a, pa);
    F(a, pb);
    uint64_t pc = M(a, 40 * MiB);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_sync_all_streams, 1);
    assert_int_equal(s.num_device_free, 2);
    assert_int_equal(s.num_alloc_retries, 1);
    assert_int_equal(CUR(s, segment, ALL), 1);

    uint64_t pd = 0;
    assert_int_equal(msnap_malloc(a, 0, 30 * MiB, 0, &pd), MSNAP_EOOM);
    assert_int_equal(pd, 0);
    INV(a);
    s = S(a);
    assert_int_equal(s.num_sync_all_streams, 2);
    assert_int_equal(s.num_alloc_retries, 2);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(CUR(s, segment, ALL), 1);
    assert_int_equal(CUR(s, reserved_bytes, ALL), npu ? 42 * MiB : 40 * MiB);
    assert_int_equal(s.num_device_alloc, 3);
    if (!npu)
      assert_string_equal(
          msnap_last_error(),
          "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total "
          "capacity of 64.00 GiB of which 63.96 GiB is free. 64.00 MiB "
          "allowed; Of the allocated memory 40.00 MiB is allocated by "
          "PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
          "reserved but unallocated memory is large try setting "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
          "fragmentation.  See documentation for Memory Management  "
          "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-"
          "memory-usage-with-pytorch-cuda-alloc-conf)");
    else
      assert_string_equal(
          msnap_last_error(),
          /* c = 41943552 bytes (split off its 42 MiB segment) */
          "NPU out of memory. Tried to allocate 32.00 MiB (NPU 0; 64.00 GiB "
          "total capacity; 40.00 MiB already allocated; 40.00 MiB current "
          "active; 63.96 GiB free; 64.00 MiB allowed; 42.00 MiB reserved in "
          "total by PyTorch).If reserved memory is >> allocated memory try "
          "setting max_split_size_mb to avoid fragmentation.");
    F(a, pc);
    done(a);
  }
}

/* ---- Example 11: garbage collection, threshold 0.5, allowed 100 MiB ---- */

static void tw_gc(msnap_conf_t *c) { c->garbage_collection_threshold = 0.5; }

static void ex11(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof, tw_gc);
    set_allowed_mib(a, 100);
    msnap_device_t *d = msnap__device(a, 0);
    uint64_t S1 = fake_next_address(0);
    uint64_t pA = M(a, 30 * MiB);
    assert_int_equal(d->large.get_free_blocks_call_count, 1);
    uint64_t S2 = fake_next_address(0);
    uint64_t pB = M(a, 30 * MiB);
    assert_int_equal(d->large.get_free_blocks_call_count, 2);
    F(a, pA);
    F(a, pB);
    assert_int_equal(blk(a, S1)->gc_count_base, 2);
    uint64_t pD = M(a, 30 * MiB);
    assert_int_equal(pD, S1);
    F(a, pD);
    assert_int_equal(blk(a, S1)->gc_count_base, 3);
    assert_int_equal(blk(a, S2)->gc_count_base, 2);
    uint64_t pE = M(a, 40 * MiB);
    assert_int_equal(d->large.get_free_blocks_call_count, 4);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_device_free, 1);
    assert_null(blk(a, S2));
    assert_non_null(blk(a, S1));
    BLK(a, S1, blk(a, S1)->size, ST_FREE);
    assert_int_equal(CUR(s, segment, ALL), 2);
    F(a, pE);
    done(a);
  }
}

/* ---- Example 12: roundup_power2_divisions ------------------------------ */

static void tw_div_1_4(msnap_conf_t *c) {
  /* [1:4,>:8]: class 0 = 4, classes 1..15 = 8 */
  c->roundup_power2_divisions[0] = 4;
  for (int i = 1; i < MSNAP_ROUNDUP_INTERVALS; i++)
    c->roundup_power2_divisions[i] = 8;
}
static void tw_div_64_256(msnap_conf_t *c) {
  /* [64:8,256:4]: classes 0..6 = 8, class 8 = 4, the rest 0 */
  for (int i = 0; i <= 6; i++)
    c->roundup_power2_divisions[i] = 8;
  c->roundup_power2_divisions[8] = 4;
}
static void tw_div_4(msnap_conf_t *c) {
  for (int i = 0; i < MSNAP_ROUNDUP_INTERVALS; i++)
    c->roundup_power2_divisions[i] = 4;
}

static void ex12(void **state) {
  (void)state;
  /* {input, cuda, npu (input + 32 first)} */
  struct {
    tweak_fn tw;
    uint64_t in, cuda, npu;
  } t[] = {
      {tw_div_1_4, 700, 1024, 1024},
      {tw_div_1_4, 1100000, 1310720, 1310720},
      {tw_div_1_4, 3000000, 3145728, 3145728},
      {tw_div_1_4, 4200000, 4718592, 4718592},
      /* npu: 33554464 is no power of two: class 5, step 4 MiB -> 36 MiB */
      {tw_div_1_4, 33554432, 33554432, 37748736},
      {tw_div_64_256, 70 * MiB, 72 * MiB, 72 * MiB},
      {tw_div_64_256, 150 * MiB, 157286400, 157286912},
      {tw_div_64_256, 300 * MiB, 320 * MiB, 320 * MiB},
      {tw_div_4, 1200, 1536, 1536},
      {tw_div_4, 5000000, 5242880, 5242880},
      {NULL, 1200, 1536, 1536},
      {NULL, 0, 512, 512},
      {NULL, 480, 512, 512},
      {NULL, 481, 512, 1024},
      {NULL, 512, 512, 1024},
  };
  for (int prof = 0; prof < 2; prof++) {
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
      msnap_allocator_t *a = mk(prof, t[i].tw);
      uint64_t want = prof == NPU ? t[i].npu : t[i].cuda;
      uint64_t got = msnap__round_size(a, t[i].in);
      if (got != want)
        fail_msg("%s round_size(%llu) = %llu, want %llu",
                 prof == NPU ? "npu" : "cuda", (unsigned long long)t[i].in,
                 (unsigned long long)got, (unsigned long long)want);
      done(a);
    }
  }
  /* Through malloc: 1100000 becomes a 1310720-byte large-pool block. */
  msnap_allocator_t *a = mk(CUDA, tw_div_1_4);
  uint64_t p = M(a, 1100000);
  BLK(a, p, 1310720, ST_ALLOC);
  assert_int_equal(CUR(S(a), segment, LARGE_POOL), 1);
  assert_int_equal(CUR(S(a), reserved_bytes, LARGE_POOL), 20 * MiB);
  F(a, p);
  done(a);
}

/* ---- Example 13: expandable segments ----------------------------------- */

static void tw_exp(msnap_conf_t *c) { c->expandable_segments = true; }

static void ex13_cuda(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, tw_exp);
  uint64_t pa = M(a, 5 * MiB);
  uint64_t E = pa;
  msnap_device_t *d = msnap__device(a, 0);
  assert_true(d->segments->expandable);
  /* VA: 20 MiB * ceil(72 GiB / 20 MiB) */
  assert_int_equal(d->segments->size, 3687 * 20 * MiB);
  BLK(a, E, 5 * MiB, ST_ALLOC);
  BLK(a, E + 5 * MiB, 15 * MiB, ST_FREE);
  BLK(a, E + 20 * MiB, 3687 * 20 * MiB - 20 * MiB, ST_UNMAPPED);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 20 * MiB);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(CUR(s, segment, ALL), 0);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);

  uint64_t pb = M(a, 25 * MiB);
  assert_int_equal(pb, E + 5 * MiB);
  BLK(a, E + 30 * MiB, 10 * MiB, ST_FREE);
  s = S(a);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 40 * MiB);
  assert_int_equal(s.num_device_alloc, 2);

  F(a, pa);
  BLK(a, E, 5 * MiB, ST_FREE);
  uint64_t pc = M(a, 8 * MiB);
  assert_int_equal(pc, E + 30 * MiB);
  BLK(a, E + 38 * MiB, 2 * MiB, ST_FREE);
  F(a, pb);
  F(a, pc);
  BLK(a, E, 40 * MiB, ST_FREE);
  EC(a);
  s = S(a);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(nsegs(a), 0);
  done(a);
}

/*
 * NPU: 5 MiB -> 5243392, 25 MiB -> 26214912, 8 MiB -> 8389120, and
 * base_addr_aligned_kb (16 KiB) applies to requests >= 2 MiB: the block
 * found for b starts at E+5243392 (512 past a 16 KiB boundary), so a
 * 15872-byte fragment is split off first and b = E+5259264; the same
 * happens for c at E+31474176 -> c = E+31490048.
 */
static void ex13_npu(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, tw_exp);
  uint64_t pa = M(a, 5 * MiB);
  uint64_t E = pa;
  BLK(a, E, 5243392, ST_ALLOC);
  BLK(a, E + 5243392, 15728128, ST_FREE);
  uint64_t pb = M(a, 25 * MiB);
  assert_int_equal(pb, E + 5259264);
  BLK(a, E + 5243392, 15872, ST_FREE);
  BLK(a, pb, 26214912, ST_ALLOC);
  BLK(a, E + 31474176, 10468864, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 40 * MiB);
  assert_int_equal(s.num_device_alloc, 2);
  assert_int_equal(CUR(s, segment, ALL), 0);
  F(a, pa);
  BLK(a, E, 5259264, ST_FREE); /* merged with the fragment */
  uint64_t pc = M(a, 8 * MiB);
  assert_int_equal(pc, E + 31490048);
  BLK(a, E + 31474176, 15872, ST_FREE);
  BLK(a, E + 39879168, 2063872, ST_FREE);
  F(a, pb);
  F(a, pc);
  BLK(a, E, 40 * MiB, ST_FREE);
  EC(a);
  s = S(a);
  assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(nsegs(a), 0);
  done(a);
}

/* ---- Example 14: the NPU boundaries (CUDA equivalents for contrast) ---- */

static void ex14(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    bool npu = prof == NPU;
    msnap_allocator_t *a = mk(prof, NULL);
    uint64_t p1 = M(a, npu ? 480 : 512);
    BLK(a, p1, 512, ST_ALLOC);
    uint64_t p2 = M(a, npu ? 481 : 513);
    BLK(a, p2, 1024, ST_ALLOC);
    uint64_t p3 = M(a, npu ? 1048544 : 1048576);
    BLK(a, p3, 1048576, ST_ALLOC);
    assert_true(blk(a, p3)->pool->is_small); /* fits in the first 2 MiB */
    assert_int_equal(CUR(S(a), segment, SMALL_POOL), 1);
    assert_int_equal(CUR(S(a), segment, LARGE_POOL), 0);
    uint64_t p4 = M(a, npu ? 1048545 : 1048577);
    BLK(a, p4, 1049088, ST_ALLOC);
    assert_int_equal(CUR(S(a), segment, LARGE_POOL), 1);
    assert_int_equal(CUR(S(a), reserved_bytes, LARGE_POOL), 20 * MiB);
    F(a, p1);
    F(a, p2);
    F(a, p3);
    F(a, p4);
    done(a);
  }
}


/* ---- NPU-only options (§20.3, §20.9) ------------------------------------ */

static void tw_lazy(msnap_conf_t *c) { c->multi_stream_lazy_reclaim = true; }
static void tw_1g(msnap_conf_t *c) { c->page_size_1g = true; }
static void tw_1g_exp(msnap_conf_t *c) {
  c->page_size_1g = true;
  c->expandable_segments = true;
}
static void tw_segmb(msnap_conf_t *c) {
  c->segment_size_mb = 64;
  c->expandable_segments = true;
}

/*
 * multi_stream_lazy_reclaim: a completed cross-stream free is not reaped
 * at the start of malloc (cuda would give the next request a's range); it
 * is reaped only when the search fails.
 */
static void npu_lazy_reclaim(void **state) {
  (void)state;
  for (int lazy = 0; lazy < 2; lazy++) {
    msnap_allocator_t *a = mk(NPU, lazy ? tw_lazy : NULL);
    uint64_t S1 = fake_next_address(0);
    uint64_t pa = M2(a, 5 * MiB, 1);
    R(a, pa, 2);
    F(a, pa); /* the event completes at once (fake auto mode) */
    BLK(a, S1, 5243392, ST_PENDING);
    uint64_t pb = M2(a, 5 * MiB, 1);
    if (!lazy) {
      assert_int_equal(pb, S1); /* reaped first, best fit */
    } else {
      assert_int_equal(pb, S1 + 5243392); /* the tail; a still pending */
      BLK(a, S1, 5243392, ST_PENDING);
      uint64_t pc = M2(a, 30 * MiB, 1); /* search fails -> reap */
      BLK(a, S1, 5243392, ST_FREE);
      F(a, pc);
    }
    F(a, pb);
    done(a);
  }
}

static void npu_page_1g(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, tw_1g);
  uint64_t S1 = fake_next_address(0);
  uint64_t p = M(a, 5 * MiB);
  assert_int_equal(p, S1);
  BLK(a, S1 + 5243392, 1024 * MiB - 5243392, ST_FREE);
  assert_int_equal(CUR(S(a), reserved_bytes, LARGE_POOL), 1024 * MiB);
  uint64_t q = M(a, 1000); /* small pool is unaffected */
  assert_int_equal(CUR(S(a), reserved_bytes, SMALL_POOL), 2 * MiB);
  F(a, p);
  F(a, q);
  done(a);

  a = mk(NPU, tw_1g_exp); /* 1 GiB granule for the large pool */
  p = M(a, 5 * MiB);
  assert_int_equal(CUR(S(a), reserved_bytes, ALL), 1024 * MiB);
  assert_int_equal(msnap__device(a, 0)->segments->granule, 1024 * MiB);
  F(a, p);
  EC(a);
  done(a);

  a = mk(NPU, tw_segmb); /* segment_size_mb sets the large granule */
  p = M(a, 5 * MiB);
  assert_int_equal(CUR(S(a), reserved_bytes, ALL), 64 * MiB);
  F(a, p);
  done(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ex1_cuda),  cmocka_unit_test(ex1_npu),
      cmocka_unit_test(ex2_cuda),  cmocka_unit_test(ex2_npu),
      cmocka_unit_test(ex3),       cmocka_unit_test(ex4_cuda),
      cmocka_unit_test(ex4_npu),   cmocka_unit_test(ex5),
      cmocka_unit_test(ex6),       cmocka_unit_test(ex7),
      cmocka_unit_test(ex8),       cmocka_unit_test(ex9),
      cmocka_unit_test(ex10),      cmocka_unit_test(ex11),
      cmocka_unit_test(ex12),      cmocka_unit_test(ex13_cuda),
      cmocka_unit_test(ex13_npu),  cmocka_unit_test(ex14),
      cmocka_unit_test(npu_lazy_reclaim), cmocka_unit_test(npu_page_1g),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
