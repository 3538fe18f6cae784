"""memsnap.torch under torch_npu, with the stand-in torch_npu
(tests/fakes/torch_npu) and the fake libascendcl.so; run by meson
(tests/torch/meson.build sets the paths).

Each scenario runs in a fresh process (memsnap's allocator and torch's
PrivateUse1 name are per process).  The stand-in's C++ NPUPluggableAllocator
calls memsnap's hooks exactly as torch_npu does (a raw pointer turned into a
typed std::function; record_stream_fn receives an NPUStream by value), and
the C++ shim under test (MEMSNAP_TORCH_NPU_SHIM) is npu.cpp built against
the stand-in headers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HANDLE0 = 0x5000000  # fake_torch_npu.cpp: stream handle = 0x5000000 + dev*0x10000 + (id+1)*0x10


def handle(device, stream_id):
    return HANDLE0 + device * 0x10000 + (stream_id + 1) * 0x10


def run(code: str, **env) -> dict:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PYTORCH_", "OOM_SNAPSHOT")) and k not in (
             "MEMSNAP_RUNTIME", "MEMSNAP_PROFILE", "MEMSNAP_SIM_MEMORY")}
    e.update(env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["_stderr"] = p.stderr
            return r
    raise AssertionError(f"no RESULT line\n{p.stdout}\n{p.stderr}")


PRELUDE = r"""
import json, warnings
warnings.simplefilter("error", RuntimeWarning)
import torch, torch_npu
import torch_npu._C as C
import memsnap, memsnap.memory as mm, memsnap.torch as mt
out = {}
"""

# The fake libascendcl.so's control function (memsnap loaded that library).
ACL = r"""
import ctypes, os
acl = ctypes.CDLL(os.environ["MEMSNAP_ACL_LIBRARY"])
acl.fake_acl_control.restype = ctypes.c_long
acl.fake_acl_control.argtypes = [ctypes.c_char_p, ctypes.c_long]
ctl = lambda what, v=0: acl.fake_acl_control(what.encode(), v)
"""


def test_use_allocator_registers_every_hook_and_raises_oom():
    r = run(PRELUDE + r"""
allocator = mt.use_allocator()
out["backend"] = mt.installed_backend()
out["names"] = list(allocator.names)
mm._record_memory_history("all", stacks="python")
p = C._fake_alloc(1 << 20)
out["allocated"] = mm.memory_allocated()
out["alloc_streams"] = [e["stream"] for e in mm._snapshot()["device_traces"][0]
                        if e["action"] == "alloc"]
# get_device_stats_fn / reset_peak_status_fn through torch_npu's C++ path.
out["npu_allocated"] = C._npu_memoryStat(0, "allocated_bytes.all.current")
out["npu_reserved"] = C._npu_memoryStat(0, "reserved_bytes.all.current")
q = C._fake_alloc(4 << 20)
C._fake_free(q)
out["peak_before"] = C._npu_memoryStat(0, "allocated_bytes.all.peak")
C._npu_resetPeakMemoryStats(0)
out["peak_after"] = C._npu_memoryStat(0, "allocated_bytes.all.peak")
# base_alloc_fn: the segment of the allocation.
out["base"] = C._fake_base_alloc(p)
out["p"] = p
# set_memory_fraction_fn
C._npu_setMemoryFraction(0.5, 0)
out["fraction"] = mm.get_per_process_memory_fraction(0)
# reset_fn (torch.npu.empty_cache): the cached 4 MiB segment goes.
C._fake_free(p)
C._npu_emptyCache()
out["reserved_after_empty"] = mm.memory_reserved()
# OOM: torch.OutOfMemoryError out of torch_npu's allocator, not a NULL.
try:
    C._fake_alloc(1 << 30)
    out["oom"] = None
except torch.OutOfMemoryError as e:
    out["oom"] = str(e)
out["after_oom"] = C._fake_alloc(4096) != 0
out["stats_patched"] = torch_npu.npu.memory.memory_stats is mm.memory_stats
print("RESULT " + json.dumps(out))
""", MEMSNAP_RUNTIME="sim", MEMSNAP_SIM_MEMORY="256M")
    assert r["backend"] == "npu"
    assert r["names"][1:] == ["msnap_torch_malloc", "msnap_torch_free"]
    assert r["names"][0].endswith("libmemsnap_torch.so")
    assert r["allocated"] >= 1 << 20
    # allocate() passes getCurrentNPUStreamNoWait: the aclrtStream.
    assert r["alloc_streams"] == [handle(0, 0)]
    assert r["npu_allocated"] == r["allocated"]
    assert r["npu_reserved"] >= r["npu_allocated"]
    assert r["peak_before"] >= r["allocated"] + (4 << 20)
    assert r["peak_after"] == r["allocated"]
    assert r["base"][0] <= r["p"] and r["base"][1] >= 1 << 20
    assert r["fraction"] == 0.5
    assert r["reserved_after_empty"] == 0
    assert r["oom"] is not None and "out of memory. Tried to allocate" in r["oom"]
    assert r["after_oom"] and r["stats_patched"]


def test_record_stream_gets_the_npustream_and_erase_stream_undoes_it():
    r = run(PRELUDE + ACL + r"""
mt.use_allocator()
ctl("pending_events", 1)
p = C._fake_alloc(1 << 20)
C._fake_record_stream(p, 0, 3)
rec0 = ctl("record_calls")
C._fake_free(p)
out["records"] = ctl("record_calls") - rec0
out["last_stream"] = ctl("last_record_stream")
seg = mm.memory_snapshot()
out["states"] = [b["state"] for s in seg for b in s["blocks"]]
ctl("complete_all")
mm.empty_cache()
# erase_stream: the use on stream 5 is forgotten; the free needs no event.
q = C._fake_alloc(1 << 20)
C._fake_record_stream(q, 0, 5)
C._fake_erase_stream(q, 0, 5)
rec1 = ctl("record_calls")
C._fake_free(q)
out["records_after_erase"] = ctl("record_calls") - rec1
out["allocated"] = mm.memory_allocated()
print("RESULT " + json.dumps(out))
""", MEMSNAP_RUNTIME="acl")
    assert r["records"] == 1
    # memsnap recorded the event on the stream torch_npu passed, not on a
    # host address of a temporary NPUStream.
    assert r["last_stream"] == handle(0, 3)
    assert "active_pending_free" in r["states"]
    assert r["records_after_erase"] == 0
    assert r["allocated"] == 0


def test_events_and_synchronize_wait_for_the_task_queue():
    r = run(PRELUDE + ACL + r"""
mt.use_allocator()
p = C._fake_alloc(1 << 20)
C._fake_record_stream(p, 0, 2)
C._fake_launch(0)           # a kernel still in torch_npu's queue
C._fake_launch(0)
out["pending_before"] = C._fake_counter("pending0")
rec0 = ctl("record_calls")
C._fake_free(p)              # cross-stream free: memsnap records an event
out["pending_after_free"] = C._fake_counter("pending0")
out["records_at_drain"] = C._fake_counter("acl_records_at_drain")
out["rec0"] = rec0
out["rec1"] = ctl("record_calls")
C._fake_launch(0)
syncs0, dsync0 = C._fake_counter("syncs"), ctl("sync_device_calls")
mm.empty_cache()             # releases segments: synchronizes first
out["pending_after_empty"] = C._fake_counter("pending0")
out["syncs"] = C._fake_counter("syncs") - syncs0
out["device_syncs"] = ctl("sync_device_calls") - dsync0
out["runtime"] = memsnap._memsnap.runtime_name()
print("RESULT " + json.dumps(out))
""", MEMSNAP_RUNTIME="acl")
    assert r["runtime"] == "acl"
    assert r["pending_before"] == 2
    # The queue was drained before memsnap's aclrtRecordEvent.
    assert r["pending_after_free"] == 0
    assert r["records_at_drain"] == r["rec0"] and r["rec1"] == r["rec0"] + 1
    assert r["pending_after_empty"] == 0
    assert r["syncs"] >= 1 and r["device_syncs"] >= 1


def test_register_device_is_refused_when_torch_npu_holds_privateuse1():
    r = run(PRELUDE + r"""
for name in ("npu", "mydev"):
    try:
        mt.register_device(name)
        out[name] = None
    except RuntimeError as e:
        out[name] = str(e)
print("RESULT " + json.dumps(out))
""", MEMSNAP_RUNTIME="sim")
    for name in ("npu", "mydev"):
        assert r[name] is not None
        assert "already registered as 'npu' (by torch_npu)" in r[name]
        assert "use_allocator" in r[name]
