"""memsnap dumps open in PyTorch's own consumers.

* ``python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot``
  on a memsnap dump succeed.
* MemoryViz.js: if the installed torch ships torch/utils/viz/MemoryViz.js,
  its unpickle function is extracted at test time and run under node on the
  dump (nothing of it is copied into the project); otherwise only the §2.9
  opcode subset is checked (pickletools).
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys

import pytest

from conftest import base_env, need, run_script

torch = pytest.importorskip("torch")

SCRIPT = r"""
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
def work():
    keep = [mm.caching_allocator_alloc(n) for n in (100, 3000, 5 << 20, 12 << 20)]
    tmp = [mm.caching_allocator_alloc(n) for n in (700, 2 << 20)]
    for p in tmp:
        mm.caching_allocator_delete(p)
    mm._annotate_memory(keep[0], "first")
    return keep
keep = work()
mm._dump_snapshot(PATH)
"""

ALLOWED = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST",
    "EMPTY_TUPLE", "DICT", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "APPEND", "APPENDS", "SETITEM", "SETITEMS", "NONE", "NEWTRUE",
    "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE", "MEMOIZE", "BINPUT", "LONG_BINPUT",
    "BINGET", "LONG_BINGET", "BYTEARRAY8",
}


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    need("record_history", "malloc", "free", "dump_snapshot", "annotate_memory")
    path = str(tmp_path_factory.mktemp("viz") / "memsnap.pickle")
    run_script(SCRIPT.replace("PATH", repr(path)))
    return path


def memory_viz(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def test_memory_viz_stats(dump):
    p = memory_viz("stats", dump)
    assert p.returncode == 0, p.stderr
    assert "total_size" in p.stdout or "Total" in p.stdout or p.stdout


def test_memory_viz_trace(dump):
    p = memory_viz("trace", dump)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("cmd", ["trace_plot", "segment_plot"])
def test_memory_viz_plots(dump, tmp_path, cmd):
    out = tmp_path / f"{cmd}.html"
    p = memory_viz(cmd, dump, "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 1000 and "MemoryViz.js" in out.read_text()


def test_memory_viz_segsum(dump):
    """segsum asserts that block sizes balance (cuda-reference §6.3)."""
    from torch.cuda import _memory_viz

    with open(dump, "rb") as f:
        data = pickle.load(f)
    text = _memory_viz.segsum(data)
    assert "Summary of segments" in text or text


def _extract_js_function(src: str, name: str) -> str:
    start = src.find(f"function {name}(")
    if start < 0:
        raise AssertionError(f"MemoryViz.js has no function {name}")
    depth, i = 0, src.index("{", start)
    while True:
        ch = src[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return src[start : i + 1]
        i += 1


def _to_json_like(v):
    if isinstance(v, (list, tuple)):
        return [_to_json_like(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_json_like(x) for k, x in v.items()}
    return v


def test_memoryviz_js_or_opcode_subset(dump, tmp_path):
    with open(dump, "rb") as f:
        raw = f.read()
    used = {op.name for op, _, _ in pickletools.genops(raw)}
    assert used - ALLOWED == set()
    js = os.path.join(os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js")
    if not os.path.exists(js):
        # This torch wheel ships no MemoryViz.js: the opcode check above is
        # the whole check (documented fallback).
        return
    node = shutil.which("node")
    assert node, "MemoryViz.js is installed but node is not on PATH"
    with open(js, encoding="utf-8") as f:
        fn = _extract_js_function(f.read(), "unpickle")
    harness = tmp_path / "run.mjs"
    harness.write_text(
        fn
        + "\nimport fs from 'fs';\n"
        "const b = fs.readFileSync(process.argv[2]);\n"
        "const ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);\n"
        "const r = unpickle(ab);\n"
        "process.stdout.write(JSON.stringify(r, (k, v) => typeof v === 'bigint' ? Number(v) : v));\n"
    )
    p = subprocess.run([node, str(harness), dump], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == _to_json_like(pickle.loads(raw))
