"""memsnap.predict._device -- the "npu" device of a prediction, and "cuda".

A CPU-only torch has no "npu" device type and no usable "cuda" one (its
autograd engine needs a device guard that only a CUDA build has).  A
prediction therefore runs every device tensor as a fake tensor of torch's
PrivateUse1 backend, renamed "npu":

- :func:`register_device` names PrivateUse1 through
  ``memsnap.torch.claim_privateuse1`` (memsnap's one naming function: it
  refuses a backend taken by torch_npu or by memsnap's real device),
  registers :data:`npu` as ``torch.npu`` and installs a Python device
  guard and hooks, as torch's ``_setup_privateuseone_for_python_backend``
  does.
- Scripts written for CUDA run unchanged: while a prediction is active,
  ``torch.cuda``'s device functions are replaced by this module's (and
  restored afterwards), ``torch.autocast("cuda")`` becomes the "npu"
  autocast, and the tracker (``_tracker.py``) maps every "cuda" device
  argument of an operator to the same "npu" index.  Tensors of such a script
  report ``device(type='npu')``.

The functions of the device module mirror ``torch.cuda`` /
``torch_npu.npu`` (device selection, streams, events, properties) and route
the memory functions (``memory_allocated``, ``memory_stats``,
``memory_summary``, ``_dump_snapshot``...) to the prediction's allocator,
so a script that prints ``torch.npu.max_memory_allocated()`` prints the
prediction.  Streams are integer handles given to the allocator as
``stream``; events complete at once (nothing runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import types
from typing import Any

import torch

DEVICE_NAME = "npu"

# The prediction in progress (set by _session.Session); the device module
# answers "no device" without one.
_ACTIVE: Any = None
_registered: str | None = None
_lock = threading.Lock()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks: the backend is built; available while predicting."""

    def is_available(self) -> bool:
        return _ACTIVE is not None

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


# PyErr_Occurred through ctypes.pythonapi: ctypes raises the pending Python
# error into the caller after any pythonapi call (_ctypes_callproc), so a
# call takes the pending error out of the interpreter (see _Guard).
_err_occurred = ctypes.pythonapi.PyErr_Occurred
_err_occurred.argtypes = []
_err_occurred.restype = ctypes.c_void_p

# Python errors taken out of the interpreter by _Guard.type_ (innermost
# last); take_pending_error() hands them to the code that reports them.
_pending_errors: list = []
_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1


class _Guard(torch._C._acc.DeviceGuard):
    """The device guard of the fake device (torch's ``PythonDeviceGuard``,
    ``torch/csrc/acc/Module.cpp``, calls ``type_`` for every device and
    stream it reports).

    ``type_`` can be called while a Python error is pending: a backward
    hook (``Tensor.register_hook``, a module's full backward hook, a node
    hook, a saved-tensor hook) or a dispatch mode raised inside the
    autograd engine, torch turned the error into a C++ ``python_error``
    without taking it out of the interpreter, and the engine's
    ``OptionalStreamGuard`` (``Engine::evaluate_function``) restores the
    stream as the exception unwinds: ``exchangeStream`` (``noexcept``)
    asks ``type_``.  Python code cannot return a value while an error is
    pending (the call fails with ``SystemError``), and an exception out of
    a ``noexcept`` function is ``std::terminate``: the process aborted.
    So ``type_`` first takes any pending error out of the interpreter and
    keeps it in ``_pending_errors``; the call then returns normally, the
    engine finishes unwinding, and ``run_backward`` returns NULL without
    an error (``SystemError``), which the prediction replaces by the kept
    error (``take_pending_error``: the user's own exception, with its
    traceback)."""

    def type_(self):
        try:
            _err_occurred()
        except BaseException as e:  # the pending error (see the docstring)
            if e.__traceback__ is not None:  # from the raising frame on, not this one
                e.__traceback__ = e.__traceback__.tb_next
            _pending_errors.append(e)
        return _PRIVATEUSE1


def take_pending_error() -> BaseException | None:
    """The innermost Python error taken by the device guard (and forget
    them all), or None."""
    if not _pending_errors:
        return None
    e = _pending_errors[-1]
    _pending_errors.clear()
    return e


def register_device(name: str = DEVICE_NAME) -> types.ModuleType:
    """Name torch's PrivateUse1 backend ``name`` and install :data:`npu`.

    Idempotent within a process.  Returns the device module
    (``torch.<name>``).

    Raises:
        RuntimeError: PrivateUse1 is already named (torch_npu is loaded,
            or memsnap.torch.register_device ran: a prediction needs the
            backend for its fake device, so run it in its own process), or
            ``torch.<name>`` already exists.
    """
    global _registered
    with _lock:
        if _registered == name:
            return npu
        if _registered is not None:
            raise RuntimeError(f"memsnap.predict: the device is already named {_registered!r}")
        from memsnap.torch import claim_privateuse1

        npu.__name__ = f"torch.{name}"
        # The order is torch's (_setup_privateuseone_for_python_backend):
        # rename, generate the Tensor methods, the module, hooks, guard.
        claim_privateuse1(name, owner="memsnap.predict")
        torch.utils.generate_methods_for_privateuse1_backend()
        claim_privateuse1(name, npu, owner="memsnap.predict")
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_Guard())
        _registered = name
        return npu


# ---------------------------------------------------------------------------
# Device state of a prediction (current device, streams).
# ---------------------------------------------------------------------------


class DeviceState:
    """Current device and per-device current stream of one prediction."""

    def __init__(self, devices: int, device: int = 0):
        self.devices = devices
        self.device = device
        self._stream: dict[int, int] = {}
        self._next_stream = 1

    def check(self, index: int) -> int:
        if not 0 <= index < self.devices:
            raise RuntimeError(f"invalid device ordinal {index} (the prediction has "
                               f"{self.devices} device{'' if self.devices == 1 else 's'}; see --devices)")
        return index

    def stream_of(self, device: int) -> int:
        return self._stream.get(device, 0)

    def new_stream(self) -> int:
        self._next_stream += 1
        return self._next_stream - 1


def _state() -> DeviceState:
    s = _ACTIVE
    if s is None:
        raise RuntimeError("memsnap.predict: no prediction is running (the simulated "
                           "device exists only inside memsnap.predict)")
    return s.device_state


def _index(device: Any = None) -> int:
    if device is None:
        return _state().device
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return _state().device if device.index is None else device.index
    index = getattr(device, "index", None)
    return _state().device if index is None else int(index)


class Stream(torch.Stream):
    """A stream of the simulated device (a ``torch.Stream`` whose
    ``stream_id`` is the handle the allocator gets as ``stream``).

    Mirrors ``torch.cuda.Stream`` / ``torch_npu.npu.Stream`` (nothing runs,
    so waits and synchronizations return at once).
    """

    def __new__(cls, device: Any = None, priority: int = 0, _handle: int | None = None, **kw):
        st = _state()
        index = _index(device)
        handle = st.new_stream() if _handle is None else _handle
        return super().__new__(cls, stream_id=handle, device_index=index,
                               device_type=int(torch._C._autograd.DeviceType.PrivateUse1))

    def __init__(self, *args, **kwargs):
        pass

    @property
    def npu_stream(self) -> int:
        return self.stream_id

    cuda_stream = npu_stream

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        self._ctx = stream(self)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class Event:
    """``torch.cuda.Event``: complete as soon as recorded (nothing runs)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kw):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        return 0.0


def current_stream(device: Any = None) -> Stream:
    i = _index(device)
    return Stream(i, _handle=_state().stream_of(i))


def default_stream(device: Any = None) -> Stream:
    return Stream(_index(device), _handle=0)


def set_stream(s: Stream) -> None:
    if s is not None:
        _state()._stream[s.device_index] = s.stream_id


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make ``s`` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    st = _state()
    prev = st.stream_of(s.device_index)
    st._stream[s.device_index] = s.stream_id
    try:
        yield s
    finally:
        st._stream[s.device_index] = prev


class device:  # noqa: N801 (torch's name)
    """``torch.cuda.device(i)``: the current device inside the block."""

    def __init__(self, dev):
        self.idx = -1 if dev is None else _index(dev)

    def __enter__(self):
        st = _state()
        self.prev = st.device
        if self.idx >= 0:
            st.device = st.check(self.idx)

    def __exit__(self, *exc):
        _state().device = self.prev
        return False


def device_of(obj):
    return device(obj.get_device() if obj.device.type != "cpu" else -1)


def is_available() -> bool:
    return _ACTIVE is not None


def is_initialized() -> bool:
    return _ACTIVE is not None


def init() -> None:
    _state()


def _lazy_init() -> None:
    pass


def device_count() -> int:
    return _state().devices if _ACTIVE is not None else 0


def current_device() -> int:
    return _state().device


def set_device(dev) -> None:
    st = _state()
    i = _index(dev)
    if i >= 0:
        st.device = st.check(i)


def synchronize(device: Any = None) -> None:
    pass


def _device_name(asked: str) -> str:
    """The device's name: the run's profile once the code chose it (its
    first device allocation), before that the profile the code gets
    through the module it asks, torch.<asked>."""
    s = _ACTIVE
    profile = None
    if s is not None:
        profile = s.targets[0].config.profile if s.targets else s.configs[0].profile
    return f"memsnap sim device ({profile or asked})"


def get_device_name(device: Any = None) -> str:
    return _device_name(DEVICE_NAME)


def _cuda_get_device_name(device: Any = None) -> str:
    """``torch.cuda.get_device_name`` (see :func:`cuda_as_device`)."""
    return _device_name("cuda")


def get_device_capability(device: Any = None) -> tuple[int, int]:
    # Ampere-class answers keep bf16/TF32 code paths the same as on a
    # current device.
    return (8, 0)


def get_device_properties(device: Any = None, _asked: str = DEVICE_NAME):
    i = _index(device)
    total = _ACTIVE.memory if _ACTIVE is not None else 0
    return types.SimpleNamespace(
        name=_device_name(_asked), total_memory=total, major=8, minor=0,
        multi_processor_count=108, is_integrated=False, is_multi_gpu_board=False,
        L2_cache_size=40 << 20, warp_size=32, max_threads_per_multi_processor=2048,
        gcnArchName="", uuid=f"memsnap-sim-{i}", index=i)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed) -> None:
    pass


manual_seed_all = manual_seed


def seed() -> None:
    pass


seed_all = seed


def initial_seed() -> int:
    return 0


def get_rng_state(device: Any = None):
    return torch.zeros(16, dtype=torch.uint8)


def set_rng_state(new_state, device: Any = None) -> None:
    pass


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    pass


def ipc_collect() -> None:
    pass


# ---------------------------------------------------------------------------
# Memory functions: the prediction's own allocator (its first configuration).
# ---------------------------------------------------------------------------


def _primary():
    s = _ACTIVE
    return None if s is None else s.primary()


def _stat(device, array: str, field: str) -> int:
    a = _primary()
    if a is None:
        return 0
    return getattr(getattr(a.stats(_index(device)), array)[0], field)


def memory_allocated(device: Any = None) -> int:
    return _stat(device, "allocated_bytes", "current")


def max_memory_allocated(device: Any = None) -> int:
    return _stat(device, "allocated_bytes", "peak")


def memory_reserved(device: Any = None) -> int:
    return _stat(device, "reserved_bytes", "current")


def max_memory_reserved(device: Any = None) -> int:
    return _stat(device, "reserved_bytes", "peak")


memory_cached = memory_reserved
max_memory_cached = max_memory_reserved


def memory_stats(device: Any = None) -> dict:
    """The flat statistics dict of ``torch.cuda.memory_stats`` (sorted keys
    such as ``"allocated_bytes.all.current"``)."""
    from . import _capi

    a = _primary()
    if a is None:
        return {}
    s = a.stats(_index(device))
    out = {}
    for name in _capi.STAT_ARRAYS:
        for t, typ in enumerate(_capi.STAT_TYPES):
            st = getattr(s, name)[t]
            for f in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{typ}.{f}"] = getattr(st, f)
    for name in _capi.STAT_SINGLES:
        st = getattr(s, name)
        for f in ("current", "peak", "allocated", "freed"):
            out[f"{name}.{f}"] = getattr(st, f)
    for name in _capi.COUNTERS:
        out[name] = getattr(s, name)
    return dict(sorted(out.items()))


def reset_peak_memory_stats(device: Any = None) -> None:
    a = _primary()
    if a is not None:
        a.reset_peak_stats(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats
reset_max_memory_cached = reset_peak_memory_stats


def reset_accumulated_memory_stats(device: Any = None) -> None:
    pass


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    a = _primary()
    return "" if a is None else a.memory_summary(_index(device), abbreviated)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    a = _primary()
    if a is None:
        return (_ACTIVE.memory, _ACTIVE.memory) if _ACTIVE else (0, 0)
    return a.mem_get_info(_index(device))


def empty_cache() -> None:
    if _ACTIVE is not None:
        _ACTIVE.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    if _ACTIVE is not None:
        _ACTIVE.set_memory_fraction(_index(device), float(fraction))


def _record_memory_history(*args, **kwargs) -> None:
    """History is always on during a prediction: a no-op."""


_record_memory_history_impl = _record_memory_history


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces=False) -> None:
    """The prediction's snapshot so far, written to ``filename``."""
    if _ACTIVE is not None:
        _ACTIVE.write_snapshot(str(filename))


def _snapshot(device: Any = None, augment_with_fx_traces=False) -> dict:
    if _ACTIVE is None:
        return {"segments": [], "device_traces": []}
    return _ACTIVE.snapshot()


def memory_snapshot(mempool_id=None, include_traces=True) -> list:
    return _snapshot()["segments"]


_MEMORY_FUNCS = (
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "memory_stats", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats",
    "memory_summary", "mem_get_info", "empty_cache", "set_per_process_memory_fraction",
    "_record_memory_history", "_record_memory_history_impl", "_dump_snapshot", "_snapshot",
    "memory_snapshot",
)
_DEVICE_FUNCS = (
    "is_available", "is_initialized", "init", "_lazy_init", "device_count", "current_device",
    "set_device", "synchronize", "get_device_name", "get_device_capability",
    "get_device_properties", "is_bf16_supported", "_is_in_bad_fork", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "ipc_collect", "Stream", "Event",
    "current_stream", "default_stream", "set_stream", "stream", "device", "device_of",
)

# ---------------------------------------------------------------------------
# torch.npu: the module registered by register_device().
# ---------------------------------------------------------------------------

npu = types.ModuleType("torch.npu", "memsnap.predict's simulated device (fake tensors).")
memory = types.ModuleType("torch.npu.memory", "memory functions of the simulated device")
for _n in _DEVICE_FUNCS + _MEMORY_FUNCS + ("get_amp_supported_dtype",):
    setattr(npu, _n, globals()[_n])
for _n in _MEMORY_FUNCS:
    setattr(memory, _n, globals()[_n])
npu.memory = memory


def _amp_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16,
                  cache_enabled: bool = True):
    """``torch.cuda.amp.autocast`` / ``torch_npu.npu.amp.autocast``."""
    return torch.autocast(_registered or DEVICE_NAME, dtype=dtype, enabled=enabled,
                          cache_enabled=cache_enabled)


def _amp_grad_scaler(*args, **kwargs):
    return torch.amp.GradScaler(_registered or DEVICE_NAME, *args, **kwargs)


npu.amp = types.SimpleNamespace(autocast=_amp_autocast, GradScaler=_amp_grad_scaler)

# torch_npu, for scripts that `import torch_npu` (only while predicting, and
# only when the real one is not loaded).
torch_npu_shim = types.ModuleType("torch_npu", "memsnap.predict stand-in for torch_npu")
torch_npu_shim.npu = npu
torch_npu_shim.__path__ = []  # a package, so `import torch_npu.npu` resolves


# ---------------------------------------------------------------------------
# "cuda" scripts
# ---------------------------------------------------------------------------


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _numpy_zeros(t: Any, force: bool = False) -> Any:
    """What ``t.numpy(force=force)`` gives for a fake tensor ``t``: an
    array of zeros of its shape and dtype, after the checks of torch's
    tensor_to_numpy (torch/csrc/utils/tensor_numpy.cpp) with their
    messages: a device tensor and one that requires grad (unless force),
    then no numpy or a dtype numpy lacks -- those two from torch itself,
    through a real empty tensor of the dtype."""
    if not force:
        if t.device.type != "cpu":
            raise TypeError(f"can't convert {t.device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        if torch.is_grad_enabled() and t.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction():
        probe = torch.empty(0, dtype=t.dtype).numpy()
    import numpy

    return numpy.zeros(tuple(t.shape), dtype=probe.dtype)


class DeviceArgs(torch.overrides.TorchFunctionMode):
    """Device arguments at torch's Python API, before C++ sees them.

    "cuda[:i]" becomes the fake device "npu[:i]" (C++ would look for a
    CUDA device guard, which a CPU-only torch lacks), and a device without
    an index gets the prediction's current device (the device guard of a
    Python backend always answers index 0): ``device=`` keyword arguments
    of every function, the device of ``Tensor.to``, and ``Tensor.cuda()``.

    Also the place where ``F.scaled_dot_product_attention`` on the fake
    device becomes the device's fused kernel (``_attention.py``), and
    where ``F.linear`` adds its bias in place as on the device
    (``_linear_bias_in_place``).
    """

    def __init__(self, session):
        super().__init__()
        self.session = session
        self.name = _registered or DEVICE_NAME
        T = torch.Tensor
        self._to, self._cuda, self._numpy = T.to, T.cuda, T.numpy
        self._sdpa = torch._C._nn.scaled_dot_product_attention
        self._linear = torch._C._nn.linear

    def _map(self, d):
        if isinstance(d, str):
            if not d.startswith(("cuda", self.name)):
                return d
            d = torch.device(d)
        elif isinstance(d, int) and not isinstance(d, bool):
            return torch.device(self.name, d)
        elif not isinstance(d, torch.device):
            return d
        if d.type == "cuda":
            self.session.saw_cuda = True
        elif d.type != self.name:
            return d
        index = self.session.device_state.device if d.index is None else d.index
        return torch.device(self.name, index)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is self._numpy and args and _is_fake(args[0]):
            # torch refuses .numpy() of a tensor subclass; a fake tensor's
            # values are unknown: zeros, as .item() and .tolist() read 0.
            # One read however many elements (values_read_as_zero counts
            # reads: _session._tolist_reads_once); an empty array read none.
            z = _numpy_zeros(args[0], bool((kwargs or {}).get("force", False)))
            if z.size:
                self.session.unknown_scalars += 1
            return z
        r = self.kernel(func, args, kwargs or {})
        if r is not None:
            return r
        if kwargs:
            d = kwargs.get("device")
            if d is not None:
                kwargs = dict(kwargs)
                kwargs["device"] = self._map(d)
        else:
            kwargs = {}
        if func is self._to and len(args) > 1 and isinstance(args[1], (str, torch.device, int)):
            args = (args[0], self._map(args[1]), *args[2:])
        elif func is self._cuda:
            dev = args[1] if len(args) > 1 else kwargs.pop("device", None)
            self.session.saw_cuda = True
            index = self.session.device_state.device if dev is None else (
                dev if isinstance(dev, int) else torch.device(dev).index)
            kwargs.pop("device", None)
            return self._to(args[0], torch.device(self.name, index), **kwargs)
        if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            # an operator called by name (torch.ops.aten.X, the prediction's
            # own kernels): its C function, what __call__ would call, so
            # that no torch/_ops.py frame enters the recorded stacks
            func = func._op
        return func(*args, **kwargs)


    def kernel(self, func, args, kwargs):
        """The device's own branch of ``func`` (SDPA's fused kernel, linear's
        in-place bias), or None to leave the call to torch."""
        if func is self._sdpa and self.session.attention == "fused":
            q = args[0] if args else kwargs.get("query")
            if isinstance(q, torch.Tensor) and q.device.type == self.name:
                from . import _attention

                return _attention.fused(self.session.kernel_profile(), args, kwargs)
        if func is self._linear:
            return self._linear_bias_in_place(args, kwargs)
        return None

    def _linear_bias_in_place(self, args, kwargs):
        """``F.linear`` with a bias on an input that takes at::linear's
        unfused branch (aten/src/ATen/native/Linear.cpp, ``linear``:
        ``at::matmul`` then the bias).  torch 2.13 fuses (``addmm``) a 2-D
        input, and any other input that is contiguous (or made so by
        TORCH_LINEAR_FLATTEN_3D=1) when the bias is "likely fusable": 1-D
        once squeezed, and contiguous.  Otherwise linear adds the bias in
        place (``output.add_(bias)``) unless the bias is
        "tensor-subclass-like", which every fake tensor is: under
        FakeTensorMode it takes ``at::add``, an output-sized block the
        device never allocates.  The device's branch, the same two
        operators (and the same autograd graph: linear is composite).
        None: leave the call to torch (the fused branches as on the device;
        under autocast linear's own casts, cached for the weight, differ
        from matmul's; under forward AD the device may take the same
        branch)."""
        names = ("input", "weight", "bias")
        a = list(args[:3]) + [kwargs.get(n) for n in names[len(args[:3]):]]
        x, w, b = a
        if not all(isinstance(t, torch.Tensor) for t in (x, w, b)):
            return None
        if x.device.type != self.name or len(args) + len(kwargs) != 3:
            return None
        fusable = (b.dim() == 1 or b.squeeze().dim() == 1) and b.is_contiguous()
        if x.dim() == 2 or (fusable and (
                x.is_contiguous() or os.environ.get("TORCH_LINEAR_FLATTEN_3D") == "1")):
            return None
        if (torch.is_autocast_enabled(self.name)
                or getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0):
            return None
        out = torch.matmul(x, w.t())
        out.add_(b)
        return out


@contextlib.contextmanager
def functional_kernels(mode: DeviceArgs):
    """``torch.nn.functional``'s own Python calls its
    ``scaled_dot_product_attention`` and ``linear`` by their global names
    there (``multi_head_attention_forward``, which ``nn.MultiheadAttention``
    and so ``nn.Transformer*`` run, and its in-projection).  A mode is off
    inside its own ``__torch_function__``, and ``DeviceArgs`` takes the
    call at ``multi_head_attention_forward``, so those inner calls never
    reached it: the attention took torch's math path whatever
    ``attention="fused"`` said.  While inside, the two names are wrappers
    that give the call to ``mode.kernel`` first (the same choice
    ``DeviceArgs`` makes for a direct call), then to torch."""
    import torch.nn.functional as F

    saved = []

    def wrap(name):
        orig = getattr(F, name)
        func = getattr(mode, "_sdpa" if name == "scaled_dot_product_attention" else "_linear")

        @functools.wraps(orig)
        def call(*args, **kwargs):
            r = mode.kernel(func, args, kwargs)
            return orig(*args, **kwargs) if r is None else r

        saved.append((name, orig))
        setattr(F, name, call)

    try:
        wrap("scaled_dot_product_attention")
        wrap("linear")
        yield
    finally:
        for name, orig in reversed(saved):
            setattr(F, name, orig)


@contextlib.contextmanager
def cuda_as_device():
    """While inside: ``torch.cuda``'s device and memory functions are this
    module's, and ``torch.autocast("cuda", ...)`` is the fake device's
    autocast (dtype default kept: float16).  Everything is restored after."""
    saved: list = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    cuda = torch.cuda
    try:
        for n in _DEVICE_FUNCS + _MEMORY_FUNCS:
            patch(cuda, n, globals()[n])
        # the name says the cuda profile while the code has not chosen one
        patch(cuda, "get_device_name", _cuda_get_device_name)
        patch(cuda, "get_device_properties",
              lambda device=None: get_device_properties(device, "cuda"))
        cmem = getattr(cuda, "memory", None)
        if cmem is not None:
            for n in _MEMORY_FUNCS:
                patch(cmem, n, globals()[n])
        ac = torch.amp.autocast_mode.autocast
        orig_init = ac.__init__

        def __init__(self, device_type, dtype=None, *args, **kwargs):
            if device_type == "cuda":
                if dtype is None:
                    dtype = torch.get_autocast_dtype("cuda")
                device_type = _registered or DEVICE_NAME
            orig_init(self, device_type, dtype, *args, **kwargs)

        patch(ac, "__init__", __init__)
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


_MISSING = object()
