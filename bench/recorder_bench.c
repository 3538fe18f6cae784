/*
 * recorder_bench.c -- cost of the memory-history recorder per alloc+free
 * pair on the sim runtime (not a test: no assertions, prints numbers).
 *
 *   off         history off (the hot path pays one branch)
 *   py20        context "all", stacks "python", a fake interpreter hook
 *               returning 20 frames (the hook's own walk is a loop that
 *               writes the frames, so this measures memsnap's share:
 *               interning, references, ring stores)
 *   py20+c      the same plus C frames (glibc backtrace)
 *   state       context "state" (stacks only on blocks)
 *
 * Usage: recorder_bench [iterations [noc [ring_entries]]]
 *        (defaults 200000, with C frames, 100000)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memsnap.h"

static int fake_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
  int n = max < 20 ? max : 20;
  for (int i = 0; i < n; i++) {
    frames[i][0] = 0x1000 + (uintptr_t)i * 64; /* code object */
    frames[i][1] = (uintptr_t)i * 2;           /* instruction  */
  }
  return n;
}
static int fake_resolve(void *ctx, const uintptr_t f[2], const char **name,
                        const char **file, int64_t *line) {
  (void)ctx;
  (void)f;
  *name = "f";
  *file = "x.py";
  *line = 1;
  return 0;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Best of 5 rounds (the machine is shared: the minimum is the cost). */
static double run(msnap_allocator_t *a, long iters) {
  uint64_t p;
  for (long i = 0; i < 1000; i++) { /* warm up */
    msnap_malloc(a, 0, 4096, 0, &p);
    msnap_free(a, p);
  }
  double best = 1e30;
  for (int round = 0; round < 5; round++) {
    double t0 = now_ns();
    for (long i = 0; i < iters / 5; i++) {
      msnap_malloc(a, 0, 4096, 0, &p);
      msnap_free(a, p);
    }
    double t = (now_ns() - t0) / (double)(iters / 5);
    if (t < best) best = t;
  }
  return best;
}

static uint64_t ring_entries = 100000;

static void set(msnap_allocator_t *a, bool on, msnap_record_context_t ctx,
                unsigned stacks) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = on;
  o.context = ctx;
  o.stacks = stacks;
  o.max_entries = ring_entries; /* the ring wraps: steady state */
  o.clear_history = true;
  if (msnap_record_history(a, &o) != 0) {
    fprintf(stderr, "record_history: %s\n", msnap_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 200000;
  if (argc > 3) ring_entries = strtoull(argv[3], NULL, 10);
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.profile = MSNAP_PROFILE_CUDA;
  msnap_allocator_t *a = NULL;
  if (msnap_allocator_create(&o, &a) != 0) {
    fprintf(stderr, "create: %s\n", msnap_last_error());
    return 1;
  }
  msnap_frame_hook_t h = {.capture = fake_capture, .resolve = fake_resolve};
  msnap_set_frame_hook(&h);

  set(a, false, MSNAP_CONTEXT_NEVER, 0);
  double off = run(a, iters);
  set(a, true, MSNAP_CONTEXT_STATE, MSNAP_STACKS_PYTHON);
  double state = run(a, iters);
  set(a, true, MSNAP_CONTEXT_ALL, MSNAP_STACKS_PYTHON);
  double py = run(a, iters);
  set(a, true, MSNAP_CONTEXT_ALL, MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP);
  /* argv[2] "noc": skip the C-frames run (profiling the rest) */
  bool with_c = !(argc > 2 && strcmp(argv[2], "noc") == 0);
  double pyc = with_c ? run(a, iters / 10) : 0.0;
  set(a, false, MSNAP_CONTEXT_NEVER, 0);

  printf("alloc+free pair, ns (iterations %ld):\n", iters);
  printf("  history off           %8.1f\n", off);
  printf("  context state, py20   %8.1f  (+%.1f)\n", state, state - off);
  printf("  context all, py20     %8.1f  (+%.1f)\n", py, py - off);
  printf("  context all, py20+C   %8.1f  (+%.1f)\n", pyc, pyc - off);
  msnap_allocator_destroy(a);
  return 0;
}
