"""The stand-in torch_npu.npu.memory: the pluggable-allocator API and the
statistics functions that go to the current allocator."""
import ctypes

from .. import _C

ORIGINAL = "torch_npu original"


def _record_memory_history(*a, **k):
    return ORIGINAL


def _snapshot(*a, **k):
    return ORIGINAL


def _dump_snapshot(*a, **k):
    return ORIGINAL


def memory_snapshot(*a, **k):
    return ORIGINAL


class NPUPluggableAllocator:
    """As torch_npu: dlopen the library, look the functions up by name."""

    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        if alloc_fn is None or free_fn is None:
            raise RuntimeError("alloc_fn or free_fn is None")
        self._allocator = _C._npu_customAllocator(alloc_fn, free_fn)
        self.names = (path_to_so_file, alloc_fn_name, free_fn_name)

    def allocator(self):
        return self._allocator


def change_current_allocator(allocator):
    _C._npu_changeCurrentAllocator(allocator.allocator())


def memory_stats(device=None):
    d = 0 if device is None else int(device)
    return {k: _C._npu_memoryStat(d, k) for k in (
        "allocated_bytes.all.current", "allocated_bytes.all.peak",
        "reserved_bytes.all.current", "allocation.all.current", "num_device_alloc")}


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def reset_peak_memory_stats(device=None):
    _C._npu_resetPeakMemoryStats(0 if device is None else int(device))


def empty_cache():
    _C._npu_emptyCache()


def set_per_process_memory_fraction(fraction, device=None):
    _C._npu_setMemoryFraction(fraction, 0 if device is None else int(device))
