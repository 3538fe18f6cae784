"""Canonical text of a Python value, identical to msnap__pickle_canon's.

N, T, F; i<decimal> for ints in [-2**63, 2**64), else I[-]0x<hex>;
f<16 hex digits of the IEEE-754 bits>; s<hex of UTF-8, lone surrogates
as U+FFFD>; b<hex>; B<hex>;
(bytes / bytearray); [..] lists, (..) tuples, {k:v,..} dicts in insertion
order, S{..} / Z{..} sets / frozensets sorted by element text; ',' between
items.
"""
import struct


def canon(x):
    if x is None:
        return "N"
    if x is True:
        return "T"
    if x is False:
        return "F"
    if isinstance(x, int):
        if -2**63 <= x < 2**64:
            return "i%d" % x
        return "I" + ("-" if x < 0 else "") + hex(abs(x))
    if isinstance(x, float):
        return "f" + struct.pack(">d", x).hex()
    if isinstance(x, str):
        # memsnap's UTF-8 policy: a lone surrogate (pickled as its 3-byte
        # form) is one code point and becomes one U+FFFD
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c
                       for c in x)
        return "s" + text.encode("utf-8").hex() + ";"
    if isinstance(x, bytearray):
        return "B" + bytes(x).hex() + ";"
    if isinstance(x, bytes):
        return "b" + x.hex() + ";"
    if isinstance(x, list):
        return "[" + ",".join(canon(v) for v in x) + "]"
    if isinstance(x, tuple):
        return "(" + ",".join(canon(v) for v in x) + ")"
    if isinstance(x, dict):
        return "{" + ",".join(canon(k) + ":" + canon(v)
                              for k, v in x.items()) + "}"
    if isinstance(x, frozenset):
        return "Z{" + ",".join(sorted(canon(v) for v in x)) + "}"
    if isinstance(x, set):
        return "S{" + ",".join(sorted(canon(v) for v in x)) + "}"
    raise TypeError(type(x))
