/*
 * history.h -- the recorder: per-allocator history state (history.c), the
 * per-device trace rings, the annotation ring, OOM observers (oom.c) and
 * the workspace allocator's state (workspace.c).  The allocator keeps one
 * pointer to it (msnap__allocator_recorder); it is created on first use.
 *
 * A trace ring keeps the newest `capacity` entries of one device, oldest
 * first from `head`:
 *
 *     v[head], v[(head+1) % vcap], ..., v[(head+n-1) % vcap]
 *
 * Invariants (msnap__ring_check):
 *   - n <= capacity, n <= vcap, head < vcap (or vcap == 0 and n == 0);
 *   - vcap <= capacity, except after a failed shrink (ENOMEM) that left
 *     the old slots; nchunks = ceil(vcap / MSNAP_RING_CHUNK);
 *   - while the ring grows (n == vcap < capacity) head is 0;
 *   - every entry holds one reference on each of its non-zero stack,
 *     user_metadata and compile_context ids; overwriting or clearing an
 *     entry drops them;
 *   - dropped counts entries lost to overflow since the last clear;
 *   - stream and pool fields index the ring's own interning tables.
 * The whole ring (entries, tables, counters) is guarded by the device
 * lock of its device.  Lowering the capacity without clearing drops the
 * oldest entries at once (PyTorch leaves stale slots; we keep "newest N").
 *
 * The recorder-wide settings (enabled, level, stacks, skip set) are
 * atomics read without locks on the hot path; msnap_record_history writes
 * them.  The annotation ring and the observer list are guarded by
 * rec->lock (inner to device locks).
 */
#ifndef MSNAP_HISTORY_H
#define MSNAP_HISTORY_H

#include <pthread.h>
#include <stdatomic.h>

#include "msnap_internal.h"

/* One recorded trace entry: 48 bytes. */
typedef struct msnap_hentry_s {
  uint64_t addr;            /* device_free for oom entries            */
  uint64_t size;
  uint64_t raw_time;        /* msnap__clock_raw at record time         */
  uint32_t stack;           /* stack id (0 = none), one reference      */
  uint32_t user_metadata;   /* string id (0 = ""), one reference       */
  uint32_t compile_context; /* string id (0 = "N/A"), one reference    */
  uint32_t stream;          /* index into ring->streams                */
  uint32_t pool;            /* index into ring->pools                  */
  uint8_t action;           /* msnap_action_t                          */
  uint8_t internal_meta;    /* 0 none, 1 "mallocWithAddress"          */
  uint16_t reserved;
} msnap_hentry_t;
_Static_assert(sizeof(msnap_hentry_t) == 48, "trace entry must be 48 bytes");

/* Small interning table for 16-byte keys (streams: {stream, 0}; pools). */
typedef struct msnap_keymap_s {
  uint64_t (*keys)[2];
  uint32_t n, cap;
  uint32_t *ht; /* ids + 1, 0 empty */
  uint32_t ht_cap;
  uint32_t last;
} msnap_keymap_t;

/* Ring storage comes in chunks of 4096 entries (192 KiB): growing adds a
 * chunk and never copies, so an unbounded history costs its entries and no
 * transient double-size copy. */
#define MSNAP_RING_CHUNK_BITS 12
#define MSNAP_RING_CHUNK (1u << MSNAP_RING_CHUNK_BITS)

#define MSNAP_RING_SPARE 64

typedef struct msnap_ring_s {
  msnap_hentry_t **chunks; /* slot s: chunks[s / CHUNK][s % CHUNK]      */
  uint64_t nchunks, chunks_cap;
  uint64_t vcap, head, n;  /* vcap = slots allocated                    */
  uint64_t capacity;
  uint64_t dropped;
  msnap_keymap_t streams, pools;
  /* Freed chunks kept for the next growth (history.c), unmapped when the
   * recorder is destroyed; 64 x 192 KiB at most. */
  msnap_hentry_t *spare[MSNAP_RING_SPARE];
  uint32_t nspare;
  /* The call (context address and serial) that recorded the newest entry
   * and that entry's raw time: the same call's next entry reuses it. */
  const void *last_ctx;
  uint64_t last_call, last_time;
} msnap_ring_t;

/* external_annotations entry. */
typedef struct msnap_aentry_s {
  uint64_t raw_time;
  uint32_t name; /* string id, one reference */
  int32_t device;
  uint8_t is_start;
} msnap_aentry_t;

typedef struct msnap_oom_observer_s {
  msnap_oom_observer_cb cb;
  void *arg;
} msnap_oom_observer_t;

struct msnap_workspace_s; /* workspace.c */

typedef struct msnap_recorder_s {
  msnap_allocator_t *a;
  int ndevices;
  _Atomic bool enabled;          /* history on (devices)              */
  _Atomic int level;             /* msnap_record_context_t             */
  _Atomic unsigned stacks;       /* MSNAP_STACKS_*                     */
  _Atomic uint32_t skip;         /* 1u << action                       */
  _Atomic bool compile_context;
  msnap_ring_t *rings;           /* [ndevices]; device lock of each    */

  pthread_mutex_t lock;          /* guards everything below            */
  uint64_t max_entries;
  bool global_record_annotations;
  bool record_host;
  msnap_aentry_t *ann;           /* annotation ring (same rules)       */
  uint64_t ann_vcap, ann_head, ann_n, ann_capacity, ann_dropped;
  msnap_oom_observer_t *observers;
  uint32_t nobservers, observers_cap;
  int oom_mode;                  /* OOM_SNAPSHOT_ENABLE at creation    */
  char *oom_path;                /* OOM_SNAPSHOT_PATH (NULL = ".")     */
  bool oom_inited;               /* msnap__oom_env_init ran            */

  struct msnap_workspace_s *ws;  /* workspace.c, own lock              */

  /* Pinned host memory (record_pinned_host_memory): its own settings,
   * atomics as above, and one flat ring guarded by the host allocator's
   * lock (host_alloc.c), not by a device lock. */
  _Atomic bool host_enabled;
  _Atomic int host_level;
  _Atomic unsigned host_stacks;
  msnap_ring_t host_ring;
} msnap_recorder_t;

/* The allocator's recorder, created on first use when create is true
 * (NULL when absent and !create, or on ENOMEM). */
msnap_recorder_t *msnap__recorder_get(msnap_allocator_t *a, bool create);

/* A copied trace entry with its stream and pool resolved (snapshots). */
typedef struct msnap_hcopy_s {
  msnap_hentry_t e;
  uint64_t stream;
  msnap_mempool_id_t pool;
} msnap_hcopy_t;
/* Copy device's ring oldest first into *out (malloc'd), taking one
 * reference on each id (released by the caller with msnap__hcopy_release).
 * Caller holds the device lock.  *dropped and *capacity report overflow. */
int msnap__ring_copy_locked(msnap_recorder_t *r, int device,
                            msnap_hcopy_t **out, size_t *n,
                            uint64_t *dropped, uint64_t *capacity);
void msnap__hcopy_release(msnap_hcopy_t *v, size_t n);
/* The same for the host ring; caller holds the host allocator lock. */
int msnap__host_ring_copy_locked(msnap_recorder_t *r, msnap_hcopy_t **out,
                                 size_t *n, uint64_t *dropped);
/* Copy the annotation ring (takes rec->lock); name ids carry a reference
 * each, dropped by the caller. */
int msnap__ann_copy(msnap_recorder_t *r, msnap_aentry_t **out, size_t *n);
/* Ring structure check (caller holds the device lock). */
int msnap__ring_check(const msnap_ring_t *ring, char *msg, size_t len);
/* This thread's metadata/compile-context ids with a reference each. */
void msnap__tls_context(uint32_t *user_metadata, uint32_t *compile_context);

/* ---- workspace.c -------------------------------------------------------- */
/* A workspace buffer as seen by a snapshot. */
typedef struct msnap_ws_info_s {
  uint64_t stream, ptr, size, requested;
  uint64_t raw_created;
  bool allocated;
} msnap_ws_info_t;
/* Copy the device's live workspace buffers (sorted by address). */
int msnap__ws_collect(msnap_allocator_t *a, int device,
                      msnap_ws_info_t **out, size_t *n);
/* Reserved/allocated workspace bytes of a device (stats reconciliation). */
void msnap__ws_totals(msnap_allocator_t *a, int device, uint64_t *reserved,
                      uint64_t *allocated);
void msnap__ws_destroy(msnap_recorder_t *r);
/* Workspace invariants (tests): 0 or MSNAP_ESTATE with msg. */
int msnap__ws_check(msnap_allocator_t *a, char *msg, size_t len);

/* ---- oom.c --------------------------------------------------------------- */
/* Write the usage-report CSV of one device (-1 = all) to path. */
int msnap__usage_report(msnap_allocator_t *a, int device, const char *path);

#endif /* MSNAP_HISTORY_H */
