/*
 * test_conf.c -- alloc-conf parsing (conf.c): every key, every validation
 * message, reset semantics, roundup_power2_divisions (allocator-algorithm
 * §21 example 12), the npu profile rules, and "unchanged on error".
 * msnap__conf_check runs after every parse.
 */
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

static char err[1024];

#define CHECK(c)                                                              \
  do {                                                                        \
    char m_[128];                                                             \
    if (msnap__conf_check((c), m_, sizeof m_) != 0) fail_msg("%s", m_);       \
  } while (0)

static void ok(msnap_conf_t *c, const char *s) {
  err[0] = '\0';
  int rc = msnap__conf_parse(c, s, err, sizeof err);
  if (rc != 0) fail_msg("parse \"%s\": %s", s, err);
  assert_string_equal(c->raw, s);
  CHECK(c);
}

/* Parse must fail with exactly `msg` and leave the conf bit-identical. */
static void bad(msnap_conf_t *c, const char *s, const char *msg) {
  msnap_conf_t before = *c;
  err[0] = '\0';
  int rc = msnap__conf_parse(c, s, err, sizeof err);
  assert_int_equal(rc, MSNAP_ECONF);
  assert_string_equal(err, msg);
  assert_string_equal(msnap_last_error(), msg);
  assert_memory_equal(&before, c, sizeof before);
  CHECK(c);
}

static void test_defaults(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_conf_t c;
    msnap__conf_init(&c, (msnap_profile_t)prof);
    CHECK(&c);
    assert_int_equal(c.profile, prof);
    assert_string_equal(c.raw, "");
    assert_true(c.max_split_size == SIZE_MAX);
    assert_int_equal(c.max_non_split_rounding_size, 20 * MiB);
    assert_int_equal(c.large_segment_size, 20 * MiB);
    assert_true(c.garbage_collection_threshold == 0.0);
    assert_true(c.per_process_memory_fraction == 1.0);
    assert_int_equal(c.base_addr_aligned_kb, 16);
    assert_int_equal(c.segment_size_mb, 0);
    assert_int_equal(c.pinned_num_register_threads, 1);
    assert_false(c.expandable_segments);
    for (int k = 0; k < MSNAP_ROUNDUP_INTERVALS; k++)
      assert_int_equal(c.roundup_power2_divisions[k], 0);
    /* NULL is "nothing to apply". */
    assert_int_equal(msnap__conf_parse(&c, NULL, err, sizeof err), 0);
    assert_string_equal(c.raw, "");
    msnap__conf_destroy(&c);
    msnap__conf_destroy(&c); /* idempotent */
  }
}

static void test_generic_keys(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  ok(&c, "max_split_size_mb:100");
  assert_int_equal(c.max_split_size, 100 * MiB);
  ok(&c, "max_split_size_mb:20");
  assert_int_equal(c.max_split_size, 20 * MiB);
  /* Clamp: min(v, SIZE_MAX / MiB) * MiB (the largest value std::stoull
   * takes is UINT64_MAX). */
  ok(&c, "max_split_size_mb:18446744073709551615");
  assert_int_equal(c.max_split_size, (SIZE_MAX / MiB) * MiB);
  ok(&c, "max_split_size_mb:100000000000000");
  assert_int_equal(c.max_split_size, (SIZE_MAX / MiB) * MiB);
  /* One more is out of range (std::stoull throws): an error naming the
   * token, the conf unchanged. */
  bad(&c, "max_split_size_mb:99999999999999999999",
      "alloc conf: value '99999999999999999999' for 'max_split_size_mb' is "
      "out of range (largest accepted: 18446744073709551615) at token 3 in "
      "\"max_split_size_mb:99999999999999999999\"");
  bad(&c, "expandable_segments:True,roundup_power2_divisions:"
      "18446744073709551616",
      "alloc conf: value '18446744073709551616' for "
      "'roundup_power2_divisions' is out of range (largest accepted: "
      "18446744073709551615) at token 7 in \"expandable_segments:True,"
      "roundup_power2_divisions:18446744073709551616\"");
  ok(&c, "max_split_size_mb:18446744073709551615");
  ok(&c, "max_non_split_rounding_mb:64");
  assert_int_equal(c.max_non_split_rounding_size, 64 * MiB);
  ok(&c, "garbage_collection_threshold:0.6");
  assert_true(c.garbage_collection_threshold == 0.6);
  ok(&c, "expandable_segments:True");
  assert_true(c.expandable_segments);
  ok(&c, "expandable_segments:False");
  assert_false(c.expandable_segments);
  ok(&c, "pinned_use_background_threads:True");
  assert_true(c.pinned_use_background_threads);
  ok(&c, "pinned_max_round_threshold_mb:8,pinned_max_cached_size_mb:512");
  assert_int_equal(c.pinned_max_round_threshold, 8 * MiB);
  assert_int_equal(c.pinned_max_cached_size, 512 * MiB);
  /* large_segment_size_mb is parsed first and raises the floors. */
  ok(&c, "max_split_size_mb:40,large_segment_size_mb:40");
  assert_int_equal(c.large_segment_size, 40 * MiB);
  assert_true(c.large_segment_size_set);
  assert_int_equal(c.max_split_size, 40 * MiB);
  assert_int_equal(c.max_non_split_rounding_size, 40 * MiB);
  /* Tokenizer: whitespace dropped, even inside runs; separators are not
   * checked (PyTorch ignores checkToken's result). */
  ok(&c, " max_split_size_mb : 1 00 ,\tgarbage_collection_threshold:0.5 ");
  assert_int_equal(c.max_split_size, 100 * MiB);
  assert_true(c.garbage_collection_threshold == 0.5);
  ok(&c, "max_split_size_mb,300");
  assert_int_equal(c.max_split_size, 300 * MiB);
  /* Empty string: resets, raw = "". */
  ok(&c, "");
  assert_true(c.max_split_size == SIZE_MAX);
  assert_true(c.garbage_collection_threshold == 0.0);
  msnap__conf_destroy(&c);
}

static void test_cuda_keys(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  ok(&c, "backend:native");
  ok(&c, "release_lock_on_cudamalloc:True");
  assert_true(c.release_lock_on_malloc);
  ok(&c, "release_lock_on_hipmalloc:False");
  assert_false(c.release_lock_on_malloc);
  ok(&c, "pinned_use_cuda_host_register:True");
  assert_true(c.pinned_use_host_register);
  ok(&c, "pinned_use_hip_host_register:False");
  assert_false(c.pinned_use_host_register);
  ok(&c, "pinned_num_register_threads:128");
  assert_int_equal(c.pinned_num_register_threads, 128);
  ok(&c, "pinned_reserve_segment_size_mb:64");
  assert_int_equal(c.pinned_reserve_segment_size, 64 * MiB);
  ok(&c, "graph_capture_record_stream_reuse:True");
  assert_true(c.graph_capture_record_stream_reuse);
  ok(&c, "per_process_memory_fraction:0.25");
  assert_true(c.per_process_memory_fraction == 0.25);
  ok(&c, "per_process_memory_fraction:0");
  assert_true(c.per_process_memory_fraction == 0.0);
  ok(&c, "per_process_memory_fraction:1");
  assert_true(c.per_process_memory_fraction == 1.0);
  ok(&c, "pinned_free_catch_all:True");
  ok(&c, "throw_on_cudamalloc_oom:True");
  assert_true(c.throw_on_malloc_oom);
  ok(&c, "expandable_segments_reserve:0.5,expandable_segments_reserve:8G");
  ok(&c, "expandable_segments_reserve_by_class:[a:1,b:2],max_split_size_mb:30");
  assert_int_equal(c.max_split_size, 30 * MiB);
  /* CUDA keys keep their values across parses. */
  ok(&c, "max_split_size_mb:50");
  assert_true(c.throw_on_malloc_oom);
  assert_true(c.per_process_memory_fraction == 1.0);
  assert_true(c.graph_capture_record_stream_reuse);
  assert_int_equal(c.pinned_num_register_threads, 128);
  msnap__conf_destroy(&c);
}

static void test_messages(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  ok(&c, "max_split_size_mb:100,garbage_collection_threshold:0.5");
  bad(&c, "max_split_sise_mb:100",
      "alloc conf: unrecognized key 'max_split_sise_mb' at token 1 in "
      "\"max_split_sise_mb:100\"");
  bad(&c, "expandable_segments:True,foo:1",
      "alloc conf: unrecognized key 'foo' at token 5 in "
      "\"expandable_segments:True,foo:1\"");
  bad(&c, "max_split_size_mb:10",
      "alloc conf: CachingAllocator option max_split_size_mb too small, must "
      "be >= 20; got '10' at token 3 in \"max_split_size_mb:10\"");
  bad(&c, "large_segment_size_mb:64,max_split_size_mb:40",
      "alloc conf: CachingAllocator option max_split_size_mb too small, must "
      "be >= 64; got '40' at token 7 in "
      "\"large_segment_size_mb:64,max_split_size_mb:40\"");
  bad(&c, "max_non_split_rounding_mb:19",
      "alloc conf: CachingAllocator option max_non_split_rounding_mb too "
      "small, must be >= 20; got '19' at token 3 in "
      "\"max_non_split_rounding_mb:19\"");
  bad(&c, "large_segment_size_mb:10",
      "alloc conf: CachingAllocator option large_segment_size_mb must be > 10 "
      "MB; got '10' at token 3 in \"large_segment_size_mb:10\"");
  bad(&c, "garbage_collection_threshold:1.0",
      "alloc conf: garbage_collect_threshold is invalid, set it in (0.0, "
      "1.0); got '1.0' at token 3 in \"garbage_collection_threshold:1.0\"");
  bad(&c, "garbage_collection_threshold:0",
      "alloc conf: garbage_collect_threshold is invalid, set it in (0.0, "
      "1.0); got '0' at token 3 in \"garbage_collection_threshold:0\"");
  bad(&c, "garbage_collection_threshold:half",
      "alloc conf: expected a number for 'garbage_collection_threshold'; got "
      "'half' at token 3 in \"garbage_collection_threshold:half\"");
  bad(&c, "roundup_power2_divisions:3",
      "alloc conf: For roundups, the divisions has to be power of 2; got '3' "
      "at token 3 in \"roundup_power2_divisions:3\"");
  bad(&c, "roundup_power2_divisions:0",
      "alloc conf: For roundups, the divisions has to be power of 2; got '0' "
      "at token 3 in \"roundup_power2_divisions:0\"");
  bad(&c, "roundup_power2_divisions:[64:3]",
      "alloc conf: For roundups, the divisions has to be power of 2 or 0 to "
      "disable roundup; got '3' at token 6 in "
      "\"roundup_power2_divisions:[64:3]\"");
  bad(&c, "roundup_power2_divisions:[48:4]",
      "alloc conf: For roundups, the intervals have to be power of 2; got "
      "'48' at token 4 in \"roundup_power2_divisions:[48:4]\"");
  bad(&c, "roundup_power2_divisions:[64:4,>:8",
      "alloc conf: missing ']' closing the list of 'roundup_power2_divisions' "
      "(token 1) at end of \"roundup_power2_divisions:[64:4,>:8\"");
  bad(&c, "roundup_power2_divisions:[64:4,128",
      "alloc conf: missing ']' closing the list of 'roundup_power2_divisions' "
      "(token 1) at end of \"roundup_power2_divisions:[64:4,128\"");
  bad(&c, "roundup_power2_divisions:[64:4,128]",
      "alloc conf: missing division after '128' (token 8) in the list of "
      "'roundup_power2_divisions' at end of "
      "\"roundup_power2_divisions:[64:4,128]\"");
  bad(&c, "expandable_segments:true",
      "alloc conf: expected 'True' or 'False' for 'expandable_segments'; got "
      "'true' at token 3 in \"expandable_segments:true\"");
  bad(&c, "max_split_size_mb:",
      "alloc conf: missing value for key 'max_split_size_mb' (token 1) at end "
      "of \"max_split_size_mb:\"");
  bad(&c, "max_split_size_mb:100abc",
      "alloc conf: expected a non-negative integer for 'max_split_size_mb'; "
      "got '100abc' at token 3 in \"max_split_size_mb:100abc\"");
  bad(&c, "max_split_size_mb:-1",
      "alloc conf: expected a non-negative integer for 'max_split_size_mb'; "
      "got '-1' at token 3 in \"max_split_size_mb:-1\"");
  bad(&c, "backend:cudaMallocAsync",
      "alloc conf: memsnap implements only the native allocator backend; got "
      "'cudaMallocAsync' at token 3 in \"backend:cudaMallocAsync\"");
  bad(&c, "backend:magic",
      "alloc conf: Unknown allocator backend, options are native and "
      "cudaMallocAsync; got 'magic' at token 3 in \"backend:magic\"");
  bad(&c, "pinned_num_register_threads:6",
      "alloc conf: Number of register threads has to be power of 2, got '6' "
      "at token 3 in \"pinned_num_register_threads:6\"");
  bad(&c, "pinned_num_register_threads:256",
      "alloc conf: Number of register threads should be less than or equal "
      "to 128, got '256' at token 3 in \"pinned_num_register_threads:256\"");
  bad(&c, "pinned_reserve_segment_size_mb:0",
      "alloc conf: Pinned reserve segment size has to be greater than 0; got "
      "'0' at token 3 in \"pinned_reserve_segment_size_mb:0\"");
  bad(&c, "per_process_memory_fraction:1.5",
      "alloc conf: per_process_memory_fraction is invalid, set it in [0.0, "
      "1.0]; got '1.5' at token 3 in \"per_process_memory_fraction:1.5\"");
  bad(&c, "page_size:1g",
      "alloc conf: unrecognized key 'page_size' (an NPU allocator key; it "
      "needs MEMSNAP_PROFILE=npu) at token 1 in \"page_size:1g\"");
  bad(&c, "release_lock_on_npumalloc:True",
      "alloc conf: unrecognized key 'release_lock_on_npumalloc' (an NPU "
      "allocator key; it needs MEMSNAP_PROFILE=npu) at token 1 in "
      "\"release_lock_on_npumalloc:True\"");
  /* A later error leaves the earlier settings (and raw) in place. */
  assert_int_equal(c.max_split_size, 100 * MiB);
  assert_true(c.garbage_collection_threshold == 0.5);
  assert_string_equal(c.raw,
                      "max_split_size_mb:100,garbage_collection_threshold:0.5");
  msnap__conf_destroy(&c);
}

static void test_reset_semantics(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  ok(&c, "max_split_size_mb:100,roundup_power2_divisions:4,"
         "garbage_collection_threshold:0.7,large_segment_size_mb:30,"
         "max_non_split_rounding_mb:50,pinned_use_background_threads:True");
  assert_int_equal(c.max_split_size, 100 * MiB);
  assert_int_equal(c.max_non_split_rounding_size, 50 * MiB);
  /* _set_allocator_settings("expandable_segments:True") silently drops
   * max_split_size_mb, the divisions and the gc threshold, and resets the
   * rounding limit to large_segment_size; large_segment_size and
   * pinned_use_background_threads survive. */
  ok(&c, "expandable_segments:True");
  assert_true(c.expandable_segments);
  assert_true(c.max_split_size == SIZE_MAX);
  assert_true(c.garbage_collection_threshold == 0.0);
  for (int k = 0; k < MSNAP_ROUNDUP_INTERVALS; k++)
    assert_int_equal(c.roundup_power2_divisions[k], 0);
  assert_int_equal(c.large_segment_size, 30 * MiB);
  assert_int_equal(c.max_non_split_rounding_size, 30 * MiB);
  assert_true(c.pinned_use_background_threads);
  /* expandable_segments is not reset either. */
  ok(&c, "max_split_size_mb:40");
  assert_true(c.expandable_segments);
  msnap__conf_destroy(&c);
}

/* round_size of allocator-algorithm §3.1, written out here to check the
 * division table against example 12. */
static uint64_t round_size(const msnap_conf_t *c, uint64_t size) {
  if (size < 512) return 512;
  uint64_t d = msnap__roundup_divisions(c, size);
  if (d > 1 && size > 512 * d) {
    if ((size & (size - 1)) == 0) return size;
    uint64_t fl = 1ull << (63 - __builtin_clzll(size));
    uint64_t step = fl >> (63 - __builtin_clzll(d));
    if (step == 0) return 2 * fl;
    return (size + step - 1) / step * step;
  }
  return (size + 511) / 512 * 512;
}

static void test_roundup_divisions(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  /* [1:4,>:8]: class 0 = 4, classes 1..15 = 8. */
  ok(&c, "roundup_power2_divisions:[1:4,>:8]");
  assert_int_equal(c.roundup_power2_divisions[0], 4);
  for (int k = 1; k < 16; k++) assert_int_equal(c.roundup_power2_divisions[k], 8);
  assert_int_equal(round_size(&c, 700), 1024);
  assert_int_equal(round_size(&c, 1100000), 1310720);
  assert_int_equal(round_size(&c, 3000000), 3145728);
  assert_int_equal(round_size(&c, 4200000), 4718592);
  assert_int_equal(round_size(&c, 33554432), 33554432);
  /* [64:8,256:4]: classes 0..6 = 8, class 8 = 4, 7 and 9..15 = 0. */
  ok(&c, "roundup_power2_divisions:[64:8,256:4]");
  static const uint64_t want[16] = {8, 8, 8, 8, 8, 8, 8, 0,
                                    4, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(c.roundup_power2_divisions, want, sizeof want);
  assert_int_equal(round_size(&c, 70 * MiB), 72 * MiB);
  assert_int_equal(round_size(&c, 150 * MiB), 157286400);
  assert_int_equal(round_size(&c, 300 * MiB), 320 * MiB);
  assert_int_equal(msnap__roundup_divisions(&c, 150 * MiB), 0);
  assert_int_equal(msnap__roundup_divisions(&c, 1 << 20), 8);
  /* Scalar form. */
  ok(&c, "roundup_power2_divisions:4");
  for (int k = 0; k < 16; k++) assert_int_equal(c.roundup_power2_divisions[k], 4);
  assert_int_equal(round_size(&c, 1200), 1536);
  assert_int_equal(round_size(&c, 5000000), 5242880);
  /* Boundaries above 32 GiB clamp to class 15; 0 disables; the classes of
   * sizes >= 32 GiB use entry 15. */
  ok(&c, "roundup_power2_divisions:[1048576:2]");
  for (int k = 0; k < 16; k++) assert_int_equal(c.roundup_power2_divisions[k], 2);
  assert_int_equal(msnap__roundup_divisions(&c, (size_t)1 << 40), 2);
  ok(&c, "roundup_power2_divisions:[2:0,>:16]");
  assert_int_equal(c.roundup_power2_divisions[0], 0);
  assert_int_equal(c.roundup_power2_divisions[1], 0);
  assert_int_equal(c.roundup_power2_divisions[2], 16);
  /* Only the first boundary fills the classes below it, also when it is
   * class 0 (c10/core/AllocatorConfig.cpp, parseRoundUpPower2Divisions'
   * first_value; torch 2.13's libc10 gives 4, 4, 0, 0, 8, 0 for sizes
   * 4097, 1 MiB + 1, 2 MiB + 1, 4 MiB + 1, 64 MiB + 1, 128 MiB + 1). */
  ok(&c, "roundup_power2_divisions:[1:4,64:8]");
  static const uint64_t want2[16] = {4, 0, 0, 0, 0, 0, 8, 0,
                                     0, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(c.roundup_power2_divisions, want2, sizeof want2);
  assert_int_equal(msnap__roundup_divisions(&c, 4097), 4);
  assert_int_equal(msnap__roundup_divisions(&c, (2 << 20) + 1), 0);
  assert_int_equal(msnap__roundup_divisions(&c, (64 << 20) + 1), 8);
  ok(&c, "roundup_power2_divisions:[1:4,2:8,>:2]");
  assert_int_equal(round_size(&c, 4097), 5120);
  assert_int_equal(round_size(&c, (1 << 20) + 1), 1310720);
  ok(&c, "roundup_power2_divisions:[]");
  for (int k = 0; k < 16; k++) assert_int_equal(c.roundup_power2_divisions[k], 0);
  /* Followed by another key. */
  ok(&c, "roundup_power2_divisions:[256:2],max_split_size_mb:64");
  assert_int_equal(c.roundup_power2_divisions[8], 2);
  assert_int_equal(c.max_split_size, 64 * MiB);
  msnap__conf_destroy(&c);
}

static void test_npu_profile(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_NPU);
  ok(&c, "base_addr_aligned_kb:0");
  assert_int_equal(c.base_addr_aligned_kb, 0);
  ok(&c, "base_addr_aligned_kb:16,page_size:1g,segment_size_mb:40,"
         "multi_stream_lazy_reclaim:True,pin_memory_expandable_segments:True,"
         "pinned_mem_register:True,pinned_reserve_segment_size_mb:8,"
         "per_process_memory_fraction:0.5,release_lock_on_npumalloc:True,"
         "throw_on_npumalloc_oom:True");
  assert_int_equal(c.base_addr_aligned_kb, 16);
  assert_true(c.page_size_1g);
  assert_int_equal(c.segment_size_mb, 40);
  assert_false(c.large_segment_size_set);
  assert_true(c.multi_stream_lazy_reclaim);
  assert_true(c.pinned_use_host_register);
  assert_int_equal(c.pinned_reserve_segment_size, 8 * MiB);
  assert_true(c.per_process_memory_fraction == 0.5);
  /* torch_npu takes any size_t for the pinned reserve: 0 is none (the
   * cuda profile refuses it, above) */
  ok(&c, "pinned_reserve_segment_size_mb:0");
  assert_int_equal(c.pinned_reserve_segment_size, 0);
  assert_true(c.release_lock_on_malloc);
  assert_true(c.throw_on_malloc_oom);
  /* The generic whitelist. */
  ok(&c, "max_split_size_mb:64,garbage_collection_threshold:0.8,"
         "roundup_power2_divisions:[256:1,512:2,>:8],"
         "pinned_use_background_threads:True,large_segment_size_mb:32,"
         "max_non_split_rounding_mb:40,pinned_max_round_threshold_mb:4,"
         "pinned_max_cached_size_mb:64");
  assert_int_equal(c.max_split_size, 64 * MiB);
  assert_int_equal(c.large_segment_size, 32 * MiB);
  assert_true(c.large_segment_size_set);
  assert_int_equal(c.roundup_power2_divisions[9], 2);
  assert_int_equal(c.roundup_power2_divisions[10], 8);
  bad(&c, "base_addr_aligned_kb:17",
      "alloc conf: base_addr_aligned_kb must be in [0, 16]; got '17' at token "
      "3 in \"base_addr_aligned_kb:17\"");
  bad(&c, "page_size:2m",
      "alloc conf: page_size only supports '1g'; got '2m' at token 3 in "
      "\"page_size:2m\"");
  bad(&c, "segment_size_mb:19",
      "alloc conf: segment_size_mb must be in [20, 512]; got '19' at token 3 "
      "in \"segment_size_mb:19\"");
  bad(&c, "segment_size_mb:513",
      "alloc conf: segment_size_mb must be in [20, 512]; got '513' at token 3 "
      "in \"segment_size_mb:513\"");
  bad(&c, "backend:native",
      "alloc conf: torch_npu does not support key 'backend' (a CUDA allocator "
      "key) at token 1 in \"backend:native\"");
  bad(&c, "release_lock_on_cudamalloc:True",
      "alloc conf: torch_npu does not support key "
      "'release_lock_on_cudamalloc' (a CUDA allocator key) at token 1 in "
      "\"release_lock_on_cudamalloc:True\"");
  bad(&c, "max_split_sise_mb:100",
      "alloc conf: unrecognized key 'max_split_sise_mb' at token 1 in "
      "\"max_split_sise_mb:100\"");
  /* expandable_segments:True with max_split_size_mb or gc: rejected. */
  bad(&c, "expandable_segments:True,max_split_size_mb:100",
      "alloc conf: expandable_segments:True cannot be combined with "
      "'max_split_size_mb' in the npu profile (torch_npu rejects it) at token "
      "5 in \"expandable_segments:True,max_split_size_mb:100\"");
  bad(&c, "garbage_collection_threshold:0.5,expandable_segments:True",
      "alloc conf: expandable_segments:True cannot be combined with "
      "'garbage_collection_threshold' in the npu profile (torch_npu rejects "
      "it) at token 1 in "
      "\"garbage_collection_threshold:0.5,expandable_segments:True\"");
  /* Alone it is fine, and resets max_split_size; then a later parse
   * adding max_split_size_mb conflicts with the kept flag. */
  ok(&c, "expandable_segments:True");
  assert_true(c.max_split_size == SIZE_MAX);
  bad(&c, "max_split_size_mb:100",
      "alloc conf: expandable_segments:True cannot be combined with "
      "'max_split_size_mb' in the npu profile (torch_npu rejects it) at token "
      "1 in \"max_split_size_mb:100\"");
  ok(&c, "expandable_segments:False,max_split_size_mb:100");
  msnap__conf_destroy(&c);
}

static void test_npu_runtime_keys(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_NPU);
  static const char *allowed[] = {
      "expandable_segments:True",       "max_split_size_mb:64",
      "max_non_split_rounding_mb:64",   "release_lock_on_npumalloc:True",
      "throw_on_npumalloc_oom:True",    "per_process_memory_fraction:0.5",
      "pinned_max_round_threshold_mb:4", "pinned_max_cached_size_mb:4"};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
    int rc = msnap__conf_parse_runtime(&c, allowed[i], err, sizeof err);
    if (rc) fail_msg("%s: %s", allowed[i], err);
    ok(&c, "expandable_segments:False");
  }
  msnap_conf_t before = c;
  assert_int_equal(msnap__conf_parse_runtime(&c, "page_size:1g", err,
                                             sizeof err),
                   MSNAP_ECONF);
  assert_memory_equal(&before, &c, sizeof c);
  assert_non_null(strstr(err, "key 'page_size' cannot be changed at run time"));
  assert_non_null(strstr(err, "at token 1 in \"page_size:1g\""));
  assert_int_equal(msnap__conf_parse_runtime(&c, "large_segment_size_mb:40",
                                             err, sizeof err),
                   MSNAP_ECONF);
  /* The cuda profile accepts every key at run time. */
  msnap_conf_t cu;
  msnap__conf_init(&cu, MSNAP_PROFILE_CUDA);
  assert_int_equal(msnap__conf_parse_runtime(&cu, "large_segment_size_mb:40,"
                                             "pinned_num_register_threads:4",
                                             err, sizeof err),
                   0);
  assert_int_equal(cu.large_segment_size, 40 * MiB);
  msnap__conf_destroy(&cu);
  msnap__conf_destroy(&c);
}

static void test_from_env(void **state) {
  (void)state;
  const char *v = (const char *)1;
  unsetenv("PYTORCH_NPU_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  assert_int_equal(msnap__conf_from_env(MSNAP_PROFILE_NPU, &v, err, sizeof err),
                   0);
  assert_null(v);
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:30", 1);
  /* The npu profile ignores PYTORCH_CUDA_ALLOC_CONF. */
  assert_int_equal(msnap__conf_from_env(MSNAP_PROFILE_NPU, &v, err, sizeof err),
                   0);
  assert_null(v);
  assert_int_equal(
      msnap__conf_from_env(MSNAP_PROFILE_CUDA, &v, err, sizeof err), 0);
  assert_string_equal(v, "max_split_size_mb:30");
  setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True", 1);
  /* cuda: PYTORCH_CUDA_ALLOC_CONF wins over PYTORCH_ALLOC_CONF. */
  assert_int_equal(
      msnap__conf_from_env(MSNAP_PROFILE_CUDA, &v, err, sizeof err), 0);
  assert_string_equal(v, "max_split_size_mb:30");
  assert_int_equal(msnap__conf_from_env(MSNAP_PROFILE_NPU, &v, err, sizeof err),
                   0);
  assert_string_equal(v, "expandable_segments:True");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  assert_int_equal(
      msnap__conf_from_env(MSNAP_PROFILE_CUDA, &v, err, sizeof err), 0);
  assert_string_equal(v, "expandable_segments:True");
  setenv("PYTORCH_NPU_ALLOC_CONF", "page_size:1g", 1);
  v = (const char *)1;
  assert_int_equal(msnap__conf_from_env(MSNAP_PROFILE_NPU, &v, err, sizeof err),
                   MSNAP_ECONF);
  assert_ptr_equal(v, (const char *)1);
  assert_string_equal(err,
                      "alloc conf: Both PYTORCH_NPU_ALLOC_CONF and "
                      "PYTORCH_ALLOC_CONF have been set, please set only one "
                      "of them. (PYTORCH_NPU_ALLOC_CONF=\"page_size:1g\", "
                      "PYTORCH_ALLOC_CONF=\"expandable_segments:True\")");
  unsetenv("PYTORCH_ALLOC_CONF");
  assert_int_equal(msnap__conf_from_env(MSNAP_PROFILE_NPU, &v, err, sizeof err),
                   0);
  assert_string_equal(v, "page_size:1g");
  unsetenv("PYTORCH_NPU_ALLOC_CONF");
}

static void test_raw_ownership(void **state) {
  (void)state;
  msnap_conf_t c;
  msnap__conf_init(&c, MSNAP_PROFILE_CUDA);
  char buf[64];
  strcpy(buf, "max_split_size_mb:25");
  ok(&c, buf);
  /* raw is a copy. */
  strcpy(buf, "garbage");
  assert_string_equal(c.raw, "max_split_size_mb:25");
  /* A NULL err buffer is allowed; the message still reaches last_error. */
  assert_int_equal(msnap__conf_parse(&c, "x:1", NULL, 0), MSNAP_ECONF);
  assert_string_equal(msnap_last_error(),
                      "alloc conf: unrecognized key 'x' at token 1 in "
                      "\"x:1\"");
  /* A short err buffer is truncated, not overrun. */
  char small[12];
  memset(small, 'Z', sizeof small);
  assert_int_equal(msnap__conf_parse(&c, "x:1", small, 8), MSNAP_ECONF);
  assert_string_equal(small, "alloc c");
  assert_int_equal(small[8], 'Z');
  msnap__conf_destroy(&c);
}

/*
 * Token soup: random strings built from keys, values and separators.  A
 * parse either succeeds (conf passes its checker, raw = the string) or
 * fails with an "alloc conf: ..." message naming a position, leaving the
 * conf bit-identical.  Deterministic (fixed seed).
 */
static void test_random_strings(void **state) {
  (void)state;
  static const char *vocab[] = {
      "max_split_size_mb", "garbage_collection_threshold",
      "roundup_power2_divisions", "expandable_segments",
      "large_segment_size_mb", "max_non_split_rounding_mb", "page_size",
      "base_addr_aligned_kb", "segment_size_mb", "backend",
      "per_process_memory_fraction", "pinned_num_register_threads",
      "throw_on_npumalloc_oom", "throw_on_cudamalloc_oom", "True", "False",
      "0", "1", "4", "16", "20", "64", "100", "0.5", "1g", ">", "native",
      ":", ":", ":", ",", ",", "[", "]", " ", "x", "-3", "1e400"};
  const size_t nv = sizeof vocab / sizeof vocab[0];
  unsigned seed = 12345;
  char buf[512];
  int ok_count = 0, err_count = 0;
  for (int prof = 0; prof < 2; prof++) {
    msnap_conf_t c;
    msnap__conf_init(&c, (msnap_profile_t)prof);
    for (int it = 0; it < 6000; it++) {
      /* key:value pairs, each token corrupted with probability 1/16. */
      size_t len = 0;
      int npairs = 1 + (int)(rand_r(&seed) % 4);
      buf[0] = '\0';
      for (int k = 0; k < npairs; k++) {
        const char *t[4] = {vocab[rand_r(&seed) % 14], ":",
                            vocab[14 + rand_r(&seed) % 13], ","};
        if (k == npairs - 1) t[3] = "";
        for (int j = 0; j < 4; j++) {
          if (rand_r(&seed) % 16 == 0) t[j] = vocab[rand_r(&seed) % nv];
          size_t tl = strlen(t[j]);
          if (len + tl + 1 >= sizeof buf) break;
          memcpy(buf + len, t[j], tl + 1);
          len += tl;
        }
      }
      msnap_conf_t before = c;
      err[0] = '\0';
      int rc = msnap__conf_parse(&c, buf, err, sizeof err);
      if (rc == 0) {
        ok_count++;
        assert_string_equal(c.raw, buf);
      } else {
        err_count++;
        assert_int_equal(rc, MSNAP_ECONF);
        assert_memory_equal(&before, &c, sizeof c);
        assert_int_equal(strncmp(err, "alloc conf: ", 12), 0);
        assert_true(strstr(err, " at token ") != NULL ||
                    strstr(err, " at end of ") != NULL);
      }
      CHECK(&c);
    }
    msnap__conf_destroy(&c);
  }
  /* Both outcomes were exercised. */
  assert_true(ok_count > 100);
  assert_true(err_count > 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_generic_keys),
      cmocka_unit_test(test_cuda_keys),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_reset_semantics),
      cmocka_unit_test(test_roundup_divisions),
      cmocka_unit_test(test_npu_profile),
      cmocka_unit_test(test_npu_runtime_keys),
      cmocka_unit_test(test_from_env),
      cmocka_unit_test(test_raw_ownership),
      cmocka_unit_test(test_random_strings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
