/*
 * map16.c -- a hash map from 16-byte keys (two uint64_t) to uint32_t
 * values: open addressing with linear probing over XXH3 of the key.
 *
 * Used where a pair of words must be found fast: the trace ring's stream
 * and pool interning (record/ring.c, under the ring owner's lock) and the
 * caches of a snapshot's stack import (api/traceback.c, one thread).  Not
 * thread safe; the owner locks.
 *
 * Invariants (msnap__map16_check): cap is 0 or a power of two; n < cap / 2
 * after every insertion (the table doubles before it gets fuller); every
 * used slot's key is reachable from its hash slot without crossing an
 * empty slot; n equals the number of used slots.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/map16.h"

static size_t map16_hash(uint64_t k0, uint64_t k1, size_t cap) {
  uint64_t k[2] = {k0, k1};
  return (size_t)XXH3_64bits(k, sizeof k) & (cap - 1);
}

/* Double the table (first 16 slots); MSNAP_ENOMEM leaves it as it was. */
static int map16_rehash(msnap_map16_t *m) {
  size_t cap = m->cap ? m->cap * 2 : 16;
  msnap_map16_ent_t *t = calloc(cap, sizeof *t);
  if (t == NULL) return MSNAP_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->t[i].used) continue;
    size_t j = map16_hash(m->t[i].k0, m->t[i].k1, cap);
    while (t[j].used) j = (j + 1) & (cap - 1);
    t[j] = m->t[i];
  }
  free(m->t);
  m->t = t;
  m->cap = cap;
  return 0;
}

uint32_t *msnap__map16_slot(msnap_map16_t *m, uint64_t k0, uint64_t k1,
                            bool *fresh) {
  if ((m->n + 1) * 2 > m->cap && map16_rehash(m) != 0) return NULL;
  size_t j = map16_hash(k0, k1, m->cap);
  while (m->t[j].used && (m->t[j].k0 != k0 || m->t[j].k1 != k1))
    j = (j + 1) & (m->cap - 1);
  *fresh = !m->t[j].used;
  if (*fresh) {
    m->t[j].used = 1;
    m->t[j].k0 = k0;
    m->t[j].k1 = k1;
    m->t[j].v = 0;
    m->n++;
  }
  return &m->t[j].v;
}

void msnap__map16_free(msnap_map16_t *m) {
  free(m->t);
  memset(m, 0, sizeof *m);
}

int msnap__map16_check(const msnap_map16_t *m, char *msg, size_t len) {
  const char *bad = NULL;
  size_t used = 0;
  if (m->cap & (m->cap - 1)) bad = "capacity is not a power of two";
  else if (m->cap && m->n * 2 >= m->cap + 2) bad = "table too full";
  for (size_t i = 0; bad == NULL && i < m->cap; i++) {
    if (!m->t[i].used) continue;
    used++;
    size_t j = map16_hash(m->t[i].k0, m->t[i].k1, m->cap);
    while (j != i && m->t[j].used) j = (j + 1) & (m->cap - 1);
    if (j != i) bad = "a key is cut off from its hash slot";
  }
  if (bad == NULL && used != m->n) bad = "count does not match the slots";
  if (bad) {
    if (msg && len) snprintf(msg, len, "map16: %s", bad);
    return MSNAP_ESTATE;
  }
  return 0;
}
