/*
 * cli_steps.c -- record_function ranges of a device and the training
 * steps among them, shared by `memsnap view` (annotation lanes, leaks
 * across steps) and `memsnap leaks` / `memsnap fleet`.
 *
 * Annotation device.  PyTorch records a record_function annotation for
 * the current device of the thread that ran it
 * (c10/cuda/CUDACachingAllocator.cpp, NativeCachingAllocator::
 * recordAnnotation: GetDevice, then that device's allocator; the callback
 * is torch/csrc/cuda/memory_snapshot.cpp's RecordFunction observer), and
 * memsnap's -1 means "no device".  One process driving several devices
 * therefore has every annotation on one of them (its current device,
 * usually 0).  A device with no annotation of its own takes those of
 * device -1, else those of the lowest other device (ann_device says
 * which), placed on its own trace by time_us like its own.
 *
 * Ranges.  external_annotations START/END pairs of that device, matched by
 * name (an END closes the latest open START of its name), in time order;
 * each is placed on the trace as states [s0, s1): s0 = the first entry at
 * or after its START's time_us, s1 the same for its END (a range still
 * open at the end of the file runs to state n).  Needs time_us in the
 * trace.  At most `max_ranges` are kept (the others counted in
 * `dropped`); kept ranges are sorted by (s0, s1).
 *
 * Steps.  The ranges of one repeated name, trailing digits ignored (with
 * a '#', '_', ' ' or '-' before them: "ProfilerStep#12" and
 * "ProfilerStep#13" are one name): with want == NULL the name with the
 * most ranges among those that never overlap themselves, occur at
 * least 3 times and hold at least one trace entry (a name whose ranges
 * are all empty -- a DataLoader's `enumerate(DataLoader)#...__next__`
 * with the data on the host, one more of them than steps -- is never
 * the step); ties: the name whose ranges cover more of the trace -- a
 * step holds its forward and backward parts -- then the name that
 * appears first; with want, the
 * first name (in order of appearance) equal to want, digits ignored on
 * both sides, that occurs at least twice.
 *
 * Invariants (cli_ranges_check, run after every cli_ranges_find in builds
 * with MSNAP_DEBUG >= 2): rg sorted by (s0, s1), s0 <= s1 <= n; steps in
 * increasing s0, each pair one of the ranges.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/base.h"

/* name without its trailing digits (and a '#', '_', ' ' or '-' before) */
static size_t norm_len(const char *p, size_t l) {
  size_t k = l;
  while (k > 0 && p[k - 1] >= '0' && p[k - 1] <= '9')
    k--;
  if (k < l && k > 0 && (p[k - 1] == '#' || p[k - 1] == '_' ||
                         p[k - 1] == ' ' || p[k - 1] == '-'))
    k--;
  return k ? k : l;
}

typedef struct ann_s {
  int64_t t;
  uint32_t idx;
} ann_t;

static int cmp_ann(const void *a, const void *b) {
  const ann_t *x = a, *y = b;
  if (x->t != y->t)
    return x->t < y->t ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int cmp_range(const void *a, const void *b) {
  const uint32_t *x = a, *y = b;
  if (x[1] != y[1])
    return x[1] < y[1] ? -1 : 1;
  return x[2] < y[2] ? -1 : x[2] > y[2];
}

/* Ranges by normalized name, then by position (index into rg); qsort's
 * context, per thread (fleet analyses files on several threads). */
static _Thread_local const msnap_snap_t *g_snap;
static _Thread_local const uint32_t *g_rg;
static int cmp_by_name(const void *a, const void *b) {
  uint32_t i = *(const uint32_t *)a, k = *(const uint32_t *)b;
  size_t li, lk;
  const char *pi = cli_str(g_snap, g_rg[3 * i], &li);
  const char *pk = cli_str(g_snap, g_rg[3 * k], &lk);
  li = norm_len(pi, li);
  lk = norm_len(pk, lk);
  int c = memcmp(pi, pk, li < lk ? li : lk);
  if (c)
    return c;
  if (li != lk)
    return li < lk ? -1 : 1;
  return i < k ? -1 : i > k;
}

void cli_ranges_free(cli_ranges_t *r) {
  free(r->rg);
  free(r->steps);
  memset(r, 0, sizeof *r);
}

/* The device whose annotations device dev uses (see the top of the
 * file); dev itself when no device has any. */
static int64_t annotation_device(const msnap_snap_t *s, int64_t dev) {
  bool own = false, none = false;
  int64_t other = INT64_MAX;
  for (uint32_t i = 0; i < s->nannotations; i++) {
    int64_t d = s->annotations[i].device;
    if (d == dev)
      own = true;
    else if (d == -1)
      none = true;
    else if (d < other)
      other = d;
  }
  return own ? dev : none ? -1 : other != INT64_MAX ? other : dev;
}

/* Match the START/END pairs of device dev's annotations into r->rg. */
static int pair_ranges(const msnap_snap_t *s, const msnap_trace_list_t *tl,
                       int64_t dev, uint32_t max_ranges, cli_ranges_t *r) {
  uint32_t na = 0;
  dev = r->ann_device = annotation_device(s, dev);
  for (uint32_t i = 0; i < s->nannotations; i++)
    na += s->annotations[i].device == dev;
  if (na == 0)
    return 0;
  ann_t *v = malloc((size_t)na * sizeof *v);
  uint32_t *open = malloc((size_t)na * sizeof *open); /* indices into v */
  r->rg = malloc(((size_t)(na < max_ranges ? na : max_ranges) + 1) * 3 *
                 sizeof *r->rg);
  if (!v || !open || !r->rg) {
    free(v);
    free(open);
    return -1;
  }
  uint32_t k = 0, nopen = 0;
  for (uint32_t i = 0; i < s->nannotations; i++)
    if (s->annotations[i].device == dev)
      v[k++] = (ann_t){s->annotations[i].time_us, i};
  qsort(v, na, sizeof *v, cmp_ann);
  for (uint32_t i = 0; i < na; i++) {
    const msnap_sannotation_t *an = &s->annotations[v[i].idx];
    if (an->is_start) {
      open[nopen++] = i;
      continue;
    }
    /* the latest open START of the same name */
    uint32_t j = nopen;
    while (j > 0 && s->annotations[v[open[j - 1]].idx].name != an->name)
      j--;
    if (j == 0)
      continue; /* END without START */
    uint32_t si = open[j - 1];
    memmove(&open[j - 1], &open[j], (nopen - j) * sizeof *open);
    nopen--;
    if (r->nrg >= max_ranges) {
      r->dropped++;
      continue;
    }
    r->rg[3 * r->nrg] = an->name;
    r->rg[3 * r->nrg + 1] = cli_entry_at_time(tl, v[si].t);
    r->rg[3 * r->nrg + 2] = cli_entry_at_time(tl, v[i].t);
    r->nrg++;
  }
  /* ranges still open at the end of the file run to its end */
  for (uint32_t j = 0; j < nopen; j++) {
    if (r->nrg >= max_ranges) {
      r->dropped++;
      continue;
    }
    r->rg[3 * r->nrg] = s->annotations[v[open[j]].idx].name;
    r->rg[3 * r->nrg + 1] = cli_entry_at_time(tl, v[open[j]].t);
    r->rg[3 * r->nrg + 2] = tl->n;
    r->nrg++;
  }
  free(v);
  free(open);
  qsort(r->rg, r->nrg, 3 * sizeof *r->rg, cmp_range);
  return 0;
}

int cli_ranges_find(const msnap_snap_t *s, int64_t dev, const char *want,
                    uint32_t max_ranges, cli_ranges_t *r) {
  memset(r, 0, sizeof *r);
  r->ann_device = dev;
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  if (!tl || tl->n == 0 ||
      !(msnap__tattr(s, &tl->v[tl->n - 1])->keys & MSNAP_K_TIME))
    return 0;
  if (pair_ranges(s, tl, dev, max_ranges, r) != 0) {
    cli_ranges_free(r);
    return -1;
  }
  if (r->nrg == 0)
    return 0;
  /* Group the ranges by normalized name. */
  uint32_t *ord = malloc((size_t)r->nrg * sizeof *ord);
  if (!ord) {
    cli_ranges_free(r);
    return -1;
  }
  for (uint32_t i = 0; i < r->nrg; i++)
    ord[i] = i;
  g_snap = s;
  g_rg = r->rg;
  qsort(ord, r->nrg, sizeof *ord, cmp_by_name);
  size_t lw = want ? norm_len(want, strlen(want)) : 0;
  uint32_t best = UINT32_MAX, best_cnt = 0, best_first = UINT32_MAX;
  uint64_t best_cover = 0;
  for (uint32_t g0 = 0, g1; g0 < r->nrg; g0 = g1) {
    size_t l0;
    const char *p0 = cli_str(s, r->rg[3 * ord[g0]], &l0);
    l0 = norm_len(p0, l0);
    bool overlap = false;
    uint32_t last_end = 0;
    uint64_t cover = 0;
    for (g1 = g0; g1 < r->nrg; g1++) {
      size_t l1;
      const char *p1 = cli_str(s, r->rg[3 * ord[g1]], &l1);
      if (norm_len(p1, l1) != l0 || memcmp(p0, p1, l0))
        break;
      if (g1 > g0 && r->rg[3 * ord[g1] + 1] < last_end)
        overlap = true;
      last_end = r->rg[3 * ord[g1] + 2];
      cover += r->rg[3 * ord[g1] + 2] - r->rg[3 * ord[g1] + 1];
    }
    uint32_t cnt = g1 - g0, first = ord[g0];
    if (want && l0 == lw && !memcmp(p0, want, l0) && r->nwant == 0)
      r->nwant = cnt;
    bool ok = want ? (l0 == lw && !memcmp(p0, want, l0) && cnt >= 2)
                   : (!overlap && cnt >= 3 && cover > 0 &&
                      (cnt > best_cnt ||
                       (cnt == best_cnt &&
                        (cover > best_cover ||
                         (cover == best_cover && first < best_first)))));
    if (want && ok && first >= best_first)
      ok = false; /* with want: the first name to appear */
    if (ok) {
      best = g0;
      best_cnt = cnt;
      best_first = first;
      best_cover = cover;
    }
  }
  if (best != UINT32_MAX) {
    r->steps = malloc((size_t)best_cnt * 2 * sizeof *r->steps);
    if (!r->steps) {
      free(ord);
      cli_ranges_free(r);
      return -1;
    }
    /* ord[best..best+cnt) are in position order: rg is sorted by s0 */
    for (uint32_t i = 0; i < best_cnt; i++) {
      r->steps[2 * i] = r->rg[3 * ord[best + i] + 1];
      r->steps[2 * i + 1] = r->rg[3 * ord[best + i] + 2];
    }
    r->nsteps = best_cnt;
    size_t l;
    const char *p = cli_str(s, r->rg[3 * ord[best]], &l);
    l = norm_len(p, l);
    if (l >= sizeof r->stepname)
      l = sizeof r->stepname - 1;
    memcpy(r->stepname, p, l);
    r->stepname[l] = 0;
    cli_sanitize(r->stepname);
  }
  free(ord);
  if (msnap_debug_level >= 2 && !cli_ranges_check(r, tl->n)) {
    fprintf(stderr, "memsnap: internal error: cli_ranges invariants\n");
    abort();
  }
  return 0;
}

bool cli_ranges_check(const cli_ranges_t *r, uint32_t n) {
  for (uint32_t i = 0; i < r->nrg; i++) {
    const uint32_t *x = &r->rg[3 * i];
    if (x[1] > x[2] || x[2] > n)
      return false;
    if (i && cmp_range(&r->rg[3 * (i - 1)], x) > 0)
      return false;
  }
  for (uint32_t i = 0; i < r->nsteps; i++)
    if (r->steps[2 * i] > r->steps[2 * i + 1] ||
        (i && r->steps[2 * i] < r->steps[2 * (i - 1)]))
      return false;
  return true;
}
