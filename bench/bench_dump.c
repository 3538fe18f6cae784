/*
 * bench_dump.c -- row 3: snapshot + dump of N trace entries.
 *
 * Fills the history ring (max_entries N, context "all", C stacks from
 * varying call depths) with alloc / free_requested / free_completed
 * entries of a size mix, then times msnap_dump_snapshot: the copy under
 * the device lock, stack resolution, the model, the pickle, fsync and
 * rename.  Each dump writes a new file (as the anchor does), removed
 * after timing.
 *
 * Two ways to run:
 *   bench_dump PATH N [ROUNDS]   ROUNDS dumps; prints their medians.
 *   bench_dump PATH N --serve    fills the ring, leaves one dump at PATH
 *                                (the anchor loads it), prints "ready",
 *                                then times one dump per line read from
 *                                stdin ("dump_s=... cpu_s=..."): the
 *                                runner alternates it with the anchor
 *                                (pickle_dump.py --serve), round by round.
 * Prints RESULT lines: entries, dump_s / cpu_s (medians), bytes.
 */
#include <sys/stat.h>

#include "bench_common.h"
#include "memsnap.h"

#define MAX_ROUNDS 64

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

static uint64_t proc_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One dump to a new file next to path; wall and CPU seconds, its size. */
static void dump_once(const char *path, int r, double *wall, double *cpu,
                      long long *bytes) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.round%d", path, r);
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  uint64_t t0 = bench_now_ns(), c0 = proc_cpu_ns();
  if (msnap_dump_snapshot(g_a, &so, tmp) != 0) {
    fprintf(stderr, "bench_dump: dump: %s\n", msnap_last_error());
    exit(1);
  }
  *wall = (double)(bench_now_ns() - t0) / 1e9;
  *cpu = (double)(proc_cpu_ns() - c0) / 1e9;
  struct stat st;
  *bytes = stat(tmp, &st) == 0 ? (long long)st.st_size : 0;
  unlink(tmp);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH [N] [ROUNDS | --serve]\n", argv[0]);
    return 2;
  }
  uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
  bool serve = argc > 3 && strcmp(argv[3], "--serve") == 0;
  int rounds = argc > 3 && !serve ? atoi(argv[3]) : 5;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 5;
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
  /* The file the anchor loads (and a first dump: symbols resolved). */
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  if (msnap_dump_snapshot(g_a, &so, argv[1]) != 0) {
    fprintf(stderr, "bench_dump: dump: %s\n", msnap_last_error());
    return 1;
  }
  double w[MAX_ROUNDS], c[MAX_ROUNDS];
  long long bytes = 0;
  int done = 0;
  if (serve) {
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (done < MAX_ROUNDS && fgets(line, sizeof line, stdin) != NULL) {
      dump_once(argv[1], done, &w[done], &c[done], &bytes);
      printf("dump_s=%.6f cpu_s=%.6f\n", w[done], c[done]);
      fflush(stdout);
      done++;
    }
  } else {
    for (; done < rounds; done++)
      dump_once(argv[1], done, &w[done], &c[done], &bytes);
  }
  BENCH_RESULT("entries", "%llu", (unsigned long long)n);
  BENCH_RESULT("rounds", "%d", done);
  BENCH_RESULT("dump_s", "%.6f", bench_median(w, done));
  BENCH_RESULT("cpu_s", "%.6f", bench_median(c, done));
  BENCH_RESULT("bytes", "%lld", bytes);
  msnap_allocator_destroy(g_a);
  return 0;
}
