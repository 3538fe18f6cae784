"""memsnap.predict._snapshot -- the prediction's snapshot, as a user sees it.

The allocator records the interpreter stack of every allocation; during a
prediction the innermost frames are memsnap.predict's own (the dispatch
mode that turned the storage into an allocation, and the dynamo-disable
wrappers torch puts around a Python mode) and the outermost ones are the
runner's (``python -m memsnap.predict``, runpy).  They say
nothing about the user's program, so they are removed from every frame
list: the innermost frame of an entry is then torch's or the user's, as in
a snapshot recorded on the device.  Everything else is the allocator's
snapshot unchanged.

The file is a pickle (protocol 4, as ``torch.cuda.memory._dump_snapshot``
writes) made next to its final name and renamed into place: a failed
write never leaves a truncated file, and an existing link at the path is
replaced, never written through.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile

import memsnap

_OWN = os.path.realpath(os.path.dirname(memsnap.__file__)) + os.sep
_OWN_INSTALLED = os.path.dirname(os.path.abspath(memsnap.__file__)) + os.sep
_PREDICT = os.path.realpath(os.path.dirname(__file__)) + os.sep


# torch wraps every __torch_function__/__torch_dispatch__ of a Python mode
# in these (dynamo-disable wrappers): innermost frames that exist only
# because the prediction runs as a mode.
_WRAPPERS = (os.sep + os.path.join("torch", "_dynamo", "eval_frame.py"),
             os.sep + os.path.join("torch", "_compile.py"))


def _ours(filename: str) -> bool:
    return (filename.startswith(("<frozen runpy>",)) or filename.startswith(_OWN)
            or filename.startswith(_OWN_INSTALLED) or filename.startswith(_PREDICT))


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
            r = r[i:]
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
    """Write ``snapshot`` to ``path`` atomically (see the module docstring).

    Raises:
        OSError: the directory is not writable (the message names the file).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".memsnap-predict-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
