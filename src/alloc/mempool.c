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
 * While a (pool, filter) scope is on d->scopes, matching mallocs are
 * routed to the pool (get_pool).  The filter accepts one stream, every
 * stream, or one thread's allocations (use_mem_pool:
 * _cuda_beginAllocateCurrentThreadToPool).  A scope is routing only: as in
 * current PyTorch and torch_npu (allocation_scopes_ vs
 * num_active_captures_), only a graph capture marked with
 * msnap_mark_capture_begin makes the device skip event processing, defer
 * frees with stream uses and skip the free-cache-and-retry step
 * (msnap__capturing in alloc_core.h).
 *
 * Invariants: a pool on d->scopes exists and is not freeable; a pool id
 * appears once in d->ppools and at most once in d->scopes;
 * d->capture_streams holds one entry per capture in progress.  Callers
 * hold the device lock except for the public functions, which take it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_core.h"

static _Atomic uint64_t next_thread_key = 1;
static _Thread_local uint64_t tl_thread_key;

uint64_t msnap__thread_key(void) {
  if (msnap_unlikely(tl_thread_key == 0))
    tl_thread_key = atomic_fetch_add_explicit(&next_thread_key, 1,
                                              memory_order_relaxed);
  return tl_thread_key;
}

/* ---- use_on_oom_pools: ska::flat_hash_set<MempoolId_t, MempoolIdHash> ---- */

static int8_t ska_log2(uint64_t v) {
  static const int8_t table[64] = {
      63, 0,  58, 1,  59, 47, 53, 2,  60, 39, 48, 27, 54, 33, 42, 3,
      61, 51, 37, 40, 49, 18, 28, 20, 55, 30, 34, 11, 43, 14, 22, 4,
      62, 57, 46, 52, 38, 26, 32, 41, 50, 36, 17, 19, 29, 10, 13, 21,
      56, 45, 25, 31, 35, 16, 9,  12, 44, 24, 15, 8,  23, 7,  6,  5};
  v |= v >> 1;
  v |= v >> 2;
  v |= v >> 4;
  v |= v >> 8;
  v |= v >> 16;
  v |= v >> 32;
  return table[((v - (v >> 1)) * 0x07EDD5E59A4E28C2ull) >> 58];
}

static uint64_t ska_next_pow2(uint64_t i) {
  --i;
  i |= i >> 1;
  i |= i >> 2;
  i |= i >> 4;
  i |= i >> 8;
  i |= i >> 16;
  i |= i >> 32;
  return i + 1;
}

/* MempoolIdHash: the non-zero half of the id. */
static uint64_t id_hash(msnap_mempool_id_t id) {
  return id.first != 0 ? id.first : id.second;
}

/* fibonacci_hash_policy::index_for_hash. */
static uint64_t idset_index(const msnap_idset_t *s, msnap_mempool_id_t id) {
  return (11400714819323198485ull * id_hash(id)) >> s->shift;
}

uint64_t msnap__idset_end(const msnap_idset_t *s) {
  return s->v ? s->nslots_m1 + (uint64_t)s->max_lookups : 0;
}

void msnap__idset_free(msnap_idset_t *s) {
  free(s->v);
  free(s->dist);
  memset(s, 0, sizeof *s);
}

static int idset_emplace(msnap_idset_t *s, msnap_mempool_id_t id);

/* sherwood_v3_table::rehash (grow() asks for max(4, 2 * bucket_count)):
 * new arrays first, so that a host allocation failure changes nothing;
 * the old entries are re-inserted in array order. */
static int idset_rehash(msnap_idset_t *s, uint64_t nb) {
  if (nb < 2 * s->n)
    nb = 2 * s->n;
  nb = ska_next_pow2(nb);
  if (nb < 2)
    nb = 2;
  int8_t shift = (int8_t)(64 - ska_log2(nb));
  if (s->v && nb == s->nslots_m1 + 1)
    return 0;
  int8_t ml = ska_log2(nb) > 4 ? ska_log2(nb) : 4;
  uint64_t ne = nb + (uint64_t)ml;
  msnap_mempool_id_t *nv = calloc(ne, sizeof *nv);
  int8_t *nd = malloc(ne);
  if (!nv || !nd) {
    free(nv);
    free(nd);
    return MSNAP_ENOMEM;
  }
  memset(nd, -1, ne - 1);
  nd[ne - 1] = 0; /* the end marker */
  msnap_mempool_id_t *ov = s->v;
  int8_t *od = s->dist;
  uint64_t oend = msnap__idset_end(s);
  s->v = nv;
  s->dist = nd;
  s->nslots_m1 = nb - 1;
  s->shift = shift;
  s->max_lookups = ml;
  s->n = 0;
  int rc = 0;
  for (uint64_t i = 0; i < oend; i++)
    if (od[i] >= 0 && rc == 0)
      rc = idset_emplace(s, ov[i]);
  free(ov);
  free(od);
  return rc;
}

static int idset_grow(msnap_idset_t *s) {
  uint64_t bc = s->v && s->nslots_m1 ? s->nslots_m1 + 1 : 0;
  return idset_rehash(s, bc * 2 > 4 ? bc * 2 : 4);
}

/* emplace_new_key: robin-hood insertion from slot `cur`, `d` away from
 * the key's desired slot. */
static int idset_emplace_new(msnap_idset_t *s, int8_t d, uint64_t cur,
                             msnap_mempool_id_t id) {
  if (s->v == NULL || s->nslots_m1 == 0 || d == s->max_lookups ||
      (double)(s->n + 1) > (double)(s->nslots_m1 + 1) * 0.5) {
    int rc = idset_grow(s);
    return rc ? rc : idset_emplace(s, id);
  }
  if (s->dist[cur] < 0) {
    s->v[cur] = id;
    s->dist[cur] = d;
    s->n++;
    return 0;
  }
  msnap_mempool_id_t ins = id, tv;
  int8_t td = s->dist[cur];
  s->dist[cur] = d;
  d = td;
  tv = s->v[cur];
  s->v[cur] = ins;
  ins = tv;
  uint64_t result = cur;
  uint64_t end = msnap__idset_end(s);
  for (++d, ++cur;; ++cur) {
    MSNAP_ASSERT(cur < end);
    if (s->dist[cur] < 0) {
      s->v[cur] = ins;
      s->dist[cur] = d;
      s->n++;
      return 0;
    } else if (s->dist[cur] < d) {
      td = s->dist[cur];
      s->dist[cur] = d;
      d = td;
      tv = s->v[cur];
      s->v[cur] = ins;
      ins = tv;
      ++d;
    } else {
      ++d;
      if (d == s->max_lookups) {
        tv = s->v[result];
        s->v[result] = ins;
        ins = tv;
        int rc = idset_grow(s);
        return rc ? rc : idset_emplace(s, ins);
      }
    }
  }
}

static int idset_emplace(msnap_idset_t *s, msnap_mempool_id_t id) {
  if (s->v == NULL)
    return idset_emplace_new(s, 0, 0, id);
  uint64_t cur = idset_index(s, id), end = msnap__idset_end(s);
  int8_t d = 0;
  for (; s->dist[cur] >= d; ++cur, ++d) {
    if (cur == end)
      break;
    if (msnap__id_eq(s->v[cur], id))
      return 0;
  }
  return idset_emplace_new(s, d, cur, id);
}

/* Slot of id, or msnap__idset_end(s) when absent (find). */
static uint64_t idset_find(const msnap_idset_t *s, msnap_mempool_id_t id) {
  uint64_t end = msnap__idset_end(s);
  if (s->v == NULL)
    return end;
  uint64_t it = idset_index(s, id);
  for (int8_t d = 0; s->dist[it] >= d; ++d, ++it) {
    if (it == end)
      return end;
    if (msnap__id_eq(s->v[it], id))
      return it;
  }
  return end;
}

/* erase: remove, then shift the following displaced entries back. */
static void idset_erase(msnap_idset_t *s, msnap_mempool_id_t id) {
  uint64_t cur = idset_find(s, id);
  if (cur == msnap__idset_end(s))
    return;
  s->dist[cur] = -1;
  s->n--;
  for (uint64_t next = cur + 1; s->dist[next] > 0; ++cur, ++next) {
    s->v[cur] = s->v[next];
    s->dist[cur] = (int8_t)(s->dist[next] - 1);
    s->dist[next] = -1;
  }
}

__attribute__((format(printf, 3, 4))) static int check_fail(char *msg,
                                                            size_t len,
                                                            const char *fmt,
                                                            ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
  return MSNAP_ESTATE;
}

int msnap__idset_check(const msnap_idset_t *s, char *msg, size_t len) {
  if (s->v == NULL)
    return s->n == 0 ? 0
                     : check_fail(msg, len, "use_on_oom set: %" PRIu64
                                            " ids without a table", s->n);
  uint64_t end = msnap__idset_end(s), n = 0;
  if (s->dist[end] != 0)
    return check_fail(msg, len, "use_on_oom set: end marker lost");
  for (uint64_t i = 0; i < end; i++) {
    if (s->dist[i] < 0)
      continue;
    n++;
    uint64_t want = idset_index(s, s->v[i]);
    if (want + (uint64_t)s->dist[i] != i || s->dist[i] >= s->max_lookups)
      return check_fail(msg, len,
                                  "use_on_oom set: id (%" PRIu64 ", %" PRIu64
                                  ") at slot %" PRIu64 " with distance %d "
                                  "(desired slot %" PRIu64 ")",
                                  s->v[i].first, s->v[i].second, i,
                                  s->dist[i], want);
    if (idset_find(s, s->v[i]) != i)
      return check_fail(msg, len,
                                  "use_on_oom set: id at slot %" PRIu64
                                  " is not found by a lookup", i);
  }
  if (n != s->n)
    return check_fail(msg, len,
                                "use_on_oom set: %" PRIu64 " ids, counted %"
                                PRIu64, n, s->n);
  return 0;
}

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
  if (rc == 0 && use_on_oom) {
    /* setUseOnOOM(id, true) (MemPool's constructor). */
    rc = idset_emplace(&d->oom_pools, nid);
    if (rc != 0) {
      pp->use_count = 0;
      pp->freeable = true;
      msnap__ppool_free(d, pp);
      rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    }
  }
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
    /* The last reference (MemPool's destructor: setUseOnOOM(id, false),
     * releasePool, emptyCache(id)). */
    idset_erase(&d->oom_pools, id);
    pp->freeable = true;
    rc = msnap__release_cached_blocks(d, id, msnap__capturing_any(d), &c);
  }
  msnap__unlock(&d->lock);
  msnap__call_end(&c);
  return rc;
}

/* beginAllocateToPool: push a (pool, filter) scope.  Caller checked d. */
static int begin_scope(msnap_device_t *d, msnap_mempool_id_t id,
                       uint8_t kind, uint64_t key) {
  if (msnap__id_zero(id))
    return msnap__set_error(MSNAP_EINVAL,
                            "beginAllocateToPool: mempool id (0, 0) is the "
                            "default pool");
  msnap__lock(&d->lock);
  int rc = 0;
  for (uint32_t i = 0; i < d->nscopes; i++) {
    if (msnap__id_eq(d->scopes[i].id, id)) {
      rc = msnap__set_error(MSNAP_ESTATE,
                            "beginAllocateToPool: already recording to "
                            "mempool_id (%" PRIu64 ", %" PRIu64 ")",
                            id.first, id.second);
      goto out;
    }
  }
  if (msnap__grow((void **)&d->scopes, &d->scopes_cap, d->nscopes, 1,
                  sizeof *d->scopes) != 0) {
    rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    goto out;
  }
  msnap_ppool_t *pp;
  rc = create_or_incref(d, id, &pp);
  if (rc != 0)
    goto out;
  d->scopes[d->nscopes++] = (msnap_scope_t){id, key, kind};
out:
  msnap__unlock(&d->lock);
  return rc;
}

int msnap_begin_allocate_to_pool(msnap_allocator_t *a, int device,
                                 msnap_mempool_id_t id, uint64_t stream,
                                 bool all_streams) {
  msnap_device_t *d = dev(a, device, "msnap_begin_allocate_to_pool");
  if (!d)
    return MSNAP_EINVAL;
  return begin_scope(d, id, all_streams ? MSNAP_SCOPE_ALL : MSNAP_SCOPE_STREAM,
                     all_streams ? 0 : stream);
}

/* _cuda_beginAllocateCurrentThreadToPool (torch/csrc/cuda/Module.cpp):
 * the filter accepts the allocations of the calling thread only. */
int msnap_begin_allocate_current_thread_to_pool(msnap_allocator_t *a,
                                                int device,
                                                msnap_mempool_id_t id) {
  msnap_device_t *d =
      dev(a, device, "msnap_begin_allocate_current_thread_to_pool");
  if (!d)
    return MSNAP_EINVAL;
  return begin_scope(d, id, MSNAP_SCOPE_THREAD, msnap__thread_key());
}

int msnap_end_allocate_to_pool(msnap_allocator_t *a, int device,
                               msnap_mempool_id_t id) {
  msnap_device_t *d = dev(a, device, "msnap_end_allocate_to_pool");
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  bool found = false;
  for (uint32_t i = 0; i < d->nscopes && !found; i++) {
    if (msnap__id_eq(d->scopes[i].id, id)) {
      for (uint32_t k = i + 1; k < d->nscopes; k++)
        d->scopes[k - 1] = d->scopes[k];
      d->nscopes--;
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

/* markCaptureBegin (CUDAGraph::capture_begin / NPUGraph after
 * AclmdlRICaptureBegin): a graph capture on `stream` is in progress. */
int msnap_mark_capture_begin(msnap_allocator_t *a, int device,
                             uint64_t stream) {
  msnap_device_t *d = dev(a, device, "msnap_mark_capture_begin");
  if (!d)
    return MSNAP_EINVAL;
  int rc = 0;
  msnap__lock(&d->lock);
  if (msnap__grow((void **)&d->capture_streams, &d->captures_cap,
                  d->ncaptures, 1, sizeof *d->capture_streams) != 0) {
    rc = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    goto out;
  }
  d->capture_streams[d->ncaptures++] = stream;
out:
  msnap__unlock(&d->lock);
  return rc;
}

/* markCaptureEnd: the capture on `stream` ended (MSNAP_ESTATE when none
 * is in progress there, PyTorch's "markCaptureEnd called with no captures
 * in progress"). */
int msnap_mark_capture_end(msnap_allocator_t *a, int device, uint64_t stream) {
  msnap_device_t *d = dev(a, device, "msnap_mark_capture_end");
  if (!d)
    return MSNAP_EINVAL;
  msnap__lock(&d->lock);
  bool found = false;
  for (uint32_t i = d->ncaptures; i-- > 0 && !found;) {
    if (d->capture_streams[i] == stream) {
      d->capture_streams[i] = d->capture_streams[--d->ncaptures];
      found = true;
    }
  }
  msnap__unlock(&d->lock);
  if (!found)
    return msnap__set_error(MSNAP_ESTATE,
                            "markCaptureEnd called with no captures in "
                            "progress on stream 0x%" PRIx64 " of device %d",
                            stream, device);
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
