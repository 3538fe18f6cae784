/*
 * oom.c -- out-of-memory observers, torch_npu's OOM_SNAPSHOT_ENABLE /
 * OOM_SNAPSHOT_PATH automatic dump, and the memory-usage report (the
 * saveDevMemUsageInfo CSV).
 *
 * Observers are kept in the recorder (rec->lock guards the list).  On an
 * OOM the allocator records the `oom` trace entry, releases the device
 * lock and calls msnap__oom_notify, which (with no library lock held):
 *   1. writes the automatic dump when OOM_SNAPSHOT_ENABLE was set at
 *      allocator creation: oom_snapshot_<pid>_<YYYYmmddHHMMSS>.pickle and
 *      device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv in OOM_SNAPSHOT_PATH
 *      (default "."), each through a temporary file and rename(2) so that
 *      a reader never sees a truncated file.  Names that already exist get
 *      a "_<n>" suffix: two OOMs in the same second give two files;
 *   2. calls every attached observer in attachment order.  An observer may
 *      call msnap_dump_snapshot (no lock is held).
 * Automatic dumps are serialized by oom_dump_lock, which is never taken
 * with a device lock held.
 *
 * OOM_SNAPSHOT_ENABLE (read by msnap__oom_env_init at allocator creation):
 * "0"/unset/non-numeric = off; "2" = history "state" (ring of 1 entry,
 * python stacks, context all); any other non-zero number = full history
 * (unbounded ring, python stacks, context all).  Unlike torch_npu no
 * interpreter call is made at the OOM point: the dump is written from C.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "history.h"

static pthread_mutex_t oom_dump_lock = PTHREAD_MUTEX_INITIALIZER;

void msnap__oom_atfork(int phase) {
  msnap__fork_mutex(&oom_dump_lock, phase);
}

int msnap_attach_oom_observer(msnap_allocator_t *a, msnap_oom_observer_cb cb,
                              void *arg) {
  if (a == NULL || cb == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "attach_oom_observer: NULL allocator or callback");
  msnap_recorder_t *r = msnap__recorder_get(a, true);
  if (r == NULL) return MSNAP_ENOMEM;
  pthread_mutex_lock(&r->lock);
  if (r->nobservers == r->observers_cap) {
    uint32_t cap = r->observers_cap ? r->observers_cap * 2 : 4;
    msnap_oom_observer_t *n = realloc(r->observers, cap * sizeof *n);
    if (n == NULL) {
      pthread_mutex_unlock(&r->lock);
      return MSNAP_ENOMEM;
    }
    r->observers = n;
    r->observers_cap = cap;
  }
  r->observers[r->nobservers++] = (msnap_oom_observer_t){cb, arg};
  pthread_mutex_unlock(&r->lock);
  return 0;
}

/* Parse OOM_SNAPSHOT_ENABLE like torch_npu (strtol, non-numeric = 0). */
static int oom_env_mode(void) {
  const char *s = getenv("OOM_SNAPSHOT_ENABLE");
  if (s == NULL || *s == '\0') return 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s) {
    fprintf(stderr,
            "memsnap: OOM_SNAPSHOT_ENABLE='%s' is not a number; OOM "
            "snapshots stay off\n", s);
    return 0;
  }
  return v == 0 ? 0 : (v == 2 ? 2 : 1);
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

/*
 * Read OOM_SNAPSHOT_ENABLE / OOM_SNAPSHOT_PATH once for a new allocator
 * (alloc.c calls this at the end of msnap_allocator_create).  A non-zero
 * mode turns history on; an invalid path only warns.
 */
void msnap__oom_env_init(msnap_allocator_t *a) {
  int mode = oom_env_mode();
  if (mode == 0) return;
  msnap_recorder_t *r = msnap__recorder_get(a, true);
  if (r == NULL) return;
  const char *path = getenv("OOM_SNAPSHOT_PATH");
  pthread_mutex_lock(&r->lock);
  if (r->oom_inited) { /* once per allocator */
    pthread_mutex_unlock(&r->lock);
    return;
  }
  r->oom_inited = true;
  r->oom_mode = mode;
  free(r->oom_path);
  r->oom_path = path && *path ? strdup(path) : NULL;
  pthread_mutex_unlock(&r->lock);
  free(oom_dir(path && *path ? path : NULL)); /* warn early */
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = MSNAP_CONTEXT_ALL;
  o.stacks = MSNAP_STACKS_PYTHON;
  o.max_entries = mode == 2 ? 1 : UINT64_MAX;
  (void)msnap_record_history(a, &o);
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

static void oom_auto_dump(msnap_allocator_t *a, msnap_recorder_t *r,
                          int device) {
  pthread_mutex_lock(&r->lock);
  char *configured = r->oom_path ? strdup(r->oom_path) : NULL;
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_lock(&oom_dump_lock);
  char *dir = oom_dir(configured);
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
    snprintf(stem, sizeof stem, "device_%d_memUsageInfo_%s", device, ts);
    char *csv = oom_unique_path(dir, stem, ".csv");
    if (csv != NULL) {
      int rc = msnap__usage_report(a, device, csv);
      if (rc != 0)
        fprintf(stderr, "memsnap: memory usage report %s not written: %s\n",
                csv, msnap_strerror(rc));
    }
    free(pk);
    free(csv);
    free(dir);
  }
  pthread_mutex_unlock(&oom_dump_lock);
  free(configured);
}

/*
 * Called by the allocator after an allocation failed for good (after the
 * `oom` trace entry), with no library lock held.  Runs the automatic dump
 * and then every observer.
 */
void msnap__oom_notify(msnap_allocator_t *a, int device, uint64_t alloc_size,
                       uint64_t device_total, uint64_t device_free) {
  msnap_recorder_t *r = msnap__recorder_get(a, false);
  if (r == NULL) return;
  pthread_mutex_lock(&r->lock);
  int mode = r->oom_mode;
  uint32_t n = r->nobservers;
  msnap_oom_observer_t local[16];
  msnap_oom_observer_t *obs = n <= 16 ? local : malloc(n * sizeof *obs);
  if (obs == NULL) n = 0;
  else if (n) memcpy(obs, r->observers, n * sizeof *obs);
  pthread_mutex_unlock(&r->lock);
  if (mode != 0) oom_auto_dump(a, r, device);
  for (uint32_t i = 0; i < n; i++)
    obs[i].cb(device, alloc_size, device_total, device_free, obs[i].arg);
  if (obs != local) free(obs);
}

/* ---- memory-usage report ------------------------------------------------- */

typedef struct usage_buf_s {
  char *p;
  size_t len, cap;
  int err;
} usage_buf_t;

__attribute__((format(printf, 2, 3))) static void ub_printf(usage_buf_t *b,
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
    size_t cap = b->cap ? b->cap * 2 : 1024;
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

static const char *const pool_names[MSNAP_STAT_TYPES] = {"all", "small_pool",
                                                         "large_pool"};

/*
 * Build the CSV text of one device (or all when device < 0):
 *   device,pool,total_bytes,free_bytes,reserved_bytes,allocated_bytes,
 *   active_bytes,requested_bytes,peak_reserved_bytes,peak_allocated_bytes,
 *   note
 * one row per pool (all / small_pool / large_pool, from msnap_stats_get)
 * plus a "workspace" row; total/free come from the runtime and are left
 * empty, with the reason in `note` and on stderr, when it cannot say.
 */
static int usage_text(msnap_allocator_t *a, int device, usage_buf_t *b) {
  int nd = msnap_device_count(a);
  ub_printf(b, "device,pool,total_bytes,free_bytes,reserved_bytes,"
               "allocated_bytes,active_bytes,requested_bytes,"
               "peak_reserved_bytes,peak_allocated_bytes,note\n");
  for (int d = 0; d < nd; d++) {
    if (device >= 0 && d != device) continue;
    msnap_stats_t st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    st.version = MSNAP_STATS_VERSION;
    int src = msnap_stats_get(a, d, &st);
    size_t fb = 0, tb = 0;
    int mrc = msnap_mem_get_info(a, d, &fb, &tb);
    char note[200] = "";
    if (mrc != 0) {
      snprintf(note, sizeof note,
               "runtime could not report total/free memory (%s)",
               msnap_strerror(mrc));
      fprintf(stderr, "memsnap: device %d: %s\n", d, note);
    }
    if (src != 0) {
      ub_printf(b, "%d,all,,,,,,,,,statistics unavailable (%s)\n", d,
                msnap_strerror(src));
      continue;
    }
    for (int k = 0; k < MSNAP_STAT_TYPES; k++) {
      ub_printf(b, "%d,%s,", d, pool_names[k]);
      if (k == MSNAP_STAT_ALL && mrc == 0)
        ub_printf(b, "%zu,%zu,", tb, fb);
      else
        ub_printf(b, ",,");
      ub_printf(b,
                "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                ",%" PRId64 ",%s\n",
                st.reserved_bytes[k].current, st.allocated_bytes[k].current,
                st.active_bytes[k].current, st.requested_bytes[k].current,
                st.reserved_bytes[k].peak, st.allocated_bytes[k].peak,
                k == MSNAP_STAT_ALL ? note : "");
    }
    uint64_t wr, wa;
    msnap__ws_totals(a, d, &wr, &wa);
    ub_printf(b,
              "%d,workspace,,,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",,,,"
              "not included in the all row\n",
              d, wr, wa, wa);
  }
  return b->err;
}

int msnap__usage_report(msnap_allocator_t *a, int device, const char *path) {
  usage_buf_t b = {0};
  int rc = usage_text(a, device, &b);
  if (rc == 0) rc = msnap__write_file_atomic(path, b.p, b.len);
  free(b.p);
  return rc;
}

int msnap_write_usage_report(msnap_allocator_t *a, const char *path) {
  if (a == NULL || path == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "write_usage_report: NULL allocator or path");
  return msnap__usage_report(a, -1, path);
}
