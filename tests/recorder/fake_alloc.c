/*
 * fake_alloc.c -- a stand-in for alloc.c's side of the recorder contract
 * (msnap_internal.h), so that the recorder's unit tests (ring, stacks,
 * metadata, context levels) run without the real allocator.  Only the
 * unit-test executables link it; they compile the recorder sources
 * directly instead of linking the core library.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_alloc.h"
#include "host_alloc.h"

static _Thread_local char fake_err[512];

int msnap__set_error(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fake_err, sizeof fake_err, fmt, ap);
  va_end(ap);
  return err;
}

const char *msnap_last_error(void) { return fake_err; }

void msnap__device_lock(msnap_allocator_t *a, int device) {
  pthread_mutex_lock(&a->locks[device]);
  a->lock_held[device] = 1;
}

void msnap__device_unlock(msnap_allocator_t *a, int device) {
  a->lock_held[device] = 0;
  pthread_mutex_unlock(&a->locks[device]);
}

struct msnap_recorder_s **msnap__allocator_recorder(msnap_allocator_t *a) {
  return &a->rec;
}

int msnap_device_count(msnap_allocator_t *a) { return a->ndev; }

int msnap__allocation_info(msnap_allocator_t *a, uint64_t ptr, int *device,
                           uint64_t *requested_size, uint64_t *stream,
                           msnap_mempool_id_t *pool, uint32_t *stack) {
  for (int i = 0; i < a->nlive; i++) {
    if (a->live[i].ptr == ptr) {
      *device = a->live[i].device;
      *requested_size = a->live[i].requested;
      *stream = a->live[i].stream;
      *pool = a->live[i].pool;
      *stack = a->live[i].stack;
      msnap__stack_ref(a->live[i].stack);
      return 0;
    }
  }
  return MSNAP_EBADPTR;
}

/* The unit tests do not link workspace.c. */
void msnap__ws_destroy(msnap_recorder_t *r) { (void)r; }

msnap_allocator_t *fake_create(int ndev) {
  msnap_allocator_t *a = calloc(1, sizeof *a);
  a->ndev = ndev;
  for (int d = 0; d < FAKE_MAX_DEV; d++) pthread_mutex_init(&a->locks[d], NULL);
  return a;
}

void fake_destroy(msnap_allocator_t *a) {
  for (int i = 0; i < a->nlive; i++) msnap__stack_unref(a->live[i].stack);
  msnap__recorder_destroy(a->rec);
  free(a);
}

/* The unit tests do not link oom.c. */
void msnap__oom_env_init(msnap_allocator_t *a) { (void)a; }

/* The host allocator's lock (host_alloc.h): one process-wide mutex is
 * enough for the unit tests, which never allocate host memory. */
static pthread_mutex_t fake_host_lock = PTHREAD_MUTEX_INITIALIZER;

int msnap__host_lock(msnap_allocator_t *a) {
  (void)a;
  pthread_mutex_lock(&fake_host_lock);
  return 0;
}

void msnap__host_unlock(msnap_allocator_t *a) {
  (void)a;
  pthread_mutex_unlock(&fake_host_lock);
}
