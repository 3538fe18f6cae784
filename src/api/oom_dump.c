/*
 * oom_dump.c -- torch_npu's OOM_SNAPSHOT_ENABLE / OOM_SNAPSHOT_PATH
 * automatic dump, as an OOM observer of the allocator.
 *
 * msnap_allocator_create (create.c) calls msnap__oom_dump_init, which
 * reads both variables once for the new allocator (base/env.c parses
 * OOM_SNAPSHOT_ENABLE: "0"/unset/non-numeric = off; "2" = history "state"
 * (ring of 1 entry, python stacks, context all); any other non-zero number
 * = full history (unbounded ring, python stacks, context all)).  When on,
 * it attaches oom_dump_observer first among the allocator's observers
 * (alloc/oom.c calls them in attachment order after an OOM, with no
 * library lock held) and turns history on.  An invalid path only warns.
 *
 * On an OOM the observer writes oom_snapshot_<pid>_<YYYYmmddHHMMSS>.pickle
 * and, as torch_npu's _dump_snapshot does, the usage CSV of api/usage.c
 * (CANN's device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv by default) in
 * OOM_SNAPSHOT_PATH (default "."), each through a temporary file and
 * rename(2) so that a reader never sees a truncated file.  Names that
 * already exist get a "_<n>" suffix: two OOMs in the same second give two
 * files.  It also runs on device errors CANN reports as OOM
 * (msnap_notify_device_error), as torch_npu's NPU_CHECK_ERROR calls its
 * oom_observer().  Automatic
 * dumps are serialized by oom_dump_lock (MSNAP_RANK_OOM_DUMP: outer to the
 * device locks the snapshot takes).  Unlike torch_npu no interpreter call
 * is made at the OOM point: the dump is written from C.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"

static pthread_mutex_t oom_dump_lock = PTHREAD_MUTEX_INITIALIZER;

/* Fork safety (alloc/fork.c takes every lower lock): oom_dump_lock is the
 * outermost lock, so its prepare handler must run before the alloc
 * layer's.  pthread_atfork runs prepare handlers in the reverse order of
 * registration, hence the registration after the first allocator exists
 * (msnap__allocator_new registered the alloc layer's handlers). */
static void oom_fork_prepare(void) { pthread_mutex_lock(&oom_dump_lock); }
static void oom_fork_release(void) { pthread_mutex_unlock(&oom_dump_lock); }
static void oom_fork_install(void) {
  pthread_atfork(oom_fork_prepare, oom_fork_release, oom_fork_release);
}
static pthread_once_t oom_fork_once = PTHREAD_ONCE_INIT;

/* The observer's argument: the allocator and the configured directory
 * (NULL = "."); freed with the allocator (oom_dump_release). */
typedef struct oom_dump_s {
  msnap_allocator_t *a;
  char *path;
} oom_dump_t;

static void oom_dump_release(void *arg) {
  oom_dump_t *od = arg;
  free(od->path);
  free(od);
}

/* Resolve the dump directory; NULL (with a message on stderr) when it
 * does not exist or is not a writable directory.  Caller frees. */
static char *oom_dir(const char *configured) {
  const char *p = configured ? configured : ".";
  char *real = realpath(p, NULL);
  struct stat st;
  if (real == NULL || stat(real, &st) != 0 || !S_ISDIR(st.st_mode) ||
      access(real, W_OK | X_OK) != 0) {
    int e = errno;
    fprintf(stderr,
            "memsnap: OOM_SNAPSHOT_PATH '%s' is invalid (%s): it must be an "
            "existing writable directory; no OOM snapshot is written\n",
            p, real == NULL || e ? strerror(e ? e : ENOTDIR)
                                 : "not a writable directory");
    free(real);
    return NULL;
  }
  return real;
}

/* "<dir>/<stem><suffix>" that does not exist yet (suffix "_1", "_2"... on
 * collisions).  Caller holds oom_dump_lock and frees the result. */
static char *oom_unique_path(const char *dir, const char *stem,
                             const char *ext) {
  size_t len = strlen(dir) + strlen(stem) + strlen(ext) + 32;
  char *p = malloc(len);
  if (p == NULL) return NULL;
  for (int n = 0; n < 10000; n++) {
    if (n == 0)
      snprintf(p, len, "%s/%s%s", dir, stem, ext);
    else
      snprintf(p, len, "%s/%s_%d%s", dir, stem, n, ext);
    if (access(p, F_OK) != 0) return p;
  }
  free(p);
  return NULL;
}

/* The observer: both files of one OOM, under oom_dump_lock (which is
 * taken before the device locks of the snapshot). */
static void oom_dump_observer(int device, uint64_t alloc_size,
                              uint64_t device_total, uint64_t device_free,
                              void *arg) {
  (void)alloc_size;
  (void)device_total;
  (void)device_free;
  const oom_dump_t *od = arg;
  msnap_allocator_t *a = od->a;
  msnap__mutex_lock(&oom_dump_lock, MSNAP_RANK_OOM_DUMP);
  char *dir = oom_dir(od->path);
  if (dir != NULL) {
    char ts[32], stem[96];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(ts, sizeof ts, "%Y%m%d%H%M%S", &tmv);
    snprintf(stem, sizeof stem, "oom_snapshot_%ld_%s", (long)getpid(), ts);
    char *pk = oom_unique_path(dir, stem, ".pickle");
    if (pk != NULL) {
      int rc = msnap_dump_snapshot(a, NULL, pk);
      if (rc != 0)
        fprintf(stderr, "memsnap: OOM snapshot %s not written: %s (%s)\n",
                pk, msnap_strerror(rc), msnap_last_error());
      else
        fprintf(stderr, "memsnap: device %d out of memory; snapshot "
                "written to %s\n", device, pk);
    }
    /* _dump_snapshot's usage CSV (api/usage.c): CANN's report by
     * default, memsnap's with MEMSNAP_USAGE_REPORT=memsnap|both. */
    msnap_usage_kind_t kind = msnap__usage_kind();
    for (int k = 0; k < 2; k++) {
      bool cann = k == 0;
      if (kind == MSNAP_USAGE_NONE ||
          (cann && kind == MSNAP_USAGE_MEMSNAP) ||
          (!cann && kind == MSNAP_USAGE_CANN))
        continue;
      int rc = msnap__usage_csv(a, device, dir, cann, ts, true, NULL);
      if (rc == MSNAP_ENOTSUP && cann)
        fprintf(stderr, "memsnap: no CANN memory usage report for device %d "
                "(%s); set MEMSNAP_USAGE_REPORT=memsnap for memsnap's own\n",
                device, msnap_last_error());
      else if (rc != 0)
        fprintf(stderr, "memsnap: memory usage report of device %d not "
                "written: %s (%s)\n", device, msnap_strerror(rc),
                msnap_last_error());
    }
    free(pk);
    free(dir);
  }
  msnap__mutex_unlock(&oom_dump_lock, MSNAP_RANK_OOM_DUMP);
}

void msnap__oom_dump_init(msnap_allocator_t *a) {
  pthread_once(&oom_fork_once, oom_fork_install);
  int mode = msnap__env_oom_snapshot_mode();
  if (mode == 0) return;
  const char *path = msnap__env_get(MSNAP_ENV_OOM_SNAPSHOT_PATH);
  oom_dump_t *od = calloc(1, sizeof *od);
  if (od == NULL) return;
  od->a = a;
  od->path = path && *path ? strdup(path) : NULL;
  if (msnap__oom_observer_add(a, oom_dump_observer, od, oom_dump_release,
                              true, true) != 0) {
    oom_dump_release(od); /* once per allocator (or ENOMEM) */
    return;
  }
  free(oom_dir(od->path)); /* warn early */
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_ALL;
  o.stacks = MSNAP_STACKS_PYTHON;
  o.max_entries = mode == 2 ? 1 : UINT64_MAX;
  (void)msnap_record_history(a, &o);
}
