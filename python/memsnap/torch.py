"""memsnap.torch -- plug memsnap into torch (CUDA) or torch_npu (Ascend).

``use_allocator()`` installs memsnap's C++ shim (libmemsnap_torch.so) as
torch's current device allocator through the pluggable-allocator API
(``torch.cuda.memory.CUDAPluggableAllocator`` or torch_npu's
``NPUPluggableAllocator``, which dlopen the library and call
``msnap_torch_malloc(size, device, stream)`` /
``msnap_torch_free(ptr, size, device, stream)``, raising
torch.OutOfMemoryError at an OOM; without the shim, libmemsnap.so's
``msnap_plugin_malloc`` / ``msnap_plugin_free``, which return NULL).  From then on every
tensor's memory comes from memsnap, and ``memsnap.memory`` (stats, history,
snapshots) describes it.

``patch_torch_npu()`` makes ``torch_npu.npu.memory``'s history and
snapshot functions (and the ones torch_npu lacks, e.g.
``_allocation_traceback`` or ``_set_memory_metadata``) call memsnap.

While history is on, ``torch.profiler.record_function`` ranges are recorded
as ``external_annotations`` (of the enabling thread, or of every thread with
``global_record_annotations=True``), and with ``compile_context=True`` the
"Torch-Compiled Region: N/M" range torch.compile's runtime opens around a
compiled frame sets the compile_context of the entries recorded inside it.
Both come, as for PyTorch's CUDA allocator, from at::RecordFunction
callbacks of the C++ shim (csrc/record.cpp), registered while history is
on (each range recorded once).  Without the shim, record_function's
``__enter__``/``__exit__`` are wrapped instead: Python ranges only, and
Python ranges named "Torch-Compiled Region..." set the compile_context
(torch.compile's own range is not seen).
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import sys
import threading
from typing import Any

from . import _device
from . import _memsnap as _C
from . import _shim
from . import configure, library_path
from . import memory as _memory

__all__ = [
    "use_allocator",
    "patch_torch_npu",
    "patch_torch_cuda",
    "installed_backend",
    "register_device",
    "registered_device",
    "claim_privateuse1",
]

# The pluggable allocator's functions: the C++ shim's (raising
# torch.OutOfMemoryError), or libmemsnap.so's C ones without the shim.
ALLOC_FN = "msnap_torch_malloc"
FREE_FN = "msnap_torch_free"
PLUGIN_ALLOC_FN = "msnap_plugin_malloc"
PLUGIN_FREE_FN = "msnap_plugin_free"

_installed: str | None = None
_lock = threading.Lock()
_claimed: str | None = None  # the PrivateUse1 name memsnap gave
_claimed_owner: str | None = None  # who claimed it (claim_privateuse1)
_claimed_module: Any = None  # the torch.<name> module it registered
_registered: str | None = None  # register_device's name


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


def _entry_points() -> tuple[str, str, str]:
    """(library, alloc_fn name, free_fn name) for the pluggable allocator:
    the C++ shim's msnap_torch_malloc, which raises torch.OutOfMemoryError,
    or, when the shim was not built, libmemsnap.so's msnap_plugin_malloc
    (an OOM then returns NULL to torch: warned)."""
    shim = _shim.path(_shim.TORCH_LIB)
    if os.path.exists(shim):
        return shim, ALLOC_FN, FREE_FN
    import warnings

    warnings.warn(
        f"memsnap: {shim} is missing (memsnap was built without torch): an "
        f"out-of-memory returns NULL to torch instead of raising "
        f"torch.OutOfMemoryError, and the optional allocator hooks are not "
        f"registered; reinstall memsnap with torch installed",
        RuntimeWarning,
        stacklevel=3,
    )
    return library_path(), PLUGIN_ALLOC_FN, PLUGIN_FREE_FN


# set_<hook>_fn of torch_npu's _NPUPluggableAllocator -> (library, symbol).
# "core" is libmemsnap.so, "npu" the torch_npu shim (C++ types).
_NPU_HOOKS = (
    ("set_init_fn", "core", "msnap_plugin_init"),
    ("set_reset_fn", "core", "msnap_plugin_reset"),
    ("set_memory_fraction_fn", "core", "msnap_plugin_memory_fraction"),
    ("set_base_alloc_fn", "core", "msnap_plugin_get_base_allocation"),
    ("set_record_stream_fn", "npu", "msnap_npu_record_stream"),
    ("set_erase_stream_fn", "npu", "msnap_npu_erase_stream"),
    ("set_get_device_stats_fn", "npu", "msnap_npu_get_device_stats"),
    ("set_reset_peak_status_fn", "npu", "msnap_npu_reset_peak_stats"),
)


def _npu_shim():
    """The torch_npu shim, or None (warned) when it was not built."""
    try:
        return _shim.npu_lib()
    except (RuntimeError, OSError) as e:
        import warnings

        warnings.warn(
            f"memsnap: {e}; record_stream, erase_stream, memory statistics "
            f"and torch_npu's task queue are not wired to memsnap",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


def _register_npu_hooks(allocator: Any, npu) -> list[str]:
    """Every hook torch_npu's allocator object offers; returns their names."""
    obj = allocator.allocator() if hasattr(allocator, "allocator") else None
    if obj is None:
        return []
    # libmemsnap.so's functions as the extension sees them: the copy whose
    # allocator memsnap.memory describes.
    core = _C.plugin_entry_points()
    done = []
    for setter, where, symbol in _NPU_HOOKS:
        if not hasattr(obj, setter) or (where == "npu" and npu is None):
            continue
        fn = core[symbol] if where == "core" else _shim.addr(npu, symbol)
        getattr(obj, setter)(fn)
        done.append(setter)
    return done


def use_allocator(backend: str | None = None):
    """Install memsnap as torch's device allocator; return the allocator object.

    Args:
        backend: "npu" (torch_npu's NPUPluggableAllocator), "cuda"
            (torch.cuda.memory.CUDAPluggableAllocator) or None: "npu" when
            torch_npu is importable, else "cuda".

    Must run before the first device allocation of the process (torch
    cannot swap an initialised allocator).  Also selects memsnap's runtime
    and profile (acl/npu or cuda/cuda) unless MEMSNAP_RUNTIME /
    MEMSNAP_PROFILE say otherwise, routes memsnap.memory's current device
    and stream to torch's, registers every optional hook of the pluggable
    allocator (empty_cache, memory fraction, record_stream, base
    allocation; torch_npu: erase_stream, device statistics, peak reset;
    CUDA: allocate-to-pool and pool release), and calls
    :func:`patch_torch_npu` or :func:`patch_torch_cuda`.

    The allocation function is the C++ shim's ``msnap_torch_malloc``: an
    out-of-memory raises ``torch.OutOfMemoryError`` (after memsnap's `oom`
    trace entry, OOM observers and OOM_SNAPSHOT_ENABLE dump).  With
    torch_npu on the acl runtime, memsnap's device synchronizations and
    event records first drain torch_npu's task queue.

    Raises:
        ModuleNotFoundError: "npu" without torch_npu installed (the message
            says to install it, or to use :func:`register_device`).
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
        if _registered is not None:
            raise RuntimeError(
                f"memsnap already provides the device {_registered!r} "
                f"(register_device); it cannot also be torch's {kind} allocator"
            )
        path = library_path()
        if not os.path.exists(path):
            raise RuntimeError(f"memsnap: {path} is missing (package not built?)")
        npu = None
        if kind == "npu":
            try:
                torch_npu = importlib.import_module("torch_npu")
            except ModuleNotFoundError as e:
                if e.name != "torch_npu":
                    raise
                raise ModuleNotFoundError(
                    "memsnap.torch.use_allocator('npu') puts memsnap under torch_npu's "
                    "allocator, and torch_npu is not installed (No module named "
                    "'torch_npu'): install torch_npu (Ascend's PyTorch adapter) for a "
                    "real NPU, or use memsnap.torch.register_device('npu') for a "
                    "simulated \"npu\" device in this torch", name="torch_npu") from None
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
                    "without CUDA, so it has no CUDA pluggable allocator; to "
                    "run torch tensors on memsnap's simulated device, use "
                    "memsnap.torch.register_device('npu') instead"
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
        if kind == "npu":
            npu = _npu_shim()
            if npu is not None and os.environ.get("MEMSNAP_RUNTIME") in ("acl", "npu", "ascend"):
                _install_queue_runtime(npu)
        lib_path, alloc_fn, free_fn = _entry_points()
        allocator = pluggable(lib_path, alloc_fn, free_fn)
        if kind == "npu":
            _register_npu_hooks(allocator, npu)
        try:
            change(allocator)
        except RuntimeError as e:
            raise RuntimeError(
                "memsnap.torch.use_allocator() must run before the first "
                f"{kind} allocation of the process (torch said: {e})"
            ) from e
        if kind == "cuda":
            _install_cuda_hooks()
        _route(dev_mod, stream_attr)
        _memory._add_device_type(kind)
        _installed = kind
        _sync_record_device()
    if kind == "npu":
        patch_torch_npu()
    else:
        patch_torch_cuda()
    return allocator


def _install_queue_runtime(npu) -> None:
    """memsnap's default allocator on the acl runtime, draining torch_npu's
    task queue before device synchronizations and event records."""
    err = npu.msnap_npu_install_runtime()
    if err:
        import warnings

        warnings.warn(
            f"memsnap: torch_npu's task queue is not drained before memsnap's "
            f"device synchronizations and event records: {_shim.text(err)} "
            f"(call memsnap.torch.use_allocator() before any other memsnap "
            f"function)",
            RuntimeWarning,
            stacklevel=4,
        )


def _install_cuda_hooks() -> None:
    """CUDAPluggableAllocator's hooks exist only in C++: the shim's CUDA
    part sets them on torch's current allocator."""
    lib = _shim.torch_lib()
    fn = getattr(lib, "msnap_torch_cuda_install_hooks", None)
    if fn is None:
        import warnings

        warnings.warn(
            "memsnap: the C++ shim was built without CUDA headers: "
            "torch.cuda.empty_cache(), record_stream and the memory fraction "
            "are not forwarded to memsnap (use memsnap.memory's functions)",
            RuntimeWarning,
            stacklevel=4,
        )
        return
    err = fn()
    if err:
        raise RuntimeError(f"memsnap.torch.use_allocator('cuda'): {_shim.text(err)}")


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


# torch.cuda.memory's functions that answer from the current allocator
# (and raise, or say nothing, for a pluggable one): memsnap's instead.  The
# same names as torch_npu gets, less those torch.cuda answers from the
# device itself (mem_get_info, list_gpu_processes) or has no use for with
# a pluggable allocator (caching_allocator_enable / _disabled).
_CUDA_PATCHED = tuple(
    n for n in _NPU_PATCHED + _NPU_PATCHED_WHEN_INSTALLED
    if n not in ("mem_get_info", "list_gpu_processes", "caching_allocator_enable",
                 "caching_allocator_disabled")
)


def patch_torch_cuda() -> list[str]:
    """Route torch.cuda's memory statistics, history and snapshots to memsnap.

    The counterpart of :func:`patch_torch_npu`: replaces, in
    ``torch.cuda.memory`` and where ``torch.cuda`` re-exports them,
    ``memory_stats``, ``memory_allocated``, ``memory_reserved`` and the
    other statistics and resets, ``memory_summary``, ``memory_snapshot``,
    ``empty_cache``, ``caching_allocator_alloc``/``delete``, the memory
    fraction, ``_record_memory_history``, ``_snapshot``,
    ``_dump_snapshot``, ``_allocation_traceback``, the memory metadata and
    annotation functions, ``_attach_out_of_memory_observer`` and
    ``_set_allocator_settings``: with memsnap as the CUDA allocator torch
    would raise for them (a pluggable allocator has no statistics or
    history).  :func:`use_allocator` calls it for "cuda".  Returns the
    sorted names replaced in ``torch.cuda.memory``.

    Raises:
        ImportError: torch is not importable.
    """
    import torch

    mem = importlib.import_module("torch.cuda.memory")
    done = []
    for name in _CUDA_PATCHED:
        fn = getattr(_memory, name)
        if hasattr(mem, name):
            setattr(mem, name, fn)
            done.append(name)
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, fn)
    return sorted(done)


# ---------------------------------------------------------------------------
# A memsnap device in torch: PrivateUse1
# ---------------------------------------------------------------------------

# Names torch already gives a meaning (torch.device types, torch attributes
# such as torch.cpu or torch.mps): a device of that name is refused.
_PRIVATEUSE1_FREE = "privateuseone"


def claim_privateuse1(name: str, module: Any = None,
                      owner: str = "memsnap.torch.register_device") -> str:
    """Give torch's PrivateUse1 backend the name ``name`` for memsnap.

    The one place memsnap names a device (``register_device`` for the real
    memsnap device and ``memsnap.predict`` for its fake one call it).
    ``owner`` names the caller: a process has one PrivateUse1 backend, so a
    second claim by another owner is refused.  Calls ``torch.utils.rename_privateuse1_backend``
    (the mechanism torch_npu uses for "npu") and, with ``module``,
    ``torch._register_device_module(name, module)`` (``torch.<name>``); a
    second call with the same name is a no-op.

    Returns:
        ``name``.

    Raises:
        ValueError: ``name`` is not a lowercase identifier.
        RuntimeError: PrivateUse1 is already named (e.g. "npu" by torch_npu:
            memsnap then cannot add a device; put memsnap under torch_npu
            with :func:`use_allocator` instead), or ``torch.<name>`` already
            exists (a built-in device type or torch module).
    """
    global _claimed, _claimed_module, _claimed_owner
    import torch

    if _check_claim(name, owner):
        if module is not None and _claimed_module is None:
            torch._register_device_module(name, module)
            _claimed_module = module
        return name
    try:
        torch.utils.rename_privateuse1_backend(name)
    except RuntimeError as e:
        raise RuntimeError(f"memsnap cannot register the device {name!r}: {e}") from e
    _claimed = name
    _claimed_owner = owner
    if module is not None:
        torch._register_device_module(name, module)
        _claimed_module = module
    return name


def _check_claim(name: str, owner: str) -> bool:
    """The checks of :func:`claim_privateuse1`, changing nothing: True
    when ``owner`` already holds ``name`` (the claim is a no-op), False
    when the claim can go ahead; raises its ValueError / RuntimeError
    otherwise."""
    import torch

    if not isinstance(name, str) or not re.fullmatch(r"[a-z_]+", name):
        # torch parses a device string's type as letters and underscores
        # (c10/core/Device.cpp): "gpu0:0" would be no device of it
        raise ValueError(
            f"device name must be lowercase letters and underscores (torch's "
            f"device strings, e.g. 'npu:0'), not {name!r}"
        )
    current = torch._C._get_privateuse1_backend_name()
    if _claimed is not None and _claimed_owner != owner:
        raise RuntimeError(
            f"memsnap cannot register the device {name!r} for {owner}: "
            f"{_claimed_owner} already registered {_claimed!r} in this process "
            f"(one PrivateUse1 backend per process; run it in its own process)"
        )
    if current == name and _claimed == name:
        return True
    if current != _PRIVATEUSE1_FREE:
        who = " (by torch_npu)" if "torch_npu" in sys.modules else ""
        raise RuntimeError(
            f"memsnap cannot register the device {name!r}: torch's PrivateUse1 "
            f"backend is already registered as {current!r}{who}, and a process "
            f"has only one; with a real backend there, use "
            f"memsnap.torch.use_allocator() to put memsnap's allocator under it"
        )
    if hasattr(torch, name):
        raise RuntimeError(
            f"memsnap cannot register the device {name!r}: torch.{name} already "
            f"exists (a built-in device type or torch module); choose another name"
        )
    import warnings

    try:
        with warnings.catch_warnings():
            # (torch warns while parsing retired types, e.g. 'mkldnn')
            warnings.simplefilter("ignore")
            torch.device(name)
    except RuntimeError:
        pass  # not a device type yet: free to take
    else:
        raise RuntimeError(
            f"memsnap cannot register the device {name!r}: it is one of torch's "
            f"built-in device types; choose another name"
        )
    return False


def registered_device() -> str | None:
    """The name given to :func:`register_device`, or None."""
    return _registered


def register_device(name: str = "npu") -> str:
    """Make ``name`` a PyTorch device whose memory is memsnap's.

    memsnap becomes that device's ``c10::Allocator`` through PyTorch's
    PrivateUse1 mechanism (as torch_npu registers "npu"), so
    ``torch.empty(..., device=name)``, ``.to(name)``, views, ``resize_``,
    ``del`` and garbage collection allocate and free through memsnap's
    caching allocator, with Python stacks that point at the caller's line.
    ``torch.<name>`` is a device module whose memory functions are
    :mod:`memsnap.memory`'s; ``Tensor.<name>()`` / ``Module.<name>()`` and
    ``Tensor.is_<name>`` are generated as torch does for PrivateUse1.

    The device memory is the sim runtime's, host-backed
    (MEMSNAP_SIM_HOST_BACKED=1 is set when the allocator does not exist
    yet), so copies to and from the CPU carry the real bytes.  The device
    "npu" gets torch_npu's allocator decisions (MEMSNAP_PROFILE=npu, unless
    MEMSNAP_PROFILE says otherwise); any other name the sim's default,
    PyTorch's (cuda).  A small set
    of operators is computed on the CPU over that memory (docs/python.md);
    any other raises NotImplementedError naming the operator.
    MEMSNAP_SIM_DEVICES and MEMSNAP_SIM_MEMORY give the device count and
    size; running past the size raises ``torch.OutOfMemoryError``.

    Args:
        name: the device type name ("npu" by default).

    Returns:
        ``name``.  A second call with the same name returns it again.

    Raises:
        RuntimeError: PrivateUse1 already taken (e.g. torch_npu imported),
            ``torch.<name>`` exists, another name was registered, memsnap's
            allocator already runs on another runtime (acl, cuda, or sim
            without host backing), or the C++ shim is missing.
        ValueError: an invalid name.

    A refused call creates nothing (no allocator, no environment variable,
    no device name), so a second call that fixes the cause works.
    """
    global _registered
    with _lock:
        if _registered is not None:
            if _registered == name:
                return name
            raise RuntimeError(
                f"memsnap already registered the device {_registered!r} "
                f"(one PrivateUse1 device per process)"
            )
        import torch

        # Everything that can be checked is checked before anything is
        # created (memsnap's allocator, the environment it reads, the
        # PrivateUse1 name): a refused call changes nothing, so a call
        # with the mistake corrected then works.
        _check_claim(name, "memsnap.torch.register_device")
        lib = _shim.torch_lib()
        if not _C.initialized():
            runtime = os.environ.get("MEMSNAP_RUNTIME", "sim") or "sim"
            if runtime.lower() != "sim":
                raise RuntimeError(
                    f"memsnap.torch.register_device needs the sim runtime "
                    f"(MEMSNAP_RUNTIME={runtime!r}); on a real device use "
                    f"memsnap.torch.use_allocator()"
                )
            os.environ["MEMSNAP_RUNTIME"] = "sim"
            os.environ["MEMSNAP_SIM_HOST_BACKED"] = "1"
            # The profile rule (docs/python.md): the sim takes PyTorch's
            # decisions unless told; a device named "npu" stands for
            # torch_npu's, as use_allocator("npu") picks the npu profile.
            if name == "npu" and not os.environ.get("MEMSNAP_PROFILE"):
                os.environ["MEMSNAP_PROFILE"] = "npu"
        else:
            _check_existing_allocator(name)
        err = lib.msnap_torch_device_check()
        if err:
            raise RuntimeError(f"memsnap.torch.register_device({name!r}): {_shim.text(err)}")
        _device.name = name
        claim_privateuse1(name, _device)
        err = lib.msnap_torch_device_init()
        if err:
            raise RuntimeError(f"memsnap.torch.register_device({name!r}): {_shim.text(err)}")
        torch.utils.generate_methods_for_privateuse1_backend()
        _memory._add_device_type(name, stream_ids_are_handles=True)
        _memory._current_device_hook = _device.current_device
        _memory._current_stream_hook = _device.current_stream_handle
        _hide_registration_frames()
        _register_reductions()
        atexit.register(_drain_autograd_threads, name)
        _registered = name
        _sync_record_device()
        return name


def _check_existing_allocator(name: str) -> None:
    """register_device after memsnap's allocator was created: it must be
    the one register_device would have created (host-backed sim, and for
    "npu" the npu profile unless MEMSNAP_PROFILE chose), else a
    RuntimeError that names the call that created it."""
    runtime, profile = _C.runtime_name(), _C.profile()
    host_backed = runtime == "sim" and _C.sim_host_backed()
    want_profile = "npu" if name == "npu" and not os.environ.get("MEMSNAP_PROFILE") else None
    if host_backed and want_profile in (None, profile):
        return
    what = (f"the sim runtime without host backing" if runtime == "sim" and not host_backed
            else f"the {runtime!r} runtime" if not host_backed
            else f"the {profile!r} profile, not {want_profile!r}")
    by = _memory._allocator_created_by()
    raise RuntimeError(
        f"memsnap.torch.register_device({name!r}) must be called before any "
        f"memsnap.memory call that creates memsnap's allocator (this one was: "
        f"{by or 'a call before register_device'}); it already exists with "
        f"{what} (one allocator per process).  Call memsnap.torch.register_device("
        f"{name!r}) first: memsnap.memory works on the device after it"
    )


def _register_reductions() -> None:
    """Device tensors cross processes by value.

    torch.multiprocessing shares a CUDA tensor through a CUDA IPC handle
    and a CPU tensor through shared memory
    (torch/multiprocessing/reductions.py, reduce_tensor); for any other
    device it calls ``_share_fd_cpu_``, which raises -- and in a
    DataLoader worker that raise happens in the queue's feeder thread,
    where it is printed and the batch lost, so the main process waits for
    it forever.  The memsnap device's memory is the sim's, private to
    each process: a device tensor is sent as its CPU copy (itself in
    shared memory, by torch's own CPU reduction) and rebuilt on the
    receiver's memsnap device, with its requires_grad (and Parameter)
    kept.  Writes on one side are not seen on the other, unlike CUDA IPC.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch
    from torch.multiprocessing import reductions
    from torch.nn.parameter import Parameter

    base = reductions.reduce_tensor

    def reduce(tensor):
        if tensor.device.type != _registered:
            return base(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            # torch's own rule (reduce_tensor)
            raise RuntimeError(
                "Cowardly refusing to serialize non-leaf tensor which "
                "requires_grad, since autograd does not support crossing "
                "process boundaries.  If you just want to transfer the data, "
                "call detach() on the tensor before serializing (e.g., "
                "putting it on the queue).")
        return (_rebuild_device_tensor,
                (tensor.device.type, tensor.device.index,
                 tensor.detach().cpu(), tensor.requires_grad,
                 isinstance(tensor, Parameter)))

    for cls in (torch.Tensor, Parameter):
        ForkingPickler.register(cls, reduce)


def _rebuild_device_tensor(name: str, index: int | None, cpu: Any,
                           requires_grad: bool, parameter: bool) -> Any:
    """The receiving side of _register_reductions (a spawned process
    registers the device first)."""
    import torch

    if _registered is None:
        register_device(name)
    t = cpu.to(torch.device(name, index or 0))
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _hide_registration_frames() -> None:
    """Frames of torch's generated ``Tensor.<name>()`` / ``Module.<name>()``
    wrappers (torch/utils/backend_registration.py) are not recorded: the
    stack of an allocation then starts at the caller's line, as for
    ``Tensor.cuda()``, which is C."""
    from torch.utils import backend_registration

    _C.hide_frames_of(backend_registration.__file__)


def _drain_autograd_threads(name: str) -> None:
    """At exit: let torch's autograd device threads drop their last graph
    task while the interpreter still runs.

    torch (2.13) keeps a Python object (the contextvars.Context of
    ``backward()``) in each graph task; the device worker thread may drop
    the last reference just after ``backward()`` returned, and if that
    happens during interpreter finalization CPython ends the thread with
    pthread_exit, which aborts the process ("terminate called without an
    active exception", pytorch/pytorch#117762).  One tiny backward per
    device, run through the engine without that Python object, completes
    only after each worker finished its previous graph task.
    """
    try:
        lib = _shim.torch_lib()
        if not lib.msnap_torch_worker_threads():
            return
        import torch
        from torch.autograd import Variable

        for d in range(_device.device_count()):
            x = torch.zeros((), device=torch.device(name, d), requires_grad=True)
            y = x.sum()
            Variable._execution_engine.run_backward(
                (y,), (torch.ones((), device=y.device),), False, False, (), True, True
            )
    except Exception:  # at exit: never turn a clean exit into an error
        pass


# ---------------------------------------------------------------------------
# record_function ranges -> external_annotations / compile_context: the C++
# shim's at::RecordFunction callbacks (_record_callbacks), or, without the
# shim, a wrapper of the Python record_function class (_patch_record_function)
# ---------------------------------------------------------------------------

_ann = threading.local()
_ann_state = {"on": False, "global": False, "thread": None, "compile": False}
_patched_record_function = False


def _device_now() -> int:
    try:
        return _memory._current_device()
    except Exception:
        return 0


def _c_name(name: str) -> str:
    """The range's name as memsnap's C API stores it (a C string): up to
    a NUL character, which torch's record_function takes but the
    extension refuses (ValueError "embedded null character" out of the
    user's ``with``, the range already entered and never exited)."""
    return name.partition("\0")[0] if "\0" in name else name


def _on_enter(name: str) -> None:
    st = _ann_state
    if not st["on"]:
        return
    name = _c_name(name)
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
    name = _c_name(name)
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
    """Wrap torch.autograd.profiler.record_function's __enter__/__exit__
    (the fallback when the C++ shim's callbacks cannot be registered).

    Installed while history is on (memsnap.memory._record_memory_history
    loads this module when torch is imported, or once it is), removed by
    :func:`_unpatch_record_function` when history is disabled.
    """
    global _patched_record_function, _rf_originals
    if _patched_record_function:
        return
    if _memory._torch_runs_elsewhere():
        # importing torch's submodules beside that import breaks it;
        # memsnap's watch, when it chained torch's loader, patches once
        # torch has run
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


_rf_lib: Any = None  # the C++ shim, once its callbacks were registered


def _record_device_type() -> int:
    """The c10::DeviceType whose current device the C++ callbacks'
    annotations name, as memsnap.memory's current device (its hook):
    memsnap's registered device or torch_npu's npu (PrivateUse1), CUDA,
    or none (device 0)."""
    if _registered is not None or _installed == "npu":
        return _shim.DEVICE_PRIVATEUSE1
    if _installed == "cuda":
        return _shim.DEVICE_CUDA
    return _shim.DEVICE_NONE


def _sync_record_device() -> None:
    """memsnap.memory's current device now follows torch's (use_allocator,
    register_device): so do the C++ callbacks' annotations."""
    if _rf_lib is not None:
        _rf_lib.msnap_torch_record_device(_record_device_type())


def _record_callbacks(enabled: bool, compile_context: bool, global_annotations: bool,
                      thread: int) -> bool:
    """Register (or remove) the C++ shim's at::RecordFunction callbacks
    (csrc/record.cpp): record_function ranges -> external_annotations,
    "Torch-Compiled Region..." ranges -> compile context, as PyTorch's CUDA
    allocator.  False when the shim is missing or cannot load: the Python
    record_function patch records instead."""
    global _rf_lib
    lib = _rf_lib
    if not enabled:
        if lib is not None:
            err = lib.msnap_torch_record_functions(0, 0, 0, 0, _record_device_type())
            if err:
                import warnings

                warnings.warn(f"memsnap: record_function callbacks not removed: "
                              f"{_shim.text(err)}", RuntimeWarning, stacklevel=4)
        return True
    if lib is None:
        if not os.path.exists(_shim.path(_shim.TORCH_LIB)):
            return False
        try:
            lib = _shim.torch_lib()
        except Exception:  # torch or the shim cannot load: the Python patch
            return False
    err = lib.msnap_torch_record_functions(1, int(bool(compile_context)),
                                           int(bool(global_annotations)), thread,
                                           _record_device_type())
    if err:
        import warnings

        # none may stay beside the wrapper (a range recorded twice)
        lib.msnap_torch_record_functions(0, 0, 0, 0, _shim.DEVICE_NONE)
        warnings.warn(f"memsnap: record_function callbacks not registered "
                      f"({_shim.text(err)}); the Python record_function class is "
                      f"wrapped instead", RuntimeWarning, stacklevel=4)
        return False
    _rf_lib = lib
    return True


def _history_changed(enabled: bool, compile_context: bool, global_annotations: bool) -> None:
    st = _ann_state
    if not enabled:
        st.update(on=False, compile=False)
        _record_callbacks(False, False, False, 0)
        _unpatch_record_function()
        return
    if not st["on"]:
        # Installation is idempotent as in torch: the thread-local/global
        # choice holds until history is disabled.
        st["global"] = bool(global_annotations)
        # the enabling thread (torch may be imported later, in another)
        on = _memory._history_on
        st["thread"] = on[2] if on is not None else threading.get_ident()
    st["on"] = True
    st["compile"] = bool(compile_context)
    if _memory._torch_runs_elsewhere():
        # importing torch's submodules (the shim loads torch) beside that
        # import breaks it; memsnap's watch, when it chained torch's
        # loader, installs the hooks once torch has run
        return
    # Python's record_function enters an at::RecordFunction
    # (torch.ops.profiler._record_function_enter_new): with the C++
    # callbacks registered, wrapping it as well would record it twice.
    if _record_callbacks(True, compile_context, st["global"], st["thread"]):
        return
    _patch_record_function()


_memory._history_listeners.append(_history_changed)
