"""Threads: Python threads (holding the GIL) and C callers without the GIL
(ctypes calls into msnap_plugin_malloc release it, as torch's C++ does)
allocate while history records Python stacks, snapshots are dumped with
the GIL released and an OOM observer takes snapshots.  Nothing may
deadlock (the subprocess has a timeout) and every dump must be complete."""

from __future__ import annotations

import os
import pickle

import pytest

from conftest import base_env, run_script
from snapcheck import schema_errors

SCRIPT = r"""
import ctypes, json, os, threading
import memsnap, memsnap.memory as mm

lib = ctypes.CDLL(memsnap.library_path())
c_alloc = lib.msnap_plugin_malloc
c_alloc.restype = ctypes.c_void_p
c_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
c_free = lib.msnap_plugin_free
c_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

mm._record_memory_history("all", stacks="python", max_entries=20000)
ooms = []
mm._attach_out_of_memory_observer(
    lambda *a: ooms.append(len(mm._snapshot()["segments"])))
errors = []

def python_worker(seed):
    try:
        for i in range(1500):
            p = mm.caching_allocator_alloc(512 * (1 + (i * seed) % 64))
            mm.caching_allocator_delete(p)
    except Exception as e:
        errors.append(repr(e))

def c_worker(seed):
    for i in range(1500):
        p = c_alloc(4096 * (1 + (i * seed) % 16), 0, None)   # GIL released
        if not p:
            errors.append("c alloc failed"); return
        c_free(p, 0, 0, None)

def oom_worker():
    for _ in range(20):
        try:
            mm.caching_allocator_alloc(1 << 40)
        except mm.OutOfMemoryError:
            pass

threads = [threading.Thread(target=python_worker, args=(s,)) for s in (3, 5)]
threads += [threading.Thread(target=c_worker, args=(s,)) for s in (7, 11)]
threads.append(threading.Thread(target=oom_worker))
for t in threads: t.start()
for k in range(10):
    mm._dump_snapshot(os.path.join(OUT, f"d{k}.pickle"))
for t in threads: t.join()
print("RESULT " + json.dumps({"errors": errors, "ooms": len(ooms),
                              "allocated": mm.memory_allocated()}))
"""


def test_threads_gil_and_no_gil_callers_with_dumps(tmp_path):
    r = run_script(SCRIPT.replace("OUT", repr(str(tmp_path))),
                   env=base_env(MEMSNAP_SIM_MEMORY="256M"), timeout=300).result
    assert r["errors"] == []
    assert r["ooms"] == 20
    assert r["allocated"] == 0
    names = set()
    for k in range(10):
        with open(tmp_path / f"d{k}.pickle", "rb") as f:
            snap = pickle.load(f)
        assert schema_errors(snap) == []
        names |= {fr["name"] for e in snap["device_traces"][0]
                  for fr in e.get("frames", [])}
    # Entries made by the C callers (no GIL) carry their Python thread's
    # frames, captured after taking the GIL.
    assert {"c_worker", "python_worker"} <= names


RELEASED_GIL = r"""
import ctypes, json
import memsnap, memsnap.memory as mm
# ctypes releases the GIL around the foreign call, as torch's bindings do
# around an operator: capture() must take it back to see the frames.
lib = ctypes.CDLL(memsnap.library_path())
lib.msnap_plugin_malloc.restype = ctypes.c_void_p
lib.msnap_plugin_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
mm._record_memory_history("all", stacks="python")
def released_gil_caller():
    return lib.msnap_plugin_malloc(4096, 0, None)
p = released_gil_caller()
tb = mm._allocation_traceback(p)
print("RESULT " + json.dumps([f["name"] for f in tb]))
"""


def test_gil_released_caller_gets_its_frames():
    names = run_script(RELEASED_GIL).result
    assert names[:2] == ["released_gil_caller", "<module>"]


HELPER_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
void *msnap_plugin_malloc(ssize_t size, int device, void *stream);
static void *run(void *arg) { return msnap_plugin_malloc(*(ssize_t *)arg, 0, 0); }
uintptr_t alloc_in_native_thread(ssize_t size) {
  pthread_t t;
  void *r = 0;
  if (pthread_create(&t, 0, run, &size) != 0) return 0;
  pthread_join(t, &r);
  return (uintptr_t)r;
}
"""

NATIVE = r"""
import ctypes, json
import memsnap, memsnap.memory as mm
mm._record_memory_history("all", stacks="python")
# PyDLL keeps the GIL held during the call: the native thread must not
# wait for it (it has no Python frames to find).
helper = ctypes.PyDLL(HELPER)
helper.alloc_in_native_thread.restype = ctypes.c_size_t
helper.alloc_in_native_thread.argtypes = [ctypes.c_ssize_t]
p = helper.alloc_in_native_thread(8192)
released = ctypes.CDLL(HELPER).alloc_in_native_thread  # GIL released
released.restype = ctypes.c_size_t
released.argtypes = [ctypes.c_ssize_t]
q = released(8192)
entries = [e for e in mm._snapshot()["device_traces"][0] if e["action"] == "alloc"]
print("RESULT " + json.dumps({"p": p, "q": q, "addrs": [e["addr"] for e in entries],
                              "frames": [e.get("frames") for e in entries]}))
"""


def test_native_thread_without_python_state(tmp_path):
    """An allocation from a thread that never ran Python (torch's autograd
    threads) gets no Python frames and never waits for the GIL, even while
    the calling Python thread holds it: `frames: []`, as PyTorch writes an
    empty gathered context."""
    import shutil
    import subprocess
    import sysconfig

    import memsnap

    # $CC: the compiler for the interpreter's machine (make test-aarch64
    # sets the aarch64 cross compiler); else the build machine's cc.
    import shlex
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc")]
    if cc[0] is None:
        pytest.skip("no C compiler to build the native-thread helper")
    src = tmp_path / "helper.c"
    src.write_text(HELPER_C)
    lib = tmp_path / "libhelper.so"
    pkg = os.path.dirname(memsnap.library_path())
    subprocess.run([*cc, "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib),
                    f"-L{pkg}", "-lmemsnap", f"-Wl,-rpath,{pkg}"], check=True)
    r = run_script(NATIVE.replace("HELPER", repr(str(lib))), timeout=60).result
    assert r["p"] and r["q"]
    assert r["addrs"] == [r["p"], r["q"]]
    assert r["frames"] == [[], []]
