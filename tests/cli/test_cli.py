#!/usr/bin/env python3
"""Tests of the memsnap CLI, run by meson: test_cli.py MEMSNAP GROUP.

Figures are computed independently here with CPython's pickle.  Groups:
  usage      --help of every command, unknown commands/options -> 2
  hostile    truncated files, bit flips, a pickle that would run a shell
             command, deep nesting, huge lengths -> exit 2 + message
  check      synthetic snapshots with one violation each -> the line
  real       every real input: check exits 0; summary --json equals the
             figures computed with pickle; convert round trip; plot; diff
  replay     which real inputs are replayable (and why not), exact replay
             matches the recording; demo-train -> replay matches
  view       HTML is self-contained; rendered by headless Chromium, the
             screenshot is not blank
Exit 77 (meson: skipped) with a loud SKIP line when what a group needs
from outside the project is missing (the real inputs, Chromium).
"""
import glob
import json
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

MEMSNAP = os.path.abspath(sys.argv[1])
GROUP = sys.argv[2]
REAL = os.environ.get("MEMSNAP_REAL_INPUTS") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "real_inputs")
TMP = tempfile.mkdtemp(prefix="memsnap-cli-test-")
FAILS = []


# Cross builds (make test-aarch64) run the binary through this wrapper,
# e.g. "qemu-aarch64 -L /".
WRAPPER = os.environ.get("MEMSNAP_EXE_WRAPPER", "").split()


def run(*args, timeout=300):
    p = subprocess.run(WRAPPER + [MEMSNAP] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        FAILS.append(what)


def skip(why):
    print("SKIP " + why, flush=True)
    sys.exit(77)


def need(ok, what):
    """A prerequisite of a group: a failure, never a skip."""
    expect(ok, what)
    if not ok:
        finish()


def finish():
    shutil.rmtree(TMP, ignore_errors=True)
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)
    sys.exit(0)


def write_pickle(obj, name):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)
    return path


def write_bytes(data, name):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# --- synthetic snapshots ------------------------------------------------
MiB = 1 << 20
A0 = 0x7f0000000000


def frame(name, filename, line):
    return {"filename": filename, "line": line, "name": name}


def good_snapshot():
    """One device, a 20 MiB segment with an allocation and a 2 MiB small
    segment; a trace from an empty allocator (2.6 format)."""
    fr = [frame("forward", "/home/u/model.py", 12),
          frame("linear", "/usr/lib/python3/site-packages/torch/nn/f.py", 9)]
    s1 = {"device": 0, "address": A0, "total_size": 20 * MiB,
          "allocated_size": 4 * MiB, "active_size": 4 * MiB,
          "requested_size": 4 * MiB - 100, "stream": 0,
          "segment_type": "large", "segment_pool_id": (0, 0),
          "is_expandable": False, "frames": fr,
          "blocks": [
              {"address": A0, "size": 4 * MiB,
               "requested_size": 4 * MiB - 100,
               "state": "active_allocated", "frames": fr},
              {"address": A0 + 4 * MiB, "size": 16 * MiB,
               "requested_size": 0, "state": "inactive", "frames": []}]}
    a2 = A0 + 64 * MiB
    s2 = {"device": 0, "address": a2, "total_size": 2 * MiB,
          "allocated_size": 512, "active_size": 512, "requested_size": 400,
          "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
          "is_expandable": False, "frames": [],
          "blocks": [
              {"address": a2, "size": 512, "requested_size": 400,
               "state": "active_allocated", "frames": []},
              {"address": a2 + 512, "size": 2 * MiB - 512,
               "requested_size": 0, "state": "inactive", "frames": []}]}
    t = 1700000000000000

    def e(action, addr, size, dt):
        return {"action": action, "addr": addr, "size": size, "stream": 0,
                "time_us": t + dt, "frames": fr}
    trace = [e("segment_alloc", A0, 20 * MiB, 1),
             e("alloc", A0, 4 * MiB - 100, 2),
             e("alloc", A0 + 4 * MiB, 2 * MiB, 3),
             e("free_requested", A0 + 4 * MiB, 2 * MiB, 4),
             e("free_completed", A0 + 4 * MiB, 2 * MiB, 5),
             e("segment_alloc", a2, 2 * MiB, 6),
             e("alloc", a2, 400, 7)]
    return {"segments": [s1, s2], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "",
                                   "max_split_size": -1,
                                   "expandable_segments": False},
            "external_annotations": []}


def reader_available():
    path = write_pickle(good_snapshot(), "probe.pickle")
    rc, out, err = run("summary", "--json", path)
    return rc == 0


# --- groups --------------------------------------------------------------
def group_usage():
    cmds = ["check", "summary", "diff", "replay", "view", "plot", "convert",
            "demo-train"]
    for c in cmds:
        rc, out, err = run(c, "--help")
        expect(rc == 0 and out.startswith("usage: memsnap " + c),
               "%s --help exits 0 with usage" % c)
        rc, out, err = run(c, "--no-such-option")
        expect(rc == 2 and "Try 'memsnap %s --help'" % c in err,
               "%s with an unknown option exits 2" % c)
    rc, out, err = run("frobnicate")
    expect(rc == 2 and "unknown command" in err, "unknown command exits 2")
    rc, out, err = run("--help")
    expect(rc == 0 and all(c in out for c in cmds), "memsnap --help lists all")
    rc, out, err = run()
    expect(rc == 2, "no command exits 2")
    rc, out, err = run("replay", "--profile", "tpu", "x.pickle")
    expect(rc == 2 and "--profile" in err, "replay --profile tpu exits 2")
    rc, out, err = run("convert", "x.pickle")
    expect(rc == 2 and "-o" in err, "convert without -o exits 2")


def hostile_inputs():
    good = pickle.dumps(good_snapshot(), protocol=4)
    cases = []
    for n in (0, 1, 2, 10, len(good) // 2, len(good) - 1):
        cases.append(("truncated-%d" % n, good[:n], True))

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch %s" % os.path.join(TMP, "PWNED"),))
    cases.append(("shell-command", pickle.dumps({"segments": [Evil()]},
                                                protocol=4), True))
    cases.append(("deep-nesting", b"\x80\x04" + b"]" * 1 +
                  b"(" * 200000 + b"." , True))
    deep = b"\x80\x04" + (b"]\x94" * 100000) + b"a" * 99999 + b"."
    cases.append(("deep-lists", deep, True))
    huge = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}\x94X" + \
        struct.pack("<I", 0xFFFFFFF0) + b"abc"
    cases.append(("huge-string-length", huge, True))
    huge8 = b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"x."
    cases.append(("huge-unicode8", huge8, True))
    cases.append(("not-a-pickle", b"hello world\n" * 10, True))
    cases.append(("empty-dict", pickle.dumps({}, protocol=4), False))
    rnd = random.Random(1234)
    for k in range(40):
        b = bytearray(good)
        for _ in range(1 + k % 4):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        cases.append(("bitflip-%d" % k, bytes(b), False))
    return cases


def group_hostile():
    if not reader_available():
        need(False, "hostile: summary of a small valid snapshot")
    for name, data, must_fail in hostile_inputs():
        path = write_bytes(data, name + ".pickle")
        for cmd in (["check"], ["summary", "--json"], ["replay", "--json"],
                    ["view", "-o", os.path.join(TMP, "h.html")],
                    ["convert", "-o", os.path.join(TMP, "h.out")]):
            rc, out, err = run(*(cmd + [path]), timeout=120)
            crashed = rc < 0 or rc > 2
            if crashed:
                expect(False, "%s %s: exit %d (crash?) %s" %
                       (cmd[0], name, rc, err[-200:]))
                continue
            if must_fail:
                expect(rc == 2 and err.startswith("memsnap: ") and
                       path in err,
                       "%s %s: exit 2 with a message naming the file" %
                       (cmd[0], name))
            elif rc == 2:
                expect(err.strip() != "", "%s %s: exit 2 with a message" %
                       (cmd[0], name))
    expect(not os.path.exists(os.path.join(TMP, "PWNED")),
           "the shell-command pickle ran nothing")
    # Well-formed pickles with nonsense content: random segments, states,
    # actions, addresses and sizes.  Every command ends with 0, 1 or 2.
    rnd = random.Random(99)
    acts = ["alloc", "free_requested", "free_completed", "segment_alloc",
            "segment_free", "segment_map", "segment_unmap", "snapshot",
            "oom", "annotate", "free"]
    crashes = 0
    for it in range(40):
        segs, a = [], A0
        for _ in range(rnd.randint(0, 5)):
            a += rnd.choice([0, 512, 2 * MiB, 20 * MiB])
            blocks, tot, addr = [], 0, a
            for _ in range(rnd.randint(1, 4)):
                sz = rnd.choice([512, 1024, 2 * MiB, rnd.randint(0, 1 << 24)])
                blocks.append({"address": addr, "size": sz,
                               "requested_size": rnd.randint(0, sz),
                               "state": rnd.choice(
                                   ["inactive", "active_allocated",
                                    "active_pending_free", "weird"]),
                               "frames": []})
                addr += sz
                tot += sz
            segs.append({"device": rnd.choice([0, 0, 1, -1]), "address": a,
                         "total_size": tot + rnd.choice([0, 512]),
                         "allocated_size": 0, "active_size": 0,
                         "requested_size": 0, "stream": rnd.choice([0, 7]),
                         "segment_type": rnd.choice(["large", "small"]),
                         "segment_pool_id": (0, rnd.choice([0, 0, 1])),
                         "is_expandable": rnd.random() < 0.1, "frames": [],
                         "blocks": blocks})
            a = addr
        traces = []
        for _ in range(rnd.randint(0, 2)):
            traces.append([{"action": rnd.choice(acts),
                            "addr": rnd.choice([A0, a,
                                              rnd.randrange(1 << 47)]),
                            "size": rnd.choice([0, 512, 2 * MiB,
                                                rnd.randrange(1 << 40)]),
                            "stream": 0}
                           for _ in range(rnd.randint(0, 40))])
        snap = {"segments": segs, "device_traces": traces}
        path = write_pickle(snap if it % 10 else segs, "random%d.pickle" % it)
        for cmd in (["check"], ["summary", "--json"], ["replay", "--json"],
                    ["replay", "--profile", "npu"], ["diff", path],
                    ["view", "-o", os.path.join(TMP, "r.html")],
                    ["plot", "-o", os.path.join(TMP, "r.svg")],
                    ["convert", "-o", os.path.join(TMP, "r.out")]):
            rc, out, err = run(*(cmd + [path]), timeout=120)
            if rc < 0 or rc > 2:
                crashes += 1
                print("  %s on random%d: exit %d %s" % (cmd[0], it, rc,
                                                         err[-300:]))
    expect(crashes == 0, "40 random well-formed snapshots x 8 commands: "
           "no crash")
    print("hostile: %d inputs x 5 commands" % len(hostile_inputs()))


def violations(mutate):
    snap = good_snapshot()
    mutate(snap)
    path = write_pickle(snap, "v.pickle")
    rc, out, err = run("check", path)
    return rc, out, err, path


def group_check():
    if not reader_available():
        need(False, "check: summary of a small valid snapshot")
    path = write_pickle(good_snapshot(), "good.pickle")
    rc, out, err = run("check", path)
    expect(rc == 0 and ": ok (" in out, "a consistent snapshot passes")
    rc, out, err = run("check", "--json", path)
    js = json.loads(out)
    expect(rc == 0 and js["violations"] == 0 and
           js["files"][0]["usable"], "check --json of a good file")

    def m_total(s):
        s["segments"][0]["total_size"] += 512
    def m_alloc(s):
        s["segments"][0]["allocated_size"] = 1
    def m_contig(s):
        s["segments"][0]["blocks"][1]["address"] += 512
    def m_state(s):
        s["segments"][0]["blocks"][0]["state"] = "active_awaiting_free"
    def m_sorted(s):
        s["segments"].reverse()
    def m_time(s):
        s["device_traces"][0][3]["time_us"] = 1
    def m_notime(s):
        del s["device_traces"][0][2]["time_us"]
    def m_action(s):
        s["device_traces"][0][3]["action"] = "free"
    def m_double_free(s):
        t = s["device_traces"][0]
        t.append(dict(t[4]))
    def m_late_segalloc(s):
        t = s["device_traces"][0]
        t[0], t[1] = t[1], t[0]
    def m_unknown_free(s):
        s["segments"][0]["blocks"][0]["state"] = "inactive"
        s["segments"][0]["allocated_size"] = 0
        s["segments"][0]["active_size"] = 0
        s["segments"][0]["requested_size"] = 0
    def m_req(s):
        s["segments"][1]["requested_size"] = 7
    cases = [
        (m_total, "segments[0]: total_size"),
        (m_alloc, "segments[0]: allocated_size 1"),
        (m_contig, "segments[0].blocks[1]: address"),
        (m_state, "segments[0].blocks[0]: unknown state "
                  "'active_awaiting_free'"),
        (m_sorted, "segments[1]: address"),
        (m_time, "device_traces[0][3]: time_us 1 is before"),
        (m_action, "device_traces[0][3]: unknown action 'free'"),
        (m_notime, "device_traces[0][2]: missing key 'time_us' (6 of the "
                   "device's 7 entries have it)"),
        (m_double_free, "device_traces[0][4]: free_completed of "
                        "0x7f0000400000 but the block is live"),
        (m_late_segalloc, "device_traces[0][1]: segment_alloc of "
                          "0x7f0000000000 comes after the alloc"),
        (m_unknown_free, "device_traces[0][1]: alloc of 0x7f0000000000 "
                         "(4194204 B): the block is neither live"),
        (m_req, "segments[1]: requested_size 7"),
    ]
    for fn, line in cases:
        rc, out, err, p = violations(fn)
        expect(rc == 1 and (p + ": " + line) in out,
               "check finds %s (%s)" % (fn.__name__, line))
        if rc != 1 or (p + ": " + line) not in out:
            print(out[-800:], err[-300:])


def group_diff():
    if not reader_available():
        need(False, "diff: summary of a small valid snapshot")
    a = good_snapshot()
    b = good_snapshot()
    seg = b["segments"][0]
    fr = seg["blocks"][0]["frames"]
    # B: a second 4 MiB block from the same site; the 2 MiB segment closed
    # and a new one opened.
    seg["blocks"] = [seg["blocks"][0],
                     {"address": A0 + 4 * MiB, "size": 4 * MiB,
                      "requested_size": 4 * MiB, "state": "active_allocated",
                      "frames": fr},
                     {"address": A0 + 8 * MiB, "size": 12 * MiB,
                      "requested_size": 0, "state": "inactive", "frames": []}]
    seg["allocated_size"] = seg["active_size"] = 8 * MiB
    seg["requested_size"] = 8 * MiB - 100
    b["segments"][1]["address"] += 32 * MiB
    for blk in b["segments"][1]["blocks"]:
        blk["address"] += 32 * MiB
    b["device_traces"] = [[]]
    pa, pb = write_pickle(a, "a.pickle"), write_pickle(b, "b.pickle")
    rc, out, err = run("diff", "--json", pa, pb)
    js = json.loads(out) if out else {}
    d = js.get("devices", [{}])[0]
    expect(rc == 1 and d.get("allocated_delta") == 4 * MiB and
           d.get("reserved_delta") == 0 and d.get("segments_opened") == 1 and
           d.get("segments_closed") == 1,
           "diff: deltas and segments opened/closed")
    lc = d.get("leak_candidates", [])
    expect(len(lc) == 1 and lc[0]["site"] == "u/model.py:12:forward" and
           lc[0]["growing"] and lc[0]["new_bytes"] == 4 * MiB,
           "diff: the growing site is the leak candidate (innermost user "
           "frame, torch frame skipped)")
    nb = d.get("new_by_site", [])
    expect(sum(x["count"] for x in nb) == 2 and
           sum(x["count"] for x in d.get("freed_by_site", [])) == 1,
           "diff: new and freed blocks grouped by site")
    rc, out, err = run("diff", pa, pa)
    expect(rc == 0, "diff of a file with itself exits 0")


def real_files():
    if not os.path.isdir(REAL):
        skip("real inputs: %s is missing -- tests that need the real "
             "snapshot files did NOT run" % REAL)
    files = sorted(glob.glob(os.path.join(REAL, "*.pickle")) +
                   glob.glob(os.path.join(REAL, "*.pkl")))
    if len(files) < 8:
        skip("real inputs: only %d files in %s" % (len(files), REAL))
    return files


def py_figures(path):
    with open(path, "rb") as f:
        d = pickle.load(f)
    segs = d if isinstance(d, list) else d.get("segments", [])
    traces = [] if isinstance(d, list) else d.get("device_traces", [])
    devs = set(s["device"] for s in segs)
    devs |= set(i for i, t in enumerate(traces) if t)
    out = {}
    for dev in sorted(devs):
        f = {"device": dev, "segments": 0, "reserved_bytes": 0,
             "allocated_bytes": 0, "active_bytes": 0, "requested_bytes": 0,
             "blocks": 0,
             "trace_entries": len(traces[dev]) if dev < len(traces) else 0}
        for s in segs:
            if s["device"] != dev:
                continue
            f["segments"] += 1
            f["reserved_bytes"] += s["total_size"]
            for b in s["blocks"]:
                f["blocks"] += 1
                if b["state"] == "active_allocated":
                    f["allocated_bytes"] += b["size"]
                if b["state"] in ("active_allocated", "active_pending_free"):
                    f["active_bytes"] += b["size"]
                    f["requested_bytes"] += b.get("requested_size", 0)
        out[dev] = f
    return out


def py_peaks(path):
    """Peak active (requested bytes) and reserved bytes over each device
    trace: the start values are the final ones minus the trace's net
    effect."""
    with open(path, "rb") as f:
        d = pickle.load(f)
    if isinstance(d, list):
        return {}
    out = {}
    for dev, tr in enumerate(d.get("device_traces", [])):
        if not tr:
            continue
        act = res = 0
        for s in d["segments"]:
            if s["device"] != dev:
                continue
            res += s["total_size"]
            for b in s["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    act += b["requested_size"]
        for e in tr:
            a = e["action"]
            if a == "alloc":
                act -= e["size"]
            elif a == "free_completed":
                act += e["size"]
            elif a in ("segment_alloc", "segment_map"):
                res -= e["size"]
            elif a in ("segment_free", "segment_unmap"):
                res += e["size"]
        pa, pr = act, res
        for e in tr:
            a = e["action"]
            if a == "alloc":
                act += e["size"]
            elif a == "free_completed":
                act -= e["size"]
            elif a in ("segment_alloc", "segment_map"):
                res += e["size"]
            elif a in ("segment_free", "segment_unmap"):
                res -= e["size"]
            pa, pr = max(pa, act), max(pr, res)
        out[dev] = (pa, pr)
    return out


def group_real():
    files = real_files()
    if not reader_available():
        need(False, "real: summary of a small valid snapshot")
    rc, out, err = run("check", *files)
    expect(rc == 0 and out.count(": ok (") == len(files),
           "check: all %d real inputs conform" % len(files))
    if rc != 0:
        print(out[-3000:], err[-1000:])
    for path in files:
        name = os.path.basename(path)
        rc, out, err = run("summary", "--json", path)
        if rc != 0:
            expect(False, "summary %s: exit %d %s" % (name, rc, err))
            continue
        js = json.loads(out)
        mine = {d["device"]: {k: d[k] for k in
                              ("device", "segments", "reserved_bytes",
                               "allocated_bytes", "active_bytes",
                               "requested_bytes", "blocks", "trace_entries")}
                for d in js["devices"]}
        ref = py_figures(path)
        expect(mine == ref, "summary --json figures of %s equal pickle's" %
               name)
        if mine != ref:
            print("  memsnap:", mine, "\n  pickle: ", ref)
        peaks = py_peaks(path)
        for dev, (pa, pr) in peaks.items():
            d = [x for x in js["devices"] if x["device"] == dev][0]
            expect(d["peak_allocated_bytes"] == pa and
                   d["peak_reserved_bytes"] == pr,
                   "summary %s device %d: peaks over the trace equal "
                   "pickle's (%d, %d)" % (name, dev, pa, pr))
        rc, out, err = run("summary", path)
        expect(rc == 0 and "reserved" in out, "summary text of %s" % name)
        svg = os.path.join(TMP, name + ".svg")
        rc, out, err = run("plot", path, "-o", svg)
        ok = rc == 0
        if ok:
            root = ET.parse(svg).getroot()
            ok = root.tag.endswith("svg")
        expect(ok, "plot %s: well-formed SVG" % name)
    a = os.path.join(REAL, "yiyi_llm_inference__oom_snapshot.pickle")
    b = os.path.join(REAL, "yiyi_llm_inference__1.3b_snapshot.pickle")
    rc, out, err = run("diff", a, a)
    expect(rc == 0 and "leak candidates" in out,
           "diff of a file with itself: no growing candidate")
    rc, out, err = run("diff", "--json", a, b)
    ok = rc in (0, 1)
    if ok:
        js = json.loads(out)
        d0 = js["devices"][0]
        ra = py_figures(a)[0]["reserved_bytes"]
        rb = py_figures(b)[0]["reserved_bytes"]
        ok = d0["reserved_delta"] == rb - ra
    expect(ok, "diff --json: reserved delta equals pickle's")


def writer_available():
    path = write_pickle(good_snapshot(), "probe_w.pickle")
    rc, out, err = run("convert", path, "-o", os.path.join(TMP, "probe.out"))
    return rc == 0


def group_convert():
    files = real_files()
    if not reader_available():
        need(False, "convert: summary of a small valid snapshot")
    if not writer_available():
        need(False, "convert: the snapshot writer writes a small snapshot")
    for path in files:
        name = os.path.basename(path)
        ref = py_figures(path)
        # convert round trip (pickle protocol 4 and JSON)
        conv = os.path.join(TMP, name + ".conv.pickle")
        rc, out, err = run("convert", path, "-o", conv)
        if rc == 0:
            with open(conv, "rb") as f:
                raw = f.read()
            expect(raw[:2] == b"\x80\x04", "convert %s: protocol 4" % name)
            d = pickle.loads(raw)
            segs = d["segments"]
            ref_n = sum(v["segments"] for v in ref.values())
            expect(isinstance(d, dict) and len(segs) == ref_n and
                   all("address" in b and "frames" in b
                       for s in segs for b in s["blocks"]),
                   "convert %s: current format, same segments" % name)
            rc4, out4, err4 = run("check", conv)
            expect(rc4 == 0, "convert %s: the output passes check" % name)
            if rc4 != 0:
                print(out4[-600:])
            rc2, out2, err2 = run("summary", "--json", conv)
            mine2 = {x["device"]: x["allocated_bytes"]
                     for x in json.loads(out2)["devices"]} if rc2 == 0 else {}
            expect(mine2 == {k: v["allocated_bytes"] for k, v in ref.items()},
                   "convert %s: re-read figures equal" % name)
        else:
            expect(False, "convert %s: exit %d %s" % (name, rc, err))
        jconv = os.path.join(TMP, name + ".json")
        rc, out, err = run("convert", "--json", path, "-o", jconv)
        if rc == 0:
            with open(jconv) as f:
                d = json.load(f)
            expect(len(d["segments"]) == sum(v["segments"]
                                              for v in ref.values()),
                   "convert --json %s parses" % name)
        else:
            expect(False, "convert --json %s: exit %d %s" % (name, rc, err))


REPLAYABLE = {
    "cranberrii_ftcourse__memory_snapshot.pickle":
        "63 segments predate the trace; start state rebuilt exactly",
    "kkaitlyn111_a2__memory_ctx128_forward_mixed.pickle":
        "227 segments predate the trace",
    "silmont2000_a2__mem_snapshot.pickle": "starts from an empty allocator",
    "silmont2000_a2__memory_forward_bf16_128.pickle":
        "43 segments predate the trace",
}
NOT_REPLAYABLE = {
    "yiyi_llm_inference__oom_snapshot.pickle": "no alloc history",
    "yiyi_llm_inference__1.3b_snapshot.pickle": "no alloc history",
    "maphsge4_select_n__snapshot_dec166a.pickle": "empty",
    "muduard_layoutediting__memory_snapshot.pkl": "bare list of segments",
}


def allocator_available():
    rc, out, err = run("demo-train", "--steps", "1", "--layers", "1",
                       "-o", os.path.join(TMP, "probe_train.pickle"))
    return rc == 0


def group_replay():
    if not reader_available():
        need(False, "replay: summary of a small valid snapshot")
    if not allocator_available():
        need(False, "replay: memsnap demo-train records a snapshot (allocator "
             "and recorder)")
    # A live recording from the built-in training loop replays exactly.
    live = os.path.join(TMP, "live.pickle")
    rc, out, err = run("demo-train", "-o", live)
    expect(rc == 0, "demo-train records a snapshot")
    rc, out, err = run("check", live)
    expect(rc == 0, "the live recording passes check")
    rc, out, err = run("replay", "--json", live)
    js = json.loads(out) if out else {}
    expect(rc == 0 and js.get("matches_recording") is True,
           "replay of the live recording matches (cuda)")
    with open(live, "rb") as f:
        d = pickle.load(f)
    nseg = sum(1 for e in d["device_traces"][0]
               if e["action"] == "segment_alloc")
    expect(js.get("segment_allocs") == nseg,
           "replay segment_allocs equals the recording's segment_alloc "
           "count (%d)" % nseg)
    # A ring buffer that dropped the oldest entries: the trace starts
    # mid-training; blocks freed in it have inferred sizes.
    tr = d["device_traces"][0]
    for cut in (37, 100, 201):
        e = dict(d)
        e["device_traces"] = [tr[cut:]]
        p = write_pickle(e, "cut%d.pickle" % cut)
        rc, out, err = run("check", p)
        expect(rc == 0, "a trace cut at entry %d still passes check" % cut)
        rc, out, err = run("replay", "--json", p)
        js = json.loads(out) if out else {}
        dv = (js.get("devices") or [{}])[0]
        expect(rc == 0 and js.get("matches_recording") is True and
               dv.get("initial_state") == "inferred" and
               dv.get("inferred_block_sizes", 0) > 0,
               "replay of the trace cut at entry %d matches, start state "
               "inferred (%s blocks)" % (cut, dv.get("inferred_block_sizes")))
    # Synthetic: empty_cache (segment_free) and a deferred free
    # (free_requested ... free_completed later).
    A1 = A0 + 64 * MiB
    def te(action, addr, size):
        return {"action": action, "addr": addr, "size": size, "stream": 0}
    trace = [te("segment_alloc", A0, 20 * MiB), te("alloc", A0, 4 * MiB - 100),
             te("free_requested", A0, 4 * MiB - 100),
             te("free_completed", A0, 4 * MiB - 100),
             te("segment_free", A0, 20 * MiB),
             te("segment_alloc", A1, 2 * MiB), te("alloc", A1, 400),
             te("free_requested", A1, 400), te("alloc", A1 + 512, 1000),
             te("free_completed", A1, 400)]
    seg = {"device": 0, "address": A1, "total_size": 2 * MiB,
           "allocated_size": 1024, "active_size": 1024,
           "requested_size": 1000, "stream": 0, "segment_type": "small",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
           "blocks": [
               {"address": A1, "size": 512, "requested_size": 400,
                "state": "inactive", "frames": []},
               {"address": A1 + 512, "size": 1024, "requested_size": 1000,
                "state": "active_allocated", "frames": []},
               {"address": A1 + 1536, "size": 2 * MiB - 1536,
                "requested_size": 0, "state": "inactive", "frames": []}]}
    p = write_pickle({"segments": [seg], "device_traces": [trace]},
                     "emptycache.pickle")
    rc, out, err = run("check", p)
    expect(rc == 0, "synthetic empty_cache/deferred-free recording passes "
           "check")
    rc, out, err = run("replay", "--json", p)
    js = json.loads(out) if out else {}
    expect(rc == 0 and js.get("matches_recording") is True and
           js.get("segment_frees") == 1 and js.get("segment_allocs") == 2 and
           js.get("final_reserved_bytes") == 2 * MiB and
           js.get("peak_reserved_bytes") == 20 * MiB,
           "replay: segment_free via empty_cache and a deferred free match")
    if js.get("matches_recording") is not True:
        print(out[-1500:], err[-500:])
    # Synthetic expandable recording: not replayable, says why.
    snap = good_snapshot()
    snap["segments"][0]["is_expandable"] = True
    p = write_pickle(snap, "expandable.pickle")
    rc, out, err = run("replay", "--json", p)
    js = json.loads(out) if out else {}
    expect(rc == 2 and js.get("matches_recording", 0) is None and
           "expandable" in (js.get("reason") or ""),
           "expandable recording: matches_recording null with a reason")
    files = real_files()
    for path in files:
        name = os.path.basename(path)
        out_pickle = os.path.join(TMP, name + ".replay.pickle")
        rc, out, err = run("replay", "--json", "--profile", "cuda", path,
                           "-o", out_pickle, timeout=600)
        try:
            js = json.loads(out)
        except ValueError:
            expect(False, "replay %s: JSON output (exit %d) %s" %
                   (name, rc, err[-300:]))
            continue
        for k in ("matches_recording", "segment_allocs", "segment_frees",
                  "peak_reserved_bytes", "final_reserved_bytes",
                  "mismatches"):
            expect(k in js, "replay %s: key %s" % (name, k))
        if name in REPLAYABLE:
            print("     %s replayable: %s" % (name, REPLAYABLE[name]))
            expect(rc == 0 and js["matches_recording"] is True,
                   "replay %s --profile cuda matches the recording" % name)
            if js["matches_recording"] is not True:
                print(json.dumps(js["mismatches"][:10], indent=1),
                      err[-500:])
            dev = js["devices"][0]
            expect(js["final_reserved_bytes"] ==
                   dev["recording"]["final_reserved_bytes"] and
                   js["segment_allocs"] == dev["recording"]["segment_allocs"],
                   "replay %s: final reserved and segment allocs equal the "
                   "recording's" % name)
            expect(os.path.exists(out_pickle),
                   "replay %s -o writes the replayed snapshot" % name)
            if os.path.exists(out_pickle):
                ref = py_figures(path)[0]
                got = py_figures(out_pickle)[0]
                expect(got["reserved_bytes"] == ref["reserved_bytes"] and
                       got["segments"] == ref["segments"],
                       "replay %s: replayed snapshot has the recorded "
                       "segments" % name)
            rc2, out2, err2 = run("replay", "--json", "--profile", "npu",
                                  path, timeout=600)
            js2 = json.loads(out2) if out2 else {}
            expect(rc2 == 0 and js2.get("mode") == "what-if" and
                   isinstance(js2.get("peak_reserved_bytes"), int),
                   "replay %s --profile npu answers peak reserved" % name)
            # The same recording with its oldest third dropped, as a ring
            # buffer would: sizes of blocks freed in it are inferred.
            with open(path, "rb") as f:
                d = pickle.load(f)
            tr = d["device_traces"][0]
            d["device_traces"] = [tr[len(tr) // 3:]]
            cut = write_pickle(d, name + ".cut.pickle")
            rc3, out3, err3 = run("replay", "--json", cut, timeout=600)
            js3 = json.loads(out3) if out3 else {}
            expect(rc3 == 0 and js3.get("matches_recording") is True,
                   "replay %s without its oldest third matches (start "
                   "state %s)" % (name, (js3.get("devices") or [{}])[0].get(
                       "initial_state")))
        else:
            print("     %s not replayable: %s" % (name, js.get("reason")))
            expect(rc == 2 and js["matches_recording"] is None and
                   js.get("reason"),
                   "replay %s: matches_recording null, reason given "
                   "(expected: %s)" % (name, NOT_REPLAYABLE.get(name)))


def png_not_blank(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False, "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    values = set(raw[i] for i in range(0, len(raw), 7))
    return len(values) > 20, "%d distinct byte values" % len(values)


def group_view():
    if not reader_available():
        need(False, "view: summary of a small valid snapshot")
    sources = [write_pickle(good_snapshot(), "good.pickle")]
    if os.path.isdir(REAL):
        sources.append(os.path.join(
            REAL, "cranberrii_ftcourse__memory_snapshot.pickle"))
        sources.append(os.path.join(
            REAL, "muduard_layoutediting__memory_snapshot.pkl"))
    else:
        print("SKIP (partly) real inputs missing: viewing synthetic only")
    chrome = None
    for c in ("chromium", "chromium-browser", "google-chrome",
              "chrome-headless-shell"):
        chrome = chrome or shutil.which(c)
    for src in sources:
        html = os.path.join(TMP, os.path.basename(src) + ".html")
        rc, out, err = run("view", src, "-o", html)
        expect(rc == 0, "view %s writes HTML" % os.path.basename(src))
        if rc != 0:
            print(err)
            continue
        with open(html, encoding="utf-8") as f:
            text = f.read()
        expect("http://" not in text.split("const DATA")[0] and
               "<script src" not in text and "https://" not in
               text.split("const DATA")[0] and "<link" not in text,
               "view %s: self-contained (no external resources)" %
               os.path.basename(src))
        if not chrome:
            continue
        png = os.path.join(TMP, os.path.basename(src) + ".png")
        p = subprocess.run([chrome, "--headless", "--no-sandbox",
                            "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1200,900",
                            "--screenshot=" + png, "file://" + html],
                           capture_output=True, text=True, timeout=180)
        ok = os.path.exists(png)
        why = p.stderr[-300:]
        if ok:
            ok, why = png_not_blank(png)
        expect(ok, "view %s: Chromium screenshot is not blank (%s)" %
               (os.path.basename(src), why))
    if not chrome:
        skip("view: no Chromium found (apt-get install -y chromium): the "
             "screenshot check did NOT run")


GROUPS = {"usage": group_usage, "hostile": group_hostile,
          "check": group_check, "real": group_real,
          "convert": group_convert, "diff": group_diff, "replay": group_replay,
          "view": group_view}

if __name__ == "__main__":
    GROUPS[GROUP]()
    finish()
