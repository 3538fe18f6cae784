"""torch_npu._C._profiler as torch_npu/csrc/profiler/init.cpp binds it:
_init_profiler(path, activities), _ExperimentalConfig(),
NpuProfilerConfig(path, record_shapes, profile_memory, with_stack,
with_flops, with_modules, experimental_config) (npu_profiler.h),
_start_profiler(config, activities), _stop_profiler(), _finalize_profiler().
Type checks stand in for pybind11's argument conversion."""
import enum
import json
import os


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1


class _ExperimentalConfig:
    def __init__(self, *args, **kwargs):
        self.args = args


class NpuProfilerConfig:
    def __init__(self, path, record_shapes=False, profile_memory=False,
                 with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None):
        if not isinstance(path, str):
            raise TypeError("NpuProfilerConfig(): path must be a str")
        flags = [record_shapes, profile_memory, with_stack, with_flops,
                 with_modules]
        if not all(isinstance(f, bool) for f in flags):
            raise TypeError("NpuProfilerConfig(): flags must be bools")
        if not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("NpuProfilerConfig(): experimental_config")
        self.path = path
        self.flags = dict(zip(["record_shapes", "profile_memory", "with_stack",
                               "with_flops", "with_modules"], flags))


_state = {"calls": [], "path": None}


def _activities(a):
    if not isinstance(a, set) or not all(isinstance(x, ProfilerActivity) for x in a):
        raise TypeError("activities must be a set of ProfilerActivity")
    return sorted(x.name for x in a)


def _init_profiler(path, activities):
    if not isinstance(path, str):
        raise TypeError("_init_profiler(): path must be a str")
    _state["path"] = path
    _state["calls"].append(["_init_profiler", path, _activities(activities)])


def _start_profiler(config, activities):
    if not isinstance(config, NpuProfilerConfig):
        raise TypeError("_start_profiler(): config must be NpuProfilerConfig")
    _state["calls"].append(["_start_profiler", config.path, config.flags,
                            _activities(activities)])


def _stop_profiler():
    _state["calls"].append(["_stop_profiler"])


def _finalize_profiler():
    _state["calls"].append(["_finalize_profiler"])
    with open(os.path.join(_state["path"], "memsnap_standin_profiler.json"), "w") as f:
        json.dump(_state["calls"], f)
