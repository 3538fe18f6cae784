"""Cost of memsnap's Python frame capture (the frame hook in
python/_memsnap/frames.c), per allocation event.

Two numbers for a stack of ~20 Python frames:
  * steady: the same stack captured again and again (frame objects already
    exist);
  * fresh: a new 20-deep call chain for every capture (CPython 3.11+ must
    create the frame objects that PyFrame_GetBack returns); one capture
    timed at the bottom of each chain (includes ~2 clock reads).
Goal (brief): <= 0.2 us per event for ~20 frames.  Run:
    .venv/bin/python bench/python_frames.py
"""

from __future__ import annotations

import time

from memsnap import _memsnap

DEPTH = 19  # + the bench's own frames ~= 21


def steady() -> tuple[float, int]:
    def rec(n):
        if n == 0:
            return _memsnap.bench_capture(200_000, 64)
        return rec(n - 1)

    return rec(DEPTH)


def fresh(n: int = 20_000) -> float:
    """Mean ns of one capture at the bottom of a new 20-deep chain."""
    bench = _memsnap.bench_capture

    def chain(k):
        if k == 0:
            return bench(1, 64)[0]
        return chain(k - 1)

    total = 0.0
    for _ in range(n):
        total += chain(DEPTH)
    return total / n


if __name__ == "__main__":
    ns, depth = steady()
    print(f"steady capture: {ns:7.1f} ns for {depth} frames ({ns / depth:.1f} ns/frame)")
    print(f"fresh chain   : {fresh():7.1f} ns per capture (new frames each time)")
