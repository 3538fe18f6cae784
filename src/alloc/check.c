/*
 * check.c -- read-only walks over a device's segments:
 * msnap_check_invariants (every "must hold" of alloc.h and expandable.c,
 * stats recomputed from the blocks) and the snapshot segment collection
 * (PyTorch's snapshot(), allocator-algorithm.md §18).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc/alloc_core.h"
#include "alloc/host.h"

#define FAIL(...)                                                             \
  do {                                                                        \
    snprintf(msg, len, __VA_ARGS__);                                          \
    return MSNAP_ESTATE;                                                      \
  } while (0)

static bool block_active(const msnap_block_t *b) {
  return b->allocated || b->event_count > 0 || b->nuses > 0 || b->deferred;
}

static int check_pool(const msnap_bpool_t *pool, const char *name,
                      char *msg, size_t len) {
  int rc = msnap__rb_check(&pool->blocks, msg, len);
  if (rc == 0)
    rc = msnap__rb_check(&pool->unmapped, msg, len);
  if (rc != 0) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", msg);
    FAIL("%s pool: %s", name, tmp);
  }
  for (const msnap_block_t *b = msnap__rb_first(&pool->blocks); b;
       b = msnap__rb_next(b)) {
    if (b->in_set != MSNAP_IN_BLOCKS || b->pool != pool || !b->mapped ||
        b->allocated || block_active(b))
      FAIL("%s pool: block 0x%" PRIx64 " in the free set is not a free "
           "mapped block of this pool",
           name, b->ptr);
  }
  for (const msnap_block_t *b = msnap__rb_first(&pool->unmapped); b;
       b = msnap__rb_next(b)) {
    if (b->in_set != MSNAP_IN_UNMAPPED || b->pool != pool || b->mapped ||
        b->allocated)
      FAIL("%s pool: block 0x%" PRIx64 " in the unmapped set is not an "
           "unmapped block of this pool",
           name, b->ptr);
  }
  return 0;
}

typedef struct counts_s {
  msnap_stat_t arr[9][MSNAP_STAT_TYPES]; /* current only */
  int64_t oversize_alloc, oversize_seg;
  uint64_t in_blocks, in_unmapped, allocated, reserved, event_refs;
} counts_t;

enum {
  C_ALLOCATION,
  C_SEGMENT,
  C_ACTIVE,
  C_INACTIVE_SPLIT,
  C_ALLOCATED_BYTES,
  C_RESERVED_BYTES,
  C_ACTIVE_BYTES,
  C_INACTIVE_SPLIT_BYTES,
  C_REQUESTED_BYTES
};

static void add(counts_t *c, int which, int type, int64_t v) {
  c->arr[which][MSNAP_STAT_ALL].current += v;
  c->arr[which][type].current += v;
}

int msnap__device_check_locked(msnap_device_t *d, char *msg, size_t len) {
  msnap_allocator_t *a = d->a;
  uint64_t mss = a->conf.max_split_size;
  counts_t cn;
  memset(&cn, 0, sizeof cn);
  int rc;
  if ((rc = check_pool(&d->large, "default large", msg, len)) != 0)
    return rc;
  if ((rc = check_pool(&d->small, "default small", msg, len)) != 0)
    return rc;
  uint64_t pool_blocks = d->large.blocks.count + d->small.blocks.count;
  uint64_t pool_unmapped = d->large.unmapped.count + d->small.unmapped.count;
  for (const msnap_ppool_t *pp = d->ppools; pp; pp = pp->next) {
    if ((rc = check_pool(&pp->large, "private large", msg, len)) != 0)
      return rc;
    if ((rc = check_pool(&pp->small, "private small", msg, len)) != 0)
      return rc;
    pool_blocks += pp->large.blocks.count + pp->small.blocks.count;
    pool_unmapped += pp->large.unmapped.count + pp->small.unmapped.count;
    int64_t nseg = 0;
    for (const msnap_segment_t *s = d->segments; s; s = s->snext)
      if (s->pool->owner == pp)
        nseg++;
    if (nseg != pp->malloc_count)
      FAIL("private pool (%" PRIu64 ",%" PRIu64 ") has %" PRId64
           " segments but malloc_count %" PRId64,
           pp->id.first, pp->id.second, nseg, pp->malloc_count);
    /* reserved_bytes_by_private_pools: the mapped bytes of its segments. */
    int64_t mapped[MSNAP_STAT_TYPES] = {0};
    for (const msnap_segment_t *s = d->segments; s; s = s->snext) {
      if (s->pool->owner != pp)
        continue;
      int type = msnap__pool_stat_type(s->pool);
      for (const msnap_block_t *b = s->head; b; b = b->next) {
        if (b->mapped) {
          mapped[MSNAP_STAT_ALL] += (int64_t)b->size;
          mapped[type] += (int64_t)b->size;
        }
      }
    }
    for (int t = 0; t < MSNAP_STAT_TYPES; t++) {
      if (pp->reserved[t].current != mapped[t])
        FAIL("private pool (%" PRIu64 ",%" PRIu64 "): reserved stat %d "
             "current %" PRId64 " but its segments map %" PRId64,
             pp->id.first, pp->id.second, t, pp->reserved[t].current,
             mapped[t]);
      if (pp->reserved[t].peak < pp->reserved[t].current)
        FAIL("private pool (%" PRIu64 ",%" PRIu64 "): reserved stat %d "
             "peak below current",
             pp->id.first, pp->id.second, t);
    }
  }
  for (uint32_t i = 0; i < d->nretired; i++) {
    const msnap_pool_stats_t *r = &d->retired[i];
    for (int t = 0; t < MSNAP_STAT_TYPES; t++)
      if (r->reserved_bytes[t].current != 0)
        FAIL("deleted private pool (%" PRIu64 ",%" PRIu64 "): reserved "
             "stat %d current %" PRId64 ", not 0",
             r->id.first, r->id.second, t, r->reserved_bytes[t].current);
    for (const msnap_ppool_t *pp = d->ppools; pp; pp = pp->next)
      if (msnap__id_eq(pp->id, r->id))
        FAIL("private pool (%" PRIu64 ",%" PRIu64 ") is both live and "
             "deleted",
             r->id.first, r->id.second);
    for (uint32_t k = i + 1; k < d->nretired; k++)
      if (msnap__id_eq(d->retired[k].id, r->id))
        FAIL("deleted private pool (%" PRIu64 ",%" PRIu64 ") listed twice",
             r->id.first, r->id.second);
  }

  uint64_t nseg = 0;
  for (const msnap_segment_t *s = d->segments; s; s = s->snext) {
    nseg++;
    if (s->snext && s->snext->sprev != s)
      FAIL("segment list links broken at 0x%" PRIx64, s->base);
    const msnap_block_t *b = s->head;
    if (!b || b->prev)
      FAIL("segment 0x%" PRIx64 ": head block missing or has a prev",
           s->base);
    if (b->ptr != s->base)
      FAIL("segment 0x%" PRIx64 ": head block starts at 0x%" PRIx64, s->base,
           b->ptr);
    uint64_t sum = 0, mapped = 0;
    int type = msnap__pool_stat_type(s->pool);
    bool split = b->next != NULL;
    for (; b; b = b->next) {
      if (b->seg != s || b->pool != s->pool || b->stream != s->stream)
        FAIL("block 0x%" PRIx64 " disagrees with its segment 0x%" PRIx64
             " (segment, pool or stream)",
             b->ptr, s->base);
      if (b->next && b->ptr + b->size != b->next->ptr)
        FAIL("segment 0x%" PRIx64 ": block 0x%" PRIx64 " + %" PRIu64
             " does not reach the next block 0x%" PRIx64,
             s->base, b->ptr, b->size, b->next->ptr);
      if (b->next && b->next->prev != b)
        FAIL("segment 0x%" PRIx64 ": broken prev link at 0x%" PRIx64,
             s->base, b->next->ptr);
      if (b->size == 0 || b->size % MSNAP_MIN_BLOCK_SIZE)
        FAIL("block 0x%" PRIx64 " has size %" PRIu64
             " (not a positive multiple of 512)",
             b->ptr, b->size);
      sum += b->size;
      if (b->event_count < 0)
        FAIL("block 0x%" PRIx64 " has event_count %d", b->ptr,
             b->event_count);
      cn.event_refs += (uint64_t)b->event_count;
      bool active = block_active(b);
      bool is_free = !b->allocated && !active;
      if (!b->mapped) {
        if (b->in_set != MSNAP_IN_UNMAPPED || b->allocated || active)
          FAIL("unmapped block 0x%" PRIx64 " is not in the unmapped set",
               b->ptr);
        if (!s->expandable)
          FAIL("unmapped block 0x%" PRIx64 " in a non-expandable segment",
               b->ptr);
        cn.in_unmapped++;
      } else {
        mapped += b->size;
        if (is_free != (b->in_set == MSNAP_IN_BLOCKS))
          FAIL("block 0x%" PRIx64 " (%s) %s the free set", b->ptr,
               is_free ? "free" : "in use", is_free ? "is not in" : "is in");
        if (is_free)
          cn.in_blocks++;
      }
      if (b->next && b->in_set != MSNAP_IN_NONE &&
          b->next->in_set == b->in_set)
        FAIL("adjacent free blocks 0x%" PRIx64 " and 0x%" PRIx64
             " were not merged",
             b->ptr, b->next->ptr);
      if (b->allocated) {
        cn.allocated++;
        add(&cn, C_ALLOCATION, type, 1);
        add(&cn, C_ALLOCATED_BYTES, type, (int64_t)b->size);
        if (b->size >= mss)
          cn.oversize_alloc++;
      }
      if (active) {
        add(&cn, C_ACTIVE, type, 1);
        add(&cn, C_ACTIVE_BYTES, type, (int64_t)b->size);
        add(&cn, C_REQUESTED_BYTES, type, (int64_t)b->requested_size);
      }
      if (is_free && b->mapped && split && !s->expandable) {
        add(&cn, C_INACTIVE_SPLIT, type, 1);
        add(&cn, C_INACTIVE_SPLIT_BYTES, type, (int64_t)b->size);
      }
    }
    if (sum != s->size)
      FAIL("segment 0x%" PRIx64 ": blocks sum to %" PRIu64
           " but the segment has %" PRIu64 " bytes",
           s->base, sum, s->size);
    if (s->expandable) {
      if (mapped > s->mapped_bytes)
        FAIL("expandable segment 0x%" PRIx64 ": %" PRIu64
             " bytes in mapped blocks but only %" PRIu64 " mapped",
             s->base, mapped, s->mapped_bytes);
      uint64_t ng = 0;
      for (uint64_t i = 0; i < s->handles_cap; i++)
        ng += s->is_mapped[i];
      if (ng * s->granule != s->mapped_bytes)
        FAIL("expandable segment 0x%" PRIx64 ": granule map disagrees "
             "with mapped_bytes",
             s->base);
      add(&cn, C_RESERVED_BYTES, type, (int64_t)s->mapped_bytes);
      cn.reserved += s->mapped_bytes;
    } else {
      add(&cn, C_SEGMENT, type, 1);
      add(&cn, C_RESERVED_BYTES, type, (int64_t)s->size);
      cn.reserved += s->size;
      if (s->size >= mss)
        cn.oversize_seg++;
    }
  }
  if (nseg != d->nsegments)
    FAIL("device %d: %" PRIu64 " segments listed but nsegments %" PRIu64,
         d->id, nseg, d->nsegments);
  if (cn.in_blocks != pool_blocks)
    FAIL("device %d: %" PRIu64 " free blocks in segments but %" PRIu64
         " in the pools' free sets",
         d->id, cn.in_blocks, pool_blocks);
  if (cn.in_unmapped != pool_unmapped)
    FAIL("device %d: %" PRIu64 " unmapped blocks in segments but %" PRIu64
         " in the pools' unmapped sets",
         d->id, cn.in_unmapped, pool_unmapped);
  if (cn.allocated != d->map.count)
    FAIL("device %d: %" PRIu64 " allocated blocks but %" PRIu64
         " ptr map entries",
         d->id, cn.allocated, d->map.count);
  if (cn.reserved != d->total_allocated_memory)
    FAIL("device %d: total_allocated_memory %" PRIu64
         " but segments hold %" PRIu64,
         d->id, d->total_allocated_memory, cn.reserved);
  if (d->map.buckets) {
    uint64_t entries = 0;
    for (uint64_t i = 0; i <= d->map.mask; i++) {
      for (const msnap_block_t *h = d->map.buckets[i]; h; h = h->hnext) {
        uint64_t key = h->ptr;
        if (!h->allocated || (XXH3_64bits(&key, sizeof key) & d->map.mask) != i)
          FAIL("ptr map entry 0x%" PRIx64 " is not an allocated block in "
               "its bucket",
               h->ptr);
        if (++entries > d->map.count)
          FAIL("ptr map has more entries than its count (cycle?)");
      }
    }
    if (entries != d->map.count)
      FAIL("ptr map holds %" PRIu64 " entries but counts %" PRIu64, entries,
           d->map.count);
  }
  uint64_t pend = 0;
  for (uint32_t i = 0; i < d->nevqs; i++)
    pend += d->evqs[i].n;
  if (pend != cn.event_refs)
    FAIL("device %d: %" PRIu64 " queued events but the blocks' event_count "
         "sum to %" PRIu64,
         d->id, pend, cn.event_refs);
  if (pend != d->pending_events)
    FAIL("device %d: %" PRIu64 " queued events but pending_events %" PRIu64,
         d->id, pend, d->pending_events);

  const msnap_stat_t *arrs[9] = {
      d->stats.allocation,      d->stats.segment,
      d->stats.active,          d->stats.inactive_split,
      d->stats.allocated_bytes, d->stats.reserved_bytes,
      d->stats.active_bytes,    d->stats.inactive_split_bytes,
      d->stats.requested_bytes};
  static const char *names[9] = {
      "allocation",      "segment",        "active",
      "inactive_split",  "allocated_bytes", "reserved_bytes",
      "active_bytes",    "inactive_split_bytes", "requested_bytes"};
  static const char *tnames[3] = {"all", "small_pool", "large_pool"};
  for (int k = 0; k < 9; k++) {
    for (int t = 0; t < MSNAP_STAT_TYPES; t++) {
      const msnap_stat_t *s = &arrs[k][t];
      if (s->current != cn.arr[k][t].current)
        FAIL("device %d: stat %s.%s.current is %" PRId64
             " but the blocks give %" PRId64,
             d->id, names[k], tnames[t], s->current, cn.arr[k][t].current);
      if (s->peak < s->current)
        FAIL("device %d: stat %s.%s peak %" PRId64 " < current %" PRId64,
             d->id, names[k], tnames[t], s->peak, s->current);
    }
  }
  /* Allocate-to-pool scopes name live, non-freeable pools, once each;
   * the use_on_oom set is a well-formed table of live pools' ids. */
  for (uint32_t i = 0; i < d->nscopes; i++) {
    const msnap_ppool_t *pp = msnap__ppool_find(d, d->scopes[i].id);
    if (!pp || pp->freeable || pp->use_count <= 0)
      FAIL("device %d: scope %u names pool (%" PRIu64 ", %" PRIu64
           ") which is not a live pool",
           d->id, i, d->scopes[i].id.first, d->scopes[i].id.second);
    for (uint32_t k = 0; k < i; k++)
      if (msnap__id_eq(d->scopes[k].id, d->scopes[i].id))
        FAIL("device %d: pool (%" PRIu64 ", %" PRIu64 ") has two scopes",
             d->id, d->scopes[i].id.first, d->scopes[i].id.second);
    if (d->scopes[i].kind > MSNAP_SCOPE_THREAD)
      FAIL("device %d: scope %u has kind %u", d->id, i, d->scopes[i].kind);
  }
  if (d->ncaptures > d->captures_cap)
    FAIL("device %d: %u captures in %u slots", d->id, d->ncaptures,
         d->captures_cap);
  if ((rc = msnap__idset_check(&d->oom_pools, msg, len)) != 0)
    return rc;
  {
    const msnap_idset_t *set = &d->oom_pools;
    for (uint64_t i = 0; i < msnap__idset_end(set); i++) {
      if (set->dist[i] < 0)
        continue;
      const msnap_ppool_t *pp = msnap__ppool_find(d, set->v[i]);
      if (!pp || pp->use_count <= 0 || !pp->use_on_oom)
        FAIL("device %d: use_on_oom set holds (%" PRIu64 ", %" PRIu64
             ") which is not a live use_on_oom pool",
             d->id, set->v[i].first, set->v[i].second);
    }
  }
  if (!a->mss_changed) {
    if (d->stats.oversize_allocations.current != cn.oversize_alloc)
      FAIL("device %d: oversize_allocations.current %" PRId64
           " but the blocks give %" PRId64,
           d->id, d->stats.oversize_allocations.current, cn.oversize_alloc);
    if (d->stats.oversize_segments.current != cn.oversize_seg)
      FAIL("device %d: oversize_segments.current %" PRId64
           " but the segments give %" PRId64,
           d->id, d->stats.oversize_segments.current, cn.oversize_seg);
  }
  return 0;
}

int msnap_check_invariants(msnap_allocator_t *a, char *msg, size_t len) {
  char dummy[8];
  if (!msg || len == 0) {
    msg = dummy;
    len = sizeof dummy;
  }
  msg[0] = 0;
  if (!a) {
    snprintf(msg, len, "NULL allocator");
    return MSNAP_EINVAL;
  }
  for (int i = 0; i < a->ndevices; i++) {
    msnap_device_t *d = &a->devices[i];
    msnap__lock(&d->lock);
    int rc = msnap__device_check_locked(d, msg, len);
    msnap__unlock(&d->lock);
    if (rc != 0)
      return rc;
  }
  /* The pinned host allocator (no-op when it was never used). */
  return msnap__host_check(a, msg, len);
}

/* ---- snapshot collection ------------------------------------------------ */

typedef struct head_s {
  const msnap_block_t *b;
} head_t;

static int cmp_head(const void *x, const void *y) {
  uint64_t a = ((const head_t *)x)->b->ptr, b = ((const head_t *)y)->b->ptr;
  return a < b ? -1 : a > b;
}

/*
 * PyTorch's snapshot(mempool_id) segment list: a reported segment starts
 * at every mapped block whose prev is absent or unmapped (so expandable
 * segments give one segment per contiguous mapped range) and runs over
 * the following mapped blocks.  Sorted by address.
 */
int msnap__device_collect_segments_locked(msnap_allocator_t *a, int device,
                                          msnap_mempool_id_t pool,
                                          msnap_snap_t *out,
                                          uint64_t *active_bytes) {
  msnap_device_t *d = msnap__device(a, device);
  if (!d || !out)
    return MSNAP_EINVAL;
  uint64_t n = 0, cap = 0;
  head_t *heads = NULL;
  for (const msnap_segment_t *s = d->segments; s; s = s->snext) {
    msnap_mempool_id_t id = msnap__pool_id(s->pool);
    if (!msnap__id_zero(pool) && !msnap__id_eq(id, pool))
      continue;
    for (const msnap_block_t *b = s->head; b; b = b->next) {
      if (!b->mapped || (b->prev && b->prev->mapped))
        continue;
      if (MSNAP_GROW(heads, cap, n + 1) != 0) {
        free(heads);
        return MSNAP_ENOMEM;
      }
      heads[n++].b = b;
    }
  }
  if (n > 1)
    qsort(heads, n, sizeof *heads, cmp_head);
  uint64_t total_active = 0;
  for (uint64_t i = 0; i < n; i++) {
    const msnap_block_t *h = heads[i].b;
    const msnap_segment_t *s = h->seg;
    msnap_ssegment_t *sg = msnap__snap_add_segment(out);
    if (!sg) {
      free(heads);
      return MSNAP_ENOMEM;
    }
    sg->device = device;
    sg->address = h->ptr;
    sg->stream = (int64_t)h->stream;
    sg->pool_id = msnap__pool_id(s->pool);
    sg->is_large = !s->pool->is_small;
    sg->is_expandable = s->expandable;
    sg->frames = s->stack;
    if (s->stack)
      msnap__stack_ref(s->stack);
    sg->keys = MSNAP_K_FRAMES | MSNAP_K_POOL_ID | MSNAP_K_EXPANDABLE |
               MSNAP_K_STREAM | MSNAP_K_SEGMENT_TYPE | MSNAP_K_REQUESTED;
    sg->first_block = out->nblocks;
    sg->nblocks = 0;
    for (const msnap_block_t *b = h; b && b->mapped; b = b->next) {
      msnap_sblock_t *sb = msnap__snap_add_block(out);
      if (!sb) {
        free(heads);
        return MSNAP_ENOMEM;
      }
      /* add_block may move the segments array: re-fetch. */
      sg = &out->segments[out->nsegments - 1];
      bool active = block_active(b);
      sb->address = b->ptr;
      sb->size = b->size;
      sb->requested_size = b->requested_size;
      sb->frames = b->stack;
      if (b->stack)
        msnap__stack_ref(b->stack);
      sb->keys = MSNAP_K_ADDRESS | MSNAP_K_REQUESTED | MSNAP_K_FRAMES;
      sb->state = b->allocated ? MSNAP_BLOCK_ACTIVE_ALLOCATED
                  : active     ? MSNAP_BLOCK_ACTIVE_PENDING_FREE
                               : MSNAP_BLOCK_INACTIVE;
      sg->nblocks++;
      sg->total_size += b->size;
      if (b->allocated)
        sg->allocated_size += b->size;
      if (active) {
        sg->active_size += b->size;
        sg->requested_size += b->requested_size;
      }
    }
    total_active += sg->active_size;
  }
  free(heads);
  if (active_bytes)
    *active_bytes = total_active;
  return 0;
}
