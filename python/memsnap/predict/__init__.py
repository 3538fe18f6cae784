"""memsnap.predict -- a real model's device memory, without the device.

Runs PyTorch code on fake tensors (``torch._subclasses.FakeTensorMode``:
shapes, dtypes, aliasing and autograd, no data, no device, host memory
independent of the model's size) while memsnap's caching allocator, on a
simulated device of the chosen size, takes every storage allocation and
free: the result is what PyTorch's (``cuda`` profile) or torch_npu's
(``npu``) allocator would do on the device: peak allocated and reserved
memory, fragmentation, the line that runs out of memory, and a snapshot
that memory_viz opens.

Command line (docs/predict.md)::

    python -m memsnap.predict --memory 64G --compare train.py --steps 2

In code::

    from memsnap.predict import predict
    with predict(memory="64G", compare=True) as p:
        model = GPT().to("npu")
        ...one training step...
    print(p.report())          # p.fits, p.peak_reserved_bytes, p.oom, p.what_if

Inside the block every tensor is a fake tensor; the device is "npu"
(``torch.npu``) and "cuda" works as well (it runs as the same fake device).
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import pkgutil
import re
import runpy
import sys
import threading
import traceback
from fractions import Fraction
from typing import Any, Sequence

from . import _device, _report, _snapshot
from ._session import (Config, ConfigError, PredictionStopped, Session, check_memory, check_reserve,
                       parse_what_if)

__all__ = ["predict", "run_script", "parse_size", "parse_what_if", "Config", "ConfigError",
           "PredictionStopped"]

# The forms of the C parser (msnap__parse_size, src/base/env.c), which reads
# MEMSNAP_SIM_MEMORY: both are tested with tests/runtime/size_forms.txt.
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGTP])(?:I?B)?|B)?\s*",
                   re.IGNORECASE | re.ASCII)
_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50}


def parse_size(text: Any) -> int:
    """Bytes from an int or text such as ``64G``, ``80GB``, ``1.5TiB``,
    ``512 M``, ``1024B``, ``1073741824`` (binary units; the forms
    MEMSNAP_SIM_MEMORY takes).  A fraction counts exactly, truncated to
    whole bytes (``0.1K`` is 102).

    Raises:
        ValueError: anything else, or a size below 1 byte.
    """
    exact = None  # the text's value before truncation to whole bytes
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _SIZE.fullmatch(str(text))
        if m is None:
            raise ValueError(f"invalid size {text!r}: expected a number with an optional "
                             "K, M, G, T or P suffix (binary units), e.g. 64G")
        unit = m.group(2)
        exact = Fraction(m.group(1)) * (1 << (_SHIFT[unit.upper()] if unit else 0))
        n = int(exact)
    if n <= 0:
        why = ("less than 1 byte (a fraction counts whole bytes)" if exact
               else "must be positive")
        raise ValueError(f"invalid size {text!r}: {why}")
    return n


class predict:  # noqa: N801 (used as a context manager, like torch's)
    """Predict the device memory of the code inside a ``with`` block.

    Args:
        memory: device size, bytes or text (``"64G"``): 2 MiB to 256 TiB
            (the simulated device's range; ``ValueError`` outside it).
        profile: "npu" (torch_npu's allocator), "cuda" (PyTorch's), or
            None: the device type the code uses.
        alloc_conf: the allocator configuration (PYTORCH_NPU_ALLOC_CONF /
            PYTORCH_CUDA_ALLOC_CONF syntax); None reads the profile's
            environment variable.
        what_if: more configurations to evaluate on the same run:
            ``Config`` objects or strings (``"expandable_segments:True"``,
            ``"cuda"``, ``"cuda,max_split_size_mb:128"``).
        compare: add the standard what-ifs (expandable segments switched,
            the other profile).
        devices: simulated devices (``torch.npu.device_count()``); with
            ``world_size`` it defaults to the world size.
        world_size, rank: run as this rank of a fake process group of
            ``world_size`` ranks (``torch.distributed`` calls work; the
            prediction is this rank's device).  A rank other than 0
            without ``world_size`` raises ``ValueError``.
        output: write the snapshot pickle here (the OOM snapshot when the
            run's configuration runs out of memory), with memsnap's file
            writer (docs/predict.md).  A path that cannot be written (a
            directory, a missing or read-only directory) is refused here;
            a failure at write time is kept in ``result["snapshot_error"]``.
        reserve: bytes per device taken before the code runs, for memory
            the allocator does not see (runtime context, communication
            buffers).
        annotate: record module forward/backward and optimizer step ranges.
        attention: "fused" (``F.scaled_dot_product_attention`` allocates
            what the device's fused kernel allocates: flash / efficient
            attention for cuda, torch_npu's npu_fusion_attention for npu)
            or "math" (torch's math path, the attention matrix kept).

    Attributes after the block: ``fits``, ``peak_allocated_bytes``,
    ``peak_requested_bytes`` (the tensors' own bytes: torch's MemTracker
    counts these), ``peak_reserved_bytes``, ``fragmentation_bytes``, ``oom`` (None or a
    dict), ``what_if`` (list of dicts), ``result`` (the ``--json`` dict),
    ``report()`` (the text report).

    Raises:
        ValueError: bad sizes or configurations; ``ConfigError`` (a
            ValueError) on entering the block for an alloc-conf the
            allocator refuses (Session.check_configs).
        OSError: ``output`` cannot be written (``filename`` names it).
        RuntimeError: a prediction is already running, or the "npu" device
            name is taken (torch_npu loaded).
    """

    def __init__(self, memory: Any = "64G", profile: str | None = None,
                 alloc_conf: str | None = None, what_if: Sequence[Any] = (),
                 compare: bool = False, devices: int | None = None,
                 world_size: int | None = None, rank: int = 0, output: str | None = None,
                 reserve: Any = 0, annotate: bool = True, attention: str = "fused"):
        if profile not in (None, "npu", "cuda"):
            raise ValueError(f"profile must be 'npu', 'cuda' or None, not {profile!r}")
        configs = [Config(profile, alloc_conf)]
        for w in what_if:
            configs.append(w if isinstance(w, Config) else parse_what_if(str(w)))
        if world_size is not None:
            if world_size < 1 or not 0 <= rank < world_size:
                raise ValueError(f"rank {rank} is not in a world of {world_size}")
        elif rank != 0:
            # as the command line's --rank without --devices
            raise ValueError(f"rank {rank} needs world_size (the ranks of the fake process group)")
        if output is not None:
            _snapshot.check_output(os.fspath(output))
        n = devices if devices is not None else (world_size or 1)
        device = rank if world_size is not None and rank < n else 0
        self._session = Session(check_memory(parse_size(memory), memory), configs,
                                devices=n, device=device,
                                compare=compare,
                                output=os.fspath(output) if output is not None else None,
                                extra_bytes=parse_size(reserve) if reserve else 0,
                                annotate=annotate, attention=attention)
        self._world = (world_size, rank) if world_size is not None else None
        self._dist = None
        self.result: dict | None = None
        self.script_error: str | None = None
        # The status the script gave os._exit (run_script), else None.
        self.os_exit: int | None = None

    def __enter__(self) -> "predict":
        s = self._session
        if self._world is not None:
            from ._dist import FakeWorld

            self._dist = FakeWorld(*self._world)
            s.world_size, s.rank = self._world
            self._dist.__enter__()
        try:
            s.__enter__()
        except BaseException:
            if self._dist is not None:
                self._dist.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        s = self._session
        try:
            suppress = s.__exit__(exc_type, exc, tb)
        finally:
            if self._dist is not None:
                self._dist.__exit__(exc_type, exc, tb)
        s.finish()
        snap = s.snapshot() if s.targets else None
        self.result = _report.results(s, snap)
        # The code ran to its end (or exited with status 0): otherwise the
        # figures cover only what ran before the exception.
        # Device work of other threads was not seen: incomplete as well.
        self.result["complete"] = (exc_type is None or (
            issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0))
        ) and not s.threads_not_seen
        return suppress

    # -- results ---------------------------------------------------------
    def _r(self, key):
        if self.result is None:
            raise RuntimeError("the prediction has not finished (leave the with block first)")
        return self.result[key]

    fits = property(lambda self: self._r("fits"))
    peak_allocated_bytes = property(lambda self: self._r("peak_allocated_bytes"))
    peak_requested_bytes = property(lambda self: self._r("peak_requested_bytes"))
    peak_reserved_bytes = property(lambda self: self._r("peak_reserved_bytes"))
    fragmentation_bytes = property(lambda self: self._r("fragmentation_bytes"))
    oom = property(lambda self: self._r("oom"))
    what_if = property(lambda self: self._r("what_if"))
    snapshot_path = property(lambda self: self._r("snapshot"))

    def report(self, script: str | None = None) -> str:
        """The text report (what ``python -m memsnap.predict`` prints)."""
        self._r("fits")
        return _report.text(self.result, script, self.script_error)


def _script_traceback(exc: BaseException, script: str) -> str:
    """The traceback from the first frame of ``script`` (the file that
    runs as ``__main__``, or ``<stdin>``) on, without the frames of the
    prediction's own machinery (memsnap's files and the dynamo-disable
    wrappers torch puts around a Python mode, as the snapshot's stacks
    drop them: ``_snapshot.clean``): an error the prediction raises for
    the device (an invalid device ordinal) ends at the script's line, as
    torch's C++ error would on the device."""
    te = traceback.TracebackException.from_exception(exc)
    target = script if script == "<stdin>" else os.path.realpath(script)
    frames = te.stack
    for i, f in enumerate(frames):
        if (f.filename if script == "<stdin>" else os.path.realpath(f.filename)) == target:
            frames = frames[i:]
            break
    te.stack = traceback.StackSummary.from_list(
        [f for f in frames if not _snapshot.machinery(f.filename)])
    # the exceptions it was raised from or while handling, the same way
    seen = {id(te)}
    todo = [te.__cause__, te.__context__]
    while todo:
        c = todo.pop()
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        c.stack = traceback.StackSummary.from_list(
            [f for f in c.stack if not _snapshot.machinery(f.filename)])
        todo += [c.__cause__, c.__context__]
    return "".join(te.format())


class _OsExit(SystemExit):
    """``os._exit(code)`` called by the script during the run."""


@contextlib.contextmanager
def _os_exit_unwinds():
    """``os._exit`` in the script's main thread and process raises
    :class:`_OsExit` instead of ending the process at once, so that the
    prediction is reported and its snapshot written first; the command
    line then ends the process with ``os._exit`` itself (no interpreter
    teardown, as the script asked).  From another thread or a forked
    child, ``os._exit`` is the real one."""
    orig = os._exit
    pid = os.getpid()

    def _exit(code):
        code = operator.index(code)  # os._exit's own TypeError
        if os.getpid() != pid or threading.current_thread() is not threading.main_thread():
            orig(code)
        raise _OsExit(code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = orig


def _run_stdin() -> dict:
    """``python -``: standard input's source runs as ``__main__`` with the
    file name ``<stdin>`` and the globals CPython gives it (pythonrun.c:
    ``__file__`` "<stdin>", ``__cached__`` None; ``__loader__``
    BuiltinImporter, ``__spec__`` and ``__package__`` None), in a
    temporary ``__main__`` module as runpy's.  The source is read as
    bytes, so that a coding declaration (PEP 263) applies."""
    import importlib.machinery

    stdin = sys.stdin
    if stdin is None:
        raise RuntimeError("'-': there is no standard input to read the script from")
    source = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read()
    code = compile(source, "<stdin>", "exec", dont_inherit=True)
    return _exec_main(code, "<stdin>", importlib.machinery.BuiltinImporter)


def _run_file(path: str) -> dict:
    """``python FILE``: the file runs as ``__main__`` under its absolute
    path, as CPython (3.9 and later) gives it -- ``__file__`` and the code's
    ``co_filename`` absolute, ``__loader__`` the file's loader, ``__spec__``
    and ``__package__`` None, ``__cached__`` None -- while ``sys.argv[0]``
    stays the name as typed (``runpy.run_path`` would set it to the path
    it is given).  A compiled ``.pyc`` runs as python runs it."""
    import importlib.machinery

    with io.open_code(path) as f:
        code = pkgutil.read_code(f)
    loader: Any = importlib.machinery.SourcelessFileLoader("__main__", path)
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        loader = importlib.machinery.SourceFileLoader("__main__", path)
    return _exec_main(code, path, loader)


def _exec_main(code: Any, file: str, loader: Any) -> dict:
    """Run ``code`` as a fresh ``__main__`` module (``__file__`` ``file``,
    ``__loader__`` ``loader``, ``__spec__``, ``__package__`` and
    ``__cached__`` None, as CPython sets them for a script), then put the
    previous ``__main__`` back.  Returns the module's globals, which keep
    what the script still holds alive for as long as the caller keeps
    them."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __cached__=None, __package__=None,
                         __spec__=None, __builtins__=builtins, __loader__=loader)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
        return main.__dict__
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
        else:
            del sys.modules["__main__"]


def run_script(script: str, args: Sequence[str] = (), **options: Any) -> predict:
    """Run ``script`` (as ``python script ARGS...`` would, ``__name__ ==
    "__main__"``) under :class:`predict` with ``options``; return it.

    ``script`` is what ``python`` takes: a file (run by its absolute path,
    ``sys.argv[0]`` as typed, as python runs it), a directory or zip file
    holding ``__main__.py`` (runpy.run_path: the directory or zip itself,
    as an absolute path, first on ``sys.path``; ``sys.argv[0]`` is that
    absolute path, where python keeps the name given), or ``-``: the
    script's source from standard input, named ``<stdin>``
    (``sys.argv[0]`` "-", ``""`` first on ``sys.path``).

    The script's own exceptions are caught: ``script_error`` then holds the
    traceback.  A ``SystemExit`` with a non-zero code counts as an error.
    An ``output`` that is the script file itself (the same file, by any
    name; for a directory, its ``__main__.py``) is refused with
    ``ValueError`` before anything runs.

    ``os._exit(code)`` in the script ends the run there (the prediction is
    finished and reported as for ``sys.exit(code)``) and sets ``os_exit``
    to ``code``: the caller decides when the process ends.
    """
    script = os.fspath(script)
    out = options.get("output")
    if out is not None and script != "-":
        # the script file, or the __main__.py of a directory script
        mains = [script]
        if os.path.isdir(script):
            mains.append(os.path.join(script, "__main__.py"))
        same = False
        for m in mains:
            try:
                same = same or os.path.samefile(os.fspath(out), m)
            except OSError:  # no such output yet (or no such file)
                pass
        if same:
            # as the memsnap CLI's -o (cli_util.c: cli_check_outputs)
            raise ValueError(f"output {os.fspath(out)!r} is the script {script!r}; "
                             "refusing to overwrite it")
    p = predict(**options)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    is_file = False
    if script == "-":
        sys.path.insert(0, "")
        first = "<stdin>"
    elif pkgutil.get_importer(script) is not None:
        # A directory or zip file: runpy puts it first on sys.path itself
        # and runs its __main__ (its parent is not added).  By its
        # absolute path, as python gives it (sys.path[0], __file__); runpy
        # then sets sys.argv[0] to that path too.
        script = os.path.abspath(script)
        first = os.path.join(script, "__main__.py")
    else:
        # A file: python runs it by its absolute path (__file__, the
        # frames' file names) and keeps sys.argv[0] as typed.
        first = os.path.abspath(script)
        sys.path.insert(0, os.path.dirname(first))
        is_file = True
    # The script's globals are kept until the prediction has ended, so
    # that its snapshot's final state is what the script held at its end
    # (as a _dump_snapshot on its last line would show), not a teardown
    # of its module half done (what reference cycles kept, the rest freed).
    kept: Any = None
    try:
        with p, _os_exit_unwinds():
            if script == "-":
                kept = _run_stdin()
            elif is_file:
                kept = _run_file(first)
            else:
                kept = runpy.run_path(script, run_name="__main__")
    except _OsExit as e:
        p.os_exit = e.code
        if e.code != 0:
            p.script_error = f"os._exit({e.code})"
    except SystemExit as e:
        if e.code not in (None, 0):
            p.script_error = f"SystemExit: {e.code}"
    except (KeyboardInterrupt, ConfigError):
        raise
    except BaseException as e:  # the script's own failure
        # An error a hook raised under a C++ stream guard outside the
        # autograd engine surfaces as a SystemError; the device guard kept
        # the real one (_device._Guard).
        kept = _device.take_pending_error()
        if kept is not None and isinstance(e, SystemError):
            e = kept
        p.script_error = _script_traceback(e, first)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        kept = None
    return p
