#!/usr/bin/env python3
"""Where `memsnap ... -o OUT` writes, run by meson: test_outputs.py MEMSNAP
GROUP (the helpers are test_cli.py's).

Groups:
  links   the kernel's protected_symlinks rule for every command with -o
          (convert, view, plot, replay, demo-train): a link planted by
          `nobody` in a sticky world-writable directory is refused with
          exit 2 and the victim file is unchanged; a link of the user's own
          is followed, the link survives and the target keeps its mode
          (0600 stays 0600); a link in the middle of the path is held to
          the same rule.  Planting needs root (lchown): SKIP without it.
  stdout  `-o /dev/stdout` (and `-o -`) into a pipe and into a redirected file, for
          convert, view and plot: the reader gets the whole output.
  temps   temporaries that killed writers left ("<name>.tmp.<tag>.<pid>.
          <n>", tag computed here independently) are removed by the next
          `-o` into the directory; live pids, other hosts' tags, the old
          form, links and other users' files are not.
  failed  a write that fails (-o /dev/full, a missing directory, a path
          ending in '/' where nothing or a file is) for every command with
          -o: exit 2, one line naming OUT, nothing written; a path refused
          by itself before any work (no report), /dev/full at the write
          (the --json report says "output": null with the reason in
          "output_error").
"""
import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import test_cli as T  # noqa: E402  (run, expect, TMP, good_snapshot, ...)
from tmptag import tmp_tag  # noqa: E402

NOBODY = 65534
SECRET = b"the user's own secret"


def snapshot_input():
    T.need(T.reader_available(), "the reader")
    return T.write_pickle(T.good_snapshot(), "in.pickle")


def sticky_dir(name):
    d = os.path.join(T.TMP, name)
    os.mkdir(d)
    os.chmod(d, 0o1777)
    return d


def victim(name, mode=0o600):
    v = os.path.join(T.TMP, name)
    with open(v, "wb") as f:
        f.write(SECRET)
    os.chmod(v, mode)
    return v


def untouched(v, mode=0o600):
    with open(v, "rb") as f:
        data = f.read()
    return data == SECRET and stat.S_IMODE(os.stat(v).st_mode) == mode


def commands(src):
    """(name, argv before -o OUT, a check of the written bytes)."""
    cmds = [("convert", ["convert", src], lambda b: b[:2] == b"\x80\x04"),
            ("convert --json", ["convert", "--json", src],
             lambda b: b.lstrip()[:1] == b"{"),
            ("view", ["view", src], lambda b: b"<html" in b[:400].lower()),
            ("plot", ["plot", src], lambda b: b"<svg" in b[:400])]
    if T.allocator_available():
        cmds.append(("demo-train", ["demo-train", "--steps", "1",
                                    "--layers", "1"],
                     lambda b: b[:2] == b"\x80\x04"))
        train = os.path.join(T.TMP, "train.pickle")
        rc, _, err = T.run("demo-train", "--steps", "2", "--layers", "1",
                           "-o", train)
        T.need(rc == 0, "demo-train for replay (%r)" % err)
        cmds.append(("replay", ["replay", "--profile", "cuda", train],
                     lambda b: b[:2] == b"\x80\x04"))
    return cmds


def group_links():
    src = snapshot_input()
    cmds = commands(src)
    if os.geteuid() != 0:
        print("SKIP planted links: a link owned by another user needs root "
              "(lchown); only the own-link cases run")
    for name, argv, ok in cmds:
        tag = name.replace(" ", "").replace("--", "-")
        d = sticky_dir("sticky" + tag)
        # own link: followed, mode kept, the link survives
        v = victim("own" + tag)
        link = os.path.join(d, "mine.out")
        os.symlink(v, link)
        rc, out, err = T.run(*argv, "-o", link)
        with open(v, "rb") as f:
            data = f.read()
        T.expect(rc == 0 and os.path.islink(link) and ok(data) and
                 stat.S_IMODE(os.stat(v).st_mode) == 0o600,
                 "%s -o OWN-LINK: followed, 0600 kept (%d %r)" % (name, rc, err))
        if os.geteuid() != 0:
            continue
        # planted link: refused, victim unchanged, nothing created
        v = victim("victim" + tag)
        link = os.path.join(d, "planted.out")
        os.symlink(v, link)
        os.lchown(link, NOBODY, NOBODY)
        before = sorted(os.listdir(d))
        rc, out, err = T.run(*argv, "-o", link)
        T.expect(rc == 2 and "protected_symlinks" in err and "uid 65534" in err
                 and untouched(v) and sorted(os.listdir(d)) == before,
                 "%s -o PLANTED-LINK: refused, victim unchanged (%d %r)"
                 % (name, rc, err))
        # a regular file planted under the name by another user: not
        # replaced, even by root (the kernel's protected_regular rule)
        planted = os.path.join(d, "planted-file.out")
        with open(planted, "wb") as f:
            f.write(SECRET)
        os.chmod(planted, 0o666)
        os.chown(planted, NOBODY, NOBODY)
        rc, out, err = T.run(*argv, "-o", planted)
        T.expect(rc == 2 and "protected_regular" in err and "uid 65534" in err
                 and open(planted, "rb").read() == SECRET
                 and os.stat(planted).st_uid == NOBODY,
                 "%s -o PLANTED-FILE: refused, file unchanged (%d %r)"
                 % (name, rc, err))
        # a planted link to a directory, in the middle of the path
        v = victim("victim-mid" + tag)
        mid = os.path.join(d, "dirlink")
        os.symlink(T.TMP, mid)
        os.lchown(mid, NOBODY, NOBODY)
        rc, out, err = T.run(*argv, "-o", os.path.join(mid, os.path.basename(v)))
        T.expect(rc == 2 and "protected_symlinks" in err and untouched(v),
                 "%s -o PLANTED-DIR-LINK/x: refused (%d %r)" % (name, rc, err))
        # the same link in a directory that is not sticky: followed
        # (the rule is the kernel's, no stricter)
        plain = os.path.join(T.TMP, "plain" + tag)
        os.mkdir(plain)
        os.chmod(plain, 0o777)
        v = victim("victim-plain" + tag)
        link = os.path.join(plain, "l.out")
        os.symlink(v, link)
        os.lchown(link, NOBODY, NOBODY)
        rc, out, err = T.run(*argv, "-o", link)
        with open(v, "rb") as f:
            data = f.read()
        T.expect(rc == 0 and ok(data),
                 "%s -o LINK in a non-sticky dir: followed (%d %r)"
                 % (name, rc, err))


def group_stdout():
    src = snapshot_input()
    for name, argv, ok in commands(src)[:4]:
        p = subprocess.Popen(T.WRAPPER + [T.MEMSNAP] + argv + ["-o", "/dev/stdout"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        data, err = p.communicate(timeout=300)
        T.expect(p.returncode == 0 and ok(data) and b"dangling" not in err,
                 "%s -o /dev/stdout into a pipe (%d %r)"
                 % (name, p.returncode, err[-300:]))
        if name == "convert":
            T.expect(pickle.loads(data)["segments"],
                     "convert -o /dev/stdout: the pipe holds the whole pickle")
        out = os.path.join(T.TMP, "redirected.out")
        with open(out, "wb") as f:
            p = subprocess.run(T.WRAPPER + [T.MEMSNAP] + argv + ["-o", "/dev/stdout"],
                               stdout=f, stderr=subprocess.PIPE)
        with open(out, "rb") as f:
            data2 = f.read()
        T.expect(p.returncode == 0 and data2 == data,
                 "%s -o /dev/stdout > FILE (%d %r)" % (name, p.returncode, p.stderr))
        # "-o -" is standard output too, and writes no file named "-"
        p = subprocess.run(T.WRAPPER + [T.MEMSNAP] + argv + ["-o", "-"],
                           capture_output=True, cwd=T.TMP)
        T.expect(p.returncode == 0 and p.stdout == data and
                 not os.path.exists(os.path.join(T.TMP, "-")),
                 "%s -o - writes to standard output (%d %r)"
                 % (name, p.returncode, p.stderr[-300:]))
    # replay prints a report: with the file on standard output the report
    # (here --json) goes to standard error, so each stream decodes alone
    if T.allocator_available():
        train = os.path.join(T.TMP, "train-stdout.pickle")
        rc, _, err = T.run("demo-train", "--steps", "2", "--layers", "1",
                           "-o", train)
        T.need(rc == 0, "demo-train for replay (%r)" % err)
        for o in ("-", "/dev/stdout"):
            p = subprocess.run(T.WRAPPER + [T.MEMSNAP, "replay", "--json",
                                            train, "-o", o],
                               capture_output=True)
            js = p.stderr[p.stderr.find(b"{"):]
            T.expect(p.returncode == 0 and
                     pickle.loads(p.stdout)["segments"] is not None and
                     json.loads(js)["replayable"] is True,
                     "replay --json -o %s: the pickle alone on stdout, the "
                     "JSON report on stderr (%d %r)"
                     % (o, p.returncode, p.stderr[-300:]))
    # --json names the output as given ("output" is OUT), never the
    # /dev/fd/N duplicate the file is written to; nor does any message
    for name, argv, ok in commands(src):
        if name.startswith("convert"):
            continue
        for o in ("-", "/dev/stdout"):
            p = subprocess.run(T.WRAPPER + [T.MEMSNAP, argv[0], "--json"] +
                               argv[1:] + ["-o", o], capture_output=True)
            js = p.stderr[p.stderr.find(b"{"):]
            j = json.loads(js) if p.returncode == 0 else {}
            T.expect(p.returncode == 0 and j.get("output") == o and
                     b"/dev/fd/" not in p.stderr,
                     "%s --json -o %s: \"output\" is %r as given (%d %r)"
                     % (name, o, o, p.returncode, p.stderr[-300:]))
    # a descriptor open only for reading: a clear error
    other = victim("stdin-file", 0o644)
    with open(other, "rb") as f:
        p = subprocess.run(T.WRAPPER + [T.MEMSNAP, "convert", src, "-o",
                                        "/dev/stdin"],
                           stdin=f, capture_output=True, text=True)
    T.expect(p.returncode == 2 and "not open for writing" in p.stderr,
             "convert -o /dev/stdin (read-only): refused (%d %r)"
             % (p.returncode, p.stderr))
    # standard output open only for reading (or closed): said of standard
    # output, not of the /dev/fd/N duplicate the write would use
    for o in ("-", "/dev/stdout"):
        for how, kw, said in (
                ("read-only", {"stdout": open(other, "rb")},
                 "open for reading only"),
                ("closed", {"stdout": subprocess.DEVNULL,
                            "preexec_fn": lambda: os.close(1)}, "closed")):
            p = subprocess.run(T.WRAPPER + [T.MEMSNAP, "convert", src, "-o",
                                            o], stderr=subprocess.PIPE,
                               text=True, **kw)
            if "stdout" in kw and hasattr(kw["stdout"], "close"):
                kw["stdout"].close()
            T.expect(p.returncode == 2 and p.stderr ==
                     "memsnap convert: cannot write standard output: it is "
                     "%s\n" % said,
                     "convert -o %s, standard output %s: named as standard "
                     "output (%d %r)" % (o, how, p.returncode, p.stderr))


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def group_temps():
    src = snapshot_input()
    tag = tmp_tag()
    d = os.path.join(T.TMP, "temps")
    os.mkdir(d)
    # A convert killed while writing leaves a temporary of the new form
    # (the input: a 2 MB recording of demo-train; --json makes ~14 MB).
    big = os.path.join(T.TMP, "big.pickle")
    if not T.allocator_available() or T.run(
            "demo-train", "--steps", "100", "--layers", "32", "--hidden", "64",
            "-o", big)[0] != 0:
        big = None
    killed = []
    if big is None:
        T.expect(False, "demo-train writes an input to kill convert on")
    else:
        for _ in range(20):
            p = subprocess.Popen(T.WRAPPER + [T.MEMSNAP, "convert", "--json", big,
                                              "-o", os.path.join(d, "big.json")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            mine = ".%d." % p.pid
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None:
                if any(mine in n for n in os.listdir(d)):
                    os.kill(p.pid, signal.SIGKILL)
                    break
                time.sleep(0.0005)
            p.wait()
            left = [n for n in os.listdir(d) if mine in n]
            if left:
                killed = left
                break
        T.expect(killed and killed[0].startswith("big.json.tmp.%s.%d."
                                                  % (tag, p.pid)),
                 "a killed convert left <name>.tmp.<tag>.<pid>.<n> (%r)" % killed)
    gone = dead_pid()
    remove = ["a.pickle.tmp.%s.%d.0" % (tag, gone),
              "b.html.tmp.%s.%d.12" % (tag, gone)] + killed
    other = "f" * 12 if tag != "f" * 12 else "e" * 12
    keep = ["live.tmp.%s.%d.0" % (tag, os.getpid()),
            "host.tmp.%s.%d.0" % (other, gone),
            "old.tmp.%d.0" % gone,
            "x.tmp.%s.%d.0~" % (tag, gone),
            "unrelated.pickle"]
    for n in remove + keep:
        if n not in killed:
            with open(os.path.join(d, n), "wb") as f:
                f.write(b"x")
    kept_target = victim("kept-by-link")
    os.symlink(kept_target, os.path.join(d, "l.tmp.%s.%d.1" % (tag, gone)))
    keep.append("l.tmp.%s.%d.1" % (tag, gone))
    if os.geteuid() == 0:
        n = "nobody.tmp.%s.%d.2" % (tag, gone)
        with open(os.path.join(d, n), "wb") as f:
            f.write(b"x")
        os.chown(os.path.join(d, n), NOBODY, NOBODY)
        keep.append(n)
    rc, out, err = T.run("convert", src, "-o", os.path.join(d, "next.pickle"))
    names = set(os.listdir(d))
    T.expect(rc == 0 and not (set(remove) & names),
             "the next -o removed the dead temporaries (%d %r %r)"
             % (rc, err, sorted(set(remove) & names)))
    T.expect(set(keep) <= names and untouched(kept_target),
             "and nothing else (%r)" % sorted(set(keep) - names))


def group_failed():
    """A write that fails: exit 2, one line on stderr naming OUT, nothing
    left behind, and a --json report that never claims the file: "output"
    null and "output_error" the line of stderr (a success gives the path
    and null)."""
    src = snapshot_input()
    here = os.path.join(T.TMP, "failed")
    os.mkdir(here)
    # (a directory on the way that is missing, or is a file, is named:
    # "No such file or directory" alone did not say which)
    targets = [("a directory that does not exist",
                os.path.join(here, "nodir", "sub", "x.out"),
                "the directory '%s' does not exist"
                % os.path.join(here, "nodir")),
               ("a file as a directory on the way",
                os.path.join(here, "afile", "x.out"),
                "'%s' is not a directory" % os.path.join(here, "afile")),
               ("a trailing '/' where nothing exists",
                os.path.join(here, "nodir2") + "/",
                "ends in '/', which names a directory, not a file (and "
                "there is no such directory)"),
               ("a trailing '/' after a file",
                os.path.join(here, "afile") + "/",
                "ends in '/', which names a directory, but it is not one")]
    with open(os.path.join(here, "afile"), "wb") as f:
        f.write(SECRET)
    if os.path.exists("/dev/full"):
        targets.append(("/dev/full", "/dev/full", "No space left on device"))
    else:
        print("SKIP -o /dev/full: no /dev/full here (the other targets ran)")
    json_cmds = ("view", "plot", "replay", "demo-train")
    for name, argv, _ok in commands(src):
        for what, out, reason in targets:
            rc, stdout, err = T.run(*(argv + ["-o", out]))
            lines = err.strip().splitlines()
            T.expect(rc == 2 and len(lines) == 1 and reason in err and
                     out in err and "it is a directory" not in err and
                     err.count("cannot write") <= 1 and
                     sorted(os.listdir(here)) == ["afile"] and
                     open(os.path.join(here, "afile"), "rb").read() == SECRET,
                     "%s -o %s: exit 2, one line, nothing written (%d %r)"
                     % (name, what, rc, err[-300:]))
            # What the path alone tells is refused before the command's
            # work (the shared pre-check, cli_check_output): no report,
            # the line names the command.  /dev/full fails at the write.
            upfront = out != "/dev/full"
            if upfront:
                T.expect(stdout == "" and
                         err.startswith("memsnap %s: " % argv[0]),
                         "%s -o %s: refused before the work, no report "
                         "(%r %r)" % (name, what, stdout[-200:], err[-200:]))
            if name not in json_cmds:
                continue
            if upfront:
                rc, stdout, err = T.run(*(argv[:1] + ["--json"] + argv[1:] +
                                          ["-o", out]))
                T.expect(rc == 2 and stdout == "" and reason in err,
                         "%s --json -o %s: refused before the work, no "
                         "report (%d %r)" % (name, what, rc, err[-200:]))
                continue
            jargv = argv[:1] + ["--json"] + argv[1:] + ["-o", out]
            rc, stdout, err = T.run(*jargv)
            try:
                j = json.loads(stdout)
            except ValueError:
                j = {}
            line = err.strip().splitlines()[-1] if err.strip() else ""
            T.expect(rc == 2 and j.get("output", "?") is None and
                     j.get("output_error") and reason in j["output_error"] and
                     line == "memsnap: " + j["output_error"],
                     "%s --json -o %s: exit 2, \"output\": null, "
                     "\"output_error\" is the stderr line (%d %r %r)"
                     % (name, what, rc, stdout[-300:], err[-200:]))
        if name in json_cmds:
            good = os.path.join(here, "ok.out")
            jargv = argv[:1] + ["--json"] + argv[1:] + ["-o", good]
            rc, stdout, err = T.run(*jargv)
            j = json.loads(stdout) if rc in (0, 1) else {}
            T.expect(rc == 0 and j.get("output") == good and
                     "output_error" in j and j["output_error"] is None and
                     os.path.getsize(good) > 0,
                     "%s --json -o OUT: \"output\" the path, "
                     "\"output_error\" null (%d %r)" % (name, rc, err[-200:]))
            os.unlink(good)
    # a full disk, worded alike by every command (cli_write_failed): the
    # path, what was being written, the system's reason and the error
    # code, as read errors carry theirs -- convert alone ended in
    # [MSNAP_ENOSPC]; demo-train said "writing '/dev/full' failed", the
    # others "cannot write: write failed: ..."
    if os.path.exists("/dev/full"):
        what = {"replay": " the replayed snapshot",
                "demo-train": " the snapshot"}
        for name, argv, _ok in commands(src):
            rc, stdout, err = T.run(*(argv + ["-o", "/dev/full"]))
            want = ("memsnap: /dev/full: cannot write%s: No space left on "
                    "device [MSNAP_ENOSPC]\n" % what.get(name, ""))
            T.expect(rc == 2 and err == want,
                     "%s -o /dev/full: %r (%d %r)" % (name, want.strip(), rc,
                                                      err))
        # the report on standard output: the same line for every command
        for argv in (["summary", src], ["check", "--json", src],
                     ["convert", src, "-o", "-"]):
            with open("/dev/full", "w") as full:
                p = subprocess.run(T.WRAPPER + [T.MEMSNAP] + argv,
                                   stdout=full, stderr=subprocess.PIPE,
                                   text=True, timeout=300)
            T.expect(p.returncode == 2 and p.stderr ==
                     "memsnap: standard output: cannot write: No space left "
                     "on device [MSNAP_ENOSPC]\n",
                     "%s > /dev/full: the same line, 'standard output' "
                     "named (%d %r)" % (" ".join(argv[:1] + argv[2:]),
                                        p.returncode, p.stderr))
    else:
        print("SKIP the wording of a full disk: no /dev/full here")
    # "cannot write" once, the path once, at the write (/dev/full) and
    # before it (a dangling link: the library's own "cannot write '...'")
    dangling = os.path.join(T.TMP, "dangling.out")
    os.symlink(os.path.join(here, "nowhere", "x"), dangling)
    for name, argv, _ok in commands(src):
        for out in (dangling, "/dev/full"):
            if out == "/dev/full" and not os.path.exists(out):
                continue
            rc, stdout, err = T.run(*(argv + ["-o", out]))
            T.expect(rc == 2 and err.count("cannot write") == 1 and
                     err.count(out) == 1,
                     "%s -o %s: 'cannot write' and the path said once (%r)"
                     % (name, out, err.strip()))
    # a file that cannot be replaced (/proc/version: procfs accepts no new
    # file beside it), or a new name there: refused before the work (the
    # pre-check creates the temporary, as root too), the user's path
    # named, once, with the real reason -- not the temporary, not ENOENT's
    # "No such file or directory"
    if os.path.exists("/proc/version"):
        for name, argv, _ok in commands(src):
            for out, again in (("/proc/version", "cannot replace it: "),
                               ("/proc/memsnap-new.out", "")):
                rc, stdout, err = T.run(*(argv + ["-o", out]))
                T.expect(rc == 2 and stdout == "" and
                         err == "memsnap %s: cannot write '%s': %sits "
                         "directory is on a proc file system, where no new "
                         "file can be created\n" % (argv[0], out, again),
                         "%s -o %s: refused before the work, the user's "
                         "path named once with the reason, no temporary "
                         "(%d %r)" % (name, out, rc, err.strip()[-300:]))
    if os.geteuid() == 0:
        # a directory the user cannot write (as `nobody`): refused up
        # front too (root writes anywhere: only another user can show it)
        ro = os.path.join(here, "readonly")
        os.mkdir(ro, 0o755)
        os.chmod(here, 0o755)
        os.chmod(T.TMP, 0o755)
        out = os.path.join(ro, "x.out")
        p = subprocess.run(T.WRAPPER + [T.MEMSNAP, "convert", src, "-o", out],
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: (os.setgid(NOBODY),
                                               os.setuid(NOBODY)))
        T.expect(p.returncode == 2 and p.stdout == "" and
                 p.stderr == "memsnap convert: cannot write '%s': its "
                 "directory is not writable: Permission denied\n" % out and
                 os.listdir(ro) == [],
                 "convert -o a directory not writable (as nobody): refused "
                 "before the work (%d %r)" % (p.returncode, p.stderr))
    else:
        print("SKIP -o into a directory not writable: needs root to run as "
              "another user (the other targets ran)")
    if T.allocator_available():
        # replay without -o: no output and no error
        train = os.path.join(T.TMP, "train.pickle")
        rc, stdout, err = T.run("replay", "--json", train)
        j = json.loads(stdout)
        T.expect(rc == 0 and j["output"] is None and j["output_error"] is None,
                 "replay --json without -o: output and output_error null")

    closed_pipe()


def closed_pipe():
    """A reader that closes the pipe early (`| head -c 10`): SIGPIPE ends
    the command, as other Unix tools (docs/cli.md: status 141 in a shell,
    no message); with SIGPIPE ignored, the write error of any OUT: exit 2,
    one line naming standard output."""
    snap, _ = T.long_name_snapshot(n=3000, size=1024)  # ~0.5 MB out
    src = T.write_pickle(snap, "pipe.pickle")
    for ignore in (False, True):
        pre = (lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN)) \
            if ignore else None
        p = subprocess.Popen(T.WRAPPER + [T.MEMSNAP, "convert", src, "-o",
                                          "-"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=pre)
        p.stdout.read(10)
        p.stdout.close()
        err = p.stderr.read().decode()
        rc = p.wait(timeout=60)
        if not ignore:
            T.expect(rc == -signal.SIGPIPE and err == "",
                     "convert -o - | head -c 10: ended by SIGPIPE, no "
                     "message (%d %r)" % (rc, err))
        else:
            T.expect(rc == 2 and err.count("\n") == 1 and
                     err.startswith("memsnap: standard output: cannot "
                                    "write: Broken pipe"),
                     "convert -o - | head -c 10, SIGPIPE ignored: exit 2, "
                     "one line (%d %r)" % (rc, err))


GROUPS = {"links": group_links, "stdout": group_stdout, "temps": group_temps,
          "failed": group_failed}

if __name__ == "__main__":
    GROUPS[T.GROUP]()
    T.finish()
