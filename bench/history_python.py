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
PAIRS = 100000
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


def best(mem, rounds=5):
    deep(DEPTH, pairs, mem, 2000)  # warm the cache
    return min(deep(DEPTH, pairs, mem, PAIRS) for _ in range(rounds))


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
    print('RESULT depth=%d' % (DEPTH + 3))
    mem._record_memory_history(None)
    print('RESULT off_ns=%.2f' % best(mem))
    mem._record_memory_history('all', context='all', stacks='python',
                               max_entries=1000000)
    print('RESULT python_ns=%.2f' % best(mem))
    mem._record_memory_history(None)
    mem._record_memory_history('all', context='all', stacks='all',
                               max_entries=1000000)
    print('RESULT all_ns=%.2f' % best(mem))
    mem._record_memory_history(None)


if __name__ == '__main__':
    main()
