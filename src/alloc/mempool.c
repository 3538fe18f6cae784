/*
 * mempool.c -- private pools (torch.cuda.MemPool / graph pools,
 * allocator-algorithm.md §18).
 *
 * A private pool owns a small and a large block pool with the same rules
 * as the default ones.  Lifecycle, as PyTorch's PrivatePool:
 *   create_or_incref (use_count += 1) -> ... -> release (use_count -= 1);
 *   at use_count 0 the pool is "freeable": release_cached_blocks may
 *   release its cached segments, and the pool is deleted once it has no
 *   segment left (malloc_count == 0).
 * While a (pool, stream filter) scope is on d->captures, matching mallocs
 * are routed to the pool (get_pool) and the device counts as "capturing"
 * (process_events skipped, frees with stream uses deferred), exactly as
 * captures_underway does in PyTorch.
 *
 * Invariants: a pool on d->captures exists and is not freeable; a pool id
 * appears once in d->ppools.  Callers hold the device lock except for the
 * public functions, which take it.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_core.h"

msnap_ppool_t *msnap__ppool_find(msnap_device_t *d, msnap_mempool_id_t id) {
  for (msnap_ppool_t *pp = d->ppools; pp; pp = pp->next)
    if (msnap__id_eq(pp->id, id))
      return pp;
  return NULL;
}

/* An entry that the resets have brought back to all zeros. */
static bool pool_stat_zero(const msnap_stat_t *r) {
  for (int t = 0; t < MSNAP_STAT_TYPES; t++)
    if (r[t].current || r[t].peak || r[t].allocated || r[t].freed)
      return false;
  return true;
}

/*
 * Delete pp (no segment left).  Its reserved stat moves to d->retired so
 * that memory_stats keeps reporting the pool's peak and totals until the
 * resets clear them, as torch 2.13 does.  Out of host memory the entry is
 * dropped (the only effect: the deleted pool's key disappears early).
 * Caller holds the device lock.
 */
void msnap__ppool_free(msnap_device_t *d, msnap_ppool_t *pp) {
  msnap_ppool_t **link = &d->ppools;
  while (*link && *link != pp)
    link = &(*link)->next;
  if (*link)
    *link = pp->next;
  if (!pool_stat_zero(pp->reserved)) {
    if (MSNAP_GROW(d->retired, d->retired_cap, d->nretired + 1) == 0) {
      msnap_pool_stats_t *r = &d->retired[d->nretired++];
      r->id = pp->id;
      memcpy(r->reserved_bytes, pp->reserved, sizeof r->reserved_bytes);
    }
  }
  free(pp);
}

/* Drop the retired entries that the resets brought to all zeros.  Caller
 * holds the device lock. */
void msnap__ppool_retired_prune(msnap_device_t *d) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < d->nretired; i++)
    if (!pool_stat_zero(d->retired[i].reserved_bytes))
      d->retired[k++] = d->retired[i];
  d->nretired = k;
}

/* create_or_incref_pool (CCA L2767-2790). */
static int create_or_incref(msnap_device_t *d, msnap_mempool_id_t id,
                            msnap_ppool_t **out) {
  msnap_ppool_t *pp = msnap__ppool_find(d, id);
  if (pp) {
    if (pp->use_count <= 0)
      return msnap__set_error(MSNAP_ESTATE,
                              "mempool (%" PRIu64 ", %" PRIu64
                              ") was already released",
                              id.first, id.second);
    pp->use_count++;
    *out = pp;
    return 0;
  }
  pp = calloc(1, sizeof *pp);
  if (!pp)
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  pp->id = id;
  pp->use_count = 1;
  msnap__bpool_init(&pp->large, false, pp);
  msnap__bpool_init(&pp->small, true, pp);
  /* The same id again (a graph pool id reused): its history continues. */
  for (uint32_t i = 0; i < d->nretired; i++) {
    if (msnap__id_eq(d->retired[i].id, id)) {
      memcpy(pp->reserved, d->retired[i].reserved_bytes,
             sizeof pp->reserved);
      d->retired[i] = d->retired[--d->nretired];
      break;
    }
  }
  /* Append: creation order is the use_on_oom search order. */
  msnap_ppool_t **link = &d->ppools;
  while (*link)
    link = &(*link)->next;
  *link = pp;
  *out = pp;
  return 0;
}

static msnap_device_t *dev(msnap_allocator_t *a, int device, const char *fn) {
  msnap_device_t *d = msnap__device(a, device);
  if (!d)
    msnap__set_error(MSNAP_EINVAL, "%s: invalid device %d", fn, device);
  return d;
}

int msnap_mempool_create(msnap_allocator_t *a, int device, bool use_on_oom,
                         bool no_split, msnap_mempool_id_t *id) {
  msnap_device_t *d = dev(a, device, "msnap_mempool_create");
  if (!d || !id)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  /* MemPool ids are {0, uid++} from an allocator-wide counter. */
  msnap_mempool_id_t nid = {
      0, __atomic_fetch_add(&a->next_mempool_id, 1, __ATOMIC_RELAXED)};
  msnap_ppool_t *pp;
  int rc = create_or_incref(d, nid, &pp);
  if (rc == 0) {
    pp->use_on_oom = use_on_oom;
    pp->no_split = no_split;
    *id = nid;
  }
  msnap__unlock(&d->lock);
  return rc;
}

/*
 * releasePool (CCA L2670-2690) followed, when the count reaches 0, by
 * emptyCache(id) as MemPool's destructor does: the pool's cached segments
 * are released and the pool is deleted once it holds no segment.
 */
int msnap_mempool_release(msnap_allocator_t *a, int device,
                          msnap_mempool_id_t id) {
  msnap_device_t *d = dev(a, device, "msnap_mempool_release");
  if (!d)
    return MSNAP_EINVAL;
  if (msnap__bad_fork(a))
    return msnap__fork_check(a, "msnap_mempool_release");
  msnap_call_t c;
  msnap__call_begin(a, &c, true);
  msnap__lock(&d->lock);
  int rc = 0;
  msnap_ppool_t *pp = msnap__ppool_find(d, id);
  if (!pp || pp->use_count <= 0) {
    rc = msnap__set_error(MSNAP_ENOENT,
                          "mempool (%" PRIu64 ", %" PRIu64
                          ") is not a live pool of device %d",
                          id.first, id.second, device);
  } else if (--pp->use_count == 0) {
    pp->freeable = true;
    rc = msnap__release_cached_blocks(d, id, &c);
  }
  msnap__unlock(&d->lock);
  msnap__call_end(&c);
  return rc;
}

int msnap_begin_allocate_to_pool(msnap_allocator_t *a, int device,
                                 msnap_mempool_id_t id, uint64_t stream,
                                 bool all_streams) {
  msnap_device_t *d = dev(a, device, "msnap_begin_allocate_to_pool");
  if (!d)
    return MSNAP_EINVAL;
  if (msnap__id_zero(id))
    return msnap__set_error(MSNAP_EINVAL,
                            "beginAllocateToPool: mempool id (0, 0) is the "
                            "default pool");
  msnap__lock(&d->lock);
  int rc = 0;
  for (uint32_t i = 0; i < d->ncaptures; i++) {
    if (msnap__id_eq(d->captures[i].id, id)) {
      rc = msnap__set_error(MSNAP_ESTATE,
                            "beginAllocateToPool: already recording to "
                            "mempool_id (%" PRIu64 ", %" PRIu64 ")",
                            id.first, id.second);
      goto out;
    }
  }
  if (MSNAP_GROW(d->captures, d->captures_cap, d->ncaptures + 1) != 0) {
    rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    goto out;
  }
  msnap_ppool_t *pp;
  rc = create_or_incref(d, id, &pp);
  if (rc != 0)
    goto out;
  d->captures[d->ncaptures++] = (msnap_capture_t){id, stream, all_streams};
out:
  msnap__unlock(&d->lock);
  return rc;
}

int msnap_end_allocate_to_pool(msnap_allocator_t *a, int device,
                               msnap_mempool_id_t id) {
  msnap_device_t *d = dev(a, device, "msnap_end_allocate_to_pool");
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  bool found = false;
  for (uint32_t i = 0; i < d->ncaptures && !found; i++) {
    if (msnap__id_eq(d->captures[i].id, id)) {
      for (uint32_t k = i + 1; k < d->ncaptures; k++)
        d->captures[k - 1] = d->captures[k];
      d->ncaptures--;
      found = true;
    }
  }
  msnap__unlock(&d->lock);
  if (!found)
    return msnap__set_error(MSNAP_ESTATE,
                            "endAllocatePool: not currently recording to "
                            "mempool_id (%" PRIu64 ", %" PRIu64 ")",
                            id.first, id.second);
  return 0;
}

int msnap_mempool_use_count(msnap_allocator_t *a, int device,
                            msnap_mempool_id_t id, int *count) {
  msnap_device_t *d = dev(a, device, "msnap_mempool_use_count");
  if (!d || !count)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  msnap_ppool_t *pp = msnap__ppool_find(d, id);
  *count = pp ? pp->use_count : 0;
  msnap__unlock(&d->lock);
  return 0;
}

int msnap_pool_stats_get(msnap_allocator_t *a, int device,
                         msnap_pool_stats_t *out, size_t cap, size_t *n) {
  msnap_device_t *d = dev(a, device, "msnap_pool_stats_get");
  if (!d)
    return MSNAP_EINVAL;
  if (!n || (cap > 0 && !out))
    return msnap__set_error(MSNAP_EINVAL, "msnap_pool_stats_get: NULL");
  msnap__lock(&d->lock);
  size_t k = 0;
  for (const msnap_ppool_t *pp = d->ppools; pp; pp = pp->next) {
    if (pool_stat_zero(pp->reserved))
      continue; /* never reserved anything (or reset to nothing) */
    if (k < cap) {
      out[k].id = pp->id;
      memcpy(out[k].reserved_bytes, pp->reserved,
             sizeof out[k].reserved_bytes);
    }
    k++;
  }
  for (uint32_t i = 0; i < d->nretired; i++, k++)
    if (k < cap)
      out[k] = d->retired[i];
  *n = k;
  msnap__unlock(&d->lock);
  return 0;
}
