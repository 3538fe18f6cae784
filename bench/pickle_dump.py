#!/usr/bin/env python3
"""Anchor of bench row 3: CPython's pickle.dump of a snapshot object.

Loads the snapshot that bench_dump wrote (plain pickle, no torch classes),
then times pickle.dump of that same Python object to a new file, protocol
4 as torch.cuda.memory._dump_snapshot (wall and process CPU time; the file
is removed after timing).

  pickle_dump.py SNAPSHOT [ROUNDS]   ROUNDS dumps; prints their medians
  pickle_dump.py SNAPSHOT --serve    prints "ready", then one timed dump
                                     per line read from stdin, so that the
                                     runner alternates it with bench_dump

Prints RESULT lines: dump_s, cpu_s (medians), bytes.
"""
import os
import pickle
import statistics
import sys
import time


def dump_once(obj, folder, r):
    name = os.path.join(folder, '.pickle_dump.%d.%d' % (os.getpid(), r))
    c0, t0 = time.process_time(), time.perf_counter()
    with open(name, 'wb') as f:
        pickle.dump(obj, f, protocol=4)
        f.flush()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = os.path.getsize(name)
    os.unlink(name)
    return wall, cpu, size


def main():
    with open(sys.argv[1], 'rb') as f:
        obj = pickle.load(f)
    folder = os.path.dirname(os.path.abspath(sys.argv[1]))
    serve = len(sys.argv) > 2 and sys.argv[2] == '--serve'
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 and not serve else 3
    walls, cpus, size = [], [], 0
    if serve:
        print('ready', flush=True)
        for _ in sys.stdin:
            w, c, size = dump_once(obj, folder, len(walls))
            walls.append(w)
            cpus.append(c)
            print('dump_s=%.6f cpu_s=%.6f' % (w, c), flush=True)
    else:
        for r in range(rounds):
            w, c, size = dump_once(obj, folder, r)
            walls.append(w)
            cpus.append(c)
    print('RESULT rounds=%d' % len(walls))
    print('RESULT dump_s=%.6f' % statistics.median(walls))
    print('RESULT cpu_s=%.6f' % statistics.median(cpus))
    print('RESULT bytes=%d' % size)


if __name__ == '__main__':
    main()
