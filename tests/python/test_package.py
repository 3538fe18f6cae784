"""The installed layout (make build): the extension and libmemsnap.so in
site-packages/memsnap/, the memsnap CLI in the environment's bin/."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import memsnap
from memsnap import _memsnap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_extension_and_library_side_by_side():
    pkg = os.path.dirname(memsnap.__file__)
    assert os.path.dirname(_memsnap.__file__) == pkg
    assert os.path.exists(os.path.join(pkg, "libmemsnap.so"))
    assert os.path.exists(os.path.join(pkg, "_memsnap.pyi"))


def _cli():
    return os.path.join(os.path.dirname(sys.executable), "memsnap")


# Cross runs (make test-aarch64) start the aarch64 CLI through this wrapper.
WRAPPER = os.environ.get("MEMSNAP_EXE_WRAPPER", "").split()


def test_one_version_everywhere():
    """meson.build's project() version is the one source: the wheel's
    metadata, memsnap.__version__ and `memsnap --version` all say it."""
    import importlib.metadata

    m = re.search(r"version\s*:\s*'([^']+)'", open(os.path.join(ROOT, "meson.build")).read())
    assert m, "no project() version in meson.build"
    version = m.group(1)
    assert importlib.metadata.version("memsnap") == version
    assert memsnap.__version__ == version
    p = subprocess.run(WRAPPER + [_cli(), "--version"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"memsnap {version}\n"


def test_module_uses_the_installed_library():
    maps = open("/proc/self/maps").read()
    libs = set(re.findall(r"\S*libmemsnap\.so\S*", maps))
    assert libs == {memsnap.library_path()}


def test_cli_installed_in_environment():
    tools = open(os.path.join(ROOT, "tools", "meson.build")).read()
    if "executable(" not in tools:
        pytest.skip("tools/meson.build builds no CLI yet (the cli branch is not merged)")
    cli = _cli()
    assert os.path.exists(cli), "memsnap CLI not installed next to the interpreter"
    p = subprocess.run(WRAPPER + [cli, "--help"], capture_output=True, text=True)
    assert p.returncode == 0


def test_multi_phase_init_state_is_per_module():
    # A second instance of the module (e.g. a subinterpreter or a reload)
    # gets its own exception type and state.
    import importlib.util

    spec = importlib.util.find_spec("memsnap._memsnap")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    assert other.OutOfMemoryError is not _memsnap.OutOfMemoryError
    assert issubclass(other.OutOfMemoryError, MemoryError)
