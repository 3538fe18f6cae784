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


ACROSS = r"""
import json, multiprocessing as mp
import memsnap.torch as mt, torch
name = mt.register_device("npu")
torch.npu.memory._record_memory_history()


class DS(torch.utils.data.Dataset):
    # workers make device tensors, as a dataset moving its samples does
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i)).to(name)


ctx = mp.get_context("fork")
dl = torch.utils.data.DataLoader(DS(), batch_size=4, num_workers=2,
                                 multiprocessing_context=ctx, timeout=60)
batches = [[b.device.type, b.cpu().tolist()] for b in dl]


def child(q, done):
    # (as with CPU tensors, the sender lives until the receiver has them:
    # torch shares the CPU copy's memory through the sender)
    p = torch.nn.Parameter(torch.arange(3.0, device=name))
    q.put((p, torch.ones(2, device=name) * 7))
    done.wait(60)


q, done = ctx.Queue(), ctx.Event()
proc = ctx.Process(target=child, args=(q, done))
proc.start()
p, t = q.get(timeout=60)
done.set()
proc.join(60)
from multiprocessing.reduction import ForkingPickler
try:
    ForkingPickler.dumps(p * 2)          # a non-leaf that requires grad
    refusal = "sent"
except RuntimeError as e:
    refusal = "refused: " + str(e)[:40]
print("RESULT " + json.dumps({
    "batches": batches, "exitcode": proc.exitcode,
    "param": [type(p).__name__, p.device.type, p.requires_grad, p.cpu().tolist()],
    "tensor": [t.device.type, t.requires_grad, t.cpu().tolist()],
    "refusal": refusal,
    "allocated": torch.npu.memory_allocated() > 0}))
"""


@pytest.mark.skipif(not _shim_built(), reason="memsnap was built without its C++ torch shim")
def test_device_tensors_cross_processes_by_value(tmp_path):
    """A DataLoader's fork workers return device tensors (torch's own
    reduction cannot share this device's memory: the batch used to be lost
    in the workers' feeder thread and the loader waited forever); a
    Parameter and a tensor cross a multiprocessing queue; a non-leaf that
    requires grad is refused with torch's words."""
    r = run_script(ACROSS, env=base_env(OUT=str(tmp_path)), timeout=300).result
    assert r["batches"] == [["npu", [[0.0] * 4, [1.0] * 4, [2.0] * 4, [3.0] * 4]],
                            ["npu", [[4.0] * 4, [5.0] * 4, [6.0] * 4, [7.0] * 4]]]
    assert r["exitcode"] == 0
    assert r["param"] == ["Parameter", "npu", True, [0.0, 1.0, 2.0]]
    assert r["tensor"] == ["npu", False, [7.0, 7.0]]
    assert r["refusal"].startswith("refused: Cowardly refusing")
    assert r["allocated"]
