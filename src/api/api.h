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

/* ---- usage.c ----------------------------------------------------------- */
/* MEMSNAP_USAGE_REPORT: which usage CSV files a dump writes. */
typedef enum msnap_usage_kind_e {
  MSNAP_USAGE_CANN = 0,    /* CANN's report (torch_npu), the default    */
  MSNAP_USAGE_MEMSNAP = 1, /* memsnap's allocator-statistics report     */
  MSNAP_USAGE_BOTH = 2,
  MSNAP_USAGE_NONE = 3
} msnap_usage_kind_t;
msnap_usage_kind_t msnap__usage_kind(void);
/* GetOomSnapshotDumpPath: real path of `configured`, else of
 * OOM_SNAPSHOT_PATH, else of "."; NULL (MSNAP_EIO set) when it is not an
 * existing directory.  Caller frees. */
char *msnap__usage_dir(const char *configured);
/* YYYYmmddHHMMSS, local time. */
void msnap__usage_stamp(char out[32]);
/* Write one CSV of device `device` in dir: CANN's (cann) or memsnap's,
 * named with `stamp`; unique: add "_<n>" instead of replacing a file of
 * the same name.  *path (optional) receives the file's path. */
int msnap__usage_csv(msnap_allocator_t *a, int device, const char *dir,
                     bool cann, const char *stamp, bool unique, char **path);

#endif /* MSNAP_API_H */
