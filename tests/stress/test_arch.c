/*
 * test_arch.c -- the architecture-specific paths, so that the aarch64
 * cross run (make test-aarch64, under qemu-aarch64) provably exercises
 * them: the recorder's time base (cntvct_el0 on aarch64, the invariant TSC
 * or clock_gettime on x86_64) and C stack capture + symbolization through
 * the public API.
 *
 * Checked: the clock source is the one the architecture must use (aarch64:
 * always cntvct); raw readings never go backwards; converted times agree
 * with CLOCK_REALTIME to within 50 ms (a correctness bound, not a speed
 * figure); msnap__clock_check passes.  Then an allocation made from a known
 * function with C stacks on shows that function's name in the frames of
 * its `alloc` trace entry, in a snapshot read back through the reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "runtime/runtime.h"

static int64_t realtime_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void test_clock_source(void **state) {
  (void)state;
  const char *src = msnap__clock_source();
  print_message("arch: clock source %s\n", src);
#if defined(__aarch64__)
  assert_string_equal(src, "cntvct");
#elif defined(__x86_64__)
  assert_true(strcmp(src, "tsc") == 0 || strcmp(src, "clock_gettime") == 0);
#else
  assert_string_equal(src, "clock_gettime");
#endif
  uint64_t prev = msnap__clock_raw();
  for (int i = 0; i < 100000; i++) {
    uint64_t now = msnap__clock_raw();
    assert_true(now >= prev);
    prev = now;
  }
  msnap__clock_calibrate();
  int64_t before = realtime_us();
  int64_t t = msnap__clock_now_us();
  int64_t after = realtime_us();
  print_message("arch: clock %lld us, CLOCK_REALTIME %lld..%lld us\n",
                (long long)t, (long long)before, (long long)after);
  assert_true(t >= before - 50000 && t <= after + 50000);
  char msg[128] = "";
  assert_int_equal(msnap__clock_check(msg, sizeof msg), 0);
}

static msnap_allocator_t *g_a;

/* The allocation site the C stack must name (exported, not inlined). */
uint64_t arch_marker_alloc(size_t size);
__attribute__((noinline)) uint64_t arch_marker_alloc(size_t size) {
  uint64_t p = 0;
  assert_int_equal(msnap_malloc(g_a, 0, size, 0, &p), 0);
  __asm__ volatile("" : : "g"(&p) : "memory"); /* no tail call */
  return p;
}

static void test_c_stacks(void **state) {
  (void)state;
  setenv("MEMSNAP_SIM_DEVICES", "1", 1);
  setenv("MEMSNAP_SIM_MEMORY", "4294967296", 1);
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  assert_int_equal(msnap_allocator_create(&o, &g_a), 0);
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.context = MSNAP_CONTEXT_ALL;
  h.stacks = MSNAP_STACKS_CPP;
  assert_int_equal(msnap_record_history(g_a, &h), 0);
  uint64_t p = arch_marker_alloc(123456);

  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(msnap_snapshot_pickle(g_a, &so, &buf, &len), 0);
  msnap_snap_t *s = NULL;
  msnap_read_error_t err;
  assert_int_equal(msnap__snap_read_buffer(buf, len, &s, &err), 0);
  assert_true(s->ndevices >= 1);
  bool found_entry = false, found_name = false;
  const msnap_trace_list_t *tl = &s->device_traces[0];
  for (uint32_t i = 0; i < tl->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (e->action != MSNAP_ACTION_ALLOC || e->addr != p)
      continue;
    found_entry = true;
    assert_true(e->frames > MSNAP_STACK_EMPTY && e->frames < s->nstacks);
    print_message("arch: alloc entry has %u frames\n",
                  msnap__stack_len(s, e->frames));
    msnap_stack_iter_t it;
    msnap__stack_iter(s, e->frames, &it);
    uint32_t fid;
    for (uint32_t k = 0; msnap__stack_next(&it, &fid); k++) {
      const msnap_frame_t *f = &s->frames[fid];
      size_t nlen = 0;
      const char *name = msnap__snap_str(s, f->name, &nlen);
      if (name != NULL && strstr(name, "arch_marker_alloc") != NULL) {
        found_name = true;
        print_message("arch: frame %u is %s\n", k, name);
      }
    }
  }
  assert_true(found_entry);
  assert_true(found_name);
  msnap__snap_free(s);
  msnap_free_string(buf);
  assert_int_equal(msnap_free(g_a, p), 0);
  msnap_allocator_destroy(g_a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_clock_source),
      cmocka_unit_test(test_c_stacks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
