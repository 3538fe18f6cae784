/*
 * fuzz_pickle_read.c -- libFuzzer target for the safe pickle reader.
 *
 * Every input goes through msnap__snap_read_buffer (snapshot mapping) and
 * test_pickle_canon (generic VM, tests/pickle/canon.c).  A model that reads must pass
 * msnap__snap_check_model, and its pickle rewrite must read back; any
 * violation aborts.  Built only with -Dfuzz=true (clang,
 * -fsanitize=fuzzer); replay_corpus.c runs the same function over
 * tests/corpus/ in the normal test suite.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "../pickle/canon.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msnap_snap_t *s = NULL;
  msnap_read_error_t err;
  int rc = msnap__snap_read_buffer(data, size, &s, &err);
  if (rc == 0) {
    char msg[256];
    if (msnap__snap_check_model(s, msg, sizeof msg) != 0) {
      fprintf(stderr, "model check failed: %s\n", msg);
      abort();
    }
    msnap_membuf_t mb = {0};
    msnap_sink_t sink;
    if (msnap__sink_init_mem(&sink, &mb) == 0) {
      int wrc = msnap__snap_write_pickle(s, &sink);
      int frc = msnap__sink_finish(&sink);
      if (wrc == 0 && frc == 0) {
        msnap_snap_t *s2 = NULL;
        if (msnap__snap_read_buffer(mb.data, mb.len, &s2, &err) != 0) {
          fprintf(stderr, "rewrite does not read back: %s\n", err.msg);
          abort();
        }
        msnap__snap_free(s2);
      }
      free(mb.data);
    }
    msnap__snap_free(s);
  } else if (err.msg[0] == 0) {
    fprintf(stderr, "error %d without a message\n", rc);
    abort();
  }
  msnap_membuf_t out = {0};
  if (test_pickle_canon(data, size, &out, &err) == 0) free(out.data);
  return 0;
}
