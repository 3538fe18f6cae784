"""The C++ shim libraries of memsnap.torch, loaded with ctypes.

``libmemsnap_torch.so`` (python/memsnap/csrc/: pluggable.cpp, device.cpp,
autocast.cpp, record.cpp, and cuda_hooks.cpp with a CUDA torch) and ``libmemsnap_torch_npu.so``
(npu.cpp, with torch_npu) are built by meson next to libmemsnap.so when a
C++ compiler and torch (torch_npu) are found at build time.  They link
against the installed torch, so torch is imported before they are loaded.
"""

from __future__ import annotations

import ctypes
import functools
import os

_DIR = os.path.dirname(os.path.abspath(__file__))

TORCH_LIB = "libmemsnap_torch.so"
NPU_LIB = "libmemsnap_torch_npu.so"

# c10::DeviceType values msnap_torch_record_functions / _record_device take
# (record.cpp checks them): whose current device an annotation names.
DEVICE_NONE = -1  # device 0
DEVICE_CUDA = 1
DEVICE_PRIVATEUSE1 = 20  # memsnap's registered device, torch_npu's npu

# msnap_torch_record_callbacks() bits
RF_ANNOTATIONS = 1
RF_THREAD_LOCAL = 2
RF_COMPILE_CONTEXT = 4
RF_STALE = 8


def path(name: str) -> str:
    """Absolute path of a shim library in the installed package."""
    return os.path.join(_DIR, name)


def _missing(p: str, what: str) -> RuntimeError:
    return RuntimeError(
        f"memsnap: {p} is missing: the C++ shim for {what} was not built "
        f"(memsnap builds it when a C++ compiler and {what} are found at "
        f"build time; reinstall memsnap with them present, e.g. "
        f"`pip install --no-build-isolation memsnap`)"
    )


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


@functools.lru_cache(maxsize=None)
def torch_lib() -> ctypes.CDLL:
    """libmemsnap_torch.so with its entry points typed."""
    import torch  # noqa: F401  (libc10 / libtorch first)

    p = path(TORCH_LIB)
    if not os.path.exists(p):
        raise _missing(p, "torch")
    lib = ctypes.CDLL(p)
    _fn(lib, "msnap_torch_device_check", ctypes.c_char_p)
    _fn(lib, "msnap_torch_device_init", ctypes.c_char_p)
    _fn(lib, "msnap_torch_current_device", ctypes.c_int)
    _fn(lib, "msnap_torch_set_device", ctypes.c_char_p, ctypes.c_int)
    _fn(lib, "msnap_torch_current_stream", ctypes.c_int64, ctypes.c_int)
    _fn(lib, "msnap_torch_worker_threads", ctypes.c_int)
    _fn(lib, "msnap_torch_cpu_operators", ctypes.c_char_p)
    # record.cpp: record_function ranges -> external_annotations and
    # compile context (at::RecordFunction callbacks)
    _fn(lib, "msnap_torch_record_functions", ctypes.c_char_p, ctypes.c_int,
        ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_int)
    _fn(lib, "msnap_torch_record_device", None, ctypes.c_int)
    _fn(lib, "msnap_torch_record_callbacks", ctypes.c_int)
    if hasattr(lib, "msnap_torch_cuda_install_hooks"):  # CUDA torch only
        _fn(lib, "msnap_torch_cuda_install_hooks", ctypes.c_char_p)
    return lib


@functools.lru_cache(maxsize=None)
def npu_lib() -> ctypes.CDLL:
    """libmemsnap_torch_npu.so (built against torch_npu) with its entry
    points typed.  MEMSNAP_TORCH_NPU_SHIM names another build of it (the
    tests build one against stand-in torch_npu headers)."""
    import torch  # noqa: F401
    import torch_npu  # noqa: F401  (libtorch_npu first)

    p = os.environ.get("MEMSNAP_TORCH_NPU_SHIM") or path(NPU_LIB)
    if not os.path.exists(p):
        raise _missing(p, "torch_npu")
    lib = ctypes.CDLL(p)
    _fn(lib, "msnap_npu_install_runtime", ctypes.c_char_p)
    return lib


def addr(lib: ctypes.CDLL, name: str) -> int:
    """The address of an exported function (for the set_*_fn hooks)."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def text(message: bytes) -> str:
    """A message of the C shims as text: their errors quote settings as
    given (an alloc conf with bytes that are not UTF-8), shown with U+FFFD
    there as memsnap.memory shows them, never a UnicodeDecodeError in place
    of the error."""
    return message.decode("utf-8", "replace")
