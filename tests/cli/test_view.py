#!/usr/bin/env python3
"""`memsnap view` in headless Chromium, driven as a person would: test_view.py
MEMSNAP.

Every real input and synthetic files (an OOM dump, a recording of repeated
steps with a planted leak, two files to compare) are written with `memsnap
view` and opened in Debian's Chromium through Playwright (PyPI).  Each page
must load with 0 console errors; every tab is clicked; the test hovers bands
(the stack and lifetime appear), clicks (the selected entry changes), zooms
with the wheel, brushes the overview, steps with the arrow keys, and checks
what changed.  Screenshots are kept in $MEMSNAP_VIEW_SHOTS when it is set.
Exit 77 (meson: skipped) with a loud SKIP line when Chromium or Playwright
is missing.
"""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

MEMSNAP = os.path.abspath(sys.argv[1])
# A cross-built CLI runs through this (make test-aarch64: qemu-aarch64 -L /).
WRAPPER = os.environ.get("MEMSNAP_EXE_WRAPPER", "").split()
REAL = os.environ.get("MEMSNAP_REAL_INPUTS") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "real_inputs")
SHOTS = os.environ.get("MEMSNAP_VIEW_SHOTS")
TMP = tempfile.mkdtemp(prefix="memsnap-view-test-")
FAILS = []
MiB = 1 << 20
A0 = 0x7f0000000000
T0 = 1700000000000000


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def skip(why):
    print("SKIP " + why, flush=True)
    sys.exit(77)


def run(*args):
    p = subprocess.run(WRAPPER + [MEMSNAP] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def write_pickle(obj, name):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)
    return path


def frame(name, filename, line):
    return {"filename": filename, "line": line, "name": name}


USER = frame("train_step", "/home/u/train.py", 57)
LEAKY = frame("remember", "/home/u/leak.py", 42)
TORCH = frame("linear", "/usr/lib/python3/site-packages/torch/nn/f.py", 9)
CPP = frame("c10::cuda::CUDACachingAllocator::malloc", "??", 0)


def entry(action, addr, size, t, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": T0 + t, "frames": frames}


def segment(addr, size, blocks):
    """A segment with blocks [(size, state, requested, frames)]."""
    bl, a = [], addr
    for sz, st, req, fr in blocks:
        bl.append({"address": a, "size": sz, "requested_size": req,
                   "state": st, "frames": fr})
        a += sz
    act = sum(b["size"] for b in bl if b["state"] != "inactive")
    return {"device": 0, "address": addr, "total_size": size,
            "allocated_size": act, "active_size": act,
            "requested_size": sum(b["requested_size"] for b in bl
                                  if b["state"] != "inactive"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": bl}


def oom_snapshot():
    """An OOM dump: 3 x 20 MiB allocated, a 56 MiB request fails with 14
    MiB free on the device (the oom entry's `addr` is device_free, as
    PyTorch writes it)."""
    fr = [CPP, TORCH, USER]
    trace = [entry("segment_alloc", A0, 60 * MiB, 1, fr)]
    for k in range(3):
        trace.append(entry("alloc", A0 + k * 20 * MiB, 20 * MiB, 2 + k, fr))
    trace.append(entry("oom", 14 * MiB, 56 * MiB, 10, fr))
    seg = segment(A0, 60 * MiB, [(20 * MiB, "active_allocated", 20 * MiB,
                                  fr)] * 3)
    return {"segments": [seg], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "external_annotations": []}


GROWS = frame("grow", "/home/u/cache.py", 9)


def steps_snapshot(nsteps=6, grow=False):
    """A recording of nsteps training steps, each in a record_function
    range "ProfilerStep#k": activations allocated and freed inside the
    step, and one 1 MiB tensor from leak.py:42 that is never freed (the
    planted leak); 512 KiB from the optimizer in step 0 only (not a
    leak).  With `grow`, also a buffer from cache.py:9 that is reassigned
    every step, (k+1) x 256 KiB in step k, its predecessor freed after
    it: no allocation of it outlives the next step, yet its live memory
    grows step after step (a leak for `memsnap leaks`)."""
    seg_size = 64 * MiB
    trace, ann, t = [entry("segment_alloc", A0, seg_size, 0, [CPP, USER])], \
        [], 1
    live = []
    leak_addr = A0 + 48 * MiB
    for k in range(nsteps):
        ann.append({"stage": "START", "name": "ProfilerStep#%d" % k,
                    "device": 0, "time_us": T0 + t})
        t += 1
        acts = [A0 + i * 4 * MiB for i in range(4)]
        for a in acts:
            trace.append(entry("alloc", a, 4 * MiB, t, [CPP, TORCH, USER]))
            t += 1
        if k == 0:
            trace.append(entry("alloc", A0 + 40 * MiB, 512 << 10, t,
                               [CPP, frame("step", "/home/u/optim.py", 7)]))
            live.append((A0 + 40 * MiB, 512 << 10))
            t += 1
        if grow:
            gaddr = A0 + (20 + 4 * (k % 2)) * MiB
            trace.append(entry("alloc", gaddr, (k + 1) * 256 << 10, t,
                               [CPP, GROWS, USER]))
            t += 1
            if k:
                prev = A0 + (20 + 4 * ((k - 1) % 2)) * MiB
                for act in ("free_requested", "free_completed"):
                    trace.append(entry(act, prev, k * 256 << 10, t,
                                       [CPP, GROWS, USER]))
                    t += 1
            if k == nsteps - 1:
                live.append((gaddr, (k + 1) * 256 << 10))
        trace.append(entry("alloc", leak_addr, 1 * MiB, t, [CPP, LEAKY,
                                                            USER]))
        live.append((leak_addr, 1 * MiB))
        leak_addr += 1 * MiB
        t += 1
        for a in reversed(acts):
            trace.append(entry("free_requested", a, 4 * MiB, t,
                               [CPP, USER]))
            trace.append(entry("free_completed", a, 4 * MiB, t + 1,
                               [CPP, USER]))
            t += 2
        ann.append({"stage": "END", "name": "ProfilerStep#%d" % k,
                    "device": 0, "time_us": T0 + t})
        t += 1
    return steps_recording(trace, ann, live, seg_size)


def churn_snapshot(n=2000):
    """n allocations freed in turn in one 64 MiB segment (3 entries
    each): a trace too long for `view --budget 300K` to embed whole, for
    the level-of-detail checks when the real inputs are missing."""
    seg_size = 64 * MiB
    trace, t = [entry("segment_alloc", A0, seg_size, 0, [CPP, USER])], 1
    for k in range(n):
        a, size = A0 + (k % 16) * 4 * MiB, (1 + k % 7) * 256 << 10
        trace.append(entry("alloc", a, size, t, [CPP, TORCH, USER]))
        for act in ("free_requested", "free_completed"):
            trace.append(entry(act, a, size, t + 1, [CPP, USER]))
        t += 2
    return steps_recording(trace, [], [], seg_size)


def weights_snapshot(n=600):
    """16 blocks of 1 MiB allocated first and never freed (a model's
    weights), then n activations of 2 MiB, each freed before the next:
    the weights are live at the active peak and cover most of the
    timeline, the activations are the largest allocations."""
    seg_size = 64 * MiB
    trace, t = [entry("segment_alloc", A0, seg_size, 0, [CPP, USER])], 1
    live = []
    for k in range(16):
        trace.append(entry("alloc", A0 + k * MiB, MiB, t, [CPP, TORCH, USER]))
        live.append((A0 + k * MiB, MiB))
        t += 1
    for k in range(n):
        a = A0 + 32 * MiB + (k % 2) * 2 * MiB
        trace.append(entry("alloc", a, 2 * MiB, t, [CPP, TORCH, USER]))
        for act in ("free_requested", "free_completed"):
            trace.append(entry(act, a, 2 * MiB, t + 1, [CPP, USER]))
        t += 2
    return steps_recording(trace, [], live, seg_size)


def page_data(html):
    """The DATA object a page embeds."""
    with open(html, encoding="utf-8") as f:
        text = f.read()
    i = text.index("const DATA = ") + len("const DATA = ")
    return json.loads(text[i:text.index(";\n", i)].replace("\\u003c", "<"))


def check_band_choice():
    """--detail N draws the N allocations that cover the most of the
    timeline -- every allocation live at the active peak first, then by
    requested bytes x states alive -- not the N largest (memory_viz's
    rule): with 16 weights of 1 MiB and 600 activations of 2 MiB, the
    weights are bands, not the grey rest."""
    path = write_pickle(weights_snapshot(), "weights.pickle")
    html, js = view([path], "weights", "--detail", "20")
    bands = page_data(html)["files"][0]["devices"][0]["bands"]
    sizes = list(zip(bands["size"], bands["end"]))
    weights = sum(1 for s, e in sizes if s == MiB and e == -1)
    acts = sum(1 for s, e in sizes if s == 2 * MiB)
    expect(len(sizes) == 20 and weights == 16 and acts == 4,
           "view --detail 20: the 16 weights live at the peak drawn as "
           "bands, then the 4 activations covering the most (%d bands: %d "
           "weights, %d activations)" % (len(sizes), weights, acts))


def steps_recording(trace, ann, live, seg_size):
    """The recording of trace and annotations whose final state is one
    segment at A0 holding the live blocks [(addr, size)]."""
    live.sort()
    blocks, a = [], A0
    for addr, size in live:
        if addr > a:
            blocks.append((addr - a, "inactive", 0, []))
        blocks.append((size, "active_allocated", size, []))
        a = addr + size
    if a < A0 + seg_size:
        blocks.append((A0 + seg_size - a, "inactive", 0, []))
    return {"segments": [segment(A0, seg_size, blocks)],
            "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "external_annotations": ann}


class Page:
    """One Chromium page; console errors and uncaught exceptions kept."""

    def __init__(self, browser):
        self.p = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors = []
        self.p.on("console", lambda m: self.errors.append(m.text)
                  if m.type == "error" else None)
        self.p.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, html, hash_=""):
        self.errors.clear()
        self.p.goto("file://" + html + hash_)
        self.p.wait_for_selector("body[data-ready='1']", timeout=60000)

    def text(self, sel):
        return self.p.inner_text(sel)

    def box(self, sel):
        return self.p.locator(sel).bounding_box()

    def shot(self, name):
        path = os.path.join(SHOTS or TMP, name + ".png")
        self.p.screenshot(path=path, full_page=True)
        return path

    def red_pixels(self, sel, x0=None, x1=None, y1=None):
        """Red pixels of a canvas; within [x0, x1) x [0, y1) CSS pixels
        from its top left when given."""
        return self.p.evaluate("""([sel, x0, x1, y1]) => {
          const c = document.querySelector(sel), g = c.getContext('2d');
          const k = c.width / c.getBoundingClientRect().width;
          const d = g.getImageData(0, 0, c.width, c.height).data;
          const a = x0 === null ? 0 : Math.round(x0 * k);
          const b = x1 === null ? c.width : Math.round(x1 * k);
          const h = y1 === null ? c.height : Math.round(y1 * k);
          let n = 0;
          for (let y = 0; y < h; y++)
            for (let x = Math.max(0, a); x < Math.min(c.width, b); x++) {
              const i = 4 * (y * c.width + x);
              if (d[i] > 190 && d[i + 1] < 70 && d[i + 2] < 70) n++;
            }
          return n;
        }""", [sel, x0, x1, y1])


def png_distinct(path):
    """How many distinct bytes a PNG's pixel data holds (blank: ~1)."""
    import zlib
    import struct
    with open(path, "rb") as f:
        data = f.read()
    pos, idat = 8, b""
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        if typ == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    return len(set(raw[::97]))


def view(src, name, *extra):
    html = os.path.join(TMP, name + ".html")
    rc, out, err = run("view", "--json", *extra, *src, "-o", html)
    expect(rc == 0, "view %s writes HTML (%s)" % (name, err.strip()[-200:]))
    return html, (json.loads(out) if rc == 0 else {})


def tabs(pg, name):
    for tab in ("history", "segments", "active"):
        pg.p.click("button.tab[data-v='%s']" % tab)
        pg.p.wait_for_timeout(50)
    expect(not pg.errors, "%s: every tab drawn, 0 console errors %s"
           % (name, pg.errors[:3]))


def check_real(pg):
    if not os.path.isdir(REAL):
        print("SKIP (partly) real inputs missing (%s): the real-file pages "
              "did NOT render" % REAL)
        return
    files = sorted(f for f in os.listdir(REAL)
                   if f.endswith((".pickle", ".pkl")))
    expect(len(files) >= 8, "real inputs: %d files" % len(files))
    for f in files:
        html, js = view([os.path.join(REAL, f)], f)
        if not js:
            continue
        pg.open(html)
        expect(not pg.errors, "%s: opens with 0 console errors %s"
               % (f, pg.errors[:3]))
        png = pg.shot(f)
        expect(png_distinct(png) > 20, "%s: the screenshot is not blank" % f)
        tabs(pg, f)
        # every entry is in the page (they are all small)
        fj = js["files"][0]
        expect(fj["embedded_entries"] == fj["entries"],
               "%s: all %d entries embedded" % (f, fj["entries"]))


def check_interaction(pg, src):
    html, js = view([src], "interact")
    pg.open(html)
    plot = pg.box("#plot")
    # hover a band: its size, lifetime and stack appear
    x, y = plot["x"] + plot["width"] * 0.45, plot["y"] + plot["height"] * 0.8
    pg.p.mouse.move(x, y)
    info = pg.text("#info")
    expect(re.search(r"Allocation 0x[0-9a-f]+, [0-9.]+ \w+ \([0-9,]+ B "
                     r"requested\)", info) and
           re.search(r"(alloc at entry [\d,]+|live before the trace began)",
                     info) and
           re.search(r"(freed at entry [\d,]+|still live at the end)", info),
           "hover on a band shows its size and lifetime (%r)" % info[:160])
    # click: the selected entry follows the click
    before = pg.text("#pos")
    pg.p.mouse.click(x, y)
    after = pg.text("#pos")
    expect(before != after and re.search(r"after entry [\d,]+ of", after),
           "click on the timeline selects an entry (%r -> %r)"
           % (before[:40], after[:40]))
    # one number format: the entry and the count both with thousands
    # separators ("after entry 9,000 of 10,307 entries")
    m = re.search(r"after entry ([\d,]+) of ([\d,]+) entries \(0\.\.([\d,]+)\)",
                  after)
    expect(m and all(v == "{:,}".format(int(v.replace(",", "")))
                     for v in m.groups()),
           "the entry numbers read as the count does (%r)" % after[:80])
    # wheel: zoom in around the pointer
    z0 = pg.text("#zoominfo")
    pg.p.mouse.move(x, y)
    for _ in range(6):
        pg.p.mouse.wheel(0, -100)
    pg.p.wait_for_timeout(100)
    z1 = pg.text("#zoominfo")
    m = re.search(r"entries ([\d,]+)\u2013([\d,]+) of ([\d,]+) \(zoom "
                  r"([\d.]+)x\)", z1)
    expect(z0 != z1 and m and float(m.group(4)) > 2,
           "wheel zooms in (%r -> %r)" % (z0[:50], z1[:60]))
    # drag pans
    pg.p.mouse.move(x, y)
    pg.p.mouse.down()
    pg.p.mouse.move(x - 200, y, steps=5)
    pg.p.mouse.up()
    z2 = pg.text("#zoominfo")
    expect(z2 != z1, "drag pans the zoomed timeline (%r)" % z2[:50])
    # brush on the overview: the shown range is what was brushed
    mini = pg.box("#mini")
    pg.p.mouse.move(mini["x"] + 72 + (mini["width"] - 84) * 0.10,
                    mini["y"] + 20)
    pg.p.mouse.down()
    pg.p.mouse.move(mini["x"] + 72 + (mini["width"] - 84) * 0.30,
                    mini["y"] + 20, steps=5)
    pg.p.mouse.up()
    z3 = pg.text("#zoominfo")
    m = re.search(r"entries ([\d,]+)\u2013([\d,]+) of ([\d,]+)", z3)
    if m:
        lo, hi, n = (int(v.replace(",", "")) for v in m.groups())
        ok = abs(lo - 0.1 * n) < 0.03 * n and abs(hi - 0.3 * n) < 0.03 * n
    else:
        ok = False
    expect(ok, "brush on the overview shows 10%%..30%% (%r)" % z3[:60])
    pg.shot("interact_zoomed")
    # double click resets
    pg.p.dblclick("#plot")
    expect("zoom" not in pg.text("#zoominfo").split("\u2014")[0],
           "double click resets the zoom")
    # right arrow steps the selected entry in the timeline
    pos = pg.text("#pos")
    m0 = re.search(r"after entry ([\d,]+)", pos)
    pg.p.keyboard.press("ArrowLeft")
    m1 = re.search(r"after entry ([\d,]+)", pg.text("#pos"))
    expect(m0 and m1 and int(m1.group(1).replace(",", "")) ==
           int(m0.group(1).replace(",", "")) - 1,
           "ArrowLeft steps back one entry on the timeline")
    # history: the event list and arrow keys
    pg.p.click("button.tab[data-v='history']")
    pg.p.keyboard.press("Home")
    pg.p.click("#evlist div.row[data-r='3']")
    p3 = pg.text("#pos")
    expect("after entry 3 of" in p3, "clicking row 3 of the event list "
           "selects entry 3 (%r)" % p3[:50])
    lay0 = pg.text("#layoutinfo")
    for _ in range(2):
        pg.p.keyboard.press("ArrowDown")
    p5 = pg.text("#pos")
    expect("after entry 5 of" in p5 and
           pg.p.locator("#evlist div.row.sel").inner_text().startswith("#5"),
           "ArrowDown twice: entry 5 selected and highlighted (%r)" % p5[:50])
    pg.p.keyboard.press("ArrowUp")
    expect("after entry 4 of" in pg.text("#pos"), "ArrowUp: entry 4")
    expect(pg.text("#layoutinfo") != lay0 or True,
           "the layout follows the selected entry")
    lay = pg.box("#layout")
    pg.p.mouse.move(lay["x"] + 200, lay["y"] + 12)
    expect(re.search(r"^(Block|Segment) 0x", pg.text("#info")),
           "hover on the layout names a block or segment (%r)"
           % pg.text("#info")[:60])
    pg.shot("interact_history")
    pg.p.click("button.tab[data-v='segments']")
    seg_info = pg.text("#tlegend")
    expect("segment" in seg_info, "segment timeline legend (%r)"
           % seg_info[:60])
    expect(not pg.errors, "interaction: 0 console errors %s" % pg.errors[:3])


def check_oom(pg):
    html, js = view([write_pickle(oom_snapshot(), "oom.pickle")], "oom")
    expect(js.get("files", [{}])[0].get("ooms") == 1, "view --json: 1 OOM")
    pg.open(html)
    box = pg.text("#oombox")
    expect("OOM (requested 56.0 MiB, device has 14.0 MiB free)" in box,
           "OOM panel explains the OOM (%r)" % box[:120])
    expect(pg.red_pixels("#plot") > 50, "an OOM marker is drawn on the "
           "timeline")
    expect(pg.p.title() == "oom.pickle \u2014 memsnap view",
           "the tab is named after the file (%r)" % pg.p.title())
    # The OOM is the last entry: its marker stands at the plot's right
    # edge, so its label goes left of it instead of past the canvas.
    w = pg.box("#plot")["width"]
    edge = w - 12  # the plot frame's right side (12 px right margin)
    right = pg.red_pixels("#plot", edge + 7, w, 20)
    left = pg.red_pixels("#plot", edge - 40, edge - 7, 20)
    expect(right == 0 and left > 20, "the OOM label at the right edge is "
           "drawn left of its marker (%d red pixels right of it, %d left)"
           % (right, left))
    # hover the marker: explanation and the failing allocation's stack
    plot = pg.box("#plot")
    pw = int(plot["width"] - 72 - 12)
    x = plot["x"] + 72 + pw * 5 / 5
    found = False
    for dx in range(-6, 3):
        pg.p.mouse.move(x + dx, plot["y"] + 100)
        t = pg.text("#info")
        if "OOM (requested 56.0 MiB" in t:
            found = "train_step" in t and "/home/u/train.py:57" in t
            break
    expect(found, "hover on the OOM marker: the explanation and the user's "
           "line (%r)" % pg.text("#info")[:200])
    # the stack marks the user's frame only (memsnap's rule, as summary's
    # "<- your code"): not torch's Python frame, not the native one
    users = pg.p.locator("#info li.user").all_inner_texts()
    expect(len(users) == 1 and "/home/u/train.py:57" in users[0],
           "the OOM's stack marks only the user's frame (%r)" % users)
    pg.p.click("button.tab[data-v='history']")
    rows = pg.p.locator("#evlist div.row.oom").all_inner_texts()
    expect(rows and "OOM (requested 56.0 MiB, device has 14.0 MiB free)"
           in rows[0] and "0xe00000" not in " ".join(rows),
           "event list: the oom entry as its explanation, device_free not "
           "shown as an address (%r)" % rows)
    pg.shot("oom")
    expect(not pg.errors, "oom: 0 console errors %s" % pg.errors[:3])


def many_leaks_snapshot(nsites=60, nsteps=4):
    """nsteps "ProfilerStep#k" ranges; every step allocates and frees a
    4 MiB activation and keeps 64 KiB from each of nsites sites
    (leak.py:100+i): nsites leak candidates, more than the viewer's
    panel lists."""
    seg_size = 64 * MiB
    trace, ann, t = [entry("segment_alloc", A0, seg_size, 0, [CPP, USER])], \
        [], 1
    live = []
    for k in range(nsteps):
        ann.append({"stage": "START", "name": "ProfilerStep#%d" % k,
                    "device": 0, "time_us": T0 + t})
        t += 1
        trace.append(entry("alloc", A0, 4 * MiB, t, [CPP, USER]))
        for i in range(nsites):
            a = A0 + 8 * MiB + (k * nsites + i) * (64 << 10)
            trace.append(entry("alloc", a, 64 << 10, t + 1 + i, [
                CPP, frame("keep%d" % i, "/home/u/leak.py", 100 + i), USER]))
            live.append((a, 64 << 10))
        t += nsites + 1
        for act in ("free_requested", "free_completed"):
            trace.append(entry(act, A0, 4 * MiB, t, [CPP, USER]))
            t += 1
        ann.append({"stage": "END", "name": "ProfilerStep#%d" % k,
                    "device": 0, "time_us": T0 + t})
        t += 1
    return steps_recording(trace, ann, live, seg_size)


def check_leaks(pg):
    path = write_pickle(steps_snapshot(), "steps.pickle")
    html, js = view([path], "steps")
    expect(js.get("files", [{}])[0].get("leak_sites") == 1,
           "view --json: 1 leak site (%s)" % js.get("files"))
    pg.open(html)
    lb = pg.text("#leakbox")
    expect('6 steps "ProfilerStep"' in lb and "leak.py:42:remember" in lb
           and "optim.py" not in lb,
           "leak panel: the planted site only, over 6 steps (%r)" % lb[:300])
    lanes = pg.box("#lanes")
    expect(lanes and lanes["height"] > 10, "annotation lanes are drawn")
    pg.p.mouse.move(lanes["x"] + lanes["width"] * 0.5, lanes["y"] + 8)
    expect('record_function "ProfilerStep#' in pg.text("#info"),
           "hover on a lane names the range (%r)" % pg.text("#info")[:80])
    red0 = pg.red_pixels("#plot")
    pg.p.check("#leaktoggle")
    red1 = pg.red_pixels("#plot")
    expect(red1 > red0 + 200, "highlight leaks colours the leaked bands "
           "(%d -> %d red pixels)" % (red0, red1))
    pg.shot("leaks")
    # clicking a lane zooms to that range
    pg.p.mouse.click(lanes["x"] + lanes["width"] * 0.5, lanes["y"] + 8)
    expect("zoom" in pg.text("#zoominfo"), "click on a lane zooms to it")
    # hover the top band at the end: the leaked allocation, flagged
    plot = pg.box("#plot")
    pg.p.dblclick("#plot")
    hit = False
    for fy in (0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
        pg.p.mouse.move(plot["x"] + plot["width"] - 20,
                        plot["y"] + 10 + (plot["height"] - 36) * fy)
        t = pg.text("#info")
        if "LEAK SUSPECT" in t:
            hit = "leak.py" in t
            break
    expect(hit, "hover on a leaked band says LEAK SUSPECT with its stack")
    expect(not pg.errors, "leaks: 0 console errors %s" % pg.errors[:3])
    # One rule with `memsnap leaks`: a reassigned buffer that grows every
    # step is a leak site in both, though none of its allocations outlives
    # the next step.
    path = write_pickle(steps_snapshot(grow=True), "grow.pickle")
    rc, out, err = run("check", path)
    expect(rc == 0, "the growing-buffer recording is consistent (%s)"
           % (out + err).strip()[-200:])
    rc, out, _ = run("leaks", "--json", "--top", "0", path)
    cli = sorted(x["site"] for d in json.loads(out)["devices"]
                 for x in d["leak_candidates"]) if out else []
    expect(rc == 1 and len(cli) == 2 and any("cache.py:9:grow" in x
                                             for x in cli),
           "leaks: the planted and the growing site (%s)" % cli)
    html, js = view([path], "grow")
    expect(js.get("files", [{}])[0].get("leak_sites") == len(cli),
           "view --json: as many leak sites as `memsnap leaks` (%s)"
           % js.get("files"))
    pg.open(html)
    rows = pg.p.eval_on_selector_all(
        "#leakbox tr.clk td.site", "els => els.map(e => e.textContent)")
    expect(sorted(rows) == cli,
           "leak panel lists the sites of `memsnap leaks` (%s)" % rows)
    lb = pg.text("#leakbox")
    expect("1.000" not in lb and "0.9" in lb and "5/0 of 5" in lb,
           "leak panel: confidence and grew/shrank as `leaks` (%r)"
           % lb[:400])
    expect(not pg.errors, "grow: 0 console errors %s" % pg.errors[:3])
    # --step naming no annotation: the panel gives `memsnap leaks`' reason
    path = write_pickle(steps_snapshot(), "nope.pickle")
    rc, out, _ = run("leaks", "--json", "--step", "Nope", path)
    why = json.loads(out)["devices"][0]["no_steps_reason"] if out else None
    html, js = view([path], "nope", "--step", "Nope")
    pg.open(html)
    lb = pg.text("#leakbox")
    expect(rc == 0 and why == 'no record_function range named "Nope"' and
           why in lb and "No repeated" not in lb,
           "leak panel with --step Nope: the reason of memsnap leaks "
           "(%r; %r)" % (why, lb[:300]))
    expect(not pg.errors, "nope: 0 console errors %s" % pg.errors[:3])
    # more sites than the panel lists: it says how many it shows
    path = write_pickle(many_leaks_snapshot(), "many.pickle")
    rc, out, err = run("check", path)
    expect(rc == 0, "the 60-site recording is consistent (%s)"
           % (out + err).strip()[-200:])
    rc, out, _ = run("leaks", "--json", "--top", "0", path)
    n = json.loads(out)["leak_candidate_count"] if out else -1
    html, js = view([path], "many")
    expect(n == 60 and js.get("files", [{}])[0].get("leak_sites") == 50,
           "60 leak candidates, 50 written for the viewer (%d, %s)"
           % (n, js.get("files")))
    pg.open(html)
    lb = pg.text("#leakbox")
    rows = pg.p.eval_on_selector_all("#leakbox tr.clk", "els => els.length")
    expect("50 of 60 sites (memsnap leaks --top 0 lists all)" in lb and
           rows == 50, "leak panel: 50 rows, says 50 of 60 sites (%d, %r)"
           % (rows, lb[:300]))
    expect(not pg.errors, "many: 0 console errors %s" % pg.errors[:3])
    # level of detail: leak allocations summed into the grey rest are not
    # bands; the panel says how many of the site's allocations are drawn
    path = write_pickle(steps_snapshot(), "steps_lod.pickle")
    for extra, want in (((), 6), (("--detail", "10"), None)):
        html, js = view([path], "steps_lod%d" % len(extra), *extra)
        bands = page_data(html)["files"][0]["devices"][0]["bands"]
        nred = sum(1 for x in bands["site"] if x == 0)
        pg.open(html)
        cells = pg.p.eval_on_selector_all(
            "#leakbox tr.clk td", "els => els.map(e => e.textContent)")
        expect(("%d of 6" % nred) in cells and
               (nred == want if want is not None else nred < 6),
               "leak panel %s: %d of the planted site's 6 allocations "
               "drawn as bands (%s)" % (" ".join(extra) or "default", nred,
                                         cells))


def check_lod_and_compare(pg, src):
    html, js = view([src], "lod", "--budget", "300K", "--detail", "300")
    f = js.get("files", [{}])[0]
    expect(f.get("embedded_entries", 0) < f.get("entries", 0) and
           f.get("bands") <= 301,
           "--budget 300K --detail 300: a part of the trace and 300 bands "
           "(%s)" % f)
    pg.open(html)
    expect("Level of detail" in pg.text("#lodnote"),
           "the page says what the level of detail left out")
    tabs(pg, "lod")
    pg.p.click("button.tab[data-v='history']")
    gaps = []
    pg.p.evaluate("document.getElementById('evlist').scrollTop = 0")
    pg.p.wait_for_timeout(50)
    for k in range(400):   # scroll the virtual list until a gap row shows
        gaps = pg.p.locator("#evlist div.row.gap").all_inner_texts()
        if gaps or not pg.p.evaluate(
                "(() => { const l = document.getElementById('evlist');"
                " const t = l.scrollTop; l.scrollTop = t + 600;"
                " l.dispatchEvent(new Event('scroll'));"
                " return l.scrollTop > t; })()"):
            break
    expect(gaps and "are not in this page" in gaps[0],
           "event list: left-out entries as a gap row (%r)" % gaps[:1])
    pg.p.click("button.tab[data-v='active']")
    pg.shot("lod")
    expect(not pg.errors, "lod: 0 console errors %s" % pg.errors[:3])
    # compare two files
    other = write_pickle(steps_snapshot(), "steps2.pickle")
    html, js = view([src, other], "compare")
    pg.open(html)
    opts = pg.p.locator("#file option").all_inner_texts()
    expect(len(opts) == 2, "file selector lists both files")
    pg.p.click("button.tab[data-v='compare']")
    t = pg.text("#cmptable")
    expect("peak active" in t and "B - A" in t, "compare: figures side by "
           "side (%r)" % t[:80])
    pg.p.select_option("#file", "1")
    expect("steps2.pickle" in pg.text("#title"), "file selector switches "
           "to the second file")
    pg.shot("compare")
    expect(not pg.errors, "compare: 0 console errors %s" % pg.errors[:3])


def check_long_names(pg):
    """2000 frames sharing one 1 MiB filename (a 1.2 MB file whose page
    was 2 GB): the page, near its 8 MiB default budget, opens; its
    stacks show the filename's tail after an ellipsis."""
    longfile = "/home/u/" + "A" * MiB + "/model.py"
    fr = [[frame("step", longfile, i)] for i in range(2000)]
    blocks = [(512, "active_allocated", 512, fr[i]) for i in range(2000)]
    trace = [entry("alloc", A0 + 512 * i, 512, i, fr[i])
             for i in range(2000)]
    snap = {"segments": [segment(A0, 2000 * 512, blocks)],
            "device_traces": [trace]}
    html, js = view([write_pickle(snap, "longname.pickle")], "longname")
    if not js:
        return
    expect(js["bytes"] < 10 * MiB, "long names: a page of %d bytes"
           % js["bytes"])
    pg.open(html)
    expect(not pg.errors, "long names: opens with 0 console errors %s"
           % pg.errors[:3])
    tabs(pg, "long names")


def check_no_trace(pg):
    """A file with no trace entries: Home/End in the history tab (they
    threw: no rows to select), and the active view draws the final
    state's reserved bytes as a flat line (the legend named it, the y
    axis was scaled to it, no line was drawn)."""
    GiB = 1 << 30
    snap = {"segments": [segment(A0, 6 * GiB,
                                 [(GiB, "active_allocated", GiB, [USER]),
                                  (5 * GiB, "inactive", 0, [])])],
            "device_traces": [[]]}
    srcs = [("notrace", write_pickle(snap, "notrace.pickle"))]
    for f in ("maphsge4_select_n__snapshot_dec166a.pickle",
              "muduard_layoutediting__memory_snapshot.pkl"):
        if os.path.exists(os.path.join(REAL, f)):
            srcs.append((f, os.path.join(REAL, f)))
    for name, src in srcs:
        html, js = view([src], "nt-" + name)
        if not js:
            continue
        pg.open(html)
        pg.p.click("button.tab[data-v='history']")
        for key in ("End", "Home", "End", "ArrowDown", "ArrowUp"):
            pg.p.keyboard.press(key)
        pg.p.wait_for_timeout(100)
        expect(not pg.errors, "%s (no trace): Home/End in the history tab, "
               "0 console errors %s" % (name, pg.errors[:3]))
        # no trace entries: no "before entry 0" (there is no entry 0); the
        # layout and the legend name the final state
        pg.p.click("button.tab[data-v='segments']")
        pg.p.click("button.tab[data-v='history']")
        lay = pg.text("#layoutinfo")
        pg.p.click("button.tab[data-v='active']")
        leg = pg.text("#tlegend")
        expect("entry 0" not in lay + leg and
               "at the final state (no trace entries)" in lay and
               "selected: at the final state (no trace entries)" in leg,
               "%s (no trace): the layout and the legend say final state, "
               "not entry 0 (%r; %r)" % (name, lay[:120], leg[-80:]))
        if name != "notrace":
            continue
        pg.p.click("button.tab[data-v='active']")
        pg.p.wait_for_timeout(100)
        # rows of the plot's right half drawn grey (r = g = b < 200)
        # across: the frame's top and bottom, and the reserved line
        grey = pg.p.evaluate("""() => {
          const c = document.getElementById('plot'), g = c.getContext('2d');
          const w = c.width, h = c.height;
          const d = g.getImageData(0, 0, w, h).data, rows = [];
          for (let y = 0; y < h; y++) {
            let n = 0;
            for (let x = w >> 1; x < w - 20; x++) {
              const i = 4 * (y * w + x);
              if (d[i] < 200 && d[i] === d[i + 1] && d[i] === d[i + 2]) n++;
            }
            if (n > 0.9 * ((w >> 1) - 20)) rows.push(y);
          }
          return rows;
        }""")
        info = pg.text("#zoominfo")
        expect(len(grey) >= 3 and "reserved 6.0 GiB" in info and
               "allocated 1.0 GiB" in info,
               "no trace: the reserved level drawn as a flat line across "
               "the plot (grey rows %s: the frame's and the line's), the page "
               "says there is no timeline (%s)" % (grey, info))


def main():
    chrome = None
    for c in ("chromium", "chromium-browser", "google-chrome"):
        chrome = chrome or shutil.which(c)
    if not chrome:
        skip("view: no Chromium (make test-deps installs Debian's chromium): "
             "the viewer was NOT checked")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        # meson may have found another python3 than the project's .venv
        vpy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                           "..", ".venv", "bin", "python")
        if os.path.exists(vpy) and os.path.realpath(vpy) != \
                os.path.realpath(sys.executable) and \
                not os.environ.get("MEMSNAP_VIEW_REEXEC"):
            os.environ["MEMSNAP_VIEW_REEXEC"] = "1"
            os.execv(vpy, [vpy, os.path.abspath(__file__), MEMSNAP])
        skip("view: Playwright missing (make build pip-installs it into "
             ".venv): the viewer was NOT checked")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.path.realpath(chrome),
                                    args=["--no-sandbox"])
        pg = Page(browser)
        check_real(pg)
        steps = write_pickle(steps_snapshot(), "interact.pickle")
        cran = os.path.join(REAL, "cranberrii_ftcourse__memory_snapshot.pickle")
        check_interaction(pg, cran if os.path.exists(cran) else steps)
        check_oom(pg)
        check_leaks(pg)
        check_long_names(pg)
        check_no_trace(pg)
        check_band_choice()
        check_lod_and_compare(
            pg, cran if os.path.exists(cran) else
            write_pickle(churn_snapshot(), "churn.pickle"))
        browser.close()
    shutil.rmtree(TMP, ignore_errors=True)
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)


if __name__ == "__main__":
    main()
