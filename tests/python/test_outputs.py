"""Files memsnap.memory writes (_dump_snapshot in both forms, the usage
report, the OOM_SNAPSHOT_ENABLE dump): the kernel's protected_symlinks
rule, the replaced file's mode, OOM dump names created with O_EXCL, one
message for an unusable OOM_SNAPSHOT_PATH, and the temporaries of killed
dumps cleaned by the next dump to the directory.

A link planted by another user needs root (os.lchown to `nobody`); those
tests skip, saying so, without it.
"""

from __future__ import annotations

import errno
import glob
import os
import pickle
import signal
import stat
import subprocess
import sys
import time

import pytest

import memsnap.memory as mm
from conftest import base_env, memsnap_cli_cmd, run_script
from snapcheck import schema_errors


def _load_tmptag():
    """tests/tmptag.py, loaded by path: putting tests/ on sys.path would let
    the folder tests/torch shadow the torch package."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "tmptag.py")
    spec = importlib.util.spec_from_file_location("tmptag", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tmp_tag


tmp_tag = _load_tmptag()

NOBODY = 65534
root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="a link owned by another user needs root (lchown)")


@pytest.fixture
def sticky(tmp_path):
    """A sticky world-writable directory, as /tmp."""
    d = tmp_path / "sticky"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def victim(tmp_path, mode=0o600):
    v = tmp_path / "victim"
    v.write_bytes(b"the user's own secret")
    os.chmod(v, mode)
    return v


def plant(link, target):
    """A link owned by `nobody`, as another user of /tmp would plant it."""
    os.symlink(target, link)
    os.lchown(link, NOBODY, NOBODY)


def unchanged(v, mode=0o600):
    st = os.stat(v)
    return v.read_bytes() == b"the user's own secret" and stat.S_IMODE(st.st_mode) == mode


@root_only
@pytest.mark.parametrize("augment", [False, True])
def test_dump_snapshot_refuses_a_planted_link(tmp_path, sticky, augment):
    if augment:
        pytest.importorskip("torch")
    v = victim(tmp_path)
    link = sticky / "dump_snapshot.pickle"
    plant(link, v)
    p = mm.caching_allocator_alloc(1 << 20)
    try:
        with pytest.raises(PermissionError, match="protected_symlinks") as e:
            mm._dump_snapshot(str(link), augment_with_fx_traces=augment)
    finally:
        mm.caching_allocator_delete(p)
    assert "uid 65534" in str(e.value) and e.value.filename == str(link)
    assert unchanged(v)
    assert os.listdir(sticky) == ["dump_snapshot.pickle"]  # no temporary left


@root_only
def test_usage_report_refuses_a_planted_link(tmp_path, sticky):
    v = victim(tmp_path)
    plant(sticky / "usage.csv", v)
    with pytest.raises(PermissionError, match="protected_symlinks"):
        mm._write_usage_report(sticky / "usage.csv")
    assert unchanged(v)


@pytest.mark.parametrize("augment", [False, True])
def test_own_link_followed_mode_kept(tmp_path, sticky, augment):
    """A link of the user's own is followed: the file it names gets the
    dump, keeps its 0600, and the link survives."""
    if augment:
        pytest.importorskip("torch")
    v = victim(tmp_path)
    link = sticky / "mine.pickle"
    os.symlink(v, link)
    p = mm.caching_allocator_alloc(1 << 20)
    mm._dump_snapshot(link, augment_with_fx_traces=augment)
    mm.caching_allocator_delete(p)
    assert os.path.islink(link)
    assert stat.S_IMODE(os.stat(v).st_mode) == 0o600
    with open(v, "rb") as f:
        snap = pickle.load(f)
    assert schema_errors(snap) == []
    # the usage report too, 0640 kept
    os.chmod(v, 0o640)
    mm._write_usage_report(link)
    assert stat.S_IMODE(os.stat(v).st_mode) == 0o640
    assert v.read_text().startswith("device,")


@pytest.mark.parametrize("augment", [False, True])
def test_dangling_link_raises_file_not_found(tmp_path, augment):
    """A link of the user's own whose target does not exist: memsnap never
    creates a file through a link, FileNotFoundError naming the link (as
    docs/python.md says), and neither the target nor a temporary appears."""
    if augment:
        pytest.importorskip("torch")
    link = tmp_path / "dump.pickle"
    os.symlink(tmp_path / "target.pickle", link)
    with pytest.raises(FileNotFoundError, match="dangling symlink") as e:
        mm._dump_snapshot(str(link), augment_with_fx_traces=augment)
    assert e.value.filename == str(link)
    assert sorted(os.listdir(tmp_path)) == ["dump.pickle"]


@pytest.mark.parametrize("augment", [False, True])
def test_empty_path_raises_file_not_found(tmp_path, augment, monkeypatch):
    """_dump_snapshot("") fails as torch's does (open('') in
    torch.cuda.memory._dump_snapshot): FileNotFoundError, ENOENT, the
    file name '', and nothing written."""
    if augment:
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        mm._dump_snapshot("", augment_with_fx_traces=augment)
    assert e.value.errno == errno.ENOENT and e.value.filename == ""
    with pytest.raises(FileNotFoundError) as want:
        open("", "wb")
    assert type(e.value) is type(want.value)
    assert os.listdir(tmp_path) == []


OOM_PLANT = r"""
import json, os, time
import memsnap.memory as mm
DIR, VICTIM = {dir!r}, {victim!r}
# Links for every name this OOM can take in the next seconds, planted by
# "another user" before the dump: each must be skipped, never written.
planted = []
now = int(time.time())
for t in range(now - 1, now + 30):
    ts = time.strftime("%Y%m%d%H%M%S", time.localtime(t))
    for name in (f"oom_snapshot_{{os.getpid()}}_{{ts}}.pickle",
                 f"device_0_memsnapUsage_{{ts}}.csv"):
        path = os.path.join(DIR, name)
        os.symlink(VICTIM, path)
        os.lchown(path, 65534, 65534)
        planted.append(name)
try:
    mm.caching_allocator_alloc(1 << 30)
except MemoryError:
    pass
print("RESULT " + json.dumps({{"planted": planted}}))
"""


@root_only
def test_oom_dump_never_writes_through_a_planted_name(tmp_path, sticky):
    """OOM dump names are created with O_EXCL: a planted link at the name
    the dump would take is left alone and the next name is used."""
    v = victim(tmp_path)
    # The sim has no CANN per-module report: the dump's CSV is memsnap's.
    env = base_env(MEMSNAP_SIM_MEMORY="64M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(sticky), MEMSNAP_USAGE_REPORT="memsnap")
    r = run_script(OOM_PLANT.format(dir=str(sticky), victim=str(v)), env=env)
    assert unchanged(v)
    for name in r.result["planted"]:
        assert os.path.islink(sticky / name) and os.readlink(sticky / name) == str(v)
    dumps = [n for n in os.listdir(sticky) if not os.path.islink(sticky / n)]
    pk = [n for n in dumps if n.endswith(".pickle")]
    csv = [n for n in dumps if n.endswith(".csv")]
    assert len(pk) == 1 and pk[0].endswith("_1.pickle"), dumps
    assert len(csv) == 1 and csv[0].endswith("_1.csv"), dumps
    with open(sticky / pk[0], "rb") as f:
        assert any(e["action"] == "oom" for e in pickle.load(f)["device_traces"][0])
    assert "written to " + str(sticky / pk[0]) in r.stderr


TWO_OOMS = r"""
import memsnap.memory as mm
for _ in range(2):
    try:
        mm.caching_allocator_alloc(1 << 30)
    except MemoryError:
        pass
"""


def test_oom_snapshot_path_regular_file_said_once(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    env = base_env(MEMSNAP_SIM_MEMORY="64M", OOM_SNAPSHOT_ENABLE="1",
                   OOM_SNAPSHOT_PATH=str(f))
    r = run_script(TWO_OOMS, env=env)
    lines = [ln for ln in r.stderr.splitlines() if "OOM_SNAPSHOT_PATH" in ln]
    assert len(lines) == 1, r.stderr
    assert f"'{f}' is invalid (Not a directory)" in lines[0]
    assert "Invalid argument" not in r.stderr
    assert f.read_text() == "x"
    # a missing directory: its own reason, once
    env["OOM_SNAPSHOT_PATH"] = str(tmp_path / "missing")
    r = run_script(TWO_OOMS, env=env)
    lines = [ln for ln in r.stderr.splitlines() if "OOM_SNAPSHOT_PATH" in ln]
    assert len(lines) == 1 and "(No such file or directory)" in lines[0], r.stderr


# ---- temporaries of killed dumps ------------------------------------------

DUMPER = r"""
import memsnap.memory as mm, sys
mm._record_memory_history("all", context=None)
for _ in range(60000):
    mm.caching_allocator_delete(mm.caching_allocator_alloc(512))
print("ready", flush=True)
while True:
    mm._dump_snapshot(sys.argv[1])
"""


def kill_a_dump(directory):
    """Start a process that dumps to <directory>/snap.pickle over and over
    and SIGKILL it while a temporary exists; returns (pid, the
    temporaries in the directory right after)."""
    target = os.path.join(directory, "snap.pickle")
    p = subprocess.Popen([sys.executable, "-c", DUMPER, target],
                         env=base_env(), stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        mine = f".{p.pid}."
        deadline = time.time() + 30
        while time.time() < deadline:
            if any(".tmp." in n and mine in n for n in os.listdir(directory)):
                break
            time.sleep(0.0005)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    return p.pid, sorted(glob.glob(target + ".tmp.*"))


def killed_dumps(directory, kills=3, trials=25):
    """Kill dumping processes until `kills` of them left a temporary; each
    new process's first dump must have removed the earlier leftovers.
    Returns the temporaries the last one left."""
    left, done = [], 0
    for _ in range(trials):
        pid, left = kill_a_dump(directory)
        # only this process's temporary can be there: the earlier ones
        # were cleaned by its first dump
        assert all(f".{pid}." in os.path.basename(x) for x in left), left
        done += bool(left)
        if done == kills:
            break
    assert done == kills, f"only {done} of {kills} dumps killed while writing"
    return left


def test_killed_dumps_cleaned_by_the_next_dump(tmp_path):
    """SIGKILL during dumps: the next dump to the directory removes the
    temporaries of the dead processes, and nothing else."""
    d = tmp_path / "dumps"
    d.mkdir()
    left = killed_dumps(str(d))
    tag = tmp_tag()
    for path in left:  # "<name>.tmp.<tag>.<pid>.<n>", of a dead pid
        parts = os.path.basename(path).split(".")
        assert parts[:3] == ["snap", "pickle", "tmp"] and parts[3] == tag, path
        with pytest.raises(ProcessLookupError):
            os.kill(int(parts[4]), 0)
    other = "f" * 12 if tag != "f" * 12 else "e" * 12
    keep = [f"x.pickle.tmp.{tag}.{os.getpid()}.0",  # alive
            f"x.pickle.tmp.{other}.{parts[4]}.0",  # another host
            f"x.pickle.tmp.{parts[4]}.0",  # the old form
            f"x.pickle.tmp.{tag}.{parts[4]}.0.bak"]  # not the pattern
    for name in keep:
        (d / name).write_bytes(b"keep")
    mm._dump_snapshot(d / "other.pickle")
    now = sorted(os.path.basename(x) for x in glob.glob(str(d / "*.tmp.*")))
    assert now == sorted(keep)
    with open(d / "other.pickle", "rb") as f:
        assert schema_errors(pickle.load(f)) == []
    if (d / "snap.pickle").exists():  # a dump that completed is whole
        with open(d / "snap.pickle", "rb") as f:
            assert schema_errors(pickle.load(f)) == []


def test_cli_dump_cleans_too(tmp_path):
    """`memsnap convert -o` goes through the same writer: it cleans the
    directory as well."""
    d = tmp_path / "cli"
    d.mkdir()
    left = killed_dumps(str(d), kills=1)
    assert left
    src = tmp_path / "in.pickle"
    mm._dump_snapshot(src)
    p = subprocess.run([*memsnap_cli_cmd(), "convert", str(src), "-o",
                        str(d / "converted.pickle")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert glob.glob(str(d / "*.tmp.*")) == []


@pytest.mark.parametrize("augment", [False, True])
def test_dump_snapshot_takes_a_descriptor(tmp_path, augment):
    """torch's _dump_snapshot is open(filename, "wb"): an open descriptor
    works too, is written and is closed when done."""
    if augment:
        pytest.importorskip("torch")
    out = tmp_path / "fd.pickle"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    p = mm.caching_allocator_alloc(3 << 20)
    try:
        mm._dump_snapshot(fd, augment_with_fx_traces=augment)
    finally:
        mm.caching_allocator_delete(p)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, as open(fd) closes it
    with open(out, "rb") as f:
        snap = pickle.load(f)
    assert any(b["size"] >= 3 << 20 and b["state"] == "active_allocated"
               for s in snap["segments"] for b in s["blocks"])
    # what open() says for descriptors it cannot take
    with pytest.raises(ValueError, match="negative file descriptor"):
        mm._dump_snapshot(-1)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    with pytest.raises(OSError) as e:
        mm._dump_snapshot(closed)
    assert e.value.errno == errno.EBADF
