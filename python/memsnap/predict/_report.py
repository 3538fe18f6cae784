"""memsnap.predict._report -- results of a prediction: figures, sites, text.

:func:`results` turns a finished :class:`~._session.Session` into plain
dicts (the ``--json`` object and :class:`memsnap.predict.Prediction`):
per configuration the peaks, fragmentation and OOM; for the run's own
configuration also the top allocation sites at the peak, computed from its
trace (every ``alloc`` / ``free_completed`` entry: the live blocks at the
moment allocated memory peaked, grouped by the innermost frame of the
user's code).  :func:`text` renders the report people read.
"""

from __future__ import annotations

from . import _frames

TOP_SITES = 10


def fmt_bytes(n: int | None) -> str:
    """Binary units, as memory_summary (``12.34 GiB``)."""
    if n is None:
        return "-"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


def peak_sites(snapshot: dict, device: int, top: int = TOP_SITES) -> dict:
    """Live blocks at the allocated peak of ``device``'s trace, grouped by
    user site: ``{"peak_allocated_bytes", "blocks", "sites": [{"site",
    "frame", "requested_bytes", "blocks"}...]}`` (largest first).  Sizes
    are the trace's: requested bytes, as PyTorch records ``alloc`` and
    ``free_completed`` entries."""
    traces = snapshot.get("device_traces", [])
    entries = traces[device] if device < len(traces) else []
    cur = peak = 0
    peak_i = -1
    for i, e in enumerate(entries):
        a = e["action"]
        if a == "alloc":
            cur += e["size"]
            if cur > peak:
                peak, peak_i = cur, i
        elif a == "free_completed":
            cur -= e["size"]
    live: dict[int, dict] = {}
    for e in entries[: peak_i + 1]:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e
        elif a == "free_completed":
            live.pop(e["addr"], None)
    by_site: dict[str, dict] = {}
    for e in live.values():
        uf = _frames.user_frames(e.get("frames", []))
        frame = uf[0] if uf else None
        key = _frames.site(frame)
        s = by_site.get(key)
        if s is None:
            s = by_site[key] = {"site": key, "frame": frame, "requested_bytes": 0,
                                     "blocks": 0}
        s["requested_bytes"] += e["size"]
        s["blocks"] += 1
    sites = sorted(by_site.values(), key=lambda s: (-s["requested_bytes"], s["site"]))
    return {"peak_requested_bytes": peak, "blocks": len(live), "sites": sites[:top]}


def user_frame_share(snapshot: dict, device: int) -> float:
    """Fraction of ``alloc`` entries whose stack has a user frame."""
    traces = snapshot.get("device_traces", [])
    entries = traces[device] if device < len(traces) else []
    allocs = [e for e in entries if e["action"] == "alloc"]
    if not allocs:
        return 0.0
    n = sum(1 for e in allocs if _frames.user_frames(e.get("frames", [])))
    return n / len(allocs)


def _config_result(t, memory: int, devices: list[int]) -> dict:
    per = {}
    for d in devices:
        s = t.alloc.stats(d)
        pr = t.peak_reserved.get(d, 0)
        at = t.allocated_at_peak.get(d, 0)
        per[d] = {
            "peak_allocated_bytes": s.allocated_bytes[0].peak,
            "peak_requested_bytes": s.requested_bytes[0].peak,
            "peak_reserved_bytes": s.reserved_bytes[0].peak,
            "allocated_at_peak_reserved_bytes": at,
            "fragmentation_bytes": pr - at,
            "fragmentation": (pr - at) / pr if pr else 0.0,
            "num_alloc_retries": s.num_alloc_retries,
            "segment_allocs": s.num_device_alloc,
        }
    head = max(per, key=lambda d: per[d]["peak_reserved_bytes"]) if per else 0
    h = per.get(head, {})
    return {
        "profile": t.config.profile,
        "alloc_conf": t.config.alloc_conf,
        "fits": t.oom is None,
        "device": head,
        "peak_allocated_bytes": h.get("peak_allocated_bytes", 0),
        "peak_requested_bytes": h.get("peak_requested_bytes", 0),
        "peak_reserved_bytes": h.get("peak_reserved_bytes", 0),
        "fragmentation_bytes": h.get("fragmentation_bytes", 0),
        "fragmentation": h.get("fragmentation", 0.0),
        "memory_bytes": memory,
        "devices": {str(d): v for d, v in per.items()},
        "oom": t.oom.to_dict() if t.oom is not None else None,
    }


def results(session, snapshot: dict | None) -> dict:
    """The prediction as one dict (see docs/predict.md, "JSON")."""
    devices = sorted(session.used_devices) or [session.device_state.device]
    configs = [_config_result(t, session.memory, devices) for t in session.targets]
    if not configs:  # the script allocated nothing on the device
        configs = [{
            "profile": session.configs[0].profile or "npu",
            "alloc_conf": session.configs[0].alloc_conf or "", "fits": True,
            "device": devices[0], "peak_allocated_bytes": 0, "peak_requested_bytes": 0,
            "peak_reserved_bytes": 0,
            "fragmentation_bytes": 0, "fragmentation": 0.0, "memory_bytes": session.memory,
            "devices": {}, "oom": None}]
    r = dict(configs[0])
    r["what_if"] = configs[1:]
    r["what_if_repeated"] = list(session.what_if_repeated)
    r["top_sites"] = []
    r["user_frame_share"] = None
    if snapshot is not None:
        ps = peak_sites(snapshot, r["device"])
        r["top_sites"] = [{k: v for k, v in s.items() if k != "frame"} | {
            "filename": s["frame"]["filename"] if s["frame"] else None,
            "line": s["frame"]["line"] if s["frame"] else None} for s in ps["sites"]]
        r["user_frame_share"] = user_frame_share(snapshot, r["device"])
    r["peak_phase"] = session.peak_phase
    r["reserve_bytes"] = session.extra_bytes
    r["snapshot"] = session.snapshot_written
    r["snapshot_error"] = session.write_error
    r["allocator_events"] = session.events
    r["elapsed_s"] = round(session.elapsed, 3)
    r["num_devices"] = session.devices
    r["rank"] = session.rank
    r["world_size"] = session.world_size
    r["eager_compile"] = session.compile_calls
    r["values_read_as_zero"] = session.unknown_scalars
    r["threads_not_seen"] = session.threads_not_seen
    r["thread_errors"] = [{"site": e["site"], "error": e["error"],
                           "threads": len(e["threads"])}
                          for e in session.thread_errors.values()]
    return r


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _count(n: int, noun: str) -> str:
    """``1 call``, ``3 calls``: a count and its noun, plural but for 1."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _pct(x: float) -> str:
    """A share as a percentage, one decimal; more when one would say
    ``100.0%`` for less than all or ``0.0%`` for more than nothing
    (99.98% is not 100.0%), up to four, then ``>99.9999%`` / ``<0.0001%``."""
    p = 100 * x
    if not 0 < x < 1:
        return f"{p:.1f}%"
    for d in (1, 2, 3, 4):
        s = f"{p:.{d}f}"
        if 0 < float(s) < 100:
            return s + "%"
    return ">99.9999%" if p > 50 else "<0.0001%"


def text(r: dict, script: str | None = None, script_error: str | None = None) -> str:
    """The human-readable report of :func:`results`."""
    out = []
    mem = r["memory_bytes"]
    where = f"{script}: " if script else ""
    rank = (f", rank {r['rank']} of {r['world_size']}" if r.get("world_size") else "")
    conf = r["alloc_conf"] or "default"
    out.append(f"memsnap predict: {where}profile {r['profile']}, alloc conf {conf}, "
               f"device of {fmt_bytes(mem)}{rank}")
    out.append(f"  {_count(r['allocator_events'], 'allocator event')} in {r['elapsed_s']:.2f} s; "
               f"device {r['device']}")
    if r.get("reserve_bytes"):
        out.append(f"  includes --reserve {fmt_bytes(r['reserve_bytes'])} per device")
    if r.get("eager_compile"):
        out.append(f"  torch.compile ran eagerly ({_count(r['eager_compile'], 'call')})")
    if r.get("values_read_as_zero"):
        out.append(f"  {_count(r['values_read_as_zero'], 'tensor value read')} (.item(), bool(), "
                   f".tolist(), .numpy()...) gave 0: fake tensors have no values")
    if not r["allocator_events"]:
        out.append("  no device memory was allocated: the code made no device allocation "
                   "(the snapshot is empty)")
    phase = f"  (during {r['peak_phase']})" if r.get("peak_phase") else ""
    out.append(f"  peak allocated   {fmt_bytes(r['peak_allocated_bytes']):>12}{phase}")
    out.append(f"  peak requested   {fmt_bytes(r['peak_requested_bytes']):>12}  "
               f"(the tensors' own bytes, before the allocator's rounding)")
    out.append(f"  peak reserved    {fmt_bytes(r['peak_reserved_bytes']):>12}")
    out.append(f"  fragmentation    {fmt_bytes(r['fragmentation_bytes']):>12}  "
               f"({_pct(r['fragmentation'])} of reserved at its peak: reserved but not "
               f"allocated)")
    if r["top_sites"]:
        out.append("  top allocation sites at the peak (live blocks by the innermost line of "
                   "your code, requested bytes):")
        for s in r["top_sites"]:
            blocks = _plural(s['blocks'], 'block  ', 'blocks ')
            out.append(f"    {fmt_bytes(s['requested_bytes']):>12}  {s['blocks']:6d} {blocks} "
                       f"{s['site']}")
    unseen = r.get("threads_not_seen", 0)
    if unseen:
        out.append(f"  device work in {_count(unseen, 'other thread')} was not seen (predict follows "
                   f"the main thread only; {_plural(unseen, 'it', 'each')} failed at its first "
                   f"device operator):")
        for e in r["thread_errors"]:
            out.append(f"    {_count(e['threads'], 'thread')}  {e['site']}: {e['error']}")
    oom = r["oom"]
    if oom is None:
        # (the peak already holds the reserve: it is an allocation)
        head = mem - r["peak_reserved_bytes"]
        figures = (f"peak reserved {fmt_bytes(r['peak_reserved_bytes'])} of {fmt_bytes(mem)}; "
                   f"{fmt_bytes(max(head, 0))} to spare")
        if unseen:
            out.append(f"verdict: UNKNOWN  (device work in {_count(unseen, 'other thread')} was not "
                       f"seen: predict follows the main thread only; the main thread's "
                       f"{figures})")
        elif r.get("complete", True):
            out.append(f"verdict: FITS  ({figures})")
        else:
            who = "the script" if script_error or script else "the code"
            out.append(f"verdict: FITS so far  ({who} failed before its end: the figures "
                       f"cover what ran; {figures})")
    else:
        out.append(f"verdict: OUT OF MEMORY on device {oom['device']} at {oom['line']}")
        out.append(f"  tried to allocate {fmt_bytes(oom['requested_bytes'])}; "
                   f"{fmt_bytes(oom['free_bytes'])} free of {fmt_bytes(oom['total_bytes'])}; "
                   f"{fmt_bytes(oom['reserved_bytes'])} reserved, "
                   f"{fmt_bytes(oom['allocated_bytes'])} allocated")
        if oom.get("phase"):
            out.append(f"  during {oom['phase']}")
        if oom["stack"]:
            out.append("  user stack (innermost first):")
            for f in oom["stack"]:
                out.append(f"    {_frames.site(f)}")
        out.append(f"  allocator: {oom['message']}")
    if r["what_if"]:
        rows = [r] + r["what_if"]
        labels = [f"{c['profile']} {c['alloc_conf'] or '(default)'}" for c in rows]
        # the label column fits the longest label (42 wide at least)
        w = max([42] + [len(x) + 2 for x in labels])
        out.append("")
        out.append(f"{'what-if (same run)':<{w + 2}}peak allocated  peak reserved"
                   "  fragmentation  fits")
        for c, label in zip(rows, labels):
            fits = "yes" if c["fits"] else f"OOM at {c['oom']['line']}"
            out.append(f"  {label:<{w}}{fmt_bytes(c['peak_allocated_bytes']):>14}"
                       f"{fmt_bytes(c['peak_reserved_bytes']):>15}"
                       f"{fmt_bytes(c['fragmentation_bytes']):>15}  {fits}")
        out.append("  (an OOM configuration's peaks are those reached before its OOM)")
    for d in r.get("what_if_repeated", []):
        out.append(f"what-if {d['what_if']!r} is the configuration of {d['same_as']} "
                   f"({d['profile']} {d['alloc_conf'] or '(default)'}): not run twice")
    if script_error:
        out.append("")
        out.append("the script failed (not a predicted OOM):")
        out.append(script_error.rstrip())
    if r["snapshot"]:
        kind = "OOM snapshot" if oom is not None else "snapshot"
        out.append(f"{kind}: {r['snapshot']} (open at https://pytorch.org/memory_viz, or "
                   f"memsnap view/summary)")
    elif r.get("snapshot_error"):
        out.append(f"snapshot NOT written: {r['snapshot_error']}")
    return "\n".join(out) + "\n"
