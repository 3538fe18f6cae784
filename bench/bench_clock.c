/*
 * bench_clock.c -- row 6: cost of one time stamp.  The recorder's cycle
 * counter (msnap__clock_raw: rdtsc / cntvct_el0) and its conversion to
 * microseconds (msnap__clock_now_us) against clock_gettime(MONOTONIC) and
 * clock_gettime(REALTIME).  Rounds interleave the four (each goes first
 * in turn); the figure of each is the median of its rounds, in thread CPU
 * time per read.  Prints RESULT lines: ns per read.
 *
 * usage: bench_clock [ROUNDS]
 */
#include "bench_common.h"
#include "api/api.h"
#include "runtime/runtime.h"

#define N 2000000
#define MAX_ROUNDS 64

static uint64_t mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_nsec;
}

static uint64_t real_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_nsec;
}

static uint64_t raw(void) { return msnap__clock_raw(); }
static uint64_t now_us(void) { return (uint64_t)msnap__clock_now_us(); }

#define NCLOCKS 4
static uint64_t (*const clocks[NCLOCKS])(void) = {raw, now_us, mono,
                                                  real_time};
static const char *const keys[NCLOCKS] = {"raw_ns", "now_us_ns",
                                          "monotonic_ns", "realtime_ns"};

__attribute__((noinline)) static double time_one(uint64_t (*fn)(void)) {
  uint64_t acc = 0, t0 = bench_cpu_ns();
  for (int i = 0; i < N; i++) acc += fn();
  double ns = (double)(bench_cpu_ns() - t0) / N;
  bench_escape(&acc);
  return ns;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 9;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 9;
  double v[NCLOCKS][MAX_ROUNDS];
  (void)msnap__clock_now_us(); /* calibrate before timing */
  for (int k = 0; k < NCLOCKS; k++) (void)time_one(clocks[k]);
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < NCLOCKS; j++) {
      int k = (r + j) % NCLOCKS;
      v[k][r] = time_one(clocks[k]);
    }
#if defined(__x86_64__)
  printf("RESULT counter=rdtsc\n");
#elif defined(__aarch64__)
  printf("RESULT counter=cntvct_el0\n");
#else
  printf("RESULT counter=clock_gettime\n");
#endif
  printf("RESULT counter_source=%s\n", msnap__clock_source());
  BENCH_RESULT("rounds", "%d", rounds);
  for (int k = 0; k < NCLOCKS; k++)
    printf("RESULT %s=%.2f\n", keys[k], bench_median(v[k], rounds));
  return 0;
}
