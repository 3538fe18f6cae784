/*
 * ring.c -- the trace ring: the newest `capacity` trace entries of one
 * device (or of the pinned host allocator), in chunks that never move,
 * with small interning tables for the entries' streams and pools.
 * Invariants and locking: history.h (msnap__ring_check verifies them);
 * every function here runs under the ring owner's lock.
 *
 * Cost under the owner's lock, per recorded event: one counter read (none
 * for an entry that follows one of the same call, e.g. free_completed
 * after free_requested: ~60 ns where the hypervisor traps rdtsc), a
 * 48-byte store into the ring and up to three atomic increments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* ---- the ring ------------------------------------------------------------ */

static void hentry_release(const msnap_hentry_t *e) {
  msnap__stack_unref(e->stack);
  msnap__stack_unref(e->user_metadata);
  msnap__stack_unref(e->compile_context);
}

/* Slot s of the storage, and the i-th entry from the oldest. */
static inline msnap_hentry_t *ring_slot(const msnap_ring_t *ring,
                                        uint64_t s) {
  return &ring->chunks[s >> MSNAP_RING_CHUNK_BITS]
                      [s & (MSNAP_RING_CHUNK - 1)];
}
static inline msnap_hentry_t *ring_at(const msnap_ring_t *ring, uint64_t i) {
  uint64_t s = ring->head + i;
  if (s >= ring->vcap) s -= ring->vcap;
  return ring_slot(ring, s);
}

/* Chunks are mapped directly, each at full size (MSNAP_RING_CHUNK entries
 * = 192 KiB, a whole number of pages).  malloc would serve such a block by
 * mmap with one more page for its header: about 1 byte per entry.  The
 * slots in use are prefaulted in one call (MADV_POPULATE_WRITE, Linux
 * 5.14; ignored where unknown): taking one page fault per 85 entries on
 * the recording path cost ~90 ns per alloc+free pair on a VM.  Slots past
 * the capacity stay untouched, so a partly used chunk costs its entries.
 * A ring keeps up to MSNAP_RING_SPARE freed chunks (12 MiB) for reuse
 * until the ring is destroyed, so that turning history off and on
 * again does not fault fresh pages in (malloc's heap gave that reuse). */
#define RING_CHUNK_BYTES ((size_t)MSNAP_RING_CHUNK * sizeof(msnap_hentry_t))

#if defined(__SANITIZE_ADDRESS__)
#define RING_CHUNK_MALLOC 1 /* keep ASan's redzones around chunks */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RING_CHUNK_MALLOC 1
#endif
#endif

/* Prefault slots [from, to) of chunk c (best effort). */
static void chunk_populate(msnap_hentry_t *c, uint64_t from, uint64_t to) {
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
static msnap_hentry_t *chunk_new(msnap_ring_t *ring, uint64_t slots) {
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
static void chunk_free(msnap_ring_t *ring, msnap_hentry_t *c) {
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

static void ring_free_chunks(msnap_ring_t *ring, msnap_hentry_t **chunks,
                             uint64_t n) {
  for (uint64_t k = 0; k < n; k++) chunk_free(ring, chunks[k]);
  free(chunks);
}

/* Allocate chunks for `slots` slots (all full-size but the last). */
static msnap_hentry_t **ring_alloc_chunks(msnap_ring_t *ring, uint64_t slots,
                                          uint64_t *nchunks) {
  uint64_t n = (slots + MSNAP_RING_CHUNK - 1) >> MSNAP_RING_CHUNK_BITS;
  msnap_hentry_t **c = calloc(n ? n : 1, sizeof *c);
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
  msnap_hentry_t **nc = NULL;
  if (slots > 0) {
    nc = ring_alloc_chunks(ring, slots, &nchunks);
    if (nc == NULL) return MSNAP_ENOMEM;
  }
  uint64_t drop = ring->n - keep;
  for (uint64_t i = 0; i < ring->n; i++) {
    const msnap_hentry_t *e = ring_at(ring, i);
    if (i < drop)
      hentry_release(e);
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
  msnap_hentry_t *c = chunk_new(ring, sz);
  if (c == NULL) return MSNAP_ENOMEM;
  ring->chunks[ring->nchunks++] = c;
  ring->vcap += sz;
  return 0;
}

void msnap__ring_clear(msnap_ring_t *ring) {
  for (uint64_t i = 0; i < ring->n; i++) hentry_release(ring_at(ring, i));
  ring_free_chunks(ring, ring->chunks, ring->nchunks);
  ring->chunks = NULL;
  ring->nchunks = ring->chunks_cap = 0;
  ring->vcap = ring->head = ring->n = 0;
  ring->dropped = 0;
  ring->last_ctx = NULL;
  ring->last_call = ring->last_time = 0;
}

void msnap__ring_set_capacity(msnap_ring_t *ring, uint64_t capacity) {
  ring->capacity = capacity;
  if (ring->n > capacity || ring->vcap > capacity) {
    if (ring_relayout(ring, capacity) != 0) {
      /* No memory for a smaller copy: release the oldest in place and
       * keep the slots (vcap > capacity until the next relayout). */
      while (ring->n > capacity) {
        hentry_release(ring_at(ring, 0));
        ring->head = ring->head + 1 == ring->vcap ? 0 : ring->head + 1;
        ring->n--;
        ring->dropped++;
      }
    }
  }
}

/* Append e (whose references the ring takes over).  Owner's lock held.
 * Growth adds a chunk (nothing is copied); a full ring overwrites its
 * oldest entry. */
static void ring_push(msnap_ring_t *ring, const msnap_hentry_t *e) {
  MSNAP_ASSERT(ring->n <= ring->vcap && ring->n <= ring->capacity);
  if (ring->n == ring->vcap && ring->vcap < ring->capacity) {
    if (ring->head != 0) (void)ring_relayout(ring, ring->n); /* rare */
    if (ring->n == ring->vcap && ring->head == 0)
      (void)ring_grow(ring); /* on ENOMEM: overwrite the oldest */
  }
  if (ring->vcap == 0) { /* not even one slot: the entry is dropped */
    hentry_release(e);
    ring->dropped++;
    return;
  }
  if (ring->n < ring->vcap) {
    *ring_at(ring, ring->n) = *e;
    ring->n++;
    return;
  }
  msnap_hentry_t *old = ring_slot(ring, ring->head);
  hentry_release(old);
  *old = *e;
  ring->head = ring->head + 1 == ring->vcap ? 0 : ring->head + 1;
  ring->dropped++;
}

int msnap__ring_check(const msnap_ring_t *ring, char *msg, size_t len) {
  const char *bad = NULL;
  if (ring->n > ring->capacity) bad = "more entries than capacity";
  else if (ring->n > ring->vcap) bad = "more entries than slots";
  else if (ring->vcap && ring->head >= ring->vcap) bad = "head out of range";
  else if (ring->nspare > MSNAP_RING_SPARE) bad = "too many spare chunks";
  else if (ring->nchunks !=
           (ring->vcap + MSNAP_RING_CHUNK - 1) >> MSNAP_RING_CHUNK_BITS)
    bad = "chunk count does not match the slots";
  for (uint64_t i = 0; bad == NULL && i < ring->n; i++) {
    const msnap_hentry_t *e = ring_at(ring, i);
    if (e->action >= MSNAP_ACTION_COUNT) bad = "entry with a bad action";
    else if (e->stream >= ring->streams.n) bad = "entry with a bad stream";
    else if (e->pool >= ring->pools.n) bad = "entry with a bad pool";
    else if (e->stack && msnap__stack_refcount(e->stack) == 0)
      bad = "entry with a dead stack";
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
  ring_drop_spare(ring);
  keymap_free(&ring->streams);
  keymap_free(&ring->pools);
}

/* ---- recording and copying ------------------------------------------------ */

/* Append one entry (history.h): skipped actions and disabled settings
 * record nothing; the entry takes its own references, ctx keeps its own. */
void msnap__ring_record(msnap_ring_t *ring, const msnap_hsettings_t *s,
                        msnap_action_t action, uint64_t addr, uint64_t size,
                        uint64_t stream, msnap_mempool_id_t pool,
                        const msnap_rctx_t *ctx, uint32_t stack_override) {
  if (!msnap__hsettings_on(s) || (unsigned)action >= MSNAP_ACTION_COUNT)
    return;
  if (atomic_load_explicit(&s->skip, memory_order_relaxed) & (1u << action))
    return;
  int level = atomic_load_explicit(&s->level, memory_order_relaxed);
  msnap_hentry_t e;
  /* One clock read per call and ring: an entry right after one of the
   * same call (no other entry in between, so time never decreases) takes
   * its time. */
  if (ctx != NULL && ctx->call != 0 && ring->last_ctx == (const void *)ctx &&
      ring->last_call == ctx->call)
    e.raw_time = ring->last_time;
  else
    e.raw_time = msnap__clock_raw();
  e.addr = addr;
  e.size = size;
  e.action = (uint8_t)action;
  e.internal_meta = 0;
  e.reserved = 0;
  e.stack = 0;
  if (level >= MSNAP_CONTEXT_ALLOC)
    e.stack = stack_override ? stack_override : (ctx ? ctx->stack : 0);
  e.user_metadata = ctx ? ctx->user_metadata : 0;
  e.compile_context = ctx ? ctx->compile_context : 0;
  uint32_t si = keymap_get(&ring->streams, stream, 0);
  uint32_t pi = keymap_get(&ring->pools, pool.first, pool.second);
  if (si == UINT32_MAX || pi == UINT32_MAX) {
    ring->dropped++; /* host ENOMEM: lose the entry, say so */
    return;
  }
  e.stream = si;
  e.pool = pi;
  msnap__stack_ref(e.stack);
  msnap__stack_ref(e.user_metadata);
  msnap__stack_ref(e.compile_context);
  ring_push(ring, &e);
  ring->last_ctx = ctx;
  ring->last_call = ctx != NULL ? ctx->call : 0;
  ring->last_time = e.raw_time;
}

/* Copy `ring` oldest first with one reference per id (owner lock held). */
int msnap__ring_copy(const msnap_ring_t *ring, msnap_hcopy_t **out,
                     size_t *n) {
  msnap_hcopy_t *v = NULL;
  if (ring->n > 0) {
    if (ring->n > SIZE_MAX / sizeof *v) return MSNAP_ENOMEM;
    v = malloc((size_t)ring->n * sizeof *v);
    if (v == NULL) return MSNAP_ENOMEM;
  }
  for (uint64_t i = 0; i < ring->n; i++) {
    const msnap_hentry_t *e = ring_at(ring, i);
    v[i].e = *e;
    v[i].stream = ring->streams.keys[e->stream][0];
    v[i].pool.first = ring->pools.keys[e->pool][0];
    v[i].pool.second = ring->pools.keys[e->pool][1];
    msnap__stack_ref(e->stack);
    msnap__stack_ref(e->user_metadata);
    msnap__stack_ref(e->compile_context);
  }
  *out = v;
  *n = (size_t)ring->n;
  return 0;
}

void msnap__hcopy_release(msnap_hcopy_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) hentry_release(&v[i].e);
  free(v);
}

