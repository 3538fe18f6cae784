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

/* Print "memsnap: <message>\n" on stderr (printf format). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "memsnap CMD: unknown option, see memsnap CMD --help"; returns 2. */
int cli_usage_error(const char *cmd, const char *what);

/* ---- the shared command prologue (cli_args.c) ----------------------------- */
typedef enum { CLI_OPT_FLAG, CLI_OPT_STRING, CLI_OPT_LONG } cli_optkind_t;
/* One option: --name (and -letter when letter != 0); dest is a bool *
 * (FLAG), a const char ** (STRING) or a long * (LONG, accepted in
 * [lo, hi], else the usage error `what`). */
typedef struct cli_opt_s {
  const char *name;
  char letter;
  cli_optkind_t kind;
  void *dest;
  long lo, hi;
  const char *what;
} cli_opt_t;
#define CLI_FLAG(name, letter, dest)                                        \
  { name, letter, CLI_OPT_FLAG, dest, 0, 0, NULL }
#define CLI_STRING(name, letter, dest)                                      \
  { name, letter, CLI_OPT_STRING, dest, 0, 0, NULL }
#define CLI_LONG(name, letter, dest, lo, hi, what)                          \
  { name, letter, CLI_OPT_LONG, dest, lo, hi, what }
#define CLI_OPT_END { NULL, 0, CLI_OPT_FLAG, NULL, 0, 0, NULL }
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
} cli_cmd_t;
/* cli_begin's "go on" (any other value is the exit code to return). */
enum { CLI_CONTINUE = -1, CLI_DONE = CLI_OK };
/* Parse argv for command c: options, FILE count, -o (checked against the
 * inputs).  *first is the index of the first FILE; with load != NULL the
 * first FILE is loaded into *load (the caller frees it). */
int cli_begin(const cli_cmd_t *c, int argc, char **argv, int *first,
              msnap_snap_t **load);

/* Load a snapshot file of any generation.  On failure prints
 * "memsnap: PATH: <reason>" and returns CLI_UNUSABLE; *out untouched. */
int cli_load(const char *path, msnap_snap_t **out);
/* The reason of the last failed cli_load (without the path), for JSON. */
const char *cli_load_error(void);

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
/* Number fields of the open object, in order. */
typedef struct cli_u64_field_s {
  const char *key;
  uint64_t v;
} cli_u64_field_t;
void cj_u64_fields(cli_json_t *j, const cli_u64_field_t *f, size_t n);
/* A one-object document on stdout: string (s != NULL) or integer fields
 * ({"output": ..., "bytes": ...} of the commands that write a file). */
typedef struct cli_field_s {
  const char *key;
  const char *s;
  int64_t i;
} cli_field_t;
void cli_print_fields(const cli_field_t *f, size_t n);
/* A generic model value (allocator_settings) as JSON; nesting deeper than
 * CJ_MAX_DEPTH - 2 is written as null. */
#define CJ_MAX_DEPTH 64
void cj_gv(cli_json_t *j, const msnap_snap_t *s, const msnap_gv_t *v);

/* allocator_settings as compact "key=value" items ("max_split_size=-1",
 * "roundup_power2_divisions={64:4}"; all-zero integer dicts left out):
 * *n malloc'd strings in a malloc'd array, NULL if none or on ENOMEM. */
char **cli_settings_items(const msnap_snap_t *s, const msnap_gv_t *d,
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
/* Index of the first of n sorted elements (stride bytes each) whose
 * 64-bit key at byte offset `off` is >= key (signed or unsigned). */
uint32_t cli_lower_bound(const void *base, uint32_t n, size_t stride,
                         size_t off, uint64_t key, bool is_signed);

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
 * "??", shared objects), frames inside torch/ (any path component "torch",
 * "torch_npu" or "memsnap") and frames of the Python standard library (a
 * path under lib/python3.x that is not in site-packages); the first frame
 * left that is not in an installed package (site-packages, dist-packages)
 * is the site, and the innermost installed-package frame inside it (e.g.
 * einops, transformers' modeling code) its `via`.  When every frame is
 * skipped, the innermost installed-package frame, else the innermost
 * Python frame, else (native frames only: an autograd engine thread) the
 * innermost autograd node ("...MmBackward0::apply(...)"), else the
 * innermost native frame that is not the unwinder or the allocator, is
 * the site (via = CLI_SITE_NONE).  frame is CLI_SITE_NONE when the stack
 * is empty. */
typedef struct cli_site_s {
  uint32_t frame, via;
} cli_site_t;
cli_site_t cli_site(const msnap_snap_t *s, msnap_stack_t st);
static inline bool cli_site_eq(cli_site_t a, cli_site_t b) {
  return a.frame == b.frame && a.via == b.via;
}
/* Format a site as "file:line:name" (file shortened to its last two path
 * components; a native frame (line 0, not a .py file) is its C++ name
 * without the final parameter list),
 * followed by " (via file:line:name)" when it has a via; the pseudo sites
 * as CLI_SITE_NONE_TEXT / CLI_SITE_BEFORE_TEXT.  Control characters come
 * out as '?'. */
void cli_site_format(const msnap_snap_t *s, cli_site_t site, char *buf,
                     size_t len);
/* Replace control characters of a NUL-terminated string by '?' in place
 * (text from a file must not drive the terminal). */
void cli_sanitize(char *buf);

/* Devices that appear in the snapshot: every segment device and every
 * index of a non-empty device trace, sorted; *n set; caller frees. */
int64_t *cli_devices(const msnap_snap_t *s, uint32_t *n);
/* Trace of a device, NULL when absent. */
const msnap_trace_list_t *cli_trace(const msnap_snap_t *s, int64_t device);

/* "2.1", "2.6", "segment list"... */
const char *cli_generation_name(msnap_generation_t g);

/* The device with the longest trace, else the first segment's, else 0. */
int64_t cli_default_device(const msnap_snap_t *s);
/* Write a whole file atomically (temporary file + rename); prints the
 * reason and returns -1 on failure. */
int cli_write_file(const char *path, const void *data, size_t len);
/* Refuse an empty output path, a directory, or an output that is one of
 * the inputs (same device and inode); prints why, returns CLI_UNUSABLE. */
int cli_check_output(const char *cmd, const char *out, char **inputs,
                     int ninputs);

/* Human-readable bytes ("1.5 GiB") into buf. */
const char *cli_bytes(uint64_t v, char *buf, size_t len);
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
bool cli_workspace_synthetic(const msnap_trace_list_t *tl, uint32_t i);
/* Active (requested) and reserved bytes before the first entry and after
 * each entry of the device trace; *n = entries + 1; caller frees. */
int cli_timeline(const msnap_snap_t *s, int64_t dev, uint64_t **act,
                 uint64_t **res, uint32_t *n);
int cli_state_final(const msnap_snap_t *s, int64_t device, cli_state_t *st);

#endif /* MSNAP_CLI_H */
