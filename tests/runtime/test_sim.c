/*
 * test_sim.c -- the simulated device runtime (src/runtime/sim.c).  Every test
 * runs msnap__sim_check after each operation (CHECK).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/api.h"
#include "runtime/runtime.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define BASE0 0x7f0000000000ull
#define SPAN_DEFAULT (1ull << 44)

static const msnap_runtime_ops_t *ops;

#define CHECK(ctx)                                                            \
  do {                                                                        \
    char msg_[256];                                                           \
    int rc_ = msnap__sim_check((ctx), msg_, sizeof msg_);                     \
    if (rc_ != 0) fail_msg("sim invariant: %s", msg_);                        \
  } while (0)

static void *make(int devices, uint64_t memory) {
  void *ctx = NULL;
  assert_int_equal(msnap__sim_create(devices, memory, &ctx), 0);
  assert_non_null(ctx);
  CHECK(ctx);
  return ctx;
}

static uint64_t xmalloc(void *ctx, int dev, size_t size) {
  uint64_t p = 0xdead;
  int rc = ops->malloc(ctx, dev, size, &p);
  if (rc != 0) fail_msg("malloc(%zu): %s", size, msnap_last_error());
  CHECK(ctx);
  return p;
}

static void xfree(void *ctx, int dev, uint64_t p) {
  assert_int_equal(ops->free(ctx, dev, p), 0);
  CHECK(ctx);
}

static size_t free_bytes(void *ctx, int dev) {
  size_t f, t;
  assert_int_equal(ops->mem_get_info(ctx, dev, &f, &t), 0);
  return f;
}

static void test_by_name(void **state) {
  (void)state;
  assert_ptr_equal(msnap_runtime_by_name("sim"), msnap_runtime_sim());
  assert_ptr_equal(msnap_runtime_by_name("SIM"), msnap_runtime_sim());
  assert_ptr_equal(msnap_runtime_by_name("acl"), msnap_runtime_acl());
  assert_ptr_equal(msnap_runtime_by_name("npu"), msnap_runtime_acl());
  assert_ptr_equal(msnap_runtime_by_name("cuda"), msnap_runtime_cuda());
  assert_null(msnap_runtime_by_name("rocm"));
  assert_null(msnap_runtime_by_name(NULL));
  assert_string_equal(msnap_runtime_sim()->name, "sim");
  /* Control calls ignore contexts that are not sim contexts. */
  int not_sim[64] = {0};
  msnap_sim_fail_nth(not_sim, NULL, 1);
  msnap_sim_set_manual_events(not_sim, true);
  msnap_sim_complete_events(not_sim, 0, true);
  msnap_sim_set_next_address(not_sim, 0, 0x1000);
  assert_int_equal(msnap_sim_live_allocations(not_sim), 0);
  assert_int_equal(msnap_sim_live_allocations(NULL), 0);
  for (int i = 0; i < 64; i++) assert_int_equal(not_sim[i], 0);
  char m[64];
  assert_int_equal(msnap__sim_check(not_sim, m, sizeof m), MSNAP_EINVAL);
  /* Every member of the table is implemented. */
  const msnap_runtime_ops_t *o = msnap_runtime_sim();
  void (*const *fn)(void) = (void (*const *)(void))&o->init;
  size_t n = (sizeof *o - offsetof(msnap_runtime_ops_t, init)) / sizeof *fn;
  for (size_t i = 0; i < n; i++) assert_non_null(fn[i]);
}

static void test_env_init(void **state) {
  (void)state;
  setenv("MEMSNAP_SIM_DEVICES", "3", 1);
  setenv("MEMSNAP_SIM_MEMORY", "8G", 1);
  void *ctx = NULL;
  assert_int_equal(ops->init(&ctx), 0);
  int n = 0;
  assert_int_equal(ops->device_count(ctx, &n), 0);
  assert_int_equal(n, 3);
  size_t f, t;
  assert_int_equal(ops->mem_get_info(ctx, 2, &f, &t), 0);
  assert_int_equal(t, 8 * GiB);
  assert_int_equal(f, 8 * GiB);
  ops->fini(ctx);
  unsetenv("MEMSNAP_SIM_DEVICES");
  unsetenv("MEMSNAP_SIM_MEMORY");
  assert_int_equal(ops->init(&ctx), 0);
  assert_int_equal(ops->device_count(ctx, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(ops->mem_get_info(ctx, 0, &f, &t), 0);
  assert_int_equal(t, 64 * GiB);
  ops->fini(ctx);
}

static void test_basics(void **state) {
  (void)state;
  void *ctx = make(2, 1 * GiB);
  /* Lowest fit: 512-byte granularity for small requests. */
  uint64_t a = xmalloc(ctx, 0, 512);
  assert_int_equal(a, BASE0);
  uint64_t b = xmalloc(ctx, 0, 1000); /* footprint 1024 */
  assert_int_equal(b, BASE0 + 512);
  uint64_t c = xmalloc(ctx, 0, 2 * MiB); /* segment-sized: 2 MiB aligned */
  assert_int_equal(c, BASE0 + 2 * MiB);
  uint64_t d = xmalloc(ctx, 0, 100);
  assert_int_equal(d, BASE0 + 1536);
  assert_int_equal(free_bytes(ctx, 0), 1 * GiB - 512 - 1000 - 2 * MiB - 100);
  /* Freed holes are reused lowest first. */
  xfree(ctx, 0, b);
  assert_int_equal(xmalloc(ctx, 0, 512), BASE0 + 512);
  assert_int_equal(xmalloc(ctx, 0, 512), BASE0 + 1024);
  assert_int_equal(xmalloc(ctx, 0, 512), BASE0 + 2048);
  /* Device 1 has its own region and accounting. */
  uint64_t e = xmalloc(ctx, 1, 20 * MiB);
  assert_int_equal(e, BASE0 + SPAN_DEFAULT);
  assert_int_equal(free_bytes(ctx, 1), 1 * GiB - 20 * MiB);
  /* size 0 yields 0 and costs nothing; free(0) is a no-op. */
  uint64_t z = 1;
  assert_int_equal(ops->malloc(ctx, 0, 0, &z), 0);
  assert_int_equal(z, 0);
  xfree(ctx, 0, 0);
  /* Bad device and bad pointer. */
  uint64_t untouched = 77;
  assert_int_equal(ops->malloc(ctx, 2, 512, &untouched), MSNAP_EINVAL);
  assert_int_equal(untouched, 77);
  assert_non_null(strstr(msnap_last_error(), "invalid device 2"));
  assert_int_equal(ops->free(ctx, 0, BASE0 + 4), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "0x7f0000000004"));
  assert_int_equal(msnap_sim_live_allocations(ctx), 7);
  ops->fini(ctx);
}

/* The same call sequence gives the same addresses, handles and events. */
static void run_sequence(uint64_t out[16]) {
  void *ctx = make(2, 4 * GiB);
  int k = 0;
  uint64_t p[6];
  p[0] = xmalloc(ctx, 0, 2 * MiB);
  p[1] = xmalloc(ctx, 0, 20 * MiB);
  p[2] = xmalloc(ctx, 1, 2 * MiB);
  xfree(ctx, 0, p[0]);
  p[3] = xmalloc(ctx, 0, 12 * MiB); /* does not fit the 2 MiB hole */
  p[4] = xmalloc(ctx, 0, 1 * MiB);  /* fits it */
  p[5] = xmalloc(ctx, 0, 4096);
  for (int i = 1; i < 6; i++) out[k++] = p[i];
  uint64_t va, h, ev;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 72 * GiB / 16, 0, &va), 0);
  out[k++] = va;
  assert_int_equal(ops->vmm_map(ctx, 0, va, 20 * MiB, &h), 0);
  out[k++] = h;
  assert_int_equal(ops->event_create(ctx, 0, &ev), 0);
  out[k++] = ev;
  assert_int_equal(ops->host_malloc(ctx, 100, &h), 0);
  out[k++] = h;
  while (k < 16) out[k++] = 0;
  ops->fini(ctx);
}

static void test_determinism(void **state) {
  (void)state;
  uint64_t a[16], b[16];
  run_sequence(a);
  run_sequence(b);
  assert_memory_equal(a, b, sizeof a);
  /* The documented layout. */
  assert_int_equal(a[0], BASE0 + 2 * MiB);        /* 20 MiB after hole */
  assert_int_equal(a[1], BASE0 + SPAN_DEFAULT);   /* device 1 */
  assert_int_equal(a[2], BASE0 + 22 * MiB);       /* 12 MiB */
  assert_int_equal(a[3], BASE0);                  /* 1 MiB in the hole */
  assert_int_equal(a[4], BASE0 + 1 * MiB);        /* 4 KiB after it */
  assert_int_equal(a[5], BASE0 + SPAN_DEFAULT / 16); /* VMM region */
  assert_int_equal(a[6], 1);                      /* first handle */
  assert_int_equal(a[7], 1);                      /* first event */
  assert_int_equal(a[8], 0x7e0000000000ull);      /* host region */
}

static void test_large_memory_span(void **state) {
  (void)state;
  /* 1 TiB devices: span = next_pow2(1 TiB) * 64 = 2^46. */
  void *ctx = make(2, 1024 * GiB);
  assert_int_equal(xmalloc(ctx, 1, 2 * MiB), BASE0 + (1ull << 46));
  ops->fini(ctx);
}

static void test_fault_switch(void **state) {
  (void)state;
  void *ctx = make(1, 1 * GiB);
  uint64_t p = 5, ev = 9;
  /* Any call: the 2nd call from now fails. */
  msnap_sim_fail_nth(ctx, NULL, 2);
  assert_int_equal(ops->event_create(ctx, 0, &ev), 0);
  assert_int_equal(ops->malloc(ctx, 0, 4096, &p), MSNAP_EOOM);
  assert_int_equal(p, 5);
  assert_non_null(strstr(msnap_last_error(), "injected failure of malloc"));
  /* Disarmed after firing. */
  p = xmalloc(ctx, 0, 4096);
  xfree(ctx, 0, p);
  /* Named call: other calls do not count. */
  msnap_sim_fail_nth(ctx, "event_record", 2);
  p = xmalloc(ctx, 0, 512);
  assert_int_equal(ops->event_record(ctx, 0, ev, 0), 0);
  xfree(ctx, 0, p);
  assert_int_equal(ops->event_record(ctx, 0, ev, 0), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "event_record"));
  assert_int_equal(ops->event_record(ctx, 0, ev, 0), 0);
  /* vmm_map and host_malloc are allocations: EOOM. */
  uint64_t va, h = 3;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 40 * MiB, 0, &va), 0);
  msnap_sim_fail_nth(ctx, "vmm_map", 1);
  assert_int_equal(ops->vmm_map(ctx, 0, va, 20 * MiB, &h), MSNAP_EOOM);
  assert_int_equal(h, 3);
  msnap_sim_fail_nth(ctx, "host_malloc", 1);
  assert_int_equal(ops->host_malloc(ctx, 64, &h), MSNAP_EOOM);
  msnap_sim_fail_nth(ctx, "free", 1);
  p = xmalloc(ctx, 0, 512);
  assert_int_equal(ops->free(ctx, 0, p), MSNAP_ERUNTIME);
  xfree(ctx, 0, p); /* the failed free left it live */
  /* 0 disarms. */
  msnap_sim_fail_nth(ctx, NULL, 1);
  msnap_sim_fail_nth(ctx, NULL, 0);
  xfree(ctx, 0, xmalloc(ctx, 0, 512));
  CHECK(ctx);
  assert_int_equal(ops->vmm_release(ctx, 0, va, 40 * MiB), 0);
  assert_int_equal(ops->event_destroy(ctx, 0, ev), 0);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  ops->fini(ctx);
}

static void test_events(void **state) {
  (void)state;
  void *ctx = make(2, 1 * GiB);
  uint64_t e1, e2, e3, e4;
  bool done = false;
  assert_int_equal(ops->event_create(ctx, 0, &e1), 0);
  assert_int_equal(ops->event_create(ctx, 0, &e2), 0);
  assert_int_equal(ops->event_create(ctx, 0, &e3), 0);
  assert_int_equal(ops->event_create(ctx, 1, &e4), 0);
  assert_int_equal(e1, 1);
  assert_int_equal(e4, 4);
  /* Never recorded: complete. Auto mode: complete at once. */
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_record(ctx, 0, e1, 7), 0);
  done = false;
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  /* Manual mode. */
  msnap_sim_set_manual_events(ctx, true);
  assert_int_equal(ops->event_record(ctx, 0, e1, 7), 0);
  assert_int_equal(ops->event_record(ctx, 0, e2, 8), 0);
  assert_int_equal(ops->event_record(ctx, 0, e3, 8), 0);
  assert_int_equal(ops->event_record(ctx, 1, e4, 7), 0);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_false(done);
  msnap_sim_complete_events(ctx, 7, false); /* e1 and e4 */
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_query(ctx, 1, e4, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_query(ctx, 0, e2, &done), 0);
  assert_false(done);
  /* event_synchronize waits for (completes) one event. */
  assert_int_equal(ops->event_synchronize(ctx, 0, e2), 0);
  assert_int_equal(ops->event_query(ctx, 0, e2, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_query(ctx, 0, e3, &done), 0);
  assert_false(done);
  /* device_synchronize completes only that device's events. */
  assert_int_equal(ops->event_record(ctx, 1, e4, 7), 0);
  assert_int_equal(ops->device_synchronize(ctx, 0), 0);
  assert_int_equal(ops->event_query(ctx, 0, e3, &done), 0);
  assert_true(done);
  assert_int_equal(ops->event_query(ctx, 1, e4, &done), 0);
  assert_false(done);
  msnap_sim_complete_events(ctx, 0, true);
  assert_int_equal(ops->event_query(ctx, 1, e4, &done), 0);
  assert_true(done);
  /* Leaving manual mode completes pending events. */
  assert_int_equal(ops->event_record(ctx, 0, e1, 3), 0);
  msnap_sim_set_manual_events(ctx, false);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), 0);
  assert_true(done);
  /* Wrong device, destroyed events. */
  assert_int_equal(ops->event_query(ctx, 1, e1, &done), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "belongs to device 0"));
  assert_int_equal(msnap_sim_live_allocations(ctx), 4);
  assert_int_equal(ops->event_destroy(ctx, 0, e1), 0);
  CHECK(ctx);
  assert_int_equal(ops->event_query(ctx, 0, e1, &done), MSNAP_ERUNTIME);
  assert_int_equal(ops->event_destroy(ctx, 0, e1), MSNAP_ERUNTIME);
  assert_int_equal(ops->event_record(ctx, 0, 99, 0), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "event 99"));
  assert_int_equal(msnap_sim_live_allocations(ctx), 3);
  /* Ids are never reused. */
  assert_int_equal(ops->event_create(ctx, 0, &e1), 0);
  assert_int_equal(e1, 5);
  CHECK(ctx);
  ops->fini(ctx);
}

static void test_vmm(void **state) {
  (void)state;
  void *ctx = make(1, 100 * MiB);
  uint64_t va = 0, va2 = 0, h1, h2, h3, h4 = 11;
  /* Reserve more VA than memory: reservations are free. */
  assert_int_equal(ops->vmm_reserve(ctx, 0, 1 * GiB, 0, &va), 0);
  assert_int_equal(va, BASE0 + SPAN_DEFAULT / 16);
  assert_int_equal(ops->vmm_reserve(ctx, 0, 1 * GiB, 1 * GiB, &va2), 0);
  assert_int_equal(va2, va + 1 * GiB);
  CHECK(ctx);
  assert_int_equal(free_bytes(ctx, 0), 100 * MiB);
  assert_int_equal(ops->vmm_map(ctx, 0, va, 20 * MiB, &h1), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va + 20 * MiB, 20 * MiB, &h2), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va2, 40 * MiB, &h3), 0);
  CHECK(ctx);
  assert_int_equal(free_bytes(ctx, 0), 20 * MiB);
  /* Mapping beyond memory: OOM, nothing changes. */
  assert_int_equal(ops->vmm_map(ctx, 0, va + 40 * MiB, 40 * MiB, &h4),
                   MSNAP_EOOM);
  assert_int_equal(h4, 11);
  /* malloc shares the same memory. */
  uint64_t p = 1;
  assert_int_equal(ops->malloc(ctx, 0, 22 * MiB, &p), MSNAP_EOOM);
  assert_int_equal(p, 1);
  /* Overlaps, outside reservations, misaligned. */
  assert_int_equal(ops->vmm_map(ctx, 0, va + 18 * MiB, 2 * MiB, &h4),
                   MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "overlaps"));
  assert_int_equal(ops->vmm_map(ctx, 0, va + 1 * GiB - 2 * MiB, 4 * MiB, &h4),
                   MSNAP_ERUNTIME);
  assert_int_equal(ops->vmm_map(ctx, 0, BASE0, 2 * MiB, &h4), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "not inside a reservation"));
  assert_int_equal(ops->vmm_map(ctx, 0, va + 512, 2 * MiB, &h4), MSNAP_EINVAL);
  assert_int_equal(ops->vmm_reserve(ctx, 0, 3 * MiB, 0, &h4), MSNAP_EINVAL);
  /* A non-power-of-two alignment rounds up: 20 MiB -> 32 MiB. */
  uint64_t va3 = 0;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 2 * MiB, 20 * MiB, &va3), 0);
  assert_int_equal(va3, va + 2 * GiB);
  assert_int_equal(va3 % (32 * MiB), 0);
  assert_int_equal(ops->vmm_reserve(ctx, 0, 2 * MiB, 1 * MiB, &va3), 0);
  assert_int_equal(va3, va + 2 * GiB + 2 * MiB);
  assert_int_equal(ops->vmm_release(ctx, 0, va + 2 * GiB, 2 * MiB), 0);
  assert_int_equal(ops->vmm_release(ctx, 0, va3, 2 * MiB), 0);
  assert_int_equal(h4, 11);
  /* Release refuses while mapped. */
  assert_int_equal(ops->vmm_release(ctx, 0, va, 1 * GiB), MSNAP_ERUNTIME);
  assert_non_null(strstr(msnap_last_error(), "still mapped"));
  assert_int_equal(ops->vmm_release(ctx, 0, va, 2 * GiB), MSNAP_ERUNTIME);
  assert_int_equal(msnap_sim_live_allocations(ctx), 5);
  /* Unmap with a wrong range or handle fails. */
  assert_int_equal(ops->vmm_unmap(ctx, 0, va, 40 * MiB, h1), MSNAP_ERUNTIME);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va, 20 * MiB, 999), MSNAP_ERUNTIME);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va, 20 * MiB, h1), 0);
  CHECK(ctx);
  assert_int_equal(free_bytes(ctx, 0), 40 * MiB);
  /* Remap the hole: new handle. */
  assert_int_equal(ops->vmm_map(ctx, 0, va, 20 * MiB, &h4), 0);
  assert_int_equal(h4, 4);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va, 20 * MiB, h4), 0);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va + 20 * MiB, 20 * MiB, h2), 0);
  assert_int_equal(ops->vmm_unmap(ctx, 0, va2, 40 * MiB, h3), 0);
  assert_int_equal(free_bytes(ctx, 0), 100 * MiB);
  assert_int_equal(ops->vmm_release(ctx, 0, va, 1 * GiB), 0);
  assert_int_equal(ops->vmm_release(ctx, 0, va2, 1 * GiB), 0);
  CHECK(ctx);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  ops->fini(ctx);
}

static void test_host(void **state) {
  (void)state;
  void *ctx = make(1, 1 * GiB);
  uint64_t a, b, c;
  assert_int_equal(ops->host_malloc(ctx, 100, &a), 0);
  assert_int_equal(ops->host_malloc(ctx, 5000, &b), 0);
  assert_int_equal(a, 0x7e0000000000ull);
  assert_int_equal(b, 0x7e0000000000ull + 4 * KiB);
  /* Pinned memory is not device memory. */
  assert_int_equal(free_bytes(ctx, 0), 1 * GiB);
  assert_int_equal(ops->host_free(ctx, a), 0);
  assert_int_equal(ops->host_malloc(ctx, 4096, &c), 0);
  assert_int_equal(c, a);
  assert_int_equal(ops->host_free(ctx, a + 8), MSNAP_ERUNTIME);
  assert_int_equal(ops->host_free(ctx, 0), 0);
  assert_int_equal(msnap_sim_live_allocations(ctx), 2);
  CHECK(ctx);
  assert_int_equal(ops->host_free(ctx, b), 0);
  assert_int_equal(ops->host_free(ctx, c), 0);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  ops->fini(ctx);
}

static void test_next_address(void **state) {
  (void)state;
  void *ctx = make(2, 1 * GiB);
  uint64_t a = xmalloc(ctx, 0, 2 * MiB);
  /* A real NPU-looking address outside the region is fine. */
  msnap_sim_set_next_address(ctx, 0, 0x12c040000000ull);
  assert_int_equal(xmalloc(ctx, 0, 20 * MiB), 0x12c040000000ull);
  /* Only the next malloc is forced. */
  assert_int_equal(xmalloc(ctx, 0, 2 * MiB), a + 2 * MiB);
  /* Overlap: error, the slot is consumed, nothing allocated. */
  msnap_sim_set_next_address(ctx, 0, a + 1 * MiB);
  uint64_t p = 4;
  assert_int_equal(ops->malloc(ctx, 0, 512, &p), MSNAP_EINVAL);
  assert_int_equal(p, 4);
  assert_non_null(strstr(msnap_last_error(), "0x7f0000100000"));
  assert_int_equal(xmalloc(ctx, 0, 512), a + 4 * MiB);
  msnap_sim_set_next_address(ctx, 0, 0x12c040000000ull + 20 * MiB - 512);
  assert_int_equal(ops->malloc(ctx, 0, 1024, &p), MSNAP_EINVAL);
  msnap_sim_set_next_address(ctx, 0, 0x12c040000100ull); /* misaligned */
  assert_int_equal(ops->malloc(ctx, 0, 1024, &p), MSNAP_EINVAL);
  /* Per device: device 1 is unaffected by device 0's forced address. */
  msnap_sim_set_next_address(ctx, 0, 0x200000000000ull);
  assert_int_equal(xmalloc(ctx, 1, 512), BASE0 + SPAN_DEFAULT);
  assert_int_equal(xmalloc(ctx, 0, 512), 0x200000000000ull);
  /* Address 0 cancels an override no malloc used. */
  msnap_sim_set_next_address(ctx, 0, 0x300000000000ull);
  msnap_sim_set_next_address(ctx, 0, 0);
  uint64_t q = xmalloc(ctx, 0, 512);
  assert_true(q >= BASE0 && q < BASE0 + SPAN_DEFAULT);
  xfree(ctx, 0, q);
  /* Free the forced allocation and re-force the same address (replay). */
  xfree(ctx, 0, 0x12c040000000ull);
  msnap_sim_set_next_address(ctx, 0, 0x12c040000000ull);
  assert_int_equal(xmalloc(ctx, 0, 20 * MiB), 0x12c040000000ull);
  ops->fini(ctx);
}

static void test_oom_at_capacity(void **state) {
  (void)state;
  void *ctx = make(1, 1 * GiB);
  uint64_t a = xmalloc(ctx, 0, 1 * GiB - 2 * MiB);
  uint64_t b = xmalloc(ctx, 0, 2 * MiB);
  assert_int_equal(free_bytes(ctx, 0), 0);
  uint64_t p = 3;
  assert_int_equal(ops->malloc(ctx, 0, 512, &p), MSNAP_EOOM);
  assert_int_equal(p, 3);
  assert_non_null(strstr(msnap_last_error(), "device 0 out of memory"));
  assert_non_null(strstr(msnap_last_error(), "1073741824"));
  xfree(ctx, 0, b);
  assert_int_equal(ops->malloc(ctx, 0, 2 * MiB + 512, &p), MSNAP_EOOM);
  assert_int_equal(xmalloc(ctx, 0, 2 * MiB), b);
  xfree(ctx, 0, a);
  xfree(ctx, 0, b);
  /* More than total at once. */
  assert_int_equal(ops->malloc(ctx, 0, 2 * GiB, &p), MSNAP_EOOM);
  assert_int_equal(free_bytes(ctx, 0), 1 * GiB);
  ops->fini(ctx);
}

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static void test_no_host_ram(void **state) {
  (void)state;
  void *ctx = make(1, 64 * GiB);
  long before = max_rss_kib();
  /* One 60 GiB allocation... */
  uint64_t big = xmalloc(ctx, 0, 60 * GiB);
  assert_int_equal(big, BASE0);
  assert_int_equal(free_bytes(ctx, 0), 4 * GiB);
  xfree(ctx, 0, big);
  /* ...and 60 GiB as 3072 segments of 20 MiB. */
  enum { N = 3072 };
  static uint64_t segs[N];
  for (int i = 0; i < N; i++) {
    assert_int_equal(ops->malloc(ctx, 0, 20 * MiB, &segs[i]), 0);
    assert_int_equal(segs[i], BASE0 + (uint64_t)i * 20 * MiB);
  }
  CHECK(ctx);
  assert_int_equal(free_bytes(ctx, 0), 4 * GiB);
  assert_int_equal(msnap_sim_live_allocations(ctx), N);
  /* Host RSS grew by far less than one simulated segment. */
  assert_true(max_rss_kib() - before < 16 * 1024);
  for (int i = 0; i < N; i++) assert_int_equal(ops->free(ctx, 0, segs[i]), 0);
  CHECK(ctx);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  ops->fini(ctx);
}

/* Host-backed: device, mapped and pinned addresses are real memory; freed
 * ranges fault again; no RAM is used until pages are touched. */
static void *make_hb(int devices, uint64_t memory) {
  void *ctx = NULL;
  assert_int_equal(msnap__sim_create_ex(devices, memory, true, &ctx), 0);
  assert_true(msnap_sim_host_backed(ctx));
  CHECK(ctx);
  return ctx;
}

/* The permissions of the mapping holding p in /proc/self/maps ("rw-p",
 * "---p"), "" when unmapped: what a touch would do, without faulting
 * (sanitizers and qemu-user report the real maps too). */
static const char *perms_of(uint64_t p) {
  static char perms[8];
  perms[0] = '\0';
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return perms;
  char line[512];
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long long lo, hi;
    char pr[8];
    if (sscanf(line, "%llx-%llx %7s", &lo, &hi, pr) == 3 && p >= lo &&
        p < hi) {
      snprintf(perms, sizeof perms, "%s", pr);
      break;
    }
  }
  fclose(f);
  return perms;
}

static void test_host_backed(void **state) {
  (void)state;
  void *plain = make(1, GiB);
  assert_false(msnap_sim_host_backed(plain));
  ops->fini(plain);
  /* 8 GiB devices: 512 GiB of address space each (sanitizer and qemu
   * runs have room for it). */
  void *ctx = make_hb(2, 8 * GiB);
  long page = sysconf(_SC_PAGESIZE);
  long before = max_rss_kib();
  /* 6 GiB on device 0 costs nothing until touched. */
  uint64_t big = xmalloc(ctx, 0, 6 * GiB);
  assert_true(max_rss_kib() - before < 16 * 1024);
  unsigned char *b = (unsigned char *)(uintptr_t)big;
  b[0] = 0x5a;
  b[6 * GiB - 1] = 0xa5;
  assert_int_equal(b[0] + b[6 * GiB - 1], 0xff);
  xfree(ctx, 0, big);
  /* Small requests are page-aligned and do not share pages. */
  uint64_t p1 = xmalloc(ctx, 1, 1000), p2 = xmalloc(ctx, 1, 1000);
  assert_int_equal(p1 % (uint64_t)page, 0);
  assert_true(p2 >= p1 + (uint64_t)page);
  unsigned char *c1 = (unsigned char *)(uintptr_t)p1;
  for (int i = 0; i < 1000; i++) assert_int_equal(c1[i], 0);
  memset(c1, 7, 1000);
  memset((void *)(uintptr_t)p2, 9, 1000);
  assert_int_equal(c1[999], 7);
  assert_string_equal(perms_of(p1), "rw-p");
  xfree(ctx, 1, p1);
  assert_string_equal(perms_of(p1), "---p"); /* a touch faults */
  assert_int_equal(((unsigned char *)(uintptr_t)p2)[0], 9);
  /* A freed range that is handed out again reads zeros. */
  uint64_t p3 = xmalloc(ctx, 1, 1000);
  assert_int_equal(p3, p1);
  assert_int_equal(((unsigned char *)(uintptr_t)p3)[0], 0);
  xfree(ctx, 1, p2);
  xfree(ctx, 1, p3);
  /* VMM: a mapping is writable, unmapping makes it fault. */
  uint64_t va = 0, h = 0;
  assert_int_equal(ops->vmm_reserve(ctx, 0, 8 * MiB, 0, &va), 0);
  assert_int_equal(ops->vmm_map(ctx, 0, va + 2 * MiB, 2 * MiB, &h), 0);
  CHECK(ctx);
  memset((void *)(uintptr_t)(va + 2 * MiB), 3, 2 * MiB);
  assert_string_equal(perms_of(va + 2 * MiB), "rw-p");
  assert_int_equal(ops->vmm_unmap(ctx, 0, va + 2 * MiB, 2 * MiB, h), 0);
  assert_string_equal(perms_of(va + 2 * MiB), "---p");
  assert_int_equal(ops->vmm_release(ctx, 0, va, 8 * MiB), 0);
  /* Pinned host memory too. */
  uint64_t hp = 0;
  assert_int_equal(ops->host_malloc(ctx, 100, &hp), 0);
  memset((void *)(uintptr_t)hp, 1, 100);
  assert_int_equal(ops->host_free(ctx, hp), 0);
  /* Forced placement must stay inside the reservation. */
  msnap_sim_set_next_address(ctx, 0, BASE0);
  uint64_t bad = 0;
  assert_int_equal(ops->malloc(ctx, 0, 4096, &bad), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "host-backed"));
  CHECK(ctx);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  ops->fini(ctx);
  /* The environment switch. */
  setenv("MEMSNAP_SIM_HOST_BACKED", "1", 1);
  setenv("MEMSNAP_SIM_MEMORY", "1G", 1);
  assert_int_equal(ops->init(&ctx), 0);
  assert_true(msnap_sim_host_backed(ctx));
  ops->fini(ctx);
  setenv("MEMSNAP_SIM_HOST_BACKED", "yes", 1); /* warns once, default off */
  assert_int_equal(ops->init(&ctx), 0);
  assert_false(msnap_sim_host_backed(ctx));
  ops->fini(ctx);
  unsetenv("MEMSNAP_SIM_HOST_BACKED");
  unsetenv("MEMSNAP_SIM_MEMORY");
}

/* Under an address-space limit (ulimit -v, RLIMIT_AS) the host-backed
 * reservations shrink (the pinned-host region, then each device's span)
 * instead of failing, allocations up to the device's memory still work;
 * where even the smallest do not fit, the error names the limit.  Runs in
 * a child (the limit stays with the process); skipped under an emulator
 * (MEMSNAP_EXE_WRAPPER: the limit would bind qemu-user itself), where the
 * limit is not enforced, and under the sanitizers (their shadow memory is
 * address space too). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SIM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SIM_TEST_SANITIZED 1
#endif
#endif

#define CHILD_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond);              \
      _exit(1);                                                               \
    }                                                                         \
  } while (0)

static void as_limit_child(void) {
  /* the process's address space now, plus 40 GiB */
  unsigned long long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  CHILD_CHECK(f != NULL && fscanf(f, "%llu", &pages) == 1);
  fclose(f);
  uint64_t limit = pages * (uint64_t)sysconf(_SC_PAGESIZE) + 48 * GiB;
  struct rlimit rl = {limit, limit};
  CHILD_CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
  void *probe = mmap(NULL, 64 * GiB, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (probe != MAP_FAILED) _exit(77); /* not enforced here */
  /* 2 devices of 2 GiB: 2 x 128 GiB + 1 TiB by default; 2 x 16 GiB
   * (8x) and 1 GiB fit, and leave the process an eighth of the limit */
  void *ctx = NULL;
  CHILD_CHECK(msnap__sim_create_ex(2, 2 * GiB, true, &ctx) == 0);
  char msg[256];
  CHILD_CHECK(msnap__sim_check(ctx, msg, sizeof msg) == 0);
  f = fopen("/proc/self/statm", "r");
  CHILD_CHECK(f != NULL && fscanf(f, "%llu", &pages) == 1);
  fclose(f);
  CHILD_CHECK(limit - pages * (uint64_t)sysconf(_SC_PAGESIZE) >= limit / 8);
  for (int d = 0; d < 2; d++) {
    uint64_t a = 0, b = 0;
    CHILD_CHECK(ops->malloc(ctx, d, 1536 * MiB, &a) == 0);
    CHILD_CHECK(ops->malloc(ctx, d, 512 * MiB, &b) == 0); /* all of it */
    unsigned char *p = (unsigned char *)(uintptr_t)a;
    p[0] = 1;
    p[1536 * MiB - 1] = 2;
    CHILD_CHECK(p[0] + p[1536 * MiB - 1] == 3);
    uint64_t c = 0;
    CHILD_CHECK(ops->malloc(ctx, d, 2 * MiB, &c) == MSNAP_EOOM);
    CHILD_CHECK(ops->free(ctx, d, a) == 0);
    CHILD_CHECK(ops->free(ctx, d, b) == 0);
  }
  /* the VMM region past the (now larger) malloc region: room for the
   * expandable segments of both pools of three streams (1.125x the
   * memory each) */
  uint64_t va = 0, h = 0, e[6];
  for (int i = 0; i < 6; i++)
    CHILD_CHECK(ops->vmm_reserve(ctx, 0, 2304 * MiB, 0, &e[i]) == 0);
  for (int i = 0; i < 6; i++)
    CHILD_CHECK(ops->vmm_release(ctx, 0, e[i], 2304 * MiB) == 0);
  CHILD_CHECK(ops->vmm_reserve(ctx, 1, 4 * GiB, 0, &va) == 0);
  CHILD_CHECK(ops->vmm_map(ctx, 1, va, 2 * GiB, &h) == 0);
  memset((void *)(uintptr_t)va, 5, 2 * MiB);
  CHILD_CHECK(ops->vmm_unmap(ctx, 1, va, 2 * GiB, h) == 0);
  CHILD_CHECK(ops->vmm_release(ctx, 1, va, 4 * GiB) == 0);
  uint64_t hp = 0;
  CHILD_CHECK(ops->host_malloc(ctx, 100 * MiB, &hp) == 0);
  memset((void *)(uintptr_t)hp, 1, 100 * MiB);
  CHILD_CHECK(ops->host_free(ctx, hp) == 0);
  /* pinned memory past the cut region says why */
  CHILD_CHECK(ops->host_malloc(ctx, 2 * GiB, &hp) == MSNAP_EOOM);
  CHILD_CHECK(strstr(msnap_last_error(), "ulimit -v") != NULL);
  CHILD_CHECK(msnap__sim_check(ctx, msg, sizeof msg) == 0);
  ops->fini(ctx);
  /* 64 GiB does not fit in 48 GiB at all: the error says why */
  ctx = NULL;
  CHILD_CHECK(msnap__sim_create_ex(1, 64 * GiB, true, &ctx) == MSNAP_EOOM);
  CHILD_CHECK(strstr(msnap_last_error(), "RLIMIT_AS") != NULL);
  CHILD_CHECK(strstr(msnap_last_error(), "MEMSNAP_SIM_MEMORY") != NULL);
  _exit(0);
}

static void test_host_backed_as_limit(void **state) {
  (void)state;
#ifdef SIM_TEST_SANITIZED
  fprintf(stderr, "SKIP test_host_backed_as_limit: sanitizer build\n");
  skip();
#else
  const char *wrap = getenv("MEMSNAP_EXE_WRAPPER");
  if (wrap != NULL && wrap[0] != '\0') {
    /* make test-aarch64 runs this under qemu-user, where the limit would
     * bind the emulator's own mappings (the child died of a signal) */
    fprintf(stderr, "SKIP test_host_backed_as_limit: run through %s, "
                    "which RLIMIT_AS would bind itself\n", wrap);
    skip();
  }
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) as_limit_child();
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    fprintf(stderr, "SKIP test_host_backed_as_limit: RLIMIT_AS is not "
                    "enforced here\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(st), 0);
#endif
}

/* Several threads hammer one context; the mutex keeps it consistent. */
typedef struct worker_s {
  void *ctx;
  int device;
  unsigned seed;
  int failures;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  uint64_t live[32] = {0};
  for (int i = 0; i < 3000; i++) {
    int slot = (int)(rand_r(&w->seed) % 32);
    if (live[slot] != 0) {
      if (ops->free(w->ctx, w->device, live[slot]) != 0) w->failures++;
      live[slot] = 0;
    } else {
      size_t size = 512u << (rand_r(&w->seed) % 14);
      if (ops->malloc(w->ctx, w->device, size, &live[slot]) != 0)
        w->failures++;
    }
    uint64_t ev;
    if (i % 100 == 0) {
      if (ops->event_create(w->ctx, w->device, &ev) != 0 ||
          ops->event_record(w->ctx, w->device, ev, (uint64_t)i) != 0 ||
          ops->event_destroy(w->ctx, w->device, ev) != 0)
        w->failures++;
    }
  }
  for (int k = 0; k < 32; k++)
    if (live[k] != 0 && ops->free(w->ctx, w->device, live[k]) != 0)
      w->failures++;
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  void *ctx = make(2, 4 * GiB);
  enum { T = 4 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){ctx, i % 2, (unsigned)(i + 1) * 7919u, 0};
    assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].failures, 0);
  }
  CHECK(ctx);
  assert_int_equal(msnap_sim_live_allocations(ctx), 0);
  assert_int_equal(free_bytes(ctx, 0), 4 * GiB);
  assert_int_equal(free_bytes(ctx, 1), 4 * GiB);
  ops->fini(ctx);
}

int main(void) {
  ops = msnap_runtime_sim();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_name),
      cmocka_unit_test(test_env_init),
      cmocka_unit_test(test_basics),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_large_memory_span),
      cmocka_unit_test(test_fault_switch),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_vmm),
      cmocka_unit_test(test_host),
      cmocka_unit_test(test_next_address),
      cmocka_unit_test(test_oom_at_capacity),
      cmocka_unit_test(test_no_host_ram),
      cmocka_unit_test(test_host_backed),
      cmocka_unit_test(test_host_backed_as_limit),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
