"""The rest of the memsnap.memory surface, in a fresh process each."""

from __future__ import annotations

import pytest

from conftest import base_env, run_script

API = r"""
import json, warnings
import memsnap, memsnap.memory as mm
from memsnap import _memsnap
MiB = 1 << 20
out = {}
out["profile"] = _memsnap.profile()
out["runtime"] = _memsnap.runtime_name()
out["info0"] = list(mm.mem_get_info())
p = mm.caching_allocator_alloc(3 * MiB, device=0, stream=0)
q = mm.caching_allocator_alloc(1000, "npu:0")
st = mm.memory_stats()
out["keys"] = list(st)
out["nested_keys"] = sorted(mm.memory_stats_as_nested_dict())
out["allocated"] = [mm.memory_allocated(), mm.max_memory_allocated(),
                    mm.memory_reserved(), mm.max_memory_reserved(),
                    mm.memory_cached(), mm.max_memory_cached()]
out["info1"] = list(mm.mem_get_info(0))
out["processes"] = mm.list_gpu_processes()
mm.record_stream(p, 0)
mm.caching_allocator_delete(p)
out["after_free"] = [mm.memory_allocated(), mm.max_memory_allocated()]
mm.reset_peak_memory_stats()
out["peak_reset"] = mm.max_memory_allocated()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    mm.reset_max_memory_allocated()
    mm.reset_max_memory_cached()
out["warnings"] = [x.category.__name__ for x in w]
mm.reset_accumulated_memory_stats()
st = mm.memory_stats()
out["accumulated"] = [st["allocated_bytes.all.allocated"], st["num_device_alloc"],
                      st["allocated_bytes.all.current"]]
mm.caching_allocator_delete(q)
mm.empty_cache()
out["reserved_after_empty"] = mm.memory_reserved()
mm.set_per_process_memory_fraction(0.25)
out["fraction"] = mm.get_per_process_memory_fraction()
try:
    mm.caching_allocator_alloc(40 * MiB)
except mm.OutOfMemoryError:
    out["fraction_oom"] = True
mm.set_per_process_memory_fraction(1.0)
with mm.caching_allocator_disabled():
    out["disabled_flag"] = _memsnap.caching_enabled()
    r = mm.caching_allocator_alloc(1000)
    out["disabled_stats"] = mm.memory_stats()["allocation.all.current"]
    mm.caching_allocator_delete(r)
out["enabled_again"] = _memsnap.caching_enabled()
out["backend"] = mm.get_allocator_backend()
out["metadata"] = [mm._memory_metadata_supported(), mm._get_memory_metadata()]
mm._set_allocator_settings("max_split_size_mb:40")
out["settings"] = _memsnap.allocator_settings()
out["summary_head"] = mm.memory_summary().splitlines()[1]
print("RESULT " + json.dumps(out))
"""


def test_api_surface():
    r = run_script(API, env=base_env(MEMSNAP_SIM_MEMORY="128M",
                                     MEMSNAP_PROFILE="npu")).result
    assert r["profile"] == "npu" and r["runtime"] == "sim"
    assert r["info0"] == [128 << 20, 128 << 20]
    assert len(r["keys"]) == 123 and r["keys"] == sorted(r["keys"])
    assert "num_oom_rejections" in r["keys"]
    assert "allocated_bytes.all.current" in r["keys"]
    assert r["nested_keys"] == sorted([
        "active", "active_bytes", "allocated_bytes", "allocation",
        "inactive_split", "inactive_split_bytes", "max_split_size",
        "num_alloc_retries", "num_device_alloc", "num_device_free",
        "num_ooms", "num_oom_rejections", "num_sync_all_streams",
        "oversize_allocations", "oversize_segments", "requested_bytes",
        "reserved_bytes", "segment"])
    alloc, max_alloc, reserved, max_reserved, cached, max_cached = r["allocated"]
    assert alloc >= 3 * (1 << 20) + 1000 and max_alloc == alloc
    assert reserved >= alloc and cached == reserved and max_cached == max_reserved
    assert r["info1"][0] == (128 << 20) - reserved
    assert r["processes"].startswith("GPU:0\nprocess ") and "MB GPU memory" in r["processes"]
    assert r["after_free"][0] < alloc and r["after_free"][1] == alloc
    assert r["peak_reset"] == r["after_free"][0]
    assert r["warnings"] == ["FutureWarning", "FutureWarning"]
    assert r["accumulated"][:2] == [0, 0] and r["accumulated"][2] > 0
    assert r["reserved_after_empty"] == 0
    assert r["fraction"] == 0.25 and r["fraction_oom"] is True
    assert r["disabled_flag"] is False and r["disabled_stats"] == 0
    assert r["enabled_again"] is True
    assert r["backend"] == "native"
    assert r["metadata"] == [True, ""]
    assert "max_split_size_mb:40" in r["settings"]
    assert "memory summary, device ID 0" in r["summary_head"]


def test_default_profile_is_the_runtimes_own():
    """No MEMSNAP_PROFILE: the sim runs PyTorch's allocator (cuda), so a
    1 MiB request is a 1 MiB block and the summary speaks CUDA."""
    code = r"""
import json
import memsnap.memory as mm
from memsnap import _memsnap
p = mm.caching_allocator_alloc(1 << 20)
size = [b["size"] for s in mm.memory_snapshot() for b in s["blocks"]
        if b["state"] == "active_allocated"]
print("RESULT " + json.dumps([_memsnap.profile(), size,
                              mm.memory_summary().splitlines()[1]]))
"""
    prof, size, head = run_script(code).result
    assert prof == "cuda" and size == [1 << 20]
    assert "PyTorch CUDA memory summary" in head


POOL = r"""
import json
import memsnap.memory as mm
out = {}
pool = mm.MemPool()
out["id"] = list(pool.id)
out["count"] = pool.use_count()
with mm.use_mem_pool(pool):
    p = mm.caching_allocator_alloc(1000)
q = mm.caching_allocator_alloc(1000)
segs = pool.snapshot()
out["pool_segments"] = [[list(s["segment_pool_id"]), [b["address"] for b in s["blocks"]
                         if b["state"] == "active_allocated"]] for s in segs]
out["p"], out["q"] = p, q
out["all_pools"] = sorted(tuple(s["segment_pool_id"]) for s in mm.memory_snapshot())
out["no_traces"] = len(pool.snapshot(include_traces=False))
mm.caching_allocator_delete(p); mm.caching_allocator_delete(q)
other = mm.MemPool(use_on_oom=True, no_split=True)
out["other_id"] = list(other.id)
print("RESULT " + json.dumps(out))
"""


def test_mempool():
    r = run_script(POOL).result
    assert r["id"][0] == 0 and r["id"][1] > 0 and r["count"] >= 1
    assert r["pool_segments"] == [[r["id"], [r["p"]]]]
    assert r["all_pools"] == sorted([[0, 0], r["id"]])
    assert r["no_traces"] == 1
    assert r["other_id"] != r["id"]


def test_configure_before_first_use():
    code = r"""
import json, memsnap
from memsnap import _memsnap
memsnap.configure(runtime="sim", profile="cuda")
import memsnap.memory as mm
mm.caching_allocator_alloc(10)
try:
    memsnap.configure(profile="npu")
except RuntimeError as e:
    late = str(e)
print("RESULT " + json.dumps([_memsnap.profile(), _memsnap.runtime_name(), late]))
"""
    profile, runtime, late = run_script(code).result
    assert (profile, runtime) == ("cuda", "sim")
    assert "before the allocator is first used" in late


def test_configure_takes_the_environment_variables_names():
    """configure() takes the names MEMSNAP_RUNTIME / MEMSNAP_PROFILE take
    (npu and ascend for acl, any case) and stores the runtime's own name;
    with the allocator created, an alias of what it runs is no change."""
    code = r"""
import json, os, memsnap
from memsnap import _memsnap
out = {}
for rt in ("npu", "Ascend", "ACL"):
    memsnap.configure(runtime=rt, profile="NPU")
    out[rt] = [os.environ["MEMSNAP_RUNTIME"], os.environ["MEMSNAP_PROFILE"]]
memsnap.configure(runtime="SIM", profile="Cuda")
import memsnap.memory as mm
mm.caching_allocator_alloc(10)
memsnap.configure(runtime="sim", profile="CUDA")
try:
    memsnap.configure(runtime="npu")
except RuntimeError as e:
    out["late"] = str(e)
try:
    memsnap.configure(runtime="gpu")
except ValueError as e:
    out["bad"] = str(e)
out["now"] = [_memsnap.runtime_name(), _memsnap.profile()]
print("RESULT " + json.dumps(out))
"""
    r = run_script(code).result
    assert r["npu"] == r["Ascend"] == r["ACL"] == ["acl", "npu"], r
    assert r["now"] == ["sim", "cuda"], r
    assert "already exists with runtime 'sim', profile 'cuda'" in r["late"], r
    assert r["bad"] == ("unknown memsnap runtime 'gpu'; expected one of "
                        "('sim', 'acl', 'npu', 'ascend', 'cuda')"), r


def test_snapshot_honours_device():
    code = r"""
import json
import memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
p0 = mm.caching_allocator_alloc(1000, device=0)
p1 = mm.caching_allocator_alloc(5 << 20, device="npu:1")
full = mm._snapshot()
only1 = mm._snapshot(device=1)
print("RESULT " + json.dumps({
    "full": sorted({s["device"] for s in full["segments"]}),
    "only1": sorted({s["device"] for s in only1["segments"]}),
    "traces": len(full["device_traces"]),
    "dev1_allocs": [e["addr"] for e in full["device_traces"][1] if e["action"] == "alloc"],
    "p1": p1,
    "stats1": mm.memory_allocated(1) > 0 and mm.memory_allocated(0) < mm.memory_allocated(1)}))
"""
    r = run_script(code, env=base_env(MEMSNAP_SIM_DEVICES="2")).result
    assert r["full"] == [0, 1] and r["only1"] == [1]
    assert r["traces"] == 2 and r["dev1_allocs"] == [r["p1"]]
    assert r["stats1"] is True


# torch.cuda.use_mem_pool (torch 2.13, torch/cuda/memory.py) calls
# _cuda_beginAllocateCurrentThreadToPool on entry and, on exit,
# _cuda_endAllocateToPool then _cuda_releasePool: the context holds one
# reference to the pool while it is active and drops it on exit, so
# MemPool.use_count() is 1, then 2 inside, then 1 again (also after an
# exception), and the pool's cached segments go once the object dies
# (allocator-algorithm §18: releasePool at 0 marks the pool freeable;
# MemPool's destructor empties it).
POOL_REFS = r"""
import gc, json
import memsnap.memory as mm
out = {}
pool = mm.MemPool()
out["created"] = pool.use_count()
with mm.use_mem_pool(pool):
    out["inside"] = pool.use_count()
    p = mm.caching_allocator_alloc(3 << 20)
    with mm.use_mem_pool(mm.MemPool()) as _:
        pass
out["after"] = pool.use_count()
try:
    with mm.use_mem_pool(pool):
        raise KeyError("boom")
except KeyError:
    pass
out["after_exception"] = pool.use_count()
try:
    with mm.use_mem_pool(pool):
        with mm.use_mem_pool(pool):
            pass
except RuntimeError as e:
    out["nested_same"] = str(e)
out["after_nested"] = pool.use_count()
mm.caching_allocator_delete(p)
out["reserved_live_pool"] = mm.memory_reserved()
pool_id = pool.id
del pool
gc.collect()
out["reserved_after_del"] = mm.memory_reserved()
out["pools_left"] = [s["segment_pool_id"] for s in mm.memory_snapshot()]
print("RESULT " + json.dumps(out))
"""


def test_use_mem_pool_reference_count():
    r = run_script(POOL_REFS).result
    assert r["created"] == 1
    assert r["inside"] == 2
    assert r["after"] == 1
    assert r["after_exception"] == 1
    assert "already recording to mempool_id" in r["nested_same"]
    assert r["after_nested"] == 1
    assert r["reserved_live_pool"] == 20 << 20
    assert r["reserved_after_del"] == 0
    assert r["pools_left"] == []


# torch 2.13's memory_stats_as_nested_dict (CUDA) carries
# reserved_bytes_by_private_pools keyed by MemPool.id tuples, each shaped
# like reserved_bytes; memory_stats joins the tuple with "_"
# (cuda-reference §5.10, torch/cuda/memory.py: memory_stats).  The
# CachingDeviceAllocator.h comment: "current drops to 0 when a pool is
# deleted, while peak/allocated/freed are preserved until reset".
PRIVATE_POOL_STATS = r"""
import gc, json
import memsnap
memsnap.configure(profile="cuda")
import memsnap.memory as mm
out = {}
out["before"] = mm.memory_stats_as_nested_dict().get(
    "reserved_bytes_by_private_pools", "absent")
flat0 = mm.memory_stats()
out["nkeys_before"] = len(flat0)
pool = mm.MemPool()
with mm.use_mem_pool(pool):
    p = mm.caching_allocator_alloc(5 << 20)
    q = mm.caching_allocator_alloc(1000)
r = mm.caching_allocator_alloc(5 << 20)
nested = mm.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]
out["nested_keys"] = [list(k) for k in nested]
out["key_types"] = [type(k).__name__ for k in nested]
k = "reserved_bytes_by_private_pools.%d_%d" % pool.id
flat = mm.memory_stats()
out["flat"] = {key[len(k) + 1:]: v for key, v in flat.items()
               if key.startswith(k + ".")}
out["nkeys"] = len(flat)
out["id"] = list(pool.id)
mm.caching_allocator_delete(p); mm.caching_allocator_delete(q)
del pool
gc.collect()
flat = mm.memory_stats()
out["after_del"] = {key[len(k) + 1:]: v for key, v in flat.items()
                    if key.startswith(k + ".")}
mm.reset_peak_memory_stats()
mm.reset_accumulated_memory_stats()
out["after_resets"] = mm.memory_stats_as_nested_dict()[
    "reserved_bytes_by_private_pools"]
mm.caching_allocator_delete(r)
print("RESULT " + json.dumps(out))
"""


def test_reserved_bytes_by_private_pools():
    r = run_script(PRIVATE_POOL_STATS).result
    mib = 1 << 20
    assert r["before"] == {}
    assert r["nkeys_before"] == 123
    assert r["nested_keys"] == [r["id"]] and r["key_types"] == ["tuple"]
    f = r["flat"]
    assert len(f) == 12 and r["nkeys"] == 123 + 12
    assert f["all.current"] == 22 * mib and f["all.peak"] == 22 * mib
    assert f["large_pool.current"] == 20 * mib
    assert f["small_pool.current"] == 2 * mib
    assert f["all.allocated"] == 22 * mib and f["all.freed"] == 0
    a = r["after_del"]
    assert a["all.current"] == 0 and a["all.peak"] == 22 * mib
    assert a["all.allocated"] == 22 * mib and a["all.freed"] == 22 * mib
    assert r["after_resets"] == {}


def test_no_private_pool_stats_in_npu_profile():
    code = PRIVATE_POOL_STATS.replace(
        'profile="cuda"', 'profile="npu"').split("pool = mm.MemPool()")[0]
    code += "print('RESULT ' + json.dumps(out))\n"
    r = run_script(code).result
    assert r["before"] == "absent" and r["nkeys_before"] == 123


CREATED_BY = r"""
import json, threading
import memsnap.memory as mm
from memsnap import _memsnap
out = {"before": _memsnap.created_by()}
mm.empty_cache()
out["after_empty_cache"] = _memsnap.created_by()
def inner(n):
    return mm.caching_allocator_alloc(n)
def outer():
    return inner(1 << 20)
if THREAD:
    t = threading.Thread(target=mm.memory_stats)
    t.start(); t.join()
else:
    p = outer()
out["by"] = list(_memsnap.created_by())
out["named"] = mm._allocator_created_by()
p = outer()
mm.caching_allocator_delete(p)
out["later"] = mm._allocator_created_by()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("thread", [False, True])
def test_created_by_names_the_first_call(thread):
    """The extension notes the memsnap.memory call that created the
    allocator (the outermost frame in the package and the line that called
    it), on every supported Python: on 3.9 and 3.10 this frame walk once
    crashed the first allocation (PyFrame_GetBack was implicitly declared).
    From a thread, the caller is threading's run()."""
    r = run_script(CREATED_BY.replace("THREAD", str(thread))).result
    assert r["before"] is None and r["after_empty_cache"] is None, r
    if thread:
        mod, func, site = r["by"]
        assert (mod, func) == ("memory.py", "memory_stats"), r
        assert site.rsplit(":", 1)[0].endswith("threading.py"), r
        assert r["named"] == f"memsnap.memory.memory_stats at {site}", r
    else:
        assert r["by"] == ["memory.py", "caching_allocator_alloc", "<string>:9"], r
        assert r["named"] == "memsnap.memory.caching_allocator_alloc at <string>:9", r
    assert r["later"] == r["named"], r


def test_npu_segment_size_mb_is_deprecated_as_in_torch_npu():
    """torch_npu warns once that segment_size_mb is deprecated for
    large_segment_size_mb (NPUAllocatorConfig::parseSegmentSizeMb); the
    setting still applies.  The npu profile takes a pinned reserve of 0
    (no reserve segment), as torch_npu's parser does."""
    code = r"""
import json
import memsnap.memory as mm
for _ in range(2):
    mm.caching_allocator_delete(mm.caching_allocator_alloc(30 << 20))
print("RESULT " + json.dumps(mm.memory_reserved()))
"""
    p = run_script(code, env=base_env(
        MEMSNAP_PROFILE="npu",
        PYTORCH_NPU_ALLOC_CONF="segment_size_mb:40,pinned_reserve_segment_size_mb:0"))
    assert p.stderr.count("segment_size_mb is deprecated") == 1, p.stderr
    assert p.result > 0
