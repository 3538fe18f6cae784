"""memsnap.predict: real torch.nn models through `python -m memsnap.predict`.

The scripts in predict_scripts/ are ordinary training scripts (they run on
a GPU or an NPU as they are); every test runs them unchanged, as a user
would, in a subprocess, with the real torch of the test venv (CPU build:
there is no device, which is the point).  Checked: the verdict and exit
status, the snapshot (``memsnap check``, torch's memory_viz consumers,
the viewer's pickle opcode subset), the peak against torch's MemTracker on
the same model, the OOM report, the what-if table against standalone runs,
module annotations, per-rank memory under FSDP2, DDP's gradient buckets,
and the errors.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import base_env, run_cli, run_script

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "predict_scripts")
GPT = os.path.join(SCRIPTS, "gpt_train.py")
FSDP = os.path.join(SCRIPTS, "gpt_fsdp.py")
DDP = os.path.join(SCRIPTS, "linear_ddp.py")
PINNED = os.path.join(SCRIPTS, "pinned_loader.py")
CLI = os.path.join(os.path.dirname(sys.executable), "memsnap")
# Tolerance of the MemTracker comparison (docs/predict.md): memsnap counts
# blocks as the caching allocator hands them out (rounded to 512 B, npu
# +32 B, whole unsplit remainders), MemTracker counts storage bytes.
MEMTRACKER_TOLERANCE = 0.01

# The default model of gpt_train.py.
VOCAB, SEQ, D, LAYERS = 8192, 256, 512, 6


def predict(*args, cwd=None, timeout=600, stdin=None):
    """`python -m memsnap.predict ARGS` (`stdin`: bytes for its standard
    input); stdout and stderr as text, `.json` the --json object."""
    p = subprocess.run([sys.executable, "-m", "memsnap.predict", *args], env=base_env(),
                       capture_output=True, cwd=cwd, timeout=timeout, input=stdin)
    p.stdout, p.stderr = p.stdout.decode(), p.stderr.decode()
    p.json = None
    if "--json" in args and p.stdout.strip():
        p.json = json.loads(p.stdout.strip().splitlines()[-1])
    return p


def param_count() -> int:
    """Parameters of the default GPT (built on the meta device)."""
    sys.path.insert(0, SCRIPTS)
    try:
        import gpt_train
    finally:
        sys.path.remove(SCRIPTS)
    with torch.device("meta"):
        m = gpt_train.GPT(VOCAB, SEQ, D, LAYERS, 8)
    return sum(p.numel() for p in m.parameters())


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def check_cli(path):
    p = subprocess.run([CLI, "check", str(path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """Must show 1 and 3: the GPT script on "npu", 64G, with --compare."""
    d = tmp_path_factory.mktemp("gpt")
    out = d / "gpt.pickle"
    p = predict("--memory", "64G", "--compare", "--json", "-o", str(out), GPT, cwd=d)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, out


def test_gpt_fits_on_64g(gpt_run):
    p, out = gpt_run
    r = p.json
    assert r["fits"] is True and r["oom"] is None and r["complete"] is True
    assert r["profile"] == "npu" and r["memory_bytes"] == 64 << 30
    assert r["snapshot"] == str(out) and out.exists()
    # The script's own output went to stderr, the JSON alone to stdout.
    assert "step 1: loss" in p.stderr
    # Peak allocated >= fp32 weights + grads + AdamW's two states.
    n = param_count()
    assert r["peak_allocated_bytes"] >= n * 4 * 4
    assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"]
    assert r["fragmentation_bytes"] == (r["devices"]["0"]["peak_reserved_bytes"]
                                        - r["devices"]["0"]["allocated_at_peak_reserved_bytes"])
    # Top sites are lines of the script (never memsnap or torch).
    assert r["top_sites"] and all(s["filename"] == GPT for s in r["top_sites"])


def test_gpt_snapshot_is_valid(gpt_run):
    _, out = gpt_run
    assert "ok" in check_cli(out)
    # The CLI's replay engine, fed the recorded stream, makes the same
    # decisions as the prediction did.
    rp = subprocess.run([CLI, "replay", "--json", "--profile", "npu", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    replay = json.loads(rp.stdout)
    assert replay["matches_recording"] is True
    assert replay["peak_reserved_bytes"] == gpt_run[0].json["peak_reserved_bytes"]
    raw = out.read_bytes()
    from test_memory_viz import ALLOWED

    assert {op.name for op, _, _ in pickletools.genops(raw)} - ALLOWED == set()
    viz = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot",
                          str(out), "-o", str(out) + ".html"], capture_output=True, text=True,
                         timeout=300)
    assert viz.returncode == 0, viz.stderr


def test_gpt_alloc_entries_carry_user_frames(gpt_run):
    _, out = gpt_run
    s = load(out)
    allocs = [e for e in s["device_traces"][0] if e["action"] == "alloc"]
    assert len(allocs) > 500
    in_script = [e for e in allocs if any(f["filename"] == GPT for f in e["frames"])]
    assert len(in_script) / len(allocs) > 0.95
    # No frame of memsnap's own machinery in any stack.
    pkg = os.path.dirname(os.path.dirname(__import__("memsnap").__file__))
    for e in allocs:
        for f in e["frames"]:
            assert "memsnap" + os.sep + "predict" not in f["filename"], f
            assert not f["filename"].startswith(os.path.join(pkg, "memsnap")), f
    # Backward allocations carry the user's loss.backward() line.
    src = open(GPT).read().splitlines()
    line = next(i + 1 for i, t in enumerate(src) if "loss.backward()" in t)
    assert any(f["filename"] == GPT and f["line"] == line
               for e in allocs for f in e["frames"])


def test_gpt_annotations(gpt_run):
    _, out = gpt_run
    ann = load(out)["external_annotations"]
    names = {(a["name"], a["stage"]) for a in ann}
    for name in ("blocks.0.attn", "blocks.5.mlp.fc", "blocks.0.attn (backward)",
                 "head (backward)", "AdamW.step", "GPT"):
        assert (name, "START") in names and (name, "END") in names, name
    # START/END balanced per name, times in order.
    for name in {a["name"] for a in ann}:
        stages = [a["stage"] for a in ann if a["name"] == name]
        assert stages.count("START") == stages.count("END"), name
    times = [a["time_us"] for a in ann]
    assert times == sorted(times)
    # Two optimizer steps.
    assert sum(1 for a in ann if a["name"] == "AdamW.step" and a["stage"] == "START") == 2


def test_what_if_table_matches_standalone_runs(gpt_run, tmp_path):
    """Must show 3: default vs expandable_segments:True vs the other
    profile, from one run; each row equals a run of that configuration
    alone."""
    p, _ = gpt_run
    r = p.json
    rows = [(w["profile"], w["alloc_conf"]) for w in r["what_if"]]
    assert rows == [("npu", "expandable_segments:True"), ("cuda", "")]
    text = predict("--memory", "64G", "--compare", "-o", str(tmp_path / "t.pickle"), GPT,
                   cwd=tmp_path)
    assert text.returncode == 0
    assert "what-if (same run)" in text.stdout
    assert "npu expandable_segments:True" in text.stdout and "cuda (default)" in text.stdout
    for w in r["what_if"]:
        args = ["--profile", w["profile"], "--alloc-conf", w["alloc_conf"]]
        alone = predict("--memory", "64G", "--json", *args, "-o", str(tmp_path / "a.pickle"),
                        GPT, cwd=tmp_path)
        assert alone.returncode == 0, alone.stderr
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation_bytes"):
            assert alone.json[key] == w[key], (w["profile"], w["alloc_conf"], key)
    # Expandable segments leave less reserved-but-unallocated memory.
    exp = r["what_if"][0]
    assert exp["fragmentation_bytes"] < r["fragmentation_bytes"]


def test_gpt_oom(tmp_path):
    """Must show 2: --memory below weights + optimizer states."""
    n = param_count()
    memory = n * 4 * 3  # weights + AdamW states, less grads
    out = tmp_path / "oom.pickle"
    p = predict("--memory", str(memory), "--json", "-o", str(out), GPT, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    r = p.json
    assert r["fits"] is False
    oom = r["oom"]
    assert oom["requested_bytes"] > 0 and oom["free_bytes"] < oom["requested_bytes"] + (2 << 20)
    assert oom["total_bytes"] == memory
    assert oom["stack"] and oom["stack"][0]["filename"] == GPT
    assert oom["line"].startswith(os.path.relpath(GPT, tmp_path) + ":") or GPT in oom["line"]
    assert "out of memory" in oom["message"]
    # The OOM snapshot: written, valid, ends at the oom entry.
    assert r["snapshot"] == str(out)
    assert "ok" in check_cli(out)
    trace = load(out)["device_traces"][0]
    assert trace[-1]["action"] == "oom"
    assert any(f["filename"] == GPT for f in trace[-1]["frames"])
    # The text report names the line and the stack.
    t = predict("--memory", str(memory), "-o", str(out), GPT, cwd=tmp_path)
    assert t.returncode == 1
    assert "verdict: OUT OF MEMORY" in t.stdout and "gpt_train.py:" in t.stdout
    assert "user stack (innermost first)" in t.stdout and "OOM snapshot:" in t.stdout


# Forward fits in 100 MiB, backward does not (four 16 MiB tensors live
# after forward; backward adds grad_h, grad_w2 and grad_w1).
BACKWARD_OOM = """\
import sys
import torch
n = 4 << 20
x = torch.randn(n, device="npu")
w1 = torch.randn(n, device="npu", requires_grad=True)
w2 = torch.randn(n, device="npu", requires_grad=True)
h = x * w1
loss = (h * w2).sum()
if sys.argv[1:] == ["grad"]:
    torch.autograd.grad(loss, [w1, w2])
else:
    loss.backward()
print("the script went on after the OOM", file=sys.stderr)
"""


@pytest.mark.parametrize("how", ["backward", "backward", "backward", "grad", "compare"])
def test_oom_in_backward(tmp_path, how):
    """An OOM inside the autograd engine: exit 1, the report and the OOM
    snapshot, every time (raising inside the engine used to abort the
    process in torch's Python device guard: rc 134, "terminate called
    without an active exception")."""
    script = tmp_path / "bw.py"
    script.write_text(BACKWARD_OOM)
    out = tmp_path / "bw.pickle"
    extra = ["--compare"] if how == "compare" else []
    args = ["grad"] if how == "grad" else []
    p = predict("--memory", "100M", "--json", *extra, "-o", str(out), str(script), *args,
                cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    oom = p.json["oom"]
    assert oom["phase"] == "backward"
    assert oom["line"] == ("bw.py:10 in <module>" if how == "grad" else "bw.py:12 in <module>")
    assert p.json["snapshot"] == str(out)
    assert "ok" in check_cli(out)
    assert load(out)["device_traces"][0][-1]["action"] == "oom"
    # Stopped as backward() returned: no line after it ran.
    assert "went on" not in p.stderr
    assert p.json["script_error"] is None


def test_matches_memtracker(tmp_path):
    """Peak allocated vs torch's MemTracker on the same model and run
    (MemTracker supports one iteration: one step)."""
    code = f"""
        import json, sys
        sys.path.insert(0, {SCRIPTS!r})
        sys.argv = ["gpt_train.py", "--steps", "1"]
        import gpt_train
        from memsnap.predict import predict
        from torch.distributed._tools.mem_tracker import MemTracker
        with predict(memory="64G", what_if=["cuda"]) as p:
            mt = MemTracker()
            with mt:
                gpt_train.main()
            peak = mt.get_tracker_snapshot("peak")
        print("RESULT " + json.dumps({{"mt": {{str(k): v["Total"] for k, v in peak.items()}},
                                      "npu": p.peak_allocated_bytes,
                                      "cuda": p.what_if[0]["peak_allocated_bytes"],
                                      "npu_requested": p.peak_requested_bytes,
                                      "cuda_requested": p.what_if[0]["peak_requested_bytes"]}}))
    """
    r = run_script(code, timeout=600).result
    mt = r["mt"]["npu:0"]
    for profile in ("npu", "cuda"):
        ours = r[profile]
        assert ours >= mt  # rounding only ever adds
        assert abs(ours - mt) / mt <= MEMTRACKER_TOLERANCE, (profile, ours, mt)
        # the tensors' own bytes: what MemTracker counts
        assert r[profile + "_requested"] == mt, (profile, r[profile + "_requested"], mt)


def test_cuda_script(tmp_path):
    """The same script written for CUDA: the cuda profile by default."""
    out = tmp_path / "c.pickle"
    p = predict("--memory", "64G", "--json", "-o", str(out), GPT, "--device", "cuda",
                "--layers", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["profile"] == "cuda" and p.json["fits"]
    assert "ok" in check_cli(out)


def test_device_name_names_the_profile_the_script_gets(tmp_path):
    """torch.cuda.get_device_name before the first allocation names the
    cuda profile the script will get, as the report does (it said npu)."""
    script = tmp_path / "name.py"
    script.write_text(
        "import torch\n"
        "print('NAME', torch.cuda.get_device_name(0), '|',\n"
        "      torch.cuda.get_device_properties(0).name)\n"
        "x = torch.ones(4, device='cuda')\n"
        "print('AFTER', torch.cuda.get_device_name(0))\n")
    p = predict("--memory", "8G", "--json", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["profile"] == "cuda"
    assert ("NAME memsnap sim device (cuda) | memsnap sim device (cuda)"
            in p.stdout + p.stderr), p.stdout + p.stderr
    assert "AFTER memsnap sim device (cuda)" in p.stdout + p.stderr


def test_python_api_twice_in_one_process():
    code = f"""
        import json, sys
        sys.path.insert(0, {SCRIPTS!r})
        import torch, torch.nn.functional as F
        from memsnap.predict import predict
        from gpt_train import GPT
        res = []
        for _ in range(2):
            with predict(memory="8G", compare=True) as p:
                m = GPT(1024, 64, 128, 2, 4).to("npu")
                opt = torch.optim.AdamW(m.parameters())
                x = torch.randint(0, 1024, (4, 64), device="npu")
                F.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
                opt.step()
                inside = torch.npu.max_memory_allocated()
            res.append([p.fits, p.peak_allocated_bytes, p.peak_reserved_bytes, inside,
                        len(p.what_if)])
        print("RESULT " + json.dumps(res))
    """
    a, b = run_script(code).result
    assert a == b  # fresh allocators each time: deterministic
    assert a[0] is True and a[1] > 0 and a[2] >= a[1]
    assert a[3] == a[1]  # torch.npu.max_memory_allocated() is the prediction
    assert a[4] == 2


def test_fsdp_per_rank_memory(tmp_path):
    """FSDP2 over a fake process group: per-rank optimizer state is 1/N
    (two steps: the peak of the second holds the state the first made)."""
    def run(n):
        p = predict("--memory", "64G", "--json", "--devices", str(n), "--rank", str(n - 1),
                    "-o", str(tmp_path / f"f{n}.pickle"), FSDP, "--steps", "2", cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.json

    one, four = run(1), run(4)
    assert four["world_size"] == 4 and four["rank"] == 3 and four["device"] == 3

    def step_bytes(r):  # live bytes allocated by opt.step() at the peak
        src = open(FSDP).read().splitlines()
        line = next(i + 1 for i, t in enumerate(src) if "opt.step()" in t)
        return sum(s["requested_bytes"] for s in r["top_sites"] if s["line"] == line
                   and s["filename"] == FSDP)

    n = param_count()
    assert step_bytes(one) >= 2 * 4 * n
    assert step_bytes(four) <= step_bytes(one) / 4 + (1 << 20)
    assert four["peak_allocated_bytes"] < one["peak_allocated_bytes"]

    # DTensor's metadata propagation (global-shape tensors under a
    # FakeTensorMode of its own in eager mode) allocates nothing on a device
    def propagation_allocs(n):
        with open(tmp_path / f"f{n}.pickle", "rb") as f:
            snap = pickle.load(f)
        return [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"
                and any("_sharding_prop.py" in fr["filename"]
                        or fr["name"] == "_rebuild_tensor_from_dtensor_meta"
                        for fr in e.get("frames", []))]

    assert propagation_allocs(1) == [] and propagation_allocs(4) == []

    # each rank's snapshot names its rank, as a rank's own dump would
    with open(tmp_path / "f4.pickle", "rb") as f:
        info = pickle.load(f)["process_info"]
    assert (info["rank"], info["world_size"], info["local_rank"]) == (3, 4, 3)


CUDA_IN_BACKWARD = """
import torch

class ToCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g.cpu().to("cuda") * 2  # Python run by the autograd engine

x = torch.randn(1024, device="cuda", requires_grad=True)
ToCuda.apply(x).sum().backward()
assert x.grad.device == torch.empty(1, device="cuda").device
"""

TP_CUDA = """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
m = nn.Sequential(nn.Linear(256, 1024, bias=False), nn.ReLU(), nn.Linear(1024, 256, bias=False)).cuda()
parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
m(torch.randn(8, 256, device="cuda")).sum().backward()
"""


def test_cuda_arguments_mapped_inside_backward(tmp_path):
    """"cuda" arguments of Python that the autograd engine runs -- a custom
    Function's backward, DTensor's from_local moving a gradient to the
    mesh's device in a tensor-parallel script written for CUDA -- are the
    fake device's, as in the forward."""
    for name, code, extra in (("fn.py", CUDA_IN_BACKWARD, ()),
                              ("tp.py", TP_CUDA, ("--devices", "2"))):
        script = tmp_path / name
        script.write_text(code)
        p = predict("--memory", "64G", "--json", *extra, "-o", str(tmp_path / (name + ".pickle")),
                    str(script), cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.json["peak_allocated_bytes"] > 0


SEQUENTIAL = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(1024, 4096), nn.Sequential(nn.ReLU(), nn.Linear(4096, 1024)),
                      nn.Linear(1024, 1024)).to("cuda")
x = torch.randn(256, 1024, device="cuda")
model(x).square().mean().backward()
"""


def test_sequential_phase_labels(tmp_path):
    """Ranges of an nn.Sequential's children are named by their path from
    the outermost module and their class, never a bare index: in the
    snapshot's annotations, the JSON (peak_phase, oom.phase) and the text
    report."""
    script = tmp_path / "seq.py"
    script.write_text(SEQUENTIAL)
    p = predict("--memory", "64G", "--json", "-o", str(tmp_path / "s.pickle"), str(script),
                cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    ann = load(tmp_path / "s.pickle")["external_annotations"]
    names = {a["name"] for a in ann}
    for name in ("Sequential", "Sequential.0 (Linear)", "Sequential.1 (Sequential)",
                 "Sequential.1.0 (ReLU)", "Sequential.1.1 (Linear)", "Sequential.2 (Linear)",
                 "Sequential.0 (Linear) (backward)", "Sequential.2 (Linear) (backward)",
                 "Sequential.1.1 (Linear) (backward)"):
        assert name in names, (name, names)
    assert not any(n.split(" ")[0].isdigit() for n in names), names
    assert p.json["peak_phase"] in names
    # Out of memory in the backward (weights 16 + 16 + 4 MiB, activations
    # of 256 x 4096 fp32: 4 MiB).
    oom = predict("--memory", "64M", "--json", "-o", str(tmp_path / "o.pickle"), str(script),
                  cwd=tmp_path)
    assert oom.returncode == 1, oom.stdout + oom.stderr
    phase = oom.json["oom"]["phase"]
    assert phase in names and phase.startswith("Sequential.") and "(" in phase, phase
    text = predict("--memory", "64M", "-o", str(tmp_path / "t.pickle"), str(script),
                   cwd=tmp_path)
    assert text.returncode == 1
    assert f"  during {phase}\n" in text.stdout, text.stdout


def test_ddp_gradient_buckets(tmp_path):
    """A plain DistributedDataParallel script (nn.Linear layers, SGD with
    momentum, three steps) over the fake process group: DDP's parameter
    check and its gradient allreduce (default comm hook) go through, and
    the prediction holds DDP's gradient buckets on top of parameters,
    gradients and momentum; gradient_as_bucket_view=True holds less."""
    src = open(DDP).read().splitlines()

    def line_of(text):
        return next(i + 1 for i, t in enumerate(src) if text in t)

    def run(*extra):
        out = tmp_path / f"ddp{''.join(extra)}.pickle"
        p = predict("--memory", "64G", "--json", "--devices", "2", "--rank", "1",
                    "-o", str(out), DDP, *extra, cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        r = p.json
        assert r["complete"] and r["fits"] and r["script_error"] is None
        assert (r["world_size"], r["rank"], r["device"]) == (2, 1, 1)
        check_cli(out)
        return r

    def site_bytes(r, line):
        return sum(s["requested_bytes"] for s in r["top_sites"]
                   if s["line"] == line and s["filename"] == DDP)

    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    plain = run()
    # The buckets are (re)built at the forward of the second step.
    assert site_bytes(plain, line_of("loss = F.cross_entropy(ddp(x), y)")) >= params
    assert site_bytes(plain, line_of("model = model.to(device)")) >= params
    assert site_bytes(plain, line_of("opt.step()")) >= params  # momentum
    assert plain["peak_allocated_bytes"] >= 4 * params
    view = run("--bucket-view")
    assert view["peak_allocated_bytes"] < plain["peak_allocated_bytes"] - params // 4
    # find_unused_parameters=True (an unused head): the reducer stages its
    # bitmap of used parameters in pinned host memory (plain host memory in
    # a prediction, is_pinned() True as its assert wants) and allreduces it.
    unused = run("--find-unused")
    head = 2048 * 10 * 4 + 10 * 4
    assert unused["peak_allocated_bytes"] >= plain["peak_allocated_bytes"] + head
    assert unused["peak_allocated_bytes"] <= plain["peak_allocated_bytes"] + 4 * head + (2 << 20)
    # No bucket rebuild with find_unused_parameters (reducer.cpp,
    # should_rebuild_buckets): the buckets made by the constructor stay.
    assert site_bytes(unused, line_of("ddp = DDP(model")) >= params + head
    assert site_bytes(unused, line_of("loss.backward()")) >= params  # gradients
    assert site_bytes(unused, line_of("opt.step()")) >= params  # momentum


def test_pinned_host_memory(tmp_path):
    """pin_memory(), torch.empty(..., pin_memory=True), is_pinned() and
    non_blocking copies of a CUDA input pipeline: pinned host memory is
    plain host memory (no device runtime needed), the pinned tensors report
    is_pinned() True and others False, the run completes and counts the
    model, its gradients and the copied batches on the device (nothing for
    the pinned host buffers)."""
    out = tmp_path / "pinned.pickle"
    p = predict("--json", "-o", str(out), PINNED, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = p.json
    assert r["complete"] and r["fits"] and r["script_error"] is None
    assert "staging pinned: True, labels pinned: True, unpinned: False" in p.stderr
    assert p.stderr.count("batch on npu:0, small pinned True") == 3
    src = open(PINNED).read().splitlines()

    def site_bytes(text):
        line = next(i + 1 for i, t in enumerate(src) if text in t)
        return sum(s["requested_bytes"] for s in r["top_sites"]
                   if s["line"] == line and s["filename"] == PINNED)

    w, batch = 1024, 256
    params = (w * w + w + w * 10 + 10) * 4
    assert r["peak_allocated_bytes"] >= 2 * params + batch * w * 4  # params, grads, batch
    assert r["peak_allocated_bytes"] < 4 * params + 8 * batch * w * 4
    assert site_bytes("x = staging.to(args.device, non_blocking=True)") == batch * w * 4
    assert site_bytes("staging = torch.empty(") == 0  # host memory, not the device's
    assert "ok" in check_cli(out)


def test_reserve_adds_to_reserved(tmp_path):
    p = predict("--memory", "64G", "--reserve", "3G", "--json", "-o",
                str(tmp_path / "r.pickle"), GPT, "--layers", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.json["reserve_bytes"] == 3 << 30
    assert p.json["peak_reserved_bytes"] >= 3 << 30
    # "to spare" is the device less the peak, which holds the reserve once
    text = predict("--memory", "64G", "--reserve", "3G", "-o",
                   str(tmp_path / "r2.pickle"), GPT, "--layers", "1", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    verdict = [x for x in text.stdout.splitlines() if x.startswith("verdict: FITS")]
    spare = (64 << 30) - p.json["peak_reserved_bytes"]
    assert verdict and f"{spare / (1 << 30):.2f} GiB to spare" in verdict[0], verdict
    big = predict("--memory", "2G", "--reserve", "3G", GPT, cwd=tmp_path)
    assert big.returncode == 2 and "--reserve" in big.stderr
    # Refused before the script runs: nothing of it happens, and a script
    # that never touches the device is not told it fits.
    side = tmp_path / "side.py"
    side.write_text("open('ran', 'w').write('x')\nprint('SCRIPT RAN')\n")
    for script in (side, GPT):
        big = predict("--memory", "2G", "--reserve", "3G", str(script), cwd=tmp_path)
        assert big.returncode == 2, big.stdout + big.stderr
        assert "--reserve 3.00 GiB (3221225472 B) does not fit in a device of " \
               "--memory 2.00 GiB (2147483648 B)" in big.stderr
        assert "SCRIPT RAN" not in big.stdout and not (tmp_path / "ran").exists()
    from memsnap.predict import predict as api

    with pytest.raises(ValueError, match="does not fit in a device"):
        api(memory="2G", reserve="3G")


def test_usage_and_script_errors(tmp_path):
    nope = predict("--memory", "64G", str(tmp_path / "nope.py"))
    assert nope.returncode == 2 and "nope.py: no such file" in nope.stderr
    folder = predict("--memory", "64G", str(tmp_path))
    assert folder.returncode == 2, folder.stdout + folder.stderr
    assert "a directory without a __main__ module" in folder.stderr
    bad = predict("--memory", "lots", GPT)
    assert bad.returncode == 2 and "invalid size" in bad.stderr
    # a positive fraction of a byte is refused as such, not as "not positive"
    half = predict("--memory", "0.5", GPT)
    assert half.returncode == 2 and "'0.5': less than 1 byte" in half.stderr
    zero = predict("--memory", "0", GPT)
    assert zero.returncode == 2 and "'0': must be positive" in zero.stderr
    # a negative size after a space is the option's value, said by the size
    # parser (argparse alone takes "-5G" for an unknown option), wherever
    # the option stands among the others; the script's own arguments are
    # left alone
    for args in (["--memory", "-5G"], ["-o", str(tmp_path / "x.pickle"), "--memory", "-5G"],
                 ["--reserve", "-1G"], ["--memory=-5G"], ["--mem", "-5G"]):
        neg = predict(*args, GPT)
        assert neg.returncode == 2, (args, neg.stderr)
        assert "invalid size '-" in neg.stderr and "expected one argument" not in neg.stderr
    passed = predict("--memory", "8G", str(tmp_path / "nope.py"), "--memory", "-5G")
    assert passed.returncode == 2 and "nope.py: no such file" in passed.stderr
    dashes = predict("--", "--memory", "-5G")  # after --: SCRIPT, as given
    assert dashes.returncode == 2 and "--memory: no such file" in dashes.stderr
    missing = predict("--memory", "--json", GPT)  # an option is no value
    assert missing.returncode == 2 and "expected one argument" in missing.stderr
    empty = predict("-o", "", GPT)
    assert empty.returncode == 2 and "-o: output path is empty" in empty.stderr
    conf = predict("--alloc-conf", "max_split_sise_mb:64", "--profile", "npu", GPT,
                   "--layers", "1", cwd=tmp_path)
    assert conf.returncode == 2 and "max_split_sise_mb" in conf.stderr
    script = tmp_path / "boom.py"
    script.write_text("import torch\nx = torch.ones(3, device='npu')\n"
                      "raise ValueError('boom at line 3')\n")
    p = predict("--memory", "1G", str(script), cwd=tmp_path)
    assert p.returncode == 2
    assert "the script failed" in p.stdout and "boom at line 3" in p.stdout
    assert "boom.py\", line 3" in p.stdout
    # The run did not finish: the verdict says so, and so does the JSON.
    assert "verdict: FITS so far  (the script failed before its end" in p.stdout
    assert "verdict: FITS  (" not in p.stdout
    j = predict("--memory", "1G", "--json", str(script), cwd=tmp_path)
    assert j.returncode == 2 and j.json["fits"] is True and j.json["complete"] is False


def test_no_script_names_only_script_as_required():
    """ARGS is optional: the error and the usage name SCRIPT alone."""
    p = predict()
    assert p.returncode == 2
    assert "the following arguments are required: SCRIPT\n" in p.stderr
    assert "ARGS" not in p.stderr.splitlines()[-1]
    assert "SCRIPT [ARGS ...]" in p.stderr
    # The script's own options still reach it.
    assert "SCRIPT [ARGS ...]" in predict("--help").stdout


THREADS = """import threading, torch
out = []
def work():
    out.append(torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE))
def mine():
    raise ValueError("the thread's own error")
ts = [threading.Thread(target=work) for _ in range(3)]
[t.start() for t in ts]; [t.join() for t in ts]
# after the others: its traceback is not interleaved with their lines
m = threading.Thread(target=mine, name="mine"); m.start(); m.join()
x = torch.nn.Linear(256, 256).to(DEVICE)
print(torch.cuda.memory_allocated() if DEVICE == "cuda" else torch.npu.memory_allocated())
"""


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_device_work_in_other_threads_is_not_a_fit(tmp_path, device):
    """Threads' device operators are not seen: each such thread fails on
    the real backend.  The report lists them in one line per distinct
    failure (no 60-line tracebacks), the verdict is UNKNOWN (never FITS),
    the JSON says threads_not_seen and complete: false, exit status 2.  A
    thread's own exception keeps Python's traceback."""
    script = tmp_path / "threads.py"
    script.write_text(f"DEVICE = {device!r}\n" + THREADS)
    p = predict("--memory", "1G", str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    backend = "CUDA" if device == "cuda" else "npu"
    short = (f"NotImplementedError: Could not run 'aten::empty.memory_format' with "
             f"arguments from the '{backend}' backend")
    assert "device work in 3 other threads was not seen" in p.stdout
    assert f"3 threads  threads.py:5 in work: {short}" in p.stdout
    assert "verdict: UNKNOWN  (device work in 3 other threads was not seen" in p.stdout
    assert "verdict: FITS" not in p.stdout
    # stderr: one line for the three threads, torch's dispatcher listing
    # never; the thread's own ValueError as Python prints it.
    assert p.stderr.count("device work not seen") == 1
    assert "registered at" not in p.stderr
    assert "ValueError: the thread's own error" in p.stderr
    assert "Exception in thread mine" in p.stderr
    # The main thread's Linear is predicted as usual.
    assert "peak allocated            0 B" not in p.stdout
    j = predict("--memory", "1G", "--json", str(script), cwd=tmp_path)
    assert j.returncode == 2
    assert j.json["threads_not_seen"] == 3 and j.json["complete"] is False
    assert j.json["fits"] is True and j.json["script_error"] is None
    assert j.json["thread_errors"] == [
        {"site": "threads.py:5 in work", "error": short, "threads": 3}]


def test_report_counts_one_in_the_singular(tmp_path):
    """One allocator event (an allocation larger than the device: its
    OOM) and one thread not seen read in the singular."""
    script = tmp_path / "one.py"
    script.write_text("import threading, torch\n"
                      "t = threading.Thread(target=lambda: torch.ones(8, device='cuda'))\n"
                      "t.start(); t.join()\n"
                      "x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n")
    p = predict("--memory", "1G", str(script), cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "  1 allocator event in " in p.stdout, p.stdout
    assert ("device work in 1 other thread was not seen (predict follows the main thread "
            "only; it failed at its first device operator):") in p.stdout, p.stdout
    assert "1 thread  one.py:2 in <lambda>: " in p.stdout, p.stdout


def test_percentages_never_round_to_all_or_nothing(tmp_path):
    """A share is 100.0% only when it is all, 0.0% only when it is none:
    512 B live in a 2 MiB segment is 99.98% fragmentation, not 100.0%."""
    from memsnap.predict._report import _pct
    assert [_pct(x) for x in (0, 1, 0.479, 0.9998, 0.9995, 0.00004, 1 - 1e-12, 1e-12)] == [
        "0.0%", "100.0%", "47.9%", "99.98%", "99.95%", "0.004%", ">99.9999%", "<0.0001%"]
    script = tmp_path / "small.py"
    script.write_text("import torch\n"
                      "x = torch.empty(512, dtype=torch.uint8, device='cuda')\n")
    p = predict(str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "(99.98% of reserved at its peak" in p.stdout, p.stdout


def test_threads_without_device_work_keep_the_verdict(tmp_path):
    """CPU work in threads is fine: FITS, exit 0, threads_not_seen 0."""
    script = tmp_path / "cpu_threads.py"
    script.write_text("import threading, torch\n"
                      "t = threading.Thread(target=lambda: torch.ones(8) * 2)\n"
                      "t.start(); t.join()\n"
                      "x = torch.ones(1024, device='npu')\n")
    p = predict("--memory", "1G", "--json", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.json["threads_not_seen"] == 0 and p.json["complete"] is True


def test_memory_outside_the_device_range(tmp_path):
    """--memory below the 2 MiB segment granule (or above 256 TiB) is
    refused before the script runs, as `memsnap replay --device-memory`;
    2M itself is a device of exactly 2 MiB."""
    script = tiny(tmp_path)
    for size in ("1K", "2097151", "257T"):
        p = predict("--memory", size, script, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"memory {size}" in p.stderr and "2M..256T" in p.stderr
        assert "script ran" not in p.stderr
    ok = predict("--memory", "2M", "--json", script, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.json["memory_bytes"] == 2 << 20 and ok.json["complete"] is True
    from memsnap.predict import predict as api

    with pytest.raises(ValueError, match="2M..256T"):
        api(memory="1K")


SIZE_FORMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime",
                          "size_forms.txt")


def size_forms():
    """(text, bytes or None) of the table C's msnap__parse_size is tested
    with too (tests/runtime/test_env.c)."""
    with open(SIZE_FORMS) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#") or "|" not in line:
                continue
            text, _, want = line.rpartition("|")
            yield text, None if want == "invalid" else int(want)


def test_parse_size_accepts_what_the_c_parser_accepts():
    """predict's --memory and MEMSNAP_SIM_MEMORY take the same forms: every
    row of the shared table gives the same bytes (0 aside: a device size
    must be positive), and a fractional size reaches the simulated device
    through MEMSNAP_SIM_MEMORY (the C parser) exactly as parse_size reads
    it."""
    from memsnap.predict import parse_size

    rows = list(size_forms())
    assert len(rows) >= 40
    for text, want in rows:
        if want is None or want == 0:
            with pytest.raises(ValueError):
                parse_size(text)
        else:
            assert parse_size(text) == want, text
    for text in ("1.5G", "80GB", "512 M"):
        r = run_script("import memsnap.memory as mm\n"
                       "print('RESULT', mm.mem_get_info(0)[1])\n",
                       env=base_env(MEMSNAP_SIM_MEMORY=text))
        assert r.result == parse_size(text) and "warning" not in r.stderr, text


OS_EXIT = """import os, threading, torch
x = torch.ones(1000, device="cuda")
# A thread that never ends: only os._exit ends this process.
threading.Thread(target=threading.Event().wait).start()
os._exit(CODE)
print("not reached")
"""


@pytest.mark.parametrize("code", [0, 3])
def test_os_exit_reports_first(tmp_path, code):
    """os._exit in the script: the report and the snapshot come first,
    then the process ends through os._exit (the script's endless thread
    is not waited for); status 0 for os._exit(0), 2 (a failed script, as
    sys.exit(3)) otherwise."""
    script = tmp_path / "osexit.py"
    script.write_text(OS_EXIT.replace("CODE", str(code)))
    out = tmp_path / "o.pickle"
    p = predict("--json", "-o", str(out), str(script), cwd=tmp_path, timeout=120)
    assert p.returncode == (0 if code == 0 else 2), p.stdout + p.stderr
    assert "not reached" not in p.stderr
    assert p.json["snapshot"] == str(out) and p.json["complete"] is (code == 0)
    assert p.json["script_error"] == (None if code == 0 else "os._exit(3)")
    assert any(s["line"] == 2 for s in p.json["top_sites"])
    assert any(e["action"] == "alloc" for e in load(out)["device_traces"][0])
    text = predict(str(script), cwd=tmp_path, timeout=120)
    assert "verdict: FITS" in text.stdout and "snapshot: osexit_predict.pickle" in text.stdout


# Python code raising inside the autograd engine (docs/predict.md, "A script
# that fails"): torch leaves the error pending in the interpreter while the
# engine unwinds through the fake device's stream guard; predict used to
# abort there (std::terminate, exit 134, no report, no snapshot).
RAISING_HOOKS = {
    "tensor_hook_leaf": (
        "m.weight.register_hook(lambda g: 1 / 0)\n"
        "m(torch.randn(8, 64, device='cuda')).sum().backward()\n",
        "ZeroDivisionError"),
    "tensor_hook_nonleaf": (
        "h = m(torch.randn(8, 64, device='cuda'))\n"
        "def hook(g):\n    raise RuntimeError('non-leaf hook raised')\n"
        "h.register_hook(hook)\n"
        "(h * 2).sum().backward()\n",
        "RuntimeError: non-leaf hook raised"),
    "module_full_backward_hook": (
        "def hook(mod, gi, go):\n    raise KeyError('module backward hook raised')\n"
        "m.register_full_backward_hook(hook)\n"
        "m(torch.randn(8, 64, device='cuda', requires_grad=True)).sum().backward()\n",
        "KeyError: 'module backward hook raised'"),
    "saved_tensor_unpack_hook": (
        "def unpack(t):\n    raise ValueError('unpack hook raised')\n"
        "with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):\n"
        "    y = m(torch.randn(8, 64, device='cuda')).relu().sum()\n"
        "torch.autograd.grad(y, [m.weight])\n",
        "ValueError: unpack hook raised"),
}


@pytest.mark.parametrize("kind", sorted(RAISING_HOOKS))
def test_raising_backward_hook_reaches_the_report(tmp_path, kind):
    """A hook that raises during backward: exit 2, the script failure with
    the user's own exception and the hook's line, the snapshot written
    and valid; several runs (the abort was deterministic)."""
    body, expect = RAISING_HOOKS[kind]
    script = tmp_path / "hookraise.py"
    script.write_text("import torch\nm = torch.nn.Linear(64, 64).cuda()\n" + body)
    nlines = body.count("\n") + 2
    for i in range(3):
        out = tmp_path / f"h{i}.pickle"
        p = predict("--json", "-o", str(out), str(script), cwd=tmp_path)
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert "terminate called" not in p.stderr and "SystemError" not in p.stdout
        err = p.json["script_error"]
        assert expect in err, err
        assert "in type_" not in err  # the device guard's frame is not shown
        assert f'hookraise.py", line {nlines}, in <module>' in err  # the backward line
        assert p.json["snapshot"] == str(out) and p.json["oom"] is None
        snap = load(out)
        assert any(e["action"] == "alloc" for e in snap["device_traces"][0])
    check_cli(out)


def test_raising_hook_caught_by_the_script(tmp_path):
    """The script catches its hook's error and goes on: the prediction
    goes on too (exit 0, the later backward counted)."""
    script = tmp_path / "caught.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(64, 64).to('npu')\n"
        "h = m.weight.register_hook(lambda g: 1 / 0)\n"
        "try:\n    torch.autograd.grad(m(torch.randn(8, 64, device='npu')).sum(), [m.weight])\n"
        "except ZeroDivisionError:\n    print('caught', flush=True)\n"
        "h.remove()\n"
        "m(torch.randn(8, 64, device='npu')).sum().backward()\n"
        "assert m.weight.grad.shape == (64, 64)\n")
    p = predict("--json", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "caught" in p.stderr and p.json["script_error"] is None
    assert any(s["line"] == 9 for s in p.json["top_sites"])


DEEPCOPY = """import copy, torch, torch.nn as nn
lin = copy.deepcopy(nn.Linear(512, 1536)).to("npu")
layer = nn.TransformerEncoderLayer(512, 8, 1024, batch_first=True)
enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to("npu")
"""


def test_deep_copied_parameters_move_to_the_device(tmp_path):
    """copy.deepcopy of a module (nn.TransformerEncoder deep-copies its
    layer) then ``.to(device)``: the copies' parameters are the
    prediction's fake tensors like any other, so the move swaps them as on
    the device ("Cannot swap t1 because it has weakref associated with it"
    for every parameter over 1 MiB before), and torch's warning about a
    fake tensor's data pointer, which deepcopy triggers, is not the
    user's to see.  The peak is the parameters' own bytes, exactly."""
    script = tmp_path / "deepcopy_model.py"
    script.write_text(DEEPCOPY)
    p = predict("--json", "-o", str(tmp_path / "d.pickle"), str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "data pointer of FakeTensor" not in p.stderr, p.stderr
    layer = torch.nn.TransformerEncoderLayer(512, 8, 1024, batch_first=True)
    enc_params = 2 * sum(q.numel() for q in layer.parameters())
    assert p.json["peak_requested_bytes"] == 4 * (512 * 1536 + 1536 + enc_params), p.json


TINY = "import sys, torch\nx = torch.ones(1024, device='npu')\nprint('script ran', file=sys.stderr)\n"
NOBODY = 65534


def tiny(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    return str(script)


# A small model whose __main__ imports a module next to it (found only
# when the directory or zip itself is first on sys.path, as `python DIR`
# puts it) and says how it was run.
MLP_MAIN = """import json, sys, torch
import mlp_width
nn, w = torch.nn, mlp_width.WIDTH
model = nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, 10)).to("cuda")
model(torch.randn(32, 256, device="cuda")).sum().backward()
print("RAN " + json.dumps([sys.argv, sys.path[0], __file__]), file=sys.stderr)
"""


def _ran(p) -> list:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("RAN ")]
    assert len(lines) == 1, p.stdout + p.stderr
    return json.loads(lines[0][len("RAN "):])


def test_directory_and_zip_run_their_main(tmp_path):
    """A directory or zip file holding __main__.py runs as `python DIR`
    runs it (runpy.run_path): its __main__.py as __main__, the directory
    or zip itself first on sys.path (its sibling module imports), argv[0]
    the name given; the default snapshot is named after it, and the sites
    are lines of its __main__.py.  One without __main__ is a usage error."""
    import zipfile

    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(MLP_MAIN)
    (app / "mlp_width.py").write_text("WIDTH = 1024\n")
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as z:
        z.write(app / "__main__.py", "__main__.py")
        z.write(app / "mlp_width.py", "mlp_width.py")
    params = (256 * 1024 + 1024 + 1024 * 10 + 10) * 4
    for name in ("app", "app.pyz"):
        p = predict("--memory", "1G", "--json", name, "--flag", cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        # python gives sys.argv[0] as typed; runpy.run_path the absolute path
        full = str(tmp_path / name)
        assert _ran(p) == [[full, "--flag"], full, os.path.join(full, "__main__.py")]
        r = p.json
        assert r["fits"] and r["complete"] and r["script"] == name
        assert r["snapshot"] == "app_predict.pickle"
        assert r["peak_allocated_bytes"] >= 2 * params  # weights and their gradients
        sites = {s["site"].split(" in ")[0] for s in r["top_sites"]}
        assert os.path.join(name, "__main__.py") + ":4" in sites, r["top_sites"]
        assert "ok" in check_cli(tmp_path / "app_predict.pickle")
    (tmp_path / "empty").mkdir()
    with zipfile.ZipFile(tmp_path / "nomain.zip", "w") as z:
        z.writestr("mlp_width.py", "WIDTH = 1\n")
    for bad, kind in (("empty", "a directory"), ("nomain.zip", "a zip file")):
        p = predict("--memory", "1G", bad, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"{bad}: {kind} without a __main__ module" in p.stderr


FILE_SCRIPT = """import json, os, sys, torch
x = torch.empty(1 << 20, device="cuda")
print("RAN " + json.dumps([sys.argv, sys.path[0], __file__,
                           sys._getframe().f_code.co_filename, __spec__ is None,
                           __package__, type(__loader__).__name__]), file=sys.stderr)
os.chdir(os.path.dirname(os.path.dirname(__file__)))
print(open(os.path.join(os.path.dirname(__file__), "data.txt")).read(), file=sys.stderr)
"""


def test_file_runs_by_its_absolute_path(tmp_path):
    """A file given by a relative name runs as `python sub/train.py` runs
    it (CPython 3.9 and later): __file__ and the code's file name absolute
    (a script that changes directory still finds the files beside it),
    sys.argv[0] as typed, __spec__ and __package__ None, its source file
    loader; the report and the sites keep the name as typed."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "train.py").write_text(FILE_SCRIPT)
    (sub / "data.txt").write_text("DATA-BESIDE-THE-SCRIPT")
    name = os.path.join("sub", "train.py")
    full = str(sub / "train.py")
    p = predict("--memory", "1G", "--json", name, "--flag", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert _ran(p) == [[name, "--flag"], str(sub), full, full, True, None,
                       "SourceFileLoader"]
    assert "DATA-BESIDE-THE-SCRIPT" in p.stderr
    r = p.json
    assert r["fits"] and r["complete"] and r["script"] == name
    assert {s["site"] for s in r["top_sites"]} == {name + ":2 in <module>"}, r["top_sites"]


HELD_SCRIPT = """import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 256)).to("cuda")
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
tmp = torch.empty(1 << 20, device="cuda")
del tmp
print("LIVE", torch.cuda.memory_allocated(), file=sys.stderr)
"""


@pytest.mark.parametrize("how", ["file", "stdin", "directory"])
def test_snapshot_ends_in_the_state_the_script_ends_in(tmp_path, how):
    """The snapshot's final state is what the script holds at its end (its
    module-level model, optimizer state), as a _dump_snapshot on its last
    line would show -- not a teardown of its globals half done (it showed
    the tensors held in reference cycles only, or none)."""
    if how == "directory":
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "__main__.py").write_text(HELD_SCRIPT)
        p = predict("--memory", "1G", "-o", "s.pickle", "app", cwd=tmp_path)
    elif how == "stdin":
        p = predict("--memory", "1G", "-o", "s.pickle", "-", cwd=tmp_path,
                    stdin=HELD_SCRIPT.encode())
    else:
        (tmp_path / "held.py").write_text(HELD_SCRIPT)
        p = predict("--memory", "1G", "-o", "s.pickle", "held.py", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    live = int(re.search(r"LIVE (\d+)", p.stderr).group(1))
    assert live > 0
    with open(tmp_path / "s.pickle", "rb") as f:
        snap = pickle.load(f)
    held = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")
    assert held == live, (held, live)


STDIN_SCRIPT = """# -*- coding: latin-1 -*-
import json, sys, torch
nn = torch.nn
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
model(torch.randn(32, 256, device="cuda")).sum().backward()
print("RAN " + json.dumps([sys.argv, sys.path[0], __file__, __spec__ is None,
                           "\xe9"]), file=sys.stderr)
if sys.argv[1:] == ["big"]:
    huge = torch.empty(1 << 30, device="cuda")
if sys.argv[1:] == ["fail"]:
    def fail():
        raise ValueError("no such layer")
    fail()
"""


def test_script_from_standard_input(tmp_path):
    """`-` reads the script from standard input as `python -` does: named
    <stdin> (its lines are the user's: sites, the OOM line, the
    traceback), argv[0] "-", "" first on sys.path, the source's coding
    declaration honoured; the default snapshot is stdin_predict.pickle."""
    src = STDIN_SCRIPT.replace("\\xe9", "\xe9").encode("latin-1")  # a real é, one byte
    big = predict("--memory", "1G", "--json", "-", "big", cwd=tmp_path, stdin=src)
    assert big.returncode == 1, big.stdout + big.stderr
    assert _ran(big) == [["-", "big"], "", "<stdin>", True, "\xe9"]
    r = big.json
    assert r["script"] == "-" and r["snapshot"] == "stdin_predict.pickle"
    assert r["oom"]["line"] == "<stdin>:9 in <module>", r["oom"]
    assert {s["site"] for s in r["top_sites"]} >= {"<stdin>:4 in <module>",
                                                   "<stdin>:5 in <module>"}, r["top_sites"]
    assert "ok" in check_cli(tmp_path / "stdin_predict.pickle")
    fail = predict("--memory", "1G", "-", "fail", cwd=tmp_path, stdin=src)
    assert fail.returncode == 2, fail.stdout + fail.stderr
    assert fail.stdout.startswith("memsnap predict: <stdin>: ")
    tb = fail.stdout[fail.stdout.index("the script failed"):]
    assert ('Traceback (most recent call last):\n  File "<stdin>", line 13, in <module>\n'
            '  File "<stdin>", line 12, in fail\nValueError: no such layer') in tb, tb


def test_output_refused_before_the_run(tmp_path):
    """-o in a missing directory, or naming a directory: exit 2 with the
    file and the reason, before the script runs -- worded as the memsnap
    CLI's -o: "'DIR' is a directory" (it read "cannot write the snapshot
    DIR: cannot write: it is a directory"), the missing directory named
    (it read a bare "No such file or directory"), "cannot write" once."""
    script = tiny(tmp_path)
    (tmp_path / "somedir").mkdir()
    (tmp_path / "afile").write_text("")
    cases = (("nodir/sub/x.pickle", "memsnap.predict: cannot write the snapshot "
              "nodir/sub/x.pickle: the directory 'nodir' does not exist\n"),
             ("afile/x.pickle", "memsnap.predict: cannot write the snapshot "
              "afile/x.pickle: 'afile' is not a directory\n"),
             ("somedir", "memsnap.predict: 'somedir' is a directory\n"),
             ("somedir/", "memsnap.predict: 'somedir/' is a directory\n"))
    for out, line in cases:
        p = predict("-o", out, script, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert p.stderr == line, p.stderr
    # the CLI's -o says the same of a directory
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    cli = run_cli("convert", snap, "-o", "somedir", cwd=tmp_path)
    assert cli.returncode == 2
    assert cli.stderr == "memsnap convert: 'somedir' is a directory\n", cli.stderr


def test_output_that_is_the_script_refused(tmp_path):
    """-o naming the script itself (a typo: `-o t.py t.py`), by its name or
    through a link: exit 2 before the run, the script left as it was --
    as the memsnap CLI refuses an input file as OUT."""
    script = tiny(tmp_path)
    before = open(script, "rb").read()
    os.symlink(script, tmp_path / "alias.py")
    for out in (script, str(tmp_path / "alias.py")):
        p = predict("-o", out, script, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert (f"memsnap.predict: output {out!r} is the script {script!r}; "
                "refusing to overwrite it") in p.stderr, p.stderr
        assert "script ran" not in p.stderr and "Traceback" not in p.stderr
        assert open(script, "rb").read() == before
    # a directory script: its __main__.py is the script
    d = tmp_path / "app"
    d.mkdir()
    (d / "__main__.py").write_text(TINY)
    p = predict("-o", str(d / "__main__.py"), str(d), cwd=tmp_path)
    assert p.returncode == 2 and "refusing to overwrite it" in p.stderr, p.stderr
    assert (d / "__main__.py").read_text() == TINY


def test_output_ending_in_a_slash_refused_before_the_run(tmp_path, monkeypatch):
    """-o NAME/ (no such directory): refused up front with the reason the
    final write gives (memsnap's file writer refuses the name itself)."""
    from memsnap import _memsnap

    script = tiny(tmp_path)
    monkeypatch.chdir(tmp_path)
    for out in ("nodir_z/", "nodir_z/."):
        with pytest.raises(OSError) as final:
            _memsnap.write_file(out, b"")
        p = predict("-o", out, script, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        why = final.value.strerror
        assert why.startswith("cannot write: "), why
        assert (f"cannot write the snapshot {out}: {why[len('cannot write: '):]}"
                in p.stderr), p.stderr
        assert p.stderr.count("cannot write") == 1, p.stderr
        assert "script ran" not in p.stderr and "Traceback" not in p.stderr
        assert not (tmp_path / "nodir_z").exists()


MARKED = ("import sys, pathlib, torch\npathlib.Path(sys.argv[1]).write_text('ran')\n"
          "x = torch.ones(1024, device='npu')\n")


def test_output_dangling_link_refused_before_the_run(tmp_path):
    """-o naming a dangling link: refused up front with the writer's own
    reason (memsnap's pre-check, as the CLI's -o), the script never runs
    (its marker file is not written), nothing is created."""
    script = tmp_path / "marked.py"
    script.write_text(MARKED)
    marker = tmp_path / "marker"
    link = tmp_path / "dangling.pickle"
    os.symlink(tmp_path / "nowhere" / "x.pickle", link)
    p = predict("-o", str(link), str(script), str(marker), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"cannot write the snapshot {link}: " in p.stderr and "dangling" in p.stderr
    assert "Traceback" not in p.stderr and not marker.exists()
    assert os.path.islink(link) and not (tmp_path / "nowhere").exists()


def test_output_refuses_a_planted_link(tmp_path):
    """A link planted by another user in a sticky directory (as in /tmp) is
    refused before the script runs (the protected_symlinks rule, memsnap's
    pre-check): exit 2, the link's target untouched, the script's marker
    file never written."""
    if os.geteuid() != 0:
        pytest.skip("SKIP: a link owned by another user needs root (lchown); "
                    "the planted-link refusal is NOT tested")
    script = tmp_path / "marked.py"
    script.write_text(MARKED)
    marker = tmp_path / "marker"
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret")
    os.chmod(victim, 0o600)
    link = sticky / "p.pickle"
    os.symlink(victim, link)
    os.lchown(link, NOBODY, NOBODY)
    p = predict("-o", str(link), str(script), str(marker), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"cannot write the snapshot {link}: " in p.stderr
    assert "protected_symlinks" in p.stderr and "Traceback" not in p.stderr
    assert not marker.exists()
    assert victim.read_bytes() == b"secret" and os.path.islink(link)
    assert sorted(os.listdir(sticky)) == ["p.pickle"]  # no temporary left


def test_output_own_link_followed_mode_kept(tmp_path):
    """The user's own link is followed: its target gets the snapshot and
    keeps its mode, the link stays a link."""
    script = tiny(tmp_path)
    target = tmp_path / "target.pickle"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    link = tmp_path / "link.pickle"
    os.symlink(target, link)
    p = predict("-o", str(link), script, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.path.islink(link) and (os.stat(target).st_mode & 0o777) == 0o600
    assert "ok" in check_cli(target)


def test_output_mode_follows_umask(tmp_path):
    script = tiny(tmp_path)
    for mask, mode in ((0o022, 0o644), (0o027, 0o640)):
        out = tmp_path / f"u{mask:o}.pickle"
        p = subprocess.run([sys.executable, "-m", "memsnap.predict", "-o", str(out), script],
                           env=base_env(), capture_output=True, text=True, cwd=tmp_path,
                           timeout=600, umask=mask)
        assert p.returncode == 0, p.stdout + p.stderr
        assert (os.stat(out).st_mode & 0o777) == mode


def test_output_to_an_fd_link(tmp_path):
    """-o /dev/fd/N (as /dev/stdout): the snapshot is written to the
    descriptor (a pipe here), not renamed over the link."""
    import threading

    script = tiny(tmp_path)
    r, w = os.pipe()
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(os.fdopen(r, "rb").read()))
    reader.start()
    try:
        p = subprocess.run([sys.executable, "-m", "memsnap.predict", "-o", f"/dev/fd/{w}",
                            script], env=base_env(), capture_output=True, text=True,
                           cwd=tmp_path, timeout=600, pass_fds=(w,))
    finally:
        os.close(w)
        reader.join(600)
    assert p.returncode == 0, p.stdout + p.stderr
    snap = pickle.loads(chunks[0])
    assert snap["device_traces"][0] and snap["segments"]


@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_output_to_standard_output(tmp_path, out):
    """-o - (as the CLI's) and -o /dev/stdout: the pickle alone on standard
    output, the report (here --json) and the script's prints on standard
    error; no file named "-"."""
    script = tiny(tmp_path)
    p = subprocess.run([sys.executable, "-m", "memsnap.predict", "--json", "-o", out,
                        script], env=base_env(), capture_output=True, cwd=tmp_path,
                       timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    snap = pickle.loads(p.stdout)
    assert snap["device_traces"][0] and snap["segments"]
    err = p.stderr.decode()
    report = json.loads(err[err.index("{"):])
    assert report["snapshot"] == "standard output" and report["fits"] is True
    assert not (tmp_path / "-").exists()


def test_python_api_refuses_a_bad_alloc_conf_on_entering():
    """predict(alloc_conf=...) with a key the allocator refuses raises
    ConfigError when the block is entered, before its code runs (a block
    that allocates nothing does not "fit"), as the command line refuses it
    before the script; a bad what-if too.  The refused prediction leaves
    nothing behind: the next one runs a real nn.Linear."""
    code = """
        import json, torch
        from memsnap.predict import predict, ConfigError
        out = {"ran": []}
        for kw in ({"alloc_conf": "max_split_sise_mb:3"},
                   {"alloc_conf": "max_split_sise_mb:3", "profile": "cuda"},
                   {"what_if": ["cuda,garbage_collection_threshold:2"]}):
            try:
                with predict(memory="8G", **kw):
                    out["ran"].append(kw)
            except ConfigError as e:
                out.setdefault("errors", []).append(str(e))
        with predict(memory="8G") as p:
            lin = torch.nn.Linear(64, 32).to("npu")
            lin(torch.ones(8, 64, device="npu")).sum().backward()
        out["fits"], out["peak"] = p.fits, p.peak_allocated_bytes
        # a key of one profile only, the profile left to the code: the
        # code uses cuda, whose allocator takes it
        with predict(memory="8G", alloc_conf="release_lock_on_cudamalloc:True") as p:
            lin = torch.nn.Linear(64, 32).to("cuda")
            lin(torch.ones(8, 64, device="cuda")).sum().backward()
        out["cuda"] = [p.fits, p.result["profile"], p.result["alloc_conf"]]
        print("RESULT " + json.dumps(out))
    """
    r = run_script(code).result
    assert r["ran"] == [], r
    assert r["cuda"] == [True, "cuda", "release_lock_on_cudamalloc:True"], r
    assert len(r["errors"]) == 3, r
    # (no profile given, both refuse it alike: none named)
    assert r["errors"][0].startswith("allocator (alloc conf 'max_split_sise_mb:3'): "), r
    assert "max_split_sise_mb" in r["errors"][1] and "cuda" in r["errors"][1], r
    assert "garbage_collection_threshold" in r["errors"][2], r
    assert r["fits"] is True and r["peak"] > 0, r


def test_cli_refuses_a_bad_alloc_conf_before_the_script(tmp_path):
    """The command line refuses an alloc-conf no profile takes before the
    script runs, also a script that allocates nothing."""
    script = tmp_path / "quiet.py"
    script.write_text("import sys\nprint('script ran', file=sys.stderr)\n")
    p = predict("--alloc-conf", "max_split_sise_mb:3", "--json", str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "unrecognized key 'max_split_sise_mb'" in p.stderr, p.stderr
    assert "script ran" not in p.stderr and p.stdout == ""
    assert "what-if" not in p.stderr  # the run's own configuration
    # a what-if's bad alloc-conf is named as the what-if's
    # (a profile named only where the what-if names one)
    for spec, who in (("expandable_segments:Bogus", "alloc conf "),
                      ("npu,max_split_size_mb:1", "npu, ")):
        p = predict("--what-if", spec, "--json", str(script), cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"memsnap.predict: what-if '{spec}': allocator ({who}" in p.stderr, p.stderr
        assert "script ran" not in p.stderr and p.stdout == ""


def test_cli_names_a_what_if_as_given_and_both_profiles_reasons(tmp_path):
    """A what-if whose profile the script decides: refused up front by both
    profiles for different reasons, the message gives both; refused by
    one only, it is refused at the first allocation (the script's
    profile is the one that refuses it) and named as typed."""
    script = tmp_path / "lin.py"
    script.write_text("import torch\n"
                      "lin = torch.nn.Linear(64, 32).to('cuda')\n"
                      "lin(torch.ones(8, 64, device='cuda')).sum().backward()\n")
    spec = "pinned_num_register_threads:3"
    p = predict("--memory", "1G", "--what-if", spec, str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"what-if '{spec}': refused by both profiles: allocator (npu, " in p.stderr, p.stderr
    assert "torch_npu does not support key 'pinned_num_register_threads'" in p.stderr, p.stderr
    assert ("; allocator (cuda, alloc conf 'pinned_num_register_threads:3'): alloc conf: "
            "Number of register threads has to be power of 2, got '3'") in p.stderr, p.stderr
    # a CUDA key npu refuses, on a script that uses cuda: taken
    spec = "pinned_num_register_threads:4"
    p = predict("--memory", "1G", "--what-if", spec, "--json", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["fits"] is True, p.json
    # ... and on one that uses npu: refused at its first allocation
    script.write_text(script.read_text().replace("cuda", "npu"))
    p = predict("--memory", "1G", "--what-if", spec, str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert (f"memsnap.predict: what-if '{spec}': allocator (npu, alloc conf '{spec}'): "
            "alloc conf: torch_npu does not support key") in p.stderr, p.stderr
    assert "'npu," not in p.stderr, p.stderr


def test_cli_names_no_profile_when_both_refuse_a_what_if_alike(tmp_path):
    """A what-if both profiles refuse for one reason, checked before the
    script has chosen its device: the message names no profile (it said
    'npu' for a script written for cuda)."""
    script = tmp_path / "lin.py"
    script.write_text("import torch\n"
                      "x = torch.ones(8, 64, device='cuda')\n")
    p = predict("--memory", "1G", "--what-if", "bogus", str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "what-if 'bogus': allocator (alloc conf 'bogus'): " in p.stderr, p.stderr
    assert "npu" not in p.stderr and "cuda" not in p.stderr, p.stderr


def test_cli_says_which_what_ifs_repeat_a_configuration(tmp_path):
    """A what-if equal to the run's configuration or to an earlier
    what-if is not run twice, and the report and --json say so; a long
    what-if widens the table's label column instead of pushing the
    figures out of line."""
    script = tmp_path / "lin.py"
    script.write_text("import torch\n"
                      "lin = torch.nn.Linear(64, 32).to('cuda')\n"
                      "lin(torch.ones(8, 64, device='cuda')).sum().backward()\n")
    long = "cuda,max_split_size_mb:1024,garbage_collection_threshold:0.5"
    args = ["--memory", "1G", "--what-if", "cuda", "--what-if", long,
            "--what-if", "npu", "--what-if", long, str(script)]
    p = predict(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert ("what-if 'cuda' is the configuration of the run (cuda (default)): "
            "not run twice") in out, out
    assert (f"what-if '{long}' is the configuration of what-if '{long}' (cuda "
            f"{long[5:]}): not run twice") in out, out
    table = out[out.index("what-if (same run)"):].splitlines()
    head, rows = table[0], table[1:4]
    assert [r.split()[0] for r in rows] == ["cuda", "cuda", "npu"], table
    # every row's figures end where the header's columns do
    col = head.index("fits")
    for r in rows:
        assert r[col - 2:col] == "  " and r[col:col + 3] == "yes", (head, r)
    j = predict(*args[:-1], "--json", str(script), cwd=tmp_path).json
    assert [(w["profile"], w["alloc_conf"]) for w in j["what_if"]] == [
        ("cuda", long[5:]), ("npu", "")], j["what_if"]
    assert j["what_if_repeated"] == [
        {"what_if": "cuda", "same_as": "the run", "profile": "cuda", "alloc_conf": ""},
        {"what_if": long, "same_as": f"what-if '{long}'", "profile": "cuda",
         "alloc_conf": long[5:]}], j["what_if_repeated"]


def test_refuses_a_taken_device_name():
    code = """
        import torch
        torch.utils.rename_privateuse1_backend("foo")
        from memsnap.predict import predict
        try:
            with predict():
                pass
        except RuntimeError as e:
            print("RESULT " + __import__("json").dumps(str(e)))
    """
    msg = run_script(code).result
    assert "already registered as 'foo'" in msg


def test_refuses_the_real_memsnap_device():
    """memsnap.torch.register_device and a prediction both need PrivateUse1:
    the second owner is refused by the one naming function."""
    code = """
        import memsnap.torch as mt
        mt.register_device("npu")
        from memsnap.predict import predict
        try:
            with predict():
                pass
        except RuntimeError as e:
            print("RESULT " + __import__("json").dumps(str(e)))
    """
    msg = run_script(code).result
    assert "memsnap.torch.register_device already registered 'npu'" in msg


def test_amp_lowers_the_peak(tmp_path):
    """torch.autocast on the fake device (PyTorch's CUDA autocast lists):
    bf16 activations, so a lower peak than fp32."""
    res = {}
    for amp in ([], ["--amp"]):
        p = predict("--memory", "64G", "--json", "-o", str(tmp_path / "a.pickle"), GPT,
                    "--steps", "1", *amp, cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        res[bool(amp)] = p.json["peak_allocated_bytes"]
    assert res[True] < res[False]


def test_torch_npu_script(tmp_path):
    """`import torch_npu`, .npu(), torch.npu.amp, torch.npu statistics."""
    p = predict("--memory", "8G", "--json", "-o", str(tmp_path / "n.pickle"),
                os.path.join(SCRIPTS, "npu_amp.py"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["profile"] == "npu"
    reported = int(p.stderr.split("max_memory_allocated ")[1].split()[0])
    assert reported == p.json["peak_allocated_bytes"]


def test_cuda_loader_amp_streams(tmp_path):
    """DataLoader workers + pin_memory, fp16 autocast + GradScaler, a side
    stream with record_stream: runs, and torch.cuda's statistics are the
    prediction's."""
    out = tmp_path / "l.pickle"
    p = predict("--memory", "8G", "--json", "-o", str(out),
                os.path.join(SCRIPTS, "cuda_amp_loader.py"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["profile"] == "cuda"
    assert "PyTorch CUDA memory summary" in p.stderr
    reported = int(p.stderr.split("max_memory_allocated ")[1].split()[0])
    assert reported == p.json["peak_allocated_bytes"]
    streams = {e["stream"] for e in load(out)["device_traces"][0] if e["action"] == "alloc"}
    assert len(streams) == 2  # the default stream and the side stream


def test_fused_attention(tmp_path):
    """SDPA as the device's fused kernel: far below the math path, which
    keeps the attention matrix; npu keeps more than cuda (softmax_max and
    softmax_sum, B x N x S x 8 fp32 each, vs logsumexp)."""
    llama = os.path.join(os.path.dirname(HERE), "..", "bench", "predict_llama.py")
    args = [llama, "--layers", "2", "--d-model", "512", "--heads", "8", "--kv-heads", "2",
            "--ffn", "1024", "--vocab", "1000", "--seq", "2048"]
    peak = {}
    for profile in ("npu", "cuda"):
        for attention in ("fused", "math"):
            p = predict("--memory", "64G", "--json", "--profile", profile, "--attention",
                        attention, "-o", str(tmp_path / "s.pickle"), *args, cwd=tmp_path)
            assert p.returncode == 0, p.stdout + p.stderr
            peak[profile, attention] = p.json["peak_allocated_bytes"]
    matrix = 8 * 2048 * 2048 * 2  # one layer's B x H x T x T bf16 attention matrix
    for profile in ("npu", "cuda"):
        assert peak[profile, "math"] - peak[profile, "fused"] > matrix
    extra = 2 * 8 * 2048 * 8 * 4 - 8 * 2048 * 4  # per layer, npu over cuda
    assert peak["npu", "fused"] - peak["cuda", "fused"] >= extra


MHA = """import torch, torch.nn as nn
mha = nn.MultiheadAttention(256, 8, batch_first=True).to("cuda")
x = torch.randn(8, 1024, 256, device="cuda", requires_grad=True)
out, _ = mha(x, x, x, need_weights=False)
out.sum().backward()
"""


def test_fused_attention_inside_multihead_attention(tmp_path):
    """nn.MultiheadAttention (so nn.Transformer*) calls SDPA from inside
    torch.nn.functional's multi_head_attention_forward, where the
    prediction's torch function mode is off: the attention took the math
    path whatever --attention said (both gave the same peak).  Fused now
    keeps no B x H x T x T matrix, in both profiles."""
    script = tmp_path / "mha.py"
    script.write_text(MHA)
    peak = {}
    for profile in ("npu", "cuda"):
        for attention in ("fused", "math"):
            p = predict("--json", "--profile", profile, "--attention", attention,
                        "-o", str(tmp_path / "m.pickle"), str(script), cwd=tmp_path)
            assert p.returncode == 0, p.stdout + p.stderr
            peak[profile, attention] = p.json["peak_allocated_bytes"]
    matrix = 8 * 8 * 1024 * 1024 * 4  # B x H x T x T fp32
    for profile in ("npu", "cuda"):
        assert peak[profile, "math"] - peak[profile, "fused"] > matrix, peak
        assert peak[profile, "fused"] < matrix, peak


def _run_script(tmp_path, name: str, source: str):
    """Write source to tmp_path/name and predict it (--memory 1G --json,
    the snapshot beside it): the finished run, checked to exit 0."""
    script = tmp_path / name
    script.write_text(source)
    p = predict("--memory", "1G", "--json", "-o", str(script.with_suffix(".pickle")),
                str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_values_and_data_dependent_shapes(tmp_path):
    """No values on the device: .item() reads 0, data-dependent sizes are
    upper bounds; small host tensors are real (true values)."""
    p = _run_script(
        tmp_path, "values.py",
        "import sys, torch\n"
        "x = torch.randn(1000, 64, device='npu')\n"
        "m = x[:, 0] > 0\n"
        "print('shapes', tuple(torch.nonzero(m).shape), tuple(x[m].shape),\n"
        "      tuple(x.masked_select(m[:, None]).shape), file=sys.stderr)\n"
        "print('item', x.sum().item(), bool(x.sum() > 0), file=sys.stderr)\n"
        "host = torch.arange(10) * 3\n"
        "print('host', host.sum().item(), torch.nonzero(host > 20).flatten().tolist(),\n"
        "      file=sys.stderr)\n")
    assert "shapes (1000, 1) (1000, 64) (64000,)" in p.stderr
    assert "item 0.0 False" in p.stderr
    assert "host 135 [7, 8, 9]" in p.stderr
    assert p.json["values_read_as_zero"] == 2  # x.sum().item(), bool(x.sum() > 0)


def test_values_read_as_zero_counts_calls_not_elements(tmp_path):
    """values_read_as_zero counts one per read call, however many
    elements: .tolist() of 1000 logits (1-D and 2-D) counts 1 as their
    .numpy() does, .item() and bool() 1 each, an empty tensor's .tolist()
    and .numpy() nothing; a real host tensor's values are not counted."""
    p = _run_script(
        tmp_path, "reads.py",
        "import sys, torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(128, 10)).to('cuda')\n"
        "logits = model(torch.randn(100, 64, device='cuda'))\n"
        "flat = logits.flatten().cpu().tolist()\n"
        "rows = logits.cpu().tolist()\n"
        "arr = logits.detach().cpu().numpy()\n"
        "loss = logits.sum().item()\n"
        "flag = bool(logits.max() > 0)\n"
        "none = [logits[:0].cpu().tolist(), logits[:0].detach().cpu().numpy().shape]\n"
        "real = torch.arange(1000).tolist()\n"
        "print('reads', len(flat), set(flat), len(rows), len(rows[0]), arr.shape, loss, flag,\n"
        "      none, len(real), file=sys.stderr)\n")
    assert "reads 1000 {0.0} 100 10 (100, 10) 0.0 False [[], (0, 10)] 1000" in p.stderr
    assert p.json["values_read_as_zero"] == 5  # flat, rows, arr, loss, flag
    text = predict("--memory", "1G", "-o", str(tmp_path / "reads.pickle"),
                   str(tmp_path / "reads.py"), cwd=tmp_path)
    assert "\n  5 tensor value reads (.item(), bool(), .tolist(), .numpy()...) gave 0" \
        in text.stdout, text.stdout


def test_numpy_of_fake_tensors(tmp_path):
    """.numpy() of a fake host tensor (a metric's preds.cpu().numpy())
    gives zeros of its shape and dtype, counted as values read as zero;
    a real small host tensor keeps its values; torch's own errors stay
    (a device tensor, a tensor that requires grad, bfloat16)."""
    script = tmp_path / "metrics.py"
    script.write_text(
        "import sys, torch\n"
        "w = torch.randn(256, 8, device='cuda', requires_grad=True)\n"
        "preds = (torch.randn(4096, 256, device='cuda') @ w).argmax(1)\n"
        "a = preds.cpu().numpy()\n"
        "print('preds', a.shape, a.dtype, int(a.sum()), file=sys.stderr)\n"
        "print('real', torch.arange(4).numpy().tolist(), file=sys.stderr)\n"
        "for bad in (lambda: preds.numpy(), lambda: w.cpu().numpy(),\n"
        "            lambda: w.detach().bfloat16().cpu().numpy()):\n"
        "    try:\n"
        "        bad()\n"
        "    except (TypeError, RuntimeError) as e:\n"
        "        print('refused', type(e).__name__, str(e)[:40], file=sys.stderr)\n"
        "print('detached', w.detach().cpu().numpy().shape, file=sys.stderr)\n")
    p = predict("--memory", "1G", "--json", "-o", str(tmp_path / "m.pickle"), str(script),
                cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "preds (4096,) int64 0" in p.stderr
    assert "real [0, 1, 2, 3]" in p.stderr
    assert "refused TypeError can't convert npu:0 device type tensor" in p.stderr
    assert "refused RuntimeError Can't call numpy() on Tensor that requi" in p.stderr
    assert "refused TypeError Got unsupported ScalarType BFloat16" in p.stderr
    assert "detached (256, 8)" in p.stderr
    assert p.json["values_read_as_zero"] == 2  # preds and w.detach()


def test_torch_compile_runs_eagerly(tmp_path):
    """torch.compile of a real nn model runs eagerly under predict (no
    kernels to compile for a device that is not there): its memory is the
    eager run's, counted as one call per compiled call; counts in the text
    report are singular for 1 (a site of one block keeps the column)."""
    p = _run_script(
        tmp_path, "compiled.py",
        "import torch\n"
        "nn = torch.nn\n"
        "model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to('cuda')\n"
        "cm = torch.compile(model)\n"
        "x = torch.randn(32, 256, device='cuda')\n"
        "out = cm(x)\n"
        "out.sum().backward()\n")
    r = p.json
    assert r["eager_compile"] == 1 and r["complete"] and r["fits"]
    params = (256 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert r["peak_allocated_bytes"] >= 2 * params  # weights and their gradients
    text = predict("--memory", "1G", "-o", str(tmp_path / "compiled.pickle"),
                   str(tmp_path / "compiled.py"), cwd=tmp_path)
    assert "  torch.compile ran eagerly (1 call)\n" in text.stdout, text.stdout
    ones = [ln for ln in text.stdout.splitlines() if " 1 block " in ln]
    assert ones and all(" 1 block   compiled.py:" in ln for ln in ones), text.stdout


LINEAR_PEAKS = """
    import json, os, sys, torch
    dev = os.environ.get("DEV", "cuda")
    if dev != "cuda":
        import memsnap.torch as mt
        mt.register_device(dev)
    mod = torch.cuda if dev == "cuda" else getattr(torch, dev)
    lin = torch.nn.Linear(1024, 4096).to(dev)
    res = []
    for shape, t, grad, flat in (((64, 32, 1024), True, False, False),  # 3-D, not contiguous
                                 ((8, 2, 16, 1024), True, False, False),  # 4-D, not contiguous
                                 ((64, 32, 1024), True, True, False),   # with backward
                                 ((32, 1024), False, False, False),     # 2-D: addmm
                                 ((32, 8, 1024), False, False, False),  # 3-D contiguous: addmm
                                 ((2, 2, 8, 16, 1024), False, True, False)):  # 5-D contiguous
        x = torch.randn(*shape, device=dev)
        if t:
            x = x.transpose(0, 1)
        mod.reset_peak_memory_stats()
        base = mod.memory_allocated()
        with torch.set_grad_enabled(grad):
            y = lin(x)
            fn = type(y.grad_fn).__name__ if y.grad_fn is not None else None
            if grad:
                y.sum().backward()
        res.append([mod.max_memory_allocated() - base, fn])
        del x, y
        lin.zero_grad(set_to_none=True)
    print("RESULT " + json.dumps(res), file=sys.stderr if dev == "cuda" else sys.stdout)
"""


def test_linear_bias_added_in_place_as_on_the_device(tmp_path):
    """at::linear on an input it does not fuse (3-D not contiguous, 4-D)
    adds the bias in place on a device; under FakeTensorMode every bias
    is "tensor-subclass-like" and torch would add it out of place (an
    output-sized block more).  The prediction's peaks equal the memsnap
    device's for every branch of linear, forward and backward."""
    script = tmp_path / "lin.py"
    script.write_text(textwrap.dedent(LINEAR_PEAKS))
    device = run_script(f"""
        import os, runpy
        os.environ["DEV"] = "msim"
        runpy.run_path({str(script)!r}, run_name="__main__")
    """).result
    p = predict("--memory", "4G", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [l for l in p.stderr.splitlines() if l.startswith("RESULT ")]
    assert line, p.stderr
    predicted = json.loads(line[0][len("RESULT "):])
    assert predicted == device
    assert device[0][0] == (64 * 32 * 1024 + 64 * 32 * 4096) * 4  # matmul's copy + output
    assert device[2][1] == "AddBackward0" and device[5][1] == "ViewBackward0", device


NO_DEVICE = ("import sys, torch\nx = torch.ones(3) * 2\n"
             "print('cpu only', x.sum().item(), file=sys.stderr)\n")


def test_no_device_allocation_writes_an_empty_snapshot(tmp_path):
    """A script that never allocates on the device still gets its snapshot:
    an empty one (no segments, an empty trace per device) that memsnap
    check and torch's memory_viz open; the report and --json say nothing
    was allocated.  A write that fails (the directory removed while the
    script ran) is reported in snapshot_error, as for any other run."""
    from conftest import run_cli

    script = tmp_path / "cpu_only.py"
    script.write_text(NO_DEVICE)
    p = predict(str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no device memory was allocated" in p.stdout
    assert "snapshot: cpu_only_predict.pickle" in p.stdout
    out = tmp_path / "cpu_only_predict.pickle"
    snap = load(out)
    assert snap["segments"] == [] and snap["device_traces"] == [[]]
    assert snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == ""
    c = run_cli("check", out)
    assert c.returncode == 0 and "0 trace entries" in c.stdout, c.stdout + c.stderr
    for cmd in ("trace_plot", "segment_plot"):
        html = tmp_path / f"{cmd}.html"
        m = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, str(out),
                            "-o", str(html)], capture_output=True, text=True, timeout=300)
        assert m.returncode == 0 and html.stat().st_size > 0, m.stderr

    p = predict("--json", "--devices", "2", "-o", "two.pickle", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.json["snapshot"] == "two.pickle" and p.json["snapshot_error"] is None
    assert p.json["allocator_events"] == 0 and p.json["peak_reserved_bytes"] == 0
    assert load(tmp_path / "two.pickle")["device_traces"] == [[], []]

    (tmp_path / "gone").mkdir()
    script.write_text(NO_DEVICE + "import os\nos.rmdir('gone')\n")
    p = predict("--json", "-o", "gone/x.pickle", str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.json["snapshot"] is None
    assert (p.json["snapshot_error"]
            == "gone/x.pickle: the directory 'gone' does not exist"), p.json
    assert "the snapshot was not written: gone/x.pickle" in p.stderr


def test_python_api_without_device_allocation_writes_the_snapshot(tmp_path):
    """predict(output=...) around code with no device allocation writes
    the empty snapshot too (snapshot_path names it)."""
    from memsnap.predict import predict as run

    out = tmp_path / "api.pickle"
    with run(memory="1G", output=str(out)) as pr:
        torch.ones(4).sum()
    assert pr.snapshot_path == str(out) and pr.result["snapshot_error"] is None
    assert load(out)["segments"] == []
    assert "no device memory was allocated" in pr.report()


PADDED_ENCODER = """
import sys, torch, torch.nn as nn
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True), 2)
enc = enc.to("cuda").eval()
x = torch.randn(4, 128, 256, device="cuda")
mask = torch.zeros(4, 128, dtype=torch.bool, device="cuda")
mask[:, 100:] = True
with torch.inference_mode():
    y = enc(x, src_key_padding_mask=mask if sys.argv[1] == "mask" else None)
assert y.shape == (4, 128, 256)
"""


def test_padded_transformer_encoder_inference(tmp_path):
    """nn.TransformerEncoder's inference with a padding mask asks whether
    the mask is left-aligned (its values) before making a nested tensor;
    the prediction answers no and predicts the padded path (it failed
    with "no fake impl" for _nested_tensor_from_mask_left_aligned).  The
    padded path with a mask needs at least what it needs without one."""
    script = tmp_path / "padded.py"
    script.write_text(PADDED_ENCODER)
    got = {}
    for how in ("mask", "nomask"):
        out = tmp_path / f"{how}.pickle"
        p = predict("--json", "-o", str(out), str(script), how, cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.json["complete"] is True, p.json
        check_cli(out)
        got[how] = p.json["peak_requested_bytes"]
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True)
    params = 2 * 4 * sum(q.numel() for q in layer.parameters())
    batch = 4 * 128 * 256 * 4
    # the parameters, the input and at least two activations of its size
    assert got["nomask"] >= params + 3 * batch, got
    assert got["mask"] >= got["nomask"], got


def test_device_index_past_the_devices(tmp_path):
    """A tensor on "cuda:1" with one simulated device raises the error
    set_device(1) gets, at the script's line (memsnap.predict crashed on
    its own report with a TypeError, exit status 1, and the Python API
    raised msnap_stats_get's internal error); a rank without a world is
    refused as the command line refuses --rank without --devices."""
    script = tmp_path / "dev1.py"
    script.write_text("import torch\nx = torch.ones(8, device='cuda')\n"
                      "y = torch.empty(10, device='cuda:1')\n")
    p = predict("-o", str(tmp_path / "d.pickle"), str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "invalid device ordinal 1 (the prediction has 1 device; see --devices)" in p.stdout
    assert "dev1.py\", line 3" in p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    j = predict("--json", str(script), cwd=tmp_path)
    assert j.returncode == 2 and j.json["complete"] is False, j.stdout + j.stderr
    assert j.json["peak_requested_bytes"] == 32, j.json
    empty = tmp_path / "empty1.py"
    empty.write_text("import torch\nx = torch.ones(8, device='cuda')\n"
                     "y = torch.empty(0, device='cuda:1')\n")
    e = predict(str(empty), cwd=tmp_path)
    assert e.returncode == 2 and "invalid device ordinal 1" in e.stdout, e.stdout + e.stderr
    two = predict("--devices", "2", "--json", str(script), cwd=tmp_path)
    assert two.returncode == 0 and two.json["complete"] is True, two.stdout + two.stderr
    from memsnap.predict import predict as api
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        with api() as pr:
            torch.empty(10, device="cuda:1")
    assert pr.result is not None and pr.result["complete"] is False
    with pytest.raises(ValueError, match="rank 3 needs world_size"):
        api(rank=3)


AUTOCAST_LINEAR = """
import torch, torch.nn as nn
lin = nn.Linear(128, 256).to("cuda")
x = torch.randn(4, 16, 128, device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = lin(x)
"""


def test_autocast_casts_in_the_order_of_pytorchs_wrappers(tmp_path):
    """PyTorch's autocast wrappers cast the arguments in one call
    expression, which GCC (PyTorch's and torch_npu's Linux builds)
    evaluates last argument first: F.linear's copies are the bias's, the
    weight's, then the input's (the memsnap device, running those C++
    wrappers, allocates them so); the prediction cast input first, and its
    stacks began with a torch/_ops.py frame (OpOverload.__call__)."""
    script = tmp_path / "lin.py"
    script.write_text(AUTOCAST_LINEAR)
    out = tmp_path / "lin.pickle"
    p = predict("-o", str(out), str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    allocs = [e for e in load(out)["device_traces"][0] if e["action"] == "alloc"]
    sizes = [e["size"] for e in allocs]
    # weight, bias, x in fp32; then bias, weight, x in bf16; then y
    assert sizes == [131072, 1024, 32768, 512, 65536, 16384, 32768], sizes
    # the casts' stacks start at the caller's frames, as on the device
    # (the C++ wrappers leave none): no torch/_ops.py frame of the
    # prediction's own Python kernels
    files = {f["filename"].replace(os.sep, "/").rsplit("/", 2)[-1]
             for e in allocs for f in e["frames"]}
    assert "_ops.py" not in files, files
    assert allocs[3]["frames"][0]["filename"].endswith("torch/nn/modules/linear.py"), allocs[3]
    # nor in the fused attention's (its kernels call aten operators by name)
    attn = tmp_path / "attn.py"
    attn.write_text("import torch, torch.nn.functional as F\n"
                    "q = torch.randn(2, 4, 64, 32, device='cuda')\n"
                    "y = F.scaled_dot_product_attention(q, q, q, is_causal=True)\n")
    p = predict("-o", str(tmp_path / "attn.pickle"), str(attn), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    entries = load(tmp_path / "attn.pickle")["device_traces"][0]
    stacks = [[f["filename"] for f in e["frames"]] for e in entries if e["action"] == "alloc"]
    assert len(stacks) >= 4 and all(s and s[0].endswith("attn.py") for s in stacks), stacks


FUNCTIONAL_SCRIPT = """\
import os
import torch
import torch.nn as nn
import torch.nn.functional as F

dev = os.environ.get("PREDICT_DEV", "cuda")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to(dev)
x = torch.randn(32, 64, device=dev)
target = torch.randint(0, 10, (32,), device=dev)
for _ in range(2):
    probs = F.softmax(model(x), dim=-1)  # LINE-SOFTMAX
    loss = F.cross_entropy(probs, target)  # LINE-CE
    loss.backward()
    model.zero_grad()
"""


def _torch_frames(frames: list, script: str) -> list:
    """The frames of a stack inside torch, innermost first, up to the
    script's first frame: (file name within torch, function name, line)."""
    out = []
    for f in frames:
        if f["filename"] == script:
            break
        out.append((f["filename"].rsplit(os.sep + "torch" + os.sep, 1)[-1], f["name"],
                    f["line"]))
    return out


def test_functional_ops_carry_the_devices_frames(tmp_path):
    """The prediction's __torch_function__ mode makes every overridable
    function run twice (its has_torch_function test calls
    handle_torch_function, which calls it again inside the mode): the
    snapshot keeps the frames a device run records, with no overrides.py
    frame and no second copy of F.softmax / F.cross_entropy /
    Tensor.backward.  Compared with the same script run for real on a
    memsnap device (register_device, python stacks).  With
    --no-annotations: the module ranges' global hooks send every module
    call through torch's hook path (docs/predict.md, "stacks")."""
    script = tmp_path / "functional_train.py"
    script.write_text(FUNCTIONAL_SCRIPT)
    src = FUNCTIONAL_SCRIPT.splitlines()
    soft = next(i for i, t in enumerate(src, 1) if "LINE-SOFTMAX" in t)
    ce = next(i for i, t in enumerate(src, 1) if "LINE-CE" in t)
    out = tmp_path / "f.pickle"
    p = predict("--no-annotations", "-o", str(out), str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    predicted = load(out)
    check_cli(out)

    dumped = tmp_path / "device.pickle"
    code = f"""
import os, runpy
import memsnap.torch as mt
import memsnap.memory as mm
os.environ["PREDICT_DEV"] = mt.register_device("npu")
mm._record_memory_history("all", stacks="python")
runpy.run_path({str(script)!r}, run_name="__main__")
mm._dump_snapshot({str(dumped)!r})
"""
    run_script(code, timeout=300)
    device = load(dumped)

    def stacks_at(snap, line):
        """The torch frames of the allocs made at the script's `line`."""
        got = set()
        for e in snap["device_traces"][0]:
            if e["action"] != "alloc":
                continue
            mine = [f for f in e["frames"] if f["filename"] == str(script)]
            if mine and mine[0]["line"] == line:
                got.add(tuple(_torch_frames(e["frames"], str(script))))
        return got

    for line, fn in ((soft, "softmax"), (ce, "cross_entropy")):
        want = stacks_at(device, line)
        got = stacks_at(predicted, line)
        assert want and any(s and s[0][1] == fn for s in want), want
        assert got == want, (fn, got, want)
    for e in predicted["device_traces"][0]:
        files = [f["filename"] for f in e["frames"]]
        assert not any(f.endswith(os.path.join("torch", "overrides.py")) for f in files), e
        # (file, function): torch.autograd.backward is a "backward" too
        where = [(os.path.basename(f["filename"]), f["name"]) for f in e["frames"]]
        for fn in (("functional.py", "softmax"), ("functional.py", "cross_entropy"),
                   ("_tensor.py", "backward")):
            assert where.count(fn) <= 1, (fn, e["frames"])


def test_device_error_traceback_ends_at_the_script(tmp_path):
    """An error the prediction raises for the device (an ordinal past
    --devices) is reported with the script's frames only: none of
    memsnap's machinery or torch's dynamo wrappers around its mode, as
    torch's C++ error ends at the user's line on a device."""
    script = tmp_path / "ordinal.py"
    script.write_text("import torch\n"
                      "x = torch.ones(3, device='cuda')\n"
                      "def make():\n"
                      "    return torch.zeros(10, device='cuda:1')\n"
                      "y = make()\n")
    p = predict(str(script), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    tb = p.stdout[p.stdout.index("Traceback (most recent call last):"):]
    tb = tb[:tb.index("RuntimeError: invalid device ordinal 1")]
    files = re.findall(r'File "([^"]+)", line (\d+)', tb)
    assert files == [(str(script), "5"), (str(script), "4")], tb
    # the same for the exception a script's own error was raised from
    script.write_text("import torch\n"
                      "try:\n"
                      "    torch.zeros(10, device='cuda:1')\n"
                      "except RuntimeError as e:\n"
                      "    raise ValueError('wrapped') from e\n")
    p = predict(str(script), cwd=tmp_path)
    assert p.returncode == 2 and "ValueError: wrapped" in p.stdout, p.stdout + p.stderr
    files = re.findall(r'File "([^"]+)", line (\d+)', p.stdout)
    assert files == [(str(script), "3"), (str(script), "5")], p.stdout
