"""vizcheck.py ORIG REWRITTEN [ORIG REWRITTEN ...]

What `python -m torch.cuda._memory_viz stats|trace FILE` prints (segsum()
and trace() of the loaded file, a bare list wrapped as the CLI does) must
be the same for each original and its rewrite.  One process, so torch is
imported once.  Exit 0 when all match."""
import contextlib
import io
import pickle
import sys

from torch.cuda import _memory_viz as mv


def run(fn, path):
    with open(path, "rb") as f:
        data = pickle.load(f)
    if isinstance(data, list):
        data = {"segments": data, "traces": []}
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            print(fn(data))
    except Exception as e:  # the CLI would fail the same way
        return "exception %s: %s" % (type(e).__name__, e)
    return buf.getvalue()


bad = 0
args = sys.argv[1:]
for orig, new in zip(args[0::2], args[1::2]):
    for name, fn in (("stats", mv.segsum), ("trace", mv.trace)):
        if run(fn, orig) != run(fn, new):
            print("%s: _memory_viz %s differs" % (orig, name))
            bad += 1
sys.exit(1 if bad else 0)
