#!/usr/bin/env python3
"""Turn the alloc/free_requested entries of real snapshot traces into the
plain-text op list bench/alloc_bench reads: "a <id> <size>" / "f <id>".

Usage: alloc_trace.py OUT FILE.pickle...   (skips files without traces)
"""
import argparse
import pickle
import sys


def main():
    ap = argparse.ArgumentParser(
        description='Turn the alloc/free_requested entries of real '
        'snapshot traces into the op list bench/alloc_bench reads.')
    ap.add_argument('out', metavar='OUT')
    ap.add_argument('files', metavar='FILE.pickle', nargs='*')
    args = ap.parse_args()
    out, files = args.out, args.files
    ops = []
    for path in files:
        with open(path, "rb") as f:
            d = pickle.load(f)
        if not isinstance(d, dict):
            continue
        for trace in d.get("device_traces", []):
            live = {}
            for e in trace:
                act = e.get("action")
                if act == "alloc":
                    ident = len(ops)
                    live[e["addr"]] = ident
                    ops.append(("a", ident, e["size"]))
                elif act == "free_requested" and e["addr"] in live:
                    ops.append(("f", live.pop(e["addr"]), 0))
    with open(out, "w") as f:
        for op, ident, size in ops:
            f.write(f"{op} {ident} {size}\n" if op == "a" else f"f {ident}\n")
    print(f"{out}: {len(ops)} ops from {len(files)} files")


if __name__ == "__main__":
    main()
