/*
 * oom.c -- out-of-memory observers (torch.cuda.memory._record_memory_history's
 * companion attach_out_of_memory_observer) and the memory-usage report
 * (torch_npu's saveDevMemUsageInfo CSV).
 *
 * Observers live in the allocator (a->observers, guarded by a->obs_lock,
 * MSNAP_RANK_OBSERVERS).  On an OOM the allocator records the `oom` trace
 * entry, releases the device lock and calls msnap__oom_notify, which
 * copies the list under obs_lock and then, with no library lock held,
 * calls every observer in attachment order.  An observer may call
 * msnap_dump_snapshot.  The api layer's OOM_SNAPSHOT_ENABLE dump
 * (api/oom_dump.c) is such an observer, attached by msnap_allocator_create
 * before any other, so it runs first; library-owned observers carry a
 * `release` that frees their argument when the allocator is destroyed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"
#include "base/sink.h"

/* ---- observers ------------------------------------------------------------ */

int msnap__oom_observer_add(msnap_allocator_t *a, msnap_oom_observer_cb cb,
                            void *arg, void (*release)(void *arg),
                            bool unique, bool on_device_error) {
  msnap__mutex_lock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
  if (unique) {
    for (uint32_t i = 0; i < a->nobservers; i++) {
      if (a->observers[i].cb == cb) {
        msnap__mutex_unlock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
        return 1;
      }
    }
  }
  if (MSNAP_GROW(a->observers, a->observers_cap, a->nobservers + 1) != 0) {
    msnap__mutex_unlock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
    return MSNAP_ENOMEM;
  }
  a->observers[a->nobservers++] =
      (msnap_oom_observer_t){cb, arg, release, on_device_error};
  msnap__mutex_unlock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
  return 0;
}

int msnap_attach_oom_observer(msnap_allocator_t *a, msnap_oom_observer_cb cb,
                              void *arg) {
  if (a == NULL || cb == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "attach_oom_observer: NULL allocator or callback");
  int rc = msnap__oom_observer_add(a, cb, arg, NULL, false, false);
  return rc < 0 ? rc : 0;
}

/* Call the observers (only the on_device_error ones when `errors_only`)
 * from a copy of the list, with no library lock held. */
static void notify(msnap_allocator_t *a, int device, uint64_t alloc_size,
                   uint64_t device_total, uint64_t device_free,
                   bool errors_only) {
  msnap__mutex_lock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
  uint32_t n = a->nobservers;
  msnap_oom_observer_t local[16];
  msnap_oom_observer_t *obs = n <= 16 ? local : malloc(n * sizeof *obs);
  if (obs == NULL) n = 0;
  else if (n) memcpy(obs, a->observers, n * sizeof *obs);
  msnap__mutex_unlock(&a->obs_lock, MSNAP_RANK_OBSERVERS);
  for (uint32_t i = 0; i < n; i++)
    if (!errors_only || obs[i].on_device_error)
      obs[i].cb(device, alloc_size, device_total, device_free, obs[i].arg);
  if (obs != local) free(obs);
}

void msnap__oom_notify(msnap_allocator_t *a, int device, uint64_t alloc_size,
                       uint64_t device_total, uint64_t device_free) {
  notify(a, device, alloc_size, device_total, device_free, false);
}

void msnap__oom_notify_device_error(msnap_allocator_t *a, int device) {
  size_t f = 0, t = 0;
  if (device < 0 || device >= a->ndevices ||
      a->rt->mem_get_info(a->rt_ctx, device, &f, &t) != 0)
    f = t = 0;
  notify(a, device, 0, t, f, true);
}

/*
 * msnap_notify_device_error: a framework reports a failed device call's
 * error text (torch_npu's NPU_CHECK_ERROR / NPUQueue error paths).  When
 * the text is CANN's OOM (isCannOOM: "EL0004" or "Failed to allocate")
 * the on_device_error observers run -- the OOM_SNAPSHOT dump -- and 1 is
 * returned; otherwise 0.
 */
int msnap_notify_device_error(msnap_allocator_t *a, int device,
                              const char *message) {
  if (a == NULL || message == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "notify_device_error: NULL allocator or message");
  if (device < 0 || device >= a->ndevices)
    return msnap__set_error(MSNAP_EINVAL,
                            "notify_device_error: invalid device %d", device);
  if (!msnap__is_cann_oom_text(message))
    return 0;
  msnap__oom_notify_device_error(a, device);
  return 1;
}

/* Free the list (allocator destruction), releasing library-owned
 * arguments. */
void msnap__oom_observers_destroy(msnap_allocator_t *a) {
  for (uint32_t i = 0; i < a->nobservers; i++)
    if (a->observers[i].release != NULL)
      a->observers[i].release(a->observers[i].arg);
  free(a->observers);
  a->observers = NULL;
  a->nobservers = a->observers_cap = 0;
}

/* ---- memory-usage report ------------------------------------------------- */

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
static int usage_text(msnap_allocator_t *a, int device, msnap_strbuf_t *b) {
  int nd = msnap_device_count(a);
  msnap__strbuf_printf(b, "device,pool,total_bytes,free_bytes,reserved_bytes,"
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
      msnap__strbuf_printf(b, "%d,all,,,,,,,,,statistics unavailable (%s)\n", d,
                msnap_strerror(src));
      continue;
    }
    for (int k = 0; k < MSNAP_STAT_TYPES; k++) {
      msnap__strbuf_printf(b, "%d,%s,", d, pool_names[k]);
      if (k == MSNAP_STAT_ALL && mrc == 0)
        msnap__strbuf_printf(b, "%zu,%zu,", tb, fb);
      else
        msnap__strbuf_printf(b, ",,");
      msnap__strbuf_printf(b,
                "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                ",%" PRId64 ",%s\n",
                st.reserved_bytes[k].current, st.allocated_bytes[k].current,
                st.active_bytes[k].current, st.requested_bytes[k].current,
                st.reserved_bytes[k].peak, st.allocated_bytes[k].peak,
                k == MSNAP_STAT_ALL ? note : "");
    }
    uint64_t wr, wa;
    msnap__ws_totals(a, d, &wr, &wa);
    msnap__strbuf_printf(b,
              "%d,workspace,,,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",,,,"
              "not included in the all row\n",
              d, wr, wa, wa);
  }
  return b->err;
}

/*
 * CANN's per-module report of one device (torch_npu saveDevMemUsageInfo):
 * the runtime's mem_usage_info op (aclrtGetMemUsageInfo(device, rows[128],
 * 128, &count)) as
 *
 *   moduleName,curMemSize(MB),memPeakSize(MB)
 *   <name>,<bytes / 2^20 with 4 decimals>,<same>
 *
 * one row per module, at most 128 ("moduleCount is unreliable"; a warning
 * on stderr names a larger count).  A name runs to its NUL or its 32
 * bytes; a line break in it becomes '?' (one row per module).
 */
#define CANN_MAX_MODULES 128 /* torch_npu kMaxModuleNum */

int msnap__cann_usage_text(msnap_allocator_t *a, int device, char **text,
                           size_t *len) {
  if (a->rt->mem_usage_info == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "the %s runtime has no "
                            "aclrtGetMemUsageInfo",
                            a->rt->name ? a->rt->name : "?");
  msnap_mem_usage_t *rows = calloc(CANN_MAX_MODULES, sizeof *rows);
  if (rows == NULL) return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  size_t n = 0;
  int rc = a->rt->mem_usage_info(a->rt_ctx, device, rows, CANN_MAX_MODULES,
                                 &n);
  if (rc != 0) {
    free(rows);
    return rc;
  }
  msnap_strbuf_t b = {0};
  msnap__strbuf_printf(&b, "moduleName,curMemSize(MB),memPeakSize(MB)\n");
  for (size_t i = 0; i < n && i < CANN_MAX_MODULES; i++) {
    char name[sizeof rows[i].name + 1];
    memcpy(name, rows[i].name, sizeof rows[i].name);
    name[sizeof rows[i].name] = '\0';
    for (char *c = name; *c; c++)
      if (*c == '\n' || *c == '\r') *c = '?';
    msnap__strbuf_printf(&b, "%s,%.4f,%.4f\n", name,
              (double)rows[i].cur_bytes / 1048576.0,
              (double)rows[i].peak_bytes / 1048576.0);
  }
  if (n > CANN_MAX_MODULES)
    fprintf(stderr, "memsnap: warning: CANN reported %zu memory modules on "
            "device %d; the usage CSV has the first %d\n", n, device,
            CANN_MAX_MODULES);
  free(rows);
  if (b.err) {
    free(b.p);
    return msnap__set_error(b.err, "out of host memory");
  }
  *text = b.p ? b.p : calloc(1, 1);
  *len = b.len;
  return *text ? 0 : msnap__set_error(MSNAP_ENOMEM, "out of host memory");
}

int msnap__usage_report_text(msnap_allocator_t *a, int device, char **text,
                             size_t *len) {
  msnap_strbuf_t b = {0};
  int rc = usage_text(a, device, &b);
  if (rc != 0) {
    free(b.p);
    return rc;
  }
  *text = b.p;
  *len = b.len;
  return 0;
}

int msnap__usage_report(msnap_allocator_t *a, int device, const char *path) {
  msnap_strbuf_t b = {0};
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
