/*
 * cmd_leaks.c -- `memsnap leaks FILE...`: allocation sites whose live
 * memory grows step after step.
 *
 * Steps.  With one file: the ranges of its repeated record_function name
 * (cli_steps.c: ProfilerStep#N, or --step NAME), per device; the value of
 * a site at step k is the requested bytes of the trace's allocations from
 * that site live at the end of the step (state s1 of its range; lifetimes
 * from cli_pair_entries).  Blocks allocated before the trace are left
 * out: they can only be freed, never grow.  With several files: one step
 * per file, in the order given; the value of a site is the requested
 * bytes of its live blocks in that file (sites by the stack resolver of
 * cli_stacks.c, compared as text across files).
 *
 * Score.  Over the T = steps - 1 transitions a site grows in g and
 * shrinks in h; it is a leak candidate when its last value exceeds its
 * first and
 *     confidence = max(0, g - h) / T * (1 - 2^-T)
 * reaches --min-confidence (default 0.7): growth in every transition of
 * 2 gives 0.75, of 4 0.94, of 9 0.998; one growth among 9 transitions
 * (a cache filled once) 0.11.  T transitions reach 1 - 2^-T at most (0.5
 * for 2 files): a --min-confidence above that is lowered to it, with a
 * warning (usable_threshold), so that 2 files still list the sites that
 * grew.  Requested bytes, not block sizes: the same
 * requests give different block sizes as the allocator splits
 * differently.  The pseudo sites "<no stack>" (no stack recorded: unrelated
 * allocations lumped together) and "<no stack: allocated before the
 * trace>" are never candidates; "<no Python frames: ...>" is (the
 * allocations of autograd's backward thread in a recording of Python
 * stacks only: cli_site_leak_candidate).
 *
 * Memory: per site a few counters (values are folded in at each step
 * end: O(sites x steps) time, O(sites) memory); in files mode one file
 * at a time is loaded.
 */
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_RANGES 1000000u

typedef struct acc_s {
  uint64_t first, last, prev;
  uint32_t grown, shrunk, seen;
} acc_t;

static void acc_step(acc_t *a, uint64_t v) {
  if (a->seen == 0) {
    a->first = v;
  } else {
    a->grown += v > a->prev;
    a->shrunk += v < a->prev;
  }
  a->prev = a->last = v;
  a->seen++;
}

double cli_leak_confidence(uint32_t grown, uint32_t shrunk, uint32_t steps) {
  if (steps < 2 || grown <= shrunk)
    return 0.0;
  double t = steps - 1;
  return (double)(grown - shrunk) / t * (1.0 - pow(2.0, -t));
}

/*
 * The threshold to use over `steps` steps (>= 2): min_conf, or when that
 * is above the highest confidence the steps can give (growth in every
 * transition: 0.5 for 2 steps, below the default 0.7) that highest one,
 * so that any site that grew in every transition is still listed; the
 * warning (warn, n bytes, prefixed with `who`) then names it and how
 * many steps would reach min_conf.  warn is "" when min_conf is used.
 */
static double usable_threshold(uint32_t steps, double min_conf,
                               const char *who, const char *unit,
                               const char *verb, char *warn, size_t n) {
  warn[0] = '\0';
  double top = cli_leak_confidence(steps - 1, 0, steps);
  if (top >= min_conf)
    return min_conf;
  /* 1 - 2^-T stays below 1 (a double rounds it to 1 from T = 54) */
  uint32_t need = 0;
  for (uint32_t k = steps + 1; k <= 50 && !need; k++)
    if (cli_leak_confidence(k - 1, 0, k) >= min_conf)
      need = k;
  char more[96];
  if (need)
    snprintf(more, sizeof more, "%s %u %s to reach %.3f, or a lower "
             "--min-confidence", verb, need, unit,
             cli_leak_confidence(need - 1, 0, need));
  else
    snprintf(more, sizeof more, "no number of %s reaches %g: give a lower "
             "--min-confidence", unit, min_conf);
  snprintf(warn, n,
           "%s%u %s make %u %s: the highest confidence is %.3f, below "
           "--min-confidence %g; any site that grew in every transition "
           "is listed at %.3f (%s)",
           who, steps, unit, steps - 1,
           steps == 2 ? "transition" : "transitions", top, min_conf, top,
           more);
  return top;
}

static int cmp_leak(const void *a, const void *b) {
  const cli_leak_t *x = a, *y = b;
  if (x->confidence != y->confidence)
    return x->confidence > y->confidence ? -1 : 1;
  uint64_t gx = x->last - x->first, gy = y->last - y->first;
  if (gx != gy)
    return gx > gy ? -1 : 1;
  return strcmp(x->site, y->site);
}

/* Drop the candidates below min_conf (l->v is sorted by confidence). */
void cli_leaks_trim(cli_leaks_t *l, double min_conf) {
  while (l->n > 0 && l->v[l->n - 1].confidence < min_conf)
    free(l->v[--l->n].site);
}

void cli_leaks_free(cli_leaks_t *l) {
  for (uint32_t i = 0; i < l->n; i++)
    free(l->v[i].site);
  free(l->v);
  memset(l, 0, sizeof *l);
}

/* Append the candidate of accumulator a at `site` when it qualifies. */
static int add_candidate(cli_leaks_t *l, const char *site, cli_site_t key,
                         const acc_t *a, uint32_t allocs, double min_conf) {
  if (!cli_site_leak_candidate(site) || a->last <= a->first)
    return 0;
  double c = cli_leak_confidence(a->grown, a->shrunk, l->steps);
  if (c < min_conf)
    return 0;
  cli_leak_t *v = realloc(l->v, ((size_t)l->n + 1) * sizeof *v);
  if (!v)
    return -1;
  l->v = v;
  v[l->n] = (cli_leak_t){.site = strdup(site), .key = key,
                         .first = a->first,
                         .last = a->last, .grown = a->grown,
                         .shrunk = a->shrunk, .allocs = allocs,
                         .confidence = c};
  if (!v[l->n].site)
    return -1;
  l->n++;
  return 0;
}

int cli_leaks_steps(const msnap_snap_t *s, int64_t dev, const char *step,
                    double min_conf, cli_leaks_t *l) {
  memset(l, 0, sizeof *l);
  l->device = dev;
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  cli_ranges_t r;
  if (cli_ranges_find(s, dev, step, MAX_RANGES, &r) != 0)
    return -1;
  snprintf(l->stepname, sizeof l->stepname, "%s", r.stepname);
  l->steps = r.nsteps;
  l->ann_device = r.ann_device;
  if (r.nsteps < 2 && step && r.nrg > 0) {
    char name[128];
    snprintf(name, sizeof name, "%s", step);
    cli_sanitize(name);
    snprintf(l->why, sizeof l->why,
             r.nwant == 0 ? "no record_function range named \"%s\""
                          : "the step name \"%s\" occurs only once",
             name);
    cli_ranges_free(&r);
    return 0;
  }
  if (r.nsteps < 2) {
    /* A file without annotations says so before the trace's time_us is
     * asked for: time_us matters only to place annotations there are. */
    snprintf(l->why, sizeof l->why, "%s",
             !tl || tl->n == 0 ? "no trace on this device"
             : s->nannotations == 0
                 ? "no record_function annotations in the file "
                   "(external_annotations)"
             : !(msnap__tattr(s, &tl->v[tl->n - 1])->keys & MSNAP_K_TIME)
                 ? "the trace has no time_us to place annotations on"
             : r.nrg == 0 ? "no record_function ranges on this device "
                            "(nor on device -1 or another device)"
             : step ? "the step name occurs fewer than 2 times"
                    : "no record_function name repeats 3 times without "
                      "overlapping itself (name the step with --step)");
    cli_ranges_free(&r);
    return 0;
  }
  uint32_t *pair = NULL;
  cli_sites_t sites;
  if (cli_pair_entries(tl, &pair) != 0) {
    cli_ranges_free(&r);
    return -1;
  }
  if (cli_sites_init(&sites, s) != 0) {
    free(pair);
    cli_ranges_free(&r);
    return -1;
  }
  uint64_t *live = calloc((size_t)sites.n + 1, sizeof *live);
  acc_t *acc = calloc((size_t)sites.n + 1, sizeof *acc);
  uint32_t *nalloc = calloc((size_t)sites.n + 1, sizeof *nalloc);
  int rc = -1;
  if (!live || !acc || !nalloc)
    goto out;
  uint32_t k = 0;
  /* to the end of the trace: nalloc counts every allocation of a site */
  for (uint32_t st = 0; st <= tl->n; st++) {
    /* state st: after entries 0..st-1; step ends are states */
    while (k < r.nsteps && r.steps[2 * k + 1] == st) {
      for (uint32_t x = 0; x < sites.n; x++)
        acc_step(&acc[x], live[x]);
      k++;
    }
    if (st == tl->n)
      break;
    const msnap_strace_t *e = &tl->v[st];
    if (e->action == MSNAP_ACTION_ALLOC &&
        !cli_workspace_synthetic(tl, st)) {
      uint32_t x = cli_sites_of(&sites, e->frames);
      live[x] += e->size;
      nalloc[x]++;
    } else if (e->action == MSNAP_ACTION_FREE_COMPLETED &&
               pair[st] != CLI_NO_PAIR) {
      const msnap_strace_t *a = &tl->v[pair[st]];
      uint64_t *v = &live[cli_sites_of(&sites, a->frames)];
      *v -= *v >= a->size ? a->size : *v;
    }
  }
  char text[512];
  for (uint32_t x = 0; x < sites.n; x++) {
    cli_site_format(s, sites.site[x], text, sizeof text);
    if (add_candidate(l, text, sites.site[x], &acc[x], nalloc[x],
                      min_conf) != 0)
      goto out;
  }
  if (l->n) /* l->v is NULL without candidates */
    qsort(l->v, l->n, sizeof *l->v, cmp_leak);
  rc = 0;
out:
  free(live);
  free(acc);
  free(nalloc);
  free(pair);
  cli_sites_free(&sites);
  cli_ranges_free(&r);
  if (rc != 0)
    cli_leaks_free(l);
  return rc;
}

/* ---- several files ---------------------------------------------------------- */

typedef struct fsite_s {
  char *site; /* owned */
  int64_t device;
  uint32_t file;
  uint64_t bytes;
} fsite_t;

static int cmp_fsite(const void *a, const void *b) {
  const fsite_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  int c = strcmp(x->site, y->site);
  if (c)
    return c;
  return x->file < y->file ? -1 : x->file > y->file;
}

/* The live blocks of one file as (device, site, file, requested bytes),
 * appended to *v (summed per site later). */
static int file_sites(const msnap_snap_t *s, uint32_t file, fsite_t **v,
                      uint32_t *n, uint32_t *cap) {
  cli_stacks_t stk;
  if (cli_stacks_init(&stk, s) != 0)
    return -1;
  char text[512];
  int rc = 0;
  for (cli_bwalk_t it = cli_bwalk_all(s); cli_bwalk_next(&it);) {
    const msnap_sblock_t *b = it.b;
    int64_t dev = it.g->device;
    if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
      continue;
    cli_site_format(s, cli_stacks_site(&stk, dev, it.addr, b), text,
                    sizeof text);
    uint64_t req = (b->keys & MSNAP_K_REQUESTED) ? b->requested_size
                                                 : b->size;
    if (*n == *cap) {
      uint32_t c = *cap ? *cap * 2 : 256;
      fsite_t *w = realloc(*v, (size_t)c * sizeof *w);
      if (!w) {
        rc = -1;
        break;
      }
      *v = w;
      *cap = c;
    }
    (*v)[*n] = (fsite_t){strdup(text), dev, file, req};
    if (!(*v)[*n].site) {
      rc = -1;
      break;
    }
    (*n)++;
  }
  cli_stacks_free(&stk);
  return rc;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap leaks [--json] [--step NAME] [--min-confidence X]\n"
          "                     [--top N] FILE...\n"
          "\n"
          "Allocation sites whose live memory grows step after step: over\n"
          "the repeated record_function ranges of one recording (steps:\n"
          "the most frequent non-overlapping name whose ranges hold\n"
          "trace entries, trailing digits ignored, e.g. ProfilerStep#N;\n"
          "or --step NAME), or over several\n"
          "snapshots of one process (one step per file, in the order\n"
          "given).  A site's value at a step is the requested bytes of its\n"
          "allocations live at the end of the step.  confidence =\n"
          "max(0, grown - shrunk) / T * (1 - 2^-T) over the T transitions\n"
          "between steps (1.0: grows every step of many).  T transitions\n"
          "reach 1 - 2^-T at most (2 files: 0.5): a --min-confidence above\n"
          "that is lowered to it, with a warning, and any site that grew\n"
          "in every transition is listed.\n"
          "\n"
          "  --step NAME          the annotation name of one step\n"
          "  --min-confidence X   report sites from this confidence (0..1,\n"
          "                       default 0.7)\n"
          "  --top N              sites shown per device (default 10, 0 =\n"
          "                       all)\n"
          "  --json               {mode, files, min_confidence, warnings,\n"
          "                       devices: [{device, steps, step_name,\n"
          "                       steps_from_device, no_steps_reason,\n"
          "                       leak_candidates: [{site, bytes,\n"
          "                       bytes_per_step, first_bytes, last_bytes,\n"
          "                       steps_grown, steps_shrunk, confidence}]}],\n"
          "                       leak_candidate_count}\n"
          "  -h, --help           this text\n"
          "\nExit status: 0 no leak candidate, 1 leak candidates found,\n"
          "2 unusable input.\n");
}

static void print_dev(cli_json_t *j, bool json, const cli_leaks_t *l,
                      long topn) {
  char b1[32], b2[32], b3[32];
  uint32_t shown = topn > 0 && (uint32_t)topn < l->n ? (uint32_t)topn : l->n;
  uint32_t t = l->steps > 1 ? l->steps - 1 : 1;
  if (json) {
    cj_obj(j);
    cj_key(j, "device");
    cj_i64(j, l->device);
    cj_key(j, "steps");
    cj_u64(j, l->steps);
    cj_key(j, "step_name");
    if (l->stepname[0])
      cj_cstr(j, l->stepname);
    else
      cj_null(j);
    cj_key(j, "steps_from_device");
    if (l->steps > 0 && l->ann_device != l->device)
      cj_i64(j, l->ann_device);
    else
      cj_null(j);
    cj_key(j, "no_steps_reason");
    if (l->why[0])
      cj_cstr(j, l->why);
    else
      cj_null(j);
    cj_key(j, "leak_candidates");
    cj_arr(j);
    for (uint32_t i = 0; i < shown; i++) {
      const cli_leak_t *x = &l->v[i];
      cj_obj(j);
      cj_key(j, "site");
      cj_cstr(j, x->site);
      cj_key(j, "bytes");
      cj_u64(j, x->last - x->first);
      cj_key(j, "bytes_per_step");
      cj_u64(j, (x->last - x->first) / t);
      cj_key(j, "first_bytes");
      cj_u64(j, x->first);
      cj_key(j, "last_bytes");
      cj_u64(j, x->last);
      cj_key(j, "steps_grown");
      cj_u64(j, x->grown);
      cj_key(j, "steps_shrunk");
      cj_u64(j, x->shrunk);
      cj_key(j, "confidence");
      cj_dbl(j, floor(x->confidence * 1000.0 + 0.5) / 1000.0);
      cj_obj_end(j);
    }
    cj_arr_end(j);
    cj_obj_end(j);
    return;
  }
  printf("\ndevice %" PRId64 ": ", l->device);
  if (l->why[0]) {
    printf("no steps: %s\n", l->why);
    return;
  }
  printf("%u %s%s%s%s\n", l->steps, cli_plural(l->steps, "step", "steps"),
         l->stepname[0] ? " (" : "",
         l->stepname, l->stepname[0] ? ")" : "");
  if (l->ann_device != l->device)
    printf("  steps taken from device %" PRId64 "'s record_function "
           "annotations%s (none recorded for this device)\n", l->ann_device,
           l->ann_device == -1 ? " (-1: no device)" : "");
  if (l->out_of_order) {
    printf("  leak candidates not reported: the files are out of time "
           "order (warning above)\n");
    return;
  }
  if (l->n == 0) {
    printf("  no site grows from step to step\n");
    return;
  }
  printf("  %-6s %12s %12s  %-15s %s\n", "conf.", "growth", "per step",
         "grew/shrank", "site");
  for (uint32_t i = 0; i < shown; i++) {
    const cli_leak_t *x = &l->v[i];
    char gs[32];
    snprintf(gs, sizeof gs, "%u/%u of %u", x->grown, x->shrunk, t);
    printf("  %-6.3f %12s %12s  %-15s %s\n", x->confidence,
           cli_bytes(x->last - x->first, b1, sizeof b1),
           cli_bytes((x->last - x->first) / t, b2, sizeof b2), gs, x->site);
    (void)b3;
  }
  if (l->n > shown)
    printf("  ... %u more\n", l->n - shown);
}

int cli_cmd_leaks(int argc, char **argv) {
  bool json = false;
  const char *step = NULL;
  double min_conf = CLI_LEAK_MIN_CONFIDENCE;
  long topn = 10;
  const cli_opt_t opts[] = {
      CLI_STRING("step", 0, &step),
      CLI_DOUBLE("min-confidence", 0, &min_conf, 0.0, 1.0,
                 "--min-confidence needs 0..1"),
      CLI_LONG("top", 't', &topn, 0, LONG_MAX, "--top needs a number >= 0"),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"leaks", usage, opts, -1,
                         "expects one recording or several snapshots",
                         &json, NULL, NULL, false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  if (step != NULL && step[0] == '\0')
    return cli_usage_error("leaks", "--step expects a record_function name");
  int nfiles = argc - first;
  char **files = argv + first;
  cli_leaks_t *per = NULL;
  uint32_t nper = 0;
  /* warnings: [0] another process (files), [1 + d] the threshold of
   * device d (steps) or [1] of every device (files), [2] a file named
   * more than once (files), [3] files out of time order (files) */
  char (*warn)[512] = NULL;
  uint32_t nwarn = 2;
  int rc = CLI_OK;
  if (nfiles == 1) {
    msnap_snap_t *s;
    if (cli_load(files[0], &s) != CLI_OK) {
      if (json)
        cli_json_unusable(files[0], NULL);
      return CLI_UNUSABLE;
    }
    uint32_t nd;
    int64_t *devs = cli_devices(s, &nd);
    per = calloc((size_t)nd + 1, sizeof *per);
    nwarn = nd + 1;
    warn = calloc(nwarn, sizeof *warn);
    if (!per || !warn || (!devs && nd)) {
      rc = CLI_UNUSABLE;
    } else {
      /* the threshold used is min_conf or, when the steps cannot reach
       * it, the highest they reach (>= 0.5 from 2 steps): the candidates
       * are gathered once at the lower of the two, then trimmed */
      double floor_conf = min_conf < 0.5 ? min_conf : 0.5;
      for (uint32_t d = 0; d < nd && rc == CLI_OK; d++, nper++) {
        if (cli_leaks_steps(s, devs[d], step, floor_conf, &per[d]) != 0) {
          rc = CLI_UNUSABLE;
          break;
        }
        if (per[d].steps < 2)
          continue;
        char who[48];
        snprintf(who, sizeof who, "device %" PRId64 ": ", devs[d]);
        double use = usable_threshold(per[d].steps, min_conf, who, "steps",
                                      "record", warn[1 + d],
                                      sizeof warn[1 + d]);
        cli_leaks_trim(&per[d], use);
      }
    }
    if (rc != CLI_OK)
      cli_err("out of memory");
    free(devs);
    msnap__snap_free(s);
  } else {
    if (step)
      return cli_usage_error("leaks", "--step applies to one recording");
    nwarn = 4;
    warn = calloc(nwarn, sizeof *warn);
    if (!warn) {
      cli_err("out of memory");
      return CLI_UNUSABLE;
    }
    double use = usable_threshold((uint32_t)nfiles, min_conf, "", "files",
                                  "give", warn[1], sizeof warn[1]);
    /* the same file named twice is taken as two steps, as given (the
     * user may mean it), with a warning; fleet reads it once */
    char dup[320];
    uint32_t ndup =
        cli_file_repeats(files, (uint32_t)nfiles, NULL, dup, sizeof dup);
    if (ndup)
      snprintf(warn[2], sizeof warn[2],
               "a file was given more than once (%s; %u repeated name%s): "
               "each name is a step, in the order given, so one snapshot "
               "counts as several steps",
               dup, ndup, ndup == 1 ? "" : "s");
    fsite_t *v = NULL;
    uint32_t n = 0, cap = 0;
    int64_t pid0 = -1, pid;
    const char *diffproc = NULL;
    /* the files' latest time_us: each file is a step in the order given,
     * so one taken before the file before it reverses the steps (a
     * growing site reads as shrinking, a shrinking one as a leak) */
    int64_t tprev = 0, t;
    bool have_prev = false;
    int backwards = -1; /* the first file older than the one before it */
    for (int f = 0; f < nfiles && rc == CLI_OK; f++) {
      msnap_snap_t *s;
      if (cli_load(files[f], &s) != CLI_OK) {
        if (json)
          cli_json_unusable(files[f], NULL);
        rc = CLI_UNUSABLE;
        break;
      }
      if (cli_last_time(s, &t)) {
        if (have_prev && t < tprev && backwards < 0)
          backwards = f;
        tprev = t;
        have_prev = true;
      } else {
        have_prev = false;
      }
      if (cli_gv_int(s, &s->process_info, "pid", &pid)) {
        if (pid0 < 0)
          pid0 = pid;
        else if (pid != pid0)
          diffproc = files[f];
      }
      if (file_sites(s, (uint32_t)f, &v, &n, &cap) != 0) {
        cli_err("out of memory");
        rc = CLI_UNUSABLE;
      }
      msnap__snap_free(s);
    }
    if (backwards > 0)
      snprintf(warn[3], sizeof warn[3],
               "%s's trace ends before %s's (time_us): it was taken "
               "before it, and each file is a step in the order given -- "
               "run leaks with the files oldest first; leak candidates "
               "are not reported",
               files[backwards], files[backwards - 1]);
    if (diffproc)
      snprintf(warn[0], sizeof warn[0],
               "%s was written by another process than %s (process_info): "
               "sites of different runs are compared",
               diffproc, files[0]);
    if (rc == CLI_OK) {
      if (n) /* v is NULL when no file has a live block */
        qsort(v, n, sizeof *v, cmp_fsite);
      /* one entry per (device, site, file) */
      uint32_t m = 0;
      for (uint32_t i = 0; i < n; i++) {
        if (m && v[m - 1].device == v[i].device &&
            v[m - 1].file == v[i].file && !strcmp(v[m - 1].site, v[i].site)) {
          v[m - 1].bytes += v[i].bytes;
          free(v[i].site);
        } else {
          v[m++] = v[i];
        }
      }
      n = m;
      per = calloc(1, sizeof *per);
      if (!per)
        rc = CLI_UNUSABLE;
    }
    /* one cli_leaks_t per device, in device order (no candidate for
     * steps out of time order) */
    for (uint32_t i = 0; rc == CLI_OK && i < n;) {
      int64_t dev = v[i].device;
      cli_leaks_t *l = NULL;
      if (nper == 0 || per[nper - 1].device != dev) {
        cli_leaks_t *w = realloc(per, ((size_t)nper + 1) * sizeof *w);
        if (!w) {
          rc = CLI_UNUSABLE;
          break;
        }
        per = w;
        memset(&per[nper], 0, sizeof per[nper]);
        per[nper].device = dev;
        per[nper].ann_device = dev; /* files mode: no annotations used */
        per[nper].steps = (uint32_t)nfiles;
        per[nper].out_of_order = backwards >= 0;
        snprintf(per[nper].stepname, sizeof per[nper].stepname, "files");
        nper++;
      }
      l = &per[nper - 1];
      uint32_t k = i;
      acc_t a = {0};
      for (int f = 0; f < nfiles; f++) {
        uint64_t val = 0;
        if (k < n && v[k].device == dev && !strcmp(v[k].site, v[i].site) &&
            v[k].file == (uint32_t)f)
          val = v[k++].bytes;
        acc_step(&a, val);
      }
      const cli_site_t nokey = {CLI_SITE_NONE, CLI_SITE_NONE};
      if (backwards < 0 && add_candidate(l, v[i].site, nokey, &a, 0, use) != 0)
        rc = CLI_UNUSABLE;
      i = k > i ? k : i + 1;
    }
    for (uint32_t i = 0; i < nper; i++)
      if (per[i].n)
        qsort(per[i].v, per[i].n, sizeof *per[i].v, cmp_leak);
    for (uint32_t i = 0; i < n; i++)
      free(v[i].site);
    free(v);
  }
  if (rc != CLI_OK) {
    for (uint32_t i = 0; per && i < nper; i++)
      cli_leaks_free(&per[i]);
    free(per);
    free(warn);
    return rc;
  }
  uint64_t total = 0;
  for (uint32_t i = 0; i < nper; i++)
    total += per[i].n;
  cli_json_t j;
  cj_init(&j, stdout);
  if (json) {
    cj_obj(&j);
    cj_key(&j, "mode");
    cj_cstr(&j, nfiles == 1 ? "steps" : "files");
    cj_key(&j, "files");
    cj_arr(&j);
    for (int f = 0; f < nfiles; f++)
      cj_cstr(&j, files[f]);
    cj_arr_end(&j);
    cj_key(&j, "min_confidence");
    cj_dbl(&j, min_conf);
    cj_key(&j, "warnings");
    cj_arr(&j);
    for (uint32_t w = 0; w < nwarn; w++)
      if (warn[w][0])
        cj_cstr(&j, warn[w]);
    cj_arr_end(&j);
    cj_key(&j, "devices");
    cj_arr(&j);
  } else {
    if (nfiles == 1)
      printf("%s: leaks across the steps of the recording\n",
             cli_shown(files[0]));
    else
      printf("leaks across %d snapshots (one step per file, in the order "
             "given)\n", nfiles);
    for (uint32_t w = 0; w < nwarn; w++)
      if (warn[w][0])
        printf("warning: %s\n", warn[w]);
  }
  for (uint32_t i = 0; i < nper; i++)
    print_dev(&j, json, &per[i], topn);
  if (json) {
    cj_arr_end(&j);
    cj_key(&j, "leak_candidate_count");
    cj_u64(&j, total);
    cj_obj_end(&j);
    cj_end(&j);
  }
  for (uint32_t i = 0; i < nper; i++)
    cli_leaks_free(&per[i]);
  free(per);
  free(warn);
  return total ? CLI_FINDING : CLI_OK;
}
