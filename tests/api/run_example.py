"""Run the docs/c-api.md example and check its snapshot with CPython.

usage: run_example.py EXAMPLE_BINARY

The example prints one line per step and exits 0 when every step behaved
as the documentation says.  Its snapshot must unpickle with plain
``pickle`` and hold what the program did: one device trace with the
allocations, the free of every one of them, the OOM and the
max_split_size the program configured.
"""
import os
import pickle
import subprocess
import sys
import tempfile

MiB = 1 << 20


def main() -> int:
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "example.pickle")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MEMSNAP_", "PYTORCH_", "OOM_SNAPSHOT"))}
        # The example sets runtime, profile and sizes itself; the
        # environment must not change what the documentation shows.
        # A cross build runs the program under an emulator (Makefile
        # test-aarch64 sets MEMSNAP_EXE_WRAPPER, as for the CLI tests).
        wrapper = os.environ.get("MEMSNAP_EXE_WRAPPER", "").split()
        run = subprocess.run(wrapper + [exe, path], capture_output=True,
                             text=True, env=env, timeout=300)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        if run.returncode != 0:
            print(f"example exited {run.returncode}")
            return 1
        with open(path, "rb") as f:
            snap = pickle.load(f)
        keys = ["segments", "device_traces", "allocator_settings",
                "external_annotations", "host_segments", "host_traces",
                "process_info"]
        assert sorted(snap) == sorted(keys), sorted(snap)
        # memsnap's own key: who wrote the file (memory_viz ignores it).
        info = snap["process_info"]
        assert info["pid"] > 0 and info["runtime"] == "sim", info
        assert info["profile"] == "npu", info  # the example asks for npu
        trace = snap["device_traces"][0]
        # with the time of its newest OOM (the cap then: none)
        last_oom = [e["time_us"] for e in trace if e["action"] == "oom"][-1]
        assert info["devices"] == [{"device": 0, "total_bytes": 1 << 30,
                                    "last_oom_time_us": last_oom}], info
        actions = [e["action"] for e in trace]
        allocs = [e["size"] for e in trace if e["action"] == "alloc"]
        assert allocs == [1000, 100 * MiB, 300 * MiB], allocs
        assert actions.count("free_completed") == 3, actions
        assert actions.count("oom") == 1, actions
        oom = next(e for e in trace if e["action"] == "oom")
        # The oom entry records the rounded size: 2 GiB + 32-byte pad,
        # rounded up to 512 (npu profile).
        assert oom["size"] == 2048 * MiB + 512, oom
        settings = snap["allocator_settings"]
        assert settings["max_split_size"] == 128 * MiB, settings
        # Every live block was freed: no active block is left.
        states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
        assert states <= {"inactive"}, states
        print(f"snapshot ok: {len(trace)} trace entries, actions "
              f"{sorted(set(actions))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
