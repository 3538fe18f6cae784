#!/usr/bin/env python3
"""What the memsnap reader takes as input, run by meson:
test_input.py MEMSNAP GROUP.

Groups:
  special    devices, FIFOs, pipes, /proc files, directories: every one
             ends within 10 s with a clear message and bounded memory
             (issue 14 item 1); streamed input past MEMSNAP_INPUT_LIMIT
  compressed gzip and zstd snapshots read directly (files and pipes), the
             same figures as the plain file; truncated, corrupt and bomb
             inputs refused (issue 11), a zstd window over the reader's
             2^27 a limit (MSNAP_ELIMIT); zlib and libzstd opened only for
             such inputs, a missing one named
  wrong      common wrong inputs named: a torch.save zip, a legacy
             torch.save file, a pickled tensor, text, HTML, JSON, xz, bz2;
             a segment, block or trace entry without its defining key
             named by its index path; a segment without device, address,
             total_size, allocated_size or active_size, a block without
             size: refused
  utf8       invalid UTF-8 and lone surrogates become U+FFFD, `check`
             reports them; every real input and such a file convert to
             pickles CPython loads and JSON json.loads accepts
  amplify    output bounded by input: a 2 kB file with device 200,000,000
             and a file whose entries share frame lists through the memo
  bounds     hostile pickles that grow the reader per opcode (items on the
             stack, containers made and dropped) or through the memo (a
             list shared in allocator_settings, a trace entry, block or
             history entry listed 1-5 M times, a history list shared by
             20000 blocks), or in a batched list of 20 M Nones, 16 M
             floats or wide ints (boxed numbers, counted by their bytes),
             refused with MSNAP_ELIMIT in bounded memory; 1 M segments at one
             address, 400 K segment_free entries read in bounded memory
Memory is the peak RSS of the memsnap process (RUSAGE_CHILDREN of a
helper that runs only it).  Exit 77 (SKIP) with a loud line when what a
group needs from outside the project is missing.
"""
import bz2
import gzip
import json
import lzma
import os
import pickle
import random
import resource
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

MEMSNAP = os.path.abspath(sys.argv[1])
GROUP = sys.argv[2]
REAL = os.environ.get("MEMSNAP_REAL_INPUTS") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "real_inputs")
TMP = tempfile.mkdtemp(prefix="memsnap-input-test-")
FAILS = []
WRAPPER = os.environ.get("MEMSNAP_EXE_WRAPPER", "").split()
MiB = 1 << 20
A0 = 0x7f0000000000

# Runs one command and reports its exit status, output, wall time and the
# peak RSS of that process alone (a fresh helper per command).
MEASURE = r"""
import resource, subprocess, sys, time, json
t = time.time()
stdin = open(sys.argv[1], 'rb') if sys.argv[1] != '' else subprocess.DEVNULL
try:
    p = subprocess.run(sys.argv[2:], stdin=stdin, capture_output=True,
                       timeout=60)
    rc, out, err = p.returncode, p.stdout, p.stderr
except subprocess.TimeoutExpired:
    rc, out, err = -999, b'', b'timeout'
print(json.dumps({'rc': rc, 'out': out.decode('utf-8', 'replace'),
                  'err': err.decode('utf-8', 'replace'),
                  'secs': time.time() - t,
                  'rss': resource.getrusage(resource.RUSAGE_CHILDREN)
                  .ru_maxrss * 1024}))
"""


def measured(*args, stdin=""):
    """(rc, out, err, seconds, peak RSS bytes) of memsnap ARGS."""
    p = subprocess.run([sys.executable, "-c", MEASURE, stdin] + WRAPPER +
                       [MEMSNAP] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=120)
    r = json.loads(p.stdout)
    return r["rc"], r["out"], r["err"], r["secs"], r["rss"]


def run(*args, timeout=300, env=None, stdin=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(WRAPPER + [MEMSNAP] + [str(a) for a in args],
                       capture_output=True, timeout=timeout, env=e,
                       stdin=stdin if stdin is not None
                       else subprocess.DEVNULL)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def skip(why):
    print("SKIP " + why, flush=True)
    sys.exit(77)


def finish():
    shutil.rmtree(TMP, ignore_errors=True)
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)
    sys.exit(0)


def path(name):
    return os.path.join(TMP, name)


def write_bytes(data, name):
    with open(path(name), "wb") as f:
        f.write(data)
    return path(name)


def frame(name, filename, line):
    return {"filename": filename, "line": line, "name": name}


def good_snapshot(fr=None):
    """A consistent 2.6 snapshot: a 20 MiB segment, one live block, a
    trace from an empty allocator."""
    fr = fr or [frame("forward", "/home/u/model.py", 12)]
    seg = {"device": 0, "address": A0, "total_size": 20 * MiB,
           "allocated_size": 4 * MiB, "active_size": 4 * MiB,
           "requested_size": 4 * MiB - 100, "stream": 0,
           "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": fr,
           "blocks": [{"address": A0, "size": 4 * MiB,
                       "requested_size": 4 * MiB - 100,
                       "state": "active_allocated", "frames": fr},
                      {"address": A0 + 4 * MiB, "size": 16 * MiB,
                       "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    t = 1700000000000000
    trace = [{"action": "segment_alloc", "addr": A0, "size": 20 * MiB,
              "stream": 0, "time_us": t, "frames": fr},
             {"action": "alloc", "addr": A0, "size": 4 * MiB - 100,
              "stream": 0, "time_us": t + 1, "frames": fr}]
    return {"segments": [seg], "device_traces": [trace],
            "allocator_settings": {"expandable_segments": False},
            "external_annotations": []}


def good_file(name="good.pickle"):
    return write_bytes(pickle.dumps(good_snapshot(), protocol=4), name)


def real_files():
    if not os.path.isdir(REAL):
        skip("real inputs: %s is missing -- tests that need the real "
             "snapshot files did NOT run" % REAL)
    files = sorted(os.path.join(REAL, f) for f in os.listdir(REAL)
                   if f.endswith((".pickle", ".pkl")))
    if len(files) < 8:
        skip("real inputs: only %d files in %s" % (len(files), REAL))
    return files


def summary_json(p, **kw):
    rc, out, err = run("summary", "--json", p, **kw)
    if rc != 0:
        return None
    d = json.loads(out)
    d.pop("file", None)
    return d


# --- groups --------------------------------------------------------------
def group_special():
    # Devices: refused at once, by type, never read.
    for args in (["check", "/dev/zero"], ["check", "/dev/urandom"],
                 ["convert", "/dev/urandom", "-o", path("x")],
                 ["convert", "/dev/zero", "-o", path("x")],
                 ["summary", "--json", "/dev/zero"]):
        rc, out, err, secs, rss = measured(*args)
        expect(rc == 2 and "is a character device" in err and secs < 10
               and rss <= 256 * MiB and not os.path.exists(path("x")),
               "%s: exit 2 in %.2f s, RSS %.1f MB, %r" %
               (" ".join(args[:2]), secs, rss / 1e6, err.strip()[-120:]))
    # A FIFO nobody writes: ends within 10 s.
    fifo = path("fifo")
    os.mkfifo(fifo)
    rc, out, err, secs, rss = measured("check", fifo)
    expect(rc == 2 and "no writer" in err and secs < 10,
           "check FIFO without a writer: exit 2 in %.1f s (%r)" %
           (secs, err.strip()[-120:]))
    # A FIFO with a writer: read as a stream.
    good = pickle.dumps(good_snapshot(), protocol=4)
    # A writer that opens the FIFO at once but sends its first byte only
    # after the 5 s no-writer wait: waited for, as on a pipe.
    slow = path("slow.fifo")
    os.mkfifo(slow)

    def slow_writer():
        fd = os.open(slow, os.O_WRONLY)
        time.sleep(6.5)
        os.write(fd, good)
        os.close(fd)
    t = threading.Thread(target=slow_writer)
    t.start()
    rc, out, err = run("check", slow)
    t.join()
    expect(rc == 0 and "ok" in out,
           "check FIFO whose writer is open but slow (6.5 s): waited for "
           "(rc %d, %r)" % (rc, err.strip()[-120:]))

    def writer():
        time.sleep(0.5)
        with open(fifo, "wb") as f:
            f.write(good)
    th = threading.Thread(target=writer)
    th.start()
    rc, out, err = run("check", fifo, timeout=60)
    th.join(30)
    expect(rc == 0 and "ok" in out, "check FIFO with a writer (%d %r)"
           % (rc, err))
    # A pipe on standard input ("-"), also slow to start.
    p = subprocess.Popen(WRAPPER + [MEMSNAP, "summary", "--json", "-"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    time.sleep(0.3)
    out, err = p.communicate(good, timeout=60)
    expect(p.returncode == 0 and
           json.loads(out)["devices"][0]["allocated_bytes"] == 4 * MiB,
           "summary - (a pipe): figures (%d %r)" % (p.returncode, err))
    # A writer that keeps its end of the pipe open after the pickle: the
    # reader stops at STOP, it does not wait for more.
    r, w = os.pipe()
    p = subprocess.Popen(WRAPPER + [MEMSNAP, "summary", "--json", "-"],
                         stdin=r, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    os.close(r)
    os.write(w, good)
    try:
        out, err = p.communicate(timeout=20)
        ended = p.returncode == 0
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        ended = False
    os.close(w)
    expect(ended, "a pipe whose writer stays open after STOP: summary ends")
    slow_writer_cpu()
    # /dev/null, as standard input or by name: named as the empty device
    # it is (not "a device that never ends")
    for args, stdin in ((["check", "-"], "/dev/null"),
                        (["summary", "-"], "/dev/null"),
                        (["check", "/dev/null"], "")):
        rc, out, err, secs, rss = measured(*args, stdin=stdin)
        expect(rc == 2 and "is /dev/null (always empty)" in err and
               ("standard input is" in err) == (args[1] == "-") and
               "never ends" not in err and len(err.strip().splitlines()) == 1,
               "%s%s: one line naming /dev/null: %r"
               % (" ".join(args), " < /dev/null" if stdin else "",
                  err.strip()[-160:]))
    # standard input twice: refused before anything is read
    good_path = write_bytes(good, "twice.pickle")
    for args in (["diff", "-", "-"], ["view", "-", "-", "-o", path("t.html")],
                 ["check", "-", good_path, "-"]):
        with open(good_path, "rb") as stdin:
            rc, out, err = run(*args, stdin=stdin)
            left = stdin.read()
        expect(rc == 2 and "standard input ('-') is given more than once"
               in err and "empty" not in err and left == good and
               not os.path.exists(path("t.html")),
               "%s: standard input twice refused, nothing read (%d %r)"
               % (" ".join(args[:3]), rc, err.strip()[-200:]))
    # one pipe under two names ('-' and /dev/stdin): a usage error of the
    # other commands, before anything is read; fleet reads it once, with
    # the warning of any file named twice (one helper identifies both)
    if os.path.exists("/dev/stdin"):
        for args in (["diff", "-", "/dev/stdin"],
                     ["check", "/dev/stdin", good_path, "-"]):
            p = subprocess.run(WRAPPER + [MEMSNAP] + args, input=good,
                               capture_output=True, timeout=60)
            err = p.stderr.decode("utf-8", "replace")
            expect(p.returncode == 2 and
                   "'%s' and '%s' are the same pipe" % (args[1], args[-1])
                   in err,
                   "%s: one pipe under two names refused (%d %r)"
                   % (" ".join(args), p.returncode, err.strip()[-200:]))
        p = subprocess.run(WRAPPER + [MEMSNAP, "fleet", "--json", "-",
                                      "/dev/stdin"], input=good,
                           capture_output=True, timeout=60)
        js = json.loads(p.stdout) if p.stdout else {}
        expect(p.returncode == 0 and
               [x.get("file") for x in js.get("ranks", [])] == ["-"] and
               js["ranks"][0].get("allocated_bytes") == 4 * MiB and
               any("/dev/stdin is -; 1 name left out" in w
                   for w in js.get("warnings", [])),
               "fleet - /dev/stdin: the pipe is read once, with a warning "
               "(%d %r %r)" % (p.returncode, js.get("warnings"),
                               p.stderr[-200:]))
    # fleet reads standard input named twice once, as docs/cli.md says of
    # any input named twice: from a pipe and from a file
    p = subprocess.run(WRAPPER + [MEMSNAP, "fleet", "--json", "-", "-"],
                       input=good, capture_output=True, timeout=60)
    js = json.loads(p.stdout) if p.stdout else {}
    expect(p.returncode == 0 and
           [x.get("file") for x in js.get("ranks", [])] == ["-"] and
           js["ranks"][0].get("allocated_bytes") == 4 * MiB and
           any("- given again; 1 name left out" in w
               for w in js.get("warnings", [])),
           "cat S | fleet - -: standard input read once, with a warning "
           "(%d %r %r)" % (p.returncode, js.get("warnings"), p.stderr[-200:]))
    with open(good_path, "rb") as stdin:
        rc, out, err = run("fleet", "-", "-", stdin=stdin)
    expect(rc == 0 and "warning: a file was given more than once (- given "
           "again; 1 name left out)" in out and "fleet: 1 file" in out,
           "fleet - - < FILE: read once, with a warning (%d %r)"
           % (rc, (out + err).strip()[:300]))
    with open(good_path, "rb") as stdin:
        rc, out, err = run("diff", "-", good_path, stdin=stdin)
    expect(rc in (0, 1), "diff - FILE: one '-' is fine (%d %r)"
           % (rc, err.strip()[-160:]))
    # Random bytes through a pipe: refused early, little memory.
    rnd = random.Random(7)
    worst = 0
    for k in range(20):
        blob = write_bytes(bytes(rnd.getrandbits(8) for _ in range(4096)) *
                           2048, "rnd%d" % k)
        rc, out, err, secs, rss = measured("check", "-", stdin=blob)
        worst = max(worst, rss)
        expect(rc == 2 and secs < 10, "8 MB of random bytes on a pipe "
               "(%d): exit %d in %.2f s" % (k, rc, secs))
    expect(worst <= 256 * MiB, "random pipes: peak RSS %.1f MB <= 256 MB"
           % (worst / 1e6))
    # An endless valid stream stops at MEMSNAP_INPUT_LIMIT.
    big = pickle.dumps(list(range(300000)), protocol=4)
    e = dict(os.environ, MEMSNAP_INPUT_LIMIT="64K")
    p = subprocess.Popen(WRAPPER + [MEMSNAP, "check", "-"], env=e,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(big, timeout=60)
    except BrokenPipeError:
        out, err = p.communicate(timeout=60)
    rc, err = p.returncode, err.decode()
    expect(rc == 2 and "MEMSNAP_INPUT_LIMIT" in err and "limit" in err,
           "a stream past MEMSNAP_INPUT_LIMIT: %r" % err.strip()[-160:])
    # 0 is not a limit: warned about as 'bogus' is, in the same words,
    # the default applies and is named as a size both times
    for v in ("0", "bogus"):
        rc, out, err = run("check", "-", stdin=open(good_file(), "rb"),
                           env={"MEMSNAP_INPUT_LIMIT": v})
        expect(rc == 0 and
               ("memsnap: warning: ignoring MEMSNAP_INPUT_LIMIT '%s': it must "
                "be at least 1 byte (a number with an optional K, M, G, T or "
                "P suffix); using 8G\n" % v) in err,
               "MEMSNAP_INPUT_LIMIT=%s: a warning, the 8 GiB default as 8G "
               "(%d %r)" % (v, rc, err.strip()[-200:]))
    # A limit past 2^64 bytes is clamped, not wrapped: stdin and a gzip
    # file still read (limit + 1 wrapped to 0: "the input is empty").
    gz = write_bytes(gzip.compress(open(good_file(), "rb").read()), "good.gz")
    for v in ("16384P", "18446744073709551615", "99999999999999999999"):
        for how in ("stdin", "gzip"):
            rc, out, err = run("check", "-" if how == "stdin" else gz,
                               stdin=open(good_file(), "rb") if how == "stdin"
                               else None, env={"MEMSNAP_INPUT_LIMIT": v})
            expect(rc == 0, "MEMSNAP_INPUT_LIMIT=%s, %s: read (%d %r)"
                   % (v, how, rc, err.strip()[-160:]))
    # A regular file is mapped, the limit does not apply to it.
    rc, out, err = run("check", good_file(),
                       env={"MEMSNAP_INPUT_LIMIT": "64"})
    expect(rc == 0, "a mapped file ignores the stream limit (%d %r)"
           % (rc, err))
    # /proc files (stat size 0): read as a stream, named as text.
    rc, out, err, secs, rss = measured("check", "/proc/self/maps")
    expect(rc == 2 and "text file" in err and "is empty" not in err,
           "/proc/self/maps: a text file, not 'empty' (%r)"
           % err.strip()[-160:])
    rc, out, err = run("check", TMP)
    expect(rc == 2 and "is a directory" in err, "a directory: %r" % err)
    rc, out, err = run("check", write_bytes(b"", "empty.pickle"))
    expect(rc == 2 and "empty" in err, "an empty file: %r" % err)
    missing = path("missing.pickle")
    rc, out, err = run("check", missing)
    expect(rc == 2 and "No such file" in err, "a missing file: %r" % err)
    # one line naming the file once, no byte offset (nothing was read)
    expect(err.count(missing) == 1 and "offset" not in err
           and len(err.strip().splitlines()) == 1,
           "a missing file is named once: %r" % err)
    # tagged with the table's "no such item" wherever a command reports
    # it (it was [MSNAP_EIO], as an unreadable file): its line, the
    # --json documents' "error", fleet's row; a dangling link and a file
    # on the way are missing too
    dangling = path("dangling.pickle")
    os.symlink(path("nowhere.pickle"), dangling)
    on_the_way = os.path.join(write_bytes(b"x", "afile.bin"), "x.pickle")
    rc, out, err = run("summary", dangling)
    expect(err == "memsnap: %s: cannot open: a dangling symbolic link: its "
           "target '%s' does not lead to a file [MSNAP_ENOENT]\n"
           % (dangling, path("nowhere.pickle")),
           "a dangling link is called one (%r)" % err)
    # a relative target is read from the link's directory, and says so
    rel = path("rel-dangling.pickle")
    os.symlink("nowhere-rel.pickle", rel)
    rc, out, err = run("summary", rel)
    expect(err.endswith(": cannot open: a dangling symbolic link: its target "
                        "'nowhere-rel.pickle' (relative to the link's "
                        "directory) does not lead to a file [MSNAP_ENOENT]\n"),
           "a relative dangling link says where its target is read (%r)"
           % err)
    for name in (missing, dangling, on_the_way):
        for args in (["check", name], ["summary", name], ["diff", name, name],
                     ["replay", name], ["leaks", name]):
            rc, out, err = run(*args)
            expect(rc == 2 and err.startswith("memsnap: %s: cannot open: "
                                              % name)
                   and err.endswith(" [MSNAP_ENOENT]\n"),
                   "%s of a missing file: [MSNAP_ENOENT] (%r)"
                   % (args[0], err))
        for args in (["summary", "--json", name], ["check", "--json", name],
                     ["view", "--json", name, "-o", path("m.html")],
                     ["replay", "--json", name]):
            rc, out, err = run(*args)
            try:
                j = json.loads(out)
            except ValueError:
                j = {}
            j = (j.get("files") or [{}])[0] if "files" in j else j  # check
            expect(rc == 2 and str(j.get("error")).endswith(
                       " [MSNAP_ENOENT]"),
                   "%s --json of a missing file: \"error\" [MSNAP_ENOENT] "
                   "(%r)" % (args[0], out[-200:]))
    rc, out, err = run("fleet", missing)
    expect(rc == 2 and "[MSNAP_ENOENT]" in err and "[MSNAP_ENOENT]" in out
           and "MSNAP_EIO" not in out + err,
           "fleet of a missing file: [MSNAP_ENOENT] (%r %r)"
           % (err[-200:], out[-300:]))


def zstd_frame(data, fhd, window=b"", fcs=b""):
    """A zstd frame built by hand (RFC 8878): magic, frame header
    descriptor `fhd`, Window_Descriptor `window` (none for a single
    segment), Frame_Content_Size `fcs`, then `data` in raw blocks of at
    most 128 KiB (the last one marked last)."""
    out = b"\x28\xb5\x2f\xfd" + bytes([fhd]) + window + fcs
    blocks = [data[i:i + (128 << 10)] for i in range(0, len(data), 128 << 10)]
    for i, b in enumerate(blocks):
        hdr = (len(b) << 3) | (1 if i == len(blocks) - 1 else 0)  # raw = 0
        out += struct.pack("<I", hdr)[:3] + b
    return out


def zstd_windows(good):
    """A zstd frame that needs a larger window than the reader allows
    (2^27, zstd's default) is a limit of the reader, not corrupt data:
    MSNAP_ELIMIT naming the window, the limit and the way to read it (it
    was "the zstd-compressed data is corrupt: Frame requires too much
    memory for decoding" [MSNAP_EFORMAT]).  The frames are built by hand
    (zstd --long=31 writes the same header when the program is here)."""
    lim = "more than the 128.00 MiB (2^27 bytes) memsnap decompresses with"
    cases = [  # (what, frame, window text, zstd --long=N)
        ("window 2^31", zstd_frame(good, 0x00, b"\xa8"),
         "2.00 GiB (2147483648 bytes)", 31),
        ("window 2^27 + 2^24", zstd_frame(good, 0x00, b"\x89"),
         "144.00 MiB (150994944 bytes)", 28),
        ("a single segment of 200 MiB",
         zstd_frame(good, 0xe0, fcs=struct.pack("<Q", 200 << 20)),
         "200.00 MiB (209715200 bytes)", 28)]
    if shutil.which("zstd"):
        zsrc = write_bytes(good, "long31-src.pickle")
        with open(zsrc, "rb") as fh:  # (a pipe: the size is not known)
            made = subprocess.run(["zstd", "-q", "--long=31", "-c"], stdin=fh,
                                  check=True, capture_output=True).stdout
        expect(made[4:6] == b"\x04\xa8", "zstd --long=31 writes the window "
               "descriptor of 2^31 (%r)" % made[:8])
        cases.append(("zstd --long=31", made, "2.00 GiB (2147483648 bytes)",
                      31))
    else:
        print("SKIP zstd --long=31: the zstd program is missing (the frames "
              "built by hand ran)")
    for what, frame, window, lg in cases:
        f = write_bytes(frame, "window.pickle.zst")
        for args, stdin in ((["check", f], None), (["summary", "-"], f)):
            if stdin:
                with open(stdin, "rb") as fh:
                    rc, out, err = run(*args, stdin=fh)
            else:
                rc, out, err = run(*args)
            expect(rc == 2 and err.endswith(" [MSNAP_ELIMIT]\n") and
                   ("a zstd frame needs a window of %s, %s" % (window, lim))
                   in err and ("zstd -dc --long=%d FILE | memsnap COMMAND -"
                               % lg) in err and "corrupt" not in err and
                   len(err.strip().splitlines()) == 1,
                   "%s (%s): a limit, named (%r)"
                   % (what, " ".join(args[:1]), err.strip()[-300:]))
        if shutil.which("zstd") and "single" not in what:
            # zstd reads it as the message says, and so does memsnap then
            d = subprocess.run(["zstd", "-q", "-dc", "--long=%d" % lg, f],
                               capture_output=True)
            expect(d.returncode == 0 and d.stdout == good,
                   "%s: zstd -dc --long=%d reads the frame (%r)"
                   % (what, lg, d.stderr[-200:]))
    # the limit itself reads: a window of exactly 2^27
    rc, out, err = run("check", write_bytes(zstd_frame(good, 0x00, b"\x88"),
                                            "w27.pickle.zst"))
    expect(rc == 0, "a frame with a window of 2^27: read (%d %r)"
           % (rc, err.strip()[-200:]))
    # a window no zstd decoder takes (2^41) is corrupt, as before
    rc, out, err = run("check", write_bytes(zstd_frame(good, 0x00, b"\xf8"),
                                            "w41.pickle.zst"))
    expect(rc == 2 and "zstd-compressed data is corrupt" in err and
           "[MSNAP_EFORMAT]" in err,
           "a window of 2^41: corrupt (%r)" % err.strip()[-200:])


def cpu_of(args, feed=None):
    """(rc, stderr, CPU seconds) of memsnap ARGS; feed(w): writes its
    standard input (a pipe of 1 MiB) and closes it."""
    r = None
    if feed:
        import fcntl
        r, w = os.pipe()
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    p = subprocess.Popen(WRAPPER + [MEMSNAP] + args,
                         stdin=r if feed else subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if feed:
        os.close(r)
        feed(w)
    err = p.stderr.read().decode("utf-8", "replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, ru.ru_utime + ru.ru_stime


def slow_writer_cpu():
    """A writer slower than the reader (1 MiB at a time, then a pause):
    the read-ahead at a MARK finds nothing ready; it must not poll and
    move the window at every MARK again until something came (src/base/
    source.c; 40 times the CPU of the mapped file: 3.4 s for these
    8.7 MB, where a pickle has a MARK every 20 bytes)."""
    data = pickle.dumps([(i, i, i, i) for i in range(400000)], protocol=4)
    f = write_bytes(data, "tuples.pickle")

    def feed(w):
        for i in range(0, len(data), 1 << 20):
            os.write(w, data[i:i + (1 << 20)])
            time.sleep(0.3)
        os.close(w)
    rc, err, cpu = cpu_of(["summary", f])
    prc, perr, pcpu = cpu_of(["summary", "-"], feed)
    expect(rc == prc == 2 and err.replace(f, "-") == perr and
           pcpu <= 4 * cpu + 0.5,
           "a pipe fed 1 MiB at a time with pauses: the file's error, CPU "
           "%.2f s (the file: %.2f s; %r)" % (pcpu, cpu, perr.strip()[-120:]))


def group_compressed():
    files = real_files()
    for f in files:
        name = os.path.basename(f)
        ref = summary_json(f)
        with open(f, "rb") as fh:
            raw = fh.read()
        gz = write_bytes(gzip.compress(raw), name + ".gz")
        got = summary_json(gz)
        expect(ref is not None and got == ref,
               "%s.gz: same summary as the plain file" % name)
        zst = None
        if shutil.which("zstd"):
            zst = path(name + ".zst")
            subprocess.run(["zstd", "-q", "-f", f, "-o", zst], check=True)
            expect(summary_json(zst) == ref,
                   "%s.zst: same summary as the plain file" % name)
        with open(gz, "rb") as stdin:
            got = summary_json("-", stdin=stdin)
        expect(got == ref, "%s.gz through a pipe: same summary" % name)
    if not shutil.which("zstd"):
        print("SKIP zstd files: the zstd program is missing (the gzip ones "
              "ran)")
    good = pickle.dumps(good_snapshot(), protocol=4)
    # concatenated gzip members are one stream (cat a.gz b.gz)
    half = len(good) // 2
    cat = write_bytes(gzip.compress(good[:half]) + gzip.compress(good[half:]),
                      "two-members.pickle.gz")
    rc, out, err = run("check", cat)
    expect(rc == 0, "two gzip members: one stream (%d %r)" % (rc, err))
    gzd = gzip.compress(good)
    rc, out, err = run("check", write_bytes(gzd[:len(gzd) // 2], "cut.gz"))
    expect(rc == 2 and "gzip" in err and "truncated" in err and
           "the offset counts decompressed bytes" in err,
           "a truncated .gz, its offset said to be in decompressed bytes: %r"
           % err.strip()[-160:])
    # cut inside the trailer (CRC32, size) or the last deflate block: the
    # pickle itself may be whole, the file is not (gzip -t fails it)
    for cut in (1, 4, 8, 9):
        rc, out, err = run("check", write_bytes(gzd[:-cut], "tail%d.gz" % cut))
        expect(rc == 2 and "gzip" in err and "truncated" in err,
               "a .gz without its last %d bytes: %r" % (cut, err.strip()[-160:]))
    if shutil.which("zstd"):
        zsrc = write_bytes(good, "whole.pickle")
        zout = path("whole.pickle.zst")
        subprocess.run(["zstd", "-q", "-f", zsrc, "-o", zout], check=True)
        with open(zout, "rb") as f:
            zd = f.read()
        rc, out, err = run("check", write_bytes(zd[:-3], "tail.zst"))
        expect(rc == 2 and "zstd" in err and "truncated" in err and
               "the offset counts decompressed bytes" in err,
               "a .zst without its last 3 bytes: %r" % err.strip()[-160:])
    # compressed twice: named, with the way out, for each pair of layers
    # (the decompressed data starts with gzip's or zstd's magic again)
    twice = [("gzip in gzip", gzip.compress(gzd), "gzip", "gzip")]
    if shutil.which("zstd"):
        zsrc = write_bytes(good, "twice-src.pickle")
        zz = subprocess.run(["zstd", "-q", "-c", zsrc], check=True,
                            capture_output=True).stdout
        zz2 = subprocess.run(["zstd", "-q", "-c"], input=zz, check=True,
                             capture_output=True).stdout
        zg = subprocess.run(["zstd", "-q", "-c"], input=gzd, check=True,
                            capture_output=True).stdout
        twice += [("zstd in zstd", zz2, "zstd", "zstd"),
                  ("zstd in gzip", gzip.compress(zz), "gzip", "zstd"),
                  ("gzip in zstd", zg, "zstd", "gzip")]
    for what, data, outer, inner in twice:
        f = write_bytes(data, "twice.bin")
        for args, stdin in ((["summary", f], None), (["summary", "-"], f)):
            if stdin:
                with open(stdin, "rb") as fh:
                    rc, out, err = run(*args, stdin=fh)
            else:
                rc, out, err = run(*args)
            expect(rc == 2 and "compressed twice" in err and
                   ("the %s-compressed data decompresses to %s-compressed"
                    % (outer, inner)) in err and
                   ("%s -dc FILE > ONCE" % outer) in err and
                   "opcode" not in err and len(err.strip().splitlines()) == 1,
                   "%s (summary %s): %r" % (what, args[1] if stdin is None
                                            else "- < FILE",
                                            err.strip()[-240:]))
    zstd_windows(good)
    # ... and undoing one layer as the message says gives the snapshot
    once = subprocess.run(["gzip", "-dc"], input=gzip.compress(gzd),
                          capture_output=True, check=True).stdout
    rc, out, err = run("check", write_bytes(once, "once.gz"))
    expect(rc == 0, "gzip -dc of the twice-compressed file reads (%d %r)"
           % (rc, err.strip()[-160:]))
    bad = bytearray(gzd)
    for i in range(12, len(bad) - 8, 7):
        bad[i] ^= 0x5a
    rc, out, err = run("check", write_bytes(bytes(bad), "corrupt.gz"))
    expect(rc == 2 and "gzip" in err, "a corrupt .gz: %r"
           % err.strip()[-160:])
    # One byte flipped in the middle of a real recording's deflate data:
    # the garbage it decompresses to fails the pickle reader (a memo key,
    # an opcode) long before the member's CRC is reached; zlib's error is
    # the one reported, naming the file, for a file and a pipe.
    real = os.path.join(REAL, "kkaitlyn111_a2__memory_ctx128_forward_mixed"
                        ".pickle")
    if os.path.exists(real):
        with open(real, "rb") as f:
            gz1 = bytearray(gzip.compress(f.read()))
        for at in (len(gz1) // 5, len(gz1) // 3, len(gz1) // 2):
            flip = bytearray(gz1)
            flip[at] ^= 0x55
            fp = write_bytes(bytes(flip), "flipped.pickle.gz")
            with open(fp, "rb") as fh:
                p = subprocess.Popen(WRAPPER + [MEMSNAP, "check", "-"],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
                _, perr = p.communicate(fh.read(), timeout=120)
            rc, out, err = run("check", fp)
            for how, r, e, name in (
                    ("file", rc, err, fp),
                    ("pipe", p.returncode, perr.decode("utf-8", "replace"),
                     "-")):
                expect(r == 2 and e.startswith(
                    "memsnap: %s: offset " % name) and
                    "the gzip-compressed data is corrupt: incorrect data "
                    "check" in e and "memo" not in e and "opcode" not in e
                    and "expected" not in e,
                    "a byte flipped at %d of %d in a .gz (%s): zlib's "
                    "error, naming the file: %r"
                    % (at, len(gz1), how, e.strip()[-240:]))
    else:
        print("SKIP flipped byte in a real recording: no real inputs")
    corrupt_check_offsets(max(files, key=os.path.getsize))
    # a whole gzip member around a pickle that is wrong: the reader's error
    rc, out, err = run("check", write_bytes(
        gzip.compress(b"\x80\x04}\xff."),
        "badop.pickle.gz"))
    expect(rc == 2 and "unknown opcode 0xff" in err and "corrupt" not in err
           and "while decoding" not in err,
           "a valid .gz of a wrong pickle: the reader's error (%r)"
           % err.strip()[-200:])
    # a bomb: 64 MB of zeros in 64 kB; decompressed bytes count against
    # the limit, and the zeros are not a pickle anyway
    bomb = write_bytes(gzip.compress(b"\x80\x04]" + b"\x00" * (64 * MiB)),
                       "bomb.gz")
    rc, out, err, secs, rss = measured("check", bomb)
    expect(rc == 2 and rss <= 256 * MiB and secs < 10,
           "a gzip bomb: exit 2, RSS %.1f MB, %.1f s" % (rss / 1e6, secs))
    lim = write_bytes(gzip.compress(pickle.dumps(list(range(200000)),
                                                 protocol=4)), "lim.gz")
    rc, out, err = run("check", lim, env={"MEMSNAP_INPUT_LIMIT": "100K"})
    expect(rc == 2 and "MEMSNAP_INPUT_LIMIT" in err,
           "decompressed bytes count against the limit: %r"
           % err.strip()[-160:])
    compression_libraries(good)


def prefilled_pipe(data):
    """The read end of a pipe that holds all of data, its writer closed
    (what the reader takes at once is then the same in every run)."""
    r, w = os.pipe()
    import fcntl
    fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    assert len(data) <= fcntl.fcntl(w, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    os.write(w, data)
    os.close(w)
    return r


def corrupt_check_offsets(real):
    """A real recording compressed, its check (gzip's CRC32 and size,
    zstd's XXH64) wrong or its trailer cut: the pickle reads, the check
    fails.  The error names it at the offset where the decompressor met
    it -- the end of the data, after the pickle -- the same for the file
    and for a pipe (src/base/source.c gives every byte decompressed
    before an error; it dropped up to a window of them, the read-ahead's
    4 MiB, so the offset was up to that much earlier and differed
    between a file and a pipe)."""
    with open(real, "rb") as f:
        raw = f.read()
    name = os.path.basename(real)
    gzd = bytearray(gzip.compress(raw))
    cases = []
    for back, says in ((8, "incorrect data check"),
                       (2, "incorrect length check")):
        bad = bytearray(gzd)
        bad[-back] ^= 0x55
        cases.append(("gzip, byte -%d flipped" % back, bytes(bad), ".gz",
                      "the gzip-compressed data is corrupt: " + says))
    cases.append(("gzip, its last 4 bytes cut", bytes(gzd[:-4]), ".gz",
                  "the gzip-compressed data is truncated"))
    if shutil.which("zstd"):
        zd = subprocess.run(["zstd", "-q", "-c", "--check"], input=raw,
                            check=True, capture_output=True).stdout
        bad = bytearray(zd)
        bad[-1] ^= 0x55
        cases.append(("zstd, its checksum flipped", bytes(bad), ".zst",
                      "the zstd-compressed data is corrupt: Restored data "
                      "doesn't match checksum"))
    for what, data, ext, says in cases:
        fp = write_bytes(data, "check" + ext)
        rc, out, err = run("summary", fp)
        r = prefilled_pipe(data)
        try:
            prc, pout, perr = run("summary", "-", stdin=r)
        finally:
            os.close(r)
        want = "offset %d: %s" % (len(raw), says)
        expect(rc == 2 and prc == 2 and want in err and
               err.replace(fp, "-") == perr,
               "%s %s: named at offset %d (the end), file and pipe alike: "
               "%r / %r" % (name, what, len(raw), err.strip()[-200:],
                            perr.strip()[-200:]))


def compression_libraries(good):
    """zlib and libzstd are opened at run time on the first compressed
    input (src/base/source.c): nothing of memsnap is linked against them,
    a plain input never needs them, a missing one is named."""
    readelf = shutil.which("readelf")
    lib = os.path.join(os.path.dirname(MEMSNAP), "..", "src",
                       "libmemsnap.so")
    if readelf:
        for f in [MEMSNAP] + ([lib] if os.path.exists(lib) else []):
            d = subprocess.run([readelf, "-d", f], capture_output=True,
                               text=True).stdout
            expect("NEEDED" in d and "libz" not in d and "zstd" not in d,
                   "%s: no libz / libzstd among its NEEDED libraries"
                   % os.path.basename(f))
    else:
        print("SKIP NEEDED check: readelf is missing")
    plain = write_bytes(good, "plain.pickle")
    gz = write_bytes(gzip.compress(good), "good.pickle.gz")
    # the library is opened only for a compressed input (the zstd magic
    # is enough: the library is needed before any byte is decompressed)
    zst = write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64, "magic.zst")
    gone = {"MEMSNAP_ZLIB_LIBRARY": path("no/libz.so.1"),
            "MEMSNAP_ZSTD_LIBRARY": path("no/libzstd.so.1")}
    rc, out, err = run("check", plain, env=gone)
    expect(rc == 0, "a plain input reads without zlib and libzstd (%d %r)"
           % (rc, err.strip()[-160:]))
    rc, out, err = run("check", gz, env=gone)
    expect(rc == 2 and "reading gzip input needs libz.so.1" in err and
           "no/libz.so.1" in err and "MSNAP_ENOTSUP" in err,
           "without zlib a .gz is refused naming libz.so.1: %r"
           % err.strip()[-240:])
    with open(gz, "rb") as stdin:
        rc, out, err = run("check", "-", env=gone, stdin=stdin)
    expect(rc == 2 and "reading gzip input needs libz.so.1" in err,
           "the same through a pipe: %r" % err.strip()[-160:])
    rc, out, err = run("check", zst, env=gone)
    expect(rc == 2 and "reading zstd input needs libzstd.so.1" in err and
           "no/libzstd.so.1" in err,
           "without libzstd a .zst is refused naming libzstd.so.1: %r"
           % err.strip()[-240:])
    # a library without the entry points: named too
    rc, out, err = run("check", zst,
                       env={"MEMSNAP_ZSTD_LIBRARY": "libz.so.1"})
    expect(rc == 2 and "libz.so.1 has no ZSTD_" in err,
           "a libzstd without its entry points: %r" % err.strip()[-160:])
    # and by default both load
    rc, out, err = run("check", gz)
    expect(rc == 0, "by default the .gz reads (%d %r)" % (rc, err[-160:]))


def group_wrong():
    cases = []
    try:
        import torch  # the real torch of .venv when the tests run under make
        import io
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(3)}, buf)
        cases.append(("torch.save", buf.getvalue(), "zip archive"))
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(3)}, buf,
                   _use_new_zipfile_serialization=False)
        cases.append(("torch.save legacy", buf.getvalue(), "torch.save file"))
        cases.append(("pickled tensor", pickle.dumps(torch.zeros(2)),
                      "torch._utils._rebuild_tensor_v2"))
    except ImportError:
        print("SKIP torch.save files: torch is not importable by %s (a zip "
              "archive made with zipfile stands in)" % sys.executable)
        zb = path("z.zip")
        with zipfile.ZipFile(zb, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
        with open(zb, "rb") as f:
            cases.append(("zip", f.read(), "zip archive"))
    good = pickle.dumps(good_snapshot(), protocol=4)
    cases += [
        ("text", b"this is not a snapshot\nsecond line\n", "text file"),
        ("csv", b"segment,size\n0,1024\n", "text file"),
        ("html", b"<!DOCTYPE html><html><body>x</body></html>", "HTML page"),
        ("json", json.dumps({"segments": []}).encode(), "looks like JSON"),
        ("xz", lzma.compress(good), "xz-compressed"),
        ("bz2", bz2.compress(good), "bzip2-compressed"),
        ("elf", open(MEMSNAP, "rb").read(4096), "ELF"),
        ("object", pickle.dumps(OSError("x")), "Python objects"),
    ]
    # A snapshot with a key missing: the message names the item (its
    # index path) and the key that would make it a segment, block or trace
    # entry, never "'segments' is a dict, expected a segment dict".
    def without(where, key):
        d = good_snapshot()
        d["segments"].append(dict(d["segments"][0], address=A0 + 64 * MiB))
        item = {"segment": lambda: d["segments"][1],
                "block": lambda: d["segments"][0]["blocks"][1],
                "entry": lambda: d["device_traces"][0][1]}[where]()
        del item[key]
        return pickle.dumps(d, protocol=4)
    cases += [
        ("segment without blocks", without("segment", "blocks"),
         "segments[1] is a dict without 'blocks', expected a segment dict"),
        ("block without state", without("block", "state"),
         "blocks[1] is a dict without 'state', expected a block dict"),
        ("entry without action", without("entry", "action"),
         "device_traces[0][1] is a dict without 'action', expected a "
         "trace entry dict"),
        ("list of ints", pickle.dumps([1, 2]),
         "segments[0] is an int, expected a segment dict"),
        # the type of a value or an item, with its article (or none)
        ("segments None", pickle.dumps({"segments": None,
                                        "device_traces": []}),
         "'segments' is None, expected a list of segment dicts"),
        ("segment None", pickle.dumps({"segments": [None],
                                       "device_traces": []}),
         "segments[0] is None, expected a segment dict"),
        ("entry float", pickle.dumps({"segments": [],
                                      "device_traces": [[1.5]]}),
         "device_traces[0][0] is a float, expected a trace entry dict"),
        ("total_size str", pickle.dumps({"segments": [
            dict(good_snapshot()["segments"][0], total_size="20M")],
            "device_traces": []}),
         "'total_size' is a str, expected an int"),
        ("addr None", pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": None, "size": 8}]]}),
         "'addr' is None, expected an int"),
        ("size list", pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 0, "size": [8]}]]}),
         "'size' is a list, expected an int"),
        # a frames list of dicts that are no frames: the frame named
        # with the keys it lacks, never "'frames' is a list"
        ("frame with name only", pickle.dumps({"segments": [],
            "device_traces": [[{"action": "alloc", "addr": 0, "size": 8,
                                "frames": [{"name": "x"}]}]]}),
         "frames[0] is a dict without 'filename' and 'line', expected a "
         "frame dict (one with 'filename', or 'name' and 'line')"),
        ("empty frame", pickle.dumps({"segments": [
            dict(good_snapshot()["segments"][0], frames=[
                {"name": "f", "filename": "a.py", "line": 1}, {}])],
            "device_traces": []}),
         "frames[1] is a dict without 'name', 'filename' and 'line', "
         "expected a frame dict"),
        ("frame int", pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 0, "size": 8, "frames": [3]}]]}),
         "frames[0] is an int, expected a frame dict"),
        # keys every PyTorch version writes: refused, never read as 0
        ("segment without total_size", without("segment", "total_size"),
         "a segment dict without 'total_size'"),
        ("segment without device", without("segment", "device"),
         "a segment dict without 'device'"),
        ("segment without active_size", without("segment", "active_size"),
         "a segment dict without 'active_size'"),
        ("block without size", without("block", "size"),
         "a block dict without 'size'"),
    ]
    for name, data, want in cases:
        p = write_bytes(data, "wrong-" + name.replace(" ", "-"))
        for cmd in (["check"], ["summary"], ["convert", "-o", path("w.out")]):
            rc, out, err = run(*(cmd + [p]))
            expect(rc == 2 and want in err and p in err,
                   "%s on %s: says %r (%r)" % (cmd[0], name, want,
                                              err.strip()[-200:]))


def crafted_invalid_utf8():
    """A snapshot whose frame strings hold raw invalid UTF-8 (\\xff\\xfe,
    a cut sequence) -- no CPython str can hold them, so the pickle is
    patched: SHORT_BINUNICODE lengths stay right."""
    fr = [frame("nameAAAA", "/x/fileBBBB.py", 3)]
    data = pickle.dumps(good_snapshot(fr), protocol=4)
    data = data.replace(b"AAAA", b"\xff\xfe\xe2\x82").replace(
        b"BBBB", b"\xed\xa0\x80!")
    return data


def group_utf8():
    p = write_bytes(crafted_invalid_utf8(), "invalid-utf8.pickle")
    want_name = b"name\xff\xfe\xe2\x82".decode("utf-8", "replace")
    # (ED A0 80 is an encoded surrogate, '\ud800' to pickle.load: one
    # code point, one U+FFFD -- bytes.decode would give three)
    want_file = "/x/file\ufffd!.py"
    rc, out, err = run("check", p)
    expect(rc == 1 and "strings:" in out and "not valid UTF-8" in out,
           "check reports invalid UTF-8 (%d %r)" % (rc, out))
    sur = pickle.dumps(good_snapshot([frame("f\ud800", "/y/\udcff.py", 1)]),
                       protocol=4)
    ps = write_bytes(sur, "surrogates.pickle")
    rc, out, err = run("check", ps)
    expect(rc == 1 and "not valid UTF-8" in out,
           "check reports lone surrogates (%d %r)" % (rc, out))
    files = [p, ps]
    if os.path.isdir(REAL):
        files += real_files()
    else:
        print("SKIP real inputs in the utf8 group: %s is missing" % REAL)
    for f in files:
        name = os.path.basename(f)
        out_p = path(name + ".conv.pickle")
        rc, o, err = run("convert", f, "-o", out_p)
        ok = rc == 0
        if ok:
            try:
                with open(out_p, "rb") as fh:
                    d = pickle.load(fh)
            except Exception as e:
                ok = False
                print("  pickle.load: %r" % e)
        expect(ok, "convert %s: CPython's pickle loads it" % name)
        out_j = path(name + ".json")
        rc, o, err = run("convert", "--json", f, "-o", out_j)
        ok = rc == 0
        if ok:
            try:
                with open(out_j, "rb") as fh:
                    j = json.loads(fh.read().decode("utf-8", "strict"))
            except Exception as e:
                ok = False
                print("  json.loads: %r" % e)
        expect(ok, "convert --json %s: strict UTF-8, json.loads accepts it"
               % name)
        if f == p and ok:
            fr = d["segments"][0]["frames"][0]
            expect(fr["name"] == want_name and fr["filename"] == want_file,
                   "the repaired strings are CPython's decode('utf-8', "
                   "'replace') (%r %r)" % (fr["name"], fr["filename"]))
            jf = j["frame_table"][j["stack_table"][
                j["segments"][0]["frames"]][0]]
            expect(jf["name"] == want_name, "JSON holds the same text")
    lone_surrogates()


def lone_surrogates():
    """A lone surrogate of a Python str ('a\\udc80b', as a frame name
    may hold one) becomes one U+FFFD per code point in convert's pickle
    and JSON, the same length as the str -- Python's json module reads
    the JSON strictly and gets what json.dumps/loads give for the str
    with each surrogate replaced."""
    fr = frame("a\udc80b", "/y/\ud800\udfff.py", 7)

    def policy(x):
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c
                       for c in x)
    want = json.loads(json.dumps({k: policy(v) if isinstance(v, str) else v
                                  for k, v in fr.items()}))
    p = write_bytes(pickle.dumps(good_snapshot([fr]), protocol=4),
                    "lone-surrogate.pickle")
    out_p, out_j = path("lone.conv.pickle"), path("lone.json")
    rc, o, err = run("convert", p, "-o", out_p)
    got = None
    if rc == 0:
        with open(out_p, "rb") as fh:
            got = pickle.load(fh)["segments"][0]["frames"][0]
    expect(got == want and got["name"] == "a\ufffdb" and
           len(got["filename"]) == len(fr["filename"]),
           "convert: a lone surrogate is one U+FFFD (%r)" % (got,))
    rc, o, err = run("convert", "--json", p, "-o", out_j)
    got = None
    if rc == 0:
        with open(out_j, "rb") as fh:
            j = json.loads(fh.read().decode("utf-8", "strict"))
        got = j["frame_table"][j["stack_table"][j["segments"][0]["frames"]][0]]
    expect(got == want,
           "convert --json: a lone surrogate is one U+FFFD, as Python's json "
           "module reads it (%r %r)" % (got, want))


def shared_frames_file():
    """~400 kB: 3000 entries whose 250-frame stacks are shared through the
    memo (a handful of stack objects); written inline, each entry would
    repeat 250 frame dicts."""
    stacks = [[frame("f%d_%d" % (s, i), "/m/layer%d.py" % i, i)
               for i in range(250)] for s in range(4)]
    t = 1700000000000000
    trace = []
    for i in range(1500):
        st = stacks[i % 4]
        trace.append({"action": "alloc", "addr": A0 + 4 * MiB + 512 * i,
                      "size": 512, "stream": 0, "time_us": t + 2 * i,
                      "frames": st})
        trace.append({"action": "free_requested",
                      "addr": A0 + 4 * MiB + 512 * i, "size": 512,
                      "stream": 0, "time_us": t + 2 * i + 1, "frames": st})
    snap = good_snapshot()
    snap["device_traces"][0] += trace
    return pickle.dumps(snap, protocol=4)


def group_amplify():
    seg = dict(good_snapshot()["segments"][0], device=200000000)
    small = write_bytes(pickle.dumps({"segments": [seg],
                                      "device_traces": [[]]}, protocol=4),
                        "device-200M.pickle")
    expect(os.path.getsize(small) < 2048, "the huge-device file is < 2 kB")
    for cmd in (["check"], ["summary"], ["convert", "-o", path("d.out")],
                ["convert", "--json", "-o", path("d.json")], ["replay"],
                ["plot", "-o", path("d.svg")], ["view", "-o", path("d.html")],
                ["diff", small]):
        rc, out, err, secs, rss = measured(*(cmd + [small]))
        expect(rc == 2 and "device 200000000 is not a device index" in err
               and rss <= 256 * MiB,
               "%s: the same clear error, RSS %.1f MB (%r)" %
               (cmd[0], rss / 1e6, err.strip()[-140:]))
    data = shared_frames_file()
    sf = write_bytes(data, "shared-frames.pickle")
    size = len(data)
    for fmt in (["--json"], []):
        out_p = path("sf.out")
        rc, out, err, secs, rss = measured("convert", *fmt, sf, "-o", out_p)
        osize = os.path.getsize(out_p) if rc == 0 else 0
        expect(rc == 0 and osize <= 4 * size and rss <= 256 * MiB,
               "convert %s of a %d kB shared-frames file: %d kB out "
               "(<= 4x), RSS %.1f MB" % (" ".join(fmt) or "(pickle)",
                                         size // 1000, osize // 1000,
                                         rss / 1e6))
    with open(path("sf.out"), "rb") as f:
        conv = pickle.load(f)
    rc, out, err = run("convert", "--json", sf, "-o", path("sf.json"))
    with open(path("sf.json")) as f:
        j = json.load(f)
    F, S = j["frame_table"], j["stack_table"]
    e = j["device_traces"][0][5]
    expect([F[i] for i in S[e["frames"]]] ==
           conv["device_traces"][0][5]["frames"],
           "JSON frames resolve through stack_table/frame_table to the "
           "pickle's frames")
    expect(len(set(x["frames"] for x in j["device_traces"][0][2:])) == 4,
           "the four shared stacks are four stack ids")
    # 400 frames (distinct lines) sharing one 1 MiB file name: 1 MB of
    # gzip, 400 MB of JSON (a pickle stores the name once): refused before
    # anything is written, the pickle output still made
    big = "F" * (1 << 20)
    entries = [{"action": "alloc", "addr": 4096 * (i + 1), "size": 512,
                "stream": 0, "frames": [{"filename": big, "line": i,
                                         "name": "n"}]} for i in range(400)]
    shared = write_bytes(gzip.compress(pickle.dumps(
        {"segments": [], "device_traces": [entries]}, protocol=4), 6),
        "shared-name.pickle.gz")
    out_j = path("shared-name.json")
    rc, out, err, secs, rss = measured("convert", "--json", shared, "-o", out_j)
    expect(rc == 2 and "MSNAP_ELIMIT" in err and "write a pickle" in err
           and not os.path.exists(out_j) and rss <= 256 * MiB,
           "convert --json of 400 frames sharing a 1 MiB name: refused, "
           "nothing written, RSS %.1f MB (%r)" % (rss / 1e6, err.strip()[-200:]))
    rc, out, err = run("convert", shared, "-o", path("shared-name.pickle"))
    expect(rc == 0 and os.path.getsize(path("shared-name.pickle")) < 4 * MiB,
           "the same file as a pickle: written, the name stored once (%d %r)"
           % (rc, err.strip()[-160:]))
    # One 1 MiB string referred to 100 000 times through the memo (1.2 MB
    # of pickle, 1.6 kB of gzip): 100 GiB once expanded.  In
    # allocator_settings or process_info (generic values: every command
    # writes them in full) the reader refuses it; as the name of 100 000
    # annotations, convert --json does (a pickle keeps it once).
    def memo_string_file(where):
        s = "A" * (1 << 20)
        if where == "annotations":
            ann = [{"stage": "START", "name": s, "device": 0,
                    "time_us": i} for i in range(100000)]
            d = {"segments": [], "device_traces": [[]],
                 "external_annotations": ann}
        else:
            d = {"segments": [], "device_traces": [[]], where: {"x": [s] * 100000}}
        return write_bytes(gzip.compress(pickle.dumps(d, protocol=4), 9),
                           "memo-string-%s.pickle.gz" % where)
    for where in ("allocator_settings", "process_info"):
        f = memo_string_file(where)
        for cmd in (["summary"], ["summary", "--json"],
                    ["view", "-o", path("ms.html")],
                    ["convert", "--json", "-o", path("ms.json")]):
            rc, out, err, secs, rss = measured(*(cmd + [f]))
            expect(rc == 2 and "MSNAP_ELIMIT" in err and
                   "shared through the memo" in err and rss <= 256 * MiB and
                   len(out) < 1 * MiB and not os.path.exists(path("ms.json")),
                   "%s of a 1 MiB string shared 100 000 times in %s: "
                   "refused, RSS %.1f MB, %d B out (%r)"
                   % (" ".join(cmd[:2]), where, rss / 1e6, len(out),
                      err.strip()[-200:]))
    # A long setting (a 1 MiB string, a list of 100 000 ints) is cut in
    # summary's text after 512 characters, saying how long it was; the
    # JSON keeps it whole
    ls = write_bytes(pickle.dumps({"segments": [], "device_traces": [[]],
                                   "allocator_settings": {
                                       "PYTORCH_CUDA_ALLOC_CONF": "x" * MiB,
                                       "lst": list(range(100000))}},
                                  protocol=4), "long-setting.pickle")
    rc, out, err = run("summary", ls)
    lines = out.splitlines()
    expect(rc == 0 and len(out) < 4096 and
           any(ln.endswith("... (1048576 bytes)") for ln in lines) and
           any(ln.endswith("... (100000 items)") for ln in lines),
           "summary of a 1 MiB setting and a 100 000-item one: each cut, "
           "its length said (%d B of text)" % len(out))
    rc, out, err = run("summary", "--json", ls)
    js = json.loads(out) if rc == 0 else {}
    expect(len(js.get("allocator_settings", {}).get(
        "PYTORCH_CUDA_ALLOC_CONF", "")) == MiB,
        "summary --json keeps the setting whole")
    f = memo_string_file("annotations")
    rc, out, err, secs, rss = measured("convert", "--json", f, "-o",
                                       path("ma.json"))
    expect(rc == 2 and "MSNAP_ELIMIT" in err and "write a pickle" in err and
           not os.path.exists(path("ma.json")) and rss <= 256 * MiB,
           "convert --json of 100 000 annotations named by one 1 MiB "
           "string: refused, nothing written (%r)" % err.strip()[-200:])


def asan_build():
    """True when the memsnap binary is built with AddressSanitizer (make
    test-sanitize): its shadow memory and its quarantine of freed memory
    (256 MB by default) add to every peak RSS."""
    try:
        with open(MEMSNAP, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


ASAN = asan_build()


def hostile_refused(name, data, says, max_rss=64 * MiB, gz=False):
    """A hostile pickle is refused with a clear MSNAP_ELIMIT naming the
    limit, within max_rss of memory (under AddressSanitizer: 3x that, plus
    its 256 MB quarantine)."""
    if ASAN:
        max_rss = 3 * max_rss + 256 * MiB
    f = write_bytes(gzip.compress(data, 6) if gz else data, name)
    rc, out, err, secs, rss = measured("summary", "--json", f)
    expect(rc == 2 and says in err and "MSNAP_ELIMIT" in err
           and "offset " in err and rss <= max_rss,
           "%s (%d MB of pickle): refused, says %r, RSS %.1f MB (%r)" %
           (name, len(data) // 1000000, says, rss / 1e6,
            err.strip()[-160:]))


def group_bounds():
    # items pushed without a MARK, or 10 M under one MARK: the stack is
    # bounded (MSNAP_PICKLE_MAX_STACK, 2^20 items)
    hostile_refused("nones.pickle.gz", b"\x80\x04" + b"N" * 50000000
                    + b".", "more than 1048576 items on the stack", gz=True)
    # (empty lists: each a container, the pool's bound comes first)
    hostile_refused("emptylists.pickle.gz", b"\x80\x04" + b"]" * 50000000
                    + b".", "live containers", gz=True)
    junk = (b"\x80\x02}(X\x08\x00\x00\x00segments]X\r\x00\x00\x00"
            b"device_traces]X\x04\x00\x00\x00junk(" + b"K\x01" * 10000000
            + b"lu.")
    hostile_refused("biglist-junk.pickle", junk, "items on the stack")
    # lists made and dropped: the pool of live containers is bounded by
    # the input (MSNAP_PICKLE_POOL_FREE, then one per 8 bytes)
    hostile_refused("pop.pickle", b"\x80\x04" + b"]0" * 10000000 + b"N.",
                    "live containers")
    hostile_refused("memoput.pickle", b"\x80\x04" + b"]q\x000" * 5000000
                    + b"N.", "live containers")
    # a list shared through the memo, doubling per level: generic values
    # are bounded by the input (one per byte, at least 64 Ki), for
    # allocator_settings and process_info together
    for key, levels in (("allocator_settings", 22), ("process_info", 16)):
        x = [1]
        for _ in range(levels):
            x = [x, x]
        data = pickle.dumps({"segments": [], "device_traces": [[]],
                             key: {"a": x}}, protocol=4)
        expect(len(data) < 1000, "the %s DAG is < 1 kB" % key)
        hostile_refused("dag-%s.pickle" % key, data,
                        "value too large to convert", max_rss=32 * MiB)
    half = [1]
    for _ in range(14):  # 49 Ki values each: together over 64 Ki
        half = [half, half]
    data = pickle.dumps({"segments": [], "device_traces": [[]],
                         "allocator_settings": {"a": half},
                         "process_info": {"a": half}}, protocol=4)
    hostile_refused("dag-both.pickle", data, "value too large to convert",
                    max_rss=32 * MiB)
    hostile_refused("dag-both.pickle", data, "while converting process_info",
                    max_rss=32 * MiB)
    # one trace entry dict listed 5 M times through the memo, batched by
    # 1000 as a pickler would: at most 1024 + 1 per 8 bytes repeats
    e = {"action": "alloc", "addr": A0, "size": 512, "stream": 0,
         "frames": []}
    hostile_refused("tracebomb.pickle", pickle.dumps(
        {"segments": [], "device_traces": [[e] * 5000000]}, protocol=2),
        "trace lists repeat entries", max_rss=96 * MiB)
    # one block dict listed 1 M times through the memo (as torch would
    # pickle `blocks = [b] * N`), and one 2.0 history entry: the same
    # bound as trace entries (1024 + 1 per 8 bytes repeats), checked as
    # the list is converted, before any block is copied (5 M: 1 GB)
    b = {"address": A0, "size": 512, "requested_size": 512,
         "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": A0, "total_size": 512 << 20,
           "allocated_size": 512, "active_size": 512, "stream": 0,
           "segment_type": "large", "blocks": [b] * 1000000}
    hostile_refused("blockbomb.pickle", pickle.dumps(
        {"segments": [seg], "device_traces": [[]]}, protocol=4),
        "block lists repeat blocks", max_rss=48 * MiB)
    h = {"addr": A0, "real_size": 512, "frames": []}
    seg20 = {"device": 0, "address": A0, "total_size": 2 << 20,
             "allocated_size": 512, "active_size": 512, "stream": 0,
             "blocks": [{"size": 512, "state": "active_allocated",
                         "history": [h] * 1000000}]}
    hostile_refused("histbomb.pickle", pickle.dumps(
        {"segments": [seg20]}, protocol=4),
        "history lists repeat entries", max_rss=48 * MiB)
    # one list of 1000 history entries taken by 20000 blocks: 20 M
    # entries written for 300 kB
    hl = [{"addr": A0 + i, "real_size": 512, "frames": []}
          for i in range(1000)]
    seg20["blocks"] = [{"size": 512, "state": "inactive", "history": hl}
                       for _ in range(20000)]
    hostile_refused("histshared.pickle", pickle.dumps(
        {"segments": [seg20]}, protocol=4),
        "history lists repeat entries", max_rss=48 * MiB)
    # 20 M Nones batched by 1000 per MARK (as a pickler writes a list),
    # 60 kB of gzip, under a key the reader ignores or in
    # allocator_settings: the items held by open containers have the
    # budget of generic values (one per byte, at most 16 Mi, 8 bytes
    # each), checked as a container grows (was 1.6 GB for 200 M; in
    # allocator_settings refused only once converted, 3.1 GB)
    nones = b"]" + (b"(" + b"N" * 1000 + b"e") * 20000
    for key in ("junk", "allocator_settings"):
        data = (b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]"
                + b"\x8c" + bytes([len(key)]) + key.encode() + nones
                + b"u.")
        hostile_refused("nones-%s.pickle.gz" % key, data,
                        "items held in containers", max_rss=192 * MiB,
                        gz=True)
    rc, out, err, secs, rss = measured("summary", "--json",
                                       path("nones-allocator_settings"
                                            ".pickle.gz"))
    expect("memo" not in err, "a flat list is not said to be shared "
           "through the memo (%r)" % err.strip()[-160:])
    # 16 M floats in allocator_settings (300 kB of gzip), and as many ints
    # wider than 61 bits (LONG1 of 8 and 9 bytes): each number a 24-byte
    # box kept to the end of the read, which counts in the same budget by
    # its bytes (3 items, and an int's bytes past 64 bits) -- they were
    # all held, boxed and converted: 858 MB at the peak, where 16 M Nones
    # peak at 490 MB.  And 20 M floats pushed and dropped (POP): boxes
    # made for nothing, never freed (480 MB), refused the same way.
    numbers = [("floats", b"G\x3f\xf0\x00\x00\x00\x00\x00\x01"),
               ("wideints", b"\x8a\x08" + b"\x00" * 7 + b"\x70"),
               ("bigints", b"\x8a\x09" + b"\x00" * 8 + b"\x01")]
    for what, item in numbers:
        data = (b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]"
                b"\x8c\x12allocator_settings]"
                + (b"(" + item * 1000 + b"e") * 16000 + b"u.")
        hostile_refused("%s16m-allocator_settings.pickle.gz" % what, data,
                        "numbers boxed", max_rss=192 * MiB, gz=True)
    dropped = b"\x80\x04" + (numbers[0][1] + b"0") * 20000000 + b"N."
    hostile_refused("floats-dropped.pickle.gz", dropped, "numbers boxed",
                    max_rss=192 * MiB, gz=True)
    # a real amount of numbers is read: 1 M floats and wide ints, with
    # their values
    vals = {"f": [i + 0.5 for i in range(500000)],
            "w": [(1 << 62) + i for i in range(500000)]}
    f = write_bytes(pickle.dumps({"segments": [], "device_traces": [[]],
                                  "allocator_settings": vals}, protocol=4),
                    "numbers-1m.pickle")
    rc, out, err = run("convert", "--json", f, "-o", path("numbers.json"))
    with open(path("numbers.json")) as jf:
        expect(rc == 0 and json.load(jf)["allocator_settings"] == vals,
               "1 M boxed numbers in allocator_settings read back (%r)"
               % err.strip()[-160:])
    # out of memory while reading (4 M floats in allocator_settings, the
    # address space limited to 128 MiB): named as every reader error, with
    # the file, the offset and the code (not under AddressSanitizer, whose
    # shadow memory needs the address space, nor under an emulator)
    if not ASAN and not WRAPPER:
        key = b"allocator_settings"
        data = (b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]"
                + b"\x8c" + bytes([len(key)]) + key + b"]"
                + (b"(" + b"G\x3f\xf0\x00\x00\x00\x00\x00\x01" * 1000
                   + b"e") * 4000 + b"u.")
        f = write_bytes(gzip.compress(data, 6), "floats-4m.pickle.gz")

        def limit_as():
            resource.setrlimit(resource.RLIMIT_AS, (128 * MiB, 128 * MiB))
        p = subprocess.run([MEMSNAP, "summary", "--json", f],
                           capture_output=True, preexec_fn=limit_as,
                           timeout=120)
        err = p.stderr.decode("utf-8", "replace")
        expect(p.returncode == 2 and f + ": offset " in err
               and "out of memory (while " in err and "[MSNAP_ENOMEM]" in err,
               "out of memory while reading names the file, the offset and "
               "the code (%r)" % err.strip()[-200:])
    # 1 M segments at one address (one segment dict listed again through
    # the memo, as 'segments' may) and a trace entry: the final state of
    # the backward replay is sorted once, O(n log n); inserting each
    # segment in turn moved every one after it (200 K segments: 11 s; 1 M
    # would pass the helper's 60 s timeout)
    seg = {"device": 0, "address": A0, "total_size": 2 << 20,
           "allocated_size": 0, "active_size": 0, "stream": 0,
           "segment_type": "large", "blocks": []}
    snap = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}
    f = write_bytes(pickle.dumps({"segments": [seg] * 1000000,
                                  "device_traces": [[snap]]}, protocol=4),
                    "segsameaddr.pickle")
    rc, out, err, secs, rss = measured("summary", "--json", f)
    lim = 3 * 256 * MiB + 256 * MiB if ASAN else 256 * MiB
    expect(rc == 0 and json.loads(out)["devices"][0]["segments"] == 1000000
           and rss <= lim,
           "1 M segments at one address: read and summarized, RSS %.1f MB "
           "(rc %d, %r)" % (rss / 1e6, rc, err.strip()[-160:]))
    # 400 K segment_free entries at increasing addresses (12 MB): undone
    # from the newest, each segment goes before all the others; the walk's
    # segments are a treap (an insert into the sorted array moved them
    # all: 100 K took 4 s, 400 K would pass the helper's 60 s timeout)
    tr = [{"action": "segment_free", "addr": A0 + i * (2 << 20),
           "size": 2 << 20, "stream": 0} for i in range(400000)]
    f = write_bytes(pickle.dumps({"segments": [], "device_traces": [tr]},
                                 protocol=4), "segfree.pickle")
    rc, out, err, secs, rss = measured("summary", "--json", f)
    expect(rc == 0 and json.loads(out)["devices"][0]["trace_entries"]
           == 400000 and rss <= lim,
           "400 K segment_free entries: replayed, RSS %.1f MB (rc %d, %r)"
           % (rss / 1e6, rc, err.strip()[-160:]))
    # what a real file holds, as large as the budget allows, reads
    big = {"k%d" % i: [i, "v%d" % i] for i in range(20000)}
    f = write_bytes(pickle.dumps({"segments": [], "device_traces": [[]],
                                  "allocator_settings": big}, protocol=4),
                    "big-settings.pickle")
    rc, out, err = run("convert", "--json", f, "-o", path("bs.json"))
    with open(path("bs.json")) as jf:
        expect(rc == 0 and json.load(jf)["allocator_settings"] == big,
               "20000 distinct allocator_settings read back (%r)" %
               err.strip()[-160:])


GROUPS = {"special": group_special, "compressed": group_compressed,
          "wrong": group_wrong, "utf8": group_utf8,
          "amplify": group_amplify, "bounds": group_bounds}

if __name__ == "__main__":
    GROUPS[GROUP]()
    finish()
