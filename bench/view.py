#!/usr/bin/env python3
"""Benchmark of `memsnap view` on a large generated snapshot (issue 11).

    bench/view.py --memsnap build/tools/memsnap \
        --gen build/bench/bench_gen_snapshot [--bytes 1073741824] [--rounds 3]

Generates (once, kept under --dir) a ~1 GB 2.6-format snapshot with
bench_gen_snapshot (it passes `memsnap check`), then, interleaved in every
round: `memsnap view` (wall time, peak RSS through /usr/bin/time -v, HTML
bytes and their ratio to the input) and the anchor, PyTorch's own offline
page `python -m torch.cuda._memory_viz trace_plot` (the whole pickle
inside, base64; its page loads d3 from the network, so it cannot be timed
opening here).  Then the time memsnap's page takes to open in headless
Chromium (Playwright): from navigation start to the first drawing
(window.memsnapViewReady).  Prints medians as JSON; nothing is asserted.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def timed(cmd):
    t = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True,
                       text=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr[-2000:]))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                        p.stderr).group(1)) * 1024
    return wall, rss, p.stdout


def open_time(html, chrome):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chrome, args=["--no-sandbox"])
        pg = b.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto("file://" + os.path.abspath(html), timeout=300000)
        pg.wait_for_selector("body[data-ready='1']", timeout=300000)
        ms = pg.evaluate("window.memsnapViewReady")
        b.close()
    if errors:
        sys.exit("page errors: %s" % errors[:3])
    return ms / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memsnap", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/memsnap-view-bench")
    ap.add_argument("--chrome", default="/usr/bin/chromium")
    ap.add_argument("--no-anchor", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    src = os.path.join(a.dir, "generated-%d.pickle" % a.bytes)
    if not os.path.exists(src):
        subprocess.run([a.gen, src, str(a.bytes)], check=True)
        subprocess.run([a.memsnap, "check", src], check=True,
                       stdout=subprocess.DEVNULL)
    insize = os.path.getsize(src)
    html = os.path.join(a.dir, "view.html")
    anchor = os.path.join(a.dir, "trace_plot.html")
    r = {"input_bytes": insize, "view_s": [], "view_rss": [], "anchor_s": [],
         "open_s": []}
    for _ in range(a.rounds):
        w, rss, out = timed([a.memsnap, "view", "--json", src, "-o", html])
        r["view_s"].append(w)
        r["view_rss"].append(rss)
        r["view"] = json.loads(out)
        if not a.no_anchor:
            w, rss, _ = timed([sys.executable, "-m", "torch.cuda._memory_viz",
                               "trace_plot", src, "-o", anchor])
            r["anchor_s"].append(w)
            r["anchor_bytes"] = os.path.getsize(anchor)
        r["open_s"].append(open_time(html, a.chrome))
    out = {"input_bytes": insize, "entries": r["view"]["files"][0]["entries"],
           "html_bytes": r["view"]["bytes"],
           "ratio": r["view"]["bytes"] / insize,
           "embedded_entries": r["view"]["files"][0]["embedded_entries"],
           "bands": r["view"]["files"][0]["bands"],
           "allocations": r["view"]["files"][0]["allocations"],
           "view_s_median": statistics.median(r["view_s"]),
           "view_rss_median": statistics.median(r["view_rss"]),
           "open_s_median": statistics.median(r["open_s"]),
           "open_s": r["open_s"]}
    if r["anchor_s"]:
        out["anchor_s_median"] = statistics.median(r["anchor_s"])
        out["anchor_bytes"] = r["anchor_bytes"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
