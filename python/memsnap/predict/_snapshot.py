"""memsnap.predict._snapshot -- the prediction's snapshot, as a user sees it.

The allocator records the interpreter stack of every allocation; during a
prediction the innermost frames are memsnap.predict's own (the dispatch
mode that turned the storage into an allocation, and the dynamo-disable
wrappers torch puts around a Python mode) and the outermost ones are the
runner's (``python -m memsnap.predict``, runpy).  They say
nothing about the user's program, so they are removed from every frame
list: the innermost frame of an entry is then torch's or the user's, as in
a snapshot recorded on the device.  The same holds for the two frames a
``__torch_function__`` dispatch adds in the middle of a stack: with the
prediction's mode active, every overridable function (``F.softmax``,
``Tensor.backward``, ...) first calls ``handle_torch_function``
(torch/overrides.py) from its ``has_torch_function`` test and runs again
inside the mode; on the device, without a mode, it runs once.  So an
``overrides.py`` ``handle_torch_function`` frame whose caller is the same
function as the frame it leads to loses itself and that caller: the stack
is the device's.  Everything else is the allocator's snapshot unchanged.

The file is a pickle (protocol 4, as ``torch.cuda.memory._dump_snapshot``
writes), written by memsnap's one file writer (``msnap_write_file``, as
``memsnap.memory._dump_snapshot(augment_with_fx_traces=True)`` writes its
dict): a temporary next to the final name renamed into place, so a failed
write never leaves a truncated file; the kernel's protected_symlinks rule
(a link in a sticky world-writable directory is followed only when it
belongs to the user or to the directory's owner, else ``PermissionError``
and nothing is written); a link of the user's own is followed and the file
it names keeps its mode; a new file gets 0666 less the umask; a device,
FIFO or ``/dev/stdout`` is written directly.
"""

from __future__ import annotations

import os
import pickle

import memsnap
from memsnap import _memsnap

_OWN = os.path.realpath(os.path.dirname(memsnap.__file__)) + os.sep
_OWN_INSTALLED = os.path.dirname(os.path.abspath(memsnap.__file__)) + os.sep
_PREDICT = os.path.realpath(os.path.dirname(__file__)) + os.sep


# torch wraps every __torch_function__/__torch_dispatch__ of a Python mode
# in these (dynamo-disable wrappers): innermost frames that exist only
# because the prediction runs as a mode.
_WRAPPERS = (os.sep + os.path.join("torch", "_dynamo", "eval_frame.py"),
             os.sep + os.path.join("torch", "_compile.py"))


_OVERRIDES = os.sep + os.path.join("torch", "overrides.py")


def _same_function(a: dict, b: dict) -> bool:
    return (a.get("filename") == b.get("filename") and
            a.get("name") == b.get("name"))


def _undispatch(r: list) -> list:
    """``r`` (innermost first, memsnap's frames removed) without the
    frames of a ``__torch_function__`` dispatch: ``[..., f@inner,
    handle_torch_function, f@outer, ...]`` becomes ``[..., f@inner, ...]``."""
    out: list = []
    i = 0
    while i < len(r):
        f = r[i]
        if (f.get("name") == "handle_torch_function" and out and i + 1 < len(r)
                and f.get("filename", "").endswith(_OVERRIDES)
                and _same_function(out[-1], r[i + 1])):
            i += 2
            continue
        out.append(f)
        i += 1
    return out


def _ours(filename: str) -> bool:
    return (filename.startswith(("<frozen runpy>",)) or filename.startswith(_OWN)
            or filename.startswith(_OWN_INSTALLED) or filename.startswith(_PREDICT))


def machinery(filename: str) -> bool:
    """A frame of the prediction's own machinery: memsnap's files, the
    runner's, and torch's dynamo-disable wrappers around a Python mode."""
    return _ours(filename) or filename.endswith(_WRAPPERS)


def clean(snapshot: dict) -> dict:
    """``snapshot`` with memsnap's and the runner's frames removed (in
    place; frame lists shared between entries are filtered once)."""
    done: dict[int, list] = {}

    def fix(frames):
        r = done.get(id(frames))
        if r is None:
            r = [f for f in frames if not _ours(f.get("filename", ""))]
            i = 0
            while i < len(r) and r[i].get("filename", "").endswith(_WRAPPERS):
                i += 1
            r = _undispatch(r[i:])
            done[id(frames)] = r
            done[id(r)] = r
        return r

    for seg in snapshot.get("segments", []):
        if "frames" in seg:
            seg["frames"] = fix(seg["frames"])
        for b in seg.get("blocks", []):
            if "frames" in b:
                b["frames"] = fix(b["frames"])
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = fix(e["frames"])
    return snapshot


def write(snapshot: dict, path: str) -> None:
    """Write ``snapshot`` to ``path`` (see the module docstring).

    Raises:
        OSError: the file cannot be written (``filename`` is ``path``;
            ``PermissionError`` for a link the rule refuses).
    """
    _memsnap.write_file(os.fspath(path), pickle.dumps(snapshot, protocol=4))


def check_output(path: str) -> None:
    """Refuse, before anything runs, a ``path`` the final write would
    refuse: memsnap's own pre-check (``msnap_check_output``, the one the
    ``memsnap`` CLI's ``-o`` uses) resolves it as the writer will -- the
    protected_symlinks rule (a link another user planted in /tmp), a
    dangling link, a name ending in ``/``, a missing directory on the way
    -- and refuses a directory, a new or regular file whose directory is
    not writable, a device or FIFO that is not writable.  Nothing is
    created.  What only the write can tell (a full disk) is reported by
    :func:`write`.

    Raises:
        OSError: ``filename`` is ``path``, ``strerror`` the writer's reason.
    """
    _memsnap.check_output(os.fspath(path))


def reason(e: OSError) -> str:
    """The writer's reason in an OSError of :func:`write` /
    :func:`check_output`, without its opening "cannot write: " (the
    library's "cannot write 'PATH': REASON" less the path, which
    ``filename`` holds): the caller's own words say what was not written."""
    text = e.strerror or str(e)
    lead = "cannot write: "
    return text[len(lead):] if text.startswith(lead) else text


def describe(e: OSError, path: str) -> str:
    """``path: reason`` for an OSError of :func:`write` / :func:`check_output`."""
    return f"{path}: {reason(e)}"


def refusal(e: OSError, path: str) -> str:
    """The line for an ``-o`` that :func:`check_output` refused, worded as
    the ``memsnap`` CLI's ``-o`` (tools/cli_util.c ``cli_check_output``):
    ``'PATH' is a directory`` for a directory, else ``cannot write the
    snapshot PATH: REASON``."""
    why = reason(e)
    if isinstance(e, IsADirectoryError) and why == "it is a directory":
        return f"'{path}' is a directory"
    return f"cannot write the snapshot {path}: {why}"
