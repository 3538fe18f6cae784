/*
 * create.c (api layer) -- msnap_allocator_create and the process-wide
 * allocator (msnap_default).
 *
 * msnap_allocator_create = the alloc layer's msnap__allocator_new (profile,
 * runtime, conf, devices, history off) followed by what only the api
 * layer can add: OOM_SNAPSHOT_ENABLE (oom_dump.c attaches the automatic
 * dump as the allocator's first OOM observer and turns history on).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

int msnap_allocator_create(const msnap_options_t *opts,
                           msnap_allocator_t **out) {
  int rc = msnap__allocator_new(opts, out);
  if (rc != 0) return rc;
  msnap__oom_dump_init(*out);
  return 0;
}

/* ---- the process-wide allocator ----------------------------------------- */

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static msnap_allocator_t *default_alloc;
static _Atomic bool default_made;
static char default_err[512];
/* msnap_set_default_runtime: the table, and whether creation began. */
static pthread_mutex_t default_rt_lock = PTHREAD_MUTEX_INITIALIZER;
static const msnap_runtime_ops_t *default_rt;
static bool default_begun;

int msnap_set_default_runtime(const msnap_runtime_ops_t *ops) {
  if (ops == NULL)
    return msnap__set_error(MSNAP_EINVAL, "msnap_set_default_runtime: NULL");
  pthread_mutex_lock(&default_rt_lock);
  bool begun = default_begun;
  if (!begun)
    default_rt = ops;
  pthread_mutex_unlock(&default_rt_lock);
  if (begun)
    return msnap__set_error(MSNAP_ESTATE,
                            "msnap_set_default_runtime: the process-wide "
                            "allocator already exists");
  return 0;
}

static void default_create(void) {
  msnap_options_t o;
  msnap_options_init(&o);
  pthread_mutex_lock(&default_rt_lock);
  default_begun = true;
  o.runtime = default_rt;
  pthread_mutex_unlock(&default_rt_lock);
  o.error_buf = default_err;
  o.error_buf_len = sizeof default_err;
  if (msnap_allocator_create(&o, &default_alloc) != 0)
    default_alloc = NULL;
  else
    atomic_store(&default_made, true);
}

msnap_allocator_t *msnap_default(void) {
  pthread_once(&default_once, default_create);
  return default_alloc;
}

bool msnap_default_exists(void) { return atomic_load(&default_made); }

const char *msnap_default_error(void) {
  pthread_once(&default_once, default_create);
  return default_alloc ? NULL : default_err;
}
