"""A stand-in for torch_npu in tests: only the profiler surface that
torch_npu.npu.memory._dump_snapshot uses when saveDevMemUsageInfo fails
(torch_npu/npu/memory.py), with the signatures of the real bindings
(torch_npu/csrc/profiler/init.cpp, npu_profiler.h).  A finished run leaves
<path>/memsnap_standin_profiler.json naming the calls, so a test can check
what memsnap asked for.  Put tests/fakes/python on PYTHONPATH to use it;
never on the path of other tests.
"""
from . import _C, profiler  # noqa: F401
