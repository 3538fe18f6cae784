/*
 * stats.c -- memory_stats(), the two resets and memory_summary()
 * (allocator-algorithm.md §14-§15).
 *
 * The counters themselves live in msnap_device_t.stats and are updated
 * inline under the device lock (alloc.h: msnap__stat_inc/dec).  This file
 * copies them out, resets them with PyTorch's rules (§14.4) and renders
 * the summary table byte for byte as torch.cuda.memory.memory_summary.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"

static msnap_device_t *stat_dev(msnap_allocator_t *a, int device,
                                const char *fn) {
  msnap_device_t *d = msnap__device(a, device);
  if (!d)
    msnap__set_error(MSNAP_EINVAL, "%s: invalid device %d", fn, device);
  return d;
}

int msnap_stats_get(msnap_allocator_t *a, int device, msnap_stats_t *out) {
  msnap_device_t *d = stat_dev(a, device, "msnap_stats_get");
  if (!d)
    return MSNAP_EINVAL;
  if (!out || out->size < sizeof *out)
    return msnap__set_error(MSNAP_EINVAL,
                            "msnap_stats_get: out->size must be "
                            "sizeof(msnap_stats_t) = %zu",
                            sizeof *out);
  uint32_t size = out->size;
  msnap__lock(&d->lock);
  *out = d->stats;
  msnap__unlock(&d->lock);
  out->size = size;
  out->version = MSNAP_STATS_VERSION;
  return 0;
}

int msnap_reset_peak_stats(msnap_allocator_t *a, int device) {
  msnap_device_t *d = stat_dev(a, device, "msnap_reset_peak_stats");
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  msnap_stats_t *s = &d->stats;
#define RESET_PEAK_ARR_(n)                                                    \
  for (int i = 0; i < MSNAP_STAT_TYPES; i++)                                  \
    s->n[i].peak = s->n[i].current;
  MSNAP_STAT_ARRAY_FIELDS(RESET_PEAK_ARR_)
#undef RESET_PEAK_ARR_
#define RESET_PEAK_ONE_(n) s->n.peak = s->n.current;
  MSNAP_STAT_FIELDS(RESET_PEAK_ONE_)
#undef RESET_PEAK_ONE_
  for (msnap_ppool_t *pp = d->ppools; pp; pp = pp->next)
    for (int i = 0; i < MSNAP_STAT_TYPES; i++)
      pp->reserved[i].peak = pp->reserved[i].current;
  for (uint32_t k = 0; k < d->nretired; k++)
    for (int i = 0; i < MSNAP_STAT_TYPES; i++)
      d->retired[k].reserved_bytes[i].peak = 0; /* current is 0 */
  msnap__ppool_retired_prune(d);
  msnap__unlock(&d->lock);
  return 0;
}

int msnap_reset_accumulated_stats(msnap_allocator_t *a, int device) {
  msnap_device_t *d = stat_dev(a, device, "msnap_reset_accumulated_stats");
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  msnap_stats_t *s = &d->stats;
#define RESET_ACC_ARR_(n)                                                     \
  for (int i = 0; i < MSNAP_STAT_TYPES; i++)                                  \
    s->n[i].allocated = s->n[i].freed = 0;
  MSNAP_STAT_ARRAY_FIELDS(RESET_ACC_ARR_)
#undef RESET_ACC_ARR_
#define RESET_ACC_ONE_(n) s->n.allocated = s->n.freed = 0;
  MSNAP_STAT_FIELDS(RESET_ACC_ONE_)
#undef RESET_ACC_ONE_
  s->num_alloc_retries = 0;
  s->num_ooms = 0;
  s->num_sync_all_streams = 0;
  s->num_device_alloc = 0;
  s->num_device_free = 0;
  /* torch_npu also zeroes num_oom_rejections (NPU L1811); upstream's
   * newest CUDA code does the same for its new counter. */
  s->num_oom_rejections = 0;
  for (msnap_ppool_t *pp = d->ppools; pp; pp = pp->next)
    for (int i = 0; i < MSNAP_STAT_TYPES; i++)
      pp->reserved[i].allocated = pp->reserved[i].freed = 0;
  for (uint32_t k = 0; k < d->nretired; k++)
    for (int i = 0; i < MSNAP_STAT_TYPES; i++)
      d->retired[k].reserved_bytes[i].allocated =
          d->retired[k].reserved_bytes[i].freed = 0;
  msnap__ppool_retired_prune(d);
  msnap__unlock(&d->lock);
  return 0;
}

/* ---- memory_summary ----------------------------------------------------- */

/* Python floor division (values are normally >= 0). */
static int64_t floordiv(int64_t v, int64_t d) {
  int64_t q = v / d;
  if ((v % d != 0) && ((v < 0) != (d < 0)))
    q--;
  return q;
}

/* The unit scaling shared by memory_summary's formatters: while the
 * reference value `pref` is at least `threshold`, move to the next of the
 * `nunits` units, dividing `v` (floor) and `pref` by `div`.  Returns the
 * unit index; *v is scaled in place. */
static int scale_units(int64_t *v, int64_t pref, double threshold,
                       int64_t div, int nunits) {
  int u = 0;
  double p = (double)pref;
  for (int k = 1; k < nunits && p >= threshold; k++) {
    u = k;
    *v = floordiv(*v, div);
    p /= (double)div;
  }
  return u;
}

/* _format_size(sz, pref_sz): 10 characters "%6d UUU". */
static void fmt_size(msnap_strbuf_t *b, int64_t sz, int64_t pref) {
  static const char *units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = scale_units(&sz, pref, 768 * 1024, 1024, 6);
  msnap__strbuf_printf(b, "%6" PRId64 " %s", sz, units[u]);
}

/* _format_count(cnt, pref_cnt): 10 characters "%7d U ". */
static void fmt_count(msnap_strbuf_t *b, int64_t cnt, int64_t pref) {
  static const char *units[] = {" ", "K", "M"};
  int u = scale_units(&cnt, pref, 750 * 1000, 1000, 3);
  msnap__strbuf_printf(b, "%7" PRId64 " %s ", cnt, units[u]);
}

/* torch_npu's variant: units "B ", "KB", "MB"... and a 7-wide number
 * (still 10 characters). */
static void fmt_size_npu(msnap_strbuf_t *b, int64_t sz, int64_t pref) {
  static const char *units[] = {"B ", "KB", "MB", "GB", "TB", "PB"};
  int u = scale_units(&sz, pref, 768 * 1024, 1024, 6);
  msnap__strbuf_printf(b, "%7" PRId64 " %s", sz, units[u]);
}

typedef void (*fmt_fn)(msnap_strbuf_t *, int64_t, int64_t);

static void line_start(msnap_strbuf_t *b, bool *first) {
  msnap__strbuf_printf(b, *first ? "|" : "|\n|");
  *first = false;
}

static void rule(msnap_strbuf_t *b, bool *first, char c) {
  line_start(b, first);
  char s[76];
  memset(s, c, 75);
  s[75] = 0;
  msnap__strbuf_printf(b, "%s", s);
}

static void row(msnap_strbuf_t *b, bool *first, const char *label,
                const msnap_stat_t *s, const msnap_stat_t *pref, fmt_fn f) {
  line_start(b, first);
  msnap__strbuf_printf(b, " %-21s | ", label);
  f(b, s->current, pref->current);
  msnap__strbuf_printf(b, " | ");
  f(b, s->peak, pref->peak);
  msnap__strbuf_printf(b, " | ");
  f(b, s->allocated, pref->allocated);
  msnap__strbuf_printf(b, " | ");
  f(b, s->freed, pref->freed);
  msnap__strbuf_printf(b, " ");
}

/*
 * memory_summary (§15).  The "npu" profile renders torch_npu's variant:
 * "NPU" wording, the header widths that keep 75 columns (device ID 18,
 * OOMs 13, retries 9), sizes as "%7d" + "B "/"KB"/"MB"..., and no
 * "Requested memory" rows (torch-npu-today.md §1.1).
 */
int msnap_memory_summary(msnap_allocator_t *a, int device, bool abbreviated,
                         char **out) {
  if (!out)
    return msnap__set_error(MSNAP_EINVAL, "msnap_memory_summary: NULL out");
  msnap_stats_t st;
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  int rc = msnap_stats_get(a, device, &st);
  if (rc != 0)
    return rc;
  bool npu = a->profile == MSNAP_PROFILE_NPU;
  msnap_strbuf_t b = {0};
  bool first = true;

  rule(&b, &first, '=');
  line_start(&b, &first);
  if (npu)
    msnap__strbuf_printf(&b, " %16s PyTorch NPU memory summary, device ID %-18d ", "",
              device);
  else
    msnap__strbuf_printf(&b, " %16s PyTorch CUDA memory summary, device ID %-17d ", "",
              device);
  rule(&b, &first, '-');
  line_start(&b, &first);
  if (npu)
    msnap__strbuf_printf(&b,
              "  %9s NPU OOMs: %-13" PRId64 " | %6s npuMalloc retries: "
              "%-9" PRId64 "  ",
              "", st.num_ooms, "", st.num_alloc_retries);
  else
    msnap__strbuf_printf(&b,
              "  %9s CUDA OOMs: %-12" PRId64 " | %6s cudaMalloc retries: "
              "%-8" PRId64 "  ",
              "", st.num_ooms, "", st.num_alloc_retries);
  rule(&b, &first, '=');
  line_start(&b, &first);
  msnap__strbuf_printf(&b, "        Metric         | Cur Usage  | Peak Usage | "
                "Tot Alloc  | Tot Freed  ");

  fmt_fn fsz = npu ? fmt_size_npu : fmt_size;
  struct {
    const msnap_stat_t *arr;
    const char *name;
    fmt_fn f;
  } metrics[] = {
      {st.allocated_bytes, "Allocated memory", fsz},
      {st.active_bytes, "Active memory", fsz},
      {st.requested_bytes, "Requested memory", fsz},
      {st.reserved_bytes, npu ? "NPU reserved memory" : "GPU reserved memory",
       fsz},
      {st.inactive_split_bytes, "Non-releasable memory", fsz},
      {st.allocation, "Allocations", fmt_count},
      {st.active, "Active allocs", fmt_count},
      {st.segment, npu ? "NPU reserved segments" : "GPU reserved segments",
       fmt_count},
      {st.inactive_split, "Non-releasable allocs", fmt_count},
  };
  for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
    if (npu && metrics[m].arr == st.requested_bytes)
      continue;
    const msnap_stat_t *arr = metrics[m].arr;
    rule(&b, &first, '-');
    row(&b, &first, metrics[m].name, &arr[MSNAP_STAT_ALL],
        &arr[MSNAP_STAT_ALL], metrics[m].f);
    if (!abbreviated) {
      row(&b, &first, "      from large pool", &arr[MSNAP_STAT_LARGE_POOL],
          &arr[MSNAP_STAT_ALL], metrics[m].f);
      row(&b, &first, "      from small pool", &arr[MSNAP_STAT_SMALL_POOL],
          &arr[MSNAP_STAT_ALL], metrics[m].f);
    }
  }
  rule(&b, &first, '-');
  row(&b, &first, "Oversize allocations", &st.oversize_allocations,
      &st.oversize_allocations, fmt_count);
  rule(&b, &first, '-');
  row(&b, &first, npu ? "Oversize NPU segments" : "Oversize GPU segments",
      &st.oversize_segments, &st.oversize_segments, fmt_count);
  rule(&b, &first, '=');
  msnap__strbuf_printf(&b, "|\n");
  if (b.err) {
    free(b.p);
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  }
  *out = b.p;
  return 0;
}
