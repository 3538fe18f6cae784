/*
 * cmd_check.c -- `memsnap check FILE...`: conformance of snapshot files to
 * the schema of their generation (cuda-reference.md §2 and §7.3), one line
 * per violation naming where it is:
 *
 *   FILE: segments[12].blocks[3]: address 0x... but ...
 *   FILE: device_traces[0][881]: free_completed of 0x... but ...
 *
 * Rules: block sizes sum to total_size; blocks are contiguous from the
 * segment address; allocated/active/requested sizes are the sums of the
 * blocks; states and actions are known names; segments are sorted and
 * disjoint per device and devices are concatenated in order (except a
 * tail of one-block workspace segments, as torch_npu appends them, in a
 * file that shows torch_npu: torch_npu_evidence);
 * time_us never decreases within a device trace; keys required by the
 * generation are present ('segments' and 'device_traces' in a dict, block
 * address since 2.1, requested_size with frames, time_us on all entries
 * of a device or none, 'device_free' rather than 'addr' on an oom entry);
 * every device with segments has a trace list; segment ends fit in 64
 * bits; addresses, trace entry sizes and blocks' requested sizes stay
 * below 2^53;
 * and the backward replay of each device trace over the final
 * state (cli_back.c) finds nothing wrong.  The replay rules never need the
 * entries a ring buffer dropped, so a truncated history is not a fault.
 */
#include <limits.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* A trace entry's violation held until its device's checks are done
 * (check_traces prints them sorted by entry).  At most CHECK_HOLD_MAX are
 * held (about 200 bytes each): past that, those held are printed in
 * trace order and the rest as they are found, so that a file of millions
 * of violations is checked in bounded memory. */
#define CHECK_HOLD_MAX (1u << 16)
typedef struct held_s {
  int64_t device;
  uint32_t entry, seq;
  char *where, *msg;
} held_t;

typedef struct check_s {
  const char *file;
  bool json;
  cli_json_t *j;
  long count;
  long max_lines;
  int64_t device; /* for the backward-replay callback */
  /* while `hold`: report() keeps each violation, at (device, entry) */
  bool hold, held_oom;
  uint32_t entry;
  held_t *held;
  uint32_t nheld, capheld, seq;
  long unheld; /* held ones --max-lines would not print: only counted */
} check_t;

static void emit(check_t *c, const char *where, const char *msg) {
  c->count++;
  if (c->max_lines >= 0 && c->count > c->max_lines)
    return;
  if (c->json) {
    cj_obj(c->j);
    cj_key(c->j, "where");
    cj_cstr(c->j, where);
    cj_key(c->j, "message");
    cj_cstr(c->j, msg);
    cj_obj_end(c->j);
  } else {
    printf("%s: %s: %s\n", cli_shown(c->file), where, msg);
  }
}

static int held_cmp(const void *x, const void *y) {
  const held_t *a = x, *b = y;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  if (a->entry != b->entry) return a->entry < b->entry ? -1 : 1;
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Sort the held violations and, under --max-lines, keep only those that
 * can still be printed (the others are counted). */
static void sort_held(check_t *c) {
  if (c->nheld) qsort(c->held, c->nheld, sizeof *c->held, held_cmp);
  if (c->max_lines < 0) return;
  uint32_t keep = c->count >= c->max_lines ? 0
                  : c->max_lines - c->count < c->nheld
                      ? (uint32_t)(c->max_lines - c->count)
                      : c->nheld;
  for (uint32_t i = keep; i < c->nheld; i++) {
    free(c->held[i].where);
    free(c->held[i].msg);
  }
  c->unheld += c->nheld - keep;
  c->nheld = keep;
}

static void release_held(check_t *c);

static void report(check_t *c, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(check_t *c, const char *where, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cli_sanitize(msg); /* names from the file must not drive the terminal */
  if (c->hold && c->nheld >= CHECK_HOLD_MAX) {
    release_held(c); /* (hold is off from here on) */
    fflush(stdout); /* "above" also when both go to one file or pipe */
    fprintf(stderr,
            "memsnap check: %s: over %u violations of trace entries: those "
            "above are in trace order, the rest follow in the order found\n",
            c->file, CHECK_HOLD_MAX);
  }
  if (!c->hold) {
    emit(c, where, msg);
    return;
  }
  held_t h = {c->device, c->entry, c->seq++, strdup(where), strdup(msg)};
  if (!h.where || !h.msg || MSNAP_GROW(c->held, c->capheld, c->nheld + 1)) {
    free(h.where);
    free(h.msg);
    c->held_oom = true;
    c->unheld++;
    return;
  }
  c->held[c->nheld++] = h;
  /* (what --max-lines will not print need not be held; past
   * CHECK_HOLD_MAX there is nothing to trim, and 2 * max_lines would wrap
   * for --max-lines near LONG_MAX, sorting at every violation) */
  if (c->max_lines >= 0 && c->max_lines < CHECK_HOLD_MAX &&
      c->nheld >= 2 * (uint32_t)c->max_lines + 1024)
    sort_held(c);
}

/* Print the held violations in trace order (device, entry, then the
 * order they were found in) and forget them. */
static void release_held(check_t *c) {
  c->hold = false;
  sort_held(c);
  for (uint32_t i = 0; i < c->nheld; i++) {
    emit(c, c->held[i].where, c->held[i].msg);
    free(c->held[i].where);
    free(c->held[i].msg);
  }
  free(c->held);
  c->held = NULL;
  c->nheld = c->capheld = 0;
  c->count += c->unheld;
  c->unheld = 0;
  if (c->held_oom) {
    c->held_oom = false;
    report(c, "device_traces", "out of memory: violations not shown");
  }
}

static void back_cb(void *arg, uint32_t entry, const char *msg) {
  check_t *c = arg;
  c->entry = entry;
  char where[64];
  snprintf(where, sizeof where, "device_traces[%" PRId64 "][%u]", c->device,
           entry);
  report(c, where, "%s", msg);
}

/* The file shows a torch_npu recording (cli_recording_profile's
 * evidence).  A torch_npu file without history has none: nothing tells
 * it from a CUDA one. */
static bool torch_npu_evidence(const msnap_snap_t *s) {
  return strcmp(cli_recording_profile(s), "npu") == 0;
}

/*
 * Where a workspace tail would start (nsegments when none).  torch_npu's
 * _snapshot (Module.cpp) appends NPUWorkspaceAllocator::snapshot()'s
 * segments, one large block each, after the caching allocator's
 * device-ordered, address-sorted ones: device by device in device order
 * (snapshot() walks device_allocator), within a device in the order of
 * its stream-keyed hash map, not by address; memsnap's npu profile does
 * the same (buffers in creation order).  The tail is the run after the
 * first break of the order when every segment of it is a large segment
 * of exactly one block.  check_segments accepts it only with
 * torch_npu_evidence, and checks its device order.
 */
static uint32_t workspace_tail(const msnap_snap_t *s) {
  for (uint32_t i = 1; i < s->nsegments; i++) {
    const msnap_ssegment_t *p = &s->segments[i - 1], *g = &s->segments[i];
    if (g->device > p->device ||
        (g->device == p->device && g->address > p->address))
      continue;
    for (uint32_t k = i; k < s->nsegments; k++)
      if (s->segments[k].nblocks != 1 || !s->segments[k].is_large)
        return s->nsegments;
    return i;
  }
  return s->nsegments;
}

/* Segments of one device must not overlap (the workspace tail included). */
typedef struct overlap_ctx_s {
  check_t *c;
  const msnap_snap_t *s;
} overlap_ctx_t;

static bool overlap_report(void *arg, uint32_t prev, uint32_t next) {
  overlap_ctx_t *o = arg;
  const msnap_ssegment_t *p = &o->s->segments[prev];
  const msnap_ssegment_t *g = &o->s->segments[next];
  char where[64];
  snprintf(where, sizeof where, "segments[%u]", next);
  report(o->c, where,
         "segment at 0x%" PRIx64 " overlaps segments[%u] "
         "[0x%" PRIx64 ", 0x%" PRIx64 ")",
         g->address, prev, p->address, cli_segment_end(p));
  return true;
}

static void check_overlaps(check_t *c, const msnap_snap_t *s) {
  overlap_ctx_t o = {c, s};
  cli_segment_overlaps(s, INT64_MIN, overlap_report, &o);
}

/* After a device's segments: of its n segments out of address order
 * (the first reported in full), the `rest` not reported one by one
 * (segments[first] to segments[last]), as one violation. */
static void unsorted_line(check_t *c, int64_t dev, uint32_t n, uint32_t rest,
                          uint32_t first, uint32_t last) {
  if (rest == 0)
    return;
  /* one more is named alone: "1 more segment, segments[11], is not..." */
  char which[96];
  if (rest == 1)
    snprintf(which, sizeof which, "1 more segment, segments[%u], is", first);
  else
    snprintf(which, sizeof which, "%u more segments in segments[%u..%u] are",
             rest, first, last);
  report(c, "segments",
         "device %" PRId64 ": %s not above the previous segment's address "
         "(%u in all): the device's segments are not sorted by address, as "
         "PyTorch's DeviceCachingAllocator::snapshot sorts them "
         "(c10/cuda/CUDACachingAllocator.cpp)",
         dev, which, n);
}

static void check_segments(check_t *c, const msnap_snap_t *s) {
  char where[96];
  int64_t prev_dev = INT64_MIN;
  uint64_t prev_addr = 0;
  uint32_t prev_i = 0;
  bool dev_seen_order_bad = false;
  /* a device's segments out of address order: the first is reported,
   * the rest of that device counted into one line (unsorted_line) */
  uint32_t unsorted = 0, unsorted_rest = 0, unsorted_first = 0,
           unsorted_last = 0;
  uint32_t tail = workspace_tail(s);
  /* a tail of the workspace's shape in a file that does not show
   * torch_npu: checked as the rest, its first violation says why */
  uint32_t hint_from = s->nsegments;
  if (tail < s->nsegments && !torch_npu_evidence(s)) {
    hint_from = tail;
    tail = s->nsegments;
  }
  check_overlaps(c, s);
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    snprintf(where, sizeof where, "segments[%u]", i);
    /* (the reader refuses these already: kept for models built in code) */
    if (g->device < 0 || g->device >= MSNAP_SNAP_MAX_DEVICES)
      report(c, where,
             "device %" PRId64 " is not a device index (expected 0..%d)",
             g->device, MSNAP_SNAP_MAX_DEVICES - 1);
    if (i >= tail) {
      /* torch_npu's workspace tail: devices in order, addresses in any
       * order within a device */
      if (i > tail && g->device < s->segments[i - 1].device)
        report(c, where,
               "device %" PRId64 " after device %" PRId64 " in the "
               "workspace segments at the end: torch_npu appends them "
               "in device order",
               g->device, s->segments[i - 1].device);
    } else if (g->device != prev_dev) {
      unsorted_line(c, prev_dev, unsorted, unsorted_rest, unsorted_first,
                    unsorted_last);
      unsorted = unsorted_rest = 0;
      if (prev_dev != INT64_MIN && g->device < prev_dev &&
          !dev_seen_order_bad) {
        report(c, where,
               "device %" PRId64 " after device %" PRId64
               ": devices must be concatenated in device order",
               g->device, prev_dev);
        dev_seen_order_bad = true;
      }
      prev_dev = g->device;
    } else if (g->address <= prev_addr && unsorted++ > 0 &&
               i < hint_from) {
      /* (out of order past the device's first: counted, one line for the
       * rest; the first, and one that needs the hint, are reported) */
      if (unsorted_rest++ == 0)
        unsorted_first = i;
      unsorted_last = i;
    } else if (g->address <= prev_addr) {
      const char *why = "";
      if (i >= hint_from) {
        why = " (one-block large segments out of order at the end are "
              "torch_npu's workspace segments only in a file that shows "
              "torch_npu: an npu profile, PYTORCH_NPU_ALLOC_CONF, "
              "workspace_segments in allocator_settings, workspace_snapshot "
              "entries)";
        hint_from = s->nsegments; /* said once */
      }
      report(c, where,
             "address 0x%" PRIx64 " is not above the previous segment's "
             "(segments[%u] at 0x%" PRIx64 "): segments must be sorted by "
             "address per device%s",
             g->address, prev_i, prev_addr, why);
    }
    prev_addr = g->address;
    prev_i = i;
    bool wraps = g->total_size > UINT64_MAX - g->address;
    if (wraps)
      report(c, where,
             "address 0x%" PRIx64 " plus total_size %" PRIu64 " runs past "
             "2^64 (the segment's end overflows 64 bits)",
             g->address, g->total_size);
    if (wraps || g->address + g->total_size > (1ull << 53))
      report(c, where,
             "address range ends above 2^53: JavaScript viewers "
             "(memory_viz) lose precision");
    if (g->nblocks == 0) {
      report(c, where, "segment has no blocks");
      continue;
    }
    uint64_t run = g->address, sum = 0, alloc = 0, active = 0, req = 0;
    bool req_known = true;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      snprintf(where, sizeof where, "segments[%u].blocks[%u]", i, k);
      if (b->state == MSNAP_BLOCK_UNKNOWN_STATE)
        report(c, where,
               "unknown state '%s' (expected active_allocated, "
               "active_pending_free or inactive)",
               cli_str(s, b->state_str, NULL));
      if ((b->keys & MSNAP_K_ADDRESS) && b->address != run)
        report(c, where,
               "address 0x%" PRIx64 " but the segment start plus the "
               "previous blocks give 0x%" PRIx64 " (blocks not contiguous)",
               b->address, run);
      if (!(b->keys & MSNAP_K_ADDRESS) && s->generation >= MSNAP_GEN_2_1 &&
          !(b->keys & MSNAP_K_HISTORY))
        report(c, where, "missing key 'address' (present since 2.1)");
      if ((b->keys & MSNAP_K_FRAMES) && !(b->keys & MSNAP_K_REQUESTED))
        report(c, where,
               "has 'frames' but no 'requested_size' (viewers apply no "
               "default then)");
      if (b->size == 0)
        report(c, where, "block of size 0");
      if ((b->keys & MSNAP_K_REQUESTED) && b->requested_size > (1ull << 53))
        report(c, where,
               "requested_size %" PRIu64 " is above 2^53: JavaScript "
               "viewers (memory_viz) lose precision, and no device holds it",
               b->requested_size);
      /* Inactive blocks keep the stale request of their last use (PyTorch
       * does not clear it on a split or merge): only active ones count. */
      if ((b->keys & MSNAP_K_REQUESTED) && cli_block_active(b) &&
          b->requested_size > b->size)
        report(c, where,
               "requested_size %" PRIu64 " is larger than the block's size "
               "%" PRIu64, b->requested_size, b->size);
      run += b->size;
      sum += b->size;
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED)
        alloc += b->size;
      if (cli_block_active(b)) {
        active += b->size;
        req += b->requested_size;
        if (!(b->keys & MSNAP_K_REQUESTED))
          req_known = false;
      }
    }
    snprintf(where, sizeof where, "segments[%u]", i);
    if (sum != g->total_size)
      report(c, where,
             "total_size %" PRIu64 " but its blocks sum to %" PRIu64,
             g->total_size, sum);
    if (g->allocated_size != alloc)
      report(c, where,
             "allocated_size %" PRIu64 " but its active_allocated blocks "
             "sum to %" PRIu64,
             g->allocated_size, alloc);
    if (g->active_size != active)
      report(c, where,
             "active_size %" PRIu64 " but its active blocks sum to %" PRIu64,
             g->active_size, active);
    if (req_known && g->requested_size != req)
      report(c, where,
             "requested_size %" PRIu64 " but the requested sizes of its "
             "active blocks sum to %" PRIu64,
             g->requested_size, req);
  }
  unsorted_line(c, prev_dev, unsorted, unsorted_rest, unsorted_first,
                unsorted_last);
}

/* The two keys of every snapshot dict PyTorch's _snapshot() writes
 * (the reader needs one of them; a bare list of segments, the format
 * before 2.0, has neither).  Returns false when 'segments' is missing:
 * the final state is unknown then, so the trace is not replayed. */
static bool check_top(check_t *c, const msnap_snap_t *s) {
  if (s->generation == MSNAP_GEN_SEGMENT_LIST) return true;
  bool segs = (s->top_keys & MSNAP_TOP_SEGMENTS) != 0;
  if (!segs)
    report(c, "top-level dict",
           "missing key 'segments' (PyTorch writes it in every snapshot "
           "dict; torch's memory_viz stats and trace fail without it); the "
           "trace is not replayed, having no final state to replay over");
  if (!(s->top_keys & MSNAP_TOP_DEVICE_TRACES))
    report(c, "top-level dict",
           "missing key 'device_traces' (PyTorch writes it in every "
           "snapshot dict, one list per device even when no history was "
           "recorded; torch's memory_viz trace fails without it)");
  return segs;
}

static void check_traces(check_t *c, const msnap_snap_t *s, bool replay) {
  char where[64];
  if (s->ndevices > 0) {
    for (uint32_t i = 0; i < s->nsegments; i++) {
      int64_t dev = s->segments[i].device;
      if (dev < 0 || (uint64_t)dev >= s->ndevices) {
        snprintf(where, sizeof where, "segments[%u]", i);
        report(c, where,
               "device %" PRId64 " has no list in device_traces (%u %s: "
               "memory_viz indexes device_traces by a segment's device)",
               dev, s->ndevices, cli_plural(s->ndevices, "list", "lists"));
        break;
      }
    }
  }
  /* the entries' violations come from two passes (this forward one and
   * the backward replay): printed at the end, in trace order */
  c->hold = true;
  for (uint32_t d = 0; d < s->ndevices; d++) {
    const msnap_trace_list_t *tl = &s->device_traces[d];
    bool have_prev = false;
    int64_t prev = 0;
    /* time_us: all entries of a device or none (files older than 2.2 and
     * conversions of them have none). */
    uint32_t timed = 0;
    for (uint32_t i = 0; i < tl->n; i++)
      timed += (msnap__tattr(s, &tl->v[i])->keys & MSNAP_K_TIME) != 0;
#define WHERE                                                                \
  (c->device = d, c->entry = i,                                              \
   snprintf(where, sizeof where, "device_traces[%u][%u]", d, i), where)
    for (uint32_t i = 0; i < tl->n; i++) {
      const msnap_strace_t *e = &tl->v[i];
      const msnap_tattr_t *at = msnap__tattr(s, e);
      if (e->action == MSNAP_ACTION_UNKNOWN) {
        const char *a = cli_str(s, at->action_str, NULL);
        report(c, WHERE, "unknown action '%s'%s", a,
               !strcmp(a, "free") ? " ('free' is only synthesized by "
                                    "viewers, producers write "
                                    "free_requested/free_completed)"
                                  : "");
      }
      if (at->keys & MSNAP_K_TIME) {
        if (have_prev && e->time_us < prev)
          report(c, WHERE,
                 "time_us %" PRId64 " is before the previous entry's %" PRId64
                 " (time must not decrease within a device)",
                 e->time_us, prev);
        prev = e->time_us;
        have_prev = true;
      } else if (timed > 0) {
        report(c, WHERE,
               "missing key 'time_us' (%u of the device's %u entries %s "
               "it)",
               timed, tl->n, cli_plural(timed, "has", "have"));
      }
      /* PyTorch keeps the free device memory of an OOM in the entry's
       * addr field and writes it as 'device_free' (never 'addr');
       * memory_viz's trace reads e['device_free'] and fails without it */
      if (e->action == MSNAP_ACTION_OOM && !(at->keys & MSNAP_K_DEVICE_FREE))
        report(c, WHERE,
               "'oom' entry %s 'device_free' (PyTorch writes the device's "
               "free memory under that key; torch's memory_viz trace cannot "
               "read the file without it)",
               at->keys & MSNAP_K_ADDRESS ? "has 'addr' instead of"
                                          : "without");
      /* every PyTorch entry has 'size', and 'addr' but an oom's (the
       * reader reads a missing one as 0: say so, not a 0's effects) */
      if (e->action != MSNAP_ACTION_OOM &&
          !(at->keys & (MSNAP_K_ADDRESS | MSNAP_K_DEVICE_FREE)))
        report(c, WHERE,
               "missing key 'addr' (PyTorch writes it in every entry but "
               "an oom's; read as 0)");
      if (!(at->keys & MSNAP_K_SIZE))
        report(c, WHERE,
               "missing key 'size' (PyTorch writes it in every entry; read "
               "as 0)");
      if (e->size > (1ull << 53))
        report(c, WHERE,
               "size %" PRIu64 " is above 2^53: JavaScript viewers "
               "(memory_viz) lose precision, and no device holds it",
               e->size);
      if (e->addr >= (1ull << 53) && !(at->keys & MSNAP_K_DEVICE_FREE))
        report(c, WHERE,
               "addr 0x%" PRIx64 " is above 2^53: JavaScript viewers "
               "(memory_viz) lose precision",
               e->addr);
    }
#undef WHERE
  }
  if (replay) {
    uint32_t nd;
    int64_t *devs = cli_devices(s, &nd);
    for (uint32_t k = 0; k < nd; k++) {
      c->device = devs[k];
      c->entry = UINT32_MAX;
      if (cli_backward(s, devs[k], back_cb, c, NULL) < 0)
        report(c, "device_traces", "out of memory during the replay check");
    }
    free(devs);
  }
  release_held(c);
}

/* Text that was not valid UTF-8 (the reader repaired it with U+FFFD, so
 * what memsnap writes always decodes; the file itself does not). */
static void check_strings(check_t *c, const msnap_snap_t *s) {
  if (!s->utf8_repaired) return;
  size_t n;
  const char *ex = cli_str(s, s->utf8_example, &n);
  report(c, "strings",
         "%" PRIu64 " string%s not valid UTF-8 (invalid bytes or lone "
         "surrogates; read as U+FFFD), the first: \"%.*s%s\"",
         s->utf8_repaired, s->utf8_repaired == 1 ? " is" : "s are",
         (int)(n < 120 ? n : 120), ex, n > 120 ? "..." : "");
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap check [--json] [--max-lines N] FILE...\n"
          "\n"
          "Check each snapshot file against the schema of its generation\n"
          "and the rules viewers rely on; print one line per violation:\n"
          "  FILE: segments[12].blocks[3]: <what is wrong>\n"
          "  FILE: device_traces[0][881]: <what is wrong>\n"
          "\n"
          "Rules: block sums (total/allocated/active/requested sizes),\n"
          "contiguous blocks, known state and action names, segments sorted\n"
          "per device (in a file that shows torch_npu, its workspace\n"
          "segments may follow, out of address order, device by device),\n"
          "time_us not decreasing per device, keys of the generation\n"
          "('device_free', not 'addr', on an oom entry), and a\n"
          "backward replay of each trace over the final state\n"
          "(alloc/free_*/segment_* must be consistent with it; a ring\n"
          "buffer that dropped old entries is not a violation; a recording\n"
          "that skipped such actions (allocator_settings'\n"
          "trace_skip_actions) gets a note instead).  Text that is not\n"
          "valid UTF-8 (read as U+FFFD) is reported under 'strings'.\n"
          "\n"
          "  --json          one JSON object: {files: [{file, usable,\n"
          "                  violations: [{where, message}], count,\n"
          "                  replay_checked (the backward replay ran),\n"
          "                  replay_skipped_why (why not, or null)}],\n"
          "                  violations}; a file that cannot be read is\n"
          "                  {file, usable: false, error}\n"
          "  --max-lines N   print at most N violations per file (all are\n"
          "                  counted)\n"
          "  -h, --help      this text\n"
          "\nExit status: 0 all files conform, 1 violations found, 2 a file\n"
          "could not be read.\n");
}

int cli_cmd_check(int argc, char **argv) {
  bool json = false;
  long max_lines = -1;
  const cli_opt_t opts[] = {CLI_LONG("max-lines", 'm', &max_lines, 0,
                                     LONG_MAX,
                                     "--max-lines needs a number >= 0"),
                            CLI_OPT_END};
  const cli_cmd_t cmd = {"check", usage, opts, -1, "no FILE given", &json,
                         NULL, NULL, false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  cli_json_t j;
  cj_init(&j, stdout);
  if (json) {
    cj_obj(&j);
    cj_key(&j, "files");
    cj_arr(&j);
  }
  int rc = CLI_OK;
  long total = 0;
  cli_progress_t pr;
  cli_progress_init(&pr, "check");
  for (int a = first; a < argc; a++) {
    cli_progress_tick(&pr, (uint64_t)(a - first), (uint64_t)(argc - first));
    msnap_snap_t *s = NULL;
    /* no rule looks into a stack (the reader checks every frame list
     * either way): the file's stacks are not stored */
    int lr = cli_load_ex(argv[a], &s, true);
    if (json) {
      cj_obj(&j);
      cj_key(&j, "file");
      cj_cstr(&j, argv[a]);
      cj_key(&j, "usable");
      cj_bool(&j, lr == CLI_OK);
    }
    if (lr != CLI_OK) {
      rc = CLI_UNUSABLE;
      if (json) { /* the keys of the unusable document (cli_json_unusable) */
        cj_key(&j, "error");
        cj_cstr(&j, cli_load_error());
        cj_obj_end(&j);
      }
      continue;
    }
    check_t c = {.file = argv[a], .json = json, .j = &j,
                 .max_lines = max_lines};
    if (json) {
      cj_key(&j, "violations");
      cj_arr(&j);
    }
    bool top = check_top(&c, s);
    char skipped[384] = "";
    bool holes = cli_skipped_history(s, skipped, sizeof skipped);
    check_segments(&c, s);
    check_traces(&c, s, top && !holes);
    check_strings(&c, s);
    if (json) {
      cj_arr_end(&j);
      cj_key(&j, "count");
      cj_i64(&j, c.count);
      cj_key(&j, "replay_checked");
      cj_bool(&j, top && !holes);
      cj_key(&j, "replay_skipped_why");
      if (holes)
        cj_cstr(&j, skipped);
      else
        cj_null(&j);
      cj_obj_end(&j);
    } else {
      if (holes)
        printf("%s: note: the backward replay's rules were not checked: the "
               "recording skipped its %s\n", cli_shown(argv[a]), skipped);
      if (c.count == 0) {
        uint64_t ne = 0;
        for (uint32_t d = 0; d < s->ndevices; d++)
          ne += s->device_traces[d].n;
        printf("%s: ok (%u segment%s, %u block%s, %" PRIu64
               " trace entr%s)\n", cli_shown(argv[a]), s->nsegments,
               s->nsegments == 1 ? "" : "s", s->nblocks,
               s->nblocks == 1 ? "" : "s", ne, ne == 1 ? "y" : "ies");
      } else if (max_lines >= 0 && c.count > max_lines) {
        printf("%s: %ld %s (%ld not shown)\n", cli_shown(argv[a]), c.count,
               cli_plural((uint64_t)c.count, "violation", "violations"),
               c.count - max_lines);
      }
    }
    total += c.count;
    if (c.count && rc == CLI_OK)
      rc = CLI_FINDING;
    msnap__snap_free(s);
  }
  cli_progress_end(&pr);
  if (json) {
    cj_arr_end(&j);
    cj_key(&j, "violations");
    cj_i64(&j, total);
    cj_obj_end(&j);
    cj_end(&j);
  }
  return rc;
}
