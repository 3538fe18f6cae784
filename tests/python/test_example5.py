"""allocator-algorithm.md §21 worked example 5 through memsnap.memory.

MEMSNAP_PROFILE=cuda (PyTorch's decisions, no NPU pad).  After every step
the segment layout (memory_snapshot) and the statistics (memory_stats) are
exactly the spec's, and memory_summary is what torch's own formatter
prints for those statistics.
"""

from __future__ import annotations

import pytest

from conftest import base_env, run_script

MiB = 1 << 20

SCRIPT = r"""
import json
import memsnap.memory as mm
MiB = 1 << 20
steps = []
def record(label):
    segs = mm.memory_snapshot()
    st = mm.memory_stats()
    layout = []
    for seg in segs:
        base = seg["address"]
        layout.append({"total_size": seg["total_size"],
                       "segment_type": seg["segment_type"],
                       "blocks": [[(b["address"] - base) // MiB, b["size"] // MiB,
                                   b["state"], b["requested_size"]]
                                  for b in seg["blocks"]]})
    keys = ["inactive_split_bytes.all.current", "inactive_split.all.current",
            "allocated_bytes.all.current", "reserved_bytes.all.current",
            "active_bytes.all.current", "requested_bytes.all.current",
            "allocation.all.current", "segment.all.current",
            "segment.large_pool.current", "segment.small_pool.current",
            "inactive_split_bytes.large_pool.current", "num_device_alloc"]
    steps.append({"label": label, "layout": layout,
                  "stats": {k: st[k] for k in keys}, "nkeys": len(st)})

a = mm.caching_allocator_alloc(5 * MiB)
b = mm.caching_allocator_alloc(5 * MiB)
c = mm.caching_allocator_alloc(5 * MiB)
record("1")
mm.caching_allocator_delete(b); record("2")
mm.caching_allocator_delete(a); record("3")
e = mm.caching_allocator_alloc(8 * MiB); record("4")
summary = mm.memory_summary()
summary_abbrev = mm.memory_summary(abbreviated=True)
mm.caching_allocator_delete(c); record("5")
mm.caching_allocator_delete(e); record("6")
mm.empty_cache()
final_reserved = mm.memory_reserved()
torch_summary = torch_summary_abbrev = None
try:
    import torch.cuda.memory as tm
    tm.memory_stats = mm.memory_stats  # torch's formatter over our stats
    # Recreate step 4's state to format it.
    a = mm.caching_allocator_alloc(5 * MiB); b = mm.caching_allocator_alloc(5 * MiB)
    c = mm.caching_allocator_alloc(5 * MiB); mm.caching_allocator_delete(b)
    mm.caching_allocator_delete(a); e = mm.caching_allocator_alloc(8 * MiB)
    torch_summary = (tm.memory_summary(0), mm.memory_summary(0),
                     tm.memory_summary(0, abbreviated=True),
                     mm.memory_summary(0, abbreviated=True))
except ImportError:
    pass
print("RESULT " + json.dumps({"steps": steps, "final_reserved": final_reserved,
                              "torch_summary": torch_summary}))
"""

A, I = "active_allocated", "inactive"
EXPECTED_BLOCKS = {
    "1": [[0, 5, A, 5 * MiB], [5, 5, A, 5 * MiB], [10, 5, A, 5 * MiB], [15, 5, I, None]],
    "2": [[0, 5, A, 5 * MiB], [5, 5, I, None], [10, 5, A, 5 * MiB], [15, 5, I, None]],
    "3": [[0, 10, I, None], [10, 5, A, 5 * MiB], [15, 5, I, None]],
    "4": [[0, 8, A, 8 * MiB], [8, 2, I, None], [10, 5, A, 5 * MiB], [15, 5, I, None]],
    "5": [[0, 8, A, 8 * MiB], [8, 12, I, None]],
    "6": [[0, 20, I, None]],
}
# (ISB MiB, IS, allocated MiB, requested MiB, allocations)
EXPECTED_STATS = {
    "1": (5, 1, 15, 15, 3),
    "2": (10, 2, 10, 10, 2),
    "3": (15, 2, 5, 5, 1),
    "4": (7, 2, 13, 13, 2),
    "5": (12, 1, 8, 8, 1),
    "6": (0, 0, 0, 0, 0),
}


@pytest.fixture(scope="module")
def result():
    return run_script(SCRIPT, env=base_env(MEMSNAP_PROFILE="cuda")).result


def test_layout_after_every_step(result):
    for step in result["steps"]:
        assert len(step["layout"]) == 1, step
        seg = step["layout"][0]
        assert seg["total_size"] == 20 * MiB and seg["segment_type"] == "large"
        got = [[o, s, st, req if st != I else None] for o, s, st, req in seg["blocks"]]
        assert got == EXPECTED_BLOCKS[step["label"]], step["label"]


def test_stats_after_every_step(result):
    for step in result["steps"]:
        st = step["stats"]
        isb, is_, alloc, req, n = EXPECTED_STATS[step["label"]]
        assert st["inactive_split_bytes.all.current"] == isb * MiB, step["label"]
        assert st["inactive_split.all.current"] == is_, step["label"]
        assert st["allocated_bytes.all.current"] == alloc * MiB
        assert st["active_bytes.all.current"] == alloc * MiB
        assert st["requested_bytes.all.current"] == req * MiB
        assert st["allocation.all.current"] == n
        assert st["reserved_bytes.all.current"] == 20 * MiB
        assert st["segment.all.current"] == st["segment.large_pool.current"] == 1
        assert st["segment.small_pool.current"] == 0
        assert st["inactive_split_bytes.large_pool.current"] == isb * MiB
        assert st["num_device_alloc"] == 1
        assert step["nkeys"] == 123
    assert result["final_reserved"] == 0


def test_summary_matches_torch_formatter(result):
    if result["torch_summary"] is None:
        pytest.skip("torch is not installed: no reference formatter")
    t_full, m_full, t_ab, m_ab = result["torch_summary"]
    assert m_full == t_full
    assert m_ab == t_ab
