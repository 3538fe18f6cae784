"""memsnap.torch: use_allocator, patch_torch_npu (against a stand-in
torch_npu package written to tmp_path), record_function annotations, FX
augmentation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    msg = run_script(code).result
    assert "without CUDA" in msg and "register_device('npu')" in msg


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
    as external_annotations with name/stage/device/time_us, through the
    C++ shim's at::RecordFunction callback (record_function's class is not
    wrapped as well: a range is recorded once); disabling history removes
    the callback again."""
    pytest.importorskip("torch")
    code = r"""
import json, sys, threading
import torch
import memsnap.memory as mm, memsnap._shim as sh
rf = torch.autograd.profiler.record_function
orig = (rf.__enter__, rf.__exit__)
mm._record_memory_history("all", global_record_annotations=True)
hooked = sh.torch_lib().msnap_torch_record_callbacks()
wrapped = rf.__enter__ is not orig[0]
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
off = sh.torch_lib().msnap_torch_record_callbacks()
mm._record_memory_history("all")
with torch.autograd.profiler.record_function("after"):
    pass
ann_after = [a["name"] for a in mm._snapshot()["external_annotations"]]
print("RESULT " + json.dumps({"ann": ann, "hooked": hooked, "restored": restored,
                              "wrapped": wrapped, "off": off,
                              "alloc_t": alloc_t, "ann_after": ann_after,
                              "mt": "memsnap.torch" in sys.modules}))
"""
    r = run_script(code).result
    # a global annotation callback, no compile-context one; no wrapper
    assert r["hooked"] == 1 and r["wrapped"] is False and r["mt"] is True, r
    assert r["off"] == 0, r
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
    to the watch's loader, which installs them once torch has run.
    A finder holds torch's import at ``torch.functional`` (imported by
    torch/__init__.py's body) until the second thread has enabled history:
    the race is exact, no sleep."""
    pytest.importorskip("torch")
    code = r"""
import json, sys, threading
import memsnap.memory as mm
mm._record_memory_history("all")
reached, go = threading.Event(), threading.Event()
released = []
class Hold:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.functional":
            reached.set()
            # False: the enabling thread blocked on torch's import
            released.append(go.wait(60))
        return None
sys.meta_path.insert(0, Hold())
err = []
def imp():
    try:
        __import__("torch")
    except Exception as e:
        err.append(repr(e))
t = threading.Thread(target=imp); t.start()
held = reached.wait(60)
running = getattr(sys.modules.get("torch"), "__spec__", None)
running = bool(getattr(running, "_initializing", False))
mm._record_memory_history("all")
go.set()
t.join()
import torch
with torch.profiler.record_function("late"):
    p = mm.caching_allocator_alloc(1000)
ann = [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
mm.caching_allocator_delete(p)
print("RESULT " + json.dumps({"err": err, "ann": ann, "held": held, "running": running,
                              "released": released}))
"""
    r = run_script(code).result
    assert r["held"] is True and r["running"] is True, r
    assert r["released"] == [True], r
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


def test_compiled_model_sets_compile_context():
    """torch.compile's "Torch-Compiled Region: N/M" range is opened from
    C++ (dynamo's eval frame, RecordScope::FUNCTION): with
    compile_context=True the shim's callback makes it the compile_context
    of the entries recorded inside, as PyTorch's CUDA allocator.  A model
    on the memsnap device compiled with backend="aot_eager" (inductor
    generates no code for a PrivateUse1 device: KeyError 'npu'), and an
    inductor-compiled CPU function whose graph break allocates through
    memsnap.  A record_function range around them is recorded exactly
    once (the callback, not also the Python class), also for a range
    opened in backward, which autograd runs in its device thread (the
    thread-local callback follows the enabling thread's state there, as
    torch's); a Python range merely named "Torch-Compiled Region" is an
    annotation, not a compile context (USER_SCOPE, as in torch).  History
    off: no callback is left."""
    pytest.importorskip("torch")
    code = r"""
import collections, json
import torch
import memsnap.memory as mm, memsnap.torch as mt, memsnap._shim as sh
mt.register_device("npu")
lib = sh.torch_lib()
rf = torch.autograd.profiler.record_function
orig = (rf.__enter__, rf.__exit__)
class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        with torch.profiler.record_function("in_backward"):
            return g * 2
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to("npu")
compiled = torch.compile(model, backend="aot_eager")
@torch.compile
def cpu_fn(a):
    b = a.sin() + 1
    torch._dynamo.graph_break()
    p = mm.caching_allocator_alloc(4096)
    return b.cos(), p
before = lib.msnap_torch_record_callbacks()
mm._record_memory_history("all", compile_context=True)
on = lib.msnap_torch_record_callbacks()
x = torch.randn(8, 16, device="npu", requires_grad=True)
with torch.profiler.record_function("step"):
    compiled(Twice.apply(x)).sum().backward()
_, p = cpu_fn(torch.randn(64))
with torch.profiler.record_function("Torch-Compiled Region: 9/9"):
    q = mm.caching_allocator_alloc(1000)
s = mm._snapshot()
mm.caching_allocator_delete(p); mm.caching_allocator_delete(q)
stages = collections.Counter(f"{a['name']}|{a['stage']}" for a in s["external_annotations"])
cc = collections.defaultdict(list)
for e in s["device_traces"][0]:
    cc[e["compile_context"]].append([e["action"], e["size"]])
mm._record_memory_history(None)
print("RESULT " + json.dumps({
    "before": before, "on": on, "off": lib.msnap_torch_record_callbacks(),
    "wrapped": (rf.__enter__, rf.__exit__) != orig, "stages": stages, "cc": cc}))
"""
    r = run_script(code, timeout=600).result
    assert r["before"] == 0 and r["off"] == 0, r
    assert r["on"] == 1 | 2 | 4, r  # thread-local annotations + compile context
    assert r["wrapped"] is False, r
    st = r["stages"]
    for name in ("step", "in_backward", "Torch-Compiled Region: 9/9"):
        assert st[f"{name}|START"] == 1 and st[f"{name}|END"] == 1, st
    cc = r["cc"]
    regions = sorted(k for k in cc if k.startswith("Torch-Compiled Region: "))
    assert len(regions) == 2, cc  # the model's frame and cpu_fn's
    model_entries = [a for k in regions for a, _ in cc[k] if a == "alloc"]
    assert len(model_entries) >= 3, cc  # the compiled forward allocates
    assert any(["alloc", 4096] in cc[k] for k in regions), cc
    assert ["alloc", 1000] in cc["N/A"], cc  # a Python range is no region
    assert set(cc) == {"N/A", *regions}, cc


def test_record_function_once_per_thread_and_python_fallback():
    """global_record_annotations=False records the enabling thread's ranges
    only; True every thread's; each once.  Without the C++ shim (made
    missing here) memsnap wraps the Python record_function class instead:
    the same annotations, and a Python range named "Torch-Compiled
    Region..." is the compile context (torch.compile's own C++ range is not
    seen then); history off restores the class."""
    pytest.importorskip("torch")
    code = r"""
import json, sys, threading
import torch
import memsnap._shim as sh
missing = "--fallback" in sys.argv
if missing:
    real = sh.path
    sh.path = lambda name: "/nonexistent/" + name if name == sh.TORCH_LIB else real(name)
import memsnap.memory as mm, memsnap.torch as mt
rf = torch.autograd.profiler.record_function
orig = (rf.__enter__, rf.__exit__)
def other():
    with torch.profiler.record_function("other_thread"):
        pass
out = {}
for glob in (False, True):
    mm._record_memory_history("all", compile_context=True, global_record_annotations=glob,
                              clear_history=True)
    with torch.profiler.record_function("main_thread"):
        t = threading.Thread(target=other); t.start(); t.join()
    with torch.profiler.record_function("Torch-Compiled Region: 3/1"):
        p = mm.caching_allocator_alloc(1000)
    s = mm._snapshot()
    mm.caching_allocator_delete(p)
    out[str(glob)] = {
        "ann": [[a["name"], a["stage"]] for a in s["external_annotations"]],
        "cc": [e["compile_context"] for e in s["device_traces"][0] if e["action"] == "alloc"],
        "wrapped": (rf.__enter__, rf.__exit__) != orig}
    mm._record_memory_history(None)
out["restored"] = (rf.__enter__, rf.__exit__) == orig
out["shim"] = mt._rf_lib is not None
print("RESULT " + json.dumps(out))
"""
    main = [["main_thread", "START"], ["main_thread", "END"]]
    other = [["other_thread", "START"], ["other_thread", "END"]]
    region = [["Torch-Compiled Region: 3/1", "START"], ["Torch-Compiled Region: 3/1", "END"]]
    for fallback in (False, True):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)]
                              + (["--fallback"] if fallback else []),
                              env=base_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        r = json.loads(line[len("RESULT "):])
        assert r["shim"] is (not fallback), r
        assert r["restored"] is True, r
        thread_local, everywhere = r["False"], r["True"]
        # the other thread's START/END lie inside main_thread's range
        assert thread_local["ann"] == main + region, r
        assert everywhere["ann"] == [main[0], *other, main[1], *region], r
        for one in (thread_local, everywhere):
            assert one["wrapped"] is fallback, r
            assert one["cc"] == (["Torch-Compiled Region: 3/1"] if fallback else ["N/A"]), r


def test_record_function_callback_of_a_thread_turned_off_elsewhere():
    """History enabled by one thread (a thread-local callback there) and
    disabled by another, which cannot remove it from that thread: it is
    switched off (bit 8) and no second thread-local one is added while it
    exists, so nothing is recorded twice; the thread that holds it removes
    it when it next disables history."""
    pytest.importorskip("torch")
    code = r"""
import json, threading
import torch
import memsnap.memory as mm, memsnap._shim as sh
lib = sh.torch_lib()
def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn())); t.start(); t.join()
    return out[0]
def rng(name):
    with torch.profiler.record_function(name):
        pass
def names():
    return [[a["name"], a["stage"]] for a in mm._snapshot()["external_annotations"]]
bits = {}
mm._record_memory_history("all")
bits["main_on"] = lib.msnap_torch_record_callbacks()
in_thread(lambda: mm._record_memory_history(None))
bits["off_elsewhere"] = lib.msnap_torch_record_callbacks()
rng("while_off")
def other_enables():
    mm._record_memory_history("all")
    rng("other")
    return lib.msnap_torch_record_callbacks()
bits["other_on"] = in_thread(other_enables)
rng("main_not_enabling")
ann = names()
mm._record_memory_history(None)
bits["main_off"] = lib.msnap_torch_record_callbacks()
mm._record_memory_history("all")
bits["main_on_again"] = lib.msnap_torch_record_callbacks()
rng("main_again")
ann2 = names()
mm._record_memory_history(None)
bits["end"] = lib.msnap_torch_record_callbacks()
print("RESULT " + json.dumps({"bits": bits, "ann": ann, "ann2": ann2}))
"""
    r = run_script(code).result
    assert r["bits"] == {"main_on": 1 | 2, "off_elsewhere": 8, "other_on": 1 | 8,
                         "main_off": 0, "main_on_again": 1 | 2, "end": 0}, r
    assert r["ann"] == [["other", "START"], ["other", "END"]], r
    assert r["ann2"] == [["main_again", "START"], ["main_again", "END"]], r
