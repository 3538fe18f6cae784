"""The frame hook: what capture()/resolve() give for Python frames."""

from __future__ import annotations

import sys
import threading

import pytest

from memsnap import _memsnap

# Tokens come from the fast walk over CPython 3.11-3.13's interpreter
# frames; other versions walk the public API and name nothing (token 0).
needs_tokens = pytest.mark.skipif(
    not (3, 11) <= sys.version_info[:2] < (3, 14),
    reason="SKIP: capture tokens need the fast frame walk (CPython 3.11-3.13)")


def inner_function():
    return _memsnap.capture_frames(), sys._getframe().f_lineno - 0


class Holder:
    def method(self):
        return inner_function()


def call_shapes(leaf):
    """Call paths to leaf that differ in caller, line and depth:
    caller_a, caller_b (one depth, two callers), two_sites (one caller,
    two lines, alternating) and rec(n, fn) (fn under n more frames)."""

    def caller_a():
        return leaf()

    def caller_b():
        return leaf()

    def two_sites(first=[True]):
        first[0] = not first[0]
        if first[0]:
            return leaf()
        return leaf()

    def rec(n, fn):
        if n == 0:
            return fn()
        return rec(n - 1, fn)

    return caller_a, caller_b, two_sites, rec


def test_capture_names_files_lines_innermost_first():
    frames, _ = Holder().method()
    names = [f[0] for f in frames]
    assert names[0] == "inner_function"
    # co_name, as torch's frames (not co_qualname, "Holder.method")
    assert names[1] == "method"
    assert names[2].endswith("test_capture_names_files_lines_innermost_first")
    assert all(f[1] == __file__ for f in frames[:3])
    # The line of the capture_frames() call inside inner_function.
    expected = inner_function.__code__.co_firstlineno + 1
    assert frames[0][2] == expected


def test_capture_depth_and_limit():
    def rec(n):
        if n == 0:
            return _memsnap.capture_frames(5), _memsnap.capture_frames(4096)
        return rec(n - 1)

    few, many = rec(30)
    assert len(few) == 5
    assert [f[0] for f in few] == ["rec"] * 5
    assert len(many) >= 31


def test_capture_from_another_thread_sees_that_thread():
    out = []

    def worker_fn():
        out.append(_memsnap.capture_frames())

    t = threading.Thread(target=worker_fn)
    t.start()
    t.join()
    names = [f[0] for f in out[0]]
    assert names[0].endswith("worker_fn")
    # The rest is threading's bootstrap, not this test's frames.
    assert names[1] == "run"
    assert all(f[1].endswith("threading.py") for f in out[0][1:])


def test_code_objects_are_recorded_once():
    def f():
        return _memsnap.capture_frames(1)

    f()
    seen_before, _ = _memsnap.frame_hook_stats()
    for _ in range(100):
        f()
    seen_after, _ = _memsnap.frame_hook_stats()
    assert seen_after == seen_before


def test_bench_capture_reports_depth():
    def rec(n):
        if n == 0:
            return _memsnap.bench_capture(1000, 64)
        return rec(n - 1)

    ns, depth = rec(18)
    assert depth >= 20
    assert ns > 0


def test_fast_walk_equals_public_api():
    """The 3.11 fast walk (interpreter frame records) gives exactly the
    frames of the public API walk (PyEval_GetFrame / PyFrame_GetBack)."""

    def gen():
        yield _memsnap.capture_frames(64), _memsnap.capture_frames(64, True)

    def rec(n):
        if n == 0:
            fast = _memsnap.capture_frames(64)
            slow = _memsnap.capture_frames(64, True)
            in_gen = next(gen())
            return fast, slow, in_gen
        return rec(n - 1)

    fast, slow, (gfast, gslow) = rec(10)
    # Same call site except the line of the capture itself.
    assert [f[:2] for f in fast] == [f[:2] for f in slow]
    assert [f[2] for f in fast[1:]] == [f[2] for f in slow[1:]]
    assert fast[0][2] + 1 == slow[0][2]
    assert gfast[0][:2] == gslow[0][:2] and gfast[1:] == gslow[1:]


def test_fast_walk_through_c_callbacks_and_threads():
    """C -> Python re-entries (sorted's key, a generator, a thread's
    bootstrap) give the same frames in both walks."""
    res = []

    def key(x):
        res.append((_memsnap.capture_frames(), _memsnap.capture_frames(64, True)))
        return x

    def gen():
        yield sorted([1], key=key)

    def worker():
        list(gen())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    sorted([2], key=key)
    assert len(res) == 2
    for fast, slow in res:
        assert [f[:2] for f in fast] == [f[:2] for f in slow]
        assert [f[2] for f in fast[1:]] == [f[2] for f in slow[1:]]
    names = [f[0].rsplit(".", 1)[-1] for f in res[0][0]]
    assert names[:4] == ["key", "gen", "worker", "run"]


def test_repeated_walks_follow_every_change():
    """The fast walk remembers the previous walk frame by frame (code,
    instruction, owner): each capture still gives exactly the current
    frames when the same code runs from other callers, at other lines, at
    other depths, and after a file is hidden."""

    def leaf():
        return _memsnap.capture_frames(64), _memsnap.capture_frames(64, True)

    caller_a, caller_b, two_sites, rec = call_shapes(leaf)

    seen = []
    for i in range(60):
        fn = (caller_a, caller_b, two_sites)[i % 3]
        seen.append((rec(i % 5 + 3, fn), fn.__name__, i % 5 + 3))
    for (fast, slow), name, depth in seen:
        assert [f[:2] for f in fast] == [f[:2] for f in slow]
        assert [f[2] for f in fast[1:]] == [f[2] for f in slow[1:]]
        names = [f[0].rsplit(".", 1)[-1] for f in fast]
        assert names[:2] == ["leaf", name]
        assert names[2:3 + depth] == ["rec"] * (depth + 1)
    assert seen[0][0][0] != seen[1][0][0]
    lines = {fast[1][2] for (fast, _), name, _ in seen if name == "two_sites"}
    assert len(lines) == 2

    # Code compiled under a file name that gets hidden after the walks
    # have seen (and remembered) its frames.
    ns = {"leaf": leaf}
    src = "def hideme():\n    return leaf()\n"
    fake = "/memsnap-test-hidden-%d/frames_hidden.py" % id(ns)
    exec(compile(src, fake, "exec"), ns)
    before = []
    for _ in range(3):
        before.append(rec(2, ns["hideme"])[0])
    assert all(any(f[1] == fake for f in b) for b in before)
    _memsnap.hide_frames_of(fake)
    after, public = rec(2, ns["hideme"])
    assert not any(f[1] == fake for f in after)
    assert [f[0] for f in after] == [f[0] for f in before[-1] if f[1] != fake]
    assert [f[:2] for f in after] == [f[:2] for f in public]


@needs_tokens
def test_token_walk_names_exactly_the_current_frames():
    """capture_token (the path the library takes) checks a remembered
    whole walk frame by frame: whatever changes -- caller, line, depth,
    a generator frame, a file hidden after it was remembered -- the frames
    are the public API's, and one token always stands for one list."""

    def leaf():
        got = _memsnap.capture_frames(64, False, True)
        return got, _memsnap.capture_frames(64, True)

    caller_a, caller_b, two_sites, rec = call_shapes(leaf)

    def from_generator():
        def gen():
            yield leaf()
            yield leaf()
        return list(gen())[len(seen) % 2]

    by_token = {}
    seen = []
    fns = (caller_a, caller_b, two_sites, from_generator)
    for i in range(120):
        fn = fns[i % 4]
        depth = i % 5 + 3
        (fast, token), slow = rec(depth, fn)
        seen.append((fast, token))
        assert [f[:2] for f in fast] == [f[:2] for f in slow]
        assert [f[2] for f in fast[1:]] == [f[2] for f in slow[1:]]
        names = [f[0].rsplit(".", 1)[-1] for f in fast]
        assert names[0] == "leaf"
        assert "rec" in names
        assert token != 0
        assert by_token.setdefault(token, fast) == fast

    def same():
        return [rec(4, lambda: _memsnap.capture_frames(64, False, True))
                for _ in range(5)]

    # the same chain again and again: one token, taken from the record
    runs = same()
    assert len({t for _, t in runs}) == 1
    assert all(f == runs[0][0] for f, _ in runs)

    # a file hidden after its frames were remembered: a new token, and
    # the frames without it
    ns = {"leaf": leaf}
    fake = "/memsnap-test-hidden-tok-%d/frames_hidden.py" % id(ns)
    exec(compile("def hideme():\n    return leaf()\n", fake, "exec"), ns)
    before = [rec(2, ns["hideme"])[0] for _ in range(3)]
    assert len({t for _, t in before}) == 1
    assert any(f[1] == fake for f in before[0][0])
    _memsnap.hide_frames_of(fake)
    (after, token), public = rec(2, ns["hideme"])
    assert token != before[0][1]
    assert not any(f[1] == fake for f in after)
    assert [f[:2] for f in after] == [f[:2] for f in public]


@needs_tokens
def test_token_walk_in_other_threads():
    """Each thread's chain is its own: tokens never cross-name frames."""
    out = {}

    def worker(k):
        def site():
            return _memsnap.capture_frames(64, False, True)

        def a():
            return site()

        def b():
            return site()

        out[k] = [(a if i % 2 else b)() for i in range(50)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_token = {}
    for k, runs in out.items():
        for fast, token in runs:
            assert fast[1][0].rsplit(".", 1)[-1] in ("a", "b")
            assert by_token.setdefault(token, fast) == fast


def test_recorded_stacks_follow_alternating_sites():
    """Through the allocator: a loop that allocates and frees from two
    lines and two callers records, entry by entry, the line and caller
    that made each call (the token path with its per-thread stack cache)."""
    from conftest import run_script
    proc = run_script(r"""
import json, sys
import memsnap.memory as mm
mm._record_memory_history('all', stacks='python')
def site(n):
    p = mm.caching_allocator_alloc(n)          # ALLOC
    mm.caching_allocator_delete(p)             # FREE
def from_a(n):
    site(n)
def from_b(n):
    site(n)
expect = []
for i in range(200):
    (from_a if i % 3 else from_b)(512 << (i % 4))
    expect.append('from_a' if i % 3 else 'from_b')
snap = mm._snapshot()
src = open(__file__).read().splitlines() if False else None
got = []
for tr in snap['device_traces']:
    for e in tr:
        if e['action'] in ('alloc', 'free_requested'):
            fr = e['frames']
            got.append((e['action'], fr[0]['name'], fr[0]['line'],
                        fr[1]['name']))
print('RESULT ' + json.dumps({'got': got, 'expect': expect}))
""")
    got, expect = proc.result["got"], proc.result["expect"]
    allocs = [g for g in got if g[0] == "alloc"]
    frees = [g for g in got if g[0] == "free_requested"]
    assert len(allocs) == len(frees) == 200
    assert {g[2] for g in allocs} == {allocs[0][2]}
    assert {g[2] for g in frees} == {allocs[0][2] + 1}
    assert [g[3] for g in allocs] == expect
    assert [g[3] for g in frees] == expect
    assert all(g[1] == "site" for g in got)
