/*
 * test_platform.c -- what memsnap learns from the vendor runtime beyond
 * memory: the SoC name and CANN version behind torch_npu's AddPadSize,
 * CANN's per-module usage CSV (saveDevMemUsageInfo), CANN-reported OOMs
 * (NPU_CHECK_ERROR's oom_observer()), and NVML's process list in the CUDA
 * OOM message (reportProcessMemoryInfo).  Runs on the fake libascendcl.so,
 * libcudart.so and libnvidia-ml.so of tests/fakes (paths from the test
 * environment; FAKE_ACL_NOVMM_LIBRARY models an older CANN without the
 * platform symbols).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/api.h"

#define MiB ((uint64_t)1 << 20)

static long (*acl_control)(const char *, long);
static void *acl_lib;
static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  const char *path = getenv("MEMSNAP_ACL_LIBRARY");
  if (path == NULL) {
    fprintf(stderr, "MEMSNAP_ACL_LIBRARY is not set: run through meson test\n");
    return -1;
  }
  acl_lib = dlopen(path, RTLD_NOW);
  if (acl_lib == NULL) return -1;
  *(void **)&acl_control = dlsym(acl_lib, "fake_acl_control");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/msnap_platform_XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return -1;
  return acl_control ? 0 : -1;
}

static void clean(void) {
  DIR *d = opendir(tmpdir);
  if (d == NULL) return;
  struct dirent *e;
  char p[600];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
    unlink(p);
  }
  closedir(d);
}

static int teardown(void **state) {
  (void)state;
  clean();
  rmdir(tmpdir);
  if (acl_lib != NULL) dlclose(acl_lib);
  return 0;
}

static int count_files(const char *prefix, const char *suffix) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name), sl = suffix ? strlen(suffix) : 0;
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 &&
        (suffix == NULL || (l >= sl && strcmp(e->d_name + l - sl, suffix) == 0)))
      n++;
  }
  closedir(d);
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

static msnap_allocator_t *make(msnap_profile_t profile, const char *runtime) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = (int)profile;
  o.runtime_name = runtime;
  o.alloc_conf = "";
  o.caching_disabled = 0;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  if (msnap_allocator_create(&o, &a) != 0)
    fail_msg("allocator on %s: %s", runtime, err);
  return a;
}

/* NCA AddPadSize from aclrtGetSocName and aclsysGetCANNVersion (the
 * fake's defaults: Ascend910B1, CANN 8.5.0 -> 32). */
static void test_pad_from_acl(void **state) {
  (void)state;
  static const struct {
    const char *soc, *cann;
    size_t size512;
  } cases[] = {
      {NULL, NULL, 1024},                      /* Ascend910B1, 8.5.0 */
      {"Ascend950PR_9579", "9.1.0", 512},
      {"Ascend950PR_9579", "9.0.0", 1024},
      {"Ascend910_9391", "9.1.0", 1024},
      {"", "9.1.0", 1024},                     /* aclrtGetSocName NULL */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].soc) setenv("FAKE_ACL_SOC_NAME", cases[i].soc, 1);
    if (cases[i].cann) setenv("FAKE_ACL_CANN_VERSION", cases[i].cann, 1);
    msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, "acl");
    uint64_t p;
    size_t sz = 0;
    assert_int_equal(msnap_malloc(a, 0, 512, 0, &p), 0);
    assert_int_equal(msnap_allocation_size(a, p, &sz), 0);
    assert_int_equal(sz, cases[i].size512);
    assert_int_equal(msnap_free(a, p), 0);
    msnap_allocator_destroy(a);
    unsetenv("FAKE_ACL_SOC_NAME");
    unsetenv("FAKE_ACL_CANN_VERSION");
  }
  /* An older CANN without the queries: the pad stays 32. */
  char *saved = strdup(getenv("MEMSNAP_ACL_LIBRARY"));
  setenv("MEMSNAP_ACL_LIBRARY", getenv("FAKE_ACL_NOVMM_LIBRARY"), 1);
  setenv("FAKE_ACL_SOC_NAME", "Ascend950PR_9579", 1);
  setenv("FAKE_ACL_CANN_VERSION", "9.1.0", 1);
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, "acl");
  uint64_t p;
  size_t sz = 0;
  assert_int_equal(msnap_malloc(a, 0, 512, 0, &p), 0);
  assert_int_equal(msnap_allocation_size(a, p, &sz), 0);
  assert_int_equal(sz, 1024);
  assert_int_equal(msnap_free(a, p), 0);
  msnap_allocator_destroy(a);
  setenv("MEMSNAP_ACL_LIBRARY", saved, 1);
  free(saved);
  unsetenv("FAKE_ACL_SOC_NAME");
  unsetenv("FAKE_ACL_CANN_VERSION");
}

/* NCA saveDevMemUsageInfo: header, MiB with 4 decimals, at most 128 rows,
 * device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv. */
static void test_cann_usage_csv(void **state) {
  (void)state;
  clean();
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, "acl");
  uint64_t p;
  assert_int_equal(msnap_malloc(a, 1, 10 * MiB, 0, &p), 0);
  char *path = NULL;
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 1, tmpdir, &path), 0);
  assert_non_null(path);
  const char *base = strrchr(path, '/') + 1;
  assert_int_equal(strncmp(base, "device_1_memUsageInfo_", 22), 0);
  assert_int_equal(strlen(base), strlen("device_1_memUsageInfo_") + 14 + 4);
  assert_string_equal(base + strlen(base) - 4, ".csv");
  char *text = slurp(path);
  assert_non_null(text);
  /* the fake charges the 12 MiB segment (10 MiB + 32 B rounded to 2 MiB):
   * app = 12 MiB now and at peak */
  assert_string_equal(text,
                      "moduleName,curMemSize(MB),memPeakSize(MB)\n"
                      "app,12.0000,12.0000\n"
                      "runtime,2.0000,2.0000\n");
  msnap_free_string(path);
  /* More modules than torch_npu's kMaxModuleNum (128): the first 128. */
  acl_control("usage_extra", 200);
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 0, tmpdir, &path), 0);
  text = slurp(path);
  int rows = 0;
  for (char *c = text; *c; c++) rows += *c == '\n';
  assert_int_equal(rows, 1 + 128);
  assert_non_null(strstr(text, "\nmod0,1.0000,2.0000\n"));
  assert_non_null(strstr(text, "\nmod125,"));
  assert_null(strstr(text, "\nmod126,"));
  msnap_free_string(path);
  acl_control("usage_extra", 0);
  /* dir NULL: OOM_SNAPSHOT_PATH (GetOomSnapshotDumpPath) */
  clean();
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 0, NULL, NULL), 0);
  assert_int_equal(count_files("device_0_memUsageInfo_", ".csv"), 1);
  unsetenv("OOM_SNAPSHOT_PATH");
  /* a directory that does not exist */
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 0, "/nonexistent/dir",
                                                 NULL),
                   MSNAP_EIO);
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 7, tmpdir, NULL),
                   MSNAP_EINVAL);
  /* MEMSNAP_USAGE_REPORT */
  clean();
  setenv("MEMSNAP_USAGE_REPORT", "both", 1);
  assert_int_equal(msnap_dump_usage_reports(a, 0, tmpdir), 0);
  assert_int_equal(count_files("device_0_memUsageInfo_", ".csv"), 1);
  assert_int_equal(count_files("device_0_memsnapUsage_", ".csv"), 1);
  clean();
  setenv("MEMSNAP_USAGE_REPORT", "none", 1);
  assert_int_equal(msnap_dump_usage_reports(a, 0, tmpdir), 0);
  assert_int_equal(count_files("device_", NULL), 0);
  unsetenv("MEMSNAP_USAGE_REPORT");
  assert_int_equal(msnap_free(a, p), 0);
  msnap_allocator_destroy(a);

  /* Older CANN (no aclrtGetMemUsageInfo) and the sim: MSNAP_ENOTSUP,
   * nothing written (torch_npu falls back to its profiler). */
  char *saved = strdup(getenv("MEMSNAP_ACL_LIBRARY"));
  setenv("MEMSNAP_ACL_LIBRARY", getenv("FAKE_ACL_NOVMM_LIBRARY"), 1);
  a = make(MSNAP_PROFILE_NPU, "acl");
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 0, tmpdir, NULL),
                   MSNAP_ENOTSUP);
  assert_int_equal(msnap_dump_usage_reports(a, 0, tmpdir), MSNAP_ENOTSUP);
  assert_int_equal(count_files("device_", NULL), 0);
  msnap_allocator_destroy(a);
  setenv("MEMSNAP_ACL_LIBRARY", saved, 1);
  free(saved);
  a = make(MSNAP_PROFILE_NPU, "sim");
  assert_int_equal(msnap_save_dev_mem_usage_info(a, 0, tmpdir, NULL),
                   MSNAP_ENOTSUP);
  msnap_allocator_destroy(a);
}

/* NPU_CHECK_ERROR (NPUException.h): a CANN error whose text isCannOOM
 * ("EL0004" / "Failed to allocate") runs oom_observer() -- the
 * OOM_SNAPSHOT dump, which writes the pickle and _dump_snapshot's CSV. */
static int user_calls;
static void user_observer(int device, uint64_t alloc, uint64_t total,
                          uint64_t free_b, void *arg) {
  (void)device, (void)alloc, (void)total, (void)free_b, (void)arg;
  user_calls++;
}

static void test_cann_reported_oom(void **state) {
  (void)state;
  clean();
  setenv("OOM_SNAPSHOT_ENABLE", "1", 1);
  setenv("OOM_SNAPSHOT_PATH", tmpdir, 1);
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, "acl");
  user_calls = 0;
  assert_int_equal(msnap_attach_oom_observer(a, user_observer, NULL), 0);
  assert_int_equal(msnap_notify_device_error(a, 0, "EE9999: Inner Error"), 0);
  assert_int_equal(count_files("oom_snapshot_", ".pickle"), 0);
  assert_int_equal(
      msnap_notify_device_error(a, 0, "aclnnMatmul failed. EL0004: Failed to "
                                      "allocate memory."),
      1);
  assert_int_equal(count_files("oom_snapshot_", ".pickle"), 1);
  assert_int_equal(count_files("device_0_memUsageInfo_", ".csv"), 1);
  assert_int_equal(user_calls, 0); /* only the snapshot observer */
  assert_int_equal(msnap_notify_device_error(a, 9, "EL0004"), MSNAP_EINVAL);
  /* memsnap's own aclrtMallocHost failing with CANN's OOM text */
  acl_control("err_text", 1);
  acl_control("fail_next", 507899);
  uint64_t h = 0;
  assert_int_not_equal(msnap_host_malloc(a, 4096, &h), 0);
  assert_non_null(strstr(msnap_last_error(), "EL0004"));
  assert_int_equal(count_files("oom_snapshot_", ".pickle"), 2);
  acl_control("err_text", 0);
  acl_control("fail_next", 507899);
  assert_int_not_equal(msnap_host_malloc(a, 4096, &h), 0);
  assert_int_equal(count_files("oom_snapshot_", ".pickle"), 2);
  msnap_allocator_destroy(a);
  unsetenv("OOM_SNAPSHOT_ENABLE");
  unsetenv("OOM_SNAPSHOT_PATH");
}

/* CCA reportProcessMemoryInfo: NVML's compute processes in the OOM
 * message, after "... is free. " and before the allowed memory. */
static void test_nvml_processes_in_oom_message(void **state) {
  (void)state;
  setenv("FAKE_NVML_OTHER", "4242:2097152", 1);
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, "cuda");
  uint64_t p, q;
  assert_int_equal(msnap_malloc(a, 0, 100 * MiB, 0, &p), 0);
  assert_int_equal(msnap_malloc(a, 0, 400 * MiB, 0, &q), MSNAP_EOOM);
  const char *m = msnap_last_error();
  assert_non_null(strstr(m, " is free. Process 4242 has 2.00 MiB memory in "
                            "use. Including non-PyTorch memory, this process "
                            "has 100.00 MiB memory in use. Of the allocated "
                            "memory"));
  assert_int_equal(msnap_free(a, p), 0);
  msnap_allocator_destroy(a);
  unsetenv("FAKE_NVML_OTHER");
  /* without NVML: nothing (reportProcessMemoryInfo returns "") */
  setenv("MEMSNAP_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  a = make(MSNAP_PROFILE_CUDA, "cuda");
  assert_int_equal(msnap_malloc(a, 0, 400 * MiB, 0, &q), MSNAP_EOOM);
  assert_non_null(strstr(msnap_last_error(), " is free. Of the allocated"));
  msnap_allocator_destroy(a);
  unsetenv("MEMSNAP_NVML_LIBRARY");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pad_from_acl),
      cmocka_unit_test(test_cann_usage_csv),
      cmocka_unit_test(test_cann_reported_oom),
      cmocka_unit_test(test_nvml_processes_in_oom_message),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
