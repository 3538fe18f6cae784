"""The stand-in torch_npu.npu (also torch.npu)."""
from .. import _lib
from . import memory
from .memory import (  # noqa: F401
    NPUPluggableAllocator,
    change_current_allocator,
    empty_cache,
    max_memory_allocated,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    _record_memory_history,
    _snapshot,
    _dump_snapshot,
    memory_snapshot,
)


class _Stream:
    def __init__(self, device, stream_id):
        self.device_index = device
        self.stream_id = stream_id
        from .. import _C
        self.npu_stream = _C._fake_stream_handle(device, stream_id)


def is_available():
    return True


def device_count():
    return _lib.fake_npu_device_count()


def current_device():
    return _lib.fake_npu_current_device()


def set_device(device):
    _lib.fake_npu_set_device(int(device))


def current_stream(device=None):
    d = current_device() if device is None else int(device)
    return _Stream(d, 0)


def _is_in_bad_fork():
    return False


def manual_seed_all(seed):
    pass
