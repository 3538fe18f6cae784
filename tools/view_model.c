/*
 * view_model.c -- the data of `memsnap view`: for each input file one JSON
 * object, computed here in a few bounded passes over each device trace and
 * cut to a byte budget, so that a snapshot of a gigabyte gives a page of a
 * few tens of megabytes that a browser opens in seconds (level of detail).
 *
 * Positions.  A device trace has n entries, numbered from 0 as in the
 * file's device_traces[d] list.  A *state* s in 0..n is the allocator
 * state after entries 0..s-1 (s = 0: before entry 0, the start of the
 * trace; s = n: the final state of the file).  Every position below is a
 * state; the viewer labels state s > 0 "after entry s-1".
 *
 * Object of one file (arrays of records are written column by column):
 *   file, generation, settings: ["key=value"...], budget (bytes), lod
 *   (true when something was left out to meet the budget),
 *   devices: [{
 *     device, n, t0 (time_us of entry 0, or null),
 *     series: {w, a0, r0, amax, aat, rmax, rat}: bucket k covers states
 *       k*w+1 .. (k+1)*w; amax = the most active bytes (requested bytes of
 *       live allocations) in it, aat = the state of that maximum; r* the
 *       same for reserved bytes (segments).  w = 1 up to VM_MAX_BUCKETS
 *       entries: then every state is exact.  (The bytes at aat not drawn
 *       as bands, the "smaller ones" band, are amax less the bands live
 *       at aat: the viewer computes them, so the series does not change
 *       with the bands kept.)
 *     bands / segbands: {total, start, end, size, stack, addr, pre, site,
 *       dur}: the allocations (alloc .. free_completed) that weigh most
 *       (band_weight: live at the active peak, then bytes x states alive)
 *       / the largest segments (segment_alloc or _map .. segment_free or
 *       _unmap), ordered
 *       by start (the stacking order of PyTorch's Active Memory Timeline);
 *       start = first state holding it (0 when it predates the trace, pre
 *       = 1), end = first state without it (-1: alive at the end), size =
 *       requested bytes, site = index in leaks or -1, dur = lifetime
 *       in microseconds or -1.  total = allocations in the trace.  At
 *       most `detail` of each, as many as the budget takes.
 *     windows: [{first, count, kf: {segs: [addr, size, stream]...,
 *       blocks: [addr, requested, pending, stack, alloc entry]...},
 *       ev: {a, addr, size, stack, t, stream}}]: the trace entries kept
 *       (all of them when they fit the budget), in runs; kf is the state
 *       at `first`, ev the entries first .. first+count-1 (t: time_us - t0).
 *       Two windows may meet (the second's key frame is then the first's
 *       end state; see Budget).
 *     ooms: [[entry, requested, device_free, stack, active, reserved]]
 *       (an oom entry's `addr` field is device_free in PyTorch),
 *     annotations: {names, ranges: [name, s0, s1]..., dropped}
 *       (record_function START/END pairs, placed at the first entry at or
 *       after their time_us),
 *     steps: {name, ranges: [s0, s1]..., from_device (the device whose
 *       annotations gave the steps when this one has none, else null)}
 *       | null, leaks: [[site,
 *       confidence, first_bytes, last_bytes, steps_grown, steps_shrunk,
 *       allocations of the site in the trace]...] (the candidates of
 *       `memsnap leaks` over these steps, at most VM_MAX_LEAK_SITES),
 *       leak_total (the number of candidates), steps_why (why there
 *       are no steps, the no_steps_reason of `memsnap leaks`, else null),
 *     segments: [[addr, size, stream, [[addr, size, state, requested,
 *       stack, alloc entry (-1 unknown, -2 before the trace)]...]]...]
 *       (the final state), sites: [[site, bytes, count]...] (the top
 *       allocation sites by live bytes at the end, as `memsnap summary`)
 *   }],
 *   strings: the distinct texts of the frames, each once (a name's head,
 *   a filename's tail, cut to CLI_TEXT_CAP bytes),
 *   frames: [[name, filename, line, user]...] (name and filename: indexes
 *   in strings; user: 1 for a frame of the user's own code,
 *   cli_frame_is_user), nodes: [parent, frame, ...]:
 *   stacks as a trie; node k (1-based) is frames[nodes[2k-1]] called from
 *   node nodes[2k-2] (0: outermost), so a stack is one node id (0: none).
 *
 * Budget.  The budget bounds the bytes written, counted, not estimated.
 * The series, the final state, OOMs, annotations and leaks are always
 * written.  The rest comes from one order of items that does not depend
 * on the budget (choice_order): the `detail` allocations that weigh most
 * and the largest segments, heaviest first, interleaved with the trace's
 * tiles of VM_TILE
 * entries by priority (OOMs, the end, the peaks, the start, then spread
 * evenly) so that bands take about VM_BAND_SHARE of it.  Level L keeps
 * the first L items; a tile continues the window of the tile before it
 * when that one came earlier in the order, else it opens a window with
 * its own key frame, so a higher level only adds bytes.  Each device takes
 * the highest level whose page, written to a byte counter (its object and
 * what its stacks add to the string table and trie), fits its share of
 * the budget (a search: the whole page, then guesses between the levels
 * measured, bisections among them).  The fixed parts are written first
 * (before the bands and windows), so their trie ids and bytes are
 * measured once.  So a larger budget never keeps fewer entries or bands
 * or gives a smaller page, and the page exceeds the budget only when its
 * fixed parts alone do (the CLI's note).  Memory: the model, every stack
 * seen as one trie (gtrie_t), the live records of one pass, one key
 * frame, and arrays of the kept parts' size.
 *
 * Leaks.  Steps are the ranges of one repeated annotation (the most
 * frequent non-overlapping name, digits at its end ignored, at least 3
 * times, ties to the one covering more; or --step NAME; cli_steps.c).
 * The leak sites are exactly the candidates of `memsnap leaks` on the
 * same file and step name (cli_leaks_steps, confidence >= 0.7: sites
 * whose live requested bytes at the step ends grow step after step); a
 * band is a leak band when it is a trace allocation of such a site.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "view_model.h"

#define VM_MAX_BUCKETS 32768u
#define VM_TILE 4096u
#define VM_BAND_SHARE 0.30
#define VM_SEGBAND_SHARE 0.05
#define VM_MAX_OOMS 1000u
#define VM_MAX_RANGES 50000u
#define VM_MAX_SITES 12u
#define VM_MAX_LEAK_SITES 50u
#define NONE32 UINT32_MAX

/* ---- u64 -> u32 hash map (linear probing, backward-shift delete) ------- */
typedef struct umap_s {
  uint64_t *k;
  uint32_t *v; /* NONE32 = empty slot */
  uint32_t cap, n;
} umap_t;

static void um_free(umap_t *m) {
  free(m->k);
  free(m->v);
  memset(m, 0, sizeof *m);
}

static int um_rehash(umap_t *m, uint32_t cap) {
  uint64_t *k = malloc((size_t)cap * sizeof *k);
  uint32_t *v = malloc((size_t)cap * sizeof *v);
  if (!k || !v) {
    free(k);
    free(v);
    return -1;
  }
  memset(v, 0xff, (size_t)cap * sizeof *v);
  for (uint32_t i = 0; i < m->cap; i++) {
    if (m->v[i] == NONE32)
      continue;
    uint32_t h = (uint32_t)msnap__mix64(m->k[i]) & (cap - 1);
    while (v[h] != NONE32)
      h = (h + 1) & (cap - 1);
    k[h] = m->k[i];
    v[h] = m->v[i];
  }
  free(m->k);
  free(m->v);
  m->k = k;
  m->v = v;
  m->cap = cap;
  return 0;
}

static uint32_t um_get(const umap_t *m, uint64_t key) {
  if (!m->cap)
    return NONE32;
  uint32_t h = (uint32_t)msnap__mix64(key) & (m->cap - 1);
  while (m->v[h] != NONE32) {
    if (m->k[h] == key)
      return m->v[h];
    h = (h + 1) & (m->cap - 1);
  }
  return NONE32;
}

/* Insert or replace.  0, or -1 on ENOMEM. */
static int um_put(umap_t *m, uint64_t key, uint32_t val) {
  if ((m->n + 1) * 2 > m->cap && um_rehash(m, m->cap ? m->cap * 2 : 64))
    return -1;
  uint32_t h = (uint32_t)msnap__mix64(key) & (m->cap - 1);
  while (m->v[h] != NONE32) {
    if (m->k[h] == key) {
      m->v[h] = val;
      return 0;
    }
    h = (h + 1) & (m->cap - 1);
  }
  m->k[h] = key;
  m->v[h] = val;
  m->n++;
  return 0;
}

static void um_del(umap_t *m, uint64_t key) {
  if (!m->cap)
    return;
  uint32_t mask = m->cap - 1, h = (uint32_t)msnap__mix64(key) & mask;
  while (m->v[h] != NONE32 && m->k[h] != key)
    h = (h + 1) & mask;
  if (m->v[h] == NONE32)
    return;
  m->v[h] = NONE32;
  m->n--;
  /* Backward shift: move later members of the run into the hole. */
  for (uint32_t j = (h + 1) & mask; m->v[j] != NONE32; j = (j + 1) & mask) {
    uint32_t home = (uint32_t)msnap__mix64(m->k[j]) & mask;
    bool move = h <= j ? (home <= h || home > j) : (home <= h && home > j);
    if (move) {
      m->k[h] = m->k[j];
      m->v[h] = m->v[j];
      m->v[j] = NONE32;
      h = j;
    }
  }
}

/* ---- live blocks / segments of one state -------------------------------- */
typedef struct lrec_s {
  uint64_t addr, size;
  int64_t stream;
  msnap_stack_t stack; /* model stack id */
  uint32_t rank;       /* index among the drawn bands, NONE32 = not drawn */
  uint32_t entry;      /* alloc entry, NONE32 = before the trace          */
  uint32_t rid;        /* record id: k for the k-th live at the start,
                          (live at the start) + entry for the trace's     */
  uint8_t pending, inuse;
} lrec_t;

typedef struct live_s {
  umap_t m; /* addr -> index in r */
  lrec_t *r;
  uint32_t nr, capr;
  uint32_t *fl; /* free indices of r */
  uint32_t nfl;
} live_t;

static void live_free(live_t *l) {
  um_free(&l->m);
  free(l->r);
  free(l->fl);
  memset(l, 0, sizeof *l);
}

static lrec_t *live_get(live_t *l, uint64_t addr) {
  uint32_t i = um_get(&l->m, addr);
  return i == NONE32 ? NULL : &l->r[i];
}

static void live_del(live_t *l, uint64_t addr) {
  uint32_t i = um_get(&l->m, addr);
  if (i == NONE32)
    return;
  um_del(&l->m, addr);
  l->r[i].inuse = 0;
  l->fl[l->nfl++] = i;
}

/* Insert (replacing a record at the same address).  NULL on ENOMEM. */
static lrec_t *live_put(live_t *l, const lrec_t *rec) {
  live_del(l, rec->addr);
  uint32_t i;
  if (l->nfl) {
    i = l->fl[--l->nfl];
  } else {
    if (l->nr == l->capr) {
      uint32_t cap = l->capr ? l->capr * 2 : 256;
      lrec_t *r = realloc(l->r, (size_t)cap * sizeof *r);
      uint32_t *fl = realloc(l->fl, (size_t)cap * sizeof *fl);
      if (r)
        l->r = r;
      if (fl)
        l->fl = fl;
      if (!r || !fl)
        return NULL;
      l->capr = cap;
    }
    i = l->nr++;
  }
  if (um_put(&l->m, rec->addr, i)) {
    l->fl[l->nfl++] = i;
    return NULL;
  }
  l->r[i] = *rec;
  l->r[i].inuse = 1;
  return &l->r[i];
}

/* ---- stacks as a trie of (caller node, frame) ---------------------------- */
/* Frames refer to a table of distinct strings (each frame's name cut to
 * its head, its filename to its tail, CLI_TEXT_CAP bytes): a long string
 * that many frames share goes in the page once. */
/* Every stack seen, as one trie of (caller, model frame) shared by a file's
 * tries: node g (1-based; 0 the root) is frame[g] called from parent[g]. */
typedef struct gtrie_s {
  uint32_t *parent, *frame;
  uint32_t *child; /* a node's first child (0: none) */
  uint32_t n, cap; /* nodes; room in the three arrays */
  uint64_t cap_parent, cap_frame, cap_child;
  umap_t h;       /* (parent << 32 | model frame) -> node, for the other
                     children: most nodes have one (a path that does not
                     branch), found or added without a probe of h */
  uint32_t *of;   /* model stack -> node + 1, 0 = not seen yet */
  uint32_t *chain; /* scratch of trie_stack: nodes up from a stack's */
  uint32_t chcap;
} gtrie_t;

static void gtrie_free(gtrie_t *g) {
  free(g->parent);
  free(g->frame);
  free(g->child);
  um_free(&g->h);
  free(g->of);
  free(g->chain);
}

/* The node of model stack st (0: none or empty); NONE32 on ENOMEM. */
static uint32_t gtrie_stack(gtrie_t *g, const msnap_snap_t *s,
                            msnap_stack_t st) {
  if (st == MSNAP_STACK_ABSENT || st >= s->nstacks)
    return 0;
  if (g->of[st])
    return g->of[st] - 1;
  uint32_t n;
  const uint32_t *fr = cli_stack(s, st, &n);
  uint32_t p = 0;
  for (uint32_t k = n; fr && k > 0; k--) {
    uint32_t f = fr[k - 1];
    if (f >= s->nframes)
      continue;
    uint64_t key = (uint64_t)p << 32 | f;
    uint32_t first = g->cap ? g->child[p] : 0, id;
    if (first && g->frame[first] == f)
      id = first;
    else
      id = first ? um_get(&g->h, key) : NONE32;
    if (id == NONE32) {
      if (g->n + 1 >= g->cap) {
        uint32_t cap = g->cap ? g->cap * 2 : 1024;
        if (MSNAP_GROW(g->parent, g->cap_parent, cap) != 0 ||
            MSNAP_GROW(g->frame, g->cap_frame, cap) != 0 ||
            MSNAP_GROW(g->child, g->cap_child, cap) != 0)
          return NONE32;
        if (g->cap == 0)
          g->child[0] = 0; /* the root */
        g->cap = cap;
      }
      if (first && um_put(&g->h, key, g->n + 1))
        return NONE32;
      id = ++g->n;
      g->parent[id] = p;
      g->frame[id] = f;
      g->child[id] = 0;
      if (!first)
        g->child[p] = id;
    }
    p = id;
  }
  g->of[st] = p + 1;
  return p;
}

typedef struct trie_s {
  const msnap_snap_t *s;
  gtrie_t *g;     /* the stacks, shared */
  uint32_t *node; /* pairs: parent node, output frame */
  uint32_t n, cap;
  uint32_t *loc;  /* node of g -> output node, 0 = not written yet */
  uint32_t lcap;
  uint32_t *fout; /* model frame -> output frame + 1 */
  uint32_t *flist; /* output frame -> model frame */
  uint32_t *fstr;  /* output frame -> name string, filename string */
  uint32_t nf;
  uint64_t *sref; /* output string -> model string << 1 | tail */
  uint32_t ns, scap;
  umap_t sh;      /* hash of a string's text -> output string */
  uint64_t bytes; /* of the strings, frames and nodes as written, each
                     with a comma (one too many per non-empty array) */
} trie_t;

static unsigned digits(uint64_t v) {
  unsigned d = 1;
  while (v >= 10) {
    v /= 10;
    d++;
  }
  return d;
}

/* Bytes of p[0..n) as a JSON string of the page (base/json.c's escapes,
 * MSNAP_JSON_HTML), quotes included. */
static uint64_t json_str_len(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  uint64_t len = 2;
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' &&
        c != '>' && c != '&') {
      len++;
      i++;
      continue;
    }
    size_t bad = 0, seq = c >= 0x80 ? msnap__utf8_seq(p + i, n - i, &bad) : 0;
    if (seq > 0) {
      len += seq;
      i += seq;
    } else if (c >= 0x80) {
      len += 3; /* U+FFFD */
      i += bad;
    } else {
      len += c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' ? 2 : 6;
      i++;
    }
  }
  return len;
}

static int trie_init(trie_t *t, const msnap_snap_t *s, gtrie_t *g) {
  memset(t, 0, sizeof *t);
  t->s = s;
  t->g = g;
  t->fout = calloc((size_t)s->nframes + 1, sizeof *t->fout);
  t->flist = calloc((size_t)s->nframes + 1, sizeof *t->flist);
  t->fstr = calloc(2 * ((size_t)s->nframes + 1), sizeof *t->fstr);
  return t->fout && t->flist && t->fstr ? 0 : -1;
}

static void trie_free(trie_t *t) {
  free(t->node);
  free(t->loc);
  free(t->fout);
  free(t->flist);
  free(t->fstr);
  free(t->sref);
  um_free(&t->sh);
}

static void *dup_mem(const void *p, size_t n) {
  void *q = malloc(n ? n : 1);
  if (q && n)
    memcpy(q, p, n);
  return q;
}

static int um_copy(umap_t *dst, const umap_t *src) {
  memset(dst, 0, sizeof *dst);
  if (!src->cap)
    return 0;
  dst->k = dup_mem(src->k, (size_t)src->cap * sizeof *src->k);
  dst->v = dup_mem(src->v, (size_t)src->cap * sizeof *src->v);
  dst->cap = src->cap;
  dst->n = src->n;
  return dst->k && dst->v ? 0 : -1;
}

/* dst = a copy of src (a scratch trie to measure a choice in). */
static int trie_copy(trie_t *dst, const trie_t *src) {
  const msnap_snap_t *s = src->s;
  *dst = *src;
  dst->node = dup_mem(src->node, (size_t)src->cap * 2 * sizeof *src->node);
  dst->loc = dup_mem(src->loc, (size_t)src->lcap * sizeof *src->loc);
  dst->fout = dup_mem(src->fout, ((size_t)s->nframes + 1) * sizeof *src->fout);
  dst->flist = dup_mem(src->flist,
                       ((size_t)s->nframes + 1) * sizeof *src->flist);
  dst->fstr = dup_mem(src->fstr,
                      2 * ((size_t)s->nframes + 1) * sizeof *src->fstr);
  dst->sref = dup_mem(src->sref, (size_t)src->scap * sizeof *src->sref);
  int b = um_copy(&dst->sh, &src->sh);
  if (b || !dst->node || !dst->loc || !dst->fout || !dst->flist ||
      !dst->fstr || !dst->sref)
    return -1;
  return 0;
}

/* A string of a frame as written: a name's head, a filename's tail, cut
 * to CLI_TEXT_CAP bytes (cli_text_cap); out holds CLI_TEXT_CAP + 3. */
static size_t trie_text(const msnap_snap_t *s, uint64_t ref, char *out) {
  size_t l;
  const char *p = cli_str(s, (uint32_t)(ref >> 1), &l);
  return cli_text_cap(p, l, ref & 1, out);
}

/* Output string of model string str (tail: a filename); NONE32 on ENOMEM. */
static uint32_t trie_string(trie_t *t, uint32_t str, bool tail) {
  char a[CLI_TEXT_CAP + 3], b[CLI_TEXT_CAP + 3];
  uint64_t ref = (uint64_t)str << 1 | (tail ? 1u : 0u);
  size_t n = trie_text(t->s, ref, a);
  uint64_t hsh = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    hsh = (hsh ^ (unsigned char)a[i]) * 1099511628211ull;
  uint32_t k = um_get(&t->sh, hsh);
  if (k != NONE32) {
    size_t m = trie_text(t->s, t->sref[k], b);
    if (m == n && memcmp(a, b, n) == 0)
      return k;
  }
  if (MSNAP_GROW(t->sref, t->scap, (uint64_t)t->ns + 1) != 0)
    return NONE32;
  t->sref[t->ns] = ref;
  t->bytes += json_str_len(a, n) + 1;
  /* a different text of the same hash keeps the first in the map */
  if (k == NONE32 && um_put(&t->sh, hsh, t->ns))
    return NONE32;
  return t->ns++;
}

/* Output node id of a model stack (0: none or empty); NONE32 on ENOMEM.
 * Ids are given in the order the stacks are first written, a caller
 * before its callees: the nodes of g not yet written on the way from the
 * stack's node to the root are numbered outermost first. */
static uint32_t trie_stack(trie_t *t, msnap_stack_t st) {
  gtrie_t *g = t->g;
  uint32_t gid = gtrie_stack(g, t->s, st);
  if (gid == NONE32)
    return NONE32;
  if (gid == 0)
    return 0;
  if (gid < t->lcap && t->loc[gid])
    return t->loc[gid];
  if (g->n + 1 > t->lcap) {
    uint32_t cap = t->lcap ? t->lcap : 1024;
    while (cap < g->n + 1)
      cap *= 2;
    uint32_t *v = realloc(t->loc, (size_t)cap * sizeof *v);
    if (!v)
      return NONE32;
    memset(v + t->lcap, 0, (size_t)(cap - t->lcap) * sizeof *v);
    t->loc = v;
    t->lcap = cap;
  }
  /* the unwritten nodes up from gid (each written node's callers are) */
  uint32_t top = gid, depth = 0;
  while (top && !t->loc[top]) {
    if (MSNAP_GROW(g->chain, g->chcap, (uint64_t)depth + 1) != 0)
      return NONE32;
    g->chain[depth++] = top;
    top = g->parent[top];
  }
  if (t->n + depth > t->cap) {
    uint32_t cap = t->cap ? t->cap : 1024;
    while (cap < t->n + depth)
      cap *= 2;
    uint32_t *v = realloc(t->node, (size_t)cap * 2 * sizeof *v);
    if (!v)
      return NONE32;
    t->node = v;
    t->cap = cap;
  }
  /* number them outermost first: node ids n+1 .. n+depth, from the top */
  uint32_t p = top ? t->loc[top] : 0, base = t->n;
  for (uint32_t k = 1; k <= depth; k++) {
    uint32_t x = g->chain[depth - k]; /* numbered base + k */
    t->loc[x] = base + k;
    uint32_t f = g->frame[x];
    if (!t->fout[f]) {
      uint32_t a = trie_string(t, t->s->frames[f].name, false);
      uint32_t b = a == NONE32 ? NONE32
                               : trie_string(t, t->s->frames[f].filename, true);
      if (b == NONE32)
        return NONE32;
      t->flist[t->nf] = f;
      t->fstr[2 * t->nf] = a;
      t->fstr[2 * t->nf + 1] = b;
      t->fout[f] = ++t->nf;
      int64_t line = t->s->frames[f].line;
      /* [a,b,line,user], */
      t->bytes += digits(a) + digits(b) + (line < 0) +
                  digits(line < 0 ? 0u - (uint64_t)line : (uint64_t)line) + 7;
    }
    uint32_t fo = t->fout[f] - 1;
    t->node[2 * (base + k - 1)] = p;
    t->node[2 * (base + k - 1) + 1] = fo;
    t->bytes += digits(p) + digits(fo) + 2;
    p = base + k;
  }
  t->n = base + depth;
  return t->loc[gid];
}

/* "strings", "frames", "nodes" of the trie (the end of a file's object). */
static void trie_write(const trie_t *t, cli_json_t *j) {
  char cut[CLI_TEXT_CAP + 3];
  cj_key(j, "strings");
  cj_arr(j);
  for (uint32_t i = 0; i < t->ns; i++)
    cj_str(j, cut, trie_text(t->s, t->sref[i], cut));
  cj_arr_end(j);
  cj_key(j, "frames");
  cj_arr(j);
  for (uint32_t i = 0; i < t->nf; i++) {
    cj_arr(j);
    cj_u64(j, t->fstr[2 * i]);
    cj_u64(j, t->fstr[2 * i + 1]);
    cj_i64(j, t->s->frames[t->flist[i]].line);
    cj_u64(j, cli_frame_is_user(t->s, t->flist[i]) ? 1 : 0);
    cj_arr_end(j);
  }
  cj_arr_end(j);
  cj_key(j, "nodes");
  cj_arr(j);
  for (uint32_t i = 0; i < 2 * t->n; i++)
    cj_u64(j, t->node[i]);
  cj_arr_end(j);
}

/* ---- counting what would be written ----------------------------------- */
/* A JSON writer that only counts bytes (the page's, MSNAP_JSON_HTML). */
static int count_cb(void *opaque, const void *p, size_t len) {
  (void)opaque;
  (void)p;
  (void)len;
  return 0;
}

static int counter_init(cli_json_t *j) {
  memset(j, 0, sizeof *j);
  if (msnap__sink_init_cb(&j->sink, count_cb, NULL) != 0)
    return -1;
  msnap__json_init(&j->w, &j->sink, MSNAP_JSON_HTML);
  return 0;
}

static void counter_free(cli_json_t *j) { (void)msnap__sink_finish(&j->sink); }

/* Bytes of trie_write(t) (with the comma before its first key). */
static int64_t trie_bytes(const trie_t *t) {
  cli_json_t c;
  if (counter_init(&c))
    return -1;
  cj_obj(&c);
  cj_key(&c, "x");
  cj_null(&c);
  uint64_t b0 = c.sink.bytes;
  trie_write(t, &c);
  int64_t n = (int64_t)(c.sink.bytes - b0);
  counter_free(&c);
  return n;
}

/* ---- top-N by size (a min-heap) ----------------------------------------- */
typedef struct hitem_s {
  uint64_t size;
  uint32_t id;
} hitem_t;

typedef struct heap_s {
  hitem_t *v;
  uint32_t n, cap;
} heap_t;

/* a ranks below b: smaller, or as large and later. */
static bool h_less(hitem_t a, hitem_t b) {
  return a.size < b.size || (a.size == b.size && a.id > b.id);
}

static void h_down(heap_t *h, uint32_t i) {
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && h_less(h->v[l], h->v[m]))
      m = l;
    if (r < h->n && h_less(h->v[r], h->v[m]))
      m = r;
    if (m == i)
      return;
    hitem_t x = h->v[i];
    h->v[i] = h->v[m];
    h->v[m] = x;
    i = m;
  }
}

static void h_push(heap_t *h, uint64_t size, uint32_t id) {
  hitem_t it = {size, id};
  if (h->cap == 0)
    return;
  if (h->n < h->cap) {
    uint32_t i = h->n++;
    h->v[i] = it;
    while (i > 0 && h_less(h->v[i], h->v[(i - 1) / 2])) {
      hitem_t x = h->v[i];
      h->v[i] = h->v[(i - 1) / 2];
      h->v[(i - 1) / 2] = x;
      i = (i - 1) / 2;
    }
  } else if (h_less(h->v[0], it)) {
    h->v[0] = it;
    h_down(h, 0);
  }
}

static int cmp_hitem_desc(const void *a, const void *b) {
  hitem_t x = *(const hitem_t *)a, y = *(const hitem_t *)b;
  return h_less(y, x) ? -1 : h_less(x, y) ? 1 : 0;
}

static int cmp_hitem_id(const void *a, const void *b) {
  uint32_t x = ((const hitem_t *)a)->id, y = ((const hitem_t *)b)->id;
  return x < y ? -1 : x > y;
}

/* ---- bands of one kind ---------------------------------------------------- */
/* The candidates are the `detail` largest elements; the k largest of them
 * are drawn (k chosen by the budget). */
typedef struct bands_s {
  heap_t heap;
  uint32_t *id;   /* candidate element ids, increasing (= start order) */
  uint32_t *rank; /* of each candidate: its rank by size, 0 = largest   */
  uint32_t n;     /* candidates                                       */
  uint32_t k;     /* drawn: the candidates of rank < k                 */
  uint64_t total;
  int64_t *end;
} bands_t;

static void bands_free(bands_t *b) {
  free(b->heap.v);
  free(b->id);
  free(b->rank);
  free(b->end);
}

/* ---- the per-device context ----------------------------------------------- */
typedef struct kf_s {
  uint32_t first, count;
  lrec_t *segs, *blocks;
  uint32_t nsegs, nblocks;
} kf_t;

typedef struct vdev_s {
  const msnap_snap_t *s;
  const vm_opts_t *o;
  trie_t *t;
  cli_stacks_t *stk;
  int64_t dev;
  const msnap_trace_list_t *tl;
  uint32_t n;
  cli_state_t st;             /* state at the start of the trace */
  msnap_stack_t *prestack;    /* stacks of st.b */
  bands_t blk, seg;
  /* series */
  uint32_t w, nb;
  uint64_t a0, r0;
  uint64_t *amax, *rmax;
  uint32_t *aat, *rat;
  /* pass A */
  uint32_t peak_a, peak_r; /* states */
  uint32_t *ooms;
  uint32_t nooms;
  uint64_t *oom_a, *oom_r;
  uint32_t *tile_live; /* live blocks + segments at each tile start */
  uint32_t ntiles;
  uint32_t *torder; /* tiles by priority */
  uint32_t *trank;  /* of each tile: its place in torder */
  uint8_t *item;    /* the choice order: 0 band, 1 segment band, 2 tile */
  double *icost;    /* rough bytes of the first L items, L = 0..nitems */
  uint32_t nitems;
  /* rel[i]: the record (rid) entry i frees, marks pending or replaces at
   * its address, NONE32 for none: found once (pass_b), so that the key
   * frames of each level are made by a pass without address lookups */
  uint32_t *rel;
  /* a level being measured: stop writing windows once the counter's bytes
   * and the trie's growth (t->bytes - tbase) pass `limit` (0: never) */
  uint64_t limit, tbase;
  bool aborted;
  /* windows */
  kf_t *win;
  uint32_t nwin;
  /* annotations */
  uint32_t *rg; /* name str, s0, s1 */
  uint32_t nrg, rg_dropped;
  uint32_t *steps; /* s0, s1 pairs */
  uint32_t nsteps;
  char stepname[128];
  cli_leaks_t leaks; /* the candidates of `memsnap leaks` */
} vdev_t;

static void dev_free(vdev_t *d) {
  cli_state_free(&d->st);
  free(d->prestack);
  bands_free(&d->blk);
  bands_free(&d->seg);
  free(d->amax);
  free(d->rmax);
  free(d->aat);
  free(d->rat);
  free(d->ooms);
  free(d->oom_a);
  free(d->oom_r);
  free(d->tile_live);
  free(d->torder);
  free(d->trank);
  free(d->item);
  free(d->icost);
  free(d->rel);
  for (uint32_t i = 0; i < d->nwin; i++) {
    free(d->win[i].segs);
    free(d->win[i].blocks);
  }
  free(d->win);
  free(d->rg);
  free(d->steps);
  cli_leaks_free(&d->leaks);
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a >= b ? a - b : 0; }

static uint64_t pre_size(const cli_lblock_t *b) {
  return b->requested ? b->requested : b->size;
}

/* Stacks of the blocks live at the start (cli_start_stacks). */
static int prestacks(vdev_t *d) {
  d->prestack = calloc((size_t)d->st.nb + 1, sizeof *d->prestack);
  if (!d->prestack)
    return -1;
  cli_start_stacks(d->s, d->stk, d->dev, &d->st, d->prestack);
  return 0;
}

/* Pass A: the largest allocations and segments, the peaks, the OOM
 * entries, the live count at each tile start. */
static int pass_a(vdev_t *d) {
  const msnap_trace_list_t *tl = d->tl;
  uint64_t a = d->a0, r = d->r0, best_a = a, best_r = r;
  uint32_t live = d->st.nb + d->st.ng;
  for (uint32_t k = 0; k < d->st.ng; k++)
    h_push(&d->seg.heap, d->st.g[k].size, k);
  d->blk.total = d->st.nb;
  d->seg.total = d->st.ng;
  d->peak_a = d->peak_r = 0;
  for (uint32_t i = 0; i < d->n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (i % VM_TILE == 0)
      d->tile_live[i / VM_TILE] = live;
    switch (e->action) {
    case MSNAP_ACTION_ALLOC:
      a += e->size;
      live++;
      d->blk.total++;
      break;
    case MSNAP_ACTION_FREE_COMPLETED:
      a = sub0(a, e->size);
      live -= live > 0;
      break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP:
      r += e->size;
      live++;
      h_push(&d->seg.heap, e->size, d->st.ng + i);
      d->seg.total++;
      break;
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP:
      r = sub0(r, e->size);
      live -= live > 0;
      break;
    case MSNAP_ACTION_OOM:
      if (d->nooms < VM_MAX_OOMS) {
        d->oom_a[d->nooms] = a;
        d->oom_r[d->nooms] = r;
        d->ooms[d->nooms++] = i;
      }
      break;
    default: break;
    }
    if (a > best_a) {
      best_a = a;
      d->peak_a = i + 1;
    }
    if (r > best_r) {
      best_r = r;
      d->peak_r = i + 1;
    }
  }
  return 0;
}

/* The weight of an allocation as a band candidate: live at the active
 * peak first (the state a user looks at first: what held the memory
 * then), then the area it covers in the timeline, requested bytes x
 * states alive (saturated), so that the bands drawn leave the least to
 * the grey band of the others. */
static uint64_t band_weight(const vdev_t *d, uint64_t size, uint32_t start,
                            uint64_t end) {
  uint64_t area;
  if (__builtin_mul_overflow(size, end - start, &area) || area >> 63)
    area = (UINT64_C(1) << 63) - 1;
  bool at_peak = start <= d->peak_a && d->peak_a < end;
  return (at_peak ? UINT64_C(1) << 63 : 0) | area;
}

/* Allocation `id` (rid_rec's numbering: the blocks live at the start,
 * then the trace's entries) becomes a band candidate that ends at state
 * `end`: its size and start state follow from its id. */
static void push_candidate(vdev_t *d, uint32_t id, uint64_t end) {
  const uint32_t pre = d->st.nb;
  uint64_t size = id < pre ? pre_size(&d->st.b[id]) : d->tl->v[id - pre].size;
  uint32_t start = id < pre ? 0 : id - pre + 1;
  h_push(&d->blk.heap, band_weight(d, size, start, end), id);
}

/* Pass A2: the allocation candidates (the heap of blk), each weighed by
 * band_weight once its end is known (its free_completed, else the end of
 * the trace).  An alloc at the address of a live block (an inconsistent
 * trace) ends that block there, as pass_b's bands do. */
static int pass_a2(vdev_t *d) {
  umap_t open = {0}; /* addr -> record id (rid_rec's numbering) */
  int rc = -1;
  const uint32_t pre = d->st.nb;
  for (uint32_t k = 0; k < pre; k++)
    if (um_put(&open, d->st.b[k].addr, k))
      goto out;
  for (uint32_t i = 0; i < d->n; i++) {
    const msnap_strace_t *e = &d->tl->v[i];
    if (e->action != MSNAP_ACTION_ALLOC &&
        e->action != MSNAP_ACTION_FREE_COMPLETED)
      continue;
    uint32_t id = um_get(&open, e->addr);
    if (id != NONE32) {
      push_candidate(d, id, (uint64_t)i + 1);
      um_del(&open, e->addr);
    }
    if (e->action == MSNAP_ACTION_ALLOC && um_put(&open, e->addr, pre + i))
      goto out;
  }
  for (uint32_t h = 0; h < open.cap; h++) /* alive at the end */
    if (open.v[h] != NONE32)
      push_candidate(d, open.v[h], (uint64_t)d->n + 1);
  rc = 0;
out:
  um_free(&open);
  return rc;
}

/* The candidates of b (the heap): ids sorted, each with its weight rank;
 * their ends are found by pass_b. */
static int band_candidates(bands_t *b) {
  heap_t *h = &b->heap;
  qsort(h->v, h->n, sizeof *h->v, cmp_hitem_desc);
  b->n = h->n;
  b->id = malloc(((size_t)b->n + 1) * sizeof *b->id);
  b->rank = malloc(((size_t)b->n + 1) * sizeof *b->rank);
  b->end = malloc(((size_t)b->n + 1) * sizeof *b->end);
  if (!b->id || !b->rank || !b->end)
    return -1;
  /* (rank, id) pairs sorted by id: the candidates in start order */
  for (uint32_t r = 0; r < b->n; r++)
    h->v[r].size = r;
  qsort(h->v, h->n, sizeof *h->v, cmp_hitem_id);
  for (uint32_t i = 0; i < b->n; i++) {
    b->id[i] = h->v[i].id;
    b->rank[i] = (uint32_t)h->v[i].size;
    b->end[i] = -1;
  }
  free(h->v);
  h->v = NULL;
  h->n = h->cap = 0;
  return 0;
}

/* Index of a candidate id (ids sorted), NONE32 when not a candidate. */
static uint32_t band_rank(const bands_t *b, uint32_t id) {
  uint32_t lo = 0, hi = b->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (b->id[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < b->n && b->id[lo] == id ? lo : NONE32;
}

/* The order in which tiles of the trace are kept: OOMs, the end, the
 * peaks, the start, then spread evenly (halves, quarters...). */
static int tile_order(vdev_t *d) {
  uint32_t nt = d->ntiles, no = 0;
  d->torder = malloc(((size_t)nt + 1) * sizeof *d->torder);
  d->trank = malloc(((size_t)nt + 1) * sizeof *d->trank);
  uint8_t *seen = calloc((size_t)nt + 1, 1);
  if (!d->torder || !d->trank || !seen) {
    free(seen);
    return -1;
  }
#define PUSH(k)                                                              \
  do {                                                                       \
    uint32_t k_ = (k);                                                       \
    if (k_ < nt && !seen[k_]) {                                              \
      seen[k_] = 1;                                                          \
      d->trank[k_] = no;                                                     \
      d->torder[no++] = k_;                                                  \
    }                                                                        \
  } while (0)
  if (nt) {
    for (uint32_t i = 0; i < d->nooms; i++)
      PUSH(d->ooms[i] / VM_TILE);
    PUSH(nt - 1);
    PUSH(d->peak_a ? (d->peak_a - 1) / VM_TILE : 0);
    PUSH(d->peak_r ? (d->peak_r - 1) / VM_TILE : 0);
    PUSH(0);
    for (uint32_t step = nt; step >= 1; step /= 2) {
      for (uint32_t k = step / 2; k < nt; k += step ? step : 1)
        PUSH(k);
      if (step == 1)
        break;
    }
    for (uint32_t k = 0; k < nt; k++)
      PUSH(k);
  }
#undef PUSH
  free(seen);
  return 0;
}

/* The choice order: bands, segment bands and tiles interleaved so that,
 * by a rough cost of each (not the budget), bands take about
 * VM_BAND_SHARE of what is chosen and segment bands VM_SEGBAND_SHARE.
 * The page of level L holds the first L items of this order: a larger
 * budget takes a longer prefix, never fewer entries or bands. */
static int choice_order(vdev_t *d) {
  uint32_t nb = d->blk.n, ns = d->seg.n, nt = d->ntiles;
  d->nitems = nb + ns + nt;
  d->item = malloc((size_t)d->nitems + 1);
  d->icost = malloc(((size_t)d->nitems + 1) * sizeof *d->icost);
  if (!d->item || !d->icost)
    return -1;
  d->icost[0] = 0;
  double cb = 0, cs = 0, ct = 0;
  uint32_t ib = 0, is = 0, it = 0;
  for (uint32_t i = 0; i < d->nitems; i++) {
    /* the kind furthest below its share of the cost so far */
    double kb = ib < nb ? (cb + 60) / VM_BAND_SHARE : 1e300;
    double ks = is < ns ? (cs + 60) / VM_SEGBAND_SHARE : 1e300;
    double kt = 1e300;
    if (it < nt) {
      uint32_t k = d->torder[it];
      uint32_t hi = (k + 1) * VM_TILE < d->n ? (k + 1) * VM_TILE : d->n;
      kt = (ct + 40.0 * (hi - k * VM_TILE) + 45.0 * d->tile_live[k]) /
           (1 - VM_BAND_SHARE - VM_SEGBAND_SHARE);
    }
    if (kt <= kb && kt <= ks) {
      uint32_t k = d->torder[it++];
      uint32_t hi = (k + 1) * VM_TILE < d->n ? (k + 1) * VM_TILE : d->n;
      ct += 40.0 * (hi - k * VM_TILE) + 45.0 * d->tile_live[k];
      d->item[i] = 2;
    } else if (kb <= ks) {
      ib++;
      cb += 60;
      d->item[i] = 0;
    } else {
      is++;
      cs += 60;
      d->item[i] = 1;
    }
    d->icost[i + 1] = cb + cs + ct;
  }
  return 0;
}

/* Choose level L: the first L items of the choice order.  Tile k joins
 * the window of tile k-1 when k-1 came earlier in the order, else it
 * starts a window with its own key frame (so that a longer prefix only
 * adds to the page: no key frame is ever dropped). */
static int choose_level(vdev_t *d, uint32_t L) {
  for (uint32_t i = 0; i < d->nwin; i++) {
    free(d->win[i].segs);
    free(d->win[i].blocks);
  }
  free(d->win);
  d->win = NULL;
  d->nwin = 0;
  uint32_t m = 0;
  d->blk.k = d->seg.k = 0;
  for (uint32_t i = 0; i < L && i < d->nitems; i++) {
    if (d->item[i] == 0)
      d->blk.k++;
    else if (d->item[i] == 1)
      d->seg.k++;
    else
      m++;
  }
  uint32_t nt = d->ntiles;
  if (nt == 0 || m == 0)
    return 0;
  uint8_t *start = calloc(nt, 1);
  if (!start)
    return -1;
  /* starts a window: kept, and k-1 not kept before it */
  for (uint32_t k = 0; k < nt; k++) {
    if (d->trank[k] >= m)
      continue;
    start[k] = k == 0 || d->trank[k - 1] >= d->trank[k] ? 1 : 2;
    if (start[k] == 1)
      d->nwin++;
  }
  d->win = calloc((size_t)d->nwin + 1, sizeof *d->win);
  if (!d->win) {
    free(start);
    return -1;
  }
  uint32_t w = 0;
  for (uint32_t k = 0; k < nt; k++) {
    if (!start[k])
      continue;
    if (start[k] == 1)
      d->win[w++].first = k * VM_TILE;
    uint32_t hi = (k + 1) * VM_TILE < d->n ? (k + 1) * VM_TILE : d->n;
    d->win[w - 1].count = hi - d->win[w - 1].first;
  }
  free(start);
  return 0;
}

/* ---- annotations and steps ------------------------------------------------ */
/* record_function ranges and the steps among them (cli_steps.c). */
static int annotations(vdev_t *d) {
  cli_ranges_t r;
  if (cli_ranges_find(d->s, d->dev, d->o->step, VM_MAX_RANGES, &r) != 0)
    return -1;
  d->rg = r.rg;
  d->nrg = r.nrg;
  d->rg_dropped = r.dropped;
  d->steps = r.steps;
  d->nsteps = r.nsteps;
  memcpy(d->stepname, r.stepname, sizeof d->stepname);
  return 0;
}

static int cmp_lrec_addr(const void *a, const void *b) {
  uint64_t x = ((const lrec_t *)a)->addr, y = ((const lrec_t *)b)->addr;
  return x < y ? -1 : x > y;
}

static void bucket(uint64_t v, uint32_t s, uint32_t j, uint64_t *mx,
                   uint32_t *at) {
  if (at[j] == 0 || v > mx[j]) {
    mx[j] = v;
    at[j] = s;
  }
}

/* Record x leaves the live set at state `end`: a candidate band ends. */
static void band_close(bands_t *b, const lrec_t *x, uint32_t end) {
  if (b && x->rank != NONE32)
    b->end[x->rank] = end;
}

/* A new live record y (element `id`; *next = the next candidate not yet
 * started; b NULL: no bands): a record at the same address (a damaged
 * trace) ends first.  0, or -1 on ENOMEM. */
static int band_open(live_t *L, bands_t *b, uint32_t *next, uint32_t id,
                     lrec_t *y) {
  if (b && *next < b->n && b->id[*next] == id)
    y->rank = (*next)++;
  const lrec_t *x = live_get(L, y->addr);
  if (x)
    band_close(b, x, y->entry + 1);
  if (!live_put(L, y))
    return -1;
  return 0;
}

/* Forward over the trace, once: the memory series, the ends of every
 * candidate band, and rel[] (for the key-frame passes, pass_kf). */
static int pass_b(vdev_t *d) {
  live_t B = {0}, G = {0};
  int rc = -1;
  uint64_t a = 0, r = 0;
  bands_t *bb = &d->blk, *gb = &d->seg;
  for (uint32_t k = 0; k < d->st.nb; k++) {
    const cli_lblock_t *b = &d->st.b[k];
    lrec_t x = {.addr = b->addr, .size = pre_size(b), .stream = b->stream,
                .stack = d->prestack[k],
                .rank = band_rank(&d->blk, k),
                .entry = NONE32, .rid = k, .pending = b->pending};
    if (!live_put(&B, &x))
      goto out;
    a += x.size;
  }
  for (uint32_t k = 0; k < d->st.ng; k++) {
    const cli_lseg_t *g = &d->st.g[k];
    lrec_t x = {.addr = g->addr, .size = g->size, .stream = g->stream,
                .rank = band_rank(&d->seg, k),
                .entry = NONE32, .rid = k};
    if (!live_put(&G, &x))
      goto out;
    r += x.size;
  }
  d->a0 = a;
  d->r0 = r;
  uint32_t bi = 0, gi = 0;
  /* next candidate trace ids */
  while (bi < d->blk.n && d->blk.id[bi] < d->st.nb)
    bi++;
  while (gi < d->seg.n && d->seg.id[gi] < d->st.ng)
    gi++;
  for (uint32_t i = 0; i < d->n; i++) {
    const msnap_strace_t *e = &d->tl->v[i];
    lrec_t *x;
    uint32_t *rel = &d->rel[i];
    switch (e->action) {
    case MSNAP_ACTION_ALLOC: {
      lrec_t y = {.addr = e->addr, .size = e->size,
                  .stream = msnap__tattr(d->s, e)->stream,
                  .stack = e->frames, .rank = NONE32, .entry = i,
                  .rid = d->st.nb + i};
      if ((x = live_get(&B, e->addr)) != NULL)
        *rel = x->rid;
      if (band_open(&B, bb, &bi, d->st.nb + i, &y))
        goto out;
      a += e->size;
      break;
    }
    case MSNAP_ACTION_FREE_REQUESTED:
      if ((x = live_get(&B, e->addr)) != NULL) {
        x->pending = 1;
        *rel = x->rid;
      }
      break;
    case MSNAP_ACTION_FREE_COMPLETED:
      a = sub0(a, e->size);
      if ((x = live_get(&B, e->addr)) != NULL) {
        *rel = x->rid;
        band_close(bb, x, i + 1);
        live_del(&B, e->addr);
      }
      break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP: {
      lrec_t y = {.addr = e->addr, .size = e->size,
                  .stream = msnap__tattr(d->s, e)->stream,
                  .stack = e->frames, .rank = NONE32, .entry = i,
                  .rid = d->st.ng + i};
      if ((x = live_get(&G, e->addr)) != NULL)
        *rel = x->rid;
      if (band_open(&G, gb, &gi, d->st.ng + i, &y))
        goto out;
      r += e->size;
      break;
    }
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP:
      r = sub0(r, e->size);
      if ((x = live_get(&G, e->addr)) != NULL) {
        *rel = x->rid;
        band_close(gb, x, i + 1);
        live_del(&G, e->addr);
      }
      break;
    default: break;
    }
    uint32_t bk = i / d->w;
    bucket(a, i + 1, bk, d->amax, d->aat);
    bucket(r, i + 1, bk, d->rmax, d->rat);
  }
  rc = 0;
out:
  live_free(&B);
  live_free(&G);
  return rc;
}

static int write_window(vdev_t *d, cli_json_t *j, const kf_t *k);

/* The live records of a key-frame pass: rids in a dense array, pos[rid]
 * its place + 1 (0: not live). */
typedef struct dlive_s {
  uint32_t *v, *pos;
  uint32_t n;
} dlive_t;

static void dl_add(dlive_t *l, uint32_t rid) {
  if (l->pos[rid])
    return;
  l->v[l->n++] = rid;
  l->pos[rid] = l->n;
}

static void dl_del(dlive_t *l, uint32_t rid) {
  if (rid == NONE32 || !l->pos[rid])
    return;
  uint32_t k = l->pos[rid] - 1, last = l->v[--l->n];
  l->v[k] = last;
  l->pos[last] = k + 1;
  l->pos[rid] = 0;
}

/* Record rid of blocks (segs false) or segments as an lrec_t. */
static lrec_t rid_rec(const vdev_t *d, bool segs, uint32_t rid,
                      const uint8_t *pend) {
  uint32_t pre = segs ? d->st.ng : d->st.nb;
  lrec_t x = {.rank = NONE32, .entry = NONE32, .rid = rid, .inuse = 1};
  if (rid < pre && segs) {
    x.addr = d->st.g[rid].addr;
    x.size = d->st.g[rid].size;
    x.stream = d->st.g[rid].stream;
  } else if (rid < pre) {
    x.addr = d->st.b[rid].addr;
    x.size = pre_size(&d->st.b[rid]);
    x.stream = d->st.b[rid].stream;
    x.stack = d->prestack[rid];
  } else {
    const msnap_strace_t *e = &d->tl->v[rid - pre];
    x.addr = e->addr;
    x.size = e->size;
    x.stream = msnap__tattr(d->s, e)->stream;
    x.stack = e->frames;
    x.entry = rid - pre;
  }
  if (pend)
    x.pending = pend[rid];
  return x;
}

/* The windows of the level chosen, each written to j with its key frame
 * (the records live at its first entry, by address) as a forward pass
 * reaches it; the pass follows rel[] (pass_b), with no address lookups. */
static int pass_kf(vdev_t *d, cli_json_t *j) {
  uint32_t nbr = d->st.nb + d->n, ngr = d->st.ng + d->n;
  dlive_t B = {malloc(((size_t)nbr + 1) * 4), calloc((size_t)nbr + 1, 4), 0};
  dlive_t G = {malloc(((size_t)ngr + 1) * 4), calloc((size_t)ngr + 1, 4), 0};
  uint8_t *pend = calloc((size_t)nbr + 1, 1);
  int rc = -1;
  if (!B.v || !B.pos || !G.v || !G.pos || !pend)
    goto out;
  for (uint32_t k = 0; k < d->st.nb; k++) {
    dl_add(&B, k);
    pend[k] = d->st.b[k].pending;
  }
  for (uint32_t k = 0; k < d->st.ng; k++)
    dl_add(&G, k);
  uint32_t wi = 0;
  for (uint32_t i = 0; i < d->n && wi < d->nwin; i++) {
    if (d->win[wi].first == i) {
      kf_t *k = &d->win[wi++];
      k->blocks = malloc(((size_t)B.n + 1) * sizeof *k->blocks);
      k->segs = malloc(((size_t)G.n + 1) * sizeof *k->segs);
      int wr = k->blocks && k->segs ? 0 : -1;
      for (uint32_t q = 0; wr == 0 && q < B.n; q++)
        k->blocks[k->nblocks++] = rid_rec(d, false, B.v[q], pend);
      for (uint32_t q = 0; wr == 0 && q < G.n; q++)
        k->segs[k->nsegs++] = rid_rec(d, true, G.v[q], NULL);
      if (wr == 0) {
        qsort(k->blocks, k->nblocks, sizeof *k->blocks, cmp_lrec_addr);
        qsort(k->segs, k->nsegs, sizeof *k->segs, cmp_lrec_addr);
        wr = write_window(d, j, k);
      }
      free(k->segs);
      free(k->blocks);
      k->segs = k->blocks = NULL;
      k->nsegs = k->nblocks = 0;
      if (wr)
        goto out;
      if (d->limit && j->sink.bytes + (d->t->bytes - d->tbase) > d->limit) {
        d->aborted = true; /* past the limit: the rest is not needed */
        break;
      }
    }
    uint32_t rel = d->rel[i];
    switch (d->tl->v[i].action) {
    case MSNAP_ACTION_ALLOC:
      dl_del(&B, rel);
      dl_add(&B, d->st.nb + i);
      break;
    case MSNAP_ACTION_FREE_REQUESTED:
      if (rel != NONE32)
        pend[rel] = 1;
      break;
    case MSNAP_ACTION_FREE_COMPLETED: dl_del(&B, rel); break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP:
      dl_del(&G, rel);
      dl_add(&G, d->st.ng + i);
      break;
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP: dl_del(&G, rel); break;
    default: break;
    }
  }
  rc = 0;
out:
  free(B.v);
  free(B.pos);
  free(G.v);
  free(G.pos);
  free(pend);
  return rc;
}

/* ---- writing ---------------------------------------------------------------- */
static void w_u64s(cli_json_t *j, const char *key, const uint64_t *v,
                   uint32_t n) {
  cj_key(j, key);
  cj_arr(j);
  for (uint32_t i = 0; i < n; i++)
    cj_u64(j, v[i]);
  cj_arr_end(j);
}

static void w_u32s(cli_json_t *j, const char *key, const uint32_t *v,
                   uint32_t n) {
  cj_key(j, key);
  cj_arr(j);
  for (uint32_t i = 0; i < n; i++)
    cj_u64(j, v[i]);
  cj_arr_end(j);
}

static int64_t entry_time(const vdev_t *d, uint32_t i) {
  return i < d->n && (msnap__tattr(d->s, &d->tl->v[i])->keys & MSNAP_K_TIME)
             ? d->tl->v[i].time_us
             : INT64_MIN;
}

/* Index in the written leaks of the site of stack st, or -1. */
static int64_t leak_index(const vdev_t *d, msnap_stack_t st) {
  uint32_t m = d->leaks.n < VM_MAX_LEAK_SITES ? d->leaks.n : VM_MAX_LEAK_SITES;
  if (m == 0)
    return -1;
  cli_site_t site = cli_site(d->s, st);
  for (uint32_t k = 0; k < m; k++) {
    cli_site_t key = d->leaks.v[k].key;
    /* an empty stack is the no-Python-frames site when that is a leak
     * site (its key comes from cli_empty_site, see cli_sites_init) */
    if (cli_site_eq(site, key) ||
        (site.frame == CLI_SITE_NONE && key.frame == CLI_SITE_NO_PYTHON))
      return k;
  }
  return -1;
}

static int write_bands(vdev_t *d, cli_json_t *j, const char *key,
                       const bands_t *b, bool segs) {
  uint32_t pre = segs ? d->st.ng : d->st.nb;
  cj_key(j, key);
  cj_obj(j);
  cj_key(j, "total");
  cj_u64(j, b->total);
  cj_key(j, "start");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k)
    cj_u64(j, b->id[i] < pre ? 0 : b->id[i] - pre + 1);
  cj_arr_end(j);
  cj_key(j, "end");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k)
    cj_i64(j, b->end[i]);
  cj_arr_end(j);
  cj_key(j, "size");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k) {
    uint32_t id = b->id[i];
    cj_u64(j, id >= pre ? d->tl->v[id - pre].size
                        : segs ? d->st.g[id].size : pre_size(&d->st.b[id]));
  }
  cj_arr_end(j);
  cj_key(j, "addr");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k) {
    uint32_t id = b->id[i];
    cj_u64(j, id >= pre ? d->tl->v[id - pre].addr
                        : segs ? d->st.g[id].addr : d->st.b[id].addr);
  }
  cj_arr_end(j);
  cj_key(j, "stack");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k) {
    uint32_t id = b->id[i];
    msnap_stack_t st = id >= pre ? d->tl->v[id - pre].frames
                                 : segs ? MSNAP_STACK_ABSENT
                                        : d->prestack[id];
    uint32_t node = trie_stack(d->t, st);
    if (node == NONE32)
      return -1;
    cj_u64(j, node);
  }
  cj_arr_end(j);
  cj_key(j, "pre");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k)
    cj_u64(j, b->id[i] < pre);
  cj_arr_end(j);
  cj_key(j, "site");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k)
    cj_i64(j, segs || b->id[i] < pre
                  ? -1 : leak_index(d, d->tl->v[b->id[i] - pre].frames));
  cj_arr_end(j);
  cj_key(j, "dur");
  cj_arr(j);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->rank[i] < b->k) {
    uint32_t id = b->id[i];
    int64_t t0 = id >= pre ? entry_time(d, id - pre) : INT64_MIN;
    int64_t t1 = b->end[i] > 0 ? entry_time(d, (uint32_t)b->end[i] - 1)
                               : INT64_MIN;
    cj_i64(j, t0 != INT64_MIN && t1 != INT64_MIN && t1 >= t0 ? t1 - t0 : -1);
  }
  cj_arr_end(j);
  cj_obj_end(j);
  return 0;
}

/* One window: its key frame (k's segs and blocks) and its entries. */
static int write_window(vdev_t *d, cli_json_t *j, const kf_t *k) {
  int64_t t0 = entry_time(d, 0);
  {
    cj_obj(j);
    cj_key(j, "first");
    cj_u64(j, k->first);
    cj_key(j, "count");
    cj_u64(j, k->count);
    cj_key(j, "kf");
    cj_obj(j);
    cj_key(j, "segs");
    cj_arr(j);
    for (uint32_t i = 0; i < k->nsegs; i++) {
      cj_u64(j, k->segs[i].addr);
      cj_u64(j, k->segs[i].size);
      cj_i64(j, k->segs[i].stream);
    }
    cj_arr_end(j);
    cj_key(j, "blocks");
    cj_arr(j);
    for (uint32_t i = 0; i < k->nblocks; i++) {
      const lrec_t *b = &k->blocks[i];
      uint32_t node = trie_stack(d->t, b->stack);
      if (node == NONE32)
        return -1;
      cj_u64(j, b->addr);
      cj_u64(j, b->size);
      cj_u64(j, b->pending);
      cj_u64(j, node);
      cj_i64(j, b->entry == NONE32 ? -1 : (int64_t)b->entry);
    }
    cj_arr_end(j);
    cj_obj_end(j);
    cj_key(j, "ev");
    cj_obj(j);
    const msnap_strace_t *v = d->tl->v + k->first;
    cj_key(j, "a");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++)
      cj_u64(j, v[i].action);
    cj_arr_end(j);
    cj_key(j, "addr");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++)
      cj_u64(j, v[i].addr);
    cj_arr_end(j);
    cj_key(j, "size");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++)
      cj_u64(j, v[i].size);
    cj_arr_end(j);
    cj_key(j, "stack");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++) {
      uint32_t node = trie_stack(d->t, v[i].frames);
      if (node == NONE32)
        return -1;
      cj_u64(j, node);
    }
    cj_arr_end(j);
    cj_key(j, "t");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++) {
      if ((msnap__tattr(d->s, &v[i])->keys & MSNAP_K_TIME) && t0 != INT64_MIN)
        cj_i64(j, v[i].time_us - t0);
      else
        cj_null(j);
    }
    cj_arr_end(j);
    cj_key(j, "stream");
    cj_arr(j);
    for (uint32_t i = 0; i < k->count; i++)
      cj_i64(j, msnap__tattr(d->s, &v[i])->stream);
    cj_arr_end(j);
    cj_obj_end(j);
    cj_obj_end(j);
  }
  return 0;
}

/* "windows": written as the forward pass reaches each window (pass_b), so
 * that one key frame at a time is held. */
static int write_windows(vdev_t *d, cli_json_t *j) {
  cj_key(j, "windows");
  cj_arr(j);
  if (pass_kf(d, j))
    return -1;
  cj_arr_end(j);
  return 0;
}

typedef struct vsite_s {
  char *text;
  uint64_t bytes, count;
} vsite_t;

static int cmp_vsite_text(const void *a, const void *b) {
  return strcmp(((const vsite_t *)a)->text, ((const vsite_t *)b)->text);
}

static int cmp_vsite_bytes(const void *a, const void *b) {
  const vsite_t *x = a, *y = b;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  return strcmp(x->text, y->text);
}

/* "sites": the VM_MAX_SITES allocation sites with the most live bytes at
 * the end of the file, [text, bytes, count] (as `memsnap summary`). */
static int write_sites(vdev_t *d, cli_json_t *j) {
  const msnap_snap_t *s = d->s;
  uint32_t cap = 0, n = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device == d->dev)
      cap += s->segments[i].nblocks;
  vsite_t *v = calloc((size_t)cap + 1, sizeof *v);
  if (!v)
    return -1;
  int rc = 0;
  char buf[512];
  for (cli_bwalk_t it = cli_bwalk(s, d->dev); cli_bwalk_next(&it);) {
    const msnap_sblock_t *b = it.b;
    if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
      continue;
    cli_site_format(s, cli_stacks_site(d->stk, d->dev, it.addr, b), buf,
                    sizeof buf);
    v[n].text = strdup(buf);
    v[n].bytes = b->size;
    v[n].count = 1;
    if (!v[n].text) {
      rc = -1;
      break;
    }
    n++;
  }
  uint32_t m = 0;
  if (rc == 0) {
    qsort(v, n, sizeof *v, cmp_vsite_text);
    for (uint32_t i = 0; i < n; i++) {
      if (m > 0 && !strcmp(v[m - 1].text, v[i].text)) {
        v[m - 1].bytes += v[i].bytes;
        v[m - 1].count++;
        free(v[i].text);
      } else {
        v[m++] = v[i];
      }
    }
    qsort(v, m, sizeof *v, cmp_vsite_bytes);
    cj_key(j, "sites");
    cj_arr(j);
    for (uint32_t i = 0; i < m && i < VM_MAX_SITES; i++) {
      cj_arr(j);
      cj_cstr(j, v[i].text);
      cj_u64(j, v[i].bytes);
      cj_u64(j, v[i].count);
      cj_arr_end(j);
    }
    cj_arr_end(j);
  } else {
    m = n;
  }
  for (uint32_t i = 0; i < m; i++)
    free(v[i].text);
  free(v);
  return rc;
}

/* The final segments and their blocks. */
static int write_final(vdev_t *d, cli_json_t *j) {
  const msnap_snap_t *s = d->s;
  cj_key(j, "segments");
  cj_arr(j);
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != d->dev)
      continue;
    cj_arr(j);
    cj_u64(j, g->address);
    cj_u64(j, g->total_size);
    cj_i64(j, g->stream);
    cj_arr(j);
    uint64_t ba = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (b->keys & MSNAP_K_ADDRESS)
        ba = b->address;
      cli_stack_src_t src;
      msnap_stack_t bst = cli_stacks_block(d->stk, d->dev, ba, b, &src);
      long ent = cli_block_active(b) ? cli_stacks_live_entry(d->stk, d->dev, ba)
                                     : -1;
      uint32_t node = trie_stack(d->t, bst);
      if (node == NONE32)
        return -1;
      cj_arr(j);
      cj_u64(j, ba);
      cj_u64(j, b->size);
      cj_u64(j, b->state <= 2 ? b->state : 3);
      cj_u64(j, b->requested_size);
      cj_u64(j, node);
      cj_i64(j, ent >= 0 ? ent : src == CLI_SRC_BEFORE_TRACE ? -2 : -1);
      cj_arr_end(j);
      ba += b->size;
    }
    cj_arr_end(j);
    cj_arr_end(j);
  }
  cj_arr_end(j);
  return 0;
}

/* Leak sites (see the top of the file), in the order of `memsnap leaks`;
 * at most VM_MAX_LEAK_SITES. */
static int write_leaks(vdev_t *d, cli_json_t *j, vm_stats_t *out) {
  const cli_leaks_t *l = &d->leaks;
  uint32_t m = l->n < VM_MAX_LEAK_SITES ? l->n : VM_MAX_LEAK_SITES;
  cj_key(j, "steps");
  if (d->nsteps) {
    cj_obj(j);
    cj_key(j, "name");
    cj_cstr(j, d->stepname);
    w_u32s(j, "ranges", d->steps, 2 * d->nsteps);
    cj_key(j, "from_device"); /* annotations of another device (cli_steps.c) */
    if (d->leaks.ann_device != d->dev)
      cj_i64(j, d->leaks.ann_device);
    else
      cj_null(j);
    cj_obj_end(j);
  } else {
    cj_null(j);
  }
  cj_key(j, "steps_why"); /* why there are no steps: `memsnap leaks`' text */
  if (l->why[0])
    cj_cstr(j, l->why);
  else
    cj_null(j);
  /* --step NAME that gave no steps: said on stderr too (cmd_view.c) */
  if (d->o->step && !d->nsteps && l->why[0] && !out->step_why[0])
    snprintf(out->step_why, sizeof out->step_why, "device %lld: %s",
             (long long)d->dev, l->why);
  cj_key(j, "leaks");
  cj_arr(j);
  for (uint32_t i = 0; i < m; i++) {
    const cli_leak_t *x = &l->v[i];
    cj_arr(j);
    cj_cstr(j, x->site);
    cj_dbl(j, (double)(int64_t)(x->confidence * 1000.0 + 0.5) / 1000.0);
    cj_u64(j, x->first);
    cj_u64(j, x->last);
    cj_u64(j, x->grown);
    cj_u64(j, x->shrunk);
    cj_u64(j, x->allocs);
    cj_arr_end(j);
  }
  cj_arr_end(j);
  cj_key(j, "leak_total"); /* all candidates; at most VM_MAX_LEAK_SITES
                              are written */
  cj_u64(j, l->n);
  out->leak_sites += m;
  return 0;
}

/* The parts of a device written whatever the level (the object's start:
 * series, leaks, OOMs, annotations, final state, sites); written before
 * the bands and windows, so that the trie ids they take, and their bytes,
 * do not depend on the level. */
static int write_device_fixed(vdev_t *d, cli_json_t *j, vm_stats_t *out) {
  int64_t t0 = entry_time(d, 0);
  cj_obj(j);
  cj_key(j, "device");
  cj_i64(j, d->dev);
  cj_key(j, "n");
  cj_u64(j, d->n);
  cj_key(j, "t0");
  if (t0 != INT64_MIN)
    cj_i64(j, t0);
  else
    cj_null(j);
  cj_key(j, "series");
  cj_obj(j);
  cj_key(j, "w");
  cj_u64(j, d->w);
  cj_key(j, "a0");
  cj_u64(j, d->a0);
  cj_key(j, "r0");
  cj_u64(j, d->r0);
  w_u64s(j, "amax", d->amax, d->nb);
  w_u32s(j, "aat", d->aat, d->nb);
  w_u64s(j, "rmax", d->rmax, d->nb);
  w_u32s(j, "rat", d->rat, d->nb);
  cj_obj_end(j);
  /* leaks first: they number the sites the bands refer to */
  if (write_leaks(d, j, out))
    return -1;
  cj_key(j, "ooms");
  cj_arr(j);
  for (uint32_t i = 0; i < d->nooms; i++) {
    const msnap_strace_t *e = &d->tl->v[d->ooms[i]];
    uint32_t node = trie_stack(d->t, e->frames);
    if (node == NONE32)
      return -1;
    cj_arr(j);
    cj_u64(j, d->ooms[i]);
    cj_u64(j, e->size);
    cj_u64(j, e->addr); /* device_free */
    cj_u64(j, node);
    cj_u64(j, d->oom_a[i]);
    cj_u64(j, d->oom_r[i]);
    cj_arr_end(j);
  }
  cj_arr_end(j);
  /* annotations: distinct names, then ranges */
  cj_key(j, "annotations");
  cj_obj(j);
  umap_t names = {0};
  uint32_t nn = 0;
  cj_key(j, "names");
  cj_arr(j);
  for (uint32_t i = 0; i < d->nrg; i++) {
    uint32_t k = um_get(&names, d->rg[3 * i]);
    if (k == NONE32) {
      if (um_put(&names, d->rg[3 * i], nn++)) {
        um_free(&names);
        return -1;
      }
      size_t l;
      const char *p = cli_str(d->s, d->rg[3 * i], &l);
      cj_str(j, p, l);
    }
  }
  cj_arr_end(j);
  cj_key(j, "ranges");
  cj_arr(j);
  for (uint32_t i = 0; i < d->nrg; i++) {
    cj_u64(j, um_get(&names, d->rg[3 * i]));
    cj_u64(j, d->rg[3 * i + 1]);
    cj_u64(j, d->rg[3 * i + 2]);
  }
  cj_arr_end(j);
  um_free(&names);
  cj_key(j, "dropped");
  cj_u64(j, d->rg_dropped);
  cj_obj_end(j);
  if (write_final(d, j) || write_sites(d, j))
    return -1;
  return 0;
}

/* The parts of a device that the level chooses (the object's end): the
 * bands and the windows. */
static int write_device_var(vdev_t *d, cli_json_t *j, vm_stats_t *out) {
  if (write_bands(d, j, "bands", &d->blk, false) ||
      write_bands(d, j, "segbands", &d->seg, true) || write_windows(d, j))
    return -1;
  cj_obj_end(j);
  out->entries += d->n;
  for (uint32_t w = 0; w < d->nwin; w++)
    out->embedded += d->win[w].count;
  out->allocations += d->blk.total;
  out->bands += d->blk.k;
  out->ooms += d->nooms;
  return 0;
}

/* Bytes that writing device d at level L adds to the page: its object
 * (with the comma before it) and what its stacks add to the trie.  The
 * fixed parts were measured once (`fixed` bytes; the trie after them is
 * `tf`); the bands and windows are written to a counter, their stacks into
 * a copy of tf.  INT64_MAX once past a quarter more than `room` (the
 * writing stops there).  -1 on ENOMEM. */
static int64_t level_bytes(vdev_t *d, uint32_t L, const trie_t *tf,
                           int64_t fixed, double room) {
  trie_t scratch, *real = d->t;
  cli_json_t c;
  vm_stats_t st;
  int64_t n = -1;
  if (choose_level(d, L))
    return -1;
  if (trie_copy(&scratch, tf)) {
    trie_free(&scratch);
    return -1;
  }
  if (counter_init(&c) == 0) {
    memset(&st, 0, sizeof st);
    cj_obj(&c);
    cj_key(&c, "x"); /* the keys before, as in the object */
    cj_null(&c);
    uint64_t b0 = c.sink.bytes;
    double lim = room * 1.25 - (double)fixed + 64;
    d->limit = b0 + (lim < 64 ? 64 : lim < 1e18 ? (uint64_t)lim : UINT64_MAX / 2);
    d->tbase = tf->bytes;
    d->aborted = false;
    d->t = &scratch;
    int rc = write_device_var(d, &c, &st);
    d->t = real;
    d->limit = 0;
    if (rc == 0 && d->aborted)
      n = INT64_MAX;
    else if (rc == 0)
      n = fixed + (int64_t)(c.sink.bytes - b0) +
          (int64_t)(scratch.bytes - tf->bytes);
    d->aborted = false;
    counter_free(&c);
  }
  trie_free(&scratch);
  return n;
}

/* The fixed parts of device d written to a counter (with the comma before
 * the object), their stacks into tf, a copy of the trie, whose growth is
 * counted.  -1 on ENOMEM. */
static int64_t fixed_bytes(vdev_t *d, trie_t *tf) {
  trie_t *real = d->t;
  cli_json_t c;
  vm_stats_t st;
  int64_t n = -1;
  if (trie_copy(tf, real))
    return -1;
  if (counter_init(&c))
    return -1;
  memset(&st, 0, sizeof st);
  cj_arr(&c);
  cj_null(&c); /* the comma before the object, as after another device */
  uint64_t b0 = c.sink.bytes;
  d->t = tf;
  if (write_device_fixed(d, &c, &st) == 0)
    n = (int64_t)(c.sink.bytes - b0) + (int64_t)(tf->bytes - real->bytes);
  d->t = real;
  counter_free(&c);
  return n;
}

/* Write device d at the largest level whose bytes fit `room` (level 0,
 * the fixed parts, when none does).  The bytes of a level grow with it
 * (each item adds to the page, nothing is dropped), so the search is a
 * bisection; the page at the level chosen is the one measured. */
static int do_device(vdev_t *d, cli_json_t *j, double room, vm_stats_t *out) {
  d->tl = cli_trace(d->s, d->dev);
  d->n = d->tl ? d->tl->n : 0;
  if (cli_backward(d->s, d->dev, NULL, NULL, &d->st) < 0 || prestacks(d))
    return -1;
  d->w = d->n > VM_MAX_BUCKETS ? (d->n + VM_MAX_BUCKETS - 1) / VM_MAX_BUCKETS
                               : 1;
  d->nb = (d->n + d->w - 1) / d->w;
  d->ntiles = (d->n + VM_TILE - 1) / VM_TILE;
  size_t nb = (size_t)d->nb + 1;
  d->amax = calloc(nb, 8);
  d->rmax = calloc(nb, 8);
  d->aat = calloc(nb, 4);
  d->rat = calloc(nb, 4);
  d->ooms = calloc(VM_MAX_OOMS, 4);
  d->oom_a = calloc(VM_MAX_OOMS, 8);
  d->oom_r = calloc(VM_MAX_OOMS, 8);
  d->tile_live = calloc((size_t)d->ntiles + 1, 4);
  uint32_t detail = d->o->detail ? d->o->detail : 1;
  d->blk.heap.v = malloc((size_t)detail * sizeof(hitem_t));
  d->seg.heap.v = malloc((size_t)detail * sizeof(hitem_t));
  d->blk.heap.cap = d->seg.heap.cap = detail;
  if (!d->amax || !d->rmax || !d->aat || !d->rat || !d->ooms || !d->oom_a ||
      !d->oom_r || !d->tile_live || !d->blk.heap.v || !d->seg.heap.v)
    return -1;
  for (uint32_t k = 0; k < d->st.nb; k++)
    d->a0 += pre_size(&d->st.b[k]);
  for (uint32_t k = 0; k < d->st.ng; k++)
    d->r0 += d->st.g[k].size;
  if (pass_a(d) || pass_a2(d) || annotations(d) ||
      cli_leaks_steps(d->s, d->dev, d->o->step, CLI_LEAK_MIN_CONFIDENCE,
                      &d->leaks))
    return -1;
  d->rel = malloc(((size_t)d->n + 1) * sizeof *d->rel);
  if (!d->rel)
    return -1;
  memset(d->rel, 0xff, ((size_t)d->n + 1) * sizeof *d->rel);
  if (band_candidates(&d->blk) || band_candidates(&d->seg) ||
      pass_b(d) ||
      tile_order(d) || choice_order(d))
    return -1;
  trie_t tf;
  int64_t fixed = fixed_bytes(d, &tf);
  if (fixed < 0) {
    trie_free(&tf);
    return -1;
  }
  /* The highest level that fits, exactly (the bytes grow with the level):
   * the whole page first, then guesses interpolated between the last
   * level that fit and the last that did not, by the rough costs of the
   * items (icost), every third one a bisection, so that few levels are
   * written to the counter. */
  uint32_t lo = 0, hi = d->nitems; /* the answer is in [lo, hi] */
  double blo = (double)fixed, bhi = -1; /* measured at lo, at hi + 1 */
  bool measured = false; /* bhi is a count, not a count stopped early */
  for (unsigned probe = 0; lo < hi; probe++) {
    uint32_t g;
    if (probe == 0) {
      g = hi;
    } else if (probe % 3 == 0 || bhi <= blo || !measured) {
      g = lo + (hi - lo + 1) / 2;
    } else {
      /* the largest L in (lo, hi] at or below the interpolated cost */
      double c0 = d->icost[lo], c1 = d->icost[hi + 1];
      double want = c0 + (room - blo) * (c1 - c0) / (bhi - blo);
      uint32_t a = lo + 1, z = hi;
      while (a < z) {
        uint32_t m = a + (z - a + 1) / 2;
        if (d->icost[m] <= want)
          a = m;
        else
          z = m - 1;
      }
      g = a;
    }
    int64_t b = level_bytes(d, g, &tf, fixed, room);
    if (b < 0) {
      trie_free(&tf);
      return -1;
    }
    if ((double)b <= room) {
      lo = g;
      blo = (double)b;
    } else {
      hi = g - 1;
      measured = b != INT64_MAX;
      bhi = (double)b;
    }
  }
  trie_free(&tf);
  if (choose_level(d, lo))
    return -1;
  if (write_device_fixed(d, j, out) || write_device_var(d, j, out))
    return -1;
  return 0;
}

int vm_write_file(cli_json_t *j, const char *path, const msnap_snap_t *s,
                  const vm_opts_t *o, vm_stats_t *out) {
  trie_t t;
  gtrie_t g;
  cli_stacks_t stk;
  uint32_t nd = 0;
  int64_t *devs = NULL;
  int rc = -1;
  memset(out, 0, sizeof *out);
  memset(&t, 0, sizeof t); /* trie_free'd below even when g.of failed */
  memset(&g, 0, sizeof g);
  g.of = calloc((size_t)s->nstacks + 1, sizeof *g.of);
  if (!g.of || trie_init(&t, s, &g)) {
    trie_free(&t);
    gtrie_free(&g);
    return -1;
  }
  if (cli_stacks_init(&stk, s)) {
    trie_free(&t);
    gtrie_free(&g);
    return -1;
  }
  devs = cli_devices(s, &nd);
  if (!devs && nd)
    goto out;
  /* the budget bounds the bytes of the whole object: what is written
   * before the devices, counted as it goes, and after them, the "lod"
   * flag (at most `,"lod":false`, 12 bytes), the trie (its keys and
   * brackets, trie0, and its elements, t.bytes, counted as they are
   * added) and the closing brackets */
  uint64_t b0 = j->sink.bytes;
  int64_t trie0 = trie_bytes(&t);
  if (trie0 < 0)
    goto out;
  uint64_t tail = 12 + (uint64_t)trie0 + 2;
  cj_obj(j);
  cj_key(j, "file");
  cj_cstr(j, path);
  cj_key(j, "generation");
  cj_cstr(j, cli_generation_name(s->generation));
  if (s->top_keys & MSNAP_TOP_ALLOCATOR_SETTINGS) {
    /* As compact key=value text: JSON numbers would lose 64-bit values
     * (trace_alloc_max_entries) in the browser. */
    uint32_t ni = 0;
    char **items = cli_settings_shown(s, &s->allocator_settings, &ni);
    cj_key(j, "settings");
    cj_arr(j);
    for (uint32_t i = 0; i < ni; i++) {
      cj_cstr(j, items[i]);
      free(items[i]);
    }
    cj_arr_end(j);
    free(items);
  }
  cj_key(j, "budget");
  cj_u64(j, o->budget);
  uint64_t total = 0, done = 0;
  for (uint32_t i = 0; i < nd; i++) {
    const msnap_trace_list_t *tl = cli_trace(s, devs[i]);
    total += tl ? tl->n : 0;
  }
  cj_key(j, "devices");
  cj_arr(j);
  for (uint32_t i = 0; i < nd; i++) {
    vdev_t d;
    memset(&d, 0, sizeof d);
    d.s = s;
    d.o = o;
    d.t = &t;
    d.stk = &stk;
    d.dev = devs[i];
    const msnap_trace_list_t *tl = cli_trace(s, devs[i]);
    done += tl ? tl->n : 0;
    /* this device's share of the budget, less what is already used (the
     * trie's growth so far included) */
    double share = total ? (double)done / (double)total : (double)(i + 1) / nd;
    double used = (double)(j->sink.bytes - b0) + (double)tail +
                  (double)t.bytes;
    double budget = o->budget > o->overhead ? (double)(o->budget - o->overhead)
                                            : 0;
    double room = budget * share - used;
    if (room < 0)
      room = 0;
    int r = do_device(&d, j, room, out);
    dev_free(&d);
    if (r)
      goto out;
  }
  cj_arr_end(j);
  cj_key(j, "lod");
  cj_bool(j, out->embedded < out->entries || out->bands < out->allocations);
  trie_write(&t, j);
  cj_obj_end(j);
  out->estimate = j->sink.bytes - b0;
  rc = 0;
out:
  free(devs);
  cli_stacks_free(&stk);
  trie_free(&t);
  gtrie_free(&g);
  return rc;
}
