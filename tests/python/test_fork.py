"""Fork safety from Python (src/fork.c): a process forks 40 times while
three threads allocate tensors on the memsnap device, record (history with
Python stacks, record_stream, annotations) and dump snapshots.  Every child
allocates, computes, takes a snapshot and exits; none may hang.  The C
suite (tests/stress/test_fork.c) does the same with native threads and
checks the "bad fork" state of real runtimes."""

from __future__ import annotations

import os

import pytest

from conftest import base_env, run_script

torch = pytest.importorskip("torch")


def _shim_built() -> bool:
    import memsnap._shim as s

    return os.path.exists(s.path(s.TORCH_LIB))


SCRIPT = r"""
import json, os, threading, time, signal
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
mm._record_memory_history("all", stacks="python", max_entries=5000)
stop = threading.Event()
ops = [0, 0, 0]
dump = os.path.join(os.environ["OUT"], "parent.pickle")

def allocating():
    live = []
    while not stop.is_set():
        live.append(torch.empty(int(1000 + 4096 * (ops[0] % 37)), device="npu"))
        if len(live) > 20:
            del live[: len(live) // 2]
        ops[0] += 1

def recording():
    s = torch.Stream(device="npu")
    while not stop.is_set():
        t = torch.ones(256, device="npu")
        t.record_stream(s)
        mm._annotate_memory(t.data_ptr(), "fork-test")
        del t
        ops[1] += 1

def dumping():
    while not stop.is_set():
        mm._dump_snapshot(dump)
        mm.memory_stats()
        ops[2] += 1

threads = [threading.Thread(target=f) for f in (allocating, recording, dumping)]
for t in threads:
    t.start()
hangs = failures = 0
for n in range(40):
    time.sleep(0.002 + (n % 7) * 0.001)
    pid = os.fork()
    if pid == 0:
        try:
            x = torch.arange(100, dtype=torch.float32, device="npu")
            ok = (x * 2).sum().item() == 9900.0
            snap = mm._snapshot()
            ok = ok and mm.memory_allocated() > 0 and len(snap["segments"]) > 0
            mm._dump_snapshot(os.path.join(os.environ["OUT"], f"child{n}.pickle"))
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    deadline = time.monotonic() + 30
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                failures += 1
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hangs += 1
            break
        time.sleep(0.005)
stop.set()
for t in threads:
    t.join()
children = len([f for f in os.listdir(os.environ["OUT"]) if f.startswith("child")])
print("RESULT " + json.dumps({"hangs": hangs, "failures": failures, "ops": ops,
                              "children": children, "bad_fork": torch.npu._is_in_bad_fork()}))
"""


@pytest.mark.skipif(not _shim_built(), reason="memsnap was built without its C++ torch shim")
def test_forty_forks_while_threads_allocate_record_and_dump(tmp_path):
    r = run_script(SCRIPT, env=base_env(OUT=str(tmp_path)), timeout=600).result
    assert r["hangs"] == 0
    assert r["failures"] == 0
    assert r["children"] == 40
    assert all(n > 0 for n in r["ops"]), r["ops"]
    assert r["bad_fork"] is False  # the sim runtime goes on in children
