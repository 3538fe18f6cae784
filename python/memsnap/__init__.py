"""memsnap: PyTorch-compatible device caching allocator and memory snapshots.

``memsnap.memory`` mirrors ``torch.cuda.memory`` (allocation, statistics,
memory history, snapshots) over memsnap's C allocator; ``memsnap.torch``
plugs that allocator into torch / torch_npu.  The runtime ("sim", "acl",
"cuda") and the allocator profile ("npu", "cuda") come from MEMSNAP_RUNTIME
and MEMSNAP_PROFILE, or from :func:`configure` called before first use.
"""

from __future__ import annotations

import os

from . import _memsnap

# memsnap's own frames (memory.py's wrappers, memsnap.torch,
# memsnap.predict) are never recorded in stacks: register this directory
# before anything allocates.  memsnap.predict's notion of "not the user's
# code" starts from the same directories.
_OWN_DIRS = tuple(dict.fromkeys(
    (os.path.dirname(__file__), os.path.dirname(os.path.abspath(__file__)))))
for _d in _OWN_DIRS:
    _memsnap.hide_frames_under(_d)
del _d

from . import memory  # noqa: E402

__all__ = ["configure", "memory", "library_path", "__version__"]

__version__ = _memsnap.VERSION

# The names MEMSNAP_RUNTIME / MEMSNAP_PROFILE take (src/runtime/runtime.c,
# src/base/env.c: any case), each to the name the allocator reports.
_RUNTIMES = {"sim": "sim", "acl": "acl", "npu": "acl", "ascend": "acl", "cuda": "cuda"}
_PROFILES = {"npu": "npu", "cuda": "cuda"}


def library_path() -> str:
    """Absolute path of libmemsnap.so (for CUDAPluggableAllocator / ctypes)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmemsnap.so")


def configure(runtime: str | None = None, profile: str | None = None) -> None:
    """Choose the device runtime and allocator profile before first use.

    Args:
        runtime: "sim" (simulated devices: MEMSNAP_SIM_DEVICES devices of
            MEMSNAP_SIM_MEMORY bytes), "acl" (Ascend, libascendcl.so; also
            "npu" or "ascend") or "cuda" (libcudart.so), in any case, as
            MEMSNAP_RUNTIME takes them; None keeps MEMSNAP_RUNTIME
            (default sim).
        profile: "npu" (torch_npu's allocator decisions) or "cuda"
            (PyTorch's), in any case; None keeps MEMSNAP_PROFILE, whose
            default is the runtime's own profile: acl -> npu, cuda -> cuda,
            sim -> cuda.

    The choice is stored in MEMSNAP_RUNTIME / MEMSNAP_PROFILE of this
    process, which the allocator reads when it is created.

    Raises:
        ValueError: an unknown runtime or profile (named).
        RuntimeError: the allocator already exists (call configure first).
    """
    rt = None if runtime is None else _RUNTIMES.get(str(runtime).lower())
    if runtime is not None and rt is None:
        raise ValueError(f"unknown memsnap runtime {runtime!r}; expected one of "
                         f"{tuple(_RUNTIMES)}")
    pr = None if profile is None else _PROFILES.get(str(profile).lower())
    if profile is not None and pr is None:
        raise ValueError(f"unknown memsnap profile {profile!r}; expected one of "
                         f"{tuple(_PROFILES)}")
    if _memsnap.initialized():
        # What the allocator really runs (the environment may be unset:
        # the defaults were used).
        current = (_memsnap.runtime_name(), _memsnap.profile())
        if (rt in (None, current[0])) and (pr in (None, current[1])):
            return
        raise RuntimeError(
            "memsnap.configure() must be called before the allocator is first "
            "used (it already exists with runtime %r, profile %r)" % current
        )
    if rt is not None:
        os.environ["MEMSNAP_RUNTIME"] = rt
    if pr is not None:
        os.environ["MEMSNAP_PROFILE"] = pr
