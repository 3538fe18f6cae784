/*
 * bench_clock.c -- row 6: cost of one time stamp.  The recorder's cycle
 * counter (msnap__clock_raw: rdtsc / cntvct_el0) and its conversion to
 * microseconds (msnap__clock_now_us) against clock_gettime(MONOTONIC) and
 * clock_gettime(REALTIME).  Prints RESULT lines: ns per read.
 */
#include "bench_common.h"
#include "api/api.h"
#include "runtime/runtime.h"

#define N 20000000

#define TIME_LOOP(expr, out)                                                  \
  do {                                                                        \
    double best_ = 1e300;                                                     \
    for (int r_ = 0; r_ < 3; r_++) {                                          \
      uint64_t acc_ = 0, t0_ = bench_now_ns();                                \
      for (int i_ = 0; i_ < N; i_++)                                          \
        acc_ += (uint64_t)(expr);                                             \
      double ns_ = (double)(bench_now_ns() - t0_) / N;                        \
      bench_escape(&acc_);                                                    \
      if (ns_ < best_)                                                        \
        best_ = ns_;                                                          \
    }                                                                         \
    (out) = best_;                                                            \
  } while (0)

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

int main(void) {
  double raw, now_us, m, rt;
  TIME_LOOP(msnap__clock_raw(), raw);
  TIME_LOOP(msnap__clock_now_us(), now_us);
  TIME_LOOP(mono(), m);
#if defined(__x86_64__)
  printf("RESULT counter=rdtsc\n");
#elif defined(__aarch64__)
  printf("RESULT counter=cntvct_el0\n");
#else
  printf("RESULT counter=clock_gettime\n");
#endif
  TIME_LOOP(real_time(), rt);
  BENCH_RESULT("raw_ns", "%.2f", raw);
  BENCH_RESULT("now_us_ns", "%.2f", now_us);
  BENCH_RESULT("monotonic_ns", "%.2f", m);
  BENCH_RESULT("realtime_ns", "%.2f", rt);
  return 0;
}
