/*
 * cmd_fleet.c -- `memsnap fleet FILE...|DIR`: the snapshots of the ranks
 * of a job side by side, the ranks that stand out, and the leaks they
 * share.
 *
 * Per file (one rank): its rank, world size, local rank, host and pid from
 * process_info (memsnap's files; RANK/WORLD_SIZE or torch.distributed at
 * dump time), else a rank from the file name ("rank3", "rank_3",
 * "rank-3"; an unreadable file too); peak requested (live requested bytes,
 * JSON's peak_requested_bytes, also as peak_allocated_bytes) and peak
 * reserved over the
 * trace (cli_timeline), final reserved and allocated, fragmentation of the
 * final state (cli_frag_model), OOM entries, and leak candidates across
 * the recording's steps (cli_leaks_steps).  Figures are summed over the
 * file's devices (a rank normally drives one).
 *
 * Outliers.  For each of peak_reserved, peak_allocated, reserved,
 * allocated and inactive_split, over the ranks that have it (at least 3):
 * median m and median absolute deviation MAD; a rank is flagged when
 * |x - m| > max(3.5 * 1.4826 * MAD, 5% of m, 1 MiB) -- the modified
 * z-score of Iglewicz and Hoaglin, with floors so that identical ranks
 * (MAD = 0) do not flag a few bytes of noise.  Both directions count.
 *
 * Common leaks.  A site that is a leak candidate in at least 2 ranks,
 * with the number of ranks.
 *
 * One process, several files.  Files whose process_info name the same
 * host and pid (and the same rank, or none) are dumps of one process (an OOM dump per OOM, successive
 * _dump_snapshot calls), not ranks: the latest of them (the last time_us
 * of its traces, else the file name, which for OOM dumps holds the time)
 * stands for the process; the others are listed, marked with the file
 * that stands for them, and count nowhere else (medians, outliers,
 * common leaks, OOM ranks, the rank and world-size checks), with a
 * warning.  Without a host and a pid (PyTorch's own dumps) files are
 * taken as ranks.
 *
 * One file, several names.  A file given twice (the same device and
 * inode: a repeated argument, a file and its directory, a link to it, a
 * FIFO or pipe named twice; the same name for one that cannot be found)
 * is read and counted once, with a warning naming the first repeat.
 *
 * Parallel, bounded.  Files are analysed by -j worker threads (default:
 * the online CPUs, at most 16), each loading one file at a time and
 * keeping only the figures, so at most -j models are in memory at once.
 * The result does not depend on -j.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define MIB (1ull << 20)
#define NMETRICS 5
#define MAX_JOBS 16

static const char *const metric_names[NMETRICS] = {
    "peak_reserved_bytes", "peak_allocated_bytes", "reserved_bytes",
    "allocated_bytes", "inactive_split_bytes"};

typedef struct rank_s {
  const char *file;
  bool ok;
  char error[512];
  int64_t rank, world_size, local_rank, pid;
  const char *rank_source;
  char host[128];
  uint32_t ndev;
  bool have_peak;
  uint64_t m[NMETRICS]; /* metric_names order */
  bool have_m[NMETRICS];
  uint64_t largest_free, free_segments_bytes;
  uint32_t ooms;
  uint64_t oom_requested;
  bool have_last_time;
  int64_t last_time_us; /* the latest time_us of its traces */
  int32_t same_process; /* index of the file that stands for its process,
                           -1: itself (set after sorting)             */
  uint32_t steps;
  cli_leak_t *leaks;
  uint32_t nleaks;
  bool outlier;
  bool flagged[NMETRICS];     /* the metrics that make it an outlier */
  double dev_ratio[NMETRICS]; /* x / median of the flagged ones (0 for a
                                 0 B figure; INFINITY over a 0 median) */
} rank_t;

/* "rank3", "rank_3", "rank-3" (any case) in the file's base name. */
static int64_t rank_from_name(const char *path) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  for (const char *p = b; *p; p++) {
    if (strncasecmp(p, "rank", 4))
      continue;
    const char *q = p + 4;
    if (*q == '_' || *q == '-')
      q++;
    if (!isdigit((unsigned char)*q))
      continue;
    int64_t r = 0;
    while (isdigit((unsigned char)*q) && r < INT32_MAX)
      r = r * 10 + (*q++ - '0');
    return r;
  }
  return -1;
}

/* The most active and the most reserved bytes over a device's timeline
 * (pk[0], pk[1]; cli_timeline_visit). */
static void peaks_visit(void *arg, uint32_t state, uint64_t act,
                        uint64_t res) {
  uint64_t *pk = arg;
  (void)state;
  pk[0] = act > pk[0] ? act : pk[0];
  pk[1] = res > pk[1] ? res : pk[1];
}

static void analyse(rank_t *r, double min_conf) {
  msnap_snap_t *s;
  r->rank = r->world_size = r->local_rank = r->pid = -1;
  /* the file name's rank, unless process_info names one (an unreadable
   * file keeps it: its row still says which rank it is) */
  if ((r->rank = rank_from_name(r->file)) >= 0)
    r->rank_source = "file name";
  if (cli_load(r->file, &s) != CLI_OK) {
    snprintf(r->error, sizeof r->error, "%s", cli_load_error());
    return;
  }
  const msnap_gv_t *pi = &s->process_info;
  int64_t pr;
  if (cli_gv_int(s, pi, "rank", &pr)) {
    r->rank = pr;
    r->rank_source = "process_info";
  }
  cli_gv_int(s, pi, "world_size", &r->world_size);
  cli_gv_int(s, pi, "local_rank", &r->local_rank);
  cli_gv_int(s, pi, "pid", &r->pid);
  const char *h = cli_gv_str(s, pi, "host");
  snprintf(r->host, sizeof r->host, "%s", h ? h : "");
  cli_sanitize(r->host);
  uint32_t nd;
  int64_t *devs = cli_devices(s, &nd);
  r->ndev = nd;
  bool nomem = !devs && nd;
  r->have_m[2] = r->have_m[3] = r->have_m[4] = true;
  for (uint32_t d = 0; d < nd && !nomem; d++) {
    cli_frag_t f;
    cli_frag_model(s, devs[d], &f);
    r->m[2] += f.reserved;
    r->m[3] += f.allocated;
    r->m[4] += f.inactive_split;
    if (f.largest_free > r->largest_free)
      r->largest_free = f.largest_free;
    r->free_segments_bytes += f.free_segments_bytes;
    const msnap_trace_list_t *tl = cli_trace(s, devs[d]);
    if (tl && tl->n) {
      /* (peaks as summary's: none for a trace where nothing is
       * allocated or freed) */
      if (cli_trace_moves(tl)) {
        uint64_t pk[2] = {0, 0}; /* the most active, reserved bytes */
        cli_timeline_visit(s, devs[d], peaks_visit, pk);
        r->m[0] += pk[1];
        r->m[1] += pk[0];
        r->have_peak = true;
      }
      for (uint32_t i = 0; i < tl->n; i++)
        if (tl->v[i].action == MSNAP_ACTION_OOM) {
          r->ooms++;
          r->oom_requested = tl->v[i].size;
        }
    }
    cli_leaks_t l;
    if (cli_leaks_steps(s, devs[d], NULL, min_conf, &l) != 0) {
      nomem = true;
      break;
    }
    if (l.steps > r->steps)
      r->steps = l.steps;
    if (l.n) {
      cli_leak_t *v = realloc(r->leaks, ((size_t)r->nleaks + l.n) *
                                            sizeof *v);
      if (!v) {
        cli_leaks_free(&l);
        nomem = true;
        break;
      }
      r->leaks = v;
      memcpy(r->leaks + r->nleaks, l.v, l.n * sizeof *v);
      r->nleaks += l.n;
      free(l.v); /* the sites moved to r->leaks */
    } else {
      cli_leaks_free(&l);
    }
  }
  r->have_m[0] = r->have_m[1] = r->have_peak;
  r->have_last_time = cli_last_time(s, &r->last_time_us);
  free(devs);
  msnap__snap_free(s);
  if (nomem)
    snprintf(r->error, sizeof r->error, "out of memory");
  else
    r->ok = true;
}

typedef struct pool_s {
  rank_t *r;
  uint32_t n;
  atomic_uint next;
  double min_conf;
} pool_t;

static void *worker(void *arg) {
  pool_t *p = arg;
  for (;;) {
    uint32_t i = atomic_fetch_add(&p->next, 1);
    if (i >= p->n)
      return NULL;
    analyse(&p->r[i], p->min_conf);
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(uint64_t *v, uint32_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  return n % 2 ? (double)v[n / 2]
               : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2.0;
}

static void outliers(rank_t *r, uint32_t n, double med[NMETRICS],
                     bool have_med[NMETRICS]) {
  uint64_t *v = malloc(((size_t)n + 1) * sizeof *v);
  if (!v)
    return;
  for (int k = 0; k < NMETRICS; k++) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
      if (r[i].ok && r[i].same_process < 0 && r[i].have_m[k])
        v[m++] = r[i].m[k];
    have_med[k] = m > 0;
    if (m == 0)
      continue;
    med[k] = median(v, m);
    if (m < 3)
      continue;
    for (uint32_t i = 0; i < m; i++)
      v[i] = (uint64_t)fabs((double)v[i] - med[k]);
    double mad = median(v, m);
    double limit = fmax(3.5 * 1.4826 * mad, fmax(0.05 * med[k], (double)MIB));
    for (uint32_t i = 0; i < n; i++)
      if (r[i].ok && r[i].same_process < 0 && r[i].have_m[k] &&
          fabs((double)r[i].m[k] - med[k]) > limit) {
        r[i].outlier = true;
        r[i].flagged[k] = true;
        r[i].dev_ratio[k] = med[k] > 0 ? (double)r[i].m[k] / med[k] : INFINITY;
      }
  }
  free(v);
}

/* ---- common leaks ------------------------------------------------------- */

typedef struct lk_s {
  const char *site;
  uint32_t rank_ix;
  uint64_t growth;
} lk_t;

static int cmp_lk(const void *a, const void *b) {
  const lk_t *x = a, *y = b;
  int c = strcmp(x->site, y->site);
  return c ? c : (x->rank_ix < y->rank_ix ? -1 : x->rank_ix > y->rank_ix);
}

typedef struct common_s {
  const char *site;
  uint32_t first, count; /* range in the sorted lk array */
} common_t;

static int cmp_common(const void *a, const void *b) {
  const common_t *x = a, *y = b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  return strcmp(x->site, y->site);
}

/* ---- input files ------------------------------------------------------------ */

static bool snapshot_name(const char *n) {
  static const char *const ext[] = {".pickle", ".pkl", ".pickle.gz",
                                    ".pkl.gz", ".pickle.zst", ".pkl.zst",
                                    NULL};
  size_t l = strlen(n);
  for (int i = 0; ext[i]; i++) {
    size_t e = strlen(ext[i]);
    if (l > e && !strcmp(n + l - e, ext[i]))
      return true;
  }
  return false;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One file under several names (cli_file_repeats: the same device and
 * inode -- a repeated argument, a file and its directory, a link to it, a
 * FIFO or pipe named twice -- or, for names it cannot identify, the same
 * string) is read once: the later names are dropped from v (freed; the
 * order of the others kept).  Returns how many; dup says the first of
 * them. */
static uint32_t drop_repeats(char **v, uint32_t *n, char *dup,
                             size_t dup_size) {
  uint32_t *keep = malloc(((size_t)*n + 1) * sizeof *keep);
  if (!keep)
    return 0;
  uint32_t ndup = cli_file_repeats(v, *n, keep, dup, dup_size);
  uint32_t k = 0;
  for (uint32_t i = 0; i < *n; i++) {
    if (keep[i] != i) {
      free(v[i]);
      continue;
    }
    v[k++] = v[i];
  }
  *n = k;
  free(keep);
  return ndup;
}

/* Directory entries left out (skipped): how many, and the first of them
 * by name (readdir's order differs between file systems). */
typedef struct skips_s {
  uint32_t n;
  uint32_t dirs_reported; /* arguments whose error inputs() printed */
  char path[600];  /* the first's path */
  char first[640]; /* "PATH: why" */
} skips_t;

/* A directory entry with a snapshot's name that is not a regular file
 * is left out: say so on stderr, and why (st: what stat(path) gave, or
 * NULL when it failed with err); counted in sk for the warnings. */
static void skipped(skips_t *sk, const char *path, const struct stat *st,
                    int err) {
  struct stat ls;
  const char *why;
  char buf[160];
  if (st)
    why = S_ISDIR(st->st_mode)
              ? "a directory, not a snapshot file"
          : S_ISFIFO(st->st_mode)
              ? "a FIFO, not a regular file (name it as an argument to "
                "read it)"
          : S_ISSOCK(st->st_mode) ? "a socket, not a regular file"
          : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)
              ? "a device, not a regular file"
              : "not a regular file";
  else if (err == ENOENT && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
    why = "a symbolic link to a file that does not exist";
  else {
    snprintf(buf, sizeof buf, "cannot be examined (%s)", strerror(err));
    why = buf;
  }
  cli_err("fleet: %s: skipped: %s", path, why);
  if (sk->n++ == 0 || strcmp(path, sk->path) < 0) {
    snprintf(sk->path, sizeof sk->path, "%s", path);
    snprintf(sk->first, sizeof sk->first, "%s: %s", path, why);
  }
}

/* Expand directories (their snapshot files, sorted); *n paths, owned. */
static char **inputs(char **args, int nargs, uint32_t *n, skips_t *sk) {
  char **v = NULL;
  uint32_t k = 0, cap = 0;
  for (int a = 0; a < nargs; a++) {
    struct stat st;
    bool dir = stat(args[a], &st) == 0 && S_ISDIR(st.st_mode);
    DIR *d = dir ? opendir(args[a]) : NULL;
    if (dir && !d) {
      cli_err("%s: cannot read the directory", args[a]);
      sk->dirs_reported++;
      continue;
    }
    uint32_t first = k, skipped_before = sk->n;
    struct dirent *de;
    do {
      const char *name = NULL;
      char *path = NULL;
      if (d) {
        de = readdir(d);
        if (!de)
          break;
        if (de->d_name[0] == '.' || !snapshot_name(de->d_name))
          continue;
        name = de->d_name;
        size_t la = strlen(args[a]);
        size_t l = la + strlen(name) + 2;
        path = malloc(l);
        if (path) /* (DIR/ as given: no second slash) */
          snprintf(path, l, "%s%s%s", args[a],
                   la && args[a][la - 1] == '/' ? "" : "/", name);
        struct stat fs;
        if (path) {
          bool ok = stat(path, &fs) == 0;
          if (!ok || !S_ISREG(fs.st_mode)) {
            skipped(sk, path, ok ? &fs : NULL, errno);
            free(path);
            continue;
          }
        }
      } else {
        de = NULL;
        path = strdup(args[a]);
      }
      if (k == cap) {
        cap = cap ? cap * 2 : 16;
        char **w = realloc(v, cap * sizeof *w);
        if (!w) {
          free(path);
          break;
        }
        v = w;
      }
      if (!path)
        break;
      v[k++] = path;
    } while (d);
    if (d) {
      closedir(d);
      if (k > first) /* v is NULL when nothing was found */
        qsort(v + first, k - first, sizeof *v, cmp_str);
      /* (entries with a snapshot's name that were all skipped are not
       * "no snapshot files": say they were skipped, as named above) */
      uint32_t ns = sk->n - skipped_before;
      sk->dirs_reported += k == first;
      if (k == first && ns == 1)
        cli_err("%s: no snapshot file to read in this directory: its "
                "entry with a snapshot's name was skipped (above)", args[a]);
      else if (k == first && ns > 1)
        cli_err("%s: no snapshot file to read in this directory: its %u "
                "entries with a snapshot's name were skipped (above)",
                args[a], ns);
      else if (k == first)
        cli_err("%s: no snapshot files (*.pickle, *.pkl) in this directory",
                args[a]);
    }
  }
  *n = k;
  return v;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap fleet [--json] [-j N] [--top N] FILE...|DIR\n"
          "\n"
          "The snapshots of a job's ranks side by side (a directory: its\n"
          "*.pickle / *.pkl files; other entries with such names, such\n"
          "as directories and FIFOs, are skipped with a warning): per\n"
          "rank its rank (from the file's process_info, or \"rank<N>\"\n"
          "in its name, also when it cannot be read), host (from\n"
          "process_info), peak requested (live requested bytes) and\n"
          "reserved over the trace,\n"
          "final reserved and allocated (summary's allocated: its\n"
          "active_allocated blocks), fragmentation (inactive split\n"
          "bytes, largest free block), OOMs and leak candidates across\n"
          "its steps.  Ranks whose figures lie far from the others'\n"
          "median (|x - median| > max(3.5 x 1.4826 x MAD, 5%% of the\n"
          "median, 1 MiB)) are flagged as outliers; leak sites found in\n"
          "2 or more ranks are listed.\n"
          "Files of one process (the same host, pid and rank in their\n"
          "process_info: successive OOM dumps) are one rank: the latest\n"
          "stands for it, the earlier ones are listed but not counted.\n"
          "Files are analysed in parallel, one at a time per thread.\n"
          "\n"
          "  -j N       threads (default: the online CPUs, at most 16)\n"
          "  --top N    common leak sites shown (default 10, 0 = all)\n"
          "  --json     {files, world_size,\n"
          "              ranks: [{file, rank, rank_source,\n"
          "                same_process_as, usable, error, world_size,\n"
          "                local_rank, pid, host, devices,\n"
          "                peak_reserved_bytes, peak_requested_bytes,\n"
          "                peak_allocated_bytes (the same figure, its\n"
          "                older name), reserved_bytes, allocated_bytes,\n"
          "                fragmentation: {inactive_split_bytes,\n"
          "                  largest_free_block_bytes,\n"
          "                  free_segments_bytes},\n"
          "                ooms, oom_requested_bytes, steps,\n"
          "                leak_candidates: [{site, bytes, confidence}],\n"
          "                outlier,\n"
          "                outlier_metrics: {<metric>: x / median}}],\n"
          "              medians: {peak_reserved_bytes,\n"
          "                peak_requested_bytes, peak_allocated_bytes,\n"
          "                reserved_bytes,\n"
          "                allocated_bytes, inactive_split_bytes},\n"
          "              outliers: [file], oom_ranks: [file],\n"
          "              common_leaks: [{site, ranks, files: [file]}],\n"
          "              warnings}\n"
          "             (a metric: a key of medians; the figures of an\n"
          "             unusable file are null)\n"
          "  -h, --help this text\n"
          "\nExit status: 0 no outlier, 1 outlier ranks, 2 unusable input\n"
          "(no file could be read).\n");
}

/* True when b is a later dump of its process than a. */
static bool later_dump(const rank_t *a, const rank_t *b) {
  if (a->have_last_time && b->have_last_time &&
      a->last_time_us != b->last_time_us)
    return b->last_time_us > a->last_time_us;
  if (a->have_last_time != b->have_last_time)
    return b->have_last_time;
  return strcmp(b->file, a->file) > 0;
}

/* Set same_process of every file (see the top of this file); returns how
 * many files another one stands for.  Quadratic in the files that share
 * a pid only: files are sorted by (host, pid) first. */
static int cmp_proc(const void *a, const void *b, void *arg) {
  const rank_t *r = arg;
  const rank_t *x = &r[*(const uint32_t *)a], *y = &r[*(const uint32_t *)b];
  int c = strcmp(x->host, y->host);
  if (c)
    return c;
  if (x->pid != y->pid)
    return x->pid < y->pid ? -1 : 1;
  /* one process that recorded as several ranks (a simulation of a job,
   * msnap_set_process_rank) holds several ranks */
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static uint32_t same_process(rank_t *r, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    r[i].same_process = -1;
  uint32_t *ix = malloc(((size_t)n + 1) * sizeof *ix);
  if (!ix)
    return 0;
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (r[i].ok && r[i].pid >= 0 && r[i].host[0])
      ix[m++] = i;
  qsort_r(ix, m, sizeof *ix, cmp_proc, r);
  uint32_t nsame = 0;
  for (uint32_t a = 0, e; a < m; a = e) {
    uint32_t best = ix[a];
    for (e = a + 1; e < m && cmp_proc(&ix[a], &ix[e], r) == 0; e++)
      if (later_dump(&r[best], &r[ix[e]]))
        best = ix[e];
    for (uint32_t q = a; q < e; q++)
      if (ix[q] != best) {
        r[ix[q]].same_process = (int32_t)best;
        nsame++;
      }
  }
  free(ix);
  return nsame;
}

static int cmp_rank(const void *a, const void *b) {
  const rank_t *x = a, *y = b;
  if ((x->rank < 0) != (y->rank < 0))
    return x->rank < 0 ? 1 : -1;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return strcmp(x->file, y->file);
}

int cli_cmd_fleet(int argc, char **argv) {
  bool json = false;
  long jobs = 0, topn = 10;
  const cli_opt_t opts[] = {
      CLI_LONG("jobs", 'j', &jobs, 1, 256, "-j needs a number 1..256"),
      CLI_LONG("top", 't', &topn, 0, LONG_MAX, "--top needs a number >= 0"),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"fleet", usage, opts, -1,
                         "expects files or a directory", &json, NULL, NULL,
                         false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  uint32_t n = 0;
  char dup[600] = "";
  skips_t sk = {0, 0, "", ""};
  char **paths = inputs(argv + first, argc - first, &n, &sk);
  uint32_t ndup = paths ? drop_repeats(paths, &n, dup, sizeof dup) : 0;
  if (n == 0) {
    free(paths);
    /* (each argument's own error, printed by inputs(), says it all) */
    if (sk.dirs_reported < (uint32_t)(argc - first))
      cli_err("fleet: no input files");
    /* --json: the unusable document; "file" is the one argument (a
     * directory without snapshots), null for several */
    /* entries skipped, not regular files: the error counts them and
     * names the first, as the warning of a report would */
    char why[800];
    if (sk.n == 1)
      snprintf(why, sizeof why,
               "no input files (a directory entry with a snapshot's name "
               "was skipped, not being a regular file: %s)", sk.first);
    else if (sk.n > 1)
      snprintf(why, sizeof why,
               "no input files (%u directory entries with a snapshot's name "
               "were skipped, not being regular files; the first by name: %s)",
               sk.n, sk.first);
    else
      snprintf(why, sizeof why,
               "no input files (no *.pickle or *.pkl file in the "
               "directories given, or they could not be read)");
    if (json)
      cli_json_unusable(argc - first == 1 ? argv[first] : NULL, why);
    return CLI_UNUSABLE;
  }
  rank_t *r = calloc(n, sizeof *r);
  if (!r) {
    cli_err("out of memory");
    return CLI_UNUSABLE;
  }
  for (uint32_t i = 0; i < n; i++)
    r[i].file = paths[i];
  if (jobs == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    jobs = c < 1 ? 1 : c > MAX_JOBS ? MAX_JOBS : c;
  }
  if ((uint32_t)jobs > n)
    jobs = n;
  pool_t pool = {.r = r, .n = n, .min_conf = CLI_LEAK_MIN_CONFIDENCE};
  atomic_init(&pool.next, 0);
  pthread_t *th = calloc((size_t)jobs, sizeof *th);
  long started = 0;
  for (long t = 0; th && t < jobs; t++)
    if (pthread_create(&th[t], NULL, worker, &pool) == 0)
      started++;
  if (started == 0)
    worker(&pool); /* no thread could start: do the work here */
  for (long t = 0; t < started; t++)
    pthread_join(th[t], NULL);
  free(th);
  qsort(r, n, sizeof *r, cmp_rank);
  uint32_t nsame = same_process(r, n);

  /* from here on a file that another stands for is not a rank */
  uint32_t nok = 0;
  for (uint32_t i = 0; i < n; i++)
    nok += r[i].ok && r[i].same_process < 0;
  double med[NMETRICS] = {0};
  bool have_med[NMETRICS] = {0};
  outliers(r, n, med, have_med);

  /* warnings: dumps of one process, duplicate ranks, missing ranks,
   * unreadable files */
  char warn[7][768];
  uint32_t nwarn = 0;
  if (sk.n == 1)
    snprintf(warn[nwarn++], sizeof warn[0],
             "a directory entry with a snapshot's name was skipped, not "
             "being a regular file (%s)", sk.first);
  else if (sk.n > 1)
    snprintf(warn[nwarn++], sizeof warn[0],
             "%u directory entries with a snapshot's name were skipped, not "
             "being regular files (the first by name: %s)", sk.n, sk.first);
  if (ndup)
    snprintf(warn[nwarn++], sizeof warn[0],
             "a file was given more than once (%s; %u name%s left out): "
             "each file is read and counted once",
             dup, ndup, ndup == 1 ? "" : "s");
  int64_t world = -1;
  uint32_t nread = 0;
  for (uint32_t i = 0; i < n; i++) {
    nread += r[i].ok;
    if (r[i].ok && r[i].world_size > world)
      world = r[i].world_size;
  }
  if (nsame) {
    /* how many processes have several files; the first of them */
    uint32_t *others = calloc((size_t)n + 1, sizeof *others);
    uint32_t procs = 0, fp = UINT32_MAX, files = 0;
    for (uint32_t i = 0; others && i < n; i++)
      if (r[i].same_process >= 0)
        others[r[i].same_process]++;
    for (uint32_t i = 0; others && i < n; i++)
      if (others[i]) {
        procs++;
        if (fp == UINT32_MAX) {
          fp = i;
          files = others[i];
        }
      }
    free(others);
    if (fp == UINT32_MAX) { /* no memory for the count: name one */
      for (uint32_t i = 0; i < n && fp == UINT32_MAX; i++)
        if (r[i].same_process >= 0)
          fp = (uint32_t)r[i].same_process;
      procs = 1;
      files = nsame;
    }
    char procs_s[48];
    snprintf(procs_s, sizeof procs_s, procs == 1 ? "one process"
                                                 : "%u processes", procs);
    snprintf(warn[nwarn++], sizeof warn[0],
             "%u file%s %s earlier dump%s of %s, not other ranks: files "
             "with the same host, pid and rank in process_info come from "
             "one process (%s%u files of pid %" PRId64 " on %s, the latest of "
             "them, %s, stands for it); earlier dumps are listed but not "
             "counted",
             nsame, nsame == 1 ? "" : "s", nsame == 1 ? "is an" : "are",
             nsame == 1 ? "" : "s", procs_s, procs == 1 ? "" : "e.g. ",
             files + 1, r[fp].pid, r[fp].host, r[fp].file);
  }
  for (uint32_t i = 1, prev = 0;
       i < n && nwarn < 2u + (ndup != 0) + (sk.n != 0); i++) {
    if (!r[i].ok || r[i].same_process >= 0)
      continue;
    if (r[prev].ok && r[prev].same_process < 0 && prev != i &&
        r[i].rank >= 0 && r[i].rank == r[prev].rank)
      snprintf(warn[nwarn++], sizeof warn[0],
               "rank %" PRId64 " appears more than once (%s, %s): compare "
               "files of one job and one moment",
               r[i].rank, r[prev].file, r[i].file);
    prev = i;
  }
  if (world > 0 && nok < (uint64_t)world)
    snprintf(warn[nwarn++], sizeof warn[0],
             "world size %" PRId64 " but %u readable rank file%s", world,
             nok, nok == 1 ? "" : "s");
  if (nread < n)
    snprintf(warn[nwarn++], sizeof warn[0],
             "%u file%s could not be read (see their error)", n - nread,
             n - nread == 1 ? "" : "s");

  /* common leaks */
  uint32_t nlk = 0;
  for (uint32_t i = 0; i < n; i++)
    nlk += r[i].same_process < 0 ? r[i].nleaks : 0;
  lk_t *lk = calloc((size_t)nlk + 1, sizeof *lk);
  common_t *cm = calloc((size_t)nlk + 1, sizeof *cm);
  uint32_t ncm = 0;
  if (lk && cm) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
      for (uint32_t q = 0; q < r[i].nleaks && r[i].same_process < 0; q++)
        lk[k++] = (lk_t){r[i].leaks[q].site, i,
                         r[i].leaks[q].last - r[i].leaks[q].first};
    qsort(lk, nlk, sizeof *lk, cmp_lk);
    for (uint32_t i = 0, e; i < nlk; i = e) {
      uint32_t ranks = 0;
      for (e = i; e < nlk && !strcmp(lk[e].site, lk[i].site); e++)
        ranks += e == i || lk[e].rank_ix != lk[e - 1].rank_ix;
      if (ranks >= 2)
        cm[ncm++] = (common_t){lk[i].site, i, e - i};
    }
    qsort(cm, ncm, sizeof *cm, cmp_common);
  }

  uint32_t nout = 0, noom = 0;
  for (uint32_t i = 0; i < n; i++) {
    nout += r[i].outlier;
    noom += r[i].ok && r[i].same_process < 0 && r[i].ooms;
  }
  char b[6][32];
  if (json) {
    cli_json_t j;
    cj_init(&j, stdout);
    cj_obj(&j);
    cj_key(&j, "files");
    cj_u64(&j, n);
    cj_key(&j, "world_size");
    if (world > 0)
      cj_i64(&j, world);
    else
      cj_null(&j);
    cj_key(&j, "ranks");
    cj_arr(&j);
    for (uint32_t i = 0; i < n; i++) {
      const rank_t *x = &r[i];
      cj_obj(&j);
      cj_key(&j, "file");
      cj_cstr(&j, x->file);
      cj_key(&j, "rank");
      if (x->rank >= 0)
        cj_i64(&j, x->rank);
      else
        cj_null(&j);
      cj_key(&j, "rank_source");
      if (x->rank_source)
        cj_cstr(&j, x->rank_source);
      else
        cj_null(&j);
      cj_key(&j, "same_process_as");
      if (x->same_process >= 0)
        cj_cstr(&j, r[x->same_process].file);
      else
        cj_null(&j);
      cj_key(&j, "usable");
      cj_bool(&j, x->ok);
      cj_key(&j, "error");
      if (x->ok) {
        cj_null(&j);
      } else {
        /* a file that could not be read has every key of a rank: its
         * figures null, no leak candidates known, never an outlier */
        cj_cstr(&j, x->error);
        static const char *const unknown[] = {
            "world_size", "local_rank", "pid", "host", "devices",
            "peak_reserved_bytes", "peak_requested_bytes",
            "peak_allocated_bytes", "reserved_bytes",
            "allocated_bytes", "fragmentation", "ooms",
            "oom_requested_bytes", "steps", "leak_candidates"};
        for (size_t k = 0; k < sizeof unknown / sizeof *unknown; k++) {
          cj_key(&j, unknown[k]);
          cj_null(&j);
        }
        cj_key(&j, "outlier");
        cj_bool(&j, false);
        cj_key(&j, "outlier_metrics");
        cj_obj(&j);
        cj_obj_end(&j);
        cj_obj_end(&j);
        continue;
      }
#define OPT_(key, v)                                                          \
  cj_key(&j, key);                                                            \
  if ((v) >= 0)                                                               \
    cj_i64(&j, v);                                                            \
  else                                                                        \
    cj_null(&j);
      OPT_("world_size", x->world_size)
      OPT_("local_rank", x->local_rank)
      OPT_("pid", x->pid)
#undef OPT_
      cj_key(&j, "host");
      if (x->host[0])
        cj_cstr(&j, x->host);
      else
        cj_null(&j);
      cj_key(&j, "devices");
      cj_u64(&j, x->ndev);
      for (int k = 0; k < NMETRICS - 1; k++) {
        if (k == 1) { /* summary --json's name for it, written first */
          cj_key(&j, "peak_requested_bytes");
          cj_u64_or_null(&j, x->have_m[k], x->m[k]);
        }
        cj_key(&j, metric_names[k]);
        cj_u64_or_null(&j, x->have_m[k], x->m[k]);
      }
      cj_key(&j, "fragmentation");
      cj_obj(&j);
      cj_key(&j, "inactive_split_bytes");
      cj_u64(&j, x->m[4]);
      cj_key(&j, "largest_free_block_bytes");
      cj_u64(&j, x->largest_free);
      cj_key(&j, "free_segments_bytes");
      cj_u64(&j, x->free_segments_bytes);
      cj_obj_end(&j);
      cj_key(&j, "ooms");
      cj_u64(&j, x->ooms);
      cj_key(&j, "oom_requested_bytes");
      cj_u64_or_null(&j, x->ooms != 0, x->oom_requested);
      cj_key(&j, "steps");
      cj_u64(&j, x->steps);
      cj_key(&j, "leak_candidates");
      cj_arr(&j);
      for (uint32_t q = 0; q < x->nleaks; q++) {
        cj_obj(&j);
        cj_key(&j, "site");
        cj_cstr(&j, x->leaks[q].site);
        cj_key(&j, "bytes");
        cj_u64(&j, x->leaks[q].last - x->leaks[q].first);
        cj_key(&j, "confidence");
        cj_dbl(&j, floor(x->leaks[q].confidence * 1000.0 + 0.5) / 1000.0);
        cj_obj_end(&j);
      }
      cj_arr_end(&j);
      cj_key(&j, "outlier");
      cj_bool(&j, x->outlier);
      cj_key(&j, "outlier_metrics");
      cj_obj(&j);
      for (int k = 0; k < NMETRICS; k++)
        if (x->flagged[k]) {
          cj_key(&j, metric_names[k]);
          if (isfinite(x->dev_ratio[k]))
            cj_dbl(&j, floor(x->dev_ratio[k] * 1000.0 + 0.5) / 1000.0);
          else
            cj_null(&j);
        }
      cj_obj_end(&j);
      cj_obj_end(&j);
    }
    cj_arr_end(&j);
    cj_key(&j, "medians");
    cj_obj(&j);
    for (int k = 0; k < NMETRICS; k++) {
      for (int twice = k == 1; twice >= 0; twice--) {
        cj_key(&j, twice ? "peak_requested_bytes" : metric_names[k]);
        if (have_med[k])
          cj_dbl(&j, med[k]);
        else
          cj_null(&j);
      }
    }
    cj_obj_end(&j);
    cj_key(&j, "outliers");
    cj_arr(&j);
    for (uint32_t i = 0; i < n; i++)
      if (r[i].outlier)
        cj_cstr(&j, r[i].file);
    cj_arr_end(&j);
    cj_key(&j, "oom_ranks");
    cj_arr(&j);
    for (uint32_t i = 0; i < n; i++)
      if (r[i].ok && r[i].same_process < 0 && r[i].ooms)
        cj_cstr(&j, r[i].file);
    cj_arr_end(&j);
    cj_key(&j, "common_leaks");
    cj_arr(&j);
    for (uint32_t c = 0; c < ncm && (topn == 0 || c < (uint32_t)topn); c++) {
      cj_obj(&j);
      cj_key(&j, "site");
      cj_cstr(&j, cm[c].site);
      uint32_t ranks = 0;
      for (uint32_t q = cm[c].first; q < cm[c].first + cm[c].count; q++)
        ranks += q == cm[c].first || lk[q].rank_ix != lk[q - 1].rank_ix;
      cj_key(&j, "ranks");
      cj_u64(&j, ranks);
      cj_key(&j, "files");
      cj_arr(&j);
      for (uint32_t q = cm[c].first; q < cm[c].first + cm[c].count; q++)
        if (q == cm[c].first || lk[q].rank_ix != lk[q - 1].rank_ix)
          cj_cstr(&j, r[lk[q].rank_ix].file);
      cj_arr_end(&j);
      cj_obj_end(&j);
    }
    cj_arr_end(&j);
    cj_key(&j, "warnings");
    cj_arr(&j);
    for (uint32_t w = 0; w < nwarn; w++)
      cj_cstr(&j, warn[w]);
    cj_arr_end(&j);
    cj_obj_end(&j);
    cj_end(&j);
  } else {
    printf("fleet: %u file%s", n, n == 1 ? "" : "s");
    if (world > 0)
      printf(", world size %" PRId64, world);
    printf("\n");
    for (uint32_t w = 0; w < nwarn; w++) {
      fputs("warning: ", stdout); /* (file names: any bytes) */
      cli_put_utf8(stdout, warn[w], strlen(warn[w]));
      fputc('\n', stdout);
    }
    printf("\n%5s %-10s %12s %12s %12s %12s %12s %12s %4s %5s  %s\n",
           "rank", "host", "peak req", "peak resv", "reserved",
           "allocated", "inact split", "largest free", "OOMs", "leaks",
           "file");
    for (uint32_t i = 0; i < n; i++) {
      const rank_t *x = &r[i];
      char rk[24];
      if (x->rank >= 0)
        snprintf(rk, sizeof rk, "%" PRId64, x->rank);
      else
        snprintf(rk, sizeof rk, "?");
      if (!x->ok) {
        /* the columns of a rank (no figures: '-'), the file where every
         * row has it, and the error under it, as the other notes */
        printf("%5s %-10s %12s %12s %12s %12s %12s %12s %4s %5s  %s\n", rk,
               "?", "-", "-", "-", "-", "-", "-", "-", "-",
               cli_shown(x->file));
        printf("%5s %-10s could not be read: %s\n", "", "", x->error);
        continue;
      }
      printf("%5s %-10.10s %12s %12s %12s %12s %12s %12s %4u %5u  %s%s\n",
             rk, x->host[0] ? x->host : "?",
             x->have_peak ? cli_bytes(x->m[1], b[0], sizeof b[0]) : "-",
             x->have_peak ? cli_bytes(x->m[0], b[1], sizeof b[1]) : "-",
             cli_bytes(x->m[2], b[2], sizeof b[2]),
             cli_bytes(x->m[3], b[5], sizeof b[5]),
             cli_bytes(x->m[4], b[3], sizeof b[3]),
             cli_bytes(x->largest_free, b[4], sizeof b[4]), x->ooms,
             x->nleaks, cli_shown(x->file), x->outlier ? "  <- outlier" : "");
      if (x->same_process >= 0)
        printf("%5s %-10s earlier dump of the same process (pid %" PRId64
               "): not counted; %s stands for it\n",
               "", "", x->pid, cli_shown(r[x->same_process].file));
    }
    if (nout) {
      printf("\noutliers (far from the median of the ranks):\n");
      for (uint32_t i = 0; i < n; i++) {
        if (!r[i].outlier)
          continue;
        printf("  %s\n", cli_shown(r[i].file));
        for (int k = 0; k < NMETRICS; k++)
          if (!r[i].flagged[k])
            continue;
          else if (isfinite(r[i].dev_ratio[k]))
            printf("    %-22s %12s  %.2fx the median %s\n", metric_names[k],
                   cli_bytes(r[i].m[k], b[0], sizeof b[0]),
                   r[i].dev_ratio[k],
                   cli_bytes((uint64_t)med[k], b[1], sizeof b[1]));
          else /* (no ratio to a median of 0 B) */
            printf("    %-22s %12s  above the median %s\n", metric_names[k],
                   cli_bytes(r[i].m[k], b[0], sizeof b[0]),
                   cli_bytes((uint64_t)med[k], b[1], sizeof b[1]));
      }
    } else if (nok >= 3) {
      printf("\nno outlier rank\n");
    } else {
      printf("\n(outliers need at least 3 readable ranks)\n");
    }
    if (noom) {
      printf("\nranks with an OOM:\n");
      for (uint32_t i = 0; i < n; i++)
        if (r[i].ok && r[i].same_process < 0 && r[i].ooms)
          printf("  %s: %u OOM%s, last request %s (memsnap summary %s "
                 "explains it)\n",
                 r[i].file, r[i].ooms, r[i].ooms == 1 ? "" : "s",
                 cli_bytes(r[i].oom_requested, b[0], sizeof b[0]),
                 r[i].file);
    }
    if (ncm) {
      printf("\nleak sites common to several ranks:\n");
      for (uint32_t c = 0; c < ncm && (topn == 0 || c < (uint32_t)topn);
           c++) {
        uint32_t ranks = 0;
        for (uint32_t q = cm[c].first; q < cm[c].first + cm[c].count; q++)
          ranks += q == cm[c].first || lk[q].rank_ix != lk[q - 1].rank_ix;
        printf("  %3u/%u ranks  %s\n", ranks, nok, cm[c].site);
      }
    }
  }
  free(lk);
  free(cm);
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t q = 0; q < r[i].nleaks; q++)
      free(r[i].leaks[q].site);
    free(r[i].leaks);
    free((char *)r[i].file);
  }
  free(r);
  free(paths);
  if (nok == 0)
    return CLI_UNUSABLE;
  return nout ? CLI_FINDING : CLI_OK;
}
