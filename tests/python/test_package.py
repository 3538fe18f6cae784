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
    assert memsnap.__version__ == "0.1.0"


def test_module_uses_the_installed_library():
    maps = open("/proc/self/maps").read()
    libs = set(re.findall(r"\S*libmemsnap\.so\S*", maps))
    assert libs == {memsnap.library_path()}


def test_cli_installed_in_environment():
    tools = open(os.path.join(ROOT, "tools", "meson.build")).read()
    if "executable(" not in tools:
        pytest.skip("tools/meson.build builds no CLI yet (the cli branch is not merged)")
    cli = os.path.join(os.path.dirname(sys.executable), "memsnap")
    assert os.path.exists(cli), "memsnap CLI not installed next to the interpreter"
    p = subprocess.run([cli, "--help"], capture_output=True, text=True)
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
