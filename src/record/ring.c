/*
 * ring.c -- the trace ring: the newest `capacity` trace entries of one
 * device (or of the pinned host allocator), in chunks that never move,
 * with small interning tables for the entries' streams and pools.
 * Invariants and locking: history.h (msnap__ring_check verifies them);
 * every function here runs under the ring owner's lock.
 *
 * Cost under the owner's lock, per recorded event: one counter read (none
 * for an entry that follows one of the same call, e.g. free_completed
 * after free_requested: ~60 ns where the hypervisor traps rdtsc), the
 * entry context found (the last one used, else one hash probe) and a
 * 28-byte store.  No atomic operation: the ring holds references per
 * entry context (stack, metadata, stream, pool), not per entry; a new
 * context takes them, the last entry of a context leaving drops them.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "record/history.h"
#include "record/stack.h"

/* ---- key maps (streams, pools) ------------------------------------------ */

/* Index of key {k0,k1}, inserting it.  UINT32_MAX on ENOMEM.  Guarded by
 * the owner's lock.  The last key found is checked first (one call
 * records entries of the same stream and pool in a row). */
static uint32_t keymap_get(msnap_keymap_t *m, uint64_t k0, uint64_t k1) {
  if (m->n > 0 && m->keys[m->last][0] == k0 && m->keys[m->last][1] == k1)
    return m->last;
  if (MSNAP_GROW(m->keys, m->cap, m->n + 1) != 0) return UINT32_MAX;
  bool fresh;
  uint32_t *slot = msnap__map16_slot(&m->index, k0, k1, &fresh);
  if (slot == NULL) return UINT32_MAX;
  if (fresh) {
    *slot = m->n;
    m->keys[m->n][0] = k0;
    m->keys[m->n][1] = k1;
    m->n++;
  }
  return m->last = *slot;
}

static void keymap_free(msnap_keymap_t *m) {
  free(m->keys);
  msnap__map16_free(&m->index);
  memset(m, 0, sizeof *m);
}

/* ---- entry contexts ------------------------------------------------------ */

static bool hctx_equal(const msnap_hctx_t *x, const msnap_hctx_t *k) {
  return x->stack == k->stack && x->user_metadata == k->user_metadata &&
         x->compile_context == k->compile_context && x->stream == k->stream &&
         x->pool == k->pool && x->size_hi == k->size_hi;
}

static uint32_t hctx_hash(const msnap_hctx_t *k) {
  /* the six key words (refs excluded) */
  return (uint32_t)XXH3_64bits(k, offsetof(msnap_hctx_t, refs));
}

/* Rebuild the index with cap slots (a power of two).  Owner's lock. */
static int hctx_rehash(msnap_hctxtab_t *t, uint32_t cap) {
  uint32_t *ht = calloc(cap, sizeof *ht);
  if (ht == NULL) return MSNAP_ENOMEM;
  for (uint32_t i = 0; i < t->n; i++) {
    if (t->v[i].refs == 0) continue;
    uint32_t j = hctx_hash(&t->v[i]) & (cap - 1);
    while (ht[j] != 0) j = (j + 1) & (cap - 1);
    ht[j] = i + 1;
  }
  free(t->ht);
  t->ht = ht;
  t->ht_cap = cap;
  return 0;
}

/* The index of context *k with one more entry counted on it, creating it
 * (with references on its ids) when new.  UINT32_MAX on ENOMEM.  Owner's
 * lock. */
static uint32_t hctx_get(msnap_hctxtab_t *t, const msnap_hctx_t *k) {
  if (t->last[0] != 0 && hctx_equal(&t->v[t->last[0] - 1], k)) {
    t->v[t->last[0] - 1].refs++;
    return t->last[0] - 1;
  }
  if (t->last[1] != 0 && hctx_equal(&t->v[t->last[1] - 1], k)) {
    uint32_t i = t->last[1];
    t->last[1] = t->last[0];
    t->last[0] = i;
    t->v[i - 1].refs++;
    return i - 1;
  }
  if ((t->live + 1) * 2 > t->ht_cap) { /* load <= 1/2 */
    uint32_t cap = t->ht_cap ? t->ht_cap * 2 : 64;
    if (cap == 0 || hctx_rehash(t, cap) != 0) return UINT32_MAX;
  }
  uint32_t j = hctx_hash(k) & (t->ht_cap - 1);
  while (t->ht[j] != 0) {
    msnap_hctx_t *x = &t->v[t->ht[j] - 1];
    if (hctx_equal(x, k)) {
      x->refs++;
      t->last[1] = t->last[0];
      t->last[0] = t->ht[j];
      return t->ht[j] - 1;
    }
    j = (j + 1) & (t->ht_cap - 1);
  }
  uint32_t i;
  if (t->free_head != 0) {
    i = t->free_head - 1;
    t->free_head = t->v[i].stack;
  } else {
    if (t->n == UINT32_MAX - 1 || MSNAP_GROW(t->v, t->cap, t->n + 1) != 0)
      return UINT32_MAX;
    i = t->n++;
  }
  t->v[i] = *k;
  t->v[i].refs = 1;
  msnap__stack_ref(k->stack);
  msnap__stack_ref(k->user_metadata);
  msnap__stack_ref(k->compile_context);
  t->ht[j] = i + 1;
  t->live++;
  t->last[1] = t->last[0];
  t->last[0] = i + 1;
  return i;
}

/* One entry naming context i is gone; the last one frees the context
 * (its references dropped, its index slot removed by backward shift).
 * Owner's lock. */
static void hctx_put(msnap_hctxtab_t *t, uint32_t i) {
  msnap_hctx_t *x = &t->v[i];
  MSNAP_ASSERT(x->refs > 0);
  if (--x->refs != 0) return;
  uint32_t mask = t->ht_cap - 1;
  uint32_t j = hctx_hash(x) & mask;
  while (t->ht[j] != i + 1) j = (j + 1) & mask;
  /* backward-shift deletion: no tombstones */
  for (uint32_t k = (j + 1) & mask; t->ht[k] != 0; k = (k + 1) & mask) {
    uint32_t home = hctx_hash(&t->v[t->ht[k] - 1]) & mask;
    /* move ht[k] into the hole j when its home is not in (j, k] */
    if (((k - home) & mask) >= ((k - j) & mask)) {
      t->ht[j] = t->ht[k];
      j = k;
    }
  }
  t->ht[j] = 0;
  msnap__stack_unref(x->stack);
  msnap__stack_unref(x->user_metadata);
  msnap__stack_unref(x->compile_context);
  memset(x, 0, sizeof *x);
  x->stack = t->free_head;
  t->free_head = i + 1;
  t->live--;
  if (t->last[1] == i + 1) t->last[1] = 0;
  if (t->last[0] == i + 1) {
    t->last[0] = t->last[1];
    t->last[1] = 0;
  }
}

static void hctx_free_all(msnap_hctxtab_t *t) {
  for (uint32_t i = 0; i < t->n; i++) {
    if (t->v[i].refs == 0) continue;
    msnap__stack_unref(t->v[i].stack);
    msnap__stack_unref(t->v[i].user_metadata);
    msnap__stack_unref(t->v[i].compile_context);
  }
  free(t->v);
  free(t->ht);
  memset(t, 0, sizeof *t);
}

/* ---- the ring ------------------------------------------------------------ */

/* An entry leaves the ring (overwritten, dropped, cleared). */
static void slot_release(msnap_ring_t *ring, const msnap_hslot_t *e) {
  hctx_put(&ring->ctxs, e->ctx);
}

/* Slot s of the storage, and the i-th entry from the oldest. */
static inline msnap_hslot_t *ring_slot(const msnap_ring_t *ring,
                                        uint64_t s) {
  return &ring->chunks[s >> MSNAP_RING_CHUNK_BITS]
                      [s & (MSNAP_RING_CHUNK - 1)];
}
static inline msnap_hslot_t *ring_at(const msnap_ring_t *ring, uint64_t i) {
  uint64_t s = ring->head + i;
  if (s >= ring->vcap) s -= ring->vcap;
  return ring_slot(ring, s);
}

/* Chunks are mapped directly, each at full size (MSNAP_RING_CHUNK entries
 * = 112 KiB, a whole number of pages).  malloc would serve such a block by
 * mmap with one more page for its header: about 1 byte per entry.  The
 * slots in use are prefaulted in one call (MADV_POPULATE_WRITE, Linux
 * 5.14; ignored where unknown): taking one page fault per 85 entries on
 * the recording path cost ~90 ns per alloc+free pair on a VM.  Slots past
 * the capacity stay untouched, so a partly used chunk costs its entries.
 * A ring keeps up to MSNAP_RING_SPARE freed chunks (7 MiB) for reuse
 * until the ring is destroyed, so that turning history off and on
 * again does not fault fresh pages in (malloc's heap gave that reuse). */
#define RING_CHUNK_BYTES ((size_t)MSNAP_RING_CHUNK * sizeof(msnap_hslot_t))

#if defined(__SANITIZE_ADDRESS__)
#define RING_CHUNK_MALLOC 1 /* keep ASan's redzones around chunks */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RING_CHUNK_MALLOC 1
#endif
#endif

/* Prefault slots [from, to) of chunk c (best effort). */
static void chunk_populate(msnap_hslot_t *c, uint64_t from, uint64_t to) {
#if !defined(RING_CHUNK_MALLOC) && defined(MADV_POPULATE_WRITE)
  uintptr_t pg = 4096;
  uintptr_t a = (uintptr_t)(c + from) & ~(pg - 1);
  uintptr_t b = ((uintptr_t)(c + to) + pg - 1) & ~(pg - 1);
  if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
  (void)c;
  (void)from;
  (void)to;
#endif
}

/* A chunk with its first `slots` slots resident: a spare one of the ring,
 * else a fresh mapping.  NULL on ENOMEM.  Owner's lock held. */
static msnap_hslot_t *chunk_new(msnap_ring_t *ring, uint64_t slots) {
#ifdef RING_CHUNK_MALLOC
  (void)ring;
  (void)slots;
  return malloc(RING_CHUNK_BYTES);
#else
  if (ring->nspare > 0) return ring->spare[--ring->nspare];
  void *p = mmap(NULL, RING_CHUNK_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  chunk_populate(p, 0, slots);
  return p;
#endif
}

/* Give chunk c back: kept as a spare of the ring while there is room.
 * Owner's lock held. */
static void chunk_free(msnap_ring_t *ring, msnap_hslot_t *c) {
  if (c == NULL) return;
#ifdef RING_CHUNK_MALLOC
  (void)ring;
  free(c);
#else
  if (ring->nspare < MSNAP_RING_SPARE)
    ring->spare[ring->nspare++] = c;
  else
    munmap(c, RING_CHUNK_BYTES);
#endif
}

/* Unmap the spare chunks (msnap__ring_destroy). */
static void ring_drop_spare(msnap_ring_t *ring) {
#ifndef RING_CHUNK_MALLOC
  while (ring->nspare > 0)
    munmap(ring->spare[--ring->nspare], RING_CHUNK_BYTES);
#else
  (void)ring;
#endif
}

static void ring_free_chunks(msnap_ring_t *ring, msnap_hslot_t **chunks,
                             uint64_t n) {
  for (uint64_t k = 0; k < n; k++) chunk_free(ring, chunks[k]);
  free(chunks);
}

/* Allocate chunks for `slots` slots (all full-size but the last). */
static msnap_hslot_t **ring_alloc_chunks(msnap_ring_t *ring, uint64_t slots,
                                          uint64_t *nchunks) {
  uint64_t n = (slots + MSNAP_RING_CHUNK - 1) >> MSNAP_RING_CHUNK_BITS;
  msnap_hslot_t **c = calloc(n ? n : 1, sizeof *c);
  if (c == NULL) return NULL;
  for (uint64_t k = 0; k < n; k++) {
    uint64_t sz = slots - k * MSNAP_RING_CHUNK;
    if (sz > MSNAP_RING_CHUNK) sz = MSNAP_RING_CHUNK;
    c[k] = chunk_new(ring, sz);
    if (c[k] == NULL) {
      ring_free_chunks(ring, c, k);
      return NULL;
    }
  }
  *nchunks = n;
  return c;
}

/* Re-lay the ring into fresh storage holding its newest `keep` entries at
 * slots 0..keep-1 (older ones are released and counted as dropped), with
 * min(capacity, keep rounded up to a chunk) slots.  Owner's lock held.
 * MSNAP_ENOMEM leaves the ring unchanged.  Used only when the capacity
 * drops, or to straighten a wrapped ring before it grows. */
static int ring_relayout(msnap_ring_t *ring, uint64_t keep) {
  if (keep > ring->n) keep = ring->n;
  uint64_t slots = (keep + MSNAP_RING_CHUNK - 1) & ~(uint64_t)(MSNAP_RING_CHUNK - 1);
  if (slots > ring->capacity) slots = ring->capacity;
  uint64_t nchunks = 0;
  msnap_hslot_t **nc = NULL;
  if (slots > 0) {
    nc = ring_alloc_chunks(ring, slots, &nchunks);
    if (nc == NULL) return MSNAP_ENOMEM;
  }
  uint64_t drop = ring->n - keep;
  for (uint64_t i = 0; i < ring->n; i++) {
    const msnap_hslot_t *e = ring_at(ring, i);
    if (i < drop)
      slot_release(ring, e);
    else
      nc[(i - drop) >> MSNAP_RING_CHUNK_BITS]
        [(i - drop) & (MSNAP_RING_CHUNK - 1)] = *e;
  }
  ring_free_chunks(ring, ring->chunks, ring->nchunks);
  ring->chunks = nc;
  ring->nchunks = ring->chunks_cap = nchunks;
  ring->vcap = slots;
  ring->head = 0;
  ring->n = keep;
  ring->dropped += drop;
  return 0;
}

/* Add slots (head == 0, n == vcap < capacity): no entry moves.  Indexing
 * (ring_at) assumes every chunk but the last holds MSNAP_RING_CHUNK slots,
 * so a partial last chunk -- made while the capacity was smaller -- is
 * widened before any new chunk is added (in place: every chunk is mapped
 * at full size). */
static int ring_grow(msnap_ring_t *ring) {
  uint64_t tail = ring->vcap & (MSNAP_RING_CHUNK - 1);
  if (tail != 0) {
    uint64_t sz = tail + (ring->capacity - ring->vcap);
    if (sz > MSNAP_RING_CHUNK) sz = MSNAP_RING_CHUNK;
    chunk_populate(ring->chunks[ring->nchunks - 1], tail, sz);
    ring->vcap += sz - tail;
    return 0;
  }
  if (MSNAP_GROW(ring->chunks, ring->chunks_cap, ring->nchunks + 1) != 0)
    return MSNAP_ENOMEM;
  uint64_t sz = ring->capacity - ring->vcap;
  if (sz > MSNAP_RING_CHUNK) sz = MSNAP_RING_CHUNK;
  msnap_hslot_t *c = chunk_new(ring, sz);
  if (c == NULL) return MSNAP_ENOMEM;
  ring->chunks[ring->nchunks++] = c;
  ring->vcap += sz;
  return 0;
}

void msnap__ring_clear(msnap_ring_t *ring) {
  for (uint64_t i = 0; i < ring->n; i++) slot_release(ring, ring_at(ring, i));
  hctx_free_all(&ring->ctxs); /* every context is free now */
  ring_free_chunks(ring, ring->chunks, ring->nchunks);
  ring->chunks = NULL;
  ring->nchunks = ring->chunks_cap = 0;
  ring->vcap = ring->head = ring->n = 0;
  ring->dropped = 0;
  ring->last_rctx = NULL;
  ring->last_call = ring->last_time = 0;
}

void msnap__ring_set_capacity(msnap_ring_t *ring, uint64_t capacity) {
  ring->capacity = capacity;
  if (ring->n > capacity || ring->vcap > capacity) {
    if (ring_relayout(ring, capacity) != 0) {
      /* No memory for a smaller copy: release the oldest in place and
       * keep the slots (vcap > capacity until the next relayout). */
      while (ring->n > capacity) {
        slot_release(ring, ring_at(ring, 0));
        ring->head = ring->head + 1 == ring->vcap ? 0 : ring->head + 1;
        ring->n--;
        ring->dropped++;
      }
    }
  }
}

/* Append e (whose context count the ring takes over).  Owner's lock held.
 * Growth adds a chunk (nothing is copied); a full ring overwrites its
 * oldest entry. */
static void ring_push(msnap_ring_t *ring, const msnap_hslot_t *e) {
  MSNAP_ASSERT(ring->n <= ring->vcap && ring->n <= ring->capacity);
  if (ring->n == ring->vcap && ring->vcap < ring->capacity) {
    if (ring->head != 0) (void)ring_relayout(ring, ring->n); /* rare */
    if (ring->n == ring->vcap && ring->head == 0)
      (void)ring_grow(ring); /* on ENOMEM: overwrite the oldest */
  }
  if (ring->vcap == 0) { /* not even one slot: the entry is dropped */
    slot_release(ring, e);
    ring->dropped++;
    return;
  }
  if (ring->n < ring->vcap) {
    *ring_at(ring, ring->n) = *e;
    ring->n++;
    return;
  }
  msnap_hslot_t *old = ring_slot(ring, ring->head);
  slot_release(ring, old);
  *old = *e;
  ring->head = ring->head + 1 == ring->vcap ? 0 : ring->head + 1;
  ring->dropped++;
}

/* Context table check: counts, index, free list.  NULL or what is wrong. */
static const char *hctx_check(const msnap_ring_t *ring, uint64_t *sum) {
  const msnap_hctxtab_t *t = &ring->ctxs;
  uint32_t live = 0, nfree = 0, indexed = 0;
  *sum = 0;
  if (t->n > t->cap) return "context count above capacity";
  for (int m = 0; m < 2; m++)
    if (t->last[m] > t->n || (t->last[m] && t->v[t->last[m] - 1].refs == 0))
      return "a recently used context is not live";
  if (t->last[0] == 0 && t->last[1] != 0) return "recent contexts out of order";
  for (uint32_t i = 0; i < t->n; i++) {
    const msnap_hctx_t *x = &t->v[i];
    if (x->refs == 0) continue;
    live++;
    *sum += x->refs;
    if (x->stream >= ring->streams.n) return "context with a bad stream";
    if (x->pool >= ring->pools.n) return "context with a bad pool";
    if (x->size_hi > 0xff) return "context with a bad size_hi";
    if ((x->stack && msnap__stack_refcount(x->stack) == 0) ||
        (x->user_metadata && msnap__stack_refcount(x->user_metadata) == 0) ||
        (x->compile_context && msnap__stack_refcount(x->compile_context) == 0))
      return "context naming a dead id";
    /* in the index exactly once, reachable from its home slot */
    if (t->ht_cap == 0) return "live context without an index";
    uint32_t mask = t->ht_cap - 1, found = 0;
    for (uint32_t j = hctx_hash(x) & mask; t->ht[j] != 0; j = (j + 1) & mask) {
      if (t->ht[j] == i + 1) found++;
      else if (t->v[t->ht[j] - 1].refs && hctx_equal(&t->v[t->ht[j] - 1], x))
        return "two live contexts are equal";
      if (found > 1) break;
    }
    if (found != 1) return "live context not indexed once";
  }
  for (uint32_t j = 0; j < t->ht_cap; j++) {
    if (t->ht[j] == 0) continue;
    indexed++;
    if (t->ht[j] > t->n || t->v[t->ht[j] - 1].refs == 0)
      return "index names a free context";
  }
  for (uint32_t f = t->free_head; f != 0; f = t->v[f - 1].stack) {
    if (f > t->n || t->v[f - 1].refs != 0) return "bad free list";
    if (++nfree > t->n) return "free list loops";
  }
  if (live != t->live) return "live context count is wrong";
  if (indexed != live) return "index size differs from the live contexts";
  if (live + nfree != t->n) return "contexts neither live nor free";
  return NULL;
}

int msnap__ring_check(const msnap_ring_t *ring, char *msg, size_t len) {
  const char *bad = NULL;
  uint64_t sum = 0;
  if (ring->n > ring->capacity) bad = "more entries than capacity";
  else if (ring->n > ring->vcap) bad = "more entries than slots";
  else if (ring->vcap && ring->head >= ring->vcap) bad = "head out of range";
  else if (ring->nspare > MSNAP_RING_SPARE) bad = "too many spare chunks";
  else if (ring->nchunks !=
           (ring->vcap + MSNAP_RING_CHUNK - 1) >> MSNAP_RING_CHUNK_BITS)
    bad = "chunk count does not match the slots";
  else
    bad = hctx_check(ring, &sum);
  if (bad == NULL && sum != ring->n)
    bad = "context counts differ from the entries";
  for (uint64_t i = 0; bad == NULL && i < ring->n; i++) {
    const msnap_hslot_t *e = ring_at(ring, i);
    unsigned action = (unsigned)(e->sizeact >> MSNAP_HSLOT_SIZE_BITS) & 0x3f;
    if (action >= MSNAP_ACTION_COUNT) bad = "entry with a bad action";
    else if (e->sizeact >> 63) bad = "entry with a reserved bit set";
    else if (e->ctx >= ring->ctxs.n || ring->ctxs.v[e->ctx].refs == 0)
      bad = "entry naming a free context";
  }
  if (bad) {
    if (msg && len) snprintf(msg, len, "trace ring: %s", bad);
    return MSNAP_ESTATE;
  }
  return 0;
}

/* ---- life cycle ------------------------------------------------------------ */

void msnap__ring_init(msnap_ring_t *ring) {
  memset(ring, 0, sizeof *ring);
  ring->capacity = 1;
}

void msnap__ring_destroy(msnap_ring_t *ring) {
  msnap__ring_clear(ring);
  hctx_free_all(&ring->ctxs);
  ring_drop_spare(ring);
  keymap_free(&ring->streams);
  keymap_free(&ring->pools);
}

/* ---- recording and copying ------------------------------------------------ */

/* Append one entry (history.h): skipped actions and disabled settings
 * record nothing; the entry counts on its context, ctx keeps its own
 * references.  True when the entry was appended (its raw time is then
 * ring->last_time). */
bool msnap__ring_record(msnap_ring_t *ring, const msnap_hsettings_t *s,
                        msnap_action_t action, uint64_t addr, uint64_t size,
                        uint64_t stream, msnap_mempool_id_t pool,
                        const msnap_rctx_t *ctx, uint32_t stack_override) {
  if (!msnap__hsettings_on(s) || (unsigned)action >= MSNAP_ACTION_COUNT)
    return false;
  if (atomic_load_explicit(&s->skip, memory_order_relaxed) & (1u << action))
    return false;
  int level = atomic_load_explicit(&s->level, memory_order_relaxed);
  msnap_hslot_t e;
  /* One clock read per call and ring: an entry right after one of the
   * same call (no other entry in between, so time never decreases) takes
   * its time. */
  if (ctx != NULL && ctx->call != 0 && ring->last_rctx == (const void *)ctx &&
      ring->last_call == ctx->call)
    e.raw_time = ring->last_time;
  else
    e.raw_time = msnap__clock_raw();
  e.addr = addr;
  e.sizeact = (size & MSNAP_HSLOT_SIZE_MASK) |
              (uint64_t)action << MSNAP_HSLOT_SIZE_BITS;
  msnap_hctx_t k;
  k.stack = 0;
  if (level >= MSNAP_CONTEXT_ALLOC)
    k.stack = stack_override ? stack_override : (ctx ? ctx->stack : 0);
  k.user_metadata = ctx ? ctx->user_metadata : 0;
  k.compile_context = ctx ? ctx->compile_context : 0;
  k.size_hi = (uint32_t)(size >> MSNAP_HSLOT_SIZE_BITS);
  k.stream = keymap_get(&ring->streams, stream, 0);
  k.pool = keymap_get(&ring->pools, pool.first, pool.second);
  k.refs = 0;
  if (k.stream == UINT32_MAX || k.pool == UINT32_MAX ||
      (e.ctx = hctx_get(&ring->ctxs, &k)) == UINT32_MAX) {
    ring->dropped++; /* host ENOMEM: lose the entry, say so */
    return false;
  }
  ring_push(ring, &e);
  ring->last_rctx = ctx;
  ring->last_call = ctx != NULL ? ctx->call : 0;
  ring->last_time = e.raw_time;
  return true;
}

/* Copy `ring` oldest first (owner lock held): the slots chunk by chunk,
 * the contexts with one reference per id. */
int msnap__ring_copy(const msnap_ring_t *ring, msnap_hcopy_t *out) {
  memset(out, 0, sizeof *out);
  const msnap_hctxtab_t *t = &ring->ctxs;
  if (ring->n > 0) {
    if (ring->n > SIZE_MAX / sizeof(msnap_hslot_t)) return MSNAP_ENOMEM;
    out->slots_bytes = (size_t)ring->n * sizeof(msnap_hslot_t);
    out->slots = msnap__prefaulted_alloc(out->slots_bytes);
    out->ctx = calloc(t->n ? t->n : 1, sizeof *out->ctx);
    if (out->slots == NULL || out->ctx == NULL) {
      msnap__prefaulted_free(out->slots, out->slots_bytes);
      free(out->ctx);
      memset(out, 0, sizeof *out);
      return MSNAP_ENOMEM;
    }
    out->n = ring->n;
    out->nctx = t->n;
  }
  /* oldest first: from head to the end of the storage, then from 0 */
  uint64_t done = 0, s = ring->head;
  while (done < ring->n) {
    uint64_t run = ring->n - done;
    uint64_t in_chunk = MSNAP_RING_CHUNK - (s & (MSNAP_RING_CHUNK - 1));
    if (run > in_chunk) run = in_chunk;
    if (run > ring->vcap - s) run = ring->vcap - s;
    memcpy(out->slots + done, ring_slot(ring, s), run * sizeof(msnap_hslot_t));
    done += run;
    s += run;
    if (s == ring->vcap) s = 0;
  }
  for (uint32_t i = 0; i < out->nctx; i++) {
    const msnap_hctx_t *x = &t->v[i];
    if (x->refs == 0) continue;
    msnap_hcopy_ctx_t *c = &out->ctx[i];
    c->stack = x->stack;
    c->user_metadata = x->user_metadata;
    c->compile_context = x->compile_context;
    c->size_hi = x->size_hi;
    c->stream = ring->streams.keys[x->stream][0];
    c->pool.first = ring->pools.keys[x->pool][0];
    c->pool.second = ring->pools.keys[x->pool][1];
    msnap__stack_ref(c->stack);
    msnap__stack_ref(c->user_metadata);
    msnap__stack_ref(c->compile_context);
  }
  return 0;
}

void msnap__hcopy_release(msnap_hcopy_t *c) {
  if (c == NULL) return;
  for (uint32_t i = 0; i < c->nctx; i++) {
    msnap__stack_unref(c->ctx[i].stack);
    msnap__stack_unref(c->ctx[i].user_metadata);
    msnap__stack_unref(c->ctx[i].compile_context);
  }
  free(c->ctx);
  msnap__prefaulted_free(c->slots, c->slots_bytes);
  memset(c, 0, sizeof *c);
}
