"""A stand-in torch_npu for memsnap's tests (tests/fakes/torch_npu/).

It loads the stand-in libtorch_npu.so (fake_torch_npu.cpp; path in
FAKE_TORCH_NPU_LIBRARY), names PrivateUse1 "npu" and registers torch.npu,
as torch_npu does on import.  The pieces memsnap.torch touches behave as
torch_npu's: torch_npu.npu.memory.NPUPluggableAllocator dlopens a library
and looks the two functions up by name, _npu_customAllocator returns an
allocator object whose set_*_fn(func_ptr) methods turn a raw pointer into
a typed std::function, change_current_allocator refuses after the first
allocation, memory_stats / empty_cache / reset_peak_memory_stats go to the
current allocator's hooks.
"""
import ctypes
import os

import torch

_lib = ctypes.CDLL(os.environ["FAKE_TORCH_NPU_LIBRARY"], mode=ctypes.RTLD_GLOBAL)

torch.utils.rename_privateuse1_backend("npu")

from . import _C  # noqa: E402
from . import npu  # noqa: E402

torch._register_device_module("npu", npu)
__version__ = "2.13.0.fake"
