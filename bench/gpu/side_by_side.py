#!/usr/bin/env python3
"""Side-by-side run of PyTorch's native CUDA caching allocator and memsnap.

Trains a small transformer for a few steps twice, each in its own process
(the allocator of a process can only be chosen before its first CUDA
allocation):

  native   torch.cuda.memory._record_memory_history(stacks="python") on the
           stock allocator;
  memsnap  memsnap installed with torch.cuda.memory.CUDAPluggableAllocator
           (memsnap.torch.use_allocator("cuda")) and
           memsnap.memory._record_memory_history(stacks="python").

Each mode is timed with and without history.  The report gives time per
step, peak reserved bytes, number of segments, the key sets of both
snapshots and whether both files load in torch.cuda._memory_viz.

A third child process ("checks") installs memsnap with
memsnap.torch.use_allocator("cuda") and checks, on the GPU, what the C++
shim and patch_torch_cuda() provide (CHECKS below): an allocation beyond
the device raises torch.OutOfMemoryError through the shim and the process
goes on; torch.cuda.empty_cache() returns memsnap's cached segments;
Tensor.record_stream across two streams keeps the block until the second
stream's work is done; torch.cuda.memory_allocated() answers from memsnap
after patch_torch_cuda().  With --write-readme the figures and the checks
replace the "GPU side by side" section of bench/README.md.

Usage:
  python bench/gpu/side_by_side.py [--steps 20] [--out DIR] [--write-readme]
  python bench/gpu/side_by_side.py --check      # CPU-safe argument checks (CI)

It must finish in under 5 minutes on one H200.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(ROOT, "bench", "README.md")
BEGIN = "<!-- gpu-side-by-side:begin -->"
END = "<!-- gpu-side-by-side:end -->"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="training steps per run (>= 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 0)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "gpu"))
    p.add_argument("--write-readme", action="store_true")
    p.add_argument("--check", action="store_true",
                   help="validate arguments and the environment, run nothing on a GPU")
    p.add_argument("--child", choices=["native", "memsnap", "checks"], help=argparse.SUPPRESS)
    p.add_argument("--history", type=int, choices=[0, 1], default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be >= 2")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    for name in ("batch", "seq", "d_model", "layers"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.d_model % 8:
        p.error("--d-model must be a multiple of 8 (8 attention heads)")
    return a


def child(a) -> dict:
    """One training run in this process; returns its figures."""
    import torch

    if a.child == "memsnap":
        import memsnap.torch as mt
        import memsnap.memory as mm
        mt.use_allocator("cuda")
        mem = mm
    else:
        mem = torch.cuda.memory
    dev = torch.device("cuda", 0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(a.d_model, 8, 4 * a.d_model, batch_first=True),
        a.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, a.seq, a.d_model, device=dev)
    if a.history:
        mem._record_memory_history(stacks="python")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / a.steps
    res = {"mode": a.child, "history": bool(a.history), "step_ms": per_step * 1e3}
    if a.child == "memsnap":
        res["peak_reserved"] = mem.max_memory_reserved()
    else:
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
    if a.history:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"{a.child}.pickle")
        mem._dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        res["snapshot"] = path
        res["segments"] = len(snap["segments"])
        res["top_keys"] = sorted(snap)
        seg = snap["segments"][0] if snap["segments"] else {}
        res["segment_keys"] = sorted(k for k in seg if k != "blocks")
        tr = [e for t in snap["device_traces"] for e in t]
        res["trace_keys"] = sorted({k for e in tr for k in e})
        res["trace_entries"] = len(tr)
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
                           capture_output=True, text=True)
        res["memory_viz_stats_ok"] = r.returncode == 0
    return res


# What the "checks" child verifies (name -> what passing means).
CHECKS = {
    "oom": "allocating twice the device raises torch.OutOfMemoryError (shim), "
           "with PyTorch's message; the next allocation works",
    "empty_cache": "torch.cuda.empty_cache() releases memsnap's cached segments",
    "record_stream": "a block used on a second stream is freed only after that "
                     "stream's work (free_completed after the synchronize)",
    "memory_allocated": "torch.cuda.memory_allocated() equals memsnap's after "
                        "patch_torch_cuda()",
}


def checks(a) -> dict:
    """The "checks" child: memsnap as torch's CUDA allocator."""
    import torch
    import memsnap.memory as mm
    import memsnap.torch as mt

    mt.use_allocator("cuda")  # registers the shim's hooks, patch_torch_cuda()
    mm._record_memory_history("all", stacks="python")
    res = {}
    # memory_allocated after patch_torch_cuda
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    res["memory_allocated"] = (torch.cuda.memory_allocated() == mm.memory_allocated()
                               >= 64 << 20)
    # record_stream across two streams
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        y = torch.ones(1 << 20, device="cuda")
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(50_000_000)  # keep s2 busy while y is freed
        z = y * 2
    y.record_stream(s2)
    ptr = y.data_ptr()
    del y
    pending = any(b["state"] == "active_pending_free" for seg in mm.memory_snapshot()
                  for b in seg["blocks"] if b["address"] == ptr)
    torch.cuda.synchronize()
    w = torch.empty(1 << 20, device="cuda", dtype=torch.uint8)  # processes events
    acts = [e["action"] for e in mm._snapshot()["device_traces"][0] if e["addr"] == ptr]
    res["record_stream"] = pending and acts[-2:] == ["free_requested", "free_completed"]
    del z, w
    # empty_cache through torch's own function (the reset hook)
    del x
    before = mm.memory_reserved()
    torch.cuda.empty_cache()
    res["empty_cache"] = before > 0 and mm.memory_reserved() < before
    # OOM through the shim
    total = torch.cuda.mem_get_info()[1]
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        res["oom"] = False
        res["oom_message"] = "no error"
    except torch.OutOfMemoryError as e:
        res["oom_message"] = str(e).splitlines()[0][:160]
        res["oom"] = "out of memory. Tried to allocate" in str(e) and \
            torch.ones(10, device="cuda").sum().item() == 10
    return {"mode": "checks", "checks": res}


def checks_table(r: dict) -> str:
    """The checks as a Markdown table (an error line when the child failed)."""
    if "error" in r:
        return f"checks: error: {r['error'].splitlines()[-1] if r['error'] else '?'}"
    lines = ["| check | result | what |", "|---|---|---|"]
    for name, what in CHECKS.items():
        ok = r["checks"].get(name)
        lines.append(f"| {name} | {'pass' if ok else 'FAIL'} | {what} |")
    if "oom_message" in r["checks"]:
        lines.append("")
        lines.append(f"OOM message: `{r['checks']['oom_message']}`")
    return "\n".join(lines)


def run_child(a, mode: str, history: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--history", str(history),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
           "--seq", str(a.seq), "--d-model", str(a.d_model), "--layers", str(a.layers),
           "--out", a.out]
    env = dict(os.environ)
    if mode in ("memsnap", "checks"):
        env["MEMSNAP_RUNTIME"] = "cuda"
        env["MEMSNAP_PROFILE"] = "cuda"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if r.returncode != 0:
        return {"mode": mode, "history": bool(history), "error": (r.stderr or r.stdout)[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def table(results) -> str:
    lines = ["| allocator | history | ms/step | peak reserved (MiB) | segments | trace entries | memory_viz stats |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['history']} | error: {r['error'].splitlines()[-1] if r['error'] else '?'} | | | | |")
            continue
        lines.append("| {mode} | {hist} | {ms:.2f} | {pr:.1f} | {seg} | {te} | {ok} |".format(
            mode=r["mode"], hist="python stacks" if r["history"] else "off", ms=r["step_ms"],
            pr=r["peak_reserved"] / 2**20, seg=r.get("segments", ""), te=r.get("trace_entries", ""),
            ok={True: "loads", False: "FAILS"}.get(r.get("memory_viz_stats_ok"), "")))
    by = {(r["mode"], r["history"]): r for r in results if "error" not in r}
    n, m = by.get(("native", True)), by.get(("memsnap", True))
    if n and m:
        lines.append("")
        for k in ("top_keys", "segment_keys", "trace_keys"):
            lines.append(f"- {k}: native only {sorted(set(n[k]) - set(m[k]))}, "
                         f"memsnap only {sorted(set(m[k]) - set(n[k]))}")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        print(json.dumps(checks(a) if a.child == "checks" else child(a)))
        return 0
    if a.check:
        try:
            import torch  # noqa: F401
            have_cuda = torch.cuda.is_available()
        except ImportError:
            have_cuda = False
        print(f"arguments ok; CUDA available: {have_cuda}")
        print("checks: " + ", ".join(CHECKS))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (use --check for the CPU-safe part)", file=sys.stderr)
        return 2
    t0 = time.time()
    results = [run_child(a, m, h) for m in ("native", "memsnap") for h in (0, 1)]
    checked = run_child(a, "checks", 1)
    text = (f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
            f"{a.layers}-layer d={a.d_model} encoder, batch {a.batch}x{a.seq}, {a.steps} timed steps "
            f"({time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s in all)\n\n" + table(results)
            + "\n\nmemsnap as torch's CUDA allocator (use_allocator(\"cuda\")):\n\n"
            + checks_table(checked))
    print(text)
    if a.write_readme:
        old = open(README).read() if os.path.exists(README) else ""
        block = f"{BEGIN}\n{text}\n{END}"
        if BEGIN in old and END in old:
            new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
        else:
            new = old.rstrip() + "\n\n## GPU side by side\n\n" + block + "\n"
        with open(README, "w") as f:
            f.write(new)
    ok = all("error" not in r for r in results) and "error" not in checked and \
        all(checked["checks"].get(n) for n in CHECKS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
