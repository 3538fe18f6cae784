/*
 * snapshot.c -- the snapshot model (src/snapshot.h): growth arrays and the
 * interning tables for strings, frames, stacks and string lists.
 *
 * Layout and invariants (msnap__snap_check_model verifies them):
 *   - Strings live in one buffer, each NUL-terminated; str_off has
 *     nstrings + 1 entries and str_off[nstrings] == strbuf_len, so the
 *     length of string i is str_off[i + 1] - str_off[i] - 1.  Id 0 is the
 *     "absent" placeholder (an empty string nobody may look up as a key),
 *     id 1 is "".  Interning is by content: equal bytes give equal ids.
 *   - Frames are interned by all seven fields; frame ids start at 0.
 *   - Stacks are msnap_stackspan_t over stack_bytes (varint zigzag
 *     differences of frame ids); id 0 = absent, id 1 = [] (both
 *     placeholders with n == 0); equal frame sequences give equal ids
 *     (equal sequences have equal encodings).
 *   - Trace entry attribute sets (msnap_tattr_t) are interned by all
 *     their fields; [0] is the all-zero set.
 *   - String lists (forward_frames) are spans of strlist_items; id 0 is the
 *     absent placeholder.
 *   - Record arrays (segments, blocks, ...) only grow; pointers returned by
 *     msnap__snap_add_* are valid until the next add of the same kind.
 *
 * Hash tables are open-addressing arrays of (id + 1), 0 = empty slot, kept
 * at most half full (the stack table three quarters); hashes are XXH3 of the interned content with a
 * per-model random seed (so a hostile file cannot pick colliding strings
 * in advance).  Strings and frames are hashed again on growth; stacks and
 * string lists (long spans) keep the low 32 bits of their hash in an
 * array by id (4 bytes each) that growth and probes use.  Every stored
 * stack has its hash there, also one appended without a lookup (the
 * reader's msnap__snap_stack_append*): the merge of equal stacks reads
 * the hashes instead of hashing the stack bytes again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "model/pickle.h"

typedef struct snap_ht_s {
  uint32_t *slots;
  uint32_t mask; /* capacity - 1; capacity is a power of two */
  uint32_t count;
} snap_ht_t;

struct msnap_snap_priv_s {
  snap_ht_t strings, frames, stacks, strlists, tattrs;
  uint32_t tattr_last; /* the last attribute set interned (a cache) */
  unsigned char *enc;  /* scratch: a stack being encoded */
  size_t enc_cap;
  bool stacks_unindexed; /* stacks appended, not deduplicated yet */
  size_t stack_bytes_ahead; /* msnap__prefault_ahead's mark */
  /* Low 32 bits of the hash of each stack / string list, by id (the
   * placeholders' entries are unused): growth re-slots without hashing
   * again, and a probe compares contents only when the hashes agree. */
  uint32_t *stack_hash, *strlist_hash;
  uint32_t stack_hash_cap, strlist_hash_cap;
  uint64_t seed; /* XXH3 seed, random per model */
  bool from_reader; /* key bits are authoritative (model read from a file) */
};

/* ---- growth arrays ------------------------------------------------------- */

#define GROW(arr, cap, n, extra)                                              \
  msnap__grow((void **)&(arr), &(cap), (n), (extra), sizeof *(arr))

/* ---- hashing helpers ----------------------------------------------------- */

static uint64_t str_hash(uint64_t seed, const char *p, size_t len) {
  return XXH3_64bits_withSeed(p, len, seed);
}

static uint64_t frame_hash(uint64_t seed, const msnap_frame_t *f) {
  uint32_t w[9];
  w[0] = f->name;
  w[1] = f->filename;
  w[2] = (uint32_t)f->line;
  w[3] = (uint32_t)((uint64_t)f->line >> 32);
  w[4] = f->fx_node_op;
  w[5] = f->fx_node_name;
  w[6] = f->fx_node_target;
  w[7] = f->fx_original_trace;
  w[8] = f->absent;
  return XXH3_64bits_withSeed(w, sizeof w, seed);
}

static bool frame_eq(const msnap_frame_t *a, const msnap_frame_t *b) {
  return a->name == b->name && a->filename == b->filename &&
         a->line == b->line && a->fx_node_op == b->fx_node_op &&
         a->fx_node_name == b->fx_node_name &&
         a->fx_node_target == b->fx_node_target &&
         a->fx_original_trace == b->fx_original_trace &&
         a->absent == b->absent;
}

static uint64_t tattr_hash(uint64_t seed, const msnap_tattr_t *a) {
  uint32_t w[13];
  w[0] = (uint32_t)a->stream;
  w[1] = (uint32_t)((uint64_t)a->stream >> 32);
  w[2] = (uint32_t)a->pool_id.first;
  w[3] = (uint32_t)(a->pool_id.first >> 32);
  w[4] = (uint32_t)a->pool_id.second;
  w[5] = (uint32_t)(a->pool_id.second >> 32);
  w[6] = a->forward_frames;
  w[7] = a->compile_context;
  w[8] = a->user_metadata;
  w[9] = a->internal_metadata;
  w[10] = a->action_str;
  w[11] = a->keys;
  w[12] = 0;
  return XXH3_64bits_withSeed(w, sizeof w, seed);
}

static bool tattr_eq(const msnap_tattr_t *a, const msnap_tattr_t *b) {
  return a->stream == b->stream && a->pool_id.first == b->pool_id.first &&
         a->pool_id.second == b->pool_id.second &&
         a->forward_frames == b->forward_frames &&
         a->compile_context == b->compile_context &&
         a->user_metadata == b->user_metadata &&
         a->internal_metadata == b->internal_metadata &&
         a->action_str == b->action_str && a->keys == b->keys;
}

static uint64_t span_hash(uint64_t seed, const uint32_t *v, uint32_t n) {
  return XXH3_64bits_withSeed(v, (size_t)n * sizeof *v, seed);
}

static uint64_t id_hash(const msnap_snap_t *s, const snap_ht_t *t,
                        uint32_t id) {
  const struct msnap_snap_priv_s *pr = s->priv;
  if (t == &pr->strings) {
    size_t len;
    const char *p = msnap__snap_str(s, id, &len);
    return str_hash(pr->seed, p, len);
  }
  if (t == &pr->frames) return frame_hash(pr->seed, &s->frames[id]);
  if (t == &pr->stacks) return pr->stack_hash[id];
  if (t == &pr->tattrs) return tattr_hash(pr->seed, &s->tattrs[id]);
  return pr->strlist_hash[id];
}

/* Double the table (or create it with 1024 slots). */
static int ht_grow(msnap_snap_t *s, snap_ht_t *t) {
  uint32_t ncap = t->slots ? (t->mask + 1) * 2 : 1024;
  if (ncap == 0) return MSNAP_ENOMEM;
  uint32_t *ns = calloc(ncap, sizeof *ns);
  if (!ns) return MSNAP_ENOMEM;
  if (t->slots) {
    for (uint32_t i = 0; i <= t->mask; i++) {
      uint32_t v = t->slots[i];
      if (!v) continue;
      uint32_t h = (uint32_t)id_hash(s, t, v - 1) & (ncap - 1);
      while (ns[h]) h = (h + 1) & (ncap - 1);
      ns[h] = v;
    }
    free(t->slots);
  }
  t->slots = ns;
  t->mask = ncap - 1;
  return 0;
}

static int ht_reserve(msnap_snap_t *s, snap_ht_t *t) {
  /* at most half full; the stack table (the largest: one slot per
   * distinct stack, probes compare a kept hash first) three quarters */
  uint64_t cap = (uint64_t)t->mask + 1;
  uint64_t limit = t == &s->priv->stacks ? cap / 4 * 3 : cap / 2;
  if (!t->slots || (uint64_t)t->count + 1 > limit) return ht_grow(s, t);
  return 0;
}

/* ---- construction -------------------------------------------------------- */

msnap_snap_t *msnap__snap_new(void) {
  msnap_snap_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->priv = calloc(1, sizeof *s->priv);
  s->strbuf_cap = 4096;
  s->strbuf = malloc(s->strbuf_cap);
  s->str_cap = 1025; /* str_off entries: one per string + the end */
  s->str_off = malloc(s->str_cap * sizeof *s->str_off);
  s->stacks_cap = 1024;
  s->stacks = malloc(s->stacks_cap * sizeof *s->stacks);
  s->strlists_cap = 16;
  s->strlists = malloc(s->strlists_cap * sizeof *s->strlists);
  s->tattrs_cap = 16;
  s->tattrs = calloc(s->tattrs_cap, sizeof *s->tattrs);
  s->stack_bytes_cap = 4096; /* never NULL: offsets are added to it */
  s->stack_bytes = malloc(s->stack_bytes_cap);
  if (!s->priv || !s->strbuf || !s->str_off || !s->stacks || !s->strlists ||
      !s->tattrs || !s->stack_bytes) {
    msnap__snap_free(s);
    return NULL;
  }
  /* id 0 (absent) and id 1 ("") */
  s->strbuf[0] = 0;
  s->strbuf[1] = 0;
  s->strbuf_len = 2;
  s->str_off[0] = 0;
  s->str_off[1] = 1;
  s->str_off[2] = 2;
  s->nstrings = 2;
  s->stacks[0] = (msnap_stackspan_t){0, 0};
  s->stacks[1] = (msnap_stackspan_t){0, 0};
  s->nstacks = 2;
  s->ntattrs = 1; /* [0]: no keys, all zero */
  s->strlists[0] = (msnap_span_t){0, 0};
  s->nstrlists = 1;
  s->generation = MSNAP_GEN_CURRENT;
  s->allocator_settings.kind = MSNAP_GV_NONE;
  s->process_info.kind = MSNAP_GV_NONE;
  /* "" must be found by interning too */
  struct msnap_snap_priv_s *pr = s->priv;
  pr->seed = msnap__random_u64();
  if (ht_grow(s, &pr->strings) < 0) {
    msnap__snap_free(s);
    return NULL;
  }
  uint32_t h = (uint32_t)str_hash(pr->seed, "", 0) & pr->strings.mask;
  pr->strings.slots[h] = 1 + MSNAP_STR_EMPTY;
  pr->strings.count = 1;
  return s;
}

void msnap__gv_free(msnap_gv_t *v) {
  if (!v) return;
  if (v->kind == MSNAP_GV_LIST || v->kind == MSNAP_GV_TUPLE ||
      v->kind == MSNAP_GV_DICT) {
    for (uint32_t i = 0; i < v->u.seq.n; i++)
      msnap__gv_free(&v->u.seq.items[i]);
    free(v->u.seq.items);
  }
  v->kind = MSNAP_GV_NONE;
}

/*
 * Free a model and everything it owns (NULL is fine).
 */
void msnap__snap_free(msnap_snap_t *s) {
  if (!s) return;
  if (s->priv) {
    free(s->priv->strings.slots);
    free(s->priv->frames.slots);
    free(s->priv->stacks.slots);
    free(s->priv->strlists.slots);
    free(s->priv->tattrs.slots);
    free(s->priv->stack_hash);
    free(s->priv->strlist_hash);
    free(s->priv->enc);
    free(s->priv);
  }
  free(s->strbuf);
  free(s->str_off);
  free(s->frames);
  free(s->stack_bytes);
  free(s->stacks);
  free(s->tattrs);
  free(s->strlists);
  free(s->strlist_items);
  free(s->segments);
  free(s->blocks);
  free(s->histories);
  for (uint32_t i = 0; i < s->ndevices; i++) free(s->device_traces[i].v);
  free(s->device_traces);
  free(s->annotations);
  msnap__gv_free(&s->allocator_settings);
  msnap__gv_free(&s->process_info);
  free(s->host_segments);
  free(s->host_blocks);
  free(s->host_traces.v);
  free(s);
}

void msnap__snap_set_from_reader(msnap_snap_t *s, bool v) {
  s->priv->from_reader = v;
}

bool msnap__snap_from_reader(const msnap_snap_t *s) {
  return s->priv->from_reader;
}

/* ---- interning ----------------------------------------------------------- */

const char *msnap__snap_str(const msnap_snap_t *s, msnap_str_t id,
                            size_t *len) {
  if (id >= s->nstrings) {
    if (len) *len = 0;
    return "";
  }
  uint64_t off = s->str_off[id];
  if (len) *len = (size_t)(s->str_off[id + 1] - off - 1);
  return s->strbuf + off;
}

bool msnap__utf8_valid(const char *p, size_t len) {
  return msnap__utf8_valid_prefix((const unsigned char *)p, len) == len;
}

/*
 * Intern len bytes at p as they are (NUL included).  Returns the id, or
 * 0 on ENOMEM.  The string buffer may move: pointers from msnap__snap_str
 * are invalidated by this call.
 */
msnap_str_t msnap__snap_intern_bytes(msnap_snap_t *s, const char *p,
                                     size_t len) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (len == 0) return MSNAP_STR_EMPTY;
  if (ht_reserve(s, &pr->strings) < 0) return 0;
  uint64_t hv = str_hash(pr->seed, p, len);
  uint32_t h = (uint32_t)hv & pr->strings.mask;
  for (;;) {
    uint32_t v = pr->strings.slots[h];
    if (!v) break;
    uint32_t id = v - 1;
    uint64_t off = s->str_off[id];
    if (s->str_off[id + 1] - off - 1 == len &&
        memcmp(s->strbuf + off, p, len) == 0)
      return id;
    h = (h + 1) & pr->strings.mask;
  }
  if (s->nstrings >= UINT32_MAX - 2) return 0;
  if (MSNAP_GROW(s->strbuf, s->strbuf_cap,
                 (uint64_t)s->strbuf_len + len + 1) != 0 ||
      MSNAP_GROW(s->str_off, s->str_cap, (uint64_t)s->nstrings + 2) != 0)
    return 0;
  uint32_t id = s->nstrings;
  memcpy(s->strbuf + s->strbuf_len, p, len);
  s->strbuf[s->strbuf_len + len] = 0;
  s->strbuf_len += len + 1;
  s->nstrings++;
  s->str_off[s->nstrings] = s->strbuf_len;
  pr->strings.slots[h] = id + 1;
  pr->strings.count++;
  return id;
}

/*
 * Intern text under the UTF-8 policy (base/utf8.c): valid UTF-8 as it is;
 * else repaired (msnap__utf8_repair), counted in s->utf8_repaired (the
 * first such string in s->utf8_example).  Returns the id or 0 on ENOMEM.
 */
msnap_str_t msnap__snap_intern(msnap_snap_t *s, const char *p, size_t len) {
  size_t v = msnap__utf8_valid_prefix((const unsigned char *)p, len);
  if (msnap_likely(v == len)) return msnap__snap_intern_bytes(s, p, len);
  if (len > (SIZE_MAX - 3) / 3) return 0;
  char *fixed = malloc(len * 3 + 1);
  if (!fixed) return 0;
  size_t n = msnap__utf8_repair((const unsigned char *)p, len, fixed);
  msnap_str_t id = msnap__snap_intern_bytes(s, fixed, n);
  free(fixed);
  if (id) {
    if (s->utf8_repaired++ == 0) s->utf8_example = id;
  }
  return id;
}

/*
 * Intern a frame by its seven keys and which of them were absent.
 * UINT32_MAX on ENOMEM.
 */
uint32_t msnap__snap_frame(msnap_snap_t *s, const msnap_frame_t *f) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (ht_reserve(s, &pr->frames) < 0) return UINT32_MAX;
  uint32_t h = (uint32_t)frame_hash(pr->seed, f) & pr->frames.mask;
  for (;;) {
    uint32_t v = pr->frames.slots[h];
    if (!v) break;
    if (frame_eq(&s->frames[v - 1], f)) return v - 1;
    h = (h + 1) & pr->frames.mask;
  }
  if (GROW(s->frames, s->frames_cap, s->nframes, 1) < 0) return UINT32_MAX;
  uint32_t id = s->nframes++;
  s->frames[id] = *f;
  pr->frames.slots[h] = id + 1;
  pr->frames.count++;
  return id;
}

/*
 * Intern a span of ids into (items, spans); hashes[id] keeps the low bits
 * of each span's hash.  Shared by stacks and string lists.  Returns the
 * span id or 0 on ENOMEM.
 */
static uint32_t span_intern(msnap_snap_t *s, snap_ht_t *t, uint32_t **items,
                            uint32_t *nitems, uint32_t *items_cap,
                            msnap_span_t **spans, uint32_t *nspans,
                            uint32_t *spans_cap, uint32_t **hashes,
                            uint32_t *hashes_cap, const uint32_t *v,
                            uint32_t n) {
  if (ht_reserve(s, t) < 0) return 0;
  uint32_t hv = (uint32_t)span_hash(s->priv->seed, v, n);
  uint32_t h = hv & t->mask;
  for (;;) {
    uint32_t e = t->slots[h];
    if (!e) break;
    if ((*hashes)[e - 1] == hv) {
      msnap_span_t sp = (*spans)[e - 1];
      if (sp.n == n &&
          (n == 0 || memcmp(*items + sp.first, v, (size_t)n * 4) == 0))
        return e - 1;
    }
    h = (h + 1) & t->mask;
  }
  if (msnap__grow((void **)items, items_cap, *nitems, n, sizeof **items) < 0)
    return 0;
  if (msnap__grow((void **)spans, spans_cap, *nspans, 1, sizeof **spans) < 0)
    return 0;
  if (msnap__grow((void **)hashes, hashes_cap, *nspans, 1,
                  sizeof **hashes) < 0)
    return 0;
  uint32_t id = (*nspans)++;
  (*spans)[id] = (msnap_span_t){*nitems, n};
  (*hashes)[id] = hv;
  if (n) memcpy(*items + *nitems, v, (size_t)n * 4);
  *nitems += n;
  t->slots[h] = id + 1;
  t->count++;
  return id;
}

unsigned char *msnap__snap_stack_tail(msnap_snap_t *s, size_t nb) {
  if (s->nstack_bytes + nb >= (UINT64_C(1) << 40)) return NULL;
  if (s->stack_bytes_cap - s->nstack_bytes < nb) {
    uint64_t nc = s->stack_bytes_cap ? s->stack_bytes_cap : 4096;
    while (nc - s->nstack_bytes < nb) nc *= 2;
    unsigned char *b = realloc(s->stack_bytes, (size_t)nc);
    if (!b) return NULL;
    s->stack_bytes = b;
    s->stack_bytes_cap = nc;
  }
  msnap__prefault_ahead(s->stack_bytes, (size_t)(s->nstack_bytes + nb),
                        (size_t)s->stack_bytes_cap,
                        &s->priv->stack_bytes_ahead);
  return s->stack_bytes + s->nstack_bytes;
}

/* The hash of a stack's encoding (stack_hash, the table's key). */
static inline uint32_t stack_bytes_hash(const msnap_snap_t *s,
                                        const unsigned char *enc,
                                        size_t nb) {
  return (uint32_t)XXH3_64bits_withSeed(enc, nb, s->priv->seed);
}

/* A new stack of n frames whose nb encoded bytes are at
 * msnap__snap_stack_tail already, with hv their hash (stack_bytes_hash):
 * its id, 0 on ENOMEM or past the limits (2^32 stacks, 2^40 bytes).
 * Every stored stack has its hash in stack_hash (the merge of equal
 * stacks reads them there instead of hashing the bytes again). */
static uint32_t stack_store_tail(msnap_snap_t *s, size_t nb, uint32_t n,
                                 uint32_t hv) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (s->nstacks >= UINT32_MAX - 1) return 0;
  if (s->nstack_bytes + nb >= (UINT64_C(1) << 40) ||
      s->stack_bytes_cap - s->nstack_bytes < nb)
    return 0;
  if (GROW(s->stacks, s->stacks_cap, s->nstacks, 1) < 0) return 0;
  if (msnap__grow((void **)&pr->stack_hash, &pr->stack_hash_cap, s->nstacks,
                  1, sizeof *pr->stack_hash) < 0)
    return 0;
  uint32_t id = s->nstacks++;
  s->stacks[id] = (msnap_stackspan_t){s->nstack_bytes, n};
  pr->stack_hash[id] = hv;
  s->nstack_bytes += nb;
  return id;
}

/* A new stack of n frames encoded in enc[0..nb) with hash hv: its id, 0
 * on ENOMEM or past the limits (2^32 stacks, 2^40 bytes). */
static uint32_t stack_store(msnap_snap_t *s, const unsigned char *enc,
                            size_t nb, uint32_t n, uint32_t hv) {
  if (s->nstacks >= UINT32_MAX - 1) return 0;
  unsigned char *t = msnap__snap_stack_tail(s, nb);
  if (!t) return 0;
  memcpy(t, enc, nb);
  return stack_store_tail(s, nb, n, hv);
}

/* Encoded bytes of stack id: up to the next stack's offset. */
static uint64_t stack_nbytes(const msnap_snap_t *s, uint32_t id) {
  uint64_t end = id + 1 < s->nstacks ? s->stacks[id + 1].off : s->nstack_bytes;
  return end - s->stacks[id].off;
}

/*
 * Intern a frame-id sequence; MSNAP_STACK_EMPTY for n == 0, 0 on ENOMEM
 * (or beyond MSNAP_STACK_MAX_FRAMES frames).
 * The ids are encoded (msnap_stackspan_t) first; equal sequences have
 * equal encodings, so the table compares bytes.
 */
msnap_stack_t msnap__snap_stack(msnap_snap_t *s, const uint32_t *frame_ids,
                                uint32_t n) {
  if (n == 0) return MSNAP_STACK_EMPTY;
  if (n > MSNAP_STACK_MAX_FRAMES) return 0;
  unsigned char *enc = msnap__snap_stack_buf(s, n);
  if (!enc) return 0;
  unsigned char *o = enc;
  uint32_t prev = 0;
  for (uint32_t i = 0; i < n; i++) {
    o = msnap__stack_put(o, prev, frame_ids[i]);
    prev = frame_ids[i];
  }
  return msnap__snap_stack_encoded(s, enc, (size_t)(o - enc), n);
}

unsigned char *msnap__snap_stack_buf(msnap_snap_t *s, uint32_t n) {
  struct msnap_snap_priv_s *pr = s->priv;
  size_t need = (size_t)n * 5 + 16;
  if (pr->enc_cap < need) {
    unsigned char *e = realloc(pr->enc, need);
    if (!e) return NULL;
    pr->enc = e;
    pr->enc_cap = need;
  }
  return pr->enc;
}

/*
 * Intern a stack given as its encoding (nb bytes of n frame ids, written
 * with msnap__stack_put into msnap__snap_stack_buf's buffer or any other
 * one).  Equal sequences have equal encodings, so the table compares
 * bytes.  0 on ENOMEM.
 */
msnap_stack_t msnap__snap_stack_encoded(msnap_snap_t *s,
                                        const unsigned char *enc, size_t nb,
                                        uint32_t n) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (n == 0) return MSNAP_STACK_EMPTY;
  if (n > MSNAP_STACK_MAX_FRAMES) return 0;
  if (pr->stacks_unindexed && msnap__snap_dedupe_stacks(s) < 0) return 0;
  snap_ht_t *t = &pr->stacks;
  if (ht_reserve(s, t) < 0) return 0;
  uint32_t hv = stack_bytes_hash(s, enc, nb);
  uint32_t h = hv & t->mask;
  for (;;) {
    uint32_t e = t->slots[h];
    if (!e) break;
    if (pr->stack_hash[e - 1] == hv) {
      msnap_stackspan_t sp = s->stacks[e - 1];
      if (sp.n == n && stack_nbytes(s, e - 1) == nb &&
          memcmp(s->stack_bytes + sp.off, enc, nb) == 0)
        return e - 1;
    }
    h = (h + 1) & t->mask;
  }
  uint32_t id = stack_store(s, enc, nb, n, hv);
  if (!id) return 0;
  t->slots[h] = id + 1;
  t->count++;
  return id;
}

/*
 * Append a stack without looking it up (the reader: most stacks of a big
 * file are new, and looking each up costs two cache misses in the middle
 * of parsing); msnap__snap_dedupe_stacks later gives equal stacks one id.
 * 0 on ENOMEM or beyond MSNAP_STACK_MAX_FRAMES frames.
 */
msnap_stack_t msnap__snap_stack_append(msnap_snap_t *s,
                                       const unsigned char *enc, size_t nb,
                                       uint32_t n) {
  if (n == 0) return MSNAP_STACK_EMPTY;
  if (n > MSNAP_STACK_MAX_FRAMES) return 0;
  uint32_t id = stack_store(s, enc, nb, n, stack_bytes_hash(s, enc, nb));
  if (id) s->priv->stacks_unindexed = true;
  return id;
}

msnap_stack_t msnap__snap_stack_append_tail(msnap_snap_t *s, size_t nb,
                                            uint32_t n) {
  if (n == 0) return MSNAP_STACK_EMPTY;
  if (n > MSNAP_STACK_MAX_FRAMES) return 0;
  if (s->stack_bytes_cap - s->nstack_bytes < nb) return 0;
  uint32_t id = stack_store_tail(
      s, nb, n, stack_bytes_hash(s, s->stack_bytes + s->nstack_bytes, nb));
  if (id) s->priv->stacks_unindexed = true;
  return id;
}

/* Rewrite a stack id field through map (ids 0 and 1 stay). */
#define REMAP(field)                                                          \
  do {                                                                        \
    if ((field) > MSNAP_STACK_EMPTY && (field) < n) (field) = map[field];     \
  } while (0)

/*
 * Give equal stacks one id, after msnap__snap_stack_append: hash every
 * stack (prefetching its table slot a batch ahead, so the cache misses
 * overlap), keep the first of each content, move the others' bytes down,
 * rewrite every stack id of the model.  Afterwards the table is complete
 * (msnap__snap_stack works on the model).  0 or MSNAP_ENOMEM.
 */
int msnap__snap_dedupe_stacks(msnap_snap_t *s) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (!pr->stacks_unindexed) return 0;
  uint32_t n = s->nstacks;
  snap_ht_t *t = &pr->stacks;
  /* the table for all of them at once (three quarters full at most) */
  uint64_t cap = 1024;
  while (cap / 4 * 3 < (uint64_t)n + 1) cap *= 2;
  if (cap > ((uint64_t)1 << 32)) return MSNAP_ENOMEM;
  uint32_t *slots = calloc((size_t)cap, sizeof *slots);
  /* every stored stack's hash, made when it was stored; compacted in
   * place below (a kept stack's new id is never above its old one) */
  uint32_t *hashes = pr->stack_hash;
  if (!slots) return MSNAP_ENOMEM;
  uint32_t mask = (uint32_t)(cap - 1);
  /* While it runs, a slot's bits above the id hold the top bits of its
   * stack's hash (a tag): most probes of other stacks end at the slot,
   * without reading the stack's hash or span (a cache miss each).  The
   * tags are cleared at the end (the table then holds id + 1 alone). */
  unsigned idbits = 32 - (unsigned)__builtin_clz(n | 1);
  uint32_t idmask = idbits >= 32 ? UINT32_MAX : (1u << idbits) - 1;
  enum { AHEAD = 16 };
  uint32_t *map = NULL; /* old id -> new id, made at the first duplicate */
  uint32_t next = MSNAP_STACK_EMPTY + 1;  /* next new id */
  uint64_t bytes = s->nstacks > 2 ? s->stacks[2].off : 0;
  for (uint32_t i = MSNAP_STACK_EMPTY + 1; i < n; i++) {
    uint32_t k = i + AHEAD;
    if (k < n) __builtin_prefetch(&slots[hashes[k] & mask]);
    msnap_stackspan_t sp = s->stacks[i];
    uint64_t nb = stack_nbytes(s, i);
    uint32_t hv = hashes[i], h = hv & mask, dup = 0;
    uint32_t tag = hv & ~idmask;
    for (;;) {
      uint32_t e = slots[h];
      if (!e) break;
      if ((e & ~idmask) != tag) {
        h = (h + 1) & mask;
        continue;
      }
      e &= idmask;
      msnap_stackspan_t q = s->stacks[e - 1];
      /* (kept stacks are compacted: the last one ends at `bytes`) */
      uint64_t qnb = e < next ? s->stacks[e].off - q.off : bytes - q.off;
      if (hashes[e - 1] == hv && q.n == sp.n && qnb == nb &&
          memcmp(s->stack_bytes + q.off, s->stack_bytes + sp.off, nb) == 0) {
        dup = e - 1;
        break;
      }
      h = (h + 1) & mask;
    }
    if (dup) {
      if (!map) {
        map = malloc((size_t)n * sizeof *map);
        if (!map) { /* (nothing moved yet: the model is as it was) */
          free(slots);
          return MSNAP_ENOMEM;
        }
        for (uint32_t j = 0; j < i; j++) map[j] = j;
      }
      map[i] = dup;
      continue;
    }
    /* a new content: it becomes stack `next` (bytes moved down) */
    uint32_t id = next++;
    if (map) {
      map[i] = id;
      if (bytes != sp.off)
        memmove(s->stack_bytes + bytes, s->stack_bytes + sp.off, (size_t)nb);
      s->stacks[id] = (msnap_stackspan_t){bytes, sp.n};
      hashes[id] = hv;
    }
    bytes += nb;
    slots[h] = (id + 1) | tag;
  }
  if (idmask != UINT32_MAX)
    for (uint64_t j = 0; j < cap; j++) slots[j] &= idmask;
  if (map) {
    /* the bytes after the last kept stack end at `bytes` */
    s->nstacks = next;
    s->nstack_bytes = bytes;
    for (uint32_t i = 0; i < s->nsegments; i++) REMAP(s->segments[i].frames);
    for (uint32_t i = 0; i < s->nblocks; i++) REMAP(s->blocks[i].frames);
    for (uint32_t i = 0; i < s->nhost_segments; i++)
      REMAP(s->host_segments[i].frames);
    for (uint32_t i = 0; i < s->nhost_blocks; i++)
      REMAP(s->host_blocks[i].frames);
    for (uint32_t i = 0; i < s->nhistories; i++)
      REMAP(s->histories[i].frames);
    for (uint32_t d = 0; d <= s->ndevices; d++) {
      msnap_trace_list_t *l =
          d < s->ndevices ? &s->device_traces[d] : &s->host_traces;
      for (uint32_t i = 0; i < l->n; i++) {
        uint32_t f = l->v[i].frames;
        REMAP(f);
        l->v[i].frames = f;
      }
    }
    free(map);
  }
  free(t->slots);
  t->slots = slots;
  t->mask = mask;
  t->count = s->nstacks - 2;
  pr->stacks_unindexed = false;
  return 0;
}

#undef REMAP

uint32_t msnap__stack_frames(const msnap_snap_t *s, msnap_stack_t st,
                             uint32_t *out, uint32_t cap) {
  msnap_stack_iter_t it;
  msnap__stack_iter(s, st, &it);
  uint32_t n = it.left, k = 0, f;
  while (k < cap && msnap__stack_next(&it, &f)) out[k++] = f;
  return n;
}

/*
 * Intern a string-id sequence (forward_frames); 0 on ENOMEM.
 */
uint32_t msnap__snap_strlist(msnap_snap_t *s, const msnap_str_t *items,
                             uint32_t n) {
  return span_intern(s, &s->priv->strlists, &s->strlist_items,
                     &s->nstrlist_items, &s->strlist_items_cap, &s->strlists,
                     &s->nstrlists, &s->strlists_cap, &s->priv->strlist_hash,
                     &s->priv->strlist_hash_cap, items, n);
}

/* ---- records ------------------------------------------------------------- */

#define ADD_RECORD(arr, n, cap)                                               \
  do {                                                                        \
    if (GROW(s->arr, s->cap, s->n, 1) < 0) return NULL;                       \
    memset(&s->arr[s->n], 0, sizeof s->arr[0]);                               \
    return &s->arr[s->n++];                                                   \
  } while (0)

msnap_ssegment_t *msnap__snap_add_segment(msnap_snap_t *s) {
  ADD_RECORD(segments, nsegments, segments_cap);
}

msnap_sblock_t *msnap__snap_add_block(msnap_snap_t *s) {
  ADD_RECORD(blocks, nblocks, blocks_cap);
}

msnap_shistory_t *msnap__snap_add_history(msnap_snap_t *s) {
  ADD_RECORD(histories, nhistories, histories_cap);
}

msnap_sannotation_t *msnap__snap_add_annotation(msnap_snap_t *s) {
  ADD_RECORD(annotations, nannotations, annotations_cap);
}

/*
 * Grow device_traces to ndevices lists (never shrinks); new lists are
 * empty.  0 or MSNAP_ENOMEM.
 */
int msnap__snap_set_devices(msnap_snap_t *s, uint32_t ndevices) {
  if (ndevices <= s->ndevices) return 0;
  msnap_trace_list_t *nl =
      realloc(s->device_traces, (size_t)ndevices * sizeof *nl);
  if (!nl) return MSNAP_ENOMEM;
  memset(nl + s->ndevices, 0, (ndevices - s->ndevices) * sizeof *nl);
  s->device_traces = nl;
  s->ndevices = ndevices;
  return 0;
}

int msnap__snap_reserve_traces(msnap_snap_t *s, msnap_trace_list_t *l,
                               uint64_t extra) {
  (void)s;
  uint64_t need = (uint64_t)l->n + extra;
  if (need > UINT32_MAX - 1) return MSNAP_ENOMEM;
  if (need > l->cap) {
    if (need > SIZE_MAX / sizeof *l->v) return MSNAP_ENOMEM;
    msnap_strace_t *v = realloc(l->v, (size_t)need * sizeof *v);
    if (v == NULL) return MSNAP_ENOMEM;
    l->v = v;
    l->cap = (uint32_t)need;
  }
  if (extra != 0) /* l->v is still NULL when nothing was ever reserved */
    msnap__prefault(l->v + l->n, (size_t)extra * sizeof *l->v);
  return 0;
}

msnap_strace_t *msnap__snap_add_trace(msnap_snap_t *s, msnap_trace_list_t *l) {
  (void)s;
  if (msnap__grow((void **)&l->v, &l->cap, l->n, 1, sizeof *l->v) < 0)
    return NULL;
  memset(&l->v[l->n], 0, sizeof *l->v);
  return &l->v[l->n++];
}

_Static_assert(sizeof(msnap_strace_t) == 32, "a trace entry is 32 bytes");

/*
 * Intern a trace entry attribute set (0 is the all-zero set).  The last
 * one is remembered: consecutive entries mostly share theirs.
 */
uint32_t msnap__snap_tattr(msnap_snap_t *s, const msnap_tattr_t *a) {
  struct msnap_snap_priv_s *pr = s->priv;
  if (tattr_eq(&s->tattrs[pr->tattr_last], a)) return pr->tattr_last;
  if (tattr_eq(&s->tattrs[0], a)) return 0;
  if (ht_reserve(s, &pr->tattrs) < 0) return UINT32_MAX;
  uint32_t h = (uint32_t)tattr_hash(pr->seed, a) & pr->tattrs.mask;
  for (;;) {
    uint32_t v = pr->tattrs.slots[h];
    if (!v) break;
    if (tattr_eq(&s->tattrs[v - 1], a)) return pr->tattr_last = v - 1;
    h = (h + 1) & pr->tattrs.mask;
  }
  if (s->ntattrs >= MSNAP_TATTR_MAX) return UINT32_MAX;
  if (GROW(s->tattrs, s->tattrs_cap, s->ntattrs, 1) < 0) return UINT32_MAX;
  uint32_t id = s->ntattrs++;
  memset(&s->tattrs[id], 0, sizeof s->tattrs[id]);
  s->tattrs[id].stream = a->stream;
  s->tattrs[id].pool_id = a->pool_id;
  s->tattrs[id].forward_frames = a->forward_frames;
  s->tattrs[id].compile_context = a->compile_context;
  s->tattrs[id].user_metadata = a->user_metadata;
  s->tattrs[id].internal_metadata = a->internal_metadata;
  s->tattrs[id].action_str = a->action_str;
  s->tattrs[id].keys = a->keys;
  pr->tattrs.slots[h] = id + 1;
  pr->tattrs.count++;
  return pr->tattr_last = id;
}

int msnap__snap_trace_set_attr(msnap_snap_t *s, msnap_strace_t *e,
                               const msnap_tattr_t *a) {
  uint32_t id = msnap__snap_tattr(s, a);
  if (id == UINT32_MAX)
    return s->ntattrs >= MSNAP_TATTR_MAX ? MSNAP_ELIMIT : MSNAP_ENOMEM;
  e->attr = id;
  return 0;
}

/* ---- checking ------------------------------------------------------------ */

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (msg && len) snprintf(msg, len, __VA_ARGS__);                        \
      return MSNAP_ESTATE;                                                    \
    }                                                                         \
  } while (0)

static bool str_ok(const msnap_snap_t *s, msnap_str_t id) {
  return id < s->nstrings;
}
static bool stack_ok(const msnap_snap_t *s, msnap_stack_t id) {
  return id < s->nstacks;
}
static bool strlist_ok(const msnap_snap_t *s, uint32_t id) {
  return id < s->nstrlists;
}

static int check_segments(const msnap_snap_t *s, const char *what,
                          const msnap_ssegment_t *segs, uint32_t nsegs,
                          uint32_t nblocks, char *msg, size_t len) {
  for (uint32_t i = 0; i < nsegs; i++) {
    const msnap_ssegment_t *g = &segs[i];
    CHECK((uint64_t)g->first_block + g->nblocks <= nblocks,
          "%s[%u]: blocks %u+%u beyond %u blocks", what, i, g->first_block,
          g->nblocks, nblocks);
    CHECK(stack_ok(s, g->frames), "%s[%u]: stack id %u out of range", what,
          i, g->frames);
    CHECK(strlist_ok(s, g->forward_frames),
          "%s[%u]: forward_frames id %u out of range", what, i,
          g->forward_frames);
  }
  return 0;
}

static int check_blocks(const msnap_snap_t *s, const char *what,
                        const msnap_sblock_t *b, uint32_t n, char *msg,
                        size_t len) {
  for (uint32_t i = 0; i < n; i++) {
    CHECK(stack_ok(s, b[i].frames), "%s[%u]: stack id %u out of range", what,
          i, b[i].frames);
    CHECK(strlist_ok(s, b[i].forward_frames),
          "%s[%u]: forward_frames id out of range", what, i);
    CHECK((uint64_t)b[i].history.first + b[i].history.n <= s->nhistories,
          "%s[%u]: history span beyond %u entries", what, i, s->nhistories);
    CHECK(b[i].state <= MSNAP_BLOCK_UNKNOWN_STATE, "%s[%u]: state %u", what,
          i, b[i].state);
    CHECK(str_ok(s, b[i].state_str), "%s[%u]: state string out of range",
          what, i);
  }
  return 0;
}

static int check_traces(const msnap_snap_t *s, const char *what, uint32_t d,
                        const msnap_trace_list_t *l, char *msg, size_t len) {
  CHECK(l->n <= l->cap, "%s[%u]: n %u > cap %u", what, d, l->n, l->cap);
  for (uint32_t i = 0; i < l->n; i++) {
    const msnap_strace_t *t = &l->v[i];
    CHECK(stack_ok(s, t->frames), "%s[%u][%u]: stack id %u out of range",
          what, d, i, t->frames);
    CHECK(t->attr < s->ntattrs, "%s[%u][%u]: attribute set %u out of range",
          what, d, i, (unsigned)t->attr);
    CHECK(t->action < MSNAP_ACTION_COUNT || t->action == MSNAP_ACTION_UNKNOWN,
          "%s[%u][%u]: action %u", what, d, i, (unsigned)t->action);
  }
  return 0;
}

static int check_tattrs(const msnap_snap_t *s, char *msg, size_t len) {
  CHECK(s->ntattrs >= 1 && s->ntattrs <= MSNAP_TATTR_MAX,
        "%u attribute sets", s->ntattrs);
  const msnap_tattr_t *z = &s->tattrs[0];
  CHECK(!z->stream && !z->pool_id.first && !z->pool_id.second &&
            !z->forward_frames && !z->compile_context && !z->user_metadata &&
            !z->internal_metadata && !z->action_str && !z->keys,
        "attribute set 0 is not all zero");
  for (uint32_t i = 0; i < s->ntattrs; i++) {
    const msnap_tattr_t *a = &s->tattrs[i];
    CHECK(strlist_ok(s, a->forward_frames),
          "attribute set %u: forward_frames out of range", i);
    CHECK(str_ok(s, a->compile_context) && str_ok(s, a->user_metadata) &&
              str_ok(s, a->internal_metadata) && str_ok(s, a->action_str),
          "attribute set %u: string id out of range", i);
  }
  return 0;
}

/* The id the stack table gives the content of stack i (UINT32_MAX: not
 * found). */
static uint32_t stack_lookup(const msnap_snap_t *s, uint32_t i) {
  const struct msnap_snap_priv_s *pr = s->priv;
  const snap_ht_t *t = &pr->stacks;
  msnap_stackspan_t sp = s->stacks[i];
  uint64_t nb = stack_nbytes(s, i);
  uint32_t hv = (uint32_t)XXH3_64bits_withSeed(s->stack_bytes + sp.off, nb,
                                               pr->seed);
  for (uint32_t h = hv & t->mask, k = 0; k <= t->mask;
       h = (h + 1) & t->mask, k++) {
    uint32_t e = t->slots[h];
    if (!e) return UINT32_MAX;
    msnap_stackspan_t q = s->stacks[e - 1];
    if (pr->stack_hash[e - 1] == hv && q.n == sp.n &&
        stack_nbytes(s, e - 1) == nb &&
        memcmp(s->stack_bytes + q.off, s->stack_bytes + sp.off, nb) == 0)
      return e - 1;
  }
  return UINT32_MAX;
}

/* A stack decodes to exactly n ids < nframes in exactly nbytes bytes. */
static int check_stack(const msnap_snap_t *s, uint32_t i, bool deep,
                       char *msg, size_t len) {
  msnap_stackspan_t sp = s->stacks[i];
  uint64_t next = i + 1 < s->nstacks ? s->stacks[i + 1].off : s->nstack_bytes;
  CHECK(sp.off <= next && next <= s->nstack_bytes,
        "stack %u: bytes %llu..%llu out of order or beyond %llu", i,
        (unsigned long long)sp.off, (unsigned long long)next,
        (unsigned long long)s->nstack_bytes);
  CHECK(next - sp.off >= sp.n && next - sp.off <= 5 * (uint64_t)sp.n,
        "stack %u: %llu bytes for %u frames", i,
        (unsigned long long)(next - sp.off), (unsigned)sp.n);
  if (!deep) return 0;
  const unsigned char *p = s->stack_bytes + sp.off,
                      *end = s->stack_bytes + next;
  int64_t prev = 0;
  for (uint32_t k = 0; k < (uint32_t)sp.n; k++) {
    uint64_t z = 0;
    unsigned shift = 0;
    for (;;) {
      CHECK(p < end && shift < 42, "stack %u: frame %u cut or too long", i,
            k);
      unsigned char b = *p++;
      z |= (uint64_t)(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    prev += (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    CHECK(prev >= 0 && prev < (int64_t)s->nframes,
          "stack %u: frame id %lld out of range", i, (long long)prev);
  }
  CHECK(p == end, "stack %u: %u bytes left over", i, (unsigned)(end - p));
  CHECK(i <= MSNAP_STACK_EMPTY ||
            s->priv->stack_hash[i] ==
                stack_bytes_hash(s, s->stack_bytes + sp.off, next - sp.off),
        "stack %u: its stored hash is not the hash of its bytes", i);
  return 0;
}

/*
 * Verify the structural invariants listed at the top of snapshot.h.
 * Returns 0 or MSNAP_ESTATE with the first violation in msg.
 */
int msnap__snap_check_model(const msnap_snap_t *s, char *msg, size_t len) {
  return msnap__snap_check_model_level(s, true, msg, len);
}

/*
 * The same; shallow (deep false) leaves out decoding every stack's frame
 * ids (spans and byte ranges are still checked): what the reader runs on
 * each model it makes, whose stacks msnap__snap_stack encoded from frame
 * ids it had checked.
 */
int msnap__snap_check_model_level(const msnap_snap_t *s, bool deep, char *msg,
                                  size_t len) {
  int rc;
  CHECK(s && s->priv, "no model");
  CHECK(s->nstrings >= 2 && s->str_off[0] == 0 &&
            s->str_off[s->nstrings] == s->strbuf_len &&
            s->strbuf_len <= s->strbuf_cap,
        "string table header broken");
  for (uint32_t i = 0; i < s->nstrings; i++) {
    CHECK(s->str_off[i + 1] > s->str_off[i] &&
              s->strbuf[s->str_off[i + 1] - 1] == 0,
          "string %u: bad offsets", i);
  }
  for (uint32_t i = 0; i < s->nframes; i++) {
    const msnap_frame_t *f = &s->frames[i];
    CHECK(str_ok(s, f->name) && str_ok(s, f->filename) &&
              str_ok(s, f->fx_node_op) && str_ok(s, f->fx_node_name) &&
              str_ok(s, f->fx_node_target) && str_ok(s, f->fx_original_trace),
          "frame %u: string id out of range", i);
  }
  CHECK(s->nstacks >= 2 && s->stacks[0].n == 0 && s->stacks[1].n == 0,
        "stack placeholders 0/1 must be empty");
  for (uint32_t i = 0; i < s->nstacks; i++)
    if ((rc = check_stack(s, i, deep, msg, len)) < 0) return rc;
  /* interned once: each stack is found in the table under its own id */
  if (deep && !s->priv->stacks_unindexed && s->priv->stacks.slots)
    for (uint32_t i = MSNAP_STACK_EMPTY + 1; i < s->nstacks; i++)
      CHECK(stack_lookup(s, i) == i, "stack %u: found as %u in the table",
            i, stack_lookup(s, i));
  if ((rc = check_tattrs(s, msg, len)) < 0) return rc;
  for (uint32_t i = 0; i < s->nstrlists; i++) {
    msnap_span_t sp = s->strlists[i];
    CHECK((uint64_t)sp.first + sp.n <= s->nstrlist_items,
          "strlist %u: span beyond items", i);
    for (uint32_t k = 0; k < sp.n; k++)
      CHECK(str_ok(s, s->strlist_items[sp.first + k]),
            "strlist %u: string id out of range", i);
  }
  for (uint32_t i = 0; i < s->nhistories; i++)
    CHECK(stack_ok(s, s->histories[i].frames),
          "history %u: stack id out of range", i);
  if ((rc = check_segments(s, "segments", s->segments, s->nsegments,
                           s->nblocks, msg, len)) < 0)
    return rc;
  if ((rc = check_blocks(s, "blocks", s->blocks, s->nblocks, msg, len)) < 0)
    return rc;
  if ((rc = check_segments(s, "host_segments", s->host_segments,
                           s->nhost_segments, s->nhost_blocks, msg, len)) < 0)
    return rc;
  if ((rc = check_blocks(s, "host_blocks", s->host_blocks, s->nhost_blocks,
                         msg, len)) < 0)
    return rc;
  CHECK(s->ndevices == 0 || s->device_traces, "device_traces missing");
  for (uint32_t d = 0; d < s->ndevices; d++)
    if ((rc = check_traces(s, "device_traces", d, &s->device_traces[d], msg,
                           len)) < 0)
      return rc;
  if ((rc = check_traces(s, "host_traces", 0, &s->host_traces, msg, len)) < 0)
    return rc;
  for (uint32_t i = 0; i < s->nannotations; i++)
    CHECK(str_ok(s, s->annotations[i].name),
          "annotation %u: name id out of range", i);
  if (msg && len) msg[0] = 0;
  return 0;
}
