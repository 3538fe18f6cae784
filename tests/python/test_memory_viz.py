"""memsnap dumps open in PyTorch's own consumers.

* ``python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot``
  on a memsnap dump succeed.
* MemoryViz.js: if the installed torch ships torch/utils/viz/MemoryViz.js
  (or MEMSNAP_MEMORYVIZ_JS names one), its unpickle function (and the
  unpickle* helpers it calls) is extracted at test time and run under node
  on the dump (nothing of it is copied into the project); otherwise only
  the §2.9 opcode subset is checked (pickletools).
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

from conftest import base_env, run_cli, run_script

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


def test_oom_entry_keyed_addr(dump, tmp_path):
    """An 'oom' entry keyed 'addr' (some hand-written or converted files;
    PyTorch writes the device's free memory as 'device_free'): torch's
    memory_viz trace fails on it with KeyError; memsnap check names the
    entry; convert writes 'device_free', and memory_viz's trace of its
    output is that of the file keyed as PyTorch keys it."""
    with open(dump, "rb") as f:
        data = pickle.load(f)
    trace = data["device_traces"][0]
    n = len(trace)
    oom = dict(trace[-1], action="oom", size=64 << 20)
    oom.pop("addr", None)
    paths = {}
    for name, key in (("torch", "device_free"), ("addr", "addr")):
        trace[n:] = [dict(oom, **{key: 3 << 30})]
        paths[name] = str(tmp_path / f"oom_{name}.pickle")
        with open(paths[name], "wb") as f:
            pickle.dump(data, f, protocol=4)
    p = memory_viz("trace", paths["addr"])
    assert p.returncode != 0 and "KeyError: 'device_free'" in p.stderr
    c = run_cli("check", paths["addr"])
    assert c.returncode == 1
    assert (f"device_traces[0][{n}]: 'oom' entry has 'addr' instead of "
            "'device_free'") in c.stdout
    assert run_cli("check", paths["torch"]).returncode == 0
    conv = str(tmp_path / "oom_conv.pickle")
    c = run_cli("convert", paths["addr"], "-o", conv)
    assert c.returncode == 0 and "written as 'device_free'" in c.stderr
    want = memory_viz("trace", paths["torch"])
    got = memory_viz("trace", conv)
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert "3.0GiB free in CUDA" in got.stdout
    assert got.stdout == want.stdout


def _function_end(src: str, start: int) -> int:
    """Index just past the function body that starts at `start` (skips
    strings, template literals and comments when matching braces)."""
    i = src.index("{", start)
    depth = 0
    while i < len(src):
        ch = src[i]
        if ch in "'\"`":
            i += 1
            while src[i] != ch:
                i += 2 if src[i] == "\\" else 1
        elif src.startswith("//", i):
            i = src.index("\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise AssertionError("unbalanced braces in MemoryViz.js")


def extract_unpickler(src: str) -> str:
    """The text of MemoryViz.js's `unpickle` and of the unpickle* helper
    functions it calls (e.g. unpickleData), nothing else."""
    import re

    wanted, found, todo = set(), {}, ["unpickle"]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        m = re.search(rf"^function {name}\(", src, re.M)
        if m is None:
            raise AssertionError(f"MemoryViz.js has no function {name}")
        body = src[m.start() : _function_end(src, m.start())]
        found[name] = body
        todo += [n for n in re.findall(r"\b(unpickle\w*)\(", body) if n not in wanted]
    return "\n\n".join(found.values())


def _to_json_like(v):
    """What JSON.stringify of the JS unpickler's result reads back as:
    tuples become lists, ints beyond 2**53 become doubles (the viewer
    decodes LONG1 <= 8 bytes to a JS Number)."""
    if isinstance(v, (list, tuple)):
        return [_to_json_like(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_json_like(x) for k, x in v.items()}
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53:
        return float(v)
    return v


def memoryviz_js() -> str | None:
    """MemoryViz.js to check against: MEMSNAP_MEMORYVIZ_JS (e.g. from a
    PyTorch source checkout), else the one the installed torch ships."""
    env = os.environ.get("MEMSNAP_MEMORYVIZ_JS")
    if env:
        assert os.path.exists(env), f"MEMSNAP_MEMORYVIZ_JS={env} does not exist"
        return env
    js = os.path.join(os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js")
    return js if os.path.exists(js) else None


HARNESS = """
import fs from 'fs';
console.log = () => {};  // MemoryViz logs its JSON attempt
const b = fs.readFileSync(process.argv[2]);
const ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
const r = unpickle(ab);
process.stdout.write(JSON.stringify(r, (k, v) => typeof v === 'bigint' ? Number(v) : v));
"""


def test_memoryviz_js_or_opcode_subset(dump, tmp_path):
    with open(dump, "rb") as f:
        raw = f.read()
    used = {op.name for op, _, _ in pickletools.genops(raw)}
    assert used - ALLOWED == set()
    js = memoryviz_js()
    if js is None:
        # This torch wheel ships no MemoryViz.js: the opcode check above is
        # the whole check (the documented fallback).
        return
    node = shutil.which("node")
    assert node, "MemoryViz.js is available but node is not on PATH"
    with open(js, encoding="utf-8") as f:
        code = extract_unpickler(f.read())
    harness = tmp_path / "run.mjs"
    harness.write_text(code + "\n" + HARNESS)
    p = subprocess.run([node, str(harness), dump], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert _to_json_like(json.loads(p.stdout)) == _to_json_like(pickle.loads(raw))


def test_save_segment_and_memory_usage_are_torchs(tmp_path):
    """_save_segment_usage / _save_memory_usage draw with torch's own
    _memory_viz: the file holds what torch.cuda.memory's functions of the
    same names write for the same snapshot (``_segments(snapshot)`` /
    ``_memory(snapshot)``).  torch's format_flamegraph runs flamegraph.pl,
    which it downloads (no network here), so both sides use a stand-in
    that returns the folded stacks it was given: those lines are what the
    comparison is about."""
    out = tmp_path / "ours"
    r = run_script(SCRIPT.replace("PATH", repr(str(tmp_path / "d.pickle"))) + f"""
import json, torch.cuda._memory_viz as viz
folded = lambda lines, flamegraph_script=None: "<folded>\\n" + lines
viz.format_flamegraph = folded
snap = mm._snapshot()
mm._save_segment_usage({str(out) + '_seg.svg'!r}, snapshot=snap)
mm._save_memory_usage({str(out) + '_mem.svg'!r})
# torch.cuda.memory's _save_segment_usage / _save_memory_usage: open, write
for kind, draw in (("seg", viz.segments), ("mem", viz.memory)):
    with open({str(out)!r} + "_" + kind + "_torch.svg", "w") as f:
        f.write(draw(snap, format_flamegraph=folded))
print("RESULT " + json.dumps(sorted(b["requested_size"] for s in snap["segments"]
                                    for b in s["blocks"]
                                    if b["state"] == "active_allocated")))
""")
    sizes = r.result
    for kind in ("seg", "mem"):
        ours = (tmp_path / f"ours_{kind}.svg").read_text()
        theirs = (tmp_path / f"ours_{kind}_torch.svg").read_text()
        assert ours == theirs
        lines = ours.splitlines()[1:]
        # every live allocation is a line ending in its requested size,
        # under work()
        for n in sizes:
            assert any(line.endswith(f" {n}") and "work" in line
                       for line in lines), (n, lines)
