/*
 * test_history_unit.c -- the trace ring, skip set, context levels,
 * metadata, compile context, annotations and clock, against a fake
 * allocator (fake_alloc.c) so that only the recorder is under test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fake_alloc.h"

static const msnap_mempool_id_t POOL0 = {0, 0};

/* Record one event the way alloc.c does: capture outside the lock, record
 * under it, release what the context still holds. */
static void event(msnap_allocator_t *a, int dev, msnap_action_t act,
                  uint64_t addr, uint64_t size, bool free_site) {
  msnap_rctx_t ctx;
  msnap__rctx_capture(a, &ctx, free_site);
  msnap__device_lock(a, dev);
  msnap__history_record_locked(a, dev, act, addr, size, 7, POOL0, &ctx, 0);
  char msg[256];
  int rc = msnap__ring_check(&a->rec->rings[dev], msg, sizeof msg);
  if (rc != 0) fail_msg("%s", msg);
  msnap__device_unlock(a, dev);
  msnap__rctx_release(&ctx);
}

static void enable(msnap_allocator_t *a, uint64_t max_entries,
                   msnap_record_context_t ctx, bool clear, uint32_t skip) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.max_entries = max_entries;
  o.context = ctx;
  o.clear_history = clear;
  o.skip_actions = skip;
  o.stacks = MSNAP_STACKS_CPP;
  assert_int_equal(msnap_record_history(a, &o), 0);
}

static void disable(msnap_allocator_t *a) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = false;
  assert_int_equal(msnap_record_history(a, &o), 0);
}

/* Copy device dev's ring; returns the count. */
static size_t copy(msnap_allocator_t *a, int dev, msnap_hcopy_t **v,
                   uint64_t *dropped) {
  size_t n;
  uint64_t cap;
  msnap__device_lock(a, dev);
  assert_int_equal(msnap__ring_copy_locked(a->rec, dev, v, &n, dropped, &cap),
                   0);
  msnap__device_unlock(a, dev);
  return n;
}

static void test_action_names(void **state) {
  (void)state;
  const char *want[] = {"alloc", "free_requested", "free_completed",
                        "segment_alloc", "segment_free", "segment_map",
                        "segment_unmap", "snapshot", "oom", "annotate",
                        "workspace_snapshot"};
  assert_int_equal(MSNAP_ACTION_COUNT, 11);
  for (int i = 0; i < MSNAP_ACTION_COUNT; i++) {
    msnap_action_t a;
    assert_string_equal(msnap_action_name(i), want[i]);
    assert_int_equal(msnap_action_parse(want[i], &a), 0);
    assert_int_equal((int)a, i);
  }
  assert_null(msnap_action_name(-1));
  assert_null(msnap_action_name(MSNAP_ACTION_COUNT));
  msnap_action_t out = MSNAP_ACTION_OOM;
  assert_int_equal(msnap_action_parse("x", &out), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(), "Unknown TraceEntry action: x");
  assert_int_equal((int)out, MSNAP_ACTION_OOM); /* untouched on failure */
  assert_int_equal(msnap_action_parse("free", &out), MSNAP_EINVAL);
}

static void test_ring_keeps_newest(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(2);
  enable(a, 3, MSNAP_CONTEXT_NEVER, false, 0);
  for (uint64_t i = 1; i <= 5; i++)
    event(a, 0, MSNAP_ACTION_ALLOC, 0x1000 * i, i, false);
  event(a, 1, MSNAP_ACTION_ALLOC, 0x9000, 9, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 3);
  assert_int_equal(dropped, 2);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(v[i].e.addr, 0x1000 * (i + 3));
    assert_int_equal(v[i].e.size, i + 3);
    assert_int_equal(v[i].stream, 7);
    assert_int_equal(v[i].e.action, MSNAP_ACTION_ALLOC);
    assert_int_equal(v[i].e.stack, 0); /* context NEVER: no stacks */
  }
  msnap__hcopy_release(v, n);
  n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(dropped, 0);
  msnap__hcopy_release(v, n);

  /* Raising the capacity keeps the entries; lowering keeps the newest. */
  enable(a, 10, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, 0, MSNAP_ACTION_ALLOC, 0x6000, 6, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].e.addr, 0x3000);
  assert_int_equal(v[3].e.addr, 0x6000);
  msnap__hcopy_release(v, n);
  enable(a, 2, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].e.addr, 0x5000);
  assert_int_equal(v[1].e.addr, 0x6000);
  assert_int_equal(dropped, 4);
  msnap__hcopy_release(v, n);

  /* max_entries 0 is clamped to 1 ("state" mode). */
  enable(a, 0, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, 0, MSNAP_ACTION_FREE_REQUESTED, 0x7000, 7, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].e.action, MSNAP_ACTION_FREE_REQUESTED);
  msnap__hcopy_release(v, n);
  fake_destroy(a);
}

static void test_ring_growth_many(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  enable(a, 1000, MSNAP_CONTEXT_NEVER, false, 0);
  for (uint64_t i = 0; i < 2500; i++)
    event(a, 0, MSNAP_ACTION_ALLOC, i, i, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 1000);
  assert_int_equal(dropped, 1500);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 1500 + i);
  msnap__hcopy_release(v, n);
  fake_destroy(a);
}


/* Chunk boundaries: wrap, grow after wrapping, shrink, odd capacities. */
static void test_ring_chunks(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n;
  enable(a, 10000, MSNAP_CONTEXT_NEVER, true, 0);
  uint64_t next = 0;
  for (int i = 0; i < 25000; i++)
    event(a, 0, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 10000);
  assert_int_equal(dropped, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 15000 + i);
  msnap__hcopy_release(v, n);
  assert_int_equal(a->rec->rings[0].nchunks, 3);
  /* grow after wrapping: straightened, then chunks are added */
  enable(a, 20000, MSNAP_CONTEXT_NEVER, false, 0);
  for (int i = 0; i < 5000; i++)
    event(a, 0, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 15000 + i);
  msnap__hcopy_release(v, n);
  /* shrink keeps the newest */
  enable(a, 4097, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 4097);
  assert_int_equal(v[0].e.addr, 30000 - 4097);
  assert_int_equal(v[4096].e.addr, 29999);
  msnap__hcopy_release(v, n);
  assert_int_equal(a->rec->rings[0].vcap, 4097);
  for (int i = 0; i < 9000; i++)
    event(a, 0, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 4097);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(v[i].e.addr, next - 4097 + i);
  msnap__hcopy_release(v, n);
  char msg[256];
  msnap__device_lock(a, 0);
  assert_int_equal(msnap__ring_check(&a->rec->rings[0], msg, sizeof msg), 0);
  msnap__device_unlock(a, 0);
  fake_destroy(a);
}

static void test_clear_and_disable(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  enable(a, 100, MSNAP_CONTEXT_ALL, false, 0);
  assert_true(msnap_history_enabled(a));
  event(a, 0, MSNAP_ACTION_ALLOC, 1, 1, false);
  /* Re-enabling with another context keeps the entries. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, false, 0);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 1);
  msnap__hcopy_release(v, n);
  /* clear_history empties the ring. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 0);
  msnap__hcopy_release(v, n);
  event(a, 0, MSNAP_ACTION_ALLOC, 2, 2, false);
  /* Disabling discards history and records nothing more. */
  disable(a);
  assert_false(msnap_history_enabled(a));
  assert_false(msnap__history_active(a));
  event(a, 0, MSNAP_ACTION_ALLOC, 3, 3, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 0);
  msnap__hcopy_release(v, n);
  fake_destroy(a);
}

static void test_skip_actions(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  enable(a, 100, MSNAP_CONTEXT_NEVER, false,
         (1u << MSNAP_ACTION_FREE_REQUESTED) | (1u << MSNAP_ACTION_SNAPSHOT));
  event(a, 0, MSNAP_ACTION_ALLOC, 1, 1, false);
  event(a, 0, MSNAP_ACTION_FREE_REQUESTED, 1, 1, true);
  event(a, 0, MSNAP_ACTION_FREE_COMPLETED, 1, 1, true);
  event(a, 0, MSNAP_ACTION_SNAPSHOT, 0, 0, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].e.action, MSNAP_ACTION_ALLOC);
  assert_int_equal(v[1].e.action, MSNAP_ACTION_FREE_COMPLETED);
  msnap__hcopy_release(v, n);
  /* The skip set is replaced on every call. */
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  event(a, 0, MSNAP_ACTION_FREE_REQUESTED, 1, 1, true);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 1);
  msnap__hcopy_release(v, n);
  /* Bits outside the action table are an error naming them. */
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.skip_actions = 1u << 20;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "Unknown TraceEntry action"));
  fake_destroy(a);
}

static void test_option_validation(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  assert_true(o.enabled);
  assert_int_equal(o.context, MSNAP_CONTEXT_ALL);
  assert_int_equal(o.stacks, MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP);
  assert_true(o.max_entries == UINT64_MAX);
  assert_true(o.record_device);
  o.enabled = false;
  o.record_host = true;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(),
                      "record_pinned_host_memory requires memory history "
                      "recording to be enabled");
  msnap_history_options_init(&o);
  o.context = (msnap_record_context_t)7;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "expected context"));
  msnap_history_options_init(&o);
  o.stacks = 0;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "expected stacks"));
  msnap_history_options_init(&o);
  o.version = 99;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_false(msnap_history_enabled(a));
  fake_destroy(a);
}

static void test_context_levels(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  msnap_rctx_t ctx;
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n;

  /* STATE: a stack for blocks, none on entries, none at free sites. */
  enable(a, 100, MSNAP_CONTEXT_STATE, true, 0);
  msnap__rctx_capture(a, &ctx, false);
  assert_int_not_equal(ctx.stack, 0);
  assert_int_equal(ctx.level, MSNAP_CONTEXT_STATE);
  msnap__rctx_release(&ctx);
  msnap__rctx_capture(a, &ctx, true);
  assert_int_equal(ctx.stack, 0);
  msnap__rctx_release(&ctx);
  event(a, 0, MSNAP_ACTION_ALLOC, 1, 1, false);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].e.stack, 0);
  msnap__hcopy_release(v, n);

  /* ALLOC: entries carry the malloc stack; free sites capture none, the
   * allocator passes the block's stack as override. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  msnap_rctx_t actx;
  msnap__rctx_capture(a, &actx, false);
  assert_int_not_equal(actx.stack, 0);
  msnap__device_lock(a, 0);
  msnap__history_record_locked(a, 0, MSNAP_ACTION_ALLOC, 1, 1, 0, POOL0,
                               &actx, 0);
  msnap__device_unlock(a, 0);
  msnap__rctx_capture(a, &ctx, true);
  assert_int_equal(ctx.stack, 0);
  msnap__device_lock(a, 0);
  msnap__history_record_locked(a, 0, MSNAP_ACTION_FREE_REQUESTED, 1, 1, 0,
                               POOL0, &ctx, actx.stack);
  msnap__device_unlock(a, 0);
  msnap__rctx_release(&ctx);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].e.stack, actx.stack);
  assert_int_equal(v[1].e.stack, actx.stack);
  /* ring (2) + copy (2) + ours (1), once the thread cache let go */
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_refcount(actx.stack), 5);
  msnap__hcopy_release(v, n);
  msnap__rctx_release(&actx);

  /* ALL: free sites capture their own stack. */
  enable(a, 100, MSNAP_CONTEXT_ALL, true, 0);
  msnap__rctx_capture(a, &ctx, true);
  assert_int_not_equal(ctx.stack, 0);
  msnap__rctx_release(&ctx);

  /* Disabling and destroying frees every stack. */
  disable(a);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_live(), live0);
  char msg[256];
  assert_int_equal(msnap__stack_check(msg, sizeof msg), 0);
  fake_destroy(a);
}

static void test_metadata_and_compile_context(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  assert_string_equal(msnap_get_memory_metadata(), "");
  event(a, 0, MSNAP_ACTION_ALLOC, 1, 1, false);
  assert_int_equal(msnap_set_memory_metadata("phase=fwd"), 0);
  assert_string_equal(msnap_get_memory_metadata(), "phase=fwd");
  assert_int_equal(msnap_compile_context_push("Torch-Compiled Region: 0/0"),
                   0);
  assert_int_equal(msnap_compile_context_push("Torch-Compiled Region: 1/0"),
                   0);
  event(a, 0, MSNAP_ACTION_ALLOC, 2, 2, false);
  assert_int_equal(msnap_compile_context_pop(), 0);
  event(a, 0, MSNAP_ACTION_ALLOC, 3, 3, false);
  assert_int_equal(msnap_compile_context_pop(), 0);
  assert_int_equal(msnap_compile_context_pop(), MSNAP_ESTATE);
  assert_int_equal(msnap_set_memory_metadata(""), 0);
  event(a, 0, MSNAP_ACTION_ALLOC, 4, 4, false);

  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].e.user_metadata, 0);
  assert_int_equal(v[0].e.compile_context, 0);
  assert_string_equal(msnap__str_get(v[1].e.user_metadata, NULL), "phase=fwd");
  assert_string_equal(msnap__str_get(v[1].e.compile_context, NULL),
                      "Torch-Compiled Region: 1/0");
  assert_string_equal(msnap__str_get(v[2].e.compile_context, NULL),
                      "Torch-Compiled Region: 0/0");
  assert_int_equal(v[3].e.user_metadata, 0);
  assert_int_equal(v[3].e.compile_context, 0);
  msnap__hcopy_release(v, n);
  disable(a);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_live(), live0);
  fake_destroy(a);
}

static void test_annotate(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(2);
  a->live[0] = (fake_live_t){.ptr = 0x7f0000200000, .requested = 400,
                             .stream = 5, .device = 1,
                             .pool = {0, 3}, .stack = 0};
  a->nlive = 1;
  /* Unknown pointer: an error even with history off. */
  assert_int_equal(msnap_annotate_memory(a, 0xdead, "x"), MSNAP_EBADPTR);
  assert_string_equal(msnap_last_error(),
                      "annotateMemory: no live allocation found at pointer "
                      "0xdead");
  /* History off: accepted, nothing recorded. */
  assert_int_equal(msnap_annotate_memory(a, 0x7f0000200000, "off"), 0);
  enable(a, 100, MSNAP_CONTEXT_ALL, true, 0);
  assert_int_equal(msnap_set_memory_metadata("thread-meta"), 0);
  assert_int_equal(msnap_annotate_memory(a, 0x7f0000200000, "weights"), 0);
  assert_int_equal(msnap_set_memory_metadata(""), 0);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].e.action, MSNAP_ACTION_ANNOTATE);
  assert_int_equal(v[0].e.addr, 0x7f0000200000);
  assert_int_equal(v[0].e.size, 400);
  assert_int_equal(v[0].stream, 5);
  assert_int_equal(v[0].pool.second, 3);
  assert_string_equal(msnap__str_get(v[0].e.user_metadata, NULL), "weights");
  assert_int_not_equal(v[0].e.stack, 0); /* annotation-site stack */
  msnap__hcopy_release(v, n);
  fake_destroy(a);
}

static void test_record_annotation(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  /* Off: ignored. */
  assert_int_equal(msnap_record_annotation(a, 0, "fwd", true), 0);
  enable(a, 3, MSNAP_CONTEXT_NEVER, true, 0);
  assert_null(a->rec->ann);
  const char *names[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(msnap_record_annotation(a, 0, names[i], i % 2 == 0), 0);
  msnap_aentry_t *v;
  size_t n;
  assert_int_equal(msnap__ann_copy(a->rec, &v, &n), 0);
  assert_int_equal(n, 3);
  assert_string_equal(msnap__str_get(v[0].name, NULL), "b");
  assert_false(v[0].is_start);
  assert_string_equal(msnap__str_get(v[2].name, NULL), "d");
  for (size_t i = 0; i < n; i++) msnap__stack_unref(v[i].name);
  free(v);
  disable(a);
  assert_int_equal(msnap__ann_copy(a->rec, &v, &n), 0);
  assert_int_equal(n, 0);
  free(v);
  fake_destroy(a);
}

static int64_t realtime_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void test_clock(void **state) {
  (void)state;
  msnap_allocator_t *a = fake_create(1);
  enable(a, 10000, MSNAP_CONTEXT_NEVER, true, 0);
  int64_t before = realtime_us();
  for (int i = 0; i < 2000; i++) event(a, 0, MSNAP_ACTION_ALLOC, i, 1, false);
  int64_t after = realtime_us();
  msnap__clock_calibrate();
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 2000);
  int64_t prev = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    int64_t t = msnap__clock_to_us(v[i].e.raw_time);
    assert_true(t >= prev);
    /* Within the bracketing wall-clock reads, with 2 ms of slack for the
     * calibration error. */
    assert_true(t >= before - 2000);
    assert_true(t <= after + 2000);
    prev = t;
  }
  msnap__hcopy_release(v, n);
  int64_t now = msnap__clock_now_us(), wall = realtime_us();
  assert_true(now - wall < 2000 && wall - now < 2000);
  char msg[128];
  assert_int_equal(msnap__clock_check(msg, sizeof msg), 0);
  print_message("clock source: %s\n", msnap__clock_source());
  fake_destroy(a);
}

/* A ring whose last chunk was cut to a small capacity (max_entries 1, 3)
 * and whose capacity then grows without clear_history: the partial chunk
 * must be widened, not followed by a new chunk (slot i lives in chunk
 * i / MSNAP_RING_CHUNK, so entry 1 would land past the 1-entry chunk;
 * found by the threaded stress under ASan). */
static void test_ring_capacity_grows_after_partial_chunk(void **state) {
  (void)state;
  static const uint64_t first_caps[] = {1, 3, 4095, 4097};
  for (size_t c = 0; c < sizeof first_caps / sizeof first_caps[0]; c++) {
    uint64_t cap0 = first_caps[c];
    msnap_allocator_t *a = fake_create(1);
    enable(a, cap0, MSNAP_CONTEXT_NEVER, true, 0);
    uint64_t next = 1;
    for (uint64_t i = 0; i < cap0 + 2; i++)
      event(a, 0, MSNAP_ACTION_ALLOC, next++, 1, false); /* wraps */
    enable(a, 10000, MSNAP_CONTEXT_NEVER, false, 0);
    for (int i = 0; i < 5000; i++)
      event(a, 0, MSNAP_ACTION_ALLOC, next++, 1, false);
    msnap_hcopy_t *v;
    uint64_t dropped;
    size_t n = copy(a, 0, &v, &dropped);
    assert_int_equal(n, cap0 + 5000 > 10000 ? 10000 : cap0 + 5000);
    for (size_t i = 0; i < n; i++)
      assert_int_equal(v[i].e.addr, next - n + i);
    msnap__hcopy_release(v, n);
    fake_destroy(a);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_action_names),
      cmocka_unit_test(test_ring_keeps_newest),
      cmocka_unit_test(test_ring_growth_many),
      cmocka_unit_test(test_ring_chunks),
      cmocka_unit_test(test_ring_capacity_grows_after_partial_chunk),
      cmocka_unit_test(test_clear_and_disable),
      cmocka_unit_test(test_skip_actions),
      cmocka_unit_test(test_option_validation),
      cmocka_unit_test(test_context_levels),
      cmocka_unit_test(test_metadata_and_compile_context),
      cmocka_unit_test(test_annotate),
      cmocka_unit_test(test_record_annotation),
      cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
