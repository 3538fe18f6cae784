/*
 * cli.h -- what the `memsnap` command files share: exit codes, JSON
 * output, loading a snapshot with a clear message, progress on stderr,
 * small model helpers (block addresses, stacks, allocation sites) and the
 * backward replay of a device trace that `check` and `replay` both use.
 *
 * Exit codes (every command): 0 = ok, 1 = a finding (violations, leak
 * candidates, replay mismatch), 2 = unusable input or usage error.
 *
 * Ownership: every cli_* function that returns allocated memory says so;
 * the snapshot model (msnap_snap_t) is owned by the command that loaded it
 * and freed with msnap__snap_free().
 */
#ifndef MSNAP_CLI_H
#define MSNAP_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "base/json.h"
#include "base/sink.h"
#include "memsnap.h"
#include "model/snapshot.h"

enum { CLI_OK = 0, CLI_FINDING = 1, CLI_UNUSABLE = 2 };

/* ---- memsnap.c: commands ------------------------------------------------ */
int cli_cmd_check(int argc, char **argv);
int cli_cmd_summary(int argc, char **argv);
int cli_cmd_diff(int argc, char **argv);
int cli_cmd_replay(int argc, char **argv);
int cli_cmd_view(int argc, char **argv);
int cli_cmd_plot(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);
int cli_cmd_demo_train(int argc, char **argv);
int cli_cmd_leaks(int argc, char **argv);
int cli_cmd_fleet(int argc, char **argv);

/* Print "memsnap: <message>\n" on stderr (printf format), as valid UTF-8
 * (a file name is any bytes: base/utf8.c's repair). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A path as the text reports show it: itself when it is valid UTF-8,
 * else a repaired copy (one U+FFFD per ill-formed part, as --json shows
 * it) that lives until 8 more repaired names were asked for on this
 * thread.  Never NULL ("?" when out of memory). */
const char *cli_shown(const char *path);
/* s[0..len) to f as valid UTF-8 (the same repair). */
void cli_put_utf8(FILE *f, const char *s, size_t len);
/* "memsnap CMD: unknown option, see memsnap CMD --help"; returns 2. */
int cli_usage_error(const char *cmd, const char *what);

/* ---- the shared command prologue (cli_args.c) ----------------------------- */
typedef enum {
  CLI_OPT_FLAG,
  CLI_OPT_STRING,
  CLI_OPT_LONG,
  CLI_OPT_DOUBLE
} cli_optkind_t;
/* One option: --name (and -letter when letter != 0); dest is a bool *
 * (FLAG), a const char ** (STRING), a long * (LONG, accepted in
 * [lo, hi]) or a double * (DOUBLE, accepted in [dlo, dhi]); a number out
 * of range gives the usage error `what`. */
typedef struct cli_opt_s {
  const char *name;
  char letter;
  cli_optkind_t kind;
  void *dest;
  long lo, hi;
  const char *what;
  double dlo, dhi;
} cli_opt_t;
#define CLI_FLAG(name, letter, dest)                                        \
  { name, letter, CLI_OPT_FLAG, dest, 0, 0, NULL, 0, 0 }
#define CLI_STRING(name, letter, dest)                                      \
  { name, letter, CLI_OPT_STRING, dest, 0, 0, NULL, 0, 0 }
#define CLI_LONG(name, letter, dest, lo, hi, what)                          \
  { name, letter, CLI_OPT_LONG, dest, lo, hi, what, 0, 0 }
#define CLI_DOUBLE(name, letter, dest, lo, hi, what)                        \
  { name, letter, CLI_OPT_DOUBLE, dest, 0, 0, what, lo, hi }
#define CLI_OPT_END { NULL, 0, CLI_OPT_FLAG, NULL, 0, 0, NULL, 0, 0 }
#define CLI_MAX_OPTS 16
/* A command: its own options (ended by CLI_OPT_END; NULL for none), the
 * number of FILE arguments (-1: one or more) and the message when it is
 * wrong, where --json goes (NULL: no --json), where -o/--output goes
 * (NULL: no -o) and the message when -o is missing (NULL: optional).
 * -h/--help is always there. */
typedef struct cli_cmd_s {
  const char *name;
  void (*usage)(FILE *f);
  const cli_opt_t *opts;
  int nfiles;
  const char *files_msg;
  bool *json;
  const char **output;
  const char *output_msg;
  bool skip_stacks; /* cli_begin's load: the command uses no stacks */
} cli_cmd_t;
/* cli_begin's "go on" (any other value is the exit code to return). */
enum { CLI_CONTINUE = -1, CLI_DONE = CLI_OK };
/* The name to print for an output path: "standard output" for the
 * descriptor cli_begin writes "-o -" / "-o /dev/stdout" to, else `out` as
 * cli_shown shows it. */
const char *cli_output_shown(const char *out);
/* The name to report for an output path in --json: the -o argument as
 * given ("-", "/dev/stdout" ...) for that descriptor, else `out`. */
const char *cli_output_named(const char *out);
/* "/dev/fd/N", the duplicate of the original standard output that such an
 * output is written to ("" when none; set by cli_begin), and the -o
 * argument it was given as. */
extern char cli_stdout_kept[32];
extern const char *cli_stdout_given;

/* Parse argv for command c: options, FILE count, -o (checked against the
 * inputs).  *first is the index of the first FILE; with load != NULL the
 * first FILE is loaded into *load (the caller frees it); when it cannot
 * be, with --json, the unusable document (cli_json_unusable) is printed. */
int cli_begin(const cli_cmd_t *c, int argc, char **argv, int *first,
              msnap_snap_t **load);

/* One file under several names.  cli_file_id identifies a FILE argument
 * by device and inode: stat of the name, fstat of standard input for "-";
 * false when it cannot (a missing file: compare the names then).  Two
 * names of one pipe, FIFO or device (cli_file_id_stream) are a usage
 * error of every command but fleet, which reads such an input once with
 * a warning (cmd_fleet.c); a regular file may be named twice. */
typedef struct cli_file_id_s {
  dev_t dev;
  ino_t ino;
  mode_t mode;
} cli_file_id_t;
bool cli_file_id(const char *file, cli_file_id_t *id);
static inline bool cli_file_id_same(const cli_file_id_t *a,
                                    const cli_file_id_t *b) {
  return a->dev == b->dev && a->ino == b->ino;
}
/* Not a regular file nor a directory: its bytes can be read only once. */
bool cli_file_id_stream(const cli_file_id_t *id);
/* The names of v[0..n) that name a file named before them: the same
 * device and inode (cli_file_id: a repeated argument, a link, '-' and
 * /dev/stdin), or the same string for names it cannot identify (a missing
 * file named twice).  Returns how many (0 also when out of memory).
 * first_of (n entries, or NULL): first_of[i] = the lowest index naming
 * the file of v[i] (i itself for a first name).  dup (dup_size bytes, or
 * 0) says the first repeat: "NAME is FIRST", or "NAME given again"; ""
 * when there is none.  fleet reads a repeated file once, leaks takes each
 * name as a step; both warn. */
uint32_t cli_file_repeats(char *const *v, uint32_t n, uint32_t *first_of,
                          char *dup, size_t dup_size);

/* Load a snapshot file of any generation.  On failure prints
 * "memsnap: PATH: <reason>" and returns CLI_UNUSABLE; *out untouched. */
int cli_load(const char *path, msnap_snap_t **out);
/* cli_load; skip_stacks: every stack reads as empty (msnap_read_stats_t),
 * for a command that uses none (replay without -o). */
int cli_load_ex(const char *path, msnap_snap_t **out, bool skip_stacks);
/* The reason of the last failed cli_load (without the path), for JSON. */
const char *cli_load_error(void);
/* The --json document of a command whose input is unusable, on stdout:
 * {"file": FILE, "usable": false, "error": ERROR} (docs/cli.md, Outputs).
 * file NULL is written as null; error NULL is cli_load_error(), the reason
 * of the failed cli_load of FILE.  The stderr line is the caller's (cli_load
 * printed it).  cli_begin prints it when it loads the file. */
void cli_json_unusable(const char *file, const char *error);

/* ---- JSON output (base/json.c; cli_json.c) -------------------------------- */
/* --json output is the library's one JSON writer (base/json.h) over a
 * stdio sink: pretty (2-space indentation) for the commands, compact with
 * <, > and & escaped for the viewer's embedded data.  Values written after
 * cj_key() belong to that key; commas are placed automatically. */
typedef struct cli_json_s {
  msnap_json_t w;
  msnap_sink_t sink;
  FILE *f;
} cli_json_t;

/* Pretty JSON to f. */
void cj_init(cli_json_t *j, FILE *f);
/* Compact JSON to f for an HTML <script> element. */
void cj_init_html(cli_json_t *j, FILE *f);
/* Finish the document with a newline and flush. */
void cj_end(cli_json_t *j);
static inline void cj_obj(cli_json_t *j) { msnap__json_obj(&j->w); }
static inline void cj_obj_end(cli_json_t *j) { msnap__json_obj_end(&j->w); }
static inline void cj_arr(cli_json_t *j) { msnap__json_arr(&j->w); }
static inline void cj_arr_end(cli_json_t *j) { msnap__json_arr_end(&j->w); }
static inline void cj_key(cli_json_t *j, const char *key) {
  msnap__json_ckey(&j->w, key);
}
static inline void cj_str(cli_json_t *j, const char *s, size_t len) {
  msnap__json_str(&j->w, s, len);
}
static inline void cj_cstr(cli_json_t *j, const char *s) {
  msnap__json_cstr(&j->w, s);
}
static inline void cj_u64(cli_json_t *j, uint64_t v) {
  msnap__json_u64(&j->w, v);
}
static inline void cj_i64(cli_json_t *j, int64_t v) {
  msnap__json_i64(&j->w, v);
}
static inline void cj_dbl(cli_json_t *j, double v) {
  msnap__json_dbl(&j->w, v);
}
static inline void cj_bool(cli_json_t *j, bool v) {
  msnap__json_bool(&j->w, v);
}
static inline void cj_null(cli_json_t *j) { msnap__json_null(&j->w); }
/* A figure that is not always known: v when `known`, else null. */
static inline void cj_u64_or_null(cli_json_t *j, bool known, uint64_t v) {
  if (known)
    msnap__json_u64(&j->w, v);
  else
    msnap__json_null(&j->w);
}
/* Number fields of the open object, in order. */
typedef struct cli_u64_field_s {
  const char *key;
  uint64_t v;
} cli_u64_field_t;
void cj_u64_fields(cli_json_t *j, const cli_u64_field_t *f, size_t n);
/* The --json keys of a command's -o: "output" is `written` (the path of
 * the file written; NULL: none was) and "output_error" null, or, after
 * cli_output_failed, "output" null and "output_error" the message that
 * went to stderr: a script never takes an unwritten file for written. */
void cj_output(cli_json_t *j, const char *written);
/* A generic model value (allocator_settings) as JSON; nesting deeper than
 * CJ_MAX_DEPTH - 2 is written as null. */
#define CJ_MAX_DEPTH 64
void cj_gv(cli_json_t *j, const msnap_snap_t *s, const msnap_gv_t *v);

/* allocator_settings as compact "key=value" items ("max_split_size=-1",
 * "roundup_power2_divisions={64:4}"; all-zero integer dicts left out;
 * each cut after 512 characters with "... (N bytes)" / "(N items)"):
 * *n malloc'd strings in a malloc'd array, NULL if none or on ENOMEM. */
char **cli_settings_items(const msnap_snap_t *s, const msnap_gv_t *d,
                          uint32_t *n);
/* The items a person is shown (summary's text, view's panel): those of
 * cli_settings_items but, on an npu recording, the CUDA-only keys at
 * their defaults and a PYTORCH_CUDA_ALLOC_CONF repeating
 * PYTORCH_NPU_ALLOC_CONF, which say nothing there. */
char **cli_settings_shown(const msnap_snap_t *s, const msnap_gv_t *d,
                          uint32_t *n);

/* ---- progress on stderr (cli_util.c) ------------------------------------ */
typedef struct cli_progress_s {
  struct timespec start;
  bool tty, shown;
  double last; /* seconds since start of the last line printed */
  const char *label;
} cli_progress_t;
/* Progress is shown only when stderr is a terminal and the work has run
 * for more than a second. */
void cli_progress_init(cli_progress_t *p, const char *label);
void cli_progress_tick(cli_progress_t *p, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress_t *p);

/* ---- model helpers (cli_util.c) ----------------------------------------- */
/* A string of the model, "" when absent; *len may be NULL. */
const char *cli_str(const msnap_snap_t *s, msnap_str_t id, size_t *len);
/* Frames of a stack: *n frames ids innermost first; NULL/0 for none.
 * The ids are decoded into a buffer of the calling thread, valid until
 * its next cli_stack call. */
const uint32_t *cli_stack(const msnap_snap_t *s, msnap_stack_t st,
                          uint32_t *n);
/* The stack to show for a block: its `frames`, or (2.0) the frames of its
 * first history element. */
msnap_stack_t cli_block_stack(const msnap_snap_t *s, const msnap_sblock_t *b);
/* Address of block i of segment seg: the recorded address when the block
 * has one, else segment address + sizes of the preceding blocks. */
uint64_t cli_block_addr(const msnap_snap_t *s, const msnap_ssegment_t *seg,
                        uint32_t i);
/* A walk over the blocks of the segments of s, in order, each with its
 * address (the rule of cli_block_addr, kept as a running sum):
 *   for (cli_bwalk_t it = cli_bwalk(s, dev); cli_bwalk_next(&it);)
 *     ... it.g (the segment), it.b (the block), it.addr ...
 * cli_bwalk(s, dev) visits the segments of device dev, cli_bwalk_all(s)
 * every segment. */
typedef struct cli_bwalk_s {
  const msnap_snap_t *s;
  int64_t dev;
  bool all;                  /* every device (dev unused)              */
  uint32_t seg, k;           /* the next block: block k of segment seg */
  uint64_t run;              /* the address after the previous block   */
  const msnap_ssegment_t *g; /* the current block's segment            */
  const msnap_sblock_t *b;   /* the current block                      */
  uint64_t addr;             /* its address                            */
} cli_bwalk_t;
static inline cli_bwalk_t cli_bwalk(const msnap_snap_t *s, int64_t dev) {
  return (cli_bwalk_t){.s = s, .dev = dev};
}
static inline cli_bwalk_t cli_bwalk_all(const msnap_snap_t *s) {
  return (cli_bwalk_t){.s = s, .all = true};
}
static inline bool cli_bwalk_next(cli_bwalk_t *w) {
  for (; w->seg < w->s->nsegments; w->seg++, w->k = 0) {
    const msnap_ssegment_t *g = &w->s->segments[w->seg];
    if (!w->all && g->device != w->dev)
      continue;
    if (w->k == 0)
      w->run = g->address;
    if (w->k < g->nblocks) {
      const msnap_sblock_t *b = &w->s->blocks[g->first_block + w->k++];
      w->g = g;
      w->b = b;
      w->addr = (b->keys & MSNAP_K_ADDRESS) ? b->address : w->run;
      w->run += b->size;
      return true;
    }
  }
  return false;
}
/* Index of the first of n sorted elements (stride bytes each) whose
 * 64-bit key at byte offset `off` is >= key (signed or unsigned).  Inline
 * and branch-free (the walks call it once per trace entry). */
static inline uint32_t cli_lower_bound(const void *base, uint32_t n,
                                       size_t stride, size_t off,
                                       uint64_t key, bool is_signed) {
  /* signed keys compare as unsigned once the sign bit is flipped */
  uint64_t flip = is_signed ? 1ull << 63 : 0;
  const char *b = (const char *)base + off;
  uint64_t k;
  if (n == 0) return 0;
  key ^= flip;
  /* the answer lies in [first, first + len]; each step halves len with
   * a mask, not a branch (a branch on random keys mispredicts half the
   * time) */
  uint32_t first = 0, len = n;
  while (len > 1) {
    uint32_t half = len / 2;
    memcpy(&k, b + (size_t)(first + half) * stride, sizeof k);
    first += half & (0u - (uint32_t)((k ^ flip) < key));
    len -= half;
  }
  memcpy(&k, b + (size_t)first * stride, sizeof k);
  return first + ((k ^ flip) < key);
}

/* True for the states that count as "active" (allocated or pending). */
static inline bool cli_block_active(const msnap_sblock_t *b) {
  return b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED ||
         b->state == MSNAP_BLOCK_ACTIVE_PENDING_FREE;
}
/* Name of an action of a trace entry ("alloc", or the kept string). */
const char *cli_action_name(const msnap_snap_t *s, const msnap_strace_t *e);
const char *cli_state_name(const msnap_snap_t *s, const msnap_sblock_t *b);

/* Allocation site of a stack: `frame`, the innermost "user" frame, and
 * `via`, the innermost frame of an installed package called from it.
 * Heuristic: skip frames whose file is not a Python source (C/C++ frames,
 * "??", shared objects, "<frozen ...>"), frames inside torch/ (any path
 * component "torch", "torch_npu" or "memsnap") and frames of the Python
 * standard library (a path under lib/python3.x that is not in
 * site-packages); the first frame left that is not in an installed
 * package (site-packages, dist-packages) is the site, and the innermost
 * installed-package frame inside it (e.g. einops, transformers' modeling
 * code) its `via`.  Code typed with no file of its own is the user's
 * too: "<stdin>" (`python -`), "<python-input-N>" (the REPL of 3.13),
 * "<ipython-input-N-HASH>" (IPython).  "<string>" (`python -c`, exec of a
 * string, but also code that dataclasses or namedtuple generate) is the
 * site only when no other user frame is on the stack: the innermost
 * such frame, with its via.  When every frame is skipped, the innermost
 * installed-package frame, else the innermost Python frame, else (native
 * frames only: an autograd engine thread) the innermost autograd node
 * ("...MmBackward0::apply(...)"), else the innermost native frame that
 * is not the unwinder or the allocator, is the site (via =
 * CLI_SITE_NONE).  frame is CLI_SITE_NONE when the stack is empty. */
typedef struct cli_site_s {
  uint32_t frame, via;
} cli_site_t;
cli_site_t cli_site(const msnap_snap_t *s, msnap_stack_t st);
/* True when frame is one of the user's own Python code: what cli_site
 * prefers (not torch's, memsnap's, the standard library's or an installed
 * package's, not a native frame; typed code and "<string>" are). */
bool cli_frame_is_user(const msnap_snap_t *s, uint32_t frame);
/* The site of a trace entry recorded with an empty stack: neither
 * PyTorch's nor memsnap's files say which stacks were asked for
 * (_record_memory_history's `stacks`), so the frames tell: when the file
 * holds Python frames and no native frame, Python stacks alone were
 * recorded, and an empty one was gathered on a thread that ran no Python
 * code (autograd's device threads run backward()):
 * CLI_SITE_NO_PYTHON; else CLI_SITE_NONE (no stack was recorded, or a
 * C++ stack was expected and is missing).  One pass over the frames. */
uint32_t cli_empty_site(const msnap_snap_t *s);
static inline bool cli_site_eq(cli_site_t a, cli_site_t b) {
  return a.frame == b.frame && a.via == b.via;
}
/* Format a site as "file:line:name" (file shortened to its last two path
 * components, '/' or backslash separated; a native frame (line 0, not a
 * .py file) is its C++ name without the final parameter list),
 * followed by " (via file:line:name)" when it has a via; the pseudo sites
 * as CLI_SITE_NONE_TEXT / CLI_SITE_BEFORE_TEXT.  Control characters come
 * out as '?'. */
void cli_site_format(const msnap_snap_t *s, cli_site_t site, char *buf,
                     size_t len);
/* The most bytes of one frame's name or filename that the CLI shows
 * (cli_site_format, the viewer's frames table): a longer one is cut at a
 * UTF-8 boundary and marked with CLI_ELLIPSIS. */
#define CLI_TEXT_CAP 4096
/* The most bytes of a file's path that a site's text shows: the tail of
 * its last two components, after CLI_ELLIPSIS when cut. */
#define CLI_FILE_CAP 200
#define CLI_ELLIPSIS "\xe2\x80\xa6" /* U+2026 */
/* p[0..n) cut to CLI_TEXT_CAP bytes at a UTF-8 boundary with
 * CLI_ELLIPSIS: its head (then the ellipsis), or with `tail` its tail
 * (after the ellipsis); into out (CLI_TEXT_CAP + 3 bytes), the length
 * returned.  Text of CLI_TEXT_CAP bytes or less is copied as it is. */
size_t cli_text_cap(const char *p, size_t n, bool tail, char *out);
/* Replace control characters of a NUL-terminated string by '?' in place
 * (text from a file must not drive the terminal). */
void cli_sanitize(char *buf);

/* Devices that appear in the snapshot: every segment device and every
 * index of a non-empty device trace, sorted; *n set; caller frees. */
int64_t *cli_devices(const msnap_snap_t *s, uint32_t *n);
/* Trace of a device, NULL when absent. */
const msnap_trace_list_t *cli_trace(const msnap_snap_t *s, int64_t device);

/* Value of `key` in a generic dict (allocator_settings, process_info),
 * NULL when absent; typed variants. */
const msnap_gv_t *cli_gv_get(const msnap_snap_t *s, const msnap_gv_t *d,
                             const char *key);
const char *cli_gv_str(const msnap_snap_t *s, const msnap_gv_t *d,
                       const char *key);
bool cli_gv_int(const msnap_snap_t *s, const msnap_gv_t *d, const char *key,
                int64_t *out);
/* "npu" or "cuda": the profile the recording was made with
 * (process_info's, else npu when allocator_settings name
 * PYTORCH_NPU_ALLOC_CONF or hold a non-empty workspace_segments list
 * (memsnap's npu files), or a trace holds a workspace_snapshot entry
 * (only torch_npu's NPUWorkspaceAllocator writes that action), else
 * cuda). */
const char *cli_recording_profile(const msnap_snap_t *s);
/* The same, and in *why (static text, when why is not NULL) what told it:
 * "named in process_info", "it has no NPU-only field",
 * ... */
const char *cli_recording_profile_why(const msnap_snap_t *s,
                                      const char **why);
/* True when the recording left out actions the alloc history needs
 * (allocator_settings' trace_skip_actions, memsnap's files: alloc, frees,
 * segment allocations, frees, maps or unmaps): the trace has holes, so
 * the backward replay's rules and a replay do not apply.  why (may be
 * NULL): "'free_requested' entries (allocator_settings ...)". */
bool cli_skipped_history(const msnap_snap_t *s, char *why, size_t n);
/* A count of device dev as recorded in process_info's devices (memsnap's
 * files): key "total_bytes" (the device's memory), "allowed_bytes" (the
 * per-process cap of a memory fraction at the dump), "last_oom_time_us"
 * and "last_oom_allowed_bytes" (the newest OOM and the cap then); false
 * when the file does not say. */
bool cli_device_info(const msnap_snap_t *s, int64_t dev, const char *key,
                     uint64_t *out);

/* "2.1", "2.6", "segment list"... */
const char *cli_generation_name(msnap_generation_t g);

/* The device with the longest trace, else the first segment's, else 0. */
int64_t cli_default_device(const msnap_snap_t *s);
/* Write a whole file atomically (temporary file + rename); prints the
 * reason and returns -1 on failure. */
int cli_write_file(const char *path, const void *data, size_t len);
/* An output that could not be written: prints "memsnap: MSG" on stderr
 * and keeps MSG for the --json report (cli_output_error; "" until one
 * failed).  cli_write_file, replay -o and demo-train report through it. */
void cli_output_failed(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* The one wording of a write that failed (every -o, and standard output
 * at exit): cli_output_failed with "OUT: cannot write[ WHAT]: REASON
 * [MSNAP_CODE]", as read errors carry their code (cli_load).  OUT is shown
 * as cli_output_shown shows it; NULL is standard output.  REASON is the
 * library's message (base/outpath.c, base/sink.c) less its own opening
 * ("cannot write 'OUT': ", "writing 'OUT' failed: ", "write failed: "),
 * so that "cannot write" and OUT come once; a REASON that still names
 * 'OUT' is given without the "OUT: " in front.  code 0: no [CODE]. */
void cli_write_failed(const char *out, const char *what, int code,
                      const char *reason);
const char *cli_output_error(void);
/* Refuse an empty output path, a directory, an output that is one of
 * the inputs (same device and inode), or one the write would refuse
 * (resolved by base/outpath.c: a missing or unwritable directory, a name
 * ending in '/', a refused link); prints why, returns CLI_UNUSABLE.
 * cli_begin runs it for every command's -o before any work. */
int cli_check_output(const char *cmd, const char *out, char **inputs,
                     int ninputs);

/* The noun for a count: `one` when n is 1, else `many` ("1 block",
 * "2 blocks", "0 entries"): printf("%u %s", n, cli_plural(n, "block",
 * "blocks")). */
const char *cli_plural(uint64_t n, const char *one, const char *many);
/* Human-readable bytes ("1.5 GiB") into buf. */
const char *cli_bytes(uint64_t v, char *buf, size_t len);
/* Two sizes as cli_bytes, each followed by ", N B" when the two read
 * alike ("4.00 MiB" both): a sentence comparing them must not read as if
 * they were equal. */
void cli_bytes_apart(uint64_t x, char *bx, size_t nx, uint64_t y, char *by,
                     size_t ny);
/* A duration in microseconds as "17 us", "366 ms", "1.25 s", "3 min 5 s". */
const char *cli_duration(int64_t us, char *buf, size_t len);
/* An axis label: bytes in the largest binary unit, without trailing
 * zeros ("1.5 GiB", "512 MiB", "0 B"). */
const char *cli_bytes_tick(uint64_t v, char *buf, size_t len);
/* A "nice" tick step for an axis from 0 to max: 1, 2 or 5 times a power
 * of ten (bytes: of a binary unit, so ticks fall on 256 MiB, 1 GiB...),
 * giving at most `most` intervals.  Never 0. */
uint64_t cli_nice_step(uint64_t max, bool bytes, unsigned most);
/* Index of the first entry of tl at or after time t (tl->n when none):
 * where a record_function annotation of that time goes on a timeline. */
uint32_t cli_entry_at_time(const msnap_trace_list_t *tl, int64_t t);
/* The latest time_us of the file's trace entries, over every device, in
 * *t: false when no entry has one (2.0 / 2.1 files). */
bool cli_last_time(const msnap_snap_t *s, int64_t *t);

/* ---- stacks of live blocks (cli_stacks.c) -------------------------------- */
/* Where the stack shown for a live block comes from (see cli_stacks.c). */
typedef enum cli_stack_src_e {
  CLI_SRC_NONE = 0,     /* no stack anywhere in the file                  */
  CLI_SRC_BLOCK,        /* the block's own `frames`                       */
  CLI_SRC_HISTORY,      /* 2.0: the first element of its `history`        */
  CLI_SRC_TRACE,        /* the latest alloc entry at its address, live    */
  CLI_SRC_BEFORE_TRACE  /* allocated before the first trace entry         */
} cli_stack_src_t;

/* Pseudo sites (cli_site returns frame CLI_SITE_NONE for an empty stack). */
#define CLI_SITE_NONE UINT32_MAX
#define CLI_SITE_BEFORE_TRACE (UINT32_MAX - 1)
#define CLI_SITE_NONE_TEXT "<no stack>"
#define CLI_SITE_BEFORE_TEXT "<no stack: allocated before the trace>"
/* An empty stack of a trace entry in a recording of Python stacks only
 * (cli_empty_site): the thread ran no Python code. */
#define CLI_SITE_NO_PYTHON (UINT32_MAX - 2)
#define CLI_SITE_NO_PYTHON_TEXT                                               \
  "<no Python frames: allocated on a thread running no Python code, such "   \
  "as autograd's backward thread>"

typedef struct cli_stacks_dev_s {
  uint64_t *addr;  /* addresses of live alloc entries, increasing */
  uint32_t *entry; /* their index in the device trace            */
  uint32_t n;
  bool has_trace;
} cli_stacks_dev_t;

typedef struct cli_stacks_s {
  const msnap_snap_t *s;
  cli_stacks_dev_t *dev; /* indexed by device (= device_traces index) */
  uint32_t ndev;
  uint32_t empty_site;   /* cli_empty_site(s)                          */
} cli_stacks_t;

/* Index the live alloc entries of every device trace of s (which must
 * outlive x).  0, or -1 on ENOMEM (x then needs no free). */
int cli_stacks_init(cli_stacks_t *x, const msnap_snap_t *s);
void cli_stacks_free(cli_stacks_t *x);
/* The invariants of x (tests and debug checks). */
bool cli_stacks_check(const cli_stacks_t *x);
/* Index in the trace of `dev` of the alloc entry at addr that is still
 * live at the end of the trace, or -1.  Only addresses of the device's
 * active blocks (final segments) are indexed: -1 for any other. */
long cli_stacks_live_entry(const cli_stacks_t *x, int64_t dev,
                           uint64_t addr);
/* The stack to show for block b at addr of device dev; *src (may be NULL)
 * says where it comes from.  MSNAP_STACK_ABSENT when there is none. */
msnap_stack_t cli_stacks_block(const cli_stacks_t *x, int64_t dev,
                               uint64_t addr, const msnap_sblock_t *b,
                               cli_stack_src_t *src);
/* The allocation site of that block (frame CLI_SITE_BEFORE_TRACE when it
 * predates the trace; format with cli_site_format). */
cli_site_t cli_stacks_site(const cli_stacks_t *x, int64_t dev, uint64_t addr,
                         const msnap_sblock_t *b);
/* True for the text of a pseudo site ("<...>"). */
static inline bool cli_site_is_pseudo(const char *site) {
  return site[0] == '<';
}
/* True for the text of a site that may be a leak candidate (`leaks`,
 * `view`, `fleet`): every real site, and CLI_SITE_NO_PYTHON_TEXT -- a real
 * group of allocations, those the recording attributes to a thread that
 * ran no Python code (autograd's backward thread).  Never "<no stack>"
 * (history recorded no stack: unrelated allocations lumped together) nor
 * the before-trace site (its blocks can only be freed). */
static inline bool cli_site_leak_candidate(const char *site) {
  return !cli_site_is_pseudo(site) ||
         strcmp(site, CLI_SITE_NO_PYTHON_TEXT) == 0;
}

/* ---- backward replay (cli_back.c) ---------------------------------------- */
/* Walking a device trace from its newest entry to its oldest, undoing each
 * entry on the final state (what MemoryViz's State History does), checks
 * every rule that does not need the part of the history the ring buffer
 * may have dropped, and leaves the state at the start of the trace.
 *
 * A live block: known size when it comes from the final state; a block
 * re-created by undoing a free_completed only knows its requested size
 * (size == 0). */
typedef struct cli_lblock_s {
  uint64_t addr, size, requested;
  int64_t stream;
  bool from_final;  /* present in the final segments                  */
  bool pending;     /* active_pending_free / between free_requested and */
                    /* free_completed                                  */
  bool has_requested;
} cli_lblock_t;

typedef struct cli_lseg_s {
  uint64_t addr, size;
  int64_t stream;
  bool from_final;
  bool is_large, is_expandable;
} cli_lseg_t;

typedef struct cli_state_s {
  cli_lblock_t *b;
  uint32_t nb, capb;
  cli_lseg_t *g;
  uint32_t ng, capg;
} cli_state_t;

/* Violation callback: entry index in the device trace (or UINT32_MAX for
 * the final state), message. */
typedef void (*cli_violation_cb)(void *arg, uint32_t entry, const char *msg);

/* Build the final state of `device` from the segments, then undo the trace
 * backwards.  Returns the number of violations; *start (if not NULL)
 * receives the state at the start of the trace (free with
 * cli_state_free).  -1 on ENOMEM. */
long cli_backward(const msnap_snap_t *s, int64_t device, cli_violation_cb cb,
                  void *arg, cli_state_t *start);
void cli_state_free(cli_state_t *st);
/* Entry i of tl is one of torch_npu's synthetic workspace entries (the
 * segment_alloc or alloc right after a workspace_snapshot of its address):
 * no history, skipped by the backward replay, the timeline and the
 * summary's peaks. */
static inline bool cli_workspace_synthetic(const msnap_trace_list_t *tl,
                                           uint32_t i) {
  const msnap_strace_t *v = tl->v;
  uint64_t a = v[i].addr;
  if (v[i].action == MSNAP_ACTION_SEGMENT_ALLOC)
    return i >= 1 && v[i - 1].action == MSNAP_ACTION_WORKSPACE_SNAPSHOT &&
           v[i - 1].addr == a;
  if (v[i].action == MSNAP_ACTION_ALLOC)
    return i >= 2 && v[i - 1].action == MSNAP_ACTION_SEGMENT_ALLOC &&
           v[i - 1].addr == a &&
           v[i - 2].action == MSNAP_ACTION_WORKSPACE_SNAPSHOT &&
           v[i - 2].addr == a;
  return false;
}

/* The action changes blocks or segments: alloc, free_completed,
 * segment_alloc/free/map/unmap (free_requested, oom, snapshot and the
 * others change nothing). */
static inline bool cli_action_moves(uint32_t action) {
  switch (action) {
  case MSNAP_ACTION_ALLOC:
  case MSNAP_ACTION_FREE_COMPLETED:
  case MSNAP_ACTION_SEGMENT_ALLOC:
  case MSNAP_ACTION_SEGMENT_FREE:
  case MSNAP_ACTION_SEGMENT_MAP:
  case MSNAP_ACTION_SEGMENT_UNMAP:
    return true;
  default:
    return false;
  }
}

/* Some entry of tl allocates or frees memory (cli_action_moves) and is
 * not one of torch_npu's synthetic workspace entries: the trace has peaks
 * (summary's, fleet's).  A trace of snapshot, oom or free_requested
 * entries only does not. */
static inline bool cli_trace_moves(const msnap_trace_list_t *tl) {
  for (uint32_t i = 0; tl && i < tl->n; i++)
    if (cli_action_moves(tl->v[i].action) && !cli_workspace_synthetic(tl, i))
      return true;
  return false;
}
/* torch_npu's workspace buffers of a device: its final segments that a
 * workspace_snapshot entry names (NPUWorkspaceAllocator's get_trace writes
 * one per buffer, then the synthetic entries) and that have a buffer's
 * shape (one block, the entry's size), their addresses sorted into *out
 * (malloc'd; NULL when none).  They are left out of the backward replay's
 * state (their life is outside the trace), and out of `replay`.  -1 on
 * ENOMEM. */
int cli_workspace_addrs(const msnap_snap_t *s, int64_t device,
                        uint64_t **out, uint32_t *n);
bool cli_is_workspace(const uint64_t *ws, uint32_t n, uint64_t addr);
/* The final segments that overlap one another: with the segments sorted
 * by (device, address), each segment that starts below the end (address
 * + total_size, UINT64_MAX when that overflows) of the one before it on
 * the same device -- visit(arg, prev, next) with both indices into
 * s->segments, in that order; device INT64_MIN: every device, else that
 * one.  visit returns false to stop.  Returns how many were visited, -1
 * on ENOMEM.  (`check` reports each; `replay` refuses such a device.) */
typedef bool (*cli_overlap_fn)(void *arg, uint32_t prev, uint32_t next);
int cli_segment_overlaps(const msnap_snap_t *s, int64_t device,
                         cli_overlap_fn visit, void *arg);
uint64_t cli_segment_end(const msnap_ssegment_t *g);
/* Active (requested) and reserved bytes before the first entry and after
 * each entry of the device trace; *n = entries + 1; caller frees. */
int cli_timeline(const msnap_snap_t *s, int64_t dev, uint64_t **act,
                 uint64_t **res, uint32_t *n);
/* The same states one at a time, in order, without the arrays (a peak
 * needs no 16 bytes per entry): visit(arg, state, active, reserved) for
 * states 0 (before the first entry) to entries; returns entries + 1. */
typedef void (*cli_timeline_fn)(void *arg, uint32_t state, uint64_t act,
                                uint64_t res);
uint32_t cli_timeline_visit(const msnap_snap_t *s, int64_t dev,
                            cli_timeline_fn visit, void *arg);
int cli_state_final(const msnap_snap_t *s, int64_t device, cli_state_t *st);

/* ---- lifetimes and sites (cli_life.c) ------------------------------------ */
/* Events of a trace by address: (addr, entry index, alloc or free). */
typedef struct cli_ev_s {
  uint64_t addr;
  uint32_t idx;
  bool alloc;
} cli_ev_t;
/* Sort by (addr, idx), stably in linear time for events made in trace
 * order (a radix sort on addr; qsort when scratch memory is short). */
void cli_sort_ev(cli_ev_t *ev, uint32_t n);
/* A key and the index of what it is the key of (a segment by address, a
 * stack by site).  cli_sort_key_ix sorts by (key, ix): a total order when
 * the indices differ, whatever qsort does with equal elements. */
typedef struct cli_key_ix_s {
  uint64_t key;
  uint32_t ix;
} cli_key_ix_t;
void cli_sort_key_ix(cli_key_ix_t *v, uint32_t n);
#define CLI_NO_PAIR UINT32_MAX
/* pair[i] of every entry of tl (see cli_life.c): alloc -> its
 * free_completed, free_completed -> its alloc, CLI_NO_PAIR otherwise.
 * *out malloc'd (tl->n entries); 0, or -1 on ENOMEM. */
int cli_pair_entries(const msnap_trace_list_t *tl, uint32_t **out);

/* Site index of every stack of a model; equal sites share an index. */
#define CLI_SITEIX_NONE 0u   /* "<no stack>"                            */
#define CLI_SITEIX_BEFORE 1u /* "<no stack: allocated before the trace>" */
typedef struct cli_sites_s {
  uint32_t *of_stack; /* stack id -> site index                        */
  cli_site_t *site;   /* site index -> site                            */
  uint32_t n, nstacks;
} cli_sites_t;
int cli_sites_init(cli_sites_t *x, const msnap_snap_t *s);
void cli_sites_free(cli_sites_t *x);
bool cli_sites_check(const cli_sites_t *x);
static inline uint32_t cli_sites_of(const cli_sites_t *x, msnap_stack_t st) {
  return st < x->nstacks ? x->of_stack[st] : CLI_SITEIX_NONE;
}

/* out[k] (st->nb entries, zeroed by the caller) = the stack of block k of
 * the start state st of dev: the stack the resolver gives the same block
 * in the final state (its own frames) when it is the same allocation (no
 * live alloc entry at its address); left MSNAP_STACK_ABSENT otherwise. */
void cli_start_stacks(const msnap_snap_t *s, const cli_stacks_t *stk,
                      int64_t dev, const cli_state_t *st, msnap_stack_t *out);

/* Bytes and count of live allocations of one site. */
typedef struct cli_site_sum_s {
  cli_site_t site;
  uint64_t bytes, count;
} cli_site_sum_t;
/* Sort v[0..n) of distinct sites of s for a ranking: most bytes first;
 * equal bytes by the site's text (cli_site_format), then by more
 * allocations, then by frame and via: an order that does not depend on
 * the order of the file (which numbers the frames), nor on qsort's. */
void cli_site_sums_rank(const msnap_snap_t *s, cli_site_sum_t *v,
                        uint32_t n);
/* Allocations live at `state` (after entries 0..state-1) of dev's trace,
 * grouped by site, largest first: trace allocations by their requested
 * size and stack; blocks of the start state (cli_backward) by their
 * requested size and the stack the same block has at the end, else the
 * before-trace pseudo site.  *out malloc'd; 0, or -1 on ENOMEM. */
int cli_live_sites_at(const msnap_snap_t *s, const cli_stacks_t *stk,
                      const cli_sites_t *sites, int64_t dev,
                      const uint32_t *pair, uint32_t state,
                      cli_site_sum_t **out, uint32_t *nout);

/* ---- fragmentation (cli_frag.c) ------------------------------------------ */
/* Fragmentation of one device of a model (a file's final state, or the
 * snapshot of a replayed allocator), in PyTorch's terms. */
typedef struct cli_frag_s {
  uint64_t segments, reserved, allocated, active;
  /* inactive blocks of segments split into more than one block (PyTorch's
   * inactive_split_bytes) and their number */
  uint64_t inactive_split, inactive_split_blocks;
  /* segments without an active block (empty_cache would release them) */
  uint64_t free_segments, free_segments_bytes;
  /* the largest inactive block: of every pool, of the small pool
   * (segments of segment_type "small"), of the large pool */
  uint64_t largest_free, largest_free_small, largest_free_large;
  uint64_t inactive; /* every inactive block */
} cli_frag_t;
void cli_frag_model(const msnap_snap_t *s, int64_t dev, cli_frag_t *f);
/* The figures as JSON keys of the open object, or as one object. */
void cli_frag_json_fields(cli_json_t *j, const cli_frag_t *f);
void cli_frag_json(cli_json_t *j, const cli_frag_t *f);

/* ---- explanations (cli_explain.c) ---------------------------------------- */
typedef struct cli_oom_s {
  bool present;
  int64_t device, stream;
  uint32_t entry, count, state; /* the last oom entry, how many, its state */
  bool have_time;
  int64_t time_us;
  uint64_t requested, device_free; /* the entry's size and device_free  */
  bool have_total;
  uint64_t device_total;           /* process_info's                     */
  /* The per-process cap on reserved bytes (set_per_process_memory_fraction
   * or the conf's per_process_memory_fraction: allowed_memory_maximum) in
   * force at the OOM, when the file records it: process_info's
   * last_oom_time_us is the entry's time (memsnap's files), with
   * last_oom_allowed_bytes or without (no cap).  cap_known: the file says
   * which; have_allowed: there was a cap. */
  bool cap_known, have_allowed;
  uint64_t allowed;
  /* Otherwise a cap the file suggests but does not tie to the OOM (the
   * fraction can change at any time): process_info's allowed_bytes, at
   * the dump, else the recorded conf's per_process_memory_fraction
   * (hint_fraction; hint_bytes with the device total).  Reported, never
   * used for the verdict.  hint_source: NULL for none. */
  const char *hint_source;
  double hint_fraction;             /* 0: not a conf's                  */
  bool have_hint_bytes;
  uint64_t hint_bytes;
  bool hint_fits;  /* with hint_bytes: the request fits under that cap */
  /* What the device could still give the process: device_free, and
   * within the cap no more than allowed - reserved. */
  uint64_t avail;
  uint64_t cached;                 /* its cached free blocks at the OOM  */
  bool small_pool;                 /* requested <= 1 MiB                 */
  uint64_t reserved, active_requested; /* at the OOM, from the trace walk */
  bool have_at;                    /* `at` known (source says how)       */
  const char *source;
  char why[512];                   /* why `at` is unknown                */
  cli_frag_t at;
  bool fits_largest, fits_unfragmented;
  /* The segment the allocator asks the device for to serve the request
   * (get_allocation_size under the recording's conf); 0: unknown (the
   * recording uses expandable segments, which map in chunks). */
  uint64_t segment_size;
  int expandable;                  /* 1 fits, 0 not, -1 unknown          */
  char expandable_why[512];
  msnap_stack_t stack;             /* the failing allocation's stack     */
  cli_site_t site;
  cli_site_sum_t *top;             /* live at the OOM, by site           */
  uint32_t ntop;
} cli_oom_t;

typedef struct cli_explain_s {
  int64_t device;
  cli_frag_t final;
  bool have_peak_state, have_at_peak;
  uint32_t peak_state;
  const char *peak_source;
  char peak_why[512];
  long trace_violations; /* > 0: the trace is inconsistent with the final
                            state (cli_backward's count; 0 without a
                            trace) */
  cli_frag_t at_peak;
  cli_oom_t oom;
} cli_explain_t;
/* Fragmentation (final state, at the peak) and the last OOM of device
 * dev (see cli_explain.c); whatif runs the expandable-segments replay.
 * 0, or -1 on ENOMEM; free with cli_explain_free. */
int cli_explain_device(const msnap_snap_t *s, const cli_stacks_t *stk,
                       const cli_sites_t *sites, int64_t dev, uint32_t topn,
                       bool whatif, cli_explain_t *x);
void cli_explain_free(cli_explain_t *x);

/* ---- record_function ranges and steps (cli_steps.c) ---------------------- */
typedef struct cli_ranges_s {
  uint32_t *rg;          /* (name string, s0, s1) triples, by (s0, s1)  */
  uint32_t nrg, dropped; /* kept ranges; ranges beyond max_ranges        */
  uint32_t *steps;       /* (s0, s1) pairs of the step ranges            */
  uint32_t nsteps;
  char stepname[128];    /* the steps' name without trailing digits      */
  uint32_t nwant;        /* ranges named `want` (digits ignored)         */
  int64_t ann_device;    /* the device whose annotations these are: dev,
                            or (none of its own) -1, or another device  */
} cli_ranges_t;
/* The ranges of device dev and its steps (see cli_steps.c); want = a
 * step name or NULL (automatic).  0, or -1 on ENOMEM; free with
 * cli_ranges_free. */
int cli_ranges_find(const msnap_snap_t *s, int64_t dev, const char *want,
                    uint32_t max_ranges, cli_ranges_t *r);
void cli_ranges_free(cli_ranges_t *r);
bool cli_ranges_check(const cli_ranges_t *r, uint32_t n);

/* ---- leaks across steps (cmd_leaks.c) ------------------------------------- */
#define CLI_LEAK_MIN_CONFIDENCE 0.7 /* `leaks`, `fleet` and `view`       */
typedef struct cli_leak_s {
  char *site;            /* owned text                                 */
  cli_site_t key;        /* the site (one recording); frame
                            CLI_SITE_NONE in files mode (text only)    */
  uint64_t first, last;  /* live requested bytes at the first/last step */
  uint32_t grown, shrunk;
  uint32_t allocs;       /* the site's alloc entries in the trace (one
                            recording; 0 in files mode)                 */
  double confidence;
} cli_leak_t;
typedef struct cli_leaks_s {
  int64_t device;
  uint32_t steps;
  char stepname[128];
  char why[256];         /* why there are no steps ("" when there are) */
  int64_t ann_device;    /* the device whose record_function annotations
                            gave the steps (cli_ranges_t.ann_device)    */
  cli_leak_t *v;         /* candidates, by confidence then growth      */
  uint32_t n;
  bool out_of_order;     /* files given out of time order: no candidate */
} cli_leaks_t;
/* Leak candidates of device dev over the steps of one recording (see
 * cmd_leaks.c); step = a step name or NULL.  0, or -1 on ENOMEM. */
int cli_leaks_steps(const msnap_snap_t *s, int64_t dev, const char *step,
                    double min_conf, cli_leaks_t *l);
void cli_leaks_trim(cli_leaks_t *l, double min_conf);
void cli_leaks_free(cli_leaks_t *l);
double cli_leak_confidence(uint32_t grown, uint32_t shrunk, uint32_t steps);

/* ---- the replay engine (cmd_replay.c) ----------------------------------- */
/* Called with the replaying allocator in state `state` (after entries
 * 0..state-1 of the device trace) for every state 0..n in order (the
 * states inside a run of segment_free entries, which replay as one
 * empty_cache, are skipped); returning false stops the replay there. */
typedef bool (*cli_replay_visit_fn)(void *arg, uint32_t state,
                                    msnap_allocator_t *a, int dev);
typedef struct cli_replay_cfg_s {
  const char *profile;    /* "cuda"/"npu"; NULL: the recording's        */
  const char *alloc_conf; /* NULL: the recording's own (exact with cuda) */
  uint64_t sim_memory;    /* bytes of the simulated device; 0: 1 TiB    */
  cli_replay_visit_fn visit;
  void *arg;
} cli_replay_cfg_t;
typedef struct cli_replay_res_s {
  bool replayable; /* false: `reason` says why                          */
  bool exact;      /* recorded addresses (cuda profile, recorded conf)  */
  bool matches;    /* no mismatch with the recording where it ran       */
  const char *initial; /* start state: "empty", "exact", "inferred"...  */
  uint64_t mismatches;
  uint32_t first_failed; /* first alloc entry that failed (CLI_NO_PAIR) */
  long violations; /* > 0: not replayable, the trace is inconsistent with
                      the final state (cli_backward's count) */
  char reason[512];
} cli_replay_res_t;
/* Replay device dev of s (see cmd_replay.c).  0 (res filled, also when
 * not replayable), or -1 on ENOMEM. */
int cli_replay_run(const msnap_snap_t *s, int64_t dev,
                   const cli_replay_cfg_t *cfg, cli_replay_res_t *res);

#endif /* MSNAP_CLI_H */
