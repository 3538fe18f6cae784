"""Round trip cost of memsnap.memory.caching_allocator_alloc + _delete
(Python wrapper + METH_FASTCALL binding + allocator), with history off and
with history on (context "all", Python stacks).  Run:
    MEMSNAP_RUNTIME=sim .venv/bin/python bench/python_alloc.py
"""

from __future__ import annotations

import time

import memsnap.memory as mm
from memsnap import _memsnap


def loop(n: int, alloc, free) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        free(alloc(4096, 0, 0))
    return (time.perf_counter() - t0) / n * 1e9


def main() -> None:
    n = 200_000
    for label in ("history off", "history on (all, python stacks)"):
        if label.startswith("history on"):
            mm._record_memory_history("all", stacks="python", max_entries=100_000)
        raw = loop(n, _memsnap.malloc, _memsnap.free)
        wrapped = loop(n, mm.caching_allocator_alloc, mm.caching_allocator_delete)
        print(f"{label:34s} binding {raw:7.0f} ns   memsnap.memory {wrapped:7.0f} ns "
              "per alloc+free")


if __name__ == "__main__":
    main()
