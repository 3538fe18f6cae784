/*
 * snapshot_write.c -- write the snapshot model as a pickle (protocol 4,
 * MemoryViz opcode subset, pickle_write.c) or as JSON (same structure,
 * tuples as arrays, frames and stacks written once in two tables: see
 * wtables; through base/json.c), streamed to a sink.
 *
 * Keys: a model read from a file (msnap__snap_from_reader) is written with
 * exactly the keys its bits record (MSNAP_K_*, MSNAP_TOP_*), in PyTorch's
 * order for its generation (2.0 frames are filename/name/line; segments
 * whose source had `frames` after `blocks` keep that order), so a round
 * trip gives an equal Python object.  A live model (not from the reader)
 * of generation MSNAP_GEN_CURRENT is written with every key PyTorch writes
 * (cuda-reference §2.1-2.6; all six top-level keys when top_keys is 0).
 *
 * Memo (pickle only): key strings and constant values ("alloc",
 * "active_allocated"...) are written once and then fetched with BINGET;
 * every model string, frame dict and frame list likewise, so shared stacks
 * cost a 2-5 byte BINGET per use, as in PyTorch's own files.  Trace and
 * block dicts are not memoized (nothing refers to them twice).
 *
 * Lists are written as MARK ... APPENDS batches of 1000 items (APPEND for
 * a single item), dicts as MARK ... SETITEMS.
 *
 * Trace entries (pickle): the bytes of an entry from compile_context to
 * its SETITEMS depend only on its attribute set (compile_context,
 * user_metadata, internal_metadata, pool_id, forward_frames and which
 * keys it has: msnap_tattr_t) and its frames; once every object they name
 * is memoized, they are the same bytes each time (BINGETs).  A small
 * cache of those tails, keyed by (attribute id, frames), turns the
 * bulk of a million-entry trace into memcpy's, and the keys before them
 * (all memoized after the first entries) are encoded straight into the
 * frame; the output is byte for byte what the plain path writes
 * (tests/recorder/test_dump.c compares both).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/pickle.h"

#define CONST_LIST(X)                                                         \
  X(action, "action") X(addr, "addr") X(size, "size") X(stream, "stream")    \
  X(time_us, "time_us") X(frames, "frames")                                  \
  X(forward_frames, "forward_frames") X(compile_context, "compile_context")  \
  X(user_metadata, "user_metadata")                                          \
  X(internal_metadata, "internal_metadata") X(pool_id, "pool_id")            \
  X(device_free, "device_free") X(device, "device") X(address, "address")    \
  X(total_size, "total_size") X(allocated_size, "allocated_size")            \
  X(active_size, "active_size") X(requested_size, "requested_size")          \
  X(segment_type, "segment_type") X(segment_pool_id, "segment_pool_id")      \
  X(is_expandable, "is_expandable") X(blocks, "blocks") X(state, "state")    \
  X(history, "history") X(real_size, "real_size") X(name, "name")            \
  X(filename, "filename") X(line, "line") X(fx_node_op, "fx_node_op")        \
  X(fx_node_name, "fx_node_name") X(fx_node_target, "fx_node_target")        \
  X(fx_original_trace, "fx_original_trace") X(stage, "stage")                \
  X(segments, "segments") X(device_traces, "device_traces")                  \
  X(allocator_settings, "allocator_settings")                                \
  X(external_annotations, "external_annotations")                            \
  X(host_segments, "host_segments") X(host_traces, "host_traces")            \
  X(process_info, "process_info")                                            \
  X(v_large, "large") X(v_small, "small")                                    \
  X(v_active_allocated, "active_allocated")                                  \
  X(v_active_pending_free, "active_pending_free") X(v_inactive, "inactive")  \
  X(v_start, "START") X(v_end, "END") X(v_na, "N/A")                        \
  X(format, "format") X(frame_table, "frame_table")                          \
  X(stack_table, "stack_table")                                              \
  X(v_format, "memsnap snapshot JSON 1: every 'frames' value is an index "   \
              "into stack_table, whose items list indices into frame_table")

enum const_e {
#define CONST_ENUM_(id, text) C_##id,
  CONST_LIST(CONST_ENUM_)
#undef CONST_ENUM_
  C_ACTION0,
  NCONSTS = C_ACTION0 + MSNAP_ACTION_COUNT
};

static const char *const const_text[NCONSTS] = {
#define CONST_TEXT_(id, text) text,
    CONST_LIST(CONST_TEXT_)
#undef CONST_TEXT_
#define ACTION_TEXT_(name, text) text,
    MSNAP_ACTION_MAP(ACTION_TEXT_)
#undef ACTION_TEXT_
};

#define MAX_LEVELS 1100
#define NO_MEMO UINT32_MAX

typedef struct level_s {
  uint32_t count;
  uint8_t is_list;
} level_t;

/* The tail of a trace entry (see the top of the file). */
#define TAIL_SLOTS 512 /* direct-mapped by hash */
#define TAIL_MAX 64    /* longest tail kept     */
typedef struct tail_ent_s {
  uint64_t k; /* attribute set << 32 | frames */
  uint8_t len; /* 0: empty slot */
  unsigned char b[TAIL_MAX];
} tail_ent_t;

static _Atomic bool tail_cache_on = true;

void msnap__snap_write_tail_cache(bool on) {
  atomic_store_explicit(&tail_cache_on, on, memory_order_relaxed);
}

typedef struct wr_s {
  const msnap_snap_t *s;
  bool json;
  bool live; /* write every key (live model of generation CURRENT) */
  bool keyed; /* from the reader: `size` only when the source had it */
  msnap_pw_t pw;
  msnap_json_t jw; /* json */
  uint32_t const_memo[NCONSTS];
  uint32_t *str_memo, *frame_memo, *stack_memo;
  tail_ent_t *tails; /* pickle only, NULL: not cached (tests)  */
  level_t lv[MAX_LEVELS];
  int depth;
  bool tables; /* JSON: writing stack_table (frame lists, not ids) */
} wr_t;

static int werr(wr_t *w) {
  return w->json ? msnap__json_err(&w->jw) : w->pw.err;
}

/* ---- structure ----------------------------------------------------------- */

static int push_level(wr_t *w, bool is_list) {
  if (w->depth + 1 >= MAX_LEVELS) {
    if (w->json) {
      if (!w->jw.out->err) w->jw.out->err = MSNAP_ELIMIT;
    } else if (!w->pw.err) {
      w->pw.err = MSNAP_ELIMIT;
      snprintf(w->pw.msg, sizeof w->pw.msg, "value nested too deeply");
    }
    return MSNAP_ELIMIT;
  }
  w->depth++;
  w->lv[w->depth].count = 0;
  w->lv[w->depth].is_list = is_list;
  return 0;
}

static void dict_begin(wr_t *w) {
  if (w->json)
    msnap__json_obj(&w->jw);
  else {
    msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_DICT);
    msnap__pw_op(&w->pw, MSNAP_OP_MARK);
  }
  push_level(w, false);
}

static void dict_end(wr_t *w) {
  if (w->json)
    msnap__json_obj_end(&w->jw);
  else
    msnap__pw_op(&w->pw, MSNAP_OP_SETITEMS);
  w->depth--;
}

static void list_begin(wr_t *w) {
  if (w->json)
    msnap__json_arr(&w->jw);
  else
    msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_LIST);
  push_level(w, true);
}

/* Before each list item: MARK batches of 1000 (pickle; the JSON writer
 * places its commas itself). */
static void list_item(wr_t *w, uint32_t total) {
  level_t *l = &w->lv[w->depth];
  if (!w->json && l->count % 1000 == 0) {
    if (l->count) msnap__pw_op(&w->pw, MSNAP_OP_APPENDS);
    if (total - l->count > 1) msnap__pw_op(&w->pw, MSNAP_OP_MARK);
  }
  l->count++;
}

static void list_end(wr_t *w, uint32_t total) {
  level_t *l = &w->lv[w->depth];
  if (w->json)
    msnap__json_arr_end(&w->jw);
  else if (l->count) {
    /* the last batch: APPENDS after a MARK, APPEND for a single item */
    uint32_t last = l->count % 1000 ? l->count % 1000 : 1000;
    msnap__pw_op(&w->pw, last > 1 || total - (l->count - last) > 1
                             ? MSNAP_OP_APPENDS
                             : MSNAP_OP_APPEND);
  }
  w->depth--;
}

/* Write a constant string (key or value), memoized after first use. */
static void cstr_slow(wr_t *w, int c) {
  if (w->json) {
    msnap__json_cstr(&w->jw, const_text[c]);
    return;
  }
  msnap__pw_str(&w->pw, const_text[c], strlen(const_text[c]));
  w->const_memo[c] = msnap__pw_memoize(&w->pw);
}

static inline void cstr(wr_t *w, int c) {
  if (msnap_likely(!w->json && w->const_memo[c] != NO_MEMO))
    msnap__pw_get(&w->pw, w->const_memo[c]);
  else
    cstr_slow(w, c);
}

static inline void key(wr_t *w, int c) {
  if (w->json) {
    msnap__json_ckey(&w->jw, const_text[c]);
  } else {
    cstr(w, c);
  }
}

static void mstr(wr_t *w, msnap_str_t id) {
  size_t n;
  const char *p = msnap__snap_str(w->s, id, &n);
  if (w->json) {
    msnap__json_str(&w->jw, p, n);
    return;
  }
  if (id < w->s->nstrings && w->str_memo[id] != NO_MEMO) {
    msnap__pw_get(&w->pw, w->str_memo[id]);
    return;
  }
  msnap__pw_str(&w->pw, p, n);
  uint32_t m = msnap__pw_memoize(&w->pw);
  if (id < w->s->nstrings) w->str_memo[id] = m;
}

/* A model string, or a default constant when the id is 0 (absent). */
static void mstr_or(wr_t *w, msnap_str_t id, int dflt) {
  if (id == MSNAP_STR_ABSENT)
    cstr(w, dflt);
  else
    mstr(w, id);
}

static inline void wi64(wr_t *w, int64_t v) {
  if (w->json)
    msnap__json_i64(&w->jw, v);
  else
    msnap__pw_int(&w->pw, v);
}

static inline void wu64(wr_t *w, uint64_t v, const char *what) {
  if (w->json)
    msnap__json_u64(&w->jw, v);
  else if (msnap_likely(v <= (uint64_t)INT64_MAX))
    msnap__pw_int(&w->pw, (int64_t)v);
  else
    msnap__pw_uint(&w->pw, v, what); /* refuses it */
}

static void wbool(wr_t *w, bool v) {
  if (w->json)
    msnap__json_bool(&w->jw, v);
  else
    msnap__pw_bool(&w->pw, v);
}

static void wfloat(wr_t *w, double v) {
  if (w->json)
    msnap__json_dbl(&w->jw, v);
  else
    msnap__pw_float(&w->pw, v);
}

static void wpair(wr_t *w, msnap_mempool_id_t p) {
  if (w->json) {
    msnap__json_arr(&w->jw);
    wu64(w, p.first, "pool id");
    wu64(w, p.second, "pool id");
    msnap__json_arr_end(&w->jw);
  } else {
    msnap__pw_uint(&w->pw, p.first, "pool id");
    msnap__pw_uint(&w->pw, p.second, "pool id");
    msnap__pw_op(&w->pw, MSNAP_OP_TUPLE2);
  }
}

/*
 * A frame dict (memoized: written once, then BINGET).  2.0 models keep
 * the filename/name/line key order of that generation; a key the source's
 * frame did not have (msnap_frame_t.absent) is left out.
 */
static void wframe(wr_t *w, uint32_t fid) {
  const msnap_frame_t *f = &w->s->frames[fid];
  if (!w->json && w->frame_memo[fid] != NO_MEMO) {
    msnap__pw_get(&w->pw, w->frame_memo[fid]);
    return;
  }
  if (w->json) {
    msnap__json_obj(&w->jw);
    push_level(w, false);
  } else {
    msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_DICT);
    w->frame_memo[fid] = msnap__pw_memoize(&w->pw);
    msnap__pw_op(&w->pw, MSNAP_OP_MARK);
    push_level(w, false);
  }
  bool name = !(f->absent & MSNAP_FRAME_NO_NAME);
  bool filename = !(f->absent & MSNAP_FRAME_NO_FILENAME);
  if (w->s->generation == MSNAP_GEN_2_0) {
    if (filename) key(w, C_filename), mstr_or(w, f->filename, C_v_na);
    if (name) key(w, C_name), mstr_or(w, f->name, C_v_na);
  } else {
    if (name) key(w, C_name), mstr_or(w, f->name, C_v_na);
    if (filename) key(w, C_filename), mstr_or(w, f->filename, C_v_na);
  }
  if (!(f->absent & MSNAP_FRAME_NO_LINE)) key(w, C_line), wi64(w, f->line);
  if (f->fx_node_op) key(w, C_fx_node_op), mstr(w, f->fx_node_op);
  if (f->fx_node_name) key(w, C_fx_node_name), mstr(w, f->fx_node_name);
  if (f->fx_node_target) key(w, C_fx_node_target), mstr(w, f->fx_node_target);
  if (f->fx_original_trace)
    key(w, C_fx_original_trace), mstr(w, f->fx_original_trace);
  dict_end(w);
}

/*
 * A frame list (memoized when non-empty); [] for MSNAP_STACK_EMPTY.
 */
static void wstack(wr_t *w, msnap_stack_t id) {
  if (id >= w->s->nstacks) id = MSNAP_STACK_EMPTY;
  if (w->json && !w->tables) {
    /* JSON: an index into stack_table (wtables) */
    wu64(w, id, "stack id");
    return;
  }
  uint32_t n = msnap__stack_len(w->s, id);
  if (!w->json) {
    if (w->stack_memo[id] != NO_MEMO) {
      msnap__pw_get(&w->pw, w->stack_memo[id]);
      return;
    }
    msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_LIST);
    if (n) w->stack_memo[id] = msnap__pw_memoize(&w->pw);
    push_level(w, true);
  } else {
    list_begin(w);
  }
  msnap_stack_iter_t it;
  msnap__stack_iter(w->s, id, &it);
  uint32_t f;
  while (msnap__stack_next(&it, &f)) {
    list_item(w, n);
    if (w->json)
      wu64(w, f, "frame id");
    else
      wframe(w, f);
  }
  list_end(w, n);
}

/*
 * JSON has no memo: frames and stacks are written once, in two tables at
 * the top (frame_table: frame dicts by frame id; stack_table: lists of
 * frame ids by stack id, 0 and 1 being []), and every `frames` value is a
 * stack id.  So a stack shared by a million entries costs one number per
 * entry, as its BINGET does in the pickle: the output stays proportional
 * to the input.
 */
static void wtables(wr_t *w) {
  const msnap_snap_t *s = w->s;
  key(w, C_format);
  cstr(w, C_v_format);
  key(w, C_frame_table);
  list_begin(w);
  for (uint32_t i = 0; i < s->nframes && !werr(w); i++) {
    list_item(w, s->nframes);
    wframe(w, i);
  }
  list_end(w, s->nframes);
  key(w, C_stack_table);
  list_begin(w);
  w->tables = true;
  for (uint32_t i = 0; i < s->nstacks && !werr(w); i++) {
    list_item(w, s->nstacks);
    wstack(w, i);
  }
  w->tables = false;
  list_end(w, s->nstacks);
}

static void wstrlist(wr_t *w, uint32_t id) {
  msnap_span_t sp = id < w->s->nstrlists ? w->s->strlists[id]
                                         : (msnap_span_t){0, 0};
  list_begin(w);
  for (uint32_t i = 0; i < sp.n; i++) {
    list_item(w, sp.n);
    mstr(w, w->s->strlist_items[sp.first + i]);
  }
  list_end(w, sp.n);
}

/*
 * A generic value (allocator_settings); tuples as TUPLE1-3/TUPLE.
 */
static void wgv(wr_t *w, const msnap_gv_t *v) {
  switch (v->kind) {
  case MSNAP_GV_NONE:
    if (w->json)
      msnap__json_null(&w->jw);
    else
      msnap__pw_op(&w->pw, MSNAP_OP_NONE);
    return;
  case MSNAP_GV_BOOL:
    wbool(w, v->u.b);
    return;
  case MSNAP_GV_INT:
    wi64(w, v->u.i);
    return;
  case MSNAP_GV_FLOAT:
    wfloat(w, v->u.f);
    return;
  case MSNAP_GV_STR:
    mstr(w, v->u.s);
    return;
  case MSNAP_GV_LIST:
  case MSNAP_GV_TUPLE: {
    uint32_t n = v->u.seq.n;
    if (v->kind == MSNAP_GV_TUPLE && !w->json) {
      if (n == 0) {
        msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_TUPLE);
        return;
      }
      if (n > 3) msnap__pw_op(&w->pw, MSNAP_OP_MARK);
      if (push_level(w, true) < 0) return;
      for (uint32_t i = 0; i < n; i++) wgv(w, &v->u.seq.items[i]);
      w->depth--;
      msnap__pw_op(&w->pw, n == 1   ? MSNAP_OP_TUPLE1
                           : n == 2 ? MSNAP_OP_TUPLE2
                           : n == 3 ? MSNAP_OP_TUPLE3
                                    : MSNAP_OP_TUPLE);
      return;
    }
    list_begin(w);
    for (uint32_t i = 0; i < n && !werr(w); i++) {
      list_item(w, n);
      wgv(w, &v->u.seq.items[i]);
    }
    list_end(w, n);
    return;
  }
  case MSNAP_GV_DICT: {
    uint32_t n = v->u.seq.n / 2;
    if (!w->json && n == 0) {
      msnap__pw_op(&w->pw, MSNAP_OP_EMPTY_DICT);
      return;
    }
    dict_begin(w);
    for (uint32_t i = 0; i < n && !werr(w); i++) {
      if (w->json) {
        const msnap_gv_t *k = &v->u.seq.items[2 * i];
        if (k->kind == MSNAP_GV_STR) {
          size_t kn;
          const char *kp = msnap__snap_str(w->s, k->u.s, &kn);
          msnap__json_key(&w->jw, kp, kn);
        } else { /* JSON keys are strings */
          char b[40];
          snprintf(b, sizeof b, "%lld",
                   k->kind == MSNAP_GV_INT ? (long long)k->u.i : 0LL);
          msnap__json_ckey(&w->jw, b);
        }
      } else {
        /* SETITEMS batches of 1000 pairs, as CPython's pickler writes
         * them (a reader bounds its stack, MSNAP_PICKLE_MAX_STACK) */
        if (i && i % 1000 == 0) {
          msnap__pw_op(&w->pw, MSNAP_OP_SETITEMS);
          msnap__pw_op(&w->pw, MSNAP_OP_MARK);
        }
        wgv(w, &v->u.seq.items[2 * i]);
      }
      wgv(w, &v->u.seq.items[2 * i + 1]);
    }
    dict_end(w);
    return;
  }
  }
}

/* ---- records ------------------------------------------------------------- */

/* The keys a live model's records are written with (every key PyTorch
 * writes for them), whatever their bits say. */
static unsigned live_block_keys(const msnap_sblock_t *b) {
  unsigned k = MSNAP_K_ADDRESS | MSNAP_K_REQUESTED | MSNAP_K_FRAMES;
  if (b->forward_frames) k |= MSNAP_K_FORWARD;
  return k;
}

static unsigned live_segment_keys(const msnap_ssegment_t *g) {
  unsigned k = MSNAP_K_REQUESTED | MSNAP_K_SEG_REQUESTED_SIZE |
               MSNAP_K_STREAM | MSNAP_K_SEGMENT_TYPE | MSNAP_K_POOL_ID |
               MSNAP_K_EXPANDABLE | MSNAP_K_FRAMES;
  if (g->forward_frames) k |= MSNAP_K_FORWARD;
  return k;
}

static unsigned live_trace_keys(const msnap_strace_t *t,
                                const msnap_tattr_t *a) {
  unsigned k = MSNAP_K_SIZE | MSNAP_K_STREAM | MSNAP_K_TIME |
               MSNAP_K_COMPILE_CTX | MSNAP_K_USER_META | MSNAP_K_POOL_ID;
  k |= t->action == MSNAP_ACTION_OOM ? MSNAP_K_DEVICE_FREE : MSNAP_K_ADDRESS;
  if (t->frames != MSNAP_STACK_ABSENT) k |= MSNAP_K_FRAMES;
  if (a->forward_frames) k |= MSNAP_K_FORWARD;
  if (a->internal_metadata > MSNAP_STR_EMPTY) k |= MSNAP_K_INTERNAL_META;
  return k;
}

static void settle_segments(msnap_ssegment_t *g, uint32_t n,
                            msnap_sblock_t *blocks) {
  for (uint32_t i = 0; i < n; i++) {
    g[i].keys |= (uint16_t)live_segment_keys(&g[i]);
    for (uint32_t k = 0; k < g[i].nblocks; k++)
      blocks[g[i].first_block + k].keys |=
          (uint16_t)live_block_keys(&blocks[g[i].first_block + k]);
  }
}

/* The entries' key bits live in their (shared) attribute sets: each entry
 * gets the set it has plus the keys it is written with. */
static int settle_traces(msnap_snap_t *s, msnap_trace_list_t *l) {
  for (uint32_t i = 0; i < l->n; i++) {
    msnap_strace_t *e = &l->v[i];
    msnap_tattr_t a = *msnap__tattr(s, e);
    unsigned k = a.keys | live_trace_keys(e, &a);
    if (k == a.keys) continue;
    a.keys = (uint16_t)k;
    int rc = msnap__snap_trace_set_attr(s, e, &a);
    if (rc != 0) return rc;
  }
  return 0;
}

int msnap__snap_settle_keys(msnap_snap_t *s) {
  if (msnap__snap_from_reader(s) || s->generation != MSNAP_GEN_CURRENT)
    return 0;
  settle_segments(s->segments, s->nsegments, s->blocks);
  settle_segments(s->host_segments, s->nhost_segments, s->host_blocks);
  for (uint32_t d = 0; d < s->ndevices; d++) {
    int rc = settle_traces(s, &s->device_traces[d]);
    if (rc != 0) return rc;
  }
  int rc = settle_traces(s, &s->host_traces);
  if (rc != 0) return rc;
  for (uint32_t i = 0; i < s->nannotations; i++)
    s->annotations[i].keys |= MSNAP_ANNOT_KEYS;
  if (s->top_keys == 0) s->top_keys = 0x3f;
  msnap__snap_set_from_reader(s, true);
  return 0;
}

static void wblock(wr_t *w, const msnap_sblock_t *b) {
  unsigned k = b->keys;
  if (w->live) k |= live_block_keys(b);
  dict_begin(w);
  if (k & MSNAP_K_ADDRESS) key(w, C_address), wu64(w, b->address, "address");
  key(w, C_size);
  wu64(w, b->size, "block size");
  if (k & MSNAP_K_REQUESTED)
    key(w, C_requested_size), wu64(w, b->requested_size, "requested_size");
  key(w, C_state);
  switch (b->state) {
  case MSNAP_BLOCK_ACTIVE_ALLOCATED: cstr(w, C_v_active_allocated); break;
  case MSNAP_BLOCK_ACTIVE_PENDING_FREE: cstr(w, C_v_active_pending_free); break;
  case MSNAP_BLOCK_INACTIVE: cstr(w, C_v_inactive); break;
  default: mstr(w, b->state_str);
  }
  if (k & MSNAP_K_FRAMES) key(w, C_frames), wstack(w, b->frames);
  if (k & MSNAP_K_FORWARD)
    key(w, C_forward_frames), wstrlist(w, b->forward_frames);
  if (k & MSNAP_K_HISTORY) {
    key(w, C_history);
    list_begin(w);
    for (uint32_t i = 0; i < b->history.n; i++) {
      const msnap_shistory_t *h = &w->s->histories[b->history.first + i];
      list_item(w, b->history.n);
      dict_begin(w);
      if ((h->keys & MSNAP_K_ADDRESS) || w->live)
        key(w, C_addr), wu64(w, h->addr, "history addr");
      key(w, C_real_size);
      wu64(w, h->real_size, "real_size");
      if (h->frames != MSNAP_STACK_ABSENT)
        key(w, C_frames), wstack(w, h->frames);
      dict_end(w);
    }
    list_end(w, b->history.n);
  }
  dict_end(w);
}

/*
 * A segment dict, PyTorch's key order (frames after blocks when the
 * source had it so).
 */
static void wsegment(wr_t *w, const msnap_ssegment_t *g,
                     const msnap_sblock_t *blocks) {
  unsigned k = g->keys;
  if (w->live) k |= live_segment_keys(g);
  dict_begin(w);
  key(w, C_device);
  wi64(w, g->device);
  key(w, C_address);
  wu64(w, g->address, "segment address");
  key(w, C_total_size);
  wu64(w, g->total_size, "total_size");
  if (k & MSNAP_K_REQUESTED) {
    key(w, C_allocated_size);
    wu64(w, g->allocated_size, "allocated_size");
    key(w, C_active_size);
    wu64(w, g->active_size, "active_size");
    if (!w->keyed || (k & MSNAP_K_SEG_REQUESTED_SIZE)) {
      key(w, C_requested_size);
      wu64(w, g->requested_size, "requested_size");
    }
  }
  if (k & MSNAP_K_STREAM) key(w, C_stream), wi64(w, g->stream);
  if (k & MSNAP_K_SEGMENT_TYPE)
    key(w, C_segment_type), cstr(w, g->is_large ? C_v_large : C_v_small);
  if (k & MSNAP_K_POOL_ID) key(w, C_segment_pool_id), wpair(w, g->pool_id);
  if (k & MSNAP_K_EXPANDABLE)
    key(w, C_is_expandable), wbool(w, g->is_expandable);
  bool frames_last = (k & MSNAP_K_FRAMES_LAST) != 0;
  if ((k & MSNAP_K_FRAMES) && !frames_last)
    key(w, C_frames), wstack(w, g->frames);
  if ((k & MSNAP_K_FORWARD) && !frames_last)
    key(w, C_forward_frames), wstrlist(w, g->forward_frames);
  key(w, C_blocks);
  list_begin(w);
  for (uint32_t i = 0; i < g->nblocks && !werr(w); i++) {
    list_item(w, g->nblocks);
    wblock(w, &blocks[g->first_block + i]);
  }
  list_end(w, g->nblocks);
  if ((k & MSNAP_K_FRAMES) && frames_last)
    key(w, C_frames), wstack(w, g->frames);
  if ((k & MSNAP_K_FORWARD) && frames_last)
    key(w, C_forward_frames), wstrlist(w, g->forward_frames);
  dict_end(w);
}

/*
 * A trace-entry dict: action, addr|device_free, size, stream, time_us,
 * compile_context, user_metadata, internal_metadata, pool_id, frames,
 * forward_frames -- each when present (size always in a model that is not
 * the reader's).
 */
/* From compile_context to the end of the dict (plain path). */
static void wtrace_tail(wr_t *w, const msnap_strace_t *t,
                        const msnap_tattr_t *a, unsigned k) {
  if (k & MSNAP_K_COMPILE_CTX)
    key(w, C_compile_context), mstr_or(w, a->compile_context, C_v_na);
  if (k & MSNAP_K_USER_META) {
    key(w, C_user_metadata);
    if (a->user_metadata == MSNAP_STR_ABSENT)
      mstr(w, MSNAP_STR_EMPTY);
    else
      mstr(w, a->user_metadata);
  }
  if (k & MSNAP_K_INTERNAL_META)
    key(w, C_internal_metadata), mstr(w, a->internal_metadata);
  if (k & MSNAP_K_POOL_ID) key(w, C_pool_id), wpair(w, a->pool_id);
  if (k & MSNAP_K_FRAMES) key(w, C_frames), wstack(w, t->frames);
  if (k & MSNAP_K_FORWARD)
    key(w, C_forward_frames), wstrlist(w, a->forward_frames);
  dict_end(w);
}

/* memcpy of n <= 64 bytes as two overlapping fixed-size copies (a
 * variable-length memcpy of a few dozen bytes costs more than the
 * encoding it replaces). */
static inline void copy_small(unsigned char *d, const unsigned char *src,
                              size_t n) {
  if (n >= 32) {
    memcpy(d, src, 32);
    memcpy(d + n - 32, src + n - 32, 32);
  } else if (n >= 16) {
    memcpy(d, src, 16);
    memcpy(d + n - 16, src + n - 16, 16);
  } else if (n >= 8) {
    memcpy(d, src, 8);
    memcpy(d + n - 8, src + n - 8, 8);
  } else {
    for (size_t i = 0; i < n; i++) d[i] = src[i];
  }
}

/* The tail through the cache (pickle): a hit copies its bytes; a miss
 * writes it and keeps its bytes when they memoized nothing (so they are
 * what every later entry with this key writes) and sit in one frame. */
static void wtrace_tail_cached(wr_t *w, const msnap_strace_t *t,
                               const msnap_tattr_t *a, unsigned k) {
  /* The tail's keys and values are the attribute set's and the frames'
   * (k follows from both), so (attr, frames) is the whole key. */
  uint64_t tk = (uint64_t)t->attr << 32 | t->frames;
  uint64_t h = tk * 0x9e3779b97f4a7c15ull;
  tail_ent_t *e = &w->tails[(h ^ h >> 29 ^ h >> 47) & (TAIL_SLOTS - 1)];
  /* A tail that does not fit the current frame takes the plain path, so
   * that frames end exactly where they would without the cache. */
  if (e->len && e->k == tk && w->pw.used + e->len <= MSNAP_PW_FRAME_SIZE) {
    unsigned char *p = msnap__pw_room(&w->pw, e->len);
    if (p) copy_small(p, e->b, e->len);
    w->depth--; /* the dict the tail closes */
    return;
  }
  size_t start = w->pw.used;
  uint32_t memo = w->pw.memo_next;
  wtrace_tail(w, t, a, k);
  size_t end = w->pw.used;
  /* a flushed frame restarts `used` below start */
  if (!w->pw.err && w->pw.memo_next == memo && end > start &&
      end - start <= TAIL_MAX) {
    e->k = tk;
    e->len = (uint8_t)(end - start);
    memcpy(e->b, w->pw.buf + 9 + start, e->len);
  }
}

/* Direct encoders for the fast path below: the bytes msnap__pw_get and
 * msnap__pw_int write, at p; the new end. */
static inline unsigned char *put_get(unsigned char *p, uint32_t id) {
  if (id < 256) {
    p[0] = MSNAP_OP_BINGET;
    p[1] = (unsigned char)id;
    return p + 2;
  }
  p[0] = MSNAP_OP_LONG_BINGET;
  for (int i = 0; i < 4; i++) p[1 + i] = (unsigned char)(id >> (8 * i));
  return p + 5;
}

static inline unsigned char *put_int(unsigned char *p, int64_t v) {
  if (v >= 0 && v < 256) {
    p[0] = MSNAP_OP_BININT1;
    p[1] = (unsigned char)v;
    return p + 2;
  }
  if (v >= 0 && v < 65536) {
    p[0] = MSNAP_OP_BININT2;
    p[1] = (unsigned char)v;
    p[2] = (unsigned char)(v >> 8);
    return p + 3;
  }
  uint64_t u = (uint64_t)v;
  if (v >= INT32_MIN && v <= INT32_MAX) {
    p[0] = MSNAP_OP_BININT;
    for (int i = 0; i < 4; i++) p[1 + i] = (unsigned char)(u >> (8 * i));
    return p + 5;
  }
  uint64_t mag = v < 0 ? ~u : u;
  int n = (64 - __builtin_clzll(mag) + 1 + 7) / 8;
  p[0] = MSNAP_OP_LONG1;
  p[1] = (unsigned char)n;
  for (int i = 0; i < n; i++) p[2 + i] = (unsigned char)(u >> (8 * i));
  return p + 2 + n;
}

/* The keys up to time_us of a live trace entry, written straight into the
 * frame when every key and the action are memoized, the values fit and
 * the bytes fit the frame (so that frames end where the plain path ends
 * them): the same bytes as dict_begin ... wi64(time_us).  false: not
 * taken (nothing written). */
#define HEAD_MAX 64
static bool wtrace_head_fast(wr_t *w, const msnap_strace_t *t,
                             const msnap_tattr_t *a, unsigned k) {
  int addr_key = (k & MSNAP_K_ADDRESS) ? C_addr : C_device_free;
  unsigned where = k & (MSNAP_K_ADDRESS | MSNAP_K_DEVICE_FREE);
  if ((where != MSNAP_K_ADDRESS && where != MSNAP_K_DEVICE_FREE) ||
      !(k & MSNAP_K_SIZE) || !(k & MSNAP_K_STREAM) || !(k & MSNAP_K_TIME) ||
      t->action >= MSNAP_ACTION_COUNT || t->addr > (uint64_t)INT64_MAX ||
      t->size > (uint64_t)INT64_MAX ||
      w->pw.used + HEAD_MAX > MSNAP_PW_FRAME_SIZE || w->pw.err ||
      w->depth + 1 >= MAX_LEVELS)
    return false;
  const uint32_t *m = w->const_memo;
  if (m[C_action] == NO_MEMO || m[C_ACTION0 + t->action] == NO_MEMO ||
      m[addr_key] == NO_MEMO || m[C_size] == NO_MEMO ||
      m[C_stream] == NO_MEMO || m[C_time_us] == NO_MEMO)
    return false;
  unsigned char *p0 = w->pw.buf + 9 + w->pw.used, *p = p0;
  *p++ = MSNAP_OP_EMPTY_DICT;
  *p++ = MSNAP_OP_MARK;
  p = put_get(p, m[C_action]);
  p = put_get(p, m[C_ACTION0 + t->action]);
  p = put_get(p, m[addr_key]);
  p = put_int(p, (int64_t)t->addr);
  p = put_get(p, m[C_size]);
  p = put_int(p, (int64_t)t->size);
  p = put_get(p, m[C_stream]);
  p = put_int(p, a->stream);
  p = put_get(p, m[C_time_us]);
  p = put_int(p, t->time_us);
  w->pw.used += (size_t)(p - p0);
  w->depth++; /* the dict the tail closes (dict_begin's push_level) */
  w->lv[w->depth].count = 0;
  w->lv[w->depth].is_list = false;
  return true;
}

static void wtrace(wr_t *w, const msnap_strace_t *t) {
  const msnap_tattr_t *a = msnap__tattr(w->s, t);
  unsigned k = a->keys;
  if (w->live) k |= live_trace_keys(t, a);
  if (!w->keyed) k |= MSNAP_K_SIZE;
  if (w->tails != NULL && wtrace_head_fast(w, t, a, k)) {
    wtrace_tail_cached(w, t, a, k);
    return;
  }
  dict_begin(w);
  key(w, C_action);
  if (t->action < MSNAP_ACTION_COUNT)
    cstr(w, C_ACTION0 + t->action);
  else
    mstr(w, a->action_str);
  if (k & MSNAP_K_ADDRESS) key(w, C_addr), wu64(w, t->addr, "addr");
  if (k & MSNAP_K_DEVICE_FREE)
    key(w, C_device_free), wu64(w, t->addr, "device_free");
  if (k & MSNAP_K_SIZE) key(w, C_size), wu64(w, t->size, "size");
  if (k & MSNAP_K_STREAM) key(w, C_stream), wi64(w, a->stream);
  if (k & MSNAP_K_TIME) key(w, C_time_us), wi64(w, t->time_us);
  if (w->tails != NULL)
    wtrace_tail_cached(w, t, a, k);
  else
    wtrace_tail(w, t, a, k);
}

static void wtraces(wr_t *w, const msnap_trace_list_t *l) {
  list_begin(w);
  for (uint32_t i = 0; i < l->n && !werr(w); i++) {
    list_item(w, l->n);
    if (i + 16 < l->n) __builtin_prefetch(&l->v[i + 16]); /* from memory */
    wtrace(w, &l->v[i]);
  }
  list_end(w, l->n);
}

static void wsegments(wr_t *w, const msnap_ssegment_t *segs, uint32_t n,
                      const msnap_sblock_t *blocks) {
  list_begin(w);
  for (uint32_t i = 0; i < n && !werr(w); i++) {
    list_item(w, n);
    wsegment(w, &segs[i], blocks);
  }
  list_end(w, n);
}

static void wannotations(wr_t *w) {
  const msnap_snap_t *s = w->s;
  list_begin(w);
  for (uint32_t i = 0; i < s->nannotations; i++) {
    const msnap_sannotation_t *a = &s->annotations[i];
    unsigned k = a->keys;
    if (w->live) k |= MSNAP_ANNOT_KEYS;
    list_item(w, s->nannotations);
    dict_begin(w);
    key(w, C_stage);
    cstr(w, a->is_start ? C_v_start : C_v_end);
    if (k & MSNAP_K_ANNOT_NAME) key(w, C_name), mstr(w, a->name);
    if (k & MSNAP_K_ANNOT_DEVICE) key(w, C_device), wi64(w, a->device);
    if (k & MSNAP_K_TIME) key(w, C_time_us), wi64(w, a->time_us);
    dict_end(w);
  }
  list_end(w, s->nannotations);
}

/*
 * The top level: a bare list of segments, or the snapshot dict with the
 * top-level keys of the source (all six for a live model without bits).
 */
static void wtop(wr_t *w) {
  const msnap_snap_t *s = w->s;
  if (s->generation == MSNAP_GEN_SEGMENT_LIST && !w->json) {
    wsegments(w, s->segments, s->nsegments, s->blocks);
    return;
  }
  /* a model read from a file: its own keys (a 2.0 dict has no
   * device_traces); a live one: at least segments and device_traces */
  uint32_t top = s->top_keys;
  if (w->live)
    top = top == 0 ? 0x3f
                   : top | MSNAP_TOP_SEGMENTS | MSNAP_TOP_DEVICE_TRACES;
  dict_begin(w);
  if (w->json) wtables(w);
  if (s->generation == MSNAP_GEN_SEGMENT_LIST) {
    /* a bare list of segments: JSON puts it under "segments" */
    key(w, C_segments);
    wsegments(w, s->segments, s->nsegments, s->blocks);
    dict_end(w);
    return;
  }
  if (top & MSNAP_TOP_SEGMENTS) {
    key(w, C_segments);
    wsegments(w, s->segments, s->nsegments, s->blocks);
  }
  if (top & MSNAP_TOP_DEVICE_TRACES) {
    key(w, C_device_traces);
    list_begin(w);
    for (uint32_t d = 0; d < s->ndevices && !werr(w); d++) {
      list_item(w, s->ndevices);
      wtraces(w, &s->device_traces[d]);
    }
    list_end(w, s->ndevices);
  }
  if (top & MSNAP_TOP_ALLOCATOR_SETTINGS) {
    key(w, C_allocator_settings);
    if (s->allocator_settings.kind == MSNAP_GV_NONE) {
      msnap_gv_t empty = {.kind = MSNAP_GV_DICT};
      wgv(w, &empty);
    } else {
      wgv(w, &s->allocator_settings);
    }
  }
  if (top & MSNAP_TOP_EXTERNAL_ANNOTATIONS)
    key(w, C_external_annotations), wannotations(w);
  if (top & MSNAP_TOP_HOST_SEGMENTS) {
    key(w, C_host_segments);
    wsegments(w, s->host_segments, s->nhost_segments, s->host_blocks);
  }
  if (top & MSNAP_TOP_HOST_TRACES)
    key(w, C_host_traces), wtraces(w, &s->host_traces);
  if ((top & MSNAP_TOP_PROCESS_INFO) &&
      s->process_info.kind == MSNAP_GV_DICT)
    key(w, C_process_info), wgv(w, &s->process_info);
  dict_end(w);
}

/*
 * Writer state; the memo tables (pickle only) start empty (all ones).
 */
static int wr_init(wr_t *w, const msnap_snap_t *s, bool json) {
  memset(w, 0, sizeof *w);
  w->s = s;
  w->json = json;
  w->keyed = msnap__snap_from_reader(s);
  w->live = !w->keyed && s->generation == MSNAP_GEN_CURRENT;
  for (int i = 0; i < NCONSTS; i++) w->const_memo[i] = NO_MEMO;
  if (json) return 0;
  w->str_memo = malloc(((size_t)s->nstrings + 1) * sizeof *w->str_memo);
  w->frame_memo = malloc(((size_t)s->nframes + 1) * sizeof *w->frame_memo);
  w->stack_memo = malloc(((size_t)s->nstacks + 1) * sizeof *w->stack_memo);
  if (!w->str_memo || !w->frame_memo || !w->stack_memo) return MSNAP_ENOMEM;
  memset(w->str_memo, 0xff, ((size_t)s->nstrings + 1) * sizeof *w->str_memo);
  memset(w->frame_memo, 0xff, ((size_t)s->nframes + 1) * sizeof *w->frame_memo);
  memset(w->stack_memo, 0xff, ((size_t)s->nstacks + 1) * sizeof *w->stack_memo);
  if (atomic_load_explicit(&tail_cache_on, memory_order_relaxed)) {
    w->tails = calloc(TAIL_SLOTS, sizeof *w->tails);
    if (w->tails == NULL) return MSNAP_ENOMEM;
  }
  return 0;
}

static void wr_destroy(wr_t *w) {
  free(w->str_memo);
  free(w->frame_memo);
  free(w->stack_memo);
  free(w->tails);
}

/*
 * Write s as a pickle to out (the sink is flushed, not finished).  Returns
 * 0, MSNAP_EINVAL for a value MemoryViz cannot read (>= 2^63), or the
 * sink's error.
 */
int msnap__snap_write_pickle(const msnap_snap_t *s, msnap_sink_t *out) {
  if (s->stacks_skipped) return MSNAP_EINVAL; /* not the file's model */
  wr_t *w = malloc(sizeof *w);
  if (!w) return MSNAP_ENOMEM;
  int rc = wr_init(w, s, false);
  if (rc == 0) rc = msnap__pw_init(&w->pw, out);
  if (rc == 0) {
    wtop(w);
    rc = msnap__pw_finish(&w->pw);
    if (rc == 0) rc = msnap__sink_flush(out);
  } else {
    msnap__pw_abort(&w->pw);
  }
  wr_destroy(w);
  free(w);
  return rc;
}

/*
 * The JSON output's bound.  A pickle stores each string once (memo) and
 * refers to it as often as it likes; JSON writes it in full at every
 * place: a frame's strings in its frame_table entry, an annotation's
 * name, a trace entry's compile_context / user_metadata /
 * internal_metadata.  2000 frames sharing one 8 MiB file name, 16.7 kB
 * of gzip, would be 16 GB of JSON; 100 000 annotations named by one
 * 1 MiB string, 100 GB.  Those string bytes are bounded before anything
 * is written: at most 16 times the bytes of all the file's strings, plus
 * 64 MiB (a real recording's frames hold a few times its strings: many
 * lines of one file).  Beyond: MSNAP_ELIMIT, nothing written.  (The
 * generic values' strings, allocator_settings and process_info, are
 * bounded by the reader: MSNAP_PICKLE_GV_STR_RATIO.)
 */
#define JSON_SHARED_STR_RATIO 16
#define JSON_SHARED_STR_SLACK ((uint64_t)64 << 20)

static uint64_t str_bytes(const msnap_snap_t *s, msnap_str_t id) {
  size_t n = 0;
  if (id != 0) (void)msnap__snap_str(s, id, &n);
  return n;
}

static int json_bound(const msnap_snap_t *s) {
  uint64_t all = 0, frames = 0, other = 0;
  for (msnap_str_t id = 1; id < s->nstrings; id++) all += str_bytes(s, id);
  uint64_t limit = all * JSON_SHARED_STR_RATIO + JSON_SHARED_STR_SLACK;
  for (uint32_t i = 0; i < s->nframes; i++) {
    const msnap_frame_t *f = &s->frames[i];
    frames += str_bytes(s, f->name) + str_bytes(s, f->filename) +
              str_bytes(s, f->fx_node_op) + str_bytes(s, f->fx_node_name) +
              str_bytes(s, f->fx_node_target) +
              str_bytes(s, f->fx_original_trace);
  }
  for (uint32_t i = 0; i < s->nannotations; i++)
    other += str_bytes(s, s->annotations[i].name);
  for (uint32_t d = 0; d < s->ndevices && other <= limit; d++) {
    const msnap_trace_list_t *tl = &s->device_traces[d];
    for (uint32_t i = 0; i < tl->n && other <= limit; i++) {
      const msnap_tattr_t *a = msnap__tattr(s, &tl->v[i]);
      other += str_bytes(s, a->compile_context) +
               str_bytes(s, a->user_metadata) +
               str_bytes(s, a->internal_metadata);
    }
  }
  if (frames + other <= limit) return 0;
  return msnap__set_error(
      MSNAP_ELIMIT,
      "the JSON would hold %llu bytes of %s strings: they share strings "
      "(%llu bytes in all) that a pickle stores once and JSON writes at "
      "every use (the limit: %dx the strings + 64 MiB); write a pickle "
      "instead",
      (unsigned long long)(frames + other),
      frames >= other ? "frame" : "annotation and trace-entry",
      (unsigned long long)all, JSON_SHARED_STR_RATIO);
}

/*
 * Write s as JSON to out (flushed, not finished); MSNAP_ELIMIT before
 * anything is written when its frames would repeat shared strings beyond
 * json_bound's limit.
 */
int msnap__snap_write_json(const msnap_snap_t *s, msnap_sink_t *out) {
  if (s->stacks_skipped) return MSNAP_EINVAL; /* not the file's model */
  int brc = json_bound(s);
  if (brc < 0) return brc;
  wr_t *w = malloc(sizeof *w);
  if (!w) return MSNAP_ENOMEM;
  int rc = wr_init(w, s, true);
  if (rc == 0) {
    msnap__json_init(&w->jw, out, MSNAP_JSON_FLOAT_POINT);
    wtop(w);
    msnap__sink_write(out, "\n", 1);
    rc = out->err;
    if (rc == 0) rc = msnap__sink_flush(out);
  }
  wr_destroy(w);
  free(w);
  return rc;
}

/*
 * Write s to path through a temporary file + fsync + rename; on any
 * error the temporary is removed and path is untouched.
 */
int msnap__snap_write_file(const msnap_snap_t *s, const char *path,
                           bool json) {
  msnap_atomic_file_t f;
  int rc = msnap__atomic_open(&f, path);
  if (rc < 0) return rc;
  msnap_sink_t sink;
  rc = msnap__sink_init_fd(&sink, f.fd);
  if (rc < 0) {
    msnap__atomic_abort(&f);
    return rc;
  }
  rc = json ? msnap__snap_write_json(s, &sink)
            : msnap__snap_write_pickle(s, &sink);
  int frc = msnap__sink_finish(&sink);
  if (rc == 0) rc = frc;
  if (rc < 0) {
    msnap__atomic_abort(&f);
    return rc;
  }
  return msnap__atomic_commit(&f);
}
