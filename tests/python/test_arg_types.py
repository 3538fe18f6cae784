"""Argument types at the Python boundary, checked as torch checks them.

Every public function of memsnap.memory is swept: each parameter has a
kind (device, stream, size, pointer, pybind11 bool, ...), and every bad
value of its kind must raise the exception torch raises (TypeError,
ValueError, or torch's own RuntimeError) -- never be accepted silently.
A function or parameter without a kind fails the test, so a new function
cannot skip the sweep.  The bool rule is compared with a real pybind11
binding of the installed torch.
"""

from __future__ import annotations

import inspect
import os

import pytest

import memsnap.memory as mm

# Helpers of the module, not API (they are exercised through the API;
# _add_device_type is memsnap.torch's hook where a branch has it).
INTERNAL = {
    "_add_device_type", "_augment", "_current_device",
    "_deprecated_reset_peak", "_device_index", "_device_type",
    "_dump_augmented", "_dump_usage_report", "_load_torch_hooks", "_notify_history",
    "_output_target", "_pybind_bool", "_stream_handle", "_write_flamegraph",
    "__getattr__",  # the module's attribute hook (TorchOutOfMemoryError)
}

# kind -> [(bad value, exception types it may raise)]
BAD = {
    "device": [(v, (ValueError,)) for v in
               (object(), 1.5, True, "gpu:0", "cuda:x", [0], b"cuda")],
    "stream": [(-1, (ValueError,)), (2**63 - 1, (ValueError,)),
               (2**56, (ValueError,)), (2**64, (ValueError,)),
               (True, (TypeError,)), (1.5, (TypeError,)), ("0", (TypeError,))],
    "size": [(True, (TypeError,)), (1.5, (TypeError,)), ("3", (TypeError,)),
             (None, (TypeError,)), (-1, (ValueError,))],
    "ptr": [(v, (TypeError,)) for v in (True, 1.5, "3", None)],
    # pybind11's bool caster: no str, list or plain object
    "pybind_bool": [(v, (TypeError,)) for v in ("yes", [], object(), "")],
    # torch's own checks: exactly a bool, else RuntimeError
    "strict_bool": [(v, (RuntimeError,)) for v in (1, "yes", None)],
    "count": [(v, (TypeError,)) for v in (True, 1.5, "3", None, -1)],
    "fraction": [(v, (TypeError,)) for v in (1, "0.5", True, None)],
    "opt_str": [(v, (TypeError,)) for v in (1, [], object())],
    "str": [(v, (TypeError,)) for v in (1, None, b"x")],
    "path": [(v, (TypeError,)) for v in (1.5, None, object())],
    "skip_actions": [("alloc", (TypeError,)), (5, (TypeError,)),
                     ([1], (TypeError,))],
    "pool": [(v, (TypeError,)) for v in (object(), None, 3)],
    "allocator": [(object(), (ValueError,))],
    "mempool_id": [(("a", 1), (RuntimeError,))],
    "observer": [(v, (TypeError,)) for v in (5, "f")],
    # a _snapshot() dict (torch indexes it: anything else is a TypeError)
    "snapshot": [(v, (TypeError,)) for v in (5, "x", [])],
    # Python truthiness in torch as well (`if not abbreviated`,
    # `if augment_with_fx_traces`): any value is accepted, as torch.
    "truthy": [],
}

# parameter name -> kind (per function where one name means two things)
KIND = {
    "device": "device", "stream": "stream", "size": "size",
    "mem_ptr": "ptr", "ptr": "ptr", "data_ptr": "ptr",
    "clear_history": "pybind_bool", "compile_context": "pybind_bool",
    "global_record_annotations": "pybind_bool",
    "record_pinned_host_memory": "pybind_bool", "record_cuda": "pybind_bool",
    "record_context": "pybind_bool", "trace_alloc_record_context": "pybind_bool",
    "record_context_cpp": "pybind_bool", "use_on_oom": "pybind_bool",
    "no_split": "pybind_bool",
    "value": "strict_bool", "include_traces": "strict_bool",
    "max_entries": "count", "trace_alloc_max_entries": "count",
    "fraction": "fraction", "context": "opt_str", "stacks": "opt_str",
    "metadata": "str", "message": "str", "env": "str", "filename": "path", "path": "path",
    "skip_actions": "skip_actions", "pool": "pool", "allocator": "allocator",
    "mempool_id": "mempool_id", "observer": "observer", "snapshot": "snapshot",
    "abbreviated": "truthy", "augment_with_fx_traces": "truthy",
}
KIND_OF = {("_record_memory_history", "enabled"): "opt_str",
           ("_record_memory_history_impl", "enabled"): "opt_str",
           ("_record_memory_history_legacy", "enabled"): "pybind_bool"}


def api():
    """(name, callable, parameter names) of every public function, and
    MemPool's constructor."""
    out = []
    for name, fn in inspect.getmembers(mm, inspect.isfunction):
        if fn.__module__ != mm.__name__ or name in INTERNAL:
            continue
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        out.append((name, fn, [p.name for p in params]))
    params = list(inspect.signature(mm.MemPool.__init__).parameters)[1:]
    out.append(("MemPool", mm.MemPool, params))
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Good values for every required argument."""
    p = mm.caching_allocator_alloc(4096)
    hp = mm._host_alloc(64)
    d = tmp_path_factory.mktemp("args")
    yield {
        "size": 16, "mem_ptr": p, "ptr": p, "data_ptr": p, "stream": 0,
        "fraction": 1.0, "env": "garbage_collection_threshold:0.5",
        "metadata": "m", "message": "EL0004: Failed to allocate memory.",
        "observer": lambda *a: None,
        "filename": str(d / "f.pickle"), "path": str(d / "f.csv"),
        "pool": mm.MemPool(), "host_ptr": hp,
    }
    mm._record_memory_history(None)
    mm.caching_allocator_delete(p)
    mm._host_free(hp)


def good_args(name, params, live):
    """Positional values for the parameters without defaults."""
    fn = mm.MemPool.__init__ if name == "MemPool" else getattr(mm, name)
    sig = inspect.signature(fn).parameters
    args = {}
    for p in params:
        if sig[p].default is inspect.Parameter.empty:
            if name.startswith("_host_") and p == "ptr":
                args[p] = live["host_ptr"]
            elif name == "_record_memory_history_legacy" and p == "enabled":
                args[p] = True
            else:
                args[p] = live[p]
    return args


def test_every_parameter_has_a_kind():
    missing = [(name, p) for name, _, params in api() for p in params
               if KIND_OF.get((name, p), KIND.get(p)) is None]
    assert missing == []
    names = {name for name, _, _ in api()}
    exported = {n for n in mm.__all__ if n != "OutOfMemoryError"}
    assert exported <= names  # the whole module, not a subset
    assert {"_record_memory_history", "_dump_snapshot", "_host_alloc",
            "_annotate_memory", "_set_allocator_settings"} <= names


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_sweep_bad_values_raise(live):
    """Every bad value of every parameter of every public function raises
    the expected type; none is accepted silently."""
    silent, wrong = [], []
    checked = 0
    for name, fn, params in api():
        for p in params:
            kind = KIND_OF.get((name, p), KIND.get(p))
            for bad, types in BAD[kind]:
                kwargs = good_args(name, params, live)
                kwargs[p] = bad
                call = f"{name}({p}={bad!r})"
                try:
                    r = fn(**kwargs)
                    if inspect.isgenerator(r) or hasattr(r, "__enter__"):
                        with r:  # a context manager checks on entry
                            pass
                    silent.append(call)
                except types:
                    checked += 1
                except Exception as e:  # noqa: BLE001 - report every one
                    wrong.append(f"{call}: {type(e).__name__}: {e}")
    mm._record_memory_history(None)
    assert silent == [], "accepted silently"
    assert wrong == [], "wrong exception type"
    assert checked > 250


def test_issue_cases():
    """The five arguments the reliability pass found accepted silently."""
    with pytest.raises(TypeError, match="clear_history must be a bool, not str"):
        mm._record_memory_history(clear_history="yes")
    with pytest.raises(ValueError, match="Expected a torch.device with a "
                       "specified index or an integer"):
        mm._record_memory_history(device=object())
    with pytest.raises(TypeError, match="size must be an int .bytes., not bool"):
        mm.caching_allocator_alloc(True)
    for s in (-1, 2**63 - 1):
        with pytest.raises(ValueError, match=r"Invalid stream handle .*\[0, 2\*\*56\)"):
            mm.caching_allocator_alloc(16, stream=s)
    mm._record_memory_history(None)
    assert mm.memory_allocated() == 0 or all(
        seg["stream"] >= 0 for seg in mm.memory_snapshot())


def test_good_values_still_work():
    """The forms torch takes keep working: devices as ints, strings and
    device objects, streams as ints and stream objects, the bools
    pybind11 converts (None, numbers)."""
    class Dev:  # torch.device's shape
        type, index = "cuda", 0

    class CudaDevice:  # torch.cuda.device's shape
        idx = 0

    class Stream:
        cuda_stream = 7

    for d in (0, "cuda:0", "npu:0", "cuda", "0", Dev(), CudaDevice(), None):
        assert isinstance(mm.memory_allocated(d), int)
    for s in (0, 1, 2**56 - 1, Stream()):
        p = mm.caching_allocator_alloc(512, 0, s)
        mm.caching_allocator_delete(p)
    segs = [g["stream"] for g in mm.memory_snapshot()]
    assert 2**56 - 1 in segs and 7 in segs
    mm.empty_cache()
    for flag in (True, False, None, 0, 1, 2.5):
        mm._record_memory_history("all", clear_history=flag)
        mm._record_memory_history_legacy(flag)
    mm._record_memory_history(None)
    pool = mm.MemPool(use_on_oom=0, no_split=None)
    assert len(pool.id) == 2


def test_pybind_bool_rule_is_torchs():
    """memsnap's bool rule accepts and refuses exactly what a real pybind11
    bool parameter of the installed torch accepts and refuses."""
    torch = pytest.importorskip("torch")
    setter = torch._C._jit_set_texpr_fuser_enabled
    getter = torch._C._jit_texpr_fuser_enabled
    old = getter()

    class Truthy:
        def __bool__(self):
            return False

    class Sized:
        def __len__(self):
            return 0

    try:
        for v in (True, False, None, 0, 1, 2.5, 0.0, -3, Truthy(), "yes", "",
                  [], [1], (), {}, object(), Sized(), b"x"):
            try:
                setter(v)
                theirs = getter()
            except TypeError:
                theirs = TypeError
            try:
                ours = mm._pybind_bool(v, "flag", "f")
            except TypeError:
                ours = TypeError
            assert ours == theirs, (v, ours, theirs)
    finally:
        setter(old)


def test_skip_actions_str_refused():
    with pytest.raises(TypeError, match="skip_actions must be a list of str"):
        mm._record_memory_history(skip_actions="alloc")
    mm._record_memory_history(None)


def test_use_mem_pool_type():
    with pytest.raises(TypeError, match="expects a MemPool"):
        with mm.use_mem_pool(object()):
            pass


def test_paths_accept_pathlike(tmp_path):
    mm._dump_snapshot(tmp_path / "p.pickle")
    mm._write_usage_report(tmp_path / "u.csv")
    assert os.path.getsize(tmp_path / "p.pickle") > 0
