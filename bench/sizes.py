#!/usr/bin/env python3
"""Write the request-size mix of the real snapshots, one size a line.

Sizes are the `size` of every `alloc` trace entry (the requested size, as
PyTorch records it) and the `requested_size` of every active block, over
every file in the real-inputs folder, read with plain CPython pickle (the
files hold no torch classes).  Without the folder a fixed fallback mix is
written instead, and the first line's comment says so.

usage: sizes.py OUT_FILE [REAL_INPUTS_DIR]
"""
import argparse
import glob
import os
import pickle
import random
import sys


def real_sizes(folder):
    sizes = []
    files = sorted(glob.glob(os.path.join(folder, '*.pickle')) +
                   glob.glob(os.path.join(folder, '*.pkl')))
    for path in files:
        with open(path, 'rb') as f:
            snap = pickle.load(f)
        segments = snap if isinstance(snap, list) else snap.get('segments', [])
        for seg in segments:
            for b in seg.get('blocks', []):
                if b.get('state') == 'active_allocated':
                    sizes.append(int(b.get('requested_size') or b['size']))
        if isinstance(snap, dict):
            for trace in snap.get('device_traces', []):
                for e in trace:
                    if e.get('action') == 'alloc' and e.get('size'):
                        sizes.append(int(e['size']))
    return files, [s for s in sizes if s > 0]


def fallback_sizes():
    """A training-step-like mix: many small tensors, activations of a few
    MiB, some large weights/buffers (deterministic)."""
    rng = random.Random(20261129)
    sizes = []
    for _ in range(6000):
        r = rng.random()
        if r < 0.45:
            sizes.append(rng.choice([4, 8, 512, 1024, 2048, 4096]) *
                         rng.randint(1, 64))
        elif r < 0.85:
            sizes.append(rng.randint(1, 64) << 16)
        else:
            sizes.append(rng.randint(1, 48) << 20)
    return sizes


def main():
    ap = argparse.ArgumentParser(
        description='Write the request-size mix of the real snapshots.')
    ap.add_argument('out', help='output file, one size a line')
    ap.add_argument('real', nargs='?', default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared',
        'real_inputs'), help='real-inputs folder')
    args = ap.parse_args()
    out, folder = args.out, args.real
    files, sizes = ([], [])
    if os.path.isdir(folder):
        files, sizes = real_sizes(folder)
    if sizes:
        origin = 'real inputs: %d files, %d requests' % (len(files), len(sizes))
    else:
        print('sizes.py: WARNING: no real inputs at %s, using the fallback '
              'mix' % folder, file=sys.stderr)
        sizes = fallback_sizes()
        origin = 'fallback mix (real inputs missing)'
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        for s in sizes:
            f.write('%d\n' % s)
    print(origin)


if __name__ == '__main__':
    main()
