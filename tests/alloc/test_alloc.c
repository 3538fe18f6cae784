/*
 * test_alloc.c -- allocator behaviour beyond the worked examples:
 * memory_summary golden text, unknown pointers, the 1 EB guard, the
 * errors msnap_plugin_malloc leaves in msnap_last_error(), caching
 * disabled, throw_on_*malloc_oom rejections, private pools (routing,
 * use_on_oom, no_split, deferred frees while capturing), snapshot segment
 * collection, resets, multi-device lookup, fault injection at every
 * runtime call site (no leak, invariants hold), and a 4-thread smoke test.
 * Invariants are checked after every operation (talloc.h helpers).
 */
#include <pthread.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "talloc.h"
#include "workload.h"

static void tw_exp_helper(msnap_conf_t *c) { c->expandable_segments = true; }

/* ---- memory_summary ---------------------------------------------------- */

static const char *golden_summary =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 0                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      |   1536 B   |   1536 B   |   1536 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |   1536 B   |   1536 B   |   1536 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         |   1536 B   |   1536 B   |   1536 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |   1536 B   |   1536 B   |   1536 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      |   1001 B   |   1001 B   |   1001 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |   1001 B   |   1001 B   |   1001 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |\n"
    "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |\n"
    "|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory |   2046 KiB |   2047 KiB |   2047 KiB |   1024 B   |\n"
    "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |\n"
    "|       from small pool |   2046 KiB |   2047 KiB |   2047 KiB |   1024 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |       2    |       2    |       2    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       2    |       2    |       2    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |       2    |       2    |       2    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       2    |       2    |       2    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n"
    "|===========================================================================|\n";

static int count_lines(const char *s, size_t width, bool *all_width) {
  int n = 0;
  *all_width = true;
  for (const char *p = s; *p;) {
    const char *e = strchr(p, '\n');
    if (!e)
      break;
    if ((size_t)(e - p) != width)
      *all_width = false;
    n++;
    p = e + 1;
  }
  return n;
}

static void summary_golden(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t pa = M(a, 1), pb = M(a, 1000);
  char *s = NULL;
  assert_int_equal(msnap_memory_summary(a, 0, false, &s), 0);
  assert_string_equal(s, golden_summary);
  free(s);
  assert_int_equal(msnap_memory_summary(a, 0, true, &s), 0);
  bool w;
  /* 6 header lines + 9 x (rule + row) + 2 x (rule + row) + final rule */
  assert_int_equal(count_lines(s, 77, &w), 6 + 18 + 4 + 1);
  assert_true(w);
  assert_non_null(strstr(s, "| Non-releasable memory |   2046 KiB |   2047 KiB "
                            "|   2047 KiB |   1024 B   |\n"));
  free(s);
  F(a, pa);
  F(a, pb);
  done(a);

  /* npu: same 77-column frame, NPU wording, no Requested memory rows. */
  a = mk(NPU, NULL);
  pa = M(a, 3 * MiB);
  assert_int_equal(msnap_memory_summary(a, 0, false, &s), 0);
  assert_int_equal(count_lines(s, 77, &w), 6 + 8 * 4 + 4 + 1);
  assert_true(w);
  assert_non_null(strstr(s, "PyTorch NPU memory summary, device ID 0"));
  assert_non_null(strstr(s, " NPU OOMs: 0"));
  assert_non_null(strstr(
      s, "|                  PyTorch NPU memory summary, device ID 0        "
         "          |\n"));
  assert_non_null(strstr(
      s, "|            NPU OOMs: 0             |        npuMalloc retries: "
         "0          |\n"));
  /* torch_npu's units: "%7d" and "KB" */
  assert_non_null(strstr(s, "| NPU reserved memory   |   20480 KB |"));
  assert_non_null(strstr(s, "| Oversize NPU segments |       0    |"));
  assert_null(strstr(s, "Requested memory"));
  free(s);
  F(a, pa);
  done(a);
}

/* Units switch at 768 KiB of the "all" value; counts at 750000. */
static void summary_units(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t p = M(a, 3 * 1024 * MiB); /* 3 GiB */
  char *s = NULL;
  assert_int_equal(msnap_memory_summary(a, 0, false, &s), 0);
  assert_non_null(strstr(s, "| Allocated memory      |   3072 MiB |"));
  assert_non_null(strstr(s, "|       from small pool |      0 MiB |"));
  free(s);
  F(a, p);
  done(a);
}

/* ---- errors and edge cases --------------------------------------------- */

static void unknown_pointer(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t p = M(a, 4096);
  msnap_stats_t before = S(a);
  assert_int_equal(msnap_free(a, 0x1234), MSNAP_EBADPTR);
  assert_string_equal(msnap_last_error(), "invalid device pointer: 0x1234");
  assert_int_equal(msnap_free(a, p + 512), MSNAP_EBADPTR); /* interior */
  INV(a);
  msnap_stats_t after = S(a);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(msnap_free(a, 0), 0);
  F(a, p);
  assert_int_equal(msnap_free(a, p), MSNAP_EBADPTR); /* double free */
  INV(a);
  assert_int_equal(msnap_record_stream(a, p, 3), MSNAP_EBADPTR);
  size_t sz = 77;
  assert_int_equal(msnap_allocation_size(a, p, &sz), MSNAP_EBADPTR);
  assert_int_equal(sz, 77); /* out-param untouched */
  done(a);
}

/* msnap_erase_stream (torch_npu's eraseStream): a stream use is forgotten,
 * so the free records no event for it; the other uses stay. */
static void erase_stream(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, NULL);
  fake_set_manual_events(true);
  uint64_t p = M(a, 1 << 20);
  assert_int_equal(msnap_record_stream(a, p, 5), 0);
  assert_int_equal(msnap_record_stream(a, p, 6), 0);
  assert_int_equal(msnap_erase_stream(a, p, 5), 0);
  assert_int_equal(msnap_erase_stream(a, p, 9), 0); /* never recorded */
  INV(a);
  uint64_t ev = fake_calls("event_record");
  F(a, p);
  assert_int_equal(fake_calls("event_record"), ev + 1); /* stream 6 only */
  fake_complete_events(6);
  fake_set_manual_events(false);
  assert_int_equal(msnap_erase_stream(a, p, 6), MSNAP_EBADPTR);
  assert_int_equal(msnap_erase_stream(a, 0, 6), 0);
  INV(a);
  done(a);
}

static void guards(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof, NULL);
    uint64_t p = 99;
    assert_int_equal(msnap_malloc(a, 0, 1ull << 60, 0, &p), MSNAP_EOOM);
    assert_int_equal(p, 99);
    assert_string_equal(msnap_last_error(),
                        prof == CUDA ? "CUDA out of memory. Tried to allocate "
                                       "more than 1EB memory."
                                     : "NPU out of memory. Tried to allocate "
                                       "more than 1EB memory.");
    assert_int_equal(S(a).num_ooms, 0);
    assert_int_equal(msnap_malloc(a, 0, 0, 0, &p), 0);
    assert_int_equal(p, 0);
    assert_int_equal(CUR(S(a), allocation, ALL), 0);
    assert_int_equal(msnap_malloc(a, 1, 8, 0, &p), MSNAP_EINVAL);
    assert_int_equal(msnap_malloc(a, -1, 8, 0, &p), MSNAP_EINVAL);
    done(a);
  }
}

/* msnap_plugin_malloc (the process-wide allocator, sim runtime): every
 * NULL it returns leaves its reason in msnap_last_error(), replacing an
 * older error.  First, in a child (before this process creates its
 * default allocator), an allocator that cannot be created. */
static void plugin_malloc_errors(void **state) {
  (void)state;
  assert_false(msnap_default_exists());
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("MEMSNAP_RUNTIME", "no-such-runtime", 1);
    void *p = msnap_plugin_malloc(64, 0, NULL);
    const char *want = "plugin_malloc: allocator could not be created: "
                       "unknown device runtime 'no-such-runtime'";
    _exit(p == NULL && strcmp(msnap_last_error(), want) == 0 ? 0 : 1);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);

  setenv("MEMSNAP_RUNTIME", "sim", 1);
  setenv("MEMSNAP_PROFILE", "cuda", 1);
  setenv("MEMSNAP_SIM_DEVICES", "2", 1);
  setenv("MEMSNAP_SIM_MEMORY", "1G", 1);
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
  unsetenv("OOM_SNAPSHOT_ENABLE");
  msnap_allocator_t *a = msnap_default();
  assert_non_null(a);
  assert_int_equal(msnap_device_count(a), 2);
  /* a bad device, with a stale error of another call before it */
  assert_int_equal(msnap_free(NULL, 1), MSNAP_EINVAL);
  assert_null(msnap_plugin_malloc(64, 2, NULL));
  assert_string_equal(msnap_last_error(),
                      "plugin_malloc: invalid device 2 (0..1)");
  assert_null(msnap_plugin_malloc(64, -1, NULL));
  assert_string_equal(msnap_last_error(),
                      "plugin_malloc: invalid device -1 (0..1)");
  /* size 0 is checked for its device too, as msnap_malloc does */
  assert_null(msnap_plugin_malloc(0, 7, NULL));
  assert_string_equal(msnap_last_error(),
                      "plugin_malloc: invalid device 7 (0..1)");
  assert_null(msnap_plugin_malloc(-5, 0, NULL));
  assert_string_equal(msnap_last_error(),
                      "plugin_malloc: invalid size -5 (must be >= 0)");
  /* msnap_malloc's own errors pass through (the 1 EB guard) */
  assert_null(msnap_plugin_malloc((ssize_t)1 << 61, 1, NULL));
  assert_string_equal(msnap_last_error(),
                      "CUDA out of memory. Tried to allocate more than 1EB "
                      "memory.");
  /* nothing was allocated by the refusals; a valid call works */
  for (int d = 0; d < 2; d++) {
    msnap_stats_t s;
    s.size = sizeof s;
    s.version = MSNAP_STATS_VERSION;
    assert_int_equal(msnap_stats_get(a, d, &s), 0);
    assert_int_equal(CUR(s, allocation, ALL), 0);
    assert_int_equal(s.num_ooms, 0);
  }
  void *p = msnap_plugin_malloc(4096, 1, NULL);
  assert_non_null(p);
  size_t sz = 0;
  assert_int_equal(msnap_allocation_size(a, (uint64_t)(uintptr_t)p, &sz), 0);
  assert_true(sz >= 4096);
  msnap_plugin_free(p, 4096, 1, NULL);
  assert_int_equal(msnap_allocation_size(a, (uint64_t)(uintptr_t)p, &sz),
                   MSNAP_EBADPTR);
}

static void device_oom_message(void **state) {
  (void)state;
  fake_cfg_t cfg = {.total = 100 * MiB};
  msnap_allocator_t *a = mk_cfg(CUDA, NULL, &cfg);
  uint64_t p1 = M(a, 50 * MiB);
  uint64_t p2 = M(a, 4 * MiB); /* 20 MiB segment */
  uint64_t p3 = 0;
  assert_int_equal(msnap_malloc(a, 0, 40 * MiB, 0, &p3), MSNAP_EOOM);
  INV(a);
  assert_string_equal(
      msnap_last_error(),
      "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total "
      "capacity of 100.00 MiB of which 30.00 MiB is free. Of the allocated "
      "memory 54.00 MiB is allocated by PyTorch, and 16.00 MiB is reserved "
      "by PyTorch but unallocated. If reserved but unallocated memory is "
      "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
      "avoid fragmentation.  See documentation for Memory Management  "
      "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-"
      "memory-usage-with-pytorch-cuda-alloc-conf)");
  msnap_stats_t s = S(a);
  assert_int_equal(s.num_ooms, 1);
  assert_int_equal(s.num_alloc_retries, 1);
  assert_int_equal(s.num_sync_all_streams, 1);
  F(a, p1);
  F(a, p2);
  /* Now the retry path frees the cached segments and succeeds. */
  p3 = M(a, 90 * MiB);
  s = S(a);
  assert_int_equal(s.num_alloc_retries, 2);
  assert_int_equal(s.num_device_free, 2);
  F(a, p3);
  done(a);
}

static void caching_disabled(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_options_t o;
    msnap_options_init(&o);
    o.profile = prof;
    o.runtime = fake_rt(NULL);
    o.caching_disabled = 1;
    o.alloc_conf = "";
    msnap_allocator_t *a;
    assert_int_equal(msnap_allocator_create(&o, &a), 0);
    assert_false(msnap_caching_enabled(a));
    uint64_t before = fake_calls("malloc");
    uint64_t p = M(a, 100);
    assert_int_equal(fake_calls("malloc"), before + 1);
    /* no rounding (npu: +32 pad only) */
    assert_int_equal(fake_used(0), prof == NPU ? 132 : 100);
    size_t sz = 0;
    assert_int_equal(msnap_allocation_size(a, p, &sz), 0);
    assert_int_equal(sz, prof == NPU ? 132 : 100);
    R(a, p, 5); /* no-op */
    msnap_stats_t s = S(a);
    assert_int_equal(CUR(s, allocation, ALL), 0);
    assert_int_equal(s.num_device_alloc, 0);
    F(a, p);
    assert_int_equal(fake_used(0), 0);
    EC(a);
    assert_int_equal(S(a).num_sync_all_streams, 1);
    /* Enable at run time; a cached pointer is freed after disabling. */
    assert_int_equal(msnap_set_caching_enabled(a, true), 0);
    uint64_t q = M(a, 100);
    assert_int_equal(CUR(S(a), allocation, ALL), 1);
    assert_int_equal(msnap_set_caching_enabled(a, false), 0);
    uint64_t r = M(a, 100);
    F(a, q);
    assert_int_equal(CUR(S(a), allocation, ALL), 0);
    F(a, r);
    uint64_t leak = M(a, 64); /* destroy frees raw allocations */
    (void)leak;
    done(a);
  }
}

static void tw_reject(msnap_conf_t *c) {
  c->throw_on_malloc_oom = true;
  c->per_process_memory_fraction = 64.0 / 65536.0; /* 64 MiB of 64 GiB */
}

static void rejection(void **state) {
  (void)state;
  for (int prof = 0; prof < 2; prof++) {
    msnap_allocator_t *a = mk(prof, tw_reject);
    uint64_t p1 = M(a, 30 * MiB);
    uint64_t p2 = M(a, 12 * MiB);
    F(a, p2); /* cached; a normal OOM chain would release it */
    uint64_t p3 = 0;
    assert_int_equal(msnap_malloc(a, 0, 30 * MiB, 0, &p3), MSNAP_EREJECTED);
    INV(a);
    msnap_stats_t s = S(a);
    assert_int_equal(s.num_oom_rejections, 1);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_sync_all_streams, 0);
    assert_int_equal(s.num_device_free, 0);
    assert_non_null(strstr(msnap_last_error(), "preemptively rejected"));
    assert_int_equal(msnap_reset_accumulated_stats(a, 0), 0);
    assert_int_equal(S(a).num_oom_rejections, 0);
    F(a, p1);
    done(a);
  }
}

static void resets(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t p = M(a, 5 * MiB), q = M(a, 5 * MiB);
  F(a, p);
  msnap_stats_t s = S(a);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].peak, 10 * MiB);
  assert_int_equal(msnap_reset_peak_stats(a, 0), 0);
  s = S(a);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].peak, 5 * MiB);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].allocated, 10 * MiB);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(msnap_reset_accumulated_stats(a, 0), 0);
  s = S(a);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].allocated, 0);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].freed, 0);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].current, 5 * MiB);
  assert_int_equal(s.num_device_alloc, 0);
  assert_int_equal(s.max_split_size, -1);
  F(a, q);
  s = S(a);
  assert_int_equal(s.allocated_bytes[MSNAP_STAT_ALL].freed, 5 * MiB);
  msnap_stats_t bad;
  bad.size = 8;
  assert_int_equal(msnap_stats_get(a, 0, &bad), MSNAP_EINVAL);
  done(a);
}

static void fraction_api(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  double f = 0;
  assert_int_equal(msnap_get_memory_fraction(a, 0, &f), 0);
  assert_true(f == 1.0);
  assert_int_equal(msnap_set_memory_fraction(a, 0, 1.5), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(),
                      "invalid fraction:1.5. Please set within [0, 1].");
  assert_int_equal(msnap_set_memory_fraction(a, 0, 0.25), 0);
  assert_int_equal(msnap_get_memory_fraction(a, 0, &f), 0);
  assert_true(f == 0.25);
  assert_int_equal(msnap_set_memory_fraction(a, 0, 1.0), 0);
  assert_false(msnap__device(a, 0)->has_allowed);
  size_t fr = 0, tot = 0;
  assert_int_equal(msnap_mem_get_info(a, 0, &fr, &tot), 0);
  assert_int_equal(tot, 64ull << 30);
  done(a);
}


/* OOM message with cached memory in a private pool (P > 0). */
static void oom_message_private_pool(void **state) {
  (void)state;
  fake_cfg_t cfg = {.total = 100 * MiB};
  msnap_allocator_t *a = mk_cfg(CUDA, NULL, &cfg);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, true), 0);
  uint64_t pp = M(a, 30 * MiB);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  F(a, pp); /* cached in the live pool: empty_cache keeps it */
  uint64_t p = M(a, 50 * MiB);
  uint64_t q = 0;
  assert_int_equal(msnap_malloc(a, 0, 40 * MiB, 0, &q), MSNAP_EOOM);
  INV(a);
  assert_string_equal(
      msnap_last_error(),
      "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total "
      "capacity of 100.00 MiB of which 20.00 MiB is free. Of the allocated "
      "memory 80.00 MiB is allocated by PyTorch, with 30.00 MiB allocated in "
      "private pools (e.g., CUDA Graphs), and 0 bytes is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large "
      "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
      "fragmentation.  See documentation for Memory Management  "
      "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-"
      "memory-usage-with-pytorch-cuda-alloc-conf)");
  F(a, p);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  done(a);
}

/* ---- private pools ------------------------------------------------------ */

static void mempools(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(id.first, 0);
  assert_int_equal(id.second, 1);
  int uc = 0;
  assert_int_equal(msnap_mempool_use_count(a, 0, id, &uc), 0);
  assert_int_equal(uc, 1);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 7, false), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 7, false),
                   MSNAP_ESTATE);
  assert_int_equal(msnap_mempool_use_count(a, 0, id, &uc), 0);
  assert_int_equal(uc, 2);
  uint64_t in_pool = M2(a, 4096, 7);
  uint64_t other_stream = M2(a, 4096, 8);
  assert_true(msnap__id_eq(blk(a, in_pool)->pool->owner->id, id));
  assert_null(blk(a, other_stream)->pool->owner);
  /* stats count private pools like the default ones */
  assert_int_equal(CUR(S(a), segment, SMALL_POOL), 2);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), MSNAP_ESTATE);
  uint64_t after = M2(a, 4096, 7);
  assert_null(blk(a, after)->pool->owner);
  /* empty_cache never touches a live private pool */
  assert_int_equal(CUR(S(a), segment, ALL), 3); /* stream 7 is new */
  F(a, in_pool);
  EC(a);
  assert_int_equal(CUR(S(a), segment, ALL), 3);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0); /* 2 -> 1 */
  assert_int_equal(CUR(S(a), segment, ALL), 3);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0); /* 1 -> 0: freed */
  assert_int_equal(CUR(S(a), segment, ALL), 2);
  assert_int_equal(msnap_mempool_use_count(a, 0, id, &uc), 0);
  assert_int_equal(uc, 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), MSNAP_ENOENT);
  F(a, other_stream);
  F(a, after);
  done(a);
}

/* A pool released while it still holds a live block is deleted when the
 * block is freed and the cache emptied. */
static void mempool_release_with_live_block(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(NPU, NULL);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, true), 0);
  uint64_t p = M2(a, 3 * MiB, 42);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_non_null(msnap__device(a, 0)->ppools);
  F(a, p);
  EC(a);
  assert_null(msnap__device(a, 0)->ppools);
  assert_int_equal(nsegs(a), 0);
  done(a);
}

static void use_on_oom_and_no_split(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, true, true, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
  uint64_t p = M(a, 12 * MiB); /* 12 MiB segment; no_split */
  BLK(a, p, 12 * MiB, ST_ALLOC);
  F(a, p);
  uint64_t q = M(a, 2 * MiB); /* no_split: takes the whole 12 MiB block */
  BLK(a, q, 12 * MiB, ST_ALLOC);
  F(a, q);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  /* Default pool under a 16 MiB limit: 12 MiB reserved already, a new
   * 20 MiB segment would exceed it -> the use_on_oom pool's cached block. */
  assert_int_equal(msnap_set_memory_fraction(a, 0, 16.0 / 65536.0), 0);
  uint64_t r = M(a, 5 * MiB);
  assert_int_equal(r, q);
  assert_true(msnap__id_eq(blk(a, r)->pool->owner->id, id));
  assert_int_equal(S(a).num_ooms, 0);
  F(a, r);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0); /* begin's ref */
  assert_int_equal(nsegs(a), 1);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0); /* create's ref */
  assert_int_equal(nsegs(a), 0);
  done(a);
}

/* record_stream + free while a graph capture is on (markCaptureBegin on
 * the stream, allocations routed to the capture's pool): the free is
 * deferred (no event yet), and processed after the capture ends
 * (CCA DeviceCachingAllocator::free, insert_events_deferred_until_no_capture). */
static void deferred_free_during_capture(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  fake_set_manual_events(true);
  uint64_t p = M(a, 4096);
  R(a, p, 9);
  msnap_mempool_id_t id;
  assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
  assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, false), 0);
  assert_int_equal(msnap_mark_capture_begin(a, 0, 0), 0);
  uint64_t ev_before = fake_calls("event_record");
  F(a, p);
  BLK(a, p, 4096, ST_PENDING);
  assert_true(blk(a, p)->deferred);
  assert_int_equal(fake_calls("event_record"), ev_before);
  uint64_t x = M(a, 4096); /* no process_events during capture */
  BLK(a, p, 4096, ST_PENDING);
  assert_int_equal(msnap_mark_capture_end(a, 0, 0), 0);
  assert_int_equal(msnap_mark_capture_end(a, 0, 0), MSNAP_ESTATE);
  assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
  uint64_t y = M(a, 4096); /* inserts the event; not complete yet */
  assert_int_equal(fake_calls("event_record"), ev_before + 1);
  BLK(a, p, 4096, ST_PENDING);
  fake_complete_events(9);
  uint64_t z = M(a, 4096);
  assert_int_equal(z, p); /* freed and reused */
  F(a, x);
  F(a, y);
  F(a, z);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  assert_int_equal(msnap_mempool_release(a, 0, id), 0);
  done(a);
}

/* ---- snapshot collection ------------------------------------------------ */

static void collect_segments(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, tw_exp_helper);
  fake_set_manual_events(true);
  uint64_t p1 = M(a, 5 * MiB), p2 = M(a, 1000);
  R(a, p2, 4);
  F(a, p2); /* pending */
  msnap_snap_t *sn = msnap__snap_new();
  uint64_t act = 0;
  msnap__device_lock(a, 0);
  assert_int_equal(msnap__device_collect_segments_locked(
                       a, 0, (msnap_mempool_id_t){0, 0}, sn, &act),
                   0);
  msnap__device_unlock(a, 0);
  assert_int_equal(sn->nsegments, 2);
  /* sorted by address: the expandable VA is below the small segment */
  const msnap_ssegment_t *s0 = &sn->segments[0], *s1 = &sn->segments[1];
  assert_true(s0->address < s1->address);
  const msnap_ssegment_t *large = s0->is_large ? s0 : s1;
  const msnap_ssegment_t *small = s0->is_large ? s1 : s0;
  assert_true(large->is_expandable);
  assert_int_equal(large->total_size, 20 * MiB); /* mapped range only */
  assert_int_equal(large->allocated_size, 5 * MiB);
  assert_int_equal(large->nblocks, 2);
  assert_int_equal(small->total_size, 2 * MiB);
  assert_int_equal(small->allocated_size, 0);
  assert_int_equal(small->active_size, 1024);
  assert_int_equal(small->requested_size, 1000);
  assert_int_equal(sn->blocks[small->first_block].state,
                   MSNAP_BLOCK_ACTIVE_PENDING_FREE);
  assert_int_equal(sn->blocks[small->first_block + 1].state,
                   MSNAP_BLOCK_INACTIVE);
  assert_int_equal(act, 5 * MiB + 1024);
  msnap__snap_free(sn);
  F(a, p1);
  done(a);
}

/* ---- multi-device ------------------------------------------------------- */

static void two_devices(void **state) {
  (void)state;
  fake_cfg_t cfg = {.devices = 2};
  msnap_allocator_t *a = mk_cfg(CUDA, NULL, &cfg);
  assert_int_equal(msnap_device_count(a), 2);
  uint64_t p0 = 0, p1 = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &p0), 0);
  assert_int_equal(msnap_malloc(a, 1, 4096, 0, &p1), 0);
  assert_int_not_equal(p0, p1);
  int dev = -1;
  uint64_t req = 0;
  assert_int_equal(
      msnap__allocation_info(a, p0, &dev, &req, NULL, NULL, NULL), 0);
  assert_int_equal(dev, 0);
  assert_int_equal(req, 4096);
  uint64_t base = 0, bsz = 0;
  assert_int_equal(msnap__allocation_base(a, p1, &base, &bsz), 0);
  assert_int_equal(base, p1);
  assert_int_equal(bsz, 2 * MiB);
  assert_int_equal(msnap__allocation_base(a, p1 + 512, &base, &bsz),
                   MSNAP_EBADPTR);
  uint64_t p2 = 0; /* second block of device 0's segment */
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &p2), 0);
  assert_int_equal(msnap__allocation_base(a, p2, &base, &bsz), 0);
  assert_int_equal(base, p0);
  assert_int_equal(bsz, 2 * MiB);
  F(a, p2);
  F(a, p1);
  F(a, p0);
  msnap_stats_t s1;
  s1.size = sizeof s1;
  assert_int_equal(msnap_stats_get(a, 1, &s1), 0);
  assert_int_equal(CUR(s1, segment, ALL), 1);
  assert_int_equal(msnap_empty_cache(a, 1), 0);
  assert_int_equal(msnap_stats_get(a, 1, &s1), 0);
  assert_int_equal(CUR(s1, segment, ALL), 0);
  assert_int_equal(CUR(S(a), segment, ALL), 1);
  done(a);
}

/* ---- expandable extras -------------------------------------------------- */

static void expandable_small_and_off(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, tw_exp_helper);
  uint64_t s1 = M(a, 1000), s2 = M(a, 1 * MiB), s3 = M(a, 1 * MiB);
  /* small granule is 2 MiB: 1024 + 1 MiB fit in granule 0, the next
   * 1 MiB needs granule 1 */
  assert_int_equal(CUR(S(a), reserved_bytes, SMALL_POOL), 4 * MiB);
  assert_int_equal(s2, s1 + 1024);
  assert_int_equal(s3, s2 + MiB);
  F(a, s2);
  /* Turn expandable off: cached expandable blocks are skipped. */
  msnap__allocator_conf_mut(a)->expandable_segments = false;
  uint64_t n1 = M(a, 4096);
  assert_false(blk(a, n1)->seg->expandable);
  F(a, n1);
  F(a, s1);
  F(a, s3);
  EC(a);
  assert_int_equal(nsegs(a), 0);
  assert_int_equal(CUR(S(a), reserved_bytes, ALL), 0);
  done(a);
}

static void expandable_oom(void **state) {
  (void)state;
  fake_cfg_t cfg = {.total = 100 * MiB};
  msnap_allocator_t *a = mk_cfg(CUDA, tw_exp_helper, &cfg);
  uint64_t p1 = M(a, 50 * MiB);
  uint64_t p2 = 0;
  assert_int_equal(msnap_malloc(a, 0, 60 * MiB, 0, &p2), MSNAP_EOOM);
  INV(a);
  assert_int_equal(S(a).num_ooms, 1);
  F(a, p1);
  p2 = M(a, 60 * MiB); /* the freed 60 MiB of granules are reused */
  F(a, p2);
  done(a);
}

/* ---- fault injection ---------------------------------------------------- */

static const char *fi_sites[] = {"malloc",      "free",
                                 "event_create", "event_record",
                                 "event_query",  "event_synchronize",
                                 "vmm_reserve",  "vmm_map",
                                 "vmm_unmap",    "vmm_release"};

static void fault_injection(void **state) {
  (void)state;
  uint64_t runs = 0;
  for (size_t si = 0; si < sizeof fi_sites / sizeof fi_sites[0]; si++) {
    for (int exp = 0; exp < 2; exp++) {
      for (int code = 0; code < 2; code++) {
        /* Dry run: how many calls of this site does the workload make? */
        msnap_allocator_t *a = mk(exp ? CUDA : NPU, exp ? tw_exp_helper : NULL);
        fake_set_manual_events(true);
        fi_workload(a, fake_complete_events);
        uint64_t calls = fake_calls(fi_sites[si]);
        done(a);
        /* every site is reached: VMM sites with expandable segments on,
         * device malloc/free with them off, events in both */
        bool vmm = strncmp(fi_sites[si], "vmm", 3) == 0;
        bool dev = strcmp(fi_sites[si], "malloc") == 0 ||
                   strcmp(fi_sites[si], "free") == 0;
        if ((vmm && exp) || (dev && !exp) || (!vmm && !dev))
          if (calls == 0)
            fail_msg("workload never calls %s (exp %d)", fi_sites[si], exp);
        for (uint64_t nth = 1; nth <= calls; nth++) {
          a = mk(exp ? CUDA : NPU, exp ? tw_exp_helper : NULL);
          fake_set_manual_events(true);
          fake_fail_nth(fi_sites[si], nth,
                        code ? MSNAP_EOOM : MSNAP_ERUNTIME);
          fi_workload(a, fake_complete_events);
          runs++;
          fake_fail_nth(NULL, 0, 0);
          EC(a);
          msnap_stats_t s = S(a);
          if (CUR(s, allocation, ALL) != 0 || CUR(s, active, ALL) != 0 ||
              CUR(s, reserved_bytes, ALL) != 0 || fake_used(0) != 0)
            fail_msg("site %s nth %llu exp %d: left allocation %lld "
                     "active %lld reserved %lld used %llu",
                     fi_sites[si], (unsigned long long)nth, exp,
                     (long long)CUR(s, allocation, ALL),
                     (long long)CUR(s, active, ALL),
                     (long long)CUR(s, reserved_bytes, ALL),
                     (unsigned long long)fake_used(0));
          done(a);
        }
      }
    }
  }
  print_message("fault injection: %llu faulted runs\n",
                (unsigned long long)runs);
  assert_true(runs > 200);
}

/* ---- threads ------------------------------------------------------------ */

typedef struct targ_s {
  msnap_allocator_t *a;
  uint64_t stream;
  uint64_t seed;
} targ_t;

static void *thread_main(void *arg) {
  targ_t *t = arg;
  uint64_t live[32] = {0};
  uint64_t x = t->seed;
  for (int i = 0; i < 20000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    int k = (int)(x % 32);
    if (live[k]) {
      if (msnap_free(t->a, live[k]) != 0)
        return (void *)1;
      live[k] = 0;
    } else {
      uint64_t sz = (x >> 8) % 4 == 0 ? ((x >> 16) % (24 * MiB)) + 1
                                      : ((x >> 16) % 100000) + 1;
      if (msnap_malloc(t->a, 0, sz, t->stream, &live[k]) != 0)
        return (void *)2;
    }
    if (i % 5000 == 0 && t->stream == 1)
      msnap_empty_cache(t->a, -1);
  }
  for (int k = 0; k < 32; k++)
    if (live[k] && msnap_free(t->a, live[k]) != 0)
      return (void *)3;
  return NULL;
}

static void threads_smoke(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  pthread_t th[4];
  targ_t args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (targ_t){a, (uint64_t)i + 1, 0x1234567ull * (uint64_t)(i + 1)};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    assert_null(r);
  }
  INV(a);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, allocation, ALL), 0);
  assert_int_equal(CUR(s, active_bytes, ALL), 0);
  assert_int_equal(s.allocation[MSNAP_STAT_ALL].allocated,
                   s.allocation[MSNAP_STAT_ALL].freed);
  EC(a);
  assert_int_equal(nsegs(a), 0);
  done(a);
}


/* ---- randomized operations (fixed seeds), invariants after each -------- */

static void tw_rand_mss(msnap_conf_t *c) {
  c->max_split_size = 40 * MiB;
  c->max_non_split_rounding_size = 20 * MiB;
}
static void tw_rand_gc(msnap_conf_t *c) {
  c->garbage_collection_threshold = 0.6;
  c->roundup_power2_divisions[0] = 4;
  for (int i = 1; i < MSNAP_ROUNDUP_INTERVALS; i++)
    c->roundup_power2_divisions[i] = 8;
}
static void tw_rand_exp_npu(msnap_conf_t *c) {
  c->expandable_segments = true;
  c->multi_stream_lazy_reclaim = true;
}

static void randomized(void **state) {
  (void)state;
  struct {
    msnap_profile_t prof;
    tweak_fn tw;
    uint64_t allowed_mib;
  } cfgs[] = {
      {CUDA, NULL, 0},          {NPU, NULL, 512},
      {CUDA, tw_rand_mss, 400}, {NPU, tw_rand_gc, 300},
      {CUDA, tw_exp_helper, 0}, {NPU, tw_rand_exp_npu, 600},
  };
  for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
    msnap_allocator_t *a = mk(cfgs[ci].prof, cfgs[ci].tw);
    if (cfgs[ci].allowed_mib)
      assert_int_equal(msnap_set_memory_fraction(
                           a, 0, (double)cfgs[ci].allowed_mib / 65536.0),
                       0);
    fake_set_manual_events(true);
    uint64_t x = 0x243f6a8885a308d3ull + ci;
    uint64_t live[64] = {0};
    msnap_mempool_id_t pool;
    assert_int_equal(msnap_mempool_create(a, 0, ci % 2 == 0, ci % 3 == 0,
                                          &pool),
                     0);
    bool routing = false;
    int ooms = 0, mallocs = 0;
    for (int step = 0; step < 6000; step++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      int k = (int)(x % 64);
      int op = (int)((x >> 8) % 100);
      if (op < 55) {
        if (live[k]) {
          F(a, live[k]);
          live[k] = 0;
        } else {
          uint64_t sz = (x >> 16) % 4 == 0 ? ((x >> 20) % (48 * MiB)) + 1
                                           : ((x >> 20) % 1500000) + 1;
          uint64_t p = 0;
          int rc = msnap_malloc(a, 0, sz, (x >> 40) % 3, &p);
          INV(a);
          mallocs++;
          if (rc == 0) {
            live[k] = p;
          } else {
            assert_int_equal(rc, MSNAP_EOOM);
            ooms++;
          }
        }
      } else if (op < 70) {
        if (live[k])
          R(a, live[k], 3 + (x >> 30) % 2);
      } else if (op < 75) {
        fake_complete_events(3 + (x >> 30) % 2);
      } else if (op < 78) {
        EC(a);
      } else if (op < 82) {
        if (!routing)
          assert_int_equal(
              msnap_begin_allocate_to_pool(a, 0, pool, (x >> 33) % 3, false),
              0);
        else {
          /* as use_mem_pool: end, then drop begin's reference */
          assert_int_equal(msnap_end_allocate_to_pool(a, 0, pool), 0);
          assert_int_equal(msnap_mempool_release(a, 0, pool), 0);
        }
        routing = !routing;
        INV(a);
      } else if (op < 84) {
        msnap__allocator_conf_mut(a)->expandable_segments ^=
            cfgs[ci].tw == tw_exp_helper;
        INV(a);
      }
    }
    if (routing) {
      assert_int_equal(msnap_end_allocate_to_pool(a, 0, pool), 0);
      assert_int_equal(msnap_mempool_release(a, 0, pool), 0);
    }
    for (int k = 0; k < 64; k++)
      if (live[k])
        F(a, live[k]);
    assert_int_equal(msnap_mempool_release(a, 0, pool), 0);
    EC(a);
    msnap_stats_t s = S(a);
    print_message("randomized config %zu: %d mallocs, %d OOMs, %lld "
                  "segments allocated, %lld retries\n",
                  ci, mallocs, ooms, (long long)s.num_device_alloc,
                  (long long)s.num_alloc_retries);
    assert_int_equal(CUR(s, allocation, ALL), 0);
    assert_int_equal(CUR(s, active, ALL), 0);
    assert_int_equal(CUR(s, reserved_bytes, ALL), 0);
    assert_int_equal(nsegs(a), 0);
    done(a);
  }
}

/* A runtime whose device mallocs are 512 bytes past a 2 MiB boundary
 * (the fake's pointers, shifted), to reach torch_npu's base-address
 * alignment on an unsplit non-expandable block. */
static const msnap_runtime_ops_t *g_fake_ops;
static int off_malloc(void *ctx, int device, size_t size, uint64_t *ptr) {
  int rc = g_fake_ops->malloc(ctx, device, size, ptr);
  if (rc == 0)
    *ptr += 512;
  return rc;
}
static int off_free(void *ctx, int device, uint64_t ptr) {
  return g_fake_ops->free(ctx, device, ptr - 512);
}

/* npu: an unsplit free 20 MiB segment starting 512 bytes past a 16 KiB
 * boundary, then expandable_segments switched on at run time.  The next
 * 5 MiB request splits a 15872-byte head off (base_addr_aligned_kb:16) and
 * then the remainder: both are free split blocks of a non-expandable
 * segment, counted in inactive_split (fuzz find, see test_alloc_sim). */
static void expandable_switch_unsplit_head(void **state) {
  (void)state;
  g_fake_ops = fake_rt(NULL);
  static msnap_runtime_ops_t ops;
  ops = *g_fake_ops;
  ops.malloc = off_malloc;
  ops.free = off_free;
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = (int)NPU;
  o.runtime = &ops;
  o.caching_disabled = 0;
  o.alloc_conf = "";
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  uint64_t p = M(a, 5 * MiB);
  assert_int_equal(p % (2 * MiB), 512);
  F(a, p);
  BLK(a, p, 20 * MiB, ST_FREE);
  assert_int_equal(CUR(S(a), inactive_split, ALL), 0);
  assert_int_equal(msnap_set_allocator_settings(a, "expandable_segments:True"),
                   0);
  INV(a);
  uint64_t q = M(a, 5 * MiB); /* 5 MiB + 32 -> 5243392 */
  assert_int_equal(q, p + 15872);
  BLK(a, p, 15872, ST_FREE);
  BLK(a, q, 5243392, ST_ALLOC);
  BLK(a, q + 5243392, 20 * MiB - 15872 - 5243392, ST_FREE);
  msnap_stats_t s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 2);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 20 * MiB - 5243392);
  F(a, q);
  s = S(a);
  assert_int_equal(CUR(s, inactive_split, ALL), 0);
  assert_int_equal(CUR(s, inactive_split_bytes, ALL), 0);
  EC(a);
  done(a);
}

/* reserved_bytes_by_private_pools (torch 2.13, cuda-reference §5.10): a
 * pool's entry appears with its first reserved byte, follows its segments
 * (cudaMalloc'ed or mapped), stays after the pool is deleted (current 0,
 * peak/allocated/freed kept) until the resets bring it to zeros. */
static msnap_pool_stats_t pool_stat(msnap_allocator_t *a, size_t want_n,
                                    size_t i) {
  msnap_pool_stats_t v[4];
  size_t n = 99;
  assert_int_equal(msnap_pool_stats_get(a, 0, NULL, 0, &n), 0);
  assert_int_equal(n, want_n);
  assert_int_equal(msnap_pool_stats_get(a, 0, v, 4, &n), 0);
  assert_int_equal(n, want_n);
  if (i >= n) {
    msnap_pool_stats_t z;
    memset(&z, 0, sizeof z);
    return z;
  }
  return v[i];
}

static void set_expandable(msnap_conf_t *c) { c->expandable_segments = true; }

static void private_pool_reserved_stats(void **state) {
  (void)state;
  for (int exp = 0; exp < 2; exp++) {
    msnap_allocator_t *a = mk(CUDA, exp ? set_expandable : NULL);
    msnap_mempool_id_t id, unused;
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &id), 0);
    assert_int_equal(msnap_mempool_create(a, 0, false, false, &unused), 0);
    pool_stat(a, 0, 0);
    assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, true), 0);
    uint64_t big = M(a, 5 * MiB);    /* 20 MiB segment / granule */
    uint64_t small = M(a, 1000);     /* 2 MiB small segment       */
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0); /* begin's ref */
    uint64_t dflt = M(a, 5 * MiB);   /* default pool: not counted */
    msnap_pool_stats_t ps = pool_stat(a, 1, 0);
    assert_true(msnap__id_eq(ps.id, id));
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].current, 22 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_LARGE_POOL].current,
                     20 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_SMALL_POOL].current,
                     2 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].peak, 22 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].allocated, 22 * MiB);
    assert_int_equal(CUR(S(a), reserved_bytes, ALL), 42 * MiB);

    /* The pool dies: its segments go, the entry stays with current 0. */
    F(a, big);
    F(a, small);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    INV(a);
    ps = pool_stat(a, 1, 0);
    assert_true(msnap__id_eq(ps.id, id));
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].current, 0);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].peak, 22 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].allocated, 22 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].freed, 22 * MiB);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_SMALL_POOL].freed, 2 * MiB);
    assert_int_equal(CUR(S(a), reserved_bytes, ALL), 20 * MiB);

    /* Resets: peak first (still listed), then the totals (gone). */
    assert_int_equal(msnap_reset_peak_stats(a, 0), 0);
    ps = pool_stat(a, 1, 0);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].peak, 0);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].freed, 22 * MiB);
    assert_int_equal(msnap_reset_accumulated_stats(a, 0), 0);
    pool_stat(a, 0, 0);

    /* The same id again (graph pools reuse ids by value): a new pool. */
    assert_int_equal(msnap_begin_allocate_to_pool(a, 0, id, 0, true), 0);
    uint64_t again = M(a, 1000);
    assert_int_equal(msnap_end_allocate_to_pool(a, 0, id), 0);
    ps = pool_stat(a, 1, 0);
    assert_true(msnap__id_eq(ps.id, id));
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].current, 2 * MiB);
    F(a, again);
    assert_int_equal(msnap_mempool_release(a, 0, id), 0);
    ps = pool_stat(a, 1, 0);
    assert_int_equal(ps.reserved_bytes[MSNAP_STAT_ALL].current, 0);
    assert_int_equal(msnap_mempool_release(a, 0, unused), 0);
    F(a, dflt);
    EC(a);
    done(a);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(summary_golden),
      cmocka_unit_test(summary_units),
      cmocka_unit_test(unknown_pointer),
      cmocka_unit_test(guards),
      cmocka_unit_test(plugin_malloc_errors),
      cmocka_unit_test(device_oom_message),
      cmocka_unit_test(oom_message_private_pool),
      cmocka_unit_test(caching_disabled),
      cmocka_unit_test(rejection),
      cmocka_unit_test(resets),
      cmocka_unit_test(fraction_api),
      cmocka_unit_test(mempools),
      cmocka_unit_test(mempool_release_with_live_block),
      cmocka_unit_test(private_pool_reserved_stats),
      cmocka_unit_test(use_on_oom_and_no_split),
      cmocka_unit_test(deferred_free_during_capture),
      cmocka_unit_test(collect_segments),
      cmocka_unit_test(two_devices),
      cmocka_unit_test(expandable_small_and_off),
      cmocka_unit_test(expandable_oom),
      cmocka_unit_test(expandable_switch_unsplit_head),
      cmocka_unit_test(fault_injection),
      cmocka_unit_test(threads_smoke),
      cmocka_unit_test(randomized),
      cmocka_unit_test(erase_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
