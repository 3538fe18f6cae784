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
 * (oom_snapshot_rank<R>_<pid>_<YYYYmmddHHMMSS>.pickle when the process
 * knows its rank: msnap_set_process_rank or RANK, api/process.c, so that
 * the dumps of a job's ranks sort by rank in one shared directory)
 * and, as torch_npu's _dump_snapshot does, the usage CSV of api/usage.c
 * (CANN's device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv by default) in
 * OOM_SNAPSHOT_PATH (default "."), each through a temporary file and
 * rename(2) so that a reader never sees a truncated file.  Each name is
 * first created empty with O_CREAT | O_EXCL | O_NOFOLLOW
 * (msnap__name_reserve, base), so a name that exists -- an earlier dump,
 * or a link someone planted -- gets a "_<n>" suffix instead (two OOMs in
 * the same second give two files) and no other file is ever replaced.
 * An unusable OOM_SNAPSHOT_PATH (missing, not a directory, not writable,
 * reached through a refused link) is reported once per reason: when the
 * allocator is created, and at an OOM only if the reason changed.  It
 * also runs on device errors CANN reports as OOM
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

/* The observer's argument: the allocator, the configured directory
 * (NULL = ".") and the reason last reported for an unusable directory
 * (an errno; 0 = none), so that one reason is printed once; the reason
 * last said about each file of the dump (the snapshot, the usage report)
 * likewise, so that a failure repeated at every OOM is said once until
 * its reason changes or a dump succeeds; freed with the allocator
 * (oom_dump_release).  Used under oom_dump_lock. */
typedef struct oom_dump_s {
  msnap_allocator_t *a;
  char *path;
  int warned;
  /* [0] the snapshot, [1] the usage report: the reason last said, as
   * (memsnap error, errno) -- the message itself names a file whose name
   * changes every second; 0 = nothing said since the last success. */
  long said[2];
} oom_dump_t;

/* Print `msg` unless the reason (rc, the last errno) is the one said last
 * for `which`. */
static void oom_say(oom_dump_t *od, int which, int rc, const char *msg) {
  long key = (long)(rc < 0 ? -rc : rc) * 4096 + msnap_last_errno() + 1;
  if (od->said[which] == key) return;
  fputs(msg, stderr);
  od->said[which] = key;
}

static void oom_dump_release(void *arg) {
  oom_dump_t *od = arg;
  free(od->path);
  free(od);
}

/* The dump directory: "." or OOM_SNAPSHOT_PATH, which must be an existing
 * writable directory reached under the link rule of every output (a link
 * planted in a sticky world-writable directory is not followed).  Returns
 * it, or NULL after printing why -- once per reason and allocator. */
static const char *oom_dir(oom_dump_t *od) {
  const char *p = od->path ? od->path : ".";
  size_t n = strlen(p);
  char *probe = malloc(n + 3);
  if (probe == NULL) return NULL;
  snprintf(probe, n + 3, "%s/.", p); /* the directory itself, even "x/" */
  msnap_outpath_t o;
  int e = 0;
  const char *why = NULL;
  if (msnap__outpath_resolve(&o, probe) != 0) {
    e = msnap_last_errno() ? msnap_last_errno() : EINVAL;
    if (e == EACCES) why = msnap_last_error(); /* a refused link */
  } else {
    if (!S_ISDIR(o.st.st_mode))
      e = ENOTDIR;
    else if (faccessat(o.dirfd, o.name, W_OK | X_OK, 0) != 0)
      e = errno;
    msnap__outpath_release(&o);
  }
  free(probe);
  if (e == 0) {
    od->warned = 0;
    return p;
  }
  if (od->warned != e)
    fprintf(stderr,
            "memsnap: OOM_SNAPSHOT_PATH '%s' is invalid (%s): it must be an "
            "existing writable directory; no OOM snapshot is written\n",
            p, why ? why : strerror(e));
  od->warned = e;
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
  oom_dump_t *od = arg;
  msnap_allocator_t *a = od->a;
  msnap__mutex_lock(&oom_dump_lock, MSNAP_RANK_OOM_DUMP);
  const char *dir = oom_dir(od);
  if (dir != NULL) {
    char ts[32], stem[96];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(ts, sizeof ts, "%Y%m%d%H%M%S", &tmv);
    msnap_process_t proc;
    msnap__process_get(&proc);
    if (proc.rank >= 0)
      snprintf(stem, sizeof stem, "oom_snapshot_rank%lld_%ld_%s",
               (long long)proc.rank, (long)getpid(), ts);
    else
      snprintf(stem, sizeof stem, "oom_snapshot_%ld_%s", (long)getpid(), ts);
    char *pk = msnap__name_reserve(dir, stem, ".pickle");
    char msg[512];
    if (pk == NULL) {
      snprintf(msg, sizeof msg, "memsnap: no OOM snapshot is written: %s\n",
               msnap_last_error());
      oom_say(od, 0, MSNAP_EIO, msg);
    } else {
      int rc = msnap_dump_snapshot(a, NULL, pk);
      if (rc != 0) {
        /* The reason without the file name, which changes every time. */
        snprintf(msg, sizeof msg, "memsnap: OOM snapshot %s not written: %s "
                 "(%s)\n", pk, msnap_strerror(rc), msnap_last_error());
        oom_say(od, 0, rc, msg);
        msnap__name_unreserve(pk);
      } else {
        od->said[0] = 0;
        fprintf(stderr, "memsnap: device %d out of memory; snapshot "
                "written to %s\n", device, pk);
      }
    }
    /* _dump_snapshot's usage CSV (api/usage.c): CANN's report by
     * default in the npu profile (torch_npu's OOM path writes it; torch's
     * CUDA allocator has none, so the cuda profile writes none unless
     * MEMSNAP_USAGE_REPORT asks), memsnap's with
     * MEMSNAP_USAGE_REPORT=memsnap|both. */
    msnap_usage_kind_t kind = msnap__usage_kind();
    if (kind == MSNAP_USAGE_CANN && msnap_profile(a) != MSNAP_PROFILE_NPU &&
        msnap__env_get(MSNAP_ENV_USAGE_REPORT) == NULL)
      kind = MSNAP_USAGE_NONE;
    for (int k = 0; k < 2; k++) {
      bool cann = k == 0;
      if (kind == MSNAP_USAGE_NONE ||
          (cann && kind == MSNAP_USAGE_MEMSNAP) ||
          (!cann && kind == MSNAP_USAGE_CANN))
        continue;
      int rc = msnap__usage_csv(a, device, dir, cann, ts, true, NULL);
      if (rc == MSNAP_ENOTSUP && cann) {
        snprintf(msg, sizeof msg, "memsnap: no CANN memory usage report for "
                 "device %d (%s); set MEMSNAP_USAGE_REPORT=memsnap for "
                 "memsnap's own\n", device, msnap_last_error());
        oom_say(od, 1, rc, msg);
      } else if (rc != 0) {
        snprintf(msg, sizeof msg, "memsnap: memory usage report of device "
                 "%d not written: %s (%s)\n", device, msnap_strerror(rc),
                 msnap_last_error());
        oom_say(od, 1, rc, msg);
      } else {
        od->said[1] = 0;
      }
    }
    free(pk);
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
  if (od->path) { /* "dir/" -> "dir" (not "/"): names read "dir/oom_..." */
    size_t n = strlen(od->path);
    while (n > 1 && od->path[n - 1] == '/') od->path[--n] = '\0';
  }
  if (msnap__oom_observer_add(a, oom_dump_observer, od, oom_dump_release,
                              true, true) != 0) {
    oom_dump_release(od); /* once per allocator (or ENOMEM) */
    return;
  }
  msnap__mutex_lock(&oom_dump_lock, MSNAP_RANK_OOM_DUMP);
  (void)oom_dir(od); /* warn early (and only once for this reason) */
  msnap__mutex_unlock(&oom_dump_lock, MSNAP_RANK_OOM_DUMP);
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_ALL;
  o.stacks = MSNAP_STACKS_PYTHON;
  o.max_entries = mode == 2 ? 1 : UINT64_MAX;
  (void)msnap_record_history(a, &o);
}
