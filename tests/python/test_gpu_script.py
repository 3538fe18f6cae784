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
