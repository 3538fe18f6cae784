#!/usr/bin/env bash
# run.sh BUILD_DIR SECONDS -- run every libFuzzer target of BUILD_DIR
# (built with -Dfuzz=true) for SECONDS each, one after the other.
#
# Each target starts from its committed corpus tests/corpus/<target>/ and
# grows a working corpus in fuzz-out/<target>/corpus (not committed).  When
# a target crashes, times out or runs out of memory, the input is copied to
# tests/corpus/<target>/ (a regression file that `make test` replays from
# then on) and the run fails, naming the file.  Prints one line per target.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/fuzz-out"
mkdir -p "$out"

shopt -s nullglob
targets=("$build"/tests/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
  echo "run.sh: no fuzz targets in $build/tests/fuzz (set up with -Dfuzz=true)" >&2
  exit 1
fi

failed=0
passed=0
for bin in "${targets[@]}"; do
  [ -f "$bin" ] && [ -x "$bin" ] || continue
  name=$(basename "$bin")
  target=${name#fuzz_}
  seeds="$root/tests/corpus/$target"
  work="$out/$target/corpus"
  crashes="$out/$target/crashes"
  mkdir -p "$work" "$crashes"
  rm -f "$crashes"/*
  log="$out/$target/fuzz.log"
  echo "fuzz: $target for ${seconds}s (log $log)"
  start=$(date +%s)
  "$bin" "$work" "$seeds" -max_total_time="$seconds" -timeout=20 \
    -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$crashes/" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  found=("$crashes"/*)
  if [ $rc -ne 0 ] || [ ${#found[@]} -ne 0 ]; then
    failed=$((failed + 1))
    echo "fuzz: $target FAILED (exit $rc) after $((end - start))s:"
    tail -40 "$log"
    for f in "${found[@]}"; do
      dest="$seeds/$(basename "$f")"
      cp "$f" "$dest"
      echo "fuzz: $target: input kept as regression file $dest" \
           "(fix the bug, then commit it)"
    done
  else
    passed=$((passed + 1))
    echo "fuzz: $target ok: ${execs:-?} inputs in $((end - start))s," \
         "corpus $(ls "$work" | wc -l) files"
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ $failed -eq 0 ]
