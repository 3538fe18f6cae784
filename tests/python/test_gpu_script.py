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


# ---- bench/gpu/ground_truth.py (issue 16): the CPU-safe parts -------------

import importlib.util
import json as _json
import shutil as _shutil

GT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu", "ground_truth.py")
GT_CLI = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "memsnap")


def gt(*args, **kw):
    return subprocess.run([sys.executable, GT, *args], capture_output=True, text=True, **kw)


def gt_module():
    spec = importlib.util.spec_from_file_location("ground_truth", GT)
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
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, SCRIPT, "--child", "checks"], capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "without CUDA" in r.stderr


def need_cli():
    import pytest
    if not os.path.exists(GT_CLI):
        pytest.skip(f"SKIP: {GT_CLI} is missing (make build)")


def test_ground_truth_check_lists_eight_or_more_configurations():
    need_cli()
    r = gt("--check")
    assert r.returncode == 0, r.stderr
    assert "arguments ok" in r.stdout
    mod = gt_module()
    assert len(mod.CONFIGS) >= 8
    assert all(conf for conf, _, _ in mod.CONFIGS.values())  # none default
    assert {w for _, w, _ in mod.CONFIGS.values()} <= set(mod.WORKLOADS)


def test_ground_truth_bad_arguments_are_refused():
    for bad, msg in [(["--steps", "1"], "--steps must be >= 2"),
                     (["--hidden", "100"], "multiple of 64"),
                     (["--configs", "nope"], "unknown configuration"),
                     (["--configs", ","], "names no configuration")]:
        r = gt("--check", *bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert msg in r.stderr


def test_ground_truth_refuses_to_record_without_cuda():
    need_cli()
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        return  # the GPU run itself is made by hand (bench/README.md)
    r = gt("--configs", "max_split", "--out", "/nonexistent/never-written")
    assert r.returncode == 2
    assert "no CUDA device" in r.stderr


def test_ground_truth_self_test_replays_exactly(tmp_path):
    """Record on memsnap's sim (cuda profile) under three configurations,
    replay with the script's comparison: exact, same decisions."""
    need_cli()
    out = tmp_path / "st"
    r = gt("--self-test", str(out), "--configs", "max_split,gc,record_stream",
           "--steps", "4", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _json.load(open(out / "ground_truth.json"))
    assert [x["config"] for x in rows] == ["max_split", "gc", "record_stream"]
    for x in rows:
        assert x["exact"] == "exact" and x["what_if"] == "same decisions", x
        assert x["trace_entries"] > 50
    # The comparison finds a difference: replay the max_split recording as
    # if it had been made with 64 MiB large segments.
    mod = gt_module()
    path = str(out / "max_split.pickle")
    meta = _json.load(open(path + ".meta.json"))
    wrong = mod.replay(os.path.abspath(GT_CLI), path, meta["device_total"],
                       "large_segment_size_mb:64")
    v = mod.verdict(wrong, False)
    assert v.startswith("mismatch: device 0: entry "), v
    assert "segment size 67108864 B in the replay" in v


def test_ground_truth_self_test_counts_what_replay_refuses(tmp_path):
    """expandable segments and private pools: memsnap replay refuses them
    (tools/replay.c), which the script reports with replay's reason, in
    the table and a note under it -- and their entries are counted in the
    recording (the per-device trace_entries of replay's JSON exist only
    for a device it replays: 0 was reported)."""
    need_cli()
    out = tmp_path / "st"
    r = gt("--self-test", str(out), "--configs", "expandable,mempool,max_split",
           "--steps", "4", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {x["config"]: x for x in _json.load(open(out / "ground_truth.json"))}
    why = {"expandable": "the recording uses expandable segments",
           "mempool": "the recording uses private memory pools"}
    for name, reason in why.items():
        x = rows[name]
        assert x["trace_entries"] > 50, x
        assert x["exact"].startswith("not replayable: " + reason), x
        assert x["what_if"].startswith("not replayable: " + reason), x
        assert x["replayable"] is False, x
        assert f"- {name}: {reason}" in r.stdout, r.stdout
    assert rows["max_split"]["replayable"] and rows["max_split"]["exact"] == "exact"
    # the count is the recording's, as memsnap's reader counts it
    for name, x in rows.items():
        s = subprocess.run([GT_CLI, "summary", "--json", str(out / f"{name}.pickle")],
                           capture_output=True, text=True)
        assert x["trace_entries"] == sum(d["trace_entries"]
                                         for d in _json.loads(s.stdout)["devices"])
    assert "Not replayable by `memsnap replay`" in r.stdout


def test_ground_truth_corpus_round_trip(tmp_path, monkeypatch):
    """--save-corpus stores gzip'd JSON (no pickle in git) that
    --verify-corpus turns back into a pickle and replays."""
    need_cli()
    out = tmp_path / "st"
    r = gt("--self-test", str(out), "--configs", "roundup_list", "--steps", "3",
           timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    mod = gt_module()
    corpus = tmp_path / "corpus"
    monkeypatch.setattr(mod, "CORPUS", str(corpus))
    row = mod.compare(os.path.abspath(GT_CLI), str(out / "roundup_list.pickle"))
    dst = mod.save_corpus(str(out / "roundup_list.pickle"), row)
    assert dst.endswith(".json.gz") and os.path.getsize(dst) < 2 << 20
    assert os.path.exists(str(corpus / "roundup_list.meta.json"))
    assert mod.verify_corpus(os.path.abspath(GT_CLI)) == 0
    # An empty corpus is not an error (no GPU run yet).
    _shutil.rmtree(corpus)
    assert mod.verify_corpus(os.path.abspath(GT_CLI)) == 0


def test_ground_truth_verify_committed_corpus():
    """The recordings committed from GPU runs, if any, still replay as they
    did when saved."""
    need_cli()
    r = gt("--verify-corpus", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
