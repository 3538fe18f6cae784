#!/usr/bin/env bash
# packaging/test-wheel-aarch64.sh -- the aarch64 wheel on (emulated) aarch64,
# the last step of `make test-aarch64` (after packaging/wheels.sh aarch64).
#
# A venv of Debian's arm64 CPython 3.11 (build-wheels/arm64-root, run by
# qemu-user) installs dist/memsnap-V-cp311-cp311-manylinux_2_28_aarch64.whl
# with --no-index, and pytest>=7 (pure Python) from the index; no torch.
# Then, all under qemu:
#   - memsnap --version, import memsnap.memory, a dump that memsnap check
#     passes (the wheel's CLI);
#   - tests/python with that interpreter: the torch tests skip (no torch),
#     every other test runs;
#   - tests/cli/test_cli.py, every group of tests/cli/meson.build, against
#     the wheel's CLI (exit 77 = SKIP, as under meson).  The harness is
#     this machine's Python ($PYTHON, as meson runs it): only the CLI runs
#     under qemu, and the harness's own checks (pickle loads of the real
#     inputs, the fragmentation walks) run at native speed.
# The aarch64 programs are started through MEMSNAP_EXE_WRAPPER (the kernel
# here runs no aarch64 binary by itself); sys.executable is a script that
# starts qemu, so the tests' subprocesses of Python run under qemu too.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
W=$top/build-wheels
ROOT=$W/arm64-root
VERSION=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1)
whl=$top/dist/memsnap-$VERSION-cp311-cp311-manylinux_2_28_aarch64.whl
[ -f "$whl" ] || { echo "test-wheel-aarch64: no $whl (packaging/wheels.sh aarch64)" >&2; exit 1; }
WRAP=$ROOT/usr/bin/aarch64-run  # packaging/arm64-python.sh
v=$W/venv-aarch64
fail=0

echo "test-wheel-aarch64: venv of Debian's arm64 python3.11 under qemu-user"
rm -rf "$v"
"$ROOT/usr/bin/python3.11-qemu" -m venv "$v"
"$v/bin/python" -m pip install -q --no-index "$whl"
"$v/bin/python" -m pip install -q "pytest>=7"
"$v/bin/python" -c 'import platform, sys; print("  python", platform.python_version(), platform.machine(), sys.executable)'

t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
out=$(cd "$t" && $WRAP "$v/bin/memsnap" --version)
[ "$out" = "memsnap $VERSION" ] || { echo "FAIL memsnap --version: '$out'"; exit 1; }
(cd "$t" && "$v/bin/python" - <<'EOF'
import importlib.metadata as md
import memsnap, memsnap.memory as mm
assert memsnap.__version__ == md.version("memsnap"), (memsnap.__version__, md.version("memsnap"))
mm._record_memory_history("all", stacks="python")
p = mm.caching_allocator_alloc(1 << 20)
mm._dump_snapshot("snap.pickle")
mm.caching_allocator_delete(p)
EOF
)
(cd "$t" && $WRAP "$v/bin/memsnap" check snap.pickle >/dev/null)
echo "test-wheel-aarch64: $out; import memsnap.memory; dump passes memsnap check"

echo "test-wheel-aarch64: tests/python (no torch in this venv: the torch tests skip)"
(cd tests/python && MEMSNAP_EXE_WRAPPER="$WRAP" CC=aarch64-linux-gnu-gcc \
   MEMSNAP_BUILD_DIR="$top/build-aarch64" \
   MEMSNAP_SOURCE_ROOT="$top" \
   "$v/bin/python" -m pytest -q -ra -p no:cacheprovider .) || fail=1

# The groups meson runs (tests/cli/meson.build), with the wheel's CLI.
groups=$(python3 -c 'import re,sys; s=open(sys.argv[1]).read(); print(" ".join(re.findall(r"\x27(\w+)\x27", re.search(r"foreach g : \[(.*?)\]", s, re.S).group(1))))' tests/cli/meson.build)
[ -n "$groups" ] || { echo "no CLI test groups found"; exit 1; }
passed=0 skipped=0 failed=0
for g in $groups; do
  rc=0
  MEMSNAP_EXE_WRAPPER="$WRAP" MEMSNAP_SOURCE_ROOT="$top" \
    MEMSNAP_REAL_INPUTS="$top/../shared/real_inputs" \
    "${PYTHON:-python3}" tests/cli/test_cli.py "$v/bin/memsnap" "$g" >"$W/cli-$g.log" 2>&1 || rc=$?
  case $rc in
    0) passed=$((passed + 1)); echo "  cli-$g ok" ;;
    77) skipped=$((skipped + 1)); echo "  cli-$g SKIP: $(grep -m1 '^SKIP' "$W/cli-$g.log")" ;;
    *) failed=$((failed + 1)); fail=1; echo "  cli-$g FAILED (rc $rc):"; grep -E '^FAIL|Error|error' "$W/cli-$g.log" | head -20 ;;
  esac
done
echo "test-wheel-aarch64: CLI tests: $passed passed, $failed failed, $skipped skipped"
exit $fail
