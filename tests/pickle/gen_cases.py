"""Write CPython pickles of many values at protocols 0..5 with their
canonical text: <out>/<name>.p<proto> and <out>/<name>.canon."""
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canon import canon  # noqa: E402

EDGE_INTS = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -1, -2**31,
             -2**31 - 1, 2**53, 2**60 - 1, 2**60, -2**60, -2**60 - 1,
             2**63 - 1, -2**63, 2**63, 2**64 - 1, 2**64, -2**63 - 1,
             2**100 + 12345, -(2**200) - 7, 10**40]
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e300, 5e-324, float("inf"),
          float("-inf"), 3.141592653589793, 0.1]
STRS = ["", "a", "hello world", "caf\u00e9", "\u4e2d\u6587", "\U0001f600",
        "back\\slash", "new\nline", "quote'\"", "x" * 300, "y" * 70000,
        "lone\ud800surrogate", "esc\udcffaped", "\ud83d\ude00pair",
        "end\udbff"]


def cases():
    shared = {"name": "f", "filename": "a.py", "line": 3}
    stack = [shared, {"name": "g", "filename": "b.py", "line": 4}]
    yield "ints", EDGE_INTS
    yield "floats", FLOATS
    yield "strs", STRS
    yield "consts", [None, True, False, (), [], {}, (1,), (1, 2),
                     (1, 2, 3), (1, 2, 3, 4)]
    yield "biglist", list(range(2500))
    yield "bigdict", {"k%d" % i: i for i in range(2100)}
    yield "nested", {"a": [1, [2, [3, [4, {"b": (5, 6)}]]]], "c": None}
    yield "memo", {"x": [stack, stack, stack], "y": stack, "z": shared}
    yield "snapshotish", {
        "segments": [{"device": 0, "address": 139927954128896,
                      "total_size": 2097152, "segment_pool_id": (0, 0),
                      "is_expandable": False, "frames": stack,
                      "blocks": [{"address": 139927954128896,
                                  "size": 512, "state": "active_allocated",
                                  "frames": stack}]}],
        "device_traces": [[{"action": "alloc", "addr": 1, "size": 2,
                            "frames": stack}] * 3]}
    yield "bytes", [b"", b"\x00\xff", bytearray(b"ab"), b"z" * 300]
    yield "sets", [set(), {1, 2, 3}, frozenset({"a", "b"}), {(1, 2)}]
    yield "intkeys", {1: "a", -5: "b", (1, 2): "c", 2**70: "d"}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    manifest = open(os.path.join(out, "MANIFEST"), "w")
    unsafe_ops = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ",
                  "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}
    for name, value in cases():
        with open(os.path.join(out, name + ".canon"), "w") as f:
            f.write(canon(value))
        for proto in range(6):
            try:
                data = pickle.dumps(value, protocol=proto)
            except Exception:
                continue
            with open(os.path.join(out, "%s.p%d" % (name, proto)), "wb") as f:
                f.write(data)
            ops = {op.name for op, _, _ in pickletools.genops(data)}
            manifest.write("%s %d %s\n" % (name, proto,
                           "unsafe" if ops & unsafe_ops else "ok"))
            n += 1
    manifest.close()
    print(n)


if __name__ == "__main__":
    main()
