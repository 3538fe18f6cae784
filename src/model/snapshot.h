/*
 * snapshot.h -- the snapshot model: one in-memory form for every generation
 * of PyTorch's snapshot format (2.0 per-block `history`, 2.1, 2.6, newest,
 * and a bare list of segments from memory_snapshot()) and for live
 * snapshots of a msnap_allocator_t.
 *
 * Who uses it:
 *   - api/snapshot.c fills it from a live allocator (under the device lock
 *     for segments, copying the history ring), then serializes it outside
 *     the lock;
 *   - snapshot_read.c fills it from a pickle file (any generation);
 *   - snapshot_write.c writes it as a pickle (protocol 4, MemoryViz opcode
 *     subset) or JSON, keeping exactly the keys the source had;
 *   - the memsnap CLI (check, summary, diff, replay, view, convert) reads it.
 *
 * Invariants (checked by msnap__snap_check_model):
 *   - Every string id is 0 (= key absent) or < nstrings; string 1 is "".
 *   - Strings interned as text are valid UTF-8 (msnap__snap_intern
 *     repairs them), so every pickle and JSON written from the model
 *     decodes; only pickle bytes objects (never part of a snapshot)
 *     are kept raw.
 *   - Every stack id is 0 (= key absent), 1 (= empty list []), or <
 *     nstacks; a stack is n frame ids, each < nframes, encoded in
 *     stack_bytes (msnap_stackspan_t; read with msnap__stack_iter).
 *   - Every trace entry's attr is < ntattrs; tattrs[0] is all zero.
 *   - segments[i].first_block + nblocks <= nblocks (total); blocks of a
 *     segment are consecutive in `blocks`.
 *   - device_traces has ndevices lists (ndevices may be 0 for a bare list),
 *     ndevices <= MSNAP_SNAP_MAX_DEVICES; segment devices are in
 *     [0, MSNAP_SNAP_MAX_DEVICES) (host segments: also -1).
 * The model does NOT assume the file was consistent: checking sums,
 * contiguity and ordering is the CLI's `check` job, which reports where.
 *
 * Memory: every record is a fixed-size struct (a trace entry 32 bytes);
 * strings, frames, stacks and trace entry attributes are interned once
 * (xxHash), a stack costs about a byte per frame, so a file with shared
 * frames costs little more than its distinct frames.
 */
#ifndef MSNAP_SNAPSHOT_H
#define MSNAP_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap.h"

typedef uint32_t msnap_str_t;   /* 0: absent; 1: "" */

/* Device indices a model holds: segments 0..MSNAP_SNAP_MAX_DEVICES - 1
 * (host segments and annotations also -1); the reader refuses others, so
 * every command validates devices the same way and nothing sized by a
 * device index can grow beyond this. */
#define MSNAP_SNAP_MAX_DEVICES 65536
typedef uint32_t msnap_stack_t; /* 0: absent (no key); 1: [] */

#define MSNAP_STR_ABSENT 0u
#define MSNAP_STR_EMPTY 1u
#define MSNAP_STACK_ABSENT 0u
#define MSNAP_STACK_EMPTY 1u

typedef struct msnap_frame_s {
  msnap_str_t name, filename;
  int64_t line;
  /* Optional FX-augmentation keys (0 = absent). */
  msnap_str_t fx_node_op, fx_node_name, fx_node_target, fx_original_trace;
  /* MSNAP_FRAME_NO_*: keys the source's frame dict did not have (name
   * and filename are then "", line 0); 0 for every frame PyTorch writes,
   * so frames built in memory (zeroed) have all three. */
  uint8_t absent;
} msnap_frame_t;

enum {
  MSNAP_FRAME_NO_NAME = 1u << 0,
  MSNAP_FRAME_NO_FILENAME = 1u << 1,
  MSNAP_FRAME_NO_LINE = 1u << 2
};

typedef struct msnap_span_s {
  uint32_t first, n;
} msnap_span_t;

/* A stack: n frame ids stored at stack_bytes + off (up to the next
 * stack's off, or nstack_bytes for the last), each
 * the LEB128 varint of the zigzag difference to the previous id (the
 * first: to 0).  Frames of a stack are mostly interned together, so most
 * differences take one byte: a stack costs about a byte per frame. */
typedef struct msnap_stackspan_s {
  uint64_t off : 40; /* stacks are appended: the next one's off ends it */
  uint64_t n : 24;
} msnap_stackspan_t;
#define MSNAP_STACK_MAX_FRAMES ((1u << 24) - 1)

enum msnap_block_state_e {
  MSNAP_BLOCK_INACTIVE = 0,
  MSNAP_BLOCK_ACTIVE_ALLOCATED = 1,
  MSNAP_BLOCK_ACTIVE_PENDING_FREE = 2,
  MSNAP_BLOCK_UNKNOWN_STATE = 3 /* state string kept in state_str */
};

/* Key-presence bits, so a rewrite keeps exactly the keys of the source. */
enum {
  MSNAP_K_ADDRESS = 1u << 0,        /* block address (absent in 2.0)    */
  MSNAP_K_REQUESTED = 1u << 1,      /* requested_size                    */
  MSNAP_K_FRAMES = 1u << 2,         /* frames                            */
  MSNAP_K_POOL_ID = 1u << 3,        /* segment_pool_id / pool_id         */
  MSNAP_K_EXPANDABLE = 1u << 4,     /* is_expandable                     */
  MSNAP_K_TIME = 1u << 5,           /* time_us                           */
  MSNAP_K_COMPILE_CTX = 1u << 6,    /* compile_context                   */
  MSNAP_K_USER_META = 1u << 7,      /* user_metadata                     */
  MSNAP_K_HISTORY = 1u << 8,        /* 2.0 block `history`               */
  MSNAP_K_FORWARD = 1u << 9,        /* forward_frames                    */
  MSNAP_K_DEVICE_FREE = 1u << 10,   /* oom entry: device_free not addr   */
  MSNAP_K_STREAM = 1u << 11,
  MSNAP_K_SEGMENT_TYPE = 1u << 12,
  MSNAP_K_INTERNAL_META = 1u << 13,
  MSNAP_K_FRAMES_LAST = 1u << 14,   /* segment: `frames` after `blocks`  */
  MSNAP_K_SIZE = 1u << 15,          /* trace entry: `size` (read files)  */
  /* segment: `requested_size` (read files; bit 0 is a block's address) */
  MSNAP_K_SEG_REQUESTED_SIZE = 1u << 0,
  /* external annotation: `name`, `device` (read files; its `time_us` is
   * MSNAP_K_TIME) */
  MSNAP_K_ANNOT_NAME = 1u << 0,
  MSNAP_K_ANNOT_DEVICE = 1u << 1
};
/* The keys PyTorch writes in every external annotation (with `stage`). */
#define MSNAP_ANNOT_KEYS                                                      \
  (MSNAP_K_ANNOT_NAME | MSNAP_K_ANNOT_DEVICE | MSNAP_K_TIME)
/* Notes on the bits (added by the pickle helper):
 *   - segments: MSNAP_K_REQUESTED stands for the three sums
 *     allocated_size/active_size/requested_size, and in a model read from
 *     a file requested_size is written only with
 *     MSNAP_K_SEG_REQUESTED_SIZE (a hand-made or old file may have the
 *     other two alone); device, address and total_size are always
 *     written.
 *   - annotations: MSNAP_K_ANNOT_NAME, MSNAP_K_ANNOT_DEVICE, MSNAP_K_TIME;
 *     stage is always written.  2.0 history elements: MSNAP_K_ADDRESS =
 *     `addr` present; real_size is always written, frames when present.
 *   - trace entries: MSNAP_K_ADDRESS = `addr` present, MSNAP_K_DEVICE_FREE
 *     = `device_free` present, MSNAP_K_SIZE = `size` present; action is
 *     always written, and so is size for a model not produced by
 *     snapshot_read.c (msnap__snap_settle_keys sets the bit).
 *   - Models not produced by snapshot_read.c (live snapshots) with
 *     generation MSNAP_GEN_CURRENT are written with every key PyTorch
 *     writes (cuda-reference §2) whatever their bits say; if their top_keys
 *     is 0, all six top-level keys are written. */

typedef struct msnap_sblock_s {
  uint64_t address, size, requested_size;
  msnap_stack_t frames;
  uint32_t forward_frames; /* index into strlists, 0 = absent */
  msnap_span_t history;    /* 2.0: span of `histories`          */
  msnap_str_t state_str;   /* only for MSNAP_BLOCK_UNKNOWN_STATE  */
  uint16_t keys;           /* MSNAP_K_* present in the source    */
  uint8_t state;           /* enum msnap_block_state_e           */
} msnap_sblock_t;

/* 2.0 per-block history element {addr, real_size, frames}. */
typedef struct msnap_shistory_s {
  uint64_t addr, real_size;
  msnap_stack_t frames;
  uint16_t keys; /* MSNAP_K_ADDRESS when the source has `addr` */
} msnap_shistory_t;

typedef struct msnap_ssegment_s {
  int64_t device;
  uint64_t address, total_size, allocated_size, active_size, requested_size;
  int64_t stream;
  msnap_mempool_id_t pool_id;
  msnap_stack_t frames;
  uint32_t forward_frames;
  uint32_t first_block, nblocks;
  uint16_t keys;
  uint8_t is_large;      /* segment_type "large" */
  uint8_t is_expandable;
} msnap_ssegment_t;

#define MSNAP_ACTION_UNKNOWN 255 /* action string kept in action_str */

/*
 * What trace entries share: everything but addr, size, time_us, frames
 * and action.  Interned once per distinct combination (a recording has a
 * handful: streams x pools x metadata strings), so an entry is 32 bytes.
 */
typedef struct msnap_tattr_s {
  int64_t stream;
  msnap_mempool_id_t pool_id;
  uint32_t forward_frames;
  msnap_str_t compile_context, user_metadata, internal_metadata;
  msnap_str_t action_str; /* only for MSNAP_ACTION_UNKNOWN (e.g. legacy "free") */
  uint16_t keys;          /* MSNAP_K_* present in the source */
} msnap_tattr_t;

#define MSNAP_TATTR_MAX (1u << 24) /* distinct attribute sets per model */

typedef struct msnap_strace_s {
  uint64_t addr; /* device_free for oom entries (MSNAP_K_DEVICE_FREE) */
  uint64_t size;
  int64_t time_us;
  msnap_stack_t frames;
  uint32_t action : 8; /* msnap_action_t or MSNAP_ACTION_UNKNOWN */
  uint32_t attr : 24;  /* index into tattrs (0: no keys, all zero) */
} msnap_strace_t;

typedef struct msnap_sannotation_s {
  msnap_str_t name;
  int64_t device;
  int64_t time_us;
  uint8_t is_start; /* stage "START" / "END" */
  uint8_t keys;     /* MSNAP_K_ANNOT_NAME, _DEVICE, MSNAP_K_TIME present */
} msnap_sannotation_t;

typedef struct msnap_trace_list_s {
  msnap_strace_t *v;
  uint32_t n, cap;
} msnap_trace_list_t;

/* A generic value for the free-form parts (allocator_settings,
 * process_info): a small tree. */
typedef enum msnap_gv_kind_e {
  MSNAP_GV_NONE,
  MSNAP_GV_BOOL,
  MSNAP_GV_INT,
  MSNAP_GV_FLOAT,
  MSNAP_GV_STR,
  MSNAP_GV_LIST,
  MSNAP_GV_TUPLE,
  MSNAP_GV_DICT
} msnap_gv_kind_t;

typedef struct msnap_gv_s {
  msnap_gv_kind_t kind;
  union {
    bool b;
    int64_t i;
    double f;
    msnap_str_t s;
    struct {
      struct msnap_gv_s *items; /* dict: key,value,key,value... */
      uint32_t n;               /* number of items (dict: 2*pairs) */
    } seq;
  } u;
} msnap_gv_t;

typedef enum msnap_generation_e {
  MSNAP_GEN_SEGMENT_LIST = 0, /* bare list of segments (memory_snapshot()) */
  MSNAP_GEN_2_0 = 1,          /* blocks with `history`, no block address   */
  MSNAP_GEN_2_1 = 2,          /* device_traces, frames, no time_us         */
  MSNAP_GEN_2_2 = 3,          /* time_us                                   */
  MSNAP_GEN_2_6 = 4,          /* allocator_settings, external_annotations  */
  MSNAP_GEN_CURRENT = 5       /* compile_context, user_metadata, pool_id,  */
                              /* host_segments/host_traces                  */
} msnap_generation_t;

#define MSNAP_SNAP_DROPPED_NAMES 4 /* names kept in dropped_key */
/* The kind of record a dropped key was in (dropped_in). */
typedef enum msnap_dropped_in_e {
  MSNAP_DROPPED_IN_TRACE,      /* a trace entry              */
  MSNAP_DROPPED_IN_SEGMENT,    /* a segment                  */
  MSNAP_DROPPED_IN_BLOCK,      /* a block                    */
  MSNAP_DROPPED_IN_HISTORY,    /* a 2.0 block history element */
  MSNAP_DROPPED_IN_ANNOTATION, /* an external annotation     */
  MSNAP_DROPPED_IN_FRAME,      /* a frame                    */
  MSNAP_DROPPED_IN_TOP         /* the top-level dict         */
} msnap_dropped_in_t;

typedef struct msnap_snap_s {
  msnap_generation_t generation;
  uint32_t top_keys; /* MSNAP_TOP_* present */

  /* interned strings: offsets into one buffer */
  char *strbuf;
  size_t strbuf_len, strbuf_cap;
  uint64_t *str_off; /* str_off[id] = offset; length = next - off - 1 */
  uint32_t nstrings, str_cap;

  msnap_frame_t *frames;
  uint32_t nframes, frames_cap;
  unsigned char *stack_bytes; /* encoded frame ids (msnap_stackspan_t) */
  uint64_t nstack_bytes, stack_bytes_cap;
  msnap_stackspan_t *stacks;
  uint32_t nstacks, stacks_cap;
  msnap_span_t *strlists; /* forward_frames: spans of strlist_items */
  uint32_t nstrlists, strlists_cap;
  msnap_str_t *strlist_items;
  uint32_t nstrlist_items, strlist_items_cap;

  msnap_ssegment_t *segments;
  uint32_t nsegments, segments_cap;
  msnap_sblock_t *blocks;
  uint32_t nblocks, blocks_cap;
  msnap_shistory_t *histories;
  uint32_t nhistories, histories_cap;

  msnap_trace_list_t *device_traces;
  uint32_t ndevices;

  msnap_tattr_t *tattrs; /* trace entry attributes; [0] is all zero */
  uint32_t ntattrs, tattrs_cap;

  msnap_sannotation_t *annotations;
  uint32_t nannotations, annotations_cap;

  msnap_gv_t allocator_settings; /* MSNAP_GV_NONE if absent */
  /* memsnap's own top-level key `process_info` (absent in PyTorch's files;
   * memory_viz and torch's _memory_viz ignore it): a dict {pid, host,
   * rank, world_size, local_rank, runtime, profile, devices: [{device,
   * total_bytes}], memsnap_version}, each key only when known
   * (api/process.c).  MSNAP_GV_NONE if absent. */
  msnap_gv_t process_info;

  msnap_ssegment_t *host_segments; /* blocks in host_blocks */
  uint32_t nhost_segments, host_segments_cap;
  msnap_sblock_t *host_blocks;
  uint32_t nhost_blocks, host_blocks_cap;
  msnap_trace_list_t host_traces;

  /* Strings that were not valid UTF-8 when interned (repaired with
   * U+FFFD; msnap__snap_intern), the first of them (0: none). */
  uint64_t utf8_repaired;
  msnap_str_t utf8_example;

  /* Keys of records (trace entries, segments, blocks, 2.0 history
   * elements, annotations, frames, the top-level dict) that the model has
   * no place for (a
   * trace entry's `category`; `device_free` beside `addr`):
   * snapshot_read.c drops them, counting them here, with the first
   * distinct str keys' names (0: none) and the kind of record each was in
   * (msnap_dropped_in_t), so that a rewrite can say what it leaves out. */
  uint64_t keys_dropped;
  msnap_str_t dropped_key[MSNAP_SNAP_DROPPED_NAMES];
  uint8_t dropped_in[MSNAP_SNAP_DROPPED_NAMES];
  bool dropped_more; /* dropped keys beyond those named (or not str) */

  /* Read with msnap_read_stats_t.skip_stacks: every stack of the file
   * reads as empty, so the model is not the file's; the writers refuse
   * it. */
  bool stacks_skipped;

  /* private: intern hash tables, arenas */
  struct msnap_snap_priv_s *priv;
} msnap_snap_t;

enum {
  MSNAP_TOP_SEGMENTS = 1u << 0,
  MSNAP_TOP_DEVICE_TRACES = 1u << 1,
  MSNAP_TOP_ALLOCATOR_SETTINGS = 1u << 2,
  MSNAP_TOP_EXTERNAL_ANNOTATIONS = 1u << 3,
  MSNAP_TOP_HOST_SEGMENTS = 1u << 4,
  MSNAP_TOP_HOST_TRACES = 1u << 5,
  MSNAP_TOP_PROCESS_INFO = 1u << 6 /* memsnap's process_info          */
};

/* --- construction (snapshot.c) ----------------------------------------- */
msnap_snap_t *msnap__snap_new(void);
void msnap__snap_free(msnap_snap_t *s);
/* Intern text (not necessarily NUL-terminated) under the model's UTF-8
 * policy: bytes that are not valid UTF-8 (invalid bytes, cut sequences)
 * become U+FFFD, exactly as CPython's bytes.decode("utf-8", "replace"),
 * except that an encoded surrogate (a Python str's lone surrogate, pickled
 * with "surrogatepass") becomes one U+FFFD, one per code point; counted
 * in utf8_repaired.  0 on ENOMEM. */
msnap_str_t msnap__snap_intern(msnap_snap_t *s, const char *p, size_t len);
/* Intern bytes as they are (pickle bytes objects); 0 on ENOMEM. */
msnap_str_t msnap__snap_intern_bytes(msnap_snap_t *s, const char *p,
                                     size_t len);
/* True when p[0..len) is valid UTF-8 (no surrogates). */
bool msnap__utf8_valid(const char *p, size_t len);
const char *msnap__snap_str(const msnap_snap_t *s, msnap_str_t id,
                            size_t *len);
/* Intern a frame; returns its id or UINT32_MAX on ENOMEM. */
uint32_t msnap__snap_frame(msnap_snap_t *s, const msnap_frame_t *f);
/* Intern a stack of frame ids (innermost first); n == 0 gives
 * MSNAP_STACK_EMPTY; returns 0 on ENOMEM. */
msnap_stack_t msnap__snap_stack(msnap_snap_t *s, const uint32_t *frame_ids,
                                uint32_t n);
/* The same from the encoding (msnap_stackspan_t): a caller that has the
 * ids one by one writes them with msnap__stack_put into
 * msnap__snap_stack_buf(s, n) (room for n ids; NULL on ENOMEM). */
unsigned char *msnap__snap_stack_buf(msnap_snap_t *s, uint32_t n);
static inline unsigned char *msnap__stack_put(unsigned char *o, uint32_t prev,
                                              uint32_t id) {
  int64_t d = (int64_t)id - (int64_t)prev;
  uint64_t z = ((uint64_t)d << 1) ^ (uint64_t)(d >> 63);
  if (z < 0x80) { /* the common lengths without a loop */
    *o = (unsigned char)z;
    return o + 1;
  }
  if (z < 0x4000) {
    o[0] = (unsigned char)(z | 0x80);
    o[1] = (unsigned char)(z >> 7);
    return o + 2;
  }
  while (z >= 0x80) {
    *o++ = (unsigned char)(z | 0x80);
    z >>= 7;
  }
  *o++ = (unsigned char)z;
  return o;
}
/* msnap__stack_put without a branch on the usual lengths (ids a few
 * thousand apart encode in 1 or 2 bytes at random, which a branch
 * predicts badly): the same bytes, but it may write one byte past the
 * encoding it returns, so the buffer needs 5 bytes per id plus one
 * (msnap__snap_stack_buf's has 16 spare). */
static inline unsigned char *msnap__stack_put2(unsigned char *o, uint32_t prev,
                                               uint32_t id) {
  int64_t d = (int64_t)id - (int64_t)prev;
  uint64_t z = ((uint64_t)d << 1) ^ (uint64_t)(d >> 63);
  if (z < 0x4000) {
    unsigned two = z >= 0x80;
    o[0] = (unsigned char)(z | (two << 7));
    o[1] = (unsigned char)(z >> 7);
    return o + 1 + two;
  }
  return msnap__stack_put(o, prev, id);
}
msnap_stack_t msnap__snap_stack_encoded(msnap_snap_t *s,
                                        const unsigned char *enc, size_t nb,
                                        uint32_t n);
/* The reader's way: append without a lookup, then one pass at the end
 * gives equal stacks one id (and rewrites the model's stack ids). */
msnap_stack_t msnap__snap_stack_append(msnap_snap_t *s,
                                       const unsigned char *enc, size_t nb,
                                       uint32_t n);
/* The same without a copy: the encoding is written in place at the end
 * of stack_bytes -- msnap__snap_stack_tail(s, nb) gives room for nb bytes
 * there (NULL on ENOMEM or past 2^40 bytes; the pointer holds until the
 * next stack is added), msnap__snap_stack_append_tail makes the first nb
 * of them a stack of n frames.  Bytes written there and never appended
 * are ignored. */
unsigned char *msnap__snap_stack_tail(msnap_snap_t *s, size_t nb);
msnap_stack_t msnap__snap_stack_append_tail(msnap_snap_t *s, size_t nb,
                                            uint32_t n);
int msnap__snap_dedupe_stacks(msnap_snap_t *s);
uint32_t msnap__snap_strlist(msnap_snap_t *s, const msnap_str_t *items,
                             uint32_t n);
/* Append records; return a pointer to the zeroed new record or NULL. */
msnap_ssegment_t *msnap__snap_add_segment(msnap_snap_t *s);
msnap_sblock_t *msnap__snap_add_block(msnap_snap_t *s);
msnap_shistory_t *msnap__snap_add_history(msnap_snap_t *s);
int msnap__snap_set_devices(msnap_snap_t *s, uint32_t ndevices);
/* Append a zeroed entry (attr 0: no keys); set its attributes with
 * msnap__snap_trace_set_attr. */
msnap_strace_t *msnap__snap_add_trace(msnap_snap_t *s, msnap_trace_list_t *l);
/* Room for `extra` more entries in l (exactly), prefaulted: a writer that
 * knows its count up front adds them without reallocation or a page fault
 * per page -- through msnap__snap_add_trace, or as l->v[l->n++] with
 * every field written.  0 or MSNAP_ENOMEM. */
int msnap__snap_reserve_traces(msnap_snap_t *s, msnap_trace_list_t *l,
                               uint64_t extra);
/* Intern an attribute set: its index, or UINT32_MAX on ENOMEM or past
 * MSNAP_TATTR_MAX sets. */
uint32_t msnap__snap_tattr(msnap_snap_t *s, const msnap_tattr_t *a);
/* Give e the attributes *a (interned); 0 or MSNAP_ENOMEM/MSNAP_ELIMIT. */
int msnap__snap_trace_set_attr(msnap_snap_t *s, msnap_strace_t *e,
                               const msnap_tattr_t *a);
/* The attributes of a trace entry. */
static inline const msnap_tattr_t *msnap__tattr(const msnap_snap_t *s,
                                                const msnap_strace_t *e) {
  return &s->tattrs[e->attr];
}

/* ---- stacks ---------------------------------------------------------------- */
typedef struct msnap_stack_iter_s {
  const unsigned char *p;
  uint32_t left, prev;
} msnap_stack_iter_t;
/* Frames of stack st, innermost first: msnap__stack_next gives each id. */
static inline void msnap__stack_iter(const msnap_snap_t *s, msnap_stack_t st,
                                     msnap_stack_iter_t *it) {
  if (st >= s->nstacks) {
    it->p = NULL;
    it->left = it->prev = 0;
    return;
  }
  it->p = s->stack_bytes + s->stacks[st].off;
  it->left = (uint32_t)s->stacks[st].n;
  it->prev = 0;
}
static inline bool msnap__stack_next(msnap_stack_iter_t *it, uint32_t *id) {
  if (!it->left) return false;
  uint64_t z = 0;
  unsigned shift = 0;
  unsigned char b;
  do {
    b = *it->p++;
    z |= (uint64_t)(b & 0x7f) << shift;
    shift += 7;
  } while ((b & 0x80) && shift < 42);
  int64_t d = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
  it->prev = (uint32_t)((int64_t)it->prev + d);
  it->left--;
  *id = it->prev;
  return true;
}
/* Number of frames of stack st (0 for ids out of range). */
static inline uint32_t msnap__stack_len(const msnap_snap_t *s,
                                        msnap_stack_t st) {
  return st < s->nstacks ? (uint32_t)s->stacks[st].n : 0;
}
/* Decode up to cap frame ids of st into out; returns the stack's length. */
uint32_t msnap__stack_frames(const msnap_snap_t *s, msnap_stack_t st,
                             uint32_t *out, uint32_t cap);
msnap_sannotation_t *msnap__snap_add_annotation(msnap_snap_t *s);
void msnap__gv_free(msnap_gv_t *v);
/* Structural invariants of the model (see top of file). */
int msnap__snap_check_model(const msnap_snap_t *s, char *msg, size_t len);
/* The same; deep = false does not decode each stack's frame ids. */
int msnap__snap_check_model_level(const msnap_snap_t *s, bool deep, char *msg,
                                  size_t len);

/* --- reading (snapshot_read.c) ------------------------------------------ */
typedef struct msnap_read_error_s {
  uint64_t offset;  /* byte offset in the file            */
  char msg[512];    /* "offset N: <what> (while <phase>)" */
} msnap_read_error_t;
/* Read any generation.  MSNAP_EFORMAT / MSNAP_EUNSAFE / MSNAP_ELIMIT /
 * MSNAP_EIO with err filled. */
int msnap__snap_read_file(const char *path, msnap_snap_t **out,
                          msnap_read_error_t *err);
int msnap__snap_read_buffer(const void *buf, size_t len, msnap_snap_t **out,
                            msnap_read_error_t *err);
/* Options of a read (in) and its counts (out).  generic_only (tests and
 * benchmarks): the fast path off.  skip_stacks: frame lists are read and
 * checked as ever (the same errors for the same input) but not stored:
 * every `frames` reads as the empty stack, the model's stacks_skipped is
 * set and the writers refuse it (MSNAP_EINVAL).  For a consumer that
 * never looks at stacks (memsnap replay without -o): the file's stacks
 * are most of a big recording's model.  Out: how many APPENDS batches the
 * fast path decoded / rolled back, trace entries the entry scan read. */
typedef struct msnap_read_stats_s {
  bool generic_only;
  bool skip_stacks;
  uint64_t fast_batches, fast_rollbacks;
  uint64_t entries_scanned; /* trace entries read by the entry scan */
} msnap_read_stats_t;
int msnap__snap_read_buffer_ex(const void *buf, size_t len,
                               msnap_snap_t **out, msnap_read_error_t *err,
                               msnap_read_stats_t *stats);
/* msnap__snap_read_file with options and counts (stats may be NULL). */
int msnap__snap_read_file_ex(const char *path, msnap_snap_t **out,
                             msnap_read_error_t *err,
                             msnap_read_stats_t *stats);
/* From an open source (base/source.h); stats may be NULL. */
struct msnap_source_s;
int msnap__snap_read_source(struct msnap_source_s *src, msnap_snap_t **out,
                            msnap_read_error_t *err,
                            msnap_read_stats_t *stats);

/* --- writing (snapshot_write.c) ----------------------------------------- */
struct msnap_sink_s;
/* Pickle protocol 4, MemoryViz opcode subset, memo for repeated strings,
 * frames and stacks, streamed to the sink. */
int msnap__snap_write_pickle(const msnap_snap_t *s, struct msnap_sink_s *out);
/* JSON (frame_table / stack_table: each frame and stack once).
 * MSNAP_ELIMIT, nothing written, when the frames' strings (which JSON
 * writes in every frame) exceed 16x the bytes of all strings + 64 MiB. */
int msnap__snap_write_json(const msnap_snap_t *s, struct msnap_sink_s *out);
/* Turn a live model (not read from a file, generation CURRENT) into one
 * whose key bits say exactly what is written: every key a live model is
 * written with is set in its records' bits, which become authoritative
 * (as a model read from a file).  A caller can then clear the bits of
 * values it cannot vouch for (memsnap replay: time_us of a recording
 * without times, requested_size the recording does not give).  0, or
 * MSNAP_ENOMEM / MSNAP_ELIMIT (interning the entries' attribute sets). */
int msnap__snap_settle_keys(msnap_snap_t *s);
/* Tests: turn the pickle writer's trace-tail cache off (on by default) to
 * compare its output with the plain path's. */
void msnap__snap_write_tail_cache(bool on);
/* Write to path through a temporary file + rename. */
int msnap__snap_write_file(const msnap_snap_t *s, const char *path,
                           bool json);

#endif /* MSNAP_SNAPSHOT_H */
