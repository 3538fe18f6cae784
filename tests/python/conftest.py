"""Shared helpers of the memsnap Python tests.

The tests import the INSTALLED package (``make build`` installs it into
.venv).  Work that needs a fresh process-wide allocator (its runtime,
profile and sim memory come from the environment when it is created) runs
in a subprocess through :func:`run_script`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest

import memsnap
from memsnap import _memsnap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The build whose test programs and stand-ins (tests/runtime's fake
# libascendcl.so, tools/memsnap) match this interpreter's architecture:
# build/ by default; build-aarch64/ for the aarch64 wheel's run under qemu
# (packaging/test-wheel-aarch64.sh).
BUILD = os.environ.get("MEMSNAP_BUILD_DIR") or os.path.join(ROOT, "build")
# Cross runs (make test-aarch64) start aarch64 programs through this.
EXE_WRAPPER = shlex.split(os.environ.get("MEMSNAP_EXE_WRAPPER", ""))

# For tests whose scripts import torch (the torch-free venvs of
# make test-pythons and make test-aarch64 have none).
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="SKIP: torch is not installed in this interpreter's environment")


# A script prologue: a 5 MiB block `keep`, then a 1 MiB workspace buffer
# `w` of stream 7 (torch_npu's NPUWorkspaceAllocator, msnap_workspace_malloc
# through ctypes on the default allocator), history not yet on.
WORKSPACE_SETUP = r"""
import ctypes, glob, json, os
import memsnap, memsnap.memory as mm
lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(memsnap.__file__),
                                         "libmemsnap*.so*"))[0])
lib.msnap_default.restype = ctypes.c_void_p
lib.msnap_workspace_malloc.argtypes = [ctypes.c_void_p, ctypes.c_int,
    ctypes.c_size_t, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
keep = mm.caching_allocator_alloc(5 << 20)
w = ctypes.c_uint64()
assert lib.msnap_workspace_malloc(lib.msnap_default(), 0, 1 << 20, 7,
                                  ctypes.byref(w)) == 0
"""


def base_env(**extra: str) -> dict:
    """A clean environment for a subprocess: no inherited memsnap/torch
    allocator settings or distributed rank, sim runtime, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMSNAP_", "PYTORCH_", "OOM_SNAPSHOT"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["MEMSNAP_RUNTIME"] = "sim"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_script(code: str, env: dict | None = None, cwd: str | None = None,
               check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run `code` with this interpreter; a line `RESULT <json>` printed by
    the script is parsed into `.result`."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env if env is not None else base_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"script failed ({proc.returncode}):\n--- stdout\n{proc.stdout}"
            f"\n--- stderr\n{proc.stderr}"
        )
    proc.result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            proc.result = json.loads(line[len("RESULT "):])
    return proc


def memsnap_cli() -> str:
    """The installed `memsnap` command (next to this interpreter)."""
    exe = os.path.join(os.path.dirname(sys.executable), "memsnap")
    if not os.path.exists(exe):
        pytest.fail(f"the memsnap CLI is not installed at {exe} (make build)")
    return exe


def memsnap_cli_cmd() -> list:
    """The installed CLI as a command line (through EXE_WRAPPER if any)."""
    return [*EXE_WRAPPER, memsnap_cli()]


def run_cli(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run the installed CLI; .json holds stdout parsed when it is JSON."""
    proc = subprocess.run([*memsnap_cli_cmd(), *map(str, args)], cwd=cwd,
                          env=base_env(), capture_output=True, text=True,
                          timeout=timeout)
    proc.json = None
    if proc.stdout.lstrip().startswith("{"):
        proc.json = json.loads(proc.stdout)
    return proc


@pytest.fixture
def lib():
    return _memsnap
