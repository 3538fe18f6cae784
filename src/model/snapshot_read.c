/*
 * snapshot_read.c -- read a snapshot pickle of any generation into the
 * model (snapshot.h): 2.0 (blocks with `history`, no block address), 2.1,
 * 2.2, 2.6, the newest dict, and a bare list of segments.
 *
 * Design (memory bound: a snapshot is read in about 1.5x its file size):
 *   - The file is mmap'ed read-only and the safe VM (pickle_read.c) runs
 *     over it; every 64 MiB the consumed pages are dropped from the
 *     process (MADV_DONTNEED), so the input costs little resident memory.
 *   - No generic object tree of the file is built.  The VM calls
 *     snap_complete() whenever a container is stored into another one.
 *     At that moment the container is complete (a pickler writes a
 *     container fully before the opcode that stores it), and this file
 *     classifies it by its keys and turns it into a model record:
 *       frame dict          -> interned frame id        (REC_FRAME)
 *       list of frames      -> interned stack id        (REC_STACK)
 *       (int, int) tuple    -> interned pool-id pair    (REC_PAIR)
 *       dict with `action`  -> msnap_strace_t in a pool (REC_TRACE)
 *       dict with `state`   -> msnap_sblock_t           (REC_BLOCK)
 *       dict with `real_size` (2.0 history) -> msnap_shistory_t
 *       dict with `blocks`  -> msnap_ssegment_t         (REC_SEG)
 *       dict with `stage`   -> msnap_sannotation_t      (REC_ANNOT)
 *       empty list          -> REC_EMPTY
 *     The VM then frees the container and points its memo slot at the
 *     record, so a frame list shared through the memo is interned once and
 *     every later BINGET of it is one 8-byte value.
 *   - What stays alive until STOP: the trace lists (kept by the VM as
 *     ranges of consecutive records, so no per-entry item array), the memo
 *     (8 bytes per memoized object, written lazily), the trace pool (one
 *     msnap_strace_t, 80 bytes, per entry) and small generic containers
 *     (the top-level dict, allocator_settings).  At STOP the root dict is
 *     mapped: the device list whose entries start the pool takes the pool
 *     array itself (no copy), other lists are copied out, segments and
 *     blocks are laid out in list order.
 *   Measured (bench/bench_pickle): 1M entries, a 59 MB file written by
 *   memsnap -> 87 MB peak RSS growth (1.47x); the same object written by
 *   CPython (which memoizes every dict) -> 1.62x.  The 80-byte record per
 *   entry is the floor; real PyTorch entries are larger in the file
 *   (pool_id tuples, compile_context keys), so real ratios are lower.

 * Key presence: every optional key sets its MSNAP_K_* bit (and top-level
 * keys MSNAP_TOP_*), so snapshot_write.c writes back exactly the keys of
 * the source.  2.0 blocks get address = segment address + sizes of the
 * preceding blocks with MSNAP_K_ADDRESS clear.  Keys the model does not
 * know (e.g. `category` of _profile_to_snapshot entries) are dropped;
 * those of trace entries are counted and named (note_dropped) so that
 * memsnap convert can say so.
 *
 * Big integers (beyond 64 bits) and negative sizes/addresses are refused
 * with MSNAP_EFORMAT naming the key (a negative one also its value, in 64
 * bits or wider alike: negative_int); the pickle itself stays readable by
 * the generic VM (the tests' canonical dump, tests/pickle/canon.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "model/pickle.h"

enum rec_kind_e {
  REC_FRAME = 1,
  REC_STACK,
  REC_PAIR,
  REC_TRACE,
  REC_BLOCK,
  REC_HIST,
  REC_SEG,
  REC_ANNOT,
  REC_EMPTY,
  REC_BSPAN,  /* a list of block records: spans[index]   */
  REC_HSPAN,  /* a list of 2.0 history records: spans[]   */
  REC_STRLIST /* a list of str: strlist id (forward_frames) */
};

/* Keys known to the model; interned first, so their string ids are small
 * and a table maps id -> key. */
#define KEY_LIST(X)                                                           \
  X(action) X(addr) X(size) X(stream) X(time_us) X(frames) X(forward_frames) \
  X(compile_context) X(user_metadata) X(internal_metadata) X(pool_id)        \
  X(device_free) X(device) X(address) X(total_size) X(allocated_size)        \
  X(active_size) X(requested_size) X(segment_type) X(segment_pool_id)        \
  X(is_expandable) X(blocks) X(state) X(history) X(real_size) X(name)        \
  X(filename) X(line) X(fx_node_op) X(fx_node_name) X(fx_node_target)        \
  X(fx_original_trace) X(stage) X(segments) X(device_traces)                 \
  X(allocator_settings) X(external_annotations) X(host_segments)             \
  X(host_traces) X(process_info)

enum key_e {
#define KEY_ENUM_(k) KEY_##k,
  KEY_LIST(KEY_ENUM_)
#undef KEY_ENUM_
  NKEYS
};

static const char *const key_names[NKEYS] = {
#define KEY_NAME_(k) #k,
    KEY_LIST(KEY_NAME_)
#undef KEY_NAME_
};

typedef struct fields_s {
  msnap_pv_t v[NKEYS];
  uint64_t present;
  int pos[NKEYS]; /* item order, for key-order facts */
} fields_t;

/* A list of block or history records (REC_BSPAN / REC_HSPAN). */
typedef struct span_s {
  uint32_t first, n;
  bool claimed; /* a segment (block) took these blocks (history entries):
                 * another one copies (shares) them, as repeats */
} span_t;

typedef struct pair_tab_s {
  msnap_mempool_id_t *v;
  uint32_t n, cap;
  uint32_t *slots; /* id + 1 */
  uint32_t mask;
  uint64_t seed;
} pair_tab_t;

static uint32_t pair_hash(const pair_tab_t *t, uint64_t a, uint64_t b) {
  uint64_t k[2] = {a, b};
  return (uint32_t)XXH3_64bits_withSeed(k, sizeof k, t->seed);
}

typedef struct rd_s {
  msnap_snap_t *s;
  msnap_pvm_t *vm;
  msnap_str_t key_str[NKEYS];
  uint8_t *key_of; /* key_of[str id] = key + 1, for ids < nkey_of */
  uint32_t nkey_of;
  msnap_str_t action_str[MSNAP_ACTION_COUNT];
  uint8_t *action_of; /* action_of[str id] = action + 1 */
  uint32_t naction_of;
  msnap_str_t st_alloc, st_pending, st_inactive, seg_large, seg_small,
      stage_start, stage_end;
  msnap_strace_t *pool;
  uint32_t npool, pool_cap;
  size_t pool_ahead; /* msnap__prefault_ahead's mark for pool */
  pair_tab_t pairs;
  uint32_t *ids;
  uint32_t nids_cap;
  span_t *spans; /* REC_BSPAN / REC_HSPAN */
  uint32_t nspans, spans_cap;
  uint32_t nseg_records, nblock_records; /* made during the run */
  /* block and 2.0 history dicts converted (records), and the items of
   * the lists of them, each list counted once more for each block or
   * segment that takes it after the first (repeat_bound) */
  uint64_t block_records, hist_records, block_listed, hist_listed;
  size_t len; /* input bytes: each memo reference costs >= 2 of them */
  size_t scan_nb; /* bytes refs_scan encoded (msnap__snap_stack_tail) */
  bool any_current_key, any_time;
  uint64_t entries_scanned; /* by entry_scan (kept by a rollback) */
  bool convert_failed; /* a container was refused: the file is a pickle */
  bool skip_stacks; /* msnap_read_stats_t.skip_stacks: frame lists are
                     * checked as ever, none is stored (SKIPPED_STACK) */
} rd_t;

#define REC(kind, idx) MSNAP_PV_REC_MAKE(kind, idx)
/* A frame list read with skip_stacks: a stack record still (so every
 * check of where a list of frames may be is the same), of the empty
 * stack. */
#define SKIPPED_STACK REC(REC_STACK, MSNAP_STACK_EMPTY)
#define IS_REC(v, kind)                                                       \
  (MSNAP_PV_TAG(v) == MSNAP_PV_REC && MSNAP_PV_REC_KIND(v) == (kind))

/* ---- small helpers ------------------------------------------------------- */

static int ids_room(rd_t *r, uint32_t n) {
  if (n <= r->nids_cap) return 0;
  uint32_t *p = realloc(r->ids, (size_t)n * sizeof *p);
  if (!p) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  r->ids = p;
  r->nids_cap = n;
  return 0;
}

static uint32_t pair_intern(rd_t *r, uint64_t a, uint64_t b) {
  pair_tab_t *t = &r->pairs;
  if (!t->slots || (t->n + 1) * 2 > t->mask + 1) {
    uint32_t nc = t->slots ? (t->mask + 1) * 2 : 64;
    uint32_t *ns = calloc(nc, sizeof *ns);
    if (!ns) return UINT32_MAX;
    for (uint32_t i = 0; i < t->n; i++) {
      uint32_t h = pair_hash(t, t->v[i].first, t->v[i].second) & (nc - 1);
      while (ns[h]) h = (h + 1) & (nc - 1);
      ns[h] = i + 1;
    }
    free(t->slots);
    t->slots = ns;
    t->mask = nc - 1;
  }
  uint32_t h = pair_hash(t, a, b) & t->mask;
  while (t->slots[h]) {
    msnap_mempool_id_t *e = &t->v[t->slots[h] - 1];
    if (e->first == a && e->second == b) return t->slots[h] - 1;
    h = (h + 1) & t->mask;
  }
  if (msnap__grow((void **)&t->v, &t->cap, t->n, 1, sizeof *t->v) < 0)
    return UINT32_MAX;
  t->v[t->n] = (msnap_mempool_id_t){a, b};
  t->slots[h] = t->n + 1;
  return t->n++;
}

/* Collect the known keys of a dict's items into f. */
static void get_fields(rd_t *r, const msnap_pitems_t *it, fields_t *f) {
  f->present = 0;
  if (!it->range) {
    /* (the usual case, through locals: the stores into f cannot alias
     * them) */
    const msnap_pv_t *v = it->v;
    const uint8_t *key_of = r->key_of;
    uint32_t n = it->n, nkey_of = r->nkey_of;
    uint64_t present = 0;
    for (uint32_t i = 0; i + 1 < n; i += 2) {
      msnap_pv_t k = v[i];
      uint64_t id = MSNAP_PV_PAYLOAD(k);
      if (MSNAP_PV_TAG(k) != MSNAP_PV_STR || id >= nkey_of || !key_of[id])
        continue;
      int key = key_of[id] - 1;
      present |= 1ull << key;
      f->v[key] = v[i + 1];
      f->pos[key] = (int)i;
    }
    f->present = present;
    return;
  }
  for (uint32_t i = 0; i + 1 < it->n; i += 2) {
    msnap_pv_t k = msnap__pitem(it, i);
    if (MSNAP_PV_TAG(k) != MSNAP_PV_STR) continue;
    uint64_t id = MSNAP_PV_PAYLOAD(k);
    if (id >= r->nkey_of || !r->key_of[id]) continue;
    int key = r->key_of[id] - 1;
    f->present |= 1ull << key;
    f->v[key] = msnap__pitem(it, i + 1);
    f->pos[key] = (int)i;
  }
}

#define HAS(f, k) (((f)->present >> KEY_##k) & 1u)

/* A Python type name t with its article, in buf: "an int", "a dict",
 * "None" (no article).  Returns buf. */
static const char *type_phrase(const char *t, char *buf, size_t len) {
  snprintf(buf, len, "%s%s",
           !strcmp(t, "None")              ? ""
           : strchr("aeiouAEIOU", t[0]) ? "an "
                                        : "a ",
           t);
  return buf;
}

static void describe_item(rd_t *r, msnap_pv_t v, const char *defkey,
                          char *buf, size_t len);

/* (a record -- a list of str, a frame dict -- is named by what it was) */
static int bad_type(rd_t *r, int key, msnap_pv_t v, const char *want) {
  char tp[256];
  describe_item(r, v, NULL, tp, sizeof tp);
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT, "'%s' is %s, expected %s",
                         key_names[key], tp, want);
}

/* A key every PyTorch version writes in a `what` dict (and the model
 * keeps without a presence bit): its absence is an error, not a 0. */
static int need(rd_t *r, const fields_t *f, int key, const char *what) {
  if ((f->present >> key) & 1u)
    return 0;
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                         "a %s dict without '%s' (PyTorch writes it in every "
                         "%s)",
                         what, key_names[key], what);
}

/* What an item of a model list (or a key's value) is, for a message: a
 * record by the key that made it one, a plain dict by the key it lacks
 * (defkey: the key that makes the wanted record, e.g. 'blocks' for a
 * segment; NULL: "a dict"). */
static void describe_item(rd_t *r, msnap_pv_t v, const char *defkey,
                          char *buf, size_t len) {
  static const char *const rec[] = {
      [REC_FRAME] = "a frame dict",
      [REC_STACK] = "a list of frame dicts",
      [REC_PAIR] = "an (int, int) tuple",
      [REC_TRACE] = "a trace entry dict (it has 'action')",
      [REC_BLOCK] = "a block dict (it has 'state')",
      [REC_HIST] = "a 2.0 history dict (it has 'real_size')",
      [REC_SEG] = "a segment dict (it has 'blocks')",
      [REC_ANNOT] = "an annotation dict (it has 'stage')",
      [REC_EMPTY] = "an empty list",
      [REC_BSPAN] = "a list of block dicts",
      [REC_HSPAN] = "a list of 2.0 history dicts",
      [REC_STRLIST] = "a list of str"};
  if (MSNAP_PV_TAG(v) == MSNAP_PV_REC) {
    unsigned k = MSNAP_PV_REC_KIND(v);
    snprintf(buf, len, "%s",
             k < sizeof rec / sizeof *rec && rec[k] ? rec[k] : "a record");
    return;
  }
  const char *t = msnap__pvm_type(r->vm, v);
  if (!strcmp(t, "dict") && defkey)
    snprintf(buf, len, "a dict without '%s'", defkey);
  else
    type_phrase(t, buf, len);
}

/* Item i of the list named `list` (e.g. "segments", "device_traces[1]")
 * is not the wanted record. */
static int bad_item(rd_t *r, const char *list, uint32_t i, msnap_pv_t v,
                    const char *want, const char *defkey) {
  char what[96];
  describe_item(r, v, defkey, what, sizeof what);
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT, "%s[%u] is %s, expected %s",
                         list, i, what, want);
}

static int get_i64(rd_t *r, const fields_t *f, int key, int64_t *out) {
  int64_t i;
  msnap_pv_t v = f->v[key];
  if (msnap_likely(MSNAP_PV_TAG(v) == MSNAP_PV_INT)) { /* (the usual int) */
    *out = MSNAP_PV_INT_VALUE(v);
    return 0;
  }
  int k = msnap__pvm_int(r->vm, v, &i, NULL);
  if (k == MSNAP_PINT_U64 || k == MSNAP_PINT_BIG)
    return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                           "'%s' does not fit in 64 signed bits",
                           key_names[key]);
  if (k != MSNAP_PINT_I64 || MSNAP_PV_TAG(v) == MSNAP_PV_CONST)
    return bad_type(r, key, v, "an int in 64 signed bits");
  *out = i;
  return 0;
}

/* The decimal digits of an int wider than 64 bits (two's-complement
 * bytes, little-endian: msnap__pvm_big) into buf; one of more than 32
 * bytes is named by its size. */
static void big_decimal(const unsigned char *b, size_t n, char *buf,
                        size_t len) {
  unsigned char m[32]; /* the magnitude, little-endian */
  bool neg = n && (b[n - 1] & 0x80);
  if (n > sizeof m) {
    snprintf(buf, len, "%s int of %zu bytes", neg ? "a negative" : "an", n);
    return;
  }
  unsigned carry = 1;
  for (size_t i = 0; i < n; i++) {
    unsigned x = neg ? (unsigned)(unsigned char)~b[i] + carry : b[i];
    m[i] = (unsigned char)x;
    carry = x >> 8;
  }
  char d[80]; /* 32 bytes: at most 78 digits */
  size_t nd = 0;
  for (size_t top = n; top > 0 && nd < sizeof d;) {
    unsigned rem = 0;
    for (size_t i = top; i-- > 0;) {
      unsigned cur = rem << 8 | m[i];
      m[i] = (unsigned char)(cur / 10);
      rem = cur % 10;
    }
    d[nd++] = (char)('0' + rem);
    while (top > 0 && m[top - 1] == 0) top--;
  }
  size_t k = 0;
  if (neg && k + 1 < len) buf[k++] = '-';
  while (nd > 0 && k + 1 < len) buf[k++] = d[--nd];
  if (k == 0 || (neg && k == 1)) buf[k++] = '0';
  buf[k < len ? k : len - 1] = '\0';
}

/* A negative int where a key takes none (an address, a size), named by
 * its value -- of 64 bits or wider, the same words: "'addr' is -5,
 * expected a non-negative int". */
static int negative_int(rd_t *r, int key, msnap_pv_t v) {
  char num[200];
  int64_t i;
  size_t n;
  const unsigned char *b;
  if (msnap__pvm_int(r->vm, v, &i, NULL) == MSNAP_PINT_I64)
    snprintf(num, sizeof num, "%" PRId64, i);
  else if ((b = msnap__pvm_big(r->vm, v, &n)) != NULL)
    big_decimal(b, n, num, sizeof num);
  else
    snprintf(num, sizeof num, "negative");
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                         "'%s' is %s, expected a non-negative int",
                         key_names[key], num);
}

static int get_u64(rd_t *r, const fields_t *f, int key, uint64_t *out) {
  int64_t i;
  uint64_t u;
  msnap_pv_t v = f->v[key];
  if (msnap_likely(MSNAP_PV_TAG(v) == MSNAP_PV_INT) &&
      MSNAP_PV_INT_VALUE(v) >= 0) { /* (the usual int) */
    *out = (uint64_t)MSNAP_PV_INT_VALUE(v);
    return 0;
  }
  switch (msnap__pvm_int(r->vm, v, &i, &u)) {
  case MSNAP_PINT_I64:
    if (i < 0) return negative_int(r, key, v);
    *out = (uint64_t)i;
    return 0;
  case MSNAP_PINT_U64:
    *out = u;
    return 0;
  case MSNAP_PINT_BIG: {
    size_t n;
    const unsigned char *b = msnap__pvm_big(r->vm, v, &n);
    if (b && n && (b[n - 1] & 0x80)) return negative_int(r, key, v);
    return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                           "'%s' does not fit in 64 bits", key_names[key]);
  }
  default:
    return bad_type(r, key, v, "an int");
  }
}

static int get_str(rd_t *r, const fields_t *f, int key, msnap_str_t *out) {
  msnap_pv_t v = f->v[key];
  if (MSNAP_PV_TAG(v) != MSNAP_PV_STR) return bad_type(r, key, v, "a str");
  *out = (msnap_str_t)MSNAP_PV_PAYLOAD(v);
  return 0;
}

static int get_bool(rd_t *r, const fields_t *f, int key, uint8_t *out) {
  msnap_pv_t v = f->v[key];
  if (v == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_TRUE))
    *out = 1;
  else if (v == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_FALSE))
    *out = 0;
  else
    return bad_type(r, key, v, "a bool");
  return 0;
}

static int get_pair(rd_t *r, const fields_t *f, int key,
                    msnap_mempool_id_t *out) {
  msnap_pv_t v = f->v[key];
  if (!IS_REC(v, REC_PAIR))
    return bad_type(r, key, v, "a (int, int) tuple");
  *out = r->pairs.v[MSNAP_PV_REC_INDEX(v)];
  return 0;
}

/* A list with an item that is no frame record: name the first such item,
 * and of a dict the frame keys it lacks ("frames[0] is a dict without
 * 'filename' and 'line', ..."). */
static int bad_frames(rd_t *r, int key, msnap_pv_t v) {
  static const char frame[] =
      "a frame dict (one with 'filename', or 'name' and 'line')";
  msnap_pobj_t *o =
      MSNAP_PV_TAG(v) == MSNAP_PV_OBJ ? msnap__pvm_obj(r->vm, v) : NULL;
  uint32_t i = 0;
  while (o && o->kind == MSNAP_POBJ_LIST && i < o->n &&
         IS_REC(msnap__pobj_item(o, i), REC_FRAME))
    i++;
  if (!o || o->kind != MSNAP_POBJ_LIST || i == o->n)
    return bad_type(r, key, v, "a list of frame dicts");
  msnap_pv_t x = msnap__pobj_item(o, i);
  msnap_pobj_t *d =
      MSNAP_PV_TAG(x) == MSNAP_PV_OBJ ? msnap__pvm_obj(r->vm, x) : NULL;
  if (!d || d->kind != MSNAP_POBJ_DICT || (d->flags & MSNAP_POBJF_RANGE))
    return bad_item(r, key_names[key], i, x, frame, NULL);
  fields_t f;
  msnap_pitems_t it = {.v = d->items, .n = d->n};
  get_fields(r, &it, &f);
  /* (a dict with filename, or name and line, is a frame record unless
   * it also has 'segments': that one is only "a dict") */
  const char *miss[3];
  int n = 0;
  if (!HAS(&f, name)) miss[n++] = "'name'";
  if (!HAS(&f, filename)) miss[n++] = "'filename'";
  if (!HAS(&f, line)) miss[n++] = "'line'";
  if (n < 2 || HAS(&f, filename))
    return bad_item(r, key_names[key], i, x, frame, NULL);
  char lacks[64];
  if (n == 3)
    snprintf(lacks, sizeof lacks, "%s, %s and %s", miss[0], miss[1],
             miss[2]);
  else
    snprintf(lacks, sizeof lacks, "%s and %s", miss[0], miss[1]);
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                         "%s[%u] is a dict without %s, expected %s",
                         key_names[key], i, lacks, frame);
}

static int get_stack(rd_t *r, const fields_t *f, int key,
                     msnap_stack_t *out) {
  msnap_pv_t v = f->v[key];
  if (IS_REC(v, REC_STACK))
    *out = (msnap_stack_t)MSNAP_PV_REC_INDEX(v);
  else if (IS_REC(v, REC_EMPTY))
    *out = MSNAP_STACK_EMPTY;
  else
    return bad_frames(r, key, v);
  return 0;
}

/* forward_frames: a list of str (REC_STRLIST, made when it was stored). */
static int get_strlist(rd_t *r, const fields_t *f, int key, uint32_t *out) {
  msnap_pv_t v = f->v[key];
  if (IS_REC(v, REC_EMPTY)) {
    *out = msnap__snap_strlist(r->s, NULL, 0);
    return *out ? 0 : msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  }
  if (!IS_REC(v, REC_STRLIST)) return bad_type(r, key, v, "a list of str");
  *out = (uint32_t)MSNAP_PV_REC_INDEX(v);
  return 0;
}

/* ---- conversions --------------------------------------------------------- */

#define KEY_BIT(k) (1ull << KEY_##k)
/* The keys of each record's dict that its conversion keeps. */
#define TRACE_KEYS                                                            \
  (KEY_BIT(action) | KEY_BIT(addr) | KEY_BIT(device_free) | KEY_BIT(size) |  \
   KEY_BIT(stream) | KEY_BIT(time_us) | KEY_BIT(compile_context) |           \
   KEY_BIT(user_metadata) | KEY_BIT(internal_metadata) | KEY_BIT(pool_id) |  \
   KEY_BIT(frames) | KEY_BIT(forward_frames))
#define SEGMENT_KEYS                                                          \
  (KEY_BIT(device) | KEY_BIT(address) | KEY_BIT(total_size) |                \
   KEY_BIT(allocated_size) | KEY_BIT(active_size) |                          \
   KEY_BIT(requested_size) | KEY_BIT(stream) | KEY_BIT(segment_type) |       \
   KEY_BIT(segment_pool_id) | KEY_BIT(is_expandable) | KEY_BIT(frames) |     \
   KEY_BIT(forward_frames) | KEY_BIT(blocks))
#define BLOCK_KEYS                                                            \
  (KEY_BIT(address) | KEY_BIT(size) | KEY_BIT(requested_size) |              \
   KEY_BIT(state) | KEY_BIT(frames) | KEY_BIT(forward_frames) |              \
   KEY_BIT(history))
#define HIST_KEYS (KEY_BIT(addr) | KEY_BIT(real_size) | KEY_BIT(frames))
#define ANNOTATION_KEYS                                                       \
  (KEY_BIT(stage) | KEY_BIT(name) | KEY_BIT(device) | KEY_BIT(time_us))
#define TOP_KEYS                                                              \
  (KEY_BIT(segments) | KEY_BIT(device_traces) | KEY_BIT(host_segments) |     \
   KEY_BIT(host_traces) | KEY_BIT(external_annotations) |                    \
   KEY_BIT(allocator_settings) | KEY_BIT(process_info))
#define FRAME_KEYS                                                            \
  (KEY_BIT(name) | KEY_BIT(filename) | KEY_BIT(line) |                       \
   KEY_BIT(fx_node_op) | KEY_BIT(fx_node_name) | KEY_BIT(fx_node_target) |   \
   KEY_BIT(fx_original_trace))

/*
 * The keys of a converted record's dict that the model does not keep (any
 * but `kept`; for a trace entry the one of `addr` and `device_free`
 * that conv_trace did not take): counted in s->keys_dropped, the first
 * distinct str keys named in s->dropped_key with the record's kind in
 * s->dropped_in (s->dropped_more: others, not named, or not str).  The
 * usual record has none and costs a popcount.
 */
static void note_dropped(rd_t *r, const msnap_pitems_t *it,
                         const fields_t *f, uint64_t kept,
                         msnap_dropped_in_t in) {
  kept &= f->present;
  if (msnap_likely(it->n / 2 <= (uint32_t)__builtin_popcountll(kept)))
    return;
  msnap_snap_t *s = r->s;
  for (uint32_t i = 0; i + 1 < it->n; i += 2) {
    msnap_pv_t k = msnap__pitem(it, i);
    bool str = MSNAP_PV_TAG(k) == MSNAP_PV_STR;
    uint64_t id = MSNAP_PV_PAYLOAD(k);
    if (str && id < r->nkey_of && r->key_of[id] &&
        ((kept >> (r->key_of[id] - 1)) & 1u))
      continue; /* (a repeated key is one key, as in pickle.load's dict) */
    s->keys_dropped++;
    int j = 0;
    for (; str && j < MSNAP_SNAP_DROPPED_NAMES; j++) {
      if (s->dropped_key[j] == id && s->dropped_in[j] == in) break;
      if (s->dropped_key[j] == MSNAP_STR_ABSENT) {
        s->dropped_key[j] = (msnap_str_t)id;
        s->dropped_in[j] = (uint8_t)in;
        break;
      }
    }
    if (!str || j == MSNAP_SNAP_DROPPED_NAMES) s->dropped_more = true;
  }
}

static int conv_frame(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_frame_t fr = {0};
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting a frame dict");
  /* a missing key reads as "" / 0, and the frame says it was missing
   * (the writer leaves it out) */
  fr.name = fr.filename = MSNAP_STR_EMPTY;
  fr.absent = (uint8_t)((HAS(f, name) ? 0 : MSNAP_FRAME_NO_NAME) |
                        (HAS(f, filename) ? 0 : MSNAP_FRAME_NO_FILENAME) |
                        (HAS(f, line) ? 0 : MSNAP_FRAME_NO_LINE));
  if (HAS(f, name)) rc = get_str(r, f, KEY_name, &fr.name);
  if (!rc && HAS(f, filename)) rc = get_str(r, f, KEY_filename, &fr.filename);
  if (!rc && HAS(f, line)) rc = get_i64(r, f, KEY_line, &fr.line);
  if (!rc && HAS(f, fx_node_op))
    rc = get_str(r, f, KEY_fx_node_op, &fr.fx_node_op);
  if (!rc && HAS(f, fx_node_name))
    rc = get_str(r, f, KEY_fx_node_name, &fr.fx_node_name);
  if (!rc && HAS(f, fx_node_target))
    rc = get_str(r, f, KEY_fx_node_target, &fr.fx_node_target);
  if (!rc && HAS(f, fx_original_trace))
    rc = get_str(r, f, KEY_fx_original_trace, &fr.fx_original_trace);
  if (rc) return rc;
  uint32_t id = msnap__snap_frame(r->s, &fr);
  if (id == UINT32_MAX)
    return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *v = REC(REC_FRAME, id);
  return 0;
}

/*
 * Trace-entry dict -> a record in the trace pool (REC_TRACE).  Sets a
 * MSNAP_K_* bit per optional key; an unknown action keeps its string.
 */
/* Append a converted entry to the trace pool (below 2^31 entries). */
static inline int pool_push(rd_t *r, const msnap_strace_t *t) {
  if (msnap_unlikely(r->npool == r->pool_cap) &&
      msnap__grow((void **)&r->pool, &r->pool_cap, r->npool, 1,
                  sizeof *r->pool) < 0)
    return MSNAP_ENOMEM;
  r->pool[r->npool] = *t;
  msnap__prefault_ahead(r->pool, ((size_t)r->npool + 1) * sizeof *t,
                        (size_t)r->pool_cap * sizeof *t, &r->pool_ahead);
  r->npool++;
  return 0;
}

static int conv_trace(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_strace_t t;
  msnap_tattr_t a;
  memset(&t, 0, sizeof t);
  memset(&a, 0, sizeof a);
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting a trace entry");
  msnap_str_t as = 0;
  if ((rc = get_str(r, f, KEY_action, &as)) < 0) return rc;
  t.action = MSNAP_ACTION_UNKNOWN;
  if (as < r->naction_of && r->action_of[as]) t.action = r->action_of[as] - 1;
  if (t.action == MSNAP_ACTION_UNKNOWN) a.action_str = as;
  /* of `addr` and `device_free` both present, an oom entry takes
   * device_free (PyTorch's key for it), any other addr */
  if (HAS(f, addr) &&
      !(t.action == MSNAP_ACTION_OOM && HAS(f, device_free))) {
    if ((rc = get_u64(r, f, KEY_addr, &t.addr)) < 0) return rc;
    a.keys |= MSNAP_K_ADDRESS;
  } else if (HAS(f, device_free)) {
    if ((rc = get_u64(r, f, KEY_device_free, &t.addr)) < 0) return rc;
    a.keys |= MSNAP_K_DEVICE_FREE;
  }
  if (HAS(f, size)) {
    if ((rc = get_u64(r, f, KEY_size, &t.size)) < 0) return rc;
    a.keys |= MSNAP_K_SIZE;
  }
  if (HAS(f, stream)) {
    if ((rc = get_i64(r, f, KEY_stream, &a.stream)) < 0) return rc;
    a.keys |= MSNAP_K_STREAM;
  }
  if (HAS(f, time_us)) {
    if ((rc = get_i64(r, f, KEY_time_us, &t.time_us)) < 0) return rc;
    a.keys |= MSNAP_K_TIME;
    r->any_time = true;
  }
  if (HAS(f, compile_context)) {
    if ((rc = get_str(r, f, KEY_compile_context, &a.compile_context)) < 0)
      return rc;
    a.keys |= MSNAP_K_COMPILE_CTX;
    r->any_current_key = true;
  }
  if (HAS(f, user_metadata)) {
    if ((rc = get_str(r, f, KEY_user_metadata, &a.user_metadata)) < 0)
      return rc;
    a.keys |= MSNAP_K_USER_META;
    r->any_current_key = true;
  }
  if (HAS(f, internal_metadata)) {
    if ((rc = get_str(r, f, KEY_internal_metadata, &a.internal_metadata)) < 0)
      return rc;
    a.keys |= MSNAP_K_INTERNAL_META;
  }
  if (HAS(f, pool_id)) {
    if ((rc = get_pair(r, f, KEY_pool_id, &a.pool_id)) < 0) return rc;
    a.keys |= MSNAP_K_POOL_ID;
    r->any_current_key = true;
  }
  if (HAS(f, frames)) {
    if ((rc = get_stack(r, f, KEY_frames, &t.frames)) < 0) return rc;
    a.keys |= MSNAP_K_FRAMES;
  }
  if (HAS(f, forward_frames)) {
    if ((rc = get_strlist(r, f, KEY_forward_frames, &a.forward_frames)) < 0)
      return rc;
    a.keys |= MSNAP_K_FORWARD;
  }
  if ((rc = msnap__snap_trace_set_attr(r->s, &t, &a)) < 0)
    return msnap__pvm_fail(r->vm, rc,
                           rc == MSNAP_ELIMIT
                               ? "more than %u distinct sets of trace entry "
                                 "attributes (stream, pool, metadata)"
                               : "out of memory (%u)",
                           MSNAP_TATTR_MAX);
  if (r->npool >= (1u << 31))
    return msnap__pvm_fail(r->vm, MSNAP_ELIMIT, "more than 2^31 entries");
  if (pool_push(r, &t) < 0)
    return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *v = REC(REC_TRACE, r->npool - 1);
  return 0;
}

/*
 * 2.0 `history` element {addr, real_size, frames} -> histories[].
 */
static int conv_hist(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_shistory_t h = {0};
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting a 2.0 block history entry");
  if (HAS(f, addr)) {
    rc = get_u64(r, f, KEY_addr, &h.addr);
    h.keys |= MSNAP_K_ADDRESS;
  }
  if (!rc) rc = get_u64(r, f, KEY_real_size, &h.real_size);
  h.frames = MSNAP_STACK_ABSENT;
  if (!rc && HAS(f, frames)) rc = get_stack(r, f, KEY_frames, &h.frames);
  if (rc) return rc;
  msnap_shistory_t *p = msnap__snap_add_history(r->s);
  if (!p) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *p = h;
  r->hist_records++;
  *v = REC(REC_HIST, r->s->nhistories - 1);
  return 0;
}

/*
 * Blocks (2.0 history entries) listed again, n more.  A block dict listed
 * again through the memo costs a 2-byte BINGET and a copy of the block
 * (blocks are copied into their segment: 80 bytes) -- `[b] * 5 M` in
 * 10 MB of input read at 1 GB, 25 M in 87 kB of gzip ran out of memory --
 * and a list of history entries taken by many blocks multiplies what is
 * written of them.  A real recording lists each block and history entry
 * once (torch and memsnap write every dict out), so as for trace entries
 * (map_traces) only 1024 more than those made, and one more per 8 bytes
 * of input read so far, may be listed.
 */
static int repeat_bound(rd_t *r, unsigned kind, uint64_t n) {
  bool block = kind == REC_BLOCK;
  uint64_t *listed = block ? &r->block_listed : &r->hist_listed;
  uint64_t made = block ? r->block_records : r->hist_records;
  uint64_t off = msnap__pvm_offset(r->vm);
  if (msnap_unlikely(*listed + n > made + off / 8 + 1024))
    return msnap__pvm_fail(
        r->vm, MSNAP_ELIMIT,
        "%s repeat %s (%llu listed, %llu distinct; the limit: 1024 repeats "
        "and one per 8 bytes of input): %s dicts shared through the memo, "
        "which a real recording never does",
        block ? "block lists" : "history lists",
        block ? "blocks" : "entries", (unsigned long long)(*listed + n),
        (unsigned long long)made, block ? "block" : "history");
  *listed += n;
  return 0;
}

/*
 * A list of block (or 2.0 history) records, made REC_BSPAN / REC_HSPAN
 * when it was stored: its span [first, first + n); *n = 0 for [].
 */
static int rec_span(rd_t *r, int key, msnap_pv_t v, unsigned kind,
                    uint32_t *first, uint32_t *n) {
  *first = *n = 0;
  if (IS_REC(v, REC_EMPTY)) return 0;
  if (!IS_REC(v, kind == REC_BLOCK ? REC_BSPAN : REC_HSPAN)) {
    /* a list with an item that is no such record: name that item */
    const char *item = kind == REC_BLOCK ? "a block dict" : "a history dict";
    const char *defkey = kind == REC_BLOCK ? "state" : "real_size";
    msnap_pobj_t *o = MSNAP_PV_TAG(v) == MSNAP_PV_OBJ
                          ? msnap__pvm_obj(r->vm, v)
                          : NULL;
    for (uint32_t i = 0; o && o->kind == MSNAP_POBJ_LIST && i < o->n; i++)
      if (!IS_REC(msnap__pobj_item(o, i), kind))
        return bad_item(r, key_names[key], i, msnap__pobj_item(o, i), item,
                        defkey);
    return bad_type(r, key, v,
                    kind == REC_BLOCK ? "a list of block dicts"
                                      : "a list of history dicts");
  }
  span_t *sp = &r->spans[MSNAP_PV_REC_INDEX(v)];
  int rc;
  if (sp->claimed && (rc = repeat_bound(r, kind, sp->n)) < 0) return rc;
  if (sp->claimed && kind == REC_BLOCK) {
    /* the same block list in a second segment: its own copy (2.0 block
     * addresses are computed from the segment's address) */
    uint32_t at = r->s->nblocks;
    for (uint32_t i = 0; i < sp->n; i++) {
      msnap_sblock_t *b = msnap__snap_add_block(r->s);
      if (!b) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
      *b = r->s->blocks[sp->first + i];
    }
    *first = at;
    *n = sp->n;
    return 0;
  }
  /* (a history list taken by a second block is shared, not copied) */
  sp->claimed = true;
  *first = sp->first;
  *n = sp->n;
  return 0;
}

/*
 * A list whose items are all block (history) records -> a span of them:
 * consecutive records as they are, others (shared or reordered) copied
 * to the end of their array first.
 */
static int make_span(rd_t *r, const msnap_pitems_t *it, unsigned kind,
                     msnap_pv_t *out) {
  msnap_snap_t *s = r->s;
  uint32_t n = it->n;
  int rc = repeat_bound(r, kind, n);
  if (rc < 0) return rc;
  uint32_t first = (uint32_t)MSNAP_PV_REC_INDEX(msnap__pitem(it, 0));
  bool consecutive = true;
  for (uint32_t i = 1; i < n && consecutive; i++)
    consecutive = MSNAP_PV_REC_INDEX(msnap__pitem(it, i)) == first + i;
  if (!consecutive) {
    first = kind == REC_BLOCK ? s->nblocks : s->nhistories;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t idx = MSNAP_PV_REC_INDEX(msnap__pitem(it, i));
      if (kind == REC_BLOCK) {
        msnap_sblock_t *b = msnap__snap_add_block(s);
        if (!b) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
        *b = s->blocks[idx];
      } else {
        msnap_shistory_t *h = msnap__snap_add_history(s);
        if (!h) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
        *h = s->histories[idx];
      }
    }
  }
  if (msnap__grow((void **)&r->spans, &r->spans_cap, r->nspans, 1,
                  sizeof *r->spans) < 0)
    return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  r->spans[r->nspans] = (span_t){first, n, false};
  *out = REC(kind == REC_BLOCK ? REC_BSPAN : REC_HSPAN, r->nspans);
  r->nspans++;
  return 0;
}

/*
 * Block dict -> blocks[] (laid out again in segment order at STOP).
 */
static int conv_block(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_sblock_t b;
  memset(&b, 0, sizeof b);
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting a block dict");
  if (HAS(f, address)) {
    if ((rc = get_u64(r, f, KEY_address, &b.address)) < 0) return rc;
    b.keys |= MSNAP_K_ADDRESS;
  }
  if ((rc = need(r, f, KEY_size, "block")) < 0 ||
      (rc = get_u64(r, f, KEY_size, &b.size)) < 0)
    return rc;
  if (HAS(f, requested_size)) {
    if ((rc = get_u64(r, f, KEY_requested_size, &b.requested_size)) < 0)
      return rc;
    b.keys |= MSNAP_K_REQUESTED;
  }
  msnap_str_t st = 0;
  if ((rc = get_str(r, f, KEY_state, &st)) < 0) return rc;
  if (st == r->st_alloc)
    b.state = MSNAP_BLOCK_ACTIVE_ALLOCATED;
  else if (st == r->st_pending)
    b.state = MSNAP_BLOCK_ACTIVE_PENDING_FREE;
  else if (st == r->st_inactive)
    b.state = MSNAP_BLOCK_INACTIVE;
  else {
    b.state = MSNAP_BLOCK_UNKNOWN_STATE;
    b.state_str = st;
  }
  if (HAS(f, frames)) {
    if ((rc = get_stack(r, f, KEY_frames, &b.frames)) < 0) return rc;
    b.keys |= MSNAP_K_FRAMES;
  }
  if (HAS(f, forward_frames)) {
    if ((rc = get_strlist(r, f, KEY_forward_frames, &b.forward_frames)) < 0)
      return rc;
    b.keys |= MSNAP_K_FORWARD;
  }
  if (HAS(f, history)) {
    if ((rc = rec_span(r, KEY_history, f->v[KEY_history], REC_HIST,
                       &b.history.first, &b.history.n)) < 0)
      return rc;
    b.keys |= MSNAP_K_HISTORY;
  }
  msnap_sblock_t *p = msnap__snap_add_block(r->s);
  if (!p) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *p = b;
  r->block_records++;
  *v = REC(REC_BLOCK, r->s->nblocks - 1);
  return 0;
}

/*
 * Segment dict -> segments[]; its block list must hold block records,
 * which become the segment's span (2.0 block addresses are computed).
 */
static int conv_segment(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_ssegment_t g;
  memset(&g, 0, sizeof g);
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting a segment dict");
  /* every PyTorch version writes these three (torch/csrc/cuda/
   * memory_snapshot.cpp, and the segment dicts of 1.x's memory_snapshot);
   * the model cannot say "absent", so a file without one is refused
   * rather than read as 0 */
  if ((rc = need(r, f, KEY_device, "segment")) < 0 ||
      (rc = need(r, f, KEY_address, "segment")) < 0 ||
      (rc = need(r, f, KEY_total_size, "segment")) < 0 ||
      (rc = get_i64(r, f, KEY_device, &g.device)) < 0 ||
      (rc = get_u64(r, f, KEY_address, &g.address)) < 0 ||
      (rc = get_u64(r, f, KEY_total_size, &g.total_size)) < 0)
    return rc;
  if (HAS(f, allocated_size) || HAS(f, active_size) ||
      HAS(f, requested_size)) {
    g.keys |= MSNAP_K_REQUESTED;
    /* (one presence bit for the three sums: allocated_size and
     * active_size come together in every version that has either) */
    if ((rc = need(r, f, KEY_allocated_size, "segment")) < 0 ||
        (rc = need(r, f, KEY_active_size, "segment")) < 0)
      return rc;
    if (HAS(f, allocated_size) &&
        (rc = get_u64(r, f, KEY_allocated_size, &g.allocated_size)) < 0)
      return rc;
    if (HAS(f, active_size) &&
        (rc = get_u64(r, f, KEY_active_size, &g.active_size)) < 0)
      return rc;
    if (HAS(f, requested_size)) {
      if ((rc = get_u64(r, f, KEY_requested_size, &g.requested_size)) < 0)
        return rc;
      g.keys |= MSNAP_K_SEG_REQUESTED_SIZE;
    }
  }
  if (HAS(f, stream)) {
    if ((rc = get_i64(r, f, KEY_stream, &g.stream)) < 0) return rc;
    g.keys |= MSNAP_K_STREAM;
  }
  if (HAS(f, segment_type)) {
    msnap_str_t t = 0;
    if ((rc = get_str(r, f, KEY_segment_type, &t)) < 0) return rc;
    if (t == r->seg_large)
      g.is_large = 1;
    else if (t != r->seg_small)
      return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                             "segment_type is neither \"large\" nor "
                             "\"small\"");
    g.keys |= MSNAP_K_SEGMENT_TYPE;
  }
  if (HAS(f, segment_pool_id)) {
    if ((rc = get_pair(r, f, KEY_segment_pool_id, &g.pool_id)) < 0) return rc;
    g.keys |= MSNAP_K_POOL_ID;
  }
  if (HAS(f, is_expandable)) {
    if ((rc = get_bool(r, f, KEY_is_expandable, &g.is_expandable)) < 0)
      return rc;
    g.keys |= MSNAP_K_EXPANDABLE;
  }
  if (HAS(f, frames)) {
    if ((rc = get_stack(r, f, KEY_frames, &g.frames)) < 0) return rc;
    g.keys |= MSNAP_K_FRAMES;
    if (HAS(f, blocks) && f->pos[KEY_frames] > f->pos[KEY_blocks])
      g.keys |= MSNAP_K_FRAMES_LAST;
  }
  if (HAS(f, forward_frames)) {
    if ((rc = get_strlist(r, f, KEY_forward_frames, &g.forward_frames)) < 0)
      return rc;
    g.keys |= MSNAP_K_FORWARD;
  }
  if ((rc = rec_span(r, KEY_blocks, f->v[KEY_blocks], REC_BLOCK,
                     &g.first_block, &g.nblocks)) < 0)
    return rc;
  /* 2.0: blocks without an address start at the segment address */
  uint64_t a = g.address;
  for (uint32_t i = 0; i < g.nblocks; i++) {
    msnap_sblock_t *b = &r->s->blocks[g.first_block + i];
    if (!(b->keys & MSNAP_K_ADDRESS)) b->address = a;
    a += b->size;
  }
  msnap_ssegment_t *p = msnap__snap_add_segment(r->s);
  if (!p) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *p = g;
  *v = REC(REC_SEG, r->s->nsegments - 1);
  return 0;
}

/*
 * external_annotations entry -> annotations[].
 */
static int conv_annotation(rd_t *r, const fields_t *f, msnap_pv_t *v) {
  msnap_sannotation_t a = {0};
  int rc = 0;
  msnap__pvm_set_phase(r->vm, "converting an external_annotations entry");
  msnap_str_t st = 0;
  if ((rc = get_str(r, f, KEY_stage, &st)) < 0) return rc;
  if (st != r->stage_start && st != r->stage_end)
    return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                           "stage is neither \"START\" nor \"END\"");
  a.is_start = st == r->stage_start;
  if (HAS(f, name)) {
    if ((rc = get_str(r, f, KEY_name, &a.name)) < 0) return rc;
    a.keys |= MSNAP_K_ANNOT_NAME;
  }
  if (HAS(f, device)) {
    if ((rc = get_i64(r, f, KEY_device, &a.device)) < 0) return rc;
    a.keys |= MSNAP_K_ANNOT_DEVICE;
  }
  if (a.device < -1 || a.device >= MSNAP_SNAP_MAX_DEVICES)
    return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                           "device %lld is not a device index (expected "
                           "-1..%d)",
                           (long long)a.device, MSNAP_SNAP_MAX_DEVICES - 1);
  if (HAS(f, time_us)) {
    if ((rc = get_i64(r, f, KEY_time_us, &a.time_us)) < 0) return rc;
    a.keys |= MSNAP_K_TIME;
  }
  msnap_sannotation_t *p = msnap__snap_add_annotation(r->s);
  if (!p) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  *p = a;
  *v = REC(REC_ANNOT, r->s->nannotations - 1);
  return 0;
}

/*
 * A list whose first item is a frame record: a stack when every item is
 * one (encoded in one pass: kind check, id, varint), else left generic.
 */
static int frames_to_stack(rd_t *r, msnap_pvm_t *vm, const msnap_pitems_t *it,
                           msnap_pv_t *out) {
  uint32_t n = it->n;
  if (n > MSNAP_STACK_MAX_FRAMES)
    return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                           "a list of %u frames (at most %u)", n,
                           MSNAP_STACK_MAX_FRAMES);
  const uint64_t want = MSNAP_PV_REC_MAKE(REC_FRAME, 0);
  const uint64_t kind_mask = MSNAP_PV_REC_MAKE(0xffff, 0) | 7u;
  /* (the items through locals: the byte stores cannot alias them) */
  const msnap_pv_t *items = it->range ? NULL : it->v;
  msnap_pv_t first = it->first;
  if (r->skip_stacks) {
    for (uint32_t i = 0; i < n; i++) {
      msnap_pv_t v = items ? items[i] : first + ((uint64_t)i << 3);
      if ((v & kind_mask) != want) return 0;
    }
    *out = SKIPPED_STACK;
    return 0;
  }
  unsigned char *enc = msnap__snap_stack_buf(r->s, n), *o = enc;
  if (!enc) return msnap__pvm_fail(vm, MSNAP_ENOMEM, "out of memory");
  uint32_t prev = 0;
  for (uint32_t i = 0; i < n; i++) {
    msnap_pv_t v = items ? items[i] : first + ((uint64_t)i << 3);
    if ((v & kind_mask) != want) return 0;
    uint32_t id = (uint32_t)MSNAP_PV_REC_INDEX(v);
    o = msnap__stack_put2(o, prev, id);
    prev = id;
  }
  msnap_stack_t st = msnap__snap_stack_append(r->s, enc, (size_t)(o - enc), n);
  if (!st) return msnap__pvm_fail(vm, MSNAP_ENOMEM, "out of memory");
  *out = REC(REC_STACK, st);
  return 0;
}

/* The frame reference at q, with at least 6 bytes from q on (each takes
 * at most 5): its width, *id its frame record; 0 when q holds anything
 * else (another opcode, an index past the memo, a value not a frame). */
static inline size_t frame_ref_fast(const unsigned char *q,
                                    const msnap_pv_t *memo,
                                    uint32_t memo_len, uint32_t *id) {
  const uint64_t want = MSNAP_PV_REC_MAKE(REC_FRAME, 0);
  const uint64_t kind_mask = MSNAP_PV_REC_MAKE(0xffff, 0) | 7u;
  uint64_t idx;
  size_t w;
  if (q[0] == MSNAP_OP_LONG_BINGET) {
    idx = (uint64_t)q[1] | (uint64_t)q[2] << 8 | (uint64_t)q[3] << 16 |
          (uint64_t)q[4] << 24;
    w = 5;
  } else if (q[0] == MSNAP_OP_BINGET) {
    idx = q[1];
    w = 2;
  } else {
    return 0;
  }
  if (idx >= memo_len) return 0;
  msnap_pv_t v = memo[idx];
  if ((v & kind_mask) != want) return 0;
  *id = (uint32_t)MSNAP_PV_REC_INDEX(v);
  return w;
}

/* The same anywhere before end (msnap__pref_next near the end). */
static inline size_t frame_ref_next(const unsigned char *q,
                                    const unsigned char *end,
                                    const msnap_pv_t *memo,
                                    uint32_t memo_len, uint32_t *id) {
  if (msnap_likely(end - q >= 6)) return frame_ref_fast(q, memo, memo_len, id);
  const uint64_t want = MSNAP_PV_REC_MAKE(REC_FRAME, 0);
  const uint64_t kind_mask = MSNAP_PV_REC_MAKE(0xffff, 0) | 7u;
  const unsigned char *t = q;
  msnap_pv_t v;
  if (!msnap__pref_next(&t, end, memo, memo_len, &v) ||
      (v & kind_mask) != want)
    return 0;
  *id = (uint32_t)MSNAP_PV_REC_INDEX(v);
  return (size_t)(t - q);
}

/*
 * The fast path's lists of memo references (pickle.h): a frame list
 * encoded straight from its opcodes, as frames_to_stack would from its
 * items -- scan takes frame records only, at most MSNAP_STACK_MAX_FRAMES
 * of them, and writes their encoding in place at the end of the model's
 * stack bytes (msnap__snap_stack_tail); close makes it a stack.  With
 * skip_stacks it takes the same references and encodes nothing.
 */
static uint32_t refs_scan(void *ctx, const msnap_pv_t *memo,
                          uint32_t memo_len, const unsigned char **qp,
                          const unsigned char *end) {
  rd_t *r = ctx;
  const unsigned char *q = *qp;
  uint32_t n = 0, id;
  size_t w;
  if (r->skip_stacks) {
    while (n < MSNAP_STACK_MAX_FRAMES &&
           (w = frame_ref_next(q, end, memo, memo_len, &id)) != 0) {
      q += w;
      n++;
    }
    *qp = q;
    r->scan_nb = 0;
    return n;
  }
  uint32_t room = 128, prev = 0;
  /* (written in place: room for `room` ids, msnap__stack_put2's spare
   * byte and more) */
  unsigned char *enc = msnap__snap_stack_tail(r->s, (size_t)room * 5 + 16);
  unsigned char *o = enc;
  if (!enc) return 0;
  for (;;) {
    if (msnap_unlikely(n == room)) {
      if (n == MSNAP_STACK_MAX_FRAMES) break;
      room = n * 2 < MSNAP_STACK_MAX_FRAMES ? n * 2 : MSNAP_STACK_MAX_FRAMES;
      unsigned char *e = msnap__snap_stack_tail(r->s, (size_t)room * 5 + 16);
      if (!e) return 0;
      o = e + (o - enc);
      enc = e;
    }
    if (msnap_likely(end - q >= 6)) {
      /* as many references as surely have 6 bytes left and room: no end
       * or room tests per reference */
      size_t k = (size_t)(end - q - 6) / 5 + 1;
      uint32_t stop = k < room - n ? n + (uint32_t)k : room;
      do {
        if (!(w = frame_ref_fast(q, memo, memo_len, &id))) goto done;
        q += w;
        o = msnap__stack_put2(o, prev, id);
        prev = id;
      } while (++n < stop);
      continue;
    }
    if (!(w = frame_ref_next(q, end, memo, memo_len, &id))) break;
    q += w;
    o = msnap__stack_put2(o, prev, id);
    prev = id;
    n++;
  }
done:
  *qp = q;
  r->scan_nb = (size_t)(o - enc);
  return n;
}

static msnap_pv_t refs_close(void *ctx, uint32_t n) {
  rd_t *r = ctx;
  if (r->skip_stacks) return SKIPPED_STACK;
  msnap_stack_t st = msnap__snap_stack_append_tail(r->s, r->scan_nb, n);
  return st ? REC(REC_STACK, st) : 0;
}

static const msnap_pvm_refs_t frame_refs = {refs_scan, refs_close};

/* An int token at *q, at least 16 bytes before end (msnap__pint_token):
 * *x the value the VM would give, *q past it.  false: another token. */
static inline bool entry_int(const unsigned char **qp, int64_t *x) {
  size_t w = msnap__pint_token(*qp, 16, x);
  *qp += w;
  return w != 0;
}

/* What entry_scan found for a str value: a memo reference's id, or the
 * bytes of a new str (interned when the entry is made). */
typedef struct entry_str_s {
  const unsigned char *p; /* NULL: id */
  size_t n;
  msnap_str_t id;
} entry_str_t;

/* A put entry_scan found: its slot, and what it puts (a str value, or
 * the frame list). */
typedef struct entry_put_s {
  const unsigned char *at;
  uint32_t slot;
  int str; /* index into the entry's strs; -1: the frame list */
} entry_put_t;

#define ENTRY_PUTS 4

/* A put at *q (peeked, its slot checked free of the puts before it),
 * noted in puts; *q past it.  false: leave the dict to the VM. */
static inline bool entry_put(msnap_pvm_t *vm, const unsigned char **q,
                             const unsigned char *end, entry_put_t *puts,
                             unsigned *nputs, int str) {
  uint32_t slot;
  size_t w;
  int pk = msnap__pvm_put_peek(vm, *q, end, *nputs, &slot, &w);
  if (pk <= 0) return pk == 0;
  if (*nputs == ENTRY_PUTS) return false;
  for (unsigned i = 0; i < *nputs; i++)
    if (puts[i].slot == slot) return false;
  puts[(*nputs)++] = (entry_put_t){*q, slot, str};
  *q += w;
  return true;
}

/*
 * The fast path's trace entries (pickle.h, msnap_pvm_dicts_t): a dict
 * whose first key is 'action' and whose keys are memo references to
 * action / addr / size / stream / time_us / frames / compile_context /
 * user_metadata, each once -- the entries of every PyTorch version to
 * date -- read straight into the pool.  The values: a str (a memo
 * reference, or new: SHORT_BINUNICODE / BINUNICODE and its put, as
 * PyTorch 2.6+ writes compile_context), an int (BININT*, LONG1 up to 8
 * bytes; addr and size not negative), for frames a memo reference to a
 * stack or [] or a new frame list (refs_scan, then its put).  Anything
 * else -- another key or value shape, a FRAME, a second batch, the last
 * 16 bytes of the input -- returns 0 before any change and the VM reads
 * the dict item by item; conv_trace then gives the same entry (or the
 * error).  Nothing changes until the whole dict is read: then the new
 * strings are interned and the puts made in the order of the input, the
 * frame list becomes a stack, and the entry is made.
 */
static int entry_scan(void *ctx, msnap_pvm_t *vm, const msnap_pv_t *memo,
                      uint32_t memo_len, const unsigned char **qp,
                      const unsigned char *end, msnap_pv_t *out) {
  rd_t *r = ctx;
  const unsigned char *q = *qp + 1; /* past MARK */
  const uint8_t *key_of = r->key_of;
  const uint32_t nkey_of = r->nkey_of;
  msnap_strace_t t;
  msnap_tattr_t a;
  memset(&t, 0, sizeof t);
  memset(&a, 0, sizeof a);
  uint32_t seen = 0;
  /* the str values: action, compile_context, user_metadata */
  entry_str_t strs[3];
  int str_key[3];
  unsigned nstrs = 0;
  entry_put_t puts[ENTRY_PUTS];
  unsigned nputs = 0;
  /* a new frame list: its frame count (0: []) */
  bool new_list = false;
  uint32_t nframes = 0;
  for (;;) {
    if (end - q < 16) return 0;
    if (q[0] == MSNAP_OP_SETITEMS && seen) break;
    uint64_t idx;
    if (q[0] == MSNAP_OP_BINGET) {
      idx = q[1];
      q += 2;
    } else if (q[0] == MSNAP_OP_LONG_BINGET) {
      idx = (uint64_t)q[1] | (uint64_t)q[2] << 8 | (uint64_t)q[3] << 16 |
            (uint64_t)q[4] << 24;
      q += 5;
    } else {
      return 0;
    }
    if (idx >= memo_len) return 0;
    msnap_pv_t k = memo[idx];
    uint64_t sid = MSNAP_PV_PAYLOAD(k);
    if (MSNAP_PV_TAG(k) != MSNAP_PV_STR || sid >= nkey_of || !key_of[sid])
      return 0;
    unsigned key = key_of[sid] - 1u;
    if (!seen && key != KEY_action) return 0;
    if (key >= 32 || ((seen >> key) & 1u)) return 0;
    seen |= 1u << key;
    int64_t x;
    msnap_pv_t v;
    switch (key) {
    case KEY_action:
    case KEY_compile_context:
    case KEY_user_metadata: {
      entry_str_t *e = &strs[nstrs];
      str_key[nstrs] = (int)key;
      if (q[0] == MSNAP_OP_SHORT_BINUNICODE ||
          q[0] == MSNAP_OP_BINUNICODE) {
        size_t w = q[0] == MSNAP_OP_SHORT_BINUNICODE ? 1 : 4;
        uint64_t n = w == 1 ? q[1]
                            : (uint64_t)q[1] | (uint64_t)q[2] << 8 |
                                  (uint64_t)q[3] << 16 |
                                  (uint64_t)q[4] << 24;
        if (n > (uint64_t)(end - q) - 1 - w) return 0;
        e->p = q + 1 + w;
        e->n = (size_t)n;
        e->id = 0;
        q += 1 + w + n;
        if (!entry_put(vm, &q, end, puts, &nputs, (int)nstrs)) return 0;
      } else {
        if (!msnap__pref_next(&q, end, memo, memo_len, &v) ||
            MSNAP_PV_TAG(v) != MSNAP_PV_STR)
          return 0;
        e->p = NULL;
        e->id = (msnap_str_t)MSNAP_PV_PAYLOAD(v);
      }
      nstrs++;
      break;
    }
    case KEY_addr:
    case KEY_size:
      if (!entry_int(&q, &x) || x < 0) return 0;
      if (key == KEY_addr) {
        t.addr = (uint64_t)x;
        a.keys |= MSNAP_K_ADDRESS;
      } else {
        t.size = (uint64_t)x;
        a.keys |= MSNAP_K_SIZE;
      }
      break;
    case KEY_stream:
      if (!entry_int(&q, &x)) return 0;
      a.stream = x;
      a.keys |= MSNAP_K_STREAM;
      break;
    case KEY_time_us:
      if (!entry_int(&q, &x)) return 0;
      t.time_us = x;
      a.keys |= MSNAP_K_TIME;
      break;
    case KEY_frames:
      a.keys |= MSNAP_K_FRAMES;
      if (q[0] == MSNAP_OP_EMPTY_LIST) {
        q++;
        if (!entry_put(vm, &q, end, puts, &nputs, -1)) return 0;
        new_list = true;
        /* (no MARK: [] when a key or SETITEMS follows -- a list of one
         * item, `item APPEND`, stops the loop at APPEND, which is never
         * a key or a value) */
        if (q[0] == MSNAP_OP_MARK) {
          if (q[1] != MSNAP_OP_BINGET && q[1] != MSNAP_OP_LONG_BINGET)
            return 0;
          q++;
          nframes = refs_scan(r, memo, memo_len, &q, end);
          /* (one batch, closed: the VM's fp_refs) */
          if (!nframes || end - q < 2 || q[0] != MSNAP_OP_APPENDS ||
              q[1] == MSNAP_OP_MARK || q[1] == MSNAP_OP_FRAME)
            return 0;
          q++;
        }
      } else {
        if (!msnap__pref_next(&q, end, memo, memo_len, &v)) return 0;
        if (IS_REC(v, REC_STACK))
          t.frames = (msnap_stack_t)MSNAP_PV_REC_INDEX(v);
        else if (IS_REC(v, REC_EMPTY))
          t.frames = MSNAP_STACK_EMPTY;
        else
          return 0;
      }
      break;
    default:
      return 0;
    }
  }
  q++; /* SETITEMS */
  if (q < end && (q[0] == MSNAP_OP_MARK || q[0] == MSNAP_OP_FRAME)) return 0;
  if (r->npool >= (1u << 31)) return 0;
  /* the changes, in the order of the input (the VM's): new strings and
   * their puts, the frame list (a stack) and its put, the entry */
  msnap_pv_t list_value = 0;
  if (new_list) {
    if (nframes && r->skip_stacks) {
      t.frames = MSNAP_STACK_EMPTY;
      list_value = SKIPPED_STACK;
    } else if (nframes) {
      msnap_stack_t st =
          msnap__snap_stack_append_tail(r->s, r->scan_nb, nframes);
      if (!st) return -1;
      t.frames = st;
      list_value = REC(REC_STACK, st);
    } else {
      t.frames = MSNAP_STACK_EMPTY;
      list_value = REC(REC_EMPTY, 0);
    }
  }
  for (unsigned i = 0; i < nstrs; i++)
    if (strs[i].p &&
        !(strs[i].id = msnap__snap_intern(r->s, (const char *)strs[i].p,
                                          strs[i].n)))
      return -1;
  for (unsigned i = 0; i < nputs; i++) {
    msnap_pv_t pv = puts[i].str < 0
                        ? list_value
                        : MSNAP_PV_MAKE(MSNAP_PV_STR, strs[puts[i].str].id);
    if (!msnap__pvm_put(vm, puts[i].slot, pv, puts[i].at)) return -1;
  }
  for (unsigned i = 0; i < nstrs; i++) {
    msnap_str_t id = strs[i].id;
    if (str_key[i] == KEY_action) {
      t.action = MSNAP_ACTION_UNKNOWN;
      if (id < r->naction_of && r->action_of[id])
        t.action = r->action_of[id] - 1;
      if (t.action == MSNAP_ACTION_UNKNOWN) a.action_str = id;
    } else if (str_key[i] == KEY_compile_context) {
      a.compile_context = id;
      a.keys |= MSNAP_K_COMPILE_CTX;
    } else {
      a.user_metadata = id;
      a.keys |= MSNAP_K_USER_META;
    }
  }
  if (a.keys & (MSNAP_K_COMPILE_CTX | MSNAP_K_USER_META))
    r->any_current_key = true;
  if (a.keys & MSNAP_K_TIME) r->any_time = true;
  if (msnap__snap_trace_set_attr(r->s, &t, &a) < 0 || pool_push(r, &t) < 0)
    return -1;
  *out = REC(REC_TRACE, r->npool - 1);
  *qp = q;
  r->entries_scanned++;
  return 1;
}

static const msnap_pvm_dicts_t trace_dicts = {entry_scan};

/*
 * The VM's completion callback: classify a finished container by its
 * items and turn it into a record (see the header comment); *out stays 0
 * for shapes that remain generic.  The VM's fast path calls it with the
 * same items at the same point of the stream, so both give one model.
 */
static int snap_convert_one(rd_t *r, msnap_pvm_t *vm, unsigned kind,
                            const msnap_pitems_t *it, msnap_pv_t *out);

static int snap_convert(void *ctx, msnap_pvm_t *vm, unsigned kind,
                        const msnap_pitems_t *it, msnap_pv_t *out) {
  rd_t *r = ctx;
  int rc = snap_convert_one(r, vm, kind, it, out);
  if (rc < 0 && rc != MSNAP_ENOMEM) r->convert_failed = true;
  return rc;
}

static int snap_convert_one(rd_t *r, msnap_pvm_t *vm, unsigned kind,
                            const msnap_pitems_t *it, msnap_pv_t *out) {
  uint32_t n = it->n;
  if (kind == MSNAP_POBJ_LIST) {
    if (n == 0) {
      *out = REC(REC_EMPTY, 0);
      return 0;
    }
    msnap_pv_t v0 = msnap__pitem(it, 0);
    unsigned k0 = MSNAP_PV_TAG(v0) == MSNAP_PV_REC ? MSNAP_PV_REC_KIND(v0)
                  : MSNAP_PV_TAG(v0) == MSNAP_PV_STR ? REC_STRLIST
                                                     : 0;
    if (k0 != REC_FRAME && k0 != REC_BLOCK && k0 != REC_HIST &&
        k0 != REC_STRLIST)
      return 0;
    /* (a frame list is checked while it is encoded) */
    for (uint32_t i = 1; i < n && k0 != REC_FRAME; i++) {
      msnap_pv_t v = msnap__pitem(it, i);
      if (k0 == REC_STRLIST ? MSNAP_PV_TAG(v) != MSNAP_PV_STR
                            : !IS_REC(v, k0))
        return 0;
    }
    if (k0 == REC_BLOCK || k0 == REC_HIST) return make_span(r, it, k0, out);
    if (k0 == REC_STRLIST) {
      if (ids_room(r, n) < 0) return MSNAP_ENOMEM;
      for (uint32_t i = 0; i < n; i++)
        r->ids[i] = (uint32_t)MSNAP_PV_PAYLOAD(msnap__pitem(it, i));
      uint32_t id = msnap__snap_strlist(r->s, r->ids, n);
      if (!id) return msnap__pvm_fail(vm, MSNAP_ENOMEM, "out of memory");
      *out = REC(REC_STRLIST, id);
      return 0;
    }
    return frames_to_stack(r, vm, it, out);
  }
  if (kind == MSNAP_POBJ_TUPLE) {
    if (n != 2) return 0;
    uint64_t ab[2];
    for (int i = 0; i < 2; i++) {
      int64_t x;
      uint64_t u;
      msnap_pv_t v = msnap__pitem(it, (uint32_t)i);
      msnap_pint_t k = msnap__pvm_int(vm, v, &x, &u);
      if (MSNAP_PV_TAG(v) == MSNAP_PV_CONST) return 0;
      if (k == MSNAP_PINT_I64 && x >= 0)
        ab[i] = (uint64_t)x;
      else if (k == MSNAP_PINT_U64)
        ab[i] = u;
      else
        return 0;
    }
    uint32_t id = pair_intern(r, ab[0], ab[1]);
    if (id == UINT32_MAX)
      return msnap__pvm_fail(vm, MSNAP_ENOMEM, "out of memory");
    *out = REC(REC_PAIR, id);
    return 0;
  }
  if (kind != MSNAP_POBJ_DICT) return 0;
  fields_t f;
  get_fields(r, it, &f);
  int rc;
  uint64_t kept;
  msnap_dropped_in_t in;
  if (HAS(&f, action)) {
    rc = conv_trace(r, &f, out);
    kept = TRACE_KEYS;
    if (rc == 0 && HAS(&f, addr) && HAS(&f, device_free))
      kept &= r->pool[r->npool - 1].action == MSNAP_ACTION_OOM
                  ? ~KEY_BIT(addr)
                  : ~KEY_BIT(device_free);
    in = MSNAP_DROPPED_IN_TRACE;
  } else if (HAS(&f, blocks) && !HAS(&f, segments)) {
    rc = conv_segment(r, &f, out);
    kept = SEGMENT_KEYS;
    in = MSNAP_DROPPED_IN_SEGMENT;
  } else if (HAS(&f, state)) {
    rc = conv_block(r, &f, out);
    kept = BLOCK_KEYS;
    in = MSNAP_DROPPED_IN_BLOCK;
  } else if (HAS(&f, real_size)) {
    rc = conv_hist(r, &f, out);
    kept = HIST_KEYS;
    in = MSNAP_DROPPED_IN_HISTORY;
  } else if (HAS(&f, stage)) {
    rc = conv_annotation(r, &f, out);
    kept = ANNOTATION_KEYS;
    in = MSNAP_DROPPED_IN_ANNOTATION;
  } else if ((HAS(&f, filename) || (HAS(&f, name) && HAS(&f, line))) &&
             !HAS(&f, segments)) {
    rc = conv_frame(r, &f, out);
    kept = FRAME_KEYS;
    in = MSNAP_DROPPED_IN_FRAME;
  } else {
    return 0;
  }
  if (rc == 0 && *out) note_dropped(r, it, &f, kept, in);
  return rc;
}

/* The fast path's checkpoint: what its records appended (the VM undoes
 * its own memo writes; interned strings, frames, stacks and pairs are
 * found again by content), and whether a conversion failed -- a refusal
 * inside a batch rolled back is not one the generic interpreter makes
 * when it stops earlier (at a FRAME longer than the input, say), and the
 * flag decides how a failed read is worded (msnap__snap_read_source). */
static void snap_save(void *ctx, uint64_t st[MSNAP_PVM_SAVE_WORDS]) {
  rd_t *r = ctx;
  st[0] = r->npool;
  st[1] = r->s->nblocks;
  st[2] = r->s->nhistories;
  st[3] = r->s->nsegments;
  st[4] = r->s->nannotations;
  st[5] = r->nspans;
  st[6] = r->s->utf8_repaired;
  st[7] = r->s->keys_dropped;
  st[8] = r->block_records;
  st[9] = r->hist_records;
  st[10] = r->block_listed;
  st[11] = r->hist_listed;
  st[12] = r->convert_failed;
}

static void snap_restore(void *ctx, const uint64_t st[MSNAP_PVM_SAVE_WORDS]) {
  rd_t *r = ctx;
  r->npool = (uint32_t)st[0];
  r->s->nblocks = (uint32_t)st[1];
  r->s->nhistories = (uint32_t)st[2];
  r->s->nsegments = (uint32_t)st[3];
  r->s->nannotations = (uint32_t)st[4];
  r->nspans = (uint32_t)st[5];
  r->s->utf8_repaired = st[6];
  r->s->keys_dropped = st[7]; /* (the names are found again) */
  r->block_records = st[8];
  r->hist_records = st[9];
  r->block_listed = st[10];
  r->hist_listed = st[11];
  r->convert_failed = st[12] != 0;
}

/* REC values inside generic parts (allocator_settings): only [] is known. */
static int rec_gv(void *ctx, msnap_pv_t v, msnap_gv_t *out) {
  rd_t *r = ctx;
  if (IS_REC(v, REC_EMPTY)) {
    memset(out, 0, sizeof *out);
    out->kind = MSNAP_GV_LIST;
    return 0;
  }
  if (IS_REC(v, REC_STRLIST)) {
    msnap_span_t sp = r->s->strlists[MSNAP_PV_REC_INDEX(v)];
    msnap_gv_t *it = sp.n ? calloc(sp.n, sizeof *it) : NULL;
    if (sp.n && !it)
      return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < sp.n; i++) {
      it[i].kind = MSNAP_GV_STR;
      it[i].u.s = r->s->strlist_items[sp.first + i];
    }
    memset(out, 0, sizeof *out);
    out->kind = MSNAP_GV_LIST;
    out->u.seq.items = it;
    out->u.seq.n = sp.n;
    return 0;
  }
  if (IS_REC(v, REC_PAIR)) {
    msnap_mempool_id_t p = r->pairs.v[MSNAP_PV_REC_INDEX(v)];
    msnap_gv_t *it = calloc(2, sizeof *it);
    if (!it || p.first > INT64_MAX || p.second > INT64_MAX) {
      free(it);
      return msnap__pvm_fail(r->vm, MSNAP_EFORMAT, "pair out of range");
    }
    it[0].kind = it[1].kind = MSNAP_GV_INT;
    it[0].u.i = (int64_t)p.first;
    it[1].u.i = (int64_t)p.second;
    out->kind = MSNAP_GV_TUPLE;
    out->u.seq.items = it;
    out->u.seq.n = 2;
    return 0;
  }
  return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                         "a snapshot record inside allocator_settings");
}

/* ---- the root ------------------------------------------------------------ */

/* Lay segments (in the order of `list`) and their blocks out into fresh
 * arrays: the device ones into segments/blocks, or host ones. */
static int place_segments(rd_t *r, int key, msnap_pv_t list,
                          const msnap_ssegment_t *segs,
                          const msnap_sblock_t *blocks, bool host) {
  msnap_snap_t *s = r->s;
  if (IS_REC(list, REC_EMPTY)) return 0;
  msnap_pobj_t *o = msnap__pvm_obj(r->vm, list);
  if (!o || o->kind != MSNAP_POBJ_LIST)
    return bad_type(r, key, list, "a list of segment dicts");
  uint64_t nb = 0;
  for (uint32_t i = 0; i < o->n; i++) {
    if (!IS_REC(msnap__pobj_item(o, i), REC_SEG))
      return bad_item(r, key_names[key], i, msnap__pobj_item(o, i),
                      "a segment dict", "blocks");
    nb += segs[MSNAP_PV_REC_INDEX(msnap__pobj_item(o, i))].nblocks;
  }
  /* a segment listed many times (memo references) would multiply its
   * blocks: allow what a sane file can hold, refuse amplification */
  if (nb > UINT32_MAX - 2 ||
      nb > 2 * (uint64_t)r->nblock_records + r->len / 2 + 1024 ||
      o->n > 2 * (uint64_t)r->nseg_records + r->len / 2 + 1024)
    return msnap__pvm_fail(r->vm, MSNAP_ELIMIT,
                           "'%s' repeats segments (%u listed, %llu blocks)",
                           key_names[key], o->n, (unsigned long long)nb);
  msnap_ssegment_t *ns = malloc(((size_t)o->n + 1) * sizeof *ns);
  msnap_sblock_t *nbk = malloc(((size_t)nb + 1) * sizeof *nbk);
  if (!ns || !nbk) {
    free(ns);
    free(nbk);
    return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < o->n; i++) {
    ns[i] = segs[MSNAP_PV_REC_INDEX(msnap__pobj_item(o, i))];
    /* one rule for every command: a device is an index (host segments
     * say -1), so nothing sized by it can blow up */
    int64_t dev = ns[i].device;
    if (dev < (host ? -1 : 0) || dev >= MSNAP_SNAP_MAX_DEVICES) {
      free(ns);
      free(nbk);
      return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                             "%s[%u]: device %lld is not a device index "
                             "(expected %d..%d)",
                             key_names[key], i, (long long)dev,
                             host ? -1 : 0, MSNAP_SNAP_MAX_DEVICES - 1);
    }
    if (ns[i].nblocks)
      memcpy(nbk + k, blocks + ns[i].first_block,
             (size_t)ns[i].nblocks * sizeof *nbk);
    ns[i].first_block = k;
    k += ns[i].nblocks;
  }
  if (host) {
    s->host_segments = ns;
    s->nhost_segments = s->host_segments_cap = o->n;
    s->host_blocks = nbk;
    s->nhost_blocks = s->host_blocks_cap = k;
  } else {
    s->segments = ns;
    s->nsegments = s->segments_cap = o->n;
    s->blocks = nbk;
    s->nblocks = s->blocks_cap = k;
  }
  return 0;
}

/* A list of trace records -> (first, n) when consecutive in the pool. */
static int trace_items(rd_t *r, int key, int64_t dev, msnap_pv_t list,
                       msnap_pobj_t **po) {
  *po = NULL;
  if (IS_REC(list, REC_EMPTY)) return 0;
  char name[48];
  if (dev >= 0)
    snprintf(name, sizeof name, "%s[%lld]", key_names[key], (long long)dev);
  else
    snprintf(name, sizeof name, "%s", key_names[key]);
  msnap_pobj_t *o = msnap__pvm_obj(r->vm, list);
  if (!o || o->kind != MSNAP_POBJ_LIST) {
    char what[96];
    describe_item(r, list, "action", what, sizeof what);
    return msnap__pvm_fail(r->vm, MSNAP_EFORMAT,
                           "%s is %s, expected a list of trace entry dicts",
                           name, what);
  }
  for (uint32_t i = 0; i < o->n; i++)
    if (!IS_REC(msnap__pobj_item(o, i), REC_TRACE))
      return bad_item(r, name, i, msnap__pobj_item(o, i),
                      "a trace entry dict", "action");
  *po = o;
  return 0;
}

/*
 * Copy the records of a trace list out of the pool into l.
 */
static int copy_traces(rd_t *r, msnap_pobj_t *o, msnap_trace_list_t *l) {
  if (!o || o->n == 0) return 0;
  l->v = malloc((size_t)o->n * sizeof *l->v);
  if (!l->v) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < o->n; i++)
    l->v[i] = r->pool[MSNAP_PV_REC_INDEX(msnap__pobj_item(o, i))];
  l->n = l->cap = o->n;
  return 0;
}

/*
 * True when the list's records are pool[0..n): it may take the pool.
 */
static bool starts_pool(const msnap_pobj_t *o) {
  if (!o || o->n == 0) return false;
  for (uint32_t i = 0; i < o->n; i++)
    if (MSNAP_PV_REC_INDEX(msnap__pobj_item(o, i)) != i) return false;
  return true;
}

/*
 * device_traces / host_traces -> the model's trace lists.  The first
 * device list that starts the pool takes the pool array (no copy).
 */
static int map_traces(rd_t *r, const fields_t *f) {
  msnap_snap_t *s = r->s;
  msnap__pvm_set_phase(r->vm, "mapping device_traces");
  msnap_pobj_t *host = NULL;
  int rc;
  if (HAS(f, host_traces) &&
      (rc = trace_items(r, KEY_host_traces, -1, f->v[KEY_host_traces], &host)) < 0)
    return rc;
  uint32_t nd = 0;
  msnap_pv_t dt = f->v[KEY_device_traces];
  msnap_pobj_t *outer = NULL;
  if (HAS(f, device_traces) && !IS_REC(dt, REC_EMPTY)) {
    outer = msnap__pvm_obj(r->vm, dt);
    if (!outer || outer->kind != MSNAP_POBJ_LIST)
      return bad_type(r, KEY_device_traces, dt, "a list of lists");
    nd = outer->n;
    if (nd > MSNAP_SNAP_MAX_DEVICES)
      return msnap__pvm_fail(r->vm, MSNAP_ELIMIT,
                             "device_traces has %u lists: more than %d "
                             "devices",
                             nd, MSNAP_SNAP_MAX_DEVICES);
  }
  if (nd && msnap__snap_set_devices(s, nd) < 0)
    return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  /* Entries or lists repeated through the memo would multiply the
   * entries: a 2-byte BINGET of a trace entry dict costs a 32-byte model
   * entry and an 8-byte list item (tracebomb: 5 M references to one dict,
   * 10 MB of input, 238 MB of memory).  A real recording never shares
   * one (each entry is its own dict; torch and memsnap write every one
   * out), so beyond the distinct entries only 1024 more, and one more per
   * 8 bytes of input, may be listed: repeats then cost at most 5 bytes of
   * memory per input byte (not 20). */
  uint64_t total = host ? host->n : 0;
  for (uint32_t d = 0; d < nd; d++) {
    msnap_pobj_t *o;
    outer = msnap__pvm_obj(r->vm, dt);
    rc = trace_items(r, KEY_device_traces, d, msnap__pobj_item(outer, d), &o);
    if (rc < 0) return rc;
    total += o ? o->n : 0;
  }
  if (total > (uint64_t)r->npool + r->len / 8 + 1024)
    return msnap__pvm_fail(r->vm, MSNAP_ELIMIT,
                           "trace lists repeat entries (%llu listed, %u "
                           "distinct; the limit: 1024 repeats and one per 8 "
                           "bytes of input): trace entry dicts shared through "
                           "the memo, which a real recording never does",
                           (unsigned long long)total, r->npool);
  int owner = -1;
  for (uint32_t d = 0; d < nd; d++) {
    msnap_pobj_t *o;
    outer = msnap__pvm_obj(r->vm, dt);
    rc = trace_items(r, KEY_device_traces, d, msnap__pobj_item(outer, d), &o);
    if (rc < 0)
      return rc;
    if (owner < 0 && starts_pool(o))
      owner = (int)d;
    else if ((rc = copy_traces(r, o, &s->device_traces[d])) < 0)
      return rc;
  }
  if ((rc = copy_traces(r, host, &s->host_traces)) < 0) return rc;
  if (owner >= 0) {
    msnap_pobj_t *o;
    outer = msnap__pvm_obj(r->vm, dt);
    trace_items(r, KEY_device_traces, owner, msnap__pobj_item(outer, owner),
                &o);
    msnap_strace_t *v = realloc(r->pool, (size_t)o->n * sizeof *v);
    if (!v) v = r->pool;
    s->device_traces[owner].v = v;
    s->device_traces[owner].n = o->n;
    s->device_traces[owner].cap = o->n;
    r->pool = NULL;
    r->npool = r->pool_cap = 0;
  }
  return 0;
}

/*
 * external_annotations list -> annotations[] in list order.
 */
static int map_annotations(rd_t *r, msnap_pv_t list) {
  msnap_snap_t *s = r->s;
  if (IS_REC(list, REC_EMPTY)) {
    s->nannotations = 0;
    return 0;
  }
  msnap_pobj_t *o = msnap__pvm_obj(r->vm, list);
  if (!o || o->kind != MSNAP_POBJ_LIST)
    return bad_type(r, KEY_external_annotations, list, "a list");
  msnap_sannotation_t *na = malloc(((size_t)o->n + 1) * sizeof *na);
  if (!na) return msnap__pvm_fail(r->vm, MSNAP_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < o->n; i++) {
    if (!IS_REC(msnap__pobj_item(o, i), REC_ANNOT)) {
      free(na);
      return bad_type(r, KEY_external_annotations, msnap__pobj_item(o, i),
                      "an annotation dict");
    }
    na[i] = s->annotations[MSNAP_PV_REC_INDEX(msnap__pobj_item(o, i))];
  }
  free(s->annotations);
  s->annotations = na;
  s->nannotations = s->annotations_cap = o->n;
  return 0;
}

/* Map the root value into the model. */
static int map_root(rd_t *r, msnap_pv_t root) {
  msnap_snap_t *s = r->s;
  msnap_pvm_t *vm = r->vm;
  msnap__pvm_set_phase(vm, "mapping the top-level object");
  /* segment and block records so far are the pool; re-laid below */
  msnap_ssegment_t *segs = s->segments;
  msnap_sblock_t *blocks = s->blocks;
  r->nseg_records = s->nsegments;
  r->nblock_records = s->nblocks;
  s->segments = NULL;
  s->blocks = NULL;
  s->nsegments = s->segments_cap = s->nblocks = s->blocks_cap = 0;
  int rc = 0;
  msnap_pobj_t *o = msnap__pvm_obj(vm, root);
  if (IS_REC(root, REC_EMPTY) || (o && o->kind == MSNAP_POBJ_LIST)) {
    s->generation = MSNAP_GEN_SEGMENT_LIST;
    s->top_keys = MSNAP_TOP_SEGMENTS;
    rc = place_segments(r, KEY_segments, root, segs, blocks, false);
  } else if (o && o->kind == MSNAP_POBJ_DICT) {
    fields_t f;
    msnap_pitems_t it = {o->items, o->fwd, o->n,
                         (o->flags & MSNAP_POBJF_RANGE) != 0};
    get_fields(r, &it, &f);
    if (!HAS(&f, segments) && !HAS(&f, device_traces))
      rc = msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "the top-level dict has neither 'segments' nor "
                           "'device_traces'");
    if (!rc && HAS(&f, segments)) {
      s->top_keys |= MSNAP_TOP_SEGMENTS;
      rc = place_segments(r, KEY_segments, f.v[KEY_segments], segs, blocks,
                          false);
    }
    if (!rc && HAS(&f, host_segments)) {
      s->top_keys |= MSNAP_TOP_HOST_SEGMENTS;
      rc = place_segments(r, KEY_host_segments, f.v[KEY_host_segments], segs,
                          blocks, true);
    }
    if (!rc) {
      if (HAS(&f, device_traces)) s->top_keys |= MSNAP_TOP_DEVICE_TRACES;
      if (HAS(&f, host_traces)) s->top_keys |= MSNAP_TOP_HOST_TRACES;
      rc = map_traces(r, &f);
    }
    if (!rc && HAS(&f, external_annotations)) {
      s->top_keys |= MSNAP_TOP_EXTERNAL_ANNOTATIONS;
      rc = map_annotations(r, f.v[KEY_external_annotations]);
    } else if (!rc) {
      s->nannotations = 0;
    }
    if (!rc && HAS(&f, allocator_settings)) {
      s->top_keys |= MSNAP_TOP_ALLOCATOR_SETTINGS;
      msnap__pvm_set_phase(vm, "converting allocator_settings");
      rc = msnap__pvm_to_gv(vm, f.v[KEY_allocator_settings],
                            &s->allocator_settings);
    }
    if (!rc) note_dropped(r, &it, &f, TOP_KEYS, MSNAP_DROPPED_IN_TOP);
    if (!rc && HAS(&f, process_info)) {
      s->top_keys |= MSNAP_TOP_PROCESS_INFO;
      msnap__pvm_set_phase(vm, "converting process_info");
      rc = msnap__pvm_to_gv(vm, f.v[KEY_process_info], &s->process_info);
    }
    /* generation, from the keys seen */
    /* 2.0: blocks carry `history` (or neither `address` nor `frames`) */
    bool old20 = false, no_addr = false, frames = false;
    for (uint32_t i = 0; i < s->nblocks; i++) {
      if (s->blocks[i].keys & MSNAP_K_HISTORY) old20 = true;
      if (!(s->blocks[i].keys & MSNAP_K_ADDRESS)) no_addr = true;
      if (s->blocks[i].keys & MSNAP_K_FRAMES) frames = true;
    }
    if (no_addr && !frames) old20 = true;
    if (old20)
      s->generation = MSNAP_GEN_2_0;
    else if (r->any_current_key ||
             (s->top_keys &
              (MSNAP_TOP_HOST_SEGMENTS | MSNAP_TOP_HOST_TRACES)))
      s->generation = MSNAP_GEN_CURRENT;
    else if (s->top_keys & (MSNAP_TOP_ALLOCATOR_SETTINGS |
                            MSNAP_TOP_EXTERNAL_ANNOTATIONS))
      s->generation = MSNAP_GEN_2_6;
    else if (r->any_time)
      s->generation = MSNAP_GEN_2_2;
    else
      s->generation = MSNAP_GEN_2_1;
  } else {
    char tp[64];
    rc = msnap__pvm_fail(vm, MSNAP_EFORMAT,
                         "the pickle holds %s, not a snapshot dict or a "
                         "list of segments",
                         type_phrase(msnap__pvm_type(vm, root), tp,
                                     sizeof tp));
  }
  free(segs);
  free(blocks);
  return rc;
}

/*
 * Intern the key and value strings (their ids are small, so key_of is a
 * small table) and create the VM with the completion callback.
 */
static int rd_init(rd_t *r, msnap_snap_t *s) {
  memset(r, 0, sizeof *r);
  r->s = s;
  r->pairs.seed = msnap__random_u64();
  r->vm = msnap__pvm_new(s, snap_convert, r);
  if (!r->vm) return MSNAP_ENOMEM;
  msnap__pvm_set_rec_gv(r->vm, rec_gv);
  msnap__pvm_set_checkpoint(r->vm, snap_save, snap_restore);
  msnap__pvm_set_refs(r->vm, &frame_refs);
  msnap__pvm_set_dicts(r->vm, &trace_dicts);
  uint32_t maxid = 0;
  for (int k = 0; k < NKEYS; k++) {
    r->key_str[k] = msnap__snap_intern(s, key_names[k], strlen(key_names[k]));
    if (!r->key_str[k]) return MSNAP_ENOMEM;
    if (r->key_str[k] > maxid) maxid = r->key_str[k];
  }
  r->nkey_of = maxid + 1;
  r->key_of = calloc(r->nkey_of, 1);
  if (!r->key_of) return MSNAP_ENOMEM;
  for (int k = 0; k < NKEYS; k++) r->key_of[r->key_str[k]] = (uint8_t)(k + 1);
  static const char *const action_names[MSNAP_ACTION_COUNT] = {
#define ACTION_NAME_(name, str) str,
      MSNAP_ACTION_MAP(ACTION_NAME_)
#undef ACTION_NAME_
  };
  uint32_t amax = 0;
  for (int a = 0; a < MSNAP_ACTION_COUNT; a++) {
    const char *n = action_names[a];
    if (!(r->action_str[a] = msnap__snap_intern(s, n, strlen(n))))
      return MSNAP_ENOMEM;
    if (r->action_str[a] > amax) amax = r->action_str[a];
  }
  r->naction_of = amax + 1;
  r->action_of = calloc(r->naction_of, 1);
  if (!r->action_of) return MSNAP_ENOMEM;
  for (int a = 0; a < MSNAP_ACTION_COUNT; a++)
    r->action_of[r->action_str[a]] = (uint8_t)(a + 1);
#define I_(field, lit)                                                        \
  if (!(r->field = msnap__snap_intern(s, lit, sizeof lit - 1)))               \
    return MSNAP_ENOMEM;
  I_(st_alloc, "active_allocated")
  I_(st_pending, "active_pending_free")
  I_(st_inactive, "inactive")
  I_(seg_large, "large")
  I_(seg_small, "small")
  I_(stage_start, "START")
  I_(stage_end, "END")
#undef I_
  return 0;
}

static void rd_destroy(rd_t *r) {
  msnap__pvm_free(r->vm);
  free(r->key_of);
  free(r->action_of);
  free(r->pool);
  free(r->pairs.v);
  free(r->pairs.slots);
  free(r->ids);
  free(r->spans);
}

/*
 * Run the VM over src, map the root, check the model.  On success *out
 * owns the model (marked as read from a file).  Wrong inputs are named
 * (msnap__identify_head before parsing, msnap__identify_text after an
 * early failure; text cut short is a truncated protocol-0 pickle).
 * *end (when not NULL): on success, the stream offset just past STOP.
 */
#define READ_HEAD 40

static int read_source(msnap_source_t *src, msnap_snap_t **out,
                       msnap_read_error_t *err, msnap_read_stats_t *stats,
                       uint64_t *end) {
  /* the head: what the file is, when it is not a pickle.  READ_HEAD
   * bytes (the magic numbers need 14), the same for every kind of input,
   * and no more of a stream is waited for: a writer may send a short
   * pickle and keep its end open */
  const unsigned char *p = src->start;
  int frc = msnap__source_fill(src, &p, READ_HEAD);
  if (frc < 0) {
    snprintf(err->msg, sizeof err->msg, "offset 0: %s (while reading)",
             src->err);
    return frc;
  }
  size_t nhead = (size_t)(src->end - p);
  if (nhead > READ_HEAD) nhead = READ_HEAD;
  if (nhead == 0) {
    snprintf(err->msg, sizeof err->msg, "offset 0: the %sinput is empty "
             "(while reading)", msnap__source_codec_name(src));
    return MSNAP_EFORMAT;
  }
  /* compressed twice: the source undoes one gzip/zstd layer, and what
   * it gives starts with a gzip or zstd magic number again */
  if (src->codec != MSNAP_SOURCE_PLAIN) {
    msnap_source_codec_t ic =
        msnap__source_codec_of((const unsigned char *)p, nhead);
    if (ic != MSNAP_SOURCE_PLAIN) {
      const char *inner = ic == MSNAP_SOURCE_GZIP ? "gzip" : "zstd";
      bool outer_gz = src->codec == MSNAP_SOURCE_GZIP;
      snprintf(err->msg, sizeof err->msg,
               "offset 0: not a snapshot pickle: it is compressed twice "
               "(the %sdata decompresses to %s-compressed data again): "
               "undo one layer (%s -dc FILE > ONCE) and read ONCE",
               msnap__source_codec_name(src), inner,
               outer_gz ? "gzip" : "zstd");
      return MSNAP_EFORMAT;
    }
  }
  char what[400];
  size_t at = 0;
  if (msnap__identify_head(p, nhead, what, sizeof what, &at)) {
    err->offset = at;
    snprintf(err->msg, sizeof err->msg, "offset %zu: %s", at, what);
    return MSNAP_EFORMAT;
  }
  /* kept for msnap__identify_text (the window may move while reading) */
  unsigned char head[READ_HEAD];
  memcpy(head, p, nhead);
  msnap_snap_t *s = msnap__snap_new();
  if (!s) {
    snprintf(err->msg, sizeof err->msg, "offset 0: out of memory (while "
                                        "starting)");
    return MSNAP_ENOMEM;
  }
  rd_t r;
  bool pickle_read = false;
  int rc = rd_init(&r, s);
  if (rc == 0) {
    msnap_pv_t root = 0;
    if (stats) msnap__pvm_set_fast(r.vm, !stats->generic_only);
    r.skip_stacks = stats && stats->skip_stacks;
    s->stacks_skipped = r.skip_stacks;
    rc = msnap__pvm_run_source(r.vm, src, &root, err);
    /* the VM read a whole pickle, refused a container's content, or
     * refused code in a text pickle that goes on to STOP: the error is
     * about a pickle, whatever its first bytes look like */
    pickle_read = rc == 0 || r.convert_failed ||
                  (rc == MSNAP_EUNSAFE &&
                   msnap__pvm_refused_text_pickle(r.vm));
    if (stats) {
      msnap__pvm_fast_stats(r.vm, &stats->fast_batches,
                            &stats->fast_rollbacks);
      stats->entries_scanned = r.entries_scanned;
    }
    /* the bytes read up to STOP justify what the lists may repeat */
    r.len = (size_t)msnap__pvm_offset(r.vm) + 1;
    if (rc == 0) rc = map_root(&r, root);
  } else {
    snprintf(err->msg, sizeof err->msg, "offset 0: out of memory (while "
                                        "starting)");
  }
  rd_destroy(&r);
  /* equal stacks get one id (the VM's memory is given back first) */
  if (rc == 0 && msnap__snap_dedupe_stacks(s) < 0) {
    snprintf(err->msg, sizeof err->msg,
             "offset %zu: out of memory (while merging equal stacks)",
             r.len);
    rc = MSNAP_ENOMEM;
  }
  /* compressed input: garbage from corrupt data fails the reader before
   * the member's CRC is reached; the decompressor's error is the cause */
  bool corrupt = false;
  if (rc < 0 && rc != MSNAP_ENOMEM && src->codec != MSNAP_SOURCE_PLAIN &&
      !src->err[0]) {
    uint64_t stopped = err->offset;
    if (msnap__source_check_member(src, stopped) == MSNAP_EFORMAT) {
      snprintf(err->msg, sizeof err->msg,
               "offset %llu: %.300s (while reading; the pickle reader had "
               "stopped at offset %llu on the bytes it gave)",
               (unsigned long long)msnap__source_offset(src, src->end),
               src->err, (unsigned long long)stopped);
      err->offset = msnap__source_offset(src, src->end);
      rc = MSNAP_EFORMAT;
      corrupt = true;
    }
  }
  bool text = rc < 0 && rc != MSNAP_ENOMEM && rc != MSNAP_EIO && !corrupt &&
              !pickle_read &&
              msnap__identify_text(head, nhead, what, sizeof what);
  if (text && strstr(err->msg, MSNAP_PICKLE_TRUNCATED) != NULL) {
    /* text the reader took to its end without a wrong opcode: a pickle of
     * protocol 0 (the text one) cut short, not a text file */
    size_t l = strlen(err->msg);
    snprintf(err->msg + l, sizeof err->msg - l,
             "; it is a pickle of protocol 0 (a text format)");
  } else if (text && err->offset < 512) {
    /* a text file fails in its first bytes: say so, keep the detail */
    char detail[200];
    const char *d = strchr(err->msg, ':');
    snprintf(detail, sizeof detail, "%.199s", d ? d + 2 : err->msg);
    snprintf(err->msg, sizeof err->msg, "offset %llu: %.250s; the pickle "
             "reader stopped there: %s",
             (unsigned long long)err->offset, what, detail);
  }
  if (rc == 0) {
    char msg[256];
    if (msnap__snap_check_model_level(s, false, msg, sizeof msg) < 0) {
      snprintf(err->msg, sizeof err->msg,
               "offset %zu: inconsistent model: %s (while checking)", r.len,
               msg);
      rc = MSNAP_EFORMAT;
    }
  }
  if (rc < 0) {
    msnap__snap_free(s);
    return rc;
  }
  msnap__snap_set_from_reader(s, true);
  *out = s;
  if (end) *end = r.len;
  return 0;
}

/*
 * Read a snapshot from memory (the caller keeps buf; not decompressed).
 */
int msnap__snap_read_buffer_ex(const void *buf, size_t len,
                               msnap_snap_t **out, msnap_read_error_t *err,
                               msnap_read_stats_t *stats) {
  msnap_read_error_t local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  if (!buf && len) return MSNAP_EINVAL;
  msnap_source_t *src;
  if (msnap__source_mem(&src, buf, len) < 0) {
    snprintf(err->msg, sizeof err->msg, "offset 0: out of memory");
    return MSNAP_ENOMEM;
  }
  int rc = read_source(src, out, err, stats, NULL);
  msnap__source_close(src);
  return rc;
}

int msnap__snap_read_buffer(const void *buf, size_t len, msnap_snap_t **out,
                            msnap_read_error_t *err) {
  return msnap__snap_read_buffer_ex(buf, len, out, err, NULL);
}

int msnap__snap_read_source(msnap_source_t *src, msnap_snap_t **out,
                            msnap_read_error_t *err,
                            msnap_read_stats_t *stats) {
  msnap_read_error_t local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  return read_source(src, out, err, stats, NULL);
}

/*
 * Read a snapshot file ("-": standard input) through a source (source.h):
 * a regular file is mapped, anything else streamed with the limit of
 * MEMSNAP_INPUT_LIMIT; gzip and zstd files are decompressed.
 */
int msnap__snap_read_file(const char *path, msnap_snap_t **out,
                          msnap_read_error_t *err) {
  return msnap__snap_read_file_ex(path, out, err, NULL);
}

int msnap__snap_read_file_ex(const char *path, msnap_snap_t **out,
                             msnap_read_error_t *err,
                             msnap_read_stats_t *stats) {
  msnap_read_error_t local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  /* 0 is no limit the source takes (it would mean the default): warned
   * about, as any invalid value */
  uint64_t limit = msnap__env_size_range(MSNAP_ENV_INPUT_LIMIT,
                                         MSNAP_SOURCE_LIMIT_DEFAULT, 1,
                                         UINT64_MAX);
  msnap_source_t *src;
  char why[256];
  int rc = msnap__source_open(&src, path, limit, why, sizeof why);
  if (rc < 0) {
    /* nothing was read: no offset; the name, for callers that print
     * only this message */
    snprintf(err->msg, sizeof err->msg, "%.200s: %s",
             strcmp(path, "-") ? path : "standard input", why);
    return rc;
  }
  uint64_t end = 0;
  rc = read_source(src, out, err, stats, &end);
  if (rc == 0 && (rc = msnap__source_finish(src, end)) < 0) {
    snprintf(err->msg, sizeof err->msg, "offset %llu: %s (after the pickle)",
             (unsigned long long)msnap__source_offset(src, src->end),
             src->err);
    msnap__snap_free(*out);
    *out = NULL;
  }
  msnap__source_close(src);
  return rc;
}
