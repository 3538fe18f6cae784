"""memsnap.memory where issue 16 found it diverging from torch / torch_npu.

Each test names the function it mirrors.  Every scenario runs in a fresh
process (the allocator is created from the environment on first use).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess

import pytest

from conftest import BUILD, EXE_WRAPPER, HERE, WORKSPACE_SETUP, base_env, needs_torch, run_script

ROOT = os.path.dirname(os.path.dirname(HERE))
FAKE_ACL = os.path.join(BUILD, "tests", "runtime", "libascendcl.so")
FAKE_ACL_OLD = os.path.join(BUILD, "tests", "runtime", "libascendcl_novmm.so")
STANDINS = os.path.join(ROOT, "tests", "fakes", "python")
CLI = os.path.join(BUILD, "tools", "memsnap")


def need(path: str) -> None:
    if not os.path.exists(path):
        pytest.skip(f"SKIP: {path} is missing (build with `make build` first)")


# torch.cuda.memory.use_mem_pool -> _cuda_beginAllocateCurrentThreadToPool;
# CUDACachingAllocator.cpp / NPUCachingAllocator.cpp malloc: the
# free-cache-and-retry step is skipped only by is_capture_context().
MEMPOOL_REPRO = r"""
import json
import memsnap.memory as mm
cached = mm.caching_allocator_alloc(600 << 20)
mm.caching_allocator_delete(cached)
before = mm.memory_reserved()
pool = mm.MemPool()
with mm.use_mem_pool(pool):
    p = mm.caching_allocator_alloc(600 << 20)
    in_pool = [s["address"] for s in pool.snapshot()]
stats = mm.memory_stats()
mm.caching_allocator_delete(p)
print("RESULT " + json.dumps({"before": before, "p": p, "in_pool": in_pool,
      "ooms": stats["num_ooms"], "retries": stats["num_alloc_retries"]}))
"""


@pytest.mark.parametrize("profile", ["npu", "cuda"])
def test_mempool_repro_succeeds(profile):
    r = run_script(MEMPOOL_REPRO, env=base_env(MEMSNAP_SIM_MEMORY="1G",
                                               MEMSNAP_PROFILE=profile)).result
    assert r["before"] >= 600 << 20
    assert r["ooms"] == 0 and r["retries"] == 1
    assert r["p"] in r["in_pool"]


THREADS = r"""
import json, threading
import memsnap.memory as mm
pool = mm.MemPool()
out = {}
def worker(key):
    out[key] = mm.caching_allocator_alloc(4096)
with mm.use_mem_pool(pool):
    mine = mm.caching_allocator_alloc(4096)
    t = threading.Thread(target=worker, args=("inside",))
    t.start(); t.join()
pool_blocks = [s["address"] for s in pool.snapshot()]
def in_pool(p):
    return any(s["address"] <= p < s["address"] + s["total_size"]
               for s in pool.snapshot())
print("RESULT " + json.dumps({"mine": in_pool(mine),
                              "other": in_pool(out["inside"])}))
"""


def test_use_mem_pool_routes_only_the_current_thread():
    """torch/cuda/memory.py use_mem_pool: "This context manager makes only
    current thread's allocations route to the given pool"."""
    r = run_script(THREADS).result
    assert r == {"mine": True, "other": False}


ENABLE_EARLY = r"""
import json
import memsnap.memory as mm
from memsnap import _memsnap
early = _memsnap.initialized()
mm.caching_allocator_enable(False)     # before init: nothing happens
mm.caching_allocator_enable("not a bool")  # torch does not look either
p = mm.caching_allocator_alloc(1 << 20)
cached = mm.memory_stats()["allocation.all.current"]
mm.caching_allocator_delete(p)
mm.caching_allocator_enable(False)     # after init: applied
q = mm.caching_allocator_alloc(1 << 20)
raw = mm.memory_stats()["allocation.all.current"]
mm.caching_allocator_delete(q)
try:
    mm.caching_allocator_enable("x")
    err = None
except RuntimeError as e:
    err = str(e)
print("RESULT " + json.dumps({"early": early, "cached": cached, "raw": raw,
                              "err": err}))
"""


def test_caching_allocator_enable_before_init_is_a_noop():
    """torch/cuda/memory.py caching_allocator_enable: ``if
    is_initialized(): torch._C._cuda_cudaCachingAllocator_enable(value)``."""
    r = run_script(ENABLE_EARLY).result
    assert r["early"] is False
    assert r["cached"] == 1  # the allocator caches: the early call was ignored
    assert r["raw"] == 0     # caching off: raw allocations, no stats
    assert "expects a bool" in r["err"]


WARN = r"""
import json, warnings
import memsnap.memory as mm
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    mm._set_allocator_settings("expandable_segments:False")
print("RESULT " + json.dumps([[x.category.__name__, str(x.message)] for x in w]))
"""


@pytest.mark.parametrize("profile", ["cuda", "npu"])
def test_set_allocator_settings_warns_like_torch(profile):
    """torch/cuda/memory.py _set_allocator_settings is @deprecated
    (FutureWarning); torch_npu/npu/memory.py _set_allocator_settings is not."""
    r = run_script(WARN, env=base_env(MEMSNAP_PROFILE=profile)).result
    if profile == "cuda":
        assert len(r) == 1 and r[0][0] == "FutureWarning"
        assert "_set_allocator_settings is deprecated" in r[0][1]
    else:
        assert r == []


ACCEL_SETTINGS = r"""
import json, warnings
import memsnap.torch as mt
name = mt.register_device("memdev")       # not "npu": the cuda profile
import memsnap.memory as mm, torch
model = torch.nn.Linear(64, 64).to(name)
model(torch.randn(4, 64, device=name)).sum().backward()
def expandable():
    return mm._snapshot()["allocator_settings"].get("expandable_segments")
before = expandable()
torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
after_torch = expandable()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    mm._set_allocator_settings("expandable_segments:True")
print("RESULT " + json.dumps({"before": before, "after_torch": after_torch,
                              "after_memsnap": expandable(),
                              "warnings": [str(x.message) for x in w]}))
"""


@needs_torch
def test_set_allocator_settings_warning_does_not_send_to_torch():
    """torch's FutureWarning says "Use
    torch._C._accelerator_setAllocatorSettings instead"; memsnap's said so
    too, but that call configures torch's own allocator: on a memsnap
    device training a model it leaves memsnap's settings as they were.
    The warning now says that memsnap's function is the one to call."""
    r = run_script(ACCEL_SETTINGS, timeout=300).result
    assert r["before"] is False and r["after_torch"] is False
    assert r["after_memsnap"] is True
    [msg] = r["warnings"]
    assert "_set_allocator_settings is deprecated" in msg
    assert "leaves memsnap's settings as they are" in msg
    assert "Use torch._C._accelerator_setAllocatorSettings instead" not in msg


DUMP = r"""
import json, os
import memsnap.memory as mm
p = mm.caching_allocator_alloc(3 << 20)
mm._dump_snapshot("snap.pickle")
mm.caching_allocator_delete(p)
print("RESULT " + json.dumps(sorted(os.listdir("."))))
"""


def test_dump_snapshot_writes_cann_usage_csv(tmp_path):
    """torch_npu/npu/memory.py _dump_snapshot: the pickle, then
    torch_npu._C._npu_saveDevMemUsageInfo(current_device())
    (NPUCachingAllocator.cpp saveDevMemUsageInfo: aclrtGetMemUsageInfo,
    device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv in OOM_SNAPSHOT_PATH,
    default "./")."""
    need(FAKE_ACL)
    env = base_env(MEMSNAP_RUNTIME="acl", MEMSNAP_ACL_LIBRARY=FAKE_ACL,
                   MEMSNAP_PROFILE="npu")
    files = run_script(DUMP, env=env, cwd=str(tmp_path)).result
    csvs = [f for f in files if f.startswith("device_0_memUsageInfo_")]
    assert "snap.pickle" in files and len(csvs) == 1, files
    assert len(csvs[0]) == len("device_0_memUsageInfo_") + 14 + 4
    with open(tmp_path / csvs[0], newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["moduleName", "curMemSize(MB)", "memPeakSize(MB)"]
    names = [r[0] for r in rows[1:]]
    assert names == ["app", "runtime"]
    app = rows[1]
    assert float(app[1]) == 20.0 and float(app[2]) == 20.0  # a 20 MiB segment
    assert all(len(x.split(".")[1]) == 4 for x in app[1:])   # setprecision(4)
    # With OOM_SNAPSHOT_PATH the CSV goes there (GetOomSnapshotDumpPath).
    other = tmp_path / "oomdir"
    other.mkdir()
    env["OOM_SNAPSHOT_PATH"] = str(other)
    files = run_script(DUMP, env=env, cwd=str(tmp_path)).result
    assert len(glob.glob(str(other / "device_0_memUsageInfo_*.csv"))) == 1
    # An OOM_SNAPSHOT_PATH that is no directory: torch_npu's
    # GetOomSnapshotDumpPath raises; the pickle is written by then, and
    # memsnap warns why the report is missing (never silent).
    env["OOM_SNAPSHOT_PATH"] = str(tmp_path / "missing")
    nodir = tmp_path / "nodir"
    nodir.mkdir()
    r = run_script(DUMP, env=env, cwd=str(nodir))
    assert r.result == ["snap.pickle"], r.result
    assert ("RuntimeWarning: memsnap: no memory usage report was written: "
            "OOM_SNAPSHOT_PATH '%s' is not an existing directory"
            % (tmp_path / "missing")) in r.stderr, r.stderr
    assert "(the snapshot was)" in r.stderr
    # The cuda profile (torch.cuda._dump_snapshot) writes no CSV.
    env = base_env(MEMSNAP_RUNTIME="acl", MEMSNAP_ACL_LIBRARY=FAKE_ACL,
                   MEMSNAP_PROFILE="cuda")
    cuda_dir = tmp_path / "cuda"
    cuda_dir.mkdir()
    files = run_script(DUMP, env=env, cwd=str(cuda_dir)).result
    assert files == ["snap.pickle"]


def test_dump_snapshot_falls_back_to_the_torch_npu_profiler(tmp_path):
    """torch_npu/npu/memory.py _dump_snapshot: when saveDevMemUsageInfo
    fails, _init_profiler(dirname(abspath(filename)), {CPU, NPU}),
    NpuProfilerConfig(path, False, True, False, False, False,
    _ExperimentalConfig()), _start_profiler, _stop_profiler,
    _finalize_profiler.  Here an older CANN (no aclrtGetMemUsageInfo) and
    the torch_npu stand-in of tests/fakes/python."""
    need(FAKE_ACL_OLD)
    out = tmp_path / "out"
    out.mkdir()
    env = base_env(MEMSNAP_RUNTIME="acl", MEMSNAP_ACL_LIBRARY=FAKE_ACL_OLD,
                   MEMSNAP_PROFILE="npu", PYTHONPATH=STANDINS)
    code = DUMP.replace('"snap.pickle"', repr(str(out / "snap.pickle")))
    run_script(code, env=env, cwd=str(tmp_path))
    assert not glob.glob(str(tmp_path / "*.csv")) and not glob.glob(str(out / "*.csv"))
    with open(out / "memsnap_standin_profiler.json") as f:
        calls = json.load(f)
    assert calls == [
        ["_init_profiler", str(out), ["CPU", "NPU"]],
        ["_start_profiler", str(out),
         {"record_shapes": False, "profile_memory": True, "with_stack": False,
          "with_flops": False, "with_modules": False}, ["CPU", "NPU"]],
        ["_stop_profiler"],
        ["_finalize_profiler"],
    ]
    # Without torch_npu: nothing more than the pickle.
    env.pop("PYTHONPATH")
    (out / "memsnap_standin_profiler.json").unlink()
    run_script(code, env=env, cwd=str(tmp_path))
    assert sorted(os.listdir(out)) == ["snap.pickle"]


NOTIFY = r"""
import json
import memsnap.memory as mm
calls = []
mm._attach_out_of_memory_observer(lambda *a: calls.append(a))
a = mm._notify_device_error("EE9999: Inner Error")
b = mm._notify_device_error("aclnnAdd failed: EL0004: Failed to allocate memory.")
print("RESULT " + json.dumps([a, b, len(calls)]))
"""


def test_cann_reported_oom_dumps(tmp_path):
    """torch_npu NPU_CHECK_ERROR (NPUException.h): an error text that
    isCannOOM (NPUException.cpp: "EL0004" or "Failed to allocate") calls
    oom_observer() -- the OOM_SNAPSHOT dump -- before raising."""
    env = base_env(OOM_SNAPSHOT_ENABLE="1", OOM_SNAPSHOT_PATH=str(tmp_path),
                   MEMSNAP_USAGE_REPORT="memsnap")
    r = run_script(NOTIFY, env=env, cwd=str(tmp_path)).result
    assert r == [False, True, 0]
    assert len(glob.glob(str(tmp_path / "oom_snapshot_*.pickle"))) == 1
    assert len(glob.glob(str(tmp_path / "device_0_memsnapUsage_*.csv"))) == 1


WORKSPACE = WORKSPACE_SETUP + r"""
mm._record_memory_history()
s = mm._snapshot()
mm._dump_snapshot("ws.pickle")
print("RESULT " + json.dumps({
    "w": w.value,
    "last": [s["segments"][-1]["address"],
             s["segments"][-1]["blocks"][0]["state"],
             s["segments"][-1]["allocated_size"]],
    "first": [e["action"] for e in s["device_traces"][0][:3]],
    "sizes": [e["size"] for e in s["device_traces"][0][:3]]}))
"""


def test_workspace_torch_npu_view_and_memsnap_check(tmp_path):
    """torch_npu Module.cpp _snapshot appends NPUWorkspaceAllocator's
    segments (block never allocated) and prepends get_trace()'s three
    entries per buffer; `memsnap check` accepts that layout."""
    need(CLI)
    r = run_script(WORKSPACE, env=base_env(MEMSNAP_PROFILE="npu"),
                   cwd=str(tmp_path)).result
    assert r["last"] == [r["w"], "inactive", 0]
    assert r["first"] == ["workspace_snapshot", "segment_alloc", "alloc"]
    assert r["sizes"] == [2 << 20] * 3
    p = subprocess.run([*EXE_WRAPPER, CLI, "check", str(tmp_path / "ws.pickle")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
