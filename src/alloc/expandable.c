/*
 * expandable.c -- expandable segments (allocator-algorithm.md §13):
 * one VA reservation per segment, physical memory mapped granule by
 * granule through the runtime's VMM ops (vmm_reserve/map/unmap/release).
 *
 * A segment's VA is covered by blocks in address order: mapped blocks
 * (free in pool->blocks, allocated, or pending) and unmapped blocks (in
 * pool->unmapped).  Invariants, in addition to those of alloc.h:
 *   - an unmapped block starts and ends on granule boundaries (or at the
 *     end of the VA), and its granules are not mapped;
 *   - every granule overlapping a mapped block is mapped (is_mapped[i]),
 *     and seg->mapped_bytes = granule * number of mapped granules;
 *   - reserved_bytes counts mapped bytes; the `segment` stat never counts
 *     expandable segments, and inactive_split* never count their blocks.
 * Callers hold the device lock.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_core.h"

/*
 * Granule of a pool (§13; npu §20.3).  A configured size that is not a
 * multiple of 2 MiB (e.g. large_segment_size_mb:21) is rounded up to one:
 * VMM runtimes only map whole 2 MiB pages.
 */
static uint64_t granule_for(const msnap_allocator_t *a,
                            const msnap_bpool_t *pool) {
  const msnap_conf_t *c = &a->conf;
  uint64_t g = c->large_segment_size;
  if (pool->is_small)
    return MSNAP_SMALL_BUFFER;
  if (a->profile == MSNAP_PROFILE_NPU) {
    if (c->page_size_1g)
      return MSNAP_EXTRA_LARGE_BUFFER;
    if (!c->large_segment_size_set && c->segment_size_mb)
      g = c->segment_size_mb * MSNAP_MIB;
  }
  return (g + MSNAP_SMALL_BUFFER - 1) / MSNAP_SMALL_BUFFER * MSNAP_SMALL_BUFFER;
}

static int ensure_handles(msnap_segment_t *s, uint64_t n) {
  if (n <= s->handles_cap)
    return 0;
  uint64_t nc = s->handles_cap ? s->handles_cap : 8;
  while (nc < n)
    nc *= 2;
  if (nc > s->nhandles)
    nc = s->nhandles;
  uint64_t *h = realloc(s->handles, nc * sizeof *h);
  if (!h)
    return MSNAP_ENOMEM;
  s->handles = h;
  uint8_t *m = realloc(s->is_mapped, nc);
  if (!m)
    return MSNAP_ENOMEM;
  memset(m + s->handles_cap, 0, nc - s->handles_cap);
  s->is_mapped = m;
  s->handles_cap = nc;
  return 0;
}

/*
 * ExpandableSegment::map: map the granules covering [ptr, ptr+size)
 * (ptr granule aligned).  Returns the mapped byte count (0 on failure,
 * with every granule mapped by this call unmapped again and *err set).
 */
static uint64_t seg_map(msnap_device_t *d, msnap_segment_t *s, uint64_t ptr,
                        uint64_t size, int *err) {
  msnap_allocator_t *a = d->a;
  uint64_t g = s->granule;
  uint64_t begin = (ptr - s->base) / g;
  uint64_t end = (ptr - s->base + size + g - 1) / g;
  if (end > s->nhandles)
    end = s->nhandles;
  if (ensure_handles(s, end) != 0) {
    *err = MSNAP_ENOMEM;
    return 0;
  }
  for (uint64_t i = begin; i < end; i++) {
    uint64_t h = 0;
    int rc = a->rt->vmm_map(a->rt_ctx, d->id, s->base + i * g, g, &h);
    if (rc != 0) {
      for (uint64_t k = begin; k < i; k++) {
        a->rt->vmm_unmap(a->rt_ctx, d->id, s->base + k * g, g, s->handles[k]);
        s->is_mapped[k] = 0;
      }
      *err = rc;
      return 0;
    }
    s->handles[i] = h;
    s->is_mapped[i] = 1;
  }
  s->mapped_bytes += (end - begin) * g;
  return (end - begin) * g;
}

/*
 * ExpandableSegment::unmap: unmap the granules fully inside
 * [ptr, ptr+size).  Returns the unmapped range (it stops at the first
 * failing granule, so the range is always contiguous from its start).
 */
static uint64_t seg_unmap(msnap_device_t *d, msnap_segment_t *s, uint64_t ptr,
                          uint64_t size, uint64_t *uptr) {
  msnap_allocator_t *a = d->a;
  uint64_t g = s->granule;
  uint64_t off = ptr - s->base;
  uint64_t begin = (off + g - 1) / g;
  uint64_t end = (off + size) / g;
  *uptr = s->base + begin * g;
  if (begin >= end)
    return 0;
  /* CUDA synchronises the segment's stream, torch_npu the device. */
  a->rt->device_synchronize(a->rt_ctx, d->id);
  uint64_t i;
  for (i = begin; i < end; i++) {
    if (a->rt->vmm_unmap(a->rt_ctx, d->id, s->base + i * g, g,
                         s->handles[i]) != 0)
      break;
    s->is_mapped[i] = 0;
  }
  s->mapped_bytes -= (i - begin) * g;
  return (i - begin) * g;
}

static inline bool allocatable(const msnap_block_t *b) {
  return b && !b->allocated && b->event_count == 0 && b->nuses == 0 &&
         !b->deferred;
}

/* The reserve class set for a stream ("" when none); caller holds a
 * device lock. */
static const char *stream_class(const msnap_allocator_t *a, uint64_t stream) {
  for (uint32_t i = 0; i < a->nstream_classes; i++)
    if (a->stream_classes[i].stream == stream)
      return a->stream_classes[i].name;
  return "";
}

/*
 * Granules of a new segment's VA (ExpandableSegment's max_handles_ =
 * numSegments(reserve)): the reserve is total + total / 8 unless
 * expandable_segments_reserve[_by_class] (cuda) sets a smaller one for the
 * stream's class (msnap__conf_reserve_bytes).
 */
static uint64_t segment_granules(const msnap_device_t *d, uint64_t g,
                                 uint64_t stream) {
  const msnap_allocator_t *a = d->a;
  uint64_t reserve = msnap__conf_reserve_bytes(
      &a->conf, stream_class(a, stream), d->device_total);
  uint64_t n = reserve / g + (reserve % g != 0);
  return n == 0 ? 1 : n;
}

/* A new expandable segment whose VA is one unmapped block.  A request
 * larger than that VA fails with MSNAP_EOOM and p->reserve_short (the OOM
 * message then names expandable_segments_reserve). */
static msnap_block_t *new_segment(msnap_device_t *d, msnap_params_t *p) {
  msnap_allocator_t *a = d->a;
  uint64_t g = granule_for(a, p->pool);
  uint64_t n = segment_granules(d, g, p->stream);
  if (p->size > n * g) {
    p->err = MSNAP_EOOM;
    p->reserve_short = true;
    return NULL;
  }
  msnap_block_t *b = msnap__block_new(d);
  if (!b) {
    p->err = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    return NULL;
  }
  msnap_segment_t *s = msnap__segment_new(d, p->pool, p->stream);
  if (!s) {
    msnap__block_delete(d, b);
    p->err = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    return NULL;
  }
  uint64_t va = 0;
  /* Alignment 0: the runtime's default granularity, as PyTorch's
   * cuMemAddressReserve(&ptr, size, 0, 0, 0). */
  int rc = a->rt->vmm_reserve(a->rt_ctx, d->id, n * g, 0, &va);
  if (rc != 0) {
    msnap__segment_delete(d, s);
    msnap__block_delete(d, b);
    if (rc == MSNAP_EOOM)
      p->err = MSNAP_EOOM;
    else
      p->err = msnap__set_error(rc,
                                "device runtime vmm_reserve of %" PRIu64
                                " bytes on device %d failed: %s",
                                n * g, d->id, msnap_strerror(rc));
    return NULL;
  }
  s->expandable = true;
  s->base = va;
  s->size = n * g;
  s->granule = g;
  s->nhandles = n;
  s->head = b;
  b->stream = p->stream;
  b->size = n * g;
  b->ptr = va;
  b->pool = p->pool;
  b->seg = s;
  b->mapped = 0;
  msnap__pool_insert_unmapped(p->pool, b);
  return b;
}

/* find_expandable_block (CCA L2799-2844). */
static msnap_block_t *find_expandable_block(msnap_device_t *d,
                                            msnap_params_t *p) {
  uint64_t size = p->size;
  for (msnap_block_t *u =
           msnap__rb_lower_bound(&p->pool->unmapped, p->stream, 0, 0);
       u && u->stream == p->stream; u = msnap__rb_next(u)) {
    msnap_block_t *c = allocatable(u->prev) ? u->prev : u;
    uint64_t bytes = 0;
    for (msnap_block_t *b = c; bytes < size && allocatable(b); b = b->next)
      bytes += b->size;
    if (bytes >= size)
      return c;
  }
  return new_segment(d, p);
}

/*
 * map_block (CCA L2846-2913): map `size` bytes at the start of the
 * unmapped block; the mapped part becomes a free block merged with free
 * mapped neighbours and inserted into pool->blocks.  Returns the block
 * (to_map itself) or NULL with p->err set.
 */
static msnap_block_t *map_block(msnap_device_t *d, msnap_block_t *to_map,
                                uint64_t size, msnap_params_t *p,
                                const msnap_call_t *c) {
  msnap_segment_t *s = to_map->seg;
  msnap_bpool_t *pool = to_map->pool;
  msnap_block_t *rest = NULL;
  int err = 0;
  /* Reserve the object for the unmapped rest before touching the VMM. */
  rest = msnap__block_new(d);
  if (!rest) {
    p->err = msnap__set_error(MSNAP_ENOMEM, "out of host memory");
    return NULL;
  }
  uint64_t mapped = seg_map(d, s, to_map->ptr, size, &err);
  if (mapped == 0) {
    msnap__block_delete(d, rest);
    if (err == MSNAP_EOOM || err == 0)
      p->err = MSNAP_EOOM;
    else
      p->err = msnap__set_error(err,
                                "device runtime vmm_map at 0x%" PRIx64
                                " on device %d failed: %s",
                                to_map->ptr, d->id, msnap_strerror(err));
    return NULL;
  }
  msnap__pool_erase(to_map);
  to_map->mapped = 1;
  /* The trace names the newly mapped range (§13): its start is to_map's
   * ptr before the merge with a free predecessor moves it. */
  uint64_t map_ptr = to_map->ptr;
  if (mapped < to_map->size) {
    rest->stream = to_map->stream;
    rest->size = to_map->size - mapped;
    rest->ptr = to_map->ptr + mapped;
    rest->pool = pool;
    rest->seg = s;
    rest->mapped = 0;
    msnap__link_after(rest, to_map);
    msnap__pool_insert_unmapped(pool, rest);
    to_map->size = mapped;
  } else {
    msnap__block_delete(d, rest);
  }
  msnap__try_merge(d, to_map, to_map->prev);
  msnap__try_merge(d, to_map, to_map->next);
  msnap__pool_insert_blocks(pool, to_map);
  d->total_allocated_memory += mapped;
  msnap__reserved_inc(d, pool, (int64_t)mapped);
  d->stats.num_device_alloc++;
  msnap__trace(d, c, MSNAP_ACTION_SEGMENT_MAP, map_ptr, mapped,
               to_map->stream, pool, 0);
  if (!s->stack && c->r.stack) {
    msnap__stack_ref(c->r.stack);
    s->stack = c->r.stack;
  }
  return to_map;
}

/*
 * try_allocate_expandable_block (CCA L2915-2946): map enough granules for
 * p->size bytes (the rounded request, not alloc_size) and return the free
 * block, erased from pool->blocks; NULL with p->err set on failure.
 */
msnap_block_t *msnap__try_allocate_expandable(msnap_device_t *d,
                                              msnap_params_t *p,
                                              const msnap_call_t *c) {
  msnap_block_t *cand = find_expandable_block(d, p);
  if (!cand)
    return NULL;
  if (!cand->mapped) {
    uint64_t n = cand->size < p->size ? cand->size : p->size;
    cand = map_block(d, cand, n, p, c);
    if (!cand)
      return NULL;
  }
  while (cand->size < p->size) {
    /* free -> unmapped -> *: the merged candidate absorbed every free
     * mapped neighbour, so the next block is unmapped (find checked that
     * the chain is long enough). */
    msnap_block_t *nx = cand->next;
    if (!nx || nx->mapped) {
      p->err = MSNAP_EOOM;
      return NULL;
    }
    uint64_t remaining = p->size - cand->size;
    uint64_t n = remaining < nx->size ? remaining : nx->size;
    cand = map_block(d, nx, n, p, c);
    if (!cand)
      return NULL;
  }
  msnap__pool_erase(cand);
  return cand;
}

/*
 * unmap_block (CCA L3536-3605): unmap the fully free granules of free
 * block b; unaligned head/tail pieces stay mapped as separate free blocks;
 * the unmapped middle merges with unmapped neighbours into pool->unmapped.
 */
void msnap__unmap_block(msnap_device_t *d, msnap_block_t *b,
                        const msnap_call_t *c) {
  msnap_segment_t *s = b->seg;
  msnap_bpool_t *pool = b->pool;
  /* Reserve the two fragment objects first (host OOM: do nothing). */
  msnap_block_t *before = msnap__block_new(d);
  msnap_block_t *after = before ? msnap__block_new(d) : NULL;
  if (!after) {
    if (before)
      msnap__block_delete(d, before);
    return;
  }
  uint64_t uptr = 0;
  uint64_t usize = seg_unmap(d, s, b->ptr, b->size, &uptr);
  if (usize == 0) {
    msnap__block_delete(d, before);
    msnap__block_delete(d, after);
    return;
  }
  msnap__pool_erase(b);
  uint64_t before_size = uptr - b->ptr;
  if (before_size > 0) {
    before->stream = b->stream;
    before->size = before_size;
    before->ptr = b->ptr;
    before->pool = pool;
    before->seg = s;
    before->mapped = 1;
    msnap__link_before(before, b);
    msnap__pool_insert_blocks(pool, before);
  } else {
    msnap__block_delete(d, before);
  }
  uint64_t after_size = b->size - (before_size + usize);
  if (after_size > 0) {
    after->stream = b->stream;
    after->size = after_size;
    after->ptr = uptr + usize;
    after->pool = pool;
    after->seg = s;
    after->mapped = 1;
    msnap__link_after(after, b);
    msnap__pool_insert_blocks(pool, after);
  } else {
    msnap__block_delete(d, after);
  }
  b->ptr = uptr;
  b->size = usize;
  b->mapped = 0;
  msnap__try_merge(d, b, b->prev);
  msnap__try_merge(d, b, b->next);
  msnap__pool_insert_unmapped(pool, b);
  d->total_allocated_memory -= usize;
  msnap__reserved_dec(d, pool, (int64_t)usize);
  d->stats.num_device_free++;
  msnap__trace(d, c, MSNAP_ACTION_SEGMENT_UNMAP, uptr, usize, b->stream, pool,
               s->stack);
}

/*
 * release_expandable_segment (CCA L3473-3487): b is the only block of its
 * segment and unmapped; release the VA and delete both.
 */
int msnap__release_expandable_segment(msnap_device_t *d, msnap_block_t *b) {
  msnap_allocator_t *a = d->a;
  msnap_segment_t *s = b->seg;
  int rc = a->rt->vmm_release(a->rt_ctx, d->id, s->base, s->size);
  if (rc != 0)
    rc = a->rt->vmm_release(a->rt_ctx, d->id, s->base, s->size);
  msnap__pool_erase(b);
  msnap__segment_delete(d, s);
  msnap__block_delete(d, b);
  if (rc != 0)
    return msnap__set_error(rc,
                            "device runtime vmm_release on device %d "
                            "failed: %s",
                            d->id, msnap_strerror(rc));
  return 0;
}

void msnap__expandable_teardown(msnap_device_t *d, msnap_segment_t *s) {
  msnap_allocator_t *a = d->a;
  for (uint64_t i = 0; i < s->handles_cap; i++) {
    if (!s->is_mapped[i])
      continue;
    uint64_t va = s->base + i * s->granule;
    if (a->rt->vmm_unmap(a->rt_ctx, d->id, va, s->granule, s->handles[i]) != 0)
      a->rt->vmm_unmap(a->rt_ctx, d->id, va, s->granule, s->handles[i]);
    s->is_mapped[i] = 0;
  }
  if (a->rt->vmm_release(a->rt_ctx, d->id, s->base, s->size) != 0)
    a->rt->vmm_release(a->rt_ctx, d->id, s->base, s->size);
}
