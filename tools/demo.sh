#!/bin/sh
# demo.sh -- the main job (`make demo`): replay a real PyTorch recording
# through memsnap's allocator with the CUDA profile (must match the
# recording) and with the NPU profile (shows the difference), and write
# the replayed snapshot, its summary and HTML views into demo-out/.
#
# The CLI is `memsnap` on PATH (make demo puts .venv/bin first), or
# $MEMSNAP, or a build directory's tools/memsnap.  Without the shared
# folder of real inputs, a snapshot is recorded live from the built-in
# simulated training loop (memsnap demo-train) and used instead.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ -n "${MEMSNAP:-}" ]; then
  M=$MEMSNAP
elif command -v memsnap >/dev/null 2>&1; then
  M=memsnap
else
  M=
  for b in build build-*; do
    if [ -x "$b/tools/memsnap" ]; then M=$root/$b/tools/memsnap; break; fi
  done
  if [ -z "$M" ]; then
    echo "demo: no memsnap binary: run 'make build' first" >&2
    exit 2
  fi
fi

out=demo-out
mkdir -p "$out"
shared=${SHARED:-../shared}
input=$shared/real_inputs/cranberrii_ftcourse__memory_snapshot.pickle

echo "== memsnap demo (CLI: $M)"
if [ -f "$input" ]; then
  echo "input: $input"
  echo "       (a real recording: PyTorch 2.1, fine-tuning run, 215 segments,"
  echo "        10307 trace entries; the trace began with 63 segments in use)"
else
  echo "NOTE: $shared/real_inputs is missing: recording a snapshot live from"
  echo "      memsnap's built-in simulated training loop instead."
  input=$out/live_training.pickle
  "$M" demo-train -o "$input"
fi

echo
echo "== check"
"$M" check --max-lines 20 "$input" || echo "(check reported findings above)"

echo
echo "== replay with the CUDA profile (exact: recorded addresses)"
set +e
"$M" replay --profile cuda -o "$out/replay_cuda.pickle" "$input"
rc_cuda=$?
"$M" replay --json --profile cuda "$input" > "$out/replay_cuda.json"
set -e

echo
echo "== replay with the NPU profile (what-if: torch_npu's allocator)"
set +e
"$M" replay --profile npu --max-mismatches 4 -o "$out/replay_npu.pickle" \
  "$input"
rc_npu=$?
"$M" replay --json --profile npu "$input" > "$out/replay_npu.json"
set -e

echo
echo "== what-if: CUDA with expandable_segments:True"
"$M" replay --profile cuda --alloc-conf expandable_segments:True \
  --max-mismatches 2 "$input" \
  || echo "(expandable what-if not available: see the message above)"
"$M" replay --json --profile cuda --alloc-conf expandable_segments:True \
  "$input" > "$out/replay_expandable.json" || true

# A top-level figure of a replay --json file (two-space indented keys).
fig() {
  sed -n "s/^  \"$2\": \([0-9a-z]*\).*/\1/p" "$1" | head -n 1
}
echo
echo "== the same recording under three allocators"
printf '%-30s %16s %16s %9s\n' allocator "peak reserved" "segment allocs" matches
for k in cuda npu expandable; do
  f=$out/replay_$k.json
  [ -s "$f" ] || continue
  case $k in
    cuda) label="cuda (= the recording)";;
    npu) label="npu (torch_npu allocator)";;
    *) label="cuda + expandable_segments";;
  esac
  printf '%-30s %16s %16s %9s\n' "$label" "$(fig "$f" peak_reserved_bytes)" \
    "$(fig "$f" segment_allocs)" "$(fig "$f" matches_recording)"
done

if [ -f "$out/replay_cuda.pickle" ]; then
  "$M" summary "$out/replay_cuda.pickle" > "$out/replay_cuda_summary.txt"
  "$M" summary --json "$out/replay_cuda.pickle" \
    > "$out/replay_cuda_summary.json"
  "$M" view "$out/replay_cuda.pickle" -o "$out/replay_cuda.html"
fi
"$M" summary "$input" > "$out/recording_summary.txt"
"$M" view "$input" -o "$out/recording.html"
"$M" plot "$input" -o "$out/recording_timeline.svg"

echo
echo "== summary of the recording"
sed -n '1,40p' "$out/recording_summary.txt"

echo
echo "== outputs in $root/$out/"
ls -l "$out"
echo
echo "Open $root/$out/replay_cuda.html (replayed) or recording.html"
echo "in a browser."
if [ "$rc_cuda" -ne 0 ]; then
  echo "demo: the CUDA-profile replay did not match the recording" \
    "(exit $rc_cuda)" >&2
  exit 1
fi
if [ "$rc_npu" -gt 1 ]; then
  echo "demo: the NPU replay failed (exit $rc_npu)" >&2
  exit 1
fi
echo "demo: CUDA replay matches the recording."
