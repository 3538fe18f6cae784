/*
 * usage.c (api layer) -- the memory-usage CSV files written next to
 * snapshot dumps.
 *
 * CANN's report (torch_npu saveDevMemUsageInfo, NPUCachingAllocator.cpp,
 * called by torch_npu.npu.memory._dump_snapshot and so by every
 * OOM_SNAPSHOT dump): the runtime's mem_usage_info op
 * (aclrtGetMemUsageInfo(device, rows[128], 128, &count)) written as
 *
 *   moduleName,curMemSize(MB),memPeakSize(MB)
 *   <name>,<bytes / 2^20 with 4 decimals>,<same>
 *
 * one row per module, at most 128 ("moduleCount is unreliable"; a warning
 * on stderr names a larger count), to
 * <dir>/device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv (local time, 1 s).
 * dir defaults to torch_npu's GetOomSnapshotDumpPath(): the real path of
 * OOM_SNAPSHOT_PATH, else of ".".  Without aclrtGetMemUsageInfo (older
 * CANN, the sim, cuda) nothing is written and MSNAP_ENOTSUP returned:
 * torch_npu then runs its profiler instead (memsnap.memory does that in
 * Python when torch_npu is importable).
 *
 * memsnap's own report (msnap__usage_report in alloc/oom.c: allocator
 * statistics per device and pool) can be written instead of, or besides,
 * CANN's: MEMSNAP_USAGE_REPORT = "cann" (default), "memsnap", "both" or
 * "none"; its file is device_<dev>_memsnapUsage_<stamp>.csv so that a tool
 * reading CANN's format never meets it under CANN's name.
 *
 * Files are written atomically (temporary file, rename): a reader never
 * sees half a CSV.  A same-second name is replaced, as torch_npu's
 * ofstream does; the OOM dump instead picks a "_<n>" suffix.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"

#define CANN_MAX_MODULES 128 /* torch_npu kMaxModuleNum */

typedef struct tbuf_s {
  char *p;
  size_t len, cap;
  int err;
} tbuf_t;

__attribute__((format(printf, 2, 3))) static void tb_printf(tbuf_t *b,
                                                            const char *fmt,
                                                            ...) {
  if (b->err) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->err = MSNAP_EINVAL;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (np == NULL) {
      b->err = MSNAP_ENOMEM;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

msnap_usage_kind_t msnap__usage_kind(void) {
  static const char *const words[] = {"cann", "memsnap", "both", "none",
                                      NULL};
  return (msnap_usage_kind_t)msnap__env_choice(MSNAP_ENV_USAGE_REPORT, words,
                                               MSNAP_USAGE_CANN);
}

/* The CSV text of CANN's report for one device. */
static int cann_text(msnap_allocator_t *a, int device, tbuf_t *b) {
  const msnap_runtime_ops_t *rt = msnap_runtime(a);
  if (rt->mem_usage_info == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "the %s runtime has no "
                            "aclrtGetMemUsageInfo",
                            rt->name ? rt->name : "?");
  msnap_mem_usage_t *rows = calloc(CANN_MAX_MODULES, sizeof *rows);
  if (rows == NULL) return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  size_t n = 0;
  int rc = rt->mem_usage_info(msnap_runtime_ctx(a), device, rows,
                              CANN_MAX_MODULES, &n);
  if (rc != 0) {
    free(rows);
    return rc;
  }
  tb_printf(b, "moduleName,curMemSize(MB),memPeakSize(MB)\n");
  for (size_t i = 0; i < n && i < CANN_MAX_MODULES; i++) {
    char name[sizeof rows[i].name + 1];
    memcpy(name, rows[i].name, sizeof rows[i].name);
    name[sizeof rows[i].name] = '\0';
    for (char *c = name; *c; c++)
      if (*c == '\n' || *c == '\r') *c = '?'; /* one row per module */
    tb_printf(b, "%s,%.4f,%.4f\n", name,
              (double)rows[i].cur_bytes / 1048576.0,
              (double)rows[i].peak_bytes / 1048576.0);
  }
  if (n > CANN_MAX_MODULES)
    fprintf(stderr, "memsnap: warning: CANN reported %zu memory modules on "
            "device %d; the usage CSV has the first %d\n", n, device,
            CANN_MAX_MODULES);
  free(rows);
  return b->err;
}

char *msnap__usage_dir(const char *configured) {
  const char *p = configured;
  if (p == NULL || *p == '\0') {
    p = msnap__env_get(MSNAP_ENV_OOM_SNAPSHOT_PATH);
    if (p == NULL || *p == '\0') p = ".";
  }
  char *real = realpath(p, NULL);
  struct stat st;
  if (real == NULL || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    int e = real == NULL ? errno : ENOTDIR;
    free(real);
    msnap__set_error_errno(MSNAP_EIO, e, "usage report directory '%s' is "
                           "not an existing directory", p);
    return NULL;
  }
  return real;
}

int msnap__usage_csv(msnap_allocator_t *a, int device, const char *dir,
                     bool cann, const char *stamp, bool unique,
                     char **path) {
  if (path) *path = NULL;
  tbuf_t b = {0};
  int rc;
  if (cann) {
    rc = cann_text(a, device, &b);
  } else {
    char *text = NULL;
    size_t len = 0;
    rc = msnap__usage_report_text(a, device, &text, &len);
    b.p = text;
    b.len = len;
  }
  if (rc != 0) {
    free(b.p);
    return rc;
  }
  char stem[96];
  snprintf(stem, sizeof stem, "device_%d_%s_%s", device,
           cann ? "memUsageInfo" : "memsnapUsage", stamp);
  size_t plen = strlen(dir) + sizeof stem + 32;
  char *p = malloc(plen);
  if (p == NULL) {
    free(b.p);
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  }
  snprintf(p, plen, "%s/%s.csv", dir, stem);
  for (int k = 1; unique && access(p, F_OK) == 0 && k < 10000; k++)
    snprintf(p, plen, "%s/%s_%d.csv", dir, stem, k);
  rc = msnap__write_file_atomic(p, b.p ? b.p : "", b.len);
  free(b.p);
  if (rc == 0 && path) {
    *path = p;
    return 0;
  }
  free(p);
  return rc;
}

/* YYYYmmddHHMMSS of now, local time (std::put_time "%Y%m%d%H%M%S"). */
void msnap__usage_stamp(char out[32]) {
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(out, 32, "%Y%m%d%H%M%S", &tmv);
}

static int check_device(msnap_allocator_t *a, int device, const char *fn) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "%s: NULL allocator", fn);
  if (device < 0 || device >= msnap_device_count(a))
    return msnap__set_error(MSNAP_EINVAL, "%s: invalid device %d", fn, device);
  return 0;
}

int msnap_save_dev_mem_usage_info(msnap_allocator_t *a, int device,
                                  const char *dir, char **path) {
  int rc = check_device(a, device, "save_dev_mem_usage_info");
  if (rc) return rc;
  char *d = msnap__usage_dir(dir);
  if (d == NULL) return MSNAP_EIO;
  char stamp[32];
  msnap__usage_stamp(stamp);
  rc = msnap__usage_csv(a, device, d, true, stamp, false, path);
  free(d);
  return rc;
}

int msnap_dump_usage_reports(msnap_allocator_t *a, int device,
                             const char *dir) {
  int rc = check_device(a, device, "dump_usage_reports");
  if (rc) return rc;
  msnap_usage_kind_t kind = msnap__usage_kind();
  if (kind == MSNAP_USAGE_NONE) return 0;
  char *d = msnap__usage_dir(dir);
  if (d == NULL) return MSNAP_EIO;
  char stamp[32];
  msnap__usage_stamp(stamp);
  int cann_rc = 0;
  if (kind == MSNAP_USAGE_CANN || kind == MSNAP_USAGE_BOTH)
    cann_rc = msnap__usage_csv(a, device, d, true, stamp, false, NULL);
  if (kind == MSNAP_USAGE_MEMSNAP || kind == MSNAP_USAGE_BOTH) {
    rc = msnap__usage_csv(a, device, d, false, stamp, false, NULL);
    if (rc != 0) {
      free(d);
      return rc;
    }
  }
  free(d);
  return cann_rc;
}
