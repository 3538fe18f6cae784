"""memsnap explains what it recorded: OOMs, leaks across steps and runs,
many ranks -- on recordings made here with memsnap itself (real Python
stacks, torch's record_function and torch.distributed), read back with the
installed `memsnap` CLI; and memsnap's own frames never reach a stack."""

from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import memsnap
from conftest import WORKSPACE_SETUP, base_env, needs_torch, run_cli, run_script

MiB = 1 << 20
PKG_DIR = os.path.dirname(os.path.abspath(memsnap.__file__))


def all_frame_lists(snap):
    """Every recorded stack of a snapshot dict."""
    for seg in snap.get("segments", []) + snap.get("host_segments", []):
        yield seg.get("frames", [])
        for b in seg["blocks"]:
            yield b.get("frames", [])
    for trace in snap.get("device_traces", []) + [snap.get("host_traces", [])]:
        for e in trace:
            yield e.get("frames", [])


def write_script(tmp_path, name, code):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def line_of(code, marker):
    """1-based line of the first line of `code` that contains marker."""
    return next(i for i, x in enumerate(code.splitlines(), 1) if marker in x)


def run_file(path, env=None, args=(), cwd=None, check=True):
    proc = subprocess.run([sys.executable, str(path), *map(str, args)],
                          env=env or base_env(), cwd=cwd or path.parent,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{path.name} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


# --- frames ------------------------------------------------------------------

FRAMES = r"""
import json, pickle, sys
import torch
from torch.autograd.profiler import record_function
import memsnap.memory as mm
mm._record_memory_history("all", stacks=STACKS, record_pinned_host_memory=True)

def user_alloc(n):
    return mm.caching_allocator_alloc(n)

def user_free(p):
    mm.caching_allocator_delete(p)

with record_function("ProfilerStep#0"):
    a = user_alloc(1000)
    b = user_alloc(3 << 20)
    mm.record_stream(b, 7)
    mm._annotate_memory(a, "weights")
    user_free(b)
    pool = mm.MemPool()
    with mm.use_mem_pool(pool):
        c = user_alloc(4096)
    h = mm._host_alloc(1 << 20)
    mm._host_free(h)
    try:
        user_alloc(1 << 50)           # an oom entry with its stack
    except MemoryError:
        pass
tb = mm._allocation_traceback(a)
mm._dump_snapshot(OUT)
print("RESULT " + json.dumps({"tb": tb}))
"""


@needs_torch
@pytest.mark.parametrize("stacks", ["python", "all"])
def test_no_memsnap_frame_in_any_recorded_stack(tmp_path, stacks):
    out = str(tmp_path / "frames.pickle")
    code = FRAMES.replace("STACKS", repr(stacks)).replace("OUT", repr(out))
    r = run_script(code).result
    with open(out, "rb") as f:
        snap = pickle.load(f)
    lists = [fl for fl in all_frame_lists(snap) if fl]
    python = [f for fl in lists for f in fl if f["filename"].endswith(".py")
              or f["filename"] == "<string>"]
    assert python, "no Python frame recorded at all"
    ours = [f for f in python if f["filename"].startswith(PKG_DIR)]
    assert ours == [], f"memsnap frames recorded: {ours[:3]}"
    # the innermost Python frame of every allocation is the caller's code
    allocs = [e for e in snap["device_traces"][0]
              if e["action"] in ("alloc", "oom")]
    assert len(allocs) >= 4
    for e in allocs:
        py = [f for f in e["frames"] if f["filename"] == "<string>"]
        assert py and py[0]["name"] == "user_alloc", e["frames"][:4]
    assert r["tb"] and all(not f["filename"].startswith(PKG_DIR) for f in r["tb"])


SHIM = r"""
import json
import torch
import memsnap.torch as mt, memsnap.memory as mm
name = mt.register_device("npu")
mm._record_memory_history("all", stacks="all")
t = torch.empty(1 << 20, dtype=torch.uint8, device=name)
s = mm._snapshot()
print("RESULT " + json.dumps({"frames": [e["frames"] for e in s["device_traces"][0]
                                         if e["action"] == "alloc"]}))
"""


@needs_torch
def test_no_torch_shim_frame_in_c_stacks():
    """memsnap's C++ torch shim (libmemsnap_torch.so: the device's
    allocator and kernels) is memsnap's own code, left out as
    libmemsnap.so is: the C stack of a tensor allocation starts in torch."""
    import memsnap.torch as mt
    try:
        mt._shim.torch_lib()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"SKIP: the torch shim is not built: {e}")
    r = run_script(SHIM).result
    assert r["frames"], "no alloc entry"
    for fr in r["frames"]:
        assert fr, "an allocation without frames"
        ours = [f for f in fr if "libmemsnap" in f["filename"] or
                "memsnap/csrc" in f["filename"] or
                f["name"].startswith(("memsnap_torch::", "msnap_"))]
        assert ours == [], ours[:3]
        assert any(f["filename"] == "<string>" for f in fr)


# --- rank, world size, host, pid ------------------------------------------------

RANKED = r"""
import json, os
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
p = mm.caching_allocator_alloc(1 << 20)
try:
    mm.caching_allocator_alloc(1 << 40)
except MemoryError:
    pass
s = mm._snapshot()
ooms = [e["time_us"] for e in s["device_traces"][0] if e["action"] == "oom"]
print("RESULT " + json.dumps({"info": s["process_info"], "pid": os.getpid(),
                              "oom_time": ooms[-1] if ooms else None}))
"""


def test_rank_from_the_environment_and_oom_dump_name(tmp_path):
    env = base_env(RANK="3", WORLD_SIZE="8", LOCAL_RANK="1",
                   MEMSNAP_SIM_MEMORY="256M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(tmp_path))
    r = run_script(RANKED, env=env, cwd=str(tmp_path)).result
    info = r["info"]
    assert (info["rank"], info["world_size"], info["local_rank"]) == (3, 8, 1)
    assert info["pid"] == r["pid"] and info["host"] == os.uname().nodename
    assert info["runtime"] == "sim" and info["profile"] == "cuda"
    # (the OOM the script provoked, with no cap then)
    assert info["devices"] == [{"device": 0, "total_bytes": 256 * MiB,
                                "last_oom_time_us": r["oom_time"]}]
    dumps = glob.glob(str(tmp_path / "oom_snapshot_*.pickle"))
    assert [os.path.basename(d).split("_")[2] for d in dumps] == ["rank3"], dumps
    assert f"_{r['pid']}_" in os.path.basename(dumps[0])
    # without a rank: torch_npu's name, and no rank keys
    env = base_env(MEMSNAP_SIM_MEMORY="256M")
    info = run_script(RANKED, env=env).result["info"]
    assert "rank" not in info and "world_size" not in info


DIST = r"""
import json, os, sys
import torch.distributed as dist
import memsnap.memory as mm
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                        world_size=2)
mm._record_memory_history("all", stacks="python")
p = mm.caching_allocator_alloc(1 << 20)
mm._dump_snapshot(f"dist_rank{rank}.pickle")
dist.barrier()
dist.destroy_process_group()
"""


@needs_torch
def test_rank_from_torch_distributed(tmp_path):
    """No RANK in the environment: the rank comes from the real process
    group (gloo, two processes)."""
    script = write_script(tmp_path, "dist.py", DIST)
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), store],
                              env=base_env(), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for r in (0, 1):
        with open(tmp_path / f"dist_rank{r}.pickle", "rb") as f:
            info = pickle.load(f)["process_info"]
        assert info["rank"] == r and info["world_size"] == 2, info
    fl = run_cli("fleet", "--json", tmp_path)
    assert fl.returncode == 0, fl.stderr
    assert [(x["rank"], x["rank_source"]) for x in fl.json["ranks"]] == \
        [(0, "process_info"), (1, "process_info")]


# --- the OOM explained ----------------------------------------------------------

OOM_TRAIN = """\
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
keep = []

def activation(i):
    return mm.caching_allocator_alloc(6 * MiB)

def forward():
    ptrs = [activation(i) for i in range(150)]
    for p in ptrs[1::3]:
        mm.caching_allocator_delete(p)   # a 6 MiB hole in every segment
    keep.extend(ptrs[0::3] + ptrs[2::3])
    return mm.caching_allocator_alloc(100 * MiB)   # fails

try:
    forward()
except MemoryError as e:
    print("OOM", e)
"""


def test_oom_dump_written_by_memsnap_is_explained(tmp_path):
    script = write_script(tmp_path, "train.py", OOM_TRAIN)
    env = base_env(MEMSNAP_SIM_MEMORY="1G", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(tmp_path))
    proc = run_file(script, env=env)
    assert "OOM CUDA out of memory" in proc.stdout
    (dump,) = glob.glob(str(tmp_path / "oom_snapshot_*.pickle"))
    js = run_cli("summary", "--json", dump)
    assert js.returncode == 0, js.stderr
    oom = js.json["oom"]
    # The request and the device: 100 MiB asked, 24 MiB of the 1 GiB free
    # (50 segments of 20 MiB reserved).
    assert oom["requested_bytes"] == 100 * MiB and oom["pool"] == "large"
    assert oom["device_free_bytes"] == 24 * MiB
    assert oom["device_total_bytes"] == 1 << 30
    assert oom["reserved_bytes"] == 1000 * MiB
    assert oom["allocated_bytes"] == 600 * MiB
    assert oom["inactive_split_bytes"] == 400 * MiB
    # the holes are 6 MiB; segment tails 2 MiB
    assert oom["largest_free_block_bytes"] == 6 * MiB
    assert oom["largest_free_block_by_pool"] == {"small": 0, "large": 6 * MiB}
    assert oom["fits_in_largest_free_block"] is False
    assert oom["fits_without_fragmentation"] is True
    assert oom["fits_with_expandable_segments"] is True
    assert oom["state_source"] == "final state"
    assert oom["verdict"].startswith("fragmentation")
    # the failing allocation's stack: the user's line, no memsnap frame
    fail = line_of(OOM_TRAIN, "# fails")
    act = line_of(OOM_TRAIN, "6 * MiB")
    assert oom["frames"][0] == {"name": "forward", "filename": str(script),
                                "line": fail}
    assert oom["site"].endswith(f"train.py:{fail}:forward")
    assert oom["top_live_sites"] == [
        {"site": oom["site"].replace(f"{fail}:forward", f"{act}:activation"),
         "bytes": 600 * MiB, "count": 100}]
    # every real figure agrees with the dump read with CPython's pickle
    with open(dump, "rb") as f:
        snap = pickle.load(f)
    blocks = [b for s in snap["segments"] for b in s["blocks"]]
    inactive = [b["size"] for b in blocks if b["state"] == "inactive"]
    assert max(inactive) == oom["largest_free_block_bytes"]
    assert sum(inactive) == oom["inactive_split_bytes"]
    entry = [e for e in snap["device_traces"][0] if e["action"] == "oom"][-1]
    assert entry["device_free"] == oom["device_free_bytes"]
    assert entry["size"] == oom["requested_bytes"]
    # the text names the user's line
    txt = run_cli("summary", dump)
    assert "failing allocation  " in txt.stdout
    line = [x for x in txt.stdout.splitlines() if "failing allocation" in x][0]
    assert line.rstrip().endswith(f"train.py:{fail}:forward")
    assert "would have fit" in txt.stdout and "<- your code" in txt.stdout


SEGMENT_OOM = """\
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
keep = []
try:
    while True:
        keep.append(mm.caching_allocator_alloc(4 * MiB))   # the failing line
except MemoryError as e:
    print("OOM", e)
"""


@pytest.mark.parametrize("profile", ["cuda", "npu"])
def test_oom_on_the_segment_size_is_not_called_fragmentation(tmp_path, profile):
    """4 MiB requests on a 50 MiB device: each new 20 MiB segment
    (kLargeBuffer: requests from 1 to 10 MiB) holds five; with two
    segments full the next request would fit in the 10 MiB still free,
    but its new segment does not -- the segment size, not fragmentation,
    is why (PyTorch's own message says "Tried to allocate 20.00 MiB")."""
    script = write_script(tmp_path, "train.py", SEGMENT_OOM)
    env = base_env(MEMSNAP_SIM_MEMORY="50M", MEMSNAP_PROFILE=profile,
                   OOM_SNAPSHOT_ENABLE="1", OOM_SNAPSHOT_PATH=str(tmp_path))
    proc = run_file(script, env=env)
    assert "Tried to allocate 20.00 MiB" in proc.stdout, proc.stdout
    (dump,) = glob.glob(str(tmp_path / "oom_snapshot_*.pickle"))
    oom = run_cli("summary", "--json", dump).json["oom"]
    # (npu: the request padded by 32 bytes, then rounded)
    assert 4 * MiB <= oom["requested_bytes"] <= oom["device_free_bytes"] < 20 * MiB
    assert oom["segment_size_bytes"] == 20 * MiB
    assert oom["fits_in_largest_free_block"] is False
    assert oom["verdict_kind"] == "segment_size"
    assert oom["verdict"].startswith("segment size:")
    assert "20.00 MiB" in oom["verdict"]
    txt = run_cli("summary", dump)
    assert "segment size: the request" in txt.stdout
    assert "fragmentation:" not in txt.stdout
    # the text names the segment as the allocator's message did
    line = [x for x in txt.stdout.splitlines() if x.startswith("  new segment")]
    assert line and line[0].startswith("  new segment      20.00 MiB (20971520 B)")


FRACTION_OOM = """\
import sys
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
mode = sys.argv[1]
if mode in ("api", "change"):
    mm.set_per_process_memory_fraction(0.5)
if mode == "reset":                       # the conf's 0.5, lifted
    mm.set_per_process_memory_fraction(1.0)
keep = []
try:
    if mode == "reset":
        while True:
            keep.append(mm.caching_allocator_alloc(100 * MiB))
    keep = [mm.caching_allocator_alloc(100 * MiB) for _ in range(4)]
    mm.caching_allocator_alloc(200 * MiB)   # fails: past the 512 MiB allowed
except mm.OutOfMemoryError as e:
    print("OOM", e)
if mode == "change":                      # after the OOM, before the dump
    mm.set_per_process_memory_fraction(0.9)
mm._dump_snapshot(sys.argv[2])
"""


@pytest.mark.parametrize("how", ["api", "conf", "change", "reset"])
def test_oom_under_a_memory_fraction_is_out_of_memory(tmp_path, how):
    """A 1 GiB device with the process held to half of it, by
    set_per_process_memory_fraction or the conf's
    per_process_memory_fraction: 400 MiB live, 8 MiB cached, 616 MiB of
    the device free, and a 200 MiB request.  The device could hold it, the
    cap (512 MiB) cannot: out of memory, not fragmentation, and no layout
    (expandable segments included) would have served it.  The cap is the
    one recorded with the OOM: raised to 0.9 after it (change) it is still
    512 MiB; the conf's 0.5 lifted to 1.0 before (reset) is no cap at
    all."""
    script = write_script(tmp_path, "train.py", FRACTION_OOM)
    dump = tmp_path / "oom.pickle"
    env = base_env(MEMSNAP_SIM_MEMORY="1G", MEMSNAP_PROFILE="npu")
    if how in ("conf", "reset"):
        env["PYTORCH_NPU_ALLOC_CONF"] = "per_process_memory_fraction:0.5"
    proc = run_file(script, env=env, args=(how, dump))
    assert ("512.00 MiB allowed" in proc.stdout) == (how != "reset"), proc.stdout
    with open(dump, "rb") as f:
        snap = pickle.load(f)
    entry = [e for e in snap["device_traces"][0] if e["action"] == "oom"][-1]
    dev = {"device": 0, "total_bytes": 1 << 30,
           "last_oom_time_us": entry["time_us"]}
    if how != "reset":
        dev["last_oom_allowed_bytes"] = 512 * MiB
        dev["allowed_bytes"] = (1 << 30) * 9 // 10 if how == "change" else 512 * MiB
    assert snap["process_info"]["devices"] == [dev]
    oom = run_cli("summary", "--json", dump).json["oom"]
    assert oom["cap_known"] is True and oom["unconfirmed_cap"] is None
    txt = run_cli("summary", dump).stdout
    flat = " ".join(txt.split())
    if how == "reset":
        # the device ran out: no cap, nothing about one in the text
        assert oom["allowed_bytes"] is None
        assert oom["available_bytes"] == oom["device_free_bytes"] < 100 * MiB
        assert oom["verdict_kind"] == "out_of_memory"
        assert "allowed " not in txt and "fraction" not in oom["verdict"]
        return
    assert oom["device_free_bytes"] == entry["device_free"] == 616 * MiB
    assert oom["allowed_bytes"] == 512 * MiB
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert oom["reserved_bytes"] == reserved
    assert oom["available_bytes"] == 512 * MiB - reserved
    assert oom["fits_without_fragmentation"] is False
    assert oom["fits_with_expandable_segments"] is False
    assert oom["verdict_kind"] == "out_of_memory"
    assert "allowed 512.00 MiB reserved at most (per-process memory " \
           "fraction, recorded with the OOM)" in flat
    assert "though the device had enough free" in flat
    assert "fragmentation:" not in txt
    # Without the record of the OOM (a torch dump has no process_info):
    # the conf's fraction of a known total is reported as a cap the file
    # does not tie to the OOM, and the verdict assumes none.
    if how != "conf":
        return
    del snap["process_info"]["devices"][0]["last_oom_time_us"]
    del snap["process_info"]["devices"][0]["last_oom_allowed_bytes"]
    del snap["process_info"]["devices"][0]["allowed_bytes"]
    p2 = tmp_path / "conf.pickle"
    with open(p2, "wb") as f:
        pickle.dump(snap, f)
    oom = run_cli("summary", "--json", p2).json["oom"]
    assert oom["cap_known"] is False and oom["allowed_bytes"] is None
    assert oom["unconfirmed_cap"] == {"source": "PYTORCH_NPU_ALLOC_CONF",
                                      "bytes": 512 * MiB, "fraction": 0.5,
                                      "would_fit": False}
    assert oom["verdict_kind"] == "unconfirmed_cap"
    assert oom["verdict"].startswith("probably the memory-fraction cap: under "
                                     "the 512.00 MiB the file suggests (from "
                                     "PYTORCH_NPU_ALLOC_CONF)")
    flat = " ".join(run_cli("summary", p2).stdout.split())
    assert "under that cap the request would not have fit" in flat
    del snap["process_info"]
    with open(p2, "wb") as f:
        pickle.dump(snap, f)
    oom = run_cli("summary", "--json", p2).json["oom"]
    assert oom["unconfirmed_cap"] == {"source": "PYTORCH_NPU_ALLOC_CONF",
                                      "bytes": None, "fraction": 0.5,
                                      "would_fit": None}
    assert oom["available_bytes"] == oom["device_free_bytes"]
    assert oom["verdict_kind"] == "fragmentation"  # no total: no cap to judge by


BACKWARD_OOM = """\
import memsnap.torch as mt, torch
import memsnap.memory as mm
name = mt.register_device("npu")
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
w = torch.randn(1024, 1024, device=name, requires_grad=True)
x = torch.randn(2048, 1024, device=name)
y = (x @ w).relu()
keep = []
try:
    while True:                     # fill the device
        keep.append(torch.empty(MiB, dtype=torch.uint8, device=name))
except torch.OutOfMemoryError:
    pass
try:
    y.sum().backward()              # runs on autograd's device thread
except torch.OutOfMemoryError as e:
    print("OOM", e)
"""


BIGGER_THAN_DEVICE = """\
import sys
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
keep = [mm.caching_allocator_alloc(100 * MiB) for _ in range(3)]
try:
    mm.caching_allocator_alloc(int(sys.argv[2]) * MiB)  # the failing request
except mm.OutOfMemoryError as e:
    print("OOM", e)
mm._dump_snapshot(sys.argv[1])
"""


FILL = """\
import sys
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
keep = []
try:
    while True:                          # 4 MiB blocks in 20 MiB segments
        keep.append(mm.caching_allocator_alloc(4 << 20))
except mm.OutOfMemoryError as e:
    print("OOM", e)
mm._dump_snapshot(sys.argv[1])
"""


def test_oom_largest_block_that_rounds_like_the_request_shows_bytes(tmp_path):
    """npu rounds a 4 MiB request to 4194816 B; the split segment's last
    block, 4192256 B, also reads "4.00 MiB": the OOM's state gives its
    bytes, or "largest free block 4.00 MiB" would contradict the verdict
    that no free block held the request."""
    script = write_script(tmp_path, "fill.py", FILL)
    dump = tmp_path / "oom.pickle"
    run_file(script, env=base_env(MEMSNAP_SIM_MEMORY="1G",
                                  MEMSNAP_PROFILE="npu"), args=(dump,))
    oom = run_cli("summary", "--json", dump).json["oom"]
    assert oom["requested_bytes"] == 4194816
    assert oom["largest_free_block_by_pool"]["large"] == 4192256
    assert oom["fits_in_largest_free_block"] is False
    flat = " ".join(run_cli("summary", dump).stdout.split())
    assert "requested 4.00 MiB (4194816 B, rounded; large pool)" in flat
    assert "large pool 4.00 MiB = 4192256 B (blocks from" in flat


@pytest.mark.parametrize("mib", [3072, 800])
def test_out_of_memory_verdict_gives_the_figures(tmp_path, mib):
    """The verdict names the request and what it was measured against: the
    device's whole memory when the request is larger than it (no setting
    can help: the size is the bug), else what the process could still use,
    its two parts given."""
    script = write_script(tmp_path, "big.py", BIGGER_THAN_DEVICE)
    dump = tmp_path / "oom.pickle"
    run_file(script, env=base_env(MEMSNAP_SIM_MEMORY="1G"),
             args=(dump, mib))
    oom = run_cli("summary", "--json", dump).json["oom"]
    assert oom["verdict_kind"] == "out_of_memory"
    assert oom["requested_bytes"] == mib * MiB
    flat = " ".join(run_cli("summary", dump).stdout.split())
    if mib > 1024:
        assert oom["verdict"] == (
            "out of memory: the request (3.00 GiB) is larger than the "
            "device's whole memory (1.00 GiB), so no cache, setting or "
            "layout can serve it; check the size the failing allocation "
            "asks for (a shape, batch or dtype larger than meant)")
    else:
        free = oom["device_free_bytes"]
        assert free == 724 * MiB, oom
        assert oom["verdict"] == (
            "out of memory: the request (800.00 MiB) exceeds everything the "
            "process could still use (724.00 MiB: free device memory, "
            "724.00 MiB, plus its cached free blocks, 0 B)")
    assert "verdict " + oom["verdict"] in flat



@needs_torch
@pytest.mark.parametrize("stacks", ["python", "all"])
def test_oom_in_backward_says_why_it_has_no_python_frames(tmp_path, stacks):
    """An OOM in backward() on the device: autograd's device thread runs
    no Python code, so with Python stacks its allocation has no frames,
    and the explanation says why instead of "<no stack>"; with C stacks
    recorded too it has native frames (autograd's node)."""
    script = write_script(tmp_path, "train.py",
                          BACKWARD_OOM.replace('stacks="python"',
                                               f'stacks="{stacks}"'))
    env = base_env(MEMSNAP_SIM_MEMORY="128M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(tmp_path))
    proc = run_file(script, env=env)
    assert "OOM" in proc.stdout, proc.stdout + proc.stderr
    dumps = sorted(glob.glob(str(tmp_path / "oom_snapshot_*.pickle")),
                   key=os.path.getmtime)
    with open(dumps[-1], "rb") as f:
        snap = pickle.load(f)
    entry = [e for e in snap["device_traces"][0] if e["action"] == "oom"][-1]
    oom = run_cli("summary", "--json", dumps[-1]).json["oom"]
    txt = run_cli("summary", dumps[-1]).stdout
    if stacks == "python":
        # the file itself: the oom entry has no frames, others have Python ones
        assert not entry.get("frames")
        assert any(e.get("frames") for e in snap["device_traces"][0])
        want = ("<no Python frames: allocated on a thread running no Python "
                "code, such as autograd's backward thread>")
        assert oom["site"] == want
        assert f"failing allocation  {want}" in txt
    else:
        assert entry.get("frames") and "<no " not in oom["site"]


THREE_OOMS = """\
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
keep = [mm.caching_allocator_alloc(4 * MiB)]
for k in range(3):                  # three OOMs, three dumps of one process
    try:
        mm.caching_allocator_alloc((100 + k) * MiB)
    except MemoryError:
        keep.append(mm.caching_allocator_alloc(2 * MiB))
print("done")
"""


def test_fleet_takes_the_oom_dumps_of_one_process_for_one_rank(tmp_path):
    """Three OOM dumps written by one process (memsnap's OOM_SNAPSHOT_ENABLE:
    one file per OOM) are one rank for `memsnap fleet`: the latest stands
    for the process, the two earlier ones are marked, with a warning."""
    script = write_script(tmp_path, "train.py", THREE_OOMS)
    env = base_env(MEMSNAP_SIM_MEMORY="64M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(tmp_path))
    run_file(script, env=env)
    dumps = glob.glob(str(tmp_path / "oom_snapshot_*.pickle"))
    assert len(dumps) == 3
    js = run_cli("fleet", "--json", str(tmp_path)).json
    ranks = js["ranks"]
    latest = [r["file"] for r in ranks if r["same_process_as"] is None]
    assert len(latest) == 1 and len(ranks) == 3
    # the latest dump holds all three OOMs of the process
    (last,) = [r for r in ranks if r["file"] == latest[0]]
    assert last["ooms"] == 3
    assert all(r["same_process_as"] == latest[0] for r in ranks
               if r["file"] != latest[0])
    assert js["oom_ranks"] == latest
    assert any("2 files are earlier dumps of one process" in w
               for w in js["warnings"])


WORKSPACE_OOM = WORKSPACE_SETUP + r"""
mm._record_memory_history()
big = [mm.caching_allocator_alloc(8 << 20) for _ in range(3)]
try:
    mm.caching_allocator_alloc(60 << 20)
except MemoryError:
    pass
mm._dump_snapshot("ws_oom.pickle")
"""


def test_oom_live_sites_skip_torch_npu_workspace_entries(tmp_path):
    """torch_npu's workspace view puts three synthetic entries per buffer
    at the start of the trace (workspace_snapshot, segment_alloc, alloc);
    they are no history, and the OOM's live allocations leave them out, as
    the summary's peaks and the backward replay do (cli_workspace_synthetic):
    the live sites add up to the active bytes at the OOM."""
    run_script(WORKSPACE_OOM, env=base_env(MEMSNAP_PROFILE="npu",
                                           MEMSNAP_SIM_MEMORY="64M"),
               cwd=str(tmp_path))
    dump = tmp_path / "ws_oom.pickle"
    with open(dump, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    assert [e["action"] for e in trace[:3]] == [
        "workspace_snapshot", "segment_alloc", "alloc"]
    js = run_cli("summary", "--json", dump)
    assert js.returncode == 0, js.stderr
    oom = js.json["oom"]
    live = oom["top_live_sites"]
    assert sum(x["bytes"] for x in live) == oom["active_requested_bytes"]
    assert sum(x["count"] for x in live) == 4  # keep + the three 8 MiB
    # no entry without a stack: neither "<no stack>" nor "<no Python
    # frames: ...>" (`keep`, allocated before the recording, is "<no
    # stack: allocated before the trace>")
    assert all(x["site"] == "<no stack: allocated before the trace>" or
               not x["site"].startswith("<no ") for x in live)


# --- leaks: diff of two dumps, steps of one recording --------------------------

LOOP = """\
import sys
import memsnap.memory as mm
from torch.autograd.profiler import record_function
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
leak = sys.argv[1] == "leak"
params = [mm.caching_allocator_alloc(4 * MiB) for _ in range(4)]
kept = []

def forward():
    return [mm.caching_allocator_alloc((1 + i) * MiB) for i in range(5)]

def backward(acts):
    for a in reversed(acts):
        mm.caching_allocator_delete(a)

def remember():
    kept.append(mm.caching_allocator_alloc(2 * MiB))   # the planted leak

for step in range(10):
    with record_function(f"ProfilerStep#{step}"):
        acts = forward()
        if step in (4, 8):                  # dumped while activations live
            mm._dump_snapshot(f"{sys.argv[1]}_{step}.pickle")
        backward(acts)
        if leak:
            remember()
mm._dump_snapshot(f"{sys.argv[1]}_end.pickle")
"""


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    d = tmp_path_factory.mktemp("loops")
    script = write_script(d, "loop.py", LOOP)
    for kind in ("noleak", "leak"):
        run_file(script, args=[kind])
    return d


@needs_torch
def test_diff_of_a_loop_without_leak_has_no_candidate(loops):
    r = run_cli("diff", "--json", loops / "noleak_4.pickle",
                loops / "noleak_8.pickle")
    assert r.returncode == 0, r.stdout
    d = r.json["devices"][0]
    assert d["leak_candidates"] == []
    assert d["alignment"]["method"] == "time"
    # the activations live in both were freed and allocated again in
    # between (same addresses): freed + new, never kept
    new = {x["site"]: x["count"] for x in d["new_by_site"]}
    freed = {x["site"]: x["count"] for x in d["freed_by_site"]}
    assert new == freed and list(new.values()) == [5]
    assert [x["count"] for x in d["kept_by_site"]] == [4]   # the params


@needs_torch
def test_diff_finds_the_planted_leak_only(loops):
    r = run_cli("diff", "--json", loops / "leak_4.pickle",
                loops / "leak_8.pickle")
    assert r.returncode == 1
    (cand,) = r.json["devices"][0]["leak_candidates"]
    assert cand["site"].endswith(f"loop.py:{line_of(LOOP, 'planted')}:remember")
    assert cand["bytes"] == 4 * 2 * MiB and cand["count"] == 4
    # every device's candidates at the top level too, with the device
    assert r.json["leak_candidates"] == [{"device": 0, **cand}]


@needs_torch
def test_diff_of_files_in_the_wrong_order_warns(loops):
    """B taken before A (both timed): no alignment a step back in the loop,
    no leak candidate, a warning to swap them -- for the leak's dumps too."""
    for kind in ("noleak", "leak"):
        r = run_cli("diff", "--json", loops / f"{kind}_8.pickle",
                    loops / f"{kind}_4.pickle")
        assert r.returncode == 0, r.stdout
        assert r.json["same_process"] is True
        assert r.json["leak_candidate_count"] == 0
        assert any("taken before A" in w and "swapped" in w for w in r.json["warnings"])
        assert r.json["devices"][0]["alignment"]["b_first_entry_after_a"] is None


@needs_torch
def test_diff_warns_when_files_share_nothing(loops):
    r = run_cli("diff", "--json", loops / "noleak_8.pickle",
                loops / "leak_8.pickle")
    assert r.json["same_process"] is False
    assert r.json["leak_candidate_count"] == 0 and r.returncode == 0
    assert "different processes" in r.json["warnings"][0]


@needs_torch
def test_leaks_over_the_steps_of_one_recording(loops):
    r = run_cli("leaks", "--json", loops / "leak_end.pickle")
    assert r.returncode == 1, r.stdout
    (dev,) = r.json["devices"]
    assert dev["steps"] == 10 and dev["step_name"] == "ProfilerStep"
    (cand,) = dev["leak_candidates"]
    assert cand["site"].endswith(f"loop.py:{line_of(LOOP, 'planted')}:remember")
    # A step's END and its last alloc can share a microsecond (time_us):
    # that step's leak then counts at the next step's end.
    assert cand["steps_grown"] >= 8 and cand["steps_shrunk"] == 0
    assert cand["last_bytes"] - cand["first_bytes"] >= 16 * MiB
    assert cand["confidence"] > 0.85
    r = run_cli("leaks", "--json", loops / "noleak_end.pickle")
    assert r.returncode == 0 and r.json["leak_candidate_count"] == 0


@needs_torch
def test_leaks_over_several_snapshots(loops):
    files = [loops / f"leak_{s}.pickle" for s in (4, 8)] + \
        [loops / "leak_end.pickle"]
    r = run_cli("leaks", "--json", *files)
    (cand,) = r.json["devices"][0]["leak_candidates"]
    assert cand["site"].endswith(f"loop.py:{line_of(LOOP, 'planted')}:remember")
    assert r.json["warnings"] == []


# --- many ranks ----------------------------------------------------------------

RANK = """\
import os
import memsnap.memory as mm
from torch.autograd.profiler import record_function
rank = int(os.environ["RANK"])
mm._record_memory_history("all", stacks="python")
MiB = 1 << 20
params = [mm.caching_allocator_alloc(8 * MiB) for _ in range(4)]
kept = []

def cache(step):
    kept.append(mm.caching_allocator_alloc(MiB))   # leaks on every rank

for step in range(6):
    with record_function(f"ProfilerStep#{step}"):
        n = 12 if rank == 5 else 6                 # rank 5: the outlier
        acts = [mm.caching_allocator_alloc(3 * MiB) for _ in range(n)]
        for a in acts:
            mm.caching_allocator_delete(a)
        cache(step)
mm._dump_snapshot(f"snap_rank{rank}.pickle")
"""


@needs_torch
def test_fleet_flags_the_planted_outlier_among_eight_ranks(tmp_path):
    script = write_script(tmp_path, "rank.py", RANK)
    for r in range(8):
        run_file(script, env=base_env(RANK=str(r), WORLD_SIZE="8",
                                      LOCAL_RANK=str(r)))
    res = run_cli("fleet", "--json", "-j", "4", tmp_path)
    assert res.returncode == 1, res.stderr
    js = res.json
    assert [x["rank"] for x in js["ranks"]] == list(range(8))
    assert all(x["world_size"] == 8 and x["rank_source"] == "process_info"
               for x in js["ranks"])
    assert js["outliers"] == [str(tmp_path / "snap_rank5.pickle")]
    (r5,) = [x for x in js["ranks"] if x["rank"] == 5]
    assert r5["peak_reserved_bytes"] > js["medians"]["peak_reserved_bytes"]
    # peak requested under summary --json's name, and its earlier one
    summ = run_cli("summary", "--json", r5["file"]).json
    assert r5["peak_requested_bytes"] == sum(
        d["peak_requested_bytes"] for d in summ["devices"]) > 0
    for x in js["ranks"]:
        assert x["peak_requested_bytes"] == x["peak_allocated_bytes"]
    assert (js["medians"]["peak_requested_bytes"]
            == js["medians"]["peak_allocated_bytes"])
    (common,) = js["common_leaks"]
    assert common["site"].endswith(f"rank.py:{line_of(RANK, 'every rank')}:cache")
    assert common["ranks"] == 8
    # the same result with one thread
    one = run_cli("fleet", "--json", "-j", "1", tmp_path).json
    assert one["outliers"] == js["outliers"] and one["ranks"] == js["ranks"]
    txt = run_cli("fleet", tmp_path).stdout
    assert "snap_rank5.pickle  <- outlier" in txt
    assert "8/8 ranks" in txt


# --- which profile -------------------------------------------------------------

def test_replay_defaults_to_the_recordings_profile(tmp_path):
    """The live allocator takes the runtime's own profile (sim: cuda) unless
    MEMSNAP_PROFILE says; replay takes the recording's."""
    code = textwrap.dedent("""
    import memsnap.memory as mm, sys
    mm._record_memory_history("all", stacks="python")
    ps = [mm.caching_allocator_alloc(n) for n in (1 << 20, 3000, 5 << 20)]
    mm.caching_allocator_delete(ps[1])
    mm._dump_snapshot(sys.argv[1])
    """)
    script = write_script(tmp_path, "rec.py", code)
    for prof in ("npu", "cuda"):
        env = base_env(MEMSNAP_PROFILE=prof) if prof == "npu" else base_env()
        out = tmp_path / f"{prof}.pickle"
        run_file(script, env=env, args=[out])
        with open(out, "rb") as f:
            assert pickle.load(f)["process_info"]["profile"] == prof
        r = run_cli("replay", "--json", out)
        assert r.json["profile"] == prof, r.stdout
        assert r.returncode == 0
    # a 1 MiB request is a 1 MiB block under cuda (no NPU pad)
    with open(tmp_path / "cuda.pickle", "rb") as f:
        blocks = [b for s in pickle.load(f)["segments"] for b in s["blocks"]
                  if b["requested_size"] == 1 << 20]
    assert blocks[0]["size"] == 1 << 20
