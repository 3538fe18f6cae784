/*
 * alloc_bench.c -- speed of the caching allocator's hot path (history
 * off, sim runtime), next to mimalloc and glibc malloc on the same size
 * sequence.  Not a test: it prints numbers and asserts nothing.
 *
 *   alloc_bench                 cached malloc+free pairs (fixed sizes)
 *   alloc_bench TRACE [REPS]    replay an op list from bench/alloc_trace.py
 *                               (the real-snapshot size mix)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "memsnap.h"

/* mimalloc through bench_mimalloc (loaded privately: linked, it would
 * replace glibc's malloc below); NULL pointers skip its rows. */
static bench_mi_t mi;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static msnap_allocator_t *make(void) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_CUDA;
  o.runtime_name = "sim";
  o.sim_devices = 1;
  o.sim_memory = 1ull << 40;
  o.caching_disabled = 0;
  o.alloc_conf = "";
  msnap_allocator_t *a;
  if (msnap_allocator_create(&o, &a) != 0) {
    fprintf(stderr, "create: %s\n", msnap_last_error());
    exit(1);
  }
  return a;
}

static bool only_memsnap;

static void pairs(void) {
  msnap_allocator_t *a = make();
  static const size_t sizes[] = {4096, 1000, 5u << 20, 8192000};
  const char *ne = getenv("MSNAP_BENCH_N");
  const int n = ne ? atoi(ne) : 5000000;
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    uint64_t p;
    /* keep one block live so the segment stays split (steady state) */
    uint64_t keep;
    msnap_malloc(a, 0, sizes[k], 0, &keep);
    for (int i = 0; i < 1000; i++) {
      msnap_malloc(a, 0, sizes[k], 0, &p);
      msnap_free(a, p);
    }
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
      msnap_malloc(a, 0, sizes[k], 0, &p);
      msnap_free(a, p);
    }
    double t1 = now_ns();
    printf("memsnap  malloc+free %9zu B: %6.1f ns/pair\n", sizes[k],
           (t1 - t0) / n);
    msnap_free(a, keep);
    if (only_memsnap || mi.malloc == NULL)
      continue;
    void *keep2 = mi.malloc(sizes[k]);
    t0 = now_ns();
    for (int i = 0; i < n; i++) {
      void *q = mi.malloc(sizes[k]);
      __asm__ volatile("" : : "r"(q) : "memory");
      mi.free(q);
    }
    t1 = now_ns();
    printf("mimalloc malloc+free %9zu B: %6.1f ns/pair\n", sizes[k],
           (t1 - t0) / n);
    mi.free(keep2);
  }
  msnap_allocator_destroy(a);
}

typedef struct op_s {
  char kind;
  uint32_t id;
  uint64_t size;
} op_t;

static op_t *load(const char *path, size_t *n, uint32_t *maxid) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    exit(1);
  }
  size_t cap = 1024;
  op_t *v = malloc(cap * sizeof *v);
  *n = 0;
  *maxid = 0;
  char k;
  unsigned long long id, sz;
  while (fscanf(f, " %c %llu", &k, &id) == 2) {
    sz = 0;
    if (k == 'a' && fscanf(f, " %llu", &sz) != 1)
      break;
    if (*n == cap)
      v = realloc(v, (cap *= 2) * sizeof *v);
    v[(*n)++] = (op_t){k, (uint32_t)id, sz};
    if (id + 1 > *maxid)
      *maxid = (uint32_t)id + 1;
  }
  fclose(f);
  return v;
}

static void replay(const char *path, int reps) {
  size_t n;
  uint32_t maxid;
  op_t *ops = load(path, &n, &maxid);
  uint64_t *live = calloc(maxid, sizeof *live);
  void **hlive = calloc(maxid, sizeof *hlive);
  msnap_allocator_t *a = make();
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
      if (ops[i].kind == 'a') {
        msnap_malloc(a, 0, ops[i].size, 0, &live[ops[i].id]);
      } else {
        msnap_free(a, live[ops[i].id]);
        live[ops[i].id] = 0;
      }
    }
    for (uint32_t i = 0; i < maxid; i++)
      if (live[i]) {
        msnap_free(a, live[i]);
        live[i] = 0;
      }
    double t = (now_ns() - t0) / (double)n;
    if (t < best)
      best = t;
  }
  msnap_stats_t st;
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  msnap_stats_get(a, 0, &st);
  printf("memsnap  trace %zu ops x %d: %6.1f ns/op (best rep); segments "
         "allocated %lld\n",
         n, reps, best, (long long)st.num_device_alloc);
  msnap_allocator_destroy(a);
  best = 1e30;
  for (int r = 0; mi.malloc != NULL && r < reps; r++) {
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
      if (ops[i].kind == 'a') {
        hlive[ops[i].id] = mi.malloc(ops[i].size);
      } else {
        mi.free(hlive[ops[i].id]);
        hlive[ops[i].id] = NULL;
      }
    }
    for (uint32_t i = 0; i < maxid; i++)
      if (hlive[i]) {
        mi.free(hlive[i]);
        hlive[i] = NULL;
      }
    double t = (now_ns() - t0) / (double)n;
    if (t < best)
      best = t;
  }
  if (mi.malloc != NULL)
    printf("mimalloc trace %zu ops x %d: %6.1f ns/op (best rep)\n", n, reps,
           best);
  best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
      if (ops[i].kind == 'a') {
        hlive[ops[i].id] = malloc(ops[i].size);
      } else {
        free(hlive[ops[i].id]);
        hlive[ops[i].id] = NULL;
      }
    }
    for (uint32_t i = 0; i < maxid; i++)
      if (hlive[i]) {
        free(hlive[i]);
        hlive[i] = NULL;
      }
    double t = (now_ns() - t0) / (double)n;
    if (t < best)
      best = t;
  }
  printf("glibc    trace %zu ops x %d: %6.1f ns/op (best rep)\n", n, reps,
         best);
  free(live);
  free(hlive);
  free(ops);
}

int main(int argc, char **argv) {
  mi = bench_mimalloc();
  /* "-m": memsnap pairs only (for perf stat instruction counts) */
  if (argc > 1 && strcmp(argv[1], "-m") == 0) {
    only_memsnap = true;
    pairs();
    return 0;
  }
  if (argc > 1)
    replay(argv[1], argc > 2 ? atoi(argv[2]) : 20);
  else
    pairs();
  return 0;
}
