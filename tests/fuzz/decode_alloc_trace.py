#!/usr/bin/env python3
"""Print an alloc_trace fuzz input as the operations fuzz_alloc_trace.c
runs (same decoding), to debug a crash file by hand.

usage: decode_alloc_trace.py FILE
"""
import struct
import sys

OPS = ['malloc', 'malloc', 'free', 'free_bad', 'record_stream',
       'empty_cache', 'settings', 'settings_raw', 'complete_events',
       'history', 'snapshot', 'fraction']
CONFS = ['', 'expandable_segments:True', 'max_split_size_mb:40',
         'garbage_collection_threshold:0.6,max_split_size_mb:64',
         'roundup_power2_divisions:4',
         'roundup_power2_divisions:[256:1,512:2,1024:4,>:8]',
         'expandable_segments:False,max_split_size_mb:20',
         'expandable_segments:True,garbage_collection_threshold:0.5']
EDGES = [1, 511, 512, 513, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 1,
         (2 << 20) - 512, 2 << 20, (10 << 20) + 1, 20 << 20, (20 << 20) + 1,
         40 << 20, 64 << 20, 1 << 30, (4 << 30) + 1]
STREAMS = [0, 0x1000, 0x2000, 0x3000]


def main():
    data = open(sys.argv[1], 'rb').read()
    pos = 0

    def u8():
        nonlocal pos
        if pos < len(data):
            pos += 1
            return data[pos - 1]
        return 0

    def u32():
        return sum(u8() << (8 * i) for i in range(4))

    h = u8()
    print('profile %s, manual events %s, conf %r' % (
        'cuda' if h & 1 else 'npu', bool(h & 2), CONFS[(h >> 2) % 8]))
    if h & 0x80:
        c = u8()
        print('history on: context %d, max_entries %d' % (c & 3, 1 + (c >> 2)))
    n = 0
    live = 0
    while pos < len(data):
        n += 1
        op = OPS[u8() % 12]
        if op == 'malloc':
            c, v = u8(), u32()
            kind = c & 3
            size = [v % (1 << 20) + 1, v % (32 << 20) + 1, v % (1 << 30),
                    EDGES[v % len(EDGES)]][kind]
            print('%3d malloc(%d) device %d stream 0x%x' % (
                n, size, (c >> 4) & 1, STREAMS[(c >> 2) & 3]))
        elif op in ('free', 'free_bad'):
            print('%3d %s(live[%d %% nlive])' % (n, op, u8()))
        elif op == 'record_stream':
            i = u8()
            print('%3d record_stream(live[%d %% nlive], 0x%x)' % (
                n, i, STREAMS[(i >> 6) & 3]))
        elif op == 'empty_cache':
            print('%3d empty_cache(%d)' % (n, -1 if u8() & 1 else 0))
        elif op == 'settings':
            print('%3d set_allocator_settings(%r)' % (n, CONFS[u8() % 8]))
        elif op == 'settings_raw':
            k = u8() % 64
            s = data[pos:pos + k]
            pos += len(s)
            print('%3d set_allocator_settings(%r)' % (n, s[:63]))
        elif op == 'complete_events':
            print('%3d complete_events(0x%x)' % (n, STREAMS[u8() & 3]))
        elif op == 'history':
            c = u8()
            print('%3d history toggle: context %d, max_entries %d' % (
                n, c & 3, 1 + (c >> 2)))
        elif op == 'snapshot':
            print('%3d snapshot' % n)
        else:
            print('%3d memory_fraction(%s)' % (n, [1.0, 0.5, 0.1, 0.02][u8() & 3]))


if __name__ == '__main__':
    main()
