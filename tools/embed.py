#!/usr/bin/env python3
"""Embed a text file as a C string constant: embed.py IN OUT NAME."""
import sys

src, dst, name = sys.argv[1], sys.argv[2], sys.argv[3]
with open(src, encoding="utf-8") as f:
    text = f.read()
out = ["/* Generated from %s by embed.py; do not edit. */" % src.split("/")[-1],
       "static const char %s[] =" % name]
for line in text.splitlines(True):
    esc = (line.replace("\\", "\\\\").replace('"', '\\"')
           .replace("\n", "\\n").replace("\t", "\\t"))
    out.append('  "%s"' % esc)
out.append(";")
with open(dst, "w", encoding="utf-8") as f:
    f.write("\n".join(out) + "\n")
