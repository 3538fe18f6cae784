#!/usr/bin/env python3
"""Check the pinned-host part of a memsnap snapshot pickle with CPython's
own unpickler (cuda-reference §2.8).

Usage: check_host.py FILE [--viz]

Every host segment must carry the device-segment keys with the fixed
values of §2.8 and exactly one block; every host trace entry the
TraceEntry keys of §2.4.  Prints one JSON line: the number of host
segments, their states, the host actions in order and the number of
device trace entries.  With --viz, also runs
`python -m torch.cuda._memory_viz stats FILE` (torch must be importable)
and fails if it does.

Exit status 0 when the file passes, 1 with a message otherwise.
"""
import json
import pickle
import subprocess
import sys

SEG_KEYS = {"device", "address", "total_size", "allocated_size",
            "active_size", "requested_size", "stream", "segment_type",
            "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us",
              "compile_context", "user_metadata", "pool_id"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
           "segment_free"}


def need(cond, where, what):
    if not cond:
        print(f"{where}: {what}", file=sys.stderr)
        sys.exit(1)


def check_frames(frames, where):
    need(isinstance(frames, list), where, "frames is not a list")
    for i, f in enumerate(frames):
        need(isinstance(f, dict) and set(f) >= {"filename", "line", "name"},
             f"{where}[{i}]", "frame without filename/line/name")


def main():
    path = sys.argv[1]
    with open(path, "rb") as fh:
        snap = pickle.load(fh)
    need(isinstance(snap, dict), "top", "not a dict")
    for k in ("segments", "device_traces", "host_segments", "host_traces"):
        need(k in snap, "top", f"missing key {k}")
    states = []
    for i, seg in enumerate(snap["host_segments"]):
        w = f"host_segments[{i}]"
        need(set(seg) == SEG_KEYS, w, f"keys {sorted(seg)}")
        size = seg["total_size"]
        need(seg["device"] == -1, w, f"device {seg['device']} != -1")
        need(seg["stream"] == 0, w, "stream != 0")
        need(seg["segment_type"] == "small", w, "segment_type != small")
        need(seg["segment_pool_id"] == (0, 0), w, "segment_pool_id != (0, 0)")
        need(seg["is_expandable"] is False, w, "is_expandable not False")
        need(seg["requested_size"] == size, w, "requested_size != size")
        check_frames(seg["frames"], w + ".frames")
        need(len(seg["blocks"]) == 1, w, "not exactly one block")
        b = seg["blocks"][0]
        need(set(b) == BLOCK_KEYS, w + ".blocks[0]", f"keys {sorted(b)}")
        need(b["address"] == seg["address"] and b["size"] == size
             and b["requested_size"] == size, w + ".blocks[0]",
             "address/size/requested_size differ from the segment")
        st = b["state"]
        need(st in ("active_allocated", "active_pending_free", "inactive"),
             w, f"state {st}")
        need(seg["allocated_size"] == (size if st == "active_allocated"
                                       else 0), w, "allocated_size")
        need(seg["active_size"] == (0 if st == "inactive" else size), w,
             "active_size")
        check_frames(b["frames"], w + ".blocks[0].frames")
        states.append(st)
    addrs = [s["address"] for s in snap["host_segments"]]
    need(addrs == sorted(addrs), "host_segments", "not sorted by address")
    acts = []
    prev = None
    for i, e in enumerate(snap["host_traces"]):
        w = f"host_traces[{i}]"
        need(set(e) - {"frames"} == TRACE_KEYS, w, f"keys {sorted(e)}")
        need(e["action"] in ACTIONS, w, f"action {e['action']}")
        need(e["stream"] == 0 and e["pool_id"] == (0, 0), w,
             "stream/pool_id not 0/(0, 0)")
        need(isinstance(e["time_us"], int) and e["time_us"] > 10**15, w,
             "time_us not microseconds since the epoch")
        need(prev is None or e["time_us"] >= prev, w, "time_us decreases")
        prev = e["time_us"]
        if "frames" in e:
            check_frames(e["frames"], w + ".frames")
        acts.append(e["action"])
    ndev = sum(len(t) for t in snap["device_traces"])
    framed = sum(1 for e in snap["host_traces"] if e.get("frames"))
    print(json.dumps({"nseg": len(states), "states": states, "actions": acts,
                      "device_entries": ndev, "framed": framed,
                      "sizes": [s["total_size"]
                                for s in snap["host_segments"]]}))
    if "--viz" in sys.argv[2:]:
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz",
                            "stats", path], capture_output=True, text=True)
        need(r.returncode == 0, "_memory_viz stats", r.stderr[-2000:])


if __name__ == "__main__":
    main()
