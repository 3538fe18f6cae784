"""Bad arguments raise what torch raises (cuda-reference §4-§5)."""

from __future__ import annotations

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
    with pytest.raises(TypeError, match="Invalid type for stream argument, must be "
                       "`torch.cuda.Stream` or `int` representing a pointer to an "
                       "existing stream"):
        mm.caching_allocator_alloc(10, stream="s")


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
out["enable"] = catch(mm.caching_allocator_enable, 1)
out["annotate"] = catch(mm._annotate_memory, 0x1234, "x")
out["traceback_unknown"] = mm._allocation_traceback(0x1234)
out["zero"] = mm.caching_allocator_alloc(0)
out["settings"] = catch(mm._set_allocator_settings, "max_split_size_mb:abc")
out["configure_late"] = catch(memsnap.configure, "acl", "cuda")
print("RESULT " + json.dumps(out))
"""


def test_pointer_and_config_errors():
    r = run_script(ERRORS).result
    assert r["double_free"][0] == "ValueError" and "0x" in r["double_free"][1]
    assert r["bogus_free"][0] == "ValueError" and "0x1234" in r["bogus_free"][1]
    assert r["negative"][0] == "ValueError" and "Invalid memory size" in r["negative"][1]
    assert r["enable"] == ["RuntimeError",
                           "cudaCachingAllocator_enable expects a bool, but got int"]
    assert r["annotate"] == ["RuntimeError",
                             "annotateMemory: no live allocation found at pointer 0x1234"]
    assert r["traceback_unknown"] is None
    assert r["zero"] == 0
    assert r["settings"][0] == "ValueError" and "max_split_size_mb" in r["settings"][1]
    assert r["configure_late"][0] == "RuntimeError"


def test_bad_environment_config_names_token():
    code = r"""
import json, memsnap.memory as mm
try:
    mm.caching_allocator_alloc(10)
except ValueError as e:
    print("RESULT " + json.dumps(str(e)))
"""
    r = run_script(code, env=base_env(PYTORCH_NPU_ALLOC_CONF="bogus_key:1")).result
    assert r is not None and "bogus_key" in r


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
