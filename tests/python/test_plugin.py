"""libmemsnap.so's pluggable-allocator entry points, called through ctypes
exactly as torch.cuda.memory.CUDAPluggableAllocator / torch_npu's
NPUPluggableAllocator call them:

    void *alloc(ssize_t size, int device, stream_t stream)
    void  free(void *ptr, ssize_t size, int device, stream_t stream)
"""

from __future__ import annotations

import ctypes

import memsnap
from memsnap import _memsnap
from conftest import base_env, run_script


def load():
    lib = ctypes.CDLL(memsnap.library_path())
    alloc = lib.msnap_plugin_malloc
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = lib.msnap_plugin_free
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib, alloc, free


def test_exported_names_are_the_extension_library():
    lib, _, _ = load()
    seen = _memsnap.plugin_entry_points()
    for name, addr in seen.items():
        assert ctypes.cast(getattr(lib, name), ctypes.c_void_p).value == addr, name


SCRIPT = r"""
import ctypes, json
import memsnap, memsnap.memory as mm
lib = ctypes.CDLL(memsnap.library_path())
alloc = lib.msnap_plugin_malloc
alloc.restype = ctypes.c_void_p
alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free = lib.msnap_plugin_free
free.restype = None
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
mm._record_memory_history("all", stacks="python")
p = alloc(4096, 0, None)
q = alloc(3 << 20, 0, ctypes.c_void_p(0))
out = {"p": p, "q": q, "allocated": mm.memory_allocated()}
snap = mm._snapshot()
out["alloc_addrs"] = [e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
out["live"] = sorted(b["address"] for s in snap["segments"] for b in s["blocks"]
                     if b["state"] == "active_allocated")
free(p, 4096, 0, None)
free(q, 3 << 20, 0, None)
out["after"] = mm.memory_allocated()
out["zero"] = alloc(0, 0, None)
free(None, 0, 0, None)
print("RESULT " + json.dumps(out))
"""


def test_plugin_allocations_appear_in_snapshot():
    r = run_script(SCRIPT).result
    assert r["p"] and r["q"]
    assert r["alloc_addrs"] == [r["p"], r["q"]]
    assert r["live"] == sorted([r["p"], r["q"]])
    assert r["allocated"] >= 4096 + (3 << 20)
    assert r["after"] == 0
    assert r["zero"] is None


def test_plugin_bad_free_is_reported_not_fatal():
    code = r"""
import ctypes, memsnap
lib = ctypes.CDLL(memsnap.library_path())
lib.msnap_plugin_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.msnap_plugin_free(ctypes.c_void_p(0xdead000), 16, 0, None)
print("RESULT 1")
"""
    proc = run_script(code)
    assert proc.result == 1
    assert "0xdead000" in proc.stderr


def test_base_allocation_is_the_segment():
    """msnap_plugin_get_base_allocation is PyTorch's getBaseAllocation: the
    start and size of the segment holding the allocation (IPC handles)."""
    code = r"""
import ctypes, json, memsnap
import memsnap.memory as mm
lib = ctypes.CDLL(memsnap.library_path())
f = lib.msnap_plugin_get_base_allocation
f.restype = ctypes.c_void_p
f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
a = mm.caching_allocator_alloc(4096)
b = mm.caching_allocator_alloc(4096)
size = ctypes.c_size_t()
base = f(b, ctypes.byref(size))
bad = f(0xdead000, ctypes.byref(size))
print("RESULT " + json.dumps({"a": a, "b": b, "base": base, "size": size.value,
                              "bad": bad}))
"""
    r = run_script(code).result
    assert r["b"] != r["a"] and r["base"] == min(r["a"], r["b"])
    assert r["bad"] is None
