/*
 * pool.c -- the ordered sets of free blocks of a block pool.
 *
 * PyTorch keeps two std::set<Block*> per BlockPool (allocator-algorithm.md
 * §2.2): `blocks` ordered by (stream, size, ptr) for free mapped blocks and
 * `unmapped` ordered by (stream, ptr) for unmapped expandable VA.  Here each
 * set is an intrusive red-black tree whose nodes live inside the blocks
 * (block->node), so insertion and removal never allocate and a lookup is
 * one O(log n) descent.  Streams and pointers compare as unsigned 64-bit
 * integers, exactly as the C++ comparators cast them.
 *
 * Invariants (checked by msnap__rb_check):
 *   - binary-search order by the tree's key, strictly increasing (no two
 *     blocks share a key: the pointer makes keys unique);
 *   - the root is black, a red node has no red child, and every path from
 *     a node to a leaf crosses the same number of black nodes;
 *   - parent links agree with child links; `count` is the node count.
 *
 * The balancing code follows the classic parent-pointer formulation
 * (Cormen et al.; the BSD <sys/tree.h> macros), written out for this one
 * node type.  The children are indexed by direction (LEFT, RIGHT; !dir is
 * the mirror), so each pair of mirrored cases is written once.  Callers
 * hold the device lock.
 */
#include <stdio.h>

#include "alloc/alloc.h"

#define NODE(b) (&(b)->node)
#define BLOCK(n) ((msnap_block_t *)(n))

/* Directions: child[LEFT] holds the smaller keys, child[RIGHT] the larger. */
enum { LEFT = 0, RIGHT = 1 };

_Static_assert(offsetof(msnap_block_t, node) == 0,
               "block->node must be first so that a node is a block");

void msnap__rb_init(msnap_rbtree_t *t, bool by_addr) {
  t->root = NULL;
  t->count = 0;
  t->by_addr = by_addr;
}

/* Three-way comparison of block x against key (stream, size, ptr). */
static inline int key_cmp(bool by_addr, const msnap_block_t *x,
                          uint64_t stream, uint64_t size, uint64_t ptr) {
  if (x->stream != stream)
    return x->stream < stream ? -1 : 1;
  if (!by_addr && x->size != size)
    return x->size < size ? -1 : 1;
  if (x->ptr != ptr)
    return x->ptr < ptr ? -1 : 1;
  return 0;
}

/* A missing child (NULL) counts as black. */
static inline bool is_red(const msnap_rbnode_t *n) { return n && n->red; }

/* Point the link that held `old` at n: parent's child on old's side, or
 * the root when old had no parent. */
static void replace_link(msnap_rbtree_t *t, msnap_rbnode_t *parent,
                         const msnap_rbnode_t *old, msnap_rbnode_t *n) {
  if (!parent)
    t->root = n;
  else
    parent->child[parent->child[LEFT] == old ? LEFT : RIGHT] = n;
}

/* Rotate at x toward dir: x's child y on the other side takes x's place
 * and x becomes y's child on side dir (dir = LEFT: a left rotation). */
static void rotate(msnap_rbtree_t *t, msnap_rbnode_t *x, int dir) {
  msnap_rbnode_t *y = x->child[!dir];
  x->child[!dir] = y->child[dir];
  if (y->child[dir])
    y->child[dir]->parent = x;
  y->parent = x->parent;
  replace_link(t, x->parent, x, y);
  y->child[dir] = x;
  x->parent = y;
}

void msnap__bpool_init(msnap_bpool_t *p, bool is_small,
                       msnap_ppool_t *owner) {
  msnap__rb_init(&p->blocks, false);
  msnap__rb_init(&p->unmapped, true);
  p->get_free_blocks_call_count = 0;
  p->is_small = is_small;
  p->owner = owner;
}

/*
 * Insert block b (not in any set) into t.  The key must not be present
 * (block pointers are unique within a pool and stream).
 */
void msnap__rb_insert(msnap_rbtree_t *t, msnap_block_t *b) {
  msnap_rbnode_t *parent = NULL, **link = &t->root;
  msnap_rbnode_t *z = NODE(b);
  while (*link) {
    parent = *link;
    if (key_cmp(t->by_addr, BLOCK(parent), b->stream, b->size, b->ptr) > 0)
      link = &parent->child[LEFT];
    else
      link = &parent->child[RIGHT];
  }
  z->child[LEFT] = z->child[RIGHT] = NULL;
  z->parent = parent;
  z->red = 1;
  *link = z;
  t->count++;

  while ((parent = z->parent) && parent->red) {
    msnap_rbnode_t *g = parent->parent;
    int dir = parent == g->child[LEFT] ? LEFT : RIGHT; /* parent's side */
    msnap_rbnode_t *u = g->child[!dir];
    if (is_red(u)) {
      u->red = 0;
      parent->red = 0;
      g->red = 1;
      z = g;
      continue;
    }
    if (parent->child[!dir] == z) {
      rotate(t, parent, dir);
      msnap_rbnode_t *tmp = parent;
      parent = z;
      z = tmp;
    }
    parent->red = 0;
    g->red = 1;
    rotate(t, g, !dir);
  }
  t->root->red = 0;
}

/* Restore the black height after removing a black node; x (possibly NULL)
 * took its place under parent. */
static void erase_fixup(msnap_rbtree_t *t, msnap_rbnode_t *x,
                        msnap_rbnode_t *parent) {
  msnap_rbnode_t *w;
  while (!is_red(x) && x != t->root) {
    int dir = parent->child[LEFT] == x ? LEFT : RIGHT; /* x's side */
    w = parent->child[!dir];
    if (w->red) {
      w->red = 0;
      parent->red = 1;
      rotate(t, parent, dir);
      w = parent->child[!dir];
    }
    if (!is_red(w->child[LEFT]) && !is_red(w->child[RIGHT])) {
      w->red = 1;
      x = parent;
      parent = x->parent;
    } else {
      if (!is_red(w->child[!dir])) {
        if (w->child[dir])
          w->child[dir]->red = 0;
        w->red = 1;
        rotate(t, w, !dir);
        w = parent->child[!dir];
      }
      w->red = parent->red;
      parent->red = 0;
      if (w->child[!dir])
        w->child[!dir]->red = 0;
      rotate(t, parent, dir);
      x = t->root;
      break;
    }
  }
  if (x)
    x->red = 0;
}

/* Remove block b, which must be in t. */
void msnap__rb_erase(msnap_rbtree_t *t, msnap_block_t *b) {
  msnap_rbnode_t *old = NODE(b), *elm = old, *child, *parent;
  int red;
  if (!elm->child[LEFT]) {
    child = elm->child[RIGHT];
  } else if (!elm->child[RIGHT]) {
    child = elm->child[LEFT];
  } else {
    /* Two children: splice out the successor and put it in old's place. */
    elm = elm->child[RIGHT];
    while (elm->child[LEFT])
      elm = elm->child[LEFT];
    child = elm->child[RIGHT];
    parent = elm->parent;
    red = elm->red;
    if (child)
      child->parent = parent;
    replace_link(t, parent, elm, child);
    if (elm->parent == old)
      parent = elm;
    elm->child[LEFT] = old->child[LEFT];
    elm->child[RIGHT] = old->child[RIGHT];
    elm->parent = old->parent;
    elm->red = old->red;
    replace_link(t, old->parent, old, elm);
    old->child[LEFT]->parent = elm;
    if (old->child[RIGHT])
      old->child[RIGHT]->parent = elm;
    goto color;
  }
  parent = elm->parent;
  red = elm->red;
  if (child)
    child->parent = parent;
  replace_link(t, parent, elm, child);
color:
  if (!red)
    erase_fixup(t, child, parent);
  t->count--;
  old->child[LEFT] = old->child[RIGHT] = old->parent = NULL;
}

/*
 * lower_bound: the first block whose key is >= (stream, size, ptr); NULL
 * when every key is smaller.  For a by_addr tree `size` is ignored.
 */
msnap_block_t *msnap__rb_lower_bound(const msnap_rbtree_t *t, uint64_t stream,
                                     uint64_t size, uint64_t ptr) {
  msnap_rbnode_t *n = t->root, *best = NULL;
  bool by_addr = t->by_addr;
  while (n) {
    if (key_cmp(by_addr, BLOCK(n), stream, size, ptr) >= 0) {
      best = n;
      n = n->child[LEFT];
    } else {
      n = n->child[RIGHT];
    }
  }
  return BLOCK(best);
}

/* The last node of the subtree at n toward dir (LEFT: the smallest key). */
static inline const msnap_rbnode_t *extreme(const msnap_rbnode_t *n,
                                            int dir) {
  while (n->child[dir])
    n = n->child[dir];
  return n;
}

/* The in-order neighbour of b toward dir (RIGHT: next, LEFT: previous);
 * NULL past the end. */
static inline msnap_block_t *neighbour(const msnap_block_t *b, int dir) {
  const msnap_rbnode_t *n = NODE(b);
  if (n->child[dir])
    return BLOCK(extreme(n->child[dir], !dir));
  while (n->parent && n == n->parent->child[dir])
    n = n->parent;
  return BLOCK(n->parent);
}

msnap_block_t *msnap__rb_first(const msnap_rbtree_t *t) {
  return t->root ? BLOCK(extreme(t->root, LEFT)) : NULL;
}

msnap_block_t *msnap__rb_last(const msnap_rbtree_t *t) {
  return t->root ? BLOCK(extreme(t->root, RIGHT)) : NULL;
}

msnap_block_t *msnap__rb_next(const msnap_block_t *b) {
  return neighbour(b, RIGHT);
}

msnap_block_t *msnap__rb_prev(const msnap_block_t *b) {
  return neighbour(b, LEFT);
}

/* Black height of the subtree at n, or -1 after writing a violation. */
static int check_node(const msnap_rbtree_t *t, const msnap_rbnode_t *n,
                      size_t *count, char *msg, size_t len) {
  if (!n)
    return 0;
  (*count)++;
  for (int dir = LEFT; dir <= RIGHT; dir++) {
    if (n->child[dir] && n->child[dir]->parent != n) {
      snprintf(msg, len, "rb: %s child of block 0x%llx has a bad parent link",
               dir == LEFT ? "left" : "right",
               (unsigned long long)BLOCK(n)->ptr);
      return -1;
    }
  }
  if (n->red && (is_red(n->child[LEFT]) || is_red(n->child[RIGHT]))) {
    snprintf(msg, len, "rb: red block 0x%llx has a red child",
             (unsigned long long)BLOCK(n)->ptr);
    return -1;
  }
  int hl = check_node(t, n->child[LEFT], count, msg, len);
  if (hl < 0)
    return -1;
  int hr = check_node(t, n->child[RIGHT], count, msg, len);
  if (hr < 0)
    return -1;
  if (hl != hr) {
    snprintf(msg, len, "rb: unequal black heights under block 0x%llx",
             (unsigned long long)BLOCK(n)->ptr);
    return -1;
  }
  return hl + (n->red ? 0 : 1);
}

int msnap__rb_check(const msnap_rbtree_t *t, char *msg, size_t len) {
  size_t count = 0;
  if (t->root && (t->root->red || t->root->parent)) {
    snprintf(msg, len, "rb: root is red or has a parent");
    return MSNAP_ESTATE;
  }
  if (check_node(t, t->root, &count, msg, len) < 0)
    return MSNAP_ESTATE;
  if (count != t->count) {
    snprintf(msg, len, "rb: %zu nodes but count says %zu", count, t->count);
    return MSNAP_ESTATE;
  }
  const msnap_block_t *prev = NULL;
  for (const msnap_block_t *b = msnap__rb_first(t); b; b = msnap__rb_next(b)) {
    if (prev && key_cmp(t->by_addr, prev, b->stream, b->size, b->ptr) >= 0) {
      snprintf(msg, len,
               "rb: order violated between block 0x%llx and block 0x%llx",
               (unsigned long long)prev->ptr, (unsigned long long)b->ptr);
      return MSNAP_ESTATE;
    }
    prev = b;
  }
  return 0;
}
