/*
 * talloc.h -- shared helpers of the allocator tests (header-only; each
 * test executable includes it once).  Every helper that changes the
 * allocator runs msnap_check_invariants afterwards and fails the test with
 * the violation text.
 */
#ifndef TALLOC_H
#define TALLOC_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc/alloc_core.h"
#include "fake_rt.h"

#define MiB 1048576ull
#define NPU MSNAP_PROFILE_NPU
#define CUDA MSNAP_PROFILE_CUDA

#define INV(a)                                                                \
  do {                                                                        \
    char m_[512];                                                             \
    int r_ = msnap_check_invariants((a), m_, sizeof m_);                      \
    if (r_ != 0)                                                              \
      fail_msg("invariant violated (%s:%d): %s", __FILE__, __LINE__, m_);     \
  } while (0)

typedef void (*tweak_fn)(msnap_conf_t *c);

/* An allocator on the fake runtime; `tweak` edits the conf as a parsed
 * PYTORCH_*_ALLOC_CONF would have (before any device state depends on it:
 * the frozen max_split_size stat and the fraction are re-derived). */
static inline msnap_allocator_t *mk_cfg(msnap_profile_t prof, tweak_fn tweak,
                                        const fake_cfg_t *cfg) {
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = (int)prof;
  o.runtime = fake_rt(cfg);
  o.caching_disabled = 0;
  o.alloc_conf = "";
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0)
    fail_msg("msnap_allocator_create: %d %s", rc, msnap_last_error());
  if (tweak) {
    msnap_conf_t *c = msnap__allocator_conf_mut(a);
    tweak(c);
    for (int i = 0; i < a->ndevices; i++) {
      msnap_device_t *d = msnap__device(a, i);
      d->stats.max_split_size = (int64_t)c->max_split_size;
    }
  }
  INV(a);
  return a;
}

static inline msnap_allocator_t *mk(msnap_profile_t prof, tweak_fn tweak) {
  return mk_cfg(prof, tweak, NULL);
}

static inline void done(msnap_allocator_t *a) {
  INV(a);
  msnap_allocator_destroy(a);
  assert_int_equal(fake_live(), 0);
}

static inline uint64_t M2(msnap_allocator_t *a, uint64_t size,
                          uint64_t stream) {
  uint64_t p = 0;
  int rc = msnap_malloc(a, 0, size, stream, &p);
  if (rc != 0)
    fail_msg("msnap_malloc(%llu): %d %s", (unsigned long long)size, rc,
             msnap_last_error());
  INV(a);
  return p;
}
#define M(a, size) M2((a), (size), 0)

static inline void F(msnap_allocator_t *a, uint64_t p) {
  int rc = msnap_free(a, p);
  if (rc != 0)
    fail_msg("msnap_free(0x%llx): %d %s", (unsigned long long)p, rc,
             msnap_last_error());
  INV(a);
}

static inline void R(msnap_allocator_t *a, uint64_t p, uint64_t stream) {
  int rc = msnap_record_stream(a, p, stream);
  if (rc != 0)
    fail_msg("msnap_record_stream(0x%llx): %d %s", (unsigned long long)p, rc,
             msnap_last_error());
  INV(a);
}

static inline void EC(msnap_allocator_t *a) {
  int rc = msnap_empty_cache(a, -1);
  if (rc != 0)
    fail_msg("msnap_empty_cache: %d %s", rc, msnap_last_error());
  INV(a);
}

static inline msnap_stats_t S(msnap_allocator_t *a) {
  msnap_stats_t s;
  s.size = sizeof s;
  s.version = MSNAP_STATS_VERSION;
  assert_int_equal(msnap_stats_get(a, 0, &s), 0);
  return s;
}

/* The block starting at ptr on device 0 (NULL if none). */
static inline const msnap_block_t *blk(msnap_allocator_t *a, uint64_t ptr) {
  msnap_device_t *d = msnap__device(a, 0);
  for (const msnap_segment_t *s = d->segments; s; s = s->snext)
    for (const msnap_block_t *b = s->head; b; b = b->next)
      if (b->ptr == ptr)
        return b;
  return NULL;
}

enum { ST_FREE = 0, ST_ALLOC = 1, ST_PENDING = 2, ST_UNMAPPED = 3 };

/* Assert a block at ptr with this size and state. */
#define BLK(a, ptr, sz, state)                                                \
  do {                                                                        \
    const msnap_block_t *b_ = blk((a), (ptr));                                \
    if (!b_)                                                                  \
      fail_msg("%s:%d: no block at 0x%llx", __FILE__, __LINE__,               \
               (unsigned long long)(ptr));                                    \
    assert_int_equal(b_->size, (sz));                                         \
    int st_ = !b_->mapped      ? ST_UNMAPPED                                  \
              : b_->allocated  ? ST_ALLOC                                     \
              : (b_->event_count || b_->nuses || b_->deferred) ? ST_PENDING   \
                                                               : ST_FREE;     \
    assert_int_equal(st_, (state));                                           \
  } while (0)

static inline uint64_t nsegs(msnap_allocator_t *a) {
  return msnap__device(a, 0)->nsegments;
}

#define CUR(s, f, t) ((s).f[MSNAP_STAT_##t].current)

#endif
