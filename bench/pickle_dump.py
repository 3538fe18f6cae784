#!/usr/bin/env python3
"""Anchor of bench row 3: CPython's pickle.dump of a snapshot object.

Loads the snapshot that bench_dump wrote (plain pickle, no torch classes),
then times pickle.dump of that same Python object to a file, protocol 4 as
torch.cuda.memory._dump_snapshot, best of 3.  Prints RESULT lines.

usage: pickle_dump.py SNAPSHOT_FILE
"""
import os
import pickle
import sys
import tempfile
import time


def main():
    with open(sys.argv[1], 'rb') as f:
        obj = pickle.load(f)
    best = None
    size = 0
    folder = os.path.dirname(os.path.abspath(sys.argv[1]))
    for _ in range(3):
        with tempfile.NamedTemporaryFile('wb', dir=folder,
                                         delete=False) as f:
            t0 = time.perf_counter()
            pickle.dump(obj, f, protocol=4)
            f.flush()
            t = time.perf_counter() - t0
            name = f.name
        size = os.path.getsize(name)
        os.unlink(name)
        best = t if best is None else min(best, t)
    print('RESULT dump_s=%.6f' % best)
    print('RESULT bytes=%d' % size)


if __name__ == '__main__':
    main()
