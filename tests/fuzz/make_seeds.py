#!/usr/bin/env python3
"""Write the hand-made seed inputs of the fuzz targets into tests/corpus/.

Run once when the input format of a target changes; the files are
committed.  Inputs that crashed a target (tests/fuzz/run.sh copies them,
named crash-*, timeout-*, oom-*) live next to these seeds and are never
rewritten here.
"""
import gzip
import io
import os
import pickle
import struct
import zipfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'corpus')

CONFS = {
    'seed-empty': '',
    'seed-expandable': 'expandable_segments:True',
    'seed-max-split': 'max_split_size_mb:128',
    'seed-max-split-small': 'max_split_size_mb:19',
    'seed-gc': 'garbage_collection_threshold:0.6,max_split_size_mb:64',
    'seed-gc-bad': 'garbage_collection_threshold:1.5',
    'seed-roundup-scalar': 'roundup_power2_divisions:4',
    'seed-roundup-list': 'roundup_power2_divisions:[256:1,512:2,1024:4,>:8]',
    'seed-roundup-unclosed': 'roundup_power2_divisions:[256:1,512:2',
    'seed-roundup-not-pow2': 'roundup_power2_divisions:3',
    'seed-large-segment': 'large_segment_size_mb:32,max_split_size_mb:40',
    'seed-bool-bad': 'expandable_segments:true',
    'seed-unknown-key': 'no_such_key:1',
    'seed-release-lock-cuda': 'release_lock_on_cudamalloc:True',
    'seed-release-lock-npu': 'release_lock_on_npumalloc:True',
    'seed-npu-page-1g': 'page_size:1g,segment_size_mb:64,base_addr_aligned_kb:16',
    'seed-fraction': 'per_process_memory_fraction:0.5',
    'seed-spaces': ' expandable_segments : True , max_split_size_mb : 100 ',
    'seed-separators': 'max_split_size_mb,100',
    'seed-trailing-colon': 'max_split_size_mb:',
    'seed-negative': 'max_split_size_mb:-1',
    'seed-huge': 'max_split_size_mb:99999999999999999999999',
    'seed-pinned-threads': 'pinned_num_register_threads:256',
    'seed-throw-oom': 'throw_on_cudamalloc_oom:True',
}

# fuzz_alloc_trace.c opcodes (the byte is taken modulo 12).
OP = dict(MALLOC=0, FREE=2, FREE_BAD=3, RECORD=4, EMPTY=5, SET=6, SETRAW=7,
          COMPLETE=8, HISTORY=9, SNAP=10, FRACTION=11)


def malloc(kind, v, stream=0, dev=0):
    return (bytes([OP['MALLOC'], kind | (stream << 2) | (dev << 4)]) +
            struct.pack('<I', v))


def op(name, *b):
    return bytes([OP[name], *b])


def traces():
    progs = {}
    # Small/large mix, frees, empty_cache.
    p = bytes([0])
    for i in range(20):
        p += malloc(i % 4, 1000 * i + 7)
    for i in range(10):
        p += op('FREE', i * 3)
    progs['seed-mix'] = p + op('EMPTY', 1)
    # Manual events (header bit 1): record_stream, free, complete events.
    p = bytes([2])
    for i in range(8):
        p += malloc(1, 3 << 20, stream=i % 4)
    for i in range(8):
        p += op('RECORD', ((i % 4) << 6) | i)
    for i in range(4):
        p += op('FREE', 0)
    p += op('EMPTY', 1) + op('COMPLETE', 1) + op('COMPLETE', 2) + malloc(3, 5)
    progs['seed-streams'] = p
    # Expandable segments (conf 1), cuda profile.
    p = bytes([1 | (1 << 2)])
    for i in range(12):
        p += malloc(2, (i + 1) * 50_000_000)
    p += op('FREE', 5) + op('FREE', 2) + op('SET', 2) + malloc(3, 11)
    progs['seed-expandable'] = p + op('EMPTY', 0)
    # OOM: memory fraction 0.1, then large requests.
    p = bytes([0]) + malloc(3, 16) + op('FRACTION', 2)
    p += malloc(2, 900_000_000) + malloc(2, 900_000_000)
    progs['seed-oom'] = p + op('FREE', 0) + op('FRACTION', 0) + malloc(3, 15)
    # History (header bit 7), snapshots, bogus frees, raw settings.
    p = bytes([0x80 | 1]) + bytes([3 | (20 << 2)])
    for i in range(10):
        p += malloc(i % 3, 77777 * (i + 1))
    p += op('SNAP') + op('FREE_BAD', 3) + op('FREE', 1) + op('HISTORY', 2)
    p += op('SETRAW', 24) + b'max_split_size_mb:40,ga' + op('SET', 3)
    p += op('SNAP')
    for i in range(30):
        p += op('FREE', i)
    progs['seed-history-snapshot'] = p + op('EMPTY', 1) + op('SNAP')
    # Every edge size, on the four streams.
    p = bytes([4 << 2])
    for i in range(17):
        p += malloc(3, i, stream=i % 4)
    for i in range(17):
        p += op('FREE', 0)
    progs['seed-edges'] = p
    return progs


A0 = 0x7f0000000000


def frame(name, filename, line):
    return {"filename": filename, "line": line, "name": name}


def snapshot(frames, n=40, device=0):
    """A small consistent snapshot whose trace entries share `frames`."""
    seg = {"device": device, "address": A0, "total_size": 2 << 20,
           "allocated_size": 512, "active_size": 512, "requested_size": 400,
           "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": frames,
           "blocks": [{"address": A0, "size": 512, "requested_size": 400,
                       "state": "active_allocated", "frames": frames},
                      {"address": A0 + 512, "size": (2 << 20) - 512,
                       "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    trace = [{"action": "segment_alloc", "addr": A0, "size": 2 << 20,
              "stream": 0, "time_us": 1, "frames": frames},
             {"action": "alloc", "addr": A0, "size": 400, "stream": 0,
              "time_us": 2, "frames": frames}]
    for i in range(n):
        a = A0 + 512 + 512 * i
        trace.append({"action": "alloc", "addr": a, "size": 512,
                      "stream": 0, "time_us": 3 + 3 * i, "frames": frames,
                      "pool_id": (0, 0), "compile_context": "N/A",
                      "user_metadata": ""})
        trace.append({"action": "free_requested", "addr": a, "size": 512,
                      "stream": 0, "time_us": 4 + 3 * i, "frames": frames})
        trace.append({"action": "free_completed", "addr": a, "size": 512,
                      "stream": 0, "time_us": 5 + 3 * i, "frames": frames})
    return {"segments": [seg], "device_traces": [trace],
            "allocator_settings": {"expandable_segments": False},
            "external_annotations": [{"stage": "START", "name": "step",
                                      "device": 0, "time_us": 1}]}


def pickles():
    """Seeds of the reader (tests/corpus/pickle_read): the shapes its fast
    path decodes and the inputs of issues 11, 13 and 14.  small_* must
    read, hostile_* must be refused, generic_* either (the fuzz target
    checks that every way of reading agrees)."""
    out = {}
    fr = [frame("forward", "/m/model.py", 12), frame("f", "/m/a.py", 3),
          frame("forward", "/m/model.py", 12)]  # a frame twice (recursion)
    for proto in (2, 4, 5):
        out['small_shared_p%d.bin' % proto] = pickle.dumps(snapshot(fr),
                                                           protocol=proto)
    # one-item dicts (SETITEM) and lists (APPEND) in the batches
    one = snapshot([frame("g", "/m/b.py", 1)], n=3)
    one["device_traces"][0].append({"action": "snapshot"})
    out['small_single_items_p4.bin'] = pickle.dumps(one, protocol=4)
    # lone surrogates (CPython writes them with surrogatepass)
    out['small_surrogates_p4.bin'] = pickle.dumps(
        snapshot([frame("f\ud800", "/m/\udcff.py", 1)], n=2), protocol=4)
    # raw invalid UTF-8 in SHORT_BINUNICODE (no CPython str holds it)
    out['small_invalid_utf8_p4.bin'] = pickle.dumps(
        snapshot([frame("nameAAAA", "/m/fileBBBB.py", 1)], n=2),
        protocol=4).replace(b"AAAA", b"\xff\xfe\xe2\x82").replace(
            b"BBBB", b"\xed\xa0\x80!")
    # frame lists shared through the memo (convert --json stays small)
    stacks = [[frame("f%d_%d" % (k, i), "/m/l%d.py" % i, i)
               for i in range(60)] for k in range(3)]
    shared = snapshot(stacks[0], n=0)
    for i in range(150):
        shared["device_traces"][0].append(
            {"action": "annotate", "addr": A0, "size": 400, "stream": 0,
             "time_us": 10 + i, "frames": stacks[i % 3]})
    out['small_memo_stacks_p4.bin'] = pickle.dumps(shared, protocol=4)
    # a declared length far beyond the input (a stream refuses the item,
    # a buffer counts what remains)
    out['hostile_binunicode_huge.bin'] = (b"\x80\x04\x95\x10\x00\x00\x00"
                                          b"\x00\x00\x00\x00]\x94(X" +
                                          struct.pack("<I", 0xF7000000) +
                                          b"abc" * 100)
    # a device that is not an index: refused by every command
    out['hostile_device_200m.bin'] = pickle.dumps(
        snapshot(fr, n=1, device=200000000), protocol=4)
    # a trace dict that refers to its own frame list before it is stored
    # (the fast path rolls back; the generic interpreter reads it)
    d = pickle.dumps(snapshot(fr, n=1), protocol=4)
    out['generic_batch_rollback.bin'] = d.replace(b"time_us", b"time_ux", 1)
    # wrong inputs: text, a zip (torch.save), gzip (read directly from a
    # file; the buffer reader sees the magic)
    out['generic_text.bin'] = b"this is not a snapshot\nsecond line\n"
    z = io.BytesIO()
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
    out['generic_zip.bin'] = z.getvalue()
    out['generic_gzip.bin'] = gzip.compress(out['small_shared_p4.bin'])
    return out


def main():
    os.makedirs(os.path.join(ROOT, 'pickle_read'), exist_ok=True)
    for k, v in pickles().items():
        with open(os.path.join(ROOT, 'pickle_read', k), 'wb') as f:
            f.write(v)
    os.makedirs(os.path.join(ROOT, 'conf_parse'), exist_ok=True)
    os.makedirs(os.path.join(ROOT, 'alloc_trace'), exist_ok=True)
    for k, v in CONFS.items():
        with open(os.path.join(ROOT, 'conf_parse', k), 'w') as f:
            f.write(v)
    for k, v in traces().items():
        with open(os.path.join(ROOT, 'alloc_trace', k), 'wb') as f:
            f.write(v)


if __name__ == '__main__':
    main()
