"""CPU-safe parts of bench/gpu/side_by_side.py (the GPU run needs CUDA)."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu", "side_by_side.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_check_mode_reports_environment():
    r = run("--check")
    assert r.returncode == 0, r.stderr
    assert "arguments ok" in r.stdout


def test_bad_arguments_are_refused():
    for bad, msg in [(["--steps", "1"], "--steps must be >= 2"),
                     (["--warmup", "-1"], "--warmup must be >= 0"),
                     (["--d-model", "100"], "multiple of 8")]:
        r = run("--check", *bad)
        assert r.returncode == 2
        assert msg in r.stderr


def test_without_cuda_the_comparison_refuses_to_run():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        return  # the real comparison is exercised by hand on a GPU machine
    r = run("--steps", "2")
    assert r.returncode == 2
    assert "no CUDA device" in r.stderr


def _module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("side_by_side", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_mode_lists_the_gpu_checks():
    r = run("--check")
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("checks: ")][0]
    assert line.split(": ")[1].split(", ") == ["oom", "empty_cache", "record_stream",
                                               "memory_allocated"]


def test_checks_table_reports_each_check():
    mod = _module()
    r = {"mode": "checks", "checks": {"oom": True, "empty_cache": True,
                                      "record_stream": False, "memory_allocated": True,
                                      "oom_message": "CUDA out of memory. Tried to allocate 160.00 GiB"}}
    text = mod.checks_table(r)
    rows = {l.split(" | ")[0].strip("| "): l.split(" | ")[1] for l in text.splitlines()
            if l.startswith("| ") and not l.startswith("| check")}
    assert rows == {"oom": "pass", "empty_cache": "pass", "record_stream": "FAIL",
                    "memory_allocated": "pass"}
    assert "OOM message: `CUDA out of memory. Tried to allocate 160.00 GiB`" in text
    assert mod.checks_table({"mode": "checks", "error": "x\nRuntimeError: boom"}) == \
        "checks: error: RuntimeError: boom"


def test_checks_child_refuses_without_cuda():
    """The checks child needs CUDA; on the CPU torch it fails with torch's
    own refusal from use_allocator, never silently."""
    import torch
    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, SCRIPT, "--child", "checks"], capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "without CUDA" in r.stderr
