/*
 * fault_sweep.c -- fault injection sweep over every runtime call site and
 * the file calls of a dump.
 *
 * Runtime sites: the allocator runs on a counting wrapper around the sim
 * runtime's ops table (the ctx is the sim's own, so msnap_sim_* work).  A
 * fault-free run of a realistic workload (mixed sizes on three streams,
 * record_stream with manual events, an OOM-retry, empty_cache, history on
 * and a snapshot dump) counts the calls of each site; then, for each site
 * (device malloc/free, event create/record/query/destroy/synchronize, VMM
 * reserve/map/unmap/release) and each configuration (plain and
 * expandable_segments), the workload runs again with msnap_sim_fail_nth
 * armed to fail the middle call of that site once.  Checked every time:
 *   - the failure really happened (the wrapper sees the injected error)
 *     and is printed with the API call that met it and what the caller
 *     got: recovery (e.g. free cache and retry) or a clear error
 *     (MSNAP_EOOM / MSNAP_ERUNTIME with a non-empty message);
 *   - msnap_check_invariants passes after every API call;
 *   - after freeing everything and emptying the cache nothing is allocated
 *     or reserved, and the device is all free;
 *   - after msnap_allocator_destroy the runtime holds nothing
 *     (msnap_sim_live_allocations == 0: no leaked memory, mapping,
 *     reservation or event).
 *
 * Dump sites: the test binary interposes write(2), fsync(2), rename(2)
 * and renameat(2) (the core is linked statically into it, so its calls
 * bind here; no hook in src/).  Each is failed in turn during msnap_dump_snapshot (ENOSPC,
 * EIO, and a short write followed by ENOSPC), and the dump must return
 * MSNAP_ENOSPC / MSNAP_EIO, leave the target absent -- or, when a previous
 * dump existed, byte-for-byte intact -- and leave no temporary file.  A
 * real ENOSPC comes from a 256 KiB tmpfs mounted in a private mount
 * namespace (root only; said loudly when not possible), and a real EFBIG
 * from RLIMIT_FSIZE.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "runtime/runtime.h"

/* ---- counting wrapper around the sim runtime ---------------------------- */

enum {
  S_MALLOC, S_FREE, S_EVENT_CREATE, S_EVENT_DESTROY, S_EVENT_RECORD,
  S_EVENT_QUERY, S_EVENT_SYNC, S_DEVICE_SYNC, S_VMM_RESERVE, S_VMM_RELEASE,
  S_VMM_MAP, S_VMM_UNMAP, S_COUNT
};
static const char *const site_names[S_COUNT] = {
    "malloc", "free", "event_create", "event_destroy", "event_record",
    "event_query", "event_synchronize", "device_synchronize", "vmm_reserve",
    "vmm_release", "vmm_map", "vmm_unmap"};

static uint64_t calls[S_COUNT];
static uint64_t injected[S_COUNT];
static const char *cur_api = "(none)"; /* API call in progress */
static const char *injected_api = NULL;
static uint64_t live_at_fini = UINT64_MAX;
static const msnap_runtime_ops_t *sim;

/* Count a call and notice an injected failure. */
static int seen(int site, int rc) {
  calls[site]++;
  if (rc != 0 && strstr(msnap_last_error(), "msnap_sim_fail_nth") != NULL) {
    injected[site]++;
    injected_api = cur_api;
  }
  return rc;
}

static int w_init(void **ctx) { return sim->init(ctx); }
static void w_fini(void *ctx) {
  live_at_fini = msnap_sim_live_allocations(ctx);
  sim->fini(ctx);
}
static int w_device_count(void *ctx, int *count) {
  return sim->device_count(ctx, count);
}
static int w_malloc(void *ctx, int device, size_t size, uint64_t *ptr) {
  return seen(S_MALLOC, sim->malloc(ctx, device, size, ptr));
}
static int w_free(void *ctx, int device, uint64_t ptr) {
  return seen(S_FREE, sim->free(ctx, device, ptr));
}
static int w_mem_get_info(void *ctx, int device, size_t *f, size_t *t) {
  return sim->mem_get_info(ctx, device, f, t);
}
static int w_event_create(void *ctx, int device, uint64_t *ev) {
  return seen(S_EVENT_CREATE, sim->event_create(ctx, device, ev));
}
static int w_event_destroy(void *ctx, int device, uint64_t ev) {
  return seen(S_EVENT_DESTROY, sim->event_destroy(ctx, device, ev));
}
static int w_event_record(void *ctx, int device, uint64_t ev, uint64_t st) {
  return seen(S_EVENT_RECORD, sim->event_record(ctx, device, ev, st));
}
static int w_event_query(void *ctx, int device, uint64_t ev, bool *done) {
  return seen(S_EVENT_QUERY, sim->event_query(ctx, device, ev, done));
}
static int w_event_sync(void *ctx, int device, uint64_t ev) {
  return seen(S_EVENT_SYNC, sim->event_synchronize(ctx, device, ev));
}
static int w_device_sync(void *ctx, int device) {
  return seen(S_DEVICE_SYNC, sim->device_synchronize(ctx, device));
}
static int w_vmm_reserve(void *ctx, int device, size_t size, size_t align,
                         uint64_t *va) {
  return seen(S_VMM_RESERVE, sim->vmm_reserve(ctx, device, size, align, va));
}
static int w_vmm_release(void *ctx, int device, uint64_t va, size_t size) {
  return seen(S_VMM_RELEASE, sim->vmm_release(ctx, device, va, size));
}
static int w_vmm_map(void *ctx, int device, uint64_t va, size_t size,
                     uint64_t *handle) {
  return seen(S_VMM_MAP, sim->vmm_map(ctx, device, va, size, handle));
}
static int w_vmm_unmap(void *ctx, int device, uint64_t va, size_t size,
                       uint64_t handle) {
  return seen(S_VMM_UNMAP, sim->vmm_unmap(ctx, device, va, size, handle));
}
static int w_host_malloc(void *ctx, size_t size, uint64_t *ptr) {
  return sim->host_malloc(ctx, size, ptr);
}
static int w_host_free(void *ctx, uint64_t ptr) {
  return sim->host_free(ctx, ptr);
}

static const msnap_runtime_ops_t counting_ops = {
    .name = "sim",
    .init = w_init,
    .fini = w_fini,
    .device_count = w_device_count,
    .malloc = w_malloc,
    .free = w_free,
    .mem_get_info = w_mem_get_info,
    .event_create = w_event_create,
    .event_destroy = w_event_destroy,
    .event_record = w_event_record,
    .event_query = w_event_query,
    .event_synchronize = w_event_sync,
    .device_synchronize = w_device_sync,
    .vmm_reserve = w_vmm_reserve,
    .vmm_release = w_vmm_release,
    .vmm_map = w_vmm_map,
    .vmm_unmap = w_vmm_unmap,
    .host_malloc = w_host_malloc,
    .host_free = w_host_free,
};

/* ---- interposed file calls (dump faults) -------------------------------- */

typedef enum { F_NONE, F_WRITE, F_SHORT_WRITE, F_FSYNC, F_RENAME } ffault_t;
static ffault_t file_fault = F_NONE;
static int file_errno = ENOSPC;
static int file_fault_hits;

ssize_t write(int fd, const void *buf, size_t n);
int fsync(int fd);
int rename(const char *from, const char *to);
int renameat(int fromfd, const char *from, int tofd, const char *to);

/* Only descriptors >= 3 (never our own stdout/stderr) are failed. */
ssize_t write(int fd, const void *buf, size_t n) {
  static ssize_t (*real)(int, const void *, size_t);
  if (real == NULL)
    real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  if (fd > 2 && file_fault == F_WRITE) {
    file_fault_hits++;
    errno = file_errno;
    return -1;
  }
  if (fd > 2 && file_fault == F_SHORT_WRITE) {
    /* First a short write of half the bytes, then the error. */
    file_fault_hits++;
    if (file_fault_hits == 1 && n > 1)
      return real(fd, buf, n / 2);
    errno = file_errno;
    return -1;
  }
  return real(fd, buf, n);
}

int fsync(int fd) {
  static int (*real)(int);
  if (real == NULL)
    real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  if (file_fault == F_FSYNC) {
    file_fault_hits++;
    errno = file_errno;
    return -1;
  }
  return real(fd);
}

int rename(const char *from, const char *to) {
  static int (*real)(const char *, const char *);
  if (real == NULL)
    real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
  if (file_fault == F_RENAME) {
    file_fault_hits++;
    errno = file_errno;
    return -1;
  }
  return real(from, to);
}

/* The atomic file renames on its directory's descriptor (base/sink.c). */
int renameat(int fromfd, const char *from, int tofd, const char *to) {
  static int (*real)(int, const char *, int, const char *);
  if (real == NULL)
    real = (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT,
                                                               "renameat");
  if (file_fault == F_RENAME) {
    file_fault_hits++;
    errno = file_errno;
    return -1;
  }
  return real(fromfd, from, tofd, to);
}

/* The sim runtime takes its device count and size from MEMSNAP_SIM_DEVICES
 * and MEMSNAP_SIM_MEMORY (it does not see msnap_options_t.sim_*), so set
 * both as well (0 leaves a variable alone). */
static void sim_env(int devices, uint64_t memory) {
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

/* ---- helpers ------------------------------------------------------------ */

static msnap_allocator_t *make_allocator(const char *conf, uint64_t memory) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime = &counting_ops;
  o.profile = MSNAP_PROFILE_CUDA;
  o.alloc_conf = conf;
  o.caching_disabled = 0;
  o.sim_devices = 1;
  o.sim_memory = memory;
  sim_env(o.sim_devices, o.sim_memory);
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0)
    fail_msg("allocator_create(\"%s\"): %s: %s", conf, msnap_err_name(rc),
             err);
  return a;
}

static void check_inv(msnap_allocator_t *a, const char *after) {
  char msg[512] = "";
  if (msnap_check_invariants(a, msg, sizeof msg) != 0)
    fail_msg("invariants broken after %s: %s", after, msg);
}

/* What the workload saw: the first failing API call and its error. */
typedef struct outcome_s {
  int rc;
  const char *api;
  char msg[256];
  int64_t retries, ooms;
} outcome_t;

/* One API call's result: allowed codes are 0, EOOM, ERUNTIME (anything
 * else fails the test), a failure must carry a message. */
static void api_result(msnap_allocator_t *a, outcome_t *out, const char *api,
                       int rc) {
  if (rc != 0) {
    if (rc != MSNAP_EOOM && rc != MSNAP_ERUNTIME)
      fail_msg("%s returned %s (%s)", api, msnap_err_name(rc),
               msnap_last_error());
    if (msnap_last_error()[0] == '\0')
      fail_msg("%s returned %s without a message", api, msnap_err_name(rc));
    if (out->rc == 0) {
      out->rc = rc;
      out->api = api;
      snprintf(out->msg, sizeof out->msg, "%s", msnap_last_error());
    }
  }
  check_inv(a, api);
}

#define CALL(api, expr)                                                       \
  do {                                                                        \
    cur_api = api;                                                            \
    api_result(a, out, api, (expr));                                          \
    cur_api = "(none)";                                                       \
  } while (0)

#define MAXP 96

/* The workload: a 2 GiB device, three streams, manual events.  Frees
 * everything it allocated; returns with the cache emptied. */
static void workload(msnap_allocator_t *a, outcome_t *out, const char *dir) {
  void *simctx = msnap_runtime_ctx(a);
  uint64_t p[MAXP];
  int n = 0;
  static const size_t sizes[] = {
      512, 4096, 700000, 1 << 20, (2 << 20) + 7, 3 << 20, 12 << 20,
      25 << 20, 60 << 20, 100 << 20};
  const uint64_t s1 = 0x11, s2 = 0x22;
  msnap_sim_set_manual_events(simctx, true);

  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.stacks = MSNAP_STACKS_PYTHON; /* no frame hook: no frames */
  h.max_entries = 10000;
  CALL("msnap_record_history", msnap_record_history(a, &h));

  /* Phase A: a mix on two streams, uses on a third. */
  for (int i = 0; i < 40; i++) {
    uint64_t q = 0;
    CALL("msnap_malloc",
         msnap_malloc(a, 0, sizes[i % 10], (i & 1) ? s1 : 0, &q));
    if (q != 0)
      p[n++] = q;
  }
  for (int i = 0; i < n; i += 3)
    CALL("msnap_record_stream", msnap_record_stream(a, p[i], s2));
  for (int i = 0; i < n; i += 2) {
    CALL("msnap_free", msnap_free(a, p[i]));
    p[i] = 0;
  }
  msnap_sim_complete_events(simctx, s2, false);
  /* Phase B: fill the device with 100 MiB blocks (leaving less than 150
   * MiB free), free them (cached), then ask for 150 MiB blocks: no cached
   * block fits and the device is full, so the allocator must free cached
   * segments and retry (PyTorch's alloc_block failure path). */
  int first_big = n;
  size_t free_b = 0, total_b = 0;
  cur_api = "msnap_mem_get_info";
  assert_int_equal(msnap_mem_get_info(a, 0, &free_b, &total_b), 0);
  int nbig = (int)(free_b / (100u << 20)) - 1;
  for (int i = 0; i < nbig && n < MAXP; i++) {
    uint64_t q = 0;
    CALL("msnap_malloc", msnap_malloc(a, 0, 100u << 20, 0, &q));
    if (q != 0)
      p[n++] = q;
  }
  for (int i = first_big; i < n; i++) {
    CALL("msnap_free", msnap_free(a, p[i]));
    p[i] = 0;
  }
  for (int i = 0; i < 6 && n < MAXP; i++) {
    uint64_t q = 0;
    CALL("msnap_malloc", msnap_malloc(a, 0, (150u << 20) + 4096u * i, s1, &q));
    if (q != 0)
      p[n++] = q;
  }
  /* Phase C: a snapshot dump with history, then empty_cache. */
  char path[256];
  snprintf(path, sizeof path, "%s/sweep.pickle", dir);
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  CALL("msnap_dump_snapshot", msnap_dump_snapshot(a, &so, path));
  CALL("msnap_empty_cache", msnap_empty_cache(a, -1));
  /* Phase D: free everything, let the events complete, empty the cache. */
  for (int i = 0; i < n; i++)
    if (p[i] != 0)
      CALL("msnap_free", msnap_free(a, p[i]));
  msnap_sim_complete_events(simctx, 0, true);
  CALL("msnap_malloc", msnap_malloc(a, 0, 1000, 0, &p[0]));
  CALL("msnap_free", msnap_free(a, p[0]));
  CALL("msnap_empty_cache", msnap_empty_cache(a, -1));

  msnap_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  assert_int_equal(msnap_stats_get(a, 0, &st), 0);
  out->retries = st.num_alloc_retries;
  out->ooms = st.num_ooms;
}

/* After a workload: a second empty_cache (a failed free may have left a
 * segment cached) must return everything. */
static void check_drained(msnap_allocator_t *a, const char *label) {
  msnap_sim_fail_nth(msnap_runtime_ctx(a), NULL, 0);
  msnap_sim_complete_events(msnap_runtime_ctx(a), 0, true);
  if (msnap_empty_cache(a, -1) != 0)
    fail_msg("%s: empty_cache after the fault: %s", label,
             msnap_last_error());
  check_inv(a, "the final empty_cache");
  msnap_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  assert_int_equal(msnap_stats_get(a, 0, &st), 0);
  if (st.allocated_bytes[MSNAP_STAT_ALL].current != 0 ||
      st.reserved_bytes[MSNAP_STAT_ALL].current != 0)
    fail_msg("%s: %lld bytes allocated, %lld reserved after freeing all",
             label, (long long)st.allocated_bytes[MSNAP_STAT_ALL].current,
             (long long)st.reserved_bytes[MSNAP_STAT_ALL].current);
  size_t fr = 0, tot = 0;
  assert_int_equal(msnap_mem_get_info(a, 0, &fr, &tot), 0);
  if (fr != tot)
    fail_msg("%s: device has %zu of %zu bytes free after freeing all "
             "(leaked device memory)", label, fr, tot);
}

static char tmpdir[64];

/* Remove every file of a folder; returns how many there were. */
static int clean_dir(const char *dir) {
  DIR *d = opendir(dir);
  int count = 0;
  struct dirent *e;
  char path[512];
  if (d == NULL)
    return 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
    count++;
  }
  closedir(d);
  return count;
}

/* ---- runtime call sites ------------------------------------------------- */

static void sweep_conf(const char *conf) {
  /* Fault-free run: count every site. */
  memset(calls, 0, sizeof calls);
  memset(injected, 0, sizeof injected);
  live_at_fini = UINT64_MAX;
  outcome_t base;
  memset(&base, 0, sizeof base);
  msnap_allocator_t *a = make_allocator(conf, 2ull << 30);
  workload(a, &base, tmpdir);
  if (base.rc != 0)
    fail_msg("conf \"%s\": the fault-free workload failed in %s: %s", conf,
             base.api, base.msg);
  check_drained(a, "fault-free run");
  /* The sites the workload reaches (destroy's own calls excluded: it
   * returns nothing a caller could see). */
  uint64_t base_calls[S_COUNT];
  memcpy(base_calls, calls, sizeof calls);
  msnap_allocator_destroy(a);
  assert_int_equal(live_at_fini, 0);
  clean_dir(tmpdir);
  print_message("fault_sweep: conf \"%s\": fault-free run: %lld alloc "
                "retries; calls:", conf, (long long)base.retries);
  for (int s = 0; s < S_COUNT; s++)
    if (base_calls[s])
      print_message(" %s=%llu", site_names[s],
                    (unsigned long long)base_calls[s]);
  print_message("\n");

  for (int s = 0; s < S_COUNT; s++) {
    if (base_calls[s] == 0) {
      if (calls[s] != 0)
        print_message("fault_sweep: conf \"%s\": %s is only called by "
                      "msnap_allocator_destroy (not failed)\n", conf,
                      site_names[s]);
      continue;
    }
    uint64_t nth = base_calls[s] / 2 + 1;
    memset(calls, 0, sizeof calls);
    memset(injected, 0, sizeof injected);
    injected_api = NULL;
    live_at_fini = UINT64_MAX;
    outcome_t out;
    memset(&out, 0, sizeof out);
    char label[128];
    snprintf(label, sizeof label, "conf \"%s\", %s #%llu", conf,
             site_names[s], (unsigned long long)nth);
    a = make_allocator(conf, 2ull << 30);
    msnap_sim_fail_nth(msnap_runtime_ctx(a), site_names[s], nth);
    workload(a, &out, tmpdir);
    if (injected[s] != 1)
      fail_msg("%s: the fault was not injected (%llu)", label,
               (unsigned long long)injected[s]);
    if (out.rc == 0)
      print_message("fault_sweep: %s failed in %s -> recovered (alloc "
                    "retries %lld, fault-free %lld)\n",
                    label, injected_api, (long long)out.retries,
                    (long long)base.retries);
    else
      print_message("fault_sweep: %s failed in %s -> %s saw %s: %s\n", label,
                    injected_api, out.api, msnap_err_name(out.rc), out.msg);
    check_drained(a, label);
    msnap_allocator_destroy(a);
    if (live_at_fini != 0)
      fail_msg("%s: %llu runtime allocations/handles leaked", label,
               (unsigned long long)live_at_fini);
    /* A dump is complete or absent. */
    char path[256];
    snprintf(path, sizeof path, "%s/sweep.pickle", tmpdir);
    if (access(path, F_OK) == 0) {
      msnap_snap_t *snap = NULL;
      msnap_read_error_t err;
      if (msnap__snap_read_file(path, &snap, &err) != 0)
        fail_msg("%s: the dump is not a complete snapshot: %s", label,
                 err.msg);
      msnap__snap_free(snap);
    }
    clean_dir(tmpdir);
  }
}

static void test_runtime_sites(void **state) {
  (void)state;
  sweep_conf("");
  sweep_conf("expandable_segments:True");
}

/* ---- dump faults -------------------------------------------------------- */

static msnap_allocator_t *dump_allocator(int nallocs) {
  msnap_allocator_t *a = make_allocator("", 4ull << 30);
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.stacks = MSNAP_STACKS_PYTHON; /* no frame hook: no frames */
  assert_int_equal(msnap_record_history(a, &h), 0);
  for (int i = 0; i < nallocs; i++) {
    uint64_t q = 0;
    assert_int_equal(msnap_malloc(a, 0, 1000u + 512u * (unsigned)(i % 64), 0, &q),
                     0);
    if (i % 2)
      assert_int_equal(msnap_free(a, q), 0);
  }
  return a;
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  if (fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* Dump with fault f; the target must stay as it was (absent, or the old
 * bytes) and the folder must hold nothing else. */
static void dump_fault(msnap_allocator_t *a, const char *dir, ffault_t f,
                       int err, int want, const char *what, bool had_old) {
  char path[256];
  snprintf(path, sizeof path, "%s/dump.pickle", dir);
  size_t oldlen = 0;
  uint8_t *old = had_old ? slurp(path, &oldlen) : NULL;
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  file_fault = f;
  file_errno = err;
  file_fault_hits = 0;
  int rc = msnap_dump_snapshot(a, &so, path);
  file_fault = F_NONE;
  if (file_fault_hits == 0)
    fail_msg("dump: %s: the fault was never reached", what);
  if (rc != want)
    fail_msg("dump: %s: got %s (%s), want %s", what, msnap_err_name(rc),
             msnap_last_error(), msnap_err_name(want));
  print_message("fault_sweep: dump with %s -> %s: %s\n", what,
                msnap_err_name(rc), msnap_last_error());
  size_t len = 0;
  uint8_t *now = slurp(path, &len);
  if (had_old) {
    if (now == NULL || len != oldlen || memcmp(now, old, len) != 0)
      fail_msg("dump: %s: the previous dump was changed", what);
  } else if (now != NULL) {
    fail_msg("dump: %s: a %zu-byte file was left at the target", what, len);
  }
  free(now);
  free(old);
  /* No temporary left over. */
  DIR *d = opendir(dir);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && strcmp(e->d_name, "dump.pickle") != 0)
      fail_msg("dump: %s: left %s/%s behind", what, dir, e->d_name);
  closedir(d);
}

static void test_dump_faults(void **state) {
  (void)state;
  msnap_allocator_t *a = dump_allocator(200);
  struct {
    ffault_t f;
    int err, want;
    const char *what;
  } cases[] = {
      {F_WRITE, ENOSPC, MSNAP_ENOSPC, "write ENOSPC"},
      {F_SHORT_WRITE, ENOSPC, MSNAP_ENOSPC, "short write then ENOSPC"},
      {F_WRITE, EIO, MSNAP_EIO, "write EIO"},
      {F_FSYNC, EIO, MSNAP_EIO, "fsync EIO"},
      {F_RENAME, EIO, MSNAP_EIO, "rename EIO"},
      {F_RENAME, ENOSPC, MSNAP_ENOSPC, "rename ENOSPC"},
  };
  for (int pass = 0; pass < 2; pass++) {
    /* pass 0: no earlier dump; pass 1: over a complete earlier dump. */
    clean_dir(tmpdir);
    if (pass == 1) {
      char path[256];
      snprintf(path, sizeof path, "%s/dump.pickle", tmpdir);
      msnap_snapshot_options_t so;
      msnap_snapshot_options_init(&so);
      assert_int_equal(msnap_dump_snapshot(a, &so, path), 0);
      uint64_t q = 0;
      assert_int_equal(msnap_malloc(a, 0, 12345, 0, &q), 0);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      dump_fault(a, tmpdir, cases[i].f, cases[i].err, cases[i].want,
                 cases[i].what, pass == 1);
  }
  check_inv(a, "the dump faults");
  clean_dir(tmpdir);
  msnap_allocator_destroy(a);
}

/* A real EFBIG: RLIMIT_FSIZE below the dump's size. */
static void test_dump_efbig(void **state) {
  (void)state;
  msnap_allocator_t *a = dump_allocator(400);
  char path[256];
  snprintf(path, sizeof path, "%s/big.pickle", tmpdir);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 4096;
  signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  int rc = msnap_dump_snapshot(a, &so, path);
  setrlimit(RLIMIT_FSIZE, &old);
  print_message("fault_sweep: dump over RLIMIT_FSIZE=4096 -> %s: %s\n",
                msnap_err_name(rc), msnap_last_error());
  assert_int_equal(rc, MSNAP_EIO);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(clean_dir(tmpdir), 0);
  msnap_allocator_destroy(a);
}

/* A real ENOSPC: a 256 KiB tmpfs in a private mount namespace. */
static char tmpfs_dir[64];
static bool have_tmpfs;

static void test_dump_enospc_tmpfs(void **state) {
  (void)state;
  if (!have_tmpfs) {
    print_message("fault_sweep: SKIPPED the real-ENOSPC dump: cannot mount "
                  "a tmpfs here (needs root and mount namespaces); the "
                  "interposed ENOSPC cases above still ran\n");
    skip();
  }
  msnap_allocator_t *a = dump_allocator(10000);
  char path[256];
  snprintf(path, sizeof path, "%s/dump.pickle", tmpfs_dir);
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  int rc = msnap_dump_snapshot(a, &so, path);
  print_message("fault_sweep: dump of 10000 allocations to a 256 KiB tmpfs -> "
                "%s: %s\n", msnap_err_name(rc), msnap_last_error());
  assert_int_equal(rc, MSNAP_ENOSPC);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(clean_dir(tmpfs_dir), 0);
  /* A small dump fits, is complete, and survives a failed bigger one. */
  msnap_allocator_t *small = make_allocator("", 1ull << 30);
  uint64_t q = 0;
  assert_int_equal(msnap_malloc(small, 0, 4096, 0, &q), 0);
  assert_int_equal(msnap_dump_snapshot(small, &so, path), 0);
  msnap_snap_t *snap = NULL;
  msnap_read_error_t err;
  assert_int_equal(msnap__snap_read_file(path, &snap, &err), 0);
  msnap__snap_free(snap);
  size_t len1 = 0, len2 = 0;
  uint8_t *before = slurp(path, &len1);
  assert_int_equal(msnap_dump_snapshot(a, &so, path), MSNAP_ENOSPC);
  uint8_t *after = slurp(path, &len2);
  assert_non_null(after);
  assert_true(len1 == len2 && memcmp(before, after, len1) == 0);
  free(before);
  free(after);
  assert_int_equal(clean_dir(tmpfs_dir), 1);
  msnap_allocator_destroy(small);
  msnap_allocator_destroy(a);
}

/* Before any thread exists: a private mount namespace with a small tmpfs
 * (fails quietly when not root; the test then says it skipped). */
static void setup_tmpfs(void) {
  snprintf(tmpfs_dir, sizeof tmpfs_dir, "/tmp/memsnap-enospc-XXXXXX");
  if (mkdtemp(tmpfs_dir) == NULL)
    return;
  if (unshare(CLONE_NEWNS) != 0 ||
      mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", tmpfs_dir, "tmpfs", 0, "size=256k,mode=0700") != 0) {
    rmdir(tmpfs_dir);
    return;
  }
  have_tmpfs = true;
}

int main(void) {
  sim = msnap_runtime_sim();
  setup_tmpfs();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/memsnap-sweep-XXXXXX");
  if (mkdtemp(tmpdir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_sites),
      cmocka_unit_test(test_dump_faults),
      cmocka_unit_test(test_dump_efbig),
      cmocka_unit_test(test_dump_enospc_tmpfs),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  clean_dir(tmpdir);
  rmdir(tmpdir);
  if (have_tmpfs) {
    umount(tmpfs_dir);
    rmdir(tmpfs_dir);
  }
  return rc;
}
