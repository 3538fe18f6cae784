/*
 * map16.h -- hash map from 16-byte keys to uint32_t values (map16.c).
 * A zeroed msnap_map16_t is an empty map.
 */
#ifndef MSNAP_MAP16_H
#define MSNAP_MAP16_H

#include "base/base.h"

typedef struct msnap_map16_ent_s {
  uint64_t k0, k1;
  uint32_t v;
  uint32_t used;
} msnap_map16_ent_t;

typedef struct msnap_map16_s {
  msnap_map16_ent_t *t;
  size_t cap, n;
} msnap_map16_t;

/* The value slot of key (k0, k1), inserted (value 0, *fresh = true) when
 * absent.  NULL on ENOMEM (the map is unchanged).  The pointer is valid
 * until the next insertion. */
uint32_t *msnap__map16_slot(msnap_map16_t *m, uint64_t k0, uint64_t k1,
                            bool *fresh);
void msnap__map16_free(msnap_map16_t *m);
/* Invariants (see map16.c): 0 or MSNAP_ESTATE with msg. */
int msnap__map16_check(const msnap_map16_t *m, char *msg, size_t len);

#endif /* MSNAP_MAP16_H */
