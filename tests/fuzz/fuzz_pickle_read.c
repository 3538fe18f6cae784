/*
 * fuzz_pickle_read.c -- libFuzzer target for the safe pickle reader.
 *
 * Every input goes through msnap__snap_read_buffer (snapshot mapping, the
 * fast path on) and test_pickle_canon (generic VM, tests/pickle/canon.c),
 * and is checked against itself read six more ways, which must all agree
 * exactly (the same result code and message, or models whose pickle
 * rewrites are the same bytes):
 *   - the generic interpreter alone (the fast path off);
 *   - as a stream handing out 1 to 8 bytes per read (every refill path);
 *   - gzip-compressed, then decompressed by the source (inputs < 64 KiB);
 *   - zstd-compressed likewise;
 *   - with skip_stacks (memsnap replay's read), fast path and generic
 *     interpreter: compared with the buffer read's model with its stacks
 *     emptied (test_model_strip_stacks); the skip_stacks model itself
 *     stores no stack and the writer refuses it.
 * (One allowed difference: a declared length beyond what a stream may
 * hold is refused by a stream with MSNAP_ELIMIT, where the buffer reader
 * says how many bytes remain.)  A model that reads must pass
 * msnap__snap_check_model, and its pickle
 * rewrite must read back; any violation aborts.  Built only with
 * -Dfuzz=true (clang, -fsanitize=fuzzer); replay_corpus.c runs the same
 * function over tests/corpus/ in the normal test suite.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "../pickle/canon.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The pickle rewrite of a model (NULL when the writer refuses it). */
static unsigned char *rewrite(const msnap_snap_t *s, size_t *len) {
  msnap_membuf_t mb;
  *len = 0;
  if (test_model_rewrite(s, &mb) != 0) return NULL;
  *len = mb.len;
  return (unsigned char *)mb.data;
}

/* Abort unless (rc2, s2, e2) is the same outcome as (rc, ref, e). */
/* A declared length beyond MSNAP_SOURCE_MAX_NEED: a buffer knows how much
 * input is left ("needs N bytes but only M remain"), a stream refuses the
 * item without reading to the end ("an item of N bytes ..."). */
static bool same_refusal(int rc, const msnap_read_error_t *e, int rc2,
                         const msnap_read_error_t *e2) {
  return rc == MSNAP_EFORMAT && rc2 == MSNAP_ELIMIT &&
         strstr(e->msg, "bytes but only") && strstr(e2->msg, "an item of");
}

static void same(const char *how, int rc, const unsigned char *ref,
                 size_t ref_len, const msnap_read_error_t *e, int rc2,
                 msnap_snap_t *s2, const msnap_read_error_t *e2) {
  if (strcmp(how, "generic interpreter") != 0 &&
      same_refusal(rc, e, rc2, e2))
    return;
  if (rc != rc2) {
    fprintf(stderr, "%s: result %d, the buffer read %d (%s / %s)\n", how,
            rc2, rc, e2->msg, e->msg);
    abort();
  }
  if (rc != 0) {
    if (strcmp(e->msg, e2->msg) != 0) {
      fprintf(stderr, "%s: message\n  %s\nthe buffer read:\n  %s\n", how,
              e2->msg, e->msg);
      abort();
    }
    return;
  }
  size_t n2;
  unsigned char *w2 = rewrite(s2, &n2);
  if ((w2 == NULL) != (ref == NULL) ||
      (w2 && (n2 != ref_len || memcmp(w2, ref, n2) != 0))) {
    fprintf(stderr, "%s: the model differs from the buffer read's\n", how);
    abort();
  }
  free(w2);
}

static void via_source(const char *how, msnap_source_t *src, int rc,
                       const unsigned char *ref, size_t ref_len,
                       const msnap_read_error_t *e) {
  if (!src) return;
  msnap_snap_t *s2 = NULL;
  msnap_read_error_t e2;
  int rc2 = msnap__snap_read_source(src, &s2, &e2, NULL);
  same(how, rc, ref, ref_len, e, rc2, s2, &e2);
  msnap__snap_free(s2);
  msnap__source_close(src);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msnap_snap_t *s = NULL;
  msnap_read_error_t err;
  int rc = msnap__snap_read_buffer(data, size, &s, &err);
  unsigned char *ref = NULL, *bare = NULL;
  size_t ref_len = 0, bare_len = 0;
  if (rc == 0) {
    char msg[256];
    if (msnap__snap_check_model(s, msg, sizeof msg) != 0) {
      fprintf(stderr, "model check failed: %s\n", msg);
      abort();
    }
    ref = rewrite(s, &ref_len);
    if (ref) {
      msnap_snap_t *s2 = NULL;
      if (msnap__snap_read_buffer(ref, ref_len, &s2, &err) != 0) {
        fprintf(stderr, "rewrite does not read back: %s\n", err.msg);
        abort();
      }
      msnap__snap_free(s2);
    }
    /* the model a read with skip_stacks should give */
    test_model_strip_stacks(s);
    bare = rewrite(s, &bare_len);
    msnap__snap_free(s);
  } else if (err.msg[0] == 0) {
    fprintf(stderr, "error %d without a message\n", rc);
    abort();
  }
  /* the generic interpreter alone */
  msnap_read_stats_t st = {.generic_only = true};
  msnap_snap_t *sg = NULL;
  msnap_read_error_t eg;
  int rcg = msnap__snap_read_buffer_ex(data, size, &sg, &eg, &st);
  same("generic interpreter", rc, ref, ref_len, &err, rcg, sg, &eg);
  msnap__snap_free(sg);
  /* skip_stacks (memsnap replay's read), fast path and generic: the same
   * outcome, and the same model but for its stacks, none stored */
  for (int g = 0; g < 2; g++) {
    msnap_read_stats_t sk = {.generic_only = g == 1, .skip_stacks = true};
    msnap_snap_t *ss = NULL;
    msnap_read_error_t es;
    int rcs = msnap__snap_read_buffer_ex(data, size, &ss, &es, &sk);
    if (rcs == 0) {
      size_t nw;
      unsigned char *w = rewrite(ss, &nw);
      if (w || !ss->stacks_skipped || ss->nstacks > 2) {
        fprintf(stderr, "skip_stacks: a model with stacks, or written\n");
        abort();
      }
      test_model_strip_stacks(ss);
    }
    same(g ? "skip_stacks, generic interpreter" : "skip_stacks", rc, bare,
         bare_len, &err, rcs, ss, &es);
    msnap__snap_free(ss);
  }
  /* a stream in small pieces (not when the bytes start like gzip/zstd:
   * the stream would decompress what the buffer reader takes as is) */
  bool compressed_magic =
      (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) ||
      (size >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f &&
       data[3] == 0xfd);
  msnap_source_t *src = NULL;
  if (!compressed_magic &&
      msnap__source_chunked(&src, data, size, 1 + size % 8, 0) == 0)
    via_source("stream", src, rc, ref, ref_len, &err);
  if (!compressed_magic && size > 0 && size < (64u << 10)) {
    /* gzip (windowBits 15 + 16) */
    z_stream z;
    memset(&z, 0, sizeof z);
    uLong cap = compressBound((uLong)size) + 64;
    unsigned char *gz = malloc(cap);
    if (gz && deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8,
                           Z_DEFAULT_STRATEGY) == Z_OK) {
      z.next_in = (unsigned char *)data;
      z.avail_in = (uInt)size;
      z.next_out = gz;
      z.avail_out = (uInt)cap;
      int zr = deflate(&z, Z_FINISH);
      size_t n = cap - z.avail_out;
      deflateEnd(&z);
      if (zr == Z_STREAM_END &&
          msnap__source_chunked(&src, gz, n, 4096, 0) == 0)
        via_source("gzip", src, rc, ref, ref_len, &err);
    }
    free(gz);
    size_t zcap = ZSTD_compressBound(size);
    unsigned char *zs = malloc(zcap);
    if (zs) {
      size_t n = ZSTD_compress(zs, zcap, data, size, 3);
      if (!ZSTD_isError(n) &&
          msnap__source_chunked(&src, zs, n, 4096, 0) == 0)
        via_source("zstd", src, rc, ref, ref_len, &err);
    }
    free(zs);
  }
  free(ref);
  free(bare);
  msnap_membuf_t out = {0};
  if (test_pickle_canon(data, size, &out, &err) == 0) free(out.data);
  return 0;
}
