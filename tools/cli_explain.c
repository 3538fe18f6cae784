/*
 * cli_explain.c -- what `memsnap summary` explains beyond the sums of the
 * final state: fragmentation at the peak, and why an allocation ran out of
 * memory.
 *
 * States.  State s of a device trace is the allocator after entries
 * 0..s-1 (s = n: the final state).  The figures of a state come from a
 * snapshot model and cli_frag_model: the file's own segments for the
 * final state (exact), otherwise the allocator of an exact replay
 * (cli_replay_run: PyTorch's decisions at the recorded addresses) visited
 * in that state, used only when the replay matched the recording up to
 * there.  Anything else is reported as unknown with the reason; nothing
 * is estimated.
 *
 * The peak.  The state with the most reserved bytes (segment_alloc/_map
 * minus segment_free/_unmap from the start state that the backward replay
 * rebuilds), ties broken by the most active (requested) bytes, the first
 * of equals.  When that is the final state no replay is needed.
 *
 * The OOM.  The last `oom` entry of the device (PyTorch records it after
 * the cache release and retry failed: `size` is the rounded request,
 * `device_free` what the runtime reported free).  At its state:
 *   reserved / active  from the trace walk (exact);
 *   allocated, inactive_split, largest free block per pool
 *                      from the state's model (above);
 *   fits_in_largest_free_block   the largest inactive block of the
 *                      request's pool (small: <= 1 MiB) >= the request;
 *   available          what the device could still give the process:
 *                      device_free, but with a per-process memory
 *                      fraction at most allowed - reserved (PyTorch's
 *                      alloc_block refuses a segment that takes reserved
 *                      bytes past allowed_memory_maximum, whatever the
 *                      device has free).  The cap counts only when the
 *                      file ties it to this OOM: process_info's
 *                      last_oom_time_us is the entry's time_us (memsnap
 *                      writes it with last_oom_allowed_bytes, the cap in
 *                      force then, absent without one).  A cap the file
 *                      only suggests -- process_info's allowed_bytes (the
 *                      one at the dump) or the recorded conf's
 *                      per_process_memory_fraction (which
 *                      set_per_process_memory_fraction may have replaced)
 *                      -- is reported as unconfirmed and changes nothing;
 *   fits_without_fragmentation   request <= available + reserved -
 *                      active: all the memory the process could use, were
 *                      it one block;
 *   segment_size       what the allocator asks the device for when no
 *                      cached block serves the request: PyTorch's
 *                      get_allocation_size (CUDACachingAllocator.cpp; the
 *                      same in torch_npu's NPUCachingAllocator.cpp): 2 MiB
 *                      up to 1 MiB, kLargeBuffer (20 MiB, or the conf's
 *                      large_segment_size_mb) below 10 MiB, else the
 *                      request rounded up to 2 MiB (npu page_size:1g: to
 *                      1 GiB in the large pool); unknown (0) with
 *                      expandable segments.  A request that fits in the
 *                      device's free memory while its segment does not
 *                      failed on the segment size, not on fragmentation;
 *   fits_with_expandable_segments  false without a replay when the
 *                      request exceeds the device's total memory or all
 *                      the process could use (fits_without_fragmentation
 *                      false): no layout fits it; else a what-if replay with
 *                      expandable_segments:True on a device of reserved +
 *                      available bytes, stopped in the OOM's state, then
 *                      asked for the request (null when the trace is not
 *                      replayable; false when the replay ran out of memory
 *                      earlier, naming the entry);
 *   the stack of the failing allocation (the oom entry's frames) and the
 *   allocations live at that state by site (cli_live_sites_at).
 * The device total comes from process_info (memsnap's files) or is
 * unknown.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "api/api.h"


/* True when no entry from state `state` on changes segments or blocks:
 * that state is the final one. */
static bool state_is_final(const msnap_trace_list_t *tl, uint32_t state) {
  for (uint32_t i = state; i < tl->n; i++)
    if (cli_action_moves(tl->v[i].action))
      return false;
  return true;
}

/* ---- the segment of a request ------------------------------------------- */

/* The recording's conf (PYTORCH_NPU_ALLOC_CONF, else
 * PYTORCH_CUDA_ALLOC_CONF of its allocator_settings) parsed by the
 * allocator's own parser for the recording's profile, quietly: 0, or -1
 * when the parser refuses it.  *npu: the profile.  Destroy c after. */
static int recording_conf(const msnap_snap_t *s, msnap_conf_t *c, bool *npu) {
  *npu = strcmp(cli_recording_profile(s), "npu") == 0;
  const char *conf = cli_gv_str(s, &s->allocator_settings,
                                "PYTORCH_NPU_ALLOC_CONF");
  if (conf == NULL)
    conf = cli_gv_str(s, &s->allocator_settings, "PYTORCH_CUDA_ALLOC_CONF");
  char err[256];
  msnap__conf_init(c, *npu ? MSNAP_PROFILE_NPU : MSNAP_PROFILE_CUDA);
  c->quiet = true;
  return msnap__conf_parse(c, conf ? conf : "", err, sizeof err) == 0 ? 0
                                                                      : -1;
}

/* get_allocation_size of a rounded request under the recording's conf;
 * 0 with expandable segments or a conf the parser refuses. */
static uint64_t segment_size_of(const msnap_snap_t *s, uint64_t size) {
  const msnap_gv_t *e =
      cli_gv_get(s, &s->allocator_settings, "expandable_segments");
  msnap_conf_t c;
  bool npu;
  uint64_t seg = 0;
  if (recording_conf(s, &c, &npu) == 0 && !c.expandable_segments &&
      !(e && e->kind == MSNAP_GV_BOOL && e->u.b)) {
    seg = msnap__allocation_size(&c, size);
    if (npu && c.page_size_1g && size > MSNAP_SMALL_SIZE)
      seg = (seg + MSNAP_EXTRA_LARGE_BUFFER - 1) / MSNAP_EXTRA_LARGE_BUFFER *
            MSNAP_EXTRA_LARGE_BUFFER;
  }
  msnap__conf_destroy(&c);
  return seg;
}

/* The per-process cap at the OOM (see `available` above) into o. */
static void cap_of(const msnap_snap_t *s, int64_t dev, int64_t oom_time,
                   bool have_time, cli_oom_t *o) {
  uint64_t t;
  if (have_time && cli_device_info(s, dev, "last_oom_time_us", &t) &&
      t == (uint64_t)oom_time) {
    o->cap_known = true;
    o->have_allowed =
        cli_device_info(s, dev, "last_oom_allowed_bytes", &o->allowed);
    return;
  }
  if (cli_device_info(s, dev, "allowed_bytes", &o->hint_bytes)) {
    o->hint_source = "process_info";
    o->have_hint_bytes = true;
    return;
  }
  msnap_conf_t c;
  bool npu;
  if (recording_conf(s, &c, &npu) == 0 &&
      c.per_process_memory_fraction < 1.0) {
    o->hint_source = npu ? "PYTORCH_NPU_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
    o->hint_fraction = c.per_process_memory_fraction;
    if (o->have_total) {
      o->have_hint_bytes = true;
      o->hint_bytes =
          (uint64_t)(c.per_process_memory_fraction * (double)o->device_total);
    }
  }
  msnap__conf_destroy(&c);
}

/* What the device could still give a process that holds `reserved`:
 * its free memory, and under a cap no more than allowed - reserved. */
static uint64_t cap_room(uint64_t device_free, bool capped, uint64_t allowed,
                         uint64_t reserved) {
  uint64_t room = allowed > reserved ? allowed - reserved : 0;
  return capped && room < device_free ? room : device_free;
}

/* What o->avail is, in the replay's words. */
static const char *avail_what(const cli_oom_t *o) {
  return o->avail < o->device_free ? "what the memory fraction allowed"
                                   : "free";
}

/* ---- replay visits ------------------------------------------------------- */

typedef struct visit_s {
  uint32_t want[2]; /* states to observe (CLI_NO_PAIR: none)      */
  bool got[2];
  cli_frag_t frag[2];
  int64_t dev;
  bool failed;      /* a snapshot could not be taken (ENOMEM)     */
  /* what-if: ask for `request` bytes in state want[0]            */
  bool ask;
  uint64_t request;
  int64_t stream;
  int ask_rc;
} visit_t;

static bool frag_of_allocator(msnap_allocator_t *a, int dev, cli_frag_t *f) {
  msnap_snapshot_options_t so;
  msnap_snapshot_options_init(&so);
  so.device = dev;
  so.include_traces = false;
  msnap_snap_t *m = NULL;
  if (msnap__snapshot_take(a, &so, &m) != 0 || !m)
    return false;
  cli_frag_model(m, dev, f);
  msnap__snap_free(m);
  return true;
}

static bool visit(void *arg, uint32_t state, msnap_allocator_t *a, int dev) {
  visit_t *v = arg;
  bool more = false;
  for (int k = 0; k < 2; k++) {
    if (v->want[k] == CLI_NO_PAIR || v->got[k])
      continue;
    if (state == v->want[k]) {
      if (v->ask && k == 0) {
        uint64_t p = 0;
        v->ask_rc = msnap_malloc(a, dev, v->request, (uint64_t)v->stream, &p);
        if (v->ask_rc == 0)
          msnap_free(a, p);
      } else if (!frag_of_allocator(a, dev, &v->frag[k])) {
        v->failed = true;
      }
      v->got[k] = true;
    } else if (state < v->want[k]) {
      more = true; /* a state skipped by a segment_free run stays unseen */
    }
  }
  return more && !v->failed;
}

/* ---- the peak --------------------------------------------------------------- */

/* The peak (the first state with the most reserved bytes, ties broken
 * by the most active ones) and the figures of state `want`, in one walk
 * of the timeline (cli_timeline_visit: no arrays). */
typedef struct peak_walk_s {
  uint32_t best, want;
  uint64_t best_act, best_res, want_act, want_res;
} peak_walk_t;

static void peak_visit(void *arg, uint32_t state, uint64_t act,
                       uint64_t res) {
  peak_walk_t *p = arg;
  if (state == 0 || res > p->best_res ||
      (res == p->best_res && act > p->best_act)) {
    p->best = state;
    p->best_act = act;
    p->best_res = res;
  }
  if (state == p->want) {
    p->want_act = act;
    p->want_res = res;
  }
}

/* (torch_npu's synthetic workspace allocs are no history) */
static bool has_allocs(const msnap_trace_list_t *tl) {
  for (uint32_t i = 0; tl && i < tl->n; i++)
    if (tl->v[i].action == MSNAP_ACTION_ALLOC &&
        !cli_workspace_synthetic(tl, i))
      return true;
  return false;
}

void cli_explain_free(cli_explain_t *x) {
  free(x->oom.top);
  memset(x, 0, sizeof *x);
}

int cli_explain_device(const msnap_snap_t *s, const cli_stacks_t *stk,
                       const cli_sites_t *sites, int64_t dev, uint32_t topn,
                       bool whatif, cli_explain_t *x) {
  memset(x, 0, sizeof *x);
  x->device = dev;
  cli_frag_model(s, dev, &x->final);
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  cli_oom_t *o = &x->oom;
  /* the last oom entry */
  for (uint32_t i = 0; tl && i < tl->n; i++)
    if (tl->v[i].action == MSNAP_ACTION_OOM) {
      o->present = true;
      o->entry = i;
      o->count++;
    }
  if (!tl || tl->n == 0 || !has_allocs(tl)) {
    snprintf(x->peak_why, sizeof x->peak_why, "%s",
             s->generation == MSNAP_GEN_SEGMENT_LIST
                 ? "the file is a bare list of segments: no trace"
             : !tl || tl->n == 0
                 ? "the device has no trace (history was not recorded)"
                 : "the trace holds no alloc history");
  }
  int rc = -1;
  peak_walk_t pk = {.want = o->present ? o->entry : UINT32_MAX};
  if (tl && tl->n) {
    cli_timeline_visit(s, dev, peak_visit, &pk);
    x->peak_state = pk.best;
  }
  x->have_peak_state = tl && tl->n && has_allocs(tl);

  if (o->present) {
    const msnap_strace_t *e = &tl->v[o->entry];
    o->device = dev;
    o->requested = e->size;
    o->device_free = e->addr;
    o->stream = msnap__tattr(s, e)->stream;
    o->have_time = (msnap__tattr(s, e)->keys & MSNAP_K_TIME) != 0;
    o->time_us = e->time_us;
    o->small_pool = e->size <= MSNAP_SMALL_SIZE;
    o->have_total = cli_device_info(s, dev, "total_bytes", &o->device_total);
    cap_of(s, dev, e->time_us, o->have_time, o);
    o->stack = e->frames;
    o->site = cli_site(s, e->frames);
    if (o->site.frame == CLI_SITE_NONE)
      o->site.frame = cli_empty_site(s);
    o->state = o->entry; /* the state the oom entry was recorded in */
    o->reserved = pk.want_res;
    o->active_requested = pk.want_act;
    o->expandable = -1;
  }

  /* States to observe: the peak and the OOM's, from the final state when
   * nothing changes after them, else from an exact replay. */
  visit_t v = {.want = {CLI_NO_PAIR, CLI_NO_PAIR}, .dev = dev};
  bool counted = false; /* trace_violations known */
  if (x->have_peak_state) {
    if (state_is_final(tl, x->peak_state)) {
      x->at_peak = x->final;
      x->have_at_peak = true;
      x->peak_source = "final state";
    } else {
      v.want[0] = x->peak_state;
    }
  }
  if (o->present) {
    if (state_is_final(tl, o->state)) {
      o->at = x->final;
      o->have_at = true;
      o->source = "final state";
    } else {
      v.want[1] = o->state;
    }
  }
  if (v.want[0] != CLI_NO_PAIR || v.want[1] != CLI_NO_PAIR) {
    cli_replay_cfg_t cfg = {.profile = NULL, .visit = visit, .arg = &v};
    cli_replay_res_t rr;
    if (cli_replay_run(s, dev, &cfg, &rr) != 0 || v.failed)
      goto out;
    /* the replay's backward walk counted them, unless it stopped
     * before it (expandable segments, private pools) */
    x->trace_violations = rr.violations;
    counted = rr.replayable || rr.violations > 0;
    const char *why = !rr.replayable ? rr.reason
                      : !rr.exact
                          ? "the replay was a what-if (another profile or "
                            "alloc conf than the recording's)"
                      : !rr.matches ? "the replay did not match the recording"
                                    : NULL;
    for (int k = 0; k < 2; k++) {
      if (v.want[k] == CLI_NO_PAIR && !v.got[k])
        continue;
      char *dst = k == 0 ? x->peak_why : o->why;
      size_t len = k == 0 ? sizeof x->peak_why : sizeof o->why;
      if (why || !v.got[k]) {
        snprintf(dst, len, "%s", why ? why : "the replay skipped that state");
        continue;
      }
      if (k == 0) {
        x->at_peak = v.frag[0];
        x->have_at_peak = true;
        x->peak_source = "exact replay";
      } else {
        o->at = v.frag[1];
        o->have_at = true;
        o->source = "exact replay";
      }
    }
  }
  /* No replay counted the trace's violations (none was needed, or it
   * stopped before its backward walk): the backward walk alone. */
  if (tl && tl->n && !counted) {
    long nv = cli_backward(s, dev, NULL, NULL, NULL);
    if (nv < 0)
      goto out;
    x->trace_violations = nv;
  }
  if (o->present) {
    o->segment_size = segment_size_of(s, o->requested);
    uint64_t reserved = o->have_at ? o->at.reserved : o->reserved;
    uint64_t cached = o->have_at ? o->at.reserved - o->at.active
                      : o->reserved > o->active_requested
                          ? o->reserved - o->active_requested
                          : 0;
    o->cached = cached;
    o->avail = cap_room(o->device_free, o->have_allowed, o->allowed,
                        reserved);
    if (o->have_hint_bytes)
      o->hint_fits = o->requested <= cap_room(o->device_free, true,
                                              o->hint_bytes, reserved) +
                                         cached;
    if (o->have_at) {
      uint64_t lf = o->small_pool ? o->at.largest_free_small
                                  : o->at.largest_free_large;
      o->fits_largest = lf >= o->requested;
    }
    /* A request larger than the device, or than all the process could
     * still use (what the device could give it plus its cached free
     * blocks), fits in no layout: no replay needed to say so. */
    uint64_t usable = o->avail + cached;
    o->fits_unfragmented = o->requested <= usable;
    if (o->have_total && o->requested > o->device_total) {
      char r[32], t[32];
      o->expandable = 0;
      snprintf(o->expandable_why, sizeof o->expandable_why,
               "the request (%s) is larger than the device's whole memory "
               "(%s): no layout fits it",
               cli_bytes(o->requested, r, sizeof r),
               cli_bytes(o->device_total, t, sizeof t));
    } else if (!o->fits_unfragmented) {
      char r[64], u[64];
      o->expandable = 0;
      cli_bytes_apart(o->requested, r, sizeof r, usable, u, sizeof u);
      snprintf(o->expandable_why, sizeof o->expandable_why,
               "the request (%s) is larger than all the process could still "
               "use at the OOM (%s: %s plus its cached free blocks): no "
               "layout fits it", r, u,
               o->avail < o->device_free
                   ? "what its per-process memory fraction still allowed"
                   : "free device memory");
    } else if (whatif) {
      /* expandable segments on a device of what this process could use */
      visit_t w = {.want = {o->state, CLI_NO_PAIR}, .dev = dev, .ask = true,
                   .request = o->requested, .stream = o->stream,
                   .ask_rc = -1};
      /* (the sim's range: 2 MiB up to 256 TiB a device) */
      uint64_t mem = o->reserved + o->avail;
      if (mem != 0 && mem < MSNAP_SIM_MIN_MEMORY) mem = MSNAP_SIM_MIN_MEMORY;
      if (mem > MSNAP_SIM_MAX_MEMORY) mem = MSNAP_SIM_MAX_MEMORY;
      cli_replay_cfg_t cfg = {.profile = NULL,
                              .alloc_conf = "expandable_segments:True",
                              .sim_memory = mem,
                              .visit = visit,
                              .arg = &w};
      cli_replay_res_t rr;
      if (cli_replay_run(s, dev, &cfg, &rr) != 0)
        goto out;
      if (!rr.replayable) {
        snprintf(o->expandable_why, sizeof o->expandable_why, "%s",
                 rr.reason);
      } else if (rr.first_failed != CLI_NO_PAIR &&
                 rr.first_failed < o->state) {
        o->expandable = 0;
        char b[32];
        snprintf(o->expandable_why, sizeof o->expandable_why,
                 "the replay on a device of %s (reserved + %s at the OOM) "
                 "ran out of memory earlier, at entry %u",
                 cli_bytes(o->reserved + o->avail, b, sizeof b), avail_what(o),
                 rr.first_failed);
      } else if (w.got[0]) {
        o->expandable = w.ask_rc == 0;
        char b[32];
        snprintf(o->expandable_why, sizeof o->expandable_why,
                 "a replay on a device of %s (reserved + %s at the OOM) "
                 "%s the request in the OOM's state",
                 cli_bytes(o->reserved + o->avail, b, sizeof b), avail_what(o),
                 w.ask_rc == 0 ? "served" : "could not serve");
      } else {
        snprintf(o->expandable_why, sizeof o->expandable_why,
                 "the replay did not reach the OOM's state");
      }
    }
    uint32_t *pair = NULL;
    if (cli_pair_entries(tl, &pair) != 0)
      goto out;
    int lr = cli_live_sites_at(s, stk, sites, dev, pair, o->state, &o->top,
                               &o->ntop);
    free(pair);
    if (lr != 0)
      goto out;
    if (topn && o->ntop > topn)
      o->ntop = topn;
  }
  rc = 0;
out:
  return rc;
}
