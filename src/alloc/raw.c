/*
 * raw.c -- the caching-disabled path (allocator-algorithm.md §19):
 * PYTORCH_NO_{CUDA,NPU}_MEMORY_CACHING=1 or msnap_set_caching_enabled(
 * false) turn every request into a direct runtime malloc (npu: + the
 * 32-byte pad, no rounding) and every free into a direct runtime free;
 * no pools, no statistics, no history.
 *
 * The live raw allocations are an open-addressing table ptr -> (device,
 * size) keyed by XXH3, linear probing with backward-shift deletion, under
 * a->raw_lock.  Invariant: raw_count is the number of used slots and the
 * table is at most half full.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc/alloc_core.h"

static inline uint64_t ptr_hash(uint64_t ptr) {
  return XXH3_64bits(&ptr, sizeof ptr);
}

static const char *prof_dev(const msnap_allocator_t *a) {
  return a->profile == MSNAP_PROFILE_NPU ? "NPU" : "CUDA";
}

static int raw_insert(msnap_allocator_t *a, uint64_t ptr, uint64_t size,
                      int device) {
  if ((a->raw_count + 1) * 2 > a->raw_cap) {
    uint64_t nc = a->raw_cap ? a->raw_cap * 2 : 64;
    msnap_rawent_t *nv = calloc(nc, sizeof *nv);
    if (!nv)
      return MSNAP_ENOMEM;
    for (uint64_t i = 0; i < a->raw_cap; i++) {
      if (!a->raw[i].used)
        continue;
      uint64_t h = ptr_hash(a->raw[i].ptr) & (nc - 1);
      while (nv[h].used)
        h = (h + 1) & (nc - 1);
      nv[h] = a->raw[i];
    }
    free(a->raw);
    a->raw = nv;
    a->raw_cap = nc;
  }
  uint64_t h = ptr_hash(ptr) & (a->raw_cap - 1);
  while (a->raw[h].used)
    h = (h + 1) & (a->raw_cap - 1);
  a->raw[h] = (msnap_rawent_t){ptr, size, device, true};
  __atomic_store_n(&a->raw_count, a->raw_count + 1, __ATOMIC_RELAXED);
  return 0;
}

static msnap_rawent_t *raw_find(msnap_allocator_t *a, uint64_t ptr) {
  if (!a->raw_cap)
    return NULL;
  uint64_t h = ptr_hash(ptr) & (a->raw_cap - 1);
  while (a->raw[h].used) {
    if (a->raw[h].ptr == ptr)
      return &a->raw[h];
    h = (h + 1) & (a->raw_cap - 1);
  }
  return NULL;
}

/* Backward-shift deletion for linear probing. */
static void raw_erase(msnap_allocator_t *a, msnap_rawent_t *e) {
  uint64_t mask = a->raw_cap - 1;
  uint64_t i = (uint64_t)(e - a->raw);
  a->raw[i].used = false;
  uint64_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!a->raw[j].used)
      break;
    uint64_t k = ptr_hash(a->raw[j].ptr) & mask;
    if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
      a->raw[i] = a->raw[j];
      a->raw[j].used = false;
      i = j;
    }
  }
  __atomic_store_n(&a->raw_count, a->raw_count - 1, __ATOMIC_RELAXED);
}

int msnap__raw_malloc(msnap_allocator_t *a, int device, uint64_t size,
                      uint64_t *ptr) {
  if (a->profile == MSNAP_PROFILE_NPU)
    size += a->npu_pad;
  uint64_t p = 0;
  int rc = a->rt->malloc(a->rt_ctx, device, size, &p);
  if (rc != 0) {
    char s[32];
    msnap__format_size(size, s, sizeof s);
    if (rc == MSNAP_EOOM)
      return msnap__set_error(MSNAP_EOOM,
                              "%s out of memory. Tried to allocate %s on "
                              "device %d (caching allocator disabled).",
                              prof_dev(a), s, device);
    return msnap__set_error(rc,
                            "device runtime malloc of %" PRIu64
                            " bytes on device %d failed: %s",
                            size, device, msnap_strerror(rc));
  }
  msnap__mutex_lock(&a->raw_lock, MSNAP_RANK_RAW);
  rc = raw_insert(a, p, size, device);
  msnap__mutex_unlock(&a->raw_lock, MSNAP_RANK_RAW);
  if (rc != 0) {
    a->rt->free(a->rt_ctx, device, p);
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  }
  *ptr = p;
  return 0;
}

/* Free a raw allocation; 1 if ptr was not one. */
int msnap__raw_free(msnap_allocator_t *a, uint64_t ptr) {
  msnap__mutex_lock(&a->raw_lock, MSNAP_RANK_RAW);
  msnap_rawent_t *e = raw_find(a, ptr);
  if (!e) {
    msnap__mutex_unlock(&a->raw_lock, MSNAP_RANK_RAW);
    return 1;
  }
  int device = e->device;
  int rc = a->rt->free(a->rt_ctx, device, ptr);
  if (rc == 0)
    raw_erase(a, e);
  msnap__mutex_unlock(&a->raw_lock, MSNAP_RANK_RAW);
  if (rc != 0)
    return msnap__set_error(rc,
                            "device runtime free of 0x%" PRIx64
                            " on device %d failed: %s",
                            ptr, device, msnap_strerror(rc));
  return 0;
}


/* Size of the raw allocation at ptr; false if ptr is not one. */
bool msnap__raw_lookup(msnap_allocator_t *a, uint64_t ptr, uint64_t *size) {
  if (__atomic_load_n(&a->raw_count, __ATOMIC_RELAXED) == 0)
    return false;
  msnap__mutex_lock(&a->raw_lock, MSNAP_RANK_RAW);
  msnap_rawent_t *e = raw_find(a, ptr);
  if (e && size)
    *size = e->size;
  msnap__mutex_unlock(&a->raw_lock, MSNAP_RANK_RAW);
  return e != NULL;
}

/* Return every raw allocation to the runtime (destroy). */
void msnap__raw_release_all(msnap_allocator_t *a) {
  for (uint64_t i = 0; i < a->raw_cap; i++)
    if (a->raw[i].used &&
        a->rt->free(a->rt_ctx, a->raw[i].device, a->raw[i].ptr) != 0)
      a->rt->free(a->rt_ctx, a->raw[i].device, a->raw[i].ptr);
  free(a->raw);
  a->raw = NULL;
  a->raw_cap = a->raw_count = 0;
}
