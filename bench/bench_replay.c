/*
 * bench_replay.c -- row 5: replay throughput, split into its parts.  The
 * same code as `memsnap replay FILE` (tools/replay.c, the engine, and the
 * CLI's loader cli_load_ex), timed in one process, rounds interleaved:
 *
 *   read     cli_load_ex as `memsnap replay` without -o calls it: the
 *            pickle read into the snapshot model, stacks skipped
 *            (msnap_read_stats_t.skip_stacks), and the model check (the
 *            reader's part, src/model);
 *   engine   replay_init + replay_run: the replayability check (backward
 *            replay of the trace over the final state), carving the start
 *            state, then every alloc/free through memsnap's allocator on
 *            the sim, each decision compared with the recording.
 *
 * The end-to-end figure (the `memsnap replay` process, start-up and report
 * included) is the runner's (bench/run.py), interleaved with these rounds.
 * Prints RESULT lines: events (alloc/free/segment entries of the
 * replayed devices), medians over the rounds of each part's wall seconds
 * and of its thread CPU seconds (the machine may be shared).
 *
 * usage: bench_replay FILE [ROUNDS]
 */
#include "bench_common.h"
#include "api/api.h"
#include "cli.h"
#include "replay.h"

#define MAX_ROUNDS 64

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [ROUNDS]\n", argv[0]);
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 5;
  double tr[MAX_ROUNDS], te[MAX_ROUNDS], cr[MAX_ROUNDS], ce[MAX_ROUNDS];
  uint64_t events = 0;
  bool matches = false;
  for (int r = 0; r < rounds; r++) {
    msnap_snap_t *s = NULL;
    uint64_t c0 = bench_cpu_ns(), t0 = bench_now_ns();
    if (cli_load_ex(argv[1], &s, true) != CLI_OK) return 1; /* as replay */
    uint64_t c1 = bench_cpu_ns(), t1 = bench_now_ns();
    replay_t rp;
    memset(&rp, 0, sizeof rp);
    if (replay_init(&rp, s, argv[1], NULL, NULL, 8) != CLI_OK ||
        replay_run(&rp) != CLI_OK)
      return 1;
    uint64_t c2 = bench_cpu_ns(), t2 = bench_now_ns();
    replay_totals_t tot;
    replay_totals(&rp, &tot);
    events = 0;
    for (uint32_t k = 0; k < rp.nd; k++)
      if (rp.dr[k].replayable) events += rp.dr[k].entries;
    matches = tot.matches;
    replay_free(&rp);
    msnap__snap_free(s);
    tr[r] = (double)(t1 - t0) / 1e9;
    te[r] = (double)(t2 - t1) / 1e9;
    cr[r] = (double)(c1 - c0) / 1e9;
    ce[r] = (double)(c2 - c1) / 1e9;
  }
  BENCH_RESULT("events", "%llu", (unsigned long long)events);
  BENCH_RESULT("matches", "%d", matches ? 1 : 0);
  BENCH_RESULT("read_s", "%.6f", bench_median(tr, rounds));
  BENCH_RESULT("engine_s", "%.6f", bench_median(te, rounds));
  BENCH_RESULT("read_cpu_s", "%.6f", bench_median(cr, rounds));
  BENCH_RESULT("engine_cpu_s", "%.6f", bench_median(ce, rounds));
  return 0;
}
