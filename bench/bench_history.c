/*
 * bench_history.c -- row 2 (C side): cost of the memory history per
 * alloc+free pair, seen from a C caller DEPTH frames deep.  Modes: history
 * off; context "all" without stacks; context "all" with C stacks through
 * the recorder's CFI unwinder (the default) and through libunwind (when
 * it loads: the unwinder the recorder used before).  Cached sizes only,
 * so the allocator's own work is the hot path of row 1.
 *
 * The modes run interleaved: each round runs every mode once, in turn,
 * so that a busy machine disturbs them alike; the figure of a mode is the
 * median over the rounds of its thread CPU time per pair.  Prints RESULT
 * lines: ns per pair.
 *
 * usage: bench_history [ROUNDS]
 */
#include "bench_common.h"
#include "memsnap.h"
#include "record/stack.h"

#define DEPTH 20
#define PAIRS 100000
#define MAX_ROUNDS 64

static const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20};

static msnap_allocator_t *g_a;

__attribute__((noinline)) static double pairs(int n) {
  uint64_t t0 = bench_cpu_ns();
  for (int i = 0; i < n; i++) {
    uint64_t p = 0;
    if (msnap_malloc(g_a, 0, sizes[i % 5], 0, &p) != 0) {
      fprintf(stderr, "bench_history: malloc: %s\n", msnap_last_error());
      exit(1);
    }
    msnap_free(g_a, p);
  }
  return (double)(bench_cpu_ns() - t0) / n;
}

/* Call pairs() from `depth` nested frames (not inlined, not tail calls). */
__attribute__((noinline)) static double deep(int depth, int n) {
  if (depth <= 1)
    return pairs(n);
  double r = deep(depth - 1, n);
  bench_escape(&r);
  return r;
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

typedef struct mode_s {
  const char *key;
  bool on;
  unsigned stacks;
  const char *unwinder; /* NULL: leave as is */
  double v[MAX_ROUNDS];
} hmode_t;

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 7;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 7;
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
  hmode_t modes[] = {
      {"off_ns", false, MSNAP_STACKS_PYTHON, NULL, {0}},
      /* python stacks without a frame hook: no frames */
      {"nostacks_ns", true, MSNAP_STACKS_PYTHON, NULL, {0}},
      {"cstacks_ns", true, MSNAP_STACKS_CPP, "cfi", {0}},
      {"cstacks_libunwind_ns", true, MSNAP_STACKS_CPP, "libunwind", {0}},
  };
  int nmodes = sizeof modes / sizeof modes[0];
  bool have[4] = {true, true, true, true};
  have[2] = msnap__stack_set_unwinder("cfi") == 0;
  have[3] = msnap__stack_set_unwinder("libunwind") == 0;
  for (int r = 0; r < rounds; r++) {
    for (int m = 0; m < nmodes; m++) {
      if (!have[m]) continue;
      if (modes[m].unwinder) msnap__stack_set_unwinder(modes[m].unwinder);
      history(false, MSNAP_STACKS_PYTHON);
      history(modes[m].on, modes[m].stacks);
      deep(DEPTH, 2000); /* warm: stacks interned, rules cached */
      modes[m].v[r] = deep(DEPTH, PAIRS);
    }
  }
  history(false, MSNAP_STACKS_PYTHON);
  BENCH_RESULT("depth", "%d", DEPTH + 2);
  BENCH_RESULT("rounds", "%d", rounds);
  BENCH_RESULT("unwinder", "%s", have[2] ? "cfi" : msnap__stack_unwinder_name());
  for (int m = 0; m < nmodes; m++)
    if (have[m])
      printf("RESULT %s=%.2f\n", modes[m].key, bench_median(modes[m].v, rounds));
  msnap_allocator_destroy(g_a);
  return 0;
}
