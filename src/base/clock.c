/*
 * clock.c -- cheap time stamps for trace entries, converted to wall-clock
 * microseconds only when a snapshot is taken.
 *
 * Recording reads a raw counter (msnap__clock_raw): the TSC on x86_64 when
 * the CPU says it is invariant, the virtual counter cntvct_el0 on aarch64,
 * else clock_gettime(CLOCK_MONOTONIC) in nanoseconds.  A raw reading means
 * nothing by itself; conversion uses two calibration anchors, each a pair
 * (raw, CLOCK_REALTIME ns) chosen as the median of a burst of paired
 * samples:
 *
 *   - the first anchor is taken once, on first use of the clock;
 *   - the second anchor is refreshed by msnap__clock_calibrate(), which
 *     snapshots call before converting.
 *
 * A reading r converts to  real1 + (r - raw1) * scale,  with scale the
 * slope between the two anchors (ns per tick).  The map is linear with a
 * positive slope, hence monotone: entries recorded in order (under the
 * device lock) convert to non-decreasing times.  Between the anchors the
 * error is bounded by the jitter of the anchors themselves (about a
 * microsecond), whatever the distance between them.
 *
 * Invariants (msnap__clock_check):
 *   - anchor1.raw > anchor0.raw once calibrated, scale > 0;
 *   - for the fallback counter the scale is exactly 1 when uncalibrated.
 *
 * Locking: the anchors are guarded by clock_lock; readers of the counter
 * take no lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include "base/base.h"

#define CLOCK_SAMPLES 33

typedef struct clock_anchor_s {
  uint64_t raw;
  int64_t real_ns;
} clock_anchor_t;

enum { CLOCK_SRC_FALLBACK = 0, CLOCK_SRC_TSC = 1, CLOCK_SRC_CNTVCT = 2 };

static pthread_once_t clock_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t clock_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set once by clock_init; read with relaxed atomics (a plain load on
 * x86_64/aarch64) because recording threads may read it without a
 * happens-before edge to the pthread_once that wrote it. */
static _Atomic int clock_source = CLOCK_SRC_FALLBACK;
static clock_anchor_t anchor0;                /* clock_lock              */
static clock_anchor_t anchor1;                /* clock_lock              */
static double clock_scale = 1.0;              /* clock_lock, ns per tick */

static uint64_t clock_fallback_raw(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t clock_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + (int64_t)ts.tv_nsec;
}

/* The hot path: one instruction on x86_64/aarch64, a vDSO call otherwise.
 * clock_source is written once before any recording can start
 * (pthread_once in every entry point that enables history). */
uint64_t msnap__clock_raw(void) {
#if defined(__x86_64__)
  if (msnap_likely(atomic_load_explicit(&clock_source, memory_order_relaxed) ==
                   CLOCK_SRC_TSC))
    return __rdtsc();
#elif defined(__aarch64__)
  if (msnap_likely(atomic_load_explicit(&clock_source, memory_order_relaxed) ==
                   CLOCK_SRC_CNTVCT)) {
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
  }
#endif
  return clock_fallback_raw();
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Take CLOCK_SAMPLES paired readings and return the median pair: samples
 * are sorted by their bracket width (raw after - raw before) and the one
 * of median width gives the anchor, so that one pre-empted sample cannot
 * skew it. */
static clock_anchor_t clock_sample(void) {
  uint64_t key[CLOCK_SAMPLES];
  clock_anchor_t s[CLOCK_SAMPLES];
  for (int i = 0; i < CLOCK_SAMPLES; i++) {
    uint64_t r0 = msnap__clock_raw();
    int64_t t = clock_realtime_ns();
    uint64_t r1 = msnap__clock_raw();
    s[i].raw = r0 + (r1 - r0) / 2;
    s[i].real_ns = t;
    /* width in the high bits, sample index in the low 8 bits */
    key[i] = ((r1 - r0) << 8) | (uint64_t)i;
  }
  qsort(key, CLOCK_SAMPLES, sizeof key[0], cmp_u64);
  return s[key[CLOCK_SAMPLES / 2] & 0xff];
}

static void clock_init(void) {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  /* CPUID 0x80000007 EDX bit 8: invariant TSC (constant rate, runs in all
   * C-states), the condition for using it as a time base. */
  if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) &&
      eax >= 0x80000007u &&
      __get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx) && (edx & (1u << 8)))
    clock_source = CLOCK_SRC_TSC;
#elif defined(__aarch64__)
  clock_source = CLOCK_SRC_CNTVCT;
#endif
  if (msnap__env_get(MSNAP_ENV_CLOCK_FALLBACK) != NULL)
    clock_source = CLOCK_SRC_FALLBACK;
  anchor0 = clock_sample();
  anchor1 = anchor0;
  clock_scale = 1.0;
  if (atomic_load(&clock_source) == CLOCK_SRC_FALLBACK) return;
  /* A first slope so that conversions before any calibration are sane:
   * wait about 200 us (once per process). */
  for (;;) {
    clock_anchor_t b = clock_sample();
    if (b.real_ns - anchor0.real_ns >= 200000 && b.raw > anchor0.raw) {
      anchor1 = b;
      clock_scale = (double)(b.real_ns - anchor0.real_ns) /
                    (double)(b.raw - anchor0.raw);
      break;
    }
  }
}

/* Make sure the counter source and the first anchor exist.  Every entry
 * point that can start recording calls this before the first reading. */
void msnap__clock_init(void) { pthread_once(&clock_once, clock_init); }

/* Refresh the second anchor (snapshot time).  Takes clock_lock; cheap
 * (CLOCK_SAMPLES realtime reads). */
void msnap__clock_calibrate(void) {
  msnap__clock_init();
  clock_anchor_t b = clock_sample();
  msnap__mutex_lock(&clock_lock, MSNAP_RANK_CLOCK);
  /* Keep the old slope when too little time passed since the first
   * anchor to measure one (less than 100 us). */
  if (b.raw > anchor0.raw && b.real_ns - anchor0.real_ns >= 100000) {
    clock_scale = (double)(b.real_ns - anchor0.real_ns) /
                  (double)(b.raw - anchor0.raw);
    anchor1 = b;
  }
  msnap__mutex_unlock(&clock_lock, MSNAP_RANK_CLOCK);
}

/* Convert a raw reading to microseconds since the Unix epoch with the
 * current anchors.  Monotone in raw for a fixed calibration. */
void msnap__clock_map(msnap_clock_map_t *m) {
  msnap__clock_init();
  msnap__mutex_lock(&clock_lock, MSNAP_RANK_CLOCK);
  m->raw1 = anchor1.raw;
  m->real1_ns = anchor1.real_ns;
  m->scale = clock_scale;
  msnap__mutex_unlock(&clock_lock, MSNAP_RANK_CLOCK);
}

int64_t msnap__clock_to_us(uint64_t raw) {
  msnap_clock_map_t m;
  msnap__clock_map(&m);
  return msnap__clock_map_us(&m, raw);
}

int64_t msnap__clock_now_us(void) {
  msnap__clock_init();
  return msnap__clock_to_us(msnap__clock_raw());
}

/* Name of the counter in use ("tsc", "cntvct", "clock_gettime"). */
const char *msnap__clock_source(void) {
  msnap__clock_init();
  switch (atomic_load(&clock_source)) {
  case CLOCK_SRC_TSC: return "tsc";
  case CLOCK_SRC_CNTVCT: return "cntvct";
  default: return "clock_gettime";
  }
}

/* Structural check for tests: 0, or MSNAP_ESTATE with the violation. */
int msnap__clock_check(char *msg, size_t len) {
  msnap__clock_init();
  msnap__mutex_lock(&clock_lock, MSNAP_RANK_CLOCK);
  int bad = !(clock_scale > 0.0) || anchor1.raw < anchor0.raw;
  msnap__mutex_unlock(&clock_lock, MSNAP_RANK_CLOCK);
  if (bad) {
    if (msg && len) snprintf(msg, len, "clock: scale <= 0 or anchors reversed");
    return MSNAP_ESTATE;
  }
  return 0;
}

void msnap__clock_atfork(int phase) { msnap__fork_mutex(&clock_lock, phase); }
