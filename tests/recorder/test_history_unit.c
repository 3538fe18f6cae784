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

#include "decoded_copy.h"

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

/* Copy the ring (decoded); returns the count. */
static size_t copy(rec_t *r, msnap_hentry_t **v, uint64_t *dropped) {
  msnap_hcopy_t c;
  pthread_mutex_lock(&r->lock);
  assert_int_equal(msnap__ring_copy(&r->ring, &c), 0);
  *dropped = r->ring.dropped;
  pthread_mutex_unlock(&r->lock);
  *v = decode(&c);
  return (size_t)c.n;
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
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 3);
  assert_int_equal(dropped, 2);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(v[i].addr, 0x1000 * (i + 3));
    assert_int_equal(v[i].size, i + 3);
    assert_int_equal(v[i].stream, 7);
    assert_int_equal(v[i].action, MSNAP_ACTION_ALLOC);
    assert_int_equal(v[i].stack, 0); /* context NEVER: no stacks */
  }
  release(v);
  n = copy(b, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(dropped, 0);
  release(v);

  /* Raising the capacity keeps the entries; lowering keeps the newest. */
  enable(a, 10, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, MSNAP_ACTION_ALLOC, 0x6000, 6, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].addr, 0x3000);
  assert_int_equal(v[3].addr, 0x6000);
  release(v);
  enable(a, 2, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].addr, 0x5000);
  assert_int_equal(v[1].addr, 0x6000);
  assert_int_equal(dropped, 4);
  release(v);

  /* max_entries 0 is clamped to 1 ("state" mode). */
  enable(a, 0, MSNAP_CONTEXT_NEVER, false, 0);
  event(a, MSNAP_ACTION_FREE_REQUESTED, 0x7000, 7, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].action, MSNAP_ACTION_FREE_REQUESTED);
  release(v);
  rec_free(a);
  rec_free(b);
}

static void test_ring_growth_many(void **state) {
  (void)state;
  rec_t *a = rec_new();
  enable(a, 1000, MSNAP_CONTEXT_NEVER, false, 0);
  for (uint64_t i = 0; i < 2500; i++)
    event(a, MSNAP_ACTION_ALLOC, i, i, false);
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 1000);
  assert_int_equal(dropped, 1500);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].addr, 1500 + i);
  release(v);
  rec_free(a);
}


/* Chunk boundaries: wrap, grow after wrapping, shrink, odd capacities. */
/* Chunk boundaries: wrap, grow after wrapping, shrink, odd capacities. */
static void test_ring_chunks(void **state) {
  (void)state;
  rec_t *a = rec_new();
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n;
  enable(a, 10000, MSNAP_CONTEXT_NEVER, true, 0);
  uint64_t next = 0;
  for (int i = 0; i < 25000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 10000);
  assert_int_equal(dropped, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].addr, 15000 + i);
  release(v);
  assert_int_equal(a->ring.nchunks, 3);
  /* grow after wrapping: straightened, then chunks are added */
  enable(a, 20000, MSNAP_CONTEXT_NEVER, false, 0);
  for (int i = 0; i < 5000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 15000);
  for (size_t i = 0; i < n; i++) assert_int_equal(v[i].addr, 15000 + i);
  release(v);
  /* shrink keeps the newest */
  enable(a, 4097, MSNAP_CONTEXT_NEVER, false, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4097);
  assert_int_equal(v[0].addr, 30000 - 4097);
  assert_int_equal(v[4096].addr, 29999);
  release(v);
  assert_int_equal(a->ring.vcap, 4097);
  for (int i = 0; i < 9000; i++)
    event(a, MSNAP_ACTION_ALLOC, next++, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 4097);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(v[i].addr, next - 4097 + i);
  release(v);
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
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  release(v);
  /* clear_history empties the ring. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 0);
  release(v);
  event(a, MSNAP_ACTION_ALLOC, 2, 2, false);
  /* Disabling discards history and records nothing more. */
  disable(a);
  assert_false(msnap__hsettings_on(&a->s));
  event(a, MSNAP_ACTION_ALLOC, 3, 3, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 0);
  release(v);
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
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 2);
  assert_int_equal(v[0].action, MSNAP_ACTION_ALLOC);
  assert_int_equal(v[1].action, MSNAP_ACTION_FREE_COMPLETED);
  release(v);
  /* The skip set is replaced on every call. */
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  event(a, MSNAP_ACTION_FREE_REQUESTED, 1, 1, true);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  release(v);
  /* Actions outside the table are never recorded. */
  event(a, (msnap_action_t)MSNAP_ACTION_COUNT, 1, 1, false);
  n = copy(a, &v, &dropped);
  assert_int_equal(n, 1);
  release(v);
  rec_free(a);
}

static void test_context_levels(void **state) {
  (void)state;
  rec_t *a = rec_new();
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  msnap_rctx_t ctx;
  msnap_hentry_t *v;
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
  assert_int_equal(v[0].stack, 0);
  release(v);

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
  assert_int_equal(v[0].stack, actx.stack);
  assert_int_equal(v[1].stack, actx.stack);
  /* Both entries share one entry context, which holds the ring's one
   * reference; the copy holds one per context: ring (1) + copy (1) + the
   * thread's stack cache (1: actx borrows its id from a pinned slot, which
   * a flush keeps). */
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_refcount(actx.stack), 3);
  release(v);
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

  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].user_metadata, 0);
  assert_int_equal(v[0].compile_context, 0);
  assert_string_equal(msnap__str_get(v[1].user_metadata, NULL), "phase=fwd");
  assert_string_equal(msnap__str_get(v[1].compile_context, NULL),
                      "Torch-Compiled Region: 1/0");
  assert_string_equal(msnap__str_get(v[2].compile_context, NULL),
                      "Torch-Compiled Region: 0/0");
  assert_int_equal(v[3].user_metadata, 0);
  assert_int_equal(v[3].compile_context, 0);
  release(v);
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
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, &v, &dropped);
  assert_int_equal(n, 2000);
  int64_t prev = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    int64_t t = msnap__clock_to_us(v[i].raw_time);
    assert_true(t >= prev);
    /* Within the bracketing wall-clock reads, with 2 ms of slack for the
     * calibration error. */
    assert_true(t >= before - 2000);
    assert_true(t <= after + 2000);
    prev = t;
  }
  release(v);
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
    msnap_hentry_t *v;
    uint64_t dropped;
    size_t n = copy(a, &v, &dropped);
    assert_int_equal(n, cap0 + 5000 > 10000 ? 10000 : cap0 + 5000);
    for (size_t i = 0; i < n; i++)
      assert_int_equal(v[i].addr, next - n + i);
    release(v);
    rec_free(a);
  }
}

/* ---- the packed ring against a plain one ---------------------------------
 * The ring stores 28-byte slots and shares stacks, metadata, streams and
 * pools through entry contexts (ring.c).  Here a plain reference -- the
 * newest `capacity` wide entries in a flat array -- receives the same
 * random events (a few stacks, strings, streams, pools, every action,
 * sizes with all 64 bits used, capacity changes with and without clear);
 * after every step the decoded copy must equal it entry for entry, the
 * ring must pass its check, and in the end every reference is gone. */
typedef struct ref_s {
  msnap_hentry_t *v;
  size_t n, cap;
  uint64_t capacity, dropped;
} ref_t;

static void ref_push(ref_t *r, const msnap_hentry_t *e) {
  if (r->n == r->capacity) {
    memmove(r->v, r->v + 1, (r->n - 1) * sizeof *r->v);
    r->n--;
    r->dropped++;
  }
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 64;
    r->v = realloc(r->v, r->cap * sizeof *r->v);
    assert_non_null(r->v);
  }
  r->v[r->n++] = *e;
}

static void ref_capacity(ref_t *r, uint64_t capacity) {
  r->capacity = capacity;
  if (r->n > capacity) {
    size_t drop = r->n - (size_t)capacity;
    memmove(r->v, r->v + drop, (size_t)capacity * sizeof *r->v);
    r->n = (size_t)capacity;
    r->dropped += drop;
  }
}

static uint64_t rnd_next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static void test_ring_matches_reference(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  uintptr_t pcs[3][2] = {{0x1000, 0x2000}, {0x1000, 0x3000}, {0x4000, 0}};
  uint32_t stacks[3], strs[3];
  for (int i = 0; i < 3; i++)
    stacks[i] = msnap__stack_intern(pcs[i], i == 2 ? 1 : 2, NULL, 0, NULL);
  strs[0] = msnap__str_intern("phase=fwd", 9);
  strs[1] = msnap__str_intern("Torch-Compiled Region: 0/1", 26);
  strs[2] = msnap__str_intern("phase=bwd", 9);
  rec_t *a = rec_new();
  ref_t ref = {0};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  enable(a, 300, MSNAP_CONTEXT_ALL, true, 0);
  ref.capacity = 300;
  static const msnap_mempool_id_t pools[3] = {{0, 0}, {0, 1}, {7, 0}};
  static const uint64_t caps[] = {1, 5, 299, 4096, 4097, 9000};
  for (int step = 0; step < 40000; step++) {
    uint64_t r = rnd_next(&x);
    if (r % 1000 == 0) { /* capacity change, sometimes with clear */
      uint64_t cap = caps[(r >> 10) % (sizeof caps / sizeof caps[0])];
      bool clear = (r >> 20) % 4 == 0;
      enable(a, cap, MSNAP_CONTEXT_ALL, clear, 0);
      ref_capacity(&ref, cap);
      if (clear) ref.n = 0, ref.dropped = 0;
    } else {
      msnap_hentry_t e;
      memset(&e, 0, sizeof e);
      e.action = (uint8_t)((r >> 8) % MSNAP_ACTION_COUNT);
      e.addr = rnd_next(&x);
      uint64_t w = rnd_next(&x);
      e.size = (r >> 16) % 8 == 0 ? w : w >> (w % 64); /* all 64 bits too */
      e.stream = (r >> 24) % 3 * 7;
      e.pool = pools[(r >> 28) % 3];
      e.stack = (r >> 32) % 4 ? stacks[(r >> 34) % 3] : 0;
      e.user_metadata = (r >> 36) % 2 ? strs[(r >> 37) % 3] : 0;
      e.compile_context = (r >> 39) % 3 == 0 ? strs[1] : 0;
      msnap_rctx_t ctx;
      memset(&ctx, 0, sizeof ctx);
      ctx.stack = e.stack;
      ctx.user_metadata = e.user_metadata;
      ctx.compile_context = e.compile_context;
      pthread_mutex_lock(&a->lock);
      msnap__ring_record(&a->ring, &a->s, (msnap_action_t)e.action, e.addr,
                         e.size, e.stream, e.pool, &ctx, 0);
      pthread_mutex_unlock(&a->lock);
      ref_push(&ref, &e);
    }
    pthread_mutex_lock(&a->lock);
    char msg[256];
    int rc = msnap__ring_check(&a->ring, msg, sizeof msg);
    if (rc != 0) fail_msg("step %d: %s", step, msg);
    assert_int_equal(a->ring.dropped, ref.dropped);
    pthread_mutex_unlock(&a->lock);
    if (step % 97 != 0 && step < 39999) continue;
    msnap_hentry_t *v;
    uint64_t dropped;
    size_t n = copy(a, &v, &dropped);
    assert_int_equal(n, ref.n);
    for (size_t i = 0; i < n; i++) {
      const msnap_hentry_t *g = &v[i], *w2 = &ref.v[i];
      if (g->addr != w2->addr || g->size != w2->size ||
          g->action != w2->action || g->stream != w2->stream ||
          g->pool.first != w2->pool.first ||
          g->pool.second != w2->pool.second || g->stack != w2->stack ||
          g->user_metadata != w2->user_metadata ||
          g->compile_context != w2->compile_context ||
          g->internal_meta != 0)
        fail_msg("step %d: entry %zu of %zu differs from the reference", step,
                 i, n);
      if (i > 0) assert_true(g->raw_time >= v[i - 1].raw_time);
    }
    release(v);
  }
  free(ref.v);
  rec_free(a);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(msnap__stack_refcount(stacks[i]), 1);
    msnap__stack_unref(stacks[i]);
    assert_int_equal(msnap__stack_refcount(strs[i]), 1);
    msnap__stack_unref(strs[i]);
  }
  assert_int_equal(msnap__stack_live(), live0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_action_names),
      cmocka_unit_test(test_ring_keeps_newest),
      cmocka_unit_test(test_ring_growth_many),
      cmocka_unit_test(test_ring_chunks),
      cmocka_unit_test(test_ring_capacity_grows_after_partial_chunk),
      cmocka_unit_test(test_ring_matches_reference),
      cmocka_unit_test(test_clear_and_disable),
      cmocka_unit_test(test_skip_actions),
      cmocka_unit_test(test_context_levels),
      cmocka_unit_test(test_metadata_and_compile_context),
      cmocka_unit_test(test_annotation_ring),
      cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
