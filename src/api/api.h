/*
 * api.h -- the api layer's internal interface (snapshot.c, oom_dump.c,
 * create.c, plugin.c) for tools and tests.  The api layer is the top of
 * the library: it may call every layer below (alloc, record, model,
 * runtime, base) and nothing calls it from below.
 */
#ifndef MSNAP_API_H
#define MSNAP_API_H

#include "alloc/allocator.h"
#include "base/map16.h"
#include "base/sink.h"
#include "model/snapshot.h"

/* ---- snapshot.c ---------------------------------------------------------- */
/* Build the snapshot model of a live allocator (copies under the locks,
 * resolves stacks and symbols outside them). */
int msnap__snapshot_take(msnap_allocator_t *a,
                         const msnap_snapshot_options_t *o,
                         msnap_snap_t **out);

/* ---- traceback.c --------------------------------------------------------- */
/* A stack import into model s: recorded stacks (raw ids of record/stack.c)
 * become model stacks, each unique stack, C address and interpreter frame
 * resolved once (caches by raw id, pc and (code, instruction)). */
typedef struct msnap_import_s {
  msnap_snap_t *s;
  msnap_map16_t stacks;   /* raw stack id -> model stack id */
  msnap_map16_t cframes;  /* pc -> model frame id          */
  msnap_map16_t pyframes; /* (code, instr) -> model frame  */
  int err;                /* first error (MSNAP_ENOMEM)    */
} msnap_import_t;
void msnap__import_init(msnap_import_t *im, msnap_snap_t *s);
/* The model stack of raw stack id `raw` (held by the caller; no reference
 * is taken or dropped): MSNAP_STACK_ABSENT for 0, MSNAP_STACK_EMPTY for a
 * dead id or on error (recorded in im->err). */
msnap_stack_t msnap__import_stack(msnap_import_t *im, uint32_t raw);
/* Free the caches; returns im->err. */
int msnap__import_done(msnap_import_t *im);
/* Replace the raw stack ids that segments, blocks, host segments and host
 * blocks of s hold (one reference each) by model stacks, and drop those
 * references; and likewise for trace entries whose frames still hold a
 * raw id when raw_traces (live snapshots give trace entries model stacks
 * as they build them, snapshot.c).  im NULL: a private import. */
int msnap__snap_import_stacks(msnap_snap_t *s, msnap_import_t *im,
                              bool raw_traces);

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
