#!/usr/bin/env bash
# packaging/arm64-python.sh ROOT -- Debian's arm64 CPython 3.11, unpacked
# into ROOT and run under qemu-user: the target interpreter of the aarch64
# wheel build (meson asks it for the extension suffix and the include
# directory) and of the aarch64 wheel's tests.
#
# Debian's python3.11-minimal is Multi-Arch: allowed, so python3.11:arm64
# cannot be installed beside the amd64 one: the packages are fetched with
# `apt-get download` (versions of the apt lists in force) and unpacked with
# `dpkg-deb -x`, nothing installed.  ROOT then holds /lib/ld-linux-aarch64.so.1,
# the libraries the stdlib's extension modules need, the stdlib, ensurepip's
# wheels and the headers of libpython3.11-dev (only Python's: no libc
# headers, so ROOT/usr/include can go on a cross compiler's include path).
#
# ROOT/usr/bin/python3.11-qemu runs it: qemu-aarch64 starts ROOT's own
# ld.so, which loads ROOT/usr/bin/python3.11 with ROOT's libraries first
# (--library-path) and argv[0] kept as the path the script was called by,
# so that sys.executable is that script (a subprocess of the tests starts
# qemu again) and a venv made from it finds its pyvenv.cfg; the stdlib is
# found from the script's own folder (ROOT/usr/lib/python3.11).
# ROOT/usr/bin/aarch64-run PROGRAM ARGS runs any aarch64 program that way.
# Not `qemu-aarch64 -L ROOT`: that prefix makes every absolute path the
# guest names resolve under ROOT first, "/" included, so a program that
# walks a path from "/" (memsnap's output writer does, component by
# component) finds ROOT's tree instead of the real one.
# Idempotent: ROOT/.complete marks a fetched root (the two scripts are
# written every time).
set -euo pipefail
root=${1:?usage: arm64-python.sh ROOT}

write_runners() {
  local libs="$root/lib/aarch64-linux-gnu:$root/usr/lib/aarch64-linux-gnu"
  cat > "$root/usr/bin/aarch64-run" <<EOF
#!/bin/sh
exec qemu-aarch64 "$root/lib/ld-linux-aarch64.so.1" --library-path "$libs" "\$@"
EOF
  cat > "$root/usr/bin/python3.11-qemu" <<EOF
#!/bin/sh
exec qemu-aarch64 "$root/lib/ld-linux-aarch64.so.1" --library-path "$libs" --argv0 "\$0" "$root/usr/bin/python3.11" "\$@"
EOF
  chmod +x "$root/usr/bin/aarch64-run" "$root/usr/bin/python3.11-qemu"
}
if [ -f "$root/.complete" ]; then write_runners; exit 0; fi

# CPython 3.11's own packages and what their binaries and lib-dynload/*.so
# link (apt-cache depends libpython3.11-stdlib:arm64 and friends).
pkgs=(
  python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11
  libpython3.11-dev python3.11-venv
  libc6 libgcc-s1 libcrypt1 zlib1g libffi8 libssl3 libexpat1 libbz2-1.0
  liblzma5 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1
  libdb5.3 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3
  libkrb5support0 libkeyutils1 libcom-err2
)
arch_all=(python3-pip-whl python3-setuptools-whl)

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "arm64-python: the arm64 Debian architecture is not enabled (make deps-aarch64)" >&2
  exit 1
fi
debs="$root.debs"
rm -rf "$root" "$debs"
mkdir -p "$root" "$debs"
echo "arm64-python: fetching Debian's arm64 python3.11 into $root"
# apt-get download writes into the current folder.  As root, apt's
# sandbox user cannot write there: download as root (a warning otherwise).
( cd "$debs" && apt-get download -q -o APT::Sandbox::User=root \
    "${pkgs[@]/%/:arm64}" "${arch_all[@]}" >/dev/null ) || {
  echo "arm64-python: apt-get download failed (run apt-get update first?)" >&2
  exit 1; }
for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
# Nothing but Python's headers under usr/include (see above).
extra=$(cd "$root/usr/include" && ls | grep -vx -e python3.11 -e aarch64-linux-gnu || true)
if [ -n "$extra" ] || [ "$(ls "$root/usr/include/aarch64-linux-gnu")" != python3.11 ]; then
  echo "arm64-python: unexpected headers in $root/usr/include: $extra" >&2
  exit 1
fi
write_runners
"$root/usr/bin/python3.11-qemu" -c \
  'import platform, ssl, sqlite3, ctypes, venv; print("arm64-python:", platform.machine(), platform.python_version())'
rm -rf "$debs"
touch "$root/.complete"
