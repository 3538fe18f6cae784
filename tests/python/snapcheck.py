"""Checks of the snapshot schema (cuda-reference §2) shared by the tests."""

from __future__ import annotations

ACTIONS = {
    "alloc", "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
    "annotate", "workspace_snapshot",
}
TOP = {
    "segments": list, "device_traces": list, "allocator_settings": dict,
    "external_annotations": list, "host_segments": list, "host_traces": list,
}
SEGMENT = {
    "device": int, "address": int, "total_size": int, "allocated_size": int,
    "active_size": int, "requested_size": int, "stream": int,
    "segment_type": str, "segment_pool_id": tuple, "is_expandable": bool,
    "frames": list, "blocks": list,
}
BLOCK = {"address": int, "size": int, "requested_size": int, "state": str, "frames": list}
ENTRY = {
    "action": str, "size": int, "stream": int, "time_us": int,
    "compile_context": str, "user_metadata": str, "pool_id": tuple,
}
FRAME = {"filename": str, "line": int, "name": str}


def _types(d: dict, spec: dict, where: str, errors: list) -> None:
    for key, typ in spec.items():
        if key not in d:
            errors.append(f"{where}: missing key {key!r}")
        elif typ is int and isinstance(d[key], bool):
            errors.append(f"{where}: {key!r} is a bool, expected int")
        elif not isinstance(d[key], typ):
            errors.append(f"{where}: {key!r} is {type(d[key]).__name__}, expected {typ.__name__}")


def _frames(frames, where, errors):
    for i, f in enumerate(frames):
        _types(f, FRAME, f"{where}.frames[{i}]", errors)


def schema_errors(s: dict) -> list:
    """Every deviation of snapshot `s` from cuda-reference §2 / §7.2."""
    errors: list = []
    _types(s, TOP, "snapshot", errors)
    if errors:
        return errors
    for i, seg in enumerate(s["segments"]):
        w = f"segments[{i}]"
        _types(seg, SEGMENT, w, errors)
        _frames(seg.get("frames", []), w, errors)
        addr = seg.get("address", 0)
        total = 0
        for j, b in enumerate(seg.get("blocks", [])):
            wb = f"{w}.blocks[{j}]"
            _types(b, BLOCK, wb, errors)
            _frames(b.get("frames", []), wb, errors)
            if b.get("address") != addr:
                errors.append(f"{wb}: address {b.get('address')} != running {addr}")
            if b.get("state") not in ("active_allocated", "active_pending_free", "inactive"):
                errors.append(f"{wb}: bad state {b.get('state')!r}")
            addr += b.get("size", 0)
            total += b.get("size", 0)
        if total != seg.get("total_size"):
            errors.append(f"{w}: block sizes {total} != total_size {seg.get('total_size')}")
        if seg.get("segment_type") not in ("large", "small"):
            errors.append(f"{w}: bad segment_type")
        if len(seg.get("segment_pool_id", ())) != 2:
            errors.append(f"{w}: segment_pool_id is not a pair")
    for d, trace in enumerate(s["device_traces"]):
        if not isinstance(trace, list):
            errors.append(f"device_traces[{d}] is not a list")
            continue
        for k, e in enumerate(trace):
            w = f"device_traces[{d}][{k}]"
            _types(e, ENTRY, w, errors)
            if e.get("action") not in ACTIONS:
                errors.append(f"{w}: unknown action {e.get('action')!r}")
            if e.get("action") == "oom":
                if not isinstance(e.get("device_free"), int) or "addr" in e:
                    errors.append(f"{w}: oom entry needs device_free and no addr")
            elif not isinstance(e.get("addr"), int) or isinstance(e.get("addr"), bool):
                errors.append(f"{w}: no int addr")
            if "frames" in e:
                _frames(e["frames"], w, errors)
            if "internal_metadata" in e and not e["internal_metadata"]:
                errors.append(f"{w}: empty internal_metadata must be absent")
    for i, a in enumerate(s["external_annotations"]):
        _types(a, {"name": str, "stage": str, "device": int, "time_us": int},
               f"external_annotations[{i}]", errors)
    devices = {seg["device"] for seg in s["segments"] if "device" in seg}
    if s["device_traces"]:
        for dev in devices:
            if dev >= len(s["device_traces"]):
                errors.append(f"device {dev} has segments but no device_traces list")
    return errors
