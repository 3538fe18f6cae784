"""memsnap.predict._frames -- which frames are the user's.

A frame is the user's when its file is not part of the Python installation
(the standard library, site-packages / dist-packages of any environment),
of torch or of memsnap (the directories the allocator's own frame hook
hides: ``memsnap._OWN_DIRS``), and is a real file (not ``<frozen ...>`` or
``<string>``) or ``<stdin>`` (a script read from standard input:
``python -m memsnap.predict -``, or ``python -`` around a predict block).  A model library installed into site-packages is therefore
not "user" code: its allocations are attributed to the line of the user's
script that called into it.  Results are cached per file name.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

import memsnap


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p))
    for p in sys.path:
        if p and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            roots.add(os.path.realpath(p))
    roots.add(os.path.realpath(os.path.dirname(torch.__file__)))
    # memsnap's own files: the directories whose frames the allocator's
    # stacks never hold (memsnap/__init__.py, _memsnap.hide_frames_under)
    for d in memsnap._OWN_DIRS:
        roots.add(os.path.realpath(d))
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


_ROOTS = _library_roots()
_cache: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    r = _cache.get(filename)
    if r is None:
        if filename == "<stdin>":
            r = True
        elif not filename or filename.startswith("<"):
            r = False
        else:
            real = os.path.realpath(filename)
            r = not any(real.startswith(root) for root in _ROOTS)
        _cache[filename] = r
    return r


def user_frames(frames: list) -> list:
    """The user's frames of a snapshot frame list (dicts with filename,
    line, name), innermost first."""
    return [f for f in frames if is_user_file(f.get("filename", ""))]


def user_stack_now(skip: int = 1) -> list:
    """The calling thread's user frames as snapshot-style dicts, innermost
    first."""
    out = []
    f = sys._getframe(skip)
    while f is not None:
        code = f.f_code
        if is_user_file(code.co_filename):
            name = code.co_name  # as the allocator's frames (and torch's)
            out.append({"filename": code.co_filename, "line": f.f_lineno, "name": name})
        f = f.f_back
    return out


def site(frame: dict | None) -> str:
    """``file:line in name`` of a frame dict ("<no user frame>" for None);
    the file relative to the current directory when it lies below it."""
    if not frame:
        return "<no user frame>"
    name = frame["filename"]
    try:
        rel = os.path.relpath(name)
        if not rel.startswith(os.pardir):
            name = rel
    except ValueError:  # another drive
        pass
    return f"{name}:{frame['line']} in {frame['name']}"
