/*
 * cmd_convert.c -- `memsnap convert FILE -o OUT [--json]`: rewrite a
 * snapshot of any generation as a current-format pickle (protocol 4, the
 * MemoryViz opcode subset) or as JSON, through the snapshot writer.
 *
 * Upgrading (default): keys that the current producer always writes are
 * added with the values PyTorch would give them -- block `address`
 * (segment address + preceding sizes), block `frames` (a 2.0 block's first
 * history element, else []) and `requested_size` (that element's
 * real_size, else the block's size), segment `frames`/`segment_pool_id`/
 * `is_expandable`/`stream`/`segment_type`/`requested_size` (the sum over
 * its active blocks), trace `compile_context` ("N/A"), `user_metadata`
 * (""), `pool_id` and `stream`, a `device_traces` list per device,
 * `external_annotations`; a 2.0 block's `history` is dropped (its first
 * element became `frames` and `requested_size`).  Times that were never
 * recorded stay absent (viewers only display them).  An 'oom' entry keyed
 * 'addr' is written with 'device_free', PyTorch's key for that value,
 * with a note; one with neither key is refused (nothing to take the value
 * from).  Trace entries get `size` (0) and frames `name`, `filename` ("")
 * and `line` (0) when they lack them.  --keep-keys writes exactly the keys
 * of the source instead.  Either way, keys of records the model does
 * not keep (the reader counts them: keys_dropped) are named in a
 * warning.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

/*
 * 'oom' entries without 'device_free'.  PyTorch keeps the device's free
 * memory at an OOM in the entry's addr field and writes it as
 * 'device_free', never 'addr'; torch's memory_viz trace reads
 * e['device_free'] and fails without it.  Some hand-written or converted
 * files key it 'addr'.  Counts the entries that have 'addr' instead and
 * those that have neither key, and names the first of each as
 * "device_traces[d][i]" in at_addr and at_none.
 */
typedef struct oom_keys_s {
  uint32_t naddr, nnone;
  char at_addr[48], at_none[48];
} oom_keys_t;

static void oom_without_device_free(const msnap_snap_t *s, oom_keys_t *o) {
  memset(o, 0, sizeof *o);
  for (uint32_t d = 0; d < s->ndevices; d++)
    for (uint32_t i = 0; i < s->device_traces[d].n; i++) {
      const msnap_strace_t *e = &s->device_traces[d].v[i];
      unsigned k = msnap__tattr(s, e)->keys;
      if (e->action != MSNAP_ACTION_OOM || (k & MSNAP_K_DEVICE_FREE))
        continue;
      bool addr = (k & MSNAP_K_ADDRESS) != 0;
      if ((addr ? o->naddr++ : o->nnone++) == 0)
        snprintf(addr ? o->at_addr : o->at_none, sizeof o->at_addr,
                 "device_traces[%u][%u]", d, i);
    }
}

/* An 'oom' entry's 'addr' written as 'device_free', the key PyTorch
 * gives that value (the entries point at attribute sets with the bit
 * moved, one per set). */
static int oom_addr_to_device_free(msnap_snap_t *s) {
  uint32_t nsets = s->ntattrs;
  uint32_t *map = malloc(((size_t)nsets + 1) * sizeof *map);
  if (!map)
    return MSNAP_ENOMEM;
  for (uint32_t k = 0; k < nsets; k++)
    map[k] = UINT32_MAX;
  for (uint32_t d = 0; d < s->ndevices; d++) {
    msnap_trace_list_t *tl = &s->device_traces[d];
    for (uint32_t i = 0; i < tl->n; i++) {
      msnap_strace_t *e = &tl->v[i];
      msnap_tattr_t a = *msnap__tattr(s, e);
      if (e->action != MSNAP_ACTION_OOM || (a.keys & MSNAP_K_DEVICE_FREE) ||
          !(a.keys & MSNAP_K_ADDRESS) || e->attr >= nsets)
        continue;
      if (map[e->attr] == UINT32_MAX) {
        a.keys = (uint16_t)((a.keys & ~MSNAP_K_ADDRESS) | MSNAP_K_DEVICE_FREE);
        map[e->attr] = msnap__snap_tattr(s, &a);
        if (map[e->attr] == UINT32_MAX) {
          free(map);
          return MSNAP_ENOMEM;
        }
      }
      e->attr = map[e->attr];
    }
  }
  free(map);
  return 0;
}

static int upgrade(msnap_snap_t *s) {
  msnap_str_t na = msnap__snap_intern(s, "N/A", 3);
  msnap_str_t empty = msnap__snap_intern(s, "", 0);
  if (!na || !empty)
    return MSNAP_ENOMEM;
  int64_t maxdev = -1;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    msnap_ssegment_t *g = &s->segments[i];
    if (g->device > maxdev)
      maxdev = g->device;
    if (!(g->keys & MSNAP_K_FRAMES)) {
      g->frames = MSNAP_STACK_EMPTY;
      g->keys |= MSNAP_K_FRAMES;
    }
    /* Blocks without requested_size (2.0) get one below; their
     * segment's requested_size (read as 0), like that of a segment
     * without the key, is then the sum over its active blocks, as
     * PyTorch keeps it (memsnap check's rule). */
    bool filled = false;
    uint64_t requested = 0;
    g->keys |= MSNAP_K_POOL_ID | MSNAP_K_EXPANDABLE | MSNAP_K_STREAM |
               MSNAP_K_SEGMENT_TYPE | MSNAP_K_REQUESTED;
    uint64_t a = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (!(b->keys & MSNAP_K_ADDRESS)) {
        b->address = a;
        b->keys |= MSNAP_K_ADDRESS;
      }
      a += b->size;
      if (!(b->keys & MSNAP_K_FRAMES)) {
        b->frames = cli_block_stack(s, b);
        if (b->frames == MSNAP_STACK_ABSENT)
          b->frames = MSNAP_STACK_EMPTY;
        b->keys |= MSNAP_K_FRAMES;
      }
      if (!(b->keys & MSNAP_K_REQUESTED)) {
        if (b->history.n > 0 && b->history.first < s->nhistories)
          b->requested_size = s->histories[b->history.first].real_size;
        else
          b->requested_size = b->size;
        b->keys |= MSNAP_K_REQUESTED;
        filled = true;
      }
      if (cli_block_active(b))
        requested += b->requested_size;
      b->keys &= (uint16_t)~MSNAP_K_HISTORY;
      b->history.n = 0;
    }
    if (filled || !(g->keys & MSNAP_K_SEG_REQUESTED_SIZE))
      g->requested_size = requested;
    g->keys |= MSNAP_K_SEG_REQUESTED_SIZE;
  }
  /* an annotation without name, device or time_us gets "", 0 or 0 */
  for (uint32_t i = 0; i < s->nannotations; i++) {
    msnap_sannotation_t *an = &s->annotations[i];
    if (!(an->keys & MSNAP_K_ANNOT_NAME)) an->name = empty;
    an->keys |= MSNAP_ANNOT_KEYS;
  }
  if (maxdev >= 0 && (uint64_t)(maxdev + 1) > s->ndevices) {
    int rc = msnap__snap_set_devices(s, (uint32_t)(maxdev + 1));
    if (rc)
      return rc;
  }
  /* trace entries share their attribute sets: upgrade each set once,
   * then point the entries at the upgraded ones */
  uint32_t na_sets = s->ntattrs;
  uint32_t *map = malloc((size_t)na_sets * sizeof *map);
  if (!map)
    return MSNAP_ENOMEM;
  for (uint32_t k = 0; k < na_sets; k++) {
    msnap_tattr_t a = s->tattrs[k];
    if (!(a.keys & MSNAP_K_COMPILE_CTX)) {
      a.compile_context = na;
      a.keys |= MSNAP_K_COMPILE_CTX;
    }
    if (!(a.keys & MSNAP_K_USER_META)) {
      a.user_metadata = empty;
      a.keys |= MSNAP_K_USER_META;
    }
    a.keys |= MSNAP_K_SIZE | MSNAP_K_POOL_ID | MSNAP_K_STREAM;
    map[k] = msnap__snap_tattr(s, &a);
    if (map[k] == UINT32_MAX) {
      free(map);
      return MSNAP_ENOMEM;
    }
  }
  for (uint32_t d = 0; d < s->ndevices; d++) {
    msnap_trace_list_t *tl = &s->device_traces[d];
    for (uint32_t i = 0; i < tl->n; i++)
      tl->v[i].attr = map[tl->v[i].attr];
  }
  free(map);
  /* frames get the three keys of every PyTorch frame ("" / 0 for those
   * the source lacked; frames are not interned after this, so changing
   * them in place leaves at most equal frames under two ids) */
  for (uint32_t i = 0; i < s->nframes; i++)
    s->frames[i].absent = 0;
  s->top_keys |= MSNAP_TOP_SEGMENTS | MSNAP_TOP_DEVICE_TRACES |
                 MSNAP_TOP_EXTERNAL_ANNOTATIONS;
  if (s->generation < MSNAP_GEN_CURRENT)
    s->generation = MSNAP_GEN_CURRENT;
  return 0;
}

/* The first value of s that the writer refuses (>= 2^63), named as
 * "segments[i].address 0x..." into buf; "" when none is found. */
static void find_big(const msnap_snap_t *s, char *buf, size_t len) {
  const uint64_t lim = UINT64_C(1) << 63;
  buf[0] = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    const uint64_t v[] = {g->address, g->total_size, g->allocated_size,
                          g->active_size, g->requested_size};
    static const char *const k[] = {"address", "total_size",
                                    "allocated_size", "active_size",
                                    "requested_size"};
    for (int x = 0; x < 5; x++)
      if (v[x] >= lim) {
        snprintf(buf, len, "segments[%u].%s 0x%" PRIx64 " is >= 2^63", i,
                 k[x], v[x]);
        return;
      }
    for (uint32_t b = 0; b < g->nblocks; b++) {
      const msnap_sblock_t *bl = &s->blocks[g->first_block + b];
      const uint64_t w[] = {bl->address, bl->size, bl->requested_size};
      static const char *const kb[] = {"address", "size", "requested_size"};
      for (int x = 0; x < 3; x++)
        if (w[x] >= lim) {
          snprintf(buf, len, "segments[%u].blocks[%u].%s 0x%" PRIx64
                   " is >= 2^63", i, b, kb[x], w[x]);
          return;
        }
    }
  }
  for (uint32_t d = 0; d < s->ndevices; d++)
    for (uint32_t i = 0; i < s->device_traces[d].n; i++) {
      const msnap_strace_t *e = &s->device_traces[d].v[i];
      if (e->addr >= lim || e->size >= lim) {
        const char *ak = (msnap__tattr(s, e)->keys & MSNAP_K_DEVICE_FREE)
                             ? "device_free"
                             : "addr";
        snprintf(buf, len, "device_traces[%u][%u].%s 0x%" PRIx64
                 " is >= 2^63", d, i, e->addr >= lim ? ak : "size",
                 e->addr >= lim ? e->addr : e->size);
        return;
      }
    }
}

/* Keys of records the model does not keep (the reader dropped them,
 * snapshot.h keys_dropped): a warning naming them and their records. */
static void warn_dropped(const msnap_snap_t *s, const char *file) {
  static const char *const in[] = {
      [MSNAP_DROPPED_IN_TRACE] = "trace entry",
      [MSNAP_DROPPED_IN_SEGMENT] = "segment",
      [MSNAP_DROPPED_IN_BLOCK] = "block",
      [MSNAP_DROPPED_IN_HISTORY] = "block history element",
      [MSNAP_DROPPED_IN_ANNOTATION] = "annotation",
      [MSNAP_DROPPED_IN_FRAME] = "frame",
      [MSNAP_DROPPED_IN_TOP] = "top level",
  };
  if (!s->keys_dropped)
    return;
  char names[512] = "";
  size_t n = 0;
  for (int j = 0; j < MSNAP_SNAP_DROPPED_NAMES && s->dropped_key[j]; j++) {
    size_t len;
    const char *p = cli_str(s, s->dropped_key[j], &len);
    unsigned k = s->dropped_in[j];
    int w = snprintf(names + n, sizeof names - n, "%s'%.*s' (%s)",
                     j ? ", " : "", len > 60 ? 60 : (int)len, p,
                     k < sizeof in / sizeof *in ? in[k] : "record");
    if (w < 0 || (size_t)w >= sizeof names - n)
      break;
    n += (size_t)w;
  }
  fprintf(stderr,
          "memsnap: warning: %s: %" PRIu64 " %s not written (memsnap's "
          "model does not keep %s): %s%s\n",
          file, s->keys_dropped, cli_plural(s->keys_dropped, "key", "keys"),
          s->keys_dropped == 1 ? "it" : "them",
          names[0] ? names : "keys that are not str",
          names[0] && s->dropped_more ? ", ..." : "");
}

/* The extension of OUT when it names the other format (".json" for a
 * pickle, ".pickle" or ".pkl" for JSON); NULL when it does not. */
static const char *other_format_ext(const char *out, bool json) {
  const char *dot = strrchr(out, '.');
  if (!dot || strchr(dot, '/'))
    return NULL;
  if (!json && !strcasecmp(dot, ".json"))
    return dot;
  if (json && (!strcasecmp(dot, ".pickle") || !strcasecmp(dot, ".pkl")))
    return dot;
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap convert [--json] [--keep-keys] FILE -o OUT\n"
          "\n"
          "Rewrite a snapshot of any generation (2.0 with block history,\n"
          "2.1, 2.6, current, or a bare list of segments) as a\n"
          "current-format pickle (protocol 4) or, with --json, as JSON in\n"
          "which frames and stacks are written once (frame_table,\n"
          "stack_table; each 'frames' value is an index into stack_table).\n"
          "Keys the current producer\n"
          "always writes are added (block address, frames, requested_size;\n"
          "segment frames, segment_pool_id, is_expandable, stream,\n"
          "segment_type, requested_size; trace compile_context,\n"
          "user_metadata, pool_id, stream; external_annotations, one\n"
          "device_traces list per device), a 2.0 block's history is\n"
          "dropped (its first element gives frames and requested_size)\n"
          "and an oom entry's 'addr' becomes 'device_free', the key\n"
          "PyTorch writes; trace entries get 'size' (0) and frames\n"
          "'name', 'filename' ('') and 'line' (0) when they lack them.\n"
          "--keep-keys keeps exactly the source's keys.  Keys of trace\n"
          "entries the model does not keep (e.g. 'category') are not\n"
          "written, with a warning naming them.\n"
          "The output is written to a temporary file and renamed; an\n"
          "OUT named for the other format (.json without --json,\n"
          ".pickle or .pkl with it) gets a warning.\n"
          "\n"
          "  -o, --output OUT  output path (required)\n"
          "  --json            write JSON instead of a pickle\n"
          "  --keep-keys       do not add keys\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n");
}

int cli_cmd_convert(int argc, char **argv) {
  bool json = false, keep = false;
  const char *out = NULL;
  const cli_opt_t opts[] = {CLI_FLAG("keep-keys", 0, &keep), CLI_OPT_END};
  const cli_cmd_t cmd = {"convert", usage, opts, 1,
                         "expects exactly one FILE", &json, &out,
                         "-o OUT is required", false};
  int first;
  msnap_snap_t *s;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  /* Loaded here, not by cli_begin: convert's --json chooses the format of
   * OUT and is no report on stdout, so a file that cannot be loaded gives
   * the stderr line alone (docs/cli.md, convert). */
  if (cli_load(argv[first], &s) != CLI_OK)
    return CLI_UNUSABLE;
  /* an 'oom' entry without 'device_free' (above): upgrading writes its
   * 'addr' as 'device_free' and says so; one with neither key cannot be
   * upgraded and is refused; --keep-keys keeps it, with a warning */
  oom_keys_t ok;
  oom_without_device_free(s, &ok);
  if (ok.nnone && !keep) {
    msnap__snap_free(s);
    cli_output_failed("%s: cannot be converted: %s is an 'oom' entry "
                      "without 'device_free' (the device's free memory, "
                      "which PyTorch always writes and torch's memory_viz "
                      "reads) or 'addr' to take it from; %s not written "
                      "(--keep-keys writes the entry as it is)",
                      argv[first], ok.at_none, cli_output_shown(out));
    return CLI_UNUSABLE;
  }
  int rc = keep ? 0 : upgrade(s);
  if (rc == 0 && ok.naddr && !keep)
    rc = oom_addr_to_device_free(s);
  if (rc == 0)
    rc = msnap__snap_write_file(s, out, json);
  char why[160] = "";
  if (rc == MSNAP_EINVAL)
    find_big(s, why, sizeof why);
  if (rc == 0)
    warn_dropped(s, argv[first]);
  msnap__snap_free(s);
  if (rc) {
    if (why[0])
      /* a value of the input, not the output, is the problem: name the
       * input and say nothing was written */
      cli_output_failed("%s: cannot be converted: %s (a pickle MemoryViz "
                        "reads holds values below 2^63) [%s]; %s not written",
                        argv[first], why, msnap_err_name(rc),
                        cli_output_shown(out));
    else
      cli_write_failed(out, "", rc, msnap_last_error());
    return CLI_UNUSABLE;
  }
  if (ok.naddr && !keep)
    fprintf(stderr,
            "memsnap: %s: %u 'oom' entr%s had 'addr' instead of "
            "'device_free' (the first: %s): written as 'device_free', the "
            "key PyTorch writes and torch's memory_viz reads\n",
            argv[first], ok.naddr, ok.naddr == 1 ? "y" : "ies", ok.at_addr);
  else if (ok.naddr + ok.nnone)
    fprintf(stderr,
            "memsnap: warning: %s: %u 'oom' entr%s without 'device_free' "
            "(the first: %s), kept as in the source (--keep-keys): torch's "
            "memory_viz trace cannot read %s\n",
            argv[first], ok.naddr + ok.nnone,
            ok.naddr + ok.nnone == 1 ? "y" : "ies",
            ok.naddr ? ok.at_addr : ok.at_none, cli_output_shown(out));
  const char *ext = other_format_ext(out, json);
  if (ext)
    fprintf(stderr,
            "memsnap: warning: %s holds %s, though its name ends in '%s' "
            "(%s)\n",
            cli_output_shown(out), json ? "JSON, not a pickle"
                                        : "a pickle, not JSON",
            ext,
            json ? "without --json convert writes a pickle"
                 : "convert writes JSON with --json");
  fprintf(stderr, "memsnap: wrote %s (%s)\n", cli_output_shown(out),
          json ? "JSON" : "pickle protocol 4");
  return CLI_OK;
}
