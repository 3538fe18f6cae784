/*
 * bench_hotpath.c -- row 1: the hot path.  Cached malloc+free pairs over
 * the request sizes of the real snapshots (bench/sizes.py), history off,
 * for memsnap (sim runtime, caching on), glibc malloc/free and mimalloc
 * (mi_malloc/mi_free), in the same run on the same size sequence.
 * mimalloc is loaded privately (bench_mimalloc): linked, it would replace
 * glibc's malloc in the whole process.
 *
 * Each allocator first serves one warm-up pass over the sizes (so that
 * memsnap's cache holds a block of every size class, as in a training
 * step after the first).  Then `rounds` rounds, each timing one pass of
 * every allocator in turn (memsnap, glibc, mimalloc, rotating which goes
 * first), so that a busy machine disturbs them alike; the figure of an
 * allocator is the median of its rounds, in thread CPU time per pair.
 * Two mixes are timed: the whole size list, and its requests of at most
 * 1 MiB (PyTorch's small pool; there glibc and mimalloc serve from their
 * own caches, while larger requests make them call mmap/munmap).
 * Prints RESULT lines: ns per pair for each allocator and mix.
 *
 * usage: bench_hotpath SIZES_FILE [ROUNDS]
 */
#include "bench_common.h"
#include "memsnap.h"

typedef struct pairs_s {
  const size_t *sizes;
  size_t n;
} pairs_t;

static double time_glibc(const pairs_t *p) {
  uint64_t t0 = bench_cpu_ns();
  for (size_t i = 0; i < p->n; i++) {
    void *q = malloc(p->sizes[i]);
    bench_escape(q);
    free(q);
  }
  return (double)(bench_cpu_ns() - t0) / (double)p->n;
}

static bench_mi_t mi;

static double time_mimalloc(const pairs_t *p) {
  uint64_t t0 = bench_cpu_ns();
  for (size_t i = 0; i < p->n; i++) {
    void *q = mi.malloc(p->sizes[i]);
    bench_escape(q);
    mi.free(q);
  }
  return (double)(bench_cpu_ns() - t0) / (double)p->n;
}

static msnap_allocator_t *g_alloc;

static double time_memsnap(const pairs_t *p) {
  msnap_allocator_t *a = g_alloc;
  uint64_t t0 = bench_cpu_ns();
  for (size_t i = 0; i < p->n; i++) {
    uint64_t q = 0;
    if (msnap_malloc(a, 0, p->sizes[i], 0, &q) != 0) {
      fprintf(stderr, "bench_hotpath: msnap_malloc(%zu): %s\n", p->sizes[i],
              msnap_last_error());
      exit(1);
    }
    bench_escape(&q);
    msnap_free(a, q);
  }
  return (double)(bench_cpu_ns() - t0) / (double)p->n;
}

#define MAX_ROUNDS 64

/* Medians of the three allocators over interleaved rounds (out: memsnap,
 * glibc, mimalloc). */
static void interleaved(const pairs_t *p, int rounds, double out[3]) {
  double (*fn[3])(const pairs_t *) = {time_memsnap, time_glibc,
                                      time_mimalloc};
  double v[3][MAX_ROUNDS];
  for (int k = 0; k < 3; k++) fn[k](p); /* warm-up passes */
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < 3; j++) {
      int k = (r + j) % 3; /* each goes first in turn */
      v[k][r] = fn[k](p);
    }
  for (int k = 0; k < 3; k++) out[k] = bench_median(v[k], rounds);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SIZES_FILE [ROUNDS]\n", argv[0]);
    return 2;
  }
  mi = bench_mimalloc();
  if (mi.malloc == NULL) {
    const char *why = dlerror();
    fprintf(stderr, "bench_hotpath: mimalloc (libmimalloc.so.2 or "
            "libmimalloc.so) cannot be loaded: %s\n",
            why ? why : "no mi_malloc/mi_free");
    return 1;
  }
  size_t n = 0;
  size_t *all = bench_read_sizes(argv[1], &n);
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 7;
  size_t *small = malloc(n * sizeof *small);
  size_t nsmall = 0;
  for (size_t i = 0; i < n; i++)
    if (all[i] <= (1u << 20))
      small[nsmall++] = all[i];
  /* Repeat each mix up to 200k pairs per round. */
  size_t total = 200000;
  size_t *seq = malloc(total * sizeof *seq);
  size_t *seq_small = malloc(total * sizeof *seq_small);
  for (size_t i = 0; i < total; i++) {
    seq[i] = all[i % n];
    seq_small[i] = nsmall ? small[i % nsmall] : 0;
  }
  pairs_t p = {seq, total};
  pairs_t ps = {seq_small, nsmall ? total : 0};

  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.sim_devices = 1;
  o.sim_memory = 1ull << 40;
  sim_env(o.sim_devices, o.sim_memory);
  o.alloc_conf = "";
  o.caching_disabled = 0;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  if (msnap_allocator_create(&o, &g_alloc) != 0) {
    fprintf(stderr, "bench_hotpath: allocator_create: %s\n", err);
    return 1;
  }
  BENCH_RESULT("sizes", "%zu", n);
  BENCH_RESULT("sizes_small", "%zu", nsmall);
  BENCH_RESULT("pairs_per_round", "%zu", total);
  BENCH_RESULT("rounds", "%d", rounds);
  double m[3];
  interleaved(&p, rounds, m);
  BENCH_RESULT("memsnap_ns", "%.2f", m[0]);
  BENCH_RESULT("glibc_ns", "%.2f", m[1]);
  BENCH_RESULT("mimalloc_ns", "%.2f", m[2]);
  if (nsmall > 0) {
    interleaved(&ps, rounds, m);
    BENCH_RESULT("small_memsnap_ns", "%.2f", m[0]);
    BENCH_RESULT("small_glibc_ns", "%.2f", m[1]);
    BENCH_RESULT("small_mimalloc_ns", "%.2f", m[2]);
  }
  msnap_allocator_destroy(g_alloc);
  free(seq);
  free(seq_small);
  free(all);
  free(small);

  return 0;
}
