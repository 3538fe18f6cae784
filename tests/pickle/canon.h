/*
 * canon.h -- canonical text of any pickle (canon.c), for the tests and the
 * pickle_read fuzz target: the same text tests/pickle/canon.py prints for
 * a Python object, so that a pickle read by memsnap's VM and by CPython can
 * be compared as strings.
 */
#ifndef MSNAP_TEST_CANON_H
#define MSNAP_TEST_CANON_H

#include "model/pickle.h"

/* Run a pickle with no consumer and print its canonical text into out
 * (NUL-terminated; the caller frees out->data).  Shared containers are
 * printed at each use; MSNAP_ELIMIT beyond 16 values per input byte
 * (memo bombs).  Errors as msnap__pvm_run, with err filled. */
int test_pickle_canon(const void *buf, size_t len, msnap_membuf_t *out,
                      msnap_read_error_t *err);

/* What a read with skip_stacks (msnap_read_stats_t) gives of the file s
 * was read from: every stack of s the empty one (absent ones stay absent)
 * and stacks_skipped clear, so that the two models rewrite to the same
 * bytes when the reads agree on everything but stacks. */
struct msnap_snap_s;
void test_model_strip_stacks(struct msnap_snap_s *s);

/* The pickle rewrite of a model into out (msnap__snap_write_pickle into
 * a memory sink): the writer's result code, else the sink's.  On an error
 * out is freed and empty; on 0 the caller frees out->data. */
int test_model_rewrite(const struct msnap_snap_s *s, msnap_membuf_t *out);

#endif /* MSNAP_TEST_CANON_H */
