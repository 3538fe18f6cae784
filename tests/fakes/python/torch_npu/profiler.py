"""torch_npu.profiler: ProfilerActivity (torch_npu/csrc/profiler/init.cpp
binds NpuActivityType as ProfilerActivity with CPU and NPU)."""
from ._C._profiler import ProfilerActivity  # noqa: F401
