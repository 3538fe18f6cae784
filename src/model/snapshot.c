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
 *   - Stacks are spans of stack_frames; id 0 = absent, id 1 = [] (both
 *     placeholders with n == 0); equal frame sequences give equal ids.
 *   - String lists (forward_frames) are spans of strlist_items; id 0 is the
 *     absent placeholder.
 *   - Record arrays (segments, blocks, ...) only grow; pointers returned by
 *     msnap__snap_add_* are valid until the next add of the same kind.
 *
 * Hash tables are open-addressing arrays of (id + 1), 0 = empty slot, kept
 * at most half full; hashes are XXH3 of the interned content with a
 * per-model random seed (so a hostile file cannot pick colliding strings
 * in advance).  Strings and frames are hashed again on growth; stacks and
 * string lists (long spans) keep the low 32 bits of their hash in an
 * array by id (4 bytes each) that growth and probes use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "model/pickle.h"

typedef struct snap_ht_s {
  uint32_t *slots;
  uint32_t mask; /* capacity - 1; capacity is a power of two */
  uint32_t count;
} snap_ht_t;

struct msnap_snap_priv_s {
  snap_ht_t strings, frames, stacks, strlists;
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
  uint32_t w[8];
  w[0] = f->name;
  w[1] = f->filename;
  w[2] = (uint32_t)f->line;
  w[3] = (uint32_t)((uint64_t)f->line >> 32);
  w[4] = f->fx_node_op;
  w[5] = f->fx_node_name;
  w[6] = f->fx_node_target;
  w[7] = f->fx_original_trace;
  return XXH3_64bits_withSeed(w, sizeof w, seed);
}

static bool frame_eq(const msnap_frame_t *a, const msnap_frame_t *b) {
  return a->name == b->name && a->filename == b->filename &&
         a->line == b->line && a->fx_node_op == b->fx_node_op &&
         a->fx_node_name == b->fx_node_name &&
         a->fx_node_target == b->fx_node_target &&
         a->fx_original_trace == b->fx_original_trace;
}

static uint64_t span_hash(uint64_t seed, const uint32_t *v, uint32_t n) {
  return XXH3_64bits_withSeed(v, (size_t)n * sizeof *v, seed);
}

/* A random seed (getrandom, else address/time/pid mixing). */
uint64_t msnap__hash_seed(void) {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    seed = (uint64_t)(uintptr_t)&seed ^ (uint64_t)ts.tv_nsec ^
           ((uint64_t)getpid() << 32);
  }
  return XXH3_64bits(&seed, sizeof seed);
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
  if (!t->slots || (uint64_t)(t->count + 1) * 2 > (uint64_t)t->mask + 1)
    return ht_grow(s, t);
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
  if (!s->priv || !s->strbuf || !s->str_off || !s->stacks || !s->strlists) {
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
  s->stacks[0] = (msnap_span_t){0, 0};
  s->stacks[1] = (msnap_span_t){0, 0};
  s->nstacks = 2;
  s->strlists[0] = (msnap_span_t){0, 0};
  s->nstrlists = 1;
  s->generation = MSNAP_GEN_CURRENT;
  s->allocator_settings.kind = MSNAP_GV_NONE;
  /* "" must be found by interning too */
  struct msnap_snap_priv_s *pr = s->priv;
  pr->seed = msnap__hash_seed();
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
    free(s->priv->stack_hash);
    free(s->priv->strlist_hash);
    free(s->priv);
  }
  free(s->strbuf);
  free(s->str_off);
  free(s->frames);
  free(s->stack_frames);
  free(s->stacks);
  free(s->strlists);
  free(s->strlist_items);
  free(s->segments);
  free(s->blocks);
  free(s->histories);
  for (uint32_t i = 0; i < s->ndevices; i++) free(s->device_traces[i].v);
  free(s->device_traces);
  free(s->annotations);
  msnap__gv_free(&s->allocator_settings);
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

/*
 * Intern len bytes at p (any bytes, NUL included).  Returns the id, or 0
 * on ENOMEM.  The string buffer may move: pointers from msnap__snap_str
 * are invalidated by this call.
 */
msnap_str_t msnap__snap_intern(msnap_snap_t *s, const char *p, size_t len) {
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
 * Intern a frame by its seven fields.  UINT32_MAX on ENOMEM.
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

/*
 * Intern a frame-id sequence; MSNAP_STACK_EMPTY for n == 0, 0 on ENOMEM.
 */
msnap_stack_t msnap__snap_stack(msnap_snap_t *s, const uint32_t *frame_ids,
                                uint32_t n) {
  if (n == 0) return MSNAP_STACK_EMPTY;
  return span_intern(s, &s->priv->stacks, &s->stack_frames,
                     &s->nstack_frames, &s->stack_frames_cap, &s->stacks,
                     &s->nstacks, &s->stacks_cap, &s->priv->stack_hash,
                     &s->priv->stack_hash_cap, frame_ids, n);
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
    CHECK(strlist_ok(s, t->forward_frames),
          "%s[%u][%u]: forward_frames out of range", what, d, i);
    CHECK(str_ok(s, t->compile_context) && str_ok(s, t->user_metadata) &&
              str_ok(s, t->internal_metadata) && str_ok(s, t->action_str),
          "%s[%u][%u]: string id out of range", what, d, i);
    CHECK(t->action < MSNAP_ACTION_COUNT || t->action == MSNAP_ACTION_UNKNOWN,
          "%s[%u][%u]: action %u", what, d, i, t->action);
  }
  return 0;
}

/*
 * Verify the structural invariants listed at the top of snapshot.h.
 * Returns 0 or MSNAP_ESTATE with the first violation in msg.
 */
int msnap__snap_check_model(const msnap_snap_t *s, char *msg, size_t len) {
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
  for (uint32_t i = 0; i < s->nstacks; i++) {
    msnap_span_t sp = s->stacks[i];
    CHECK((uint64_t)sp.first + sp.n <= s->nstack_frames,
          "stack %u: span %u+%u beyond %u", i, sp.first, sp.n,
          s->nstack_frames);
    for (uint32_t k = 0; k < sp.n; k++)
      CHECK(s->stack_frames[sp.first + k] < s->nframes,
            "stack %u: frame id %u out of range", i,
            s->stack_frames[sp.first + k]);
  }
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
