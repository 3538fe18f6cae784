/*
 * snapshot.c (api layer) -- live snapshots (torch.cuda.memory._snapshot) of a
 * msnap_allocator_t and their serialization (_dump_snapshot, to memory or
 * to an atomic file of base/sink.c).  The recorded stacks become model
 * frames in traceback.c.
 *
 * Sequence of msnap__snapshot_take, per device in order:
 *   1. under the device lock: copy the trace ring (unless include_traces
 *      is false; references are taken on every id so that nothing dies
 *      meanwhile), collect the segments (alloc.c), then record the
 *      `snapshot` entry -- after the copy, so it shows in the next
 *      snapshot only, as in PyTorch;
 *   2. with no lock: collect the device's workspace buffers and keep the
 *      device's segments sorted by address.
 * Then, with no lock held: recalibrate the clock, convert the copied
 * entries (time_us non-decreasing per device, synthetic workspace entries
 * first), copy the external annotations, resolve every captured stack into
 * model frames (C symbols and interpreter frames once per unique frame)
 * and build allocator_settings.  Serialization happens afterwards, on the
 * model, never under a device lock.
 *
 * allocator_settings holds no integer above 2^53 - 1 (JavaScript's
 * Number.MAX_SAFE_INTEGER): pytorch.org/memory_viz reads every pickle int
 * into a double, so a larger value would be shown rounded (2^63 - 1, the
 * default ring capacity of _record_memory_history(max_entries=
 * sys.maxsize), reads as 9223372036854775808).  Hence:
 *   - limits (trace_alloc_max_entries, max_split_size,
 *     max_round_threshold, max_cached_size) above it are written as -1,
 *     meaning "unlimited": no ring or threshold that large can ever be
 *     reached.  trace_alloc_max_entries is the ring capacity per device
 *     (entries) when it is at most 2^53 - 1, -1 when it is larger, 0 when
 *     history was never recorded; max_split_size was already -1 when
 *     unset, as in PyTorch;
 *   - counts and byte totals (trace_alloc_dropped, workspace_*) saturate
 *     at 2^53 - 1 (unreachable in practice).
 * Segment and block addresses are device addresses (below 2^49 on CUDA
 * and Ascend, and on the sim) and times are microseconds since the epoch
 * (about 2^51): both stay exact.
 *
 * Workspace buffers (torch_npu's NPUWorkspaceAllocator) are shown as
 * MEMSNAP_WORKSPACE_VIEW selects; "torch_npu" is the npu profile's
 * default, "memsnap" the cuda profile's:
 *   torch_npu  as Module.cpp's _snapshot merges NPUWorkspaceAllocator::
 *              snapshot(): one one-block large segment per buffer,
 *              appended after every device's segments (device order,
 *              buffers in creation order, not sorted by address), its
 *              block inactive with requested_size 0 (torch_npu never sets
 *              WorkspaceBlock::allocated); while history is recording,
 *              three entries per buffer first in the device's trace
 *              (workspace_snapshot, segment_alloc, alloc, each sized to the
 *              buffer: get_trace).
 *   memsnap    each buffer a segment among the device's sorted segments,
 *              active_allocated (requested size) while allocated; the
 *              synthetic entries whenever traces are included, alloc only
 *              for buffers in use, sized to the request.
 * Either way the entries carry the earliest buffer creation time and
 * allocator_settings the workspace_* totals.
 *
 * Filters: o->device >= 0 keeps that device's segments and trace (the
 * other devices' trace lists are present and empty, so indices stay
 * device ordinals); a private pool id keeps that pool's segments and the
 * trace entries whose pool is that pool (so that the State History replay
 * stays consistent), and leaves out the workspace.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/host.h"
#include "api/api.h"
#include "base/map16.h"
#include "record/stack.h"

/* ---- allocator_settings ------------------------------------------------------ */

typedef struct gvb_s {
  msnap_gv_t *items;
  uint32_t n, cap;
  int err;
} gvb_t;

static void gvb_push(gvb_t *b, msnap_gv_t v) {
  if (b->err) {
    msnap__gv_free(&v);
    return;
  }
  if (MSNAP_GROW(b->items, b->cap, b->n + 1) != 0) {
    b->err = MSNAP_ENOMEM;
    msnap__gv_free(&v);
    return;
  }
  b->items[b->n++] = v;
}

static msnap_gv_t gv_str(msnap_snap_t *s, const char *p) {
  msnap_gv_t v = {.kind = MSNAP_GV_STR};
  v.u.s = msnap__snap_intern(s, p, strlen(p));
  return v;
}
static msnap_gv_t gv_int(int64_t i) {
  msnap_gv_t v = {.kind = MSNAP_GV_INT};
  v.u.i = i;
  return v;
}
static msnap_gv_t gv_bool(bool b) {
  msnap_gv_t v = {.kind = MSNAP_GV_BOOL};
  v.u.b = b;
  return v;
}
static msnap_gv_t gv_float(double f) {
  msnap_gv_t v = {.kind = MSNAP_GV_FLOAT};
  v.u.f = f;
  return v;
}
static msnap_gv_t gv_seq(msnap_gv_kind_t kind, gvb_t *b) {
  msnap_gv_t v = {.kind = kind};
  v.u.seq.items = b->items;
  v.u.seq.n = b->n;
  return v;
}

static void gv_put(msnap_snap_t *s, gvb_t *b, const char *key, msnap_gv_t v) {
  gvb_push(b, gv_str(s, key));
  gvb_push(b, v);
}

static int64_t clamp_i64(uint64_t v) {
  return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

/* The largest integer a JavaScript viewer reads exactly (2^53 - 1). */
#define JS_MAX_SAFE ((1ull << 53) - 1)

/* A count or byte total, saturated at JS_MAX_SAFE. */
static int64_t js_count(uint64_t v) {
  return v > JS_MAX_SAFE ? (int64_t)JS_MAX_SAFE : (int64_t)v;
}

/* A limit: -1 ("unlimited") above JS_MAX_SAFE. */
static int64_t js_limit(uint64_t v) {
  return v > JS_MAX_SAFE ? -1 : (int64_t)v;
}

typedef struct take_totals_s {
  uint64_t *dropped; /* per device */
  uint64_t max_entries; /* 0: history never recorded */
  uint64_t ws_reserved, ws_allocated;
  gvb_t ws_segments; /* list of ints */
} take_totals_t;

/*
 * A consistent copy of the allocator's conf.  msnap_set_allocator_settings
 * re-parses the conf in place (and frees and replaces conf.raw) under
 * every device lock, so the fields and the string are copied under device
 * 0's lock: all of them come from one applied conf.  *raw receives a
 * malloc'ed copy of the string (the caller frees it); c->raw is left NULL.
 * Called with no lock held.  Returns 0 or MSNAP_ENOMEM.
 */
static int conf_copy(msnap_allocator_t *a, msnap_conf_t *c, char **raw) {
  *raw = NULL;
  if (msnap_device_count(a) <= 0) return MSNAP_EINVAL;
  msnap__device_lock(a, 0);
  *c = *msnap__allocator_conf(a);
  const char *r = c->raw ? c->raw : "";
  *raw = strdup(r);
  msnap__device_unlock(a, 0);
  c->raw = NULL;
  return *raw == NULL ? MSNAP_ENOMEM : 0;
}

/* Every cuda-reference §2.7 key, the NPU conf string, and the recorder's
 * ring facts.  Called with no lock held (takes device 0's lock briefly). */
static int build_settings(msnap_allocator_t *a, msnap_snap_t *s,
                          take_totals_t *t, int ndev) {
  msnap_conf_t conf;
  char *raw_copy = NULL;
  int crc = conf_copy(a, &conf, &raw_copy);
  if (crc == MSNAP_ENOMEM) return crc;
  const msnap_conf_t *c = crc == 0 ? &conf : NULL;
  gvb_t b = {0};
  const char *raw = raw_copy ? raw_copy : "";
  gv_put(s, &b, "PYTORCH_CUDA_ALLOC_CONF", gv_str(s, raw));
  if (msnap_profile(a) == MSNAP_PROFILE_NPU)
    gv_put(s, &b, "PYTORCH_NPU_ALLOC_CONF", gv_str(s, raw));
  uint64_t mss = c ? c->max_split_size : UINT64_MAX;
  gv_put(s, &b, "max_split_size", gv_int(js_limit(mss)));
  gv_put(s, &b, "garbage_collection_threshold",
         gv_float(c ? c->garbage_collection_threshold : 0.0));
  gv_put(s, &b, "expandable_segments",
         gv_bool(c ? c->expandable_segments : false));
  gv_put(s, &b, "pinned_num_register_threads",
         gv_int(c ? js_count(c->pinned_num_register_threads) : 1));
  gv_put(s, &b, "release_lock_on_cudamalloc",
         gv_bool(c ? c->release_lock_on_malloc : false));
  gv_put(s, &b, "pinned_use_cuda_host_register",
         gv_bool(c ? c->pinned_use_host_register : false));
  gv_put(s, &b, "graph_capture_record_stream_reuse",
         gv_bool(c ? c->graph_capture_record_stream_reuse : false));
  /* The pinned host allocator's thresholds (bytes): SIZE_MAX by default
   * as in PyTorch, written as -1 (above 2^53 - 1: see the file comment).
   * alloc/host.c honours both. */
  gv_put(s, &b, "max_round_threshold",
         gv_int(js_limit(c ? c->pinned_max_round_threshold : UINT64_MAX)));
  gv_put(s, &b, "max_cached_size",
         gv_int(js_limit(c ? c->pinned_max_cached_size : UINT64_MAX)));
  gvb_t rd = {0};
  for (int i = 0; i < MSNAP_ROUNDUP_INTERVALS; i++) {
    char key[16];
    snprintf(key, sizeof key, "%u", 1u << i);
    gvb_push(&rd, gv_str(s, key));
    gvb_push(&rd, gv_int(c ? js_count(c->roundup_power2_divisions[i]) : 0));
  }
  if (rd.err) b.err = rd.err;
  gv_put(s, &b, "roundup_power2_divisions", gv_seq(MSNAP_GV_DICT, &rd));
  /* memsnap additions: ring capacity and overflow (closed PR #179276).
   * The capacity is -1 when above 2^53 - 1 (see the file comment). */
  gv_put(s, &b, "trace_alloc_max_entries",
         gv_int(js_limit(t->max_entries)));
  bool over = false;
  gvb_t dl = {0};
  for (int d = 0; d < ndev; d++) {
    over |= t->dropped[d] > 0;
    gvb_push(&dl, gv_int(js_count(t->dropped[d])));
  }
  if (dl.err) b.err = dl.err;
  gv_put(s, &b, "trace_alloc_overflowed", gv_bool(over));
  gv_put(s, &b, "trace_alloc_dropped", gv_seq(MSNAP_GV_LIST, &dl));
  /* the actions _record_memory_history(skip_actions=...) leaves out: a
   * reader can tell an alloc history with holes from an inconsistent one */
  gvb_t sk = {0};
  uint32_t skip = msnap__history_skip(a);
  for (int k = 0; k < MSNAP_ACTION_COUNT; k++)
    if (skip & (1u << k)) gvb_push(&sk, gv_str(s, msnap_action_name(k)));
  if (sk.err) b.err = sk.err;
  gv_put(s, &b, "trace_skip_actions", gv_seq(MSNAP_GV_LIST, &sk));
  /* Workspace (not in memory_stats): lets a reader reconcile. */
  gv_put(s, &b, "workspace_reserved_bytes", gv_int(js_count(t->ws_reserved)));
  gv_put(s, &b, "workspace_allocated_bytes",
         gv_int(js_count(t->ws_allocated)));
  gv_put(s, &b, "workspace_segments", gv_seq(MSNAP_GV_LIST, &t->ws_segments));
  memset(&t->ws_segments, 0, sizeof t->ws_segments);
  s->allocator_settings = gv_seq(MSNAP_GV_DICT, &b);
  free(raw_copy);
  return b.err;
}

/* ---- taking the snapshot ----------------------------------------------------- */

/*
 * process_info (memsnap's own top-level key; memory_viz ignores it): the
 * process's identity (api/process.c), the allocator's runtime and
 * profile, and the total memory of each device of the snapshot (the
 * runtime's mem_get_info) with the per-process cap on it when a memory
 * fraction is set (allowed_bytes), so that `memsnap summary` can say how
 * much of the device an OOM left to the process and `memsnap fleet` can
 * name ranks.
 */
static int build_process_info(msnap_allocator_t *a, msnap_snap_t *s, int d0,
                              int d1) {
  msnap_process_t p;
  msnap__process_get(&p);
  gvb_t b = {0};
  gv_put(s, &b, "pid", gv_int(p.pid));
  if (p.host[0]) gv_put(s, &b, "host", gv_str(s, p.host));
  if (p.rank >= 0) gv_put(s, &b, "rank", gv_int(p.rank));
  if (p.world_size >= 1) gv_put(s, &b, "world_size", gv_int(p.world_size));
  if (p.local_rank >= 0) gv_put(s, &b, "local_rank", gv_int(p.local_rank));
  const msnap_runtime_ops_t *rt = msnap_runtime(a);
  gv_put(s, &b, "runtime", gv_str(s, rt && rt->name ? rt->name : "?"));
  gv_put(s, &b, "profile",
         gv_str(s, msnap_profile(a) == MSNAP_PROFILE_CUDA ? "cuda" : "npu"));
  gvb_t dl = {0};
  for (int d = d0; d < d1; d++) {
    size_t fb = 0, tb = 0;
    if (msnap_mem_get_info(a, d, &fb, &tb) != 0) continue;
    gvb_t one = {0};
    gv_put(s, &one, "device", gv_int(d));
    gv_put(s, &one, "total_bytes", gv_int(clamp_i64(tb)));
    /* the cap set_per_process_memory_fraction (or the conf's
     * per_process_memory_fraction) puts on the device's reserved bytes
     * (allowed_memory_maximum = fraction x total), now and at the newest
     * recorded OOM */
    msnap_cap_info_t ci;
    if (msnap__cap_info(a, d, &ci) == 0) {
      if (ci.capped)
        gv_put(s, &one, "allowed_bytes", gv_int(clamp_i64(ci.allowed)));
      if (ci.have_oom) {
        gv_put(s, &one, "last_oom_time_us",
               gv_int(msnap__clock_to_us(ci.oom_raw_time)));
        if (ci.oom_capped)
          gv_put(s, &one, "last_oom_allowed_bytes",
                 gv_int(clamp_i64(ci.oom_allowed)));
      }
    }
    if (one.err) b.err = one.err;
    gvb_push(&dl, gv_seq(MSNAP_GV_DICT, &one));
  }
  if (dl.err) b.err = dl.err;
  gv_put(s, &b, "devices", gv_seq(MSNAP_GV_LIST, &dl));
  gv_put(s, &b, "memsnap_version", gv_str(s, MSNAP_VERSION_STRING));
  msnap__gv_free(&s->process_info);
  s->process_info = gv_seq(MSNAP_GV_DICT, &b);
  return b.err;
}

static int seg_cmp(const void *x, const void *y) {
  const msnap_ssegment_t *a = x, *b = y;
  return a->address < b->address ? -1 : a->address > b->address;
}

static bool pool_is_default(msnap_mempool_id_t p) {
  return p.first == 0 && p.second == 0;
}

typedef struct dev_copy_s {
  msnap_hcopy_t c; /* the ring copy: packed entries + their contexts */
  msnap_ws_info_t *ws;
  size_t nws;
} dev_copy_t;

/* Intern a recorder string into the model (cached by recorder id). */
static msnap_str_t model_str(msnap_snap_t *s, msnap_map16_t *cache, uint32_t id,
                             msnap_str_t dflt, int *err) {
  if (id == 0) return dflt;
  bool fresh;
  uint32_t *slot = msnap__map16_slot(cache, id, 1, &fresh);
  if (slot == NULL) {
    *err = MSNAP_ENOMEM;
    return dflt;
  }
  if (fresh) {
    size_t len;
    const char *p = msnap__str_get(id, &len);
    *slot = msnap__snap_intern(s, p, len);
    if (*slot == 0) {
      *err = MSNAP_ENOMEM;
      *slot = dflt;
    }
  }
  return *slot;
}

static msnap_strace_t *add_trace(msnap_snap_t *s, msnap_trace_list_t *l,
                                 int *err) {
  msnap_strace_t *t = msnap__snap_add_trace(s, l);
  if (t == NULL) *err = MSNAP_ENOMEM;
  return t;
}

enum {
  TRACE_KEYS = MSNAP_K_STREAM | MSNAP_K_TIME | MSNAP_K_COMPILE_CTX |
               MSNAP_K_USER_META | MSNAP_K_POOL_ID,
  SEG_KEYS = MSNAP_K_REQUESTED | MSNAP_K_FRAMES | MSNAP_K_POOL_ID |
             MSNAP_K_EXPANDABLE | MSNAP_K_STREAM | MSNAP_K_SEGMENT_TYPE,
  BLOCK_KEYS = MSNAP_K_ADDRESS | MSNAP_K_REQUESTED | MSNAP_K_FRAMES
};

/* Append the workspace buffers of one device as segments (torch_npu
 * view: never allocated, requested 0). */
static int add_ws_segments(msnap_snap_t *s, int device,
                           const msnap_ws_info_t *w, size_t n,
                           take_totals_t *t, bool npu_view) {
  for (size_t i = 0; i < n; i++) {
    bool used = w[i].allocated && !npu_view;
    msnap_sblock_t *b = msnap__snap_add_block(s);
    if (b == NULL) return MSNAP_ENOMEM;
    uint32_t bi = s->nblocks - 1;
    b->address = w[i].ptr;
    b->size = w[i].size;
    b->requested_size = used ? w[i].requested : 0;
    b->frames = 0; /* raw id: none (import makes it []) */
    b->keys = BLOCK_KEYS;
    b->state = used ? MSNAP_BLOCK_ACTIVE_ALLOCATED : MSNAP_BLOCK_INACTIVE;
    msnap_ssegment_t *g = msnap__snap_add_segment(s);
    if (g == NULL) return MSNAP_ENOMEM;
    g->device = device;
    g->address = w[i].ptr;
    g->total_size = w[i].size;
    g->allocated_size = used ? w[i].size : 0;
    g->active_size = g->allocated_size;
    g->requested_size = used ? w[i].requested : 0;
    g->stream = (int64_t)w[i].stream;
    g->pool_id = (msnap_mempool_id_t){0, 0};
    g->frames = 0;
    g->first_block = bi;
    g->nblocks = 1;
    g->keys = SEG_KEYS;
    g->is_large = 1;
    g->is_expandable = 0;
    t->ws_reserved += w[i].size;
    if (w[i].allocated) t->ws_allocated += w[i].size;
    gvb_push(&t->ws_segments, gv_int(clamp_i64(w[i].ptr)));
  }
  return t->ws_segments.err;
}

/* What one entry context of a ring copy becomes in the model, computed
 * once per context (a recording has a handful), not per entry: its
 * model stack and the attribute sets (msnap_tattr_t) of its entries --
 * one per (oom entry, mallocWithAddress) pair, interned on first use. */
#define ATTR_UNSET UINT32_MAX
typedef struct ctx_model_s {
  msnap_stack_t frames;
  msnap_tattr_t base; /* keys without ADDRESS / DEVICE_FREE / INTERNAL_META */
  uint32_t attr[2][2]; /* [oom][internal_meta]: ATTR_UNSET until used */
  uint8_t keep;        /* passes the pool filter */
} ctx_model_t;

static uint32_t ctx_attr(msnap_snap_t *s, ctx_model_t *m, bool oom,
                         bool imeta, msnap_str_t *malloc_with_addr) {
  uint32_t *slot = &m->attr[oom][imeta];
  if (*slot != ATTR_UNSET) return *slot;
  msnap_tattr_t a = m->base;
  a.keys |= oom ? MSNAP_K_DEVICE_FREE : MSNAP_K_ADDRESS;
  if (imeta) {
    if (*malloc_with_addr == 0)
      *malloc_with_addr = msnap__snap_intern(s, "mallocWithAddress", 17);
    if (*malloc_with_addr == 0) return UINT32_MAX;
    a.internal_metadata = *malloc_with_addr;
    a.keys |= MSNAP_K_INTERNAL_META;
  }
  return *slot = msnap__snap_tattr(s, &a); /* UINT32_MAX on error */
}

/* Convert one device's copied entries (synthetic workspace entries first)
 * into model trace entries, stacks imported through im. */
static int build_device_trace(msnap_snap_t *s, msnap_trace_list_t *l,
                              dev_copy_t *dc, msnap_mempool_id_t pool,
                              msnap_map16_t *strs, msnap_str_t na,
                              msnap_import_t *im, bool ws_entries,
                              bool npu_view) {
  int err = 0;
  int64_t prev = INT64_MIN;
  const msnap_hcopy_t *c = &dc->c;
  uint64_t nsyn_total = 0;
  for (size_t i = 0; ws_entries && i < dc->nws; i++)
    nsyn_total += dc->ws[i].allocated || npu_view ? 3 : 2;
  if (msnap__snap_reserve_traces(s, l, nsyn_total + c->n) != 0)
    return MSNAP_ENOMEM;
  /* Synthetic workspace entries are stamped with the earliest of the
   * buffers' creation times and the first recorded entry, so that times
   * stay non-decreasing. */
  if (dc->nws > 0 && ws_entries) {
    uint64_t t0 = dc->ws[0].raw_created;
    for (size_t i = 1; i < dc->nws; i++)
      if (dc->ws[i].raw_created < t0) t0 = dc->ws[i].raw_created;
    if (c->n > 0 && c->slots[0].raw_time < t0) t0 = c->slots[0].raw_time;
    int64_t tus = msnap__clock_to_us(t0);
    for (size_t i = 0; i < dc->nws && !err; i++) {
      const msnap_ws_info_t *w = &dc->ws[i];
      int nsyn = w->allocated || npu_view ? 3 : 2;
      static const uint8_t acts[3] = {MSNAP_ACTION_WORKSPACE_SNAPSHOT,
                                      MSNAP_ACTION_SEGMENT_ALLOC,
                                      MSNAP_ACTION_ALLOC};
      msnap_tattr_t a;
      memset(&a, 0, sizeof a);
      a.stream = (int64_t)w->stream;
      a.compile_context = na;
      a.user_metadata = MSNAP_STR_EMPTY;
      a.keys = TRACE_KEYS | MSNAP_K_ADDRESS;
      for (int k = 0; k < nsyn; k++) {
        msnap_strace_t *t = add_trace(s, l, &err);
        if (t == NULL) break;
        t->action = acts[k];
        t->addr = w->ptr;
        t->size = acts[k] == MSNAP_ACTION_ALLOC && !npu_view ? w->requested
                                                              : w->size;
        t->time_us = tus;
        t->frames = MSNAP_STACK_ABSENT;
        int rc = msnap__snap_trace_set_attr(s, t, &a);
        if (rc < 0) err = rc;
      }
    }
    prev = tus;
  }
  if (c->n == 0 || err) return err;
  ctx_model_t *cm = calloc(c->nctx, sizeof *cm);
  if (cm == NULL) return MSNAP_ENOMEM;
  for (uint32_t k = 0; k < c->nctx; k++) {
    const msnap_hcopy_ctx_t *x = &c->ctx[k];
    ctx_model_t *m = &cm[k];
    m->keep = pool_is_default(pool) || (x->pool.first == pool.first &&
                                        x->pool.second == pool.second);
    if (!m->keep) continue;
    memset(m->attr, 0xff, sizeof m->attr);
    m->frames = msnap__import_stack(im, x->stack);
    m->base.stream = (int64_t)x->stream;
    m->base.pool_id = x->pool;
    m->base.compile_context =
        model_str(s, strs, x->compile_context, na, &err);
    m->base.user_metadata =
        model_str(s, strs, x->user_metadata, MSNAP_STR_EMPTY, &err);
    m->base.keys = (uint16_t)(TRACE_KEYS | (m->frames != MSNAP_STACK_ABSENT
                                                ? MSNAP_K_FRAMES
                                                : 0));
  }
  msnap_str_t malloc_with_addr = 0;
  msnap_clock_map_t clk; /* one clock lock for the whole trace */
  msnap__clock_map(&clk);
  for (uint64_t i = 0; i < c->n && !err; i++) {
    msnap_hentry_t e;
    msnap__hcopy_get(c, i, &e);
    ctx_model_t *m = &cm[c->slots[i].ctx];
    if (!m->keep) continue;
    uint32_t attr = ctx_attr(s, m, e.action == MSNAP_ACTION_OOM,
                             e.internal_meta == 1, &malloc_with_addr);
    if (attr == UINT32_MAX) {
      err = s->ntattrs >= MSNAP_TATTR_MAX ? MSNAP_ELIMIT : MSNAP_ENOMEM;
      break;
    }
    int64_t tus = msnap__clock_map_us(&clk, e.raw_time);
    if (tus < prev) tus = prev;
    prev = tus;
    /* room was reserved above: append in place, every field written */
    l->v[l->n++] = (msnap_strace_t){.addr = e.addr,
                                    .size = e.size,
                                    .time_us = tus,
                                    .frames = m->frames,
                                    .action = e.action,
                                    .attr = attr};
  }
  free(cm);
  if (!err && im->err) err = im->err;
  return err;
}

int msnap__snapshot_take(msnap_allocator_t *a,
                         const msnap_snapshot_options_t *o,
                         msnap_snap_t **out) {
  msnap_snapshot_options_t dflt;
  if (a == NULL || out == NULL)
    return msnap__set_error(MSNAP_EINVAL, "snapshot: NULL argument");
  if (o == NULL) {
    msnap_snapshot_options_init(&dflt);
    o = &dflt;
  }
  int ndev = msnap_device_count(a);
  if (ndev < 0) ndev = 0;
  if (o->device < -1 || o->device >= ndev)
    return msnap__set_error(MSNAP_EINVAL,
                            "snapshot: device %d out of range (%d devices)",
                            o->device, ndev);
  bool traces = o->include_traces && !o->segments_only;
  msnap_mempool_id_t pool = o->mempool;
  int d0 = o->device < 0 ? 0 : o->device;
  int d1 = o->device < 0 ? ndev : o->device + 1;

  msnap_snap_t *s = msnap__snap_new();
  if (s == NULL) return MSNAP_ENOMEM;
  dev_copy_t *dc = calloc((size_t)ndev + 1, sizeof *dc);
  take_totals_t tt;
  memset(&tt, 0, sizeof tt);
  tt.dropped = calloc((size_t)ndev + 1, sizeof *tt.dropped);
  int err = (dc == NULL || tt.dropped == NULL) ? MSNAP_ENOMEM : 0;
  if (!err && traces) err = msnap__snap_set_devices(s, (uint32_t)ndev);

  /* The snapshot entry carries this thread's metadata, no stack. */
  msnap_rctx_t sctx;
  memset(&sctx, 0, sizeof sctx);
  msnap__tls_context(&sctx.user_metadata, &sctx.compile_context);

  static const char *const views[] = {"torch_npu", "memsnap", NULL};
  bool npu_view = msnap__env_choice(MSNAP_ENV_WORKSPACE_VIEW, views,
                                    msnap_profile(a) == MSNAP_PROFILE_NPU
                                        ? 0
                                        : 1) == 0;
  /* torch_npu: the synthetic entries only while recording (get_trace). */
  bool ws_entries = traces && (!npu_view || msnap_history_enabled(a));
  for (int d = d0; d < d1 && !err; d++) {
    uint32_t seg_start = s->nsegments;
    uint64_t active = 0, cap = 0;
    msnap__device_lock(a, d);
    if (traces)
      err = msnap__history_copy_locked(a, d, &dc[d].c, &tt.dropped[d], &cap);
    if (!err)
      err = msnap__device_collect_segments_locked(a, d, pool, s, &active);
    if (!err)
      msnap__history_record_locked(a, d, MSNAP_ACTION_SNAPSHOT, 0, active, 0,
                                   pool, &sctx, 0);
    msnap__device_unlock(a, d);
    if (err) break;
    if (pool_is_default(pool)) {
      err = msnap__ws_collect(a, d, &dc[d].ws, &dc[d].nws);
      if (!err && !npu_view)
        err = add_ws_segments(s, d, dc[d].ws, dc[d].nws, &tt, false);
    }
    if (!err && s->nsegments > seg_start)
      qsort(s->segments + seg_start, s->nsegments - seg_start,
            sizeof s->segments[0], seg_cmp);
  }
  /* torch_npu: every device's workspace segments after all the others. */
  for (int d = d0; d < d1 && !err && npu_view; d++)
    err = add_ws_segments(s, d, dc[d].ws, dc[d].nws, &tt, true);
  msnap__rctx_release(&sctx);
  /* Pinned host memory (cuda-reference §2.8): every host block as a
   * one-block segment and the flat host ring, only while host history is
   * on (both stay [] otherwise), copied together under the host lock. */
  dev_copy_t hc;
  memset(&hc, 0, sizeof hc);
  if (!err && !o->segments_only && msnap__host_history_active(a) &&
      msnap__host_lock(a) == 0) {
    uint64_t hdropped = 0;
    if (traces) err = msnap__host_ring_copy_locked(a, &hc.c, &hdropped);
    if (!err) err = msnap__host_collect_locked(a, s);
    msnap__host_unlock(a);
  }
  tt.max_entries = msnap__history_max_entries(a);

  /* Outside every lock: times, strings, stacks. */
  msnap__clock_calibrate();
  msnap_map16_t strs = {0};
  msnap_import_t im;
  msnap__import_init(&im, s);
  msnap_str_t na = msnap__snap_intern(s, "N/A", 3);
  if (na == 0 && !err) err = MSNAP_ENOMEM;
  for (int d = d0; d < d1 && !err && traces; d++)
    err = build_device_trace(s, &s->device_traces[d], &dc[d], pool, &strs, na,
                             &im, ws_entries, npu_view);
  if (!err && hc.c.n > 0)
    err = build_device_trace(s, &s->host_traces, &hc,
                             (msnap_mempool_id_t){0, 0}, &strs, na, &im,
                             false, false);
  msnap__hcopy_release(&hc.c);
  if (!err && traces) {
    msnap_aentry_t *av = NULL;
    size_t an = 0;
    err = msnap__annotations_copy(a, &av, &an);
    for (size_t i = 0; i < an; i++) {
      if (!err) {
        msnap_sannotation_t *x = msnap__snap_add_annotation(s);
        if (x == NULL) {
          err = MSNAP_ENOMEM;
        } else {
          x->name = model_str(s, &strs, av[i].name, MSNAP_STR_EMPTY, &err);
          x->device = av[i].device;
          x->time_us = msnap__clock_to_us(av[i].raw_time);
          x->is_start = av[i].is_start;
        }
      }
      msnap__stack_unref(av[i].name);
    }
    free(av);
  }
  msnap__map16_free(&strs);
  for (int d = 0; dc != NULL && d < ndev; d++) {
    msnap__hcopy_release(&dc[d].c);
    free(dc[d].ws);
  }
  free(dc);
  /* Always import, even after an error: it drops the references segments
   * and blocks hold (trace entries got model stacks above). */
  (void)msnap__snap_import_stacks(s, &im, false);
  int irc = msnap__import_done(&im);
  if (!err) err = irc;
  if (!err) {
    /* build_settings copies the conf under device 0's lock (conf_copy). */
    err = build_settings(a, s, &tt, ndev);
  }
  if (!err && !o->segments_only) err = build_process_info(a, s, d0, d1);
  free(tt.ws_segments.items);
  free(tt.dropped);
  if (err) {
    msnap__snap_free(s);
    return err;
  }
  if (o->segments_only) {
    s->generation = MSNAP_GEN_SEGMENT_LIST;
    s->top_keys = MSNAP_TOP_SEGMENTS;
  } else {
    s->generation = MSNAP_GEN_CURRENT;
    s->top_keys = MSNAP_TOP_SEGMENTS | MSNAP_TOP_DEVICE_TRACES |
                  MSNAP_TOP_ALLOCATOR_SETTINGS |
                  MSNAP_TOP_EXTERNAL_ANNOTATIONS | MSNAP_TOP_HOST_SEGMENTS |
                  MSNAP_TOP_HOST_TRACES | MSNAP_TOP_PROCESS_INFO;
  }
  *out = s;
  return 0;
}

void msnap_snapshot_options_init(msnap_snapshot_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_SNAPSHOT_OPTIONS_VERSION;
  o->device = -1;
  o->include_traces = true;
}

static int check_snapshot_options(const msnap_snapshot_options_t *o) {
  if (o != NULL && (o->size < sizeof *o ||
                    o->version != MSNAP_SNAPSHOT_OPTIONS_VERSION))
    return msnap__set_error(MSNAP_EINVAL,
                            "snapshot options size %u / version %u not "
                            "supported (use msnap_snapshot_options_init)",
                            o->size, o->version);
  return 0;
}

int msnap_snapshot_pickle(msnap_allocator_t *a,
                          const msnap_snapshot_options_t *o, char **out,
                          size_t *len) {
  if (a == NULL || out == NULL || len == NULL)
    return msnap__set_error(MSNAP_EINVAL, "snapshot_pickle: NULL argument");
  int rc = check_snapshot_options(o);
  if (rc != 0) return rc;
  msnap_snap_t *s = NULL;
  rc = msnap__snapshot_take(a, o, &s);
  if (rc != 0) return rc;
  msnap_membuf_t mb = {0};
  msnap_sink_t sink;
  rc = msnap__sink_init_mem(&sink, &mb);
  if (rc == 0) {
    rc = msnap__snap_write_pickle(s, &sink);
    int frc = msnap__sink_finish(&sink);
    if (rc == 0) rc = frc;
  }
  msnap__snap_free(s);
  if (rc != 0) {
    free(mb.data);
    return rc;
  }
  *out = mb.data;
  *len = mb.len;
  return 0;
}

int msnap_dump_snapshot(msnap_allocator_t *a,
                        const msnap_snapshot_options_t *o, const char *path) {
  if (a == NULL || path == NULL)
    return msnap__set_error(MSNAP_EINVAL, "dump_snapshot: NULL argument");
  int rc = check_snapshot_options(o);
  if (rc != 0) return rc;
  msnap_snap_t *s = NULL;
  rc = msnap__snapshot_take(a, o, &s);
  if (rc != 0) return rc;
  msnap_atomic_sink_t out;
  rc = msnap__atomic_sink_open(&out, path);
  if (rc == 0) {
    rc = msnap__snap_write_pickle(s, &out.sink);
    rc = msnap__atomic_sink_close(&out, rc);
  }
  msnap__snap_free(s);
  return rc;
}
