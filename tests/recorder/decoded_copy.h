/*
 * decoded_copy.h -- a ring copy (record/ring.c) decoded for the recorder
 * tests: the entries oldest first, as wide msnap_hentry_t, placed after
 * the copy itself so that release(v) drops the copy's references (one
 * per id of each entry context).  Header-only, static functions.
 */
#ifndef MSNAP_TEST_DECODED_COPY_H
#define MSNAP_TEST_DECODED_COPY_H

#include <stddef.h>
#include <stdlib.h>

#include "record/history.h"

typedef struct decoded_s {
  msnap_hcopy_t c;
  msnap_hentry_t v[];
} decoded_t;

/* Take over copy c; the decoded entries (c->n of them). */
static msnap_hentry_t *decode(msnap_hcopy_t *c) {
  decoded_t *d = malloc(sizeof *d + (size_t)c->n * sizeof(msnap_hentry_t));
  assert_non_null(d);
  d->c = *c;
  for (uint64_t i = 0; i < c->n; i++) msnap__hcopy_get(c, i, &d->v[i]);
  return d->v;
}

static void release(msnap_hentry_t *v) {
  decoded_t *d = (decoded_t *)((char *)v - offsetof(decoded_t, v));
  msnap__hcopy_release(&d->c);
  free(d);
}

#endif /* MSNAP_TEST_DECODED_COPY_H */
