/*
 * usage.c (api layer) -- the memory-usage CSV files written next to
 * snapshot dumps.
 *
 * CANN's report (torch_npu saveDevMemUsageInfo, NPUCachingAllocator.cpp,
 * called by torch_npu.npu.memory._dump_snapshot and so by every
 * OOM_SNAPSHOT dump; its text is alloc/oom.c's msnap__cann_usage_text) to
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

msnap_usage_kind_t msnap__usage_kind(void) {
  static const char *const words[] = {"cann", "memsnap", "both", "none",
                                      NULL};
  return (msnap_usage_kind_t)msnap__env_choice(MSNAP_ENV_USAGE_REPORT, words,
                                               MSNAP_USAGE_CANN);
}

char *msnap__usage_dir(const char *configured) {
  const char *p = configured;
  if (p == NULL || *p == '\0') {
    p = msnap__env_get(MSNAP_ENV_OOM_SNAPSHOT_PATH);
    if (p == NULL || *p == '\0') p = ".";
  }
  /* Not resolved here: the CSV is written through the atomic writer, which
   * walks the path under the protected_symlinks rule (base/outpath.c). */
  struct stat st;
  int e = stat(p, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (e != 0) {
    if (p != configured && strcmp(p, ".") != 0)
      msnap__set_error_errno(MSNAP_EIO, e, "OOM_SNAPSHOT_PATH '%s' is not an "
                             "existing directory", p);
    else
      msnap__set_error_errno(MSNAP_EIO, e, "usage report directory '%s' is "
                             "not an existing directory", p);
    return NULL;
  }
  char *d = strdup(p);
  if (d == NULL) msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  return d;
}

int msnap__usage_csv(msnap_allocator_t *a, int device, const char *dir,
                     bool cann, const char *stamp, bool unique,
                     char **path) {
  if (path) *path = NULL;
  char *text = NULL;
  size_t len = 0;
  int rc = cann ? msnap__cann_usage_text(a, device, &text, &len)
                : msnap__usage_report_text(a, device, &text, &len);
  if (rc != 0) return rc;
  char stem[96];
  snprintf(stem, sizeof stem, "device_%d_%s_%s", device,
           cann ? "memUsageInfo" : "memsnapUsage", stamp);
  size_t plen = strlen(dir) + sizeof stem + 32;
  char *p = malloc(plen);
  if (p == NULL) {
    free(text);
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  }
  if (unique) {
    /* A name of our own, created with O_EXCL: "_<n>" when it exists (an
     * earlier dump, or a link someone planted), no check-then-open gap. */
    free(p);
    p = msnap__name_reserve(dir, stem, ".csv");
    if (p == NULL) {
      free(text);
      return MSNAP_EIO;
    }
  } else {
    snprintf(p, plen, "%s/%s.csv", dir, stem);
  }
  rc = msnap__write_file_atomic(p, text ? text : "", len);
  free(text);
  if (rc != 0 && unique) msnap__name_unreserve(p);
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
