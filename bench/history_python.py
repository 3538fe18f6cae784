#!/usr/bin/env python3
"""Bench row 2 (Python side): history overhead seen from Python.

Drives the memsnap package the way a PyTorch user's code does: alloc+free
pairs of cached sizes made from a call stack DEPTH Python frames deep, with
history off, then with python stacks, then with 'all' (python + C).  Uses
memsnap.memory.caching_allocator_alloc / caching_allocator_delete (as
torch.cuda.memory) on the sim runtime.  Prints RESULT lines: ns per pair.
"""
import os
import sys
import time

DEPTH = 20
PAIRS = 50000
ROUNDS = 7
SIZES = [512, 4096, 65536, 1 << 20, 3 << 20]


def pairs(mem, n):
    alloc, delete = mem.caching_allocator_alloc, mem.caching_allocator_delete
    sizes = SIZES
    k = len(sizes)
    t0 = time.perf_counter_ns()
    for i in range(n):
        p = alloc(sizes[i % k])
        delete(p)
    return (time.perf_counter_ns() - t0) / n


def deep(depth, fn, *args):
    if depth <= 1:
        return fn(*args)
    return deep(depth - 1, fn, *args)


def frames_recorded(mem):
    """Frames of the newest alloc entry (proves stacks were captured)."""
    snap = mem._snapshot()
    for trace in snap.get('device_traces', []):
        for e in reversed(trace):
            if e.get('action') == 'alloc':
                return len(e.get('frames', []))
    return 0


def modes(mem):
    """Best ns per pair of each history mode, rounds interleaved so that a
    busy machine disturbs every mode alike."""
    settings = {
        'off': None,
        'python': dict(context='all', stacks='python'),
        'all': dict(context='all', stacks='all'),
    }
    best = {}
    frames = {}
    for _ in range(ROUNDS):
        for name, kw in settings.items():
            mem._record_memory_history(None)
            if kw is not None:
                mem._record_memory_history('all', max_entries=1000000, **kw)
            deep(DEPTH, pairs, mem, 2000)  # warm the cache
            ns = deep(DEPTH, pairs, mem, PAIRS)
            best[name] = min(best.get(name, ns), ns)
            if kw is not None and name not in frames:
                frames[name] = frames_recorded(mem)
    mem._record_memory_history(None)
    return best, frames


def main():
    os.environ.setdefault('MEMSNAP_RUNTIME', 'sim')
    try:
        import memsnap.memory as mem
    except ImportError as e:
        print('history_python: memsnap package not importable: %s' % e,
              file=sys.stderr)
        sys.exit(1)
    for name in ('caching_allocator_alloc', 'caching_allocator_delete',
                 '_record_memory_history'):
        if not hasattr(mem, name):
            print('history_python: memsnap.memory.%s missing' % name,
                  file=sys.stderr)
            sys.exit(1)
    best, frames = modes(mem)
    print('RESULT depth=%d' % (DEPTH + 3))
    print('RESULT python_frames=%d' % frames.get('python', 0))
    print('RESULT all_frames=%d' % frames.get('all', 0))
    for name in ('off', 'python', 'all'):
        print('RESULT %s_ns=%.2f' % (name, best[name]))

if __name__ == '__main__':
    main()
