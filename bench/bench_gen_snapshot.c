/*
 * bench_gen_snapshot.c -- writes a large synthetic snapshot (rows 4, 5):
 * a 2.6-generation dict with segments, blocks and one device trace whose
 * entries carry deep, mostly distinct stacks (Python frames over C++
 * frames, as the real inputs), sized to about TARGET_BYTES.  The trace is
 * consistent with the segments (`memsnap check` passes): every allocation
 * lies in a free block and is freed before the next one.
 *
 * A stack is a walk along a call path of 30 to 79 frames: mostly the next
 * frame of the path, one step in eight a jump of up to 7 frames, from a
 * random start, so one stack in three is new.  Frames that follow one
 * another in a path are first seen together, as in real recordings, so
 * the model stores about 1.25 bytes per frame of a stack (the 8 real
 * inputs: 1.00 to 1.13; a walk of random 1-7 frame jumps, this program
 * before 2026-12-02: 1.87, no real stack looks like that).
 *
 * It builds the snapshot model (src/snapshot.h) and writes it with the
 * project's pickle writer; a small first pass measures the bytes per
 * entry.  Deterministic (fixed seed).
 *
 * usage: bench_gen_snapshot PATH [TARGET_BYTES]
 */
#include <sys/stat.h>

#include "bench_common.h"
#include "api/api.h"
#include "runtime/runtime.h"

#define NFRAMES 6000

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}

static void die(const char *what) {
  fprintf(stderr, "bench_gen_snapshot: %s failed\n", what);
  exit(1);
}

static msnap_str_t str(msnap_snap_t *s, const char *fmt, int i) {
  char buf[160];
  int n = snprintf(buf, sizeof buf, fmt, i);
  msnap_str_t id = msnap__snap_intern(s, buf, (size_t)n);
  if (id == 0)
    die("intern");
  return id;
}

static msnap_snap_t *generate(uint64_t nentries) {
  rng = 0x243f6a8885a308d3ull;
  msnap_snap_t *s = msnap__snap_new();
  if (s == NULL)
    die("snap_new");
  s->generation = MSNAP_GEN_2_6;
  s->top_keys = MSNAP_TOP_SEGMENTS | MSNAP_TOP_DEVICE_TRACES;
  uint32_t *frames = malloc(NFRAMES * sizeof *frames);
  for (int i = 0; i < NFRAMES; i++) {
    msnap_frame_t f;
    memset(&f, 0, sizeof f);
    if (i % 3 == 0) { /* C++ frame */
      f.name = str(s, "at::native::kernel_launch_%d", i);
      f.filename = msnap__snap_intern(s, "??", 2);
      f.line = 0;
    } else {
      f.name = str(s, "forward_%d", i);
      f.filename = str(s, "/home/user/project/model/layer_%d.py", i % 300);
      f.line = 10 + (i * 37) % 900;
    }
    frames[i] = msnap__snap_frame(s, &f);
    if (frames[i] == UINT32_MAX)
      die("frame");
  }
  /* Segments: 256 of 20 MiB, 4 blocks each. */
  uint64_t base = 0x7f0000000000ull;
  for (int i = 0; i < 256; i++) {
    msnap_ssegment_t *g = msnap__snap_add_segment(s);
    if (g == NULL)
      die("segment");
    g->device = 0;
    g->address = base + (uint64_t)i * (20u << 20);
    g->total_size = 20u << 20;
    g->stream = 0;
    g->is_large = 1;
    g->first_block = s->nblocks;
    g->nblocks = 4;
    g->keys = MSNAP_K_REQUESTED | MSNAP_K_STREAM | MSNAP_K_SEGMENT_TYPE |
              MSNAP_K_POOL_ID | MSNAP_K_EXPANDABLE | MSNAP_K_FRAMES;
    g->frames = MSNAP_STACK_EMPTY;
    for (int k = 0; k < 4; k++) {
      msnap_sblock_t *b = msnap__snap_add_block(s);
      if (b == NULL)
        die("block");
      b->address = g->address + (uint64_t)k * (5u << 20);
      b->size = 5u << 20;
      b->state = k % 2 ? MSNAP_BLOCK_INACTIVE : MSNAP_BLOCK_ACTIVE_ALLOCATED;
      b->requested_size = b->state ? b->size - 512 : 0;
      b->keys = MSNAP_K_ADDRESS | MSNAP_K_REQUESTED | MSNAP_K_FRAMES;
      b->frames = MSNAP_STACK_EMPTY;
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED) {
        g->allocated_size += b->size;
        g->active_size += b->size;
        g->requested_size += b->requested_size;
      }
    }
  }
  if (msnap__snap_set_devices(s, 1) != 0)
    die("set_devices");
  /* Trace: alloc / free_requested / free_completed triples. */
  static const uint8_t actions[3] = {MSNAP_ACTION_ALLOC,
                                     MSNAP_ACTION_FREE_REQUESTED,
                                     MSNAP_ACTION_FREE_COMPLETED};
  uint32_t stack[96];
  int64_t t = 1732000000000000;
  uint64_t addr = 0, size = 0;
  msnap_stack_t st = MSNAP_STACK_EMPTY;
  msnap_tattr_t attr;
  memset(&attr, 0, sizeof attr); /* stream 0 */
  attr.keys = MSNAP_K_ADDRESS | MSNAP_K_STREAM | MSNAP_K_TIME | MSNAP_K_FRAMES;
  for (uint64_t i = 0; i < nentries; i++) {
    if (i % 3 == 0) {
      /* Inside a free (inactive, odd) 5 MiB block of a random segment, so
       * the trace is consistent (`memsnap check` passes): each allocation
       * is freed before the next one. */
      uint64_t r = rnd();
      size = 512 * (1 + r % 8192);
      uint64_t hole = base + ((r >> 16) % 256) * (20u << 20) +
                      (1 + 2 * ((r >> 24) % 2)) * (5u << 20);
      addr = hole + ((r >> 32) % (((5u << 20) - size) / 512 + 1)) * 512;
      int depth = 30 + (int)(r % 50);
      uint32_t f = (uint32_t)((r >> 8) % NFRAMES);
      for (int d = 0; d < depth; d++) {
        /* mostly the next frame of the call path, sometimes a jump */
        uint64_t j = rnd();
        f = (f + 1 + ((j & 7) ? 0 : (uint32_t)(j >> 3) % 7)) % NFRAMES;
        stack[d] = frames[f];
      }
      st = msnap__snap_stack(s, stack, (uint32_t)depth);
      if (st == 0)
        die("stack");
    }
    msnap_strace_t *e = msnap__snap_add_trace(s, &s->device_traces[0]);
    if (e == NULL)
      die("trace");
    e->action = actions[i % 3];
    e->addr = addr;
    e->size = size;
    e->time_us = t += 1 + (int64_t)(i % 5);
    e->frames = st;
    if (msnap__snap_trace_set_attr(s, e, &attr) != 0)
      die("trace attributes");
  }
  free(frames);
  return s;
}

static uint64_t write_size(msnap_snap_t *s, const char *path) {
  if (msnap__snap_write_file(s, path, false) != 0)
    die("write_file");
  struct stat st;
  if (stat(path, &st) != 0)
    die("stat");
  return (uint64_t)st.st_size;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH [TARGET_BYTES]\n", argv[0]);
    return 2;
  }
  uint64_t target = argc > 2 ? strtoull(argv[2], NULL, 10) : (1ull << 30);
  uint64_t n0 = 30000;
  msnap_snap_t *s = generate(n0);
  uint64_t b0 = write_size(s, argv[1]);
  msnap__snap_free(s);
  uint64_t n = target > b0 ? (uint64_t)((double)target / b0 * n0) : n0;
  n -= n % 3;
  s = generate(n);
  uint64_t bytes = write_size(s, argv[1]);
  msnap__snap_free(s);
  BENCH_RESULT("entries", "%llu", (unsigned long long)n);
  BENCH_RESULT("bytes", "%llu", (unsigned long long)bytes);
  return 0;
}
