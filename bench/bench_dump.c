/*
 * bench_dump.c -- row 3: snapshot + dump of N trace entries.
 *
 * Fills the history ring (max_entries N, context "all", C stacks from
 * varying call depths) with alloc / free_requested / free_completed
 * entries of a size mix, then times msnap_dump_snapshot (copy under the
 * lock, stack resolution, pickle writing, fsync and rename), best of 3.
 * The file is left at PATH for pickle_dump.py (the CPython anchor).
 * Prints RESULT lines: entries, dump_s, bytes.
 *
 * usage: bench_dump PATH [N]
 */
#include <sys/stat.h>
#include <stdlib.h>

#include "bench_common.h"
#include "memsnap.h"

static msnap_allocator_t *g_a;

__attribute__((noinline)) static void leaf(size_t size) {
  uint64_t p = 0;
  if (msnap_malloc(g_a, 0, size, 0, &p) != 0) {
    fprintf(stderr, "bench_dump: malloc: %s\n", msnap_last_error());
    exit(1);
  }
  msnap_free(g_a, p);
}

__attribute__((noinline)) static void nest(int depth, size_t size) {
  if (depth <= 0) {
    leaf(size);
    return;
  }
  nest(depth - 1, size);
  bench_escape(&size);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH [N]\n", argv[0]);
    return 2;
  }
  uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_memory = 1ull << 40;
  sim_env(o.sim_devices, o.sim_memory);
  if (msnap_allocator_create(&o, &g_a) != 0) {
    fprintf(stderr, "bench_dump: create: %s\n", msnap_last_error());
    return 1;
  }
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.context = MSNAP_CONTEXT_ALL;
  h.stacks = MSNAP_STACKS_CPP;
  h.max_entries = n;
  if (msnap_record_history(g_a, &h) != 0) {
    fprintf(stderr, "bench_dump: record_history: %s\n", msnap_last_error());
    return 1;
  }
  static const size_t sizes[] = {512, 8192, 1 << 20, 3 << 20, 24 << 20};
  /* Each pair records alloc, free_requested, free_completed. */
  for (uint64_t i = 0; i < n / 3 + 1; i++)
    nest((int)(i % 7), sizes[i % 5] + 512 * (i % 13));
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  double best = 1e300;
  for (int r = 0; r < (getenv("ROUNDS")?atoi(getenv("ROUNDS")):3); r++) {
    uint64_t t0 = bench_now_ns();
    if (msnap_dump_snapshot(g_a, &so, argv[1]) != 0) {
      fprintf(stderr, "bench_dump: dump: %s\n", msnap_last_error());
      return 1;
    }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    if (s < best)
      best = s;
  }
  struct stat st;
  stat(argv[1], &st);
  BENCH_RESULT("entries", "%llu", (unsigned long long)n);
  BENCH_RESULT("dump_s", "%.6f", best);
  BENCH_RESULT("bytes", "%lld", (long long)st.st_size);
  msnap_allocator_destroy(g_a);
  return 0;
}
