/*
 * test_recorder_oom.c -- OOM observers and the OOM_SNAPSHOT_ENABLE /
 * OOM_SNAPSHOT_PATH automatic dump on a tiny simulated device: exactly one
 * complete pickle (with its `oom` entry) and one CSV per OOM, an observer
 * that dumps without deadlocking, state-only mode, an invalid path.
 * Its own executable: the environment is read at allocator creation.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc/alloc.h"
#include "api/api.h"
#include "runtime/runtime.h"

static char tmpdir[256];

static msnap_allocator_t *make_small(void) {
  msnap_options_t o;
  msnap_options_init(&o);
  /* The sim runtime reads the environment (options too, when honoured). */
  setenv("MEMSNAP_SIM_DEVICES", "1", 1);
  setenv("MEMSNAP_SIM_MEMORY", "64M", 1);
  o.profile = MSNAP_PROFILE_NPU;
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = 1;
  o.sim_memory = 64ull << 20;
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  return a;
}

static int count_files(const char *dir, const char *prefix, const char *ext) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name), el = ext ? strlen(ext) : 0;
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    if (ext && (l < el || strcmp(e->d_name + l - el, ext) != 0)) continue;
    n++;
  }
  closedir(d);
  return n;
}

static int first_file(const char *dir, const char *prefix, char *out,
                      size_t len) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      snprintf(out, len, "%s/%s", dir, e->d_name);
      found = 1;
      break;
    }
  }
  closedir(d);
  return found;
}

static void rm_dir_files(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
}

static int run_check(const char *mode, const char *file, char *out,
                     size_t outlen) {
  const char *root = getenv("MEMSNAP_SOURCE_ROOT");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 %s/tests/recorder/check_dump.py %s %s",
           root ? root : "..", mode, file);
  FILE *p = popen(cmd, "r");
  size_t n = fread(out, 1, outlen - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static bool have_python(void) {
  return system("python3 -c 'import pickle' 2>/dev/null") == 0;
}

/* The observer: records its arguments and dumps a snapshot itself. */
typedef struct obs_s {
  msnap_allocator_t *a;
  int calls;
  int device;
  uint64_t alloc, total, free_b;
  int dump_rc;
  char path[512];
} obs_t;

static void observer(int device, uint64_t alloc_size, uint64_t total,
                     uint64_t free_b, void *arg) {
  obs_t *o = arg;
  o->calls++;
  o->device = device;
  o->alloc = alloc_size;
  o->total = total;
  o->free_b = free_b;
  o->dump_rc = msnap_dump_snapshot(o->a, NULL, o->path);
}

static void test_auto_dump_and_observer(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  setenv("OOM_SNAPSHOT_ENABLE", "1", 1);
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  /* The sim has no CANN report (aclrtGetMemUsageInfo): memsnap's own
   * statistics CSV instead (api/usage.c). */
  setenv("MEMSNAP_USAGE_REPORT", "memsnap", 1);
  msnap_allocator_t *a = make_small();
  obs_t ob;
  memset(&ob, 0, sizeof ob);
  ob.a = a;
  snprintf(ob.path, sizeof ob.path, "%s/observer.pickle", tmpdir);
  assert_int_equal(msnap_attach_oom_observer(a, observer, &ob), 0);
  uint64_t p = 0, big = 0;
  assert_int_equal(msnap_malloc(a, 0, 10 << 20, 0, &p), 0);
  /* history was turned on by the environment */
  assert_true(msnap_history_enabled(a));
  assert_int_equal(msnap_malloc(a, 0, 200ull << 20, 0, &big), MSNAP_EOOM);
  assert_int_equal(big, 0);
  assert_int_equal(ob.calls, 1);
  assert_int_equal(ob.device, 0);
  assert_true(ob.alloc >= 200ull << 20);
  assert_int_equal(ob.total, 64ull << 20);
  assert_int_equal(ob.dump_rc, 0);
  assert_int_equal(count_files(tmpdir, "oom_snapshot_", ".pickle"), 1);
  assert_int_equal(count_files(tmpdir, "device_0_memsnapUsage_", ".csv"), 1);
  assert_int_equal(count_files(tmpdir, "device_0_memUsageInfo_", ".csv"), 0);
  assert_int_equal(count_files(tmpdir, "observer.pickle", NULL), 1);
  /* no temporary file left */
  assert_int_equal(count_files(tmpdir, "", NULL), 2 + 3);
  if (have_python()) {
    char f[600], out[1024];
    assert_true(first_file(tmpdir, "oom_snapshot_", f, sizeof f));
    int rc = run_check("oom", f, out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_int_equal(run_check("oom", ob.path, out, sizeof out), 0);
    assert_true(first_file(tmpdir, "device_0_memsnapUsage_", f, sizeof f));
    assert_int_equal(run_check("csv", f, out, sizeof out), 0);
  }
  /* A second OOM within the same second: a second, distinct file. */
  assert_int_equal(msnap_malloc(a, 0, 300ull << 20, 0, &big), MSNAP_EOOM);
  assert_int_equal(count_files(tmpdir, "oom_snapshot_", ".pickle"), 2);
  assert_int_equal(count_files(tmpdir, "device_0_memsnapUsage_", ".csv"), 2);
  assert_int_equal(ob.calls, 2);
  msnap_free(a, p);
  msnap_allocator_destroy(a);
  unsetenv("MEMSNAP_USAGE_REPORT");
}

static void test_state_mode(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  setenv("OOM_SNAPSHOT_ENABLE", "2", 1);
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  msnap_allocator_t *a = make_small();
  msnap__oom_dump_init(a); /* what allocator creation does; idempotent */
  uint64_t p, big;
  assert_int_equal(msnap_malloc(a, 0, 1000, 0, &p), 0);
  assert_int_equal(msnap_malloc(a, 0, 500ull << 20, 0, &big), MSNAP_EOOM);
  assert_int_equal(count_files(tmpdir, "oom_snapshot_", ".pickle"), 1);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  /* a ring of one entry: the snapshot entry of the automatic dump */
  assert_int_equal(s->device_traces[0].n, 1);
  msnap__snap_free(s);
  if (have_python()) {
    char f[600], out[1024];
    assert_true(first_file(tmpdir, "oom_snapshot_", f, sizeof f));
    assert_int_equal(run_check("oom", f, out, sizeof out), 0);
    print_message("%s", out);
  }
  msnap_free(a, p);
  msnap_allocator_destroy(a);
}

static void test_invalid_path(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  setenv("OOM_SNAPSHOT_ENABLE", "1", 1);
  setenv("OOM_SNAPSHOT_PATH", "/nonexistent/memsnap/dir", 1);
  msnap_allocator_t *a = make_small();
  uint64_t big;
  /* no crash, a clear message on stderr, the OOM is still reported */
  assert_int_equal(msnap_malloc(a, 0, 500ull << 20, 0, &big), MSNAP_EOOM);
  assert_int_equal(count_files(tmpdir, "", NULL), 2);
  msnap_allocator_destroy(a);
}

static void test_disabled(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  setenv("OOM_SNAPSHOT_ENABLE", "0", 1);
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  msnap_allocator_t *a = make_small();
  msnap__oom_dump_init(a);
  assert_false(msnap_history_enabled(a));
  uint64_t big;
  assert_int_equal(msnap_malloc(a, 0, 500ull << 20, 0, &big), MSNAP_EOOM);
  assert_int_equal(count_files(tmpdir, "", NULL), 2);
  msnap_allocator_destroy(a);
}


static void test_workspace_oom(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  setenv("OOM_SNAPSHOT_ENABLE", "1", 1);
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  /* The sim has no CANN report (aclrtGetMemUsageInfo): memsnap's own
   * statistics CSV instead (api/usage.c). */
  setenv("MEMSNAP_USAGE_REPORT", "memsnap", 1);
  msnap_allocator_t *a = make_small();
  obs_t ob;
  memset(&ob, 0, sizeof ob);
  ob.a = a;
  snprintf(ob.path, sizeof ob.path, "%s/observer.pickle", tmpdir);
  assert_int_equal(msnap_attach_oom_observer(a, observer, &ob), 0);
  uint64_t w = 0;
  assert_int_equal(msnap_workspace_malloc(a, 0, 1 << 20, 0, &w), 0);
  /* a grow the device cannot hold: EOOM, an oom entry, observers, dump */
  assert_int_equal(msnap_workspace_malloc(a, 0, 100u << 20, 0, &w),
                   MSNAP_EOOM);
  /* torch_npu's words (NPUWorkspaceAllocator.cpp malloc) */
  const char *msg = msnap_last_error();
  static const char want[] = "NPU out of memory. NPUWorkspaceAllocator "
                             "tried to allocate 100.00 MiB(NPU 0; 64.00 MiB "
                             "total capacity; ";
  if (strncmp(msg, want, sizeof want - 1) != 0)
    fail_msg("workspace OOM message: %s", msg);
  assert_non_null(strstr(msg, " free). If you want to reduce memory usage, "
                              "take a try to set the environment variable "
                              "TASK_QUEUE_ENABLE=1."));
  assert_int_equal(ob.calls, 1);
  assert_int_equal(ob.alloc, 102u << 20); /* 100 MiB + pad, 2 MiB rounded */
  assert_int_equal(count_files(tmpdir, "oom_snapshot_", ".pickle"), 1);
  if (have_python()) {
    char f[600], out[1024];
    assert_true(first_file(tmpdir, "oom_snapshot_", f, sizeof f));
    assert_int_equal(run_check("oom", f, out, sizeof out), 0);
  }
  msnap_allocator_destroy(a);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/msnap_oom_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  rm_dir_files(tmpdir);
  rmdir(tmpdir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auto_dump_and_observer),
      cmocka_unit_test(test_state_mode),
      cmocka_unit_test(test_invalid_path),
      cmocka_unit_test(test_disabled),
      cmocka_unit_test(test_workspace_oom),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
