/*
 * cli_back.c -- backward replay of one device trace over the final state.
 *
 * The final state (the snapshot's segments and active blocks of a device)
 * is complete; the trace may have lost its oldest entries to the ring
 * buffer.  Undoing entries from the newest to the oldest therefore never
 * needs the lost part, and every rule below is checkable on any file:
 *
 *   alloc A          the block at A is live after the entry (in the final
 *                    state or re-created by a later free_completed) and
 *                    lies in a live segment; undo: remove it.  Its size
 *                    equals the block's requested_size.
 *   free_completed A the block is NOT live after the entry (else a double
 *                    free or a missing alloc); it lies in a live segment;
 *                    undo: re-create it, pending.
 *   free_requested A the block is live after the entry and pending (its
 *                    free_completed comes later, or it is
 *                    active_pending_free at the end; cuda-reference §7.3
 *                    rule 1); undo: it is allocated again.
 *   segment_alloc A  a segment starts at A with that size after the entry
 *                    (rule 2) and holds no live block once the blocks
 *                    allocated after it are undone (rule 3); undo: remove.
 *   segment_free A   no segment at A after the entry and no live block in
 *                    its range; undo: re-create it.
 *   segment_map R    R lies inside a live range; undo: unmap R.
 *   segment_unmap R  R overlaps no live range; undo: map R.
 *   annotate A       the block at A is live.
 * The synthetic workspace entries torch_npu puts first in a trace
 * (NPUWorkspaceAllocator get_trace: workspace_snapshot, segment_alloc,
 * alloc of the same buffer) describe the buffers at snapshot time, not
 * history, and torch_npu shows their blocks inactive: a segment_alloc or
 * alloc right after a workspace_snapshot of its address is skipped.
 * What is left at the end is the state at the start of the trace: empty
 * for a trace that began with an empty allocator.
 *
 * cli_timeline needs no replay: active and reserved bytes after each entry
 * (the data of `memsnap plot`) from the final state minus the trace's net
 * effect.
 *
 * Invariants of cli_state_t: b[] sorted by addr with distinct addresses;
 * g[] sorted by addr, ranges disjoint.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_state_free(cli_state_t *st) {
  free(st->b);
  free(st->g);
  memset(st, 0, sizeof *st);
}

/* ---- live blocks during the walk: a treap keyed by address -------------
 * (the sorted array of cli_state_t costs a memmove per alloc and free; a
 * trace of millions of entries needs O(log n)).  Nodes live in one array,
 * index 0 is "none"; priorities are a fixed xorshift sequence, so runs are
 * deterministic.  Invariants (bt_check): in-order addresses strictly
 * increase; a node's priority is >= its children's; the nodes reachable
 * from the root plus the free list are exactly nodes 1..cnt.  Every
 * operation is one descent: an insert notes where the new node's priority
 * belongs on its way to the neighbours the overlap checks need, and splits
 * only the subtree below that point; erase replaces the node by the merge
 * of its two children; a lookup gives the node at an address, its
 * predecessor and its successor together. */
typedef struct bnode_s {
  cli_lblock_t b;
  uint32_t c[2], pri; /* children: c[0] lower addresses, c[1] higher */
} bnode_t;

typedef struct btree_s {
  bnode_t *n;
  uint32_t cnt, cap, root, free_head, live;
  uint32_t rng;
} btree_t;

static uint32_t bt_rand(btree_t *t) {
  t->rng ^= t->rng << 13;
  t->rng ^= t->rng >> 17;
  t->rng ^= t->rng << 5;
  return t->rng;
}

/* Split the subtree at x into keys < a (into *l) and >= a (into *r). */
static void bt_split(bnode_t *n, uint32_t x, uint64_t a, uint32_t *l,
                     uint32_t *r) {
  while (x) {
    if (n[x].b.addr < a) {
      *l = x;
      l = &n[x].c[1];
      x = n[x].c[1];
    } else {
      *r = x;
      r = &n[x].c[0];
      x = n[x].c[0];
    }
  }
  *l = *r = 0;
}

/* Merge two subtrees (every key of l below every key of r). */
static uint32_t bt_merge(bnode_t *n, uint32_t l, uint32_t r) {
  uint32_t root = 0, *link = &root;
  while (l && r) {
    if (n[l].pri > n[r].pri) {
      *link = l;
      link = &n[l].c[1];
      l = n[l].c[1];
    } else {
      *link = r;
      link = &n[r].c[0];
      r = n[r].c[0];
    }
  }
  *link = l ? l : r;
  return root;
}

/* The link (root or child field) that holds the node at address a, or
 * the empty link where it would hang.  Valid until the next insert. */
static uint32_t *bt_link(btree_t *t, uint64_t a) {
  uint32_t *link = &t->root;
  while (*link && t->n[*link].b.addr != a)
    link = &t->n[*link].c[t->n[*link].b.addr < a];
  return link;
}

static uint32_t bt_find(btree_t *t, uint64_t a) { return *bt_link(t, a); }

/* One descent: *pred the last node with addr < a, *geq the first with
 * addr >= a (0: none).  *geq is the node at a when there is one. */
static void bt_around(const btree_t *t, uint64_t a, uint32_t *pred,
                      uint32_t *geq) {
  uint32_t x = t->root, p = 0, g = 0;
  while (x && t->n[x].b.addr != a) { /* branch-free steps */
    bool right = t->n[x].b.addr < a;
    p = right ? x : p;
    g = right ? g : x;
    x = t->n[x].c[right];
  }
  if (x) {
    g = x; /* the predecessor: the rightmost node of the left subtree */
    for (uint32_t y = t->n[x].c[0]; y; y = t->n[y].c[1])
      p = y;
  }
  *pred = p;
  *geq = g;
}

/* First node with addr >= a, or 0. */
static uint32_t bt_lb(const btree_t *t, uint64_t a) {
  uint32_t p, g;
  bt_around(t, a, &p, &g);
  return g;
}

/* Room for one more node; links into t->n stay valid until the next
 * bt_reserve. */
static int bt_reserve(btree_t *t) {
  if (t->free_head)
    return 0;
  return MSNAP_GROW(t->n, t->cap, (uint64_t)t->cnt + 2);
}

/* Where an insert at a goes, and the neighbours, in one descent:
 * *pred, *geq as bt_around; the returned link is the first on a's search
 * path whose node has a priority below pri (or the empty link at its end):
 * a new node of priority pri hangs there (bt_hang).  Only meaningful when
 * no node is at a. */
static uint32_t *bt_spot(btree_t *t, uint64_t a, uint32_t pri,
                         uint32_t *pred, uint32_t *geq) {
  uint32_t *link = &t->root, *hang = NULL, p = 0, g = 0;
  while (*link) {
    uint32_t x = *link;
    if (!hang && t->n[x].pri < pri)
      hang = link;
    if (t->n[x].b.addr == a) {
      g = x;
      for (uint32_t y = t->n[x].c[0]; y; y = t->n[y].c[1])
        p = y;
      break;
    }
    bool right = t->n[x].b.addr < a;
    p = right ? x : p;
    g = right ? g : x;
    link = &t->n[x].c[right];
  }
  *pred = p;
  *geq = g;
  return hang ? hang : link;
}

/* A new node for b with priority pri, hung at link (from bt_spot after
 * bt_reserve): the subtree that was there splits into its children. */
static void bt_hang(btree_t *t, uint32_t *link, const cli_lblock_t *b,
                    uint32_t pri) {
  uint32_t x = t->free_head;
  if (x)
    t->free_head = t->n[x].c[0];
  else
    x = ++t->cnt; /* index 0 stays "none" */
  bnode_t *n = t->n;
  n[x].b = *b;
  n[x].pri = pri;
  bt_split(n, *link, b->addr, &n[x].c[0], &n[x].c[1]);
  *link = x;
  t->live++;
}

static int bt_insert(btree_t *t, const cli_lblock_t *b) {
  if (bt_reserve(t) != 0)
    return -1;
  uint32_t pri = bt_rand(t), p, g;
  bt_hang(t, bt_spot(t, b->addr, pri, &p, &g), b, pri);
  return 0;
}

/* Remove the node held by *link (from bt_link, nonzero). */
static void bt_erase_at(btree_t *t, uint32_t *link) {
  uint32_t x = *link;
  *link = bt_merge(t->n, t->n[x].c[0], t->n[x].c[1]);
  t->n[x].c[0] = t->free_head;
  t->free_head = x;
  t->live--;
}

/* In-order walk without recursion (a file chooses the addresses, so the
 * depth is not trusted): calls f on each node in address order; stops and
 * returns false when f does.  stack: room for t->cnt entries. */
typedef bool (*bt_visit_fn)(const btree_t *t, uint32_t x, void *arg);

static bool bt_inorder(const btree_t *t, uint32_t *stack, bt_visit_fn f,
                       void *arg) {
  uint32_t sp = 0, x = t->root;
  while (x || sp) {
    while (x) {
      if (sp >= t->cnt)
        return false; /* more nodes on a path than exist: a cycle */
      stack[sp++] = x;
      x = t->n[x].c[0];
    }
    x = stack[--sp];
    if (!f(t, x, arg))
      return false;
    x = t->n[x].c[1];
  }
  return true;
}

static bool bt_flatten_one(const btree_t *t, uint32_t x, void *arg) {
  cli_state_t *st = arg;
  st->b[st->nb++] = t->n[x].b;
  return true;
}

typedef struct bt_check_s {
  uint32_t seen;
  bool have_prev;
  uint64_t prev;
} bt_check_t;

static bool bt_check_one(const btree_t *t, uint32_t x, void *arg) {
  bt_check_t *c = arg;
  const bnode_t *v = &t->n[x];
  if (x > t->cnt || ++c->seen > t->live)
    return false;
  if (c->have_prev && v->b.addr <= c->prev)
    return false;
  if ((v->c[0] && t->n[v->c[0]].pri > v->pri) || (v->c[1] && t->n[v->c[1]].pri > v->pri))
    return false;
  c->have_prev = true;
  c->prev = v->b.addr;
  return true;
}

/* The invariants at the top of this section; MSNAP_DEBUG >= 2 runs it
 * after every operation of the walk. */
static bool bt_check(const btree_t *t) {
  uint32_t *stack = malloc(((size_t)t->cnt + 1) * sizeof *stack);
  bt_check_t c = {0, false, 0};
  bool ok = stack && bt_inorder(t, stack, bt_check_one, &c) &&
            c.seen == t->live;
  free(stack);
  uint32_t nfree = 0;
  for (uint32_t x = t->free_head; ok && x; x = t->n[x].c[0])
    if (x > t->cnt || ++nfree > t->cnt)
      ok = false;
  return ok && c.seen + nfree == t->cnt;
}

/* ---- live segments during the walk: a treap keyed by (address, age) ---
 * (the sorted array of cli_state_t costs a memmove per segment_free,
 * segment_map and segment_unmap undone: 100 K segment_free entries at
 * increasing addresses took 4 s, quadratic).  As the block treap, nodes
 * in one array, index 0 "none", fixed xorshift priorities.  The final
 * state may hold several segments at one address (a file lists what it
 * likes), so the key is the address and then `age`: the segments of the
 * final state in their order, and each segment the walk inserts before
 * those already at its address (the order the sorted array had when a
 * segment was inserted at its lower bound, which the start state keeps).
 * Invariants: in-order keys strictly increase; a node's priority is >=
 * its children's. */
typedef struct gnode_s {
  cli_lseg_t g;
  uint64_t age;
  uint32_t c[2], pri;
} gnode_t;

typedef struct gtree_s {
  gnode_t *n;
  uint32_t cnt, cap, root, free_head, live;
  uint32_t rng;
  uint64_t next_age; /* the next inserted segment's age (decreasing) */
  uint64_t version;  /* changes with every insert and erase (hints) */
} gtree_t;

#define GT_FIRST_AGE (UINT64_C(1) << 63)

static bool gt_less(const gnode_t *x, uint64_t addr, uint64_t age) {
  return x->g.addr < addr || (x->g.addr == addr && x->age < age);
}

/* Split the subtree at x into keys < (addr, age) and the others. */
static void gt_split(gnode_t *n, uint32_t x, uint64_t addr, uint64_t age,
                     uint32_t *l, uint32_t *r) {
  while (x) {
    if (gt_less(&n[x], addr, age)) {
      *l = x;
      l = &n[x].c[1];
      x = n[x].c[1];
    } else {
      *r = x;
      r = &n[x].c[0];
      x = n[x].c[0];
    }
  }
  *l = *r = 0;
}

static uint32_t gt_merge(gnode_t *n, uint32_t l, uint32_t r) {
  uint32_t root = 0, *link = &root;
  while (l && r) {
    if (n[l].pri > n[r].pri) {
      *link = l;
      link = &n[l].c[1];
      l = n[l].c[1];
    } else {
      *link = r;
      link = &n[r].c[0];
      r = n[r].c[0];
    }
  }
  *link = l ? l : r;
  return root;
}

/* Insert g with the given age: its node, or 0 on ENOMEM. */
static uint32_t gt_insert_age(gtree_t *t, const cli_lseg_t *g, uint64_t age) {
  uint32_t x = t->free_head;
  if (x) {
    t->free_head = t->n[x].c[0];
  } else {
    if (MSNAP_GROW(t->n, t->cap, (uint64_t)t->cnt + 2) != 0)
      return 0;
    x = ++t->cnt;
  }
  gnode_t *n = t->n;
  t->rng ^= t->rng << 13;
  t->rng ^= t->rng >> 17;
  t->rng ^= t->rng << 5;
  n[x].g = *g;
  n[x].age = age;
  n[x].pri = t->rng;
  n[x].c[0] = n[x].c[1] = 0;
  /* where x's priority belongs on its key's path: split the subtree there */
  uint32_t *link = &t->root;
  while (*link && n[*link].pri >= n[x].pri)
    link = &n[*link].c[!gt_less(&n[x], n[*link].g.addr, n[*link].age)];
  gt_split(n, *link, g->addr, age, &n[x].c[0], &n[x].c[1]);
  *link = x;
  t->live++;
  t->version++;
  return x;
}

/* Insert g before the segments already at its address. */
static uint32_t gt_insert(gtree_t *t, const cli_lseg_t *g) {
  return gt_insert_age(t, g, --t->next_age);
}

static void gt_erase(gtree_t *t, uint32_t x) {
  uint32_t *link = &t->root;
  while (*link != x)
    link = &t->n[*link].c[gt_less(&t->n[*link], t->n[x].g.addr,
                                  t->n[x].age)];
  *link = gt_merge(t->n, t->n[x].c[0], t->n[x].c[1]);
  t->n[x].c[0] = t->free_head;
  t->free_head = x;
  t->live--;
  t->version++;
}

/* The invariants at the top of this section (and every node live or
 * free, once); MSNAP_DEBUG >= 2 runs it during the walk, with bt_check
 * (after every entry while the treap holds at most 1024 segments). */
static bool gt_check(const gtree_t *t) {
  uint32_t *stack = malloc(((size_t)t->cnt + 1) * sizeof *stack);
  if (!stack) return false;
  uint32_t sp = 0, x = t->root, seen = 0, prev = 0;
  bool ok = true;
  while (ok && (x || sp)) {
    while (ok && x) {
      if (x > t->cnt || sp > t->cnt) {
        ok = false; /* a cycle, or an index out of the array */
        break;
      }
      const gnode_t *v = &t->n[x];
      if ((v->c[0] && t->n[v->c[0]].pri > v->pri) ||
          (v->c[1] && t->n[v->c[1]].pri > v->pri))
        ok = false;
      stack[sp++] = x;
      x = v->c[0];
    }
    if (!ok) break;
    x = stack[--sp];
    if (++seen > t->live ||
        (prev && !gt_less(&t->n[prev], t->n[x].g.addr, t->n[x].age)))
      ok = false;
    prev = x;
    x = t->n[x].c[1];
  }
  free(stack);
  uint32_t nfree = 0;
  for (uint32_t y = t->free_head; ok && y; y = t->n[y].c[0])
    if (y > t->cnt || ++nfree > t->cnt)
      ok = false;
  return ok && seen == t->live && seen + nfree == t->cnt;
}

/* First segment with addr >= a, or 0. */
static uint32_t gt_lb(const gtree_t *t, uint64_t a) {
  uint32_t x = t->root, r = 0;
  while (x) {
    if (t->n[x].g.addr >= a) {
      r = x;
      x = t->n[x].c[0];
    } else {
      x = t->n[x].c[1];
    }
  }
  return r;
}

/* The segment before x (its predecessor in key order), or 0. */
static uint32_t gt_pred(const gtree_t *t, uint32_t x) {
  uint32_t y = t->root, r = 0;
  while (y) {
    if (gt_less(&t->n[y], t->n[x].g.addr, t->n[x].age)) {
      r = y;
      y = t->n[y].c[1];
    } else {
      y = t->n[y].c[0];
    }
  }
  return r;
}

/* The segment after x, or 0. */
static uint32_t gt_succ(const gtree_t *t, uint32_t x) {
  uint32_t y = t->root, r = 0;
  while (y) {
    if (gt_less(&t->n[x], t->n[y].g.addr, t->n[y].age)) {
      r = y;
      y = t->n[y].c[0];
    } else {
      y = t->n[y].c[1];
    }
  }
  return r;
}

/* The last segment with addr <= a, or 0; and in *after (when not NULL)
 * the first with addr > a, or 0: its successor in key order, found in the
 * same descent (every key with addr <= a precedes every other). */
static uint32_t gt_last_le2(const gtree_t *t, uint64_t a, uint32_t *after) {
  uint32_t x = t->root, r = 0, nx = 0;
  while (x) {
    if (t->n[x].g.addr <= a) {
      r = x;
      x = t->n[x].c[1];
    } else {
      nx = x;
      x = t->n[x].c[0];
    }
  }
  if (after) *after = nx;
  return r;
}

static uint32_t gt_last_le(const gtree_t *t, uint64_t a) {
  return gt_last_le2(t, a, NULL);
}

/* A find of gt_containing: node x is the last segment starting at or
 * below every address in [x's address, next) while the tree is at
 * `version`.  The walk keeps SEG_HINTS of them, direct-mapped by the
 * hash of the address's 2 MiB granule: an entry in a granule met before
 * finds its segment without a descent as long as no segment came or went
 * (a real trace has few segment entries among its allocs and frees). */
typedef struct seg_hint_s {
  uint32_t x;
  bool to_end; /* no segment after x */
  uint64_t next, version;
} seg_hint_t;

enum { SEG_HINT_BITS = 12, SEG_HINTS = 1u << SEG_HINT_BITS };

/* Segment containing [a, a+n), or 0.  hints: SEG_HINTS of them. */
static uint32_t gt_containing(const gtree_t *t, uint64_t a, uint64_t n,
                              seg_hint_t *hints) {
  if (a == UINT64_MAX)
    return 0; /* (the array's search for a + 1 found none) */
  /* (by the 2 MiB granule, the smallest segment: every address of a
   * granule lies in the same segment or the next one) */
  seg_hint_t *h =
      &hints[msnap__mix64(a >> 21) >> (64 - SEG_HINT_BITS)];
  uint32_t x;
  if (h->x && h->version == t->version && t->n[h->x].g.addr <= a &&
      (h->to_end || a < h->next)) {
    x = h->x;
  } else {
    uint32_t nx;
    x = gt_last_le2(t, a, &nx);
    if (!x)
      return 0;
    *h = (seg_hint_t){x, nx == 0, nx ? t->n[nx].g.addr : 0, t->version};
  }
  const cli_lseg_t *g = &t->n[x].g;
  if (g->addr <= a && a + n <= g->addr + g->size)
    return x;
  return 0;
}

/* Any segment overlapping [a, a+n)? */
static bool gt_overlaps(const gtree_t *t, uint64_t a, uint64_t n) {
  uint32_t i = gt_lb(t, a);
  if (i && t->n[i].g.addr < a + n)
    return true;
  /* the segment before: the last with addr < a */
  uint32_t p = a ? gt_last_le(t, a - 1) : 0;
  if (p && t->n[p].g.addr + t->n[p].g.size > a)
    return true;
  return false;
}

/* In-order walk into st->g (room for t->live); false on a cycle. */
static bool gt_flatten(const gtree_t *t, cli_state_t *st) {
  uint32_t *stack = malloc(((size_t)t->cnt + 1) * sizeof *stack);
  if (!stack)
    return false;
  uint32_t sp = 0, x = t->root;
  st->ng = 0;
  while (x || sp) {
    while (x) {
      if (sp >= t->cnt) {
        free(stack);
        return false;
      }
      stack[sp++] = x;
      x = t->n[x].c[0];
    }
    x = stack[--sp];
    st->g[st->ng++] = t->n[x].g;
    x = t->n[x].c[1];
  }
  free(stack);
  return true;
}

/* Sort keys of cli_state_final: the list position breaks ties, so that
 * the order is the one inserting one by one into sorted arrays gave (a
 * segment went before the others at its address; a block at an address
 * already taken is dropped, the first one kept). */
typedef struct seg_key_s {
  cli_lseg_t g;
  uint32_t pos;
} seg_key_t;

typedef struct block_key_s {
  cli_lblock_t b;
  uint32_t pos;
} block_key_t;

static int cmp_seg_key(const void *x, const void *y) {
  const seg_key_t *a = x, *b = y;
  if (a->g.addr != b->g.addr) return a->g.addr < b->g.addr ? -1 : 1;
  return a->pos < b->pos ? 1 : a->pos > b->pos ? -1 : 0; /* later first */
}

static int cmp_block_key(const void *x, const void *y) {
  const block_key_t *a = x, *b = y;
  if (a->b.addr != b->b.addr) return a->b.addr < b->b.addr ? -1 : 1;
  return a->pos < b->pos ? -1 : a->pos > b->pos; /* earlier first */
}

/* The final state, sorted once: O(n log n) where inserting each segment
 * and block in turn into the sorted arrays cost a memmove of those after
 * it -- quadratic for segments listed at one address, or in decreasing
 * address order (400 K segments at one address: 47 s). */
int cli_state_final(const msnap_snap_t *s, int64_t device, cli_state_t *st) {
  memset(st, 0, sizeof *st);
  uint32_t ng = 0, nb = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *seg = &s->segments[i];
    if (seg->device != device)
      continue;
    ng++;
    for (uint32_t k = 0; k < seg->nblocks; k++)
      nb += cli_block_active(&s->blocks[seg->first_block + k]);
  }
  seg_key_t *gk = malloc(((size_t)ng + 1) * sizeof *gk);
  block_key_t *bk = malloc(((size_t)nb + 1) * sizeof *bk);
  if (!gk || !bk) {
    free(gk);
    free(bk);
    return -1;
  }
  ng = nb = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *seg = &s->segments[i];
    if (seg->device != device)
      continue;
    gk[ng].g = (cli_lseg_t){.addr = seg->address,
                            .size = seg->total_size,
                            .stream = seg->stream,
                            .from_final = true,
                            .is_large = seg->is_large != 0,
                            .is_expandable = seg->is_expandable != 0};
    gk[ng].pos = ng;
    ng++;
    uint64_t a = seg->address;
    for (uint32_t k = 0; k < seg->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[seg->first_block + k];
      uint64_t ba = (b->keys & MSNAP_K_ADDRESS) ? b->address : a;
      a += b->size;
      if (!cli_block_active(b))
        continue;
      bk[nb].b = (cli_lblock_t){
          .addr = ba,
          .size = b->size,
          .requested = b->requested_size,
          .stream = seg->stream,
          .from_final = true,
          .pending = b->state == MSNAP_BLOCK_ACTIVE_PENDING_FREE,
          .has_requested = (b->keys & MSNAP_K_REQUESTED) != 0};
      bk[nb].pos = nb;
      nb++;
    }
  }
  qsort(gk, ng, sizeof *gk, cmp_seg_key);
  qsort(bk, nb, sizeof *bk, cmp_block_key);
  int rc = 0;
  if (ng) {
    st->g = malloc((size_t)ng * sizeof *st->g);
    if (!st->g) rc = -1;
    for (uint32_t i = 0; !rc && i < ng; i++)
      st->g[i] = gk[i].g;
    if (!rc) st->ng = st->capg = ng;
  }
  if (!rc && nb) {
    st->b = malloc((size_t)nb * sizeof *st->b);
    if (!st->b) rc = -1;
    for (uint32_t i = 0; !rc && i < nb; i++)
      if (i == 0 || bk[i].b.addr != bk[i - 1].b.addr)
        st->b[st->nb++] = bk[i].b;
    if (!rc) st->capb = nb;
  }
  free(gk);
  free(bk);
  return rc;
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* (address, size) of a workspace_snapshot entry; sorted by address. */
typedef struct ws_entry_s {
  uint64_t addr, size;
} ws_entry_t;

static int cmp_ws(const void *x, const void *y) {
  const ws_entry_t *a = x, *b = y;
  if (a->addr != b->addr) return a->addr < b->addr ? -1 : 1;
  return a->size < b->size ? -1 : a->size > b->size;
}

int cli_workspace_addrs(const msnap_snap_t *s, int64_t device,
                        uint64_t **out, uint32_t *n) {
  *out = NULL;
  *n = 0;
  const msnap_trace_list_t *tl = cli_trace(s, device);
  uint32_t k = 0;
  for (uint32_t i = 0; tl && i < tl->n; i++)
    k += tl->v[i].action == MSNAP_ACTION_WORKSPACE_SNAPSHOT;
  if (k == 0) return 0;
  ws_entry_t *named = malloc((size_t)k * sizeof *named);
  uint64_t *v = malloc((size_t)k * sizeof *v);
  if (named == NULL || v == NULL) {
    free(named);
    free(v);
    return -1;
  }
  k = 0;
  for (uint32_t i = 0; i < tl->n; i++)
    if (tl->v[i].action == MSNAP_ACTION_WORKSPACE_SNAPSHOT)
      named[k++] = (ws_entry_t){tl->v[i].addr, tl->v[i].size};
  qsort(named, k, sizeof *named, cmp_ws);
  /* the final segments they name that have a buffer's shape: one block,
   * the entry's size (a caching segment that took the address later has
   * its own blocks and size) */
  uint32_t m = 0;
  for (uint32_t i = 0; i < s->nsegments && m < k; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    ws_entry_t key = {g->address, g->total_size};
    if (g->device == device && g->nblocks == 1 &&
        bsearch(&key, named, k, sizeof *named, cmp_ws) != NULL)
      v[m++] = g->address;
  }
  free(named);
  if (m == 0) {
    free(v);
    return 0;
  }
  qsort(v, m, sizeof *v, cmp_u64);
  *out = v;
  *n = m;
  return 0;
}

uint64_t cli_segment_end(const msnap_ssegment_t *g) {
  return g->total_size > UINT64_MAX - g->address ? UINT64_MAX
                                                  : g->address + g->total_size;
}

/* (device, address, index) of a segment, sorted as cli_segment_overlaps
 * visits them. */
typedef struct seg_order_s {
  int64_t device;
  uint64_t address;
  uint32_t index;
} seg_order_t;

static int seg_order_cmp(const void *x, const void *y) {
  const seg_order_t *a = x, *b = y;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  if (a->address != b->address) return a->address < b->address ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

int cli_segment_overlaps(const msnap_snap_t *s, int64_t device,
                         cli_overlap_fn visit, void *arg) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    n += device == INT64_MIN || s->segments[i].device == device;
  if (n < 2) return 0;
  seg_order_t *k = malloc((size_t)n * sizeof *k);
  if (k == NULL) return -1;
  n = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (device == INT64_MIN || s->segments[i].device == device)
      k[n++] = (seg_order_t){s->segments[i].device, s->segments[i].address, i};
  qsort(k, n, sizeof *k, seg_order_cmp);
  int found = 0;
  for (uint32_t j = 1; j < n; j++) {
    const msnap_ssegment_t *p = &s->segments[k[j - 1].index];
    if (k[j].device != k[j - 1].device || k[j].address >= cli_segment_end(p))
      continue;
    found++;
    if (!visit(arg, k[j - 1].index, k[j].index)) break;
  }
  free(k);
  return found;
}

bool cli_is_workspace(const uint64_t *ws, uint32_t n, uint64_t addr) {
  return n && bsearch(&addr, ws, n, sizeof *ws, cmp_u64) != NULL;
}

/* st less torch_npu's workspace buffers of the device (their segments and
 * the blocks inside them): their whole life is outside the trace, which
 * holds only their synthetic entries (skipped by the walk), so a caching
 * segment freed at the same address earlier in the trace is no overlap.
 * -1 on ENOMEM. */
static int drop_workspace(const msnap_snap_t *s, int64_t device,
                          cli_state_t *st) {
  uint64_t *ws;
  uint32_t nws;
  if (cli_workspace_addrs(s, device, &ws, &nws) != 0) return -1;
  if (nws == 0) return 0;
  uint32_t ng = 0;
  for (uint32_t i = 0; i < st->ng; i++) {
    const cli_lseg_t g = st->g[i];
    if (!cli_is_workspace(ws, nws, g.addr)) {
      st->g[ng++] = g;
      continue;
    }
    uint32_t nb = 0;
    for (uint32_t k = 0; k < st->nb; k++)
      if (st->b[k].addr < g.addr || st->b[k].addr - g.addr >= g.size)
        st->b[nb++] = st->b[k];
    st->nb = nb;
  }
  st->ng = ng;
  free(ws);
  return 0;
}

typedef struct bctx_s {
  cli_violation_cb cb;
  void *arg;
  long n;
} bctx_t;

static void viol(bctx_t *c, uint32_t entry, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void viol(bctx_t *c, uint32_t entry, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  c->n++;
  if (!c->cb)
    return; /* only counted: no message to format */
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->cb(c->arg, entry, msg);
}

/* Extent used for overlap tests: a block re-created from a free only
 * knows its requested size (a lower bound of its block size). */
static uint64_t extent(const cli_lblock_t *b) {
  uint64_t n = b->size ? b->size : b->requested;
  return n ? n : 1;
}

/*
 * Undo the trace of `device` (see the top of the file).  The caller owns
 * *start afterwards.  Returns the number of violations, -1 on ENOMEM.
 */
long cli_backward(const msnap_snap_t *s, int64_t device, cli_violation_cb cb,
                  void *arg, cli_state_t *start) {
  cli_state_t st;
  bctx_t c = {cb, arg, 0};
  btree_t bt = {.rng = 0x9e3779b9u};
  gtree_t gt = {.rng = 0x85ebca6bu, .next_age = GT_FIRST_AGE};
  if (cli_state_final(s, device, &st) ||
      drop_workspace(s, device, &st)) {
    cli_state_free(&st);
    return -1;
  }
  seg_hint_t *seg_hint = calloc(SEG_HINTS, sizeof *seg_hint);
  if (!seg_hint)
    goto nomem;
  /* the blocks and the segments go into their treaps for the walk (st
   * keeps the arrays, for the start state) */
  for (uint32_t k = 0; k < st.nb; k++)
    if (bt_insert(&bt, &st.b[k]))
      goto nomem;
  st.nb = 0;
  for (uint32_t k = 0; k < st.ng; k++)
    if (!gt_insert_age(&gt, &st.g[k], GT_FIRST_AGE + k))
      goto nomem;
  st.ng = 0;
#define B(x) (bt.n[x].b)
#define G(x) (gt.n[x].g)
  /* The link of the block the last free_completed undo re-created (hung):
   * PyTorch records free_requested and free_completed of a block one
   * after the other when no stream use delays the free, so walking
   * backwards the free_requested finds its block here without a descent
   * (and an alloc right before it, too).  Valid until the treap next
   * changes shape (an insert or an erase): reset to NULL there. */
  uint32_t *hung = NULL;
  uint64_t hung_addr = 0;
  const msnap_trace_list_t *tl = cli_trace(s, device);
  uint32_t n = tl ? tl->n : 0;
  for (uint32_t ii = n; ii > 0; ii--) {
    uint32_t i = ii - 1;
    const msnap_strace_t *e = &tl->v[i];
    uint64_t a = e->addr, sz = e->size;
    uint32_t bi;
    if (cli_workspace_synthetic(tl, i))
      continue;
    switch (e->action) {
    case MSNAP_ACTION_ALLOC: {
      uint32_t *link = hung && hung_addr == a ? hung : bt_link(&bt, a);
      bi = *link;
      if (!bi) {
        viol(&c, i,
             "alloc of 0x%" PRIx64 " (%" PRIu64 " B): the block is neither "
             "live at the end nor freed later in the trace",
             a, sz);
        break;
      }
      if (B(bi).pending && !B(bi).from_final)
        viol(&c, i,
             "alloc of 0x%" PRIx64 ": a free_completed follows with no "
             "free_requested in between",
             a);
      if (B(bi).from_final && B(bi).has_requested &&
          B(bi).requested != sz)
        viol(&c, i,
             "alloc size %" PRIu64 " differs from the live block's "
             "requested_size %" PRIu64 " at 0x%" PRIx64,
             sz, B(bi).requested, a);
      else if (!B(bi).from_final && B(bi).requested != sz)
        viol(&c, i,
             "alloc size %" PRIu64 " differs from the size %" PRIu64
             " of its later free at 0x%" PRIx64,
             sz, B(bi).requested, a);
      if (!gt_containing(&gt, a, extent(&B(bi)), seg_hint))
        viol(&c, i,
             "alloc at 0x%" PRIx64 " lies outside every live segment "
             "(segment_alloc missing or after it)",
             a);
      bt_erase_at(&bt, link);
      hung = NULL;
      break;
    }
    case MSNAP_ACTION_FREE_COMPLETED: {
      hung = NULL; /* (bt_reserve may move the nodes) */
      if (bt_reserve(&bt) != 0)
        goto nomem;
      uint32_t kp, kn, pri = bt_rand(&bt);
      uint32_t *hang = bt_spot(&bt, a, pri, &kp, &kn);
      if (kn && B(kn).addr == a) {
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " but the block is live right "
             "after it (double free, or an alloc is missing)",
             a);
        break;
      }
      cli_lblock_t b = {.addr = a,
                        .requested = sz,
                        .stream = msnap__tattr(s, e)->stream,
                        .pending = true,
                        .has_requested = true};
      if (kp && B(kp).addr + extent(&B(kp)) > a)
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " overlaps the live block at "
             "0x%" PRIx64,
             a, B(kp).addr);
      else if (kn && a + (sz ? sz : 1) > B(kn).addr)
        viol(&c, i,
             "free_completed of 0x%" PRIx64 " (%" PRIu64 " B) overlaps the "
             "live block at 0x%" PRIx64,
             a, sz, B(kn).addr);
      if (!gt_containing(&gt, a, sz ? sz : 1, seg_hint))
        viol(&c, i,
             "free_completed at 0x%" PRIx64 " lies outside every live "
             "segment (segment_free before free_completed?)",
             a);
      bt_hang(&bt, hang, &b, pri);
      hung = hang;
      hung_addr = a;
      break;
    }
    case MSNAP_ACTION_FREE_REQUESTED:
      bi = hung && hung_addr == a ? *hung : bt_find(&bt, a);
      if (!bi) {
        viol(&c, i,
             "free_requested of 0x%" PRIx64 " with no later free_completed "
             "and no active_pending_free block at the end",
             a);
        break;
      }
      if (!B(bi).pending)
        viol(&c, i,
             "free_requested of 0x%" PRIx64 " but the block is still "
             "allocated (not pending) afterwards",
             a);
      else if (B(bi).requested != sz &&
               (B(bi).has_requested || !B(bi).from_final))
        viol(&c, i,
             "free_requested size %" PRIu64 " differs from requested_size "
             "%" PRIu64 " at 0x%" PRIx64,
             sz, B(bi).requested, a);
      B(bi).pending = false;
      break;
    case MSNAP_ACTION_SEGMENT_ALLOC: {
      uint32_t k = gt_lb(&gt, a);
      if (!k || G(k).addr != a) {
        viol(&c, i,
             "segment_alloc of 0x%" PRIx64 " (%" PRIu64 " B): no such "
             "segment afterwards (neither at the end nor freed later)",
             a, sz);
        break;
      }
      if (G(k).size != sz)
        viol(&c, i,
             "segment_alloc size %" PRIu64 " differs from the segment's "
             "size %" PRIu64 " at 0x%" PRIx64,
             sz, G(k).size, a);
      uint32_t in = bt_lb(&bt, a);
      if (in && B(in).addr < a + G(k).size)
        viol(&c, i,
             "segment_alloc of 0x%" PRIx64 " comes after the alloc of the "
             "block 0x%" PRIx64 " inside it (or that block is never "
             "allocated in the trace)",
             a, B(in).addr);
      gt_erase(&gt, k);
      break;
    }
    case MSNAP_ACTION_SEGMENT_FREE: {
      if (gt_overlaps(&gt, a, sz ? sz : 1)) {
        viol(&c, i,
             "segment_free of 0x%" PRIx64 " (%" PRIu64 " B) but a live "
             "segment overlaps it right after",
             a, sz);
        break;
      }
      uint32_t in = bt_lb(&bt, a);
      if (in && B(in).addr < a + sz)
        viol(&c, i,
             "segment_free of 0x%" PRIx64 " while the block 0x%" PRIx64
             " inside it is live",
             a, B(in).addr);
      cli_lseg_t g = {.addr = a,
                      .size = sz,
                      .stream = msnap__tattr(s, e)->stream,
                      .is_large = sz != (2u << 20)};
      if (!gt_insert(&gt, &g))
        goto nomem;
      break;
    }
    case MSNAP_ACTION_SEGMENT_MAP: {
      uint32_t k = gt_containing(&gt, a, sz ? sz : 1, seg_hint);
      if (!k) {
        viol(&c, i,
             "segment_map of [0x%" PRIx64 ", +%" PRIu64 ") not inside a "
             "live segment afterwards",
             a, sz);
        break;
      }
      uint32_t in = bt_lb(&bt, a);
      if (in && B(in).addr < a + sz)
        viol(&c, i,
             "segment_map of 0x%" PRIx64 " comes after the alloc of the "
             "block 0x%" PRIx64 " inside it",
             a, B(in).addr);
      cli_lseg_t g = G(k);
      gt_erase(&gt, k);
      if (g.addr < a) {
        cli_lseg_t l = g;
        l.size = a - g.addr;
        if (!gt_insert(&gt, &l))
          goto nomem;
      }
      if (a + sz < g.addr + g.size) {
        cli_lseg_t r = g;
        r.addr = a + sz;
        r.size = g.addr + g.size - (a + sz);
        if (!gt_insert(&gt, &r))
          goto nomem;
      }
      break;
    }
    case MSNAP_ACTION_SEGMENT_UNMAP: {
      if (gt_overlaps(&gt, a, sz ? sz : 1)) {
        viol(&c, i,
             "segment_unmap of [0x%" PRIx64 ", +%" PRIu64 ") but a live "
             "range overlaps it right after",
             a, sz);
        break;
      }
      cli_lseg_t g = {.addr = a,
                      .size = sz,
                      .stream = msnap__tattr(s, e)->stream,
                      .is_large = true,
                      .is_expandable = true};
      uint32_t k = gt_insert(&gt, &g);
      if (!k)
        goto nomem;
      /* Mapped ranges of an expandable segment are one segment when they
       * touch: merge with the neighbours. */
      uint32_t nx = gt_succ(&gt, k);
      if (nx && G(nx).is_expandable && G(nx).addr == a + sz) {
        G(k).size += G(nx).size;
        gt_erase(&gt, nx);
      }
      uint32_t px = gt_pred(&gt, k);
      if (px && G(px).is_expandable && G(px).addr + G(px).size == a) {
        G(px).size += G(k).size;
        gt_erase(&gt, k);
      }
      break;
    }
    case MSNAP_ACTION_ANNOTATE:
      if (!bt_find(&bt, a))
        viol(&c, i, "annotate of 0x%" PRIx64 ": no live block there", a);
      break;
    default:
      break;
    }
    /* MSNAP_DEBUG >= 2 (meson -Ddebug_level=2): the treap's invariants */
    if (msnap_debug_level >= 2 && !bt_check(&bt)) {
      fprintf(stderr, "memsnap: internal error: live-block treap "
                      "invariants (entry %" PRIu32 ")\n", i);
      abort();
    }
    /* (the segment treap: after every entry while it is small, then at
     * entries 2^k -- a walk undoing 400 K segment_free entries would
     * otherwise check 400 K nodes 400 K times) */
    if (msnap_debug_level >= 2 && (gt.live <= 1024 || (i & (i - 1)) == 0) &&
        !gt_check(&gt)) {
      fprintf(stderr, "memsnap: internal error: live-segment treap "
                      "invariants (entry %" PRIu32 ")\n", i);
      abort();
    }
  }
#undef B
#undef G
  if (start) {
    /* the blocks and the segments back into the sorted arrays */
    uint32_t *stack = malloc(((size_t)bt.cnt + 1) * sizeof *stack);
    if (stack == NULL || MSNAP_GROW(st.b, st.capb, bt.live) != 0 ||
        MSNAP_GROW(st.g, st.capg, gt.live) != 0) {
      free(stack);
      goto nomem;
    }
    st.nb = 0;
    bool ok = bt_inorder(&bt, stack, bt_flatten_one, &st);
    free(stack);
    if (!ok || !gt_flatten(&gt, &st))
      goto nomem; /* (no cycle: the treaps' invariants hold) */
    *start = st;
  } else {
    cli_state_free(&st);
  }
  free(bt.n);
  free(gt.n);
  free(seg_hint);
  return c.n;
nomem:
  free(bt.n);
  free(gt.n);
  free(seg_hint);
  cli_state_free(&st);
  return -1;
}

/*
 * Active (requested bytes of live allocations) and reserved bytes after
 * each entry of a device trace, starting from the state at the start of
 * the trace: the final one (requested bytes of active blocks, their size
 * when no request is known; reserved bytes) minus the trace's net effect.
 * Two passes over the trace, no replay.  torch_npu's synthetic workspace
 * entries (cli_workspace_synthetic) are no history and count in neither
 * pass: the workspace segments are reserved from the start, their blocks
 * never active.  Arrays of tl->n + 1 values (index 0 = before the first
 * entry); caller frees both.
 */
uint32_t cli_timeline_visit(const msnap_snap_t *s, int64_t dev,
                            cli_timeline_fn visit, void *arg) {
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  uint32_t m = tl ? tl->n : 0;
  __int128 a0 = 0, r0 = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    r0 += g->total_size;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (cli_block_active(b))
        a0 += b->requested_size ? b->requested_size : b->size;
    }
  }
  for (uint32_t i = 0; i < m; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (cli_workspace_synthetic(tl, i))
      continue;
    switch (e->action) {
    case MSNAP_ACTION_ALLOC: a0 -= e->size; break;
    case MSNAP_ACTION_FREE_COMPLETED: a0 += e->size; break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP: r0 -= e->size; break;
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP: r0 += e->size; break;
    default: break;
    }
  }
  uint64_t a = a0 < 0 ? 0 : a0 > UINT64_MAX ? UINT64_MAX : (uint64_t)a0;
  uint64_t r = r0 < 0 ? 0 : r0 > UINT64_MAX ? UINT64_MAX : (uint64_t)r0;
  visit(arg, 0, a, r);
  for (uint32_t i = 0; i < m; i++) {
    const msnap_strace_t *e = &tl->v[i];
    switch (cli_workspace_synthetic(tl, i) ? MSNAP_ACTION_COUNT
                                           : e->action) {
    case MSNAP_ACTION_ALLOC: a += e->size; break;
    case MSNAP_ACTION_FREE_COMPLETED: a -= a >= e->size ? e->size : a; break;
    case MSNAP_ACTION_SEGMENT_ALLOC:
    case MSNAP_ACTION_SEGMENT_MAP: r += e->size; break;
    case MSNAP_ACTION_SEGMENT_FREE:
    case MSNAP_ACTION_SEGMENT_UNMAP: r -= r >= e->size ? e->size : r; break;
    default: break;
    }
    visit(arg, i + 1, a, r);
  }
  return m + 1;
}

typedef struct timeline_arrays_s {
  uint64_t *act, *res;
} timeline_arrays_t;

static void timeline_store(void *arg, uint32_t state, uint64_t act,
                           uint64_t res) {
  timeline_arrays_t *t = arg;
  t->act[state] = act;
  t->res[state] = res;
}

int cli_timeline(const msnap_snap_t *s, int64_t dev, uint64_t **act,
                 uint64_t **res, uint32_t *n) {
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  size_t m = tl ? tl->n : 0;
  timeline_arrays_t t = {malloc((m + 1) * sizeof *t.act),
                         malloc((m + 1) * sizeof *t.res)};
  *act = *res = NULL;
  *n = 0;
  if (!t.act || !t.res) {
    free(t.act);
    free(t.res);
    return -1;
  }
  *n = cli_timeline_visit(s, dev, timeline_store, &t);
  *act = t.act;
  *res = t.res;
  return 0;
}
