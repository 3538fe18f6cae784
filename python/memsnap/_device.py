"""The device module of a memsnap device: ``torch.<name>``.

:func:`memsnap.torch.register_device` registers this module with
``torch._register_device_module(name, module)`` (as torch_npu registers
``torch.npu``).  It has what torch asks of a PrivateUse1 device module
(``is_available``, ``device_count``, ``current_device``, ``device`` (the
context manager torch.load needs), ``_lazy_init``,
``_is_in_bad_fork``, ``manual_seed_all``, ``get_amp_supported_dtype``...),
the stream, event, property and RNG functions of ``torch.cuda`` /
``torch_npu.npu`` (``Stream``, ``Event``, ``current_stream``,
``default_stream``, ``set_stream``, ``stream``, ``get_device_properties``,
``get_rng_state``...)
and, as ``torch.cuda`` / ``torch.npu``, the memory functions, which are
memsnap's own (:mod:`memsnap.memory`): ``memory_allocated``,
``memory_reserved``, ``max_memory_allocated``, ``memory_stats``,
``empty_cache``, ``reset_peak_memory_stats``, ``host_memory_stats``,
``caching_allocator_enable``, ``get_allocator_backend``..., and ``memory`` itself
(``torch.<name>.memory._record_memory_history``, ``_snapshot``,
``_dump_snapshot``).
"""

from __future__ import annotations

from typing import Any

from . import _memsnap as _C
from . import _shim
from . import memory
from .memory import (  # noqa: F401  (re-exported as torch.<name>.*)
    MemPool,
    caching_allocator_alloc,
    caching_allocator_delete,
    caching_allocator_disabled,
    caching_allocator_enable,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    list_gpu_processes,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    use_mem_pool,
)

#: The device type name (set by register_device).
name = "privateuseone"


def is_available() -> bool:
    """True: the device is simulated (MEMSNAP_SIM_DEVICES devices)."""
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """torch calls this before the first tensor of the device; memsnap's
    allocator is already there."""


def device_count() -> int:
    """MEMSNAP_SIM_DEVICES."""
    return _C.device_count()


def current_device() -> int:
    """The calling thread's current device index (the device guard's)."""
    return int(_shim.torch_lib().msnap_torch_current_device())


def set_device(device: Any) -> None:
    """Make ``device`` (an index, ``"<name>:1"`` or a torch.device) the
    calling thread's current device.  ValueError for an invalid index."""
    idx = memory._device_index(device)
    err = _shim.torch_lib().msnap_torch_set_device(idx)
    if err:
        raise ValueError(_shim.text(err))


class device:
    """Context manager that makes ``device`` the calling thread's current
    device and restores the previous one on exit, as ``torch.cuda.device``
    (torch/cuda/__init__.py) and ``torch_npu.npu.device``.

    ``device``: an index, ``"<name>:1"``, a torch.device of this type, or
    None / a negative index (no change).  torch's ``_utils._to`` enters it
    to copy a storage to the device (``torch.load`` of a device tensor,
    ``UntypedStorage.to``).  ValueError for another device type or an
    invalid index (raised on entry for the index, as torch.cuda.device).
    """

    def __init__(self, device: Any):
        self.idx = -1 if device is None else memory._device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = current_device()
            if self.idx != self.prev_idx:
                set_device(self.idx)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        if self.prev_idx >= 0 and self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """:class:`device` of the tensor ``obj`` when it is on this device; no
    change otherwise (as ``torch.cuda.device_of``)."""

    def __init__(self, obj: Any):
        on_device = getattr(obj, "device", None) is not None and obj.device.type == name
        super().__init__(obj.get_device() if on_device else None)


def _index(device: Any) -> int:
    """The index of ``device`` (None: the current device), checked against
    device_count(): ValueError when out of range."""
    idx = memory._device_index(device)
    if not 0 <= idx < device_count():
        raise ValueError(f"Invalid device index {idx} ({device_count()} devices)")
    return idx


def synchronize(device: Any = None) -> None:
    """Nothing to wait for: every operator on the device runs synchronously
    (on the CPU).  The device argument is checked."""
    _index(device)


def _is_in_bad_fork() -> bool:
    """False: the sim runtime works in forked children (memsnap's
    allocator is fork safe; the child has a copy of the device memory)."""
    return _C.in_bad_fork()


def manual_seed(seed: int) -> None:
    """Random operators of this device run on the CPU with the CPU
    generator, which ``torch.manual_seed`` seeds; nothing to do here."""


manual_seed_all = manual_seed


def seed() -> None:
    """See :func:`manual_seed`."""


seed_all = seed


def get_amp_supported_dtype() -> list:
    """Autocast dtypes: the CPU's (the operators run on the CPU); the
    shim registers torch's autocast policy for the device (csrc/autocast.cpp)."""
    import torch

    return [torch.bfloat16, torch.float16]


def current_stream_handle(device: Any = None) -> int:
    """The calling thread's current stream of ``device`` as memsnap's
    stream handle (0 = the default stream)."""
    return int(_shim.torch_lib().msnap_torch_current_stream(memory._device_index(device)))


# ---- streams and events (torch.cuda's / torch_npu.npu's names) ------------
# The device guard of the shim (csrc/device.cpp) keeps a current stream per
# thread and device; torch's generic torch.Stream / torch.Event and
# torch.accelerator reach it for a PrivateUse1 device.  Every operator runs
# synchronously, so streams are ordering labels for the allocator
# (record_stream, the stream of each block) and events complete when
# recorded.


def current_stream(device: Any = None):
    """The calling thread's current stream of ``device`` (a torch.Stream),
    as ``torch.cuda.current_stream``."""
    import torch

    return torch.accelerator.current_stream(_index(device))


def default_stream(device: Any = None):
    """The default stream (id 0) of ``device``, as
    ``torch.cuda.default_stream``."""
    import torch

    cur = current_stream(device)
    return torch.Stream(stream_id=0, device_index=cur.device_index,
                        device_type=cur.device_type)


def set_stream(stream) -> None:
    """Make ``stream`` the current stream of its device (None: no change),
    as ``torch.cuda.set_stream``."""
    import torch

    if stream is not None:
        torch.accelerator.set_stream(stream)


class stream:  # noqa: N801 (torch's name)
    """Context manager: ``stream`` is the current stream of its device
    inside the block (None: no change), as ``torch.cuda.stream``."""

    def __init__(self, stream):
        self.stream = stream
        self.prev = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        if self.prev is not None:
            set_stream(self.prev)
        return False


def get_device_name(device: Any = None) -> str:
    """``memsnap sim device (PROFILE)``."""
    _index(device)
    return f"memsnap sim device ({_C.profile()})"


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(8, 0), as predict's device: bf16 and TF32 code paths stay those of
    a current device (the operators run on the CPU)."""
    _index(device)
    return (8, 0)


def get_device_properties(device: Any = None):
    """name, total_memory (the sim's device size: ``mem_get_info``), major,
    minor, multi_processor_count... as ``torch.cuda.get_device_properties``
    gives them (the figures past total_memory are nominal)."""
    import types

    i = _index(device)
    return types.SimpleNamespace(
        name=get_device_name(i), total_memory=mem_get_info(i)[1], major=8,
        minor=0, multi_processor_count=1, is_integrated=False,
        is_multi_gpu_board=False, uuid=f"memsnap-sim-{i}", index=i)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: bf16 operators run on the CPU."""
    return True


def get_rng_state(device: Any = None):
    """The CPU generator's state: random operators of this device run on
    the CPU with it (``torch.manual_seed`` seeds it)."""
    import torch

    _index(device)
    return torch.get_rng_state()


def set_rng_state(new_state, device: Any = None) -> None:
    """See :func:`get_rng_state`."""
    import torch

    _index(device)
    torch.set_rng_state(new_state)


def __getattr__(attr: str):
    # torch.<name>.OutOfMemoryError is torch's class, as torch.cuda's.
    if attr == "OutOfMemoryError":
        import torch

        return torch.OutOfMemoryError
    # torch.<name>.Stream / Event are torch's generic classes, whose
    # device defaults to the current accelerator (this one): Stream(),
    # Stream(device=1, priority=0), Event(enable_timing=True), `with s:`,
    # and elapsed_time, which insists on torch.Event itself.
    if attr in ("Stream", "Event"):
        import torch

        return getattr(torch, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
