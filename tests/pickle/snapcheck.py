"""CPython side of the snapshot tests.

  snapcheck.py figures FILE        -> "key value" lines computed by pickle
  snapcheck.py same ORIG REWRITTEN [--unordered]
                                   -> exit 0 when pickle.load gives equal
                                      objects (with the same key order
                                      unless --unordered) and REWRITTEN is
                                      protocol 4 with MemoryViz opcodes
  snapcheck.py synth DIR           -> write synthetic snapshots of every
                                      generation / key variant into DIR
"""
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canon import canon  # noqa: E402

ALLOWED = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST",
           "EMPTY_TUPLE", "SETITEMS", "APPENDS", "APPEND", "SETITEM",
           "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "NONE", "NEWTRUE",
           "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
           "SHORT_BINUNICODE", "BINUNICODE", "MEMOIZE", "BINGET",
           "LONG_BINGET"}


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def figures(path):
    d = load(path)
    segs = d if isinstance(d, list) else d.get("segments", [])
    out = {
        "segments": len(segs),
        "blocks": sum(len(s["blocks"]) for s in segs),
        "total_size": sum(s["total_size"] for s in segs),
        "block_size": sum(b["size"] for s in segs for b in s["blocks"]),
        "active_allocated": sum(1 for s in segs for b in s["blocks"]
                                if b["state"] == "active_allocated"),
    }
    traces = d.get("device_traces", []) if isinstance(d, dict) else []
    out["devices"] = len(traces)
    out["trace_entries"] = sum(len(t) for t in traces)
    for i, t in enumerate(traces):
        out["device%d" % i] = len(t)
    out["trace_size"] = sum(e["size"] for t in traces for e in t)
    out["annotations"] = len(d.get("external_annotations", [])) \
        if isinstance(d, dict) else 0
    for k, v in out.items():
        print(k, v)


def same(orig, rewritten, ordered=True):
    a, b = load(orig), load(rewritten)
    if a != b:
        print("objects differ")
        return 1
    if ordered and canon(a) != canon(b):
        print("key order differs")
        return 1
    with open(rewritten, "rb") as f:
        data = f.read()
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    bad = ops - ALLOWED
    if bad:
        print("opcodes outside the MemoryViz subset:", sorted(bad))
        return 1
    proto = data[1] if data[:1] == b"\x80" else 0
    if proto != 4:
        print("protocol", proto)
        return 1
    return 0


def synth(out):
    os.makedirs(out, exist_ok=True)
    f1 = {"name": "train", "filename": "/x/train.py", "line": 10}
    f2 = {"name": "step", "filename": "/x/opt.py", "line": 20,
          "fx_node_op": "call_function", "fx_node_name": "mm",
          "fx_node_target": "aten.mm", "fx_original_trace": "a\nb"}
    st = [f2, f1]
    A = 139927954128896
    newest = {
        "segments": [
            {"device": 0, "address": A, "total_size": 2097152,
             "allocated_size": 512, "active_size": 1024,
             "requested_size": 900, "stream": 0, "segment_type": "small",
             "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": st, "forward_frames": ["fwd line\n"],
             "blocks": [
                 {"address": A, "size": 512, "requested_size": 400,
                  "state": "active_allocated", "frames": st},
                 {"address": A + 512, "size": 512, "requested_size": 500,
                  "state": "active_pending_free", "frames": st,
                  "forward_frames": ["x\n", "y\n"]},
                 {"address": A + 1024, "size": 2096128,
                  "requested_size": 0, "state": "inactive", "frames": []}]},
            {"device": 1, "address": A * 2, "total_size": 20971520,
             "allocated_size": 0, "active_size": 0, "requested_size": 0,
             "stream": 94000000000000, "segment_type": "large",
             "segment_pool_id": (1, 7), "is_expandable": True,
             "frames": [],
             "blocks": [{"address": A * 2, "size": 20971520,
                         "requested_size": 0, "state": "inactive",
                         "frames": []}]}],
        "device_traces": [
            [{"action": "segment_alloc", "addr": A, "size": 2097152,
              "stream": 0, "time_us": 1772552894612167,
              "compile_context": "N/A", "user_metadata": "",
              "pool_id": (0, 0), "frames": st},
             {"action": "alloc", "addr": A, "size": 400, "stream": 0,
              "time_us": 1772552894612168, "compile_context": "N/A",
              "user_metadata": "meta", "internal_metadata":
              "mallocWithAddress", "pool_id": (0, 0), "frames": st,
              "forward_frames": ["f\n"]},
             {"action": "oom", "device_free": 1024, "size": 2097152,
              "stream": 0, "time_us": 1772552894612169,
              "compile_context": "Torch-Compiled Region: 0/0",
              "user_metadata": "", "pool_id": (0, 0)},
             {"action": "snapshot", "addr": 0, "size": 1024, "stream": 0,
              "time_us": 1772552894612170, "compile_context": "N/A",
              "user_metadata": "", "pool_id": (0, 0)},
             {"action": "free", "addr": A, "size": 400, "stream": 0,
              "time_us": 1772552894612171, "compile_context": "N/A",
              "user_metadata": "", "pool_id": (0, 0)}],
            [],
            [{"action": "segment_map", "addr": A * 2, "size": 20971520,
              "stream": 94000000000000, "time_us": 1772552894612172,
              "compile_context": "N/A", "user_metadata": "",
              "pool_id": (1, 7)}] * 1500],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "max_split_size": -1, "garbage_collection_threshold": 0.5,
            "expandable_segments": True,
            "roundup_power2_divisions": {str(2**i): i % 3
                                         for i in range(16)}},
        "external_annotations": [
            {"stage": "START", "name": "fwd", "device": 0,
             "time_us": 1772552894612160},
            {"stage": "END", "name": "fwd", "device": 0,
             "time_us": 1772552894612190}],
        "host_segments": [
            {"device": -1, "address": 4096, "total_size": 4096,
             "allocated_size": 4096, "active_size": 4096,
             "requested_size": 4096, "stream": 0, "segment_type": "small",
             "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [],
             "blocks": [{"address": 4096, "size": 4096,
                         "requested_size": 4096,
                         "state": "active_allocated", "frames": []}]}],
        "host_traces": [{"action": "alloc", "addr": 4096, "size": 4096,
                         "stream": 0, "time_us": 1772552894612100,
                         "compile_context": "N/A", "user_metadata": "",
                         "pool_id": (0, 0)}],
    }
    variants = {"newest": newest}
    # 2.2: like 2.1 plus time_us
    v22 = {"segments": [dict((k, v) for k, v in s.items()
                             if k != "forward_frames")
                        for s in newest["segments"]],
           "device_traces": [[{"action": e["action"], "addr": e.get(
               "addr", 0), "size": e["size"], "stream": e["stream"],
               "time_us": e["time_us"]} for e in t]
               for t in newest["device_traces"]]}
    variants["v22"] = v22
    # minimal (as _profile_to_snapshot writes, without `category`)
    variants["minimal"] = {
        "segments": [{"device": 0, "address": A, "total_size": 1024,
                      "stream": 0,
                      "blocks": [{"size": 512, "state": "active_allocated",
                                  "requested_size": 500, "frames": st},
                                 {"size": 512, "state": "inactive"}]}],
        "device_traces": [[{"action": "alloc", "addr": A, "size": 500,
                            "stream": 0, "frames": st}]]}
    variants["empty_traces"] = {"segments": [], "device_traces": []}
    # torch_npu today: pool_id but no time_us/compile_context/user_metadata,
    # and the workspace_snapshot action
    variants["npu"] = {
        "segments": newest["segments"][:1],
        "device_traces": [[
            {"action": "workspace_snapshot", "addr": 0, "size": 4096,
             "stream": 0, "pool_id": (0, 0)},
            {"action": "alloc", "addr": A, "size": 400, "stream": 0,
             "pool_id": (0, 0), "frames": st}]]}
    for name, v in variants.items():
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(v, f, protocol=4)
    # the same content at protocol 2 and 5 must read identically
    with open(os.path.join(out, "newest_p2.pickle"), "wb") as f:
        pickle.dump(newest, f, protocol=2)
    with open(os.path.join(out, "newest_p5.pickle"), "wb") as f:
        pickle.dump(newest, f, protocol=5)
    # values MemoryViz cannot read / the model cannot hold
    big = {"segments": [], "device_traces": [[{"action": "alloc",
                                               "addr": 2**63, "size": 1,
                                               "stream": 0}]]}
    with open(os.path.join(out, "addr_2_63.pickle"), "wb") as f:
        pickle.dump(big, f, protocol=4)
    big["device_traces"][0][0]["addr"] = 2**70
    with open(os.path.join(out, "addr_2_70.pickle"), "wb") as f:
        pickle.dump(big, f, protocol=4)
    # negative addresses, in 64 bits and wider: refused alike, by value
    for name, addr in (("addr_neg5", -5), ("addr_neg_2_64", -2**64)):
        big["device_traces"][0][0]["addr"] = addr
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(big, f, protocol=4)
    print(len(variants))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "figures":
        figures(sys.argv[2])
    elif cmd == "same":
        sys.exit(same(sys.argv[2], sys.argv[3],
                      ordered="--unordered" not in sys.argv))
    elif cmd == "synth":
        synth(sys.argv[2])
