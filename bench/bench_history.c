/*
 * bench_history.c -- row 2 (C side): cost of the memory history per
 * alloc+free pair, seen from a C caller DEPTH frames deep.  Modes: history
 * off; context "all" without stacks; context "all" with C stacks
 * (stacks="all" minus Python, which the Python script measures).  Cached
 * sizes only, so the allocator's own work is the hot path of row 1.
 * Prints RESULT lines: ns per pair.
 */
#include "bench_common.h"
#include "memsnap.h"

#define DEPTH 20
#define PAIRS 200000

static const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20};

static msnap_allocator_t *g_a;

__attribute__((noinline)) static double pairs(int n) {
  uint64_t t0 = bench_now_ns();
  for (int i = 0; i < n; i++) {
    uint64_t p = 0;
    if (msnap_malloc(g_a, 0, sizes[i % 5], 0, &p) != 0) {
      fprintf(stderr, "bench_history: malloc: %s\n", msnap_last_error());
      exit(1);
    }
    msnap_free(g_a, p);
  }
  return (double)(bench_now_ns() - t0) / n;
}

/* Call pairs() from `depth` nested frames (not inlined, not tail calls). */
__attribute__((noinline)) static double deep(int depth, int n) {
  if (depth <= 1)
    return pairs(n);
  double r = deep(depth - 1, n);
  bench_escape(&r);
  return r;
}

static double best(void) {
  deep(DEPTH, 5000);
  double b = 1e300;
  for (int r = 0; r < 5; r++) {
    double ns = deep(DEPTH, PAIRS);
    if (ns < b)
      b = ns;
  }
  return b;
}

static void history(bool on, unsigned stacks) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = on;
  o.context = MSNAP_CONTEXT_ALL;
  o.stacks = stacks;
  o.max_entries = 1000000;
  if (msnap_record_history(g_a, &o) != 0) {
    fprintf(stderr, "bench_history: record_history: %s\n",
            msnap_last_error());
    exit(1);
  }
}

int main(void) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = 1;
  o.sim_memory = 1ull << 40;
  sim_env(o.sim_devices, o.sim_memory);
  if (msnap_allocator_create(&o, &g_a) != 0) {
    fprintf(stderr, "bench_history: create: %s\n", msnap_last_error());
    return 1;
  }
  BENCH_RESULT("depth", "%d", DEPTH + 2);
  BENCH_RESULT("off_ns", "%.2f", best());
  history(true, MSNAP_STACKS_PYTHON); /* no frame hook: no frames */
  BENCH_RESULT("nostacks_ns", "%.2f", best());
  history(false, MSNAP_STACKS_PYTHON);
  history(true, MSNAP_STACKS_CPP);
  BENCH_RESULT("cstacks_ns", "%.2f", best());
  history(false, MSNAP_STACKS_PYTHON);
  msnap_allocator_destroy(g_a);
  return 0;
}
