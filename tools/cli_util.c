/*
 * cli_util.c -- helpers every memsnap command uses: messages, loading a
 * snapshot, progress on stderr, and read-only views of the snapshot model
 * (strings, stacks, block addresses, allocation sites, devices).
 *
 * Nothing here keeps state between calls except the progress struct the
 * caller owns.  Every accessor tolerates ids out of range (a reader bug
 * must not crash the CLI): they answer "absent".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "base/sink.h"

void cli_err(const char *fmt, ...) {
  va_list ap;
  char buf[2048], *m = buf;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof buf && (m = malloc((size_t)n + 1)) != NULL) {
    va_start(ap, fmt);
    vsnprintf(m, (size_t)n + 1, fmt, ap);
    va_end(ap);
  } else if (m == NULL) {
    m = buf;
    n = (int)sizeof buf - 1;
  }
  /* what stdout holds comes first when both go to one file or pipe
   * ("... not replayable (reason above)") */
  fflush(stdout);
  fputs("memsnap: ", stderr);
  cli_put_utf8(stderr, m, (size_t)n);
  fputc('\n', stderr);
  if (m != buf) free(m);
}

void cli_put_utf8(FILE *f, const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    size_t v = msnap__utf8_valid_prefix(p + i, len - i), bad = 1;
    fwrite(p + i, 1, v, f);
    i += v;
    if (i >= len) break;
    (void)msnap__utf8_seq(p + i, len - i, &bad);
    fputs("\xef\xbf\xbd", f); /* U+FFFD */
    i += bad;
  }
}

const char *cli_shown(const char *path) {
  static _Thread_local char *ring[8];
  static _Thread_local unsigned next;
  size_t n = strlen(path);
  if (msnap__utf8_valid_prefix((const unsigned char *)path, n) == n)
    return path;
  char *r = n <= (SIZE_MAX - 1) / 3 ? malloc(3 * n + 1) : NULL;
  if (r == NULL) return "?";
  r[msnap__utf8_repair((const unsigned char *)path, n, r)] = '\0';
  free(ring[next]);
  ring[next] = r;
  next = (next + 1) % 8;
  return r;
}

int cli_usage_error(const char *cmd, const char *what) {
  if (what) {
    fprintf(stderr, "memsnap %s: ", cmd);
    cli_put_utf8(stderr, what, strlen(what)); /* (it may quote argv) */
    fputc('\n', stderr);
  }
  fprintf(stderr, "Try 'memsnap %s --help'.\n", cmd);
  return CLI_UNUSABLE;
}

/*
 * Read `path` with the safe reader (which checks the model's structural
 * invariants).  The caller owns *out on success.  Every failure is reported
 * with the file name and the reader's byte offset.
 */
static _Thread_local char load_error[1024]; /* per thread: fleet loads in parallel */

const char *cli_load_error(void) { return load_error; }

int cli_load(const char *path, msnap_snap_t **out) {
  return cli_load_ex(path, out, false);
}

int cli_load_ex(const char *path, msnap_snap_t **out, bool skip_stacks) {
  msnap_read_stats_t opts;
  memset(&opts, 0, sizeof opts);
  opts.skip_stacks = skip_stacks;
  msnap_read_error_t err;
  msnap_snap_t *s = NULL;
  memset(&err, 0, sizeof err);
  if (path[0] == '\0') { /* "memsnap: : cannot open" said nothing */
    snprintf(load_error, sizeof load_error,
             "an empty file name: give a snapshot file, or - for standard "
             "input [%s]",
             msnap_err_name(MSNAP_EINVAL));
    cli_err("%s", load_error);
    return CLI_UNUSABLE;
  }
  int rc = msnap__snap_read_file_ex(path, &s, &err, &opts);
  if (rc != 0 || !s) {
    cli_sanitize(err.msg); /* it may quote bytes of the file */
    /* An open failure's message starts with the name, which the line
     * below (and the JSON outputs' "file") give already. */
    const char *msg = err.msg;
    size_t pl = strlen(path);
    if (strncmp(msg, path, pl) == 0 && msg[pl] == ':' && msg[pl + 1] == ' ')
      msg += pl + 2;
    else if (strcmp(path, "-") == 0 &&
             strncmp(msg, "standard input: ", 16) == 0)
      msg += 16;
    if (msg[0])
      snprintf(load_error, sizeof load_error, "%s [%s]", msg,
               msnap_err_name(rc));
    else
      snprintf(load_error, sizeof load_error,
               "cannot read snapshot: %s [%s]", msnap_strerror(rc),
               msnap_err_name(rc));
    cli_err("%s: %s", path, load_error);
    if (s)
      msnap__snap_free(s);
    return CLI_UNUSABLE;
  }
  /* (the reader checked the model's invariants) */
  *out = s;
  return CLI_OK;
}

void cli_json_unusable(const char *file, const char *error) {
  cli_json_t j;
  cj_init(&j, stdout);
  cj_obj(&j);
  cj_key(&j, "file");
  if (file != NULL)
    cj_cstr(&j, file);
  else
    cj_null(&j);
  cj_key(&j, "usable");
  cj_bool(&j, false);
  cj_key(&j, "error");
  cj_cstr(&j, error != NULL ? error : cli_load_error());
  cj_obj_end(&j);
  cj_end(&j);
}

/* ---- progress ------------------------------------------------------------ */

static double cli_elapsed(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) +
         (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

void cli_progress_init(cli_progress_t *p, const char *label) {
  clock_gettime(CLOCK_MONOTONIC, &p->start);
  p->tty = isatty(2) != 0;
  p->shown = false;
  p->last = 0;
  p->label = label;
}

void cli_progress_tick(cli_progress_t *p, uint64_t done, uint64_t total) {
  if (!p->tty)
    return;
  double t = cli_elapsed(&p->start);
  if (t < 1.0 || t - p->last < 0.25)
    return;
  p->last = t;
  fprintf(stderr, "\r%s: %" PRIu64 "/%" PRIu64 " (%.0f%%)", p->label, done,
          total, total ? 100.0 * (double)done / (double)total : 100.0);
  p->shown = true;
}

void cli_progress_end(cli_progress_t *p) {
  if (p->shown)
    fprintf(stderr, "\r%s: done in %.1f s          \n", p->label,
            cli_elapsed(&p->start));
  p->shown = false;
}

/* ---- model views --------------------------------------------------------- */

const char *cli_str(const msnap_snap_t *s, msnap_str_t id, size_t *len) {
  size_t l = 0;
  const char *p = NULL;
  if (id != MSNAP_STR_ABSENT && id < s->nstrings)
    p = msnap__snap_str(s, id, &l);
  if (!p) {
    p = "";
    l = 0;
  }
  if (len)
    *len = l;
  return p;
}

/* cli_stack's buffer is per thread (fleet analyses files on worker
 * threads); a thread's buffer is freed when the thread ends (the key's
 * destructor). */
static pthread_key_t stack_buf_key;
static pthread_once_t stack_buf_once = PTHREAD_ONCE_INIT;
static void stack_buf_key_init(void) {
  (void)pthread_key_create(&stack_buf_key, free);
}

const uint32_t *cli_stack(const msnap_snap_t *s, msnap_stack_t st,
                          uint32_t *n) {
  /* the model keeps stacks encoded (about a byte per frame): decode into
   * this thread's buffer, valid until the next call */
  static _Thread_local uint32_t *buf;
  static _Thread_local uint32_t cap;
  *n = 0;
  if (st <= MSNAP_STACK_EMPTY || st >= s->nstacks)
    return NULL;
  uint32_t len = msnap__stack_len(s, st);
  if (len > cap) {
    pthread_once(&stack_buf_once, stack_buf_key_init);
    uint32_t *nb = realloc(buf, (size_t)len * sizeof *nb);
    if (!nb)
      return NULL;
    buf = nb;
    cap = len;
    (void)pthread_setspecific(stack_buf_key, buf);
  }
  *n = msnap__stack_frames(s, st, buf, len);
  return buf;
}

msnap_stack_t cli_block_stack(const msnap_snap_t *s,
                              const msnap_sblock_t *b) {
  if (b->keys & MSNAP_K_FRAMES)
    return b->frames;
  if (b->history.n > 0 &&
      (uint64_t)b->history.first + b->history.n <= s->nhistories)
    return s->histories[b->history.first].frames;
  return MSNAP_STACK_ABSENT;
}

uint64_t cli_block_addr(const msnap_snap_t *s, const msnap_ssegment_t *seg,
                        uint32_t i) {
  const msnap_sblock_t *b = &s->blocks[seg->first_block + i];
  if (b->keys & MSNAP_K_ADDRESS)
    return b->address;
  uint64_t a = seg->address;
  for (uint32_t k = 0; k < i; k++)
    a += s->blocks[seg->first_block + k].size;
  return a;
}

const char *cli_action_name(const msnap_snap_t *s, const msnap_strace_t *e) {
  if (e->action == MSNAP_ACTION_UNKNOWN) {
    const char *n = cli_str(s, msnap__tattr(s, e)->action_str, NULL);
    return n[0] ? n : "?";
  }
  const char *n = msnap_action_name(e->action);
  return n ? n : "?";
}

const char *cli_state_name(const msnap_snap_t *s, const msnap_sblock_t *b) {
  switch (b->state) {
  case MSNAP_BLOCK_INACTIVE: return "inactive";
  case MSNAP_BLOCK_ACTIVE_ALLOCATED: return "active_allocated";
  case MSNAP_BLOCK_ACTIVE_PENDING_FREE: return "active_pending_free";
  default: return cli_str(s, b->state_str, NULL);
  }
}

static bool ends_with(const char *s, size_t n, const char *suf) {
  size_t m = strlen(suf);
  return n >= m && memcmp(s + n - m, suf, m) == 0;
}

/* True when the path has a component equal to `comp`. */
static bool has_component(const char *s, size_t n, const char *comp) {
  size_t m = strlen(comp);
  for (size_t i = 0; i + m <= n; i++) {
    if ((i == 0 || s[i - 1] == '/' || s[i - 1] == '\\') &&
        memcmp(s + i, comp, m) == 0 &&
        (i + m == n || s[i + m] == '/' || s[i + m] == '\\'))
      return true;
  }
  return false;
}

static bool is_python_file(const char *f, size_t n) {
  return ends_with(f, n, ".py");
}

/* The standard library: lib/python3.x on POSIX, <prefix>\Lib on Windows
 * (C:\Python311\Lib\asyncio\tasks.py), frozen modules; never under
 * site-packages. */
static bool is_stdlib(const char *f, size_t n) {
  if (memmem(f, n, "site-packages", 13) || memmem(f, n, "dist-packages", 13))
    return false;
  return memmem(f, n, "/lib/python3", 12) != NULL ||
         memmem(f, n, "\\Lib\\", 5) != NULL ||
         memmem(f, n, "\\lib\\python3", 12) != NULL ||
         memmem(f, n, "<frozen", 7) != NULL;
}

static bool is_torch(const char *f, size_t n) {
  return has_component(f, n, "torch") || has_component(f, n, "torch_npu") ||
         has_component(f, n, "memsnap");
}

static bool is_third_party(const char *f, size_t n) {
  return memmem(f, n, "site-packages", 13) || memmem(f, n, "dist-packages", 13);
}

/* Code torch.compile generated: Inductor writes its output code as .py
 * files under its cache directory, <tmp>/torchinductor_<user>/ by default
 * (torch/_inductor/runtime/cache_dir_utils.py: default_cache_dir). */
static bool is_generated(const char *f, size_t n) {
  static const char dir[] = "torchinductor_";
  const size_t m = sizeof dir - 1;
  for (size_t i = 0; i + m <= n; i++)
    if ((i == 0 || f[i - 1] == '/' || f[i - 1] == '\\') &&
        memcmp(f + i, dir, m) == 0)
      return true;
  return false;
}

static bool starts_with(const char *s, size_t n, const char *pre) {
  size_t m = strlen(pre);
  return n >= m && memcmp(s, pre, m) == 0;
}

/* Code the user typed, with no file of its own: a script read from
 * standard input (`python -`, the REPL before Python 3.13: "<stdin>"),
 * the REPL of Python 3.13 ("<python-input-N>") and IPython's cells
 * ("<ipython-input-N-HASH>").  (Jupyter's cells are files,
 * /tmp/ipykernel_PID/N.py: user code as any other.)  Other names in
 * brackets are not user code: "<frozen ...>" is the standard library's,
 * "<eval_with_key>.N" torch.fx's generated code. */
static bool is_typed_code(const char *f, size_t n) {
  return (n == 7 && memcmp(f, "<stdin>", 7) == 0) ||
         ((starts_with(f, n, "<python-input-") ||
           starts_with(f, n, "<ipython-input-")) &&
          f[n - 1] == '>');
}

/* "<string>": the code of `python -c` or of exec()/eval() of a string --
 * the user's, or code a library generated (dataclasses' __init__,
 * namedtuple's __new__): the site only when no other frame of the user's
 * is on the stack. */
static bool is_string_code(const char *f, size_t n) {
  return n == 8 && memcmp(f, "<string>", 8) == 0;
}

uint32_t cli_empty_site(const msnap_snap_t *s) {
  bool python = false;
  for (uint32_t i = 0; i < s->nframes; i++) {
    size_t fl;
    const char *file = cli_str(s, s->frames[i].filename, &fl);
    /* a Python frame: a .py file, or "<string>", "<frozen ...>",
     * "<ipython-input-...>" */
    if (is_python_file(file, fl) || (fl > 0 && file[0] == '<'))
      python = true;
    else
      return CLI_SITE_NONE; /* a native frame: C++ stacks were recorded */
  }
  return python ? CLI_SITE_NO_PYTHON : CLI_SITE_NONE;
}

/* A path is at most PATH_MAX (4096) bytes: of a longer "filename" the
 * rules read the tail alone (its last components), so that a MiB-long
 * string shared by every stack costs no more than a path at each of the
 * allocations. */
static void rule_tail(const char **file, size_t *fl) {
  if (*fl > CLI_TEXT_CAP) {
    *file += *fl - CLI_TEXT_CAP;
    *fl = CLI_TEXT_CAP;
  }
}

bool cli_frame_is_user(const msnap_snap_t *s, uint32_t frame) {
  if (frame >= s->nframes) return false;
  size_t fl;
  const char *file = cli_str(s, s->frames[frame].filename, &fl);
  if (is_typed_code(file, fl) || is_string_code(file, fl))
    return true;
  rule_tail(&file, &fl);
  return is_python_file(file, fl) && !is_torch(file, fl) &&
         !is_stdlib(file, fl) && !is_third_party(file, fl) &&
         !is_generated(file, fl);
}

cli_site_t cli_site(const msnap_snap_t *s, msnap_stack_t st) {
  uint32_t n;
  const uint32_t *fr = cli_stack(s, st, &n);
  uint32_t first_py = UINT32_MAX, first_lib = UINT32_MAX;
  cli_site_t site = {CLI_SITE_NONE, CLI_SITE_NONE};
  cli_site_t str = {CLI_SITE_NONE, CLI_SITE_NONE}; /* innermost <string> */
  for (uint32_t i = 0; i < n; i++) {
    if (fr[i] >= s->nframes)
      continue;
    size_t fl;
    const char *file = cli_str(s, s->frames[fr[i]].filename, &fl);
    if (is_string_code(file, fl)) {
      if (str.frame == CLI_SITE_NONE) {
        str.frame = fr[i];
        str.via = first_lib;
      }
      continue;
    }
    bool typed = is_typed_code(file, fl);
    if (!typed && !is_python_file(file, fl))
      continue;
    rule_tail(&file, &fl);
    if (first_py == UINT32_MAX)
      first_py = fr[i];
    if (!typed &&
        (is_torch(file, fl) || is_stdlib(file, fl) || is_generated(file, fl)))
      continue;
    if (!typed && is_third_party(file, fl)) {
      if (first_lib == UINT32_MAX)
        first_lib = fr[i];
      continue;
    }
    site.frame = fr[i];
    site.via = first_lib;
    return site;
  }
  if (str.frame != CLI_SITE_NONE)
    return str;
  if (first_lib != UINT32_MAX) {
    site.frame = first_lib;
    return site;
  }
  if (first_py != UINT32_MAX) {
    site.frame = first_py;
    return site;
  }
  /* Only native frames (an autograd engine thread): the innermost
   * autograd node ("...MulBackward0::apply(...)") says which backward op
   * allocated; else the innermost frame that is not the unwinder, the
   * traceback gatherer or the caching allocator itself. */
  for (uint32_t i = 0; i < n; i++) {
    if (fr[i] >= s->nframes)
      continue;
    size_t nl;
    const char *name = cli_str(s, s->frames[fr[i]].name, &nl);
    if (memmem(name, nl, "Backward", 8) && memmem(name, nl, "::apply(", 8)) {
      site.frame = fr[i];
      return site;
    }
  }
  static const char *const skip[] = {"unwind", "CapturedTraceback",
                                     "gather", "CachingAllocator",
                                     "c10::", "_start", "__libc_start_main",
                                     NULL};
  for (uint32_t i = 0; i < n; i++) {
    if (fr[i] >= s->nframes)
      continue;
    size_t nl;
    const char *name = cli_str(s, s->frames[fr[i]].name, &nl);
    bool skipped = nl == 0;
    for (int k = 0; skip[k] && !skipped; k++)
      skipped = memmem(name, nl, skip[k], strlen(skip[k])) != NULL;
    if (!skipped) {
      site.frame = fr[i];
      return site;
    }
  }
  for (uint32_t i = 0; i < n; i++)
    if (fr[i] < s->nframes) {
      site.frame = fr[i];
      return site;
    }
  return site;
}

/* Text of a file's string cut for display: at most CLI_TEXT_CAP bytes,
 * at a UTF-8 boundary; *cut set when it was cut (an ellipsis follows). */
static size_t text_head(const char *p, size_t n, bool *cut) {
  size_t k = msnap__utf8_cut((const unsigned char *)p, n, CLI_TEXT_CAP);
  *cut = k < n;
  return k;
}

size_t cli_text_cap(const char *p, size_t n, bool tail, char *out) {
  if (n <= CLI_TEXT_CAP) {
    memcpy(out, p, n);
    return n;
  }
  size_t e = sizeof CLI_ELLIPSIS - 1;
  if (!tail) {
    size_t k = msnap__utf8_cut((const unsigned char *)p, n, CLI_TEXT_CAP);
    memcpy(out, p, k);
    memcpy(out + k, CLI_ELLIPSIS, e);
    return k + e;
  }
  size_t start = n - CLI_TEXT_CAP;
  while (start < n && ((unsigned char)p[start] & 0xc0) == 0x80)
    start++;
  memcpy(out, CLI_ELLIPSIS, e);
  memcpy(out + e, p + start, n - start);
  return e + n - start;
}

/* One frame as "file:line:name" (see cli_site_format); returns the
 * length written (snprintf's).  A name longer than CLI_TEXT_CAP bytes is
 * cut to its head, a file's last two components longer than CLI_FILE_CAP
 * to their tail, with an ellipsis: the work is bounded whatever the file
 * holds. */
static int frame_format(const msnap_snap_t *s, uint32_t frame, char *buf,
                        size_t len) {
  const msnap_frame_t *f = &s->frames[frame];
  size_t fl, nl;
  const char *file = cli_str(s, f->filename, &fl);
  const char *name = cli_str(s, f->name, &nl);
  bool ncut;
  /* A native frame (line 0, not a Python file): its C++ name alone,
   * without the final parameter list. */
  if (f->line == 0 && !is_python_file(file, fl)) {
    if (nl > 0 && nl <= CLI_TEXT_CAP && name[nl - 1] == ')') {
      int depth = 0;
      for (size_t i = nl; i > 0; i--) {
        depth += name[i - 1] == ')' ? 1 : name[i - 1] == '(' ? -1 : 0;
        if (depth == 0) {
          if (i > 1)
            nl = i - 1;
          break;
        }
      }
    }
    nl = text_head(name, nl, &ncut);
    return snprintf(buf, len, "%.*s%s", (int)nl, name, ncut ? CLI_ELLIPSIS : "");
  }
  /* Keep the last two path components (POSIX or Windows separators:
   * D:\work\proj\model.py gives proj\model.py); at most the last
   * CLI_FILE_CAP bytes of them, after an ellipsis (the line and name
   * still fit in a line of text). */
  size_t start = fl > CLI_FILE_CAP ? fl - CLI_FILE_CAP : 0;
  bool fcut = start > 0;
  int slashes = 0;
  for (size_t i = fl; i > start; i--) {
    if ((file[i - 1] == '/' || file[i - 1] == '\\') && ++slashes == 2) {
      start = i;
      fcut = false;
      break;
    }
  }
  if (fcut) /* not inside a UTF-8 sequence */
    while (start < fl && ((unsigned char)file[start] & 0xc0) == 0x80)
      start++;
  nl = text_head(name, nl, &ncut);
  return snprintf(buf, len, "%s%.*s:%" PRId64 ":%.*s%s",
                  fcut ? CLI_ELLIPSIS : "", (int)(fl - start), file + start,
                  f->line, (int)nl, name, ncut ? CLI_ELLIPSIS : "");
}

void cli_sanitize(char *buf) {
  for (; *buf; buf++)
    if ((unsigned char)*buf < 0x20 || *buf == 0x7f)
      *buf = '?';
}

/* The site as text, unsanitized (cli_site_format's work). */
static void site_format(const msnap_snap_t *s, cli_site_t site, char *buf,
                        size_t len) {
  if (site.frame == CLI_SITE_BEFORE_TRACE) {
    snprintf(buf, len, "%s", CLI_SITE_BEFORE_TEXT);
    return;
  }
  if (site.frame == CLI_SITE_NO_PYTHON) {
    snprintf(buf, len, "%s", CLI_SITE_NO_PYTHON_TEXT);
    return;
  }
  if (site.frame >= s->nframes) {
    snprintf(buf, len, "%s", CLI_SITE_NONE_TEXT);
    return;
  }
  int w = frame_format(s, site.frame, buf, len);
  if (site.via < s->nframes && w >= 0 && (size_t)w + 8 < len) {
    memcpy(buf + w, " (via ", 6);
    int v = frame_format(s, site.via, buf + w + 6, len - (size_t)w - 6);
    if (v >= 0 && (size_t)w + 6 + (size_t)v + 1 < len)
      memcpy(buf + w + 6 + v, ")", 2);
  }
}

void cli_site_format(const msnap_snap_t *s, cli_site_t site, char *buf,
                     size_t len) {
  if (len == 0)
    return;
  site_format(s, site, buf, len);
  cli_sanitize(buf);
}

/* A site of cli_site_sums_rank with its text, formatted once. */
typedef struct ranked_s {
  cli_site_sum_t v;
  char *text;
} ranked_t;

/* The ranking order of cli_site_sums_rank. */
static int cmp_ranked(const void *a, const void *b) {
  const ranked_t *rx = a, *ry = b;
  const cli_site_sum_t *x = &rx->v, *y = &ry->v;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  int c = strcmp(rx->text, ry->text);
  if (c)
    return c;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  if (x->site.frame != y->site.frame)
    return x->site.frame < y->site.frame ? -1 : 1;
  return x->site.via < y->site.via ? -1 : x->site.via > y->site.via;
}

/* The same order with the text formatted at each comparison: the
 * fallback when the texts cannot be stored (each bounded by
 * CLI_TEXT_CAP). */
static int cmp_site_sum_rank(const void *a, const void *b, void *arg) {
  const cli_site_sum_t *x = a, *y = b;
  char tx[512], ty[512];
  ranked_t rx = {*x, tx}, ry = {*y, ty};
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  cli_site_format(arg, x->site, tx, sizeof tx);
  cli_site_format(arg, y->site, ty, sizeof ty);
  return cmp_ranked(&rx, &ry);
}


void cli_bytes_apart(uint64_t x, char *bx, size_t nx, uint64_t y, char *by,
                     size_t ny) {
  cli_bytes(x, bx, nx);
  cli_bytes(y, by, ny);
  if (strcmp(bx, by) != 0)
    return;
  size_t lx = strlen(bx), ly = strlen(by);
  snprintf(bx + lx, nx - lx, ", %" PRIu64 " B", x);
  snprintf(by + ly, ny - ly, ", %" PRIu64 " B", y);
}

/* Each site's text is formatted once (not at each comparison: a name of
 * a MiB shared by thousands of sites made that quadratic in time). */
void cli_site_sums_rank(const msnap_snap_t *s, cli_site_sum_t *v,
                        uint32_t n) {
  if (n < 2)
    return;
  ranked_t *r = calloc(n, sizeof *r);
  bool ok = r != NULL;
  for (uint32_t i = 0; ok && i < n; i++) {
    char t[512];
    cli_site_format(s, v[i].site, t, sizeof t);
    r[i].v = v[i];
    ok = (r[i].text = strdup(t)) != NULL;
  }
  if (ok) {
    qsort(r, n, sizeof *r, cmp_ranked);
    for (uint32_t i = 0; i < n; i++)
      v[i] = r[i].v;
  } else {
    qsort_r(v, n, sizeof *v, cmp_site_sum_rank, (void *)s);
  }
  if (r)
    for (uint32_t i = 0; i < n; i++)
      free(r[i].text);
  free(r);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int64_t *cli_devices(const msnap_snap_t *s, uint32_t *n) {
  uint32_t cap = s->nsegments + s->ndevices + 1, k = 0;
  int64_t *v = malloc(cap * sizeof *v);
  if (!v) {
    *n = 0;
    return NULL;
  }
  for (uint32_t i = 0; i < s->nsegments; i++)
    v[k++] = s->segments[i].device;
  for (uint32_t d = 0; d < s->ndevices; d++)
    if (s->device_traces[d].n > 0)
      v[k++] = d;
  qsort(v, k, sizeof *v, cmp_i64);
  uint32_t m = 0;
  for (uint32_t i = 0; i < k; i++)
    if (m == 0 || v[m - 1] != v[i])
      v[m++] = v[i];
  *n = m;
  return v;
}

const msnap_trace_list_t *cli_trace(const msnap_snap_t *s, int64_t device) {
  if (device < 0 || (uint64_t)device >= s->ndevices || !s->device_traces)
    return NULL;
  return &s->device_traces[device];
}

const char *cli_plural(uint64_t n, const char *one, const char *many) {
  return n == 1 ? one : many;
}

const char *cli_bytes(uint64_t v, char *buf, size_t len) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int i = 0;
  while (d >= 1024.0 && i < 4) {
    d /= 1024.0;
    i++;
  }
  if (i == 0)
    snprintf(buf, len, "%" PRIu64 " B", v);
  else
    snprintf(buf, len, "%.2f %s", d, u[i]);
  return buf;
}

const char *cli_duration(int64_t us, char *buf, size_t len) {
  const char *sign = us < 0 ? "-" : "";
  double a = us < 0 ? -(double)us : (double)us;
  if (a < 1000)
    snprintf(buf, len, "%s%.0f us", sign, a);
  else if (a < 1e6)
    snprintf(buf, len, "%s%.3g ms", sign, a / 1e3);
  else if (a < 60e6)
    snprintf(buf, len, "%s%.3g s", sign, a / 1e6);
  else
    snprintf(buf, len, "%s%" PRIu64 " min %" PRIu64 " s", sign,
             (uint64_t)(a / 1e6) / 60, (uint64_t)(a / 1e6) % 60);
  return buf;
}

const char *cli_bytes_tick(uint64_t v, char *buf, size_t len) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  double d = (double)v;
  while (d >= 1024.0 && i < 4) {
    d /= 1024.0;
    i++;
  }
  snprintf(buf, len, "%.2f", d);
  /* Trailing zeros and a trailing point go. */
  char *dot = strchr(buf, '.');
  if (dot) {
    char *e = buf + strlen(buf);
    while (e > dot + 1 && e[-1] == '0')
      *--e = 0;
    if (e == dot + 1)
      *dot = 0;
  }
  size_t n = strlen(buf);
  snprintf(buf + n, len > n ? len - n : 0, " %s", u[i]);
  return buf;
}

uint64_t cli_nice_step(uint64_t max, bool bytes, unsigned most) {
  if (most == 0)
    most = 1;
  uint64_t unit = 1;
  if (bytes)
    while (unit <= UINT64_MAX / 1024 && max / unit >= 1024)
      unit *= 1024;
  /* Steps 1, 2, 5, 10, 20, 50... (times unit) until max fits in `most`
   * intervals. */
  static const uint64_t m[] = {1, 2, 5};
  for (uint64_t p = 1; p <= UINT64_MAX / 10; p *= 10)
    for (int k = 0; k < 3; k++) {
      uint64_t st = m[k] * p;
      if (st > UINT64_MAX / unit)
        return UINT64_MAX;
      st *= unit;
      if (max / st < most || (max / st == most && max % st == 0))
        return st;
    }
  return UINT64_MAX;
}

const msnap_gv_t *cli_gv_get(const msnap_snap_t *s, const msnap_gv_t *d,
                             const char *key) {
  if (!d || d->kind != MSNAP_GV_DICT)
    return NULL;
  size_t kl = strlen(key);
  for (uint32_t i = 0; i + 1 < d->u.seq.n; i += 2) {
    const msnap_gv_t *k = &d->u.seq.items[i];
    size_t n;
    const char *p = k->kind == MSNAP_GV_STR ? cli_str(s, k->u.s, &n) : NULL;
    if (p && n == kl && !memcmp(p, key, n))
      return &d->u.seq.items[i + 1];
  }
  return NULL;
}

const char *cli_gv_str(const msnap_snap_t *s, const msnap_gv_t *d,
                       const char *key) {
  const msnap_gv_t *v = cli_gv_get(s, d, key);
  return v && v->kind == MSNAP_GV_STR ? cli_str(s, v->u.s, NULL) : NULL;
}

bool cli_gv_int(const msnap_snap_t *s, const msnap_gv_t *d, const char *key,
                int64_t *out) {
  const msnap_gv_t *v = cli_gv_get(s, d, key);
  if (!v || v->kind != MSNAP_GV_INT)
    return false;
  *out = v->u.i;
  return true;
}

/*
 * The profile a recording was made with: memsnap's process_info names it;
 * otherwise a recording whose allocator_settings name
 * PYTORCH_NPU_ALLOC_CONF comes from torch_npu's allocator (npu); anything
 * else from PyTorch's (cuda).
 */
bool cli_last_time(const msnap_snap_t *s, int64_t *t) {
  bool have = false;
  for (uint32_t d = 0; d < s->ndevices; d++) {
    const msnap_trace_list_t *tl = &s->device_traces[d];
    for (uint32_t i = 0; i < tl->n; i++)
      if ((msnap__tattr(s, &tl->v[i])->keys & MSNAP_K_TIME) &&
          (!have || tl->v[i].time_us > *t)) {
        have = true;
        *t = tl->v[i].time_us;
      }
  }
  return have;
}

const char *cli_recording_profile_why(const msnap_snap_t *s,
                                      const char **why) {
  const char *w;
  if (why == NULL) why = &w;
  const char *p = cli_gv_str(s, &s->process_info, "profile");
  if (p && (!strcmp(p, "npu") || !strcmp(p, "cuda"))) {
    *why = "named in process_info";
    return p;
  }
  if (cli_gv_get(s, &s->allocator_settings, "PYTORCH_NPU_ALLOC_CONF")) {
    *why = "its settings name PYTORCH_NPU_ALLOC_CONF";
    return "npu";
  }
  const msnap_gv_t *l =
      cli_gv_get(s, &s->allocator_settings, "workspace_segments");
  if (l && l->kind == MSNAP_GV_LIST && l->u.seq.n > 0) {
    *why = "it has workspace segments";
    return "npu";
  }
  for (uint32_t d = 0; d < s->ndevices; d++)
    for (uint32_t i = 0; i < s->device_traces[d].n; i++)
      if (s->device_traces[d].v[i].action ==
          MSNAP_ACTION_WORKSPACE_SNAPSHOT) {
        *why = "its trace has workspace_snapshot entries";
        return "npu";
      }
  *why = "it has no NPU-only field";
  return "cuda";
}

const char *cli_recording_profile(const msnap_snap_t *s) {
  return cli_recording_profile_why(s, NULL);
}

bool cli_skipped_history(const msnap_snap_t *s, char *why, size_t n) {
  static const msnap_action_t history[] = {
      MSNAP_ACTION_ALLOC,         MSNAP_ACTION_FREE_REQUESTED,
      MSNAP_ACTION_FREE_COMPLETED, MSNAP_ACTION_SEGMENT_ALLOC,
      MSNAP_ACTION_SEGMENT_FREE,  MSNAP_ACTION_SEGMENT_MAP,
      MSNAP_ACTION_SEGMENT_UNMAP};
  const msnap_gv_t *l =
      cli_gv_get(s, &s->allocator_settings, "trace_skip_actions");
  if (!l || l->kind != MSNAP_GV_LIST) return false;
  size_t w = 0;
  int found = 0;
  for (uint32_t i = 0; i < l->u.seq.n; i++) {
    const msnap_gv_t *v = &l->u.seq.items[i];
    if (v->kind != MSNAP_GV_STR) continue;
    const char *name = cli_str(s, v->u.s, NULL);
    for (size_t k = 0; k < sizeof history / sizeof *history; k++) {
      if (strcmp(name, msnap_action_name(history[k])) != 0) continue;
      if (why && n && w < n)
        w += (size_t)snprintf(why + w, n - w, "%s'%s'",
                              found ? ", " : "", name);
      found++;
    }
  }
  if (found && why && n && w < n)
    snprintf(why + w, n - w, " entries (allocator_settings "
             "trace_skip_actions: _record_memory_history(skip_actions=...))");
  return found > 0;
}

bool cli_device_info(const msnap_snap_t *s, int64_t dev, const char *key,
                     uint64_t *out) {
  const msnap_gv_t *l = cli_gv_get(s, &s->process_info, "devices");
  if (!l || l->kind != MSNAP_GV_LIST)
    return false;
  for (uint32_t i = 0; i < l->u.seq.n; i++) {
    int64_t d, t;
    if (cli_gv_int(s, &l->u.seq.items[i], "device", &d) && d == dev)
      if (cli_gv_int(s, &l->u.seq.items[i], key, &t) && t >= 0) {
        *out = (uint64_t)t;
        return true;
      }
  }
  return false;
}

uint32_t cli_entry_at_time(const msnap_trace_list_t *tl, int64_t t) {
  if (tl == NULL) return 0;
  return cli_lower_bound(tl->v, tl->n, sizeof *tl->v,
                         offsetof(msnap_strace_t, time_us), (uint64_t)t,
                         true);
}

const char *cli_generation_name(msnap_generation_t g) {
  switch (g) {
  case MSNAP_GEN_SEGMENT_LIST: return "segment list";
  case MSNAP_GEN_2_0: return "2.0";
  case MSNAP_GEN_2_1: return "2.1";
  case MSNAP_GEN_2_2: return "2.2";
  case MSNAP_GEN_2_6: return "2.6";
  case MSNAP_GEN_CURRENT: return "current";
  }
  return "?";
}

int64_t cli_default_device(const msnap_snap_t *s) {
  int64_t best = -1;
  uint32_t len = 0;
  for (uint32_t d = 0; d < s->ndevices; d++)
    if (s->device_traces[d].n > len) {
      len = s->device_traces[d].n;
      best = d;
    }
  if (best >= 0)
    return best;
  return s->nsegments ? s->segments[0].device : 0;
}

/*
 * Write len bytes to path through the library's atomic file (temporary +
 * rename for a regular file, a symlink's target replaced, a device or FIFO
 * written directly, a directory refused), so a failure never leaves a
 * truncated file.  Prints the reason and returns -1 on failure.
 */
static char output_error[1024];

const char *cli_output_error(void) { return output_error; }

void cli_output_failed(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(output_error, sizeof output_error, fmt, ap);
  va_end(ap);
  if (output_error[0] == '\0')
    snprintf(output_error, sizeof output_error, "cannot write the output");
  cli_err("%s", output_error);
}

/* reason less a leading "PREFIX'out'SUFFIX" (out NULL: "PREFIXSUFFIX"). */
static const char *skip_opening(const char *reason, const char *prefix,
                                const char *out, const char *suffix) {
  size_t n = strlen(prefix);
  if (strncmp(reason, prefix, n) != 0) return reason;
  const char *p = reason + n;
  if (out != NULL) {
    size_t k = strlen(out);
    if (p[0] != '\'' || strncmp(p + 1, out, k) != 0 || p[1 + k] != '\'')
      return reason;
    p += k + 2;
  }
  n = strlen(suffix);
  return strncmp(p, suffix, n) == 0 ? p + n : reason;
}

void cli_write_failed(const char *out, const char *what, int code,
                      const char *reason) {
  const char *shown = out ? cli_output_shown(out) : "standard output";
  const char *sp = what[0] ? " " : "";
  char tail[64] = "";
  if (code != 0) snprintf(tail, sizeof tail, " [%s]", msnap_err_name(code));
  if (out != NULL) {
    reason = skip_opening(reason, "cannot write ", out, ": ");
    reason = skip_opening(reason, "writing ", out, " failed: ");
  }
  reason = skip_opening(reason, "write failed: ", NULL, "");
  if (reason[0] == '\0') reason = code ? msnap_strerror(code) : "write error";
  char quoted[4096];
  snprintf(quoted, sizeof quoted, "'%s'", out ? out : "");
  if (out != NULL && strstr(reason, quoted) != NULL)
    /* the library names the path in its own words: once */
    cli_output_failed("cannot write%s%s: %s%s", sp, what, reason, tail);
  else
    cli_output_failed("%s: cannot write%s%s: %s%s", shown, sp, what, reason,
                      tail);
}

int cli_write_file(const char *path, const void *data, size_t len) {
  msnap_atomic_file_t f;
  int rc = msnap__atomic_open(&f, path);
  if (rc != 0) {
    cli_write_failed(path, "", rc, msnap_last_error());
    return -1;
  }
  msnap_sink_t sink;
  rc = msnap__sink_init_fd(&sink, f.fd);
  if (rc == 0) {
    msnap__sink_write(&sink, data, len);
    rc = msnap__sink_finish(&sink);
  }
  if (rc != 0) {
    int e = msnap_last_errno();
    msnap__atomic_abort(&f);
    cli_write_failed(path, "", rc, e ? strerror(e) : msnap_strerror(rc));
    return -1;
  }
  rc = msnap__atomic_commit(&f);
  if (rc != 0) {
    cli_write_failed(path, "", rc, msnap_last_error());
    return -1;
  }
  return 0;
}

/*
 * Where OUT leads, resolved as the final write will (msnap_check_output:
 * base/outpath.c's link rule, a name ending in '/', every directory on the
 * way): refused with the writer's own reason, and a new or regular file
 * also when its directory is not writable (the write creates a temporary
 * there), so that a long command (replay) fails before its work, not
 * after.  What only the write can tell (a full disk) is still reported by
 * it.
 */
static int check_output_dir(const char *cmd, const char *out) {
  if (msnap_check_output(out) != 0) {
    const char *e = msnap_last_error();
    fprintf(stderr, "memsnap %s: ", cmd);
    cli_put_utf8(stderr, e, strlen(e));
    fputc('\n', stderr);
    return CLI_UNUSABLE;
  }
  return CLI_OK;
}

/*
 * Refuse an output path that is empty, a directory, or the same file as
 * one of the ninputs inputs (same st_dev/st_ino: the output would clobber
 * what is being read).  Prints "memsnap CMD: <reason>" and returns
 * CLI_UNUSABLE, else CLI_OK.
 */
int cli_check_output(const char *cmd, const char *out, char **inputs,
                     int ninputs) {
  if (!out[0]) {
    fprintf(stderr, "memsnap %s: output path is empty\n", cmd);
    return CLI_UNUSABLE;
  }
  struct stat so;
  if (stat(out, &so) != 0)
    return check_output_dir(cmd, out); /* does not exist (yet) */
  if (S_ISDIR(so.st_mode)) {
    fprintf(stderr, "memsnap %s: '%s' is a directory\n", cmd, cli_shown(out));
    return CLI_UNUSABLE;
  }
  for (int i = 0; i < ninputs; i++) {
    struct stat si;
    if (stat(inputs[i], &si) == 0 && si.st_dev == so.st_dev &&
        si.st_ino == so.st_ino && S_ISREG(so.st_mode)) {
      fprintf(stderr,
              "memsnap %s: output '%s' is the input file '%s'; refusing to "
              "overwrite it\n", cmd, cli_shown(out), cli_shown(inputs[i]));
      return CLI_UNUSABLE;
    }
  }
  return check_output_dir(cmd, out);
}

char cli_stdout_kept[32];
const char *cli_stdout_given;

const char *cli_output_shown(const char *out) {
  return cli_stdout_kept[0] != '\0' && out != NULL &&
                 strcmp(out, cli_stdout_kept) == 0
             ? "standard output"
             : cli_shown(out);
}

const char *cli_output_named(const char *out) {
  return cli_stdout_kept[0] != '\0' && cli_stdout_given != NULL &&
                 out != NULL && strcmp(out, cli_stdout_kept) == 0
             ? cli_stdout_given
             : out;
}

/* ---- {key, index} pairs (cli.h) ------------------------------------------ */

static int cmp_key_ix(const void *a, const void *b) {
  const cli_key_ix_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->ix < y->ix ? -1 : x->ix > y->ix;
}

void cli_sort_key_ix(cli_key_ix_t *v, uint32_t n) {
  qsort(v, n, sizeof *v, cmp_key_ix);
}
