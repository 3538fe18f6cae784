/* fake_alloc.h -- the fake allocator of the recorder unit tests. */
#ifndef FAKE_ALLOC_H
#define FAKE_ALLOC_H

#include <pthread.h>

#include "history.h"
#include "msnap_internal.h"
#include "stack.h"

#define FAKE_MAX_DEV 4

typedef struct fake_live_s {
  uint64_t ptr, requested, stream;
  int device;
  msnap_mempool_id_t pool;
  uint32_t stack; /* the allocation's stack, one reference */
} fake_live_t;

struct msnap_allocator_s {
  int ndev;
  pthread_mutex_t locks[FAKE_MAX_DEV];
  int lock_held[FAKE_MAX_DEV];
  struct msnap_recorder_s *rec;
  fake_live_t live[16];
  int nlive;
};

msnap_allocator_t *fake_create(int ndev);
void fake_destroy(msnap_allocator_t *a);

#endif
