"""Pinned host memory through memsnap.memory: allocation, host statistics
with torch's keys, and _record_memory_history(record_pinned_host_memory=
True) producing host_segments/host_traces (cuda-reference §2.8, §4.10)
that CPython's pickle and ``python -m torch.cuda._memory_viz stats`` read.

Each scenario runs in a fresh process (a fresh process-wide allocator).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from conftest import base_env, run_script

# torch.cuda.memory.host_memory_stats_as_nested_dict's keys (its docstring
# and torch._C._cuda_hostMemoryStats).
STAT_KEYS = {"current", "peak", "allocated", "freed"}
DURATION_KEYS = {"total", "max", "min", "count", "avg"}
NESTED_KEYS = {
    "allocations": STAT_KEYS, "allocated_bytes": STAT_KEYS,
    "active_requests": STAT_KEYS, "active_bytes": STAT_KEYS,
    "host_alloc_time": DURATION_KEYS, "host_free_time": DURATION_KEYS,
    "num_host_alloc": None, "num_host_free": None,
}

SEG_KEYS = {"device", "address", "total_size", "allocated_size",
            "active_size", "requested_size", "stream", "segment_type",
            "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us",
              "compile_context", "user_metadata", "pool_id"}


def test_host_stats_have_torch_keys_and_values():
    proc = run_script(r"""
        import json
        import memsnap.memory as mm
        before = mm.host_memory_stats_as_nested_dict()
        a = mm._host_alloc(1000)      # 1024-byte block
        b = mm._host_alloc(3000)      # 4096
        mm._host_free(a)
        c = mm._host_alloc(600)       # reuses a's block
        s1 = mm.host_memory_stats_as_nested_dict()
        flat = mm.host_memory_stats()
        mm._host_free(b)
        mm._host_free(c)
        mm.empty_host_cache()
        s2 = mm.host_memory_stats_as_nested_dict()
        mm.reset_peak_host_memory_stats()
        s3 = mm.host_memory_stats_as_nested_dict()
        mm.reset_accumulated_host_memory_stats()
        s4 = mm.host_memory_stats_as_nested_dict()
        print("RESULT " + json.dumps({"a": a, "c": c, "before": before,
              "s1": s1, "flat": list(flat.items()), "s2": s2, "s3": s3,
              "s4": s4}))
    """)
    r = proc.result
    for name in ("before", "s1", "s2", "s3", "s4"):
        d = r[name]
        assert set(d) == set(NESTED_KEYS), name
        for k, sub in NESTED_KEYS.items():
            if sub is None:
                assert isinstance(d[k], int)
            else:
                assert set(d[k]) == sub, (name, k)
    assert r["c"] == r["a"]  # cached block of the same rounded size reused
    s1 = r["s1"]
    assert s1["allocations"] == {"current": 2, "peak": 2, "allocated": 2,
                                 "freed": 0}
    assert s1["allocated_bytes"]["current"] == 1024 + 4096
    assert s1["active_requests"]["current"] == 2
    assert s1["active_requests"]["allocated"] == 3
    assert s1["active_bytes"]["current"] == 1024 + 4096
    assert s1["num_host_alloc"] == 2 and s1["num_host_free"] == 0
    assert s1["host_alloc_time"]["count"] == 2
    # The flat form: torch's host_memory_stats (sorted, "."-joined).
    keys = [k for k, _ in r["flat"]]
    assert keys == sorted(keys)
    assert "allocated_bytes.current" in keys
    assert "host_alloc_time.avg" in keys and "num_host_free" in keys
    assert len(keys) == 4 * 4 + 2 * 5 + 2
    s2 = r["s2"]
    assert s2["allocations"]["current"] == 0
    assert s2["allocated_bytes"] == {"current": 0, "peak": 1024 + 4096,
                                     "allocated": 1024 + 4096,
                                     "freed": 1024 + 4096}
    assert s2["num_host_free"] == 2 and s2["host_free_time"]["count"] == 2
    assert r["s3"]["allocated_bytes"]["peak"] == 0
    assert r["s3"]["host_alloc_time"]["max"] == 0
    s4 = r["s4"]
    assert s4["allocated_bytes"]["allocated"] == 0
    assert s4["num_host_alloc"] == 0 and s4["host_alloc_time"]["count"] == 0


def test_host_errors():
    proc = run_script(r"""
        import json
        import memsnap.memory as mm
        out = {}
        p = mm._host_alloc(10)
        for name, fn in [("double", lambda: (mm._host_free(p),
                                             mm._host_free(p))),
                         ("unknown", lambda: mm._host_free(12345)),
                         ("negative", lambda: mm._host_alloc(-1)),
                         ("stream", lambda: mm._host_record_stream(999, 0))]:
            try:
                fn()
                out[name] = None
            except Exception as e:
                out[name] = [type(e).__name__, str(e)]
        out["zero"] = mm._host_alloc(0)
        mm._host_free(0)
        print("RESULT " + json.dumps(out))
    """)
    r = proc.result
    assert r["double"][0] == "ValueError"
    assert "invalid pinned host pointer" in r["double"][1]
    assert r["unknown"][0] == "ValueError" and "0x3039" in r["unknown"][1]
    assert r["negative"][0] == "ValueError"
    assert r["stream"][0] == "ValueError"
    assert r["zero"] == 0


DUMP_SCRIPT = r"""
import json
import memsnap.memory as mm

def pin_for_test(n):
    return mm._host_alloc(n)

mm._record_memory_history("all", stacks="python",
                          record_pinned_host_memory=True,
                          record_cuda=RECORD_CUDA)
d = mm.caching_allocator_alloc(4096)
a = pin_for_test(1000)
b = pin_for_test(70000)
mm._host_record_stream(b, 0)
mm._host_free(a)
mm._dump_snapshot(DUMP)
print("RESULT " + json.dumps({"a": a, "b": b}))
"""


def dump(tmp_path, record_cuda=True):
    path = str(tmp_path / "host.pickle")
    proc = run_script(DUMP_SCRIPT.replace("DUMP", repr(path))
                      .replace("RECORD_CUDA", repr(record_cuda)))
    with open(path, "rb") as f:
        return proc.result, path, pickle.load(f)


def test_dump_has_host_segments_and_traces(tmp_path):
    r, _, snap = dump(tmp_path)
    segs = snap["host_segments"]
    assert [s["address"] for s in segs] == sorted([r["a"], r["b"]])
    for s in segs:
        assert set(s) == SEG_KEYS
        assert s["device"] == -1 and s["stream"] == 0
        assert s["segment_type"] == "small" and s["is_expandable"] is False
        assert s["segment_pool_id"] == (0, 0)
        assert s["requested_size"] == s["total_size"]
        assert len(s["blocks"]) == 1
        blk = s["blocks"][0]
        assert set(blk) == BLOCK_KEYS
        assert blk["address"] == s["address"]
        assert blk["size"] == blk["requested_size"] == s["total_size"]
    by_addr = {s["address"]: s for s in segs}
    sa, sb = by_addr[r["a"]], by_addr[r["b"]]
    assert sa["total_size"] == 1024 and sb["total_size"] == 131072
    assert sa["blocks"][0]["state"] == "inactive"
    assert sa["allocated_size"] == sa["active_size"] == 0
    assert sb["blocks"][0]["state"] == "active_allocated"
    assert sb["allocated_size"] == sb["active_size"] == 131072
    # b's allocation stack: the Python frame that asked for it.
    assert any(f["name"] == "pin_for_test" for f in sb["blocks"][0]["frames"])
    assert sa["blocks"][0]["frames"] == []  # freed: stack dropped
    assert any(f["name"] == "pin_for_test" for f in sa["frames"])  # creation

    traces = snap["host_traces"]
    assert [(e["action"], e["addr"], e["size"]) for e in traces] == [
        ("segment_alloc", r["a"], 1024), ("alloc", r["a"], 1000),
        ("segment_alloc", r["b"], 131072), ("alloc", r["b"], 70000),
        ("free_requested", r["a"], 1000), ("free_completed", r["a"], 1000)]
    for e in traces:
        assert set(e) - {"frames"} == TRACE_KEYS
        assert e["stream"] == 0 and e["pool_id"] == (0, 0)
        assert e["compile_context"] == "N/A" and e["user_metadata"] == ""
        assert isinstance(e["time_us"], int) and e["time_us"] > 10**15
    times = [e["time_us"] for e in traces]
    assert times == sorted(times)
    assert any(f["name"] == "pin_for_test" for f in traces[1]["frames"])
    # The device side is untouched: one device, segment_alloc + alloc.
    assert [e["action"] for e in snap["device_traces"][0]] == [
        "segment_alloc", "alloc"]
    assert all(s["device"] == 0 for s in snap["segments"])


def test_record_cuda_false_keeps_host(tmp_path):
    r, _, snap = dump(tmp_path, record_cuda=False)
    assert snap["device_traces"] == [[]]
    assert len(snap["host_traces"]) == 6
    assert len(snap["host_segments"]) == 2


def test_record_pinned_requires_enabled():
    proc = run_script(r"""
        import json
        import memsnap.memory as mm
        try:
            mm._record_memory_history(None, record_pinned_host_memory=True)
            out = None
        except RuntimeError as e:
            out = str(e)
        print("RESULT " + json.dumps(out))
    """)
    assert proc.result == ("record_pinned_host_memory requires memory "
                           "history recording to be enabled")


def test_host_off_gives_empty_lists(tmp_path):
    path = str(tmp_path / "off.pickle")
    run_script(f"""
        import memsnap.memory as mm
        mm._record_memory_history("all", record_pinned_host_memory=True)
        p = mm._host_alloc(100)
        mm._record_memory_history("all")   # host recording off again
        q = mm._host_alloc(100)
        mm._dump_snapshot({path!r})
    """)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert snap["host_segments"] == [] and snap["host_traces"] == []


def test_memory_viz_stats_reads_it(tmp_path):
    pytest.importorskip("torch.cuda._memory_viz")
    _, path, _ = dump(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
        capture_output=True, text=True, env=base_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() != ""
    # The C test's checker agrees (keys and fixed values of §2.8).
    here = os.path.dirname(os.path.abspath(__file__))
    chk = os.path.join(here, "..", "host", "check_host.py")
    proc = subprocess.run([sys.executable, chk, path, "--viz"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"nseg": 2' in proc.stdout
