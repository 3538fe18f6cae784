/*
 * test_dump.c -- the dump path of live snapshots (api/snapshot.c,
 * record/ring.c copies, model/snapshot_write.c) on the real allocator
 * (sim runtime):
 *   - the model's trace entries equal the ring's entries, decoded one by
 *     one from a copy taken just before (streams, pools, sizes, actions,
 *     stacks as frames, metadata and compile context as strings), through
 *     wrap-around and with a pool filter;
 *   - the pickle writer's trace-tail cache changes no byte: live models
 *     and models read back from a dump are written with the cache on and
 *     off and compared;
 *   - the copy holds one reference per entry context, not per entry.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc/alloc.h"
#include "api/api.h"
#include "record/stack.h"

static msnap_allocator_t *make(int ndev) {
  msnap_options_t o;
  msnap_options_init(&o);
  char nd[16];
  snprintf(nd, sizeof nd, "%d", ndev);
  setenv("MEMSNAP_SIM_DEVICES", nd, 1);
  setenv("MEMSNAP_SIM_MEMORY", "4G", 1);
  o.runtime_name = "sim";
  o.alloc_conf = "";
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("allocator_create: %s", msnap_last_error());
  return a;
}

static void history(msnap_allocator_t *a, uint64_t max_entries) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_ALL;
  o.stacks = MSNAP_STACKS_CPP;
  o.max_entries = max_entries;
  o.clear_history = true;
  assert_int_equal(msnap_record_history(a, &o), 0);
}

__attribute__((noinline)) static uint64_t alloc_at(msnap_allocator_t *a,
                                                   int dev, size_t size,
                                                   uint64_t stream) {
  uint64_t p = 0;
  int rc = msnap_malloc(a, dev, size, stream, &p);
  if (rc != 0 && rc != MSNAP_EOOM) fail_msg("malloc: %s", msnap_last_error());
  return p;
}

__attribute__((noinline)) static void nested(msnap_allocator_t *a, int depth,
                                             int i, uint64_t *live,
                                             int nlive) {
  if (depth > 0) {
    nested(a, depth - 1, i, live, nlive);
    __asm__ volatile("" ::: "memory");
    return;
  }
  int k = (i * 7919) % nlive;
  if (live[k]) {
    assert_int_equal(msnap_free(a, live[k]), 0);
    live[k] = 0;
  } else {
    live[k] = alloc_at(a, i % 2, (size_t)(512 + (i * 104729) % (24 << 20)),
                       (uint64_t)(i % 3));
  }
}

/* A workload touching every part of an entry context: two devices, three
 * streams, a private pool, metadata, compile context, OOMs, annotations. */
static msnap_mempool_id_t workload(msnap_allocator_t *a, int n, uint64_t *live,
                                   int nlive) {
  msnap_mempool_id_t pid = {0, 0};
  for (int i = 0; i < n; i++) {
    if (i == n / 6) assert_int_equal(msnap_set_memory_metadata("phase=fwd"), 0);
    if (i == n / 4)
      assert_int_equal(
          msnap_compile_context_push("Torch-Compiled Region: 0/1"), 0);
    if (i == n / 3) assert_int_equal(msnap_compile_context_pop(), 0);
    if (i == n / 2) assert_int_equal(msnap_set_memory_metadata(""), 0);
    if (i == n / 2 + 1) {
      assert_int_equal(msnap_mempool_create(a, 0, false, false, &pid), 0);
      assert_int_equal(msnap_begin_allocate_to_pool(a, 0, pid, 1, false), 0);
    }
    if (i == 2 * n / 3)
      assert_int_equal(msnap_end_allocate_to_pool(a, 0, pid), 0);
    if (i % 333 == 0 && live[7]) (void)msnap_annotate_memory(a, live[7], "w");
    if (i == n - 10) (void)alloc_at(a, 0, (size_t)64 << 30, 0); /* oom */
    nested(a, i % 9, i, live, nlive);
  }
  return pid;
}

/* Model string of id s ("" for absent). */
static const char *mstr(const msnap_snap_t *s, msnap_str_t id) {
  size_t n;
  return id ? msnap__snap_str(s, id, &n) : "";
}

/* The model trace of device d equals the copy c (decoded), apart from the
 * entries a pool filter leaves out. */
static void expect_trace_equals_copy(const msnap_snap_t *s, int d,
                                     const msnap_hcopy_t *c,
                                     msnap_mempool_id_t pool) {
  const msnap_trace_list_t *l = &s->device_traces[d];
  uint32_t j = 0;
  bool filter = pool.first != 0 || pool.second != 0;
  for (uint64_t i = 0; i < c->n; i++) {
    msnap_hentry_t e;
    msnap__hcopy_get(c, i, &e);
    if (filter && (e.pool.first != pool.first || e.pool.second != pool.second))
      continue;
    assert_true(j < l->n);
    const msnap_strace_t *t = &l->v[j++];
    const msnap_tattr_t *at = msnap__tattr(s, t);
    assert_int_equal(t->action, e.action);
    assert_int_equal(t->addr, e.addr);
    assert_int_equal(t->size, e.size);
    assert_int_equal(at->stream, (int64_t)e.stream);
    assert_int_equal(at->pool_id.first, e.pool.first);
    assert_int_equal(at->pool_id.second, e.pool.second);
    const char *um = e.user_metadata ? msnap__str_get(e.user_metadata, NULL)
                                     : "";
    const char *cc = e.compile_context
                         ? msnap__str_get(e.compile_context, NULL)
                         : "N/A";
    assert_string_equal(mstr(s, at->user_metadata), um);
    assert_string_equal(mstr(s, at->compile_context), cc);
    if (e.internal_meta == 1) {
      assert_string_equal(mstr(s, at->internal_metadata), "mallocWithAddress");
      assert_true(at->keys & MSNAP_K_INTERNAL_META);
    } else {
      assert_int_equal(at->internal_metadata, MSNAP_STR_ABSENT);
      assert_false(at->keys & MSNAP_K_INTERNAL_META);
    }
    if (e.stack == 0) {
      assert_int_equal(t->frames, MSNAP_STACK_ABSENT);
    } else {
      /* C frames: one per recorded return address (no interpreter) */
      msnap_stack_view_t v;
      assert_int_equal(msnap__stack_view(e.stack, &v), 0);
      assert_true(t->frames > MSNAP_STACK_EMPTY && t->frames < s->nstacks);
      assert_int_equal(msnap__stack_len(s, t->frames), v.nc);
      assert_true(at->keys & MSNAP_K_FRAMES);
    }
    assert_true(at->keys & (e.action == MSNAP_ACTION_OOM ? MSNAP_K_DEVICE_FREE
                                                         : MSNAP_K_ADDRESS));
    if (j > 1) assert_true(t->time_us >= l->v[j - 2].time_us);
  }
  assert_int_equal(j, l->n);
}

static void check_device(msnap_allocator_t *a, int d, msnap_mempool_id_t pool) {
  msnap_hcopy_t c;
  uint64_t dropped, cap;
  msnap__device_lock(a, d);
  assert_int_equal(msnap__history_copy_locked(a, d, &c, &dropped, &cap), 0);
  msnap__device_unlock(a, d);
  msnap_snapshot_options_t o;
  msnap_snapshot_options_init(&o);
  o.device = d;
  o.mempool = pool;
  msnap_snap_t *s = NULL;
  /* the snapshot's own `snapshot` entry goes in after its copy */
  assert_int_equal(msnap__snapshot_take(a, &o, &s), 0);
  char msg[256];
  if (msnap__snap_check_model(s, msg, sizeof msg) != 0) fail_msg("%s", msg);
  expect_trace_equals_copy(s, d, &c, pool);
  msnap__snap_free(s);
  msnap__hcopy_release(&c);
}

static void test_model_equals_ring(void **state) {
  (void)state;
  msnap_allocator_t *a = make(2);
  uint64_t live[211] = {0};
  history(a, 1000000);
  msnap_mempool_id_t pid = workload(a, 4000, live, 211);
  for (int d = 0; d < 2; d++) check_device(a, d, (msnap_mempool_id_t){0, 0});
  check_device(a, 0, pid);
  /* a wrapped ring: the newest 1500 */
  history(a, 1500);
  (void)workload(a, 3000, live, 211);
  for (int d = 0; d < 2; d++) check_device(a, d, (msnap_mempool_id_t){0, 0});
  for (int k = 0; k < 211; k++)
    if (live[k]) assert_int_equal(msnap_free(a, live[k]), 0);
  msnap_allocator_destroy(a);
}

/* Pickle bytes of model s, tail cache on or off. */
static char *write_model(const msnap_snap_t *s, bool cache, size_t *len) {
  msnap__snap_write_tail_cache(cache);
  msnap_membuf_t mb = {0};
  msnap_sink_t sink;
  assert_int_equal(msnap__sink_init_mem(&sink, &mb), 0);
  assert_int_equal(msnap__snap_write_pickle(s, &sink), 0);
  assert_int_equal(msnap__sink_finish(&sink), 0);
  msnap__snap_write_tail_cache(true);
  *len = mb.len;
  return mb.data;
}

static void same_bytes_both_ways(const msnap_snap_t *s) {
  size_t n1, n2;
  char *b1 = write_model(s, true, &n1);
  char *b2 = write_model(s, false, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  free(b1);
  free(b2);
}

static void test_tail_cache_same_bytes(void **state) {
  (void)state;
  msnap_allocator_t *a = make(2);
  uint64_t live[97] = {0};
  history(a, 1000000);
  (void)workload(a, 6000, live, 97);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  same_bytes_both_ways(s); /* a live model: every key */
  size_t len;
  char *bytes = write_model(s, true, &len);
  msnap__snap_free(s);
  /* read back: a model that keeps exactly the keys of its source */
  msnap_read_error_t err;
  msnap_snap_t *r = NULL;
  if (msnap__snap_read_buffer(bytes, len, &r, &err) != 0)
    fail_msg("read back: %s", err.msg);
  same_bytes_both_ways(r);
  size_t len2;
  char *again = write_model(r, true, &len2);
  assert_int_equal(len2, len); /* a live dump rewrites to itself */
  assert_memory_equal(again, bytes, len);
  free(again);
  msnap__snap_free(r);
  free(bytes);
  for (int k = 0; k < 97; k++)
    if (live[k]) assert_int_equal(msnap_free(a, live[k]), 0);
  msnap_allocator_destroy(a);
}

/* The copy references each entry context's ids once, however many entries
 * name them. */
static void test_copy_references_per_context(void **state) {
  (void)state;
  msnap_allocator_t *a = make(1);
  /* the segment (which keeps its creation stack) comes from elsewhere */
  uint64_t warm = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &warm), 0);
  assert_int_equal(msnap_free(a, warm), 0);
  history(a, 100000);
  for (int i = 0; i < 5000; i++) {
    uint64_t p = alloc_at(a, 0, 4096, 0); /* the same call site each time */
    assert_int_equal(msnap_free(a, p), 0);
  }
  msnap__stack_tcache_flush();
  msnap_hcopy_t c;
  uint64_t dropped, cap;
  msnap__device_lock(a, 0);
  assert_int_equal(msnap__history_copy_locked(a, 0, &c, &dropped, &cap), 0);
  msnap__device_unlock(a, 0);
  assert_true(c.n >= 15000);
  msnap_hentry_t e;
  msnap__hcopy_get(&c, c.n - 3, &e); /* an alloc of the loop */
  assert_int_equal(e.action, MSNAP_ACTION_ALLOC);
  assert_int_not_equal(e.stack, 0);
  /* the ring's context and the copy's: 2, not one per entry */
  assert_int_equal(msnap__stack_refcount(e.stack), 2);
  msnap__hcopy_release(&c);
  assert_int_equal(msnap__stack_refcount(e.stack), 1);
  msnap_allocator_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_equals_ring),
      cmocka_unit_test(test_tail_cache_same_bytes),
      cmocka_unit_test(test_copy_references_per_context),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
