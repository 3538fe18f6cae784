"""memsnap.predict._capi -- private allocators of libmemsnap through ctypes.

``memsnap.memory`` drives the one process-wide allocator
(``msnap_default()``).  A prediction needs one allocator per configuration
(the run's own, plus every what-if), each on its own simulated device of
``--memory`` bytes, and a fresh set for every prediction made in one
process.  ``include/memsnap.h`` has exactly that (``msnap_allocator_create``
with a profile, an alloc-conf string, a sim device count and size), so this
module binds those functions of the installed ``libmemsnap.so`` (the library
``memsnap.library_path()`` names, the very one the ``_memsnap`` extension
links) with ctypes; nothing here is a second implementation.

Interpreter frames in the trace come from the frame hook that the
``_memsnap`` extension installs when it is imported (process-wide, in
libmemsnap), so this module imports it first.  The library is opened with
``ctypes.PyDLL``: the GIL stays held during a call, as when the extension
calls the same functions, so the hook reads the calling thread's frames
directly.

Structure layouts below follow ``include/memsnap.h`` field by field
(``msnap_options_t``, ``msnap_stats_t`` from its X-macro lists,
``msnap_history_options_t``, ``msnap_snapshot_options_t``); each
``*_init`` function of the library writes the C ``sizeof`` into ``size``,
which :func:`_lib` compares with the ctypes layout once.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import threading

from .. import _memsnap  # noqa: F401  (installs the interpreter frame hook)
from .. import library_path

c_u32, c_u64, c_i64, c_int = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int

# Error codes (MSNAP_ERRNO_MAP in include/memsnap.h).
EOOM = -2
EREJECTED = -15

PROFILES = {"npu": 0, "cuda": 1}


class _Options(ctypes.Structure):
    _fields_ = [
        ("size", c_u32), ("version", c_u32), ("profile", c_int),
        ("runtime_name", ctypes.c_char_p), ("runtime", ctypes.c_void_p),
        ("alloc_conf", ctypes.c_char_p), ("caching_disabled", c_int),
        ("sim_devices", c_int), ("sim_memory", c_u64),
        ("error_buf", ctypes.c_void_p), ("error_buf_len", ctypes.c_size_t),
        ("sim_host_backed", c_int),
    ]


class _Stat(ctypes.Structure):
    _fields_ = [("current", c_i64), ("peak", c_i64), ("allocated", c_i64), ("freed", c_i64)]


# MSNAP_STAT_ARRAY_FIELDS, MSNAP_STAT_FIELDS, MSNAP_COUNTER_FIELDS.
STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
STAT_SINGLES = ("oversize_allocations", "oversize_segments")
COUNTERS = ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
            "num_device_alloc", "num_device_free", "num_oom_rejections")
STAT_TYPES = ("all", "small_pool", "large_pool")


class Stats(ctypes.Structure):
    _fields_ = ([("size", c_u32), ("version", c_u32)]
                + [(n, _Stat * 3) for n in STAT_ARRAYS]
                + [(n, _Stat) for n in STAT_SINGLES]
                + [(n, c_i64) for n in COUNTERS])


class _HistoryOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_u32), ("version", c_u32), ("enabled", ctypes.c_bool),
        ("context", c_int), ("stacks", ctypes.c_uint), ("max_entries", c_u64),
        ("clear_history", ctypes.c_bool), ("compile_context", ctypes.c_bool),
        ("global_record_annotations", ctypes.c_bool), ("skip_actions", c_u32),
        ("record_device", ctypes.c_bool), ("record_host", ctypes.c_bool),
    ]


class _MempoolId(ctypes.Structure):
    _fields_ = [("first", c_u64), ("second", c_u64)]


class _SnapshotOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_u32), ("version", c_u32), ("device", c_int),
        ("mempool", _MempoolId), ("include_traces", ctypes.c_bool),
        ("segments_only", ctypes.c_bool),
    ]


_P = ctypes.c_void_p
_SIGNATURES = {
    "msnap_options_init": (None, [ctypes.POINTER(_Options)]),
    "msnap_allocator_create": (c_int, [ctypes.POINTER(_Options), ctypes.POINTER(_P)]),
    "msnap_allocator_destroy": (None, [_P]),
    "msnap_last_error": (ctypes.c_char_p, []),
    "msnap_strerror": (ctypes.c_char_p, [c_int]),
    "msnap_malloc": (c_int, [_P, c_int, ctypes.c_size_t, c_u64, ctypes.POINTER(c_u64)]),
    "msnap_free": (c_int, [_P, c_u64]),
    "msnap_record_stream": (c_int, [_P, c_u64, c_u64]),
    "msnap_empty_cache": (c_int, [_P, c_int]),
    "msnap_set_allocator_settings": (c_int, [_P, ctypes.c_char_p]),
    "msnap_allocator_settings": (ctypes.c_char_p, [_P]),
    "msnap_set_memory_fraction": (c_int, [_P, c_int, ctypes.c_double]),
    "msnap_mem_get_info": (c_int, [_P, c_int, ctypes.POINTER(ctypes.c_size_t),
                                   ctypes.POINTER(ctypes.c_size_t)]),
    "msnap_stats_get": (c_int, [_P, c_int, ctypes.POINTER(Stats)]),
    "msnap_reset_peak_stats": (c_int, [_P, c_int]),
    "msnap_memory_summary": (c_int, [_P, c_int, ctypes.c_bool, ctypes.POINTER(_P)]),
    "msnap_free_string": (None, [_P]),
    "msnap_check_invariants": (c_int, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "msnap_history_options_init": (None, [ctypes.POINTER(_HistoryOptions)]),
    "msnap_record_history": (c_int, [_P, ctypes.POINTER(_HistoryOptions)]),
    "msnap_record_annotation": (c_int, [_P, c_int, ctypes.c_char_p, ctypes.c_bool]),
    "msnap_snapshot_options_init": (None, [ctypes.POINTER(_SnapshotOptions)]),
    "msnap_snapshot_pickle": (c_int, [_P, ctypes.POINTER(_SnapshotOptions), ctypes.POINTER(_P),
                                      ctypes.POINTER(ctypes.c_size_t)]),
}

_LIB = None
_LIB_LOCK = threading.Lock()


def _lib():
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LIB_LOCK:
        if _LIB is None:
            path = library_path()
            if not os.path.exists(path):
                raise RuntimeError(f"memsnap.predict: {path} is missing (package not built?)")
            lib = ctypes.PyDLL(path)
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            # The ctypes layouts must be the C ones (sizeof written by init).
            for init, struct in (("msnap_options_init", _Options),
                                 ("msnap_history_options_init", _HistoryOptions),
                                 ("msnap_snapshot_options_init", _SnapshotOptions)):
                o = struct()
                getattr(lib, init)(ctypes.byref(o))
                if o.size != ctypes.sizeof(struct):
                    raise RuntimeError(f"memsnap.predict: {struct.__name__} layout mismatch "
                                       f"({ctypes.sizeof(struct)} != {o.size}); rebuild memsnap")
            _LIB = lib
    return _LIB


def _err(rc: int, what: str) -> str:
    lib = _lib()
    text = lib.msnap_last_error() or b""
    text = text.decode("utf-8", "replace") or lib.msnap_strerror(rc).decode()
    return f"{what}: {text}"


class Allocator:
    """One private memsnap allocator on a simulated device.

    Args:
        profile: "npu" (torch_npu's decisions) or "cuda" (PyTorch's).
        alloc_conf: the PYTORCH_*_ALLOC_CONF string ("" = defaults), or
            None to read the profile's environment variables.
        devices: number of simulated devices.
        memory: bytes per simulated device.

    Raises:
        ValueError: a bad alloc-conf (the message names the token).
    """

    __slots__ = ("_h", "_lib", "profile", "alloc_conf", "devices", "memory", "_out")

    def __init__(self, profile: str, alloc_conf: str | None, devices: int, memory: int):
        lib = _lib()
        o = _Options()
        lib.msnap_options_init(ctypes.byref(o))
        o.profile = PROFILES[profile]
        o.runtime_name = b"sim"
        o.alloc_conf = None if alloc_conf is None else alloc_conf.encode()
        o.caching_disabled = -1
        o.sim_devices = devices
        o.sim_memory = memory
        buf = ctypes.create_string_buffer(512)
        o.error_buf = ctypes.cast(buf, ctypes.c_void_p)
        o.error_buf_len = len(buf)
        h = _P()
        rc = lib.msnap_allocator_create(ctypes.byref(o), ctypes.byref(h))
        if rc < 0:
            text = buf.value.decode("utf-8", "replace") or lib.msnap_strerror(rc).decode()
            raise ValueError(f"allocator ({profile}, alloc conf {alloc_conf!r}): {text}")
        self._h, self._lib = h, lib
        self.profile, self.devices, self.memory = profile, devices, memory
        self.alloc_conf = (lib.msnap_allocator_settings(h) or b"").decode()
        self._out = c_u64()

    def close(self) -> None:
        if self._h:
            self._lib.msnap_allocator_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # -- allocation ------------------------------------------------------
    def malloc(self, device: int, size: int, stream: int) -> int:
        """Address (>0), or a negative MSNAP_E* code (EOOM, EREJECTED).
        Other failures raise RuntimeError."""
        rc = self._lib.msnap_malloc(self._h, device, size, stream, ctypes.byref(self._out))
        if rc == 0:
            return self._out.value
        if rc in (EOOM, EREJECTED):
            return rc
        raise RuntimeError(_err(rc, "msnap_malloc"))

    def last_error(self) -> str:
        return (self._lib.msnap_last_error() or b"").decode("utf-8", "replace")

    def free(self, ptr: int) -> None:
        rc = self._lib.msnap_free(self._h, ptr)
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_free"))

    def record_stream(self, ptr: int, stream: int) -> None:
        rc = self._lib.msnap_record_stream(self._h, ptr, stream)
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_record_stream"))

    def empty_cache(self, device: int = -1) -> None:
        self._lib.msnap_empty_cache(self._h, device)

    def set_allocator_settings(self, conf: str) -> None:
        rc = self._lib.msnap_set_allocator_settings(self._h, conf.encode())
        if rc < 0:
            raise ValueError(_err(rc, "alloc conf"))

    def set_memory_fraction(self, device: int, fraction: float) -> None:
        rc = self._lib.msnap_set_memory_fraction(self._h, device, fraction)
        if rc < 0:
            raise ValueError(_err(rc, "memory fraction"))

    # -- statistics ------------------------------------------------------
    def stats(self, device: int, out: Stats | None = None) -> Stats:
        s = out if out is not None else Stats()
        s.size, s.version = ctypes.sizeof(Stats), 1
        rc = self._lib.msnap_stats_get(self._h, device, ctypes.byref(s))
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_stats_get"))
        return s

    def reset_peak_stats(self, device: int) -> None:
        self._lib.msnap_reset_peak_stats(self._h, device)

    def mem_get_info(self, device: int) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        rc = self._lib.msnap_mem_get_info(self._h, device, ctypes.byref(free), ctypes.byref(total))
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_mem_get_info"))
        return free.value, total.value

    def memory_summary(self, device: int, abbreviated: bool = False) -> str:
        out = _P()
        rc = self._lib.msnap_memory_summary(self._h, device, abbreviated, ctypes.byref(out))
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_memory_summary"))
        try:
            return ctypes.string_at(out).decode("utf-8", "replace")
        finally:
            self._lib.msnap_free_string(out)

    def check_invariants(self) -> None:
        buf = ctypes.create_string_buffer(1024)
        if self._lib.msnap_check_invariants(self._h, buf, len(buf)) < 0:
            raise AssertionError(buf.value.decode("utf-8", "replace"))

    # -- history ---------------------------------------------------------
    def record_history(self, enabled: bool = True) -> None:
        """History as ``_record_memory_history("all", context="all",
        stacks="python", max_entries=unbounded)``."""
        o = _HistoryOptions()
        self._lib.msnap_history_options_init(ctypes.byref(o))
        o.enabled = enabled
        o.stacks = 1  # MSNAP_STACKS_PYTHON: interpreter frames only
        rc = self._lib.msnap_record_history(self._h, ctypes.byref(o))
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_record_history"))

    def annotate(self, device: int, name: str, is_start: bool) -> None:
        self._lib.msnap_record_annotation(self._h, device, name.encode("utf-8", "replace"),
                                          is_start)

    def _snap_opts(self) -> _SnapshotOptions:
        o = _SnapshotOptions()
        self._lib.msnap_snapshot_options_init(ctypes.byref(o))
        return o

    def snapshot(self) -> dict:
        """The snapshot dict (as ``torch.cuda.memory._snapshot()``)."""
        o = self._snap_opts()
        out, n = _P(), ctypes.c_size_t()
        rc = self._lib.msnap_snapshot_pickle(self._h, ctypes.byref(o), ctypes.byref(out),
                                             ctypes.byref(n))
        if rc < 0:
            raise RuntimeError(_err(rc, "msnap_snapshot_pickle"))
        try:
            # Our own library's output (the memory_viz opcode subset).
            return pickle.loads(ctypes.string_at(out, n.value))
        finally:
            self._lib.msnap_free_string(out)
