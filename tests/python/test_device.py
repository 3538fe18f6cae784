"""memsnap.torch.register_device: a memsnap device in the CPU-only torch of
the test venv, through PyTorch's PrivateUse1 mechanism and the C++ shim
(python/memsnap/csrc/device.cpp).  Every scenario runs in a fresh process
(torch's PrivateUse1 name and memsnap's allocator are per process), with
real torch tensors and torch.nn modules."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import base_env, run_script

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _shim_built() -> bool:
    import memsnap._shim as s

    return os.path.exists(s.path(s.TORCH_LIB))


pytestmark = pytest.mark.skipif(not _shim_built(),
                                reason="memsnap was built without its C++ torch shim")


def test_must_show_1_allocation_free_and_device_module():
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
name = mt.register_device("npu")
mm._record_memory_history("all", stacks="python")
before = mm.memory_allocated()
t = torch.empty(1 << 20, dtype=torch.uint8, device=name)  # LINE-EMPTY
grew = mm.memory_allocated() - before
snap = mm._snapshot()
allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
dev_mod = getattr(torch, name)
same = dev_mod.memory_allocated() == mm.memory_allocated()
ptr = t.data_ptr()
del t
acts = [(e["action"], e["addr"]) for e in mm._snapshot()["device_traces"][0]]
print("RESULT " + json.dumps({
    "name": name, "grew": grew, "frames": allocs[-1]["frames"], "addr": allocs[-1]["addr"],
    "ptr": ptr, "acts": acts, "same": same, "after": mm.memory_allocated(),
    "device": str(torch.empty(1, device=name).device),
    "mod": dev_mod.__name__, "count": dev_mod.device_count(),
    "reserved": dev_mod.memory_reserved() == mm.memory_reserved(),
    "stats": dev_mod.memory_stats()["allocated_bytes.all.current"] == mm.memory_allocated(),
    "history_fn": dev_mod.memory._record_memory_history is mm._record_memory_history,
}))
"""
    line = next(i for i, l in enumerate(code.splitlines(), 1) if "LINE-EMPTY" in l)
    r = run_script(code).result
    assert r["name"] == "npu" and r["device"] == "npu:0"
    assert r["grew"] >= 1 << 20
    top = r["frames"][0]
    assert top["filename"] == "<string>" and top["line"] == line
    assert not any("memsnap" in f["filename"] for f in r["frames"])
    assert r["addr"] == r["ptr"]
    tail = [a for a in r["acts"] if a[1] == r["ptr"]][-2:]
    assert [a[0] for a in tail] == ["free_requested", "free_completed"]
    assert r["same"] and r["reserved"] and r["stats"] and r["history_fn"]
    assert r["mod"] == "memsnap._device" and r["count"] == 1


def test_must_show_2_oom_raises_torch_oom_and_dumps(tmp_path):
    code = r"""
import json, glob, os
import memsnap.torch as mt, torch
mt.register_device("npu")
keep = torch.empty(48 << 20, dtype=torch.uint8, device="npu")
out = {}
try:
    torch.empty(40 << 20, dtype=torch.uint8, device="npu")
except torch.OutOfMemoryError as e:
    out["msg"] = str(e)
    out["is_cuda_oom"] = isinstance(e, torch.cuda.OutOfMemoryError)
x = torch.arange(1000, dtype=torch.float32).to("npu")
out["sum"] = (x * 2).sum().item()
out["dumps"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(os.environ["OOM_SNAPSHOT_PATH"], "*")))
print("RESULT " + json.dumps(out))
"""
    # MEMSNAP_USAGE_REPORT=memsnap: the sim has no CANN per-module report,
    # so the dump's CSV is memsnap's own allocator-stats one.
    env = base_env(MEMSNAP_SIM_MEMORY="64M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(tmp_path), MEMSNAP_USAGE_REPORT="memsnap")
    r = run_script(code, env=env).result
    # torch_npu rounds the request up to its 2 MiB segment granularity.
    assert re.match(r"^NPU out of memory\. Tried to allocate 4\d\.\d\d MiB", r["msg"]), r["msg"]
    assert r["is_cuda_oom"]  # torch.cuda.OutOfMemoryError is the same class
    assert r["sum"] == 999000.0  # the process goes on working
    pickles = [p for p in r["dumps"] if p.endswith(".pickle")]
    assert len(pickles) == 1 and any(p.endswith(".csv") for p in r["dumps"])
    memsnap_cli = os.path.join(os.path.dirname(sys.executable), "memsnap")
    chk = subprocess.run([memsnap_cli, "check", str(tmp_path / pickles[0])],
                         capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr


def test_must_show_3_linear_model_trains_and_unsupported_ops_say_so():
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
name = mt.register_device("npu")
torch.manual_seed(0)
cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
model.load_state_dict(cpu_model.state_dict())
model = model.to(name)
params_on_device = all(p.device.type == name for p in model.parameters())
x, y = torch.randn(32, 8), torch.randn(32, 4)
xd, yd = x.to(name), y.to(name)
opt_d = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
opt_c = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)
losses = []
for step in range(5):
    for m, opt, a, b in ((model, opt_d, xd, yd), (cpu_model, opt_c, x, y)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(a), b)
        loss.backward()
        opt.step()
    losses.append(loss.item())
diff = max((p.detach().cpu() - q.detach()).abs().max().item()
           for p, q in zip(model.parameters(), cpu_model.parameters()))
out = {"on_device": params_on_device, "losses": losses, "diff": diff,
       "allocated": mm.memory_allocated() > 0}
try:
    torch.linalg.svd(xd)
except NotImplementedError as e:
    out["err"] = str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["on_device"] and r["allocated"]
    assert r["losses"][-1] < r["losses"][0]
    # The same update as on the CPU (the operators run there, on the bytes).
    assert r["diff"] < 1e-5
    assert re.match(r"operator aten::\S+ is not implemented for the memsnap device 'npu'",
                    r["err"]), r["err"]


def test_views_resize_gc_copies_and_streams():
    code = r"""
import gc, json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
mm._record_memory_history("all", stacks="python")
data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
d = data.to("npu")
roundtrip = torch.equal(d.cpu(), data)
v = d[100:200].view(10, 10).t()
view_ok = torch.equal(v.cpu(), data[100:200].view(10, 10).t())
n_alloc = len([e for e in mm._snapshot()["device_traces"][0] if e["action"] == "alloc"])
a = torch.ones(4, device="npu")
a.resize_(5000)
resized = a[:4].cpu().tolist()
class Cycle: pass
c = Cycle(); c.me = c; c.t = torch.empty(7000, device="npu"); ptr = c.t.data_ptr()
del c; gc.collect()
freed = [e["action"] for e in mm._snapshot()["device_traces"][0] if e["addr"] == ptr][-2:]
s = torch.Stream(device="npu")
d.record_stream(s)
x = torch.arange(6.0).npu()   # torch's generated Tensor.npu(): no wrapper frame
frames = [e["frames"] for e in mm._snapshot()["device_traces"][0] if e["action"] == "alloc"][-1]
ev = torch.Event(device="npu"); ev.record(); ev.synchronize()
print("RESULT " + json.dumps({
    "roundtrip": roundtrip, "view_ok": view_ok, "views_allocate": n_alloc, "resized": resized,
    "freed": freed, "stream": [s.device_index, s.stream_id], "is_npu": x.is_npu,
    "top": frames[0], "event": ev.query(),
}))
"""
    r = run_script(code).result
    assert r["roundtrip"] and r["view_ok"]
    assert r["views_allocate"] == 1  # views share the storage
    assert r["resized"] == [1.0, 1.0, 1.0, 1.0]
    assert r["freed"] == ["free_requested", "free_completed"]
    assert r["stream"][0] == 0 and r["stream"][1] > 0
    assert r["is_npu"] and r["event"]
    assert r["top"]["filename"] == "<string>"


def test_pinned_host_memory_and_dataloader_pin_memory():
    """tensor.pin_memory(), torch.empty(pin_memory=True) and a DataLoader
    with pin_memory=True feeding an nn.Linear on the device: the pinned
    buffers are blocks of memsnap's pinned host caching allocator (its
    host_memory_stats, host_segments/host_traces), is_pinned() is true for
    them only, and a freed block is cached and reused."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
mt.register_device("npu")
mm._record_memory_history("all", record_pinned_host_memory=True)
s0 = mm.host_memory_stats()
x = torch.arange(1000.0)
p = x.pin_memory()
first = [x.is_pinned(), p.is_pinned(), torch.equal(p, x), p.device.type]
s1 = mm.host_memory_stats()
e = torch.empty(100, pin_memory=True)
empty_pinned = e.is_pinned()
del p, e
torch.manual_seed(0)
ds = TensorDataset(torch.randn(64, 32), torch.randint(0, 10, (64,)))
model = torch.nn.Linear(32, 10).to("npu")
pinned = []
for xb, yb in DataLoader(ds, batch_size=16, pin_memory=True):
    pinned.append([xb.is_pinned(), yb.is_pinned()])
    loss = F.cross_entropy(model(xb.to("npu", non_blocking=True)), yb.to("npu", non_blocking=True))
    loss.backward()
s2 = mm.host_memory_stats()
snap = mm._snapshot()
print("RESULT " + json.dumps({
    "first": first, "empty_pinned": empty_pinned, "pinned": pinned,
    "s0": s0["allocations.current"], "s1": [s1["allocations.current"], s1["active_bytes.current"]],
    "s2": [s2["allocations.current"], s2["num_host_alloc"], s2["active_requests.allocated"],
           s2["active_bytes.current"]],
    "segments": len(snap["host_segments"]),
    "actions": sorted({t["action"] for t in snap["host_traces"]}),
    "grad": model.weight.grad is not None and model.weight.grad.device.type,
}))
"""
    r = run_script(code).result
    assert r["first"] == [False, True, True, "cpu"]
    assert r["empty_pinned"]
    assert r["s0"] == 0
    assert r["s1"][0] == 1 and r["s1"][1] >= 4000  # 4000 B rounded up to a power of two
    # Four batches of two tensors each, plus the two blocks above: requests
    # that a cached block serves need no new runtime allocation.
    assert r["pinned"] == [[True, True]] * 4
    assert r["s2"][2] == 2 + 8
    assert r["s2"][1] < r["s2"][2]
    assert r["segments"] >= 1 and "alloc" in r["actions"] and "free_requested" in r["actions"]
    assert r["grad"] == "npu"


def test_two_devices_and_device_arguments():
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
t1 = torch.empty(1 << 20, dtype=torch.uint8, device="npu:1")
torch.npu.set_device(1)
t2 = torch.empty(1 << 10, device="npu")
out = {"d1": mm.memory_allocated("npu:1"), "d0": mm.memory_allocated(0),
       "current": torch.npu.current_device(), "t2": str(t2.device),
       "count": torch.npu.device_count()}
try:
    torch.npu.set_device(5)
except ValueError as e:
    out["bad"] = str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_DEVICES="2")).result
    assert r["count"] == 2 and r["current"] == 1 and r["t2"] == "npu:1"
    assert r["d1"] >= (1 << 20) + (1 << 12) and r["d0"] == 0
    assert "invalid device index 5" in r["bad"]


def test_operators_refuse_tensors_of_two_devices():
    """An operator given tensors of two devices raises torch's error, as a
    CUDA kernel does (the generated wrappers' common device check,
    c10::impl::check_and_update_common_device); a 0-dim CPU tensor (a
    scalar), CPU indices and copies between devices stay allowed."""
    code = r"""
import json
import memsnap.torch as mt, torch
import torch.nn.functional as F
mt.register_device("npu")
a = torch.randn(4, 4, device="npu:0")
b = torch.randn(4, 4, device="npu:1")
cases = {
    "matmul_cpu": lambda: a @ torch.randn(4, 4),
    "linear_cpu_weight": lambda: F.linear(a, torch.randn(3, 4)),
    "model_cpu_input": lambda: torch.nn.Linear(4, 2).to("npu")(torch.randn(3, 4)),
    "cat_mixed": lambda: torch.cat([a, torch.randn(4, 4)]),
    "mse_cpu_target": lambda: F.mse_loss(a, torch.randn(4, 4)),
    "matmul_npu1": lambda: b @ a,
    "model_npu1_input": lambda: torch.nn.Linear(4, 2).to("npu:0")(b),
    "conv_npu1_weight": lambda: F.conv2d(torch.randn(1, 1, 4, 4, device="npu:0"),
                                         torch.randn(1, 1, 3, 3, device="npu:1")),
    # a CPU input to a device layer whose CPU path the device does not
    # compute (_slow_conv2d_forward): the device error, not "not implemented"
    "conv_cpu_input": lambda: torch.nn.Conv2d(1, 1, 3).to("npu")(torch.randn(1, 1, 5, 5)),
    "scalar_cpu": lambda: a * torch.tensor(2.0),
    "index_cpu": lambda: a[torch.tensor([0, 2])],
    "index_put_cpu_indices": lambda: a.clone().index_put_(
        (torch.tensor([0, 2]),), torch.zeros(2, 4, device="npu:0")),
    "copy_cpu": lambda: a.clone().copy_(torch.ones(4, 4)),
    "to_npu1": lambda: a.to("npu:1"),
}
out = {}
for k, f in cases.items():
    try:
        r = f()
        out[k] = "ok " + str(r.device)
    except RuntimeError as e:
        out[k] = "error " + str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_DEVICES="2")).result
    refused = ["matmul_cpu", "linear_cpu_weight", "model_cpu_input",
               "cat_mixed", "mse_cpu_target", "matmul_npu1",
               "model_npu1_input", "conv_npu1_weight", "conv_cpu_input"]
    for k in refused:
        assert r[k].startswith("error Expected all tensors to be on the same "
                               "device"), (k, r[k])
    assert "npu:0" in r["matmul_cpu"] and "cpu" in r["matmul_cpu"]
    assert "npu:1" in r["matmul_npu1"] and "npu:0" in r["matmul_npu1"]
    assert r["scalar_cpu"] == r["index_cpu"] == "ok npu:0", r
    assert r["index_put_cpu_indices"] == r["copy_cpu"] == "ok npu:0", r
    assert r["to_npu1"] == "ok npu:1", r


def test_copies_keep_the_conjugate_and_negative_bits():
    """A lazy conj() / neg view copied to, from or within the device gives
    the resolved values (the math-bit fallbacks recursed without end
    through _copy_from: a segmentation fault in a complex gradient)."""
    code = r"""
import json
import memsnap.torch as mt, torch
d = mt.register_device("npu")
z = torch.randn(5, dtype=torch.complex64)
zd = z.to(d)
want = z.conj().resolve_conj()
e = torch.empty(5, dtype=torch.complex64, device=d)
e.copy_(z.conj())
w = torch.randn(5, dtype=torch.complex64, device=d, requires_grad=True)
(w * zd).abs().sum().backward()
wc = w.detach().cpu().requires_grad_()
(wc * z).abs().sum().backward()
out = {"to_cpu": torch.equal(zd.conj().cpu(), want),
       "resolve": torch.equal(zd.conj().resolve_conj().cpu(), want),
       "from_cpu": torch.equal(e.cpu(), want),
       "neg": torch.equal(zd._neg_view().cpu(), -z),
       "grad": torch.allclose(w.grad.cpu(), wc.grad)}
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert all(r.values()), r


def test_device_argument_of_another_type_is_refused():
    """After register_device('npu'), memsnap.memory's device arguments are
    npu's, as torch.cuda's are cuda's: 'cuda' (str or torch.device) raises
    ValueError -- it used to answer with the npu's figures -- with the
    message torch's _get_device_index gives for a device of the wrong type;
    ints, None, npu devices and 'privateuseone' (torch.device's name of
    the renamed device) give the npu's figures; '' is refused in torch's
    words."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
from torch.cuda._utils import _get_device_index
def empty(f):
    try:
        f("")
    except (ValueError, RuntimeError) as e:
        return [type(e).__name__, str(e)]
out = {"ok": {}, "refused": {}, "torch": {},
       "empty": [empty(mm.memory_allocated), empty(torch.device)]}
name = mt.register_device("npu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 8)).to(name)
opt = torch.optim.Adam(model.parameters())
x = torch.randn(16, 64).to(name)
loss = model(x).square().mean()
loss.backward()
opt.step()
out["empty"] += [empty(mm.memory_allocated), empty(torch.device)]
# torch.device takes 'privateuseone' as the renamed device: so does memsnap
out["pu1"] = str(torch.device("privateuseone:0"))
for d in (0, None, "npu", "npu:0", "0", torch.device("npu", 0),
          torch.device("npu"), "privateuseone", "privateuseone:0"):
    out["ok"][repr(d)] = mm.memory_allocated(d)
for d in ("cuda", "cuda:0", torch.device("cuda", 0), torch.device("cpu")):
    for f in (mm.memory_allocated, mm.memory_stats, mm.reset_peak_memory_stats):
        try:
            f(d)
            out["refused"][repr(d) + " " + f.__name__] = [str(d), None]
        except ValueError as e:
            out["refused"][repr(d) + " " + f.__name__] = [str(d), str(e)]
# torch's own refusal of a device whose type is not its own
for d in ("npu", torch.device("npu", 0)):
    try:
        _get_device_index(d)
    except ValueError as e:
        out["torch"][repr(d)] = str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    figures = set(r["ok"].values())
    assert len(figures) == 1 and figures.pop() > 256 * 64 * 4, r["ok"]
    assert len(r["ok"]) == 9 and r["pu1"] == "npu:0", r
    # '' in torch's words, before and after register_device (ValueError,
    # memsnap's class for a bad device argument)
    assert r["empty"] == [["ValueError", "Device string must not be empty"],
                          ["RuntimeError", "Device string must not be empty"]] * 2, r
    assert len(r["refused"]) == 12
    for k, (d, msg) in r["refused"].items():
        assert msg == "Expected a npu device, but got: " + d, (k, msg)
    # the same message as torch's, the types swapped
    assert r["torch"] == {"'npu'": "Expected a cuda device, but got: npu",
                          "device(type='npu', index=0)":
                              "Expected a cuda device, but got: npu:0"}, r["torch"]


def test_torch_accelerator_memory_api_is_memsnaps():
    """torch.accelerator's memory functions (torch 2.9+, device-generic
    code) reach the device's allocator through c10::getDeviceAllocator and
    the pinned allocator through at::getHostAllocator: the same figures as
    memsnap.memory, resets and empty_cache act on memsnap's allocator, and
    empty_host_cache with a device tensor and a cached pinned block
    returns the block (it dereferenced a null host allocator before)."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
acc = torch.accelerator
m = torch.nn.Linear(64, 32).to("npu")
x = torch.randn(8, 64, device="npu")
m(x).sum().backward()
tmp = torch.empty(3 << 20, dtype=torch.uint8, device="npu")
del tmp
st, ms = acc.memory_stats(), mm.memory_stats()
keys = ["allocated_bytes.all.current", "allocated_bytes.all.peak",
        "reserved_bytes.all.current", "active_bytes.all.current",
        "requested_bytes.all.current", "segment.all.current",
        "allocation.all.allocated", "num_device_alloc"]
out = {"same": {k: [st[k], ms[k]] for k in keys},
       "allocated": [acc.memory_allocated(), mm.memory_allocated()],
       "reserved": [acc.memory_reserved(), mm.memory_reserved()],
       "max_allocated": [acc.max_memory_allocated(), mm.max_memory_allocated()],
       "info": [list(acc.get_memory_info()), list(mm.mem_get_info())]}
acc.reset_peak_memory_stats()
out["peak_after_reset"] = [mm.max_memory_allocated(), mm.memory_allocated()]
acc.reset_accumulated_memory_stats()
out["alloc_count_after_reset"] = mm.memory_stats()["allocation.all.allocated"]
before = mm.memory_reserved()
acc.empty_cache()
out["reserved_empty"] = [before, mm.memory_reserved(), acc.memory_reserved()]
p = torch.ones(1000).pin_memory()
del p
h0 = mm.host_memory_stats()["allocations.current"]
acc.empty_host_cache()
out["host"] = [h0, mm.host_memory_stats()["allocations.current"]]
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    for k, (a, b) in r["same"].items():
        assert a == b, k
    assert r["same"]["allocated_bytes.all.current"][0] > 0
    assert r["allocated"][0] == r["allocated"][1] > 0
    assert r["reserved"][0] == r["reserved"][1] >= r["allocated"][0]
    assert r["max_allocated"][0] == r["max_allocated"][1] >= (3 << 20)
    assert r["info"][0] == r["info"][1]
    assert r["peak_after_reset"][0] == r["peak_after_reset"][1]
    assert r["alloc_count_after_reset"] == 0
    before, after, acc_after = r["reserved_empty"]
    assert after < before and after == acc_after
    assert r["host"] == [1, 0]


def test_storage_resize_stays_on_its_device():
    """A storage of npu:1 resized while the current device is 0 (an out=
    argument's resize, FSDP-style storage resize_) is reallocated on
    npu:1, and resized to 0 keeps its device, as resize_bytes_cuda."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
x = torch.ones(1000, device="npu:1")
s = x.untyped_storage()
out = {"start": [mm.memory_allocated(0), mm.memory_allocated(1)]}
s.resize_(0)
out["zero"] = [str(s.device), mm.memory_allocated(0), mm.memory_allocated(1)]
s.resize_(80000)
out["grown"] = [str(s.device), str(x.device), mm.memory_allocated(0),
                mm.memory_allocated(1)]
y = torch.ones(10, device="npu:1")
y.untyped_storage().resize_(80000)
o = torch.empty(0, device="npu:1")
torch.add(torch.ones(5000, device="npu:1"), 1, out=o)
out["out"] = [str(o.untyped_storage().device), mm.memory_allocated(0),
              o.sum().item()]
out["segments"] = sorted({g["device"] for g in mm.memory_snapshot()})
print("RESULT " + json.dumps(out))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_DEVICES="2")).result
    assert r["start"] == [0, 4096]
    assert r["zero"] == ["npu:1", 0, 0]
    assert r["grown"][:2] == ["npu:1", "npu:1"] and r["grown"][2] == 0
    assert r["grown"][3] >= 80000
    assert r["out"] == ["npu:1", 0, 10000.0]
    assert r["segments"] == [1]


def test_device_module_streams_events_and_properties():
    """torch.<name> has torch.cuda's / torch_npu.npu's stream, event,
    property and RNG functions: Stream/Event are torch's generic classes
    on this device, current/default/set_stream and the stream context
    reach the shim's per-thread current stream, and an allocation inside
    `with torch.npu.stream(s)` is recorded on that stream."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
m = torch.npu
mm._record_memory_history("all", stacks="python")
s = m.Stream()
out = {"types": [type(s).__name__, str(s.device), m.Event is torch.Event],
       "default": [m.current_stream().stream_id, m.default_stream().stream_id]}
with m.stream(s):
    out["inside"] = m.current_stream() == s
    y = torch.ones(1000, device="npu")
out["after"] = m.current_stream().stream_id
m.set_stream(s)
out["set"] = m.current_stream() == s
m.set_stream(m.default_stream())
e1, e2 = m.Event(enable_timing=True), m.Event(enable_timing=True)
e1.record(); z = y * 2; e2.record(); e2.synchronize()
out["events"] = [e1.query(), e1.elapsed_time(e2) >= 0]
p = m.get_device_properties()
out["props"] = [m.get_device_name(), list(m.get_device_capability()),
                p.total_memory == mm.mem_get_info()[1], m.is_bf16_supported()]
st = m.get_rng_state(); a = torch.rand(3, device="npu")
m.set_rng_state(st); b = torch.rand(3, device="npu")
out["rng"] = torch.equal(a.cpu(), b.cpu())
snap = mm._snapshot()
allocs = [e for e in snap["device_traces"][0]
          if e["action"] == "alloc" and e["addr"] == y.data_ptr()]
out["stream"] = [allocs[-1]["stream"] if allocs else None, s.stream_id]
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["types"] == ["Stream", "npu:0", True]
    assert r["default"] == [0, 0] and r["inside"] and r["after"] == 0
    assert r["set"] and r["events"] == [True, True]
    assert r["props"][0].startswith("memsnap sim device (")
    assert r["props"][1:] == [[8, 0], True, True]
    assert r["rng"]
    assert r["stream"][0] == r["stream"][1] != 0


def test_torch_stream_objects_are_stream_arguments():
    """torch.npu.Stream(), current_stream() and default_stream() (torch's
    generic torch.Stream, no npu_stream / cuda_stream attribute) are
    accepted by every stream parameter, as torch.cuda's functions accept
    torch.cuda.Stream: their stream_id is the handle the device guard
    records allocations inside `with torch.npu.stream(s)` with, a
    record_stream through one makes the block's free wait as the int
    handle does, and a torch.Stream of another device is refused."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
m = torch.npu
mm._record_memory_history("all", stacks="python")
s = m.Stream()
with m.stream(s):
    inside = torch.ones(1000, device="npu")   # the device guard's stream
p_mm = mm.caching_allocator_alloc(1000, stream=s)
p_dev = m.caching_allocator_alloc(1000, stream=s)
p_cur = m.caching_allocator_alloc(1000, stream=m.current_stream())
p_def = m.caching_allocator_alloc(1000, "npu:0", m.default_stream())
with m.stream(s):
    p_none = mm.caching_allocator_alloc(1000)   # stream=None: the current one
trace = mm._snapshot()["device_traces"][0]
def alloc_stream(p):
    return [e["stream"] for e in trace if e["action"] == "alloc" and e["addr"] == p][-1]
blocks = {b["address"]: seg["stream"] for seg in mm.memory_snapshot() for b in seg["blocks"]}
out = {"trace": [alloc_stream(p) for p in (inside.data_ptr(), p_mm, p_dev, p_cur, p_def, p_none)],
       "segment": [blocks[p] for p in (inside.data_ptr(), p_mm, p_dev)],
       "id": s.stream_id}
for p in (p_mm, p_dev, p_cur, p_def, p_none):
    mm.caching_allocator_delete(p)

def free_after_record(use):
    # a real tensor whose block is used on `use`; actions on its address
    # from its allocation on, after `del`, then after the next allocation
    t = torch.empty(4096, dtype=torch.uint8, device="npu")
    p = t.data_ptr()
    start = len(mm._snapshot()["device_traces"][0]) - 1
    if use is not None:
        mm.record_stream(p, use)
    del t
    def acts():
        return [e["action"] for e in mm._snapshot()["device_traces"][0][start:]
                if e["addr"] == p]
    at_free = acts()
    state = [b["state"] for seg in mm.memory_snapshot() for b in seg["blocks"]
             if b["address"] == p]
    nxt = torch.empty(16, device="npu")
    return [at_free, state, acts()[len(at_free):]]

out["record"] = {"none": free_after_record(None), "int": free_after_record(s.stream_id),
                 "stream": free_after_record(s)}
h = mm._host_alloc(1 << 12)
mm._host_record_stream(h, s)
mm._host_free(h)
errs = []
cpu_stream = torch.Stream(device="cpu")
for call in (lambda: mm.caching_allocator_alloc(1000, stream=cpu_stream),
             lambda: m.caching_allocator_alloc(1000, stream=cpu_stream),
             lambda: mm.record_stream(inside.data_ptr(), cpu_stream),
             lambda: mm._host_record_stream(mm._host_alloc(64), cpu_stream),
             lambda: mm.caching_allocator_alloc(1000, stream="side")):
    try:
        call()
        errs.append(None)
    except (TypeError, ValueError) as e:
        errs.append([type(e).__name__, str(e)])
out["errs"] = errs
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    sid = r["id"]
    assert sid > 0
    # the Stream object's allocations are recorded on the stream that
    # `with torch.npu.stream(s)` records on; current/default stream: 0
    assert r["trace"] == [sid, sid, sid, 0, 0, sid], r["trace"]
    assert r["segment"] == [sid, sid, sid]
    rec = r["record"]
    # no stream use: freed at once, the next allocation reuses the block
    assert rec["none"] == [["alloc", "free_requested", "free_completed"], ["inactive"],
                           ["alloc"]]
    # used on s (the npu profile waits for an event on every recorded
    # stream): the free completes only when the next allocation processes
    # the events, with the handle and with the Stream object alike
    waits = [["alloc", "free_requested"], ["active_pending_free"], ["free_completed", "alloc"]]
    assert rec["int"] == waits and rec["stream"] == waits, rec
    errs = r["errs"]
    for kind, msg in errs[:4]:
        assert kind == "ValueError", msg
        assert msg.startswith("Expected a stream of the 'npu' device, but got a "
                              "torch.Stream of device cpu"), msg
    kind, msg = errs[4]
    assert kind == "TypeError"
    assert msg == ("Invalid type for stream argument, must be `torch.Stream` of the "
                   "'npu' device (`torch.npu.Stream()`, `torch.npu.current_stream()`) "
                   "or `int` (its `stream_id`; 0 is the default stream), not str")
    assert "torch.cuda" not in msg


def test_device_module_has_every_torch_cuda_memory_function_of_memsnap():
    """torch.<name> has each torch.cuda memory function memsnap.memory has
    (the host statistics, caching_allocator_enable / _disabled,
    get_allocator_backend included), as memsnap.memory's own function, and
    they work on real pinned and device tensors."""
    code = r"""
import json
import memsnap.torch as mt, torch
import memsnap.memory as mm
mt.register_device("npu")
m = torch.npu
names = [n for n in mm.__all__ if n != "OutOfMemoryError" and hasattr(torch.cuda, n)]
out = {"missing": [n for n in names if getattr(m, n, None) is not getattr(mm, n)],
       "not_cuda": sorted(n for n in mm.__all__ if not hasattr(torch.cuda, n)),
       "backend": m.get_allocator_backend()}
m.reset_accumulated_host_memory_stats()
pinned = torch.empty(1 << 16, dtype=torch.uint8, pin_memory=True)
st = m.host_memory_stats()
out["host"] = [pinned.is_pinned(), st["allocations.current"], st["num_host_alloc"],
               m.host_memory_stats_as_nested_dict()["allocations"]["current"]]
del pinned
m.reset_peak_host_memory_stats()
out["host_after"] = [m.host_memory_stats()["active_requests.current"],
                     m.host_memory_stats()["active_requests.peak"]]
lin = torch.nn.Linear(64, 64).to("npu")
before = m.memory_stats()["segment.all.current"]
with m.caching_allocator_disabled():
    y = lin(torch.randn(4, 64, device="npu"))
    out["disabled"] = [str(y.device), m.memory_stats()["segment.all.current"] == before]
del y
m.caching_allocator_enable(True)
z = lin(torch.randn(4, 64, device="npu"))
out["enabled"] = m.memory_stats()["allocation.all.current"] > 0
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["missing"] == [], r["missing"]
    # torch.accelerator's; Tensor.record_stream
    assert r["not_cuda"] == ["empty_host_cache", "record_stream"]
    assert r["backend"] == "native"
    assert r["host"][0] and r["host"][1] >= 1 and r["host"][2] >= 1
    assert r["host"][3] == r["host"][1]
    assert r["host_after"] == [0, 0]
    assert r["disabled"] == ["npu:0", True]
    assert r["enabled"]


def test_profiler_profile_memory_sees_device_memory(tmp_path):
    """torch.profiler(profile_memory=True) around a real nn.Linear forward
    on the device: the allocator glue reports each allocation and free to
    the profiler as CUDA's caching allocator does (block size, negative for
    a free, the device's allocated and reserved bytes after it, the
    block's own device), so the ops carry device memory where the same
    forward on CPU tensors carries CPU memory; an OOM is reported as an
    [OutOfMemory] event.  Without profile_memory nothing is reported and
    memsnap's allocations are the same."""
    trace = tmp_path / "trace.json"
    code = r"""
import json, sys
import memsnap.torch as mt, torch
import memsnap.memory as mm
from torch.profiler import profile, ProfilerActivity
mt.register_device("npu")
torch.manual_seed(0)
out = {}

def forward(dev, **kw):
    lin = torch.nn.Linear(256, 512).to(dev)
    x = torch.randn(64, 256, device=dev)
    with profile(activities=[ProfilerActivity.CPU], **kw) as prof:
        y = lin(x)
        del y
        out["allocated"] = [mm.memory_allocated(), mm.memory_reserved()]
    ka = {e.key: e for e in prof.key_averages()}
    mem = [e for e in prof.events() if e.name == "[memory]"]
    return ka, mem, prof

ka, mem, _ = forward("cpu", profile_memory=True)
out["cpu"] = [ka["aten::addmm"].cpu_memory_usage, ka["aten::addmm"].device_memory_usage,
              [e.cpu_memory_usage for e in mem]]
ka, mem, prof = forward("npu", profile_memory=True)
out["npu"] = [ka["aten::addmm"].device_memory_usage, ka["aten::linear"].device_memory_usage,
              [e.device_memory_usage for e in mem]]
prof.export_chrome_trace(sys.argv[1])
events = [e["args"] for e in json.load(open(sys.argv[1]))["traceEvents"]
          if e.get("name") == "[memory]"]
out["trace"] = [[a["Device Type"], a["Device Id"], a["Bytes"], a["Total Allocated"],
                 a["Total Reserved"]] for a in events]
out["device_type"] = int(torch._C._autograd.DeviceType.PrivateUse1)

# the block's own device, whichever device is current at the free
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    t = torch.empty(3000, dtype=torch.uint8, device="npu:1")
    on1 = [mm.memory_allocated(1), mm.memory_reserved(1)]
    with torch.npu.device(0):
        del t
prof.export_chrome_trace(sys.argv[1])
out["dev1"] = [[a["Device Type"], a["Device Id"], a["Bytes"], a["Total Allocated"],
                a["Total Reserved"]]
               for a in (e["args"] for e in json.load(open(sys.argv[1]))["traceEvents"]
                         if e.get("name") == "[memory]")]
out["on1"] = on1

# profiler off for memory: no event, and the allocator does the same work
def work():
    s0 = mm.memory_stats()
    y = torch.nn.functional.linear(torch.ones(32, 128, device="npu"),
                                   torch.ones(64, 128, device="npu"))
    del y
    s1 = mm.memory_stats()
    return [s1[k] - s0[k] for k in ("allocation.all.allocated",
                                    "allocated_bytes.all.allocated", "segment.all.allocated")]
with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
    with_memory = work()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    without = work()
out["off"] = [with_memory, without, work(),
              [e.name for e in prof.events() if e.name == "[memory]"],
              sum(e.device_memory_usage for e in prof.key_averages())]

keep = torch.empty(40 << 20, dtype=torch.uint8, device="npu")
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    try:
        torch.empty(40 << 20, dtype=torch.uint8, device="npu")
    except torch.OutOfMemoryError:
        pass
out["oom"] = [e.name for e in prof.events() if e.name == "[OutOfMemory]"]
print("RESULT " + json.dumps(out))
"""
    env = base_env(MEMSNAP_SIM_DEVICES="2", MEMSNAP_SIM_MEMORY="64M")
    r = subprocess.run([sys.executable, "-c", code, str(trace)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    r = json.loads(next(l for l in r.stdout.splitlines()
                        if l.startswith("RESULT "))[len("RESULT "):])
    out_bytes = 64 * 512 * 4
    # CPU tensors: the output's bytes are CPU memory of addmm / linear, and
    # its free a top-level [memory] event
    assert r["cpu"] == [out_bytes, 0, [-out_bytes]]
    # device tensors: the same figures as device memory (the npu profile's
    # block size: 512-byte rounding of the request + 32)
    block = (out_bytes + 32 + 511) // 512 * 512
    assert r["npu"][0] == block and r["npu"][1] == block
    assert r["npu"][2] == [-block]
    dt = r["device_type"]
    # (the CPU's own [memory] events are there too: cpu_fallback's copies)
    alloc, free = [t for t in r["trace"] if t[0] == dt][-2:]
    assert alloc[:3] == [dt, 0, block] and free[:3] == [dt, 0, -block]
    assert free[3] == alloc[3] - block          # the totals after each
    assert free[3:] == r["allocated"]           # memsnap's own figures
    assert r["dev1"] == [[dt, 1, 3072, 3072, r["on1"][1]], [dt, 1, -3072, 0, r["on1"][1]]]
    assert r["on1"][0] == 3072
    with_memory, without, plain, events, device_memory = r["off"]
    assert with_memory == without == plain and with_memory[0] > 0
    assert events == [] and device_memory == 0
    assert r["oom"] == ["[OutOfMemory]"]


def test_synchronize_checks_the_device_as_the_other_functions():
    """torch.<name>.synchronize accepts None, an index, "npu:0" and a
    torch.device after real work on the device, and refuses an index past
    device_count() with the same ValueError as get_device_properties."""
    code = r"""
import json
import memsnap.torch as mt, torch
mt.register_device("npu")
m = torch.npu
lin = torch.nn.Linear(64, 32).to("npu")
y = lin(torch.randn(8, 64, device="npu"))
out = {"ok": [m.synchronize(d) for d in (None, 0, "npu:0", torch.device("npu", 0))],
       "y": [str(y.device), list(y.shape)],
       "n": m.device_count()}
errs = []
for f in (m.synchronize, m.get_device_properties):
    try:
        f(m.device_count())
    except ValueError as e:
        errs.append(str(e))
out["errs"] = errs
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["ok"] == [None] * 4 and r["y"] == ["npu:0", [8, 32]]
    n = r["n"]
    assert r["errs"] == [f"Invalid device index {n} ({n} devices)"] * 2, r


def test_registration_errors_are_clear():
    code = r"""
import json, os
import memsnap.torch as mt, torch
out = {}
for bad in ("NPU", "cuda", "cpu", "gpu0", "x_1", "meta", "xla", "mkldnn"):
    try:
        mt.register_device(bad)
    except (ValueError, RuntimeError) as e:
        out[bad] = f"{type(e).__name__}: {e}"
# a refused name renamed nothing: PrivateUse1 is still free
out["backend"] = torch._C._get_privateuse1_backend_name()
out["first"] = mt.register_device("mydev")
out["again"] = mt.register_device("mydev")
try:
    mt.register_device("npu")
except RuntimeError as e:
    out["second"] = str(e)
try:
    mt.use_allocator("npu")
except (RuntimeError, ImportError) as e:
    out["use_allocator"] = str(e)
print("RESULT " + json.dumps(out))
"""
    p = run_script(code)
    r = p.result
    # torch's warning for a retired device type stays inside the check
    assert "no longer used" not in p.stderr, p.stderr
    assert r["NPU"].startswith("ValueError") and "lowercase" in r["NPU"]
    assert "torch.cuda already exists" in r["cuda"]
    assert "torch.cpu already exists" in r["cpu"]
    # torch's device strings take letters and underscores as the type
    for bad in ("gpu0", "x_1"):
        assert r[bad].startswith("ValueError") and "letters and underscores" in r[bad]
    for bad in ("meta", "xla", "mkldnn"):
        assert r[bad].startswith("RuntimeError") and "built-in device type" in r[bad]
    assert r["backend"] == "privateuseone"
    assert r["first"] == r["again"] == "mydev"
    assert "already registered the device 'mydev'" in r["second"]
    assert "register_device" in r["use_allocator"] or "torch_npu" in r["use_allocator"]


def test_refused_registration_changes_nothing():
    """A refused register_device (a bad name, a taken name) creates
    neither memsnap's allocator nor the environment it reads: the
    corrected call then registers "npu" with the npu profile, and a real
    nn.Linear runs on it."""
    code = r"""
import json, os
import memsnap.torch as mt, memsnap.memory as mm, memsnap._memsnap as C, torch
out = {"errors": []}
for bad in ("Npu", "cpu"):
    try:
        mt.register_device(bad)
    except (ValueError, RuntimeError) as e:
        out["errors"].append(type(e).__name__)
out["created"] = C.initialized()
out["env"] = [os.environ.get(k) for k in ("MEMSNAP_RUNTIME", "MEMSNAP_PROFILE",
                                          "MEMSNAP_SIM_HOST_BACKED")]
out["name"] = mt.register_device("npu")
out["profile"] = C.profile()
lin = torch.nn.Linear(16, 8).to("npu")
y = lin(torch.ones(4, 16, device="npu"))
out["y"] = [str(y.device), list(y.shape)]
out["allocated"] = mm.memory_allocated()
print("RESULT " + json.dumps(out))
"""
    env = base_env()
    for k in ("MEMSNAP_RUNTIME", "MEMSNAP_PROFILE", "MEMSNAP_SIM_HOST_BACKED"):
        env.pop(k, None)
    r = run_script(code, env=env).result
    assert r["errors"] == ["ValueError", "RuntimeError"], r
    assert r["created"] is False and r["env"] == [None, None, None], r
    assert r["name"] == "npu" and r["profile"] == "npu", r
    assert r["y"] == ["npu:0", [4, 8]] and r["allocated"] > 0, r


@pytest.mark.parametrize("call", [
    "mm.memory_allocated()", "mm.memory_stats()", "mm.mem_get_info()",
    "mm.memory_summary()", "mm._snapshot()", "mm._record_memory_history()"])
def test_memory_call_before_register_device_is_named(call):
    """A memsnap.memory call that creates the allocator before
    register_device: register_device refuses with the call and its line,
    and suggests no environment variable (one that changes the profile)."""
    code = f"""
import json
import memsnap.memory as mm, memsnap.torch as mt
{call}
try:
    mt.register_device("npu")
except RuntimeError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    r = run_script(code).result
    name = call[len("mm."):call.index("(")]
    assert ("register_device('npu') must be called before any memsnap.memory call "
            "that creates memsnap's allocator (this one was: memsnap.memory."
            f"{name} at <string>:4)") in r, r
    assert "without host backing" in r
    assert "MEMSNAP_" not in r


def test_host_backed_env_does_not_switch_the_npu_profile():
    """MEMSNAP_SIM_HOST_BACKED=1 set by hand and a statistic first: the
    allocator has the cuda profile, so register_device("npu") refuses
    instead of giving "npu" PyTorch's decisions."""
    code = r"""
import json
import memsnap.memory as mm, memsnap.torch as mt
mm.memory_stats()
try:
    mt.register_device("npu")
except RuntimeError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_HOST_BACKED="1")).result
    assert "this one was: memsnap.memory.memory_stats at <string>:4" in r
    assert "the 'cuda' profile, not 'npu'" in r


def test_empty_cache_then_register_device_then_statistics():
    """empty_cache before the allocator exists does not create it; after
    register_device every memsnap.memory call works on the device, with
    the npu profile, and sees a real nn.Linear's parameters."""
    code = r"""
import json
import memsnap, memsnap.memory as mm, memsnap.torch as mt, torch
mm.empty_cache()
created = memsnap._memsnap.initialized()
mt.register_device("npu")
mm._record_memory_history()
before = mm.memory_allocated()
lin = torch.nn.Linear(256, 256).to("npu")
out = {"created": created, "profile": memsnap._memsnap.profile(), "before": before,
       "after": mm.memory_allocated(), "torch_npu": torch.npu.memory_allocated(),
       "free_total": list(mm.mem_get_info()),
       "summary": "memory summary" in mm.memory_summary(),
       "segments": len(mm._snapshot()["segments"])}
mm.empty_cache()
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["created"] is False and r["profile"] == "npu"
    assert r["before"] == 0 and r["after"] == r["torch_npu"] >= (256 * 256 + 256) * 4
    assert r["free_total"][0] < r["free_total"][1]
    assert r["summary"] and r["segments"] >= 1


def test_module_to_device_replaces_parameters_documented_recipe():
    """docs/python.md: .to("npu") makes new Parameter objects (an optimizer
    built before holds CPU parameters that get no gradients); building it
    after the move, or swap_module_params_on_conversion, trains; a lazy
    module is materialized on the CPU before the move."""
    code = r"""
import json
import memsnap.torch as mt, torch
mt.register_device("npu")
x = torch.ones(2, 4, device="npu")
out = {"shallow": torch._has_compatible_shallow_copy_type(torch.ones(1), x)}

def train(model, opt):
    before = model.weight.detach().cpu().clone()
    model(x).sum().backward()
    opt.step()
    return not torch.equal(before, model.weight.detach().cpu())

m = torch.nn.Linear(4, 4); p0 = m.weight
early = torch.optim.SGD(m.parameters(), lr=0.1)
m.to("npu")
out["replaced"] = m.weight is not p0
out["early_trains"] = train(m, early)
out["after_trains"] = train(m, torch.optim.SGD(m.parameters(), lr=0.1))
torch.__future__.set_swap_module_params_on_conversion(True)
m = torch.nn.Linear(4, 4); p0 = m.weight
early = torch.optim.SGD(m.parameters(), lr=0.1)
m.to("npu")
out["swap_kept"] = m.weight is p0 and m.weight.device.type == "npu"
out["swap_trains"] = train(m, early)
torch.__future__.set_swap_module_params_on_conversion(False)
lazy = torch.nn.LazyLinear(4)
try:
    lazy.to("npu")(torch.ones(2, 3, device="npu"))
    out["lazy_unmaterialized"] = "ran"
except AssertionError as e:
    out["lazy_unmaterialized"] = str(e)
lazy = torch.nn.LazyLinear(4)
lazy(torch.ones(2, 3))
lazy.to("npu")
opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
before = lazy.weight.detach().cpu().clone()
lazy(torch.ones(2, 3, device="npu")).sum().backward(); opt.step()
out["lazy_trains"] = not torch.equal(before, lazy.weight.detach().cpu())
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["shallow"] is False and r["replaced"] is True
    assert r["early_trains"] is False and r["after_trains"] is True
    assert r["swap_kept"] is True and r["swap_trains"] is True
    assert "in_features from self.weight: 0" in r["lazy_unmaterialized"]
    assert r["lazy_trains"] is True


def test_exit_after_backward_is_clean():
    """torch's autograd device threads may drop their last graph task at
    interpreter shutdown (pytorch/pytorch#117762); memsnap drains them at
    exit.  Several runs, each must exit 0 without 'terminate'."""
    code = r"""
import memsnap.torch as mt, torch, memsnap._shim as s
mt.register_device("npu")
w = torch.ones(64, device="npu", requires_grad=True)
(w * w).sum().backward()
assert s.torch_lib().msnap_torch_worker_threads() == 1
"""
    for _ in range(3):
        p = run_script(code)
        assert "terminate" not in p.stderr


def test_cpu_operator_list_is_documented():
    import memsnap._shim as s

    ops = s.torch_lib().msnap_torch_cpu_operators().decode().split()
    doc = open(os.path.join(ROOT, "docs", "python.md")).read()
    missing = [op for op in ops if f"`{op.split('::')[1]}`" not in doc]
    assert len(ops) > 50 and not missing, missing


def test_claim_privateuse1_is_the_shared_naming_function():
    """claim_privateuse1 (what register_device and other memsnap tools call)
    names PrivateUse1 and registers torch.<name>, once."""
    code = r"""
import json, types
import memsnap.torch as mt, torch
mod = types.ModuleType("fake_device_module")
out = {"first": mt.claim_privateuse1("fakedev", mod),
       "again": mt.claim_privateuse1("fakedev"),
       "module": torch.fakedev is mod,
       "backend": torch._C._get_privateuse1_backend_name()}
try:
    mt.claim_privateuse1("otherdev")
except RuntimeError as e:
    out["other"] = str(e)
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["first"] == r["again"] == "fakedev" == r["backend"] and r["module"]
    assert "already registered as 'fakedev'" in r["other"]


def test_backward_thread_allocations_carry_empty_frames():
    """stacks='python': allocations and frees made by autograd's device
    thread (C++, no Python frames) carry `frames: []`, as PyTorch writes
    them: its gathered context exists and is empty, and a trace entry has
    `frames` whenever its context is set (torch/csrc/cuda/
    memory_snapshot.cpp; CUDACachingAllocator.cpp: a free uses its own
    context before the block's).  Frees of forward tensors on that thread
    do not take the allocation's frames."""
    code = r"""
import json, threading
import memsnap.torch as mt, torch
import memsnap.memory as mm
name = mt.register_device("npu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 8)).to(name)
x = torch.randn(32, 64).to(name)
mm._record_memory_history("all", stacks="python")
threads = set()
def grad_hook(g):
    threads.add(threading.get_ident())
model[0].weight.register_hook(grad_hook)
loss = model(x).square().sum()
loss.backward()
snap = mm._snapshot()
tr = snap["device_traces"][0]
print("RESULT " + json.dumps({
    "entries": [[e["action"], e["size"], e.get("frames", None)] for e in tr],
    "blocks": [b.get("frames", None) for s in snap["segments"] for b in s["blocks"]],
    "other_thread": threads != {threading.get_ident()} and len(threads) == 1,
    "wsize": model[0].weight.numel() * 4,
}))
"""
    r = run_script(code).result
    assert r["other_thread"], "autograd ran the backward on the calling thread"
    entries = r["entries"]
    # context 'all': every alloc / free entry has the key
    assert all(f is not None for _, _, f in entries), entries
    assert all(f is not None for f in r["blocks"])
    fwd = [f for a, _, f in entries if a == "alloc" and f]
    assert any(fr["name"] == "<module>" for f in fwd for fr in f), fwd
    # the first Linear's weight gradient is allocated by the device thread
    grads = [f for a, s, f in entries if a == "alloc" and s == r["wsize"]]
    assert grads and grads[-1] == [], entries
    frees = [f for a, _, f in entries if a == "free_requested"]
    assert [] in frees


def test_alloc_conf_that_is_not_utf8_gives_the_allocators_error():
    """An alloc conf with a byte that is not UTF-8 is refused by the
    allocator's parser; register_device raises that RuntimeError, the byte
    shown as U+FFFD (as memsnap.memory shows it), not a UnicodeDecodeError
    of the message (the shims' messages quote the setting as given)."""
    env = base_env()
    env["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:\udcff"  # the byte 0xff
    env["MEMSNAP_PROFILE"] = "npu"
    code = """
import json
import memsnap.torch as mt
try:
    mt.register_device("npu")
    print("RESULT " + json.dumps(None))
except Exception as e:
    print("RESULT " + json.dumps([type(e).__name__, str(e)]))
"""
    r = run_script(code, env=env).result
    assert r is not None and r[0] == "RuntimeError", r
    assert "expandable_segments" in r[1] and "\ufffd" in r[1], r
