#!/usr/bin/env python3
"""Check a memsnap snapshot pickle with CPython's own unpickler.

Usage: check_dump.py MODE FILE [ARGS...]

Modes:
  full FILE NDEV      every key of cuda-reference §2 with the right types,
                      one trace list per device, time_us non-decreasing;
                      prints a JSON summary line (action counts...)
  oom FILE            a full dump whose device traces hold an `oom` entry
  segments FILE       a bare list of segments (memory_snapshot())
  frames FILE         a list of frame dicts (_allocation_traceback)
  csv FILE            a memory-usage report with the expected header

Exit status 0 when the file passes, 1 with a message naming the offending
path inside the object otherwise.
"""
import csv
import json
import pickle
import sys


class Bad(Exception):
    pass


def need(cond, where, what):
    if not cond:
        raise Bad(f"{where}: {what}")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where):
    need(isinstance(frames, list), where, "frames is not a list")
    for i, f in enumerate(frames):
        w = f"{where}[{i}]"
        need(isinstance(f, dict), w, "frame is not a dict")
        need(set(f) >= {"filename", "line", "name"}, w, f"keys {sorted(f)}")
        need(isinstance(f["filename"], str), w, "filename not str")
        need(isinstance(f["name"], str), w, "name not str")
        need(is_int(f["line"]), w, "line not int")


def check_pool(p, where):
    need(isinstance(p, tuple) and len(p) == 2 and all(is_int(x) for x in p),
         where, f"pool id {p!r} is not a 2-tuple of ints")


SEG_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
            "requested_size", "stream", "segment_type", "segment_pool_id",
            "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
           "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
           "annotate", "workspace_snapshot"}


def check_segment(s, where):
    need(isinstance(s, dict), where, "segment is not a dict")
    missing = SEG_KEYS - set(s)
    need(not missing, where, f"missing keys {sorted(missing)}")
    for k in ("device", "address", "total_size", "allocated_size",
              "active_size", "requested_size", "stream"):
        need(is_int(s[k]), where, f"{k} not int")
    need(s["segment_type"] in ("large", "small"), where, "segment_type")
    check_pool(s["segment_pool_id"], where + ".segment_pool_id")
    need(isinstance(s["is_expandable"], bool), where, "is_expandable")
    check_frames(s["frames"], where + ".frames")
    addr = s["address"]
    tot = alloc = active = req = 0
    for i, b in enumerate(s["blocks"]):
        w = f"{where}.blocks[{i}]"
        missing = BLOCK_KEYS - set(b)
        need(not missing, w, f"missing keys {sorted(missing)}")
        need(b["address"] == addr, w, f"address {b['address']:#x} != {addr:#x}")
        need(b["state"] in STATES, w, f"state {b['state']!r}")
        check_frames(b["frames"], w + ".frames")
        addr += b["size"]
        tot += b["size"]
        if b["state"] == "active_allocated":
            alloc += b["size"]
        if b["state"] != "inactive":
            active += b["size"]
            req += b["requested_size"]
    need(tot == s["total_size"], where, "block sizes do not sum to total_size")
    need(alloc == s["allocated_size"], where, "allocated_size")
    need(active == s["active_size"], where, "active_size")
    need(req == s["requested_size"], where, "requested_size")


def check_trace(e, where):
    need(isinstance(e, dict), where, "entry is not a dict")
    need(e.get("action") in ACTIONS, where, f"action {e.get('action')!r}")
    if e["action"] == "oom":
        need(is_int(e.get("device_free")) and "addr" not in e, where,
             "oom needs device_free and no addr")
    else:
        need(is_int(e.get("addr")), where, "addr")
    for k in ("size", "stream", "time_us"):
        need(is_int(e.get(k)), where, f"{k} not int")
    need(isinstance(e.get("compile_context"), str), where, "compile_context")
    need(isinstance(e.get("user_metadata"), str), where, "user_metadata")
    check_pool(e.get("pool_id"), where + ".pool_id")
    if "frames" in e:
        check_frames(e["frames"], where + ".frames")
    if "internal_metadata" in e:
        need(isinstance(e["internal_metadata"], str) and e["internal_metadata"],
             where, "internal_metadata must be a non-empty str")


SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF": str, "max_split_size": int,
            "garbage_collection_threshold": float, "expandable_segments": bool,
            "pinned_num_register_threads": int,
            "release_lock_on_cudamalloc": bool,
            "pinned_use_cuda_host_register": bool,
            "graph_capture_record_stream_reuse": bool,
            "max_round_threshold": int, "max_cached_size": int,
            "roundup_power2_divisions": dict,
            "trace_alloc_max_entries": int, "trace_alloc_overflowed": bool}


def check_full(d, ndev):
    need(isinstance(d, dict), "top", "not a dict")
    keys = {"segments", "device_traces", "allocator_settings",
            "external_annotations", "host_segments", "host_traces"}
    need(set(d) >= keys, "top", f"missing {sorted(keys - set(d))}")
    for i, s in enumerate(d["segments"]):
        check_segment(s, f"segments[{i}]")
    # Workspace buffers (allocator_settings.workspace_segments) may come
    # last, in any order: torch_npu's layout, the npu profile's default.
    ws = set(d.get("allocator_settings", {}).get("workspace_segments", []))
    segs = d["segments"]
    k = len(segs)
    while k > 0 and segs[k - 1]["address"] in ws:
        k -= 1
    head = [s for s in segs[:k]]
    devs = [s["device"] for s in head]
    need(devs == sorted(devs), "segments", "devices not in order")
    for dev in set(devs):
        addrs = [s["address"] for s in segs
                 if s["device"] == dev and (s in head or s["address"] not in ws)]
        need(addrs == sorted(addrs), "segments", f"device {dev} not sorted")
    dt = d["device_traces"]
    need(isinstance(dt, list), "device_traces", "not a list")
    if dt:
        need(len(dt) == ndev, "device_traces", f"{len(dt)} lists, want {ndev}")
    counts = {}
    for di, lst in enumerate(dt):
        prev = None
        for i, e in enumerate(lst):
            check_trace(e, f"device_traces[{di}][{i}]")
            counts[e["action"]] = counts.get(e["action"], 0) + 1
            if prev is not None:
                need(e["time_us"] >= prev, f"device_traces[{di}][{i}]",
                     "time_us decreases")
            prev = e["time_us"]
    st = d["allocator_settings"]
    for k, t in SETTINGS.items():
        need(k in st, "allocator_settings", f"missing {k}")
        need(type(st[k]) is t, "allocator_settings",
             f"{k} is {type(st[k]).__name__}, want {t.__name__}")
    rd = st["roundup_power2_divisions"]
    need(sorted(rd, key=int) == [str(1 << i) for i in range(16)],
         "allocator_settings.roundup_power2_divisions", f"keys {sorted(rd)}")
    for a in d["external_annotations"]:
        need(set(a) == {"name", "stage", "device", "time_us"},
             "external_annotations", f"keys {sorted(a)}")
        need(a["stage"] in ("START", "END"), "external_annotations", "stage")
    need(d["host_segments"] == [] and d["host_traces"] == [], "host",
         "host data without host recording")
    return counts


def main(argv):
    mode, path = argv[1], argv[2]
    if mode == "csv":
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        need(rows and rows[0][:4] == ["device", "pool", "total_bytes",
                                      "free_bytes"], path, f"header {rows[:1]}")
        need(len(rows) > 1, path, "no data rows")
        print(json.dumps({"rows": len(rows) - 1}))
        return 0
    with open(path, "rb") as f:
        d = pickle.load(f)
    if mode == "full":
        counts = check_full(d, int(argv[3]))
        st = d["allocator_settings"]
        print(json.dumps({"actions": counts, "segments": len(d["segments"]),
                          "annotations": len(d["external_annotations"]),
                          "overflowed": st["trace_alloc_overflowed"]}))
    elif mode == "oom":
        check_full(d, len(d["device_traces"]))
        ooms = [e for lst in d["device_traces"] for e in lst
                if e["action"] == "oom"]
        need(len(ooms) >= 1, "device_traces", "no oom entry")
        print(json.dumps({"oom": len(ooms), "size": ooms[-1]["size"],
                          "device_free": ooms[-1]["device_free"]}))
    elif mode == "segments":
        need(isinstance(d, list), "top", "not a list of segments")
        for i, s in enumerate(d):
            check_segment(s, f"[{i}]")
        print(json.dumps({"segments": len(d)}))
    elif mode == "frames":
        check_frames(d, "traceback")
        need(len(d) > 0, "traceback", "empty")
        print(json.dumps({"frames": len(d), "first": d[0]["name"]}))
    else:
        raise Bad(f"unknown mode {mode}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Bad as e:
        print(f"check_dump: {e}", file=sys.stderr)
        sys.exit(1)
