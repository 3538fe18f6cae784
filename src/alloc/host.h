/*
 * host.h -- what the pinned host caching allocator (host.c) offers the
 * rest of the alloc layer, the api layer's snapshots and the tests: its
 * lock, its ring of host trace entries, its snapshot collection, its
 * destruction and its invariant checker.  The host ring (a record-layer
 * msnap_ring_t inside the host state) is guarded by the host lock.
 */
#ifndef MSNAP_HOST_H
#define MSNAP_HOST_H

#include "alloc/allocator.h"

typedef struct msnap_host_s msnap_host_t;

/* Take / drop the host allocator lock (MSNAP_RANK_HOST; creating its
 * state on first use; MSNAP_ENOMEM when that fails, and then the lock is
 * not held). */
int msnap__host_lock(msnap_allocator_t *a);
void msnap__host_unlock(msnap_allocator_t *a);
/* The host trace ring; caller holds the host lock. */
msnap_ring_t *msnap__host_ring_locked(msnap_allocator_t *a);
/* Copy the host ring (msnap__ring_copy) and its overflow count; caller
 * holds the host lock. */
int msnap__host_ring_copy_locked(msnap_allocator_t *a, msnap_hcopy_t *out,
                                 uint64_t *dropped);
/* Fill s->host_segments / s->host_blocks (cuda-reference §2.8: one
 * segment per block, device -1).  Frames fields hold raw stack ids with
 * one reference each (the api layer converts them).  Caller holds the
 * host lock. */
int msnap__host_collect_locked(msnap_allocator_t *a, msnap_snap_t *s);
/* Free every block and the state (allocator destruction). */
void msnap__host_destroy(msnap_allocator_t *a);
/* Invariants (see host.c); takes the host lock.  0 or MSNAP_ESTATE with
 * the first violation in msg. */
int msnap__host_check(msnap_allocator_t *a, char *msg, size_t len);
/* Test hook: add delta to one private counter (0: segment stat, 1:
 * cached_bytes, 2: the first block's event_count) so that tests can see
 * the checker catch it; call again with -delta to undo. */
void msnap__host_test_poke(msnap_allocator_t *a, int what, int64_t delta);

#endif /* MSNAP_HOST_H */
