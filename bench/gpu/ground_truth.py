#!/usr/bin/env python3
"""Ground truth beyond default settings: real CUDA traces replayed by memsnap.

Every real recording of ../shared/real_inputs uses PyTorch's default
allocator configuration.  This script records real CUDA memory histories
under non-default configurations -- one small torch.nn workload each, a few
seconds -- and replays every recording through memsnap's allocator
(`memsnap replay --profile cuda`), reporting for each whether every
decision matched or the first one that did not:

  exact     `memsnap replay --json --profile cuda --device-memory TOTAL`:
            the recording's own PYTORCH_CUDA_ALLOC_CONF (allocator_settings)
            is applied; addresses, every segment allocation and the final
            layout are compared.
  what-if   `memsnap replay --json --profile cuda --alloc-conf CONF
            --device-memory TOTAL`: the configuration given explicitly;
            segment decisions are compared.

A configuration is a PYTORCH_CUDA_ALLOC_CONF string and a workload
(CONFIGS below).  Each recording runs in its own process (the allocator
reads the variable when CUDA initialises): history on before the model is
built, `torch.cuda.memory._dump_snapshot`, and a meta file with the
configuration, the device's total memory (the replay's --device-memory),
the GPU and the torch version.

Usage:
  python bench/gpu/ground_truth.py [--out DIR] [--configs A,B] [--steps N]
                                   [--write-readme] [--save-corpus]
  python bench/gpu/ground_truth.py --check            # CPU-safe checks
  python bench/gpu/ground_truth.py --self-test DIR    # CPU: record on the sim
  python bench/gpu/ground_truth.py --verify-corpus    # replay saved recordings

`memsnap replay` refuses a recording that uses expandable segments (their
virtual addresses cannot be forced on the sim) or private pools (MemPool,
CUDA graphs): those configurations (expandable, mempool) come out "not
replayable" with replay's reason, in the table and in a note under it;
their entries are still counted, in the recording itself.

--self-test records the same configurations on memsnap's own simulated
device (cuda profile, memsnap.memory) with a synthetic workload of the same
shape and runs the same comparison: it exercises everything but CUDA.
--save-corpus stores the GPU recordings (JSON, gzip, each < 2 MB) with their
meta in tests/corpus/gpu_ground_truth/, and --verify-corpus (run by make
test) replays them and fails unless every recording that was exact when
saved is still exact.  It must finish in under 5 minutes on one H200.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(ROOT, "bench", "README.md")
CORPUS = os.path.join(ROOT, "tests", "corpus", "gpu_ground_truth")
BEGIN = "<!-- gpu-ground-truth:begin -->"
END = "<!-- gpu-ground-truth:end -->"

# name -> (PYTORCH_CUDA_ALLOC_CONF, workload, what it certifies).  Every
# configuration differs from the default.
CONFIGS = {
    "max_split": ("max_split_size_mb:64", "mlp",
                  "oversize blocks are not split; release_available_cached_blocks"),
    "max_split_rounding": ("max_split_size_mb:32,max_non_split_rounding_mb:32",
                           "mlp", "max_non_split_rounding_size"),
    "roundup_scalar": ("roundup_power2_divisions:4", "mlp",
                       "roundup_power2_divisions, one value"),
    "roundup_list": ("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "mlp",
                     "roundup_power2_divisions per size interval"),
    "gc": ("garbage_collection_threshold:0.3,per_process_memory_fraction:0.002",
           "mlp", "garbage_collect_cached_blocks under a memory fraction"),
    "expandable": ("expandable_segments:True", "mlp",
                   "expandable segments (segment_map / segment_unmap)"),
    "record_stream": ("max_split_size_mb:256", "streams",
                      "record_stream on a side stream: events delay frees"),
    "mempool": ("roundup_power2_divisions:2", "mempool",
                "MemPool / use_mem_pool routing (private pools)"),
    "oom": ("per_process_memory_fraction:0.01", "oom",
            "the OOM chain: free the cache and retry, then OutOfMemoryError"),
    "large_segment": ("large_segment_size_mb:64", "mlp",
                      "large_segment_size for 1-10 MiB requests"),
}
WORKLOADS = ("mlp", "streams", "mempool", "oom")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "gpu_ground_truth"))
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated names (default: all %d)" % len(CONFIGS))
    p.add_argument("--steps", type=int, default=8, help="training steps per recording (>= 2)")
    p.add_argument("--hidden", type=int, default=1024, help="MLP width (multiple of 64)")
    p.add_argument("--memsnap", default=None, help="the memsnap CLI (default: build/tools/memsnap, then PATH)")
    p.add_argument("--write-readme", action="store_true")
    p.add_argument("--save-corpus", action="store_true")
    p.add_argument("--check", action="store_true",
                   help="validate arguments and the environment, record nothing")
    p.add_argument("--self-test", metavar="DIR",
                   help="record on memsnap's sim (cuda profile) instead of CUDA")
    p.add_argument("--verify-corpus", action="store_true",
                   help="replay the recordings saved in tests/corpus/gpu_ground_truth")
    p.add_argument("--child", choices=["cuda", "sim"], help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be >= 2")
    if a.hidden < 64 or a.hidden % 64:
        p.error("--hidden must be a positive multiple of 64")
    names = [n for n in a.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error("unknown configuration(s) %s; known: %s" % (", ".join(unknown), ", ".join(CONFIGS)))
    if not names:
        p.error("--configs names no configuration")
    a.names = names
    return a


def find_memsnap(a) -> str | None:
    for c in (a.memsnap, os.path.join(ROOT, "build", "tools", "memsnap"), shutil.which("memsnap")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


# ---------------------------------------------------------------------------
# Workloads.  The CUDA one uses torch.nn; the sim one replays the same shape
# of requests through memsnap.memory (no CUDA).
# ---------------------------------------------------------------------------

BATCHES = (48, 64, 80, 56)  # varying batch sizes: splits, rounding, reuse


def cuda_workload(kind: str, steps: int, hidden: int) -> dict:
    import torch

    mem = torch.cuda.memory
    dev = torch.device("cuda")
    info = {}
    mem._record_memory_history(max_entries=1_000_000)
    model = torch.nn.Sequential(
        torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
        torch.nn.Linear(4 * hidden, hidden), torch.nn.LayerNorm(hidden),
        torch.nn.Linear(hidden, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    side = torch.cuda.Stream()
    pool = torch.cuda.MemPool() if kind == "mempool" else None
    ooms = 0
    for step in range(steps):
        b = BATCHES[step % len(BATCHES)] * 8
        x = torch.randn(b, hidden, device=dev)
        y = torch.randint(0, 10, (b,), device=dev)
        if kind == "mempool" and step % 2:
            with torch.cuda.use_mem_pool(pool):
                loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if kind == "streams":
            t = torch.empty(b * hidden, device=dev)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                t.mul_(2.0)
            t.record_stream(side)
            del t
        if kind == "oom" and step % 2:
            try:
                torch.empty(64 << 30, dtype=torch.uint8, device=dev)
            except torch.OutOfMemoryError:
                ooms += 1
    torch.cuda.synchronize()
    info["ooms"] = ooms
    info["device_total"] = torch.cuda.mem_get_info()[1]
    info["gpu"] = torch.cuda.get_device_name()
    info["torch"] = torch.__version__
    return info


def sim_workload(kind: str, steps: int, hidden: int) -> dict:
    """The same request shapes as cuda_workload through memsnap.memory:
    activations and gradients of the MLP per step (fp32), parameters and
    optimizer state once."""
    import memsnap.memory as mm

    mm._record_memory_history()
    f32 = 4
    params = [mm.caching_allocator_alloc(n * f32) for n in
              (hidden * 4 * hidden, 4 * hidden, 4 * hidden * hidden, hidden,
               hidden, hidden, hidden * 10, 10)]
    state = []
    pool = mm.MemPool() if kind == "mempool" else None
    side = 7
    ooms = 0
    for step in range(steps):
        b = BATCHES[step % len(BATCHES)] * 8
        sizes = (b * hidden, b * 4 * hidden, b * 4 * hidden, b * hidden, b * hidden, b * 10)
        if kind == "mempool" and step % 2:
            with mm.use_mem_pool(pool):
                acts = [mm.caching_allocator_alloc(n * f32) for n in sizes]
        else:
            acts = [mm.caching_allocator_alloc(n * f32) for n in sizes]
        grads = [mm.caching_allocator_alloc(n * f32) for n in sizes[::-1]]
        for p in acts[::-1] + grads:
            mm.caching_allocator_delete(p)
        if not state:  # AdamW's exp_avg / exp_avg_sq on the first step
            state = [mm.caching_allocator_alloc(n * f32) for n in
                     (hidden * 4 * hidden, hidden * 4 * hidden,
                      4 * hidden * hidden, 4 * hidden * hidden)]
        if kind == "streams":
            t = mm.caching_allocator_alloc(b * hidden * f32)
            mm.record_stream(t, side)
            mm.caching_allocator_delete(t)
        if kind == "oom" and step % 2:
            try:
                mm.caching_allocator_alloc(64 << 30)
            except mm.OutOfMemoryError:
                ooms += 1
    for p in params + state:
        mm.caching_allocator_delete(p)
    total = mm.mem_get_info()[1]
    return {"ooms": ooms, "device_total": total, "gpu": "memsnap sim",
            "torch": None}


def child(a) -> int:
    name = a.config
    conf, kind, _ = CONFIGS[name]
    info = (cuda_workload if a.child == "cuda" else sim_workload)(kind, a.steps, a.hidden)
    if a.child == "cuda":
        import torch

        torch.cuda.memory._dump_snapshot(a.file)
    else:
        import memsnap.memory as mm

        mm._dump_snapshot(a.file)
    info.update({"config": name, "conf": conf, "workload": kind, "steps": a.steps})
    with open(a.file + ".meta.json", "w") as f:
        json.dump(info, f, indent=1)
    return 0


def record(a, name: str, out: str, backend: str) -> tuple[str, float]:
    conf = CONFIGS[name][0]
    path = os.path.join(out, name + ".pickle")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "MEMSNAP_"))}
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if backend == "sim":
        # an H200's 140 GiB: the fractions of CONFIGS mean the same there
        env.update(MEMSNAP_RUNTIME="sim", MEMSNAP_PROFILE="cuda", MEMSNAP_SIM_MEMORY="140G")
    t0 = time.monotonic()
    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", backend,
                    "--config", name, "--file", path, "--steps", str(a.steps),
                    "--hidden", str(a.hidden)], env=env, check=True, timeout=600)
    return path, time.monotonic() - t0


# ---------------------------------------------------------------------------
# The comparison.
# ---------------------------------------------------------------------------

def replay(memsnap: str, path: str, device_total: int, conf: str | None) -> dict:
    cmd = [memsnap, "replay", "--json", "--profile", "cuda", "--max-mismatches", "1",
           "--device-memory", str(max(device_total, 2 << 20))]
    if conf is not None:
        cmd += ["--alloc-conf", conf]
    p = subprocess.run(cmd + [path], capture_output=True, text=True, timeout=600)
    if p.returncode not in (0, 1, 2) or not p.stdout.strip():
        return {"error": (p.stderr or p.stdout).strip() or "exit %d" % p.returncode}
    return json.loads(p.stdout)


def first_mismatch(r: dict) -> str | None:
    for d in r.get("devices") or []:
        for m in d.get("mismatches") or []:
            text = m.get("message") if isinstance(m, dict) else str(m)
            entry = m.get("entry") if isinstance(m, dict) else None
            return ("device %s entry %s: %s" % (d.get("device"), entry, text)) if entry is not None \
                else ("device %s: %s" % (d.get("device"), text))
    return None


def verdict(r: dict, exact: bool) -> str:
    """exact | mismatch: <first> | not replayable: <reason> | error: <text>"""
    if "error" in r:
        return "error: " + r["error"]
    if not r.get("replayable"):
        return "not replayable: %s" % r.get("reason")
    if r.get("matches_recording"):
        return "exact" if exact else "same decisions"
    return "mismatch: %s" % (first_mismatch(r) or "final layout differs")


def recorded_entries(path: str) -> int:
    """The recording's trace entries, every device together.  Counted in
    the file: `memsnap replay --json` gives a device's trace_entries only
    when it replays that device, so a recording it refuses (expandable
    segments, private pools) would count 0."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") if isinstance(snap, dict) else None
    return sum(len(t) for t in traces or [] if isinstance(t, list))


def compare(memsnap: str, path: str) -> dict:
    with open(path + ".meta.json") as f:
        meta = json.load(f)
    total = int(meta["device_total"])
    ex = replay(memsnap, path, total, None)
    wi = replay(memsnap, path, total, meta["conf"])
    return {"config": meta["config"], "conf": meta["conf"], "workload": meta["workload"],
            "exact": verdict(ex, True), "what_if": verdict(wi, False),
            "replayable": bool(ex.get("replayable")),
            "trace_entries": recorded_entries(path),
            "segment_allocs": [ex.get("segment_allocs"),
                               (ex.get("devices") or [{}])[0].get("recording", {}).get("segment_allocs")],
            "ooms": meta.get("ooms"), "gpu": meta.get("gpu"), "torch": meta.get("torch")}


def report(rows: list[dict], title: str) -> str:
    lines = [title, "",
             "| configuration | PYTORCH_CUDA_ALLOC_CONF | entries | exact replay | what-if replay |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | `%s` | %s | %s | %s |" % (
            r["config"], r["conf"], r["trace_entries"], r["exact"], r["what_if"]))
    refused = [r for r in rows if r["exact"].startswith("not replayable: ")]
    if refused:
        # memsnap replay's own refusal (tools/replay.c, replayable()): a
        # limit of the replay, not a decision that differs
        lines += ["", "Not replayable by `memsnap replay` (a limit of the replay, not a "
                  "mismatch; the entries are counted in the recording):"]
        lines += ["- %s: %s" % (r["config"], r["exact"][len("not replayable: "):])
                  for r in refused]
    return "\n".join(lines) + "\n"


def write_readme(text: str) -> None:
    with open(README) as f:
        s = f.read()
    block = BEGIN + "\n" + text + END
    if BEGIN in s and END in s:
        s = s[: s.index(BEGIN)] + block + s[s.index(END) + len(END):]
    else:
        s = s.rstrip("\n") + "\n\n" + block + "\n"
    with open(README, "w") as f:
        f.write(s)


# ---------------------------------------------------------------------------
# The corpus: recordings as gzip'd JSON (no pickle files in git).
# ---------------------------------------------------------------------------

TUPLE_KEYS = ("segment_pool_id", "pool_id")


def _tuples(o):
    if isinstance(o, dict):
        return {k: (tuple(v) if k in TUPLE_KEYS and isinstance(v, list) else _tuples(v))
                for k, v in o.items()}
    if isinstance(o, list):
        return [_tuples(x) for x in o]
    return o


def save_corpus(path: str, result: dict) -> str:
    os.makedirs(CORPUS, exist_ok=True)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    dst = os.path.join(CORPUS, os.path.basename(path)[:-len(".pickle")] + ".json.gz")
    with gzip.open(dst, "wt") as f:
        json.dump(snap, f, separators=(",", ":"))
    if os.path.getsize(dst) > 2 << 20:
        os.unlink(dst)
        raise SystemExit("%s would exceed 2 MB: lower --steps" % dst)
    with open(path + ".meta.json") as f:
        meta = json.load(f)
    meta["saved_verdict"] = result["exact"]
    with open(dst[:-len(".json.gz")] + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)
    return dst


def verify_corpus(memsnap: str) -> int:
    files = sorted(f for f in os.listdir(CORPUS) if f.endswith(".json.gz")) \
        if os.path.isdir(CORPUS) else []
    if not files:
        print("no GPU recordings in %s yet (run this script on a GPU with --save-corpus)"
              % os.path.relpath(CORPUS, ROOT))
        return 0
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in files:
            stem = name[:-len(".json.gz")]
            with gzip.open(os.path.join(CORPUS, name), "rt") as f:
                snap = _tuples(json.load(f))
            path = os.path.join(tmp, stem + ".pickle")
            with open(path, "wb") as f:
                pickle.dump(snap, f, protocol=4)
            shutil.copy(os.path.join(CORPUS, stem + ".meta.json"), path + ".meta.json")
            with open(path + ".meta.json") as f:
                saved = json.load(f).get("saved_verdict")
            row = compare(memsnap, path)
            ok = row["exact"] == saved or saved != "exact"
            bad += not ok
            print("%-20s %s%s" % (stem, row["exact"], "" if ok else "   (was exact when saved)"))
    return 1 if bad else 0


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        return child(a)
    memsnap = find_memsnap(a)
    if a.check:
        print("configurations: %d (%s)" % (len(a.names), ", ".join(a.names)))
        for n in a.names:
            conf, kind, what = CONFIGS[n]
            print("  %-18s %-55s %-8s %s" % (n, conf, kind, what))
        print("memsnap CLI: %s" % (memsnap or "NOT FOUND (build with `make build` or pass --memsnap)"))
        try:
            import torch
            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        print("CUDA device: %s" % ("yes" if cuda else "no (the recording needs one; --self-test runs on CPU)"))
        print("arguments ok")
        return 0 if memsnap else 2
    if memsnap is None:
        print("the memsnap CLI was not found: build it (make build) or pass --memsnap", file=sys.stderr)
        return 2
    if a.verify_corpus:
        return verify_corpus(memsnap)
    backend = "sim" if a.self_test else "cuda"
    out = a.self_test or a.out
    if backend == "cuda":
        try:
            import torch
        except ImportError:
            print("torch is not importable", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("no CUDA device: this script records real CUDA traces "
                  "(use --self-test DIR to exercise it on the sim)", file=sys.stderr)
            return 2
    os.makedirs(out, exist_ok=True)
    rows = []
    t0 = time.monotonic()
    for name in a.names:
        path, secs = record(a, name, out, backend)
        row = compare(memsnap, path)
        row["record_seconds"] = round(secs, 1)
        rows.append(row)
        print("%-20s %-32s exact: %s | what-if: %s" % (name, row["conf"][:32], row["exact"], row["what_if"]))
        if a.save_corpus and backend == "cuda":
            print("  saved %s" % os.path.relpath(save_corpus(path, row), ROOT))
    with open(os.path.join(out, "ground_truth.json"), "w") as f:
        json.dump(rows, f, indent=1)
    title = "Recorded on %s, torch %s, %d steps each, %.0f s in all (%s)." % (
        rows[0]["gpu"], rows[0]["torch"], a.steps, time.monotonic() - t0,
        "bench/gpu/ground_truth.py" + (" --self-test" if backend == "sim" else ""))
    text = report(rows, title)
    print()
    print(text)
    if a.write_readme and backend == "cuda":
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
