/*
 * history.h -- the record layer's internal interface, apart from the stack
 * table (stack.h): the trace ring (ring.c) and, in history.c, the
 * recording settings, recording contexts, thread-local metadata and
 * compile context, the annotation ring and the action names.
 *
 * The record layer calls only base.  It knows no allocator: the allocator
 * (alloc layer) embeds one ring per device (msnap_device_t, guarded by
 * that device's lock), the host ring in its pinned host allocator (guarded
 * by the host lock), one msnap_hsettings_t for device history and one for
 * host history, and one annotation ring (its own lock); it passes them in
 * with the right lock held.
 *
 * A trace ring keeps the newest `capacity` entries, oldest first from
 * `head`:
 *
 *     v[head], v[(head+1) % vcap], ..., v[(head+n-1) % vcap]
 *
 * Invariants (msnap__ring_check):
 *   - n <= capacity, n <= vcap, head < vcap (or vcap == 0 and n == 0);
 *   - vcap <= capacity, except after a failed shrink (ENOMEM) that left
 *     the old slots; nchunks = ceil(vcap / MSNAP_RING_CHUNK);
 *   - while the ring grows (n == vcap < capacity) head is 0;
 *   - every entry names a live entry context (ctxs.v[slot.ctx].refs > 0);
 *     a context's refs is the number of entries naming it; a live context
 *     holds one reference on each of its non-zero stack, user_metadata
 *     and compile_context ids, and is in the context index exactly once
 *     (no two live contexts are equal); overwriting or clearing an entry
 *     drops its context's count, and the last one frees the context and
 *     its references;
 *   - dropped counts entries lost to overflow since the last clear;
 *   - a context's stream and pool index the ring's own interning tables.
 * The whole ring (entries, tables, counters) is guarded by its owner's
 * lock.  Lowering the capacity without clearing drops the oldest entries
 * at once (PyTorch leaves stale slots; we keep "newest N").
 *
 * The settings (enabled, level, stacks, skip set) are atomics read without
 * locks on the hot path; the allocator's msnap_record_history writes them.
 */
#ifndef MSNAP_HISTORY_H
#define MSNAP_HISTORY_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "base/map16.h"

/* ---- recording contexts (history.c) -------------------------------------- */
/* A recording context, captured at the start of malloc/free/empty_cache
 * OUTSIDE the allocator lock, consumed under it, released at the end of
 * the call (msnap__rctx_release) on the same thread.  Its ids are valid
 * until then, and cost no atomic operation in the common case:
 *   - stack: borrowed from the calling thread's stack cache when
 *     stack_pin != NULL (the cache keeps the slot while pinned), else one
 *     reference of the context's own;
 *   - user_metadata, compile_context: borrowed from the thread's
 *     metadata (it cannot change during the call), unless `owns` says the
 *     context holds a reference (msnap__rctx_set_metadata).
 * A consumer that keeps an id beyond the call takes its own reference. */
enum { MSNAP_RCTX_OWNS_STACK = 1, MSNAP_RCTX_OWNS_META = 2 };
typedef struct msnap_rctx_s {
  uint32_t stack;           /* interned stack id, 0 = none          */
  uint32_t user_metadata;   /* interned string id in stack table, 0 = "" */
  uint32_t compile_context; /* interned string id, 0 = "N/A"         */
  uint8_t level;            /* msnap_record_context_t at capture      */
  uint8_t owns;             /* MSNAP_RCTX_OWNS_*                      */
  /* The pinned slot's counter in the thread's stack cache (NULL: none);
   * msnap__stack_unpin releases it without a thread-local lookup. */
  uint8_t *stack_pin;
  /* Serial of the capturing call, unique per thread and call (0: none).
   * Entries that one call records back to back in a ring share one clock
   * read (ring.c, msnap__ring_record). */
  uint64_t call;
} msnap_rctx_t;

/* What to record: one for device history, one for host history. */
typedef struct msnap_hsettings_s {
  _Atomic bool enabled;    /* history on                             */
  _Atomic int level;       /* msnap_record_context_t                 */
  _Atomic unsigned stacks; /* MSNAP_STACKS_*                         */
  _Atomic uint32_t skip;   /* 1u << action: actions not recorded     */
} msnap_hsettings_t;

/* Off, context NEVER, no stacks, nothing skipped. */
void msnap__hsettings_init(msnap_hsettings_t *s);
/* The only check on the hot path when recording is off. */
static inline bool msnap__hsettings_on(const msnap_hsettings_t *s) {
  return atomic_load_explicit(&s->enabled, memory_order_relaxed);
}
/* Capture the calling thread's context under settings s (zeroed when s is
 * off).  is_free_site: a free()/empty_cache() call site (a stack only at
 * level ALL); other sites get a stack at level >= STATE. */
void msnap__rctx_capture(const msnap_hsettings_t *s, msnap_rctx_t *ctx,
                         bool is_free_site);
/* Drop what a context holds (references, stack-cache pin). */
void msnap__rctx_release(msnap_rctx_t *ctx);
/* Replace the context's user_metadata by `id`, whose reference the
 * context takes over (msnap_annotate_memory's text). */
void msnap__rctx_set_metadata(msnap_rctx_t *ctx, uint32_t id);
/* This thread's metadata/compile-context ids, borrowed: valid until the
 * thread changes them (take a reference to keep them). */
void msnap__tls_context(uint32_t *user_metadata, uint32_t *compile_context);

/* ---- the trace ring (ring.c) --------------------------------------------- */
/* A trace entry as the ring stores it: 28 bytes.  What entries share --
 * stack, user_metadata, compile_context, stream, pool and the top byte of
 * the size -- is interned once per ring in its entry-context table
 * (msnap_hctx_t, below); an entry names its context by index. */
typedef struct __attribute__((packed, aligned(4))) msnap_hslot_s {
  uint64_t addr;     /* device_free for oom entries                      */
  uint64_t sizeact;  /* bits 0-55: size (low 56 bits); 56-61: action;
                      * 62: internal_meta ("mallocWithAddress")          */
  uint64_t raw_time; /* msnap__clock_raw at record time                  */
  uint32_t ctx;      /* index into the ring's context table             */
} msnap_hslot_t;
_Static_assert(sizeof(msnap_hslot_t) == 28, "a ring slot must be 28 bytes");

#define MSNAP_HSLOT_SIZE_BITS 56
#define MSNAP_HSLOT_SIZE_MASK ((UINT64_C(1) << MSNAP_HSLOT_SIZE_BITS) - 1)

/* An entry context: what consecutive entries of a recording share.  A
 * live context (refs > 0) holds one reference on each non-zero id; a free
 * one (refs == 0) is on the table's free list (its `stack` is the next
 * free index + 1). */
typedef struct msnap_hctx_s {
  uint32_t stack;           /* stack id (0 = none)                       */
  uint32_t user_metadata;   /* string id (0 = "")                        */
  uint32_t compile_context; /* string id (0 = "N/A")                     */
  uint32_t stream, pool;    /* indices into ring->streams, ring->pools   */
  uint32_t size_hi;         /* bits 56-63 of the entries' sizes          */
  uint32_t refs;            /* ring slots naming this context            */
} msnap_hctx_t;

/* The context table: contexts by index, an index of the live ones
 * (open addressing, linear probing, backward-shift deletion; slots hold
 * index + 1, 0 = empty), a free list. */
typedef struct msnap_hctxtab_s {
  msnap_hctx_t *v;
  uint32_t n, cap;     /* v[0..n) in use or free                           */
  uint32_t live;       /* contexts with refs > 0                           */
  uint32_t free_head;  /* first free index + 1 (0: none)                   */
  uint32_t *ht;
  uint32_t ht_cap;     /* power of two (0: no index yet)                   */
  uint32_t last[2];    /* index + 1 of the two contexts used last, most
                        * recent first (0: none): an allocator call's
                        * entries alternate between at most two         */
} msnap_hctxtab_t;

/* One trace entry, decoded (copies, tests). */
typedef struct msnap_hentry_s {
  uint64_t addr;            /* device_free for oom entries            */
  uint64_t size;
  uint64_t raw_time;        /* msnap__clock_raw at record time         */
  uint64_t stream;
  msnap_mempool_id_t pool;
  uint32_t stack;           /* stack id (0 = none)                     */
  uint32_t user_metadata;   /* string id (0 = "")                      */
  uint32_t compile_context; /* string id (0 = "N/A")                   */
  uint8_t action;           /* msnap_action_t                          */
  uint8_t internal_meta;    /* 0 none, 1 "mallocWithAddress"          */
} msnap_hentry_t;

/* Interning of 16-byte keys (streams: {stream, 0}; pools): keys[id] and
 * an index key -> id (base/map16.c). */
typedef struct msnap_keymap_s {
  uint64_t (*keys)[2];
  uint32_t n, cap;
  msnap_map16_t index;
  uint32_t last;
} msnap_keymap_t;

/* Ring storage comes in chunks of 4096 slots (112 KiB, 28 pages):
 * growing adds a chunk and never copies, so an unbounded history costs
 * its entries and no transient double-size copy. */
#define MSNAP_RING_CHUNK_BITS 12
#define MSNAP_RING_CHUNK (1u << MSNAP_RING_CHUNK_BITS)

#define MSNAP_RING_SPARE 64

typedef struct msnap_ring_s {
  msnap_hslot_t **chunks; /* slot s: chunks[s / CHUNK][s % CHUNK]       */
  uint64_t nchunks, chunks_cap;
  uint64_t vcap, head, n;  /* vcap = slots allocated                    */
  uint64_t capacity;
  uint64_t dropped;
  msnap_keymap_t streams, pools;
  msnap_hctxtab_t ctxs;
  /* Freed chunks kept for the next growth, unmapped by
   * msnap__ring_destroy; 64 x 112 KiB at most. */
  msnap_hslot_t *spare[MSNAP_RING_SPARE];
  uint32_t nspare;
  /* The call (context address and serial) that recorded the newest entry
   * and that entry's raw time: the same call's next entry reuses it. */
  const void *last_rctx;
  uint64_t last_call, last_time;
} msnap_ring_t;

/* An empty ring of capacity 1. */
void msnap__ring_init(msnap_ring_t *ring);
/* Release every entry and all storage (the owner is being destroyed). */
void msnap__ring_destroy(msnap_ring_t *ring);
/* Set the capacity (>= 1) keeping the newest entries. */
void msnap__ring_set_capacity(msnap_ring_t *ring, uint64_t capacity);
/* Drop every entry (references released) and the dropped count. */
void msnap__ring_clear(msnap_ring_t *ring);
/* Append one entry when s is on and `action` is not skipped; the entry
 * carries a stack only at level >= ALLOC (stack_override, when non-zero,
 * wins over ctx->stack).  The ring takes its own references (one per
 * entry context, not per entry).  Caller holds the ring owner's lock. */
bool msnap__ring_record(msnap_ring_t *ring, const msnap_hsettings_t *s,
                        msnap_action_t action, uint64_t addr, uint64_t size,
                        uint64_t stream, msnap_mempool_id_t pool,
                        const msnap_rctx_t *ctx, uint32_t stack_override);

/* A copied entry context with its stream and pool resolved (snapshots).
 * Contexts that were free at copy time are all zero. */
typedef struct msnap_hcopy_ctx_s {
  uint32_t stack, user_metadata, compile_context; /* one reference each */
  uint32_t size_hi;
  uint64_t stream;
  msnap_mempool_id_t pool;
} msnap_hcopy_ctx_t;

/* A copy of a ring, oldest first: the packed entries and the contexts
 * they name.  The copy holds one reference per id of each copied context
 * -- never one per entry. */
typedef struct msnap_hcopy_s {
  msnap_hslot_t *slots;
  uint64_t n;
  msnap_hcopy_ctx_t *ctx;
  uint32_t nctx;
  size_t slots_bytes; /* storage of slots (msnap__prefaulted_alloc) */
} msnap_hcopy_t;

/* Copy `ring` oldest first into *out (its slots in prefaulted memory),
 * taking one reference per id of each live context (released with
 * msnap__hcopy_release).  Owner's lock held.  0 or MSNAP_ENOMEM (*out
 * is then empty). */
int msnap__ring_copy(const msnap_ring_t *ring, msnap_hcopy_t *out);
void msnap__hcopy_release(msnap_hcopy_t *c);
/* Entry i of a copy, decoded. */
static inline void msnap__hcopy_get(const msnap_hcopy_t *c, uint64_t i,
                                    msnap_hentry_t *e) {
  const msnap_hslot_t *s = &c->slots[i];
  const msnap_hcopy_ctx_t *x = &c->ctx[s->ctx];
  e->addr = s->addr;
  e->size = (s->sizeact & MSNAP_HSLOT_SIZE_MASK) |
            (uint64_t)x->size_hi << MSNAP_HSLOT_SIZE_BITS;
  e->raw_time = s->raw_time;
  e->stream = x->stream;
  e->pool = x->pool;
  e->stack = x->stack;
  e->user_metadata = x->user_metadata;
  e->compile_context = x->compile_context;
  e->action = (uint8_t)((s->sizeact >> MSNAP_HSLOT_SIZE_BITS) & 0x3f);
  e->internal_meta = (uint8_t)((s->sizeact >> 62) & 1);
}
/* Ring structure check (owner's lock held): 0 or MSNAP_ESTATE. */
int msnap__ring_check(const msnap_ring_t *ring, char *msg, size_t len);

/* ---- the annotation ring (history.c) ------------------------------------- */
/* external_annotations entry. */
typedef struct msnap_aentry_s {
  uint64_t raw_time;
  uint32_t name; /* string id, one reference */
  int32_t device;
  uint8_t is_start;
} msnap_aentry_t;

/* The newest `capacity` annotations (same rules as a trace ring, one flat
 * array), guarded by its own lock (MSNAP_RANK_ANNOTATIONS). */
typedef struct msnap_annring_s {
  pthread_mutex_t lock;
  msnap_aentry_t *v;
  uint64_t vcap, head, n, capacity, dropped;
} msnap_annring_t;

void msnap__ann_init(msnap_annring_t *r);
void msnap__ann_destroy(msnap_annring_t *r);
/* Append one annotation (interns name; MSNAP_ENOMEM when that fails). */
int msnap__ann_record(msnap_annring_t *r, int device, const char *name,
                      bool is_start);
/* Set the capacity (>= 1) keeping the newest; clear drops them all. */
void msnap__ann_configure(msnap_annring_t *r, uint64_t capacity, bool clear);
/* Copy oldest first; name ids carry a reference each, dropped by the
 * caller. */
int msnap__ann_copy(msnap_annring_t *r, msnap_aentry_t **out, size_t *n);

#endif /* MSNAP_HISTORY_H */
