"""memsnap.predict._tracker -- every device storage becomes an allocation.

A ``TorchDispatchMode`` stacked above the ``FakeTensorMode`` of a
prediction.  Each operator runs on fake tensors (shapes, dtypes, devices,
aliasing and autograd as in eager mode; no data, no device).  After it
returns, every output tensor on the fake device is looked at:

- a storage never seen before is a new allocation of ``nbytes`` on the
  tensor's device and the current stream, requested from every live
  configuration's allocator (``Session.allocate``); a weak reference on the
  storage's Python object (torch keeps one object per storage alive as
  long as the storage lives) frees it when the storage dies, exactly when
  the caching allocator would see the free in eager mode;
- a known storage whose size changed (``resize_``, ``out=``) is
  reallocated (new block, then the old one freed, as ``resize_bytes``).

``torch.UntypedStorage.resize_`` is not an operator (FSDP frees and
re-materialises parameters with it), so it is wrapped while the mode is
active, as torch's MemTracker does.

DTensor (FSDP2, tensor parallel) learns each operator's output metadata
by running it on tensors of the global shape
(``torch/distributed/tensor/_sharding_prop.py``:
``ShardingPropagator._propagate_tensor_meta_non_cached``, under
``detect_fake_mode() or FakeTensorMode()``).  In eager mode that is a
FakeTensorMode of its own and allocates nothing; under a prediction it
finds the prediction's mode, and its tensors would come here as device
storages (384 MiB live at the peak of a 4-block FSDP2 model, whatever
the number of ranks).  While the mode is active that method is wrapped,
and what operators make inside it is not tracked.  (torch's MemTracker
under FakeTensorMode counts them.)

Host tensors stay real when they are small: an operator with no fake
input whose tensors are all on the CPU and at most ``real_cpu_bytes``
(1 MiB) runs for real, so index arithmetic, device meshes, samplers and
scalars in the script compute true values; larger host tensors (a model
built on the CPU before ``.to(device)``) are fake, so host memory does
not grow with the model.  Values of fake tensors are not computed:
``.item()`` and ``bool(t)`` read 0 / False (unless FakeTensorMode knows
the constant), and the few operators whose output size depends on values
(``nonzero``, ``masked_select``, indexing with a bool mask) get their
largest possible size, so memory is an upper bound there; so is
``nn.TransformerEncoder``'s inference with a padding mask, predicted on
the padded path (``_nested_tensor_from_mask_left_aligned`` answers False:
no nested tensors).  "cuda" device arguments become the fake device (see
``_device.py``).  ``Tensor.record_stream`` reaches the allocators as
``record_stream``.  Pinned host memory needs the device runtime (torch's
pinned allocator asks the device's hooks), so ``pin_memory()``
(``aten._pin_memory``) is a plain host copy and a factory's
``pin_memory=True`` (``torch.empty(..., pin_memory=True)``, the buffer
DDP's reducer pins under ``find_unused_parameters=True``) is dropped; the
storages so made are remembered, and ``is_pinned()`` answers True for
them (and their views) as on a device (the reducer asserts it), False for
every other tensor.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    is_traceable_wrapper_subclass_type,
)

from . import _dist

aten = torch.ops.aten


def _zero_of(dtype: torch.dtype):
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    if dtype.is_floating_point:
        return 0.0
    return 0


class _Storage:
    """A live tracked storage: its size, device and one address per
    configuration (0 where the configuration holds nothing)."""

    __slots__ = ("nbytes", "device", "ptrs", "ref")

    def __init__(self, nbytes: int, device: int, ptrs: list, ref):
        self.nbytes, self.device, self.ptrs, self.ref = nbytes, device, ptrs, ref


class Tracker(TorchDispatchMode):
    """The dispatch mode of one prediction (see the module docstring)."""

    def __init__(self, session, device_type: str, real_cpu_bytes: int = 1 << 20):
        super().__init__()
        self.session = session
        self.real_cpu_bytes = real_cpu_bytes
        self.device_type = device_type
        self.live: dict[int, _Storage] = {}
        self._orig_resize = None
        # DTensor's metadata propagation, wrapped (class, original method)
        # once the module is loaded; operators run inside it (per thread:
        # the depth) are not tracked.
        self._orig_propagate = None
        self._meta = threading.local()
        self._special = {
            aten._local_scalar_dense.default: self._scalar,
            aten.record_stream.default: self._record_stream,
            aten.is_pinned.default: self._is_pinned,
            aten._nested_tensor_from_mask_left_aligned.default: self._not_left_aligned,
        }
        # Host storages the script asked to pin (by _cdata): is_pinned()
        # answers True for them, as on a device.
        self.pinned: dict[int, weakref.ref] = {}

    # -- storage bookkeeping ---------------------------------------------
    def _track(self, t) -> None:
        dev = t.device
        if dev.type != self.device_type:
            return
        st = t.untyped_storage()
        key = st._cdata
        e = self.live.get(key)
        if e is None:
            self._new(st, key, dev.index)
        else:
            n = st.nbytes()
            if n != e.nbytes:
                self._resize(e, n)

    def _new(self, st, key: int, device: int) -> None:
        n = st.nbytes()
        # an empty tensor on a device past the prediction's is refused
        # too (Session.allocate checks the others), as on the device
        self.session.device_state.check(device)
        ptrs = self.session.allocate(device, n) if n else None
        ref = weakref.ref(st, functools.partial(self._died, key))
        self.live[key] = _Storage(n, device, ptrs, ref)

    def _died(self, key: int, _ref) -> None:
        e = self.live.pop(key, None)
        if e is not None and e.ptrs:
            self.session.free(e.ptrs)

    def _resize(self, e: _Storage, n: int) -> None:
        # resize_bytes: a new block first, then the old one is freed.
        new = self.session.allocate(e.device, n) if n else None
        old = e.ptrs
        e.ptrs, e.nbytes = new, n
        if old:
            self.session.free(old)

    def _after_storage_resize(self, st) -> None:
        e = self.live.get(st._cdata)
        if e is not None and st.nbytes() != e.nbytes:
            self._resize(e, st.nbytes())

    def release_all(self) -> None:
        """Forget every tracked storage (the prediction is over)."""
        self.live.clear()
        self.pinned.clear()

    # -- operators -------------------------------------------------------
    def _scalar(self, func, args, kwargs):
        if not isinstance(args[0], FakeTensor):  # a real host tensor
            with _disable_current_modes():
                return func(*args, **kwargs)
        try:  # FakeTensorMode knows constants (torch.tensor(0.0), their results)
            return func(*args, **kwargs)
        except DataDependentOutputException:
            self.session.unknown_scalars += 1
            return _zero_of(args[0].dtype)

    def _not_left_aligned(self, func, args, kwargs):
        # nn.TransformerEncoder's inference fast path asks whether the
        # padding mask is left-aligned (its values) before turning the
        # batch into a nested tensor.  Fake tensors have no values and
        # nested tensors no device model: the answer is no, so the padded
        # path is predicted (memory of the whole padded batch: an upper
        # bound of the nested one).
        return False

    def _is_pinned(self, func, args, kwargs):
        t = args[0]
        if t.device.type != "cpu":
            return False
        return t.untyped_storage()._cdata in self.pinned

    def _mark_pinned(self, t) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            st = t.untyped_storage()
            key = st._cdata
            self.pinned[key] = weakref.ref(st, functools.partial(self._unpinned, key))

    def _unpinned(self, key: int, ref) -> None:
        if self.pinned.get(key) is ref:  # not a newer storage at the same address
            del self.pinned[key]

    def _record_stream(self, func, args, kwargs):
        t, s = args[0], args[1]
        if t.device.type == self.device_type:
            e = self.live.get(t.untyped_storage()._cdata)
            if e is not None and e.ptrs:
                self.session.record_stream(e.ptrs, int(getattr(s, "stream_id", 0)))
        return None

    def _map_cuda(self, kwargs: dict) -> dict:
        dev = kwargs.get("device")
        if dev is not None and dev.type == "cuda":
            kwargs = dict(kwargs)
            index = dev.index if dev.index is not None else self.session.device_state.device
            kwargs["device"] = torch.device(self.device_type, index)
            self.session.saw_cuda = True
        return kwargs

    def _upper_bound(self, func, args, kwargs):
        """Outputs of data-dependent size, at their largest (None for an
        operator not handled here)."""
        x = args[0]
        dev = x.device
        if func in (aten.nonzero.default,):
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=dev)
        if func in (aten.masked_select.default,):
            n = torch.broadcast_shapes(x.shape, args[1].shape).numel()
            return torch.empty((n,), dtype=x.dtype, device=dev)
        if func is aten.index.Tensor:
            # x[mask]: every element of a bool mask selected.
            indices = []
            for i in args[1]:
                if i is not None and i.dtype in (torch.bool, torch.uint8):
                    full = torch.empty((i.numel(),), dtype=torch.long, device=i.device)
                    indices += [full] * i.dim()
                else:
                    indices.append(i)
            return func(x, indices)
        return None

    def _host_bytes(self, args, kwargs) -> int | None:
        """Bytes of the tensor arguments when all are real host tensors;
        None when one is fake or on a device; 0 when there is none."""
        n = 0
        for a in (*args, *kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, torch.Tensor):
                    if isinstance(t, FakeTensor) or t.device.type != "cpu":
                        return None
                    n += t.untyped_storage().nbytes() or 1
        return n

    def _host_side(self, func, args, kwargs):
        """``(True, None)`` when the operator works on real host tensors
        only (no fake input, CPU output) of at most ``real_cpu_bytes``: it
        then runs for real.  Otherwise ``(False, out)``, ``out`` the fake
        result when a factory had to be run to learn its size."""
        dev = kwargs.get("device")
        if dev is not None and dev.type != "cpu":
            return False, None
        n = self._host_bytes(args, kwargs)
        if n is None:
            return False, None
        if n:
            return n <= self.real_cpu_bytes, None
        # A factory: its size from the fake run (kept if it is too large).
        probe = func(*args, **kwargs)
        small = (isinstance(probe, torch.Tensor) and probe.device.type == "cpu"
                 and probe.untyped_storage().nbytes() <= self.real_cpu_bytes)
        return small, (None if small else probe)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Tensor subclasses that wrap tensors (DTensor of FSDP2 / tensor
        # parallel, ...) desugar into operators on their local tensors
        # first; those come back here (as in torch's MemTracker).
        for t in types:
            if t is not FakeTensor and is_traceable_wrapper_subclass_type(t):
                if self._orig_propagate is None:
                    self._wrap_propagation()
                return NotImplemented
        if self.session.stop_pending is not None:
            self.session.check_stop()
        kwargs = kwargs or {}
        special = self._special.get(func)
        if special is not None:
            return special(func, args, kwargs)
        # Pinned host memory needs the device runtime (torch's pinned
        # allocator asks the device's hooks): plain host memory instead,
        # remembered as pinned so that is_pinned() answers True for it.
        if func is aten._pin_memory.default:  # Tensor.pin_memory(): a copy
            if args[0].device.type != "cpu":  # as torch's _pin_memory
                raise RuntimeError(f"cannot pin '{args[0].device}' memory: only dense "
                                   "CPU tensors can be pinned")
            out = self._run(aten.clone.default, args[:1], {})
            self._mark_pinned(out)
            return out
        if kwargs.get("pin_memory"):
            # A factory (torch.empty(..., pin_memory=True), the buffer of
            # DDP's reducer under find_unused_parameters=True).
            kwargs = dict(kwargs)
            kwargs["pin_memory"] = False
            out = self._run(func, args, kwargs)
            self._mark_pinned(out)
            return out
        return self._run(func, args, kwargs)

    def _run(self, func, args, kwargs):
        """The operator on fake (or small real host) tensors, its device
        outputs tracked."""
        if "device" in kwargs:
            kwargs = self._map_cuda(kwargs)
        out = None
        if self.real_cpu_bytes:
            real, out = self._host_side(func, args, kwargs)
            if real:
                with _disable_current_modes():
                    return func(*args, **kwargs)
        if out is None:
            try:
                out = func(*args, **kwargs)
            except DynamicOutputShapeException:
                out = self._upper_bound(func, args, kwargs)
                if out is None:
                    raise
        if func.namespace == "c10d":  # collectives of a fake process group
            out = _dist.complete_work(func, out)
        if getattr(self._meta, "depth", 0):  # DTensor's metadata, not memory
            return out
        if isinstance(out, torch.Tensor):
            self._track(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self._track(o)
                elif isinstance(o, (tuple, list)):
                    for oo in o:
                        if isinstance(oo, torch.Tensor):
                            self._track(oo)
        return out

    # -- context ---------------------------------------------------------
    def _wrap_propagation(self) -> None:
        """Wrap DTensor's metadata propagation (see the module's doc) once
        its module is loaded: at entry, or when a DTensor first reaches
        the mode (before its propagation runs)."""
        mod = sys.modules.get("torch.distributed.tensor._sharding_prop")
        cls = getattr(mod, "ShardingPropagator", None)
        orig = getattr(cls, "_propagate_tensor_meta_non_cached", None)
        if orig is None:
            return
        meta = self._meta

        @functools.wraps(orig)
        def propagate(prop, *args, **kwargs):
            meta.depth = getattr(meta, "depth", 0) + 1
            try:
                return orig(prop, *args, **kwargs)
            finally:
                meta.depth -= 1

        cls._propagate_tensor_meta_non_cached = propagate
        self._orig_propagate = (cls, orig)

    def __enter__(self):
        self._wrap_propagation()
        orig = self._orig_resize = torch.UntypedStorage.resize_
        tracker = self

        @functools.wraps(orig)
        def resize_(st, size):
            r = orig(st, size)
            tracker._after_storage_resize(st)
            return r

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize
            self._orig_resize = None
        if self._orig_propagate is not None:
            cls, orig = self._orig_propagate
            cls._propagate_tensor_meta_non_cached = orig
            self._orig_propagate = None
        return super().__exit__(*exc)
