/*
 * test_pool.c -- the intrusive red-black trees of pool.c against a sorted
 * reference array: random inserts/erases (fixed seed), lower_bound on
 * random keys, in-order walks both ways, msnap__rb_check after every
 * operation.
 */
#include "talloc.h"

#define N 600

static msnap_block_t nodes[N];
static bool in_tree[N];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static int key_less(const msnap_block_t *x, const msnap_block_t *y,
                    bool by_addr) {
  if (x->stream != y->stream)
    return x->stream < y->stream;
  if (!by_addr && x->size != y->size)
    return x->size < y->size;
  return x->ptr < y->ptr;
}

/* Reference lower_bound by linear scan. */
static const msnap_block_t *ref_lb(uint64_t stream, uint64_t size,
                                   uint64_t ptr, bool by_addr) {
  msnap_block_t key = {0};
  key.stream = stream;
  key.size = size;
  key.ptr = ptr;
  const msnap_block_t *best = NULL;
  for (int i = 0; i < N; i++) {
    if (!in_tree[i] || key_less(&nodes[i], &key, by_addr))
      continue;
    if (!best || key_less(&nodes[i], best, by_addr))
      best = &nodes[i];
  }
  return best;
}

static void check(msnap_rbtree_t *t, size_t expect) {
  char msg[256];
  if (msnap__rb_check(t, msg, sizeof msg) != 0)
    fail_msg("%s", msg);
  assert_int_equal(t->count, expect);
  size_t n = 0;
  for (msnap_block_t *b = msnap__rb_first(t); b; b = msnap__rb_next(b))
    n++;
  assert_int_equal(n, expect);
  n = 0;
  for (msnap_block_t *b = msnap__rb_last(t); b; b = msnap__rb_prev(b))
    n++;
  assert_int_equal(n, expect);
}

static void run(bool by_addr) {
  msnap_rbtree_t t;
  msnap__rb_init(&t, by_addr);
  memset(nodes, 0, sizeof nodes);
  memset(in_tree, 0, sizeof in_tree);
  for (int i = 0; i < N; i++) {
    nodes[i].stream = rnd() % 3 == 0 ? UINT64_MAX - 1 : rnd() % 3;
    nodes[i].size = (rnd() % 40 + 1) * 512;
    nodes[i].ptr = 0x1000 + (uint64_t)i * 0x100000 + (rnd() % 7) * 512;
  }
  size_t count = 0;
  for (int step = 0; step < 6000; step++) {
    int i = (int)(rnd() % N);
    if (in_tree[i]) {
      msnap__rb_erase(&t, &nodes[i]);
      in_tree[i] = false;
      count--;
    } else {
      msnap__rb_insert(&t, &nodes[i]);
      in_tree[i] = true;
      count++;
    }
    if (step % 7 == 0)
      check(&t, count);
    uint64_t s = rnd() % 4 == 0 ? UINT64_MAX - 1 : rnd() % 3;
    uint64_t sz = (rnd() % 42) * 512, p = rnd() % (N * 0x100000ull);
    assert_ptr_equal(msnap__rb_lower_bound(&t, s, sz, p),
                     ref_lb(s, sz, p, by_addr));
    assert_ptr_equal(msnap__rb_lower_bound(&t, s, sz, 0),
                     ref_lb(s, sz, 0, by_addr));
  }
  check(&t, count);
  /* Drain in order. */
  while (t.root) {
    msnap__rb_erase(&t, msnap__rb_first(&t));
    count--;
    check(&t, count);
  }
}

static void by_size(void **state) {
  (void)state;
  run(false);
}

static void by_addr(void **state) {
  (void)state;
  run(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(by_size),
      cmocka_unit_test(by_addr),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
