/*
 * bench_common.h -- helpers shared by the bench/ programs (header-only,
 * static functions): a monotonic nanosecond clock, the request-size list
 * (bench/sizes.py writes it), RSS, thread CPU time, medians, and the one
 * output format the runner
 * (bench/run.py) parses:  "RESULT key=value" lines, one figure each.
 * Benchmarks print figures; they never assert on time.
 */
#ifndef MSNAP_BENCH_COMMON_H
#define MSNAP_BENCH_COMMON_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of the calling thread in ns: on a machine shared with other
 * jobs it leaves out the time the thread waited for a core, which wall
 * time does not (the runner interleaves rounds and quotes medians). */
static inline uint64_t bench_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static inline double bench_median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Keep the compiler from dropping a value or a pointer. */
static inline void bench_escape(const void *p) {
  __asm__ volatile("" : : "g"(p) : "memory");
}

/* Read one size per line (first field) from path; exits on failure. */
static inline size_t *bench_read_sizes(const char *path, size_t *n) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "bench: cannot open size list %s\n", path);
    exit(2);
  }
  size_t cap = 1024, len = 0;
  size_t *v = malloc(cap * sizeof *v);
  unsigned long long x;
  while (v != NULL && fscanf(f, "%llu%*[^\n]", &x) == 1) {
    if (len == cap) {
      cap *= 2;
      size_t *nv = realloc(v, cap * sizeof *v);
      if (nv == NULL) {
        free(v);
        v = NULL;
        break;
      }
      v = nv;
    }
    v[len++] = (size_t)x;
  }
  fclose(f);
  if (v == NULL || len == 0) {
    fprintf(stderr, "bench: no sizes in %s\n", path);
    exit(2);
  }
  *n = len;
  return v;
}

/* Resident set size of this process in bytes (/proc/self/statm). */
static inline uint64_t bench_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, rss = 0;
  if (f != NULL) {
    if (fscanf(f, "%llu %llu", &size, &rss) != 2)
      rss = 0;
    fclose(f);
  }
  return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Peak resident set size of this process in bytes (VmHWM). */
static inline uint64_t bench_peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t v = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "VmHWM:", 6) == 0)
      v = strtoull(line + 6, NULL, 10) * 1024;
  if (f != NULL)
    fclose(f);
  return v;
}

/* The sim runtime takes its device count and size from MEMSNAP_SIM_DEVICES
 * and MEMSNAP_SIM_MEMORY (it does not see msnap_options_t.sim_*), so set
 * both as well (0 leaves a variable alone). */
static inline void sim_env(int devices, uint64_t memory) {
  char v[32];
  if (devices > 0) {
    snprintf(v, sizeof v, "%d", devices);
    setenv("MEMSNAP_SIM_DEVICES", v, 1);
  }
  if (memory > 0) {
    snprintf(v, sizeof v, "%llu", (unsigned long long)memory);
    setenv("MEMSNAP_SIM_MEMORY", v, 1);
  }
}

/* mimalloc, loaded privately (RTLD_LOCAL) so that it serves only the
 * calls made through these pointers.  Linked at build time, Debian's
 * libmimalloc.so.2 (built to override) would interpose malloc/free -- and
 * __libc_malloc -- for the whole process: the anchor named "glibc" would
 * be mimalloc again, and memsnap's own host allocations would go to it.
 * NULL pointers when the library cannot be loaded. */
typedef struct bench_mi_s {
  void *(*malloc)(size_t);
  void (*free)(void *);
} bench_mi_t;

static inline bench_mi_t bench_mimalloc(void) {
  static const char *const names[] = {"libmimalloc.so.2", "libmimalloc.so"};
  bench_mi_t mi = {NULL, NULL};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) continue;
    *(void **)&mi.malloc = dlsym(h, "mi_malloc");
    *(void **)&mi.free = dlsym(h, "mi_free");
    if (mi.malloc != NULL && mi.free != NULL) break;
    mi.malloc = NULL;
    mi.free = NULL;
    dlclose(h);
  }
  return mi;
}

#define BENCH_RESULT(key, fmt, ...)                                           \
  printf("RESULT " key "=" fmt "\n", __VA_ARGS__)

#endif /* MSNAP_BENCH_COMMON_H */
