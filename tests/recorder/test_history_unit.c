/*
 * test_history_unit.c -- the record layer alone (no allocator, no stub of
 * one): the trace ring (record/ring.c: newest entries kept, chunk
 * boundaries, growth after wrapping, capacity changes, clear), the
 * recording settings (skip set, context levels and stacks), thread-local
 * metadata and compile context, the annotation ring, action names and
 * the clock.  Each test owns its rings and settings, takes a mutex where
 * the allocator would hold the ring owner's lock, and runs
 * msnap__ring_check after every recorded event.  The allocator's history
 * API on top of these (msnap_record_history, annotate_memory) is tested
 * in test_history_api.c.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "record/history.h"
#include "record/stack.h"

static const msnap_mempool_id_t POOL0 = {0, 0};

/* What an allocator owns for one device: its lock, its ring, and the
 * settings of the allocator. */
typedef struct rec_s {
  pthread_mutex_t lock;
  msnap_hsettings_t s;
  msnap_ring_t ring;
} rec_t;

static rec_t *rec_new(void) {
  rec_t *r = calloc(1, sizeof *r);
  pthread_mutex_init(&r->lock, NULL);
  msnap__hsettings_init(&r->s);
  msnap__ring_init(&r->ring);
  return r;
}

static void rec_free(rec_t *r) {
  msnap__ring_destroy(&r->ring);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

/* Record one event the way the allocator does: capture outside the lock,
 * record under it, check the ring, release what the context still holds. */
static void event(rec_t *r, msnap_action_t act, uint64_t addr, uint64_t size,
                  bool free_site) {
  msnap_rctx_t ctx;
  msnap__rctx_capture(&r->s, &ctx, free_site);
  pthread_mutex_lock(&r->lock);
  msnap__ring_record(&r->ring, &r->s, act, addr, size, 7, POOL0, &ctx, 0);
  char msg[256];
  int rc = msnap__ring_check(&r->ring, msg, sizeof msg);
  if (rc != 0) fail_msg("%s", msg);
  pthread_mutex_unlock(&r->lock);
  msnap__rctx_release(&ctx);
}

/* Settings and ring capacity as msnap_record_history sets them for one
 * device: the clock started, on, skip set, capacity max(1, max_entries)
 * without clearing, context level, then clear when asked. */
static void enable(rec_t *r, uint64_t max_entries, msnap_record_context_t ctx,
                   bool clear, uint32_t skip) {
  msnap__clock_init();
  pthread_mutex_lock(&r->lock);
  atomic_store(&r->s.enabled, true);
  atomic_store(&r->s.skip, skip);
  atomic_store(&r->s.stacks,
               ctx == MSNAP_CONTEXT_NEVER ? 0u : (unsigned)MSNAP_STACKS_CPP);
  msnap__ring_set_capacity(&r->ring, max_entries ? max_entries : 1);
  atomic_store(&r->s.level, (int)ctx);
  if (clear) msnap__ring_clear(&r->ring);
  pthread_mutex_unlock(&r->lock);
}

static void disable(rec_t *r) {
  pthread_mutex_lock(&r->lock);
  atomic_store(&r->s.enabled, false);
  atomic_store(&r->s.level, MSNAP_CONTEXT_NEVER);
  atomic_store(&r->s.stacks, 0u);
  msnap__ring_clear(&r->ring);
  pthread_mutex_unlock(&r->lock);
}

/* Copy the ring; returns the count. */
static size_t copy(rec_t *r, msnap_hcopy_t **v, uint64_t *dropped) {
  size_t n;
  pthread_mutex_lock(&r->lock);
  assert_int_equal(msnap__ring_copy(&r->ring, v, &n), 0);
  *dropped = r->ring.dropped;
  pthread_mutex_unlock(&r->lock);
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
  rec_t *a = rec_new(), *b = rec_new(); /* two devices */
  enable(a, 3, MSNAP_CONTEXT_NEVER, false, 0);
  enable(b, 3, MSNAP_CONTEXT_NEVER, false, 0);
  for (uint64_t i = 1; i <= 5; i++)
    event(a, MSNAP_ACTION_ALLOC, 0x1000 * i, i, false);
  event(b, MSNAP_ACTION_ALLOC, 0x9000, 9, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
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
  n = copy(b, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(dropped, 0);
  msnap__hcopy_release(v, n);

  /* Raising the capacity keeps the entries; lowering keeps the newest. */
  enable(a, 10, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, MSNAP_ACTION_ALLOC, 0x6000, 6, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].e.addr, 0x3000);
  assert_int_equal(v[3].e.addr, 0x6000);
  msnap__hcopy_release(v, n);
  enable(a, 2, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].e.addr, 0x5000);
  assert_int_equal(v[1].e.addr, 0x6000);
  assert_int_equal(dropped, 4);
  msnap__hcopy_release(v, n);

  /* max_entries 0 is clamped to 1 ("state" mode). */
  enable(a, 0, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, MSNAP_ACTION_FREE_REQUESTED, 0x7000, 7, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].e.action, MSNAP_ACTION_FREE_REQUESTED);
  msnap__hcopy_release(v, n);
  rec_free(a);
  rec_free(b);
}

static void test_ring_growth_many(void **state) {
  (void)state;
  rec_t *a = rec_new();
  enable(a, 1000, MSNAP_CONTEXT_NEVER, false, 0);
  for (uint64_t i = 0; i < 2500; i++)
    event(a, MSNAP_ACTION_ALLOC, i, i, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 1000);
  assert_int_equal(dropped, 1500);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 1500 + i);
  msnap__hcopy_release(v, n);
  rec_free(a);
}


/* Chunk boundaries: wrap, grow after wrapping, shrink, odd capacities. */
/* Chunk boundaries: wrap, grow after wrapping, shrink, odd capacities. */
static void test_ring_chunks(void **state) {
  (void)state;
  rec_t *a = rec_new();
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n;
  enable(a, 10000, MSNAP_CONTEXT_NEVER, true, 0);
  uint64_t next = 0;
  for (int i = 0; i < 25000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 10000);
  assert_int_equal(dropped, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 15000 + i);
  msnap__hcopy_release(v, n);
  assert_int_equal(a->ring.nchunks, 3);
  /* grow after wrapping: straightened, then chunks are added */
  enable(a, 20000, MSNAP_CONTEXT_NEVER, false, 0);
  for (int i = 0; i < 5000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].e.addr, 15000 + i);
  msnap__hcopy_release(v, n);
  /* shrink keeps the newest */
  enable(a, 4097, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4097);
  assert_int_equal(v[0].e.addr, 30000 - 4097);
  assert_int_equal(v[4096].e.addr, 29999);
  msnap__hcopy_release(v, n);
  assert_int_equal(a->ring.vcap, 4097);
  for (int i = 0; i < 9000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4097);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(v[i].e.addr, next - 4097 + i);
  msnap__hcopy_release(v, n);
  char msg[256];
  pthread_mutex_lock(&a->lock);
  assert_int_equal(msnap__ring_check(&a->ring, msg, sizeof msg), 0);
  pthread_mutex_unlock(&a->lock);
  rec_free(a);
}

static void test_clear_and_disable(void **state) {
  (void)state;
  rec_t *a = rec_new();
  enable(a, 100, MSNAP_CONTEXT_ALL, false, 0);
  assert_true(msnap__hsettings_on(&a->s));
  event(a, MSNAP_ACTION_ALLOC, 1, 1, false);
  /* Re-enabling with another context keeps the entries. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, false, 0);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  msnap__hcopy_release(v, n);
  /* clear_history empties the ring. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 0);
  msnap__hcopy_release(v, n);
  event(a, MSNAP_ACTION_ALLOC, 2, 2, false);
  /* Disabling discards history and records nothing more. */
  disable(a);
  assert_false(msnap__hsettings_on(&a->s));
  event(a, MSNAP_ACTION_ALLOC, 3, 3, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 0);
  msnap__hcopy_release(v, n);
  rec_free(a);
}

static void test_skip_actions(void **state) {
  (void)state;
  rec_t *a = rec_new();
  enable(a, 100, MSNAP_CONTEXT_NEVER, false,
         (1u << MSNAP_ACTION_FREE_REQUESTED) | (1u << MSNAP_ACTION_SNAPSHOT));
  event(a, MSNAP_ACTION_ALLOC, 1, 1, false);
  event(a, MSNAP_ACTION_FREE_REQUESTED, 1, 1, true);
  event(a, MSNAP_ACTION_FREE_COMPLETED, 1, 1, true);
  event(a, MSNAP_ACTION_SNAPSHOT, 0, 0, false);
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].e.action, MSNAP_ACTION_ALLOC);
  assert_int_equal(v[1].e.action, MSNAP_ACTION_FREE_COMPLETED);
  msnap__hcopy_release(v, n);
  /* The skip set is replaced on every call. */
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  event(a, MSNAP_ACTION_FREE_REQUESTED, 1, 1, true);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  msnap__hcopy_release(v, n);
  /* Actions outside the table are never recorded. */
  event(a, (msnap_action_t)MSNAP_ACTION_COUNT, 1, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  msnap__hcopy_release(v, n);
  rec_free(a);
}

static void test_context_levels(void **state) {
  (void)state;
  rec_t *a = rec_new();
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  msnap_rctx_t ctx;
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n;

  /* STATE: a stack for blocks, none on entries, none at free sites. */
  enable(a, 100, MSNAP_CONTEXT_STATE, true, 0);
  msnap__rctx_capture(&a->s, &ctx, false);
  assert_int_not_equal(ctx.stack, 0);
  assert_int_equal(ctx.level, MSNAP_CONTEXT_STATE);
  msnap__rctx_release(&ctx);
  msnap__rctx_capture(&a->s, &ctx, true);
  assert_int_equal(ctx.stack, 0);
  msnap__rctx_release(&ctx);
  event(a, MSNAP_ACTION_ALLOC, 1, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].e.stack, 0);
  msnap__hcopy_release(v, n);

  /* ALLOC: entries carry the malloc stack; free sites capture none, the
   * allocator passes the block's stack as override. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  msnap_rctx_t actx;
  msnap__rctx_capture(&a->s, &actx, false);
  assert_int_not_equal(actx.stack, 0);
  pthread_mutex_lock(&a->lock);
  msnap__ring_record(&a->ring, &a->s, MSNAP_ACTION_ALLOC, 1, 1, 0, POOL0,
                     &actx, 0);
  pthread_mutex_unlock(&a->lock);
  msnap__rctx_capture(&a->s, &ctx, true);
  assert_int_equal(ctx.stack, 0);
  pthread_mutex_lock(&a->lock);
  msnap__ring_record(&a->ring, &a->s, MSNAP_ACTION_FREE_REQUESTED, 1, 1, 0,
                     POOL0, &ctx, actx.stack);
  pthread_mutex_unlock(&a->lock);
  msnap__rctx_release(&ctx);
  n = copy(a, &v, &dropped);
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
  msnap__rctx_capture(&a->s, &ctx, true);
  assert_int_not_equal(ctx.stack, 0);
  msnap__rctx_release(&ctx);

  /* Disabling and destroying frees every stack. */
  disable(a);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_live(), live0);
  char msg[256];
  assert_int_equal(msnap__stack_check(msg, sizeof msg), 0);
  rec_free(a);
}

static void test_metadata_and_compile_context(void **state) {
  (void)state;
  rec_t *a = rec_new();
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  assert_string_equal(msnap_get_memory_metadata(), "");
  event(a, MSNAP_ACTION_ALLOC, 1, 1, false);
  assert_int_equal(msnap_set_memory_metadata("phase=fwd"), 0);
  assert_string_equal(msnap_get_memory_metadata(), "phase=fwd");
  assert_int_equal(msnap_compile_context_push("Torch-Compiled Region: 0/0"),
                   0);
  assert_int_equal(msnap_compile_context_push("Torch-Compiled Region: 1/0"),
                   0);
  event(a, MSNAP_ACTION_ALLOC, 2, 2, false);
  assert_int_equal(msnap_compile_context_pop(), 0);
  event(a, MSNAP_ACTION_ALLOC, 3, 3, false);
  assert_int_equal(msnap_compile_context_pop(), 0);
  assert_int_equal(msnap_compile_context_pop(), MSNAP_ESTATE);
  assert_int_equal(msnap_set_memory_metadata(""), 0);
  event(a, MSNAP_ACTION_ALLOC, 4, 4, false);

  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
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
  rec_free(a);
}

/* The annotation ring keeps the newest `capacity` entries (growing in
 * steps), lowering the capacity keeps the newest, clear drops them all and
 * every name's reference goes with its entry. */
static void test_annotation_ring(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  msnap_annring_t r;
  msnap__ann_init(&r);
  msnap__ann_configure(&r, 3, true);
  assert_null(r.v);
  const char *names[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(msnap__ann_record(&r, i, names[i], i % 2 == 0), 0);
  msnap_aentry_t *v;
  size_t n;
  assert_int_equal(msnap__ann_copy(&r, &v, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(r.dropped, 1);
  assert_string_equal(msnap__str_get(v[0].name, NULL), "b");
  assert_int_equal(v[0].device, 1);
  assert_false(v[0].is_start);
  assert_string_equal(msnap__str_get(v[2].name, NULL), "d");
  assert_true(v[1].raw_time <= v[2].raw_time);
  for (size_t i = 0; i < n; i++) msnap__stack_unref(v[i].name);
  free(v);
  /* Lowering the capacity keeps the newest. */
  msnap__ann_configure(&r, 2, false);
  assert_int_equal(msnap__ann_copy(&r, &v, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(msnap__str_get(v[0].name, NULL), "c");
  for (size_t i = 0; i < n; i++) msnap__stack_unref(v[i].name);
  free(v);
  /* More than the first 64-slot step: the ring grows. */
  msnap__ann_configure(&r, 1000, true);
  for (int i = 0; i < 200; i++)
    assert_int_equal(msnap__ann_record(&r, 0, names[i % 4], true), 0);
  assert_int_equal(msnap__ann_copy(&r, &v, &n), 0);
  assert_int_equal(n, 200);
  assert_string_equal(msnap__str_get(v[199].name, NULL), "d");
  for (size_t i = 0; i < n; i++) msnap__stack_unref(v[i].name);
  free(v);
  msnap__ann_configure(&r, 1000, true);
  assert_int_equal(msnap__ann_copy(&r, &v, &n), 0);
  assert_int_equal(n, 0);
  free(v);
  msnap__ann_destroy(&r);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_live(), live0);
}

static int64_t realtime_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void test_clock(void **state) {
  (void)state;
  rec_t *a = rec_new();
  enable(a, 10000, MSNAP_CONTEXT_NEVER, true, 0);
  int64_t before = realtime_us();
  for (int i = 0; i < 2000; i++) event(a, MSNAP_ACTION_ALLOC, i, 1, false);
  int64_t after = realtime_us();
  msnap__clock_calibrate();
  msnap_hcopy_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
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
  rec_free(a);
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
    rec_t *a = rec_new();
    enable(a, cap0, MSNAP_CONTEXT_NEVER, true, 0);
    uint64_t next = 1;
    for (uint64_t i = 0; i < cap0 + 2; i++)
      event(a, MSNAP_ACTION_ALLOC, next++, 1, false); /* wraps */
    enable(a, 10000, MSNAP_CONTEXT_NEVER, false, 0);
    for (int i = 0; i < 5000; i++)
      event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
    msnap_hcopy_t *v;
    uint64_t dropped;
    size_t n = copy(a, &v, &dropped);
    assert_int_equal(n, cap0 + 5000 > 10000 ? 10000 : cap0 + 5000);
    for (size_t i = 0; i < n; i++)
      assert_int_equal(v[i].e.addr, next - n + i);
    msnap__hcopy_release(v, n);
    rec_free(a);
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
      cmocka_unit_test(test_context_levels),
      cmocka_unit_test(test_metadata_and_compile_context),
      cmocka_unit_test(test_annotation_ring),
      cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
