/*
 * replay.h -- the replay engine (replay.c): a recording's alloc/free
 * stream run through memsnap's allocator on the simulated device, device
 * by device, with every decision compared with the recording.  `memsnap
 * replay` (cmd_replay.c) parses the command line and reports; the engine
 * knows nothing of either.
 */
#ifndef MSNAP_REPLAY_H
#define MSNAP_REPLAY_H

#include "cli.h"

#define REPLAY_MAX_MISMATCHES 64

/* One device of the recording. */
typedef struct dev_replay_s {
  int64_t device;
  bool replayable;
  char reason[512];
  const char *initial; /* "empty", "exact", "inferred", "approximate" */
  uint32_t initial_segments, initial_blocks, inferred_blocks;
  /* results */
  uint64_t segment_allocs, segment_frees;
  uint64_t peak_reserved, final_reserved;
  uint64_t inactive_split, peak_inactive_split;
  uint64_t peak_allocated, final_allocated;
  uint64_t mismatch_count;
  uint32_t first_failed; /* first alloc entry that failed in the replay,
                            or CLI_NO_PAIR */
  int first_failed_rc;   /* its MSNAP_E* code */
  uint64_t failed_allocs; /* alloc entries that failed in the replay (each
                             also a mismatch) */
  uint64_t oom_failed;    /* those that failed for lack of memory
                             (MSNAP_EOOM, MSNAP_EREJECTED) */
  long violations;       /* > 0: not replayable, the trace is inconsistent
                            with the final state (cli_backward's count) */
  uint64_t *ws;          /* torch_npu's workspace segments (their
                            workspace_snapshot entries' addresses), sorted */
  uint32_t nws;
  bool stopped;          /* the visitor stopped the replay early */
  char *mismatches[REPLAY_MAX_MISMATCHES];
  uint32_t nkept;
  bool final_compared;
  char final_why[128]; /* why the final layout was not compared ("" if
                          it was) */
  /* the recording's own figures */
  uint64_t rec_segment_allocs, rec_segment_frees;
  uint64_t rec_peak_reserved, rec_final_reserved;
  uint64_t rec_inactive_split; /* inactive blocks of split segments */
  uint64_t entries;
  /* The state at the first entry, from the replayability check's
   * backward replay (cli_backward), kept for the replay itself. */
  cli_state_t start;
  bool have_start;
} dev_replay_t;

/* Bytes per simulated device unless --device-memory says otherwise: more
 * than any recording needs, so that only the allocator decides. */
#define REPLAY_DEVICE_MEMORY (1ull << 40)

typedef struct replay_s {
  const msnap_snap_t *s;
  const char *file; /* for messages (NULL: none) */
  msnap_allocator_t *a;
  void *ctx;
  bool exact;
  msnap_profile_t profile;
  const char *profile_name; /* "cuda" or "npu" */
  bool profile_from_file;   /* the recording's (cli_recording_profile) */
  const char *profile_why;  /* then: what told it (static text) */
  const char *conf;         /* alloc conf of the replay ("" for none) */
  /* bytes the profile adds before rounding: the replay allocator's own
   * (torch_npu AddPadSize: 32, or 0 on an Ascend950 with CANN >= 9.1.0
   * as the sim reports through MEMSNAP_SIM_SOC_NAME / _CANN_VERSION) */
  uint64_t pad;
  uint64_t device_memory; /* bytes per simulated device (--device-memory) */
  uint32_t max_keep;
  /* Set between replay_init and replay_run (cli_replay_run): only this
   * device is replayed (-1: every device); the visitor is called in every
   * state of its trace (cli.h); quiet: failures only go to `why`. */
  int64_t only_device;
  cli_replay_visit_fn visit;
  void *visit_arg;
  bool quiet;
  /* record the replay's history (context "never", no stacks): needed only
   * for replay_write's trace; off by default, which saves a ring entry
   * and a clock read per call (cmd_replay sets it for -o) */
  bool keep_history;
  char why[512]; /* why replay_init / replay_run failed */
  /* the alloc conf is the user's (--alloc-conf: cmd_replay sets it), and
   * replay_run found it invalid: not printed, `why` holds the reason,
   * for a usage error */
  bool conf_given, conf_invalid;
  bool nomem;    /* ... for want of memory */
  /* every device with segments or a trace (dr[0] exists even when nd is
   * 0, holding the reason) */
  int64_t *devs;
  dev_replay_t *dr;
  uint32_t nd;
} replay_t;

/* Sums over the replayed devices. */
typedef struct replay_totals_s {
  bool replayed; /* at least one device was replayed */
  bool matches;  /* no replayed device had a mismatch */
  uint64_t failed_allocs; /* allocs that failed in the replay, all devices */
  uint64_t oom_failed;    /* those that failed for lack of memory */
  uint64_t segment_allocs, segment_frees, peak_reserved, final_reserved;
  uint64_t inactive_split;
} replay_totals_t;

/* Settle the profile and the conf for recording s: profile NULL means the
 * profile the recording was made with (cli_recording_profile: its
 * process_info's, else npu when its allocator_settings name
 * PYTORCH_NPU_ALLOC_CONF, else cuda); "exact" mode is that profile without
 * a conf (the recording's own PYTORCH_CUDA_ALLOC_CONF, or
 * PYTORCH_NPU_ALLOC_CONF for npu, then applies).  Decides
 * which devices are replayable.  CLI_OK, or CLI_UNUSABLE (message
 * printed). */
int replay_init(replay_t *r, const msnap_snap_t *s, const char *file,
                const char *profile, const char *conf, uint32_t max_keep);
/* Create the sim allocator and replay every replayable device.  CLI_OK,
 * or CLI_UNUSABLE (message printed). */
int replay_run(replay_t *r);
/* Write the replayed allocator's snapshot to out (pickle), as faithful to
 * the recording as the replay allows: the recording's stacks and times
 * where they match (no time_us at all when the recording has none), the
 * recording's requested_size for its live blocks, and a process_info
 * naming the recording's process with replayed: true.  CLI_OK or
 * CLI_UNUSABLE (message printed). */
int replay_write(replay_t *r, const char *out);
void replay_totals(const replay_t *r, replay_totals_t *t);
/* The reason the allocator's parser gave for refusing an --alloc-conf
 * (msg; "alloc conf: " off) into out, n bytes: its hint for an NPU key,
 * "it needs MEMSNAP_PROFILE=npu", names replay's own option, --profile
 * npu (replay sets the profile itself and does not read
 * MEMSNAP_PROFILE). */
void replay_conf_reason(const char *msg, char *out, size_t n);
void replay_free(replay_t *r);

#endif /* MSNAP_REPLAY_H */
