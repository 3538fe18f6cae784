/*
 * test_alloc_history.c -- the allocator's recorder hooks (cuda-reference
 * §3): which trace entries each operation emits, in which order, with
 * which addr/size.  Built only once the recorder (src/record) is in
 * the tree; reads the device trace through msnap__snapshot_take.
 */
#include "api/api.h"
#include "record/stack.h"
#include "talloc.h"

typedef struct want_s {
  msnap_action_t action;
  uint64_t addr, size;
} want_t;

static void enable_history(msnap_allocator_t *a) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_NEVER; /* no stacks: only the entries matter */
  o.stacks = 0;
  o.max_entries = 1000;
  assert_int_equal(msnap_record_history(a, &o), 0);
}

static void expect_trace(msnap_allocator_t *a, const want_t *w, size_t n) {
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  so.device = 0;
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, &so, &s), 0);
  assert_true(s->ndevices >= 1);
  const msnap_trace_list_t *l = &s->device_traces[0];
  size_t k = 0;
  for (uint32_t i = 0; i < l->n; i++) {
    const msnap_strace_t *t = &l->v[i];
    if (t->action == MSNAP_ACTION_SNAPSHOT)
      continue;
    if (k >= n)
      fail_msg("extra trace entry %u: %s addr 0x%llx size %llu", i,
               msnap_action_name(t->action), (unsigned long long)t->addr,
               (unsigned long long)t->size);
    if (t->action != w[k].action || t->addr != w[k].addr ||
        t->size != w[k].size)
      fail_msg("trace entry %zu: got %s 0x%llx %llu, want %s 0x%llx %llu", k,
               msnap_action_name(t->action), (unsigned long long)t->addr,
               (unsigned long long)t->size, msnap_action_name(w[k].action),
               (unsigned long long)w[k].addr, (unsigned long long)w[k].size);
    k++;
  }
  assert_int_equal(k, n);
  msnap__snap_free(s);
}

static void hooks_cuda(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  enable_history(a);
  fake_set_manual_events(true);
  uint64_t S1 = fake_next_address(0);
  uint64_t pa = M(a, 1);
  F(a, pa);
  uint64_t S2 = fake_next_address(0);
  uint64_t pb = M(a, 5 * MiB);
  R(a, pb, 9);
  F(a, pb);              /* free_requested only: event pending */
  uint64_t pc = M(a, 100); /* nothing completes */
  fake_complete_events(9);
  uint64_t pd = M(a, 100); /* free_completed of b, then alloc */
  EC(a);                   /* S2 is whole again: segment_free */
  assert_int_equal(msnap_set_memory_fraction(a, 0, 64.0 / 65536.0), 0);
  uint64_t pe = 0;
  assert_int_equal(msnap_malloc(a, 0, 100 * MiB, 0, &pe), MSNAP_EOOM);
  uint64_t dev_free = (64ull << 30) - 2 * MiB;
  want_t w[] = {
      {MSNAP_ACTION_SEGMENT_ALLOC, S1, 2 * MiB},
      {MSNAP_ACTION_ALLOC, S1, 1},
      {MSNAP_ACTION_FREE_REQUESTED, S1, 1},
      {MSNAP_ACTION_FREE_COMPLETED, S1, 1},
      {MSNAP_ACTION_SEGMENT_ALLOC, S2, 20 * MiB},
      {MSNAP_ACTION_ALLOC, S2, 5 * MiB},
      {MSNAP_ACTION_FREE_REQUESTED, S2, 5 * MiB},
      {MSNAP_ACTION_ALLOC, S1, 100},
      {MSNAP_ACTION_FREE_COMPLETED, S2, 5 * MiB},
      {MSNAP_ACTION_ALLOC, S1 + 512, 100},
      {MSNAP_ACTION_SEGMENT_FREE, S2, 20 * MiB},
      {MSNAP_ACTION_OOM, dev_free, 100 * MiB},
  };
  expect_trace(a, w, sizeof w / sizeof w[0]);
  F(a, pc);
  F(a, pd);
  done(a);
}

static void tw_exp(msnap_conf_t *c) { c->expandable_segments = true; }

static void hooks_expandable(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, tw_exp);
  enable_history(a);
  uint64_t p = M(a, 5 * MiB);
  F(a, p);
  EC(a);
  want_t w[] = {
      {MSNAP_ACTION_SEGMENT_MAP, p, 20 * MiB},
      {MSNAP_ACTION_ALLOC, p, 5 * MiB},
      {MSNAP_ACTION_FREE_REQUESTED, p, 5 * MiB},
      {MSNAP_ACTION_FREE_COMPLETED, p, 5 * MiB},
      {MSNAP_ACTION_SEGMENT_UNMAP, p, 20 * MiB},
  };
  expect_trace(a, w, sizeof w / sizeof w[0]);
  done(a);
}


/*
 * allocator-algorithm §21 example 13 with history on, in both profiles:
 * every segment_map names the start of the newly mapped granules (not the
 * block that absorbs them) and the mapped bytes; the final segment_unmap
 * names the unmapped range.  The NPU profile pads every request by 32
 * bytes before rounding (§20.1: 5 MiB becomes a 5 MiB + 512 block), and
 * (§20.4, base_addr_aligned_kb 16) a request >= 2 MiB whose block
 * does not start on 16 KiB first splits off a leading fragment: b lands
 * at E+5MiB+16KiB and c at E+30MiB+32KiB.  The mapped and unmapped
 * ranges are the same granules in both profiles.
 */
static void example13_trace(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof ? NPU : CUDA, tw_exp);
    enable_history(a);
    uint64_t kb16 = prof ? 16384 : 0; /* NPU 16 KiB block alignment */
    uint64_t pa = M(a, 5 * MiB);
    uint64_t E = pa;
    uint64_t pb = M(a, 25 * MiB);
    assert_int_equal(pb, E + 5 * MiB + kb16);
    F(a, pa);
    uint64_t pc = M(a, 8 * MiB);
    assert_int_equal(pc, E + 30 * MiB + 2 * kb16);
    F(a, pb);
    F(a, pc);
    EC(a);
    want_t w[] = {
        {MSNAP_ACTION_SEGMENT_MAP, E, 20 * MiB},
        {MSNAP_ACTION_ALLOC, pa, 5 * MiB},
        {MSNAP_ACTION_SEGMENT_MAP, E + 20 * MiB, 20 * MiB},
        {MSNAP_ACTION_ALLOC, pb, 25 * MiB},
        {MSNAP_ACTION_FREE_REQUESTED, pa, 5 * MiB},
        {MSNAP_ACTION_FREE_COMPLETED, pa, 5 * MiB},
        {MSNAP_ACTION_ALLOC, pc, 8 * MiB},
        {MSNAP_ACTION_FREE_REQUESTED, pb, 25 * MiB},
        {MSNAP_ACTION_FREE_COMPLETED, pb, 25 * MiB},
        {MSNAP_ACTION_FREE_REQUESTED, pc, 8 * MiB},
        {MSNAP_ACTION_FREE_COMPLETED, pc, 8 * MiB},
        {MSNAP_ACTION_SEGMENT_UNMAP, E, 40 * MiB},
    };
    expect_trace(a, w, sizeof w / sizeof w[0]);
    done(a);
  }
}

/*
 * The fresh-user repro: two 30 MiB requests.  The first maps granules
 * 0-1 (40 MiB at E); the second extends the free 10 MiB tail at E+30MiB
 * by mapping granule 2, so its segment_map is E+40MiB +20MiB and never
 * overlaps the first.  Then a partial unmap: freeing only the first block
 * and emptying the cache unmaps granule 0 alone (granule 1 still holds
 * part of the second block).
 */
static void map_ranges_disjoint(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, tw_exp);
  enable_history(a);
  uint64_t p1 = M(a, 30 * MiB);
  uint64_t E = p1;
  uint64_t p2 = M(a, 30 * MiB);
  assert_int_equal(p2, E + 30 * MiB);
  F(a, p1);
  EC(a);
  F(a, p2);
  EC(a);
  want_t w[] = {
      {MSNAP_ACTION_SEGMENT_MAP, E, 40 * MiB},
      {MSNAP_ACTION_ALLOC, p1, 30 * MiB},
      {MSNAP_ACTION_SEGMENT_MAP, E + 40 * MiB, 20 * MiB},
      {MSNAP_ACTION_ALLOC, p2, 30 * MiB},
      {MSNAP_ACTION_FREE_REQUESTED, p1, 30 * MiB},
      {MSNAP_ACTION_FREE_COMPLETED, p1, 30 * MiB},
      {MSNAP_ACTION_SEGMENT_UNMAP, E, 20 * MiB},
      {MSNAP_ACTION_FREE_REQUESTED, p2, 30 * MiB},
      {MSNAP_ACTION_FREE_COMPLETED, p2, 30 * MiB},
      {MSNAP_ACTION_SEGMENT_UNMAP, E + 20 * MiB, 40 * MiB},
  };
  expect_trace(a, w, sizeof w / sizeof w[0]);
  done(a);
}

/*
 * Stack references: with context "all" and C stacks, every alloc stack
 * stored on a block, every segment stack, the trace entries and a
 * snapshot's collected ids are references; after the allocator is gone
 * and history is off, the stack table is back to where it started.
 */
static void stack_refs_balance(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t base = msnap__stack_live();
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof, prof ? tw_exp : NULL);
    msnap_history_options_t o;
    msnap_history_options_init(&o);
    o.context = MSNAP_CONTEXT_ALL;
    o.stacks = MSNAP_STACKS_CPP;
    o.max_entries = 50; /* the ring overwrites: dropped entries unref */
    assert_int_equal(msnap_record_history(a, &o), 0);
    fake_set_manual_events(true);
    uint64_t p[16];
    for (int i = 0; i < 16; i++)
      p[i] = M2(a, (uint64_t)(i + 1) * 700000, (uint64_t)(i % 2));
    for (int i = 0; i < 16; i += 3)
      R(a, p[i], 5);
    for (int i = 0; i < 16; i += 2)
      F(a, p[i]);
    msnap_snapshot_options_t so;
    msnap_snapshot_options_init(&so);
    msnap_snap_t *s = NULL;
    assert_int_equal(msnap__snapshot_take(a, &so, &s), 0);
    assert_true(s->nsegments > 0);
    msnap__snap_free(s);
    uint64_t q = M(a, 3 * MiB);
    fake_complete_events(5);
    uint64_t r = M(a, 100); /* reaps the pending frees */
    int dev = -1;
    uint32_t st = 0;
    assert_int_equal(msnap__allocation_info(a, r, &dev, NULL, NULL, NULL,
                                            &st),
                     0);
    assert_int_not_equal(st, 0); /* context all: the block has a stack */
    msnap__stack_unref(st);
    EC(a);
    for (int i = 1; i < 16; i += 2)
      F(a, p[i]);
    F(a, q);
    F(a, r);
    EC(a);
    o.enabled = false;
    assert_int_equal(msnap_record_history(a, &o), 0);
    done(a);
  }
  msnap__stack_tcache_flush();
  msnap__stack_drain_releases();
  assert_int_equal(msnap__stack_live(), base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hooks_cuda),
      cmocka_unit_test(hooks_expandable),
      cmocka_unit_test(example13_trace),
      cmocka_unit_test(map_ranges_disjoint),
      cmocka_unit_test(stack_refs_balance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
