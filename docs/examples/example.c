/*
 * example.c -- a complete small program against include/memsnap.h and
 * libmemsnap.so (docs/c-api.md walks through it).
 *
 * It creates an allocator on the simulated runtime with the "npu" profile,
 * turns memory history on, allocates and frees, reads the statistics,
 * shows the error conventions (out of memory, a bad pointer, a bad
 * configuration token, an injected runtime fault), attaches an OOM
 * observer and dumps a snapshot that pytorch.org/memory_viz opens.
 *
 *   usage: example SNAPSHOT.pickle
 *
 * Exit status 0 when every step behaved as described, 1 otherwise.  The
 * meson test tests/api runs it and unpickles the file with CPython.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap.h"

#define MiB (1024ull * 1024ull)

static int failures;

/* Report a step; count it as a failure when ok is false. */
static void expect(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

/* Called by the allocator on every device OOM, outside its lock. */
static void on_oom(int device, uint64_t alloc_size, uint64_t device_total,
                   uint64_t device_free, void *arg) {
  int *calls = arg;
  (*calls)++;
  printf("     oom observer: device %d, %llu bytes requested, "
         "%llu total, %llu free\n",
         device, (unsigned long long)alloc_size,
         (unsigned long long)device_total, (unsigned long long)device_free);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SNAPSHOT.pickle\n", argv[0]);
    return 2;
  }

  /* 1. Create: one simulated device of 1 GiB, torch_npu's decisions.
   * Fields left at their msnap_options_init values come from the
   * environment (MEMSNAP_*, PYTORCH_NPU_ALLOC_CONF ...). */
  char conf_err[256] = "";
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.profile = MSNAP_PROFILE_NPU;
  o.sim_devices = 1;
  o.sim_memory = 1024 * MiB;
  o.alloc_conf = "max_split_size_mb:128";
  o.error_buf = conf_err;
  o.error_buf_len = sizeof conf_err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) {
    fprintf(stderr, "create: %s: %s\n", msnap_err_name(rc), conf_err);
    return 1;
  }
  expect(msnap_device_count(a) == 1, "one simulated device");

  /* 2. History: the defaults of _record_memory_history("all"), C stacks
   * only (no interpreter in this program). */
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.stacks = MSNAP_STACKS_CPP;
  h.max_entries = 10000;
  rc = msnap_record_history(a, &h);
  expect(rc == 0 && msnap_history_enabled(a), "history recording on");

  /* 3. Allocate on device 0, default stream 0.  The npu profile pads a
   * request by 32 bytes before rounding to 512: 1000 -> 1536-byte block
   * in a 2 MiB small segment. */
  uint64_t p = 0, q = 0;
  rc = msnap_malloc(a, 0, 1000, 0, &p);
  expect(rc == 0 && p != 0, "malloc 1000 bytes");
  size_t bs = 0;
  msnap_allocation_size(a, p, &bs);
  printf("     block of %zu bytes at 0x%llx\n", bs, (unsigned long long)p);
  expect(bs == 1536, "npu profile: 1000 + 32 pad rounds to 1536");
  rc = msnap_malloc(a, 0, 100 * MiB, 0, &q);
  expect(rc == 0, "malloc 100 MiB");

  /* 4. Statistics: set size and version, then read. */
  msnap_stats_t st = {.size = sizeof st, .version = MSNAP_STATS_VERSION};
  rc = msnap_stats_get(a, 0, &st);
  expect(rc == 0, "stats_get");
  printf("     allocated %lld, reserved %lld, segments %lld\n",
         (long long)st.allocated_bytes[MSNAP_STAT_ALL].current,
         (long long)st.reserved_bytes[MSNAP_STAT_ALL].current,
         (long long)st.segment[MSNAP_STAT_ALL].current);
  expect(st.allocation[MSNAP_STAT_ALL].current == 2, "two live allocations");
  expect(st.reserved_bytes[MSNAP_STAT_SMALL_POOL].current == (int64_t)(2 * MiB),
         "one 2 MiB small segment");

  /* 5. Errors are negative codes; the text is in msnap_last_error(). */
  int oom_calls = 0;
  msnap_attach_oom_observer(a, on_oom, &oom_calls);
  uint64_t big = 0;
  rc = msnap_malloc(a, 0, 2048 * MiB, 0, &big);
  expect(rc == MSNAP_EOOM && big == 0, "2 GiB on a 1 GiB device: MSNAP_EOOM");
  printf("     %s\n", msnap_last_error());
  expect(oom_calls == 1, "the OOM observer ran once");

  rc = msnap_free(a, p + 16);
  expect(rc == MSNAP_EBADPTR, "free of an interior pointer: MSNAP_EBADPTR");
  printf("     %s: %s\n", msnap_err_name(rc), msnap_last_error());

  rc = msnap_set_allocator_settings(a, "max_split_sise_mb:64");
  expect(rc == MSNAP_ECONF, "misspelt alloc-conf key: MSNAP_ECONF");
  printf("     %s\n", msnap_last_error());

  /* 6. Sim controls: make the next device malloc fail with EOOM.  The
   * allocator frees its cache and retries (PyTorch's OOM chain), so the
   * request still succeeds. */
  msnap_sim_fail_nth(msnap_runtime_ctx(a), "malloc", 1);
  uint64_t r = 0;
  rc = msnap_malloc(a, 0, 300 * MiB, 0, &r);
  expect(rc == 0, "an injected device-malloc failure is retried");

  /* 7. Free, then dump a snapshot (temporary file + rename). */
  expect(msnap_free(a, p) == 0 && msnap_free(a, q) == 0 &&
             msnap_free(a, r) == 0,
         "free all");
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  rc = msnap_dump_snapshot(a, &so, argv[1]);
  expect(rc == 0, "dump_snapshot");

  /* 8. The summary table of torch.cuda.memory_summary(). */
  char *summary = NULL;
  if (msnap_memory_summary(a, 0, true, &summary) == 0) {
    fputs(summary, stdout);
    msnap_free_string(summary);
  }

  char msg[256];
  expect(msnap_check_invariants(a, msg, sizeof msg) == 0, "invariants hold");
  msnap_allocator_destroy(a);
  printf("%s\n", failures ? "example: FAILED" : "example: all steps ok");
  return failures ? 1 : 0;
}
