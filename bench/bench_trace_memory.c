/*
 * bench_trace_memory.c -- row 7: host memory per trace entry.
 *
 * With history on (max_entries N, context "all"), N entries are recorded
 * (alloc / free_requested / free_completed of cached sizes), and the
 * growth of the process's heap (mallinfo2: in-use + mmapped) and of its
 * RSS, whichever is larger, is divided by N.  Once without stacks, once
 * with C stacks (interned: a stack shared by many entries is stored
 * once).  Prints RESULT lines: bytes per entry.
 *
 * usage: bench_trace_memory [N]
 */
#include <malloc.h>

#include "bench_common.h"
#include "memsnap.h"

static msnap_allocator_t *g_a;

static uint64_t heap_bytes(void) {
  struct mallinfo2 mi = mallinfo2();
  return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
}

__attribute__((noinline)) static void pair(size_t size) {
  uint64_t p = 0;
  if (msnap_malloc(g_a, 0, size, 0, &p) != 0) {
    fprintf(stderr, "bench_trace_memory: malloc: %s\n", msnap_last_error());
    exit(1);
  }
  msnap_free(g_a, p);
}

__attribute__((noinline)) static void nest(int depth, size_t size) {
  if (depth <= 0) {
    pair(size);
    return;
  }
  nest(depth - 1, size);
  bench_escape(&size);
}

static double per_entry(uint64_t n, unsigned stacks) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_memory = 1ull << 40;
  sim_env(o.sim_devices, o.sim_memory);
  if (msnap_allocator_create(&o, &g_a) != 0) {
    fprintf(stderr, "bench_trace_memory: create: %s\n", msnap_last_error());
    exit(1);
  }
  static const size_t sizes[] = {512, 8192, 1 << 20, 3 << 20};
  for (int i = 0; i < 4; i++)
    pair(sizes[i]); /* segments exist before the measurement */
  malloc_trim(0);
  uint64_t h0 = heap_bytes(), r0 = bench_rss_bytes();
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.context = MSNAP_CONTEXT_ALL;
  h.stacks = stacks;
  h.max_entries = n;
  if (msnap_record_history(g_a, &h) != 0) {
    fprintf(stderr, "bench_trace_memory: history: %s\n", msnap_last_error());
    exit(1);
  }
  for (uint64_t i = 0; i < n / 3 + 1; i++)
    nest((int)(i % 5), sizes[i % 4]);
  uint64_t h1 = heap_bytes(), r1 = bench_rss_bytes();
  double dh = (double)(h1 - h0), dr = r1 > r0 ? (double)(r1 - r0) : 0;
  msnap_allocator_destroy(g_a);
  return (dh > dr ? dh : dr) / (double)n;
}

int main(int argc, char **argv) {
  uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
  BENCH_RESULT("entries", "%llu", (unsigned long long)n);
  BENCH_RESULT("nostacks_bytes", "%.2f", per_entry(n, MSNAP_STACKS_PYTHON));
  BENCH_RESULT("cstacks_bytes", "%.2f", per_entry(n, MSNAP_STACKS_CPP));
  return 0;
}
