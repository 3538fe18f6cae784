"""The stand-in of torch_npu._C: ctypes over fake_torch_npu.cpp."""
import ctypes

import torch

from . import _lib

_lib.fake_npu_custom_allocator.restype = ctypes.c_void_p
_lib.fake_npu_custom_allocator.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
_lib.fake_npu_set_hook.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64]
_lib.fake_npu_change_current.argtypes = [ctypes.c_void_p]
_lib.fake_npu_alloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
_lib.fake_npu_free.argtypes = [ctypes.c_void_p]
_lib.fake_npu_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
_lib.fake_npu_erase_stream.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
_lib.fake_npu_empty_cache.argtypes = [ctypes.c_int]
_lib.fake_npu_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
_lib.fake_npu_base_alloc.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_size_t)]
_lib.fake_npu_stat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
_lib.fake_npu_reset_peak.argtypes = [ctypes.c_int]
_lib.fake_npu_counter.restype = ctypes.c_long
_lib.fake_npu_counter.argtypes = [ctypes.c_char_p]
_lib.fake_npu_stream_handle.restype = ctypes.c_uint64
_lib.fake_npu_stream_handle.argtypes = [ctypes.c_int, ctypes.c_int64]
_lib.fake_npu_last_error.restype = ctypes.c_char_p
_lib.fake_npu_set_stream.argtypes = [ctypes.c_int, ctypes.c_int64]


def _check(kind):
    """What torch's error translation does with the C++ exception."""
    if kind == 1:
        raise torch.OutOfMemoryError(_lib.fake_npu_last_error().decode())
    if kind:
        raise RuntimeError(_lib.fake_npu_last_error().decode())


_HOOKS = ("init", "reset", "memory_fraction", "base_alloc", "record_stream",
          "erase_stream", "get_device_stats", "reset_peak_status")


class _NPUPluggableAllocator:
    """torch_npu._C._NPUPluggableAllocator: set_<hook>_fn(func_ptr)."""

    def __init__(self, handle):
        self._handle = handle

    def _set(self, name, func_ptr):
        if _lib.fake_npu_set_hook(self._handle, name.encode(), func_ptr) != 0:
            raise ValueError(name)


def _setter(name):
    def set_fn(self, func_ptr):
        self._set(name, func_ptr)
    set_fn.__name__ = f"set_{name}_fn"
    return set_fn


for _h in _HOOKS:
    setattr(_NPUPluggableAllocator, f"set_{_h}_fn", _setter(_h))


def _npu_customAllocator(malloc_ptr, free_ptr):
    return _NPUPluggableAllocator(_lib.fake_npu_custom_allocator(malloc_ptr, free_ptr))


def _npu_changeCurrentAllocator(allocator):
    _check(_lib.fake_npu_change_current(allocator._handle))


def _npu_emptyCache():
    _check(_lib.fake_npu_empty_cache(1))


def _npu_setMemoryFraction(fraction, device):
    _check(_lib.fake_npu_set_memory_fraction(fraction, device))


def _npu_memoryStat(device, name):
    out = ctypes.c_int64()
    _check(_lib.fake_npu_stat(device, name.encode(), ctypes.byref(out)))
    return out.value


def _npu_resetPeakMemoryStats(device):
    _check(_lib.fake_npu_reset_peak(device))


# Test helpers: what tensors and torch_npu's kernels do.
def _fake_alloc(size):
    out = ctypes.c_void_p()
    _check(_lib.fake_npu_alloc(size, ctypes.byref(out)))
    return out.value


def _fake_free(ptr):
    _check(_lib.fake_npu_free(ptr))


def _fake_record_stream(ptr, device, stream_id):
    _check(_lib.fake_npu_record_stream(ptr, device, stream_id))


def _fake_erase_stream(ptr, device, stream_id):
    _check(_lib.fake_npu_erase_stream(ptr, device, stream_id))


def _fake_base_alloc(ptr):
    base, size = ctypes.c_void_p(), ctypes.c_size_t()
    _check(_lib.fake_npu_base_alloc(ptr, ctypes.byref(base), ctypes.byref(size)))
    return base.value, size.value


def _fake_launch(device):
    _lib.fake_npu_launch(device)


def _fake_counter(name):
    return _lib.fake_npu_counter(name.encode())


def _fake_stream_handle(device, stream_id):
    return _lib.fake_npu_stream_handle(device, stream_id)


def _fake_set_stream(device, stream_id):
    _lib.fake_npu_set_stream(device, stream_id)
