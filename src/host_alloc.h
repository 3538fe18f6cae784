/*
 * host_alloc.h -- what the pinned host caching allocator (host_alloc.c)
 * offers the rest of the core: its lock, its snapshot collection, its
 * destruction and its invariant checker.  The host ring of the recorder
 * (history.c) is guarded by the host lock.
 */
#ifndef MSNAP_HOST_ALLOC_H
#define MSNAP_HOST_ALLOC_H

#include "msnap_internal.h"

typedef struct msnap_host_s msnap_host_t;

/* Take / drop the host allocator lock (creating its state on first use;
 * MSNAP_ENOMEM when that fails, and then the lock is not held). */
int msnap__host_lock(msnap_allocator_t *a);
void msnap__host_unlock(msnap_allocator_t *a);
/* Fill s->host_segments / s->host_blocks (cuda-reference §2.8: one
 * segment per block, device -1).  Frames fields hold raw recorder stack
 * ids with one reference each (msnap__snap_import_stacks converts them).
 * Caller holds the host lock. */
int msnap__host_collect_locked(msnap_allocator_t *a, msnap_snap_t *s);
/* Free every block and the state (allocator destruction). */
void msnap__host_destroy(msnap_allocator_t *a);
/* Invariants (see host_alloc.c); takes the host lock.  0 or MSNAP_ESTATE
 * with the first violation in msg. */
int msnap__host_check(msnap_allocator_t *a, char *msg, size_t len);
/* Test hook: add delta to one private counter (0: segment stat, 1:
 * cached_bytes, 2: the first block's event_count) so that tests can see
 * the checker catch it; call again with -delta to undo. */
void msnap__host_test_poke(msnap_allocator_t *a, int what, int64_t delta);

/* ---- alloc.c ------------------------------------------------------------ */
/* The allocator's slot for its host state. */
msnap_host_t **msnap__allocator_host(msnap_allocator_t *a);

/* ---- history.c: host recording ------------------------------------------ */
/* Capture a recording context for a host call (host history settings);
 * zeroed when host history is off. */
void msnap__host_rctx_capture(msnap_allocator_t *a, msnap_rctx_t *ctx,
                              bool is_free_site);
/* Append an entry to the host ring (no-op when host history is off).
 * Caller holds the host lock. */
void msnap__host_history_record_locked(msnap_allocator_t *a,
                                       msnap_action_t action, uint64_t addr,
                                       uint64_t size, uint64_t stream,
                                       const msnap_rctx_t *ctx,
                                       uint32_t stack_override);
/* True when host history is on. */
bool msnap__host_history_active(const msnap_allocator_t *a);

#endif /* MSNAP_HOST_ALLOC_H */
