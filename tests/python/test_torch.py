"""memsnap.torch: use_allocator, patch_torch_npu (against a stand-in
torch_npu package written to tmp_path), record_function annotations, FX
augmentation."""

from __future__ import annotations

import os
import textwrap

import pytest

from conftest import base_env, run_script

# A stand-in for torch_npu: the pieces memsnap.torch touches, behaving as
# the real ones (the pluggable allocator dlopens the library and looks the
# two functions up by name; swapping after first use fails).
FAKE_MEMORY = '''
import ctypes

_current = None
_used = False
ORIGINAL = "torch_npu original"

def _record_memory_history(*a, **k): return ORIGINAL
def _snapshot(*a, **k): return ORIGINAL
def _dump_snapshot(*a, **k): return ORIGINAL
def memory_snapshot(*a, **k): return ORIGINAL
def memory_stats(*a, **k): return ORIGINAL

class NPUPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p)
        free_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                  ctypes.c_void_p)
        # Function pointers looked up by name, as dlsym in the C++ loader.
        self.alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), alloc_t)
        self.free_fn = ctypes.cast(getattr(lib, free_fn_name), free_t)
        self.names = (path_to_so_file, alloc_fn_name, free_fn_name)

def change_current_allocator(allocator):
    global _current
    if _used:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = allocator

def _fake_tensor_alloc(size):
    """What torch_npu does for a tensor: call the current allocator."""
    global _used
    _used = True
    return _current.alloc_fn(size, 0, None)
'''

FAKE_NPU_INIT = '''
from . import memory
from .memory import memory_stats, _snapshot

class _Stream:
    npu_stream = 0

def current_device():
    return 0

def current_stream(device=None):
    return _Stream()
'''


@pytest.fixture
def fake_npu(tmp_path):
    pkg = tmp_path / "torch_npu"
    (pkg / "npu").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import npu\n")
    (pkg / "npu" / "__init__.py").write_text(FAKE_NPU_INIT)
    (pkg / "npu" / "memory.py").write_text(FAKE_MEMORY)
    env = base_env(PYTHONPATH=str(tmp_path))
    return env


def test_patch_torch_npu_routes_history_and_snapshot(fake_npu):
    code = r"""
import json
import torch_npu, torch_npu.npu.memory as nm
import memsnap.memory as mm, memsnap.torch as mt
names = mt.patch_torch_npu()
out = {
  "names": names,
  "routed": all(getattr(nm, n) is getattr(mm, n) for n in names),
  "snapshot": nm._snapshot is mm._snapshot and torch_npu.npu._snapshot is mm._snapshot,
  "stats_untouched": nm.memory_stats is not mm.memory_stats,
  "added": [n for n in ("_allocation_traceback", "_set_memory_metadata",
                        "_memory_metadata_supported", "caching_allocator_disabled",
                        "mem_get_info") if hasattr(nm, n)],
}
print("RESULT " + json.dumps(out))
"""
    r = run_script(code, env=fake_npu).result
    assert r["routed"] and r["snapshot"] and r["stats_untouched"]
    for n in ("_record_memory_history", "_snapshot", "_dump_snapshot", "memory_snapshot"):
        assert n in r["names"]
    assert len(r["added"]) == 5


def test_use_allocator_installs_plugin_for_npu(fake_npu):
    pytest.importorskip("torch")  # the C++ shim is built against torch
    code = r"""
import json, os
import memsnap, memsnap.memory as mm, memsnap.torch as mt, memsnap._shim
import torch_npu.npu.memory as nm
allocator = mt.use_allocator()
out = {"backend": mt.installed_backend(),
       "names": list(allocator.names[1:]),
       "path_ok": allocator.names[0] == memsnap._shim.path("libmemsnap_torch.so"),
       "runtime": os.environ["MEMSNAP_RUNTIME"]}
mt.patch_torch_npu()
mm._record_memory_history("all", stacks="python")
ptr = nm._fake_tensor_alloc(1 << 20)
out["ptr"] = ptr
out["allocated"] = nm.memory_stats()["allocated_bytes.all.current"]
out["in_trace"] = [e["addr"] for e in mm._snapshot()["device_traces"][0]
                   if e["action"] == "alloc"] == [ptr]
try:
    mt.use_allocator("cuda")
except RuntimeError as e:
    out["second"] = str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code, env=fake_npu).result
    assert r["backend"] == "npu"
    # The C++ shim's entry points: an OOM raises torch.OutOfMemoryError
    # (tests/torch/test_npu.py drives it through a C++ NPUPluggableAllocator).
    assert r["names"] == ["msnap_torch_malloc", "msnap_torch_free"] and r["path_ok"]
    assert r["runtime"] == "sim"  # the environment's choice is kept
    assert r["ptr"] and r["allocated"] >= 1 << 20 and r["in_trace"]
    assert "already installed" in r["second"]


def test_use_allocator_too_late_is_a_clear_error(fake_npu):
    pytest.importorskip("torch")  # the C++ shim is built against torch
    code = r"""
import json
import torch_npu.npu.memory as nm
import memsnap.torch as mt
nm._used = True
try:
    mt.use_allocator("npu")
except RuntimeError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    r = run_script(code, env=fake_npu).result
    assert "before the first npu allocation" in r
    assert "Can't swap an already initialized allocator" in r


def test_use_allocator_cuda_on_cpu_torch():
    torch = pytest.importorskip("torch")
    if torch.backends.cuda.is_built():
        pytest.skip("this torch has CUDA: covered by bench/gpu")
    code = r"""
import json, memsnap.torch as mt
try:
    mt.use_allocator("cuda")
except RuntimeError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    assert "without CUDA" in run_script(code).result


def test_use_allocator_npu_without_torch_npu_says_what_to_do():
    """No torch_npu installed (no stand-in on the path): a
    ModuleNotFoundError that names torch_npu and both ways out."""
    pytest.importorskip("torch")
    code = r"""
import importlib.util, json, memsnap.torch as mt
assert importlib.util.find_spec("torch_npu") is None
try:
    mt.use_allocator("npu")
except ModuleNotFoundError as e:
    print("RESULT " + json.dumps([e.name, str(e), mt.installed_backend()]))
"""
    name, msg, installed = run_script(code).result
    assert name == "torch_npu" and installed is None
    assert "torch_npu is not installed" in msg
    assert "install torch_npu" in msg and "register_device('npu')" in msg


def test_record_function_annotations_and_fx_augmentation():
    pytest.importorskip("torch")
    code = r"""
import json, threading
import torch, torch._utils
import memsnap.memory as mm, memsnap.torch as mt
calls = []
def fake_augment(s):
    calls.append(sorted(s))
    s["augmented"] = True
    return s
torch._utils._augment_memory_snapshot_stack_traces = fake_augment
mm._record_memory_history("all", stacks="python")
with torch.profiler.record_function("outer_region"):
    p = mm.caching_allocator_alloc(1000)
def other_thread():
    with torch.profiler.record_function("thread_region"):
        pass
t = threading.Thread(target=other_thread); t.start(); t.join()
s = mm._snapshot(augment_with_fx_traces=True)
ann = [[a["name"], a["stage"]] for a in s["external_annotations"]]
mm._record_memory_history(None)
mm._record_memory_history("all", stacks="python", global_record_annotations=True)
t = threading.Thread(target=other_thread); t.start(); t.join()
ann2 = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
print("RESULT " + json.dumps({"ann": ann, "ann2": ann2, "augmented": s.get("augmented"),
                              "calls": len(calls)}))
"""
    r = run_script(code).result
    assert r["ann"] == [["outer_region", "START"], ["outer_region", "END"]]
    assert r["ann2"] == [["thread_region", "START"], ["thread_region", "END"]]
    assert r["augmented"] is True and r["calls"] == 1


def test_record_function_annotations_without_use_allocator():
    """_record_memory_history alone (memsnap.torch never imported by the
    user, use_allocator never called) records torch record_function ranges
    as external_annotations with name/stage/device/time_us; disabling
    history removes the hook from record_function again."""
    pytest.importorskip("torch")
    code = r"""
import json, sys, threading
import torch
import memsnap.memory as mm
rf = torch.autograd.profiler.record_function
orig = (rf.__enter__, rf.__exit__)
mm._record_memory_history("all", global_record_annotations=True)
hooked = rf.__enter__ is not orig[0]
with torch.autograd.profiler.record_function("region"):
    p = mm.caching_allocator_alloc(1000)
def other_thread():
    with torch.autograd.profiler.record_function("thread_region"):
        pass
t = threading.Thread(target=other_thread); t.start(); t.join()
s = mm._snapshot()
ann = s["external_annotations"]
alloc_t = [e["time_us"] for e in s["device_traces"][0] if e["action"] == "alloc"]
mm.caching_allocator_delete(p)
mm._record_memory_history(None)
restored = (rf.__enter__, rf.__exit__) == orig
mm._record_memory_history("all")
with torch.autograd.profiler.record_function("after"):
    pass
ann_after = [a["name"] for a in mm._snapshot()["external_annotations"]]
print("RESULT " + json.dumps({"ann": ann, "hooked": hooked, "restored": restored,
                              "alloc_t": alloc_t, "ann_after": ann_after,
                              "mt": "memsnap.torch" in sys.modules}))
"""
    r = run_script(code).result
    assert r["hooked"] is True and r["mt"] is True
    ann = r["ann"]
    assert [(a["name"], a["stage"]) for a in ann] == [
        ("region", "START"), ("region", "END"),
        ("thread_region", "START"), ("thread_region", "END")]
    for a in ann:
        assert a["device"] == 0
        assert isinstance(a["time_us"], int) and a["time_us"] > 0
    # The allocation happened inside the range.
    assert ann[0]["time_us"] <= r["alloc_t"][0] <= ann[1]["time_us"]
    assert r["restored"] is True
    # Re-enabled (thread-local this time): the hook is back.
    assert "after" in r["ann_after"]


def test_record_function_annotations_when_torch_is_imported_later():
    """History enabled before torch is imported: torch's import (here from
    another thread) installs the record_function hook once torch's
    module has run, for the thread that enabled history; torch keeps its
    own loader.  History off before the import: no hook, memsnap.torch
    not loaded, and the watch left sys.meta_path all the same (it stayed
    there for ever)."""
    pytest.importorskip("torch")
    code = r"""
import json, subprocess, sys, threading
import memsnap.memory as mm
assert "torch" not in sys.modules
mm._record_memory_history("all")
t = threading.Thread(target=lambda: __import__("torch")); t.start(); t.join()
import torch
def other_thread():
    with torch.profiler.record_function("thread_region"):
        pass
with torch.profiler.record_function("late"):
    p = mm.caching_allocator_alloc(1000)
    t = threading.Thread(target=other_thread); t.start(); t.join()
ann = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
mm.caching_allocator_delete(p)
loader = type(torch.__spec__.loader).__name__, type(torch.__loader__).__name__
off = subprocess.run([sys.executable, "-c", '''
import sys, memsnap.memory as mm
mm._record_memory_history("all"); mm._record_memory_history(None)
import torch
with torch.profiler.record_function("off"):
    pass
print("memsnap.torch" in sys.modules, mm._snapshot()["external_annotations"],
      sum(type(f).__name__ == "_TorchImportWatch" for f in sys.meta_path))
'''], capture_output=True, text=True)
print("RESULT " + json.dumps({"ann": ann, "loader": loader, "off": off.stdout + off.stderr}))
"""
    r = run_script(code).result
    assert r["ann"] == [["late", "START"], ["late", "END"]], r
    assert r["loader"] == ["SourceFileLoader", "SourceFileLoader"], r
    assert r["off"] == "False [] 0\n", r


def test_history_enabled_again_while_another_thread_imports_torch():
    """History on, torch imported by one thread, history enabled again by
    another while torch's module still runs: the second thread imported
    memsnap.torch, hence torch's submodules, beside the first (torch's
    import failed, "cannot initialize type ...: an object with that name
    is already defined", or the process crashed).  Now it leaves the hooks
    to the watch's loader, which installs them once torch has run."""
    pytest.importorskip("torch")
    code = r"""
import json, sys, threading, time
import memsnap.memory as mm
mm._record_memory_history("all")
err = []
def imp():
    try:
        __import__("torch")
    except Exception as e:
        err.append(repr(e))
t = threading.Thread(target=imp); t.start()
time.sleep(0.3)
mm._record_memory_history("all")
t.join()
import torch
with torch.profiler.record_function("late"):
    p = mm.caching_allocator_alloc(1000)
ann = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
mm.caching_allocator_delete(p)
print("RESULT " + json.dumps({"err": err, "ann": ann}))
"""
    r = run_script(code).result
    assert r["err"] == [], r
    assert r["ann"] == [["late", "START"], ["late", "END"]], r


def test_torch_imported_later_after_reload_of_memsnap_memory():
    """importlib.reload(memsnap.memory) with history on leaves its first
    finder in sys.meta_path and history on again installs a second: each
    asked the other for torch's spec (RecursionError at `import torch`).
    Now torch imports and its record_function ranges are recorded once."""
    pytest.importorskip("torch")
    code = r"""
import importlib, json, sys
import memsnap.memory as mm
assert "torch" not in sys.modules
mm._record_memory_history("all")
importlib.reload(mm)
mm._record_memory_history("all")
watches = sum(type(f).__name__ == "_TorchImportWatch" for f in sys.meta_path)
import torch
with torch.profiler.record_function("late"):
    p = mm.caching_allocator_alloc(1000)
ann = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
mm.caching_allocator_delete(p)
left = sum(type(f).__name__ == "_TorchImportWatch" for f in sys.meta_path)
print("RESULT " + json.dumps({"watches": watches, "ann": ann, "left": left}))
"""
    r = run_script(code).result
    assert r["watches"] == 2, r
    assert r["ann"] == [["late", "START"], ["late", "END"]], r
    # torch imported: no watch is left in sys.meta_path
    assert r["left"] == 0, r


def test_torch_spec_found_while_history_is_on_keeps_its_loader_methods():
    """importlib.util.find_spec("torch") while history is on: the chained
    loader answers as torch's own (is_package, get_filename, the resource
    reader); it had exec_module and create_module only (AttributeError)."""
    pytest.importorskip("torch")
    code = r"""
import importlib.util, json, os, sys
import memsnap.memory as mm
mm._record_memory_history("all")
spec = importlib.util.find_spec("torch")
lo = spec.loader
r = {"chained": type(lo).__name__, "pkg": lo.is_package("torch"),
     "file": lo.get_filename("torch") == spec.origin,
     "reader": lo.get_resource_reader("torch") is not None,
     "loaded": "torch" in sys.modules}
print("RESULT " + json.dumps(r))
"""
    r = run_script(code).result
    assert r == {"chained": "_TorchLoader", "pkg": True, "file": True,
                 "reader": True, "loaded": False}, r


def test_patch_torch_cuda_answers_from_memsnap():
    """patch_torch_cuda() on the CPU-only torch: torch.cuda's statistics,
    history and snapshot functions are memsnap's (torch would raise or
    answer for its own allocator)."""
    pytest.importorskip("torch")
    code = r"""
import json
import torch
import memsnap.memory as mm, memsnap.torch as mt
names = mt.patch_torch_cuda()
torch.cuda.memory._record_memory_history("all", stacks="python")
p = torch.cuda.memory.caching_allocator_alloc(3 << 20)
out = {
  "names": names,
  "allocated": torch.cuda.memory_allocated(),
  "mm": mm.memory_allocated(),
  "stats": torch.cuda.memory_stats()["allocated_bytes.all.current"],
  "reserved": torch.cuda.memory_reserved("cuda:0"),
  "actions": [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]],
  "same_fn": torch.cuda.memory_allocated is mm.memory_allocated,
}
torch.cuda.memory.caching_allocator_delete(p)
torch.cuda.empty_cache()
out["after"] = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    for n in ("memory_stats", "memory_allocated", "_record_memory_history",
              "_snapshot", "_dump_snapshot", "empty_cache"):
        assert n in r["names"]
    assert r["allocated"] == r["mm"] == r["stats"] >= 3 << 20
    assert r["reserved"] >= r["allocated"]
    assert r["actions"] == ["segment_alloc", "alloc"] and r["same_fn"]
    assert r["after"] == [0, 0]


def test_record_function_name_with_a_nul_character():
    """torch's record_function takes a name holding a NUL character; with
    history on, memsnap's hook raised ValueError ("embedded null
    character") out of the ``with``, after torch had entered the range.
    The range now runs, a model trains inside it, and the annotation
    holds the name up to the NUL (memsnap stores C strings)."""
    pytest.importorskip("torch")
    code = r"""
import json, torch
import memsnap.memory as mm
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters())
mm._record_memory_history("all", stacks="python")
with torch.profiler.record_function("step\x00 0"):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    p = mm.caching_allocator_alloc(1000)
mm.caching_allocator_delete(p)
ann = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
print("RESULT " + json.dumps(ann))
"""
    r = run_script(code).result
    assert ["step", "START"] in r and ["step", "END"] in r, r
    assert ["Optimizer.step#AdamW.step", "START"] in r, r
