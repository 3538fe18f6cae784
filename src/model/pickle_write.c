/*
 * pickle_write.c -- a protocol-4 pickle encoder restricted to the opcodes
 * the MemoryViz unpickler reads (cuda-reference §2.9).
 *
 * Output: PROTO 4, then the body in FRAMEs of at most 64 KiB (an opcode
 * never straddles a frame; a string too large for a frame is written
 * between frames, as CPython does), then STOP.  The encoder only knows
 * opcodes; what to memoize is the caller's choice (snapshot_write.c).
 *
 * Invariants: used <= MSNAP_PW_FRAME_SIZE; buf holds 9 bytes of room for
 * the FRAME header in front of the payload; err is sticky (once set, every
 * emit function is a no-op and msnap__pw_finish returns it).
 *
 * Integers: BININT1 / BININT2 / BININT, else LONG1 of at most 8 bytes.
 * Values >= 2^63 (a uint64 that would need a 9-byte LONG1, e.g. a
 * 2^64-1 "none" marker) are refused with MSNAP_EINVAL: MemoryViz would turn
 * them into BigInts (pytorch#115234).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/pickle.h"

#define HDR 9

static void pw_fail(msnap_pw_t *w, int err, const char *msg) {
  if (w->err) return;
  w->err = err;
  snprintf(w->msg, sizeof w->msg, "%s", msg);
}

void msnap__pw_flush_frame(msnap_pw_t *w) {
  if (w->used == 0 || w->err) return;
  w->buf[0] = MSNAP_OP_FRAME;
  uint64_t n = w->used;
  for (int i = 0; i < 8; i++) w->buf[1 + i] = (unsigned char)(n >> (8 * i));
  int rc = msnap__sink_write(w->sink, w->buf, HDR + w->used);
  w->used = 0;
  if (rc < 0) pw_fail(w, rc, "write failed");
}

#define room msnap__pw_room

int msnap__pw_init(msnap_pw_t *w, msnap_sink_t *sink) {
  memset(w, 0, sizeof *w);
  w->sink = sink;
  w->buf = malloc(HDR + MSNAP_PW_FRAME_SIZE);
  if (!w->buf) return MSNAP_ENOMEM;
  static const unsigned char proto[2] = {MSNAP_OP_PROTO, 4};
  int rc = msnap__sink_write(sink, proto, 2);
  if (rc < 0) pw_fail(w, rc, "write failed");
  return rc;
}

int msnap__pw_finish(msnap_pw_t *w) {
  msnap__pw_op(w, MSNAP_OP_STOP);
  msnap__pw_flush_frame(w);
  free(w->buf);
  w->buf = NULL;
  return w->err;
}

void msnap__pw_abort(msnap_pw_t *w) {
  free(w->buf);
  w->buf = NULL;
}

void msnap__pw_int_wide(msnap_pw_t *w, int64_t v) {
  unsigned char *p;
  if (v >= 0 && v < 256) {
    if ((p = room(w, 2))) {
      p[0] = MSNAP_OP_BININT1;
      p[1] = (unsigned char)v;
    }
  } else if (v >= 0 && v < 65536) {
    if ((p = room(w, 3))) {
      p[0] = MSNAP_OP_BININT2;
      p[1] = (unsigned char)v;
      p[2] = (unsigned char)(v >> 8);
    }
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    if ((p = room(w, 5))) {
      uint32_t u = (uint32_t)(int32_t)v;
      p[0] = MSNAP_OP_BININT;
      p[1] = (unsigned char)u;
      p[2] = (unsigned char)(u >> 8);
      p[3] = (unsigned char)(u >> 16);
      p[4] = (unsigned char)(u >> 24);
    }
  } else {
    /* smallest n such that v fits in n two's-complement bytes: its
     * significant bits plus a sign bit (v is outside int32 here, so the
     * magnitude word is non-zero) */
    uint64_t u = (uint64_t)v;
    uint64_t mag = v < 0 ? ~u : u;
    int bits = 64 - __builtin_clzll(mag) + 1;
    int n = (bits + 7) / 8;
    if ((p = room(w, 2 + (size_t)n))) {
      p[0] = MSNAP_OP_LONG1;
      p[1] = (unsigned char)n;
      for (int i = 0; i < n; i++) p[2 + i] = (unsigned char)(u >> (8 * i));
    }
  }
}

void msnap__pw_uint(msnap_pw_t *w, uint64_t v, const char *what) {
  if (msnap_unlikely(v > (uint64_t)INT64_MAX)) {
    char m[160];
    snprintf(m, sizeof m,
             "%s = %llu is >= 2^63; refused (MemoryViz cannot read it)",
             what ? what : "value", (unsigned long long)v);
    pw_fail(w, MSNAP_EINVAL, m);
    return;
  }
  msnap__pw_int(w, (int64_t)v);
}

void msnap__pw_float(msnap_pw_t *w, double v) {
  unsigned char *p = room(w, 9);
  if (!p) return;
  uint64_t u;
  memcpy(&u, &v, 8);
  p[0] = MSNAP_OP_BINFLOAT;
  for (int i = 0; i < 8; i++) p[1 + i] = (unsigned char)(u >> (56 - 8 * i));
}

void msnap__pw_bool(msnap_pw_t *w, bool v) {
  msnap__pw_op(w, v ? MSNAP_OP_NEWTRUE : MSNAP_OP_NEWFALSE);
}

void msnap__pw_str(msnap_pw_t *w, const char *s, size_t len) {
  unsigned char *p;
  if (len < 256) {
    if ((p = room(w, 2 + len))) {
      p[0] = MSNAP_OP_SHORT_BINUNICODE;
      p[1] = (unsigned char)len;
      memcpy(p + 2, s, len);
    }
    return;
  }
  if (len > UINT32_MAX) {
    pw_fail(w, MSNAP_ELIMIT, "string longer than 4 GiB");
    return;
  }
  if (5 + len <= MSNAP_PW_FRAME_SIZE) {
    if ((p = room(w, 5 + len))) {
      p[0] = MSNAP_OP_BINUNICODE;
      for (int i = 0; i < 4; i++) p[1 + i] = (unsigned char)(len >> (8 * i));
      memcpy(p + 5, s, len);
    }
    return;
  }
  /* too large for a frame: write it between frames */
  msnap__pw_flush_frame(w);
  if (w->err) return;
  unsigned char h[5] = {MSNAP_OP_BINUNICODE};
  for (int i = 0; i < 4; i++) h[1 + i] = (unsigned char)(len >> (8 * i));
  int rc = msnap__sink_write(w->sink, h, 5);
  if (rc == 0) rc = msnap__sink_write(w->sink, s, len);
  if (rc < 0) pw_fail(w, rc, "write failed");
}

