"""python -m memsnap.predict -- predict a script's device memory (docs/predict.md).

Exit status: 0 the run fits, 1 an out-of-memory is predicted (for the run's
own configuration), 2 usage error, the script failed, device work in other
threads of the script was not seen (verdict UNKNOWN), or the snapshot could
not be written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m memsnap.predict",
        description="Run an unchanged PyTorch script on fake tensors while memsnap's "
                    "allocator, on a simulated device, takes every allocation: peak "
                    "allocated/reserved memory, fragmentation, the line that runs out of "
                    "memory, what-ifs, and a snapshot for memory_viz.",
        epilog="exit status: 0 fits, 1 out of memory predicted, 2 usage or script error, "
                "device work in other threads not seen (verdict UNKNOWN), or the snapshot "
                "not written")
    p.add_argument("--memory", default="64G", metavar="SIZE",
                   help="device memory (binary units: 64G, 80GiB, 1.5T; default 64G)")
    p.add_argument("--profile", choices=("npu", "cuda"), default=None,
                   help="allocator decisions: torch_npu's (npu) or PyTorch's (cuda); "
                        "default: the device type the script uses")
    p.add_argument("--alloc-conf", default=None, metavar="STR",
                   help="allocator configuration (PYTORCH_NPU_ALLOC_CONF syntax); default: "
                        "the profile's environment variable")
    p.add_argument("--what-if", action="append", default=[], metavar="SPEC",
                   help="another configuration evaluated on the same run (repeatable): "
                        "npu | cuda | ALLOC_CONF | PROFILE,ALLOC_CONF")
    p.add_argument("--compare", action="store_true",
                   help="add the standard what-ifs: expandable segments switched, the "
                        "other profile")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="world size: N simulated devices and a fake process group of N "
                        "ranks (default 1, no process group)")
    p.add_argument("--rank", type=int, default=0, metavar="R",
                   help="the rank whose process is run (with --devices; default 0)")
    p.add_argument("--reserve", default="0", metavar="SIZE",
                   help="memory the allocator does not see, per device (runtime "
                        "context, communication buffers), taken before the script runs")
    p.add_argument("-o", "--output", default=None, metavar="OUT.pickle",
                   help="snapshot file (default: <script>_predict.pickle in the current "
                        "directory); '-' or /dev/stdout: standard output, the report "
                        "then on standard error")
    p.add_argument("--attention", choices=("fused", "math"), default="fused",
                   help="F.scaled_dot_product_attention as the device's fused kernel "
                        "(default: flash/efficient for cuda, npu_fusion_attention for npu) "
                        "or torch's math path")
    p.add_argument("--no-annotations", action="store_true",
                   help="do not record module / optimizer-step ranges")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # Optional for argparse, required below: with a REMAINDER after it,
    # argparse would name ARGS (optional) as required too.
    p.add_argument("script", metavar="SCRIPT", nargs="?",
                   help="the Python script to run, as python takes it: a file, a directory "
                        "or zip file with __main__.py, or - (standard input)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's arguments")
    # The usage names SCRIPT as required and ARGS as optional.
    usage = p.format_usage().removeprefix("usage: ").rstrip("\n")
    p.usage = usage.replace(" [SCRIPT] ...", " SCRIPT [ARGS ...]")
    return p


def _check_script(p: argparse.ArgumentParser, script: str) -> None:
    """What ``python SCRIPT`` runs, or a usage error: a file, a directory
    or zip file holding a ``__main__`` module (runpy.run_path), or ``-``
    (the source from standard input)."""
    if script == "-":
        if sys.stdin is None:
            p.error("-: there is no standard input to read the script from")
        return
    if not (os.path.isfile(script) or os.path.isdir(script)):
        p.error(f"{script}: " + ("not a regular file" if os.path.exists(script)
                                 else "no such file"))
    import pkgutil

    importer = pkgutil.get_importer(script)  # None: a plain script file
    if importer is None:
        return
    find = getattr(importer, "find_spec", None)  # zipimporter: 3.10+
    found = (find("__main__") if find is not None
             else importer.find_module("__main__"))
    if found is None:
        kind = "a directory" if os.path.isdir(script) else "a zip file"
        p.error(f"{script}: {kind} without a __main__ module (python runs a directory's "
                f"or zip file's __main__.py), not a script")


def _stem(script: str) -> str:
    """The default snapshot's name stem: the script file's without its
    suffix, a directory's name, "stdin" for ``-``."""
    if script == "-":
        return "stdin"
    path = os.path.normpath(os.path.abspath(script))
    name = os.path.basename(path)
    return name if os.path.isdir(path) else os.path.splitext(name)[0]


# Options whose value is a size: "-5G" after them is their (invalid) value,
# which argparse would take for an unknown option ("expected one argument").
_SIZE_OPTIONS = ("--memory", "--reserve")


def _option(a: str, options: frozenset) -> str | None:
    """The option ``a`` names, as argparse takes it: exactly, or by a
    unique prefix of a long option (``--mem``); None for any other."""
    if a in options:
        return a
    if a.startswith("--") and len(a) > 2:
        hits = [o for o in options if o.startswith("--") and o.startswith(a)]
        if len(hits) == 1:
            return hits[0]
    return None


def _join_size_values(argv: list[str], takes_value: frozenset) -> list[str]:
    """``--memory -5G`` as ``--memory=-5G``, so that the size parser says
    what is wrong with a negative size (argparse alone takes "-5G" for an
    unknown option: "expected one argument").  Only a value that looks
    like a negative number, and only before SCRIPT and ``--`` (the
    script's own arguments are left alone)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a in ("-", "--"):
            return out + argv[i:]  # SCRIPT (or "--"): the rest as given
        opt = _option(a, takes_value)
        if (opt in _SIZE_OPTIONS and i + 1 < len(argv)
                and re.match(r"-[0-9.]", argv[i + 1])):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
        if opt is not None and i < len(argv):  # its value, whatever it is
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    # the options that take one value (store_true ones take none: nargs 0)
    takes_value = frozenset(s for a in p._actions if a.option_strings and a.nargs is None
                            for s in a.option_strings)
    args = sys.argv[1:] if argv is None else list(argv)
    ns = p.parse_args(_join_size_values(args, takes_value))
    if ns.script is None:
        p.error("the following arguments are required: SCRIPT")
    _check_script(p, ns.script)
    from . import check_memory, check_reserve, parse_size, parse_what_if, run_script

    try:
        memory = check_memory(parse_size(ns.memory), ns.memory)
        reserve = parse_size(ns.reserve) if ns.reserve not in ("0", "") else 0
        check_reserve(reserve, memory)
        what_if = [parse_what_if(w) for w in ns.what_if]
    except ValueError as e:
        p.error(str(e))
    if ns.devices is not None and ns.devices < 1:
        p.error("--devices must be >= 1")
    if ns.devices is None and ns.rank != 0:
        p.error("--rank needs --devices")
    out = ns.output
    if out == "":
        p.error("-o: output path is empty")
    if out is None:
        out = f"{_stem(ns.script)}_predict.pickle"
    to_stdout = out in ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
    if to_stdout:
        # As the memsnap CLI: the snapshot has standard output to itself
        # (written to a duplicate of it); the report, --json and the
        # script's own output go to standard error.
        sys.stdout.flush()
        keep = os.dup(1)
        os.set_inheritable(keep, False)
        os.dup2(2, 1)
        out = f"/dev/fd/{keep}"
    # With --json, stdout carries only the JSON object: the script's own
    # output goes to stderr.
    redirect = contextlib.redirect_stdout(sys.stderr) if ns.json else contextlib.nullcontext()
    try:
        with redirect:
            pred = run_script(ns.script, ns.args, memory=memory, profile=ns.profile,
                              alloc_conf=ns.alloc_conf, what_if=what_if, compare=ns.compare,
                              world_size=ns.devices, rank=ns.rank, output=out,
                              reserve=reserve, annotate=not ns.no_annotations,
                              attention=ns.attention)
    except OSError as e:  # -o refused before the script runs
        from . import _snapshot

        print(f"memsnap.predict: {_snapshot.refusal(e, e.filename or out)}",
              file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        print(f"memsnap.predict: {e}", file=sys.stderr)
        return 2
    if to_stdout and pred.result.get("snapshot") == out:
        pred.result["snapshot"] = "standard output"  # not /dev/fd/N
    r = dict(pred.result)
    r["script"] = ns.script
    r["script_error"] = pred.script_error
    if ns.json:
        print(json.dumps(r))
    else:
        sys.stdout.write(pred.report("<stdin>" if ns.script == "-" else ns.script))
    if r["snapshot_error"]:
        print(f"memsnap.predict: the snapshot was not written: {r['snapshot_error']}",
              file=sys.stderr)
        status = 2
    elif r["oom"] is not None:
        status = 1
    else:
        # A failed script, or device work in other threads not seen
        # (verdict UNKNOWN): not a verdict to trust.
        status = 2 if pred.script_error or r.get("threads_not_seen") else 0
    if pred.os_exit is not None:
        # The script ended itself with os._exit: the process ends the same
        # way (no interpreter teardown: atexit handlers, joins of the
        # script's threads), once the report is out.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
