"""Out of memory: observers, OOM_SNAPSHOT_ENABLE dumps, exception types."""

from __future__ import annotations

import glob
import os
import pickle
import re

import pytest

from conftest import base_env, run_script
from snapcheck import schema_errors

OOM_SCRIPT = r"""
import json, os, sys
import memsnap.memory as mm

out = {"observer": [], "unraisable": []}
sys.unraisablehook = lambda u: out["unraisable"].append(
    [type(u.exc_value).__name__, str(u.exc_value)])

def observer(device, alloc, total, free):
    out["observer"].append([device, alloc, total, free])
    # The observer may take snapshots: no deadlock, and the oom entry is in.
    snap = mm._snapshot()
    out["oom_in_observer_snapshot"] = any(
        e["action"] == "oom" for e in snap["device_traces"][0])
    mm._dump_snapshot(os.path.join(OUTDIR, "from_observer.pickle"))
    raise ValueError("observer failure must not hide the OOM")

mm._attach_out_of_memory_observer(observer)
keep = mm.caching_allocator_alloc(8 << 20)
try:
    mm.caching_allocator_alloc(1 << 30)
except Exception as e:
    out["exc"] = [type(e).__name__, isinstance(e, MemoryError),
                  isinstance(e, mm.OutOfMemoryError), str(e)]
out["num_ooms"] = mm.memory_stats()["num_ooms"]
out["pid"] = os.getpid()
print("RESULT " + json.dumps(out))
"""


def test_oom_snapshot_enable_dump_observer_and_error(tmp_path):
    outdir = str(tmp_path)
    # The sim has no CANN usage report (aclrtGetMemUsageInfo): ask for
    # memsnap's own statistics CSV (api/usage.c).
    env = base_env(MEMSNAP_SIM_MEMORY="64M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=outdir, MEMSNAP_USAGE_REPORT="memsnap")
    r = run_script(OOM_SCRIPT.replace("OUTDIR", repr(outdir)), env=env, cwd=outdir).result

    # The caller got OutOfMemoryError (a MemoryError), after the observer.
    assert r["exc"][0] == "OutOfMemoryError" and r["exc"][1] and r["exc"][2]
    assert r["num_ooms"] == 1
    assert len(r["observer"]) == 1
    device, alloc, total, free = r["observer"][0]
    assert device == 0 and alloc >= 1 << 30 and total == 64 << 20 and free <= total
    assert r["oom_in_observer_snapshot"] is True
    assert r["unraisable"] == [["ValueError", "observer failure must not hide the OOM"]]

    # Exactly one complete OOM dump named oom_snapshot_<pid>_<time>.pickle.
    dumps = glob.glob(os.path.join(outdir, "oom_snapshot_*.pickle"))
    assert len(dumps) == 1, os.listdir(outdir)
    assert re.fullmatch(rf"oom_snapshot_{r['pid']}_\d[\d_.-]*\.pickle",
                        os.path.basename(dumps[0]))
    with open(dumps[0], "rb") as f:
        snap = pickle.load(f)
    assert schema_errors(snap) == []
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["device_free"] <= 64 << 20
    # The CSV usage report was written too, and no temporary file is left.
    assert glob.glob(os.path.join(outdir, "device_0_memsnapUsage_*.csv")), os.listdir(outdir)
    assert not glob.glob(os.path.join(outdir, "device_0_memUsageInfo_*.csv"))
    leftovers = [n for n in os.listdir(outdir)
                 if not n.endswith((".pickle", ".csv"))]
    assert leftovers == []
    with open(os.path.join(outdir, "from_observer.pickle"), "rb") as f:
        assert any(e["action"] == "oom" for e in pickle.load(f)["device_traces"][0])


TORCH_OOM = r"""
import json
import torch
import memsnap.memory as mm
try:
    mm.caching_allocator_alloc(1 << 40)
except torch.OutOfMemoryError as e:
    print("RESULT " + json.dumps([type(e).__name__, isinstance(e, MemoryError),
                                  isinstance(e, mm.OutOfMemoryError),
                                  isinstance(e, RuntimeError)]))
"""


def test_oom_under_torch_raises_torch_type():
    pytest.importorskip("torch")
    r = run_script(TORCH_OOM, env=base_env(MEMSNAP_SIM_MEMORY="64M")).result
    assert r == ["TorchOutOfMemoryError", True, True, True]


def test_oom_without_torch_is_plain_memsnap_type():
    code = r"""
import json, sys
import memsnap.memory as mm
try:
    mm.caching_allocator_alloc(1 << 40)
except MemoryError as e:
    print("RESULT " + json.dumps([type(e).__name__, "torch" in sys.modules]))
"""
    assert run_script(code, env=base_env(MEMSNAP_SIM_MEMORY="64M")).result == [
        "OutOfMemoryError", False]


REPEATED_OOM = r"""
import memsnap.memory as mm
for _ in range(3):
    try:
        mm.caching_allocator_alloc(1 << 40)
    except mm.OutOfMemoryError:
        pass
print("RESULT", mm.memory_stats()["num_ooms"])
"""


@pytest.mark.parametrize("profile", ["cuda", "npu"])
def test_a_failing_oom_dump_is_said_once(profile):
    """A directory that passes the check (root may write /proc's inode
    bits) but where no file can be created: the dump fails at each of three
    OOMs and says so once.  The cuda profile writes no usage report (torch
    has none); the npu profile's CANN report (none on the sim) is also said
    once."""
    if os.geteuid() != 0:
        pytest.skip("SKIP: needs root (a directory writable by its mode in which no file can be created: /proc)")
    env = base_env(OOM_SNAPSHOT_ENABLE="1", OOM_SNAPSHOT_PATH="/proc",
                   MEMSNAP_PROFILE=profile, MEMSNAP_SIM_MEMORY="64M")
    p = run_script(REPEATED_OOM, env=env)
    assert p.result == 3
    assert p.stderr.count("no OOM snapshot is written") == 1, p.stderr
    cann = p.stderr.count("no CANN memory usage report")
    assert cann == (0 if profile == "cuda" else 1), p.stderr


def test_oom_classes_with_torch_imported():
    """docs/python.md: with torch imported the raised class is
    TorchOutOfMemoryError, a subclass of memsnap's OutOfMemoryError and of
    torch.OutOfMemoryError; memsnap's class itself is not torch's."""
    pytest.importorskip("torch")
    code = r"""
import json, torch, memsnap.memory as mm
try:
    mm.caching_allocator_alloc(1 << 40)
except torch.OutOfMemoryError as e:
    t = type(e)
    print("RESULT " + json.dumps([t.__module__ + "." + t.__name__,
                                  isinstance(e, mm.OutOfMemoryError),
                                  isinstance(e, MemoryError),
                                  issubclass(t, torch.OutOfMemoryError),
                                  issubclass(mm.OutOfMemoryError, torch.OutOfMemoryError)]))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_MEMORY="64M")).result
    assert r == ["memsnap.memory.TorchOutOfMemoryError", True, True, True, False]


def test_oom_with_torch_imported_pickles(tmp_path):
    """The OOM raised with torch imported (TorchOutOfMemoryError, named
    memsnap.memory's) pickles, as multiprocessing and concurrent.futures
    send a worker's exception back: pickle found no such attribute in
    memsnap.memory ("Can't pickle <class
    'memsnap.memory.TorchOutOfMemoryError'>: attribute lookup ... failed").
    It unpickles in this process and in a fresh one that has not imported
    torch yet."""
    pytest.importorskip("torch")
    path = tmp_path / "oom.bin"
    code = r"""
import json, pickle, sys, torch
import memsnap.memory as mm
model = torch.nn.Linear(1024, 1024)
try:
    mm.caching_allocator_alloc(sum(p.numel() * p.element_size()
                                   for p in model.parameters()) * 64)
except torch.OutOfMemoryError as e:
    err = e
data = pickle.dumps(err)
back = pickle.loads(data)
open(%r, "wb").write(data)
print("RESULT " + json.dumps([type(back) is type(err), str(back) == str(err),
                              mm.TorchOutOfMemoryError is type(err)]))
""" % str(path)
    r = run_script(code, env=base_env(MEMSNAP_SIM_MEMORY="64M")).result
    assert r == [True, True, True]
    fresh = r"""
import json, pickle, sys
assert "torch" not in sys.modules
e = pickle.loads(open(%r, "rb").read())
import torch, memsnap.memory as mm
print("RESULT " + json.dumps([type(e).__name__, isinstance(e, torch.OutOfMemoryError),
                              isinstance(e, mm.OutOfMemoryError), "out of memory" in str(e)]))
""" % str(path)
    r = run_script(fresh, env=base_env(MEMSNAP_SIM_MEMORY="64M")).result
    assert r == ["TorchOutOfMemoryError", True, True, True]
