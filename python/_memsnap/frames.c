/*
 * frames.c -- the interpreter frame hook (msnap_set_frame_hook).
 *
 * capture() runs at the start of an allocator call, outside the allocator
 * lock, and writes the calling thread's Python frames innermost first as
 * raw pairs {entry, lasti}: `entry` is this file's record of the frame's
 * code object and `lasti` the byte offset of the current instruction.
 *
 * Invariants:
 *   - Every code object seen by capture() gets one frame_entry_t, stored in
 *     the code object's co_extra slot (PEP 523), so the lookup is an array
 *     read.  The entry holds a strong reference to the code object, and the
 *     UTF-8 copies of its qualified name and file name.
 *   - Entries (and so the code objects) stay alive for the life of the
 *     process.  This is what lets resolve() run WITHOUT the GIL (the
 *     library resolves frames while serializing a snapshot, with the GIL
 *     released) and lets retain()/release() run on any thread, even under
 *     library locks, without ever waiting for the GIL: they only count
 *     references the library holds (an atomic counter per entry).  The cost
 *     is that a code object that ever allocated while history was on is
 *     never freed (bounded by the number of distinct functions).
 *   - resolve() reads only immutable data: the copied strings and the code
 *     object's line table (PyCode_Addr2Line allocates nothing).
 *   - Frames of hidden code are skipped by capture(): memsnap's own
 *     Python files (every file under the package's directories:
 *     memory.py's API wrappers, memsnap.torch; the extension's directory
 *     is registered at init, the package's by memsnap/__init__.py through
 *     hide_frames_under), so that an allocation's innermost frame is the
 *     caller's and stacks and sites name the user's line; and single
 *     files (hide_frames_of: the wrappers torch generates for a
 *     registered device).  One list of hidden paths, each a file or a
 *     directory prefix; it only grows; each entry caches whether it is
 *     hidden together with the list generation it checked (capture runs
 *     with the GIL, which guards both).
 *   - capture() takes the GIL (PyGILState_Ensure) only when the calling
 *     thread has a Python thread state but does not hold the GIL (a thread
 *     that released it around C work); threads that never ran Python, and
 *     every thread while the interpreter is finalizing, get no frames
 *     without touching the GIL.
 */
#include "msnap_py.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

/* CPython 3.11-3.13: walk the interpreter's own frame records instead of
 * frame objects (PyFrame_GetBack creates a frame object per frame that has
 * none, i.e. for every new call: ~1 us for 20 fresh frames).  3.9, 3.10
 * and unknown versions use the public API (walk_public); define
 * MSNAP_PY_NO_FAST_FRAMES to force it. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 &&           \
    !defined(MSNAP_PY_NO_FAST_FRAMES)
#define MSNAP_PY_FAST_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#if PY_VERSION_HEX >= 0x030D0000
/* (not _PyFrame_GetCode, which asserts a code object: a C-stack shim's
 * f_executable is None, and the walk compares the pointer before it
 * skips the shim) */
#define FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#define FRAME_INSTR(f) ((f)->instr_ptr)
#define CURRENT_FRAME(ts) ((ts)->current_frame)
#else
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_INSTR(f) ((f)->prev_instr)
#define CURRENT_FRAME(ts) ((ts)->cframe->current_frame)
#endif
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define REQUEST_EXTRA PyUnstable_Eval_RequestCodeExtraIndex
#define GET_EXTRA PyUnstable_Code_GetExtra
#define SET_EXTRA PyUnstable_Code_SetExtra
#else
#define REQUEST_EXTRA _PyEval_RequestCodeExtraIndex
#define GET_EXTRA _PyCode_GetExtra
#define SET_EXTRA _PyCode_SetExtra
#endif

#if PY_VERSION_HEX >= 0x030D0000
#define IS_FINALIZING() Py_IsFinalizing()
#else
#define IS_FINALIZING() _Py_IsFinalizing()
#endif

typedef struct frame_entry_s {
  PyCodeObject *code; /* strong reference, never dropped */
  char *name;         /* co_name, as torch's frames      */
  char *filename;     /* co_filename                     */
  int firstlineno;
  atomic_long refs; /* references the library holds     */
  int hidden_gen;   /* hidden_gen when `hidden` was set  */
  bool hidden;      /* the file is in hidden_files       */
} frame_entry_t;

/* Process-wide hook state: plain C data, no Python objects. */
static Py_ssize_t extra_index = -1;
static atomic_long n_entries;
static atomic_long n_retained;

/* Files and directories whose frames are never recorded (GIL held for
 * every access).  A directory ends with its separator and hides every
 * file whose name starts with it. */
#define MAX_HIDDEN 16
static struct {
  char *path;
  size_t len;
  bool dir;
} hidden[MAX_HIDDEN];
static int n_hidden;
static int hidden_gen = 1;

static inline bool entry_hidden(frame_entry_t *e) {
  if (n_hidden == 0)
    return false;
  if (e->hidden_gen != hidden_gen) {
    e->hidden = false;
    for (int i = 0; i < n_hidden && !e->hidden; i++)
      e->hidden = hidden[i].dir
                      ? strncmp(e->filename, hidden[i].path, hidden[i].len) == 0
                      : strcmp(e->filename, hidden[i].path) == 0;
    e->hidden_gen = hidden_gen;
  }
  return e->hidden;
}

/* Hide the frames of file `path`, or (dir) of every file under directory
 * `path` (a trailing separator is added).  GIL held.  0, 1 when the list
 * is full, -1 on ENOMEM. */
static int hide(const char *path, bool dir) {
  size_t n = strlen(path);
  if (dir)
    while (n > 1 && (path[n - 1] == '/' || path[n - 1] == '\\'))
      n--;
  if (n == 0)
    return 0;
  char *p = malloc(n + 2);
  if (p == NULL)
    return -1;
  memcpy(p, path, n);
  if (dir)
    p[n++] = strchr(path, '\\') && !strchr(path, '/') ? '\\' : '/';
  p[n] = 0;
  for (int i = 0; i < n_hidden; i++)
    if (hidden[i].dir == dir && strcmp(hidden[i].path, p) == 0) {
      free(p);
      return 0;
    }
  if (n_hidden == MAX_HIDDEN) {
    free(p);
    return 1;
  }
  hidden[n_hidden].path = p;
  hidden[n_hidden].len = n;
  hidden[n_hidden].dir = dir;
  n_hidden++;
  hidden_gen++;
  return 0;
}

/* co_extra free function: only reached if a pinned code object somehow
 * dies (it cannot while the entry holds its reference). */
static void entry_free(void *p) {
  frame_entry_t *e = p;
  if (e == NULL)
    return;
  free(e->name);
  free(e->filename);
  free(e);
}

static char *dup_attr(PyObject *code, const char *attr) {
  PyObject *v = PyObject_GetAttrString(code, attr);
  if (v == NULL) {
    PyErr_Clear();
    return strdup("??");
  }
  const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
  char *r = NULL;
  if (s == NULL && PyUnicode_Check(v)) {
    /* Lone surrogates (a path's undecodable bytes under surrogateescape,
     * a name made with them) have no UTF-8: the raw bytes back
     * (surrogateescape), else the surrogates' own encoding (surrogatepass).
     * Either is invalid UTF-8, which the snapshot writer turns into
     * U+FFFD (the one UTF-8 policy) -- the rest of the path is kept. */
    PyErr_Clear();
    PyObject *b = PyUnicode_AsEncodedString(v, "utf-8", "surrogateescape");
    if (b == NULL) {
      PyErr_Clear();
      b = PyUnicode_AsEncodedString(v, "utf-8", "surrogatepass");
    }
    if (b != NULL) {
      r = strndup(PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
      Py_DECREF(b);
    }
  }
  if (s == NULL)
    PyErr_Clear();
  if (r == NULL)
    r = strdup(s ? s : "??");
  Py_DECREF(v);
  return r;
}

/* The entry of a code object, created on first sight.  GIL held.  NULL if
 * out of memory (the frame is then skipped). */
static frame_entry_t *entry_of(PyCodeObject *co) {
  void *p = NULL;
  if (GET_EXTRA((PyObject *)co, extra_index, &p) == 0 && p != NULL)
    return p;
  PyErr_Clear();
  frame_entry_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  /* co_name, not co_qualname: torch's frames name the function alone
   * (torch/csrc/profiler/python/combined_traceback.cpp), and sites are
   * compared across the two recorders' files */
  e->name = dup_attr((PyObject *)co, "co_name");
  e->filename = dup_attr((PyObject *)co, "co_filename");
  e->firstlineno = co->co_firstlineno;
  if (e->name == NULL || e->filename == NULL ||
      SET_EXTRA((PyObject *)co, extra_index, e) < 0) {
    PyErr_Clear();
    entry_free(e);
    return NULL;
  }
  Py_INCREF(co);
  e->code = co;
  atomic_fetch_add(&n_entries, 1);
  return e;
}

/* Walk the current thread's frames with the public API (GIL held). */
static int walk_public(uintptr_t (*frames)[2], int max) {
  int n = 0;
  PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
  if (f == NULL)
    return 0;
  Py_INCREF(f);
  while (f != NULL && n < max) {
    PyCodeObject *co = PyFrame_GetCode(f); /* new reference */
#if PY_VERSION_HEX >= 0x030B0000
    int lasti = PyFrame_GetLasti(f);
#elif PY_VERSION_HEX >= 0x030A0000
    int lasti = f->f_lasti < 0 ? -1 : f->f_lasti * 2;
#else
    int lasti = f->f_lasti;
#endif
    frame_entry_t *e = entry_of(co);
    Py_DECREF(co);
    if (e != NULL && !entry_hidden(e)) {
      frames[n][0] = (uintptr_t)e;
      frames[n][1] = (uintptr_t)(intptr_t)lasti;
      n++;
    }
    PyFrameObject *back = PyFrame_GetBack(f); /* new reference */
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return n;
}

#ifdef MSNAP_PY_FAST_FRAMES
/* Code object -> entry, direct-mapped, read and written with the GIL held
 * (walk() runs only then).  A cached code object is pinned by its entry,
 * so its address is never reused by another code object and a hit is
 * always right; a miss falls back to the co_extra slot (a call into the
 * interpreter and a few dependent loads per frame). */
#define CODE_CACHE_SLOTS 256
static struct {
  PyCodeObject *code;
  frame_entry_t *entry;
} code_cache[CODE_CACHE_SLOTS];

static inline frame_entry_t *entry_cached(PyCodeObject *co) {
#ifdef Py_GIL_DISABLED
  return entry_of(co); /* no GIL to guard the cache */
#endif
  uintptr_t a = (uintptr_t)co;
  size_t k = ((a >> 4) ^ (a >> 12)) & (CODE_CACHE_SLOTS - 1);
  if (__builtin_expect(code_cache[k].code == co, 1))
    return code_cache[k].entry;
  frame_entry_t *e = entry_of(co);
  if (e != NULL) {
    code_cache[k].code = co;
    code_cache[k].entry = e;
  }
  return e;
}

/* The previous walk, frame by frame (raw index i: the i-th interpreter
 * frame from the innermost, skipped ones included), read and written with
 * the GIL held like code_cache.  A slot remembers what a complete frame
 * with that code object, instruction pointer and owner gave: the entry,
 * the lasti word and whether it was hidden.  That is a function of (code,
 * instruction pointer, owner) alone -- the instruction pointer minus the
 * start of the code's bytecode is lasti, the entry is the code object's,
 * completeness compares lasti with the code's _co_firsttraceable -- and
 * of the hidden list, whose generation the memo carries.  Only frames whose code object has an
 * entry are remembered: the entry pins the code object, so no other code
 * object can take its address and an equal pointer is the same code.
 * Loops allocate from the same frames again and again, so most frames
 * of a walk are found here: four loads from the frame and a compare,
 * instead of the code object, the code cache and the entry. */
#define WALK_MEMO 128
typedef struct walk_memo_s {
  _PyInterpreterFrame *frame; /* the raw frame at this depth last time */
  PyCodeObject *code; /* NULL: nothing remembered at this depth */
  _Py_CODEUNIT *instr;  /* the frame's instruction pointer: with the code
                         * object, its instruction offset (lasti) */
  frame_entry_t *entry;
  uintptr_t word;     /* the recorded lasti word                  */
  int8_t owner;
  bool emit;          /* not hidden                                */
} walk_memo_t;
static walk_memo_t walk_memo[WALK_MEMO + 1];
/* A second way per depth: what the remembered frame gave before it was
 * replaced (a loop that allocates and frees from two lines of one
 * function alternates between two innermost frames). */
static walk_memo_t walk_memo_alt[WALK_MEMO];
static int walk_memo_gen; /* hidden_gen of the remembered frames */
static bool walk_lost;    /* the walk skipped a frame it could not record */
static bool walk_unpinned; /* the walk skipped a frame without its entry */
#ifdef Py_GIL_DISABLED /* no records, and no GIL to guard these */
#define WALK_NOTE(flag) ((void)0)
#else
#define WALK_NOTE(flag) ((flag) = true)
#endif

/* Whole walks remembered (GIL held, like the memo), for capture_token.
 * A record holds every raw frame of a complete walk -- the chain from the
 * thread's current frame to the bottom (`previous` NULL) -- with what
 * decided each frame's output (code object, instruction pointer, owner)
 * and the frames the walk wrote.  The output of a walk is a function of
 * exactly those (see walk_memo_t) and of the hidden list's generation,
 * so when the current chain is the recorded one, frame for frame, the
 * output is the recorded one, and its token names it.
 *
 * Checking a record reads each frame only after the frame above it named
 * it as its `previous` (a frame known to be live): a recorded pointer to
 * a frame that has since been popped, whose stack chunk may be freed, is
 * never followed.  The checks of successive frames do not depend on each
 * other's loads (the next address comes from the record), so the
 * processor runs them ahead -- about a nanosecond a frame, against four
 * for the memo walk, and no compare of the output.
 *
 * Most records are checked on two words a frame: its instruction
 * pointer and its `previous`.  The instruction pointer points into the
 * bytecode of the frame's code object, which lies inside that object;
 * a recorded code object is pinned by its entry, so no other object can
 * ever occupy its memory, and an equal instruction pointer means the same
 * code object and the same lasti.  The owner then changes nothing either:
 * it matters only for a frame not yet past its code's _co_firsttraceable
 * (incomplete) and for C-stack shims, and a walk that skipped any frame
 * for either reason -- a code object the walk did not pin -- is `strict`:
 * checked on code object, instruction pointer, owner and `previous`.
 *
 * Invariant: a record with a nonzero token holds a complete walk made
 * under hidden generation `gen`, every frame of it pinned unless the
 * record is strict, and its token was never given to other frames
 * (tokens come from one counter, bumped each time a record is written). */
#define REC_FRAMES 128
#define REC_WAYS 4
typedef struct walk_rec_s {
  uint64_t token; /* 0: empty, or being rewritten */
  int gen;        /* hidden_gen of the walk */
  int raw;        /* interpreter frames walked, 1..REC_FRAMES */
  int n;          /* frames written, <= raw */
  bool strict;    /* a frame was skipped unpinned: check every field */
  _PyInterpreterFrame *frame[REC_FRAMES + 1]; /* frame[raw] == NULL */
  PyCodeObject *code[REC_FRAMES];
  _Py_CODEUNIT *instr[REC_FRAMES];
  int8_t owner[REC_FRAMES];
  uintptr_t out[REC_FRAMES][2];
} walk_rec_t;
static walk_rec_t walk_rec[REC_WAYS];
static unsigned walk_rec_next;   /* the way written next (round robin) */
static uint64_t walk_rec_tokens; /* the last token given */

/* One frame of walk_ts: appended to frames[*n] unless skipped. */
static inline bool memo_hit(const walk_memo_t *m, PyCodeObject *co,
                            _PyInterpreterFrame *f) {
  return m->code == co && m->instr == FRAME_INSTR(f) &&
         m->owner == (int8_t)f->owner;
}

static inline __attribute__((always_inline)) void
walk_frame(_PyInterpreterFrame *f, walk_memo_t *m, walk_memo_t *alt,
           uintptr_t (*frames)[2], int *n) {
  PyCodeObject *co = FRAME_CODE(f);
  if (m != NULL) {
    const walk_memo_t *h =
        memo_hit(m, co, f) ? m : memo_hit(alt, co, f) ? alt : NULL;
    if (h != NULL) {
      /* frames[*n] is in bounds (the caller stops at max) */
      frames[*n][0] = (uintptr_t)h->entry;
      frames[*n][1] = h->word;
      *n += h->emit;
      return;
    }
  }
#if PY_VERSION_HEX >= 0x030C0000
  /* C-stack entry shims (3.13's _PyFrame_IsIncomplete checks this too). */
  if (f->owner == FRAME_OWNED_BY_CSTACK) {
    WALK_NOTE(walk_unpinned);
    return;
  }
#endif
  if (_PyFrame_IsIncomplete(f)) {
    WALK_NOTE(walk_unpinned);
    return;
  }
  frame_entry_t *e = entry_cached(co);
  if (e == NULL) {
    WALK_NOTE(walk_lost); /* skipped for want of memory, not by rule */
    return;
  }
  int lasti = _PyInterpreterFrame_LASTI(f);
  if (lasti >= 0)
    lasti *= (int)sizeof(_Py_CODEUNIT);
  bool emit = !entry_hidden(e);
  if (m != NULL) {
    if (m->code != NULL) { /* the previous one moves to the second way */
      *alt = *m;
      alt->frame = NULL;
    }
    m->code = co;
    m->instr = FRAME_INSTR(f);
    m->entry = e;
    m->word = (uintptr_t)(intptr_t)lasti;
    m->owner = (int8_t)f->owner;
    m->emit = emit;
  }
  if (!emit)
    return;
  frames[*n][0] = (uintptr_t)e;
  frames[*n][1] = (uintptr_t)(intptr_t)lasti;
  (*n)++;
}

/* 3.11-3.13: the same frames as walk_public (incomplete and C-stack
 * frames skipped, as PyEval_GetFrame/PyFrame_GetBack skip them), and the
 * same lasti as PyFrame_GetLasti, without frame objects.
 *
 * Following `previous` one frame at a time makes the walk wait for each
 * load before the next.  The memo also remembers where each frame was:
 * when a frame's real `previous` equals the remembered next frame, the
 * walk continues from the remembered address (the same pointer, checked
 * to be equal), which the processor can load ahead without waiting for
 * the chain -- every frame visited is still the real chain's. */
static int walk_ts_rec(PyThreadState *ts, uintptr_t (*frames)[2], int max,
                       walk_rec_t *rec) {
  _PyInterpreterFrame *f = CURRENT_FRAME(ts);
  int n = 0, i = 0;
#ifdef Py_GIL_DISABLED
  (void)rec;
  for (; f != NULL && n < max; f = f->previous) /* no GIL for the memo */
    walk_frame(f, NULL, NULL, frames, &n);
  return n;
#else
  if (walk_memo_gen != hidden_gen) {
    memset(walk_memo, 0, sizeof walk_memo);
    memset(walk_memo_alt, 0, sizeof walk_memo_alt);
    walk_memo_gen = hidden_gen;
  }
  walk_lost = false;
  walk_unpinned = false;
  for (; f != NULL && n < max && i < WALK_MEMO; i++) {
    walk_memo_t *m = &walk_memo[i];
    m->frame = f;
    if (rec != NULL && i < REC_FRAMES) {
      rec->frame[i] = f;
      rec->code[i] = FRAME_CODE(f);
      rec->instr[i] = FRAME_INSTR(f);
      rec->owner[i] = (int8_t)f->owner;
    }
    walk_frame(f, m, &walk_memo_alt[i], frames, &n);
    _PyInterpreterFrame *next = f->previous, *pred = walk_memo[i + 1].frame;
    if (__builtin_expect(next == pred, 1)) {
      /* the same pointer, but not derived from the load of `next`: the
       * compiler must not substitute one for the other */
      __asm__("" : "+r"(pred));
      f = pred;
    } else {
      f = next;
    }
  }
  walk_memo[i].frame = NULL;
  if (rec != NULL) {
    /* recorded only when the walk reached the bottom, every frame held */
    if (f == NULL && i <= REC_FRAMES && i > 0 && !walk_lost) {
      rec->frame[i] = NULL;
      rec->raw = i;
      rec->n = n;
      rec->gen = hidden_gen;
      rec->strict = walk_unpinned;
      memcpy(rec->out, frames, (size_t)n * sizeof *frames);
      rec->token = ++walk_rec_tokens;
    } else {
      rec->token = 0;
    }
  }
  for (; f != NULL && n < max; f = f->previous)
    walk_frame(f, NULL, NULL, frames, &n);
  return n;
#endif
}

static int walk_ts(PyThreadState *ts, uintptr_t (*frames)[2], int max) {
  return walk_ts_rec(ts, frames, max, NULL);
}

static int walk(uintptr_t (*frames)[2], int max) {
  return walk_ts(PyThreadState_Get(), frames, max);
}

#ifndef Py_GIL_DISABLED
/* Is the current chain, from f0, the one record r holds?  Each frame is
 * read only once the frame above it is known to name it as `previous`. */
static inline bool rec_holds(const walk_rec_t *r) {
  if (!r->strict) {
#pragma GCC unroll 4
    for (int i = 0; i < r->raw; i++) {
      const _PyInterpreterFrame *f = r->frame[i];
      if (((uintptr_t)FRAME_INSTR(f) ^ (uintptr_t)r->instr[i]) |
          ((uintptr_t)f->previous ^ (uintptr_t)r->frame[i + 1]))
        return false;
    }
    return true;
  }
  for (int i = 0; i < r->raw; i++) {
    _PyInterpreterFrame *f = r->frame[i];
    if ((FRAME_CODE(f) != r->code[i]) | (FRAME_INSTR(f) != r->instr[i]) |
        ((int8_t)f->owner != r->owner[i]) | (f->previous != r->frame[i + 1]))
      return false;
  }
  return true;
}

/* walk_ts, and the token of what it wrote: a record's when the current
 * chain is one recorded (its frames not written when that token is
 * `known` to the caller), else the walk is made and recorded (when
 * complete) in the next way. */
static int walk_ts_token(PyThreadState *ts, uintptr_t (*frames)[2], int max,
                         uint64_t known, uint64_t *token) {
  _PyInterpreterFrame *f0 = CURRENT_FRAME(ts);
  if (f0 == NULL)
    return 0;
  PyCodeObject *c0 = FRAME_CODE(f0);
  _Py_CODEUNIT *i0 = FRAME_INSTR(f0);
  for (int k = 0; k < REC_WAYS; k++) {
    const walk_rec_t *r = &walk_rec[k];
    if (r->frame[0] != f0 || r->code[0] != c0 || r->instr[0] != i0 ||
        r->token == 0 || r->gen != hidden_gen || r->n > max)
      continue;
    if (rec_holds(r)) {
      if (r->token != known)
        memcpy(frames, r->out, (size_t)r->n * sizeof *frames);
      *token = r->token;
      return r->n;
    }
  }
  walk_rec_t *r = &walk_rec[walk_rec_next++ % REC_WAYS];
  int n = walk_ts_rec(ts, frames, max, r);
  *token = r->token;
  return n;
}
#endif

/* The thread state of the thread holding the GIL (NULL when none holds
 * it), read without checks. */
#if PY_VERSION_HEX >= 0x030D0000
#define GIL_HOLDER_TSTATE() PyThreadState_GetUnchecked()
#else
#define GIL_HOLDER_TSTATE() _PyThreadState_UncheckedGet()
#endif

/* The calling thread's state when it holds the GIL, else NULL: the GIL
 * holder's state, if it is this thread's (its thread_id is this thread's
 * pthread id).  Cheaper than PyGILState_Check + PyThreadState_Get, which
 * look the thread up in thread-specific storage.  A thread that released
 * the GIL is no holder (releasing swaps the current state to NULL). */
static inline PyThreadState *gil_held_tstate(void) {
#ifdef Py_GIL_DISABLED
  return NULL; /* no GIL: take the checked path */
#else
  PyThreadState *ts = GIL_HOLDER_TSTATE();
  if (ts != NULL && ts->thread_id == PyThread_get_thread_ident())
    return ts;
  return NULL;
#endif
}
#else
#define walk walk_public
#endif

static int hook_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
#ifdef MSNAP_PY_FAST_FRAMES
  /* The common case: an allocation made from Python, GIL held. */
  PyThreadState *held = gil_held_tstate();
  if (held != NULL && max > 0 && extra_index >= 0)
    return walk_ts(held, frames, max);
#endif
  if (max <= 0 || !Py_IsInitialized() || extra_index < 0)
    return 0;
  if (PyGILState_Check())
    return walk(frames, max);
  /* A thread that never ran Python (e.g. torch's autograd engine threads)
   * has no Python frames: do not take the GIL just to find none. */
  if (PyGILState_GetThisThreadState() == NULL || IS_FINALIZING())
    return 0;
  PyGILState_STATE g = PyGILState_Ensure();
  int n = walk(frames, max);
  PyGILState_Release(g);
  return n;
}

static int hook_capture_token(void *ctx, uintptr_t (*frames)[2], int max,
                              uint64_t *token) {
  uint64_t known = *token;
  *token = 0;
#if defined(MSNAP_PY_FAST_FRAMES) && !defined(Py_GIL_DISABLED)
  PyThreadState *held = gil_held_tstate();
  if (held != NULL && max > 0 && extra_index >= 0)
    return walk_ts_token(held, frames, max, known, token);
#else
  (void)known;
#endif
  return hook_capture(ctx, frames, max);
}

static void hook_retain(void *ctx, const uintptr_t frame[2]) {
  frame_entry_t *e = (frame_entry_t *)frame[0];
  if (e != NULL && atomic_fetch_add(&e->refs, 1) == 0)
    atomic_fetch_add(&n_retained, 1);
}

static void hook_release(void *ctx, const uintptr_t frame[2]) {
  frame_entry_t *e = (frame_entry_t *)frame[0];
  if (e != NULL && atomic_fetch_sub(&e->refs, 1) == 1)
    atomic_fetch_sub(&n_retained, 1);
}

/* GIL not required (see the invariants above). */
static int hook_resolve(void *ctx, const uintptr_t frame[2], const char **name,
                        const char **filename, int64_t *line) {
  const frame_entry_t *e = (const frame_entry_t *)frame[0];
  if (e == NULL)
    return MSNAP_EINVAL;
  int lasti = (int)(intptr_t)frame[1];
  *name = e->name;
  *filename = e->filename;
  *line = lasti < 0 ? e->firstlineno : PyCode_Addr2Line(e->code, lasti);
  return 0;
}

static const msnap_frame_hook_t hook = {.ctx = NULL,
                                        .capture = hook_capture,
                                        .retain = hook_retain,
                                        .release = hook_release,
                                        .resolve = hook_resolve,
                                        .capture_token = hook_capture_token};

/* ---- Python-visible helpers (tests and bench/) --------------------------- */

/* capture_frames(max=64, public=False, token=False) -> list of (name,
 * filename, line), innermost first: what the library would record for an
 * allocation made here (public=True: through the public frame API, for
 * comparison; token=True: through capture_token, as the library calls it,
 * and the result is (list, token)). */
static PyObject *py_capture_frames(PyObject *module, PyObject *args) {
  int max = 64, public_api = 0, want_token = 0;
  uint64_t token = 0;
  if (!PyArg_ParseTuple(args, "|ipp:capture_frames", &max, &public_api,
                        &want_token))
    return NULL;
  if (max < 0 || max > 4096) {
    PyErr_SetString(PyExc_ValueError, "max must be in [0, 4096]");
    return NULL;
  }
  uintptr_t(*frames)[2] = PyMem_Malloc(sizeof *frames * (size_t)(max + 1));
  if (frames == NULL)
    return PyErr_NoMemory();
  int n = public_api    ? walk_public(frames, max)
          : want_token ? hook_capture_token(NULL, frames, max, &token)
                       : hook_capture(NULL, frames, max);
  PyObject *list = PyList_New(n);
  for (int i = 0; list != NULL && i < n; i++) {
    const char *nm = "??", *fn = "??";
    int64_t line = 0;
    hook_resolve(NULL, frames[i], &nm, &fn, &line);
    PyObject *t = Py_BuildValue("(ssL)", nm, fn, (long long)line);
    if (t == NULL) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, t);
  }
  PyMem_Free(frames);
  if (list == NULL || !want_token)
    return list;
  return Py_BuildValue("(NK)", list, (unsigned long long)token);
}

/* bench_capture(n, max=64, token=False) -> nanoseconds per capture() call
 * (token=True: per capture_token() call). */
static PyObject *py_bench_capture(PyObject *module, PyObject *args) {
  long n;
  int max = 64, want_token = 0;
  uint64_t token = 0;
  if (!PyArg_ParseTuple(args, "l|ip:bench_capture", &n, &max, &want_token))
    return NULL;
  if (n <= 0 || max <= 0 || max > 4096) {
    PyErr_SetString(PyExc_ValueError, "n > 0 and 0 < max <= 4096 required");
    return NULL;
  }
  uintptr_t(*frames)[2] = PyMem_Malloc(sizeof *frames * (size_t)max);
  if (frames == NULL)
    return PyErr_NoMemory();
  struct timespec t0, t1;
  int depth = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    token = 0; /* nothing known: the frames are written every time */
    depth = want_token ? hook_capture_token(NULL, frames, max, &token)
                       : hook_capture(NULL, frames, max);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  PyMem_Free(frames);
  double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 +
               (double)(t1.tv_nsec - t0.tv_nsec)) /
              (double)n;
  return Py_BuildValue("(di)", ns, depth);
}

static PyObject *hide_arg(PyObject *arg, bool dir, const char *what) {
  const char *f = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
  if (f == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "%s: str required", what);
    return NULL;
  }
  int rc = hide(f, dir);
  if (rc < 0)
    return PyErr_NoMemory();
  if (rc > 0) {
    PyErr_Format(PyExc_RuntimeError, "%s: too many hidden paths", what);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* hide_frames_of(filename): frames of code from that file are not
 * recorded from now on. */
static PyObject *py_hide_frames_of(PyObject *module, PyObject *arg) {
  return hide_arg(arg, false, "hide_frames_of(filename)");
}

/* hide_frames_under(directory): frames of code from files under that
 * directory are not recorded from now on (memsnap/__init__.py registers
 * the package's own directory). */
static PyObject *py_hide_frames_under(PyObject *module, PyObject *arg) {
  return hide_arg(arg, true, "hide_frames_under(directory)");
}

/* frame_hook_stats() -> (code objects seen, entries the library retains) */
static PyObject *py_frame_hook_stats(PyObject *module, PyObject *unused) {
  return Py_BuildValue("(ll)", (long)atomic_load(&n_entries),
                       (long)atomic_load(&n_retained));
}

PyMethodDef msnap_py_frames_methods[] = {
    {"capture_frames", py_capture_frames, METH_VARARGS,
     "capture_frames(max=64, public=False, token=False) -> [(name, "
     "filename, line)], innermost first ((frames, token) with token=True)."},
    {"bench_capture", py_bench_capture, METH_VARARGS,
     "bench_capture(n, max=64, token=False) -> (ns per capture, depth)."},
    {"hide_frames_of", py_hide_frames_of, METH_O,
     "hide_frames_of(filename): do not record frames of that file."},
    {"hide_frames_under", py_hide_frames_under, METH_O,
     "hide_frames_under(directory): do not record frames of files under "
     "that directory."},
    {"frame_hook_stats", py_frame_hook_stats, METH_NOARGS,
     "frame_hook_stats() -> (code objects seen, code objects retained)."},
    {NULL, NULL, 0, NULL}};

/*
 * msnap_py_frames_init -- request the co_extra index and install the hook
 * (once per process; a second module instance reuses both).
 */
int msnap_py_frames_init(PyObject *module) {
  /* The extension lies in the package directory once installed: its
   * Python files are memsnap's own. */
  PyObject *fn = PyModule_GetFilenameObject(module);
  if (fn == NULL) {
    PyErr_Clear();
  } else {
    const char *p = PyUnicode_AsUTF8(fn);
    const char *slash = p ? strrchr(p, '/') : NULL;
    if (p == NULL) {
      PyErr_Clear();
    } else if (slash != NULL && slash > p) {
      char *dir = strndup(p, (size_t)(slash - p));
      if (dir == NULL || hide(dir, true) < 0) {
        free(dir);
        Py_DECREF(fn);
        PyErr_NoMemory();
        return -1;
      }
      free(dir);
    }
    Py_DECREF(fn);
  }
  if (extra_index < 0) {
    extra_index = REQUEST_EXTRA(entry_free);
    if (extra_index < 0) {
      PyErr_SetString(PyExc_RuntimeError, "no free co_extra index");
      return -1;
    }
    int rc = msnap_set_frame_hook(&hook);
    if (rc < 0) {
      msnap_py_raise(module, rc, "msnap_set_frame_hook");
      return -1;
    }
  }
  return 0;
}
