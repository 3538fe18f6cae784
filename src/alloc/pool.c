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
 * node type.  Callers hold the device lock.
 */
#include <stdio.h>

#include "alloc/alloc.h"

#define NODE(b) (&(b)->node)
#define BLOCK(n) ((msnap_block_t *)(n))

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

static void rotate_left(msnap_rbtree_t *t, msnap_rbnode_t *x) {
  msnap_rbnode_t *y = x->right;
  x->right = y->left;
  if (y->left)
    y->left->parent = x;
  y->parent = x->parent;
  if (!x->parent)
    t->root = y;
  else if (x == x->parent->left)
    x->parent->left = y;
  else
    x->parent->right = y;
  y->left = x;
  x->parent = y;
}

static void rotate_right(msnap_rbtree_t *t, msnap_rbnode_t *x) {
  msnap_rbnode_t *y = x->left;
  x->left = y->right;
  if (y->right)
    y->right->parent = x;
  y->parent = x->parent;
  if (!x->parent)
    t->root = y;
  else if (x == x->parent->right)
    x->parent->right = y;
  else
    x->parent->left = y;
  y->right = x;
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
      link = &parent->left;
    else
      link = &parent->right;
  }
  z->left = z->right = NULL;
  z->parent = parent;
  z->red = 1;
  *link = z;
  t->count++;

  while ((parent = z->parent) && parent->red) {
    msnap_rbnode_t *g = parent->parent;
    if (parent == g->left) {
      msnap_rbnode_t *u = g->right;
      if (u && u->red) {
        u->red = 0;
        parent->red = 0;
        g->red = 1;
        z = g;
        continue;
      }
      if (parent->right == z) {
        rotate_left(t, parent);
        msnap_rbnode_t *tmp = parent;
        parent = z;
        z = tmp;
      }
      parent->red = 0;
      g->red = 1;
      rotate_right(t, g);
    } else {
      msnap_rbnode_t *u = g->left;
      if (u && u->red) {
        u->red = 0;
        parent->red = 0;
        g->red = 1;
        z = g;
        continue;
      }
      if (parent->left == z) {
        rotate_right(t, parent);
        msnap_rbnode_t *tmp = parent;
        parent = z;
        z = tmp;
      }
      parent->red = 0;
      g->red = 1;
      rotate_left(t, g);
    }
  }
  t->root->red = 0;
}

/* Restore the black height after removing a black node; x (possibly NULL)
 * took its place under parent. */
static void erase_fixup(msnap_rbtree_t *t, msnap_rbnode_t *x,
                        msnap_rbnode_t *parent) {
  msnap_rbnode_t *w;
  while ((!x || !x->red) && x != t->root) {
    if (parent->left == x) {
      w = parent->right;
      if (w->red) {
        w->red = 0;
        parent->red = 1;
        rotate_left(t, parent);
        w = parent->right;
      }
      if ((!w->left || !w->left->red) && (!w->right || !w->right->red)) {
        w->red = 1;
        x = parent;
        parent = x->parent;
      } else {
        if (!w->right || !w->right->red) {
          if (w->left)
            w->left->red = 0;
          w->red = 1;
          rotate_right(t, w);
          w = parent->right;
        }
        w->red = parent->red;
        parent->red = 0;
        if (w->right)
          w->right->red = 0;
        rotate_left(t, parent);
        x = t->root;
        break;
      }
    } else {
      w = parent->left;
      if (w->red) {
        w->red = 0;
        parent->red = 1;
        rotate_right(t, parent);
        w = parent->left;
      }
      if ((!w->left || !w->left->red) && (!w->right || !w->right->red)) {
        w->red = 1;
        x = parent;
        parent = x->parent;
      } else {
        if (!w->left || !w->left->red) {
          if (w->right)
            w->right->red = 0;
          w->red = 1;
          rotate_left(t, w);
          w = parent->left;
        }
        w->red = parent->red;
        parent->red = 0;
        if (w->left)
          w->left->red = 0;
        rotate_right(t, parent);
        x = t->root;
        break;
      }
    }
  }
  if (x)
    x->red = 0;
}

/* Remove block b, which must be in t. */
void msnap__rb_erase(msnap_rbtree_t *t, msnap_block_t *b) {
  msnap_rbnode_t *old = NODE(b), *elm = old, *child, *parent;
  int red;
  if (!elm->left) {
    child = elm->right;
  } else if (!elm->right) {
    child = elm->left;
  } else {
    /* Two children: splice out the successor and put it in old's place. */
    elm = elm->right;
    while (elm->left)
      elm = elm->left;
    child = elm->right;
    parent = elm->parent;
    red = elm->red;
    if (child)
      child->parent = parent;
    if (parent->left == elm)
      parent->left = child;
    else
      parent->right = child;
    if (elm->parent == old)
      parent = elm;
    elm->left = old->left;
    elm->right = old->right;
    elm->parent = old->parent;
    elm->red = old->red;
    if (old->parent) {
      if (old->parent->left == old)
        old->parent->left = elm;
      else
        old->parent->right = elm;
    } else {
      t->root = elm;
    }
    old->left->parent = elm;
    if (old->right)
      old->right->parent = elm;
    goto color;
  }
  parent = elm->parent;
  red = elm->red;
  if (child)
    child->parent = parent;
  if (parent) {
    if (parent->left == elm)
      parent->left = child;
    else
      parent->right = child;
  } else {
    t->root = child;
  }
color:
  if (!red)
    erase_fixup(t, child, parent);
  t->count--;
  old->left = old->right = old->parent = NULL;
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
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return BLOCK(best);
}

msnap_block_t *msnap__rb_first(const msnap_rbtree_t *t) {
  msnap_rbnode_t *n = t->root;
  if (!n)
    return NULL;
  while (n->left)
    n = n->left;
  return BLOCK(n);
}

msnap_block_t *msnap__rb_last(const msnap_rbtree_t *t) {
  msnap_rbnode_t *n = t->root;
  if (!n)
    return NULL;
  while (n->right)
    n = n->right;
  return BLOCK(n);
}

msnap_block_t *msnap__rb_next(const msnap_block_t *b) {
  const msnap_rbnode_t *n = NODE(b);
  if (n->right) {
    n = n->right;
    while (n->left)
      n = n->left;
    return BLOCK(n);
  }
  while (n->parent && n == n->parent->right)
    n = n->parent;
  return BLOCK(n->parent);
}

msnap_block_t *msnap__rb_prev(const msnap_block_t *b) {
  const msnap_rbnode_t *n = NODE(b);
  if (n->left) {
    n = n->left;
    while (n->right)
      n = n->right;
    return BLOCK(n);
  }
  while (n->parent && n == n->parent->left)
    n = n->parent;
  return BLOCK(n->parent);
}

/* Black height of the subtree at n, or -1 after writing a violation. */
static int check_node(const msnap_rbtree_t *t, const msnap_rbnode_t *n,
                      size_t *count, char *msg, size_t len) {
  if (!n)
    return 0;
  (*count)++;
  if (n->left && n->left->parent != n) {
    snprintf(msg, len, "rb: left child of block 0x%llx has a bad parent link",
             (unsigned long long)BLOCK(n)->ptr);
    return -1;
  }
  if (n->right && n->right->parent != n) {
    snprintf(msg, len, "rb: right child of block 0x%llx has a bad parent link",
             (unsigned long long)BLOCK(n)->ptr);
    return -1;
  }
  if (n->red && ((n->left && n->left->red) || (n->right && n->right->red))) {
    snprintf(msg, len, "rb: red block 0x%llx has a red child",
             (unsigned long long)BLOCK(n)->ptr);
    return -1;
  }
  int hl = check_node(t, n->left, count, msg, len);
  if (hl < 0)
    return -1;
  int hr = check_node(t, n->right, count, msg, len);
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
