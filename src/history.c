/*
 * history.c -- memory history (torch.cuda.memory._record_memory_history):
 * the recorder object, the per-device trace rings, the annotation ring,
 * thread-local metadata and compile context, and the recording entry
 * points the allocator calls.  Data structures and invariants: history.h.
 *
 * Hot path with history off: alloc.c calls msnap__history_active(), one
 * atomic load and a branch.  With history on, per event:
 *   - msnap__rctx_capture (outside the allocator lock): the stack capture
 *     and reference increments on the thread's metadata ids;
 *   - msnap__history_record_locked (under the device lock): one counter
 *     read (none for an entry that follows one of the same call, e.g.
 *     free_completed after free_requested: ~60 ns where the hypervisor
 *     traps rdtsc), a 48-byte store into the ring and up to three atomic
 *     increments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "history.h"
#include "host_alloc.h"
#include "stack.h"

/* ---- actions ------------------------------------------------------------ */

static const char *const action_names[MSNAP_ACTION_COUNT] = {
#define ACTION_NAME_(name, str) str,
    MSNAP_ACTION_MAP(ACTION_NAME_)
#undef ACTION_NAME_
};

const char *msnap_action_name(int action) {
  if (action < 0 || action >= MSNAP_ACTION_COUNT) return NULL;
  return action_names[action];
}

int msnap_action_parse(const char *name, msnap_action_t *out) {
  if (name != NULL) {
    for (int i = 0; i < MSNAP_ACTION_COUNT; i++) {
      if (strcmp(name, action_names[i]) == 0) {
        *out = (msnap_action_t)i;
        return 0;
      }
    }
  }
  return msnap__set_error(MSNAP_EINVAL, "Unknown TraceEntry action: %s",
                          name ? name : "(null)");
}

/* ---- key maps (streams, pools) ------------------------------------------ */

static uint32_t keymap_slot(const uint64_t k[2], uint32_t cap) {
  return (uint32_t)XXH3_64bits(k, 16) & (cap - 1);
}

/* Index of key {k0,k1}, inserting it.  UINT32_MAX on ENOMEM.  Guarded by
 * the owner's lock. */
static uint32_t keymap_get(msnap_keymap_t *m, uint64_t k0, uint64_t k1) {
  if (m->n > 0 && m->keys[m->last][0] == k0 && m->keys[m->last][1] == k1)
    return m->last;
  uint64_t k[2] = {k0, k1};
  if (m->ht_cap) {
    uint32_t j = keymap_slot(k, m->ht_cap);
    while (m->ht[j] != 0) {
      uint32_t i = m->ht[j] - 1;
      if (m->keys[i][0] == k0 && m->keys[i][1] == k1) return m->last = i;
      j = (j + 1) & (m->ht_cap - 1);
    }
  }
  if (m->n == m->cap) {
    uint32_t cap = m->cap ? m->cap * 2 : 8;
    void *nk = realloc(m->keys, cap * sizeof m->keys[0]);
    if (nk == NULL) return UINT32_MAX;
    m->keys = nk;
    m->cap = cap;
  }
  if ((m->n + 1) * 2 > m->ht_cap) {
    uint32_t hc = m->ht_cap ? m->ht_cap * 2 : 16;
    uint32_t *h = calloc(hc, sizeof *h);
    if (h == NULL) return UINT32_MAX;
    for (uint32_t i = 0; i < m->n; i++) {
      uint32_t j = keymap_slot(m->keys[i], hc);
      while (h[j] != 0) j = (j + 1) & (hc - 1);
      h[j] = i + 1;
    }
    free(m->ht);
    m->ht = h;
    m->ht_cap = hc;
  }
  uint32_t i = m->n++;
  m->keys[i][0] = k0;
  m->keys[i][1] = k1;
  uint32_t j = keymap_slot(k, m->ht_cap);
  while (m->ht[j] != 0) j = (j + 1) & (m->ht_cap - 1);
  m->ht[j] = i + 1;
  return m->last = i;
}

static void keymap_free(msnap_keymap_t *m) {
  free(m->keys);
  free(m->ht);
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
 * until the recorder is destroyed, so that turning history off and on
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
 * else a fresh mapping.  NULL on ENOMEM.  Device lock held. */
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
 * Device lock held. */
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

/* Unmap the spare chunks (recorder destruction). */
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
 * min(capacity, keep rounded up to a chunk) slots.  Device lock held.
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
  if (ring->nchunks == ring->chunks_cap) {
    uint64_t cap = ring->chunks_cap ? ring->chunks_cap * 2 : 4;
    msnap_hentry_t **nc = realloc(ring->chunks, (size_t)cap * sizeof *nc);
    if (nc == NULL) return MSNAP_ENOMEM;
    ring->chunks = nc;
    ring->chunks_cap = cap;
  }
  uint64_t sz = ring->capacity - ring->vcap;
  if (sz > MSNAP_RING_CHUNK) sz = MSNAP_RING_CHUNK;
  msnap_hentry_t *c = chunk_new(ring, sz);
  if (c == NULL) return MSNAP_ENOMEM;
  ring->chunks[ring->nchunks++] = c;
  ring->vcap += sz;
  return 0;
}

static void ring_clear(msnap_ring_t *ring) {
  for (uint64_t i = 0; i < ring->n; i++) hentry_release(ring_at(ring, i));
  ring_free_chunks(ring, ring->chunks, ring->nchunks);
  ring->chunks = NULL;
  ring->nchunks = ring->chunks_cap = 0;
  ring->vcap = ring->head = ring->n = 0;
  ring->dropped = 0;
  ring->last_ctx = NULL;
  ring->last_call = ring->last_time = 0;
}

/* Set the capacity (>= 1) keeping the newest entries. */
static void ring_set_capacity(msnap_ring_t *ring, uint64_t capacity) {
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

/* Append e (whose references the ring takes over).  Device lock held.
 * Growth adds a chunk (nothing is copied); a full ring overwrites its
 * oldest entry. */
static void ring_push(msnap_ring_t *ring, const msnap_hentry_t *e) {
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

/* ---- the recorder object ------------------------------------------------- */

static pthread_mutex_t rec_create_lock = PTHREAD_MUTEX_INITIALIZER;

void msnap__history_atfork(msnap_allocator_t *a, int phase) {
  if (a == NULL) {
    msnap__fork_mutex(&rec_create_lock, phase);
    return;
  }
  msnap_recorder_t *r = *msnap__allocator_recorder(a);
  if (r != NULL) msnap__fork_mutex(&r->lock, phase);
}

static msnap_recorder_t *rec_load(const msnap_allocator_t *a) {
  struct msnap_recorder_s **slot =
      msnap__allocator_recorder((msnap_allocator_t *)a);
  return slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : NULL;
}

/*
 * The allocator's recorder, created on first use (create) under
 * rec_create_lock.  A new recorder reads OOM_SNAPSHOT_ENABLE at once
 * (msnap__oom_env_init, idempotent), so that whatever creates it first --
 * an observer, the workspace, record_history -- the environment applies
 * before the caller's own settings.  Never called with a device lock held
 * when create is true.
 */
msnap_recorder_t *msnap__recorder_get(msnap_allocator_t *a, bool create) {
  msnap_recorder_t *r = rec_load(a);
  if (r != NULL || !create) return r;
  struct msnap_recorder_s **slot = msnap__allocator_recorder(a);
  if (slot == NULL) return NULL;
  bool created = false;
  pthread_mutex_lock(&rec_create_lock);
  r = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (r == NULL) {
    created = true;
    int nd = msnap_device_count(a);
    if (nd < 0) nd = 0;
    r = calloc(1, sizeof *r);
    if (r != NULL && nd > 0) {
      r->rings = calloc((size_t)nd, sizeof *r->rings);
      if (r->rings == NULL) {
        free(r);
        r = NULL;
      }
    }
    if (r != NULL) {
      r->a = a;
      r->ndevices = nd;
      pthread_mutex_init(&r->lock, NULL);
      r->max_entries = 1;
      r->ann_capacity = 1;
      for (int d = 0; d < nd; d++) r->rings[d].capacity = 1;
      r->host_ring.capacity = 1;
      atomic_init(&r->host_enabled, false);
      atomic_init(&r->host_level, MSNAP_CONTEXT_NEVER);
      atomic_init(&r->host_stacks, 0u);
      atomic_init(&r->enabled, false);
      atomic_init(&r->level, MSNAP_CONTEXT_NEVER);
      atomic_init(&r->stacks, 0u);
      atomic_init(&r->skip, 0u);
      atomic_init(&r->compile_context, false);
      __atomic_store_n(slot, r, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&rec_create_lock);
  if (created && r != NULL) msnap__oom_env_init(a);
  return r;
}

/* Free the recorder (allocator destruction; no other thread may use the
 * allocator).  The workspace buffers are returned to the runtime, so this
 * must run before the runtime is finalized. */
void msnap__recorder_destroy(struct msnap_recorder_s *r) {
  if (r == NULL) return;
  msnap__ws_destroy(r);
  for (int d = 0; d < r->ndevices; d++) {
    ring_clear(&r->rings[d]);
    ring_drop_spare(&r->rings[d]);
    keymap_free(&r->rings[d].streams);
    keymap_free(&r->rings[d].pools);
  }
  free(r->rings);
  ring_clear(&r->host_ring);
  ring_drop_spare(&r->host_ring);
  keymap_free(&r->host_ring.streams);
  keymap_free(&r->host_ring.pools);
  for (uint64_t i = 0; i < r->ann_n; i++)
    msnap__stack_unref(r->ann[(r->ann_head + i) % r->ann_vcap].name);
  free(r->ann);
  free(r->observers);
  free(r->oom_path);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

/* ---- thread-local metadata and compile context --------------------------- */

static MSNAP_TLS uint32_t tls_meta;    /* string id, TLS holds a ref */
static MSNAP_TLS uint32_t *tls_cc;     /* compile-context stack      */
static MSNAP_TLS uint32_t tls_cc_n, tls_cc_cap;
static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

static void tls_destructor(void *p) {
  (void)p;
  msnap__stack_unref(tls_meta);
  tls_meta = 0;
  for (uint32_t i = 0; i < tls_cc_n; i++) msnap__stack_unref(tls_cc[i]);
  free(tls_cc);
  tls_cc = NULL;
  tls_cc_n = tls_cc_cap = 0;
}

static void tls_key_make(void) { pthread_key_create(&tls_key, tls_destructor); }

/* Arrange for this thread's references to be dropped at thread exit. */
static void tls_register(void) {
  pthread_once(&tls_key_once, tls_key_make);
  if (pthread_getspecific(tls_key) == NULL)
    pthread_setspecific(tls_key, (void *)1);
}

int msnap_set_memory_metadata(const char *metadata) {
  uint32_t id = 0;
  if (metadata != NULL && metadata[0] != '\0') {
    id = msnap__str_intern(metadata, strlen(metadata));
    if (id == 0) return MSNAP_ENOMEM;
    tls_register();
  }
  msnap__stack_unref(tls_meta);
  tls_meta = id;
  return 0;
}

const char *msnap_get_memory_metadata(void) {
  return msnap__str_get(tls_meta, NULL);
}

int msnap_compile_context_push(const char *name) {
  if (name == NULL)
    return msnap__set_error(MSNAP_EINVAL, "compile_context_push: NULL name");
  uint32_t id = msnap__str_intern(name, strlen(name));
  if (id == 0 && name[0] != '\0') return MSNAP_ENOMEM;
  if (tls_cc_n == tls_cc_cap) {
    uint32_t cap = tls_cc_cap ? tls_cc_cap * 2 : 8;
    uint32_t *n = realloc(tls_cc, cap * sizeof *n);
    if (n == NULL) {
      msnap__stack_unref(id);
      return MSNAP_ENOMEM;
    }
    tls_cc = n;
    tls_cc_cap = cap;
  }
  tls_register();
  tls_cc[tls_cc_n++] = id;
  return 0;
}

int msnap_compile_context_pop(void) {
  if (tls_cc_n == 0)
    return msnap__set_error(MSNAP_ESTATE,
                            "compile_context_pop: the compile-context stack "
                            "of this thread is empty");
  msnap__stack_unref(tls_cc[--tls_cc_n]);
  return 0;
}

void msnap__tls_context(uint32_t *user_metadata, uint32_t *compile_context) {
  *user_metadata = tls_meta;
  msnap__stack_ref(tls_meta);
  *compile_context = tls_cc_n ? tls_cc[tls_cc_n - 1] : 0;
  msnap__stack_ref(*compile_context);
}

/* ---- recording ----------------------------------------------------------- */

/* OOM_SNAPSHOT_ENABLE seen in the environment: 0 unknown, 1 no, 2 yes. */
static _Atomic int oom_env_seen;

/* First call on an allocator without a recorder: if OOM_SNAPSHOT_ENABLE
 * is set, run msnap__oom_env_init now (for allocators whose creation did
 * not call it).  Cold path. */
static __attribute__((noinline)) bool history_first_use(
    const msnap_allocator_t *a) {
  int seen = atomic_load_explicit(&oom_env_seen, memory_order_relaxed);
  if (seen == 0) {
    const char *e = getenv("OOM_SNAPSHOT_ENABLE");
    seen = e && *e && strcmp(e, "0") != 0 ? 2 : 1;
    atomic_store(&oom_env_seen, seen);
  }
  if (seen != 2) return false;
  msnap__oom_env_init((msnap_allocator_t *)a);
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL) /* not a usable value: stop looking */
    atomic_store(&oom_env_seen, 1);
  return r != NULL && atomic_load_explicit(&r->enabled, memory_order_relaxed);
}

bool msnap__history_active(const msnap_allocator_t *a) {
  msnap_recorder_t *r = rec_load(a);
  if (msnap_likely(r != NULL))
    return atomic_load_explicit(&r->enabled, memory_order_relaxed);
  if (msnap_likely(atomic_load_explicit(&oom_env_seen,
                                        memory_order_relaxed) == 1))
    return false;
  return history_first_use(a);
}

/*
 * Capture the calling thread's recording context (outside any allocator
 * lock: the frame hook may need the interpreter lock).  A stack is taken
 * for malloc-like sites at level >= STATE and for free/empty_cache sites
 * (is_free_site) only at level ALL.  *ctx holds one reference on each
 * non-zero id; msnap__rctx_release drops what the caller did not take.
 */
/* A serial for a new call: each thread draws a range of 2^32 serials
 * once, so serials are unique across threads and never 0. */
static uint64_t call_serial(void) {
  static _Thread_local uint64_t tl_next;
  static atomic_uint_fast64_t ranges;
  if (msnap_unlikely((tl_next & 0xffffffffu) == 0))
    tl_next = (atomic_fetch_add(&ranges, 1) + 1) << 32 | 1;
  return tl_next++;
}

void msnap__rctx_capture(msnap_allocator_t *a, msnap_rctx_t *ctx,
                         bool is_free_site) {
  memset(ctx, 0, sizeof *ctx);
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL || !atomic_load_explicit(&r->enabled, memory_order_relaxed))
    return;
  ctx->call = call_serial();
  int level = atomic_load_explicit(&r->level, memory_order_relaxed);
  ctx->level = (uint8_t)level;
  if (level != MSNAP_CONTEXT_NEVER &&
      (is_free_site ? level == MSNAP_CONTEXT_ALL
                    : level >= MSNAP_CONTEXT_STATE)) {
    unsigned stacks = atomic_load_explicit(&r->stacks, memory_order_relaxed);
    /* skip this function's frame */
    ctx->stack = msnap__stack_capture(stacks, 1);
  }
  msnap__tls_context(&ctx->user_metadata, &ctx->compile_context);
}

void msnap__rctx_release(msnap_rctx_t *ctx) {
  msnap__stack_unref(ctx->stack);
  msnap__stack_unref(ctx->user_metadata);
  msnap__stack_unref(ctx->compile_context);
  ctx->stack = ctx->user_metadata = ctx->compile_context = 0;
}

/*
 * Append one entry to device's ring.  Caller holds the device lock.  The
 * entry carries a stack only at level >= ALLOC (stack_override wins over
 * ctx->stack); it takes its own references, ctx keeps its own.  Skipped
 * actions and disabled history record nothing.
 */
/* Append one entry to `ring` (its owner's lock held); the entry carries
 * a stack only when level >= ALLOC. */
static void ring_record(msnap_recorder_t *r, msnap_ring_t *ring, int level,
                        msnap_action_t action, uint64_t addr, uint64_t size,
                        uint64_t stream, msnap_mempool_id_t pool,
                        const msnap_rctx_t *ctx, uint32_t stack_override) {
  if (atomic_load_explicit(&r->skip, memory_order_relaxed) &
      (1u << action))
    return;
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

void msnap__history_record_locked(msnap_allocator_t *a, int device,
                                  msnap_action_t action, uint64_t addr,
                                  uint64_t size, uint64_t stream,
                                  msnap_mempool_id_t pool,
                                  const msnap_rctx_t *ctx,
                                  uint32_t stack_override) {
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL || !atomic_load_explicit(&r->enabled, memory_order_relaxed))
    return;
  if ((unsigned)action >= MSNAP_ACTION_COUNT || device < 0 ||
      device >= r->ndevices)
    return;
  ring_record(r, &r->rings[device],
              atomic_load_explicit(&r->level, memory_order_relaxed), action,
              addr, size, stream, pool, ctx, stack_override);
}

/* ---- host (pinned) memory ------------------------------------------------ */

bool msnap__host_history_active(const msnap_allocator_t *a) {
  msnap_recorder_t *r = rec_load(a);
  return r != NULL &&
         atomic_load_explicit(&r->host_enabled, memory_order_relaxed);
}

/* As msnap__rctx_capture, with the host settings (outside the host lock). */
void msnap__host_rctx_capture(msnap_allocator_t *a, msnap_rctx_t *ctx,
                              bool is_free_site) {
  memset(ctx, 0, sizeof *ctx);
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL ||
      !atomic_load_explicit(&r->host_enabled, memory_order_relaxed))
    return;
  ctx->call = call_serial();
  int level = atomic_load_explicit(&r->host_level, memory_order_relaxed);
  ctx->level = (uint8_t)level;
  if (level != MSNAP_CONTEXT_NEVER &&
      (is_free_site ? level == MSNAP_CONTEXT_ALL
                    : level >= MSNAP_CONTEXT_STATE)) {
    unsigned stacks =
        atomic_load_explicit(&r->host_stacks, memory_order_relaxed);
    /* skip this function's frame and host_alloc.c's entry point */
    ctx->stack = msnap__stack_capture(stacks, 1);
  }
  msnap__tls_context(&ctx->user_metadata, &ctx->compile_context);
}

/* Append to the host ring (stream as given, pool (0,0)).  Caller holds the
 * host allocator lock. */
void msnap__host_history_record_locked(msnap_allocator_t *a,
                                       msnap_action_t action, uint64_t addr,
                                       uint64_t size, uint64_t stream,
                                       const msnap_rctx_t *ctx,
                                       uint32_t stack_override) {
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL ||
      !atomic_load_explicit(&r->host_enabled, memory_order_relaxed))
    return;
  if ((unsigned)action >= MSNAP_ACTION_COUNT) return;
  ring_record(r, &r->host_ring,
              atomic_load_explicit(&r->host_level, memory_order_relaxed),
              action, addr, size, stream, (msnap_mempool_id_t){0, 0}, ctx,
              stack_override);
}

/* Copy `ring` oldest first with one reference per id (owner lock held). */
static int ring_copy(msnap_ring_t *ring, msnap_hcopy_t **out, size_t *n) {
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

int msnap__host_ring_copy_locked(msnap_recorder_t *r, msnap_hcopy_t **out,
                                 size_t *n, uint64_t *dropped) {
  int rc = ring_copy(&r->host_ring, out, n);
  if (rc == 0) *dropped = r->host_ring.dropped;
  return rc;
}

int msnap__ring_copy_locked(msnap_recorder_t *r, int device,
                            msnap_hcopy_t **out, size_t *n,
                            uint64_t *dropped, uint64_t *capacity) {
  msnap_ring_t *ring = &r->rings[device];
  int rc = ring_copy(ring, out, n);
  if (rc != 0) return rc;
  *dropped = ring->dropped;
  *capacity = ring->capacity;
  return 0;
}

void msnap__hcopy_release(msnap_hcopy_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) hentry_release(&v[i].e);
  free(v);
}

/* ---- annotations --------------------------------------------------------- */

static void ann_clear_locked(msnap_recorder_t *r) {
  for (uint64_t i = 0; i < r->ann_n; i++)
    msnap__stack_unref(r->ann[(r->ann_head + i) % r->ann_vcap].name);
  free(r->ann);
  r->ann = NULL;
  r->ann_vcap = r->ann_head = r->ann_n = r->ann_dropped = 0;
}

/* Relayout the annotation ring to vcap slots keeping the newest. */
static int ann_relayout_locked(msnap_recorder_t *r, uint64_t vcap) {
  msnap_aentry_t *nv = NULL;
  if (vcap > 0) {
    if (vcap > SIZE_MAX / sizeof *nv) return MSNAP_ENOMEM;
    nv = malloc((size_t)vcap * sizeof *nv);
    if (nv == NULL) return MSNAP_ENOMEM;
  }
  uint64_t keep = r->ann_n < vcap ? r->ann_n : vcap;
  uint64_t drop = r->ann_n - keep;
  for (uint64_t i = 0; i < r->ann_n; i++) {
    msnap_aentry_t *e = &r->ann[(r->ann_head + i) % r->ann_vcap];
    if (i < drop)
      msnap__stack_unref(e->name);
    else
      nv[i - drop] = *e;
  }
  free(r->ann);
  r->ann = nv;
  r->ann_vcap = vcap;
  r->ann_head = 0;
  r->ann_n = keep;
  r->ann_dropped += drop;
  return 0;
}

int msnap_record_annotation(msnap_allocator_t *a, int device,
                            const char *name, bool is_start) {
  if (a == NULL || name == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_annotation: NULL allocator or name");
  msnap_recorder_t *r = rec_load(a);
  if (r == NULL || !atomic_load_explicit(&r->enabled, memory_order_relaxed))
    return 0;
  msnap_aentry_t e;
  e.name = msnap__str_intern(name, strlen(name));
  if (e.name == 0 && name[0] != '\0') return MSNAP_ENOMEM;
  e.device = device;
  e.is_start = is_start;
  pthread_mutex_lock(&r->lock);
  e.raw_time = msnap__clock_raw();
  if (r->ann_n == r->ann_vcap && r->ann_vcap < r->ann_capacity) {
    uint64_t vcap = r->ann_vcap ? r->ann_vcap * 2 : 64;
    if (vcap > r->ann_capacity) vcap = r->ann_capacity;
    (void)ann_relayout_locked(r, vcap);
  }
  if (r->ann_vcap == 0) {
    msnap__stack_unref(e.name);
    r->ann_dropped++;
  } else if (r->ann_n < r->ann_vcap) {
    r->ann[(r->ann_head + r->ann_n) % r->ann_vcap] = e;
    r->ann_n++;
  } else {
    msnap__stack_unref(r->ann[r->ann_head].name);
    r->ann[r->ann_head] = e;
    r->ann_head = (r->ann_head + 1) % r->ann_vcap;
    r->ann_dropped++;
  }
  pthread_mutex_unlock(&r->lock);
  return 0;
}

int msnap__ann_copy(msnap_recorder_t *r, msnap_aentry_t **out, size_t *n) {
  pthread_mutex_lock(&r->lock);
  msnap_aentry_t *v = NULL;
  if (r->ann_n) {
    v = malloc((size_t)r->ann_n * sizeof *v);
    if (v == NULL) {
      pthread_mutex_unlock(&r->lock);
      return MSNAP_ENOMEM;
    }
  }
  for (uint64_t i = 0; i < r->ann_n; i++) {
    v[i] = r->ann[(r->ann_head + i) % r->ann_vcap];
    msnap__stack_ref(v[i].name);
  }
  *out = v;
  *n = (size_t)r->ann_n;
  pthread_mutex_unlock(&r->lock);
  return 0;
}

/* ---- configuration ------------------------------------------------------- */

void msnap_history_options_init(msnap_history_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_HISTORY_OPTIONS_VERSION;
  o->enabled = true;
  o->context = MSNAP_CONTEXT_ALL;
  o->stacks = MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP;
  o->max_entries = UINT64_MAX;
  o->record_device = true;
}

/*
 * recordHistory on every device, in the order of cuda-reference §4.1:
 * enabled flag, skip set (replaced on every call), ring capacity
 * max(1, max_entries) without clearing, context level, then clear the
 * ring when disabling or clear_history.  The annotation ring follows the
 * same rules.  Each device's ring is changed under its device lock.
 */
int msnap_record_history(msnap_allocator_t *a,
                         const msnap_history_options_t *o) {
  if (a == NULL || o == NULL)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_history: NULL allocator or options");
  if (o->size < sizeof *o || o->version != MSNAP_HISTORY_OPTIONS_VERSION)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_history: options size %u / version %u "
                            "not supported (use msnap_history_options_init)",
                            o->size, o->version);
  if (o->record_host && !o->enabled)
    return msnap__set_error(MSNAP_EINVAL,
                            "record_pinned_host_memory requires memory "
                            "history recording to be enabled");
  if ((unsigned)o->context > MSNAP_CONTEXT_ALL)
    return msnap__set_error(MSNAP_EINVAL,
                            "expected context to be 'state', 'alloc', 'all', "
                            "or None (got %d)", (int)o->context);
  if ((o->stacks & ~(unsigned)(MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP)) ||
      (o->enabled && o->context != MSNAP_CONTEXT_NEVER &&
       o->stacks == 0))
    return msnap__set_error(MSNAP_EINVAL,
                            "expected stacks to be 'python', or 'all' (got "
                            "bits 0x%x)", o->stacks);
  if (o->skip_actions >> MSNAP_ACTION_COUNT)
    return msnap__set_error(MSNAP_EINVAL,
                            "Unknown TraceEntry action: bit 0x%x",
                            o->skip_actions);
  msnap_recorder_t *r = msnap__recorder_get(a, true);
  if (r == NULL) return MSNAP_ENOMEM;
  bool hon = o->enabled && o->record_host;
  if (hon || atomic_load(&r->host_enabled)) {
    /* Create the host allocator state now: once it exists taking its lock
     * cannot fail, so nothing below fails half-way. */
    int hrc = msnap__host_lock(a);
    if (hrc != 0) return hrc;
    msnap__host_unlock(a);
  }
  msnap__clock_init();

  bool on = o->enabled && o->record_device;
  uint64_t cap = o->max_entries ? o->max_entries : 1;
  int level = on ? (int)o->context : MSNAP_CONTEXT_NEVER;
  unsigned stacks = on && o->context != MSNAP_CONTEXT_NEVER ? o->stacks : 0;
  for (int d = 0; d < r->ndevices; d++) {
    msnap__device_lock(a, d);
    if (d == 0) {
      atomic_store(&r->enabled, on);
      atomic_store(&r->skip, o->skip_actions);
      atomic_store(&r->stacks, stacks);
    }
    ring_set_capacity(&r->rings[d], cap);
    if (d == 0) atomic_store(&r->level, level);
    if (!on || o->clear_history) ring_clear(&r->rings[d]);
    msnap__device_unlock(a, d);
  }
  if (r->ndevices == 0) {
    atomic_store(&r->enabled, on);
    atomic_store(&r->skip, o->skip_actions);
    atomic_store(&r->stacks, stacks);
    atomic_store(&r->level, level);
  }
  atomic_store(&r->compile_context, on && o->compile_context);

  /* Pinned host memory (cuda-reference §4.2 (d)): on when enabled and
   * record_host, whatever record_device says; otherwise turned off (ring
   * cleared) if it was on. */
  if (hon || atomic_load(&r->host_enabled)) {
    (void)msnap__host_lock(a); /* state exists: cannot fail */
    atomic_store(&r->host_enabled, hon);
    atomic_store(&r->host_stacks,
                 hon && o->context != MSNAP_CONTEXT_NEVER ? o->stacks : 0u);
    ring_set_capacity(&r->host_ring, cap);
    atomic_store(&r->host_level, hon ? (int)o->context : MSNAP_CONTEXT_NEVER);
    if (!hon || o->clear_history) ring_clear(&r->host_ring);
    msnap__host_unlock(a);
  }

  pthread_mutex_lock(&r->lock);
  r->max_entries = cap;
  r->global_record_annotations = o->global_record_annotations;
  r->record_host = o->record_host;
  r->ann_capacity = cap;
  if (r->ann_n > cap || r->ann_vcap > cap) {
    if (ann_relayout_locked(r, cap) != 0) ann_clear_locked(r);
  }
  if (!on || o->clear_history) ann_clear_locked(r);
  pthread_mutex_unlock(&r->lock);
  return 0;
}

bool msnap_history_enabled(msnap_allocator_t *a) {
  return a != NULL && msnap__history_active(a);
}

/* ---- annotate_memory ----------------------------------------------------- */

/*
 * _annotate_memory(ptr, text): an `annotate` entry on the live allocation
 * whose base pointer is ptr (size = its requested size, user_metadata =
 * text, the annotation site's stack at level >= ALLOC).  The pointer is
 * checked even when history is off.
 */
int msnap_annotate_memory(msnap_allocator_t *a, uint64_t ptr,
                          const char *metadata) {
  if (a == NULL)
    return msnap__set_error(MSNAP_EINVAL, "annotateMemory: NULL allocator");
  int device = -1;
  uint64_t req = 0, stream = 0;
  msnap_mempool_id_t pool = {0, 0};
  uint32_t bstack = 0;
  int rc = msnap__allocation_info(a, ptr, &device, &req, &stream, &pool,
                                  &bstack);
  if (rc != 0)
    return msnap__set_error(MSNAP_EBADPTR,
                            "annotateMemory: no live allocation found at "
                            "pointer 0x%" PRIx64, ptr);
  msnap__stack_unref(bstack); /* allocation_info hands out a reference */
  if (!msnap__history_active(a)) return 0;
  msnap_rctx_t ctx;
  msnap__rctx_capture(a, &ctx, false);
  msnap__stack_unref(ctx.user_metadata);
  ctx.user_metadata =
      metadata ? msnap__str_intern(metadata, strlen(metadata)) : 0;
  msnap__device_lock(a, device);
  msnap__history_record_locked(a, device, MSNAP_ACTION_ANNOTATE, ptr, req,
                               stream, pool, &ctx, 0);
  msnap__device_unlock(a, device);
  msnap__rctx_release(&ctx);
  return 0;
}
