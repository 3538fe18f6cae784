#!/usr/bin/env python3
"""check_layers.py -- no layer of src/ references a symbol of a layer it
may not use (docs/design.md, Layers).

    check_layers.py NM name=path/libmsnap_name.a ...   (bottom layer first)

Runs `nm` over each layer's static library, collects the global symbols
each one defines and the undefined symbols each object references, and
fails (exit 1), naming the object, the symbol and the layer that defines
it, when an object of a layer references a symbol defined in a layer
outside its allowed set (ALLOWED below: base <- runtime, record, model
<- alloc <- api).  Symbols of no layer (libc, libdl, xxHash) are fine.

It then proves that it can fail: the same libraries checked with the
order reversed (api claimed as the bottom layer) must report violations.
"""
import os
import subprocess
import sys

ALLOWED = {
    "base": set(),
    "runtime": {"base"},
    "record": {"base"},
    "model": {"base"},
    "alloc": {"record", "runtime", "model", "base"},
    "api": {"alloc", "record", "runtime", "model", "base"},
}
DEFINED = set("TDBRVWGSCiu")


def scan(nm, path):
    """(defined global symbols, [(object, undefined symbol)])"""
    # POSIX format: "lib.a[obj.o]: symbol type [value size]"
    out = subprocess.run([nm, "-A", "-g", "-P", path], check=True,
                         capture_output=True, text=True).stdout
    defs, refs = set(), []
    for line in out.splitlines():
        loc, sep, rest = line.rpartition("]: ")
        parts = rest.split()
        if not sep or len(parts) < 2:
            continue
        obj = os.path.basename(loc.rpartition("[")[2])
        if parts[1] == "U":
            refs.append((obj, parts[0]))
        elif parts[1] in DEFINED:
            defs.add(parts[0])
    return defs, refs


def violations(layers, allowed):
    owner = {}
    for name, (defs, _) in layers.items():
        for s in defs:
            owner.setdefault(s, name)
    bad = []
    for name, (_, refs) in layers.items():
        for obj, sym in refs:
            o = owner.get(sym)
            if o is not None and o != name and o not in allowed[name]:
                bad.append("%s (%s) references %s, defined in layer %s"
                           % (obj, name, sym, o))
    return sorted(set(bad))


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    nm = argv[1]
    order, layers = [], {}
    for arg in argv[2:]:
        name, _, path = arg.partition("=")
        order.append(name)
        layers[name] = scan(nm, path)
    missing = set(ALLOWED) - set(order)
    if missing:
        print("FAIL: layers not given: %s" % ", ".join(sorted(missing)))
        return 1
    nrefs = sum(len(r) for _, r in layers.values())
    bad = violations(layers, ALLOWED)
    for b in bad:
        print("FAIL: " + b)
    print("%d layers, %d symbol references checked, %d wrong-way"
          % (len(order), nrefs, len(bad)))
    # The check must be able to fail: upside down, every call is wrong.
    flipped = {n: set(order[i + 1:]) for i, n in enumerate(order)}
    wrong = violations(layers, flipped)
    if not wrong:
        print("FAIL: the upside-down order reports nothing: the check "
              "cannot fail")
        return 1
    print("self-check: the upside-down order gives %d violations, e.g. %s"
          % (len(wrong), wrong[0]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
