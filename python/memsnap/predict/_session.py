"""memsnap.predict._session -- one prediction: configurations, allocators,
fake tensors, hooks, and the results.

A :class:`Session` owns one private allocator per configuration
(:class:`Config`: a profile and an alloc-conf; the first is the run's own,
the others are what-ifs), all on simulated devices of the same size.
Every storage allocation and free of the fake-tensor run goes to each
configuration that has not run out of memory yet, in the same order, so
one run of the script answers every configuration.  Only the first
configuration records history (Python frames, external annotations) and
writes the snapshot.

Out of memory: the configuration's allocator raised OOM at a request.  Its
state is kept as it was at that point (and for the first configuration
the snapshot is written at once: the OOM snapshot), it receives no more
events, and the script goes on for the others.  Once every configuration
is out of memory the script is stopped by :class:`PredictionStopped`
raised at the allocating line (a ``BaseException``, so ``except
Exception`` in the script does not swallow it).

Inside the autograd engine (``loss.backward()``, ``torch.autograd.grad``:
a graph task is running) the stop waits until the engine has returned: the
remaining backward operators run on fake tensors with no allocator
events, and :class:`PredictionStopped` is raised as the outermost
``backward()`` / ``grad()`` call returns (``torch.autograd``'s
``_engine_run_backward``, wrapped while predicting), or at the first
operator after the engine for a backward started elsewhere (``Tracker``).  An
exception raised inside the engine by Python code (a hook, the dispatch
mode) is survivable only thanks to the device guard, which takes the
pending error out of the interpreter while the engine unwinds
(``_device._Guard``: without it, ``std::terminate``); the wrapped
``_engine_run_backward`` then raises that error in place of the engine's
``SystemError``.  The stop still waits for the engine, so that the
engine's own state unwinds as after a normal return.  The OOM itself (its
stack, phase and snapshot) is recorded at the allocating line either way.

Allocators are created at the first device allocation: a script that
uses "cuda" gets the ``cuda`` profile by default, one that uses "npu" the
``npu`` profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import threading
import time
import traceback
import warnings
import weakref

import torch

from . import _capi, _device, _frames, _snapshot
from ._report import fmt_bytes


# The simulated device's size range (src/runtime/sim.c: SIM_GRANULE, the
# 2 MiB segment granule, and SIM_MAX_MEMORY; `memsnap replay
# --device-memory` takes the same range).  The simulator would round a
# smaller size up and clamp a larger one: refused instead.
MIN_MEMORY = 2 << 20
MAX_MEMORY = 1 << 48


def check_reserve(reserve: int, memory: int) -> int:
    """``reserve`` if it can be taken on a device of ``memory`` bytes,
    else ``ValueError``: checked before the script runs, since the reserve
    itself is taken at the script's first device allocation (the device
    type is known only then)."""
    if reserve < 0:
        raise ValueError(f"--reserve {reserve} B is negative")
    if reserve > memory:
        raise ValueError(f"--reserve {fmt_bytes(reserve)} ({reserve} B) does not fit in a "
                         f"device of --memory {fmt_bytes(memory)} ({memory} B)")
    return reserve


def check_memory(memory: int, text=None) -> int:
    """``memory`` if the simulated device can have that size, else
    ``ValueError`` naming the range."""
    if not MIN_MEMORY <= memory <= MAX_MEMORY:
        given = f"{text} ({memory} bytes)" if text is not None and str(text) != str(memory) \
            else f"{memory} bytes"
        raise ValueError(f"memory {given} is outside the simulated device's range: "
                         f"2M..256T bytes (the device's segment granule is 2 MiB)")
    return memory


class PredictionStopped(BaseException):
    """Raised into the script when every configuration is out of memory."""


class ConfigError(ValueError):
    """A configuration the allocator refuses: a bad alloc-conf, raised when
    the prediction starts (:meth:`Session.check_configs`), or a --reserve
    larger than the device, raised at the first device allocation."""


@dataclasses.dataclass
class Config:
    """One allocator configuration: ``profile`` "npu"/"cuda" or None (the
    device type the script uses), ``alloc_conf`` a PYTORCH_*_ALLOC_CONF
    string or None (the profile's environment variable)."""

    profile: str | None = None
    alloc_conf: str | None = None


def parse_what_if(spec: str) -> Config:
    """``npu``, ``cuda``, ``expandable_segments:True``, or
    ``cuda,expandable_segments:True`` (a profile name first, then the
    alloc-conf).  A conf without a profile uses the run's profile."""
    spec = spec.strip()
    head, sep, rest = spec.partition(",")
    if head in _capi.PROFILES:
        return Config(head, rest if sep else "")
    if not spec:
        raise ValueError("empty what-if")
    return Config(None, spec)


def _spec(c: Config) -> str:
    """A what-if as given to --what-if (or made by --compare)."""
    return ",".join(x for x in (c.profile, c.alloc_conf) if x)


def _which(i: int, c: Config) -> str:
    """The prefix naming configuration i in an error: nothing for the
    run's own (0), ``what-if 'SPEC': `` for a what-if (as given to
    --what-if or made by --compare)."""
    if i == 0:
        return ""
    return f"what-if {_spec(c)!r}: "


def _conf_items(conf: str) -> list[str]:
    return [i.strip() for i in conf.split(",") if i.strip()]


def _env_conf(profile: str) -> str | None:
    own = "PYTORCH_NPU_ALLOC_CONF" if profile == "npu" else "PYTORCH_CUDA_ALLOC_CONF"
    return os.environ.get(own) or os.environ.get("PYTORCH_ALLOC_CONF")


def compare_set(primary: Config) -> list[Config]:
    """The standard what-ifs of ``--compare``: the run's profile with
    expandable segments switched, and the other profile with its
    defaults."""
    items = [i for i in _conf_items(primary.alloc_conf or "")
             if not i.startswith("expandable_segments")]
    on = "expandable_segments:true" in (primary.alloc_conf or "").lower().replace(" ", "")
    items.append(f"expandable_segments:{'False' if on else 'True'}")
    other = "cuda" if primary.profile == "npu" else "npu"
    return [Config(primary.profile, ",".join(items)), Config(other, "")]


@dataclasses.dataclass
class OOM:
    """Where a configuration ran out of memory (bytes)."""

    device: int
    requested_bytes: int
    free_bytes: int
    total_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    message: str
    stack: list  # user frames, innermost first (dicts filename/line/name)
    phase: str | None  # innermost open annotation (module / optimizer step)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["line"] = _frames.site(self.stack[0] if self.stack else None)
        return d


class Target:
    """A configuration's allocator and what was seen of it."""

    def __init__(self, config: Config, alloc: _capi.Allocator):
        self.config = config
        self.alloc = alloc
        self.dead = False  # out of memory: frozen
        self.oom: OOM | None = None
        self.buf = _capi.Stats()
        # Per device: peak reserved, and the largest allocated while
        # reserved was at that peak.
        self.peak_reserved: dict[int, int] = {}
        self.allocated_at_peak: dict[int, int] = {}

    def poll(self, device: int) -> int:
        """Read the device's stats after an allocation; returns allocated."""
        s = self.alloc.stats(device, self.buf)
        r = s.reserved_bytes[0].current
        a = s.allocated_bytes[0].current
        p = self.peak_reserved.get(device, -1)
        if r > p:
            self.peak_reserved[device] = r
            self.allocated_at_peak[device] = a
        elif r == p and a > self.allocated_at_peak[device]:
            self.allocated_at_peak[device] = a
        return a


class Session:
    """See the module docstring.  Options are those of ``predict()``."""

    def __init__(self, memory: int, configs: list[Config], devices: int = 1,
                 device: int = 0, compare: bool = False, output: str | None = None,
                 extra_bytes: int = 0, annotate: bool = True, attention: str = "fused"):
        check_memory(memory)
        check_reserve(extra_bytes, memory)
        if devices < 1:
            raise ValueError("devices must be >= 1")
        self.memory = memory
        self.devices = devices
        self.configs = list(configs) or [Config()]
        self.compare = compare
        self.output = output
        self.extra_bytes = extra_bytes
        self.annotate_modules = annotate
        if attention not in ("fused", "math"):
            raise ValueError(f"attention must be 'fused' or 'math', not {attention!r}")
        self.attention = attention
        self.device_state = _device.DeviceState(devices, device)
        self.targets: list[Target] = []
        self.saw_cuda = False
        self.phase_stack: list[str] = []
        self.used_devices: set[int] = set()
        self.snapshot_written: str | None = None
        # Every configuration ran out of memory inside the autograd engine:
        # the stop message, raised once the engine has returned.
        self.stop_pending: str | None = None
        # Why the snapshot could not be written ("path: reason"), or None.
        self.write_error: str | None = None
        self.events = 0
        self._peak_allocated = 0
        self.peak_phase: str | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.compile_calls = 0
        self.unknown_scalars = 0
        self.started = self.elapsed = 0.0
        self._stack = None
        self.fake_mode = None
        self.device_args = None  # the DeviceArgs mode while predicting
        self.tracker = None
        # Threads of the script that failed on device work the prediction
        # does not see (it follows the thread that runs the script):
        # {(site, error): {"site", "error", "threads": [names]}}.
        self.thread_errors: dict = {}
        self._thread_lock = threading.Lock()
        # What-ifs equal to a configuration already evaluated (the run's
        # own, or an earlier what-if): [{"what_if": SPEC as given,
        # "same_as": SPEC it repeats}], filled when the allocators are made.
        self.what_if_repeated: list[dict] = []

    @property
    def threads_not_seen(self) -> int:
        """Threads whose device work failed unseen (see
        :func:`_other_threads`)."""
        return sum(len(e["threads"]) for e in self.thread_errors.values())

    # -- configuration ---------------------------------------------------
    @property
    def profile_name(self) -> str:
        return self.targets[0].config.profile if self.targets else (self.configs[0].profile
                                                                     or "npu")

    def check_configs(self) -> None:
        """Refuse, before the code runs, an alloc-conf the allocators
        would refuse at its first device allocation: each configuration is
        tried on an allocator of its profile, created and closed.  A
        configuration whose profile the code decides (profile None: the
        device type it uses) is refused when no profile takes it; one that
        only one profile refuses is refused at the first allocation, once
        the profile is known.  Both profiles refusing it for different
        reasons, the message gives both.

        Raises:
            ConfigError: the allocator's message, naming the token.
        """
        fixed = self.configs[0].profile
        for i, c in enumerate(self.configs):
            profiles = [c.profile or fixed] if (c.profile or fixed) else ["npu", "cuda"]
            errors, reasons, confs = [], set(), set()
            for profile in profiles:
                conf = c.alloc_conf
                if conf is None:
                    conf = (_env_conf(profile) if i == 0 else "") or ""
                confs.add(conf)
                try:
                    _capi.Allocator(profile, conf, self.devices, self.memory).close()
                except ValueError as e:
                    errors.append(str(e))
                    # the reason, without "allocator (PROFILE, alloc conf 'C'): "
                    reasons.add(str(e).removeprefix(
                        f"allocator ({profile}, alloc conf {conf!r}): "))
            if len(errors) == len(profiles):
                if len(reasons) == 1 and len(profiles) > 1 and len(confs) == 1:
                    # both refuse it alike: the script's profile, not known
                    # yet, does not matter (naming one would mislead)
                    raise ConfigError(_which(i, c) + f"allocator (alloc conf "
                                      f"{confs.pop()!r}): {reasons.pop()}")
                if len(reasons) == 1:
                    raise ConfigError(_which(i, c) + errors[0])
                raise ConfigError(_which(i, c) + "refused by both profiles: "
                                  + "; ".join(errors))

    def _create(self) -> None:
        """Create the allocators (first device allocation)."""
        first = self.configs[0]
        profile = first.profile or ("cuda" if self.saw_cuda else "npu")
        conf = first.alloc_conf if first.alloc_conf is not None else _env_conf(profile)
        primary = Config(profile, conf or "")
        configs = [primary]
        given = [first]  # each as the user gave it, to name it in an error
        rest = list(self.configs[1:])
        if self.compare:
            rest += compare_set(primary)
        for g in rest:
            c = Config(g.profile or profile, g.alloc_conf or "")
            same = next((k for k, o in enumerate(configs) if o == c), None)
            if same is None:
                configs.append(c)
                given.append(g)
            else:
                self.what_if_repeated.append({
                    "what_if": _spec(g),
                    "same_as": "the run" if same == 0 else f"what-if {_spec(given[same])!r}",
                    "profile": c.profile, "alloc_conf": c.alloc_conf})
        targets: list[Target] = []
        try:
            for i, c in enumerate(configs):
                try:
                    alloc = _capi.Allocator(c.profile, c.alloc_conf, self.devices, self.memory)
                except ValueError as e:
                    raise ValueError(_which(i, given[i]) + str(e)) from None
                targets.append(Target(c, alloc))
            if self.extra_bytes:
                # Known constants outside the allocator's view (runtime
                # context, communication buffers): taken up front on every
                # device of every configuration, never freed, before the
                # history starts (so no frame is blamed for them).
                for t in targets:
                    for d in range(self.devices):
                        if t.alloc.malloc(d, self.extra_bytes, 0) < 0:
                            raise ValueError(
                                f"--reserve {self.extra_bytes} B does not fit in a device "
                                f"of --memory {self.memory} B")
            targets[0].alloc.record_history(True)
        except ValueError as e:
            for t in targets:
                t.alloc.close()
            raise ConfigError(str(e)) from None
        self.targets = targets

    def kernel_profile(self) -> str:
        """The device whose kernels run: the run's profile."""
        if self.targets:
            return self.targets[0].config.profile
        return self.configs[0].profile or ("cuda" if self.saw_cuda else "npu")

    def primary(self) -> _capi.Allocator | None:
        return self.targets[0].alloc if self.targets else None

    def snapshot(self) -> dict:
        """The run's snapshot now (``_snapshot()`` of the first
        configuration, without memsnap's own frames)."""
        if not self.targets:
            return self._with_world(self._empty_snapshot())
        return self._with_world(_snapshot.clean(self.targets[0].alloc.snapshot()))

    def _with_world(self, snap: dict) -> dict:
        """A distributed prediction's snapshot names its rank, as a rank's
        own would: ``process_info`` gets ``rank``, ``world_size`` and
        ``local_rank`` (the fake world's RANK / WORLD_SIZE / LOCAL_RANK,
        which are restored when the prediction ends, before the snapshot
        is taken), after ``host`` as the library writes them."""
        info = snap.get("process_info")
        if self.world_size is None or self.rank is None or not isinstance(info, dict):
            return snap
        out = {}
        for k, v in info.items():
            if k in ("rank", "world_size", "local_rank"):
                continue
            out[k] = v
            if k == "host":
                out.update(rank=self.rank, world_size=self.world_size, local_rank=self.rank)
        if "rank" not in out:
            out.update(rank=self.rank, world_size=self.world_size, local_rank=self.rank)
        snap["process_info"] = out
        return snap

    def _empty_snapshot(self) -> dict:
        """The snapshot of a run that allocated nothing on the device: that
        of a new allocator of the run's configuration, recording history as
        the run's would (no segments, empty traces; its settings and
        process_info), or, where that allocator
        cannot be made (an alloc conf only the other profile takes), the
        same keys with empty settings."""
        first = self.configs[0]
        profile = first.profile or ("cuda" if self.saw_cuda else "npu")
        conf = first.alloc_conf if first.alloc_conf is not None else _env_conf(profile)
        try:
            alloc = _capi.Allocator(profile, conf or "", self.devices, self.memory)
        except ValueError:
            return {"segments": [], "device_traces": [[] for _ in range(self.devices)],
                    "allocator_settings": {}, "external_annotations": [],
                    "host_segments": [], "host_traces": []}
        try:
            alloc.record_history(True)  # as the run's allocator records
            return alloc.snapshot()
        finally:
            alloc.close()

    def write_snapshot(self, path: str) -> None:
        _snapshot.write(self.snapshot(), path)

    def _write_output(self) -> None:
        """The run's snapshot to ``output``; a failure is kept in
        ``write_error`` (never raised into the script)."""
        try:
            self.write_snapshot(self.output)
        except OSError as e:
            self.write_error = _snapshot.describe(e, self.output)
        else:
            self.snapshot_written = self.output

    # -- events from the tracker -----------------------------------------
    def allocate(self, device: int, nbytes: int) -> list | None:
        # a tensor on "cuda:N" past the prediction's devices: the error
        # torch.cuda.set_device(N) gets (no allocator has that device)
        self.device_state.check(device)
        if not self.targets:
            self._create()
        stream = self.device_state.stream_of(device)
        self.used_devices.add(device)
        self.events += 1
        ptrs = []
        live = False
        for t in self.targets:
            if t.dead:
                ptrs.append(0)
                continue
            p = t.alloc.malloc(device, nbytes, stream)
            if p < 0:
                self._oom(t, device, nbytes)
                ptrs.append(0)
                continue
            a = t.poll(device)
            if t is self.targets[0] and a > self._peak_allocated:
                self._peak_allocated = a
                self.peak_phase = self._phase()
            ptrs.append(p)
            live = True
        if not live:
            message = (f"memsnap.predict: every configuration is out of memory "
                       f"(requested {nbytes} bytes on device {device})")
            if torch._C._current_graph_task_id() != -1:
                # Inside the autograd engine: stop after it (module docstring).
                self.stop_pending = self.stop_pending or message
                return ptrs
            raise PredictionStopped(message)
        return ptrs

    def check_stop(self) -> None:
        """Raise the stop deferred out of the autograd engine, once the
        engine has returned (called by the tracker before every operator)."""
        if self.stop_pending is not None and torch._C._current_graph_task_id() == -1:
            raise PredictionStopped(self.stop_pending)

    def free(self, ptrs: list) -> None:
        self.events += 1
        for t, p in zip(self.targets, ptrs):
            if p and not t.dead:
                t.alloc.free(p)

    def record_stream(self, ptrs: list, stream: int) -> None:
        for t, p in zip(self.targets, ptrs):
            if p and not t.dead:
                t.alloc.record_stream(p, stream)

    def empty_cache(self) -> None:
        for t in self.targets:
            if not t.dead:
                t.alloc.empty_cache(-1)

    def set_memory_fraction(self, device: int, fraction: float) -> None:
        for t in self.targets:
            if not t.dead:
                t.alloc.set_memory_fraction(device, fraction)

    def annotate(self, name: str, is_start: bool) -> None:
        if is_start:
            self.phase_stack.append(name)
        elif name in self.phase_stack:
            # remove the innermost occurrence
            i = len(self.phase_stack) - 1 - self.phase_stack[::-1].index(name)
            del self.phase_stack[i]
        if self.targets and not self.targets[0].dead:
            self.targets[0].alloc.annotate(self.device_state.device, name, is_start)

    def _phase(self) -> str | None:
        """The innermost open range, or "backward" / None outside them."""
        if self.phase_stack:
            return self.phase_stack[-1]
        return "backward" if torch._C._current_graph_task_id() != -1 else None

    def _oom(self, t: Target, device: int, nbytes: int) -> None:
        message = t.alloc.last_error()
        free, total = t.alloc.mem_get_info(device)
        s = t.alloc.stats(device)
        t.oom = OOM(device=device, requested_bytes=nbytes, free_bytes=free, total_bytes=total,
                    reserved_bytes=s.reserved_bytes[0].current,
                    allocated_bytes=s.allocated_bytes[0].current, message=message,
                    stack=_frames.user_stack_now(2),
                    phase=self._phase())
        t.dead = True
        if t is self.targets[0] and self.output:
            self._write_output()

    # -- context ---------------------------------------------------------
    def __enter__(self):
        if _device._ACTIVE is not None:
            raise RuntimeError("memsnap.predict: a prediction is already running in "
                               "this process (predictions do not nest)")
        self.check_configs()
        from ._annotate import Annotator
        from ._tracker import Tracker

        name = _device.DEVICE_NAME
        _device.register_device(name)
        stack = contextlib.ExitStack()
        try:
            self.fake_mode = _fake_mode_class()(allow_non_fake_inputs=True)
            stack.enter_context(self.fake_mode)
            stack.enter_context(_swappable(self.fake_mode))
            stack.enter_context(_quiet_fake_data_ptr())
            stack.enter_context(_foreach_fake())
            stack.enter_context(_tolist_reads_once(self))
            _device._ACTIVE = self
            stack.callback(setattr, _device, "_ACTIVE", None)
            stack.enter_context(_autocast_on(name))
            stack.enter_context(_device.cuda_as_device())
            stack.enter_context(_patched_modules())
            stack.enter_context(_eager_compile(self))
            stack.enter_context(_inline_dataloader())
            # Backward on the calling thread: its allocations then carry the
            # user's `loss.backward()` frame.
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            stack.enter_context(_stop_after_backward(self))
            if self.annotate_modules:
                stack.enter_context(Annotator(self.annotate))
            self.device_args = _device.DeviceArgs(self)
            stack.enter_context(self.device_args)
            stack.callback(setattr, self, "device_args", None)
            stack.enter_context(_device.functional_kernels(self.device_args))
            stack.enter_context(_other_threads(self, name))
            self.tracker = Tracker(self, name)
            stack.enter_context(self.tracker)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        _device.take_pending_error()
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.elapsed = time.perf_counter() - self.started
        try:
            self._stack.close()
        finally:
            self._stack = None
        return exc_type is not None and issubclass(exc_type, PredictionStopped)

    def finish(self) -> None:
        """Write the snapshot (unless the OOM snapshot was written; an
        empty one when the run allocated nothing on the device) and stop
        every allocator from taking more events."""
        if (self.output and self.snapshot_written is None
                and self.write_error is None):
            self._write_output()
        if self.tracker is not None:
            self.tracker.release_all()


# A device operator in a thread other than the one that predicts: the fake
# device, the fake mode and the device-argument mapping are that thread's
# only, so the operator reaches torch's real "CUDA" or the unimplemented
# PrivateUse1 ("npu") backend, or a CPU build's missing CUDA support.
_UNSEEN_DEVICE = re.compile(
    r"(Could not run '[^']+' with arguments from the '(?:CUDA|PrivateUse1|{name})' backend"
    r"|PyTorch is not linked with support for (?:cuda|privateuseone|{name}) devices"
    r"|Torch not compiled with CUDA enabled)")


def unseen_device_error(exc: BaseException, name: str) -> str | None:
    """The short form of ``exc`` when it is a device operator that failed
    because it ran outside the predicting thread, else None."""
    if not isinstance(exc, (NotImplementedError, RuntimeError, AssertionError)):
        return None
    m = re.search(_UNSEEN_DEVICE.pattern.replace("{name}", re.escape(name)), str(exc))
    return None if m is None else f"{type(exc).__name__}: {m.group(1)}"


@contextlib.contextmanager
def _other_threads(session, name: str):
    """Device work in the script's other threads is not predicted (only the
    thread that runs the script has the fake device): such a thread fails
    at its first device operator.  While predicting, ``threading.excepthook``
    recognises that failure (:func:`unseen_device_error`), records it in
    ``session.thread_errors`` (the report's verdict is then UNKNOWN) and
    prints one line per distinct failure instead of the traceback; any
    other exception of a thread goes to the hook that was installed."""
    orig = threading.excepthook

    def excepthook(args):
        short = unseen_device_error(args.exc_value, name) if args.exc_value else None
        if short is None:
            return orig(args)
        frames = [{"filename": f.filename, "line": f.lineno, "name": f.name}
                  for f in traceback.extract_tb(args.exc_traceback)]
        user = [f for f in frames if _frames.is_user_file(f["filename"])]
        site = _frames.site(user[-1] if user else None)
        thread = args.thread.name if args.thread is not None else "?"
        with session._thread_lock:
            e = session.thread_errors.get((site, short))
            first = e is None
            if first:
                e = session.thread_errors[(site, short)] = {
                    "site": site, "error": short, "threads": []}
            e["threads"].append(thread)
        if first:
            print(f"memsnap.predict: thread {thread!r}: device work not seen (predict "
                  f"follows the main thread only): {site}: {short}", file=sys.stderr)

    threading.excepthook = excepthook
    try:
        yield
    finally:
        if threading.excepthook is excepthook:
            threading.excepthook = orig


@contextlib.contextmanager
def _stop_after_backward(session):
    """``backward()`` and ``autograd.grad()`` raise the stop deferred out of
    the autograd engine as they return (module docstring).  Both call
    ``_engine_run_backward``, which ``torch.autograd`` imports by name from
    ``torch.autograd.graph``: both names are wrapped.

    The engine also runs with the device-argument mode (``DeviceArgs``)
    active again: ``backward()`` and ``grad()`` reach the engine through
    that mode's ``__torch_function__``, inside which a mode is off, so the
    Python the engine runs -- custom ``autograd.Function`` backwards and
    hooks, such as DTensor's ``from_local`` moving a gradient to the
    mesh's "cuda" device -- would get "cuda" unmapped ("PyTorch is not
    linked with support for cuda devices")."""
    import torch.autograd.graph as graph

    orig = graph._engine_run_backward

    def run(*args, **kwargs):
        mode = session.device_args
        if mode is None or mode in torch.overrides._get_current_function_mode_stack():
            return orig(*args, **kwargs)
        with mode:
            return orig(*args, **kwargs)

    def _engine_run_backward(*args, **kwargs):
        try:
            r = run(*args, **kwargs)
        except BaseException:
            # An error raised inside the engine by a hook or a dispatch
            # mode was taken out of the interpreter by the device guard
            # (``_device._Guard``): the engine then fails with a
            # SystemError; the user's own error is raised instead.
            err = _device.take_pending_error()
            if err is None:
                raise
        else:
            _device.take_pending_error()  # one the engine survived
            session.check_stop()
            return r
        raise err

    saved = [(m, m._engine_run_backward) for m in (graph, torch.autograd)]
    for m, _ in saved:
        m._engine_run_backward = _engine_run_backward
    try:
        yield
    finally:
        for m, f in saved:
            m._engine_run_backward = f


@contextlib.contextmanager
def _patched_modules():
    """``import torch_npu`` gives the stand-in while predicting (unless the
    real one is loaded, which register_device refuses anyway)."""
    had = "torch_npu" in sys.modules
    if not had:
        sys.modules["torch_npu"] = _device.torch_npu_shim
        sys.modules["torch_npu.npu"] = _device.npu
    try:
        yield
    finally:
        if not had:
            sys.modules.pop("torch_npu", None)
            sys.modules.pop("torch_npu.npu", None)


def _fake_mode_class():
    from torch._subclasses.fake_tensor import FakeTensorMode

    class _FakeMode(FakeTensorMode):
        # No device is ever touched: torch.tensor(data, device=...) builds
        # on the CPU and moves, and real host tensors are never copied to
        # the device for real (NOTE [torch.tensor, lift_fresh, and device
        # movement] in torch/_subclasses/fake_tensor.py).  FakeTensorMode
        # decides this from device availability, which the fake device
        # reports as True to the script.
        avoid_device_init = True

        def __deepcopy__(self, memo):
            # copy.deepcopy of a fake tensor (a module's parameters:
            # nn.TransformerEncoder deep-copies its layer) copies the
            # tensor's __dict__ (torch/_tensor.py Tensor.__deepcopy__),
            # which holds its fake_mode: the copy then belonged to a second
            # mode, whose converter memo kept a weak reference to it, and
            # ``.to(device)`` could not swap it ("Cannot swap t1 because
            # it has weakref associated with it").  The mode is the
            # prediction's one context, never copied.
            memo[id(self)] = self
            return self

    return _FakeMode


@contextlib.contextmanager
def _quiet_fake_data_ptr():
    """``copy.deepcopy`` of a tensor asks for its data pointer
    (torch/_tensor.py ``Tensor.__deepcopy__``: ``self.data_ptr() == 0``),
    which for a fake tensor warns "Accessing the data pointer of
    FakeTensor is deprecated ... almost definitely a bug in your code":
    not in the user's code, and not on the device it predicts.  That
    warning alone is silenced while the prediction runs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning,
                                message="Accessing the data pointer of FakeTensor")
        yield


def _drop_memo(memo: dict, t) -> None:
    # No reference to a weakref object may outlive this call.
    keys = [getattr(r, "key", None) for r in weakref.getweakrefs(t)]
    for key in keys:
        r = memo.get(key)
        if r is not None and r() is t:
            del memo[key]


@contextlib.contextmanager
def _swappable(fake_mode):
    """``nn.Module.to()`` / ``.cuda()`` on fake parameters swaps tensors
    (``torch.utils.swap_tensors``), which refuses a tensor that has weak
    references, and FakeTensorMode's converter memo holds one on every
    tensor an operator returned.  The memo entry only maps the operator's
    meta result to its fake tensor; it is dropped before the swap."""
    memo = fake_mode.fake_tensor_converter.meta_converter.tensor_memo.data
    orig = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        _drop_memo(memo, t1)
        _drop_memo(memo, t2)
        return orig(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = orig


@contextlib.contextmanager
def _tolist_reads_once(session):
    """``values_read_as_zero`` counts reads, not elements: one per
    ``.item()``, ``bool()``/``int()``/``float()``, ``.tolist()`` or
    ``.numpy()`` of a fake tensor that gave 0s.  FakeTensor.tolist (a
    Python method, which no torch function mode sees) reads each element
    with ``.item()``, each counted by the tracker: the call counts once
    (nested calls for each row of a 2-D tensor included)."""
    from torch._subclasses.fake_tensor import FakeTensor

    own = "tolist" in FakeTensor.__dict__
    orig = FakeTensor.tolist

    def tolist(self, *args, **kwargs):
        before = session.unknown_scalars
        try:
            return orig(self, *args, **kwargs)
        finally:
            if session.unknown_scalars > before:
                session.unknown_scalars = before + 1

    FakeTensor.tolist = tolist
    try:
        yield
    finally:
        if own:
            FakeTensor.tolist = orig
        else:
            del FakeTensor.tolist


@contextlib.contextmanager
def _foreach_fake():
    """Optimizers and ``clip_grad_norm_`` pick their foreach (multi-tensor)
    implementation only for plain ``Tensor``/``Parameter`` types, as they
    are on a real device; fake tensors are added to those lists, so the
    prediction sees the same implementation (and its temporaries) as the
    real run."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    lists = [optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types]
    added = [lst for lst in lists if FakeTensor not in lst]
    for lst in added:
        lst.append(FakeTensor)
    try:
        yield
    finally:
        for lst in added:
            lst.remove(FakeTensor)


@contextlib.contextmanager
def _autocast_on(name: str):
    """Autocast kernels of the fake device (``_autocast.py``); their cast
    cache is cleared with torch's (outermost autocast exit)."""
    from . import _autocast

    _autocast.install(name)
    orig = torch.clear_autocast_cache

    def clear_autocast_cache():
        _autocast.clear_cache()
        orig()

    torch.clear_autocast_cache = clear_autocast_cache
    try:
        yield
    finally:
        torch.clear_autocast_cache = orig
        _autocast.clear_cache()


@contextlib.contextmanager
def _inline_dataloader():
    """DataLoaders load in the calling thread (``num_workers`` ignored):
    worker processes and the pin-memory thread would run outside the
    prediction (and cannot pickle fake tensors).  Loading order and batch
    shapes are unchanged."""
    from torch.utils.data import dataloader

    orig = dataloader.DataLoader._get_iterator

    def _get_iterator(self):
        workers, timeout = self.num_workers, self.timeout
        self.num_workers, self.timeout = 0, 0
        try:
            return dataloader._SingleProcessDataLoaderIter(self)
        finally:
            self.num_workers, self.timeout = workers, timeout

    dataloader.DataLoader._get_iterator = _get_iterator
    try:
        yield
    finally:
        dataloader.DataLoader._get_iterator = orig


@contextlib.contextmanager
def _eager_compile(session):
    """``torch.compile`` returns the model / function unchanged (a
    prediction runs eagerly; see docs/predict.md)."""
    orig = torch.compile
    orig_mod = torch.nn.Module.compile

    def compile(model=None, **kwargs):  # noqa: A001 (torch's name)
        session.compile_calls += 1
        if model is None:
            return lambda m: m
        return model

    def module_compile(self, *args, **kwargs):
        session.compile_calls += 1

    torch.compile = compile
    torch.nn.Module.compile = module_compile
    try:
        yield
    finally:
        torch.compile = orig
        torch.nn.Module.compile = orig_mod
