"""Bad arguments raise what torch raises (cuda-reference §4-§5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import memsnap
import memsnap.memory as mm
from conftest import base_env, run_script


def test_fraction_type_and_range():
    with pytest.raises(TypeError, match=r"^Invalid type for fraction argument, must be `float`$"):
        mm.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match=r"^Invalid fraction value: 1.5. Allowed range: 0~1$"):
        mm.set_per_process_memory_fraction(1.5)


def test_stream_type():
    """torch's words ("Invalid type for stream argument, must be
    `torch.cuda.Stream` or `int` representing a pointer to an existing
    stream"), naming the stream forms memsnap takes (no device type
    registered in this process: all of them) and the type given."""
    with pytest.raises(TypeError) as e:
        mm.caching_allocator_alloc(10, stream="s")
    assert str(e.value) == (
        "Invalid type for stream argument, must be a stream with an "
        "`npu_stream` / `cuda_stream` handle (`torch_npu.npu.Stream`, "
        "`torch.cuda.Stream`), a `torch.Stream` of "
        "memsnap.torch.register_device's device, or `int` representing a "
        "pointer to an existing stream, not str")
    with pytest.raises(TypeError, match="^Invalid type for stream argument"):
        mm.record_stream(0, 1.5)


def test_memory_snapshot_argument_checks():
    with pytest.raises(RuntimeError, match="^include_traces must be a boolean$"):
        mm.memory_snapshot(include_traces=1)
    with pytest.raises(RuntimeError, match="^mempool_id elements must be integers$"):
        mm.memory_snapshot(("a", 1))


def test_device_strings():
    assert mm._device_index("npu:3") == 3
    assert mm._device_index("cuda:1") == 1
    assert mm._device_index(2) == 2
    assert mm._device_index(None) == 0
    with pytest.raises(ValueError):
        mm._device_index("npu:x")


def test_configure_rejects_unknown_names():
    with pytest.raises(ValueError, match="'tpu'"):
        memsnap.configure(runtime="tpu")
    with pytest.raises(ValueError, match="'gpu'"):
        memsnap.configure(profile="gpu")


ERRORS = r"""
import json
import memsnap, memsnap.memory as mm
out = {}
def catch(f, *a):
    try:
        f(*a)
    except Exception as e:
        return [type(e).__name__, str(e)]
p = mm.caching_allocator_alloc(1000)
out["double_free"] = (mm.caching_allocator_delete(p), catch(mm.caching_allocator_delete, p))[1]
out["bogus_free"] = catch(mm.caching_allocator_delete, 0x1234)
out["negative"] = catch(mm.caching_allocator_alloc, -1)
out["huge"] = catch(mm.caching_allocator_alloc, 2**63)
out["bool"] = catch(mm.caching_allocator_alloc, True)
out["float"] = catch(mm.caching_allocator_alloc, 4096.0)
out["enable"] = catch(mm.caching_allocator_enable, 1)
out["annotate"] = catch(mm._annotate_memory, 0x1234, "x")
out["traceback_unknown"] = mm._allocation_traceback(0x1234)
out["zero"] = mm.caching_allocator_alloc(0)
out["settings"] = catch(mm._set_allocator_settings, "max_split_size_mb:abc")
out["settings_range"] = catch(mm._set_allocator_settings,
                              "max_split_size_mb:99999999999999999999")
out["settings_nul"] = catch(mm._set_allocator_settings,
                            "expandable_segments:True\x00,bogus:1")
out["settings_after"] = mm._C.allocator_settings()
out["configure_late"] = catch(memsnap.configure, "acl", "cuda")
print("RESULT " + json.dumps(out))
"""


def test_numpy_integer_sizes():
    """numpy integers are sizes, as torch's THPUtils_checkLong takes them;
    a numpy bool, a 0-d array and a tensor (a bool one included) are
    not."""
    pytest.importorskip("numpy")
    pytest.importorskip("torch")
    r = run_script(r"""
import json
import numpy as np
import memsnap.memory as mm
q = mm.caching_allocator_alloc(np.int64(4096))
out = {"size": [q > 0, mm.memory_allocated() >= 4096]}
mm.caching_allocator_delete(q)
out["refused"] = []
import torch
for v in (np.bool_(True), np.array(1024), torch.tensor(True),
          torch.tensor(4096)):  # as THPUtils_checkLong: none is a size
    try:
        mm.caching_allocator_alloc(v)
    except TypeError as e:
        out["refused"].append(str(e))
print("RESULT " + json.dumps(out))
""").result
    assert r["size"] == [True, True]
    assert len(r["refused"]) == 4, r
    assert all("caching_allocator_alloc: size must be an int" in m
               for m in r["refused"]), r


def test_pointer_and_config_errors():
    r = run_script(ERRORS).result
    assert r["double_free"][0] == "ValueError" and "0x" in r["double_free"][1]
    assert r["bogus_free"][0] == "ValueError" and "0x1234" in r["bogus_free"][1]
    assert r["negative"][0] == "ValueError" and "Invalid memory size" in r["negative"][1]
    # torch reads the size as a C ssize_t: OverflowError, here naming it.
    assert r["huge"][0] == "OverflowError"
    assert "size 9223372036854775808" in r["huge"][1]
    # bools and floats are not sizes
    assert r["bool"] == ["TypeError", "caching_allocator_alloc: size must be "
                         "an int (bytes), not bool"]
    assert r["float"][0] == "TypeError" and "float" in r["float"][1]
    assert r["enable"] == ["RuntimeError",
                           "cudaCachingAllocator_enable expects a bool, but got int"]
    assert r["annotate"] == ["RuntimeError",
                             "annotateMemory: no live allocation found at pointer 0x1234"]
    assert r["traceback_unknown"] is None
    assert r["zero"] == 0
    assert r["settings"][0] == "ValueError" and "max_split_size_mb" in r["settings"][1]
    # torch: std::stoull throws out_of_range; here an error naming the token.
    assert r["settings_range"][0] == "ValueError"
    assert "'99999999999999999999'" in r["settings_range"][1]
    assert "out of range" in r["settings_range"][1]
    # An embedded NUL is refused (naming its position), not truncated.
    assert r["settings_nul"][0] == "ValueError"
    assert "position 24" in r["settings_nul"][1]
    assert "expandable_segments" not in r["settings_after"]
    assert r["configure_late"][0] == "RuntimeError"


def test_bad_environment_config_names_token():
    code = r"""
import json, memsnap.memory as mm
try:
    mm.caching_allocator_alloc(10)
except ValueError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    r = run_script(code, env=base_env(PYTORCH_NPU_ALLOC_CONF="bogus_key:1",
                                      MEMSNAP_PROFILE="npu")).result
    assert r is not None and "bogus_key" in r
    r = run_script(code, env=base_env(PYTORCH_CUDA_ALLOC_CONF="bogus_key:1")).result
    assert r is not None and "bogus_key" in r  # the sim's own profile: cuda


def test_dump_snapshot_oserror_keeps_errno(tmp_path):
    """Regression: file errors used to be a bare OSError("input/output
    error"); now the errno's subclass with .errno and .filename."""
    import errno
    import os
    import stat

    mm._record_memory_history("all")
    # a directory target: IsADirectoryError, the directory untouched
    with pytest.raises(IsADirectoryError) as ei:
        mm._dump_snapshot(str(tmp_path))
    assert ei.value.errno == errno.EISDIR
    assert ei.value.filename == str(tmp_path)
    assert "is a directory" in str(ei.value)
    assert os.path.isdir(tmp_path)
    # a trailing '/' where nothing exists: refused as open(2) does
    # (EISDIR), saying what is true -- there is no directory there
    slash = str(tmp_path / "nodir") + "/"
    with pytest.raises(IsADirectoryError) as ei:
        mm._dump_snapshot(slash)
    assert ei.value.errno == errno.EISDIR and ei.value.filename == slash
    assert "ends in '/'" in str(ei.value) and "no such directory" in str(ei.value)
    assert "it is a directory" not in str(ei.value)
    assert not os.path.exists(tmp_path / "nodir")
    # a missing directory: FileNotFoundError naming the path
    bad = str(tmp_path / "no" / "x.pickle")
    with pytest.raises(FileNotFoundError) as ei:
        mm._dump_snapshot(bad)
    assert ei.value.errno == errno.ENOENT and ei.value.filename == bad
    # a full device (our own node, never /dev/full): ENOSPC, node kept
    full = str(tmp_path / "full")
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except OSError as e:
        pytest.skip(f"mknod needs root: {e}")
    with pytest.raises(OSError) as ei:
        mm._dump_snapshot(full)
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == full
    m = os.lstat(full)
    assert stat.S_ISCHR(m.st_mode) and m.st_rdev == os.makedev(1, 7)
    mm._record_memory_history(None)


def test_dump_snapshot_oserror_names_the_path_once(tmp_path):
    """OSError's str() appends ": 'path'"; its text (strerror) leaves the
    path out, so a descriptor open only for reading, or a file that cannot
    be replaced (/proc/version), is named once -- never the temporary the
    write would have made beside it."""
    import errno
    import os

    mm._record_memory_history("all")
    ro = tmp_path / "ro.pickle"
    ro.write_bytes(b"kept")
    fd = os.open(ro, os.O_RDONLY)
    try:
        path = f"/dev/fd/{fd}"
        with pytest.raises(OSError) as ei:
            mm._dump_snapshot(path)
        assert ei.value.errno == errno.EBADF and ei.value.filename == path
        assert str(ei.value) == (f"[Errno 9] cannot write: the descriptor is "
                                 f"not open for writing: '{path}'")
        assert ro.read_bytes() == b"kept"
    finally:
        os.close(fd)
    if os.path.exists("/proc/version"):
        with pytest.raises(OSError) as ei:
            mm._dump_snapshot("/proc/version")
        text = str(ei.value)
        assert ei.value.filename == "/proc/version"
        assert text.count("/proc/version") == 1 and "temporary" not in text
        assert ".tmp." not in text and "cannot write" in text
    mm._record_memory_history(None)


DEVICE_ERRORS = r"""
import json, math
import memsnap, memsnap.memory as mm
out = {}
def catch(f, *a):
    try:
        f(*a)
    except Exception as e:
        return [type(e).__name__, str(e)]
mm.caching_allocator_delete(mm.caching_allocator_alloc(100))
n = mm._C.device_count()
out["n"] = n
out["alloc"] = catch(mm.caching_allocator_alloc, 100, n)
out["stats"] = catch(mm.memory_stats, n)
out["allocated"] = catch(mm.memory_allocated, n)
out["fraction"] = catch(mm.set_per_process_memory_fraction, 0.5, n)
out["get_fraction"] = catch(mm.get_per_process_memory_fraction, n)
out["mem_get_info"] = catch(mm.mem_get_info, n)
out["reset"] = catch(mm.reset_peak_memory_stats, n)
out["cpu"] = catch(mm.memory_allocated, "cpu")
out["nan"] = catch(mm.set_per_process_memory_fraction, math.nan)
out["configure_late"] = catch(memsnap.configure, "acl", "cuda")
try:
    import torch
    out["torch_cpu"] = catch(mm.memory_allocated, torch.device("cpu"))
except ImportError:
    out["torch_cpu"] = None
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("profile", ["cuda", "npu"])
def test_device_argument_errors_are_torch_like(profile):
    """A device the allocator does not have, a cpu device, a NaN fraction
    and a late configure() raise torch's exceptions and messages; no
    internal C function name (msnap_*) reaches the user."""
    r = run_script(DEVICE_ERRORS, env=base_env(MEMSNAP_PROFILE=profile)).result
    n = r["n"]
    for k in ("alloc", "stats", "allocated", "fraction", "get_fraction",
              "mem_get_info", "reset", "cpu", "nan", "configure_late"):
        assert r[k] is not None, k
        assert "msnap_" not in r[k][1], (k, r[k])
    dev = "CUDA" if profile == "cuda" else "NPU"
    assert r["alloc"] == ["RuntimeError",
                          f"{dev} error: invalid device ordinal {n} "
                          f"({n} device{'' if n == 1 else 's'} visible)"]
    assert r["mem_get_info"][0] == "RuntimeError"
    assert "invalid device ordinal" in r["mem_get_info"][1]
    # torch's words (assertValidDevice), then how many devices there are
    want = ["RuntimeError", f"Invalid device argument {n}: did you call init? "
                            f"({n} device{'' if n == 1 else 's'} visible)"]
    for k in ("stats", "allocated", "fraction", "get_fraction", "reset"):
        assert r[k] == want, (k, r[k])
    assert r["cpu"] == ["ValueError", f"Expected a {profile} device, but got: cpu"]
    if r["torch_cpu"] is not None:
        assert r["torch_cpu"] == ["ValueError",
                                  f"Expected a {profile} device, but got: cpu"]
    assert r["nan"] == ["RuntimeError",
                        "invalid fraction:nan. Please set within [0, 1]."]
    # configure() names what the allocator really runs, even though
    # MEMSNAP_PROFILE may be unset in the environment.
    assert r["configure_late"][0] == "RuntimeError"
    assert "'sim'" in r["configure_late"][1]
    assert f"'{profile}'" in r["configure_late"][1]
    assert "None" not in r["configure_late"][1]


DEVICE_WORD = r"""
import json, os, sys
import memsnap.memory as mm, memsnap._memsnap as C
def err(f, *a, **k):
    try:
        f(*a, **k)
    except ValueError as e:
        return str(e)
out = {"history": err(mm._record_memory_history, device="gpu"),
       "stats": err(mm.memory_stats, "gpu:0"), "exists": C.initialized()}
mm.memory_allocated()
out["exists_after"] = C.initialized()
out["history_after"] = err(mm._record_memory_history, device="gpu")
out["stats_after"] = err(mm.memory_stats, "gpu:0")
if len(sys.argv) > 1:
    import torch, memsnap.torch as mt
    mt.register_device(sys.argv[1])
    out["registered"] = [err(mm._record_memory_history, device="gpu"),
                         err(mm.memory_stats, "gpu:0")]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("env,word", [({}, "cuda"), ({"MEMSNAP_PROFILE": "npu"}, "npu"),
                                      ({"MEMSNAP_PROFILE": "CUDA"}, "cuda")])
def test_device_word_is_the_profiles_before_and_after_the_allocator(env, word):
    """"Expected a <type> device" names the profile's device type (torch
    says cuda, torch_npu npu) in every function, whether or not the
    allocator exists yet (the sim's default profile is cuda)."""
    r = run_script(DEVICE_WORD, env=base_env(**env)).result
    assert r["exists"] is False and r["exists_after"] is True, r
    want = [f"Expected a {word} device, but got: gpu", f"Expected a {word} device, but got: gpu:0"]
    assert [r["history"], r["stats"]] == want, r
    assert [r["history_after"], r["stats_after"]] == want, r


@pytest.mark.parametrize("name", ["npu", "mydev"])
def test_device_word_is_the_registered_device_type(name):
    """After memsnap.torch.register_device(name) the word is that device
    type, whatever the profile (a device not named "npu" has the cuda one)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import memsnap._shim as shim

    if not os.path.exists(shim.path(shim.TORCH_LIB)):
        pytest.skip("memsnap was built without its C++ torch shim")
    code = DEVICE_WORD.replace("mm.memory_allocated()", "pass")
    proc = subprocess.run([sys.executable, "-c", code, name], env=base_env(),
                          capture_output=True, text=True, timeout=120)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stderr
    r = json.loads(line[0][len("RESULT "):])
    assert r["registered"] == [f"Expected a {name} device, but got: gpu",
                               f"Expected a {name} device, but got: gpu:0"], r
