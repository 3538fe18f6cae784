"""memsnap.torch -- plug memsnap into torch (CUDA) or torch_npu (Ascend).

``use_allocator()`` installs libmemsnap.so as torch's current device
allocator through the pluggable-allocator API
(``torch.cuda.memory.CUDAPluggableAllocator`` or torch_npu's
``NPUPluggableAllocator``, which dlopen the library and call
``msnap_plugin_malloc(size, device, stream)`` /
``msnap_plugin_free(ptr, size, device, stream)``).  From then on every
tensor's memory comes from memsnap, and ``memsnap.memory`` (stats, history,
snapshots) describes it.

``patch_torch_npu()`` makes ``torch_npu.npu.memory``'s history and
snapshot functions (and the ones torch_npu lacks, e.g.
``_allocation_traceback`` or ``_set_memory_metadata``) call memsnap.

While history is on, ``torch.profiler.record_function`` ranges are recorded
as ``external_annotations`` (of the enabling thread, or of every thread with
``global_record_annotations=True``), and with ``compile_context=True``
ranges named "Torch-Compiled Region..." set the entries' compile_context.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from . import _memsnap as _C
from . import configure, library_path
from . import memory as _memory

__all__ = ["use_allocator", "patch_torch_npu", "installed_backend"]

ALLOC_FN = "msnap_plugin_malloc"
FREE_FN = "msnap_plugin_free"

_installed: str | None = None
_lock = threading.Lock()


def installed_backend() -> str | None:
    """"npu" or "cuda" once :func:`use_allocator` succeeded, else None."""
    return _installed


def _pick_backend(backend: str | None) -> str:
    if backend is not None:
        if backend not in ("npu", "cuda"):
            raise ValueError(f"backend must be 'npu', 'cuda' or None, not {backend!r}")
        return backend
    try:
        importlib.import_module("torch_npu")
        return "npu"
    except ImportError:
        return "cuda"


def use_allocator(backend: str | None = None):
    """Install memsnap as torch's device allocator; return the allocator object.

    Args:
        backend: "npu" (torch_npu's NPUPluggableAllocator), "cuda"
            (torch.cuda.memory.CUDAPluggableAllocator) or None: "npu" when
            torch_npu is importable, else "cuda".

    Must run before the first device allocation of the process (torch
    cannot swap an initialised allocator).  Also selects memsnap's runtime
    and profile (acl/npu or cuda/cuda) unless MEMSNAP_RUNTIME /
    MEMSNAP_PROFILE say otherwise, and routes memsnap.memory's current
    device and stream to torch's.

    Raises:
        RuntimeError: too late (the device allocator is already in use), or
            this torch has no pluggable-allocator API for the backend (e.g.
            a CPU-only torch for "cuda").
    """
    global _installed
    kind = _pick_backend(backend)
    with _lock:
        if _installed is not None:
            if _installed == kind:
                return None
            raise RuntimeError(f"memsnap is already installed for {_installed}")
        path = library_path()
        if not os.path.exists(path):
            raise RuntimeError(f"memsnap: {path} is missing (package not built?)")
        if kind == "npu":
            torch_npu = importlib.import_module("torch_npu")
            mem = importlib.import_module("torch_npu.npu.memory")
            dev_mod = getattr(torch_npu, "npu", None)
            # torch_npu.npu.memory defines them; torch_npu.npu re-exports.
            pluggable = getattr(mem, "NPUPluggableAllocator", None) or getattr(
                dev_mod, "NPUPluggableAllocator", None)
            change = getattr(mem, "change_current_allocator", None) or getattr(
                dev_mod, "change_current_allocator", None)
            runtime, profile = "acl", "npu"
            stream_attr = "npu_stream"
        else:
            import torch

            mem = torch.cuda.memory
            pluggable = getattr(mem, "CUDAPluggableAllocator", None)
            change = getattr(mem, "change_current_allocator", None)
            dev_mod = torch.cuda
            runtime, profile = "cuda", "cuda"
            stream_attr = "cuda_stream"
            cuda_backend = getattr(torch.backends, "cuda", None)
            if cuda_backend is None or not cuda_backend.is_built():
                raise RuntimeError(
                    "memsnap.torch.use_allocator('cuda'): this torch was built "
                    "without CUDA, so it has no CUDA pluggable allocator"
                )
        if pluggable is None or change is None:
            raise RuntimeError(
                f"memsnap.torch.use_allocator({kind!r}): this torch has no "
                f"pluggable-allocator API ({mem.__name__}.*PluggableAllocator)"
            )
        if not _C.initialized():
            configure(
                runtime=os.environ.get("MEMSNAP_RUNTIME", runtime),
                profile=os.environ.get("MEMSNAP_PROFILE", profile),
            )
        allocator = pluggable(path, ALLOC_FN, FREE_FN)
        try:
            change(allocator)
        except RuntimeError as e:
            raise RuntimeError(
                "memsnap.torch.use_allocator() must run before the first "
                f"{kind} allocation of the process (torch said: {e})"
            ) from e
        _route(dev_mod, stream_attr)
        _installed = kind
        return allocator


def _route(dev_mod: Any, stream_attr: str) -> None:
    """Make memsnap.memory's default device/stream those of torch."""
    current_device = getattr(dev_mod, "current_device", None)
    current_stream = getattr(dev_mod, "current_stream", None)
    if current_device is not None:
        _memory._current_device_hook = current_device
    if current_stream is not None:

        def stream_of(device: int) -> int:
            return int(getattr(current_stream(device), stream_attr, 0) or 0)

        _memory._current_stream_hook = stream_of


# Names torch_npu.npu.memory gets from memsnap: its history/snapshot
# functions, plus the torch.cuda.memory functions it lacks.
_NPU_PATCHED = (
    "_record_memory_history",
    "_record_memory_history_impl",
    "_record_memory_history_legacy",
    "_snapshot",
    "_dump_snapshot",
    "memory_snapshot",
    "_allocation_traceback",
    "_set_memory_metadata",
    "_get_memory_metadata",
    "_memory_metadata_supported",
    "_annotate_memory",
    "_attach_out_of_memory_observer",
    "caching_allocator_enable",
    "caching_allocator_disabled",
    "list_gpu_processes",
    "mem_get_info",
)
# With memsnap as the allocator, torch_npu's own statistics describe
# nothing: these go to memsnap too.
_NPU_PATCHED_WHEN_INSTALLED = (
    "caching_allocator_alloc",
    "caching_allocator_delete",
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
    "memory_summary",
    "empty_cache",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "_set_allocator_settings",
)


def patch_torch_npu() -> list[str]:
    """Route torch_npu.npu.memory's history/snapshot API to memsnap.

    Replaces (in ``torch_npu.npu.memory`` and, where it re-exports them, in
    ``torch_npu.npu`` and ``torch.npu``) ``_record_memory_history``,
    ``_snapshot``, ``_dump_snapshot``, ``memory_snapshot`` and adds the
    functions torch_npu lacks (``_allocation_traceback``,
    ``_set_memory_metadata``, ``_get_memory_metadata``,
    ``_memory_metadata_supported``, ``_annotate_memory``,
    ``caching_allocator_enable``/``_disabled``, ``list_gpu_processes``,
    ``mem_get_info``...).  After :func:`use_allocator` the statistics
    functions are routed too.  Returns the sorted list of names replaced or
    added in ``torch_npu.npu.memory``.

    Raises:
        ImportError: torch_npu is not importable.
    """
    torch_npu = importlib.import_module("torch_npu")
    mem = importlib.import_module("torch_npu.npu.memory")
    names = list(_NPU_PATCHED)
    if _installed == "npu":
        names += _NPU_PATCHED_WHEN_INSTALLED
    targets = [getattr(torch_npu, "npu", None)]
    try:
        import torch

        targets.append(getattr(torch, "npu", None))
    except ImportError:
        pass
    for name in names:
        fn = getattr(_memory, name)
        setattr(mem, name, fn)
        for t in targets:
            if t is not None and t is not mem and hasattr(t, name):
                setattr(t, name, fn)
    return sorted(names)


# ---------------------------------------------------------------------------
# record_function ranges -> external_annotations / compile_context
# ---------------------------------------------------------------------------

_ann = threading.local()
_ann_state = {"on": False, "global": False, "thread": None, "compile": False}
_patched_record_function = False


def _device_now() -> int:
    try:
        return _memory._current_device()
    except Exception:
        return 0


def _on_enter(name: str) -> None:
    st = _ann_state
    if not st["on"]:
        return
    if st["global"] or threading.get_ident() == st["thread"]:
        _C.record_annotation(_device_now(), name, True)
    if st["compile"] and name.startswith("Torch-Compiled Region"):
        _C.compile_context_push(name)
        stack = getattr(_ann, "compiled", None)
        if stack is None:
            stack = _ann.compiled = []
        stack.append(name)


def _on_exit(name: str) -> None:
    st = _ann_state
    stack = getattr(_ann, "compiled", None)
    if stack and stack[-1] == name:
        stack.pop()
        _C.compile_context_pop()
    if not st["on"]:
        return
    if st["global"] or threading.get_ident() == st["thread"]:
        _C.record_annotation(_device_now(), name, False)


_rf_originals: tuple | None = None  # (class, __enter__, __exit__) while patched


def _patch_record_function() -> None:
    """Wrap torch.autograd.profiler.record_function's __enter__/__exit__.

    Installed while history is on (memsnap.memory._record_memory_history
    loads this module when torch is importable), removed again by
    :func:`_unpatch_record_function` when history is disabled.
    """
    global _patched_record_function, _rf_originals
    if _patched_record_function:
        return
    try:
        from torch.autograd import profiler
    except ImportError:
        return
    except Exception as e:  # a broken torch install: history still works
        import warnings

        warnings.warn(f"memsnap: record_function ranges will not be recorded: "
                      f"importing torch failed: {e}", RuntimeWarning, stacklevel=3)
        return
    cls = profiler.record_function
    enter, exit_ = cls.__enter__, cls.__exit__

    def __enter__(self):
        r = enter(self)
        _on_enter(self.name)
        return r

    def __exit__(self, exc_type, exc_value, traceback):
        _on_exit(self.name)
        return exit_(self, exc_type, exc_value, traceback)

    __enter__._memsnap_hook = True
    __exit__._memsnap_hook = True
    cls.__enter__ = __enter__
    cls.__exit__ = __exit__
    _rf_originals = (cls, enter, exit_)
    _patched_record_function = True


def _unpatch_record_function() -> None:
    """Restore record_function's own __enter__/__exit__ (history off).

    Compiled-region contexts this thread still has open are popped: their
    __exit__ will no longer reach memsnap.
    """
    global _patched_record_function, _rf_originals
    if not _patched_record_function or _rf_originals is None:
        return
    cls, enter, exit_ = _rf_originals
    cls.__enter__ = enter
    cls.__exit__ = exit_
    _rf_originals = None
    _patched_record_function = False
    stack = getattr(_ann, "compiled", None)
    while stack:
        stack.pop()
        _C.compile_context_pop()


def _history_changed(enabled: bool, compile_context: bool, global_annotations: bool) -> None:
    st = _ann_state
    if not enabled:
        st.update(on=False, compile=False)
        _unpatch_record_function()
        return
    if not st["on"]:
        # Installation is idempotent as in torch: the thread-local/global
        # choice holds until history is disabled.
        st["global"] = bool(global_annotations)
        st["thread"] = threading.get_ident()
    st["on"] = True
    st["compile"] = bool(compile_context)
    _patch_record_function()


_memory._history_listeners.append(_history_changed)
