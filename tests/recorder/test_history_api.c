/*
 * test_history_api.c -- the allocator's history API (alloc/history.c) on
 * the real allocator (sim runtime, two devices): option validation,
 * msnap_record_history's ring rules on every device (capacity without
 * clearing, clear_history, disable), the skip set, annotate_memory on a
 * live allocation and record_annotation.  The rings underneath are tested
 * alone in test_history_unit.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "decoded_copy.h"

#include "alloc/alloc.h"
#include "record/stack.h"

static msnap_allocator_t *make(int ndev) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_CUDA;
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = ndev;
  o.sim_memory = 1ull << 30;
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  return a;
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

/* Copy device dev's ring (decoded); returns the count. */
static size_t copy(msnap_allocator_t *a, int dev, msnap_hentry_t **v,
                   uint64_t *dropped) {
  msnap_hcopy_t c;
  uint64_t cap;
  msnap__device_lock(a, dev);
  assert_int_equal(msnap__history_copy_locked(a, dev, &c, dropped, &cap), 0);
  msnap__device_unlock(a, dev);
  *v = decode(&c);
  return (size_t)c.n;
}

/* n allocations of `size` bytes on dev, freed at once: 2n entries. */
static void churn(msnap_allocator_t *a, int dev, int n, size_t size) {
  for (int i = 0; i < n; i++) {
    uint64_t p;
    assert_int_equal(msnap_malloc(a, dev, size, 0, &p), 0);
    assert_int_equal(msnap_free(a, p), 0);
  }
}

static void test_option_validation(void **state) {
  (void)state;
  msnap_allocator_t *a = make(1);
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
  o.skip_actions = 1u << 20;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "Unknown TraceEntry action"));
  msnap_history_options_init(&o);
  o.version = 99;
  assert_int_equal(msnap_record_history(a, &o), MSNAP_EINVAL);
  assert_false(msnap_history_enabled(a));
  assert_int_equal(msnap__history_max_entries(a), 0);
  /* context None takes no stacks */
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_NEVER;
  o.stacks = 0;
  assert_int_equal(msnap_record_history(a, &o), 0);
  /* annotations name -1 or a device of the allocator: the snapshot's
   * reader refuses any other */
  assert_int_equal(msnap_record_annotation(a, 0, "fwd", true), 0);
  assert_int_equal(msnap_record_annotation(a, -1, "fwd", false), 0);
  assert_int_equal(msnap_record_annotation(a, 1, "fwd", true), MSNAP_EINVAL);
  assert_int_equal(msnap_record_annotation(a, -2, "fwd", true),
                   MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "invalid device -2"));
  assert_int_equal(msnap_workspace_empty_cache(a, 1), MSNAP_EINVAL);
  assert_int_equal(msnap_workspace_empty_cache(a, -1), 0);
  /* a NULL out is an error, not a crash */
  assert_int_equal(msnap_action_parse("oom", NULL), MSNAP_EINVAL);
  msnap_action_t act;
  assert_int_equal(msnap_action_parse("oom", &act), 0);
  assert_int_equal(act, MSNAP_ACTION_OOM);
  msnap_allocator_destroy(a);
  /* allocator options not made by msnap_options_init */
  msnap_options_t co;
  msnap_options_init(&co);
  co.runtime_name = "sim";
  co.size = 4;
  msnap_allocator_t *b = NULL;
  assert_int_equal(msnap_allocator_create(&co, &b), MSNAP_EINVAL);
  assert_null(b);
  assert_non_null(strstr(msnap_last_error(), "options size 4 / version 1"));
  msnap_options_init(&co);
  co.runtime_name = "sim";
  co.version = 2;
  assert_int_equal(msnap_allocator_create(&co, &b), MSNAP_EINVAL);
  /* out of range: an error, not a rounded value */
  msnap_options_init(&co);
  co.runtime_name = "sim";
  co.sim_memory = 1;
  assert_int_equal(msnap_allocator_create(&co, &b), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "sim_memory 1"));
  co.sim_memory = 0;
  co.sim_devices = -3;
  assert_int_equal(msnap_allocator_create(&co, &b), MSNAP_EINVAL);
  co.sim_devices = 0;
  co.caching_disabled = 5;
  assert_int_equal(msnap_allocator_create(&co, &b), MSNAP_EINVAL);
  assert_null(b);
}

/* Every device's ring follows the same call: the capacity changes without
 * clearing, clear_history empties, disabling discards and records nothing
 * more. */
static void test_rings_of_every_device(void **state) {
  (void)state;
  msnap_allocator_t *a = make(2);
  enable(a, 3, MSNAP_CONTEXT_NEVER, true, 0);
  assert_true(msnap_history_enabled(a));
  assert_int_equal(msnap__history_max_entries(a), 3);
  /* segment_alloc, then (alloc, free_requested, free_completed) x 3 */
  churn(a, 0, 3, 1000);
  churn(a, 1, 1, 1000); /* 4 entries */
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 3);
  assert_int_equal(dropped, 7);
  assert_int_equal(v[0].action, MSNAP_ACTION_ALLOC);
  assert_int_equal(v[2].action, MSNAP_ACTION_FREE_COMPLETED);
  release(v);
  n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 3);
  assert_int_equal(dropped, 1);
  release(v);
  /* A larger capacity keeps what is there. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, false, 0);
  n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 3);
  release(v);
  /* A smaller one keeps the newest (on every device). */
  enable(a, 1, MSNAP_CONTEXT_ALLOC, false, 0);
  n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].action, MSNAP_ACTION_FREE_COMPLETED);
  release(v);
  /* clear_history empties every ring. */
  enable(a, 100, MSNAP_CONTEXT_ALLOC, true, 0);
  for (int d = 0; d < 2; d++) {
    n = copy(a, d, &v, &dropped);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 0);
    release(v);
  }
  churn(a, 0, 1, 1000);
  disable(a);
  assert_false(msnap_history_enabled(a));
  churn(a, 0, 1, 1000);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 0);
  release(v);
  char msg[256];
  assert_int_equal(msnap_check_invariants(a, msg, sizeof msg), 0);
  msnap_allocator_destroy(a);
}

static void test_skip_actions(void **state) {
  (void)state;
  msnap_allocator_t *a = make(1);
  enable(a, 100, MSNAP_CONTEXT_NEVER, true,
         (1u << MSNAP_ACTION_FREE_REQUESTED) | (1u << MSNAP_ACTION_ALLOC));
  churn(a, 0, 1, 1000);
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, 0, &v, &dropped);
  /* segment_alloc, free_completed */
  assert_int_equal(n, 2);
  assert_int_equal(v[0].action, MSNAP_ACTION_SEGMENT_ALLOC);
  assert_int_equal(v[1].action, MSNAP_ACTION_FREE_COMPLETED);
  release(v);
  /* The skip set is replaced on every call. */
  enable(a, 100, MSNAP_CONTEXT_NEVER, true, 0);
  churn(a, 0, 1, 1000);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 3);
  release(v);
  msnap_allocator_destroy(a);
}

static void test_annotate(void **state) {
  (void)state;
  msnap_allocator_t *a = make(2);
  uint64_t p;
  assert_int_equal(msnap_malloc(a, 1, 400, 5, &p), 0);
  /* Unknown pointer: an error even with history off. */
  assert_int_equal(msnap_annotate_memory(a, 0xdead, "x"), MSNAP_EBADPTR);
  assert_string_equal(msnap_last_error(),
                      "annotateMemory: no live allocation found at pointer "
                      "0xdead");
  /* NULL metadata: MSNAP_EINVAL (history off or on, live pointer or not;
   * "" is the way to say none) */
  assert_int_equal(msnap_annotate_memory(a, p, NULL), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(),
                      "annotateMemory: NULL metadata (\"\" for none)");
  assert_int_equal(msnap_annotate_memory(a, 0xdead, NULL), MSNAP_EINVAL);
  assert_int_equal(msnap_annotate_memory(NULL, p, "x"), MSNAP_EINVAL);
  /* History off: accepted, nothing recorded. */
  assert_int_equal(msnap_annotate_memory(a, p, "off"), 0);
  enable(a, 100, MSNAP_CONTEXT_ALL, true, 0);
  assert_int_equal(msnap_annotate_memory(a, p, NULL), MSNAP_EINVAL);
  assert_int_equal(msnap_set_memory_metadata("thread-meta"), 0);
  assert_int_equal(msnap_annotate_memory(a, p, "weights"), 0);
  /* "" records an entry without metadata (not the thread's) */
  assert_int_equal(msnap_annotate_memory(a, p, ""), 0);
  assert_int_equal(msnap_set_memory_metadata(""), 0);
  msnap_hentry_t *v;
  uint64_t dropped;
  size_t n = copy(a, 1, &v, &dropped);
  assert_int_equal(n, 2); /* the refused calls recorded nothing */
  assert_int_equal(v[0].action, MSNAP_ACTION_ANNOTATE);
  assert_int_equal(v[0].addr, p);
  assert_int_equal(v[0].size, 400);
  assert_int_equal(v[0].stream, 5);
  assert_int_equal(v[0].pool.second, 0);
  assert_string_equal(msnap__str_get(v[0].user_metadata, NULL), "weights");
  assert_int_not_equal(v[0].stack, 0); /* annotation-site stack */
  assert_int_equal(v[1].action, MSNAP_ACTION_ANNOTATE);
  assert_int_equal(v[1].addr, p);
  assert_int_equal(v[1].user_metadata, 0);
  assert_string_equal(msnap__str_get(v[1].user_metadata, NULL), "");
  release(v);
  n = copy(a, 0, &v, &dropped);
  assert_int_equal(n, 0);
  release(v);
  assert_int_equal(msnap_free(a, p), 0);
  msnap_allocator_destroy(a);
}

static void test_record_annotation(void **state) {
  (void)state;
  msnap_allocator_t *a = make(1);
  msnap_aentry_t *v;
  size_t n;
  /* Off: ignored. */
  assert_int_equal(msnap_record_annotation(a, 0, "fwd", true), 0);
  assert_int_equal(msnap__annotations_copy(a, &v, &n), 0);
  assert_int_equal(n, 0);
  free(v);
  enable(a, 3, MSNAP_CONTEXT_NEVER, true, 0);
  const char *names[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(msnap_record_annotation(a, 0, names[i], i % 2 == 0), 0);
  assert_int_equal(msnap__annotations_copy(a, &v, &n), 0);
  assert_int_equal(n, 3);
  assert_string_equal(msnap__str_get(v[0].name, NULL), "b");
  assert_false(v[0].is_start);
  assert_string_equal(msnap__str_get(v[2].name, NULL), "d");
  for (size_t i = 0; i < n; i++) msnap__stack_unref(v[i].name);
  free(v);
  assert_int_equal(msnap_record_annotation(a, 0, NULL, true), MSNAP_EINVAL);
  disable(a);
  assert_int_equal(msnap__annotations_copy(a, &v, &n), 0);
  assert_int_equal(n, 0);
  free(v);
  msnap_allocator_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_option_validation),
      cmocka_unit_test(test_rings_of_every_device),
      cmocka_unit_test(test_skip_actions),
      cmocka_unit_test(test_annotate),
      cmocka_unit_test(test_record_annotation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
