/*
 * pickle_read.c -- a safe pickle virtual machine.
 *
 * It executes the data opcodes of pickle protocols 0-5 and refuses every
 * opcode that can import or call code (GLOBAL, STACK_GLOBAL, REDUCE,
 * BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID,
 * NEXT_BUFFER, READONLY_BUFFER) with MSNAP_EUNSAFE.  It never trusts the
 * input:
 *   - every declared length is checked against the bytes that remain
 *     before anything is allocated or copied;
 *   - the VM is a loop, never recursion; container nesting and MARK depth
 *     are bounded by MSNAP_PICKLE_MAX_DEPTH (MSNAP_ELIMIT beyond);
 *   - memo indices are bounded by the input position (a pickle cannot
 *     legitimately define more memo entries than it has bytes);
 *   - pops never go below the innermost MARK (stack underflow is an error);
 *   - a reference to a container that a consumer already converted (and the
 *     VM recycled) is detected by a generation number, never aliased.
 *
 * Values (msnap_pv_t, see pickle.h) are 8 bytes: strings are interned ids
 * in a msnap_snap_t, small ints inline, the rest boxed.  Containers live in
 * an object pool.  Whenever a container is stored into another container
 * (APPEND(S), SETITEM(S), ADDITEMS, TUPLE*, LIST, DICT, FROZENSET) or
 * becomes the result, the consumer's complete callback may turn it into a
 * compact record; the VM then frees the container and repoints its memo
 * slot.  This is what keeps snapshot reading within ~1.5x the file size:
 * no generic tree of the whole file ever exists.
 *
 * Integers: ints in [-2^63, 2^64) are exact (boxed when wider than 61
 * bits).  Wider LONG/LONG1/LONG4 values are kept as their two's-complement
 * bytes (MSNAP_PINT_BIG); consumers that need a 64-bit number refuse them
 * with an error (snapshot_read.c does); msnap__pvm_big hands out their
 * bytes (the tests' canonical dump, tests/pickle/canon.c, prints them).
 * Text is interned under the model's UTF-8 policy (invalid bytes become
 * U+FFFD, an encoded surrogate one U+FFFD, msnap__snap_intern); bytes objects are
 * kept as they are.  Text opcodes are decoded: STRING and BINSTRING as
 * ASCII with Python escapes, UNICODE as raw-unicode-escape.
 *
 * Errors read "offset N: <what> (while <phase>)", N being the offset of the
 * opcode being executed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/pickle.h"

#define OBJ_INDEX_BITS 28
#define OBJ_INDEX_MASK ((1u << OBJ_INDEX_BITS) - 1)
#define INLINE_MIN (-(INT64_C(1) << 60))
#define INLINE_MAX ((INT64_C(1) << 60) - 1)
#define PROGRESS_STEP (2u << 20)

_Static_assert(sizeof(msnap_pv_t) == 8, "a VM value is one 8-byte word");
_Static_assert(sizeof(msnap_pobj_t) <= 48, "containers stay small");
_Static_assert(MSNAP_PICKLE_MAX_DEPTH < UINT16_MAX, "depth fits uint16_t");

enum box_kind_e { BOX_FLOAT, BOX_I64, BOX_U64, BOX_BIG };
typedef struct box_s {
  uint8_t kind;
  union {
    double f;
    int64_t i;
    uint64_t u;
    struct {
      uint64_t off;
      uint32_t len;
    } big;
  } v;
} box_t;

enum { OBJF_VISITING = 1, OBJF_MULTI_MEMO = 2, OBJF_CONVERTED = 8 };
_Static_assert((OBJF_CONVERTED & MSNAP_POBJF_RANGE) == 0, "distinct flags");
/* A memo slot the fast path assigned to a container it has not closed
 * yet (never seen by the generic interpreter: resolved or rolled back). */
#define PV_PENDING MSNAP_PV_MAKE(MSNAP_PV_CONST, 4)

typedef struct fp_undo_s {
  uint32_t slot;
  msnap_pv_t old;
} fp_undo_t;

struct msnap_pvm_s {
  msnap_snap_t *snap;
  msnap_pvm_complete_cb cb;
  void *cb_ctx;
  int (*rec_gv)(void *ctx, msnap_pv_t v, msnap_gv_t *out);

  msnap_pv_t *stack;
  uint32_t sn, scap;
  uint32_t *marks;
  uint32_t mn, mcap;

  msnap_pv_t *memo;
  uint32_t memo_cap, memo_len, memo_count;

  msnap_pobj_t *objs;
  uint32_t nobjs, objs_cap;
  uint32_t *free_objs;
  uint32_t nfree, free_cap;

  box_t *boxes;
  uint32_t nboxes, boxes_cap;
  unsigned char *big;
  size_t big_len, big_cap;

  char *scratch;
  size_t scratch_cap;

  msnap_source_t *src;
  size_t op_off;
  unsigned op;
  const char *phase;
  msnap_read_error_t *err;
  bool failed;
  /* refused an opcode of a text pickle that goes on to STOP (refuse) */
  bool refused_text_pickle;

  /* the fast path (see pickle.h) */
  bool fast;
  void (*save)(void *ctx, uint64_t st[MSNAP_PVM_SAVE_WORDS]);
  void (*restore)(void *ctx, const uint64_t st[MSNAP_PVM_SAVE_WORDS]);
  msnap_pv_t *fitems; /* items of the open containers, innermost last */
  uint32_t nfitems, fitems_cap;
  fp_undo_t *undo;    /* memo writes of the batch, to roll back */
  uint32_t nundo, undo_cap;
  uint64_t fast_done, fast_rolled_back;
  const msnap_pvm_refs_t *refs; /* lists of memo references (pickle.h) */
  const msnap_pvm_dicts_t *dicts; /* dicts of a known shape (pickle.h) */

  /* generic values made by msnap__pvm_to_gv, all calls together: nodes
   * left (set on the first call from the input read so far) */
  uint64_t gv_budget, gv_limit;
  uint64_t gv_str_left, gv_str_limit; /* their strings' bytes (pickle.h) */
  bool gv_budget_set;
  bool gv_shared; /* a container converted twice (shared through the memo) */

  /* items held in the item arrays of live containers (ranges of records
   * hold none): bounded as generic values are (obj_extend) */
  uint64_t items_held;
  /* boxed numbers made so far (floats, ints outside the inline range),
   * by their bytes in 8-byte items (box_cost): they live until the VM is
   * freed, so they are never given back; counted with items_held */
  uint64_t box_items;
};

/* ---- errors -------------------------------------------------------------- */

static bool op_known(unsigned op) {
  switch (op) {
#define OP_KNOWN_(name, byte) case MSNAP_OP_##name: return true;
    MSNAP_PICKLE_OPS(OP_KNOWN_)
#undef OP_KNOWN_
  default: return false;
  }
}

static const char *op_name(unsigned op) {
  switch (op) {
#define OP_NAME_(name, byte) case MSNAP_OP_##name: return #name;
    MSNAP_PICKLE_OPS(OP_NAME_)
#undef OP_NAME_
  default: return "unknown opcode";
  }
}

int msnap__pvm_fail(msnap_pvm_t *vm, int rc, const char *fmt, ...) {
  if (vm->failed) return rc;
  vm->failed = true;
  if (!vm->err) return rc;
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  vm->err->offset = vm->op_off;
  if (vm->phase)
    snprintf(vm->err->msg, sizeof vm->err->msg, "offset %zu: %s (while %s)",
             vm->op_off, what, vm->phase);
  else if (!op_known(vm->op)) /* ("unknown opcode 0xc5" says it all) */
    snprintf(vm->err->msg, sizeof vm->err->msg, "offset %zu: %s",
             vm->op_off, what);
  else
    snprintf(vm->err->msg, sizeof vm->err->msg,
             "offset %zu: %s (while decoding %s)", vm->op_off, what,
             op_name(vm->op));
  return rc;
}

uint64_t msnap__pvm_offset(const msnap_pvm_t *vm) { return vm->op_off; }

bool msnap__pvm_refused_text_pickle(const msnap_pvm_t *vm) {
  return vm->refused_text_pickle;
}

void msnap__pvm_set_phase(msnap_pvm_t *vm, const char *phase) {
  vm->phase = phase;
}

static int oom(msnap_pvm_t *vm) {
  return msnap__pvm_fail(vm, MSNAP_ENOMEM, "out of memory");
}

/* ---- construction -------------------------------------------------------- */

msnap_pvm_t *msnap__pvm_new(msnap_snap_t *strings, msnap_pvm_complete_cb cb,
                            void *ctx) {
  msnap_pvm_t *vm = calloc(1, sizeof *vm);
  if (!vm) return NULL;
  vm->snap = strings;
  vm->cb = cb;
  vm->cb_ctx = ctx;
  vm->fast = cb != NULL;
  return vm;
}

void msnap__pvm_set_checkpoint(
    msnap_pvm_t *vm, void (*save)(void *ctx, uint64_t st[MSNAP_PVM_SAVE_WORDS]),
    void (*restore)(void *ctx, const uint64_t st[MSNAP_PVM_SAVE_WORDS])) {
  vm->save = save;
  vm->restore = restore;
}

void msnap__pvm_set_fast(msnap_pvm_t *vm, bool on) {
  vm->fast = on && vm->cb != NULL;
}

void msnap__pvm_set_refs(msnap_pvm_t *vm, const msnap_pvm_refs_t *refs) {
  vm->refs = refs;
}

void msnap__pvm_set_dicts(msnap_pvm_t *vm, const msnap_pvm_dicts_t *dicts) {
  vm->dicts = dicts;
}

void msnap__pvm_fast_stats(const msnap_pvm_t *vm, uint64_t *done,
                           uint64_t *rolled_back) {
  *done = vm->fast_done;
  *rolled_back = vm->fast_rolled_back;
}

void msnap__pvm_free(msnap_pvm_t *vm) {
  if (!vm) return;
  for (uint32_t i = 0; i < vm->nobjs; i++) free(vm->objs[i].items);
  free(vm->objs);
  free(vm->free_objs);
  free(vm->stack);
  free(vm->marks);
  free(vm->memo);
  free(vm->boxes);
  free(vm->big);
  free(vm->scratch);
  free(vm->fitems);
  free(vm->undo);
  free(vm);
}

void msnap__pvm_set_rec_gv(msnap_pvm_t *vm,
                           int (*cb)(void *ctx, msnap_pv_t v,
                                     msnap_gv_t *out)) {
  vm->rec_gv = cb;
}

/* ---- values -------------------------------------------------------------- */

/* What a boxed number costs in the budget of held items (see
 * too_many_items): its bytes in 8-byte items -- the box (24 bytes: 3
 * items), and an int wider than 64 bits its two's-complement bytes too.
 * A boxed number is never freed before the VM, hence kept in box_items
 * for good. */
#define BOX_ITEMS ((sizeof(box_t) + 7) / 8)
static uint64_t box_cost(const box_t *b) {
  return BOX_ITEMS + (b->kind == BOX_BIG ? ((uint64_t)b->v.big.len + 7) / 8
                                         : 0);
}

/* Items held by live containers plus boxed numbers, over the budget? */
static inline bool held_over(const msnap_pvm_t *vm) {
  uint64_t h = vm->items_held + vm->box_items;
  return msnap_unlikely(h > MSNAP_PICKLE_GV_MIN) &&
         (h > vm->op_off || h > MSNAP_PICKLE_GV_MAX);
}

static int too_many_boxes(msnap_pvm_t *vm);

static int box_new(msnap_pvm_t *vm, box_t b, msnap_pv_t *out) {
  vm->box_items += box_cost(&b);
  if (held_over(vm)) return too_many_boxes(vm);
  if (msnap__grow((void **)&vm->boxes, &vm->boxes_cap, vm->nboxes, 1,
                  sizeof *vm->boxes) < 0)
    return oom(vm);
  vm->boxes[vm->nboxes] = b;
  *out = MSNAP_PV_MAKE(MSNAP_PV_BOX, vm->nboxes);
  vm->nboxes++;
  return 0;
}

static int make_i64(msnap_pvm_t *vm, int64_t v, msnap_pv_t *out) {
  if (v >= INLINE_MIN && v <= INLINE_MAX) {
    *out = MSNAP_PV_MAKE(MSNAP_PV_INT, (uint64_t)v & ((1ull << 61) - 1));
    return 0;
  }
  box_t b = {.kind = BOX_I64};
  b.v.i = v;
  return box_new(vm, b, out);
}

static int make_u64(msnap_pvm_t *vm, uint64_t v, msnap_pv_t *out) {
  if (v <= (uint64_t)INT64_MAX) return make_i64(vm, (int64_t)v, out);
  box_t b = {.kind = BOX_U64};
  b.v.u = v;
  return box_new(vm, b, out);
}

static int64_t inline_int(msnap_pv_t v) {
  return MSNAP_PV_INT_VALUE(v);
}

msnap_pint_t msnap__pvm_int(const msnap_pvm_t *vm, msnap_pv_t v, int64_t *i,
                            uint64_t *u) {
  switch (MSNAP_PV_TAG(v)) {
  case MSNAP_PV_INT:
    if (i) *i = inline_int(v);
    return MSNAP_PINT_I64;
  case MSNAP_PV_BOX: {
    const box_t *b = &vm->boxes[MSNAP_PV_PAYLOAD(v)];
    if (b->kind == BOX_I64) {
      if (i) *i = b->v.i;
      return MSNAP_PINT_I64;
    }
    if (b->kind == BOX_U64) {
      if (u) *u = b->v.u;
      return MSNAP_PINT_U64;
    }
    if (b->kind == BOX_BIG) return MSNAP_PINT_BIG;
    return MSNAP_PINT_NOT_INT;
  }
  default:
    return MSNAP_PINT_NOT_INT;
  }
}

bool msnap__pvm_float(const msnap_pvm_t *vm, msnap_pv_t v, double *f) {
  if (MSNAP_PV_TAG(v) != MSNAP_PV_BOX) return false;
  const box_t *b = &vm->boxes[MSNAP_PV_PAYLOAD(v)];
  if (b->kind != BOX_FLOAT) return false;
  *f = b->v.f;
  return true;
}

const unsigned char *msnap__pvm_big(const msnap_pvm_t *vm, msnap_pv_t v,
                                    size_t *len) {
  if (MSNAP_PV_TAG(v) != MSNAP_PV_BOX) return NULL;
  const box_t *b = &vm->boxes[MSNAP_PV_PAYLOAD(v)];
  if (b->kind != BOX_BIG) return NULL;
  *len = b->v.big.len;
  return vm->big + b->v.big.off;
}

const msnap_snap_t *msnap__pvm_strings(const msnap_pvm_t *vm) {
  return vm->snap;
}

/* The object of v, live or forwarded; NULL for stale references. */
static msnap_pobj_t *obj_any(const msnap_pvm_t *vm, msnap_pv_t v) {
  if (MSNAP_PV_TAG(v) != MSNAP_PV_OBJ) return NULL;
  uint64_t p = MSNAP_PV_PAYLOAD(v);
  uint32_t idx = (uint32_t)(p & OBJ_INDEX_MASK);
  uint32_t gen = (uint32_t)(p >> OBJ_INDEX_BITS);
  if (idx >= vm->nobjs) return NULL;
  msnap_pobj_t *o = &vm->objs[idx];
  if (o->kind == MSNAP_POBJ_FREE || o->gen != gen) return NULL;
  return o;
}

msnap_pobj_t *msnap__pvm_obj(msnap_pvm_t *vm, msnap_pv_t v) {
  msnap_pobj_t *o = obj_any(vm, v);
  return o && o->kind != MSNAP_POBJ_FORWARDED ? o : NULL;
}

static void obj_release_slot(msnap_pvm_t *vm, msnap_pobj_t *o) {
  uint32_t idx = (uint32_t)(o - vm->objs);
  if (msnap__grow((void **)&vm->free_objs, &vm->free_cap, vm->nfree, 1,
                  sizeof *vm->free_objs) < 0)
    return; /* leak the slot rather than fail */
  /* The item array stays with the free slot (kept for the next container
   * made in it: no malloc/free per trace entry dict). */
  o->n = 0;
  o->kind = MSNAP_POBJ_FREE;
  o->flags = 0;
  o->gen++;
  vm->free_objs[vm->nfree++] = idx;
}

/* A stack copy of v goes away. */
static inline void stack_unref(msnap_pvm_t *vm, msnap_pv_t v) {
  if (MSNAP_PV_TAG(v) != MSNAP_PV_OBJ) return;
  msnap_pobj_t *o = obj_any(vm, v);
  if (!o || !o->stackrefs) return;
  o->stackrefs--;
  if (o->kind == MSNAP_POBJ_FORWARDED && o->stackrefs == 0)
    obj_release_slot(vm, o);
}

static void stack_unref_range(msnap_pvm_t *vm, uint32_t from, uint32_t to) {
  for (uint32_t i = from; i < to; i++) stack_unref(vm, vm->stack[i]);
}

const char *msnap__pvm_type(const msnap_pvm_t *vm, msnap_pv_t v) {
  switch (MSNAP_PV_TAG(v)) {
  case MSNAP_PV_CONST:
    return MSNAP_PV_PAYLOAD(v) == MSNAP_PVC_NONE ? "None" : "bool";
  case MSNAP_PV_INT:
    return "int";
  case MSNAP_PV_STR:
    return "str";
  case MSNAP_PV_BYTES:
    return "bytes";
  case MSNAP_PV_BYTEARRAY:
    return "bytearray";
  case MSNAP_PV_REC:
    return "record";
  case MSNAP_PV_BOX:
    return vm->boxes[MSNAP_PV_PAYLOAD(v)].kind == BOX_FLOAT ? "float" : "int";
  case MSNAP_PV_OBJ: {
    msnap_pobj_t *o = msnap__pvm_obj((msnap_pvm_t *)vm, v);
    if (!o) return "consumed container";
    static const char *const names[] = {"?", "list", "tuple", "dict", "set",
                                        "frozenset"};
    return names[o->kind];
  }
  }
  return "?";
}

/* The article of a type name of msnap__pvm_type in a message: "an int",
 * "a list", "None". */
static const char *article(const char *t) {
  return !strcmp(t, "None") ? "" : strchr("aeiou", t[0]) ? "an " : "a ";
}

/*
 * A new empty container of `kind` with room for cap items.
 */
static int obj_new(msnap_pvm_t *vm, uint8_t kind, uint32_t cap,
                   msnap_pv_t *out) {
  uint32_t idx;
  bool recycled = vm->nfree > 0;
  if (recycled) {
    idx = vm->free_objs[--vm->nfree];
  } else {
    /* A container is never freed while anything may still reach it, so
     * hostile input (`]0` repeated: lists made and dropped) could grow the
     * pool by 40 bytes per 2 bytes of input (20x).  The pool is bounded by the
     * input read so far instead: MSNAP_PICKLE_POOL_FREE slots, then one per
     * MSNAP_PICKLE_POOL_BYTES bytes (real snapshots, whose containers
     * become records and give their slot back, use under 10 slots; the
     * generic interpreter about their nesting depth plus 1000). */
    if (vm->nobjs >= MSNAP_PICKLE_POOL_FREE &&
        vm->nobjs - MSNAP_PICKLE_POOL_FREE >=
            vm->op_off / MSNAP_PICKLE_POOL_BYTES)
      return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                             "%u live containers after %zu bytes of input "
                             "(the limit: %u, then one per %u bytes)",
                             vm->nobjs, vm->op_off, MSNAP_PICKLE_POOL_FREE,
                             MSNAP_PICKLE_POOL_BYTES);
    if (vm->nobjs >= OBJ_INDEX_MASK ||
        msnap__grow((void **)&vm->objs, &vm->objs_cap, vm->nobjs, 1,
                    sizeof *vm->objs) < 0) {
      if (vm->nobjs >= OBJ_INDEX_MASK)
        return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                               "more than %u live containers",
                               OBJ_INDEX_MASK);
      return oom(vm);
    }
    idx = vm->nobjs++;
    memset(&vm->objs[idx], 0, sizeof vm->objs[idx]);
  }
  msnap_pobj_t *o = &vm->objs[idx];
  /* a recycled slot may bring an item array; use it when large enough */
  if (cap > o->cap) {
    msnap_pv_t *items = malloc((size_t)cap * sizeof *items);
    if (!items) {
      /* the slot stays free: back to the list (room: it was just taken
       * from it), or a fresh slot is given back */
      if (recycled)
        vm->free_objs[vm->nfree++] = idx;
      else
        vm->nobjs--;
      return oom(vm);
    }
    free(o->items);
    o->items = items;
    o->cap = cap;
  }
  o->n = 0;
  o->memo_slot = UINT32_MAX;
  o->stackrefs = 0;
  o->fwd = 0;
  o->depth = 1;
  o->kind = kind;
  o->flags = 0;
  *out = MSNAP_PV_MAKE(MSNAP_PV_OBJ,
                       ((uint64_t)o->gen << OBJ_INDEX_BITS) | idx);
  return 0;
}

/*
 * Replace a container by v: its memo slot now holds v; copies still on
 * the stack (a memo reference pushed before the container was stored)
 * are forwarded to v until they are consumed, then the slot is recycled.
 */
void msnap__pvm_replace(msnap_pvm_t *vm, msnap_pv_t obj, msnap_pv_t v) {
  msnap_pobj_t *o = msnap__pvm_obj(vm, obj);
  if (!o) return;
  if (o->memo_slot < vm->memo_len && vm->memo[o->memo_slot] == obj)
    vm->memo[o->memo_slot] = v;
  if (!(o->flags & MSNAP_POBJF_RANGE))
    vm->items_held -= o->n < vm->items_held ? o->n : vm->items_held;
  o->flags &= (uint8_t)~MSNAP_POBJF_RANGE;
  if (o->stackrefs) {
    free(o->items);
    o->items = NULL;
    o->n = o->cap = 0;
    o->kind = MSNAP_POBJ_FORWARDED;
    o->fwd = v;
    return;
  }
  obj_release_slot(vm, o);
}

/*
 * Prepare value *v for storage into a container (or as the result): run
 * the consumer's callback on containers.  Returns its depth in *depth.
 */
static int complete(msnap_pvm_t *vm, msnap_pv_t *v, uint32_t *depth) {
  *depth = 0;
  if (MSNAP_PV_TAG(*v) != MSNAP_PV_OBJ) return 0;
  msnap_pobj_t *o = obj_any(vm, *v);
  if (o && o->kind == MSNAP_POBJ_FORWARDED) {
    *v = o->fwd;
    return 0;
  }
  if (!o)
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "reference to a container that was already "
                           "consumed (a container stored twice)");
  *depth = o->depth;
  if (!vm->cb) return 0;
  msnap_pv_t old = *v, out = 0;
  msnap_pitems_t it = {o->items, o->fwd, o->n,
                       (o->flags & MSNAP_POBJF_RANGE) != 0};
  const char *phase = vm->phase;
  int rc = vm->cb(vm->cb_ctx, vm, o->kind, &it, &out);
  vm->phase = phase;
  if (rc < 0) return rc;
  if (out) {
    *v = out;
    msnap__pvm_replace(vm, old, out);
    *depth = 0;
  }
  return 0;
}

static bool unhashable(msnap_pvm_t *vm, msnap_pv_t k) {
  msnap_pobj_t *o = msnap__pvm_obj(vm, k);
  return o && (o->kind == MSNAP_POBJ_LIST || o->kind == MSNAP_POBJ_DICT ||
               o->kind == MSNAP_POBJ_SET);
}

/* Containers grow by the items of APPEND(S), SETITEM(S), ADDITEMS and
 * the MARK-built ones: each item an 8-byte slot, for as little as one
 * byte of input (None).  What nothing converts (a key the reader does not
 * know, which it ignores) would otherwise grow with the decompressed
 * input -- 200 M Nones in 551 kB of gzip: 1.6 GB -- and what it converts
 * (allocator_settings) grow before the conversion's budget is looked at.
 * So the items held by all live containers together have the budget of
 * generic values (msnap__pvm_to_gv): one per byte of input read so far,
 * at least MSNAP_PICKLE_GV_MIN, at most MSNAP_PICKLE_GV_MAX.  A real
 * snapshot holds a few thousand at once: its lists of records are ranges
 * (no items), and its other containers become records and give their
 * items back (msnap__pvm_replace).
 *
 * Boxed numbers (a float, an int outside the inline 61 bits: a 24-byte
 * box, which lives as long as the VM) count in the same budget by their
 * bytes, 3 items each (box_cost), and are never given back: 16 M floats
 * in allocator_settings held 128 MB of items and 384 MB of boxes before
 * their 384 MB of generic values were made (900 MB at the peak, where 16 M
 * Nones peak at 490 MB); a float costs 4 items of the budget while it is
 * held, so at most 4 Mi of them are held at once, and at most 5.6 M boxes
 * are ever made (128 MiB). */
static const char *const obj_names[] = {"?", "list", "tuple", "dict", "set",
                                        "frozenset"};

/* The tail of both refusals: the boxed numbers (nb of them), what they
 * count, and the limit. */
#define HELD_LIMIT_FMT                                                        \
  "%llu numbers boxed (floats, ints wider than 61 bits: kept to the end, "   \
  "counted by their bytes as %llu items) (the limit: one item per byte of "  \
  "input, at least %u, at most %u)"
#define HELD_LIMIT_ARGS(vm, nb)                                               \
  (unsigned long long)(nb), (unsigned long long)(vm)->box_items,             \
      MSNAP_PICKLE_GV_MIN, MSNAP_PICKLE_GV_MAX

static int too_many_items(msnap_pvm_t *vm, const msnap_pobj_t *o) {
  uint32_t n = o->kind == MSNAP_POBJ_DICT ? o->n / 2 : o->n;
  char limit[256];
  if (vm->box_items == 0)
    snprintf(limit, sizeof limit,
             " (the limit: one per byte of input, at least %u, at most %u)",
             MSNAP_PICKLE_GV_MIN, MSNAP_PICKLE_GV_MAX);
  else
    snprintf(limit, sizeof limit, ", and " HELD_LIMIT_FMT,
             HELD_LIMIT_ARGS(vm, vm->nboxes));
  return msnap__pvm_fail(
      vm, MSNAP_ELIMIT,
      "%llu items held in containers after %zu bytes of input, a %s of %u "
      "%s among them%s",
      (unsigned long long)vm->items_held, vm->op_off,
      o->kind < sizeof obj_names / sizeof obj_names[0] ? obj_names[o->kind]
                                                       : "?",
      n, o->kind == MSNAP_POBJ_DICT ? "pairs" : "items", limit);
}

/* A boxed number to make past the budget (see too_many_items). */
static int too_many_boxes(msnap_pvm_t *vm) {
  return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                         "%llu items held in containers after %zu bytes of "
                         "input, and " HELD_LIMIT_FMT,
                         (unsigned long long)vm->items_held, vm->op_off,
                         HELD_LIMIT_ARGS(vm, (uint64_t)vm->nboxes + 1));
}

/*
 * Append n values to container `c` (validated by the caller), completing
 * each and tracking the nesting depth.  `keys` (dicts): every even item is
 * a key that must be hashable.
 */
static int obj_extend(msnap_pvm_t *vm, msnap_pv_t c, msnap_pv_t *vals,
                      uint32_t n, bool keys, bool from_stack) {
  /* The container is looked up once, and again only after a callback ran
   * (completing a container item may reshape the object pool): items that
   * are not containers (scalars, strings, records: nearly all of them)
   * need no completion, no unreferencing and no depth update. */
  msnap_pobj_t *o = msnap__pvm_obj(vm, c);
  if (!o)
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "container was consumed while being filled");
  /* items already held in its array (none while it is a range) */
  uint32_t held0 = (o->flags & MSNAP_POBJF_RANGE) ? 0 : o->n;
  for (uint32_t i = 0; i < n; i++) {
    if (msnap_unlikely(MSNAP_PV_TAG(vals[i]) == MSNAP_PV_OBJ)) {
      uint32_t d;
      if (keys && (i & 1) == 0 && unhashable(vm, vals[i]))
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "unhashable %s as a key",
                               msnap__pvm_type(vm, vals[i]));
      msnap_pv_t orig = vals[i];
      int rc = complete(vm, &vals[i], &d);
      if (rc < 0) return rc;
      if (from_stack) stack_unref(vm, orig);
      o = msnap__pvm_obj(vm, c);
      if (!o)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "container was consumed while being filled");
      if (d + 1 > o->depth) {
        if (d + 1 > MSNAP_PICKLE_MAX_DEPTH)
          return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                                 "containers nested deeper than %d levels",
                                 MSNAP_PICKLE_MAX_DEPTH);
        o->depth = (uint16_t)(d + 1);
      }
    }
    msnap_pv_t it = vals[i];
    if (msnap_likely(!(o->flags & MSNAP_POBJF_RANGE))) {
      if (msnap_unlikely(o->n == 0 && o->kind == MSNAP_POBJ_LIST &&
                         MSNAP_PV_TAG(it) == MSNAP_PV_REC)) {
        free(o->items);
        o->items = NULL;
        o->cap = 0;
        o->fwd = it;
        o->flags |= MSNAP_POBJF_RANGE;
        o->n = 1;
        continue;
      }
    } else {
      if (it == o->fwd + ((uint64_t)o->n << 3) && o->n < UINT32_MAX - 1) {
        o->n++;
        continue;
      }
      /* the range ends: materialize it */
      uint32_t cnt = o->n, cap = cnt + (n - i) + 8;
      msnap_pv_t *items = malloc((size_t)cap * sizeof *items);
      if (!items) return oom(vm);
      for (uint32_t k = 0; k < cnt; k++)
        items[k] = o->fwd + ((uint64_t)k << 3);
      o->items = items;
      o->cap = cap;
      o->fwd = 0;
      o->flags &= (uint8_t)~MSNAP_POBJF_RANGE;
    }
    if (msnap_unlikely(o->n == o->cap)) {
      uint32_t extra = o->cap < 8 ? 8 : o->cap / 2;
      if (n - i > extra) extra = n - i;
      if (msnap__grow((void **)&o->items, &o->cap, o->n, extra,
                      sizeof *o->items) < 0)
        return oom(vm);
    }
    o->items[o->n++] = it;
  }
  if (!(o->flags & MSNAP_POBJF_RANGE)) {
    vm->items_held += o->n - held0;
    if (held_over(vm)) return too_many_items(vm, o);
  }
  return 0;
}

/* ---- the stack ----------------------------------------------------------- */

static inline int push(msnap_pvm_t *vm, msnap_pv_t v) {
  if (msnap_unlikely(vm->sn == vm->scap)) {
    /* (memo_get_fast pushes only below scap, which never passes the cap:
     * every push beyond it comes here) */
    if (vm->sn >= MSNAP_PICKLE_MAX_STACK)
      return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                             "more than %u items on the stack (a real "
                             "pickle batches by 1000)",
                             MSNAP_PICKLE_MAX_STACK);
    if (msnap__grow((void **)&vm->stack, &vm->scap, vm->sn, 1,
                    sizeof *vm->stack) < 0)
      return oom(vm);
    if (vm->scap > MSNAP_PICKLE_MAX_STACK) vm->scap = MSNAP_PICKLE_MAX_STACK;
  }
  vm->stack[vm->sn++] = v;
  if (MSNAP_PV_TAG(v) == MSNAP_PV_OBJ) {
    msnap_pobj_t *o = obj_any(vm, v);
    if (o) o->stackrefs++;
  }
  return 0;
}

static inline uint32_t mark_base(const msnap_pvm_t *vm) {
  return vm->mn ? vm->marks[vm->mn - 1] : 0;
}

static inline int pop(msnap_pvm_t *vm, msnap_pv_t *v) {
  if (msnap_unlikely(vm->sn <= mark_base(vm)))
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "stack underflow");
  *v = vm->stack[--vm->sn];
  return 0;
}

static inline int top(msnap_pvm_t *vm, msnap_pv_t **v) {
  if (msnap_unlikely(vm->sn <= mark_base(vm)))
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "stack underflow");
  *v = &vm->stack[vm->sn - 1];
  return 0;
}

/* Pop the innermost mark: items are stack[*first .. sn). */
static int pop_mark(msnap_pvm_t *vm, uint32_t *first) {
  if (!vm->mn)
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "no MARK on the stack");
  *first = vm->marks[--vm->mn];
  return 0;
}

static int container_at(msnap_pvm_t *vm, msnap_pv_t v, uint8_t kind,
                        const char *what) {
  msnap_pobj_t *o = msnap__pvm_obj(vm, v);
  if (!o || o->kind != kind) {
    const char *t = msnap__pvm_type(vm, v);
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "%s applied to %s%s", what,
                           article(t), t);
  }
  return 0;
}

/* Build a container of `kind` from stack[first..sn) and push it. */
static int build_from(msnap_pvm_t *vm, uint8_t kind, uint32_t first) {
  uint32_t n = vm->sn - first;
  if (kind == MSNAP_POBJ_DICT && (n & 1))
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "odd number of items (%u) for a dict", n);
  msnap_pv_t c = 0;
  int rc = obj_new(vm, kind, n, &c);
  if (rc < 0) return rc;
  if (n) { /* (the stack may still be unallocated when n == 0) */
    rc = obj_extend(vm, c, vm->stack + first, n, kind == MSNAP_POBJ_DICT,
                    true);
    if (rc < 0) return rc;
  }
  vm->sn = first;
  return push(vm, c);
}

/* ---- memo ---------------------------------------------------------------- */

/* Memo slots up to idx exist (new ones are holes); false on ENOMEM. */
static bool memo_reserve(msnap_pvm_t *vm, uint64_t idx) {
  if (idx >= vm->memo_cap) {
    uint32_t old = vm->memo_cap;
    uint32_t extra = (uint32_t)(idx + 1 - old);
    if (extra < old / 2) extra = old / 2;
    if (extra < 64) extra = 64;
    if (msnap__grow((void **)&vm->memo, &vm->memo_cap, old, extra,
                    sizeof *vm->memo) < 0)
      return false;
  }
  /* slots [memo_len, memo_cap) are untouched memory (not yet resident) */
  for (; vm->memo_len <= idx; vm->memo_len++)
    vm->memo[vm->memo_len] = MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE);
  return true;
}

static int memo_put(msnap_pvm_t *vm, uint64_t idx) {
  msnap_pv_t *t = 0;
  int rc = top(vm, &t);
  if (rc < 0) return rc;
  if (idx >= UINT32_MAX - 1 || idx > vm->op_off + 16)
    return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                           "memo index %llu is beyond what %zu bytes of "
                           "input can define",
                           (unsigned long long)idx, vm->op_off);
  if (!memo_reserve(vm, idx)) return oom(vm);
  if (vm->memo[idx] == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
    vm->memo_count++;
  vm->memo[idx] = *t;
  msnap_pobj_t *o = msnap__pvm_obj(vm, *t);
  if (o) {
    if (o->memo_slot != UINT32_MAX) o->flags |= OBJF_MULTI_MEMO;
    o->memo_slot = (uint32_t)idx;
  }
  return 0;
}

/*
 * Push memo[idx]; an undefined key is an error.
 */
static int memo_get(msnap_pvm_t *vm, uint64_t idx) {
  if (idx >= vm->memo_len ||
      vm->memo[idx] == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "memo key %llu is not defined",
                           (unsigned long long)idx);
  return push(vm, vm->memo[idx]);
}

/*
 * The common case of memo_get, inlined in the interpreter loop: a defined
 * memo entry that is not a container (a string, a number or a record) and
 * room on the stack.  Returns false when memo_get must handle it.
 */
static inline bool memo_get_fast(msnap_pvm_t *vm, uint64_t idx) {
  if (idx >= vm->memo_len || vm->sn >= vm->scap) return false;
  msnap_pv_t v = vm->memo[idx];
  if (MSNAP_PV_TAG(v) == MSNAP_PV_OBJ ||
      v == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
    return false;
  vm->stack[vm->sn++] = v;
  return true;
}

/* ---- scalars ------------------------------------------------------------- */

static int scratch(msnap_pvm_t *vm, size_t n) {
  return MSNAP_GROW(vm->scratch, vm->scratch_cap, n) != 0 ? oom(vm) : 0;
}

static int push_str(msnap_pvm_t *vm, unsigned tag, const void *p,
                    size_t n) {
  /* text under the model's UTF-8 policy; bytes as they are */
  msnap_str_t id = tag == MSNAP_PV_STR
                       ? msnap__snap_intern(vm->snap, p, n)
                       : msnap__snap_intern_bytes(vm->snap, p, n);
  if (id == 0) return oom(vm);
  return push(vm, MSNAP_PV_MAKE(tag, id));
}

/* Little-endian two's-complement bytes -> a value (LONG1/LONG4). */
static int push_long_bytes(msnap_pvm_t *vm, const unsigned char *b,
                           size_t n) {
  /* drop redundant sign bytes */
  while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) ||
                   (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
    n--;
  msnap_pv_t v = 0;
  int rc;
  if (n == 0) return push(vm, MSNAP_PV_MAKE(MSNAP_PV_INT, 0));
  if (n <= 8) {
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++) u |= (uint64_t)b[i] << (8 * i);
    if (n < 8 && (b[n - 1] & 0x80)) u |= ~0ull << (8 * n);
    rc = make_i64(vm, (int64_t)u, &v);
  } else if (n == 9 && b[8] == 0) {
    uint64_t u = 0;
    for (size_t i = 0; i < 8; i++) u |= (uint64_t)b[i] << (8 * i);
    rc = make_u64(vm, u, &v);
  } else {
    if (n > UINT32_MAX)
      return msnap__pvm_fail(vm, MSNAP_ELIMIT, "integer of %zu bytes", n);
    if (MSNAP_GROW(vm->big, vm->big_cap, (uint64_t)vm->big_len + n) != 0)
      return oom(vm);
    memcpy(vm->big + vm->big_len, b, n);
    box_t bx = {.kind = BOX_BIG};
    bx.v.big.off = vm->big_len;
    bx.v.big.len = (uint32_t)n;
    vm->big_len += n;
    rc = box_new(vm, bx, &v);
  }
  if (rc < 0) return rc;
  return push(vm, v);
}

/* Decimal text (optional sign, digits, optional trailing 'L') -> value. */
static int push_decimal(msnap_pvm_t *vm, const char *s, size_t n) {
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\r' || s[n - 1] == '\t'))
    n--;
  if (n && s[n - 1] == 'L') n--;
  while (n && (*s == ' ' || *s == '\t')) s++, n--;
  bool neg = false;
  if (n && (*s == '-' || *s == '+')) neg = *s == '-', s++, n--;
  if (n == 0)
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "empty integer literal");
  /* the conversion is quadratic; CPython also refuses longer literals
   * (sys.int_info.default_max_str_digits) */
  if (n > 4300)
    return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                           "integer literal of %zu digits (limit 4300)", n);
  /* magnitude in 32-bit limbs, little-endian */
  size_t nl = n / 9 + 2;
  if (scratch(vm, nl * 4 + nl * 4 + 8) < 0) return MSNAP_ENOMEM;
  uint32_t *l = (uint32_t *)(void *)vm->scratch;
  memset(l, 0, nl * 4);
  size_t used = 1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                             "bad character 0x%02x in an integer literal",
                             (unsigned char)s[i]);
    uint64_t carry = (uint64_t)(s[i] - '0');
    for (size_t k = 0; k < used; k++) {
      uint64_t x = (uint64_t)l[k] * 10 + carry;
      l[k] = (uint32_t)x;
      carry = x >> 32;
    }
    if (carry) l[used++] = (uint32_t)carry;
  }
  /* two's complement little-endian bytes, one extra sign byte */
  size_t nb = used * 4 + 1;
  unsigned char *b = (unsigned char *)(l + nl);
  if (nb > nl * 4 + 8) nb = nl * 4 + 8;
  for (size_t i = 0; i < nb; i++)
    b[i] = i / 4 < used ? (unsigned char)(l[i / 4] >> (8 * (i % 4))) : 0;
  if (neg) {
    unsigned carry = 1;
    for (size_t i = 0; i < nb; i++) {
      unsigned x = (unsigned)(unsigned char)~b[i] + carry;
      b[i] = (unsigned char)x;
      carry = x >> 8;
    }
  }
  return push_long_bytes(vm, b, nb);
}

static int push_float(msnap_pvm_t *vm, double f) {
  box_t b = {.kind = BOX_FLOAT};
  b.v.f = f;
  msnap_pv_t v = 0;
  int rc = box_new(vm, b, &v);
  return rc < 0 ? rc : push(vm, v);
}

/* Append the UTF-8 encoding of code point c to scratch at *o. */
static size_t put_utf8(char *o, uint32_t c) {
  if (c < 0x80) {
    o[0] = (char)c;
    return 1;
  }
  if (c < 0x800) {
    o[0] = (char)(0xc0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 0x3f));
    return 2;
  }
  if (c < 0x10000) {
    o[0] = (char)(0xe0 | (c >> 12));
    o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[2] = (char)(0x80 | (c & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (c >> 18));
  o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
  o[3] = (char)(0x80 | (c & 0x3f));
  return 4;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* UNICODE: raw-unicode-escape (\uXXXX, \UXXXXXXXX; other bytes latin-1). */
static int push_raw_unicode(msnap_pvm_t *vm, const unsigned char *s,
                            size_t n) {
  if (scratch(vm, n * 4 + 1) < 0) return MSNAP_ENOMEM;
  char *o = vm->scratch;
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    if (s[i] == '\\' && i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      size_t nd = s[i + 1] == 'u' ? 4 : 8;
      if (i + 2 + nd > n)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "truncated \\u escape");
      uint32_t c = 0;
      for (size_t j = 0; j < nd; j++) {
        int h = hexval(s[i + 2 + j]);
        if (h < 0)
          return msnap__pvm_fail(vm, MSNAP_EFORMAT, "bad \\u escape");
        c = c * 16 + (uint32_t)h;
      }
      if (c > 0x10ffff)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "code point 0x%x out of range", c);
      k += put_utf8(o + k, c);
      i += 2 + nd;
    } else {
      k += put_utf8(o + k, s[i]);
      i++;
    }
  }
  return push_str(vm, MSNAP_PV_STR, o, k);
}

/* STRING: a Python repr-quoted byte string, decoded as ASCII. */
static int push_quoted(msnap_pvm_t *vm, const unsigned char *s, size_t n) {
  while (n && (s[n - 1] == '\r' || s[n - 1] == ' ')) n--;
  if (n < 2 || (s[0] != '\'' && s[0] != '"') || s[n - 1] != s[0])
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "the STRING opcode argument must be quoted");
  s++;
  n -= 2;
  if (scratch(vm, n + 1) < 0) return MSNAP_ENOMEM;
  char *o = vm->scratch;
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    unsigned c = s[i++];
    if (c != '\\') {
      o[k++] = (char)c;
      continue;
    }
    if (i >= n)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, "trailing \\ in STRING");
    c = s[i++];
    switch (c) {
    case 'n': o[k++] = '\n'; break;
    case 't': o[k++] = '\t'; break;
    case 'r': o[k++] = '\r'; break;
    case 'a': o[k++] = '\a'; break;
    case 'b': o[k++] = '\b'; break;
    case 'f': o[k++] = '\f'; break;
    case 'v': o[k++] = '\v'; break;
    case '\n': break;
    case 'x': {
      int h1 = i < n ? hexval(s[i]) : -1;
      int h2 = i + 1 < n ? hexval(s[i + 1]) : -1;
      if (h1 < 0 || h2 < 0)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "bad \\x escape");
      o[k++] = (char)(h1 * 16 + h2);
      i += 2;
      break;
    }
    default:
      if (c >= '0' && c <= '7') {
        unsigned v = c - '0';
        for (int j = 0; j < 2 && i < n && s[i] >= '0' && s[i] <= '7'; j++)
          v = v * 8 + (s[i++] - '0');
        o[k++] = (char)(v & 0xff);
      } else {
        o[k++] = '\\';
        o[k++] = (char)c;
      }
    }
  }
  for (size_t i = 0; i < k; i++)
    if ((unsigned char)o[i] >= 0x80)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                             "non-ASCII byte in a protocol-0/1 string");
  return push_str(vm, MSNAP_PV_STR, o, k);
}

static int push_ascii(msnap_pvm_t *vm, const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] >= 0x80)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                             "non-ASCII byte in a BINSTRING");
  return push_str(vm, MSNAP_PV_STR, s, n);
}

/* ---- the fast path (pickle.h) ------------------------------------------ */

static uint64_t le(const unsigned char *p, int n);

typedef struct fp_s {
  msnap_pvm_t *vm;
  const unsigned char *q, *end;
} fp_t;

/* FRAME opcodes sit between any two opcodes: skip them (a declared
 * length beyond the input is left to the generic interpreter). */
static inline bool fp_frames(fp_t *f) {
  while (msnap_unlikely(f->q < f->end && *f->q == MSNAP_OP_FRAME)) {
    if (f->end - f->q < 9 || le(f->q + 1, 8) > (uint64_t)(f->end - f->q - 9))
      return false;
    f->q += 9;
  }
  return true;
}

static bool fp_push(msnap_pvm_t *vm, msnap_pv_t v) {
  if (msnap_unlikely(vm->nfitems == vm->fitems_cap) &&
      msnap__grow((void **)&vm->fitems, &vm->fitems_cap, vm->nfitems, 64,
                  sizeof *vm->fitems) < 0)
    return false;
  vm->fitems[vm->nfitems++] = v;
  return true;
}

/* A memo write of the batch (memo_put's effect, logged for rollback). */
static bool memo_write_logged(msnap_pvm_t *vm, uint64_t idx, msnap_pv_t v,
                              const unsigned char *at) {
  if (idx >= UINT32_MAX - 1 ||
      idx > msnap__source_offset(vm->src, at) + 16)
    return false;
  if (!memo_reserve(vm, idx)) return false;
  if (vm->nundo == vm->undo_cap &&
      msnap__grow((void **)&vm->undo, &vm->undo_cap, vm->nundo, 64,
                  sizeof *vm->undo) < 0)
    return false;
  vm->undo[vm->nundo++] = (fp_undo_t){(uint32_t)idx, vm->memo[idx]};
  if (vm->memo[idx] == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
    vm->memo_count++;
  vm->memo[idx] = v;
  return true;
}

static inline bool fp_memo_write(fp_t *f, uint64_t idx, msnap_pv_t v,
                                 const unsigned char *at) {
  return memo_write_logged(f->vm, idx, v, at);
}

/* The put at q (MEMOIZE / BINPUT / LONG_BINPUT; MEMOIZE's slot is
 * memo_count): its width in bytes with *idx its slot, 0 when q holds no
 * put, -1 when it is cut short.  The one decoder of puts for the fast
 * path (fp_put) and the dict scans (msnap__pvm_put_peek). */
static inline int put_token(const unsigned char *q, const unsigned char *end,
                            uint64_t memo_count, uint64_t *idx) {
  if (q >= end) return 0;
  switch (*q) {
  case MSNAP_OP_MEMOIZE:
    *idx = memo_count;
    return 1;
  case MSNAP_OP_BINPUT:
    if (end - q < 2) return -1;
    *idx = q[1];
    return 2;
  case MSNAP_OP_LONG_BINPUT:
    if (end - q < 5) return -1;
    *idx = le(q + 1, 4);
    return 5;
  default:
    return 0;
  }
}

int msnap__pvm_put_peek(const msnap_pvm_t *vm, const unsigned char *q,
                        const unsigned char *end, uint32_t pending,
                        uint32_t *slot, size_t *w) {
  uint64_t idx;
  int n = put_token(q, end, (uint64_t)vm->memo_count + pending, &idx);
  *w = 0;
  if (n <= 0) return n;
  /* (memo_write_logged's bounds, and a slot nothing refers to yet) */
  if (idx >= UINT32_MAX - 1 || idx > msnap__source_offset(vm->src, q) + 16 ||
      (idx < vm->memo_len &&
       vm->memo[idx] != MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE)))
    return -1;
  *slot = (uint32_t)idx;
  *w = (size_t)n;
  return 1;
}

bool msnap__pvm_put(msnap_pvm_t *vm, uint32_t slot, msnap_pv_t v,
                    const unsigned char *at) {
  return memo_write_logged(vm, slot, v, at);
}

/* An optional MEMOIZE / BINPUT / LONG_BINPUT of v.  *slot gets the slot
 * (UINT32_MAX: none).  false: bail. */
static bool fp_put(fp_t *f, msnap_pv_t v, uint32_t *slot) {
  if (!fp_frames(f)) return false;
  const unsigned char *q = f->q;
  uint64_t idx;
  *slot = UINT32_MAX;
  int n = put_token(q, f->end, f->vm->memo_count, &idx);
  if (n <= 0) return n == 0;
  f->q = q + n;
  if (!fp_memo_write(f, idx, v, q)) return false;
  *slot = (uint32_t)idx;
  return true;
}

/* Length of the scalar token at q (0: not one the fast path reads). */
static size_t fp_scalar_len(const unsigned char *q, const unsigned char *end) {
  if (q >= end) return 0;
  switch (*q) {
  case MSNAP_OP_BININT1:
  case MSNAP_OP_BINGET: return 2;
  case MSNAP_OP_BININT2: return 3;
  case MSNAP_OP_BININT:
  case MSNAP_OP_LONG_BINGET: return 5;
  case MSNAP_OP_LONG1: return end - q >= 2 ? 2 + (size_t)q[1] : 0;
  case MSNAP_OP_NONE:
  case MSNAP_OP_NEWTRUE:
  case MSNAP_OP_NEWFALSE: return 1;
  default: return 0;
  }
}

static bool fp_value(fp_t *f, int depth);
static inline __attribute__((always_inline)) int fp_scalar_inl(fp_t *f);
static inline int fp_scalar(fp_t *f);
static inline bool fp_tuple_tail(fp_t *f);

/* A run of memo references to non-containers (a frame list: every item a
 * BINGET of a frame record), as long as none starts an (a, b) tuple.
 * Returns false only when out of memory.
 *
 * An item starts a tuple when the token after it is a scalar followed by
 * TUPLE2.  Inside the run that token is the next item, and the byte after
 * it is the opcode the next turn reads anyway; so the test is made once,
 * where the run stops at a token X: when X is TUPLE2 the last two items
 * were a pair (both are given back), and when X is a scalar followed by
 * TUPLE2 the last item pairs with X (it is given back).  The run ends
 * where a test before every item would have ended it. */
static inline bool fp_get_run(fp_t *f) {
  msnap_pvm_t *vm = f->vm;
  const unsigned char *q = f->q, *end = f->end;
  const msnap_pv_t *memo = vm->memo;
  uint32_t memo_len = vm->memo_len;
  /* (the item array in locals: the stores below cannot alias them) */
  msnap_pv_t *items = vm->fitems;
  uint32_t n = vm->nfitems, cap = vm->fitems_cap, n0 = n;
  /* where the last two items start (valid while n - n0 >= 1 / 2) */
  const unsigned char *last = q, *before = q;
  bool ok = true;
  for (;;) {
    size_t w;
    uint64_t idx;
    if (end - q >= 6 && q[0] == MSNAP_OP_LONG_BINGET) {
      w = 5;
      idx = le(q + 1, 4);
    } else if (end - q >= 3 && q[0] == MSNAP_OP_BINGET) {
      w = 2;
      idx = q[1];
    } else {
      break;
    }
    if (idx >= memo_len) break;
    msnap_pv_t v = memo[idx];
    if (MSNAP_PV_TAG(v) == MSNAP_PV_OBJ || v == PV_PENDING ||
        v == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
      break;
    if (msnap_unlikely(n == cap)) {
      vm->nfitems = n;
      if (msnap__grow((void **)&vm->fitems, &vm->fitems_cap, vm->nfitems, 64,
                      sizeof *vm->fitems) < 0) {
        ok = false;
        break;
      }
      items = vm->fitems;
      cap = vm->fitems_cap;
    }
    items[n++] = v;
    before = last;
    last = q;
    q += w;
  }
  if (ok && n > n0 && q < end) {
    /* the pair test at the stop (see above) */
    if (*q == MSNAP_OP_TUPLE2) {
      if (n - n0 >= 2) {
        n -= 2;
        q = before;
      }
    } else {
      size_t l2 = fp_scalar_len(q, end);
      if (l2 && (size_t)(end - q) > l2 && q[l2] == MSNAP_OP_TUPLE2) {
        n -= 1;
        q = last;
      }
    }
  }
  vm->nfitems = n;
  f->q = q;
  return ok;
}

/* The container of `kind` whose items are fitems[base..]: the consumer
 * must turn it into a record (*out), which replaces the items. */
static bool fp_offer(fp_t *f, unsigned kind, uint32_t base,
                     msnap_pv_t *out) {
  msnap_pvm_t *vm = f->vm;
  /* (no items yet: fitems may still be NULL, and NULL + 0 is undefined) */
  msnap_pitems_t it = {vm->fitems ? vm->fitems + base : NULL, 0,
                       vm->nfitems - base, false};
  const char *phase = vm->phase;
  *out = 0;
  int rc = vm->cb(vm->cb_ctx, vm, kind, &it, out);
  vm->phase = phase;
  if (rc < 0 || !*out) {
    /* (an error is found again by the generic interpreter) */
    vm->failed = false;
    if (vm->err) vm->err->msg[0] = 0;
    return false;
  }
  vm->nfitems = base;
  return true;
}

/* Close a dict or list opened with memo slot `slot` (UINT32_MAX: none). */
static bool fp_close(fp_t *f, unsigned kind, uint32_t base, uint32_t slot) {
  msnap_pv_t out;
  if (!fp_offer(f, kind, base, &out)) return false;
  /* (as msnap__pvm_replace: only while the slot still holds the
   * container -- a put inside it may have taken the slot since) */
  if (slot != UINT32_MAX && f->vm->memo[slot] == PV_PENDING)
    f->vm->memo[slot] = out;
  return fp_push(f->vm, out);
}

/* A dict: '}' [put] then MARK (key value)* SETITEMS batches, or one
 * key value SETITEM. */
static bool fp_dict(fp_t *f, int depth) {
  msnap_pvm_t *vm = f->vm;
  uint32_t slot, base = vm->nfitems;
  f->q++;
  if (!fp_put(f, PV_PENDING, &slot) || !fp_frames(f)) return false;
  if (vm->dicts && f->q < f->end && *f->q == MSNAP_OP_MARK) {
    /* the consumer's own reading of the whole body (pickle.h) */
    const unsigned char *q = f->q;
    msnap_pv_t out = 0;
    int rc = vm->dicts->scan(vm->cb_ctx, vm, vm->memo, vm->memo_len, &q,
                             f->end, &out);
    if (rc < 0) return false;
    if (rc > 0) {
      f->q = q;
      if (slot != UINT32_MAX && vm->memo[slot] == PV_PENDING)
        vm->memo[slot] = out;
      return fp_push(vm, out);
    }
  }
  bool single = f->q < f->end && *f->q != MSNAP_OP_MARK;
  do {
    if (!single) f->q++; /* MARK */
    for (;;) {
      if (!fp_frames(f) || f->q >= f->end) return false;
      unsigned op = *f->q;
      if (op == (single ? MSNAP_OP_SETITEM : MSNAP_OP_SETITEMS)) break;
      /* a key: a string (a BINGET of one, the usual key, read here) */
      const unsigned char *q = f->q;
      msnap_pv_t kv;
      if (f->end - q >= 2 && op == MSNAP_OP_BINGET && q[1] < vm->memo_len &&
          MSNAP_PV_TAG(kv = vm->memo[q[1]]) == MSNAP_PV_STR &&
          msnap_likely(vm->nfitems < vm->fitems_cap)) {
        vm->fitems[vm->nfitems++] = kv;
        f->q = q + 2;
      } else if (fp_scalar(f) <= 0 ||
                 MSNAP_PV_TAG(vm->fitems[vm->nfitems - 1]) != MSNAP_PV_STR) {
        return false;
      }
      /* (a FRAME before the value is not a scalar: fp_value skips it) */
      if (f->q >= f->end) return false;
      int r = fp_scalar_inl(f);
      if (r < 0 || (r > 0 ? !fp_tuple_tail(f) : !fp_value(f, depth)))
        return false;
      if (single) {
        if (!fp_frames(f) || f->q >= f->end || *f->q != MSNAP_OP_SETITEM)
          return false;
        break;
      }
    }
    f->q++; /* SETITEMS / SETITEM */
  } while (!single && fp_frames(f) && f->q < f->end &&
           *f->q == MSNAP_OP_MARK);
  return fp_close(f, MSNAP_POBJ_DICT, base, slot);
}

/* A list opened with memo slot `slot` whose one batch (at the MARK at
 * f->q) is memo references the consumer's scan takes whole (pickle.h):
 * its record without collecting the items.  false: nothing changed. */
static bool fp_refs(fp_t *f, uint32_t slot) {
  msnap_pvm_t *vm = f->vm;
  const unsigned char *q = f->q + 1;
  uint32_t n = vm->refs->scan(vm->cb_ctx, vm->memo, vm->memo_len, &q, f->end);
  if (!n || q >= f->end || *q != MSNAP_OP_APPENDS) return false;
  fp_t g = {vm, q + 1, f->end};
  if (!fp_frames(&g) || (g.q < g.end && *g.q == MSNAP_OP_MARK)) return false;
  /* (room for the record first: past close, nothing may fail) */
  if (vm->nfitems == vm->fitems_cap &&
      msnap__grow((void **)&vm->fitems, &vm->fitems_cap, vm->nfitems, 64,
                  sizeof *vm->fitems) < 0)
    return false;
  msnap_pv_t out = vm->refs->close(vm->cb_ctx, n);
  if (!out) return false;
  f->q = g.q;
  if (slot != UINT32_MAX && vm->memo[slot] == PV_PENDING)
    vm->memo[slot] = out;
  vm->fitems[vm->nfitems++] = out;
  return true;
}

/* A list: ']' [put] then MARK value* APPENDS batches, one dict APPEND,
 * or nothing (empty). */
static bool fp_list(fp_t *f, int depth) {
  msnap_pvm_t *vm = f->vm;
  uint32_t slot, base = vm->nfitems;
  f->q++;
  if (!fp_put(f, PV_PENDING, &slot) || !fp_frames(f)) return false;
  if (f->q < f->end && *f->q == MSNAP_OP_EMPTY_DICT) {
    if (!fp_value(f, depth)) return false;
    if (!fp_frames(f) || f->q >= f->end || *f->q != MSNAP_OP_APPEND)
      return false;
    f->q++;
  } else {
    if (vm->refs && f->q < f->end && *f->q == MSNAP_OP_MARK &&
        f->end - f->q >= 2 &&
        (f->q[1] == MSNAP_OP_BINGET || f->q[1] == MSNAP_OP_LONG_BINGET) &&
        fp_refs(f, slot))
      return true;
    while (f->q < f->end && *f->q == MSNAP_OP_MARK) {
      f->q++;
      while (fp_frames(f) && f->q < f->end && *f->q != MSNAP_OP_APPENDS) {
        if (!fp_get_run(f)) return false;
        if (f->q < f->end && *f->q != MSNAP_OP_APPENDS &&
            *f->q != MSNAP_OP_FRAME && !fp_value(f, depth))
          return false;
      }
      /* (fp_frames also stops the loop at a FRAME it refuses) */
      if (f->q >= f->end || *f->q != MSNAP_OP_APPENDS) return false;
      f->q++;
      if (!fp_frames(f)) return false;
    }
  }
  return fp_close(f, MSNAP_POBJ_LIST, base, slot);
}

/* A scalar token at f->q: pushed (1), not a scalar (0: a container or an
 * opcode the fast path does not read), or bail (-1).  fp_scalar_inl is
 * the same, inlined where a dict's values are read (the hottest call). */
static inline __attribute__((always_inline)) int fp_scalar_inl(fp_t *f) {
  msnap_pvm_t *vm = f->vm;
  const unsigned char *q = f->q, *end = f->end;
  msnap_pv_t v = 0;
  switch (*q) {
  case MSNAP_OP_BINGET:
  case MSNAP_OP_LONG_BINGET: {
    size_t w = *q == MSNAP_OP_BINGET ? 1 : 4;
    if ((size_t)(end - q) < 1 + w) return -1;
    uint64_t idx = w == 1 ? q[1] : le(q + 1, 4);
    if (idx >= vm->memo_len) return -1;
    v = vm->memo[idx];
    if (MSNAP_PV_TAG(v) == MSNAP_PV_OBJ || v == PV_PENDING ||
        v == MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_HOLE))
      return -1;
    f->q = q + 1 + w;
    break;
  }
  case MSNAP_OP_BININT1:
  case MSNAP_OP_BININT2:
  case MSNAP_OP_BININT:
  case MSNAP_OP_LONG1: {
    int64_t x;
    size_t w = msnap__pint_token(q, (size_t)(end - q), &x);
    /* (a box past the budget fails here, the batch rolls back, and the
     * generic interpreter refuses it at its own offset; the boxes of a
     * batch rolled back stay made, and counted) */
    if (!w || make_i64(vm, x, &v) < 0) return -1;
    f->q = q + w;
    break;
  }
  case MSNAP_OP_NONE:
    v = MSNAP_PV_NONE;
    f->q = q + 1;
    break;
  case MSNAP_OP_NEWTRUE:
  case MSNAP_OP_NEWFALSE:
    v = MSNAP_PV_MAKE(MSNAP_PV_CONST, *q == MSNAP_OP_NEWTRUE
                                          ? MSNAP_PVC_TRUE
                                          : MSNAP_PVC_FALSE);
    f->q = q + 1;
    break;
  case MSNAP_OP_SHORT_BINUNICODE:
  case MSNAP_OP_BINUNICODE: {
    size_t w = *q == MSNAP_OP_SHORT_BINUNICODE ? 1 : 4;
    if ((size_t)(end - q) < 1 + w) return -1;
    uint64_t n = le(q + 1, (int)w);
    if (n > (uint64_t)(end - q) - 1 - w) return -1;
    msnap_str_t id = msnap__snap_intern(vm->snap, (const char *)q + 1 + w,
                                        (size_t)n);
    if (!id) return -1;
    v = MSNAP_PV_MAKE(MSNAP_PV_STR, id);
    f->q = q + 1 + w + n;
    uint32_t slot;
    if (!fp_put(f, v, &slot)) return -1;
    return fp_push(vm, v) ? 1 : -1;
  }
  default:
    return 0;
  }
  if (msnap_unlikely(vm->nfitems == vm->fitems_cap))
    return fp_push(vm, v) ? 1 : -1;
  vm->fitems[vm->nfitems++] = v;
  return 1;
}

static inline int fp_scalar(fp_t *f) { return fp_scalar_inl(f); }

/* After a scalar: an (a, b) TUPLE2 [put] (a pool id) when the next
 * scalar is followed by TUPLE2. */
static bool fp_tuple_tail_slow(fp_t *f) {
  msnap_pvm_t *vm = f->vm;
  const unsigned char *end = f->end;
  if (!fp_frames(f)) return false;
  size_t l2 = fp_scalar_len(f->q, end);
  if (!l2 || (size_t)(end - f->q) <= l2 || f->q[l2] != MSNAP_OP_TUPLE2)
    return true;
  uint32_t base = vm->nfitems - 1;
  if (fp_scalar(f) <= 0) return false;
  f->q++; /* TUPLE2 */
  msnap_pv_t out;
  if (!fp_offer(f, MSNAP_POBJ_TUPLE, base, &out)) return false;
  uint32_t slot;
  if (!fp_put(f, out, &slot)) return false;
  return fp_push(vm, out);
}

/* fp_tuple_tail_slow, with the usual next tokens decided inline: a memo
 * reference not followed by TUPLE2, or the end of a batch. */
static inline bool fp_tuple_tail(fp_t *f) {
  const unsigned char *q = f->q;
  ptrdiff_t left = f->end - q;
  if (left >= 3 && q[0] == MSNAP_OP_BINGET && q[2] != MSNAP_OP_TUPLE2)
    return true;
  if (left >= 6 && q[0] == MSNAP_OP_LONG_BINGET && q[5] != MSNAP_OP_TUPLE2)
    return true;
  if (left >= 1 && (q[0] == MSNAP_OP_SETITEMS || q[0] == MSNAP_OP_APPENDS))
    return true;
  return fp_tuple_tail_slow(f);
}

/* One value. */
static bool fp_value(fp_t *f, int depth) {
  if (!fp_frames(f) || f->q >= f->end) return false;
  int r = fp_scalar(f);
  if (r > 0) return fp_tuple_tail(f);
  if (r < 0) return false;
  if (*f->q == MSNAP_OP_EMPTY_DICT)
    return depth < MSNAP_PVM_FAST_DEPTH && fp_dict(f, depth + 1);
  if (*f->q == MSNAP_OP_EMPTY_LIST)
    return depth < MSNAP_PVM_FAST_DEPTH && fp_list(f, depth + 1);
  return false;
}

/*
 * At a MARK over `list` with a dict next: decode the APPENDS batch.
 * Returns true with *pp past the APPENDS when done; false with nothing
 * changed (the generic interpreter takes over).
 */
static bool fast_batch(msnap_pvm_t *vm, msnap_pv_t list,
                       const unsigned char **pp, const unsigned char *end) {
  uint64_t st[MSNAP_PVM_SAVE_WORDS];
  uint32_t memo_len = vm->memo_len, memo_count = vm->memo_count;
  if (vm->save) vm->save(vm->cb_ctx, st);
  vm->nundo = 0;
  vm->nfitems = 0;
  fp_t f = {vm, *pp, end};
  bool ok = true;
  while (ok && fp_frames(&f) && f.q < end && *f.q != MSNAP_OP_APPENDS)
    ok = fp_value(&f, 0);
  ok = ok && f.q < end && *f.q == MSNAP_OP_APPENDS;
  if (ok) {
    /* the records go into the list; nothing of the batch is open */
    for (uint32_t i = 0; i < vm->nundo && ok; i++)
      ok = vm->memo[vm->undo[i].slot] != PV_PENDING;
  }
  if (ok && obj_extend(vm, list, vm->fitems, vm->nfitems, false, false) == 0) {
    *pp = f.q + 1;
    vm->fast_done++;
    return true;
  }
  /* roll back: memo writes in reverse, then the consumer's records */
  vm->failed = false;
  if (vm->err) vm->err->msg[0] = 0;
  for (uint32_t i = vm->nundo; i-- > 0;)
    vm->memo[vm->undo[i].slot] = vm->undo[i].old;
  vm->memo_len = memo_len;
  vm->memo_count = memo_count;
  if (vm->restore) vm->restore(vm->cb_ctx, st);
  vm->fast_rolled_back++;
  return false;
}

/* ---- the interpreter ----------------------------------------------------- */

/* A streamed or decompressed input's window is topped up to AHEAD bytes
 * at a MARK when less than AHEAD_LOW remain: fast_batch decodes a batch
 * only when its APPENDS is in the window (a real batch of 1000 trace
 * entries is 100-300 KB), and a pipe gives 64 KiB a read. */
#define AHEAD_LOW ((size_t)1 << 20)
#define AHEAD ((size_t)4 << 20)

static uint64_t le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

#define TRY(x)                                                                \
  do {                                                                        \
    int rc_ = (x);                                                            \
    if (msnap_unlikely(rc_ < 0)) return rc_;                                  \
  } while (0)

/* Every early end of the input (a refill, a frame, an argument line or the
 * next opcode that the source cannot give) says that the pickle is
 * truncated, then what was missing. */
#define TRUNCATED MSNAP_PICKLE_TRUNCATED

/* Make k bytes available at p: a refill of a streamed source, or an
 * error naming what is missing. */
static int refill(msnap_pvm_t *vm, const unsigned char **p,
                  const unsigned char **end, uint64_t k) {
  int rc = k > SIZE_MAX ? 1 : msnap__source_fill(vm->src, p, (size_t)k);
  *end = vm->src->end;
  if (rc == 0) return 0;
  if (rc == 1)
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           TRUNCATED "needs %llu byte%s but only %zu remain",
                           (unsigned long long)k, k == 1 ? "" : "s",
                           (size_t)(*end - *p));
  return msnap__pvm_fail(vm, rc, "%s", vm->src->err);
}

#define NEED(k)                                                               \
  do {                                                                        \
    if (msnap_unlikely((size_t)(end - p) < (uint64_t)(k)))                    \
      TRY(refill(vm, &p, &end, (uint64_t)(k)));                               \
  } while (0)


/* Read a text line (the argument of a protocol-0 opcode). */
static int read_line(msnap_pvm_t *vm, const unsigned char **pp,
                     const unsigned char **pend, const unsigned char **line,
                     size_t *n) {
  size_t scanned = 0;
  for (;;) {
    const unsigned char *p = *pp, *end = *pend;
    const unsigned char *nl =
        memchr(p + scanned, '\n', (size_t)(end - p) - scanned);
    if (nl) {
      *line = p;
      *n = (size_t)(nl - p);
      *pp = nl + 1;
      return 0;
    }
    scanned = (size_t)(end - p);
    int rc = msnap__source_fill(vm->src, pp, scanned + 1);
    *pend = vm->src->end;
    if (rc == 1)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, TRUNCATED
                             "an argument line has no terminating newline");
    if (rc < 0) return msnap__pvm_fail(vm, rc, "%s", vm->src->err);
  }
}

/*
 * After a refused opcode op, with p just past it: whether op and what
 * follows are the opcodes of a protocol-0 pickle (each a printable byte,
 * the text ones with their argument lines) up to STOP, so that the input
 * is a whole pickle, not a text file that happens to begin with 'c' or
 * "(i".  Nothing is executed; the input is read on at most
 * TEXT_PICKLE_SCAN bytes, and that many well-formed opcodes count as a
 * pickle too.  A text file fails on its first line that is no opcode.
 */
#define TEXT_PICKLE_SCAN (1u << 20)
static bool text_pickle_ends(msnap_pvm_t *vm, unsigned op,
                             const unsigned char *p) {
  msnap_source_t *src = vm->src;
  uint64_t from = msnap__source_offset(src, p);
  for (;;) {
    int lines;
    switch (op) {
    case '.':
      return true;
    case '(': case '0': case '1': case '2': case 'N': case 'R': case 'a':
    case 'b': case 'd': case 'e': case 'l': case 'o': case 's': case 't':
    case 'u':
      lines = 0;
      break;
    case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g':
    case 'p':
      lines = 1;
      break;
    case 'c': case 'i':
      lines = 2;
      break;
    default:
      return false;
    }
    for (int l = 0; l < lines; l++) {
      size_t scanned = 0;
      for (;;) {
        const unsigned char *nl = memchr(
            p + scanned, '\n', (size_t)(src->end - p) - scanned);
        if (nl) {
          p = nl + 1;
          break;
        }
        scanned = (size_t)(src->end - p);
        if (msnap__source_offset(src, src->end) - from >= TEXT_PICKLE_SCAN)
          return true;
        if (msnap__source_fill(src, &p, scanned + 1) != 0) return false;
      }
    }
    if (msnap__source_offset(src, p) - from >= TEXT_PICKLE_SCAN) return true;
    if (p >= src->end && msnap__source_fill(src, &p, 1) != 0) return false;
    op = *p++;
  }
}

/* Refuse an opcode that imports or calls; GLOBAL / STACK_GLOBAL name
 * what they would import (a pickle of Python objects, e.g. a tensor). */
static int refuse(msnap_pvm_t *vm, unsigned op, const unsigned char *p,
                  const unsigned char *end) {
  char name[160] = "";
  if (op == MSNAP_OP_GLOBAL) {
    /* its two argument lines, read as far as they go (150 bytes at
     * most), so a stream names the same thing as a file */
    const unsigned char *nl1 = NULL, *nl2 = NULL;
    for (;;) {
      nl1 = memchr(p, '\n', (size_t)(end - p));
      nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
      if (nl2 || end - p >= 150) break;
      if (msnap__source_fill(vm->src, &p, (size_t)(end - p) + 1) != 0) {
        end = vm->src->end;
        nl1 = memchr(p, '\n', (size_t)(end - p));
        nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
        break;
      }
      end = vm->src->end;
    }
    if (nl2 && nl2 - p < 150)
      snprintf(name, sizeof name, " (%.*s.%.*s)", (int)(nl1 - p), p,
               (int)(nl2 - nl1 - 1), nl1 + 1);
  } else if (op == MSNAP_OP_STACK_GLOBAL && vm->sn >= 2 &&
             MSNAP_PV_TAG(vm->stack[vm->sn - 1]) == MSNAP_PV_STR &&
             MSNAP_PV_TAG(vm->stack[vm->sn - 2]) == MSNAP_PV_STR) {
    size_t lm, ln;
    const char *m = msnap__snap_str(
        vm->snap, (msnap_str_t)MSNAP_PV_PAYLOAD(vm->stack[vm->sn - 2]), &lm);
    const char *n = msnap__snap_str(
        vm->snap, (msnap_str_t)MSNAP_PV_PAYLOAD(vm->stack[vm->sn - 1]), &ln);
    snprintf(name, sizeof name, " (%.*s.%.*s)", (int)(lm < 70 ? lm : 70), m,
             (int)(ln < 70 ? ln : 70), n);
  }
  bool imports = op == MSNAP_OP_GLOBAL || op == MSNAP_OP_STACK_GLOBAL;
  vm->refused_text_pickle = text_pickle_ends(vm, op, p);
  if (op == MSNAP_OP_NEXT_BUFFER || op == MSNAP_OP_READONLY_BUFFER)
    return msnap__pvm_fail(vm, MSNAP_EUNSAFE,
                           "opcode %s (0x%02x) takes an out-of-band buffer "
                           "(pickle protocol 5's buffer_callback), which a "
                           "memory snapshot never holds; refused",
                           op_name(op), op);
  return msnap__pvm_fail(vm, MSNAP_EUNSAFE,
                         "opcode %s (0x%02x) would import or call code%s; "
                         "refused%s",
                         op_name(op), op, name,
                         imports ? ": this pickle holds Python objects, not "
                                   "only the dicts and lists of a memory "
                                   "snapshot"
                                 : "");
}

/*
 * Execute the pickle of src up to STOP (trailing bytes are not read).
 * The result is the root value, completed like any stored container.
 * Every error names the opcode's offset; the VM may be freed after an
 * error but not run again.
 */
int msnap__pvm_run_source(msnap_pvm_t *vm, msnap_source_t *src,
                          msnap_pv_t *result, msnap_read_error_t *err) {
  const unsigned char *p = src->start, *end = src->end;
  uint64_t next_progress = PROGRESS_STEP;
  vm->src = src;
  vm->err = err;
  vm->failed = false;
  vm->refused_text_pickle = false;
  if (err) {
    err->offset = 0;
    err->msg[0] = 0;
  }
  for (;;) {
    if (msnap_unlikely(p >= end)) {
      vm->op_off = (size_t)msnap__source_offset(src, p);
      vm->op = MSNAP_OP_STOP;
      int rc = msnap__source_fill(src, &p, 1);
      end = src->end;
      if (rc < 0) return msnap__pvm_fail(vm, rc, "%s", src->err);
      if (rc == 1)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               TRUNCATED "it ended without STOP");
    }
    vm->op_off = (size_t)msnap__source_offset(src, p);
    if (msnap_unlikely(vm->op_off >= next_progress)) {
      msnap__source_progress(src, p);
      next_progress = vm->op_off + PROGRESS_STEP;
    }
    unsigned op = *p++;
    vm->op = op;
    switch (op) {
    case MSNAP_OP_PROTO:
      NEED(1);
      if (*p > 5)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "unsupported pickle protocol %u", *p);
      p++;
      break;
    case MSNAP_OP_FRAME: {
      NEED(8);
      uint64_t n = le(p, 8);
      p += 8;
      if (n > (uint64_t)(end - p)) {
        /* the declared frame must be there (a stream buffers it) */
        int rc = msnap__source_fill(src, &p, (size_t)n);
        end = src->end;
        if (rc < 0) return msnap__pvm_fail(vm, rc, "%s", src->err);
        if (rc == 1)
          return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                                 TRUNCATED
                                 "a frame of %llu bytes but only %zu remain",
                                 (unsigned long long)n, (size_t)(end - p));
      }
      break;
    }
    case MSNAP_OP_STOP: {
      msnap_pv_t v = 0;
      uint32_t d;
      TRY(pop(vm, &v));
      TRY(complete(vm, &v, &d));
      *result = v;
      return 0;
    }
    case MSNAP_OP_MARK:
      if (vm->fast && msnap_unlikely((size_t)(end - p) < AHEAD_LOW)) {
        /* a stream or decompressed input (a mapped file or a buffer is
         * whole already): a window that holds the whole batch lets the
         * fast path decode it; only what is ready is read */
        msnap__source_fill_ahead(src, &p, AHEAD);
        end = src->end;
      }
      /* (not within MSNAP_PVM_FAST_DEPTH + 2 MARKs of the limit: the
       * generic interpreter executes the batch's MARK and one per
       * container level under it -- a trace entry's frame list one
       * deeper than the fast path's containers -- and refuses the
       * 1001st, where the fast path would read on) */
      if (vm->fast && p < end && *p == MSNAP_OP_EMPTY_DICT && vm->sn &&
          mark_base(vm) < vm->sn &&
          vm->mn + MSNAP_PVM_FAST_DEPTH + 2 <= MSNAP_PICKLE_MAX_DEPTH) {
        msnap_pobj_t *lo = msnap__pvm_obj(vm, vm->stack[vm->sn - 1]);
        /* (on a stream it decodes what the window holds: a batch that
         * runs past it is left to the generic interpreter, which reads
         * on only as far as it needs -- a writer that keeps a FIFO open
         * after STOP never blocks the reader) */
        if (lo && lo->kind == MSNAP_POBJ_LIST &&
            fast_batch(vm, vm->stack[vm->sn - 1], &p, end))
          break;
      }
      if (vm->mn >= MSNAP_PICKLE_MAX_DEPTH)
        return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                               "MARKs nested deeper than %d levels",
                               MSNAP_PICKLE_MAX_DEPTH);
      if (msnap__grow((void **)&vm->marks, &vm->mcap, vm->mn, 1,
                      sizeof *vm->marks) < 0)
        return oom(vm);
      vm->marks[vm->mn++] = vm->sn;
      break;
    case MSNAP_OP_POP:
      if (vm->sn > mark_base(vm))
        stack_unref(vm, vm->stack[--vm->sn]);
      else if (vm->mn)
        vm->mn--;
      else
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "stack underflow");
      break;
    case MSNAP_OP_POP_MARK: {
      uint32_t first = 0;
      TRY(pop_mark(vm, &first));
      stack_unref_range(vm, first, vm->sn);
      vm->sn = first;
      break;
    }
    case MSNAP_OP_DUP: {
      msnap_pv_t *t = 0;
      TRY(top(vm, &t));
      TRY(push(vm, *t));
      break;
    }
    case MSNAP_OP_NONE:
      TRY(push(vm, MSNAP_PV_NONE));
      break;
    case MSNAP_OP_NEWTRUE:
      TRY(push(vm, MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_TRUE)));
      break;
    case MSNAP_OP_NEWFALSE:
      TRY(push(vm, MSNAP_PV_MAKE(MSNAP_PV_CONST, MSNAP_PVC_FALSE)));
      break;
    case MSNAP_OP_BININT1:
      NEED(1);
      TRY(push(vm, MSNAP_PV_MAKE(MSNAP_PV_INT, *p)));
      p++;
      break;
    case MSNAP_OP_BININT2:
      NEED(2);
      TRY(push(vm, MSNAP_PV_MAKE(MSNAP_PV_INT, le(p, 2))));
      p += 2;
      break;
    case MSNAP_OP_BININT: {
      NEED(4);
      msnap_pv_t v = 0;
      TRY(make_i64(vm, (int32_t)(uint32_t)le(p, 4), &v));
      TRY(push(vm, v));
      p += 4;
      break;
    }
    case MSNAP_OP_LONG1: {
      NEED(1);
      size_t n = *p++;
      NEED(n);
      TRY(push_long_bytes(vm, p, n));
      p += n;
      break;
    }
    case MSNAP_OP_LONG4: {
      NEED(4);
      int32_t n = (int32_t)(uint32_t)le(p, 4);
      p += 4;
      if (n < 0)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "negative LONG4 length");
      NEED((size_t)n);
      TRY(push_long_bytes(vm, p, (size_t)n));
      p += n;
      break;
    }
    case MSNAP_OP_INT:
    case MSNAP_OP_LONG: {
      const unsigned char *l = 0;
      size_t n = 0;
      TRY(read_line(vm, &p, &end, &l, &n));
      if (op == MSNAP_OP_INT && n == 2 && l[0] == '0' &&
          (l[1] == '0' || l[1] == '1')) {
        TRY(push(vm, MSNAP_PV_MAKE(MSNAP_PV_CONST, l[1] == '1'
                                                       ? MSNAP_PVC_TRUE
                                                       : MSNAP_PVC_FALSE)));
        break;
      }
      TRY(push_decimal(vm, (const char *)l, n));
      break;
    }
    case MSNAP_OP_FLOAT: {
      const unsigned char *l = 0;
      size_t n = 0;
      TRY(read_line(vm, &p, &end, &l, &n));
      TRY(scratch(vm, n + 1));
      memcpy(vm->scratch, l, n);
      vm->scratch[n] = 0;
      char *e;
      double f = strtod(vm->scratch, &e);
      while (*e == ' ' || *e == '\r') e++;
      if (e == vm->scratch || *e)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "bad float literal");
      TRY(push_float(vm, f));
      break;
    }
    case MSNAP_OP_BINFLOAT: {
      NEED(8);
      uint64_t u = 0;
      for (int i = 0; i < 8; i++) u = (u << 8) | p[i];
      double f;
      memcpy(&f, &u, 8);
      p += 8;
      TRY(push_float(vm, f));
      break;
    }
    case MSNAP_OP_STRING: {
      const unsigned char *l = 0;
      size_t n = 0;
      TRY(read_line(vm, &p, &end, &l, &n));
      TRY(push_quoted(vm, l, n));
      break;
    }
    case MSNAP_OP_UNICODE: {
      const unsigned char *l = 0;
      size_t n = 0;
      TRY(read_line(vm, &p, &end, &l, &n));
      TRY(push_raw_unicode(vm, l, n));
      break;
    }
    case MSNAP_OP_BINSTRING: {
      NEED(4);
      int32_t n = (int32_t)(uint32_t)le(p, 4);
      p += 4;
      if (n < 0)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "negative BINSTRING length");
      NEED((size_t)n);
      TRY(push_ascii(vm, p, (size_t)n));
      p += n;
      break;
    }
    case MSNAP_OP_SHORT_BINSTRING: {
      NEED(1);
      size_t n = *p++;
      NEED(n);
      TRY(push_ascii(vm, p, n));
      p += n;
      break;
    }
    case MSNAP_OP_SHORT_BINUNICODE:
    case MSNAP_OP_SHORT_BINBYTES:
    case MSNAP_OP_BINUNICODE:
    case MSNAP_OP_BINBYTES:
    case MSNAP_OP_BINUNICODE8:
    case MSNAP_OP_BINBYTES8:
    case MSNAP_OP_BYTEARRAY8: {
      int w = (op == MSNAP_OP_SHORT_BINUNICODE || op == MSNAP_OP_SHORT_BINBYTES)
                  ? 1
              : (op == MSNAP_OP_BINUNICODE || op == MSNAP_OP_BINBYTES) ? 4
                                                                        : 8;
      NEED(w);
      uint64_t n = le(p, w);
      p += w;
      NEED(n);
      unsigned tag = (op == MSNAP_OP_SHORT_BINUNICODE ||
                      op == MSNAP_OP_BINUNICODE || op == MSNAP_OP_BINUNICODE8)
                         ? MSNAP_PV_STR
                     : op == MSNAP_OP_BYTEARRAY8 ? MSNAP_PV_BYTEARRAY
                                                 : MSNAP_PV_BYTES;
      TRY(push_str(vm, tag, p, (size_t)n));
      p += n;
      break;
    }
    case MSNAP_OP_EMPTY_LIST:
    case MSNAP_OP_EMPTY_DICT:
    case MSNAP_OP_EMPTY_TUPLE:
    case MSNAP_OP_EMPTY_SET: {
      msnap_pv_t v = 0;
      uint8_t kind = op == MSNAP_OP_EMPTY_LIST   ? MSNAP_POBJ_LIST
                     : op == MSNAP_OP_EMPTY_DICT ? MSNAP_POBJ_DICT
                     : op == MSNAP_OP_EMPTY_SET  ? MSNAP_POBJ_SET
                                                 : MSNAP_POBJ_TUPLE;
      TRY(obj_new(vm, kind, 0, &v));
      TRY(push(vm, v));
      break;
    }
    case MSNAP_OP_LIST:
    case MSNAP_OP_TUPLE:
    case MSNAP_OP_DICT:
    case MSNAP_OP_FROZENSET: {
      uint32_t first = 0;
      TRY(pop_mark(vm, &first));
      uint8_t kind = op == MSNAP_OP_LIST    ? MSNAP_POBJ_LIST
                     : op == MSNAP_OP_TUPLE ? MSNAP_POBJ_TUPLE
                     : op == MSNAP_OP_DICT  ? MSNAP_POBJ_DICT
                                            : MSNAP_POBJ_FROZENSET;
      if (kind == MSNAP_POBJ_FROZENSET)
        for (uint32_t i = first; i < vm->sn; i++)
          if (unhashable(vm, vm->stack[i]))
            return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                                   "unhashable %s in a frozenset",
                                   msnap__pvm_type(vm, vm->stack[i]));
      TRY(build_from(vm, kind, first));
      break;
    }
    case MSNAP_OP_TUPLE1:
    case MSNAP_OP_TUPLE2:
    case MSNAP_OP_TUPLE3: {
      uint32_t n = op - MSNAP_OP_TUPLE1 + 1;
      if (vm->sn < mark_base(vm) + n)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "stack underflow");
      TRY(build_from(vm, MSNAP_POBJ_TUPLE, vm->sn - n));
      break;
    }
    case MSNAP_OP_APPEND: {
      msnap_pv_t v = 0, *l = NULL;
      TRY(pop(vm, &v));
      TRY(top(vm, &l));
      TRY(container_at(vm, *l, MSNAP_POBJ_LIST, "APPEND"));
      TRY(obj_extend(vm, *l, &v, 1, false, true));
      break;
    }
    case MSNAP_OP_APPENDS:
    case MSNAP_OP_SETITEMS:
    case MSNAP_OP_ADDITEMS: {
      uint32_t first = 0;
      TRY(pop_mark(vm, &first));
      if (first == 0 || first <= mark_base(vm))
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "no container below the MARK");
      msnap_pv_t c = vm->stack[first - 1];
      uint8_t kind = op == MSNAP_OP_APPENDS    ? MSNAP_POBJ_LIST
                     : op == MSNAP_OP_SETITEMS ? MSNAP_POBJ_DICT
                                               : MSNAP_POBJ_SET;
      TRY(container_at(vm, c, kind, op_name(op)));
      uint32_t n = vm->sn - first;
      if (kind == MSNAP_POBJ_DICT && (n & 1))
        return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                               "odd number of items (%u) for SETITEMS", n);
      if (kind == MSNAP_POBJ_SET)
        for (uint32_t i = first; i < vm->sn; i++)
          if (unhashable(vm, vm->stack[i]))
            return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                                   "unhashable %s in a set",
                                   msnap__pvm_type(vm, vm->stack[i]));
      TRY(obj_extend(vm, c, vm->stack + first, n, kind == MSNAP_POBJ_DICT,
                     true));
      vm->sn = first;
      break;
    }
    case MSNAP_OP_SETITEM: {
      if (vm->sn < mark_base(vm) + 3)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "stack underflow");
      msnap_pv_t c = vm->stack[vm->sn - 3];
      TRY(container_at(vm, c, MSNAP_POBJ_DICT, "SETITEM"));
      TRY(obj_extend(vm, c, vm->stack + vm->sn - 2, 2, true, true));
      vm->sn -= 2;
      break;
    }
    case MSNAP_OP_GET:
    case MSNAP_OP_PUT: {
      const unsigned char *l = 0;
      size_t n = 0;
      TRY(read_line(vm, &p, &end, &l, &n));
      uint64_t idx = 0;
      if (n == 0 || n > 18)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "bad memo index");
      for (size_t i = 0; i < n; i++) {
        if (l[i] < '0' || l[i] > '9')
          return msnap__pvm_fail(vm, MSNAP_EFORMAT, "bad memo index");
        idx = idx * 10 + (l[i] - '0');
      }
      TRY(op == MSNAP_OP_GET ? memo_get(vm, idx) : memo_put(vm, idx));
      break;
    }
    case MSNAP_OP_BINGET:
    case MSNAP_OP_BINPUT:
      NEED(1);
      if (op == MSNAP_OP_BINGET && msnap_likely(memo_get_fast(vm, *p))) {
        p++;
        /* runs of gets (list items): no dispatch per opcode */
        while (end - p >= 2 && *p == MSNAP_OP_BINGET &&
               memo_get_fast(vm, p[1]))
          p += 2;
        break;
      }
      TRY(op == MSNAP_OP_BINGET ? memo_get(vm, *p) : memo_put(vm, *p));
      p++;
      break;
    case MSNAP_OP_LONG_BINGET:
    case MSNAP_OP_LONG_BINPUT:
      NEED(4);
      if (op == MSNAP_OP_LONG_BINGET &&
          msnap_likely(memo_get_fast(vm, le(p, 4)))) {
        p += 4;
        while (end - p >= 5 && *p == MSNAP_OP_LONG_BINGET &&
               memo_get_fast(vm, le(p + 1, 4)))
          p += 5;
        break;
      }
      TRY(op == MSNAP_OP_LONG_BINGET ? memo_get(vm, le(p, 4))
                                     : memo_put(vm, le(p, 4)));
      p += 4;
      break;
    case MSNAP_OP_MEMOIZE:
      TRY(memo_put(vm, vm->memo_count));
      break;
    case MSNAP_OP_GLOBAL:
    case MSNAP_OP_STACK_GLOBAL:
    case MSNAP_OP_REDUCE:
    case MSNAP_OP_BUILD:
    case MSNAP_OP_INST:
    case MSNAP_OP_OBJ:
    case MSNAP_OP_NEWOBJ:
    case MSNAP_OP_NEWOBJ_EX:
    case MSNAP_OP_EXT1:
    case MSNAP_OP_EXT2:
    case MSNAP_OP_EXT4:
    case MSNAP_OP_PERSID:
    case MSNAP_OP_BINPERSID:
    case MSNAP_OP_NEXT_BUFFER:
    case MSNAP_OP_READONLY_BUFFER:
      return refuse(vm, op, p, end);
    default:
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, "unknown opcode 0x%02x",
                             op);
    }
  }
}

int msnap__pvm_run(msnap_pvm_t *vm, const unsigned char *buf, size_t len,
                   msnap_pv_t *result, msnap_read_error_t *err) {
  msnap_source_t *src;
  if (msnap__source_mem(&src, buf, len) < 0) {
    if (err) snprintf(err->msg, sizeof err->msg, "offset 0: out of memory");
    return MSNAP_ENOMEM;
  }
  int rc = msnap__pvm_run_source(vm, src, result, err);
  msnap__source_close(src);
  return rc;
}

/* ---- generic tree -------------------------------------------------------- */

static int gv_too_large(msnap_pvm_t *vm) {
  return msnap__pvm_fail(
      vm, MSNAP_ELIMIT,
      "value too large to convert: %s more than %llu values (the limit: one "
      "per byte of input, at least %u, at most %u)",
      vm->gv_shared ? "its containers shared through the memo would make"
                    : "it holds",
      (unsigned long long)vm->gv_limit, MSNAP_PICKLE_GV_MIN,
      MSNAP_PICKLE_GV_MAX);
}

/* A string of a generic value: its bytes off the strings' budget. */
static int gv_str(msnap_pvm_t *vm, msnap_str_t id) {
  size_t n = 0;
  (void)msnap__snap_str(vm->snap, id, &n);
  if (n <= vm->gv_str_left) {
    vm->gv_str_left -= n;
    return 0;
  }
  return msnap__pvm_fail(
      vm, MSNAP_ELIMIT,
      "value too large to convert: its strings, shared through the memo, "
      "would make more than %llu bytes (the limit: %ux the input + "
      "%llu MiB)",
      (unsigned long long)vm->gv_str_limit, MSNAP_PICKLE_GV_STR_RATIO,
      (unsigned long long)(MSNAP_PICKLE_GV_STR_SLACK >> 20));
}

static int to_gv(msnap_pvm_t *vm, msnap_pv_t v, msnap_gv_t *out,
                 unsigned depth, uint64_t *budget) {
  memset(out, 0, sizeof *out);
  out->kind = MSNAP_GV_NONE;
  if (depth > MSNAP_PICKLE_MAX_DEPTH)
    return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                           "value nested deeper than %d levels to convert",
                           MSNAP_PICKLE_MAX_DEPTH);
  if ((*budget)-- == 0)
    return gv_too_large(vm);
  int64_t i;
  double f;
  switch (MSNAP_PV_TAG(v)) {
  case MSNAP_PV_CONST:
    if (MSNAP_PV_PAYLOAD(v) == MSNAP_PVC_NONE) return 0;
    out->kind = MSNAP_GV_BOOL;
    out->u.b = MSNAP_PV_PAYLOAD(v) == MSNAP_PVC_TRUE;
    return 0;
  case MSNAP_PV_STR:
    out->kind = MSNAP_GV_STR;
    out->u.s = (msnap_str_t)MSNAP_PV_PAYLOAD(v);
    return gv_str(vm, out->u.s);
  case MSNAP_PV_INT:
  case MSNAP_PV_BOX:
    if (msnap__pvm_float(vm, v, &f)) {
      out->kind = MSNAP_GV_FLOAT;
      out->u.f = f;
      return 0;
    }
    if (msnap__pvm_int(vm, v, &i, NULL) == MSNAP_PINT_I64) {
      out->kind = MSNAP_GV_INT;
      out->u.i = i;
      return 0;
    }
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "integer does not fit in 64 signed bits");
  case MSNAP_PV_OBJ: {
    msnap_pobj_t *o = msnap__pvm_obj(vm, v);
    if (!o)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, "consumed container");
    if (o->kind == MSNAP_POBJ_SET || o->kind == MSNAP_POBJ_FROZENSET)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, "a set is not supported");
    if (o->flags & OBJF_VISITING)
      return msnap__pvm_fail(vm, MSNAP_EFORMAT, "recursive structure");
    if (o->flags & OBJF_CONVERTED) vm->gv_shared = true;
    o->flags |= OBJF_CONVERTED;
    uint32_t n = o->n;
    if (n > *budget) return gv_too_large(vm);
    msnap_gv_t *items = n ? calloc(n, sizeof *items) : NULL;
    if (n && !items) return oom(vm);
    out->kind = o->kind == MSNAP_POBJ_LIST    ? MSNAP_GV_LIST
                : o->kind == MSNAP_POBJ_TUPLE ? MSNAP_GV_TUPLE
                                              : MSNAP_GV_DICT;
    out->u.seq.items = items;
    out->u.seq.n = n;
    o->flags |= OBJF_VISITING;
    uint32_t idx = (uint32_t)(MSNAP_PV_PAYLOAD(v) & OBJ_INDEX_MASK);
    for (uint32_t k = 0; k < n; k++) {
      int rc = to_gv(vm, msnap__pobj_item(&vm->objs[idx], k), &items[k],
                     depth + 1,
                     budget);
      if (rc < 0) {
        vm->objs[idx].flags &= (uint8_t)~OBJF_VISITING;
        msnap__gv_free(out);
        return rc;
      }
    }
    vm->objs[idx].flags &= (uint8_t)~OBJF_VISITING;
    return 0;
  }
  case MSNAP_PV_REC:
    if (vm->rec_gv) {
      int rc = vm->rec_gv(vm->cb_ctx, v, out);
      if (rc < 0) return rc;
      /* a record may stand for a list (a list of strings): its items
       * count as well */
      if ((out->kind == MSNAP_GV_LIST || out->kind == MSNAP_GV_DICT ||
           out->kind == MSNAP_GV_TUPLE) &&
          out->u.seq.n) {
        if (out->u.seq.n > *budget) {
          msnap__gv_free(out);
          return gv_too_large(vm);
        }
        *budget -= out->u.seq.n;
        for (uint32_t k = 0; k < out->u.seq.n; k++) {
          int src = out->u.seq.items[k].kind == MSNAP_GV_STR
                        ? gv_str(vm, out->u.seq.items[k].u.s)
                        : 0;
          if (src < 0) {
            msnap__gv_free(out);
            return src;
          }
        }
      }
      return 0;
    }
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "record in a generic value");
  default: {
    const char *t = msnap__pvm_type(vm, v);
    return msnap__pvm_fail(vm, MSNAP_EFORMAT,
                           "%s%s cannot be kept as a generic value",
                           article(t), t);
  }
  }
}

/* The budget is shared by every call on a VM (allocator_settings and
 * process_info together) and proportional to the input, so that containers
 * shared through the memo (a list put in a list twice, that one twice...)
 * can never make the generic values, or their output, more than a small
 * multiple of the file: one value per input byte (a value takes at least
 * one opcode byte when nothing is shared), at least MSNAP_PICKLE_GV_MIN,
 * at most MSNAP_PICKLE_GV_MAX. */
int msnap__pvm_to_gv(msnap_pvm_t *vm, msnap_pv_t v, msnap_gv_t *out) {
  if (!vm->gv_budget_set) {
    uint64_t b = vm->op_off;
    if (b < MSNAP_PICKLE_GV_MIN) b = MSNAP_PICKLE_GV_MIN;
    if (b > MSNAP_PICKLE_GV_MAX) b = MSNAP_PICKLE_GV_MAX;
    vm->gv_budget = vm->gv_limit = b;
    uint64_t sb = vm->op_off > (UINT64_MAX - MSNAP_PICKLE_GV_STR_SLACK) /
                                   MSNAP_PICKLE_GV_STR_RATIO
                      ? UINT64_MAX
                      : vm->op_off * MSNAP_PICKLE_GV_STR_RATIO +
                            MSNAP_PICKLE_GV_STR_SLACK;
    vm->gv_str_left = vm->gv_str_limit = sb;
    vm->gv_budget_set = true;
  }
  return to_gv(vm, v, out, 0, &vm->gv_budget);
}
