"""memsnap.memory mirrors torch.cuda.memory: same names, signatures, defaults.

For every public callable of memsnap.memory that torch.cuda.memory (the
installed torch) also has, inspect.signature must agree on parameter
names, kinds and defaults, in order.  The one tolerated difference is
trailing keyword parameters that newer PyTorch (2.14, the version
cuda-reference.md describes) added and the installed torch lacks; they are
listed by name so a torch upgrade turns them into ordinary checks.
"""

from __future__ import annotations

import inspect
import os

import pytest

import memsnap.memory as mm

torch_memory = pytest.importorskip("torch.cuda.memory")

# Parameters of PyTorch 2.14 that 2.13 lacks (cuda-reference §5.1).
NEWER_TORCH_PARAMS = {
    "_record_memory_history": ["record_pinned_host_memory", "record_cuda"],
    "_record_memory_history_impl": ["record_pinned_host_memory", "record_cuda"],
    "_record_memory_history_legacy": ["record_pinned_host_memory", "record_cuda"],
}

# Names the brief requires memsnap.memory to have.
REQUIRED = """caching_allocator_alloc caching_allocator_delete memory_stats
memory_stats_as_nested_dict reset_peak_memory_stats
reset_accumulated_memory_stats reset_max_memory_allocated
reset_max_memory_cached memory_allocated max_memory_allocated
memory_reserved max_memory_reserved memory_cached max_memory_cached
memory_summary empty_cache set_per_process_memory_fraction
get_per_process_memory_fraction mem_get_info memory_snapshot
_set_allocator_settings caching_allocator_enable caching_allocator_disabled
list_gpu_processes _record_memory_history _record_memory_history_impl
_record_memory_history_legacy _snapshot _dump_snapshot
_allocation_traceback _set_memory_metadata _get_memory_metadata
_memory_metadata_supported _annotate_memory _attach_out_of_memory_observer
record_stream MemPool use_mem_pool get_allocator_backend
OutOfMemoryError""".split()


def describe(p: inspect.Parameter) -> tuple:
    default = p.default
    return (p.name, p.kind.name, "<none>" if default is inspect.Parameter.empty else repr(default))


def ours_and_theirs():
    for name in sorted(dir(mm)):
        if name.startswith("__"):
            continue
        ours = getattr(mm, name)
        theirs = getattr(torch_memory, name, None)
        if not callable(ours) or theirs is None or not callable(theirs):
            continue
        if not getattr(ours, "__module__", "").startswith("memsnap"):
            continue  # names both modules import (typing.Any, inspect.signature)
        if isinstance(ours, type) and issubclass(ours, BaseException):
            continue
        yield name, ours, theirs


def test_required_names_exist():
    missing = [n for n in REQUIRED if not hasattr(mm, n)]
    assert missing == []


def test_signature_parity():
    differences = []
    compared = []
    for name, ours, theirs in ours_and_theirs():
        try:
            sig_t = inspect.signature(theirs)
        except (TypeError, ValueError):
            continue
        sig_o = inspect.signature(ours)
        po = [describe(p) for p in sig_o.parameters.values()]
        pt = [describe(p) for p in sig_t.parameters.values()]
        extra = NEWER_TORCH_PARAMS.get(name, [])
        if len(po) > len(pt):
            tail = [p[0] for p in po[len(pt):]]
            if tail == extra[: len(tail)] and all(p[2] != "<none>" for p in po[len(pt):]):
                po = po[: len(pt)]
        compared.append(name)
        if po != pt:
            differences.append(f"{name}: memsnap {po} != torch {pt}")
    assert "caching_allocator_alloc" in compared and "_snapshot" in compared
    assert len(compared) >= 35, compared
    assert differences == [], "\n".join(differences)


def test_record_memory_history_signature_is_impl():
    assert inspect.signature(mm._record_memory_history) == inspect.signature(
        mm._record_memory_history_impl
    )


def test_every_public_function_documents_itself():
    undocumented = []
    for name in REQUIRED:
        obj = getattr(mm, name)
        doc = inspect.getdoc(obj) or ""
        if name == "OutOfMemoryError":
            continue
        if "Mirrors" not in doc and "mirrors" not in doc:
            undocumented.append(name)
    assert undocumented == []


# torch.cuda.memory's names memsnap.memory leaves out, each named in
# docs/python.md ("Not provided") with the reason.
NOT_PROVIDED = ["CUDAPluggableAllocator", "_CUDAAllocator",
                "change_current_allocator", "_get_current_allocator",
                "_use_uvm", "_host_allocator"]


def test_every_torch_function_is_provided_or_documented_as_not():
    """Each callable torch.cuda.memory defines is in memsnap.memory, or in
    NOT_PROVIDED, which docs/python.md names."""
    missing = sorted(
        n for n in dir(torch_memory)
        if not n.startswith("__") and callable(getattr(torch_memory, n))
        and getattr(getattr(torch_memory, n), "__module__", "") == torch_memory.__name__
        and not hasattr(mm, n))
    assert [n for n in missing if n not in NOT_PROVIDED] == []
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                            "python.md"), encoding="utf-8").read()
    said = doc[doc.index("Not provided"):][:1500]
    assert [n for n in NOT_PROVIDED if "`%s`" % n not in said] == []
