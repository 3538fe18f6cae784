/*
 * api.h -- the api layer's internal interface (snapshot.c, oom_dump.c,
 * create.c, plugin.c) for tools and tests.  The api layer is the top of
 * the library: it may call every layer below (alloc, record, model,
 * runtime, base) and nothing calls it from below.
 */
#ifndef MSNAP_API_H
#define MSNAP_API_H

#include "alloc/allocator.h"
#include "base/sink.h"
#include "model/snapshot.h"

/* ---- snapshot.c ---------------------------------------------------------- */
/* Build the snapshot model of a live allocator (copies under the locks,
 * resolves stacks and symbols outside them). */
int msnap__snapshot_take(msnap_allocator_t *a,
                         const msnap_snapshot_options_t *o,
                         msnap_snap_t **out);
/* Replace raw stack ids in every frames field of s by model stacks
 * (resolving Python frames and C symbols once per unique address), and
 * drop the references taken during collection. */
int msnap__snap_import_stacks(msnap_snap_t *s);

/* ---- process.c ----------------------------------------------------------- */
/* The process's place in a distributed job (see process.c). */
typedef struct msnap_process_s {
  int64_t rank, world_size, local_rank; /* -1: unknown */
  int64_t pid;
  char host[256]; /* "" when unknown */
} msnap_process_t;
void msnap__process_get(msnap_process_t *p);

/* ---- oom_dump.c ---------------------------------------------------------- */
/* OOM_SNAPSHOT_ENABLE / OOM_SNAPSHOT_PATH for allocator a: when the mode
 * is non-zero, attach the automatic-dump observer (once per allocator)
 * and turn history on.  msnap_allocator_create calls it; idempotent. */
void msnap__oom_dump_init(msnap_allocator_t *a);

#endif /* MSNAP_API_H */
