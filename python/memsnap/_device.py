"""The device module of a memsnap device: ``torch.<name>``.

:func:`memsnap.torch.register_device` registers this module with
``torch._register_device_module(name, module)`` (as torch_npu registers
``torch.npu``).  It has what torch asks of a PrivateUse1 device module
(``is_available``, ``device_count``, ``current_device``, ``device`` (the
context manager torch.load needs), ``_lazy_init``,
``_is_in_bad_fork``, ``manual_seed_all``, ``get_amp_supported_dtype``...)
and, as ``torch.cuda`` / ``torch.npu``, the memory functions, which are
memsnap's own (:mod:`memsnap.memory`): ``memory_allocated``,
``memory_reserved``, ``max_memory_allocated``, ``memory_stats``,
``empty_cache``, ``reset_peak_memory_stats``..., and ``memory`` itself
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
    empty_cache,
    get_per_process_memory_fraction,
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
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
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
        raise ValueError(err.decode())


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


def synchronize(device: Any = None) -> None:
    """Nothing to wait for: every operator on the device runs synchronously
    (on the CPU).  The device argument is checked."""
    idx = memory._device_index(device)
    if not 0 <= idx < device_count():
        raise ValueError(f"Invalid device index {idx} ({device_count()} devices)")


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


def __getattr__(attr: str):
    # torch.<name>.OutOfMemoryError is torch's class, as torch.cuda's.
    if attr == "OutOfMemoryError":
        import torch

        return torch.OutOfMemoryError
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
