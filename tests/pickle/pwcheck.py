"""pwcheck.py PICKLE CANON: exit 0 when CPython loads PICKLE to a value whose
canonical text equals the file CANON, the pickle is protocol 4, uses only
MemoryViz opcodes and no FRAME is larger than 64 KiB."""
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canon import canon  # noqa: E402
from snapcheck import ALLOWED  # noqa: E402

data = open(sys.argv[1], "rb").read()
want = open(sys.argv[2]).read()
got = canon(pickle.loads(data))
if got != want:
    i = next((i for i in range(min(len(got), len(want)))
              if got[i] != want[i]), min(len(got), len(want)))
    print("canonical text differs at", i, got[i - 40:i + 40], "|",
          want[i - 40:i + 40])
    sys.exit(1)
for op, arg, pos in pickletools.genops(data):
    if op.name not in ALLOWED:
        print("opcode", op.name, "at", pos)
        sys.exit(1)
    if op.name == "FRAME" and arg > 65536:
        print("frame of", arg, "bytes at", pos)
        sys.exit(1)
if data[:2] != b"\x80\x04":
    print("not protocol 4")
    sys.exit(1)
