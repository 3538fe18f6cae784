/*
 * cmd_replay.c -- `memsnap replay FILE`: the command line and the report
 * (text or --json) of a replay; the engine is replay.c (what is
 * replayable, how the start state is rebuilt, what is compared).
 *
 * Modes.  "exact": the recording's own profile and no --alloc-conf (the
 * recording's own PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_NPU_ALLOC_CONF for
 * the npu profile, is applied): matches_recording says whether every
 * decision matched.  "what-if": another profile or alloc conf;
 * addresses are the sim's own and only segment decisions are compared.
 * Exit status: 0 replayed (and, in exact mode, matched), 1 an exact
 * replay did not match, 2 unusable input or nothing replayable.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/conf.h"
#include "replay.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap replay [--profile cuda|npu] [--alloc-conf STR]\n"
          "                      [-o OUT] [--json] [--max-mismatches N]\n"
          "                      [--device-memory BYTES] FILE\n"
          "\n"
          "Run the file's recorded alloc/free stream through memsnap's\n"
          "caching allocator on the simulated device and report segment\n"
          "allocations and frees, peak and final reserved memory,\n"
          "fragmentation (inactive_split bytes) and whether every decision\n"
          "matches the recording.\n"
          "\n"
          "A trace that began while memory was already in use is replayed\n"
          "from the state at its first entry, rebuilt from the final\n"
          "segments.  Not replayable: no trace, no alloc history, a trace\n"
          "inconsistent with the final state (memsnap check), expandable\n"
          "segments or private pools: matches_recording is then null and\n"
          "`reason` says why.  Sizes of blocks allocated before the trace\n"
          "and freed in it are inferred from their requests (start state\n"
          "\"inferred\").\n"
          "\n"
          "  --profile P       cuda or npu (default: the profile the\n"
          "                    recording was made with: its process_info\n"
          "                    (memsnap's files), else npu when its\n"
          "                    allocator_settings name\n"
          "                    PYTORCH_NPU_ALLOC_CONF or it holds\n"
          "                    torch_npu's workspace entries, else cuda)\n"
          "  --alloc-conf STR  allocator configuration (e.g.\n"
          "                    expandable_segments:True,\n"
          "                    max_split_size_mb:128)\n"
          "                    With the recording's own profile and no\n"
          "                    --alloc-conf the replay is \"exact\"\n"
          "                    (recorded addresses, recorded conf);\n"
          "                    otherwise \"what-if\": addresses are the\n"
          "                    sim's and only segment decisions are\n"
          "                    compared.\n"
          "  -o, --output OUT  write the replayed snapshot (pickle)\n"
          "  --json            JSON: {file, profile, alloc_conf, mode,\n"
          "                    replayable, matches_recording, fits (no\n"
          "                    alloc failed for lack of memory),\n"
          "                    failed_allocs, reason,\n"
          "                    segment_allocs (allocations that grew\n"
          "                    reserved memory: new segments, or mapped\n"
          "                    pages when expandable), segment_frees,\n"
          "                    peak_reserved_bytes, final_reserved_bytes,\n"
          "                    inactive_split_bytes, mismatches, output,\n"
          "                    output_error, devices: [{device, replayable,\n"
          "                    reason, matches_recording, initial_state\n"
          "                    (this key and the ones after it only when\n"
          "                    the device is replayable), initial_segments,\n"
          "                    initial_blocks, inferred_block_sizes,\n"
          "                    trace_entries, segment_allocs, segment_frees,\n"
          "                    peak_reserved_bytes, final_reserved_bytes,\n"
          "                    peak_allocated_bytes, inactive_split_bytes,\n"
          "                    peak_inactive_split_bytes,\n"
          "                    final_state_compared, final_state_reason\n"
          "                    (why the final layout was not compared, or\n"
          "                    null), mismatch_count, failed_allocs,\n"
          "                    first_failed_entry (index, or null),\n"
          "                    mismatches,\n"
          "                    recording: {segment_allocs,\n"
          "                    segment_frees, peak_reserved_bytes,\n"
          "                    final_reserved_bytes,\n"
          "                    inactive_split_bytes}}]}\n"
          "  --max-mismatches N  mismatches listed per device, 0..64\n"
          "                    (default 10)\n"
          "  --device-memory B the simulated device's memory (default 1T;\n"
          "                    a size such as 80G or 1.5T): give the recording\n"
          "                    device's total when the configuration depends\n"
          "                    on it (per_process_memory_fraction,\n"
          "                    garbage_collection_threshold, OOMs)\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 replayed (and, in exact mode, matched), 1 exact\n"
          "replay did not match or an alloc failed (the recording does not\n"
          "fit, e.g. in --device-memory), 2 unusable input or not\n"
          "replayable.\n");
}

static void json_dev(cli_json_t *j, const dev_replay_t *d, bool exact) {
  cj_obj(j);
  cj_key(j, "device");
  cj_i64(j, d->device);
  cj_key(j, "replayable");
  cj_bool(j, d->replayable);
  cj_key(j, "reason");
  if (d->replayable)
    cj_null(j);
  else
    cj_cstr(j, d->reason);
  cj_key(j, "matches_recording");
  if (!d->replayable)
    cj_null(j);
  else
    cj_bool(j, d->mismatch_count == 0);
  if (d->replayable) {
    cj_key(j, "initial_state");
    cj_cstr(j, d->initial);
    const cli_u64_field_t figs[] = {
        {"initial_segments", d->initial_segments},
        {"initial_blocks", d->initial_blocks},
        {"inferred_block_sizes", d->inferred_blocks},
        {"trace_entries", d->entries},
        {"segment_allocs", d->segment_allocs},
        {"segment_frees", d->segment_frees},
        {"peak_reserved_bytes", d->peak_reserved},
        {"final_reserved_bytes", d->final_reserved},
        {"peak_allocated_bytes", d->peak_allocated},
        {"inactive_split_bytes", d->inactive_split},
        {"peak_inactive_split_bytes", d->peak_inactive_split}};
    cj_u64_fields(j, figs, sizeof figs / sizeof figs[0]);
    cj_key(j, "final_state_compared");
    cj_bool(j, d->final_compared);
    cj_key(j, "final_state_reason");
    if (d->final_compared)
      cj_null(j);
    else
      cj_cstr(j, d->final_why);
    cj_key(j, "mismatch_count");
    cj_u64(j, d->mismatch_count);
    cj_key(j, "failed_allocs");
    cj_u64(j, d->failed_allocs);
    cj_key(j, "first_failed_entry");
    cj_u64_or_null(j, d->failed_allocs != 0, d->first_failed);
    cj_key(j, "mismatches");
    cj_arr(j);
    for (uint32_t i = 0; i < d->nkept; i++)
      cj_cstr(j, d->mismatches[i]);
    cj_arr_end(j);
    cj_key(j, "recording");
    cj_obj(j);
    const cli_u64_field_t rec[] = {
        {"segment_allocs", d->rec_segment_allocs},
        {"segment_frees", d->rec_segment_frees},
        {"peak_reserved_bytes", d->rec_peak_reserved},
        {"final_reserved_bytes", d->rec_final_reserved},
        {"inactive_split_bytes", d->rec_inactive_split}};
    cj_u64_fields(j, rec, sizeof rec / sizeof rec[0]);
    cj_obj_end(j);
  }
  (void)exact;
  cj_obj_end(j);
}

static void print_json(const replay_t *r, const replay_totals_t *t,
                       const char *file, const char *wrote) {
  cli_json_t j;
  cj_init(&j, stdout);
  cj_obj(&j);
  cj_key(&j, "file");
  cj_cstr(&j, file);
  cj_key(&j, "profile");
  cj_cstr(&j, r->profile_name);
  cj_key(&j, "alloc_conf");
  cj_cstr(&j, r->conf ? r->conf : "");
  cj_key(&j, "mode");
  cj_cstr(&j, r->exact ? "exact" : "what-if");
  cj_key(&j, "replayable");
  cj_bool(&j, t->replayed);
  cj_key(&j, "matches_recording");
  if (t->replayed)
    cj_bool(&j, t->matches);
  else
    cj_null(&j);
  cj_key(&j, "fits");
  if (t->replayed)
    cj_bool(&j, t->oom_failed == 0);
  else
    cj_null(&j);
  cj_key(&j, "failed_allocs");
  cj_u64_or_null(&j, t->replayed, t->failed_allocs);
  cj_key(&j, "reason");
  if (t->replayed)
    cj_null(&j);
  else
    cj_cstr(&j, r->dr[0].reason[0] ? r->dr[0].reason : "not replayable");
  const struct {
    const char *key;
    uint64_t v;
  } totals[] = {{"segment_allocs", t->segment_allocs},
                {"segment_frees", t->segment_frees},
                {"peak_reserved_bytes", t->peak_reserved},
                {"final_reserved_bytes", t->final_reserved},
                {"inactive_split_bytes", t->inactive_split}};
  for (size_t k = 0; k < sizeof totals / sizeof totals[0]; k++) {
    cj_key(&j, totals[k].key);
    cj_u64_or_null(&j, t->replayed, totals[k].v);
  }
  cj_key(&j, "mismatches");
  cj_arr(&j);
  for (uint32_t k = 0; k < r->nd; k++)
    for (uint32_t i = 0; i < r->dr[k].nkept; i++)
      cj_cstr(&j, r->dr[k].mismatches[i]);
  cj_arr_end(&j);
  cj_output(&j, wrote);
  cj_key(&j, "devices");
  cj_arr(&j);
  for (uint32_t k = 0; k < r->nd; k++)
    json_dev(&j, &r->dr[k], r->exact);
  cj_arr_end(&j);
  cj_obj_end(&j);
  cj_end(&j);
}

static void print_device(const replay_t *r, const dev_replay_t *d) {
  char b1[32], b2[32];
  printf("\ndevice %" PRId64 ": ", d->device);
  if (!d->replayable) {
    printf("not replayable: %s\n", d->reason);
    return;
  }
  printf("%" PRIu64 " trace entr%s, start state %s (%u segment%s, %u "
         "live block%s",
         d->entries, d->entries == 1 ? "y" : "ies", d->initial,
         d->initial_segments, d->initial_segments == 1 ? "" : "s",
         d->initial_blocks, d->initial_blocks == 1 ? "" : "s");
  if (d->inferred_blocks)
    printf(", %u block %s inferred from requests", d->inferred_blocks,
           cli_plural(d->inferred_blocks, "size", "sizes"));
  printf(")\n");
  printf("  %-22s %15s %15s\n", "", "replay", "recording");
  printf("  %-22s %15" PRIu64 " %15" PRIu64 "\n", "segment allocs",
         d->segment_allocs, d->rec_segment_allocs);
  printf("  %-22s %15" PRIu64 " %15" PRIu64 "\n", "segment frees",
         d->segment_frees, d->rec_segment_frees);
  printf("  %-22s %15s %15s\n", "peak reserved",
         cli_bytes(d->peak_reserved, b1, sizeof b1),
         cli_bytes(d->rec_peak_reserved, b2, sizeof b2));
  printf("  %-22s %15s %15s\n", "final reserved",
         cli_bytes(d->final_reserved, b1, sizeof b1),
         cli_bytes(d->rec_final_reserved, b2, sizeof b2));
  printf("  %-22s %15s %15s\n", "inactive split (frag.)",
         cli_bytes(d->inactive_split, b1, sizeof b1),
         cli_bytes(d->rec_inactive_split, b2, sizeof b2));
  if (d->mismatch_count == 0 && r->exact && !d->final_compared)
    printf("  matches the recording: yes (every decision; the final layout "
           "was not compared: %s)\n", d->final_why);
  else if (d->mismatch_count == 0 && !r->exact &&
           d->rec_segment_allocs + d->rec_segment_frees == 0 &&
           d->segment_allocs + d->segment_frees == 0)
    /* (nothing to compare: not evidence that the other allocator would
     * decide as the recorded one) */
    printf("  matches the recording: yes, trivially (segment decisions: "
           "neither the\n  recording nor the replay opens or frees a "
           "segment; every request fit\n  the segments of the start "
           "state)\n");
  else if (d->mismatch_count == 0)
    printf("  matches the recording: yes%s\n",
           r->exact ? " (every decision and the final layout)"
                    : " (segment decisions)");
  else if (r->exact)
    printf("  matches the recording: no (%" PRIu64 " %s)\n",
           d->mismatch_count,
           cli_plural(d->mismatch_count, "mismatch", "mismatches"));
  else if (d->failed_allocs)
    printf("  differs from the recording in %" PRIu64 " %s, %" PRIu64
           " of them failed allocs (%s below)\n",
           d->mismatch_count,
           cli_plural(d->mismatch_count, "decision", "decisions"),
           d->failed_allocs,
           cli_plural(d->mismatch_count, "it is", "first ones"));
  else
    printf("  differs from the recording in %" PRIu64 " %s "
           "(expected for another allocator; %s below)\n",
           d->mismatch_count,
           cli_plural(d->mismatch_count, "decision", "decisions"),
           cli_plural(d->mismatch_count, "it is", "first ones"));
  if (d->failed_allocs && d->oom_failed == d->failed_allocs)
    printf("  does not fit: %" PRIu64 " %s failed in the replay (the first "
           "at entry %u: %s) on a simulated device of %s; the replay's "
           "figures count only the allocations that succeeded\n",
           d->failed_allocs, cli_plural(d->failed_allocs, "alloc", "allocs"),
           d->first_failed, msnap_strerror(d->first_failed_rc),
           cli_bytes(r->device_memory, b1, sizeof b1));
  else if (d->failed_allocs)
    /* not (only) a lack of memory: not called "does not fit" */
    printf("  %" PRIu64 " %s failed in the replay (the first at entry %u: "
           "%s), %" PRIu64 " of them for lack of memory on a simulated "
           "device of %s; the replay's figures count only the allocations "
           "that succeeded\n",
           d->failed_allocs, cli_plural(d->failed_allocs, "alloc", "allocs"),
           d->first_failed, msnap_strerror(d->first_failed_rc),
           d->oom_failed, cli_bytes(r->device_memory, b1, sizeof b1));
  for (uint32_t i = 0; i < d->nkept; i++)
    printf("    %s\n", d->mismatches[i]);
}

static void print_text(const replay_t *r, const char *file) {
  const char *conf = r->conf;
  printf("%s: replay with the %s profile%s%s%s%s%s (%s)\n",
         cli_shown(file), r->profile_name,
         r->profile_from_file ? " (the recording's: " : "",
         r->profile_from_file ? r->profile_why : "",
         r->profile_from_file ? ")" : "",
         conf && *conf ? ", alloc conf " : "", conf && *conf ? conf : "",
         r->exact ? "exact: recorded addresses" : "what-if");
  for (uint32_t k = 0; k < (r->nd ? r->nd : 1); k++)
    print_device(r, &r->dr[k]);
}

/* --alloc-conf refused by the allocator's own parser (msnap__conf_parse)
 * for the profile asked, or without --profile for both: true, with the
 * message of the usage error in why -- given before the file is read
 * (replay_init's check, at the allocator's creation, covers the rest). */
static bool conf_refused(const char *profile, const char *conf, char *why,
                         size_t n) {
  static const char *const names[2] = {"cuda", "npu"};
  char err[2][256] = {"", ""};
  int refused = 0;
  for (int k = 0; k < 2; k++) {
    if (profile && strcmp(profile, names[k]) != 0)
      continue;
    msnap_conf_t c;
    msnap__conf_init(&c, k ? MSNAP_PROFILE_NPU : MSNAP_PROFILE_CUDA);
    c.quiet = true; /* (the allocator's own parse warns, once) */
    if (msnap__conf_parse(&c, conf, err[k], sizeof err[k]) != 0) {
      refused |= 1 << k;
      if (!err[k][0])
        snprintf(err[k], sizeof err[k], "%s", msnap_strerror(MSNAP_ECONF));
    }
    msnap__conf_destroy(&c);
  }
  char e[2][256 + 16]; /* the reasons, "alloc conf: " off */
  for (int k = 0; k < 2; k++)
    replay_conf_reason(err[k], e[k], sizeof e[k]);
  if (profile)
    snprintf(why, n, "--alloc-conf is not valid for the %s profile: %s",
             profile, e[strcmp(profile, "npu") == 0]);
  else if (strcmp(e[0], e[1]) == 0)
    snprintf(why, n, "--alloc-conf is not valid for either profile: %s",
             e[0]);
  else
    snprintf(why, n, "--alloc-conf is not valid for either profile: %s "
             "(cuda); %s (npu)", e[0], e[1]);
  return profile ? refused != 0 : refused == 3;
}

int cli_cmd_replay(int argc, char **argv) {
  bool json = false;
  const char *profile = NULL, *conf = NULL, *out = NULL, *devmem_arg = NULL;
  long maxm = 10;
  uint64_t devmem = REPLAY_DEVICE_MEMORY;
  const cli_opt_t opts[] = {
      CLI_STRING("profile", 0, &profile),
      CLI_STRING("alloc-conf", 0, &conf),
      CLI_LONG("max-mismatches", 0, &maxm, 0, REPLAY_MAX_MISMATCHES,
               "--max-mismatches needs 0..64"),
      CLI_STRING("device-memory", 0, &devmem_arg),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"replay", usage, opts, 1, "expects exactly one FILE",
                         &json, &out, NULL, false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  if (profile && strcmp(profile, "cuda") && strcmp(profile, "npu"))
    return cli_usage_error("replay", "--profile must be cuda or npu");
  if (devmem_arg != NULL &&
      (!msnap__parse_size(devmem_arg, &devmem) || devmem < (2ull << 20) ||
       devmem > (1ull << 48)))
    return cli_usage_error("replay", "--device-memory needs 2M..256T bytes "
                                     "(a size such as 80G or 1.5T)");
  char why[1024];
  if (conf && conf_refused(profile, conf, why, sizeof why))
    return cli_usage_error("replay", why);
  const char *file = argv[first];
  msnap_snap_t *s;
  /* stacks only go to the replayed snapshot (-o): without it they are
   * not read, which is most of a big recording's model */
  if (cli_load_ex(file, &s, out == NULL) != CLI_OK) {
    if (json)
      cli_json_unusable(file, NULL);
    return CLI_UNUSABLE;
  }
  replay_t r;
  int rc = replay_init(&r, s, file, profile, conf, (uint32_t)maxm);
  r.device_memory = devmem;
  r.conf_given = conf != NULL;
  r.keep_history = out != NULL; /* the written snapshot's trace */
  if (rc == CLI_OK) rc = replay_run(&r);
  if (r.conf_invalid) rc = cli_usage_error("replay", r.why);
  if (rc == CLI_OK) {
    const char *wrote = NULL;
    replay_totals_t t;
    replay_totals(&r, &t);
    /* Nothing replayed (exit 2 below): no replayed snapshot to write, and
     * an existing OUT stays as it was. */
    if (out && r.a && t.replayed) {
      rc = replay_write(&r, out);
      if (rc == CLI_OK) wrote = out;
    }
    if (json)
      print_json(&r, &t, file, wrote);
    else
      print_text(&r, file);
    if (rc == CLI_OK && !t.replayed) {
      rc = CLI_UNUSABLE;
      /* The text report above already gave each device's reason. */
      if (json)
        cli_err("%s: not replayable: %s", file,
                r.dr[0].reason[0] ? r.dr[0].reason : "no device history");
      else
        cli_err("%s: not replayable (reason above)", file);
    } else if (rc == CLI_OK && ((!t.matches && r.exact) || t.failed_allocs)) {
      rc = CLI_FINDING;
    }
  }
  replay_free(&r);
  msnap__snap_free(s);
  return rc;
}
