"""memsnap.memory -- the torch.cuda.memory API over the memsnap allocator.

Every public function here has the name, signature and defaults of its
counterpart in ``torch/cuda/memory.py`` (PyTorch 2.13; the three
``_record_memory_history`` functions also take PyTorch 2.14's
``record_pinned_host_memory`` and ``record_cuda``) and raises the same
exception types with the same messages for bad arguments, device arguments
aside (below).  Differences are deliberate and documented on the function
(``_snapshot(device)`` honours ``device``; ``memory_stats`` works before
any allocation).

Units: sizes and addresses are bytes (Python ints), times are microseconds
since the Unix epoch, devices are indices (``int``, ``"npu:1"``,
``"cuda:1"`` or a ``torch.device``), streams are ints (the runtime's stream
handle; 0 is the default stream), stream objects with a ``npu_stream`` /
``cuda_stream`` attribute, or (after ``memsnap.torch.register_device``)
``torch.Stream`` objects of that device, whose ``stream_id`` is the handle.

Errors: a device out of memory raises :class:`OutOfMemoryError` (a
``MemoryError``; once ``torch`` is imported, the raised class also derives
from ``torch.OutOfMemoryError``); a pointer that is not a live allocation
raises ``ValueError`` naming it; a bad allocator configuration raises
``ValueError`` naming the offending token.

Argument types are checked here, at the Python boundary, as torch checks
them except for devices, where memsnap is stricter
(tests/python/test_arg_types.py sweeps every public function):

- bool parameters that torch hands to a pybind11 binding
  (``_record_memory_history``'s ``clear_history``, ``compile_context``,
  ``global_record_annotations``, ``record_pinned_host_memory``,
  ``record_cuda`` and the legacy form's flags; ``MemPool``'s ``use_on_oom``
  and ``no_split``) take what pybind11's bool caster takes: ``True`` /
  ``False``, ``None`` (False), a numpy bool or a number (its truth value);
  a str, list or other object raises ``TypeError``.  ``caching_allocator_enable``
  and ``memory_snapshot(include_traces=)`` take only a bool, as torch.
- devices are an int, ``"npu"`` / ``"cuda"`` / ``"npu:1"`` / ``"cuda:0"`` /
  ``"1"``, or an object with ``type`` and ``index`` (``torch.device``) or
  ``idx`` (``torch.cuda.device``); anything else (a bool, a float,
  ``object()``, an unknown device type) raises ``ValueError`` -- also for
  ``_record_memory_history``, whose ``device`` is otherwise ignored.  torch
  takes ``True`` as 1 and, where the device may be None, a float as the
  current device, and raises ``RuntimeError`` for an unknown device type.
  Once memsnap.torch has given memsnap.memory a device type
  (``register_device('npu')``, ``use_allocator``), a str or device of
  another type (``"cuda"`` when ``"npu"`` is registered) raises
  ``ValueError`` too, as torch's ``_get_device_index`` refuses a device
  that is not its own type ("Expected a cuda device, but got: npu").
  The message names the device type of :func:`_device_type`.  A device
  type renamed from torch's PrivateUse1 (``register_device('npu')``,
  torch_npu's) is also taken as ``"privateuseone"``, as
  ``torch.device("privateuseone")`` is that device.  ``""`` raises
  ``ValueError("Device string must not be empty")`` (torch's words).
- sizes and pointers are ints, never bools (``TypeError``; torch would
  take ``True`` as 1); a negative size raises ``ValueError``.
- streams are ints or stream objects (``npu_stream`` / ``cuda_stream``,
  or a ``torch.Stream`` of register_device's device: its ``stream_id``);
  a bool or another object raises ``TypeError``; a ``torch.Stream`` of
  another device, or a handle outside ``[0, 2**56)`` (no user-space
  pointer of a 64-bit Linux process reaches 2**56), raises ``ValueError``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import sys
import threading
import warnings
from inspect import signature
from typing import Any

from . import _memsnap as _C

__all__ = [
    "OutOfMemoryError",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_enable",
    "caching_allocator_disabled",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "empty_cache",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "memory_snapshot",
    "memory_summary",
    "list_gpu_processes",
    "mem_get_info",
    "get_allocator_backend",
    "record_stream",
    "MemPool",
    "use_mem_pool",
    # Pinned host memory (the block at the end of this file).
    "empty_host_cache",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
]

#: Raised when the device is out of memory (a ``MemoryError``).  With torch
#: imported, the class actually raised is ``TorchOutOfMemoryError``, a
#: subclass of this class and of ``torch.OutOfMemoryError``; this class
#: itself does not derive from torch's.
OutOfMemoryError = _C.OutOfMemoryError


def __getattr__(name: str) -> Any:
    # TorchOutOfMemoryError (a subclass of OutOfMemoryError and of
    # torch.OutOfMemoryError) is made by the extension for the first OOM
    # raised with torch imported, under this module's name: pickle
    # (multiprocessing, concurrent.futures, torch.multiprocessing workers
    # sending their error back) looks the class of a raised OOM up here,
    # also in a process that has not imported torch yet.
    if name == "TorchOutOfMemoryError":
        try:
            import torch  # noqa: F401  (its OutOfMemoryError is a base)
        except ImportError:
            pass
        else:
            cls = _C.oom_type()
            if cls is not OutOfMemoryError:
                return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Hooks set by memsnap.torch when memsnap is routed to torch's devices:
# the current device index and the current stream handle of a device.
_current_device_hook = None
_current_stream_hook = None
# Called as fn(enabled, compile_context, global_record_annotations) after
# the history settings changed (memsnap.torch installs record_function
# annotations with it).
_history_listeners: list = []


def _current_device() -> int:
    if _current_device_hook is not None:
        return int(_current_device_hook())
    return 0


# The device types a device argument may name until memsnap.torch gives
# memsnap.memory its own (then only that one: _device_types).
_DEVICE_TYPES = ("npu", "cuda")
# The device type memsnap.torch made memsnap.memory's (register_device's
# name, use_allocator's backend); None until then.
_torch_device_type: str | None = None
# True when that device is register_device's: its torch.Stream objects
# carry memsnap's stream handle as their stream_id (the shim's device
# guard numbers streams with memsnap handles, csrc/device.cpp).  Not for
# use_allocator's devices, whose streams are the runtime's pointers
# (torch.cuda.Stream.cuda_stream, torch_npu's npu_stream).
_stream_ids_are_handles = False


def _add_device_type(name: str, stream_ids_are_handles: bool = False) -> None:
    """Make ``name`` the device type of memsnap.memory: the only type
    accepted in device arguments from now on ("<name>:1",
    torch.device(name); another type raises ValueError, as torch's
    ``_get_device_index`` refuses a device that is not "cuda") and the one
    named in their errors.  memsnap.torch.register_device and use_allocator
    call it; register_device with ``stream_ids_are_handles`` (a
    ``torch.Stream`` of the device is then a stream argument: its
    ``stream_id``)."""
    global _torch_device_type, _stream_ids_are_handles
    _torch_device_type = name
    _stream_ids_are_handles = stream_ids_are_handles


def _device_types() -> tuple[str, ...]:
    """The device types a device argument may name: the one memsnap.torch
    registered or installed under, else "npu" and "cuda"."""
    if _torch_device_type is not None:
        return (_torch_device_type,)
    return _DEVICE_TYPES


def _profile_name() -> str:
    """The allocator's profile, "cuda" or "npu": the allocator's own once
    it exists, else the one it will be created with (MEMSNAP_PROFILE, else
    the runtime's own: acl -> npu, cuda and sim -> cuda; src/alloc/create.c)."""
    if _C.initialized():
        return _C.profile()
    profile = os.environ.get("MEMSNAP_PROFILE", "").lower()
    if profile in ("npu", "cuda"):
        return profile
    runtime = (os.environ.get("MEMSNAP_RUNTIME") or "sim").lower()
    return "npu" if runtime in ("acl", "npu", "ascend") else "cuda"


def _device_type() -> str:
    """The device type named in a device argument's error ("Expected a
    <type> device, but got: ..."), as torch names "cuda" and torch_npu
    "npu": the one memsnap.torch registered or installed under, else the
    profile's name.  The same in every function, whether or not the
    allocator exists yet."""
    return _torch_device_type or _profile_name()


def _pybind_bool(value: Any, name: str, func: str) -> bool:
    """A bool argument as torch's pybind11 bindings convert it.

    pybind11's bool caster (``type_caster<bool>::load`` with conversion)
    takes True/False, None (False), a numpy bool, or an object whose type
    implements the number protocol's ``__bool__`` (int, float, numpy
    numbers); everything else -- a str, a list, ``object()`` -- is an
    "incompatible function arguments" TypeError.
    """
    if value is True or value is False:
        return value
    if value is None:
        return False
    if getattr(type(value), "__bool__", None) is not None:
        return bool(value)
    raise TypeError(
        f"{func}(): incompatible function arguments: {name} must be a bool, "
        f"not {type(value).__name__}"
    )


def _device_index(device: Any = None, optional: bool = True) -> int:
    """Normalise a device argument as torch's ``_get_device_index`` does.

    Accepts None (the current device), an int, a string ``"npu"``,
    ``"npu:1"``, ``"cuda:0"`` or ``"1"``, an object with ``type`` and
    ``index`` attributes (``torch.device``; ``index`` None means the
    current device), or one with an int ``idx`` (``torch.cuda.device``,
    ``torch_npu.npu.device``).  Raises ValueError for anything else (a
    bool, a float, ``object()``).
    """
    if type(device) is int:  # the common case first
        return device
    if device is None:
        return _current_device()
    if isinstance(device, bool):
        raise ValueError(f"Expected a device index, got {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        if not device:
            raise ValueError("Device string must not be empty")  # torch.device("")
        kind, _, idx = device.partition(":")
        if kind.isdigit() and not idx:
            return int(kind)
        if kind == "privateuseone" and _torch_device_type is not None:
            # torch.device("privateuseone") is the PrivateUse1 backend under
            # its new name: register_device's, torch_npu's "npu"
            torch = sys.modules.get("torch")
            if (torch is not None
                    and torch._C._get_privateuse1_backend_name() == _torch_device_type):
                kind = _torch_device_type
        if kind not in _device_types():
            # torch: torch.device(str) then "Expected a cuda device, but
            # got: cpu" (torch_npu says npu); also "cuda" once "npu" is
            # registered.
            raise ValueError(f"Expected a {_device_type()} device, but got: {device}")
        if idx:
            if not idx.isdigit():
                raise ValueError(f"Invalid device string: {device!r}")
            return int(idx)
        return _current_device()
    idx = getattr(device, "idx", None)
    if type(idx) is int and not hasattr(device, "type"):
        return idx  # torch.cuda.device / torch_npu.npu.device
    index = getattr(device, "index", None)
    if hasattr(device, "type"):
        if device.type not in _device_types():
            raise ValueError(f"Expected a {_device_type()} device, but got: {device}")
        return _current_device() if index is None else int(index)
    raise ValueError(
        f"Expected a torch.device with a specified index or an integer, "
        f"but got:{device}"
    )


def _stream_handle(stream: Any, device: int) -> int:
    """A stream argument as memsnap's stream handle (an int; its range is
    checked by the extension).  The one place stream arguments are
    converted: None (the current stream of ``device``), an int, an object
    with an int ``npu_stream`` / ``cuda_stream`` (torch_npu's and
    torch.cuda's streams), or a ``torch.Stream`` of register_device's
    device (``torch.npu.Stream()``, ``current_stream()``,
    ``default_stream()``), whose ``stream_id`` is the handle the shim
    records that stream's allocations with.  A ``torch.Stream`` of
    another device raises ValueError, any other object TypeError."""
    if type(stream) is int:  # the common case first
        return stream
    if stream is None:
        if _current_stream_hook is not None:
            return int(_current_stream_hook(device))
        return 0
    for attr in ("npu_stream", "cuda_stream"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            return handle
    torch = sys.modules.get("torch")
    torch_stream = getattr(torch, "Stream", None) if torch is not None else None
    if isinstance(torch_stream, type) and isinstance(stream, torch_stream):
        kind = stream.device.type
        if _stream_ids_are_handles and kind == _torch_device_type:
            return int(stream.stream_id)
        raise ValueError(
            f"Expected a stream of the {_stream_device_name()} device, but got "
            f"a torch.Stream of device {stream.device}: {stream!r}")
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(
            f"Invalid type for stream argument, must be {_stream_types()}, "
            f"not {type(stream).__name__}")
    return stream  # its range is checked by the extension


def _stream_device_name() -> str:
    """The device whose torch.Stream objects a stream argument may be,
    for the error of one of another device."""
    if _stream_ids_are_handles and _torch_device_type is not None:
        return repr(_torch_device_type)
    if _torch_device_type is not None:
        # use_allocator: torch.cuda.Stream / torch_npu's stream objects
        return f"{_torch_device_type!r} (`torch.{_torch_device_type}.Stream`)"
    return "memsnap (memsnap.torch.register_device)"


def _stream_types() -> str:
    """What a stream argument may be, in the words of torch's "must be
    `torch.cuda.Stream` or `int` representing a pointer to an existing
    stream": the registered device's torch.Stream and its handles, the
    installed backend's stream class, else every form memsnap reads."""
    t = _torch_device_type
    if _stream_ids_are_handles and t is not None:
        return (f"`torch.Stream` of the {t!r} device (`torch.{t}.Stream()`, "
                f"`torch.{t}.current_stream()`) or `int` (its `stream_id`; "
                f"0 is the default stream)")
    pointer = "`int` representing a pointer to an existing stream"
    if t == "cuda":
        return f"`torch.cuda.Stream` or {pointer}"
    if t == "npu":
        return f"`torch_npu.npu.Stream` or {pointer}"
    return ("a stream with an `npu_stream` / `cuda_stream` handle "
            "(`torch_npu.npu.Stream`, `torch.cuda.Stream`), a `torch.Stream` "
            "of memsnap.torch.register_device's device, or " + pointer)


# ---------------------------------------------------------------------------
# Raw allocation
# ---------------------------------------------------------------------------


def caching_allocator_alloc(size, device: Any = None, stream=None):
    """Allocate ``size`` bytes on ``device`` for ``stream``; return the address.

    Args:
        size (int): bytes requested (>= 0; 0 returns 0 and does no work);
            a numpy integer scalar (``numpy.int64``) is taken too, as
            torch's ``THPUtils_checkLong`` takes it.
        device: device index, string or torch.device; None = current device.
        stream: int stream handle, stream object (``npu_stream`` /
            ``cuda_stream``) or ``torch.Stream`` of register_device's device
            (its ``stream_id``); None = current stream (0, the default
            stream, unless memsnap.torch routes streams).

    Returns:
        int: the device address (bytes).  Free it with
        :func:`caching_allocator_delete`.  Recorded as an ``alloc`` trace
        entry when history is on.

    Raises:
        OutOfMemoryError: the device is out of memory after the full OOM
            sequence (observers ran first; with OOM_SNAPSHOT_ENABLE an OOM
            snapshot was written).
        ValueError: negative size ("Invalid memory size: ..."); a device
            that is not a device; a stream handle outside [0, 2**56); a
            ``torch.Stream`` of another device.
        TypeError: a size that is not an integer (a bool included); a stream
            of another type (torch's message, naming the stream types
            accepted).
        OverflowError: a size of 2**63 or more, or below -2**63 (torch
            reads it as a C ``ssize_t``).

    Mirrors ``torch/cuda/memory.py: caching_allocator_alloc``.
    """
    dev = device if type(device) is int else _device_index(device)
    handle = stream if type(stream) is int else _stream_handle(stream, dev)
    return _C.malloc(size, dev, handle)


def caching_allocator_delete(mem_ptr):
    """Free an address returned by :func:`caching_allocator_alloc`.

    Args:
        mem_ptr (int): the address (bytes); 0 is a no-op.  Device and stream
            are tracked by the allocator.

    Raises:
        ValueError: ``mem_ptr`` is not a live allocation ("invalid device
            pointer: 0x...").

    Mirrors ``torch/cuda/memory.py: caching_allocator_delete``.
    """
    _C.free(mem_ptr)


def record_stream(ptr, stream):
    """Mark the live allocation at ``ptr`` as used on ``stream``.

    The block is not reused until the work queued on ``stream`` at the time
    of the free has finished (events recorded at free time).

    Args:
        ptr (int): base address of a live allocation (bytes).
        stream: int stream handle, stream object or ``torch.Stream`` of
            register_device's device (as ``caching_allocator_alloc``).

    Raises:
        ValueError: ``ptr`` is not a live allocation.

    Mirrors ``torch.Tensor.record_stream`` /
    ``c10/cuda/CUDACachingAllocator.cpp: recordStream``.
    """
    _C.record_stream(ptr, _stream_handle(stream, _current_device()))


def caching_allocator_enable(value: bool = True) -> None:
    """Enable or disable caching (on by default).

    Disabled: every allocation is a direct runtime malloc/free; no
    statistics, no history, no segments.  As in torch, a call before the
    device is initialized does nothing: memsnap's device is initialized
    once the process-wide allocator exists (the first allocation through
    memsnap.memory, memsnap.torch or the pluggable-allocator entry points;
    ``_C.initialized()``).

    Raises:
        RuntimeError: ``value`` is not a bool ("cudaCachingAllocator_enable
            expects a bool, but got <type>"), once initialized.

    Mirrors ``torch/cuda/memory.py: caching_allocator_enable`` (``if
    is_initialized(): torch._C._cuda_cudaCachingAllocator_enable(value)``).
    """
    if _C.initialized():
        _C.set_caching_enabled(value)


@contextlib.contextmanager
def caching_allocator_disabled():
    """Context manager: disable caching inside, restore the previous state.

    Mirrors ``torch/cuda/memory.py: caching_allocator_disabled``.
    """
    prev = _C.caching_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(prev)


def set_per_process_memory_fraction(fraction, device: Any = None) -> None:
    """Cap this process's device memory at ``fraction`` of the device total.

    Args:
        fraction (float): in [0, 1]; 1.0 removes the cap.
        device: device index, string or torch.device; None = current.

    Raises:
        TypeError: ``fraction`` is not a float ("Invalid type for fraction
            argument, must be `float`").
        ValueError: out of range ("Invalid fraction value: f. Allowed range:
            0~1").

    Allocations beyond the cap raise OutOfMemoryError.  Mirrors
    ``torch/cuda/memory.py: set_per_process_memory_fraction``.
    """
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    if fraction != fraction:
        # NaN passes torch's Python check; its C++ check then raises.
        raise RuntimeError("invalid fraction:nan. Please set within [0, 1].")
    _C.set_memory_fraction(fraction, _device_index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """Return the memory fraction cap of ``device`` (1.0 when uncapped).

    Mirrors ``torch/cuda/memory.py: get_per_process_memory_fraction``.
    """
    return _C.get_memory_fraction(_device_index(device))


def empty_cache() -> None:
    """Release every unused cached segment of every device to the runtime.

    Emits ``segment_free`` / ``segment_unmap`` trace entries when history is
    on.  Memory held by live allocations is not touched.

    Before memsnap's allocator exists there is nothing cached: returns
    without creating it (as ``torch.cuda.empty_cache`` does not initialise
    CUDA).

    Mirrors ``torch/cuda/memory.py: empty_cache``.
    """
    if not _C.initialized():
        return
    _C.empty_cache(-1)


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """Return the allocator statistics of ``device`` as a nested dict.

    Shape: the nine stat arrays (``allocation``, ``segment``, ``active``,
    ``inactive_split``, ``allocated_bytes``, ``reserved_bytes``,
    ``active_bytes``, ``inactive_split_bytes``, ``requested_bytes``) map
    ``"all"|"small_pool"|"large_pool"`` to ``{"current", "peak",
    "allocated", "freed"}``; ``oversize_allocations`` and
    ``oversize_segments`` map to the four fields; the counters
    ``num_alloc_retries``, ``num_ooms``, ``max_split_size``,
    ``num_sync_all_streams``, ``num_device_alloc``, ``num_device_free``,
    ``num_oom_rejections`` are ints.  ``*_bytes`` values are bytes.

    ``reserved_bytes_by_private_pools`` (cuda profile, as torch 2.13):
    ``{pool_id_tuple: {"all"|"small_pool"|"large_pool": {four fields}}}``,
    the reserved bytes of each private pool (``MemPool``, graph pools).  A
    pool appears with its first reserved byte; a deleted pool keeps its
    entry (``current`` 0) until the resets bring every field to 0.  The npu
    profile leaves the key out, as torch_npu does.

    Unlike torch, this works before the first allocation (all zeros).

    Mirrors ``torch/cuda/memory.py: memory_stats_as_nested_dict``.
    """
    return _C.memory_stats(_device_index(device))


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Return the statistics of ``device`` flattened with ``"."``.

    An ``OrderedDict`` sorted by key, e.g. ``"allocated_bytes.all.current"``
    (bytes), ``"num_ooms"``: 123 keys (torch 2.14's set, including
    ``num_oom_rejections``), plus, per private pool, 12 keys such as
    ``"reserved_bytes_by_private_pools.0_1.all.current"`` (tuple keys
    joined with ``"_"``, as torch 2.13).  See
    :func:`memory_stats_as_nested_dict`.

    Mirrors ``torch/cuda/memory.py: memory_stats``.
    """
    items: list = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                if isinstance(key, tuple):
                    key = "_".join(str(part) for part in key)
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            items.append((prefix, obj))

    walk("", memory_stats_as_nested_dict(device=device))
    items.sort()
    return collections.OrderedDict(items)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the ``allocated``/``freed`` fields and the event counters.

    ``num_alloc_retries``, ``num_ooms``, ``num_sync_all_streams``,
    ``num_device_alloc``, ``num_device_free``, ``num_oom_rejections`` go to
    0; ``max_split_size`` is kept.  Mirrors
    ``torch/cuda/memory.py: reset_accumulated_memory_stats``.
    """
    _C.reset_accumulated_stats(_device_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set every ``peak`` to the ``current`` value.

    Mirrors ``torch/cuda/memory.py: reset_peak_memory_stats``.
    """
    _C.reset_peak_stats(_device_index(device))


def _deprecated_reset_peak(name: str, device: Any) -> None:
    """torch's FutureWarning for the old reset_max_* names (pointing at the
    caller of the deprecated function), then reset_peak_memory_stats."""
    warnings.warn(
        "torch.cuda.%s now calls torch.cuda.reset_peak_memory_stats, which "
        "resets /all/ peak memory stats." % name,
        FutureWarning,
        stacklevel=3,
    )
    return reset_peak_memory_stats(device=device)


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated: warns (FutureWarning) and calls reset_peak_memory_stats.

    Mirrors ``torch/cuda/memory.py: reset_max_memory_allocated``.
    """
    return _deprecated_reset_peak("reset_max_memory_allocated", device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated: warns (FutureWarning) and calls reset_peak_memory_stats.

    Mirrors ``torch/cuda/memory.py: reset_max_memory_cached``.
    """
    return _deprecated_reset_peak("reset_max_memory_cached", device)


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live allocations (rounded block sizes).

    ``allocated_bytes.all.current``.  Mirrors
    ``torch/cuda/memory.py: memory_allocated``.
    """
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` in bytes (``allocated_bytes.all.peak``).

    Mirrors ``torch/cuda/memory.py: max_memory_allocated``.
    """
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes the allocator holds from the runtime (``reserved_bytes.all.current``).

    Mirrors ``torch/cuda/memory.py: memory_reserved``.
    """
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` in bytes (``reserved_bytes.all.peak``).

    Mirrors ``torch/cuda/memory.py: max_memory_reserved``.
    """
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)


def memory_cached(device: Any = None) -> int:
    """Deprecated alias of :func:`memory_reserved` (bytes).

    Mirrors ``torch/cuda/memory.py: memory_cached``.
    """
    return memory_reserved(device=device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated alias of :func:`max_memory_reserved` (bytes).

    Mirrors ``torch/cuda/memory.py: max_memory_cached``.
    """
    return max_memory_reserved(device=device)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """Return the 75-column statistics table of ``device`` as torch prints it.

    Header "PyTorch CUDA memory summary, device ID n"; rows Allocated /
    Active / Requested / GPU reserved / Non-releasable memory, Allocations,
    Active allocs, GPU reserved segments, Non-releasable allocs (each with
    large/small pool sub-rows unless ``abbreviated``), Oversize
    allocations/segments; columns Cur Usage, Peak Usage, Tot Alloc, Tot
    Freed.  Mirrors ``torch/cuda/memory.py: memory_summary``.
    """
    return _C.memory_summary(_device_index(device), bool(abbreviated))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """Return ``(free_bytes, total_bytes)`` of the device from the runtime.

    Mirrors ``torch/cuda/memory.py: mem_get_info`` (cudaMemGetInfo /
    aclrtGetMemInfo; the sim runtime reports MEMSNAP_SIM_MEMORY).
    """
    return _C.mem_get_info(_device_index(device))


def list_gpu_processes(device: Any = None) -> str:
    """Return the processes using the device and their memory, one per line.

    First line ``GPU:<index>``, then ``process <pid:>10> uses <MiB:>12.3f>
    MB GPU memory`` lines or ``no processes are running``.  On the cuda
    runtime this queries NVML (pynvml), as torch; on the sim runtime the
    only process is this one (its reserved memory); on other runtimes it
    returns a sentence saying the query is unsupported.

    Mirrors ``torch/cuda/memory.py: list_gpu_processes``.
    """
    index = _device_index(device)
    runtime = _C.runtime_name()
    lines = [f"GPU:{index}"]
    if runtime == "cuda":
        try:
            import pynvml  # type: ignore[import-not-found]
        except ModuleNotFoundError:
            return "pynvml module not found, please install nvidia-ml-py"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_DriverNotLoaded:
            return "cuda driver can't be loaded, is cuda enabled?"
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        usage = [(p.pid, p.usedGpuMemory or 0) for p in procs]
    elif runtime == "sim":
        reserved = memory_reserved(index)
        usage = [(os.getpid(), reserved)] if reserved else []
    else:
        return f"list_gpu_processes is not supported on the {runtime} runtime"
    if not usage:
        lines.append("no processes are running")
    for pid, used in usage:
        lines.append(f"process {pid:>10d} uses {used / 1048576:>12.3f} MB GPU memory")
    return "\n".join(lines)


def get_allocator_backend() -> str:
    """Return ``"native"``: memsnap is a native caching allocator.

    Mirrors ``torch/cuda/memory.py: get_allocator_backend``.
    """
    return "native"


def _set_allocator_settings(env: str):
    """Apply an allocator configuration string at run time.

    Same syntax as PYTORCH_NPU_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF (per the
    profile), e.g. ``"expandable_segments:True"``.

    In the cuda profile it warns as torch 2.13 does (FutureWarning: torch
    deprecated ``torch.cuda._set_allocator_settings``); torch_npu's
    ``torch_npu.npu.memory._set_allocator_settings`` does not warn.  The
    warning does not send the caller to torch's replacement, as torch's
    does: ``torch._C._accelerator_setAllocatorSettings`` configures torch's
    own allocator, not memsnap's (a memsnap device's or
    ``use_allocator``'s settings stay as they were), so this function
    remains the way to change memsnap's settings at run time.

    Raises:
        ValueError: a bad token, named in the message.

    Mirrors ``torch/cuda/memory.py: _set_allocator_settings``.
    """
    if _profile_name() == "cuda":
        warnings.warn(
            "torch.cuda._set_allocator_settings is deprecated (torch 2.13). "
            "memsnap.memory._set_allocator_settings keeps working and is the "
            "call that configures memsnap's allocator: torch's replacement, "
            "torch._C._accelerator_setAllocatorSettings, configures torch's "
            "own allocator and leaves memsnap's settings as they are.",
            FutureWarning,
            stacklevel=2,
        )
    if not isinstance(env, str):
        raise TypeError(f"env must be a str, not {type(env).__name__}")
    _C.set_allocator_settings(env)


# ---------------------------------------------------------------------------
# Memory pools
# ---------------------------------------------------------------------------


class MemPool(_C.MemPool):
    """A private memory pool of the memsnap allocator (``torch.cuda.MemPool``).

    Args:
        allocator: must be None (custom per-pool allocators are not
            supported; ValueError otherwise).
        use_on_oom (bool): a default-pool allocation that runs out of memory
            may take a cached block of this pool.
        no_split (bool): blocks of this pool are never split.

    ``id`` is a tuple of two ints; ``use_count()`` the reference count;
    ``snapshot(include_traces=True)`` the pool's segments.  The pool is
    released when the object is garbage collected.  Mirrors
    ``torch/cuda/memory.py: MemPool``.
    """

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None:
            raise ValueError("memsnap MemPool does not take a custom allocator")
        self._create(
            _current_device(),
            _pybind_bool(use_on_oom, "use_on_oom", "MemPool"),
            _pybind_bool(no_split, "no_split", "MemPool"),
        )

    def snapshot(self, include_traces=True):
        """Segments of this pool (list of segment dicts; see _snapshot).

        Mirrors ``torch/cuda/memory.py: MemPool.snapshot``.
        """
        return memory_snapshot(self.id, include_traces=include_traces)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None):
    """Route this thread's allocations on ``device`` to ``pool`` inside the
    ``with`` block.

    As in torch, only the current thread's allocations go to the pool
    (any stream): other threads, and threads started inside the block,
    keep allocating from the default pools.  The scope is routing only:
    unlike a graph capture it does not stop event processing, defer
    cross-stream frees or skip freeing the cache before an OOM, so an
    allocation inside it can use memory the default pools cached.
    Mirrors ``torch/cuda/memory.py: use_mem_pool``
    (``_cuda_beginAllocateCurrentThreadToPool``).

    As in torch, entering takes a reference on the pool (``use_count()`` is
    one more inside the block) and leaving drops it again
    (endAllocateToPool, then releasePool), so that the pool's cached
    segments are released once the MemPool object itself is gone.
    """
    if not isinstance(pool, _C.MemPool):
        raise TypeError(f"use_mem_pool() expects a MemPool, not {type(pool).__name__}")
    index = _device_index(device)
    pool._begin_current_thread(index)
    try:
        yield
    finally:
        pool._end(index)
        pool._release(index)


# ---------------------------------------------------------------------------
# Memory history and snapshots
# ---------------------------------------------------------------------------


# History on: (compile_context, global_record_annotations, the thread that
# enabled it), for memsnap.torch when torch is imported later; None when off.
_history_on: tuple | None = None
_torch_watch = None  # the _TorchImportWatch in sys.meta_path, once installed
# Set while a _TorchImportWatch asks the other finders: a second watch (one
# left by importlib.reload of this module, or installed by a racing thread)
# answers None instead of asking the first again, for ever.
_torch_finding = threading.local()
# Held while _history_on changes and its listeners run, and while torch's
# import reads it to install the hooks: a thread turning history off while
# another imports torch leaves it off (reentrant: the listeners and the
# import of memsnap.torch run under it).
_history_lock = threading.RLock()
# Set on the thread whose _TorchLoader has run torch's module, while it
# installs the hooks (torch's spec still says it is initialising then).
_torch_ran = threading.local()


class _TorchLoader:
    """torch's own loader, then memsnap's hooks (see _TorchImportWatch)."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        # the rest of torch's loader (is_package, get_filename,
        # get_resource_reader ...) for who inspects the spec of
        # importlib.util.find_spec("torch") before the import
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # torch keeps its own loader (importlib.resources, pkgutil)
        if module.__spec__.loader is self:
            module.__spec__.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        _drop_torch_watches()
        with _history_lock:
            on = _history_on
            if on is None:
                return
            _torch_ran.on = True
            try:
                _notify_history(True, on[0], on[1])
            except Exception as e:  # never fail torch's import
                warnings.warn(f"memsnap: record_function ranges will not be recorded: {e}",
                              RuntimeWarning, stacklevel=2)
            finally:
                _torch_ran.on = False


def _drop_torch_watches() -> None:
    """torch's module has run: the watches have nothing left to watch
    (every later import finds it in sys.modules) and leave sys.meta_path,
    this module's and any left by a reload of it."""
    global _torch_watch
    for finder in list(sys.meta_path):
        if type(finder).__name__ == "_TorchImportWatch" and type(finder).__module__ == __name__:
            try:
                sys.meta_path.remove(finder)
            except ValueError:  # another thread was first
                pass
    _torch_watch = None


class _TorchImportWatch:
    """A sys.meta_path finder that finds nothing itself: torch imported,
    it hands torch's spec from the other finders with its loader chained
    (_TorchLoader), so that memsnap.torch's record_function hook is
    installed once torch's module has run if history is on then, and the
    watch leaves sys.meta_path.  History off at the import is no reason to
    stay: the watch would never be asked for torch again."""

    def find_spec(self, name, path=None, target=None):
        if (name != "torch" or target is not None
                or getattr(_torch_finding, "on", False)):
            return None
        _torch_finding.on = True
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is None:
                    continue
                if hasattr(spec.loader, "exec_module") and hasattr(spec.loader, "create_module"):
                    spec.loader = _TorchLoader(spec.loader)
                return spec
            return None
        finally:
            _torch_finding.on = False


def _torch_runs_elsewhere() -> bool:
    """torch's module is imported but still running, in a thread other
    than the one whose _TorchLoader installs the hooks after it: nothing
    may import torch's submodules now."""
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return getattr(spec, "_initializing", False) and not getattr(_torch_ran, "on", False)


def _load_torch_hooks() -> None:
    """Load memsnap.torch (its listener records torch record_function
    ranges as external_annotations) when torch is already imported, so that
    annotations work without memsnap.torch.use_allocator().  torch is never
    imported here: enabling history must stay cheap in torch-free programs.
    Without torch, a finder watches for its import (_TorchImportWatch):
    memsnap.torch is loaded once torch's module has run, if history is
    still on."""
    global _torch_watch
    if __package__ + ".torch" in sys.modules:
        return
    if "torch" not in sys.modules:
        if _torch_watch is None:
            _torch_watch = _TorchImportWatch()
            sys.meta_path.insert(0, _torch_watch)
        return
    if _torch_runs_elsewhere():
        # importing memsnap.torch now would import torch's submodules
        # beside it and break torch's import (ImportError from a partially
        # initialised module).  The watch's loader installs the hooks once
        # torch has run, if history is on then.
        return
    import importlib

    importlib.import_module(__package__ + ".torch")


def _sync_process_rank() -> None:
    """Tell the library this process's rank once torch.distributed's
    default process group exists, so that snapshots (``process_info``) and
    OOM dump names carry it; without a process group the library reads
    RANK / WORLD_SIZE / LOCAL_RANK.  torch is never imported here."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return
        rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:  # a half-initialised or torn-down group: keep the env
        return
    env_local = os.environ.get("LOCAL_RANK", "")
    local = int(env_local) if env_local.isdigit() else -1
    # The library refuses a local rank not below the world size (ValueError):
    # such a LOCAL_RANK (a stale variable) is passed as unknown instead.
    _C.set_process_rank(rank, world, local if local < world else -1)


def _notify_history(enabled, compile_context, global_record_annotations):
    global _history_on
    _sync_process_rank()
    with _history_lock:
        if enabled:
            thread = _history_on[2] if _history_on is not None else threading.get_ident()
            _history_on = (compile_context, global_record_annotations, thread)
            _load_torch_hooks()
        else:
            _history_on = None
        for fn in list(_history_listeners):
            fn(enabled, compile_context, global_record_annotations)


def _record_memory_history_legacy(
    enabled: bool,
    record_context=True,
    trace_alloc_max_entries=1,
    trace_alloc_record_context=False,
    device: Any = None,
    record_context_cpp=False,
    clear_history=False,
    compile_context=False,
    global_record_annotations=False,
    skip_actions=None,
    record_pinned_host_memory=False,
    record_cuda=True,
):
    """The bool form of :func:`_record_memory_history` (PyTorch 2.0-2.1 API).

    ``record_context`` -> context "state"; ``trace_alloc_record_context`` ->
    "alloc" (takes precedence); ``trace_alloc_max_entries`` is the ring
    capacity (default 1); ``record_context_cpp`` adds C frames.  ``device``
    is ignored (history covers every device).

    Bool arguments follow torch's pybind11 binding (see the module text);
    ``device`` must be a device (ValueError) although it is ignored.

    Mirrors ``torch/cuda/memory.py: _record_memory_history_legacy``.
    """
    func = "_record_memory_history_legacy"
    flags = {
        name: _pybind_bool(value, name, func)
        for name, value in (
            ("enabled", enabled),
            ("record_context", record_context),
            ("trace_alloc_record_context", trace_alloc_record_context),
            ("record_context_cpp", record_context_cpp),
            ("clear_history", clear_history),
            ("compile_context", compile_context),
            ("global_record_annotations", global_record_annotations),
            ("record_pinned_host_memory", record_pinned_host_memory),
            ("record_cuda", record_cuda),
        )
    }
    if device is not None:
        _device_index(device)
    _C.record_history_legacy(
        flags["enabled"],
        flags["record_context"],
        trace_alloc_max_entries,
        flags["trace_alloc_record_context"],
        flags["record_context_cpp"],
        flags["clear_history"],
        flags["compile_context"],
        flags["global_record_annotations"],
        skip_actions if skip_actions is not None else [],
        flags["record_pinned_host_memory"],
        flags["record_cuda"],
    )
    _notify_history(
        flags["enabled"], flags["compile_context"], flags["global_record_annotations"]
    )


def _record_memory_history(enabled="all", *args, **kwargs) -> None:
    """Start/stop recording allocator history (see _record_memory_history_impl).

    A bool ``enabled`` selects the legacy form
    (:func:`_record_memory_history_legacy`).  Mirrors
    ``torch/cuda/memory.py: _record_memory_history``.
    """
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    record_pinned_host_memory: bool = False,
    record_cuda: bool = True,
):
    """Enable (or, with ``enabled=None``, disable) memory history recording.

    Args:
        enabled: None (off: the recorded history is discarded -- take the
            snapshot first), "state" (ring of 1 entry), "all" (ring of
            ``max_entries``).
        context: None, "state" (stacks on live blocks only), "alloc" (also
            on trace entries), "all" (also free-site stacks).
        stacks: "python" or "all" (adds C frames).
        max_entries (int): ring capacity per device; oldest entries are
            dropped first.
        device: ignored (history covers every device), but it must be a
            device (an int, a device string, a torch.device): ValueError
            otherwise.
        clear_history (bool): empty the rings when (re-)enabling.
        compile_context (bool): record "Torch-Compiled Region" names.
        global_record_annotations (bool): record_function ranges of every
            thread (not only this one) go to ``external_annotations``.
        skip_actions (list[str]): actions not stored ("alloc",
            "free_requested", "free_completed", "segment_alloc",
            "segment_free", "segment_map", "segment_unmap", "snapshot",
            "oom", "annotate").
        record_pinned_host_memory (bool): also record pinned host memory.
        record_cuda (bool): record the device allocator (False: host only).

    Raises:
        RuntimeError: "expected state to be 'state', 'all', or None",
            "expected context to be 'state', 'alloc', 'all', or None",
            "expected stacks to be 'python', or 'all'", "Unknown TraceEntry
            action: <s>", "record_pinned_host_memory requires memory history
            recording to be enabled".
        TypeError: negative ``max_entries``; a bool argument that is a
            str, a list or another object pybind11 refuses (see the module
            text); a str ``skip_actions``.
        ValueError: a ``device`` that is not a device.

    Mirrors ``torch/cuda/memory.py: _record_memory_history_impl`` and
    ``torch/csrc/cuda/memory_snapshot.cpp: _record_memory_history``.
    """
    func = "_record_memory_history"
    clear_history = _pybind_bool(clear_history, "clear_history", func)
    compile_context = _pybind_bool(compile_context, "compile_context", func)
    global_record_annotations = _pybind_bool(
        global_record_annotations, "global_record_annotations", func
    )
    record_pinned_host_memory = _pybind_bool(
        record_pinned_host_memory, "record_pinned_host_memory", func
    )
    record_cuda = _pybind_bool(record_cuda, "record_cuda", func)
    if device is not None:
        _device_index(device)
    _C.record_history(
        enabled,
        context,
        stacks,
        max_entries,
        clear_history,
        compile_context,
        global_record_annotations,
        skip_actions if skip_actions is not None else [],
        record_pinned_host_memory,
        record_cuda,
    )
    _notify_history(enabled is not None, compile_context, global_record_annotations)


_record_memory_history.__signature__ = signature(_record_memory_history_impl)  # type: ignore[attr-defined]


def _augment(snapshot: dict) -> dict:
    from torch._utils import _augment_memory_snapshot_stack_traces

    return _augment_memory_snapshot_stack_traces(snapshot)


def _snapshot(device: Any = None, augment_with_fx_traces=False):
    """Return the allocator state and history as the snapshot dict.

    Keys (cuda-reference §2): ``segments`` (list of segment dicts, each
    with ``blocks``), ``device_traces`` (one list of trace entries per
    device, oldest first; ``time_us`` in microseconds since the epoch),
    ``allocator_settings``, ``external_annotations``, ``host_segments``,
    ``host_traces``, and memsnap's own ``process_info`` (pid, host, rank,
    world_size, local_rank when known, runtime, profile, devices' total
    bytes; memory_viz ignores it).  Addresses and sizes are bytes.

    Args:
        device: None = every device.  Unlike torch (which ignores it), a
            device restricts ``segments`` to that device.
        augment_with_fx_traces (bool): run
            ``torch._utils._augment_memory_snapshot_stack_traces`` on the
            result (needs torch).

    Mirrors ``torch/cuda/memory.py: _snapshot``.
    """
    dev = -1 if device is None else _device_index(device)
    _sync_process_rank()
    s = _C.snapshot(dev, 0, 0, True, False)
    if augment_with_fx_traces:
        s = _augment(s)
    return s


def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
    """Write :func:`_snapshot` as a pickle (protocol 4) to ``filename``.

    The file is written next to its final name and renamed into place, so a
    crash never leaves a truncated file; the GIL is released while the C
    library serializes.  Both forms (with ``augment_with_fx_traces`` the
    dict is pickled here and written by the same C writer) follow the
    kernel's protected_symlinks rule: a symbolic link in a sticky
    world-writable directory (/tmp) is followed only when it belongs to
    the user or to the directory's owner (else ``PermissionError`` and
    nothing is written); a replaced file keeps its permission bits; the
    temporaries that killed dumps of this host left in the directory are
    removed first.  ``filename`` may also be an open file descriptor (an
    int), as for torch's ``open(filename, "wb")``: it is written directly
    and closed.  Open the file at pytorch.org/memory_viz or with
    ``python -m torch.cuda._memory_viz``.

    In the npu profile the usage report follows, as torch_npu's
    ``_dump_snapshot`` writes it: CANN's per-module CSV of the current
    device (``aclrtGetMemUsageInfo``, ``moduleName,curMemSize(MB),
    memPeakSize(MB)``) as ``device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv``
    in ``OOM_SNAPSHOT_PATH`` (default: the current directory); when the
    runtime cannot give it (older CANN, the sim) and torch_npu is
    importable, torch_npu's profiler is started and stopped once in the
    pickle's directory instead, as torch_npu does.  MEMSNAP_USAGE_REPORT
    (``cann``, ``memsnap``, ``both``, ``none``) selects memsnap's own
    statistics CSV instead or as well (docs/python.md).

    Raises:
        OSError: the file cannot be written (the message names it);
            ``PermissionError`` for a link the rule refuses;
            ``FileNotFoundError`` for a dangling link (memsnap never creates
            a file through a link); ``EBADF`` for a descriptor that is not
            open.
        ValueError: a negative descriptor (as ``open``).

    Mirrors ``torch/cuda/memory.py: _dump_snapshot`` and
    ``torch_npu/npu/memory.py: _dump_snapshot``.
    """
    path, fd = _output_target(filename)
    try:
        _sync_process_rank()
        if not augment_with_fx_traces:
            _C.dump_snapshot(path, -1, 0, 0, True, False)
        else:
            _dump_augmented(path)
    finally:
        if fd is not None:
            os.close(fd)
    if _C.profile() == "npu":
        # (the profiler's fallback report goes beside the pickle; beside
        # the current directory's files for a descriptor)
        _dump_usage_report(os.getcwd() if fd is not None
                           else os.path.dirname(os.path.abspath(path)))


def _output_target(filename: Any) -> tuple[str, int | None]:
    """The path memsnap's atomic writer gets for ``filename`` of an
    ``open(filename, "wb")`` (what torch's dump and save functions call):
    a path as it is, or an open file descriptor (an int, which ``open``
    takes and closes when done) as ``/dev/fd/N`` -- the writer writes the
    descriptor itself -- with the descriptor to close afterwards."""
    if isinstance(filename, int) and not isinstance(filename, bool):
        if filename < 0:
            raise ValueError("negative file descriptor")  # as open()
        os.fstat(filename)  # OSError EBADF, as open(fd) gives, when closed
        return "/dev/fd/%d" % filename, filename
    return os.fspath(filename), None


def _write_flamegraph(filename: Any, snapshot: Any, per_segment: bool) -> None:
    """torch's ``with open(filename, "w") as f: f.write(_segments(snapshot))``
    (or ``_memory``), written by memsnap's atomic writer."""
    if snapshot is not None and not isinstance(snapshot, dict):
        raise TypeError("snapshot must be a dict (a _snapshot() result) or None, "
                        f"not {type(snapshot).__name__}")
    path, fd = _output_target(filename)
    try:
        try:
            from torch.cuda import _memory_viz as viz
        except ImportError as e:
            raise ImportError(
                "_save_segment_usage and _save_memory_usage draw with torch's "
                "torch.cuda._memory_viz (and its flamegraph.pl); install torch, "
                "or use the memsnap CLI (memsnap view / memsnap plot) on a "
                "_dump_snapshot file") from e
        if snapshot is None:
            snapshot = _snapshot()
        # (torch's format_flamegraph, looked up now: it runs
        # ~/.cache/flamegraph.pl, which it downloads there when missing)
        draw = viz.segments if per_segment else viz.memory
        svg = draw(snapshot, format_flamegraph=viz.format_flamegraph)
        _C.write_file(path, svg.encode("utf-8"))
    finally:
        if fd is not None:
            os.close(fd)


def _save_segment_usage(filename="output.svg", snapshot=None):
    """Write a flame graph (SVG) of the live and cached bytes per stream,
    segment, block state and allocation stack to ``filename``.

    ``snapshot`` is a :func:`_snapshot` dict (None: the current one).  The
    graph is torch's own: ``torch.cuda._memory_viz.segments`` with its
    ``format_flamegraph``, which runs Brendan Gregg's ``flamegraph.pl`` as
    ``~/.cache/flamegraph.pl`` (torch 2.13: ``os.path.expanduser``, the
    directory created if missing; when the script is not there torch
    downloads it from raw.githubusercontent.com (brendangregg/FlameGraph)
    first: on an air-gapped host put it there, executable, beforehand).
    The file is written as :func:`_dump_snapshot` writes (atomic, the link
    rule, a descriptor taken and closed).

    Raises:
        TypeError: ``snapshot`` is not a dict or None; a bad ``filename``.
        ImportError: torch is not installed.
        OSError: the file cannot be written.

    Mirrors ``torch/cuda/memory.py: _save_segment_usage``.
    """
    _write_flamegraph(filename, snapshot, per_segment=True)


def _save_memory_usage(filename="output.svg", snapshot=None):
    """The same flame graph per stream without the segment level
    (``torch.cuda._memory_viz.memory``); see :func:`_save_segment_usage`.

    Mirrors ``torch/cuda/memory.py: _save_memory_usage``.
    """
    _write_flamegraph(filename, snapshot, per_segment=False)


def _dump_usage_report(prof_path: str) -> None:
    """torch_npu's step after the pickle: saveDevMemUsageInfo, else the
    profiler, writing into ``prof_path`` (``torch_npu/npu/memory.py:
    _dump_snapshot``)."""
    device = _current_device()
    try:
        if _C.dump_usage_reports(device):
            return
    except OSError as e:
        # torch_npu's saveDevMemUsageInfo raises here (GetOomSnapshotDumpPath:
        # "OOM_SNAPSHOT_PATH is invalid"); the snapshot is written by then,
        # so memsnap says why the report is missing instead of failing it
        warnings.warn(f"memsnap: no memory usage report was written: {e} "
                      "(the snapshot was)", RuntimeWarning, stacklevel=3)
        return
    try:
        import torch_npu  # type: ignore[import-not-found]
    except ImportError:
        return  # no CANN report and no torch_npu profiler to ask
    activities = {torch_npu.profiler.ProfilerActivity.CPU,
                  torch_npu.profiler.ProfilerActivity.NPU}
    prof = torch_npu._C._profiler
    prof._init_profiler(prof_path, activities)
    prof_config = [prof_path, False, True, False, False, False, prof._ExperimentalConfig()]
    npu_prof_config = prof.NpuProfilerConfig(*tuple(prof_config))
    prof._start_profiler(npu_prof_config, activities)
    prof._stop_profiler()
    prof._finalize_profiler()


def _dump_augmented(filename: str) -> None:
    data = _snapshot(augment_with_fx_traces=True)
    _C.write_file(filename, pickle.dumps(data, protocol=4))


def memory_snapshot(mempool_id=None, include_traces=True):
    """Return the list of segment dicts (``_snapshot()["segments"]``).

    Args:
        mempool_id: None for every pool, or a pool id ``(int, int)``: only
            that private pool's segments (``[]`` if unknown).
        include_traces (bool): False skips copying the history (faster); a
            ``snapshot`` trace entry is recorded either way.

    Raises:
        RuntimeError: "mempool_id elements must be integers",
            "include_traces must be a boolean".

    Mirrors ``torch/cuda/memory.py: memory_snapshot``.
    """
    if not isinstance(include_traces, bool):
        raise RuntimeError("include_traces must be a boolean")
    first, second = (0, 0) if mempool_id is None else (mempool_id[0], mempool_id[1])
    if not isinstance(first, int) or not isinstance(second, int):
        raise RuntimeError("mempool_id elements must be integers")
    result = _C.snapshot(-1, first, second, include_traces, True)
    return result["segments"] if isinstance(result, dict) else result


def _allocation_traceback(data_ptr: int) -> list[dict[str, Any]] | None:
    """Frames recorded when the live allocation at ``data_ptr`` was made.

    Returns a list of ``{"filename", "line", "name"}`` dicts, innermost
    first, or None when ``data_ptr`` is not a live base address or no stack
    was recorded (history ``context`` was None).  A tensor is accepted too
    (its storage's base address is used).  Mirrors ``torch/cuda/memory.py: _allocation_traceback``.
    """
    if not isinstance(data_ptr, int) and hasattr(data_ptr, "untyped_storage"):
        data_ptr = data_ptr.untyped_storage().data_ptr()
    return _C.allocation_traceback(data_ptr)


def _memory_metadata_supported() -> bool:
    """True: memsnap records user metadata.

    Mirrors ``torch/cuda/memory.py: _memory_metadata_supported``.
    """
    return True


def _set_memory_metadata(metadata: str):
    """Attach ``metadata`` to every later trace entry of this thread.

    Stored as ``user_metadata`` of the entries; ``""`` clears.  Mirrors
    ``torch/cuda/memory.py: _set_memory_metadata``.
    """
    _C.set_memory_metadata(metadata)


def _get_memory_metadata() -> str:
    """This thread's current metadata string (``""`` if none).

    Mirrors ``torch/cuda/memory.py: _get_memory_metadata``.
    """
    return _C.get_memory_metadata()


def _annotate_memory(data_ptr: int, metadata: str) -> None:
    """Record an ``annotate`` trace entry on the live allocation at ``data_ptr``.

    The entry's ``user_metadata`` is ``metadata``; ``size`` is the
    allocation's requested bytes.

    Raises:
        RuntimeError: "annotateMemory: no live allocation found at pointer
            0x..." (even when history is off).

    Mirrors ``torch/cuda/memory.py: _annotate_memory``.
    """
    _C.annotate_memory(data_ptr, metadata)


def _attach_out_of_memory_observer(observer) -> None:
    """Call ``observer(device, alloc_bytes, device_total, device_free)`` on OOM.

    Called after the ``oom`` trace entry is recorded and before
    OutOfMemoryError is raised, outside the allocator lock: the observer may
    call :func:`_snapshot` / :func:`_dump_snapshot`.  An exception inside
    the observer is reported through ``sys.unraisablehook`` and never hides
    the OutOfMemoryError.  Sizes are bytes.

    Mirrors ``torch._C._cuda_attach_out_of_memory_observer``.
    """
    _C.attach_oom_observer(observer)


def _save_dev_mem_usage_info(device: Any = None) -> bool:
    """Write CANN's per-module usage CSV of ``device`` (torch_npu's
    ``torch_npu._C._npu_saveDevMemUsageInfo``).

    The file is ``device_<dev>_memUsageInfo_<YYYYmmddHHMMSS>.csv`` in
    ``OOM_SNAPSHOT_PATH`` or the current directory, header
    ``moduleName,curMemSize(MB),memPeakSize(MB)``, sizes in MiB with four
    decimals.  Returns False when the runtime has no
    ``aclrtGetMemUsageInfo`` (older CANN, the sim) or the file cannot be
    written.  Mirrors ``NPUCachingAllocator.cpp: saveDevMemUsageInfo``.
    """
    return _C.save_dev_mem_usage_info(_device_index(device))


def _notify_device_error(message: str, device: Any = None) -> bool:
    """Report the text of a failed device call (a framework's error path).

    When the text is CANN's OOM (torch_npu ``isCannOOM``: it contains
    ``EL0004`` or ``Failed to allocate``) the OOM_SNAPSHOT_ENABLE dump runs
    -- torch_npu's ``NPU_CHECK_ERROR`` calls its OOM observer before
    raising.  Returns True when the text is CANN's OOM (whether or not
    OOM_SNAPSHOT_ENABLE made it write a dump), False otherwise.  Observers attached
    with :func:`_attach_out_of_memory_observer` are not called (torch_npu
    calls only the snapshot observer there).
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, not {type(message).__name__}")
    return _C.notify_device_error(_device_index(device), message)


def _write_usage_report(path) -> None:
    """Write memsnap's CSV memory-usage report (one row per device and pool,
    plus the workspace) to ``path``.

    memsnap-only: allocator statistics, not CANN's per-module report (that
    is :func:`_save_dev_mem_usage_info`, torch_npu's
    ``_npu_saveDevMemUsageInfo``).  Written as :func:`_dump_snapshot`
    writes (atomically, under the protected_symlinks rule).
    """
    _C.write_usage_report(os.fspath(path))



# ---------------------------------------------------------------------------
# Pinned host memory (src/alloc/host.c: PyTorch's CachingHostAllocator).
# Recorded into host_segments/host_traces by
# _record_memory_history(record_pinned_host_memory=True).
# ---------------------------------------------------------------------------


def _host_alloc(size: int) -> int:
    """Allocate ``size`` bytes of pinned host memory; return the address.

    The block is rounded up to a power of two and cached by size after
    :func:`_host_free` (reused by the next request of that rounded size).
    ``size`` 0 returns 0.

    Raises:
        OutOfMemoryError: the runtime has no pinned memory left.
        ValueError: ``size`` is negative.

    memsnap's stand-in for what ``torch.empty(..., pin_memory=True)`` asks
    of ``CachingHostAllocator``.
    """
    return _C.host_malloc(size)


def _host_free(ptr: int) -> None:
    """Free a block of :func:`_host_alloc` (``0`` is a no-op).

    Raises:
        ValueError: ``ptr`` is not a live pinned host block.
    """
    _C.host_free(ptr)


def _host_record_stream(ptr: int, stream: Any) -> None:
    """Mark the pinned block at ``ptr`` as used on ``stream``: after
    :func:`_host_free` it is reused only once the work queued on ``stream``
    has finished.

    Mirrors ``CachingHostAllocator_recordEvent``.
    """
    _C.host_record_stream(ptr, _stream_handle(stream, _current_device()))


def empty_host_cache() -> None:
    """Return every cached (free) pinned host block to the runtime.

    Mirrors ``torch/accelerator/memory.py: empty_host_cache``.
    """
    _C.host_empty_cache()


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """Return the pinned host allocator statistics as a nested dict.

    Keys as torch's: ``allocations``, ``allocated_bytes`` (blocks owned,
    active or cached, rounded sizes), ``active_requests``, ``active_bytes``
    (blocks not yet reusable) each ``{"current", "peak", "allocated",
    "freed"}``; ``num_host_alloc``/``num_host_free`` (runtime calls);
    ``host_alloc_time``/``host_free_time`` ``{"total", "max", "min",
    "count", "avg"}`` in microseconds.  Unlike torch, this works before
    the first allocation (all zeros).

    Mirrors ``torch/cuda/memory.py: host_memory_stats_as_nested_dict``.
    """
    return _C.host_memory_stats()


def host_memory_stats() -> dict[str, Any]:
    """Return :func:`host_memory_stats_as_nested_dict` flattened with ``"."``
    as an ``OrderedDict`` sorted by key (e.g. ``"allocated_bytes.current"``).

    Mirrors ``torch/cuda/memory.py: host_memory_stats``.
    """
    items: list = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            items.append((prefix, obj))

    walk("", host_memory_stats_as_nested_dict())
    items.sort()
    return collections.OrderedDict(items)


def reset_accumulated_host_memory_stats() -> None:
    """Zero the ``allocated``/``freed`` fields, the runtime call counters and
    the ``total``/``count`` of the timings.

    Mirrors ``torch/cuda/memory.py: reset_accumulated_host_memory_stats``.
    """
    _C.host_reset_accumulated_stats()


def reset_peak_host_memory_stats() -> None:
    """Set every ``peak`` to ``current`` and the timings' ``min``/``max`` to 0.

    Mirrors ``torch/cuda/memory.py: reset_peak_host_memory_stats``.
    """
    _C.host_reset_peak_stats()


def _allocator_created_by() -> str | None:
    """``memsnap.memory.NAME at FILE:LINE``: the call of memsnap's Python
    package that created memsnap's allocator (noted by the extension when
    msnap_default() first returned it: the outermost frame inside the
    package and its caller), or None (not created, or created another way:
    the torch shim, a C caller)."""
    by = _C.created_by()
    if by is None:
        return None
    mod, func, site = by
    mod = mod[:-3] if mod.endswith(".py") else mod
    return f"memsnap.{mod.replace('/', '.')}.{func} at {site}"
