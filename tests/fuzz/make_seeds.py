#!/usr/bin/env python3
"""Write the hand-made seed inputs of the fuzz targets into tests/corpus/.

Run once when the input format of a target changes; the files are
committed.  Inputs that crashed a target (tests/fuzz/run.sh copies them,
named crash-*, timeout-*, oom-*) live next to these seeds and are never
rewritten here.
"""
import os
import struct

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


def main():
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
