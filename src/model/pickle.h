/*
 * pickle.h -- the model layer's pickle interface: the one pickle encoder
 * of memsnap (pickle_write.c; snapshot_write.c and the api layer's
 * _allocation_traceback write through it), the safe pickle VM
 * (pickle_read.c, used by snapshot_read.c; its accessors also serve the
 * tests' canonical dump, tests/pickle/canon.c) and snapshot.c's helpers
 * for the other model files.  Nothing here is public.
 *
 * The VM's values are 8-byte tagged words (msnap_pv_t): the low 3 bits are
 * a tag, the rest a payload.  Strings are ids in a msnap_snap_t string
 * table (interned), ints that fit in 61 bits are inline, everything else
 * (floats, wide ints, big ints) is boxed in a side table, containers are
 * indices into an object pool (with a generation so a stale reference to
 * a recycled object is detected, never aliased), and REC values are
 * records a consumer produced from a completed container (snapshot_read.c
 * turns trace-entry dicts into model records this way).
 */
#ifndef MSNAP_PICKLE_H
#define MSNAP_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/sink.h"
#include "base/source.h"
#include "model/snapshot.h"

/* ---- snapshot.c helpers shared by the snapshot files --------------------- */
/* The reader marks its models: their key-presence bits are authoritative. */
void msnap__snap_set_from_reader(msnap_snap_t *s, bool v);
bool msnap__snap_from_reader(const msnap_snap_t *s);

/* ---- pickle_write.c: protocol-4 encoder over a sink --------------------- */
/*
 * Writes only the MemoryViz opcode subset (cuda-reference §2.9), in 64 KiB
 * FRAMEs.  Errors are sticky in `err` (with text in `msg`); every emit
 * function is a no-op after an error.  The caller manages memo ids: each
 * msnap__pw_memoize returns the id that BINGET/LONG_BINGET later use.
 */
#define MSNAP_PW_FRAME_SIZE 65536u
typedef struct msnap_pw_s {
  msnap_sink_t *sink;
  unsigned char *buf; /* current frame: FRAME header room + payload */
  size_t used;        /* bytes of payload in buf (after the header) */
  uint32_t memo_next; /* next memo id (MEMOIZE appends)             */
  int err;
  char msg[160];
} msnap_pw_t;

int msnap__pw_init(msnap_pw_t *w, msnap_sink_t *sink);
/* Flush the last frame, write STOP, release the buffer; returns err. */
int msnap__pw_finish(msnap_pw_t *w);
/* Release without writing more (after an error). */
void msnap__pw_abort(msnap_pw_t *w);
/* Emit the current frame (internal to the inline fast paths below). */
void msnap__pw_flush_frame(msnap_pw_t *w);
/* Room for n more bytes in the current frame (n <= frame size); NULL
 * after an error. */
static inline unsigned char *msnap__pw_room(msnap_pw_t *w, size_t n) {
  if (__builtin_expect(w->used + n > MSNAP_PW_FRAME_SIZE, 0))
    msnap__pw_flush_frame(w);
  if (__builtin_expect(w->err != 0, 0)) return NULL;
  unsigned char *p = w->buf + 9 + w->used;
  w->used += n;
  return p;
}
static inline void msnap__pw_op(msnap_pw_t *w, unsigned char op) {
  unsigned char *p = msnap__pw_room(w, 1);
  if (p) *p = op;
}
/* Slow path of msnap__pw_int (BININT2 and wider). */
void msnap__pw_int_wide(msnap_pw_t *w, int64_t v);
static inline void msnap__pw_int(msnap_pw_t *w, int64_t v) {
  if (v >= 0 && v < 256) {
    unsigned char *p = msnap__pw_room(w, 2);
    if (p) {
      p[0] = 'K'; /* BININT1 */
      p[1] = (unsigned char)v;
    }
    return;
  }
  msnap__pw_int_wide(w, v);
}
/* Unsigned: values >= 2^63 are refused (MSNAP_EINVAL, sticky). */
void msnap__pw_uint(msnap_pw_t *w, uint64_t v, const char *what);
void msnap__pw_float(msnap_pw_t *w, double v);
void msnap__pw_bool(msnap_pw_t *w, bool v);
void msnap__pw_str(msnap_pw_t *w, const char *p, size_t len);
/* MEMOIZE the object on top of the stack; returns its memo id. */
static inline uint32_t msnap__pw_memoize(msnap_pw_t *w) {
  msnap__pw_op(w, 0x94); /* MEMOIZE */
  return w->memo_next++;
}
static inline void msnap__pw_get(msnap_pw_t *w, uint32_t id) {
  unsigned char *p;
  if (id < 256) {
    if ((p = msnap__pw_room(w, 2))) {
      p[0] = 'h'; /* BINGET */
      p[1] = (unsigned char)id;
    }
  } else if ((p = msnap__pw_room(w, 5))) {
    p[0] = 'j'; /* LONG_BINGET */
    for (int i = 0; i < 4; i++) p[1 + i] = (unsigned char)(id >> (8 * i));
  }
}

/* Opcodes used by the writer and the reader (name, byte): one list for
 * the enum and the reader's error messages (pickle_read.c, op_name). */
#define MSNAP_PICKLE_OPS(X) \
  X(MARK, '(') X(STOP, '.') X(POP, '0') X(POP_MARK, '1') X(DUP, '2') \
  X(FLOAT, 'F') X(INT, 'I') X(BININT, 'J') X(BININT1, 'K') X(LONG, 'L') \
  X(BININT2, 'M') X(NONE, 'N') X(PERSID, 'P') X(BINPERSID, 'Q') \
  X(REDUCE, 'R') X(STRING, 'S') X(BINSTRING, 'T') X(SHORT_BINSTRING, 'U') \
  X(UNICODE, 'V') X(BINUNICODE, 'X') X(APPEND, 'a') X(BUILD, 'b') \
  X(GLOBAL, 'c') X(DICT, 'd') X(EMPTY_DICT, '}') X(APPENDS, 'e') \
  X(GET, 'g') X(BINGET, 'h') X(INST, 'i') X(LONG_BINGET, 'j') X(LIST, 'l') \
  X(EMPTY_LIST, ']') X(OBJ, 'o') X(PUT, 'p') X(BINPUT, 'q') \
  X(LONG_BINPUT, 'r') X(SETITEM, 's') X(TUPLE, 't') X(EMPTY_TUPLE, ')') \
  X(SETITEMS, 'u') X(BINFLOAT, 'G') X(PROTO, 0x80) X(NEWOBJ, 0x81) \
  X(EXT1, 0x82) X(EXT2, 0x83) X(EXT4, 0x84) X(TUPLE1, 0x85) X(TUPLE2, 0x86) \
  X(TUPLE3, 0x87) X(NEWTRUE, 0x88) X(NEWFALSE, 0x89) X(LONG1, 0x8a) \
  X(LONG4, 0x8b) X(BINBYTES, 'B') X(SHORT_BINBYTES, 'C') \
  X(SHORT_BINUNICODE, 0x8c) X(BINUNICODE8, 0x8d) X(BINBYTES8, 0x8e) \
  X(EMPTY_SET, 0x8f) X(ADDITEMS, 0x90) X(FROZENSET, 0x91) \
  X(NEWOBJ_EX, 0x92) X(STACK_GLOBAL, 0x93) X(MEMOIZE, 0x94) X(FRAME, 0x95) \
  X(BYTEARRAY8, 0x96) X(NEXT_BUFFER, 0x97) X(READONLY_BUFFER, 0x98)

enum {
#define MSNAP_OP_ENUM_(name, byte) MSNAP_OP_##name = byte,
  MSNAP_PICKLE_OPS(MSNAP_OP_ENUM_)
#undef MSNAP_OP_ENUM_
};

/* ---- pickle_read.c: the safe VM ------------------------------------------ */
typedef uint64_t msnap_pv_t;

enum msnap_pv_tag_e {
  MSNAP_PV_CONST = 0, /* payload: MSNAP_PVC_*                       */
  MSNAP_PV_INT = 1,   /* signed 61-bit payload                      */
  MSNAP_PV_STR = 2,   /* string id                                  */
  MSNAP_PV_OBJ = 3,   /* (generation << 28) | pool index            */
  MSNAP_PV_REC = 4,   /* (kind << 48) | index: consumer records     */
  MSNAP_PV_BOX = 5,   /* box index                                  */
  MSNAP_PV_BYTES = 6, /* string id holding the bytes                */
  MSNAP_PV_BYTEARRAY = 7
};
enum { MSNAP_PVC_NONE = 0, MSNAP_PVC_FALSE = 1, MSNAP_PVC_TRUE = 2,
       MSNAP_PVC_HOLE = 3 /* unset memo slot */ };

#define MSNAP_PV_TAG(v) ((unsigned)((v) & 7u))
#define MSNAP_PV_PAYLOAD(v) ((v) >> 3)
#define MSNAP_PV_MAKE(tag, payload) (((uint64_t)(payload) << 3) | (tag))
#define MSNAP_PV_NONE MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_NONE)
#define MSNAP_PV_REC_MAKE(kind, idx)                                          \
  MSNAP_PV_MAKE(MSNAP_PV_REC, ((uint64_t)(kind) << 48) | (uint64_t)(idx))
/* The int of an MSNAP_PV_INT value (its signed 61-bit payload). */
#define MSNAP_PV_INT_VALUE(v) ((int64_t)(v) >> 3)
#define MSNAP_PV_REC_KIND(v) ((unsigned)(MSNAP_PV_PAYLOAD(v) >> 48))
#define MSNAP_PV_REC_INDEX(v) (MSNAP_PV_PAYLOAD(v) & ((1ull << 48) - 1))

typedef enum msnap_pobj_kind_e {
  MSNAP_POBJ_FREE = 0,
  MSNAP_POBJ_LIST,
  MSNAP_POBJ_TUPLE,
  MSNAP_POBJ_DICT, /* items: key, value, key, value... */
  MSNAP_POBJ_SET,
  MSNAP_POBJ_FROZENSET,
  MSNAP_POBJ_FORWARDED /* replaced while still on the stack: see fwd */
} msnap_pobj_kind_t;

typedef struct msnap_pobj_s {
  msnap_pv_t *items;
  msnap_pv_t fwd;     /* FORWARDED: the replacement value */
  uint32_t stackrefs; /* copies of this object on the VM stack */
  uint32_t n, cap;
  uint32_t memo_slot; /* UINT32_MAX: not memoized */
  uint32_t gen;
  uint16_t depth;     /* nesting depth of the contents */
  uint8_t kind;
  uint8_t flags;
} msnap_pobj_t;

/* Object flag: a list whose items are REC values with consecutive indices
 * is kept as a range (items NULL, first item in fwd): a million trace
 * entries then cost no item array. */
#define MSNAP_POBJF_RANGE 4u

/* Item i of a container (works for ranges). */
static inline msnap_pv_t msnap__pobj_item(const msnap_pobj_t *o, uint32_t i) {
  return (o->flags & MSNAP_POBJF_RANGE) ? o->fwd + ((uint64_t)i << 3)
                                        : o->items[i];
}

/* Integer classification of a value (msnap__pvm_int). */
typedef enum msnap_pint_e {
  MSNAP_PINT_NOT_INT = 0,
  MSNAP_PINT_I64,  /* *i valid                                   */
  MSNAP_PINT_U64,  /* *u valid, value in [2^63, 2^64)            */
  MSNAP_PINT_BIG   /* does not fit 64 bits (kept as bytes)       */
} msnap_pint_t;

/* The items of a finished container as a consumer sees them: an array,
 * or (a list kept as a range) consecutive REC values from `first`. */
typedef struct msnap_pitems_s {
  const msnap_pv_t *v;
  msnap_pv_t first;
  uint32_t n;
  bool range;
} msnap_pitems_t;
static inline msnap_pv_t msnap__pitem(const msnap_pitems_t *it, uint32_t i) {
  return it->range ? it->first + ((uint64_t)i << 3) : it->v[i];
}

struct msnap_pvm_s;
typedef struct msnap_pvm_s msnap_pvm_t;
/* Called when a container of `kind` (msnap_pobj_kind_t) with these items
 * is stored into another container or becomes the result.  It may set
 * *out (0 on entry) to a value that replaces the container (the VM then
 * frees it and points its memo slot at *out).  Returns 0 or an error set
 * with msnap__pvm_fail.  It must be a function of the items alone: the
 * fast path (below) calls it for the same containers in the same order
 * as the generic interpreter would. */
typedef int (*msnap_pvm_complete_cb)(void *ctx, msnap_pvm_t *vm,
                                     unsigned kind,
                                     const msnap_pitems_t *items,
                                     msnap_pv_t *out);

/*
 * The fast path.  At a MARK over a list whose next opcode starts a dict,
 * the VM tries to decode the whole APPENDS batch in one go: dicts, lists
 * and (int, int) tuples nested up to MSNAP_PVM_FAST_DEPTH levels, whose
 * leaves are ints, floats, None, bools, strings and memo references to
 * non-containers -- the shape of every trace entry, frame, block and
 * segment.  Each container is handed to the complete callback when it
 * closes, and must come back as a record; the records are appended to the
 * list.  Anything else (an opcode outside that subset, a container the
 * consumer keeps generic, a memo reference to an open container, an
 * error) rolls the batch back -- the VM's memo writes and, through the
 * checkpoint hooks, what the consumer appended -- and the generic
 * interpreter executes the same bytes.  Conversions happen in the same
 * order either way, so the model is the same (tests compare both).  Not
 * tried within MSNAP_PVM_FAST_DEPTH + 2 MARKs of MSNAP_PICKLE_MAX_DEPTH,
 * where the generic interpreter's refusal of a MARK inside the batch
 * decides.  The checkpoint also keeps whether a conversion failed (how a
 * failed read is worded depends on it).
 */
#define MSNAP_PVM_FAST_DEPTH 8
#define MSNAP_PVM_SAVE_WORDS 13
void msnap__pvm_set_checkpoint(
    msnap_pvm_t *vm, void (*save)(void *ctx, uint64_t st[MSNAP_PVM_SAVE_WORDS]),
    void (*restore)(void *ctx, const uint64_t st[MSNAP_PVM_SAVE_WORDS]));
/*
 * Lists of memo references (optional).  Most of a snapshot's bytes are
 * lists whose items are memo references to records of one kind (a frame
 * list: a BINGET of a frame record per item).  When the fast path opens
 * a list whose one MARK ... APPENDS batch starts with a memo reference,
 * it hands the references to `scan` instead of collecting their values:
 * scan reads them (msnap__pref_next), checks each value and encodes it
 * where it likes, stops at the first reference it does not take (or at
 * any other opcode) with *q there, and returns how many it took.  When
 * the list ends right after them (APPENDS, no further batch), the VM
 * calls `close` for the record the complete callback would give for
 * the same items (0: none, and the items are collected as usual);
 * otherwise the scan is forgotten and the list is read item by item.
 * So scan must take only values whose list the complete callback turns
 * into exactly close's record.
 */
typedef struct msnap_pvm_refs_s {
  uint32_t (*scan)(void *ctx, const msnap_pv_t *memo, uint32_t memo_len,
                   const unsigned char **q, const unsigned char *end);
  msnap_pv_t (*close)(void *ctx, uint32_t n);
} msnap_pvm_refs_t;
void msnap__pvm_set_refs(msnap_pvm_t *vm, const msnap_pvm_refs_t *refs);
/*
 * Dicts of a known shape (optional).  When the fast path opens a dict
 * whose body starts with MARK, it first offers the body to `scan` (*q at
 * the MARK, memo / memo_len the memo as it stands).  scan either reads
 * the whole body -- MARK key value ... SETITEMS, one batch -- itself and
 * returns 1 with *out the record and *q past SETITEMS, or returns 0
 * having changed nothing (the VM then reads the dict item by item), or
 * -1 when it failed after a change (out of memory: the batch is rolled
 * back).  It must give exactly the record, and make exactly the
 * conversions in the same order, that the complete callback would for
 * the same items; a put inside the body goes through msnap__pvm_put_peek
 * (before any conversion: is there one, and is its slot free) and
 * msnap__pvm_put (the write, logged for rollback).  So scan takes only
 * shapes it reads in full -- a trace entry's memo references, ints and
 * frame list -- and leaves the rest to the VM.
 */
typedef struct msnap_pvm_dicts_s {
  int (*scan)(void *ctx, msnap_pvm_t *vm, const msnap_pv_t *memo,
              uint32_t memo_len, const unsigned char **q,
              const unsigned char *end, msnap_pv_t *out);
} msnap_pvm_dicts_t;
void msnap__pvm_set_dicts(msnap_pvm_t *vm, const msnap_pvm_dicts_t *dicts);
/* The put (MEMOIZE / BINPUT / LONG_BINPUT) at q, after `pending` puts
 * the scan has peeked and not yet made (each into a free slot): 1 with
 * its slot and *w its width in bytes when the slot is free (past
 * memo_len or a hole, and within the VM's bounds; the scan checks it
 * against its pending ones), 0 when q holds no put (*w = 0), -1 when the
 * put is one a scan must leave to the VM. */
int msnap__pvm_put_peek(const msnap_pvm_t *vm, const unsigned char *q,
                        const unsigned char *end, uint32_t pending,
                        uint32_t *slot, size_t *w);
/* Write v to a slot msnap__pvm_put_peek gave for the put at `at`, logged
 * for rollback.  false: out of memory. */
bool msnap__pvm_put(msnap_pvm_t *vm, uint32_t slot, msnap_pv_t v,
                    const unsigned char *at);
/* The memo reference (BINGET / LONG_BINGET) at *q, when at least one
 * byte follows it and its slot is below memo_len: *v its slot's value,
 * *q past it; false (nothing changed) otherwise. */
static inline bool msnap__pref_next(const unsigned char **q,
                                    const unsigned char *end,
                                    const msnap_pv_t *memo,
                                    uint32_t memo_len, msnap_pv_t *v) {
  const unsigned char *p = *q;
  uint64_t idx;
  if (end - p >= 3 && p[0] == MSNAP_OP_BINGET) {
    idx = p[1];
    p += 2;
  } else if (end - p >= 6 && p[0] == MSNAP_OP_LONG_BINGET) {
    idx = (uint64_t)p[1] | (uint64_t)p[2] << 8 | (uint64_t)p[3] << 16 |
          (uint64_t)p[4] << 24;
    p += 5;
  } else {
    return false;
  }
  if (idx >= memo_len) return false;
  *v = memo[idx];
  *q = p;
  return true;
}
/* The int token at q with `avail` bytes from q on: BININT1, BININT2,
 * BININT, or LONG1 of at most 8 bytes (CPython's pickle writes an int
 * of -2^63..2^64 this way at protocol >= 2).  Its width in bytes, with
 * *x its value as int64 (LONG1's two's complement, sign-extended); 0
 * when q holds another token or the token is cut short.  The one
 * decoder of these tokens: the fast path's scalars (pickle_read.c) and
 * the trace-entry scan (snapshot_read.c) both read ints through it. */
static inline size_t msnap__pint_token(const unsigned char *q, size_t avail,
                                       int64_t *x) {
  if (avail < 2) return 0;
  switch (q[0]) {
  case MSNAP_OP_BININT1:
    *x = q[1];
    return 2;
  case MSNAP_OP_BININT2:
    if (avail < 3) return 0;
    *x = (int64_t)((uint32_t)q[1] | (uint32_t)q[2] << 8);
    return 3;
  case MSNAP_OP_BININT:
    if (avail < 5) return 0;
    *x = (int32_t)((uint32_t)q[1] | (uint32_t)q[2] << 8 |
                   (uint32_t)q[3] << 16 | (uint32_t)q[4] << 24);
    return 5;
  case MSNAP_OP_LONG1: {
    size_t n = q[1];
    if (n > 8 || avail < 2 + n) return 0;
    const unsigned char *b = q + 2;
    uint64_t u = 0;
    if (avail >= 10) {
      /* one 8-byte load, the bytes past the int masked off */
      u = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 |
          (uint64_t)b[3] << 24 | (uint64_t)b[4] << 32 |
          (uint64_t)b[5] << 40 | (uint64_t)b[6] << 48 |
          (uint64_t)b[7] << 56;
      u = n == 8 ? u : n ? u & ((1ull << (8 * n)) - 1) : 0;
    } else {
      for (size_t i = 0; i < n; i++) u |= (uint64_t)b[i] << (8 * i);
    }
    if (n && n < 8 && (b[n - 1] & 0x80)) u |= ~0ull << (8 * n);
    *x = (int64_t)u;
    return 2 + n;
  }
  default:
    return 0;
  }
}
/* Tests: false runs the generic interpreter only. */
void msnap__pvm_set_fast(msnap_pvm_t *vm, bool on);
/* Batches the fast path decoded, and rolled back, so far. */
void msnap__pvm_fast_stats(const msnap_pvm_t *vm, uint64_t *done,
                           uint64_t *rolled_back);

#define MSNAP_PICKLE_MAX_DEPTH 1000
/* Items on the VM stack, all MARK levels together (MSNAP_ELIMIT beyond).
 * Picklers batch lists, dicts and sets by 1000 items per MARK (CPython,
 * torch, memsnap's writer), so a real pickle holds about 1000 items per
 * nesting level; only a tuple is written whole.  2^20 items (8 MiB) is
 * 1000x that, and keeps `( K\x01 K\x01 ...` from costing 16 bytes of
 * memory per 2 bytes of input without end. */
#define MSNAP_PICKLE_MAX_STACK (1u << 20)
/* Live containers (the VM's object pool, 40 bytes a slot plus items):
 * MSNAP_PICKLE_POOL_FREE, then one more per MSNAP_PICKLE_POOL_BYTES bytes
 * of input read (MSNAP_ELIMIT beyond): at most 5 bytes of pool per input
 * byte, where `]0` repeated would cost 20 (a slot is 40 bytes). */
#define MSNAP_PICKLE_POOL_FREE (1u << 16)
#define MSNAP_PICKLE_POOL_BYTES 8u
/* Generic values (msnap__pvm_to_gv: allocator_settings, process_info),
 * all together: one per byte of input, at least MSNAP_PICKLE_GV_MIN, at
 * most MSNAP_PICKLE_GV_MAX (MSNAP_ELIMIT beyond).  A value is 24 bytes.
 * The items held by the VM's live containers, all together, have the same
 * bound (per byte of input read so far), checked as a container grows;
 * boxed numbers (floats, ints outside the inline 61 bits), which live as
 * long as the VM, count in it by their bytes (3 items for a box, plus the
 * bytes of an int wider than 64 bits), checked as each is made. */
#define MSNAP_PICKLE_GV_MIN (1u << 16)
#define MSNAP_PICKLE_GV_MAX (1u << 24)
/* The strings of generic values, all together, by their bytes: a pickle
 * stores a string once and refers to it through the memo as often as it
 * likes (a list of 100 000 references to one 1 MiB string is 1.2 MB), and
 * every consumer of a generic value -- summary's text and JSON, view,
 * convert --json -- writes each reference in full.  At most
 * MSNAP_PICKLE_GV_STR_RATIO times the input read so far plus
 * MSNAP_PICKLE_GV_STR_SLACK bytes (MSNAP_ELIMIT beyond): a string referred
 * to once costs its own bytes of input. */
#define MSNAP_PICKLE_GV_STR_RATIO 16u
#define MSNAP_PICKLE_GV_STR_SLACK ((uint64_t)64 << 20)

msnap_pvm_t *msnap__pvm_new(msnap_snap_t *strings, msnap_pvm_complete_cb cb,
                            void *ctx);
void msnap__pvm_free(msnap_pvm_t *vm);
/* Run the pickle of src up to STOP; *result gets the root value.
 * Errors: MSNAP_EFORMAT, MSNAP_EUNSAFE, MSNAP_ELIMIT, MSNAP_ENOMEM (and
 * the source's MSNAP_EIO) with err filled ("offset N: <what> (while
 * <phase>)").  Consumed pages of a mapped source are dropped as it goes
 * (msnap__source_progress). */
int msnap__pvm_run_source(msnap_pvm_t *vm, msnap_source_t *src,
                          msnap_pv_t *result, msnap_read_error_t *err);
/* The same over buf[0..len). */
int msnap__pvm_run(msnap_pvm_t *vm, const unsigned char *buf, size_t len,
                   msnap_pv_t *result, msnap_read_error_t *err);
/* How every error message of an early end of the input begins (then what
 * was missing): the bytes before it were a pickle, cut short. */
#define MSNAP_PICKLE_TRUNCATED \
  "the pickle is truncated (the input ends early): "
/* Stream offset of the opcode being executed (of STOP after a run). */
uint64_t msnap__pvm_offset(const msnap_pvm_t *vm);
/* After a run refused an opcode that imports or calls (MSNAP_EUNSAFE):
 * whether the input is a protocol-0 (text) pickle that goes on to STOP,
 * so a whole pickle, whatever its first bytes look like. */
bool msnap__pvm_refused_text_pickle(const msnap_pvm_t *vm);
/* Record an error at the current opcode; returns rc. */
int msnap__pvm_fail(msnap_pvm_t *vm, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Phase text used in error messages ("converting a trace entry"). */
void msnap__pvm_set_phase(msnap_pvm_t *vm, const char *phase);
/* The object of an OBJ value, NULL if v is not a live container. */
msnap_pobj_t *msnap__pvm_obj(msnap_pvm_t *vm, msnap_pv_t v);
/* Replace a container by v everywhere the VM can see it (its memo slot)
 * and free it. */
void msnap__pvm_replace(msnap_pvm_t *vm, msnap_pv_t obj, msnap_pv_t v);
msnap_pint_t msnap__pvm_int(const msnap_pvm_t *vm, msnap_pv_t v, int64_t *i,
                            uint64_t *u);
/* True (and *f set) for a float; ints are not converted. */
bool msnap__pvm_float(const msnap_pvm_t *vm, msnap_pv_t v, double *f);
/* Python type name of a value for messages ("str", "dict"...). */
const char *msnap__pvm_type(const msnap_pvm_t *vm, msnap_pv_t v);
/* Convert a value into a generic tree; MSNAP_EFORMAT for values the tree
 * cannot hold (bytes, sets, big ints).  REC values go through the hook set
 * with msnap__pvm_set_rec_gv (error without one). */
void msnap__pvm_set_rec_gv(msnap_pvm_t *vm,
                           int (*cb)(void *ctx, msnap_pv_t v,
                                     msnap_gv_t *out));
int msnap__pvm_to_gv(msnap_pvm_t *vm, msnap_pv_t v, msnap_gv_t *out);

/* ---- identify.c: what a file is when it is not a snapshot ------------------ */
/* From the first bytes, before parsing: zip (torch.save), legacy
 * torch.save, xz/bzip2/lz4, ELF, PNG, PDF, HTML, SVG/XML, JSON.  Fills out
 * with "not a pickle: this is ..." and *at with the offset meant. */
bool msnap__identify_head(const unsigned char *p, size_t n, char *out,
                          size_t len, size_t *at);
/* After an early reader failure: text ("this looks like a text file (it
 * begins "...")"). */
bool msnap__identify_text(const unsigned char *p, size_t n, char *out,
                          size_t len);

/* The little-endian two's-complement bytes of an integer classified
 * MSNAP_PINT_BIG (NULL for other values). */
const unsigned char *msnap__pvm_big(const msnap_pvm_t *vm, msnap_pv_t v,
                                    size_t *len);
/* The string table of the VM (strings, bytes and bytearrays are ids in
 * it, read with msnap__snap_str). */
const msnap_snap_t *msnap__pvm_strings(const msnap_pvm_t *vm);

#endif /* MSNAP_PICKLE_H */
