"""The host / pid-namespace tag of memsnap's temporaries, computed
independently of the C code (src/base/outpath.c documents it), for the
tests of tests/cli and tests/python that plant or look for temporaries
named "<name>.tmp.<tag>.<pid>.<n>".

The tag: FNV-1a 64 over the host name, "\\n", /etc/machine-id (its first
128 bytes, "-" when unreadable or empty), "\\n", the text of the
/proc/self/ns/pid link; the low 48 bits as 12 hex digits.
"""
import os
import socket


def tmp_tag() -> str:
    def fnv(h, data):
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return h
    h = fnv(0xCBF29CE484222325, socket.gethostname().encode())
    h = fnv(h, b"\n")
    try:
        with open("/etc/machine-id", "rb") as f:
            mid = f.read(128)
    except OSError:
        mid = b""
    h = fnv(fnv(h, mid or b"-"), b"\n")
    try:
        h = fnv(h, os.readlink("/proc/self/ns/pid").encode())
    except OSError:
        pass
    return "%012x" % (h & 0xFFFFFFFFFFFF)
