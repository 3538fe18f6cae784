#!/usr/bin/env python3
"""Benchmark of memsnap.predict: a training step of a large model, predicted.

Runs bench/predict_llama.py (Llama 70B shape, bf16, AdamW, one step of
--batch x --seq tokens) in fresh processes, alternating:

- memsnap: ``python -m memsnap.predict --memory 2T --compare --json``
  (three allocator configurations on one run, snapshot written);
- MemTracker: torch's ``torch.distributed._tools.mem_tracker.MemTracker``
  under torch's ``FakeTensorMode`` on the CPU device, around the same script
  (``--device cpu``), as it runs on a machine without a device.

Each process is pinned to one CPU (sched_setaffinity) with one intra-op
thread.  Reported per tool: median wall time of the whole process (torch
import included), median time of the step itself (model build + step, as
each tool measures it), median peak RSS (wait4), and the peak each tool
predicts.  Nothing is asserted; with --readme the section between the
``bench:predict`` markers of bench/README.md is rewritten (nothing else).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "predict_llama.py")
BEGIN, END = "<!-- bench:predict:begin -->", "<!-- bench:predict:end -->"


def _child_memtracker(script_args: list[str]) -> None:
    import runpy

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.set_num_threads(1)
    sys.argv = [SCRIPT, *script_args]
    t0 = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        mt = MemTracker()
        with mt:
            runpy.run_path(SCRIPT, run_name="__main__")
        peak = mt.get_tracker_snapshot("peak")
    step = time.perf_counter() - t0
    total = max(v["Total"] for v in peak.values())
    print("RESULT " + json.dumps({"step_s": step, "peak_bytes": total}))


def _pin():
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})


def _run(cmd: list[str]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTORCH_NPU_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env,
                             preexec_fn=_pin)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed ({p.returncode}):\n{text[-2000:]}")
    return {"wall_s": wall, "rss_bytes": usage.ru_maxrss * 1024, "stdout": text}


def run_memsnap(script_args, tmp) -> dict:
    r = _run([sys.executable, "-m", "memsnap.predict", "--memory", "2T", "--compare",
              "--json", "-o", os.path.join(tmp, "llama.pickle"), SCRIPT, *script_args])
    j = json.loads(r["stdout"].strip().splitlines()[-1])
    r.update(step_s=j["elapsed_s"], peak_bytes=j["peak_allocated_bytes"],
             reserved_bytes=j["peak_reserved_bytes"], events=j["allocator_events"],
             what_if=[(w["alloc_conf"] or w["profile"], w["peak_reserved_bytes"])
                      for w in j["what_if"]])
    return r


def run_memtracker(script_args) -> dict:
    r = _run([sys.executable, __file__, "--child-memtracker", "--", *script_args,
              "--device", "cpu"])
    line = next(ln for ln in r["stdout"].splitlines() if ln.startswith("RESULT "))
    r.update(json.loads(line[len("RESULT "):]))
    return r


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--readme", default=None, help="rewrite this README's predict section")
    ap.add_argument("--child-memtracker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_memtracker:
        _child_memtracker(args.script_args)
        return 0
    script_args = ["--layers", str(args.layers), "--seq", str(args.seq)]
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name, fn, acc in (("memsnap", lambda: run_memsnap(script_args, tmp), ours),
                                  ("MemTracker", lambda: run_memtracker(script_args), theirs)):
                r = fn()
                acc.append(r)
                print(f"round {i + 1} {name}: wall {r['wall_s']:.1f} s, step {r['step_s']:.1f} s, "
                      f"peak RSS {r['rss_bytes'] / 2**20:.0f} MiB, predicted peak "
                      f"{gib(r['peak_bytes'])}", file=sys.stderr, flush=True)

    def med(rs, key):
        return statistics.median(r[key] for r in rs)

    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    o, t = ours[0], theirs[0]
    lines = [
        f"Run on {when}, {cpu}, each process pinned to one CPU, Python "
        f"{platform.python_version()}; `bench/predict_bench.py --rounds {args.rounds}` "
        f"(medians, the two tools alternating). Model: bench/predict_llama.py, "
        f"{args.layers} layers (Llama 70B shape: 70.6 B parameters at 80 layers), bf16, "
        f"AdamW, one step of 1 x {args.seq} tokens.",
        "",
        "| tool | process wall time | step (build + fwd/bwd/optimizer) | peak host RSS "
        "| predicted peak allocated | goal | met |",
        "|---|---|---|---|---|---|---|",
        f"| memsnap.predict, 3 configurations (--compare), snapshot written | "
        f"{med(ours, 'wall_s'):.1f} s | {med(ours, 'step_s'):.1f} s | "
        f"{med(ours, 'rss_bytes') / 2**20:.0f} MiB | {gib(o['peak_bytes'])} (reserved "
        f"{gib(o['reserved_bytes'])}) | <= 60 s, <= 2 GB | "
        f"{'yes' if med(ours, 'wall_s') <= 60 and med(ours, 'rss_bytes') <= 2e9 else '**no**'} |",
        f"| MemTracker + FakeTensorMode (CPU device) | {med(theirs, 'wall_s'):.1f} s | "
        f"{med(theirs, 'step_s'):.1f} s | {med(theirs, 'rss_bytes') / 2**20:.0f} MiB | "
        f"{gib(t['peak_bytes'])} (no reserved figure) | (anchor) | |",
        "",
        f"Ratio memsnap / MemTracker: wall {med(ours, 'wall_s') / med(theirs, 'wall_s'):.2f}x, "
        f"step {med(ours, 'step_s') / med(theirs, 'step_s'):.2f}x, RSS "
        f"{med(ours, 'rss_bytes') / med(theirs, 'rss_bytes'):.2f}x.  memsnap's what-ifs, "
        "peak reserved: " + ", ".join(f"{k} {gib(v)}" for k, v in o["what_if"]) + ".",
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        with open(args.readme) as f:
            readme = f.read()
        if BEGIN not in readme or END not in readme:
            sys.exit(f"predict_bench: {args.readme} lacks the {BEGIN} markers")
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(args.readme, "w") as f:
            f.write(head + BEGIN + "\n" + text + "\n" + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
