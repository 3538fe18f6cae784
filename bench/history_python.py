#!/usr/bin/env python3
"""Bench row 2 (Python side): history overhead seen from Python, and the
anchor: torch's own stack capture in the same process.

memsnap: alloc+free pairs of cached sizes through memsnap.memory
(caching_allocator_alloc / caching_allocator_delete, as torch.cuda.memory)
on the sim runtime, with history off, with history on and no stacks
(context None: trace entries without frames), with python stacks, with
'all' (python + C).  What stacks add is a mode's time per pair minus the
time with history on and no stacks (as bench_history.c's C rows); the
cost of history itself is that mode minus history off.

Anchor: what torch pays for the same stacks.  With
_record_memory_history(context='all'), PyTorch's caching allocator gathers
a traceback at the malloc and at the free of every pair
(CUDACachingAllocator.cpp: maybeGatherContext); on the CPU the same
capture is torch._C._profiler.gather_traceback(python=True, script=False,
cpp=False): two calls per pair, minus the cost of two empty calls.

Two shapes of the caller's stack, DEPTH Python frames deep:
  steady  every pair made from the same frames (a loop at one depth);
  fresh   every pair at the bottom of a new call chain (as allocation
          sites are reached in a training step: frames are new each time;
          torch's capture then has to create their frame objects).

Rounds interleave every mode (each round runs each mode once, in turn),
and the figure of a mode is the median over the rounds of its thread CPU
time per pair: on a machine shared with other jobs, time spent waiting
for a core is not charged to either side.  Prints RESULT lines.
"""
import os
import statistics
import sys
import time

DEPTH = 20
PAIRS = 30000
FRESH_PAIRS = 8000
ROUNDS = 15
SIZES = [512, 4096, 65536, 1 << 20, 3 << 20]
clock = time.thread_time_ns


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


def main():
    os.environ.setdefault('MEMSNAP_RUNTIME', 'sim')
    try:
        import memsnap.memory as mem
    except ImportError as e:
        print('history_python: memsnap package not importable: %s' % e,
              file=sys.stderr)
        sys.exit(1)
    try:
        from torch._C._profiler import gather_traceback
    except ImportError:
        gather_traceback = None
    alloc, delete = mem.caching_allocator_alloc, mem.caching_allocator_delete

    # steady: a loop at one depth
    def pairs(n):
        k = len(SIZES)
        t0 = clock()
        for i in range(n):
            p = alloc(SIZES[i % k])
            delete(p)
        return (clock() - t0) / n

    def torch_pairs(n):
        g = gather_traceback
        t0 = clock()
        for _ in range(n):
            g(True, False, False)
            g(True, False, False)
        return (clock() - t0) / n

    def two_calls(n):  # what two calls cost without a capture
        f, x = len, ()
        t0 = clock()
        for _ in range(n):
            f(x)
            f(x)
        return (clock() - t0) / n

    # fresh: a new DEPTH-deep chain for every pair
    def chain(k, fn):
        if k == 0:
            return fn()
        return chain(k - 1, fn)

    def one_pair():
        p = alloc(4096)
        delete(p)

    def one_torch():
        gather_traceback(True, False, False)
        gather_traceback(True, False, False)

    def one_nothing():
        len(())
        len(())

    def fresh(fn):
        def run(n):
            t0 = clock()
            for _ in range(n):
                chain(DEPTH, fn)
            return (clock() - t0) / n
        return run

    history = {'off': None, 'nostack': 'none', 'python': 'python',
               'all': 'all'}
    modes = [
        ('off', 'off', lambda n: deep(DEPTH, pairs, n), PAIRS),
        ('nostack', 'nostack', lambda n: deep(DEPTH, pairs, n), PAIRS),
        ('python', 'python', lambda n: deep(DEPTH, pairs, n), PAIRS),
        ('all', 'all', lambda n: deep(DEPTH, pairs, n), PAIRS),
        ('fresh_off', 'off', fresh(one_pair), FRESH_PAIRS),
        ('fresh_nostack', 'nostack', fresh(one_pair), FRESH_PAIRS),
        ('fresh_python', 'python', fresh(one_pair), FRESH_PAIRS),
    ]
    if gather_traceback is not None:
        modes += [
            ('torch', 'off', lambda n: deep(DEPTH, torch_pairs, n), PAIRS),
            ('calls', 'off', lambda n: deep(DEPTH, two_calls, n), PAIRS),
            ('fresh_torch', 'off', fresh(one_torch), FRESH_PAIRS),
            ('fresh_calls', 'off', fresh(one_nothing), FRESH_PAIRS),
        ]
    res = {name: [] for name, _, _, _ in modes}
    frames = {}
    for r in range(ROUNDS):
        for j in range(len(modes)):
            name, hist, fn, n = modes[(r + j) % len(modes)]
            mem._record_memory_history(None)
            if history[hist] == 'none':
                mem._record_memory_history('all', context=None,
                                           max_entries=1000000)
            elif history[hist] is not None:
                mem._record_memory_history('all', stacks=history[hist],
                                           max_entries=1000000)
            fn(1000)  # warm: stacks interned, caches filled
            res[name].append(fn(n))
            if history[hist] not in (None, 'none') and hist not in frames:
                frames[hist] = frames_recorded(mem)
    mem._record_memory_history(None)
    print('RESULT depth=%d' % (DEPTH + 3))
    print('RESULT rounds=%d' % ROUNDS)
    print('RESULT python_frames=%d' % frames.get('python', 0))
    print('RESULT all_frames=%d' % frames.get('all', 0))
    for name in res:
        print('RESULT %s_ns=%.2f' % (name, statistics.median(res[name])))


if __name__ == '__main__':
    main()
