/*
 * traceback.c -- recorded stacks as model frames: the stack import that
 * snapshots run after their locks are released (msnap__snap_import_stacks)
 * and torch.cuda.memory._allocation_traceback (msnap_allocation_traceback).
 *
 * A recorded stack (record/stack.c) holds raw C return addresses and raw
 * interpreter frames.  Import turns each unique stack into a model stack
 * once: C addresses are symbolized once per address (msnap__symbolize),
 * interpreter frames resolved once per (code, instruction) through the
 * frame hook, and a Python frame goes just before the C frame that runs
 * the interpreter (cuda-reference §2.5, stacks "all").  Three caches
 * (base/map16.c) keep the work per unique item.
 *
 * _allocation_traceback pickles the frames of one live allocation as a
 * list of {"filename", "line", "name"} dicts through the model's pickle
 * encoder (model/pickle_write.c), protocol 4 like every other pickle of
 * memsnap; an allocation without a stack gives no bytes (Python None).
 * A pointer that is not a live base pointer is MSNAP_EBADPTR, as
 * _annotate_memory's; the Python binding turns it into None, as torch's
 * _allocation_traceback returns None for a pointer it does not find.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/map16.h"
#include "model/pickle.h"
#include "record/stack.h"

/* ---- stack import ------------------------------------------------------------ */

typedef msnap_import_t import_t;

void msnap__import_init(msnap_import_t *im, msnap_snap_t *s) {
  memset(im, 0, sizeof *im);
  im->s = s;
}

static void import_free(import_t *im) {
  msnap__map16_free(&im->stacks);
  msnap__map16_free(&im->cframes);
  msnap__map16_free(&im->pyframes);
}

int msnap__import_done(msnap_import_t *im) {
  import_free(im);
  return im->err;
}

static uint32_t model_frame(import_t *im, const char *name,
                            const char *filename, int64_t line) {
  msnap_frame_t f;
  memset(&f, 0, sizeof f);
  f.name = msnap__snap_intern(im->s, name, strlen(name));
  f.filename = msnap__snap_intern(im->s, filename, strlen(filename));
  f.line = line;
  if (f.name == 0 || f.filename == 0) {
    im->err = MSNAP_ENOMEM;
    return UINT32_MAX;
  }
  uint32_t id = msnap__snap_frame(im->s, &f);
  if (id == UINT32_MAX) im->err = MSNAP_ENOMEM;
  return id;
}

static uint32_t c_frame(import_t *im, uintptr_t pc, msnap_csym_t *sym) {
  msnap__symbolize(pc, sym);
  bool fresh;
  uint32_t *slot = msnap__map16_slot(&im->cframes, pc, 0, &fresh);
  if (slot == NULL) {
    im->err = MSNAP_ENOMEM;
    return UINT32_MAX;
  }
  if (fresh) *slot = model_frame(im, sym->name, sym->filename, sym->line);
  return *slot;
}

static uint32_t py_frame(import_t *im, const msnap_frame_hook_t *hook,
                         const uintptr_t f[2]) {
  bool fresh;
  uint32_t *slot = msnap__map16_slot(&im->pyframes, f[0], f[1], &fresh);
  if (slot == NULL) {
    im->err = MSNAP_ENOMEM;
    return UINT32_MAX;
  }
  if (fresh) {
    const char *name = NULL, *file = NULL;
    int64_t line = 0;
    if (hook == NULL || hook->resolve(hook->ctx, f, &name, &file, &line) != 0)
      name = file = NULL;
    if (name == NULL || file == NULL) line = 0;
    *slot = model_frame(im, name ? name : "??", file ? file : "??", line);
  }
  return *slot;
}

/* A C frame that runs interpreter frames: the matching Python frame goes
 * just before it (cuda-reference §2.5, stacks "all"). */
static bool is_eval_frame(const char *name) {
  return strstr(name, "PyEval_EvalFrame") != NULL;
}

/* Model stack of a raw recorder stack (cached). */
static msnap_stack_t import_one(import_t *im, uint32_t raw) {
  bool fresh;
  uint32_t *slot = msnap__map16_slot(&im->stacks, raw, 0, &fresh);
  if (slot == NULL) {
    im->err = MSNAP_ENOMEM;
    return MSNAP_STACK_EMPTY;
  }
  if (!fresh) return *slot;
  *slot = MSNAP_STACK_EMPTY;
  msnap_stack_view_t v;
  if (msnap__stack_view(raw, &v) != 0) return MSNAP_STACK_EMPTY;
  uint32_t *ids = malloc(((size_t)v.nc + v.npy + 1) * sizeof *ids);
  if (ids == NULL) {
    im->err = MSNAP_ENOMEM;
    return MSNAP_STACK_EMPTY;
  }
  uint32_t n = 0, pi = 0;
  for (uint32_t k = 0; k < v.nc; k++) {
    msnap_csym_t sym;
    uint32_t cf = c_frame(im, v.c[k], &sym);
    /* memsnap's own C frames (the allocator, the Python binding) say
     * nothing about the caller: left out, as its Python frames are. */
    if (sym.own) continue;
    if (pi < v.npy && is_eval_frame(sym.name)) {
      uint32_t pf = py_frame(im, v.hook, v.py[pi++]);
      if (pf != UINT32_MAX) ids[n++] = pf;
    }
    if (cf != UINT32_MAX) ids[n++] = cf;
  }
  while (pi < v.npy) {
    uint32_t pf = py_frame(im, v.hook, v.py[pi++]);
    if (pf != UINT32_MAX) ids[n++] = pf;
  }
  msnap_stack_t st = msnap__snap_stack(im->s, ids, n);
  free(ids);
  if (st == 0) {
    im->err = MSNAP_ENOMEM;
    st = MSNAP_STACK_EMPTY;
  }
  *slot = st;
  return st;
}

msnap_stack_t msnap__import_stack(msnap_import_t *im, uint32_t raw) {
  return raw == 0 ? MSNAP_STACK_ABSENT : import_one(im, raw);
}

/* Convert one frames field holding a raw id (with its reference). */
static void import_field(import_t *im, msnap_stack_t *field, bool absent_ok) {
  uint32_t raw = *field;
  if (raw == 0) {
    *field = absent_ok ? MSNAP_STACK_ABSENT : MSNAP_STACK_EMPTY;
    return;
  }
  *field = import_one(im, raw);
  msnap__stack_unref(raw);
}

static void import_traces(import_t *im, msnap_trace_list_t *l) {
  msnap_snap_t *s = im->s;
  for (uint32_t i = 0; i < l->n; i++) {
    msnap_strace_t *e = &l->v[i];
    uint32_t raw = e->frames;
    import_field(im, &e->frames, true);
    /* the frames key lives in the entry's interned attributes */
    if (raw != 0 && e->frames != MSNAP_STACK_ABSENT &&
        !(msnap__tattr(s, e)->keys & MSNAP_K_FRAMES)) {
      msnap_tattr_t a = *msnap__tattr(s, e);
      a.keys |= MSNAP_K_FRAMES;
      int rc = msnap__snap_trace_set_attr(s, e, &a);
      if (rc < 0 && !im->err) im->err = rc;
    }
  }
}

int msnap__snap_import_stacks(msnap_snap_t *s, msnap_import_t *shared,
                              bool raw_traces) {
  import_t own, *im = shared;
  if (im == NULL) {
    msnap__import_init(&own, s);
    im = &own;
  }
  for (uint32_t i = 0; i < s->nsegments; i++)
    import_field(im, &s->segments[i].frames, false);
  for (uint32_t i = 0; i < s->nblocks; i++)
    import_field(im, &s->blocks[i].frames, false);
  for (uint32_t i = 0; i < s->nhost_segments; i++)
    import_field(im, &s->host_segments[i].frames, false);
  for (uint32_t i = 0; i < s->nhost_blocks; i++)
    import_field(im, &s->host_blocks[i].frames, false);
  if (raw_traces) {
    for (uint32_t d = 0; d < s->ndevices; d++)
      import_traces(im, &s->device_traces[d]);
    import_traces(im, &s->host_traces);
  }
  if (im == &own) return msnap__import_done(&own);
  return im->err;
}

/* ---- _allocation_traceback ------------------------------------------------ */

int msnap_allocation_traceback(msnap_allocator_t *a, uint64_t ptr, char **out,
                               size_t *len) {
  if (a == NULL || out == NULL || len == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "allocation_traceback: NULL argument");
  int device = -1;
  uint64_t req = 0, stream = 0;
  msnap_mempool_id_t pool = {0, 0};
  uint32_t stack = 0;
  if (msnap__allocation_info(a, ptr, &device, &req, &stream, &pool, &stack) !=
      0)
    return msnap__set_error(MSNAP_EBADPTR,
                            "allocation_traceback: no live allocation found "
                            "at pointer 0x%" PRIx64, ptr);
  if (stack == 0) {
    *out = NULL;
    *len = 0;
    return 0;
  }
  msnap_snap_t *s = msnap__snap_new();
  if (s == NULL) {
    msnap__stack_unref(stack);
    return MSNAP_ENOMEM;
  }
  import_t im;
  msnap__import_init(&im, s);
  msnap_stack_t st = import_one(&im, stack);
  msnap__stack_unref(stack);
  int err = msnap__import_done(&im);
  msnap_membuf_t b = {0};
  msnap_sink_t sink;
  msnap_pw_t w;
  if (!err) err = msnap__sink_init_mem(&sink, &b);
  if (!err && (err = msnap__pw_init(&w, &sink)) != 0) {
    msnap__pw_abort(&w);
    (void)msnap__sink_finish(&sink);
  } else if (!err) {
    msnap__pw_op(&w, MSNAP_OP_EMPTY_LIST);
    msnap__pw_op(&w, MSNAP_OP_MARK);
    if (st > MSNAP_STACK_EMPTY) {
      msnap_stack_iter_t it;
      msnap__stack_iter(s, st, &it);
      uint32_t fid;
      while (msnap__stack_next(&it, &fid)) {
        const msnap_frame_t *f = &s->frames[fid];
        size_t nl, fl;
        const char *name = msnap__snap_str(s, f->name, &nl);
        const char *file = msnap__snap_str(s, f->filename, &fl);
        msnap__pw_op(&w, MSNAP_OP_EMPTY_DICT);
        msnap__pw_op(&w, MSNAP_OP_MARK);
        msnap__pw_str(&w, "filename", 8);
        msnap__pw_str(&w, file, fl);
        msnap__pw_str(&w, "line", 4);
        msnap__pw_int(&w, f->line);
        msnap__pw_str(&w, "name", 4);
        msnap__pw_str(&w, name, nl);
        msnap__pw_op(&w, MSNAP_OP_SETITEMS);
      }
    }
    msnap__pw_op(&w, MSNAP_OP_APPENDS);
    int prc = msnap__pw_finish(&w); /* STOP */
    int src = msnap__sink_finish(&sink);
    err = prc ? prc : src;
  }
  msnap__snap_free(s);
  if (err) {
    free(b.data);
    return err;
  }
  *out = b.data;
  *len = b.len;
  return 0;
}
