/*
 * unwind.c -- the recorder's C unwinder: return addresses of the calling
 * thread from the DWARF call-frame information (.eh_frame) of the loaded
 * objects, with a process-wide cache of one compiled unwind rule per
 * return address (the "return-address cache").
 *
 * A rule says how to go from a frame to its caller at one pc: the
 * canonical frame address (CFA) is the stack pointer or the frame pointer
 * plus an offset; the return address is saved at CFA + ra_off; the
 * caller's frame pointer is saved at CFA + fp_off or left as it is; the
 * caller's stack pointer is the CFA.  Once every pc of a stack has its
 * rule, a capture costs one hash probe and one or two loads per frame (no
 * context save, no per-thread cursor): ~6 ns per frame, and ~2 for the
 * outer frames replayed from the thread's last walk (below), against ~7
 * for libunwind's cached unw_backtrace on the development VM (25 frames:
 * 50-75 ns against 170).
 *
 * Rules are computed on first sight of a pc (rule_compute: the object
 * holding it, its .eh_frame_hdr search table, the FDE and CIE, then the
 * CFA program up to the pc).  The object is found with glibc's
 * _dl_find_object where libc has it (2.35 and later; looked up at run
 * time), which takes no lock -- libgcc's unwinder does the same; the
 * object of a live frame cannot be unloaded under it.  Older libcs go
 * through dl_iterate_phdr, the rule computed inside its callback (the
 * object cannot be unloaded meanwhile).
 *
 * Fork and the loader's lock: dl_iterate_phdr holds glibc's
 * dl_load_write_lock, which fork() neither takes nor resets (glibc 2.36,
 * posix/fork.c); a child forked while a thread of the parent was inside
 * it blocks forever in its own first dl_iterate_phdr -- every unwinder's
 * (ours, libunwind's, libgcc's before 2.35).  Seen under qemu at the
 * first fork after the threads started.  So every walk of ours that can
 * reach dl_iterate_phdr -- rule_compute without _dl_find_object, and the
 * fallback unwinders (msnap__unwind_loader_enter/leave around them) --
 * holds loader_guard for reading, and fork's prepare handler takes it for
 * writing (writer-preferring: a stream of walks cannot starve a fork).
 * The child re-initialises it (its writer was the parent's thread).  What the fast path cannot follow -- CFA or register
 * rules given as DWARF expressions (signal trampolines, PLT stubs), a
 * return address kept in a register, pointer authentication, objects
 * without a search table, a stack pointer outside the thread's stack --
 * makes msnap__unwind_cfi return -1, and the caller takes its fallback
 * unwinder (libunwind or glibc backtrace) for that capture.
 *
 * Every read of the stack is checked against the thread's stack bounds
 * (pthread_getattr_np, once per thread) and the CFA must grow from frame
 * to frame, so a wrong or stale rule yields wrong frames, never a fault or
 * a loop.  Rules of an object that is unloaded stay in the cache (a pc
 * reused by another object would get the old rule; the bounds above keep
 * that harmless).
 *
 * Invariants (unwind_check, through msnap__unwind_check):
 *   - the published table has a power-of-two capacity, used <= cap / 2;
 *   - every non-empty slot is reachable by linear probing from its hash
 *     and no pc appears twice;
 *   - a slot's fields are written before its pc (release) and never
 *     change afterwards; readers load the pc with acquire.
 * Tables are only ever replaced by larger copies; retired tables are kept
 * (readers may still probe them) and freed never -- at most as much again
 * as the live table.  Writers hold rule_lock (MSNAP_RANK_UNWIND_CACHE, a
 * leaf: nothing else is taken under it), which fork's prepare handler
 * takes too (msnap__unwind_atfork), so that a child never inherits it
 * held by a thread that was inserting a rule.
 */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record/stack.h"

#if defined(__x86_64__)
#define CFI_SUPPORTED 1
#define REG_FP 6  /* rbp */
#define REG_SP 7  /* rsp */
#elif defined(__aarch64__)
#define CFI_SUPPORTED 1
#define REG_FP 29 /* x29 */
#define REG_SP 31 /* sp  */
#else
#define CFI_SUPPORTED 0
#endif

/* UR_RA_REG: as UR_STEP, but the return address is still in the link
 * register (aarch64, before a shrink-wrapped prologue saved it): only
 * usable for frame 0, whose registers we read. */
enum { UR_STEP = 1, UR_END = 2, UR_NONE = 3, UR_RA_REG = 4 };

/* A rule as computed (fields) and as cached (packed into one word next
 * to its pc: 16-byte slots, four to a cache line). */
typedef struct urule_s {
  uintptr_t pc;     /* key (a return address, or frame 0's pc); 0 empty */
  int32_t cfa_off;  /* within +-2^23 to be cached                       */
  int16_t ra_off, fp_off; /* multiples of 8 to be cached                */
  uint8_t kind;     /* UR_*                                             */
  uint8_t cfa_fp;   /* CFA = frame pointer + cfa_off (else sp + ...)    */
  uint8_t fp_saved; /* caller's frame pointer at CFA + fp_off          */
} urule_t;

/* Packed: bits 0-2 kind, 3 cfa_fp, 4 fp_saved, 8-31 cfa_off (signed),
 * 32-47 ra_off / 8, 48-63 fp_off / 8 (signed). */
typedef struct uslot_s {
  uintptr_t pc;
  uint64_t rule;
} uslot_t;

static uint64_t rule_pack(const urule_t *r) {
  return (uint64_t)(r->kind & 7) | (uint64_t)(r->cfa_fp & 1) << 3 |
         (uint64_t)(r->fp_saved & 1) << 4 |
         ((uint64_t)(uint32_t)r->cfa_off & 0xffffffu) << 8 |
         (uint64_t)(uint16_t)(r->ra_off / 8) << 32 |
         (uint64_t)(uint16_t)(r->fp_off / 8) << 48;
}

static bool rule_packable(const urule_t *r) {
  return r->cfa_off >= -(1 << 23) && r->cfa_off < (1 << 23) &&
         r->ra_off % 8 == 0 && r->fp_off % 8 == 0;
}

#define RULE_KIND(w) ((unsigned)((w) & 7))
#define RULE_CFA_FP(w) (((w) >> 3) & 1)
#define RULE_FP_SAVED(w) (((w) >> 4) & 1)
#define RULE_CFA_OFF(w) ((int64_t)((int32_t)(uint32_t)(w) >> 8))
#define RULE_RA_OFF(w) ((int64_t)(int16_t)(uint16_t)((w) >> 32) * 8)
#define RULE_FP_OFF(w) ((int64_t)(int16_t)(uint16_t)((w) >> 48) * 8)

typedef struct utab_s {
  uslot_t *v;
  uint32_t cap, used;
  struct utab_s *retired; /* the table this one replaced */
} utab_t;

static _Atomic(utab_t *) utab;
static pthread_mutex_t rule_lock = PTHREAD_MUTEX_INITIALIZER;

#ifdef PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP
#define LOADER_GUARD_INIT PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP
#else
#define LOADER_GUARD_INIT PTHREAD_RWLOCK_INITIALIZER
#endif
static pthread_rwlock_t loader_guard = LOADER_GUARD_INIT;

void msnap__unwind_loader_enter(void) { pthread_rwlock_rdlock(&loader_guard); }
void msnap__unwind_loader_leave(void) { pthread_rwlock_unlock(&loader_guard); }

static inline uint32_t pc_hash(uintptr_t pc) {
  uint64_t h = (uint64_t)pc * 0x9e3779b97f4a7c15ull;
  return (uint32_t)(h >> 32);
}

/* The packed rule of pc, or 0 (no rule has kind 0).  No lock. */
static inline uint64_t rule_find(const utab_t *t, uintptr_t pc) {
  if (t == NULL) return 0;
  uint32_t mask = t->cap - 1;
  for (uint32_t j = pc_hash(pc) & mask;; j = (j + 1) & mask) {
    uintptr_t p = __atomic_load_n(&t->v[j].pc, __ATOMIC_ACQUIRE);
    if (p == pc) return t->v[j].rule;
    if (p == 0) return 0;
  }
}

/* Insert rule r (r->pc set) unless present.  Takes rule_lock.  On
 * ENOMEM nothing is cached (the next capture computes it again). */
static void rule_insert(const urule_t *r) {
  msnap__mutex_lock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
  utab_t *t = atomic_load_explicit(&utab, memory_order_relaxed);
  if (t == NULL || (t->used + 1) * 2 > t->cap) {
    uint32_t cap = t ? t->cap * 2 : 1024;
    utab_t *n = calloc(1, sizeof *n);
    uslot_t *v = cap ? calloc(cap, sizeof *v) : NULL;
    if (n == NULL || v == NULL) {
      free(n);
      free(v);
      msnap__mutex_unlock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
      return;
    }
    n->v = v;
    n->cap = cap;
    n->retired = t;
    for (uint32_t i = 0; t != NULL && i < t->cap; i++) {
      if (t->v[i].pc == 0) continue;
      uint32_t j = pc_hash(t->v[i].pc) & (cap - 1);
      while (v[j].pc != 0) j = (j + 1) & (cap - 1);
      v[j] = t->v[i];
      n->used++;
    }
    atomic_store_explicit(&utab, n, memory_order_release);
    t = n;
  }
  uint32_t mask = t->cap - 1, j = pc_hash(r->pc) & mask;
  while (t->v[j].pc != 0 && t->v[j].pc != r->pc) j = (j + 1) & mask;
  if (t->v[j].pc == 0) {
    uslot_t *s = &t->v[j];
    s->rule = rule_pack(r);
    __atomic_store_n(&s->pc, r->pc, __ATOMIC_RELEASE);
    t->used++;
  }
  msnap__mutex_unlock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
}

int msnap__unwind_check(char *msg, size_t len) {
  const char *bad = NULL;
  msnap__mutex_lock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
  utab_t *t = atomic_load_explicit(&utab, memory_order_relaxed);
  if (t != NULL) {
    uint32_t used = 0, mask = t->cap - 1;
    if (t->cap == 0 || (t->cap & mask) != 0) bad = "capacity not a power of two";
    for (uint32_t i = 0; bad == NULL && i < t->cap; i++) {
      uintptr_t pc = t->v[i].pc;
      if (pc == 0) continue;
      used++;
      unsigned kind = RULE_KIND(t->v[i].rule);
      if (kind < UR_STEP || kind > UR_RA_REG) bad = "bad kind";
      uint32_t j = pc_hash(pc) & mask, seen = 0;
      for (;; j = (j + 1) & mask) {
        if (t->v[j].pc == 0) break;
        if (t->v[j].pc == pc) seen++;
        if (j == i) break;
      }
      if (j != i) bad = "slot not reachable from its hash";
      for (uint32_t k = 0; bad == NULL && k < t->cap; k++)
        if (k != i && t->v[k].pc == pc) bad = "pc cached twice";
      (void)seen;
    }
    if (bad == NULL && used != t->used) bad = "used count is wrong";
    if (bad == NULL && used * 2 > t->cap) bad = "table more than half full";
  }
  msnap__mutex_unlock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
  if (bad) {
    if (msg && len) snprintf(msg, len, "unwind cache: %s", bad);
    return MSNAP_ESTATE;
  }
  return 0;
}

/* loader_guard, then rule_lock (a walk holding the guard inserts rules);
 * released in reverse.  The child's guard is a fresh one: glibc's unlock
 * of a writer checks the thread id, which differs in the child. */
void msnap__unwind_atfork(int phase) {
  if (phase == MSNAP_FORK_PREPARE) {
    pthread_rwlock_wrlock(&loader_guard);
    pthread_mutex_lock(&rule_lock);
  } else {
    pthread_mutex_unlock(&rule_lock);
    if (phase == MSNAP_FORK_CHILD)
      loader_guard = (pthread_rwlock_t)LOADER_GUARD_INIT;
    else
      pthread_rwlock_unlock(&loader_guard);
  }
}

size_t msnap__unwind_cached(void) {
  utab_t *t = atomic_load_explicit(&utab, memory_order_acquire);
  return t ? t->used : 0;
}

/* ---- the thread's stack ---------------------------------------------------- */

static MSNAP_TLS uintptr_t stk_lo, stk_hi;

static void stack_bounds(void) {
  pthread_attr_t at;
  void *addr = NULL;
  size_t sz = 0;
  if (pthread_getattr_np(pthread_self(), &at) == 0) {
    pthread_attr_getstack(&at, &addr, &sz);
    pthread_attr_destroy(&at);
  }
  stk_lo = (uintptr_t)addr;
  stk_hi = (uintptr_t)addr + sz;
  if (stk_hi == 0) stk_hi = 1; /* unknown: every walk stops at once */
}

void msnap__thread_stack(uintptr_t *lo, uintptr_t *hi) {
  if (msnap_unlikely(stk_hi == 0)) stack_bounds();
  *lo = stk_lo;
  *hi = stk_hi;
}

#if CFI_SUPPORTED

/* ---- reading DWARF ------------------------------------------------------- */

typedef struct rd_s {
  const unsigned char *p, *end;
  bool bad;
} rd_t;

static uint64_t rd_uleb(rd_t *r) {
  uint64_t v = 0;
  unsigned shift = 0;
  while (r->p < r->end) {
    unsigned char b = *r->p++;
    if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
    shift += 7;
    if (!(b & 0x80)) return v;
  }
  r->bad = true;
  return 0;
}

static int64_t rd_sleb(rd_t *r) {
  int64_t v = 0;
  unsigned shift = 0;
  while (r->p < r->end) {
    unsigned char b = *r->p++;
    if (shift < 64) v |= (int64_t)((uint64_t)(b & 0x7f) << shift);
    shift += 7;
    if (!(b & 0x80)) {
      if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
      return v;
    }
  }
  r->bad = true;
  return 0;
}

static uint64_t rd_fixed(rd_t *r, unsigned n) {
  if ((size_t)(r->end - r->p) < n) {
    r->bad = true;
    r->p = r->end;
    return 0;
  }
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
  r->p += n;
  return v;
}

enum {
  PE_OMIT = 0xff,
  PE_ABS = 0x00, PE_ULEB = 0x01, PE_U2 = 0x02, PE_U4 = 0x03, PE_U8 = 0x04,
  PE_SLEB = 0x09, PE_S2 = 0x0a, PE_S4 = 0x0b, PE_S8 = 0x0c,
  PE_PCREL = 0x10, PE_DATAREL = 0x30, PE_INDIRECT = 0x80
};

/* A pointer in encoding enc; datarel is relative to `data`. */
static uintptr_t rd_ptr(rd_t *r, unsigned enc, uintptr_t data) {
  if (enc == PE_OMIT) return 0;
  uintptr_t at = (uintptr_t)r->p;
  uint64_t v;
  switch (enc & 0x0f) {
  case PE_ABS: v = rd_fixed(r, sizeof(uintptr_t)); break;
  case PE_ULEB: v = rd_uleb(r); break;
  case PE_U2: v = rd_fixed(r, 2); break;
  case PE_U4: v = rd_fixed(r, 4); break;
  case PE_U8: v = rd_fixed(r, 8); break;
  case PE_SLEB: v = (uint64_t)rd_sleb(r); break;
  case PE_S2: v = (uint64_t)(int64_t)(int16_t)rd_fixed(r, 2); break;
  case PE_S4: v = (uint64_t)(int64_t)(int32_t)rd_fixed(r, 4); break;
  case PE_S8: v = rd_fixed(r, 8); break;
  default: r->bad = true; return 0;
  }
  switch (enc & 0x70) {
  case 0: break;
  case PE_PCREL: v += at; break;
  case PE_DATAREL: v += data; break;
  default: r->bad = true; return 0; /* textrel, funcrel, aligned */
  }
  if (enc & PE_INDIRECT) {
    if (v == 0) {
      r->bad = true;
      return 0;
    }
    v = *(const uintptr_t *)(uintptr_t)v;
  }
  return (uintptr_t)v;
}

/* ---- the CFA program ----------------------------------------------------- */

enum { RR_SAME = 0, RR_OFFSET = 1, RR_UNDEF = 2, RR_OTHER = 3 };
typedef struct regrule_s {
  uint8_t how;
  int64_t off;
} regrule_t;
typedef struct cfstate_s {
  uint64_t cfa_reg;
  int64_t cfa_off;
  bool cfa_other; /* expression or a register we do not follow */
  regrule_t ra, fp;
} cfstate_t;

typedef struct cie_s {
  uint64_t code_align;
  int64_t data_align;
  uint64_t ra_reg;
  unsigned fde_enc;
  bool signal;
  bool has_z; /* FDEs carry augmentation data */
  rd_t insns;
} cie_t;

#define STATE_STACK 16

static regrule_t *track(cfstate_t *st, const cie_t *c, uint64_t reg) {
  if (reg == c->ra_reg) return &st->ra;
  if (reg == REG_FP) return &st->fp;
  return NULL;
}

/*
 * Run a CFA program from state *st up to address `target` (rows whose
 * location is <= target).  init: the state after the CIE's initial
 * instructions (DW_CFA_restore), NULL while running them.  Returns false
 * on malformed input.
 */
static bool run_cfa(rd_t r, const cie_t *c, uintptr_t loc, uintptr_t target,
                    cfstate_t *st, const cfstate_t *init, uintptr_t data) {
  cfstate_t stack[STATE_STACK];
  int sp = 0;
  while (r.p < r.end && !r.bad) {
    unsigned char op = *r.p++;
    unsigned hi = op & 0xc0, lo = op & 0x3f;
    uint64_t reg;
    regrule_t *rr;
    if (hi == 0x40) { /* advance_loc */
      loc += lo * c->code_align;
      if (loc > target) return true;
      continue;
    }
    if (hi == 0x80) { /* offset */
      int64_t off = (int64_t)rd_uleb(&r) * c->data_align;
      if ((rr = track(st, c, lo))) rr->how = RR_OFFSET, rr->off = off;
      continue;
    }
    if (hi == 0xc0) { /* restore */
      if ((rr = track(st, c, lo)))
        *rr = init ? *track((cfstate_t *)init, c, lo) : (regrule_t){RR_SAME, 0};
      continue;
    }
    switch (op) {
    case 0x00: break; /* nop */
    case 0x01: loc = rd_ptr(&r, c->fde_enc, data); /* set_loc */
      if (loc > target) return true;
      break;
    case 0x02: loc += rd_fixed(&r, 1) * c->code_align;
      if (loc > target) return true;
      break;
    case 0x03: loc += rd_fixed(&r, 2) * c->code_align;
      if (loc > target) return true;
      break;
    case 0x04: loc += rd_fixed(&r, 4) * c->code_align;
      if (loc > target) return true;
      break;
    case 0x05: /* offset_extended */
      reg = rd_uleb(&r);
      {
        int64_t off = (int64_t)rd_uleb(&r) * c->data_align;
        if ((rr = track(st, c, reg))) rr->how = RR_OFFSET, rr->off = off;
      }
      break;
    case 0x11: /* offset_extended_sf */
      reg = rd_uleb(&r);
      {
        int64_t off = rd_sleb(&r) * c->data_align;
        if ((rr = track(st, c, reg))) rr->how = RR_OFFSET, rr->off = off;
      }
      break;
    case 0x06: /* restore_extended */
      reg = rd_uleb(&r);
      if ((rr = track(st, c, reg)))
        *rr = init ? *track((cfstate_t *)init, c, reg) : (regrule_t){RR_SAME, 0};
      break;
    case 0x07: /* undefined */
      if ((rr = track(st, c, rd_uleb(&r)))) rr->how = RR_UNDEF;
      break;
    case 0x08: /* same_value */
      if ((rr = track(st, c, rd_uleb(&r)))) rr->how = RR_SAME;
      break;
    case 0x09: /* register */
      reg = rd_uleb(&r);
      (void)rd_uleb(&r);
      if ((rr = track(st, c, reg))) rr->how = RR_OTHER;
      break;
    case 0x0a: /* remember_state */
      if (sp == STATE_STACK) return false;
      stack[sp++] = *st;
      break;
    case 0x0b: /* restore_state */
      if (sp == 0) return false;
      {
        cfstate_t saved = stack[--sp];
        st->cfa_reg = saved.cfa_reg, st->cfa_off = saved.cfa_off;
        st->cfa_other = saved.cfa_other;
        st->ra = saved.ra, st->fp = saved.fp;
      }
      break;
    case 0x0c: /* def_cfa */
      st->cfa_reg = rd_uleb(&r);
      st->cfa_off = (int64_t)rd_uleb(&r);
      st->cfa_other = false;
      break;
    case 0x12: /* def_cfa_sf */
      st->cfa_reg = rd_uleb(&r);
      st->cfa_off = rd_sleb(&r) * c->data_align;
      st->cfa_other = false;
      break;
    case 0x0d: /* def_cfa_register */
      st->cfa_reg = rd_uleb(&r);
      break;
    case 0x0e: /* def_cfa_offset */
      st->cfa_off = (int64_t)rd_uleb(&r);
      break;
    case 0x13: /* def_cfa_offset_sf */
      st->cfa_off = rd_sleb(&r) * c->data_align;
      break;
    case 0x0f: /* def_cfa_expression */
      st->cfa_other = true;
      r.p += rd_uleb(&r);
      break;
    case 0x10: /* expression */
    case 0x16: /* val_expression */
      reg = rd_uleb(&r);
      r.p += rd_uleb(&r);
      if ((rr = track(st, c, reg))) rr->how = RR_OTHER;
      break;
    case 0x14: /* val_offset */
      reg = rd_uleb(&r);
      (void)rd_uleb(&r);
      if ((rr = track(st, c, reg))) rr->how = RR_OTHER;
      break;
    case 0x15: /* val_offset_sf */
      reg = rd_uleb(&r);
      (void)rd_sleb(&r);
      if ((rr = track(st, c, reg))) rr->how = RR_OTHER;
      break;
    case 0x2e: /* GNU_args_size */
      (void)rd_uleb(&r);
      break;
    case 0x2f: /* GNU_negative_offset_extended */
      reg = rd_uleb(&r);
      {
        int64_t off = -(int64_t)rd_uleb(&r) * c->data_align;
        if ((rr = track(st, c, reg))) rr->how = RR_OFFSET, rr->off = off;
      }
      break;
    default:
      /* 0x2d: GNU_window_save, on aarch64 negate_ra_state (signed return
       * addresses): not followed */
      return false;
    }
    if (r.p > r.end) return false;
  }
  return !r.bad;
}

/* Parse the CIE at p (eh_frame layout). */
static bool parse_cie(const unsigned char *p, cie_t *c, uintptr_t data) {
  memset(c, 0, sizeof *c);
  uint32_t len = (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24);
  if (len == 0 || len == 0xffffffffu) return false; /* 64-bit DWARF: no */
  rd_t r = {p + 4, p + 4 + len, false};
  if (rd_fixed(&r, 4) != 0) return false; /* not a CIE */
  unsigned version = (unsigned)rd_fixed(&r, 1);
  if (version != 1 && version != 3) return false;
  const char *aug = (const char *)r.p;
  size_t alen = strnlen(aug, (size_t)(r.end - r.p));
  r.p += alen + 1;
  c->code_align = rd_uleb(&r);
  c->data_align = rd_sleb(&r);
  c->ra_reg = version == 1 ? rd_fixed(&r, 1) : rd_uleb(&r);
  c->fde_enc = PE_ABS;
  if (aug[0] == 'z') {
    c->has_z = true;
    uint64_t zlen = rd_uleb(&r);
    const unsigned char *zend = r.p + zlen;
    for (size_t i = 1; i < alen && !r.bad; i++) {
      switch (aug[i]) {
      case 'R': c->fde_enc = (unsigned)rd_fixed(&r, 1); break;
      case 'L': (void)rd_fixed(&r, 1); break;
      case 'P': {
        unsigned enc = (unsigned)rd_fixed(&r, 1);
        (void)rd_ptr(&r, enc & ~(unsigned)PE_INDIRECT, data);
        break;
      }
      case 'S': c->signal = true; break;
      case 'B': case 'G': break; /* BTI / MTE markers: no data */
      default: return false;
      }
    }
    if (zend > r.end) return false;
    r.p = zend;
  } else if (alen != 0) {
    return false; /* unknown augmentation without sizes */
  }
  c->insns = r;
  return !r.bad;
}

/* What one dl_iterate_phdr callback needs and finds. */
typedef struct find_s {
  uintptr_t target; /* the address whose rule is wanted */
  urule_t *out;
  bool found;       /* the object holding target was seen */
} find_t;

/* Binary search of .eh_frame_hdr for target; the FDE or NULL. */
static const unsigned char *hdr_lookup(const unsigned char *hdr,
                                       uintptr_t target) {
  if (hdr[0] != 1) return NULL;
  unsigned ptr_enc = hdr[1], cnt_enc = hdr[2], tab_enc = hdr[3];
  rd_t r = {hdr + 4, hdr + 4 + 32, false};
  (void)rd_ptr(&r, ptr_enc, (uintptr_t)hdr);
  uint64_t n = rd_ptr(&r, cnt_enc, (uintptr_t)hdr);
  if (r.bad || tab_enc != (PE_DATAREL | PE_S4) || n == 0) return NULL;
  const int32_t *tab = (const int32_t *)r.p; /* pairs (initial loc, fde) */
  uint64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if ((uintptr_t)hdr + (intptr_t)tab[2 * mid] <= target)
      lo = mid;
    else
      hi = mid;
  }
  if ((uintptr_t)hdr + (intptr_t)tab[2 * lo] > target) return NULL;
  return hdr + (intptr_t)tab[2 * lo + 1];
}

/* The rule at target from FDE fde (hdr: for datarel pointers). */
static void fde_rule(const unsigned char *fde, uintptr_t hdr,
                     uintptr_t target, urule_t *out) {
  out->kind = UR_NONE;
  uint32_t len = (uint32_t)(fde[0] | fde[1] << 8 | fde[2] << 16 |
                            (uint32_t)fde[3] << 24);
  if (len == 0 || len == 0xffffffffu) return;
  rd_t r = {fde + 4, fde + 4 + len, false};
  uint32_t cie_off = (uint32_t)rd_fixed(&r, 4);
  if (cie_off == 0) return; /* a CIE, not an FDE */
  cie_t c;
  if (!parse_cie(fde + 4 - cie_off, &c, hdr)) return;
  uintptr_t begin = rd_ptr(&r, c.fde_enc, hdr);
  uintptr_t range = rd_ptr(&r, c.fde_enc & 0x0f, hdr);
  if (r.bad || target < begin || target - begin >= range) return;
  if (c.has_z) { /* the FDE's augmentation data (LSDA pointer) */
    uint64_t zlen = rd_uleb(&r);
    r.p += zlen;
  }
  if (r.bad || r.p > r.end || c.signal) return;
  cfstate_t init = {0}, st;
  init.cfa_reg = REG_SP;
  init.ra.how = RR_SAME;
  init.fp.how = RR_SAME;
  if (!run_cfa(c.insns, &c, begin, UINTPTR_MAX, &init, NULL, hdr)) return;
  st = init;
  if (!run_cfa(r, &c, begin, target, &st, &init, hdr)) return;
  if (st.ra.how == RR_UNDEF) { /* the outermost frame (_start, clone) */
    out->kind = UR_END;
    return;
  }
  bool ra_reg = false;
#if defined(__aarch64__)
  ra_reg = st.ra.how == RR_SAME; /* still in x30 */
#endif
  if (st.cfa_other || (st.cfa_reg != REG_SP && st.cfa_reg != REG_FP) ||
      (st.ra.how != RR_OFFSET && !ra_reg) ||
      (st.fp.how != RR_SAME && st.fp.how != RR_OFFSET))
    return;
  if (st.cfa_off < INT32_MIN || st.cfa_off > INT32_MAX ||
      st.ra.off < INT16_MIN || st.ra.off > INT16_MAX ||
      st.fp.off < INT16_MIN || st.fp.off > INT16_MAX)
    return;
  out->cfa_fp = st.cfa_reg == REG_FP;
  out->cfa_off = (int32_t)st.cfa_off;
  out->ra_off = (int16_t)(ra_reg ? 0 : st.ra.off);
  out->fp_saved = st.fp.how == RR_OFFSET;
  out->fp_off = (int16_t)(out->fp_saved ? st.fp.off : 0);
  out->kind = ra_reg ? UR_RA_REG : UR_STEP;
}

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  find_t *f = arg;
  const ElfW(Phdr) *eh = NULL;
  bool inside = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD) {
      uintptr_t a = info->dlpi_addr + ph->p_vaddr;
      if (f->target >= a && f->target - a < ph->p_memsz) inside = true;
    } else if (ph->p_type == PT_GNU_EH_FRAME) {
      eh = ph;
    }
  }
  if (!inside) return 0;
  f->found = true;
  if (eh != NULL) {
    const unsigned char *hdr =
        (const unsigned char *)(info->dlpi_addr + eh->p_vaddr);
    const unsigned char *fde = hdr_lookup(hdr, f->target);
    if (fde != NULL) fde_rule(fde, (uintptr_t)hdr, f->target, f->out);
  }
  return 1;
}

/* glibc's struct dl_find_object on 64-bit targets (<dlfcn.h>, 2.35; no
 * dlfo_eh_dbase or dlfo_eh_count there), declared here so that builds
 * against an older libc's headers find the function at run time too. */
typedef struct msnap__dlfo_s {
  unsigned long long dlfo_flags;
  void *dlfo_map_start, *dlfo_map_end;
  void *dlfo_link_map;
  void *dlfo_eh_frame; /* the object's PT_GNU_EH_FRAME (.eh_frame_hdr) */
  unsigned long long reserved[7];
} msnap__dlfo_t;
#if defined(DLFO_STRUCT_HAS_EH_DBASE) && !DLFO_STRUCT_HAS_EH_DBASE && \
    !DLFO_STRUCT_HAS_EH_COUNT
_Static_assert(sizeof(struct dl_find_object) == sizeof(msnap__dlfo_t),
               "struct dl_find_object");
#endif
typedef int (*dlfo_fn)(void *, msnap__dlfo_t *);
static dlfo_fn dlfo; /* NULL: libc has none (or not looked up yet) */
static pthread_once_t dlfo_once = PTHREAD_ONCE_INIT;
static void dlfo_lookup(void) {
  *(void **)&dlfo = dlsym(RTLD_DEFAULT, "_dl_find_object");
}
static atomic_bool dlfo_off; /* tests: use dl_iterate_phdr regardless */
static dlfo_fn find_object(void) {
  pthread_once(&dlfo_once, dlfo_lookup);
  return atomic_load_explicit(&dlfo_off, memory_order_relaxed) ? NULL : dlfo;
}

bool msnap__unwind_test_finder(bool find_object_on) {
  pthread_once(&dlfo_once, dlfo_lookup);
  atomic_store(&dlfo_off, !find_object_on);
  /* An empty table replaces the live one (retired, never freed: readers
   * may still probe it), so that the next walks compute rules again. */
  msnap__mutex_lock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
  utab_t *t = atomic_load_explicit(&utab, memory_order_relaxed);
  utab_t *n = calloc(1, sizeof *n);
  uslot_t *v = calloc(1024, sizeof *v);
  if (n != NULL && v != NULL) {
    n->v = v;
    n->cap = 1024;
    n->retired = t;
    atomic_store_explicit(&utab, n, memory_order_release);
  } else {
    free(n);
    free(v);
  }
  msnap__mutex_unlock(&rule_lock, MSNAP_RANK_UNWIND_CACHE);
  return dlfo != NULL;
}

/* Compute the packed rule of key (frame 0: target == key; a return
 * address: target == key - 1, the call) and cache it (a rule that does
 * not pack is cached as UR_NONE). */
static uint64_t rule_compute(uintptr_t key, uintptr_t target) {
  urule_t r;
  memset(&r, 0, sizeof r);
  r.pc = key;
  r.kind = UR_NONE;
  find_t f = {target, &r, false};
  dlfo_fn find = find_object();
  msnap__dlfo_t o;
  if (find != NULL) {
    if (find((void *)target, &o) == 0 && o.dlfo_eh_frame != NULL) {
      const unsigned char *hdr = o.dlfo_eh_frame;
      const unsigned char *fde = hdr_lookup(hdr, target);
      if (fde != NULL) fde_rule(fde, (uintptr_t)hdr, target, &r);
    }
  } else {
    msnap__unwind_loader_enter();
    dl_iterate_phdr(find_cb, &f);
    msnap__unwind_loader_leave();
  }
  if (!rule_packable(&r)) {
    memset(&r, 0, sizeof r);
    r.pc = key;
    r.kind = UR_NONE;
  }
  rule_insert(&r);
  return rule_pack(&r);
}

/* ---- the walk ------------------------------------------------------------ */

/*
 * The thread's last walk, outermost frame first (F[0]).  For each frame:
 * its registers, and the stack words the step to its caller read with
 * their values.  A walk reaching a frame with the same pc and sp as one
 * of these (and the same frame pointer where the steps from there read it
 * before restoring it) replays the recorded steps while their words still
 * hold the recorded values: unwinding is a function of the registers and
 * of the words it reads, so the rest of the stack is the recorded one.
 * A replayed step costs one or two independent loads and compares, no
 * rule lookup, so the unchanged outer part of a stack (the same caller
 * allocating again and again) costs about a nanosecond per frame.  A word
 * that changed ends the replay there and the walk goes on from that frame.
 */
enum { F_STEP = 0, F_END = 1, F_OPEN = 2 };
typedef struct uframe_s {
  uintptr_t pc, sp, fp; /* registers at this frame                        */
  uintptr_t ra_at, ra;  /* the return-address word read (ra_at 0: none)   */
  uintptr_t fp_at, fpv; /* the saved frame-pointer word (fp_at 0: none)  */
  uint8_t how;          /* F_STEP: its caller follows; F_END: the walk
                         * ended here; F_OPEN: stopped at `max` there      */
  uint8_t cfa_fp;       /* the step read the frame pointer               */
  uint8_t fp_saved;     /* ... and then restored it from the stack       */
  uint8_t fp_live;      /* the steps from here out read the incoming fp  */
} uframe_t;

#define WALK_MAX MSNAP_STACK_MAX_C
typedef struct uwalk_s {
  uint32_t n;
  uframe_t f[WALK_MAX];
} uwalk_t;
static MSNAP_TLS uwalk_t *tl_walk;
static pthread_key_t walk_key;
static pthread_once_t walk_once = PTHREAD_ONCE_INIT;

static void walk_free(void *p) {
  free(p);
  tl_walk = NULL;
}
static void walk_key_make(void) { pthread_key_create(&walk_key, walk_free); }

static uwalk_t *walk_cache(void) {
  if (tl_walk == NULL) {
    pthread_once(&walk_once, walk_key_make);
    uwalk_t *w = calloc(1, sizeof *w);
    if (w == NULL) return NULL;
    tl_walk = w;
    pthread_setspecific(walk_key, w);
  }
  return tl_walk;
}

void msnap__unwind_forget(void) {
  if (tl_walk != NULL) tl_walk->n = 0;
}

/* The thread's walk after a capture: F[0..kept] (kept -1: none) stays,
 * tmp[0..own) follow it innermost last; then the frame-pointer liveness
 * from the outermost frame in. */
static void walk_store(uwalk_t *wc, int kept, const uframe_t *tmp, int own) {
  int count = kept + 1 + own;
  if (count > WALK_MAX) {
    wc->n = 0; /* deeper than we keep: forget */
    return;
  }
  uframe_t *F = wc->f;
  for (int k = 0; k < own; k++) F[kept + 1 + k] = tmp[own - 1 - k];
  uint8_t live = 0;
  for (int i = 0; i < count; i++) {
    uframe_t *e = &F[i];
    if (e->how == F_OPEN)
      live = 1; /* what lies beyond is unknown */
    else if (e->how == F_END)
      live = e->cfa_fp;
    else
      live = e->cfa_fp || (!e->fp_saved && live);
    e->fp_live = live;
  }
  wc->n = (uint32_t)count;
}

/* A word of this thread's stack outside this function's objects (a saved
 * return address or frame pointer of another frame): read by one
 * instruction that the sanitizers do not instrument -- it is no object
 * of the program's, and no other thread writes it. */
static inline uintptr_t stack_word(uintptr_t at) {
  uintptr_t v;
#if defined(__x86_64__)
  __asm__ volatile("mov (%1), %0" : "=r"(v) : "r"(at));
#else
  __asm__ volatile("ldr %0, [%1]" : "=r"(v) : "r"(at));
#endif
  return v;
}

__attribute__((noinline)) int msnap__unwind_cfi(uintptr_t *out, int max) {
  uintptr_t pc, sp, fp, lr = 0;
  (void)lr;
#if defined(__x86_64__)
  __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
                   : "=r"(pc), "=r"(sp), "=r"(fp));
#else
  __asm__ volatile("adr %0, .\n\tmov %1, sp\n\tmov %2, x29\n\tmov %3, x30"
                   : "=r"(pc), "=r"(sp), "=r"(fp), "=r"(lr));
#endif
  if (msnap_unlikely(stk_hi == 0)) stack_bounds();
  uintptr_t lo = stk_lo, hi = stk_hi;
  if (sp < lo || sp >= hi) return -1; /* another stack (sigaltstack) */
  if (max > WALK_MAX) max = WALK_MAX;
  if (max <= 0) return 0;
  uwalk_t *wc = walk_cache();
  const uframe_t *F = wc ? wc->f : NULL;
  int idx = wc ? (int)wc->n - 1 : -1; /* candidate in F, inner to outer */
  int kept = -1, own = 0;
  uframe_t tmp[WALK_MAX]; /* this walk's own frames, innermost first */
  const utab_t *t = atomic_load_explicit(&utab, memory_order_acquire);
  int n = 0;
  for (;;) {
    out[n] = pc;
    if (n >= 1 && idx >= 0) {
      while (idx >= 0 && F[idx].sp < sp) idx--;
      if (idx >= 0 && F[idx].sp == sp && F[idx].pc == pc &&
          (!F[idx].fp_live || F[idx].fp == fp)) {
        int i = idx, n0 = n;
        for (;;) { /* replay F[i], F[i-1]... while their words hold */
          const uframe_t *c = &F[i];
          if (c->how == F_OPEN ||
              (c->ra_at && stack_word(c->ra_at) != c->ra) ||
              (c->fp_at && stack_word(c->fp_at) != c->fpv))
            break;
          if (c->how == F_END || n + 1 >= max) { /* the rest is F's */
            n++;
            kept = idx;
            own = n0;
            goto done;
          }
          if (c->fp_at) fp = c->fpv;
          pc = c->ra;
          sp = F[i - 1].sp;
          n++;
          i--;
          out[n] = pc;
        }
        /* a word of F[i] changed: F[idx..i+1] were replayed and become
         * this walk's own; F[i]'s frame (n) is stepped below */
        for (int k = n0; k < n; k++) tmp[k] = F[idx - (k - n0)];
        idx = i - 1;
      }
    }
    /* a step by rule out of frame n */
    uframe_t *fr = &tmp[n];
    fr->pc = pc;
    fr->sp = sp;
    fr->fp = fp;
    fr->ra_at = fr->ra = fr->fp_at = fr->fpv = 0;
    fr->cfa_fp = fr->fp_saved = fr->fp_live = 0;
    fr->how = F_END;
    bool first = n == 0;
    n++;
    own = n;
    uint64_t r = rule_find(t, pc);
    if (msnap_unlikely(r == 0)) {
      r = rule_compute(pc, first ? pc : pc - 1);
      t = atomic_load_explicit(&utab, memory_order_acquire);
    }
    unsigned kind = RULE_KIND(r);
    if (kind == UR_END) break;
    bool in_lr = kind == UR_RA_REG && first;
    if (kind != UR_STEP && !in_lr) return -1;
    fr->cfa_fp = (uint8_t)RULE_CFA_FP(r);
    uintptr_t cfa = (RULE_CFA_FP(r) ? fp : sp) + (intptr_t)RULE_CFA_OFF(r);
    uintptr_t ra_at = cfa + (intptr_t)RULE_RA_OFF(r);
    if (cfa <= sp || cfa > hi ||
        (!in_lr && (ra_at < sp || ra_at + sizeof(uintptr_t) > hi)))
      break; /* off the stack: the walk ends here */
    uintptr_t ra = in_lr ? lr : stack_word(ra_at);
    if (!in_lr) {
      fr->ra_at = ra_at;
      fr->ra = ra;
    }
    if (RULE_FP_SAVED(r)) {
      uintptr_t fp_at = cfa + (intptr_t)RULE_FP_OFF(r);
      if (fp_at < sp || fp_at + sizeof(uintptr_t) > hi) break;
      fp = stack_word(fp_at);
      fr->fp_saved = 1;
      fr->fp_at = fp_at;
      fr->fpv = fp;
    }
    if (ra == 0) break;
    if (n == max) {
      fr->how = F_OPEN;
      break;
    }
    fr->how = F_STEP;
    sp = cfa;
    pc = ra;
  }
done:
  if (wc != NULL) walk_store(wc, kept, tmp, own);
  return n;
}

#else /* !CFI_SUPPORTED */

int msnap__unwind_cfi(uintptr_t *out, int max) {
  (void)out;
  (void)max;
  return -1;
}

#endif
