/*
 * stack.c -- the intern table of stacks and strings, stack capture, and
 * lazy symbolization of C frames.  The data structure and its invariants
 * are described in stack.h.
 *
 * Layout:
 *   - entries live in a two-level slot array (chunks of SLOT_CHUNK
 *     pointers under a fixed directory), so that a reader holding a
 *     reference finds its entry by id without the lock while the table
 *     grows;
 *   - an open-addressing hash index (ids, linear probing, tombstones)
 *     keyed by the XXH3 hash of the contents, guarded by the table lock;
 *   - a free list of ids, reused LIFO.
 *
 * Costs: capturing an already-known stack is one XXH3 over the raw words,
 * one lock, one probe and a memcmp.  Freeing happens when the last
 * reference goes: the atomic decrement sees 1, takes the lock and frees
 * only if the slot still holds an entry with zero references (an intern
 * may have revived it meanwhile).
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <elf.h> /* Elf64_* (glibc): the base of elfutils' GElf types */

/* libdw is opened with dlopen (optional at run time), so its headers are
 * optional at build time: the few libdwfl types and entry points used
 * below are declared here as elfutils' libdwfl.h, libdw.h, gelf.h and
 * libelf.h declare them (elfutils 0.188, Debian 12).  Where
 * the real header is found it is included after them: C11 accepts a
 * repeated typedef or prototype only when it is the same, so the build
 * checks every declaration here against elfutils. */
typedef struct Elf Elf;
typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwfl_Line Dwfl_Line;
typedef Elf64_Addr GElf_Addr;
typedef Elf64_Word GElf_Word;
typedef Elf64_Xword GElf_Xword;
typedef Elf64_Shdr GElf_Shdr;
typedef Elf64_Sym GElf_Sym;
typedef GElf_Addr Dwarf_Addr;
typedef GElf_Xword Dwarf_Word;

/* Dwfl_Callbacks (an anonymous struct in libdwfl.h: checked field by
 * field below when the header is there). */
typedef struct msnap__dwfl_callbacks_s {
  int (*find_elf)(Dwfl_Module *mod, void **userdata, const char *modname,
                  Dwarf_Addr base, char **file_name, Elf **elfp);
  int (*find_debuginfo)(Dwfl_Module *mod, void **userdata,
                        const char *modname, Dwarf_Addr base,
                        const char *file_name, const char *debuglink_file,
                        GElf_Word debuglink_crc, char **debuginfo_file_name);
  int (*section_address)(Dwfl_Module *mod, void **userdata,
                         const char *modname, Dwarf_Addr base,
                         const char *secname, GElf_Word shndx,
                         const GElf_Shdr *shdr, Dwarf_Addr *addr);
  char **debuginfo_path;
} msnap__dwfl_callbacks_t;

/* Never called directly (resolved with dlsym): declared for their types. */
extern int dwfl_linux_proc_report(Dwfl *dwfl, pid_t pid);
extern void dwfl_report_begin_add(Dwfl *dwfl);
extern int dwfl_report_end(Dwfl *dwfl,
                           int (*removed)(Dwfl_Module *, void *, const char *,
                                          Dwarf_Addr, void *arg),
                           void *arg);
extern Dwfl_Module *dwfl_addrmodule(Dwfl *dwfl, Dwarf_Addr address);
extern const char *dwfl_module_addrname(Dwfl_Module *mod, GElf_Addr address);
extern int dwfl_module_getsymtab(Dwfl_Module *mod);
extern const char *dwfl_module_getsym_info(Dwfl_Module *mod, int ndx,
                                           GElf_Sym *sym, GElf_Addr *addr,
                                           GElf_Word *shndxp, Elf **elfp,
                                           Dwarf_Addr *bias);
extern Dwfl_Line *dwfl_module_getsrc(Dwfl_Module *mod, Dwarf_Addr addr);
extern const char *dwfl_lineinfo(Dwfl_Line *line, Dwarf_Addr *addr,
                                 int *linep, int *colp, Dwarf_Word *mtime,
                                 Dwarf_Word *length);
extern int dwfl_linux_proc_find_elf(Dwfl_Module *mod, void **userdata,
                                    const char *module_name, Dwarf_Addr base,
                                    char **file_name, Elf **);
extern int dwfl_standard_find_debuginfo(Dwfl_Module *, void **, const char *,
                                        Dwarf_Addr, const char *,
                                        const char *, GElf_Word, char **);

/* The callbacks handed to dwfl_begin are these two. */
_Static_assert(_Generic(&dwfl_linux_proc_find_elf,
                   __typeof__(((msnap__dwfl_callbacks_t *)0)->find_elf): 1,
                   default: 0) &&
                   _Generic(&dwfl_standard_find_debuginfo,
                       __typeof__(((msnap__dwfl_callbacks_t *)0)
                                      ->find_debuginfo): 1,
                       default: 0),
               "libdwfl callbacks: types differ");

#if defined(__has_include)
#if __has_include(<elfutils/libdwfl.h>)
#include <elfutils/libdwfl.h>
#define MSNAP_DWFL_CB_SAME(f)                                                 \
  _Static_assert(offsetof(Dwfl_Callbacks, f) ==                               \
                         offsetof(msnap__dwfl_callbacks_t, f) &&              \
                     _Generic(((Dwfl_Callbacks *)0)->f,                       \
                         __typeof__(((msnap__dwfl_callbacks_t *)0)->f): 1,    \
                         default: 0),                                         \
                 "Dwfl_Callbacks." #f " differs from elfutils")
MSNAP_DWFL_CB_SAME(find_elf);
MSNAP_DWFL_CB_SAME(find_debuginfo);
MSNAP_DWFL_CB_SAME(section_address);
MSNAP_DWFL_CB_SAME(debuginfo_path);
_Static_assert(sizeof(Dwfl_Callbacks) == sizeof(msnap__dwfl_callbacks_t),
               "Dwfl_Callbacks differs from elfutils");
_Static_assert(_Generic(&dwfl_begin,
                   Dwfl *(*)(const Dwfl_Callbacks *): 1, default: 0),
               "dwfl_begin differs from elfutils");
#undef MSNAP_DWFL_CB_SAME
#endif
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "record/stack.h"

enum { KIND_STACK = 1, KIND_STRING = 2 };

typedef struct sentry_s {
  _Atomic uint32_t refs;
  uint32_t id;
  uint64_t hash;
  const msnap_frame_hook_t *hook; /* stacks with interpreter frames      */
  uint32_t nc;                    /* C frames; strings: byte length      */
  uint32_t npy;                   /* interpreter frames                   */
  uint8_t kind;
  uintptr_t w[]; /* nc pcs then 2*npy words; strings: bytes + NUL        */
} sentry_t;

#define SLOT_CHUNK_BITS 12
#define SLOT_CHUNK (1u << SLOT_CHUNK_BITS)
#define SLOT_DIR 16384u /* 64M ids */
#define HT_TOMB UINT32_MAX

static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(sentry_t *) *slot_dir[SLOT_DIR]; /* chunks never move     */
static uint32_t next_id = 1;                    /* tab_lock              */
static uint32_t *free_ids;                      /* tab_lock              */
static uint32_t nfree, free_cap;                /* tab_lock              */
static uint32_t *ht;                            /* tab_lock; 0 empty     */
static uint32_t ht_cap, ht_used, ht_tombs;      /* tab_lock              */
static _Atomic size_t live_entries;

/* Dead stacks whose interpreter frames still await hook->release. */
static sentry_t **graves;          /* tab_lock */
static uint32_t ngraves, grave_cap; /* tab_lock */
static _Atomic uint32_t ngraves_hint;

static _Atomic(const msnap_frame_hook_t *) frame_hook;


static sentry_t *slot_get(uint32_t id) {
  if (msnap_unlikely((id >> SLOT_CHUNK_BITS) >= SLOT_DIR))
    return NULL; /* MSNAP_STACK_ID_EMPTY */
  _Atomic(sentry_t *) *chunk = __atomic_load_n(&slot_dir[id >> SLOT_CHUNK_BITS],
                                               __ATOMIC_ACQUIRE);
  if (chunk == NULL) return NULL;
  return atomic_load_explicit(&chunk[id & (SLOT_CHUNK - 1)],
                              memory_order_acquire);
}

/* Store into a slot, creating its chunk.  tab_lock held. */
static int slot_set_locked(uint32_t id, sentry_t *e) {
  uint32_t c = id >> SLOT_CHUNK_BITS;
  if (c >= SLOT_DIR) return MSNAP_ELIMIT;
  _Atomic(sentry_t *) *chunk = slot_dir[c];
  if (chunk == NULL) {
    chunk = calloc(SLOT_CHUNK, sizeof *chunk);
    if (chunk == NULL) return MSNAP_ENOMEM;
    __atomic_store_n(&slot_dir[c], chunk, __ATOMIC_RELEASE);
  }
  atomic_store_explicit(&chunk[id & (SLOT_CHUNK - 1)], e,
                        memory_order_release);
  return 0;
}

static size_t entry_words_bytes(uint8_t kind, uint32_t nc, uint32_t npy) {
  if (kind == KIND_STRING) return (size_t)nc + 1;
  return ((size_t)nc + 2 * (size_t)npy) * sizeof(uintptr_t);
}

static uint64_t content_hash(uint8_t kind, const void *p, size_t len,
                             uint32_t nc, uint32_t npy,
                             const msnap_frame_hook_t *hook) {
  uint64_t seed = ((uint64_t)kind << 56) ^ ((uint64_t)nc << 28) ^
                  (uint64_t)npy ^ (uint64_t)(uintptr_t)hook;
  return XXH3_64bits_withSeed(p, len, seed);
}

static bool entry_equal(const sentry_t *e, uint8_t kind, uint64_t hash,
                        const void *p, size_t len, uint32_t nc, uint32_t npy,
                        const msnap_frame_hook_t *hook) {
  return e->hash == hash && e->kind == kind && e->nc == nc &&
         e->npy == npy && e->hook == hook && memcmp(e->w, p, len) == 0;
}

/* Rebuild the hash index with capacity cap (power of two).  tab_lock. */
static int ht_rehash_locked(uint32_t cap) {
  uint32_t *n = calloc(cap, sizeof *n);
  if (n == NULL) return MSNAP_ENOMEM;
  for (uint32_t i = 0; i < ht_cap; i++) {
    uint32_t id = ht[i];
    if (id == 0 || id == HT_TOMB) continue;
    sentry_t *e = slot_get(id);
    uint32_t j = (uint32_t)e->hash & (cap - 1);
    while (n[j] != 0) j = (j + 1) & (cap - 1);
    n[j] = id;
  }
  free(ht);
  ht = n;
  ht_cap = cap;
  ht_tombs = 0;
  return 0;
}

static void ht_remove_locked(const sentry_t *e) {
  uint32_t j = (uint32_t)e->hash & (ht_cap - 1);
  while (ht[j] != 0) {
    if (ht[j] == e->id) {
      ht[j] = HT_TOMB;
      ht_used--;
      ht_tombs++;
      return;
    }
    j = (j + 1) & (ht_cap - 1);
  }
}

/*
 * Find or create the entry for some contents and return its id with one
 * new reference (0 on ENOMEM).  Takes tab_lock.  For a new stack with
 * interpreter frames, hook->retain runs once per frame under the lock.
 */
static uint32_t intern(uint8_t kind, const void *p, uint32_t nc, uint32_t npy,
                       const msnap_frame_hook_t *hook) {
  size_t len = entry_words_bytes(kind, nc, npy);
  size_t cmp_len = kind == KIND_STRING ? (size_t)nc : len;
  uint64_t h = content_hash(kind, p, cmp_len, nc, npy, hook);
  uint32_t id = 0;
  msnap__mutex_lock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  if (ht_cap == 0 || (ht_used + ht_tombs + 1) * 2 > ht_cap) {
    /* Rebuild at a load of at most 1/4 (tombstones are dropped). */
    uint32_t cap = ht_cap ? ht_cap : 1024;
    while ((ht_used + 1) * 4 > cap) cap *= 2;
    if (ht_rehash_locked(cap) != 0) goto out;
  }
  uint32_t j = (uint32_t)h & (ht_cap - 1), tomb = UINT32_MAX;
  while (ht[j] != 0) {
    if (ht[j] == HT_TOMB) {
      if (tomb == UINT32_MAX) tomb = j;
    } else {
      sentry_t *e = slot_get(ht[j]);
      if (entry_equal(e, kind, h, p, cmp_len, nc, npy, hook)) {
        atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
        id = e->id;
        goto out;
      }
    }
    j = (j + 1) & (ht_cap - 1);
  }
  sentry_t *e = malloc(sizeof *e + len);
  if (e == NULL) goto out;
  atomic_init(&e->refs, 1);
  e->hash = h;
  e->hook = hook;
  e->nc = nc;
  e->npy = npy;
  e->kind = kind;
  memcpy(e->w, p, cmp_len);
  if (kind == KIND_STRING) ((char *)e->w)[nc] = '\0';
  e->id = nfree ? free_ids[--nfree] : next_id++;
  if (slot_set_locked(e->id, e) != 0) {
    if (e->id == next_id - 1) next_id--;
    free(e);
    goto out;
  }
  if (tomb != UINT32_MAX) {
    j = tomb;
    ht_tombs--;
  }
  ht[j] = e->id;
  ht_used++;
  atomic_fetch_add_explicit(&live_entries, 1, memory_order_relaxed);
  if (kind == KIND_STACK && npy && hook && hook->retain) {
    const uintptr_t(*py)[2] = (const uintptr_t(*)[2])(e->w + nc);
    for (uint32_t i = 0; i < npy; i++) hook->retain(hook->ctx, py[i]);
  }
  id = e->id;
out:
  msnap__mutex_unlock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  return id;
}

uint32_t msnap__stack_intern(const uintptr_t *c, uint32_t nc,
                             const uintptr_t (*py)[2], uint32_t npy,
                             const msnap_frame_hook_t *hook) {
  if (nc + npy == 0) return 0;
  if (nc > MSNAP_STACK_MAX_C) nc = MSNAP_STACK_MAX_C;
  if (npy > MSNAP_STACK_MAX_PY) npy = MSNAP_STACK_MAX_PY;
  uintptr_t buf[MSNAP_STACK_MAX_C + 2 * MSNAP_STACK_MAX_PY];
  if (nc) memcpy(buf, c, nc * sizeof *c);
  if (npy) memcpy(buf + nc, py, npy * 2 * sizeof(uintptr_t));
  return intern(KIND_STACK, buf, nc, npy, npy ? hook : NULL);
}

uint32_t msnap__str_intern(const char *s, size_t len) {
  if (s == NULL || len == 0) return 0;
  if (len > UINT32_MAX - 1) len = UINT32_MAX - 1;
  return intern(KIND_STRING, s, (uint32_t)len, 0, NULL);
}

void msnap__stack_ref(uint32_t id) {
  if (id == 0) return;
  sentry_t *e = slot_get(id);
  if (e) atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
}

/* Drop one reference; the last one removes the entry.  The caller held a
 * reference, so the entry cannot vanish before the decrement.  May take
 * tab_lock (innermost lock, so any lock may be held). */
void msnap__stack_unref(uint32_t id) {
  if (id == 0) return;
  sentry_t *e = slot_get(id);
  if (e == NULL) return;
  uint32_t old = atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel);
  MSNAP_ASSERT(old >= 1); /* one unref too many */
  if (old != 1) return;
  msnap__mutex_lock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  e = slot_get(id);
  if (e != NULL && atomic_load_explicit(&e->refs, memory_order_acquire) == 0) {
    ht_remove_locked(e);
    slot_set_locked(id, NULL);
    if (MSNAP_GROW(free_ids, free_cap, nfree + 1) == 0)
      free_ids[nfree++] = id; /* else the id leaks */
    atomic_fetch_sub_explicit(&live_entries, 1, memory_order_relaxed);
    if (e->kind == KIND_STACK && e->npy && e->hook && e->hook->release) {
      if (MSNAP_GROW(graves, grave_cap, ngraves + 1) == 0) {
        graves[ngraves++] = e;
        atomic_store_explicit(&ngraves_hint, ngraves, memory_order_relaxed);
        e = NULL; /* freed after release */
      }
    }
    free(e);
  }
  msnap__mutex_unlock(&tab_lock, MSNAP_RANK_STACK_TABLE);
}

void msnap__stack_drain_releases(void) {
  if (atomic_load_explicit(&ngraves_hint, memory_order_relaxed) == 0) return;
  msnap__mutex_lock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  sentry_t **g = graves;
  uint32_t n = ngraves;
  graves = NULL;
  ngraves = grave_cap = 0;
  atomic_store_explicit(&ngraves_hint, 0, memory_order_relaxed);
  msnap__mutex_unlock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  for (uint32_t i = 0; i < n; i++) {
    sentry_t *e = g[i];
    const uintptr_t(*py)[2] = (const uintptr_t(*)[2])(e->w + e->nc);
    for (uint32_t k = 0; k < e->npy; k++) e->hook->release(e->hook->ctx, py[k]);
    free(e);
  }
  free(g);
}

const char *msnap__str_get(uint32_t id, size_t *len) {
  sentry_t *e = id ? slot_get(id) : NULL;
  if (e == NULL || e->kind != KIND_STRING) {
    if (len) *len = 0;
    return "";
  }
  if (len) *len = e->nc;
  return (const char *)e->w;
}

int msnap__stack_view(uint32_t id, msnap_stack_view_t *v) {
  if (id == MSNAP_STACK_ID_EMPTY) {
    memset(v, 0, sizeof *v);
    return 0;
  }
  sentry_t *e = id ? slot_get(id) : NULL;
  if (e == NULL || e->kind != KIND_STACK) return MSNAP_EINVAL;
  v->c = e->w;
  v->nc = e->nc;
  v->py = (const uintptr_t(*)[2])(e->w + e->nc);
  v->npy = e->npy;
  v->hook = e->hook;
  return 0;
}

uint32_t msnap__stack_refcount(uint32_t id) {
  if (id == MSNAP_STACK_ID_EMPTY) return 1;
  sentry_t *e = id ? slot_get(id) : NULL;
  return e ? atomic_load(&e->refs) : 0;
}

size_t msnap__stack_live(void) { return atomic_load(&live_entries); }

/* ---- capture ------------------------------------------------------------ */

const msnap_frame_hook_t *msnap__frame_hook(void) {
  return atomic_load_explicit(&frame_hook, memory_order_acquire);
}

/* Install or remove the interpreter hook.  The copy is never freed: dead
 * stacks may still point at it until their release runs. */
typedef struct hook_copy_s {
  msnap_frame_hook_t hook; /* first: a hook_copy_t* is a hook pointer */
  struct hook_copy_s *next;
} hook_copy_t;
static hook_copy_t *hook_copies; /* tab_lock; keeps old copies reachable */

int msnap_set_frame_hook(const msnap_frame_hook_t *hook) {
  msnap_frame_hook_t *copy = NULL;
  if (hook != NULL) {
    if (hook->capture == NULL || hook->resolve == NULL)
      return msnap__set_error(MSNAP_EINVAL,
                              "msnap_set_frame_hook: capture and resolve are "
                              "required");
    hook_copy_t *hc = malloc(sizeof *hc);
    if (hc == NULL) return MSNAP_ENOMEM;
    hc->hook = *hook;
    msnap__mutex_lock(&tab_lock, MSNAP_RANK_STACK_TABLE);
    hc->next = hook_copies;
    hook_copies = hc;
    msnap__mutex_unlock(&tab_lock, MSNAP_RANK_STACK_TABLE);
    copy = &hc->hook;
  }
  msnap__stack_tcache_flush();
  msnap__stack_drain_releases();
  atomic_store_explicit(&frame_hook, copy, memory_order_release);
  return 0;
}

/*
 * C frames, by MEMSNAP_UNWIND:
 *   - "cfi" (default on x86_64 and aarch64): the recorder's own DWARF
 *     unwinder with a process-wide cache of one compiled rule per return
 *     address (unwind.c): one probe and one or two loads per frame; a
 *     stack it cannot follow (signal frames, expressions) goes to
 *     libunwind when it loads, else to backtrace();
 *   - "libunwind" (the default elsewhere when libunwind.so.8 can be
 *     dlopen'ed): unw_backtrace with libunwind's per-thread cache of
 *     unwind info -- correct through code without frame pointers, about
 *     11 ns per frame once warm plus a context save per capture;
 *   - "backtrace": glibc backtrace(), the same DWARF walk without a
 *     cache, about 10x slower (8 us for 25 frames);
 *   - "fp": a frame-pointer walk, a few ns per frame, only meaningful when
 *     everything is built with frame pointers (functions without them are
 *     skipped; the walk stops at the first link outside the thread's
 *     stack, so it never faults).
 */
enum {
  UNWIND_BACKTRACE = 1,
  UNWIND_FP = 2,
  UNWIND_LIBUNWIND = 3,
  UNWIND_CFI = 4
};
static _Atomic int unwind_mode; /* 0 = not chosen yet */
static int (*unw_bt)(void **, int); /* set once before unwind_mode */

#if defined(__x86_64__)
#define UNW_PREFIX "_ULx86_64_"
#elif defined(__aarch64__)
#define UNW_PREFIX "_ULaarch64_"
#else
#define UNW_PREFIX NULL
#endif

/* dlopen libunwind and turn its per-thread caching on.  0 or -1. */
static int libunwind_load(void) {
  if (UNW_PREFIX == NULL) return -1;
  void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return -1;
  int (*bt)(void **, int) = (int (*)(void **, int))dlsym(h, "unw_backtrace");
  int (*policy)(void *, int) =
      (int (*)(void *, int))dlsym(h, UNW_PREFIX "set_caching_policy");
  void **as = (void **)dlsym(h, UNW_PREFIX "local_addr_space");
  if (bt == NULL) return -1;
  if (policy != NULL && as != NULL) policy(*as, 2 /* UNW_CACHE_PER_THREAD */);
  unw_bt = bt;
  return 0;
}

static pthread_mutex_t unwind_lock = PTHREAD_MUTEX_INITIALIZER;

static int unwinder(void) {
  int m = atomic_load_explicit(&unwind_mode, memory_order_acquire);
  if (msnap_likely(m != 0)) return m;
  /* Whether the CFI unwinder follows this stack (it may take its rule
   * cache's lock, MSNAP_RANK_UNWIND_CACHE: before ours, which then
   * guards the choice alone). */
  uintptr_t probe[4];
  bool cfi = msnap__unwind_cfi(probe, 4) > 0;
  /* (read before our lock: a bad value warns once, under env.c's lock) */
  static const char *const names[] = {"auto", "cfi", "libunwind",
                                      "backtrace", "fp", NULL};
  int want = msnap__env_choice(MSNAP_ENV_UNWIND, names, 0);
  msnap__mutex_lock(&unwind_lock, MSNAP_RANK_UNWIND);
  m = atomic_load_explicit(&unwind_mode, memory_order_relaxed);
  if (m == 0) {
    if (want == 4)
      m = UNWIND_FP;
    else if (want == 3)
      m = UNWIND_BACKTRACE;
    else if (want == 2)
      m = libunwind_load() == 0 ? UNWIND_LIBUNWIND : UNWIND_BACKTRACE;
    else if (cfi) /* its fallback: libunwind, else backtrace */
      m = (libunwind_load(), UNWIND_CFI);
    else
      m = libunwind_load() == 0 ? UNWIND_LIBUNWIND : UNWIND_BACKTRACE;
    atomic_store_explicit(&unwind_mode, m, memory_order_release);
  }
  msnap__mutex_unlock(&unwind_lock, MSNAP_RANK_UNWIND);
  return m;
}

int msnap__stack_set_unwinder(const char *name) {
  int m;
  if (strcmp(name, "fp") == 0)
    m = UNWIND_FP;
  else if (strcmp(name, "backtrace") == 0)
    m = UNWIND_BACKTRACE;
  else if (strcmp(name, "libunwind") == 0)
    m = UNWIND_LIBUNWIND;
  else if (strcmp(name, "cfi") == 0)
    m = UNWIND_CFI;
  else
    return MSNAP_EINVAL;
  uintptr_t probe[4];
  if (m == UNWIND_CFI && msnap__unwind_cfi(probe, 4) <= 0) return MSNAP_EINVAL;
  (void)unwinder(); /* chosen once: libunwind loaded if it can be */
  msnap__mutex_lock(&unwind_lock, MSNAP_RANK_UNWIND);
  int rc = 0;
  if (m == UNWIND_LIBUNWIND && unw_bt == NULL && libunwind_load() != 0)
    rc = MSNAP_EINVAL;
  else
    atomic_store_explicit(&unwind_mode, m, memory_order_release);
  msnap__mutex_unlock(&unwind_lock, MSNAP_RANK_UNWIND);
  return rc;
}

const char *msnap__stack_unwinder_name(void) {
  switch (unwinder()) {
  case UNWIND_FP: return "fp";
  case UNWIND_LIBUNWIND: return "libunwind";
  case UNWIND_CFI: return "cfi";
  default: return "backtrace";
  }
}

/* Return addresses by frame-pointer chain, starting with the caller of the
 * function that inlines this one. */
static inline __attribute__((always_inline)) int fp_walk(uintptr_t *out,
                                                         int max) {
  uintptr_t stk_lo, stk_hi; /* unknown: hi 1, the walk stops at once */
  msnap__thread_stack(&stk_lo, &stk_hi);
  uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
  int n = 0;
  while (n < max) {
    if (fp < stk_lo || fp + 2 * sizeof(uintptr_t) > stk_hi ||
        (fp & (sizeof(uintptr_t) - 1)))
      break;
    uintptr_t next = ((const uintptr_t *)fp)[0];
    uintptr_t ret = ((const uintptr_t *)fp)[1];
    if (ret == 0) break;
    out[n++] = ret;
    if (next <= fp) break;
    fp = next;
  }
  return n;
}

/* backtrace() is glibc's unwinder walk.  Its first call loads libgcc_s
 * (malloc, dl locks), so warm it up once outside any allocator lock. */
static pthread_once_t bt_once = PTHREAD_ONCE_INIT;
static void bt_warm(void) {
  void *tmp[4];
  msnap__unwind_loader_enter();
  (void)backtrace(tmp, 4);
  msnap__unwind_loader_leave();
}

/*
 * Per-thread cache of the last stacks this thread interned.  Loops capture
 * the same stack again and again; a hit costs a memcmp instead of a hash,
 * the table lock and a probe, and keeps a stack alive between a block's
 * free and the next malloc of the same site (no free/re-create churn).
 * Each cached id holds one reference, dropped when the slot is reused or
 * the thread exits.  An allocator call borrows the id it captured from
 * its slot (msnap__stack_capture_pinned): the slot is pinned until the
 * call ends, and a pinned slot is never reused -- so the call's stack
 * costs no atomic operation.
 */
#define TCACHE_SLOTS 4
typedef struct tcache_s {
  uint32_t id[TCACHE_SLOTS];
  uint8_t pins[TCACHE_SLOTS];
  unsigned next;
  bool registered;
  /* Per slot with an id: its entry (alive: the slot holds a reference)
   * and a copy of what tells stacks apart soonest -- the frame counts,
   * the hook, the first two words (innermost frame) and the last one --
   * so that a slot holding another stack is passed over without reading
   * the entry. */
  struct tcache_key_s {
    const sentry_t *e;
    const msnap_frame_hook_t *hook;
    uint32_t nc, npy;
    uintptr_t w0, w1, wl;
    /* the hook's token for these frames (capture_token), 0 if none: a
     * capture returning it, through the same hook and with no C frames,
     * is this stack without comparing a word */
    uint64_t token;
  } key[TCACHE_SLOTS];
  /* the tokens of this thread's last two captures that had one, newest
   * first: the one to offer the hook as known (tcache_known) */
  uint64_t recent[2];
} tcache_t;
static MSNAP_TLS tcache_t tc;
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;

/* Thread exit: every reference goes. */
static void tcache_destructor(void *p) {
  (void)p;
  tcache_t *t = msnap__tls_addr(&tc);
  for (int i = 0; i < TCACHE_SLOTS; i++) {
    uint32_t id = t->id[i];
    t->id[i] = 0;
    t->pins[i] = 0;
    msnap__stack_unref(id);
  }
}

static void tcache_key_make(void) {
  pthread_key_create(&tcache_key, tcache_destructor);
}

void msnap__stack_tcache_flush(void) {
  tcache_t *t = msnap__tls_addr(&tc);
  for (int i = 0; i < TCACHE_SLOTS; i++) {
    if (t->pins[i]) continue; /* in use by a call of this thread */
    uint32_t id = t->id[i];
    t->id[i] = 0;
    msnap__stack_unref(id);
  }
}

void msnap__stack_unpin(uint8_t *pin) {
  if (pin == NULL) return;
  MSNAP_ASSERT(pin >= tc.pins && pin < tc.pins + TCACHE_SLOTS);
  MSNAP_ASSERT(*pin > 0);
  if (*pin > 0) (*pin)--;
}

/* Look words (nc C frames then npy interpreter frames, at least one) up
 * in the cache; returns the slot + 1 holding them, or 0.  A nonzero token
 * of the hook (no C frames) finds its slot alone; else the full words are
 * compared (memcmp) before a slot is taken: the key only skips the slots
 * that differ early.  Inlined: the caller's address of the thread's cache
 * is reused (one TLS lookup per capture). */
static inline int tcache_find_token(const tcache_t *t,
                                    const msnap_frame_hook_t *hook,
                                    uint64_t token) {
  for (int i = 0; i < TCACHE_SLOTS; i++)
    if (t->key[i].token == token && t->id[i] != 0 && t->key[i].hook == hook)
      return i + 1;
  return 0;
}

static inline __attribute__((always_inline)) int
tcache_lookup(tcache_t *t, const uintptr_t *w, uint32_t nc, uint32_t npy,
              const msnap_frame_hook_t *hook, uint64_t token) {
  int slot;
  if (token != 0 && nc == 0 &&
      (slot = tcache_find_token(t, hook, token)) != 0)
    return slot;
  size_t nw = (size_t)nc + 2 * (size_t)npy;
  uintptr_t w1 = nw > 1 ? w[1] : 0, wl = w[nw - 1];
  for (int i = 0; i < TCACHE_SLOTS; i++) {
    const struct tcache_key_s *k = &t->key[i];
    if (t->id[i] == 0 || k->nc != nc || k->npy != npy || k->w0 != w[0] ||
        k->w1 != w1 || k->wl != wl || k->hook != hook)
      continue;
    if (nw <= 3 || memcmp(k->e->w + 2, w + 2, (nw - 2) * sizeof *w) == 0) {
      if (nc == 0 && token != 0) t->key[i].token = token; /* same frames */
      return i + 1;
    }
  }
  return 0;
}

/* A token of `hook` that a slot holds, to offer the hook as known: the
 * one of two captures ago (a loop's malloc and free alternate between two
 * stacks), else the last one; 0 when the cache holds neither.  A capture
 * that returns it may leave the frames unwritten: the slot is the stack. */
static inline uint64_t tcache_known(const tcache_t *t,
                                    const msnap_frame_hook_t *hook) {
  for (int r = 1; r >= 0; r--)
    if (t->recent[r] != 0 && tcache_find_token(t, hook, t->recent[r]))
      return t->recent[r];
  return 0;
}

/* The id of slot k (1-based) for a capture: pinned for the call (pin),
 * else with a reference of its own. */
static inline uint32_t tcache_take(tcache_t *t, int k, uint8_t **pin) {
  uint32_t id = t->id[k - 1];
  if (pin) {
    t->pins[k - 1]++;
    *pin = &t->pins[k - 1];
  } else {
    msnap__stack_ref(id);
  }
  return id;
}

/* Put id (whose reference the cache takes over) into a slot that is not
 * pinned; returns the slot + 1, or 0 when every slot is pinned (the
 * reference stays the caller's). */
static int tcache_insert(tcache_t *t, uint32_t id, uint64_t token) {
  if (!t->registered) {
    pthread_once(&tcache_once, tcache_key_make);
    pthread_setspecific(tcache_key, (void *)1);
    t->registered = true;
  }
  for (int j = 0; j < TCACHE_SLOTS; j++) {
    unsigned k = (t->next + (unsigned)j) % TCACHE_SLOTS;
    if (t->pins[k]) continue;
    t->next = k + 1;
    uint32_t old = t->id[k];
    const sentry_t *e = slot_get(id); /* alive: the caller's reference */
    size_t nw = (size_t)e->nc + 2 * (size_t)e->npy;
    t->key[k].e = e;
    t->key[k].hook = e->hook;
    t->key[k].nc = e->nc;
    t->key[k].npy = e->npy;
    t->key[k].w0 = e->w[0];
    t->key[k].w1 = nw > 1 ? e->w[1] : 0;
    t->key[k].wl = e->w[nw - 1];
    t->key[k].token = e->nc == 0 ? token : 0;
    t->id[k] = id;
    msnap__stack_unref(old);
    return (int)k + 1;
  }
  return 0;
}

/* Capture the calling thread's stack (see stack.h).  The C part starts at
 * the caller of the (noinline) entry point whose return address is `ret`
 * -- located by that address, so that interposed unwinders (sanitizers)
 * adding frames do not matter -- and drops `skip` more frames.  The
 * frames are gathered in place, in the layout of a table entry, so that a
 * cache hit copies nothing.  pin NULL: the id is returned with a
 * reference; else borrowed from a pinned cache slot when possible. */
static inline __attribute__((always_inline)) uint32_t
capture(unsigned stacks, int skip, uintptr_t ret, uint8_t **pin) {
  uintptr_t w[MSNAP_STACK_MAX_C + 2 * MSNAP_STACK_MAX_PY];
  int nc = 0, npy = 0;
  uint64_t token = 0;
  const msnap_frame_hook_t *hook = NULL;
  tcache_t *t = msnap__tls_addr(&tc);
  if (stacks & MSNAP_STACKS_CPP) {
    int um = unwinder();
    nc = -1;
    if (um == UNWIND_CFI) {
      nc = msnap__unwind_cfi(w, MSNAP_STACK_MAX_C);
      if (nc < 0) um = unw_bt ? UNWIND_LIBUNWIND : UNWIND_BACKTRACE;
    }
    if (um == UNWIND_FP) {
      nc = fp_walk(w, MSNAP_STACK_MAX_C);
    } else if (um == UNWIND_LIBUNWIND) {
      msnap__unwind_loader_enter();
      nc = unw_bt((void **)w, MSNAP_STACK_MAX_C);
      msnap__unwind_loader_leave();
      if (nc < 0) nc = 0;
    } else if (um == UNWIND_BACKTRACE) {
      pthread_once(&bt_once, bt_warm);
      msnap__unwind_loader_enter();
      nc = backtrace((void **)w, MSNAP_STACK_MAX_C);
      msnap__unwind_loader_leave();
    }
    int self = 1; /* default: only this function's frame */
    for (int i = 0; i < nc && i < 8; i++) {
      if (w[i] == ret) {
        self = i;
        break;
      }
    }
    skip += self;
    if (skip >= nc) {
      nc = 0;
    } else {
      memmove(w, w + skip, (size_t)(nc - skip) * sizeof w[0]);
      nc -= skip;
    }
  }
  if (stacks & MSNAP_STACKS_PYTHON) {
    hook = msnap__frame_hook();
    if (hook != NULL) {
      uint64_t known = 0;
      if (hook->capture_token != NULL) {
        /* with C frames the words are compared: nothing to offer */
        token = known = nc == 0 ? tcache_known(t, hook) : 0;
        npy = hook->capture_token(hook->ctx, (uintptr_t(*)[2])(w + nc),
                                  MSNAP_STACK_MAX_PY, &token);
      } else {
        npy = hook->capture(hook->ctx, (uintptr_t(*)[2])(w + nc),
                            MSNAP_STACK_MAX_PY);
      }
      if (token != 0) {
        t->recent[1] = t->recent[0];
        t->recent[0] = token;
      }
      if (known != 0 && token == known) {
        /* the frames may be unwritten: the slot holding `known` is the
         * stack (this thread's cache has not changed since) */
        int k = tcache_find_token(t, hook, token);
        if (msnap_likely(k != 0 && npy > 0 && npy <= MSNAP_STACK_MAX_PY &&
                         t->key[k - 1].npy == (uint32_t)npy)) {
          msnap__stack_drain_releases();
          return tcache_take(t, k, pin);
        }
        /* (never: a hook that broke its word) capture again, written */
        token = 0;
        npy = hook->capture_token(hook->ctx, (uintptr_t(*)[2])(w + nc),
                                  MSNAP_STACK_MAX_PY, &token);
      }
      if (npy < 0) npy = 0, token = 0;
      if (npy > MSNAP_STACK_MAX_PY) npy = MSNAP_STACK_MAX_PY, token = 0;
      /* This thread runs the interpreter: a good place for deferred
       * releases. */
      if (npy > 0) msnap__stack_drain_releases();
    }
  }
  if (pin) *pin = NULL;
  if (nc + npy == 0) return stacks ? MSNAP_STACK_ID_EMPTY : 0;
  if (npy == 0) hook = NULL;
  int k = tcache_lookup(t, w, (uint32_t)nc, (uint32_t)npy, hook, token);
  if (k != 0) return tcache_take(t, k, pin);
  uint32_t id = intern(KIND_STACK, w, (uint32_t)nc, (uint32_t)npy, hook);
  if (id == 0) return 0;
  if (!pin) msnap__stack_ref(id); /* one for the cache, one returned */
  k = tcache_insert(t, id, token);
  if (k == 0) {
    if (!pin) msnap__stack_unref(id); /* not cached after all */
    return id;
  }
  if (pin) {
    t->pins[k - 1]++;
    *pin = &t->pins[k - 1];
  }
  return id;
}

__attribute__((noinline)) uint32_t msnap__stack_capture(unsigned stacks,
                                                        int skip) {
  return capture(stacks, skip, (uintptr_t)__builtin_return_address(0), NULL);
}

__attribute__((noinline)) uint32_t
msnap__stack_capture_pinned(unsigned stacks, int skip, uint8_t **pin) {
  return capture(stacks, skip, (uintptr_t)__builtin_return_address(0), pin);
}

int msnap__stack_check(char *msg, size_t len) {
  int rc = 0;
  msnap__mutex_lock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  size_t live = 0;
  for (uint32_t id = 1; id < next_id && rc == 0; id++) {
    sentry_t *e = slot_get(id);
    if (e == NULL) continue;
    live++;
    if (e->id != id) {
      snprintf(msg, len, "stack table: slot %u holds entry %u", id, e->id);
      rc = MSNAP_ESTATE;
      break;
    }
    /* the entry must be reachable through the index */
    uint32_t j = (uint32_t)e->hash & (ht_cap - 1), found = 0;
    while (ht[j] != 0) {
      if (ht[j] == id) found++;
      j = (j + 1) & (ht_cap - 1);
    }
    if (found != 1) {
      snprintf(msg, len, "stack table: entry %u indexed %u times", id, found);
      rc = MSNAP_ESTATE;
    }
  }
  for (uint32_t i = 0; i < nfree && rc == 0; i++) {
    if (slot_get(free_ids[i]) != NULL) {
      snprintf(msg, len, "stack table: free id %u has an entry", free_ids[i]);
      rc = MSNAP_ESTATE;
    }
  }
  if (rc == 0 && live != ht_used) {
    snprintf(msg, len, "stack table: %zu live entries, %u indexed", live,
             ht_used);
    rc = MSNAP_ESTATE;
  }
  msnap__mutex_unlock(&tab_lock, MSNAP_RANK_STACK_TABLE);
  return rc;
}

/* ---- symbolization ------------------------------------------------------ */

/* libdw entry points, resolved with dlsym. */
typedef struct dw_api_s {
  Dwfl *(*begin)(const msnap__dwfl_callbacks_t *); /* dwfl_begin */
  __typeof__(&dwfl_linux_proc_report) proc_report;
  __typeof__(&dwfl_report_begin_add) report_begin_add;
  __typeof__(&dwfl_report_end) report_end;
  __typeof__(&dwfl_addrmodule) addrmodule;
  __typeof__(&dwfl_module_addrname) addrname;
  __typeof__(&dwfl_module_getsymtab) getsymtab;       /* NULL: no index */
  __typeof__(&dwfl_module_getsym_info) getsym_info; /* NULL: no index */
  __typeof__(&dwfl_module_getsrc) getsrc;
  __typeof__(&dwfl_lineinfo) lineinfo;
  msnap__dwfl_callbacks_t cb;
  Dwfl *dwfl;
} dw_api_t;

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);

typedef struct sym_slot_s {
  uintptr_t pc;
  msnap_csym_t sym;
} sym_slot_t;

static pthread_mutex_t sym_lock = PTHREAD_MUTEX_INITIALIZER;
static bool sym_inited;        /* sym_lock */
static dw_api_t dw;            /* sym_lock; dw.dwfl NULL = no libdw */
static demangle_fn demangle;   /* sym_lock */
static sym_slot_t *sym_cache;  /* sym_lock; open addressing by pc */
static size_t sym_cap, sym_used;

static void sym_init_locked(void) {
  sym_inited = true;
  demangle = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
  if (msnap__env_get(MSNAP_ENV_NO_LIBDW) != NULL) return;
  void *h = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
#define DW_SYM(field, name)                                                   \
  do {                                                                        \
    *(void **)&dw.field = dlsym(h, name);                                     \
    if (dw.field == NULL) return;                                             \
  } while (0)
  DW_SYM(begin, "dwfl_begin");
  DW_SYM(proc_report, "dwfl_linux_proc_report");
  DW_SYM(report_begin_add, "dwfl_report_begin_add");
  DW_SYM(report_end, "dwfl_report_end");
  DW_SYM(addrmodule, "dwfl_addrmodule");
  DW_SYM(addrname, "dwfl_module_addrname");
  DW_SYM(getsrc, "dwfl_module_getsrc");
  DW_SYM(lineinfo, "dwfl_lineinfo");
#undef DW_SYM
  /* optional: without them every name is dwfl_module_addrname's */
  *(void **)&dw.getsymtab = dlsym(h, "dwfl_module_getsymtab");
  *(void **)&dw.getsym_info = dlsym(h, "dwfl_module_getsym_info");
  *(void **)&dw.cb.find_elf = dlsym(h, "dwfl_linux_proc_find_elf");
  *(void **)&dw.cb.find_debuginfo = dlsym(h, "dwfl_standard_find_debuginfo");
  if (dw.cb.find_elf == NULL || dw.cb.find_debuginfo == NULL) return;
  dw.dwfl = dw.begin(&dw.cb);
  if (dw.dwfl == NULL) return;
  if (dw.proc_report(dw.dwfl, getpid()) != 0 ||
      dw.report_end(dw.dwfl, NULL, NULL) != 0)
    dw.dwfl = NULL; /* leaked on purpose: half-initialised */
}

/*
 * Symbol names by address, module by module.  dwfl_module_addrname reads
 * the module's whole symbol table for every address (libtorch_cpu.so:
 * 530 K symbols), so the first snapshot with C frames of a torch program
 * spent seconds there.  A module with at least SYMX_MIN symbols gets an
 * index instead, built on its first lookup: its named symbols that have
 * a size, sorted by start address.  A lookup takes, among the indexed
 * symbols containing the address, the one that starts nearest below it,
 * then the strongest binding (global, weak, local: libdw's preference),
 * then the first in the table -- libdw's answer wherever symbols do not
 * nest.  An address no sized symbol contains (an assembly label without
 * a size, a PLT stub) is left to dwfl_module_addrname, as is every
 * address of a smaller module.  The names point into libdw's copy of the
 * string table, which lives as long as the Dwfl (the process).  Memory:
 * 24 bytes per indexed symbol (about 10 MB for libtorch_cpu.so), kept
 * for the life of the process like the Dwfl.  sym_lock guards all.
 */
#define SYMX_MIN 1024
#define SYMX_SCAN 64 /* indexed symbols looked at below an address */
typedef struct symx_s {
  uintptr_t start;
  const char *name;
  uint32_t size;
  uint32_t order; /* bits 31-30: 3 - binding rank; 29-0: table index */
} symx_t;
typedef struct symx_mod_s {
  Dwfl_Module *mod;
  symx_t *v; /* NULL: not indexed (small, or the index failed) */
  size_t n;
} symx_mod_t;
static symx_mod_t *symx_mods; /* sym_lock */
static size_t symx_nmods, symx_capmods;

static int symx_cmp(const void *a, const void *b) {
  const symx_t *x = a, *y = b;
  if (x->start != y->start) return x->start < y->start ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* libdw's preference among bindings: global, then weak, then local. */
static uint32_t symx_rank(unsigned bind) {
  return bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
}

static void symx_build(symx_mod_t *x) {
  x->v = NULL;
  x->n = 0;
  if (dw.getsymtab == NULL || dw.getsym_info == NULL) return;
  int n = dw.getsymtab(x->mod);
  if (n < SYMX_MIN || n >= (1 << 30)) return;
  symx_t *v = malloc((size_t)n * sizeof *v);
  if (v == NULL) return;
  size_t k = 0;
  for (int i = 1; i < n; i++) {
    GElf_Sym sym;
    GElf_Addr addr;
    GElf_Word shndx;
    const char *name = dw.getsym_info(x->mod, i, &sym, &addr, &shndx, NULL,
                                      NULL);
    unsigned type = ELF64_ST_TYPE(sym.st_info);
    if (name == NULL || name[0] == '\0' || sym.st_size == 0 ||
        sym.st_size > UINT32_MAX || shndx == SHN_UNDEF ||
        type == STT_SECTION || type == STT_FILE || type == STT_TLS)
      continue;
    v[k].start = (uintptr_t)addr;
    v[k].name = name;
    v[k].size = (uint32_t)sym.st_size;
    v[k].order = symx_rank(ELF64_ST_BIND(sym.st_info)) << 30 | (uint32_t)i;
    k++;
  }
  if (k == 0) {
    free(v);
    return;
  }
  qsort(v, k, sizeof *v, symx_cmp);
  x->v = v;
  x->n = k;
}

/* The module's index entry (made on first use); NULL without memory. */
static symx_mod_t *symx_of(Dwfl_Module *m) {
  static size_t last;
  if (last < symx_nmods && symx_mods[last].mod == m) return &symx_mods[last];
  for (size_t i = 0; i < symx_nmods; i++)
    if (symx_mods[i].mod == m) return &symx_mods[last = i];
  if (symx_nmods == symx_capmods) {
    size_t cap = symx_capmods ? symx_capmods * 2 : 64;
    symx_mod_t *n = realloc(symx_mods, cap * sizeof *n);
    if (n == NULL) return NULL;
    symx_mods = n;
    symx_capmods = cap;
  }
  symx_mod_t *x = &symx_mods[last = symx_nmods++];
  x->mod = m;
  symx_build(x);
  return x;
}

/* The name of the symbol containing q in module m (see above), or NULL. */
static const char *sym_addrname(Dwfl_Module *m, uintptr_t q) {
  symx_mod_t *x = symx_of(m);
  if (x == NULL || x->v == NULL) return dw.addrname(m, q);
  /* the last symbol starting at or below q */
  size_t lo = 0, hi = x->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->v[mid].start <= q)
      lo = mid + 1;
    else
      hi = mid;
  }
  /* back from there: the first that contains q starts nearest below it;
   * at one start the order puts the strongest binding first */
  const symx_t *best = NULL;
  for (size_t j = lo, seen = 0; j > 0 && seen < SYMX_SCAN; j--, seen++) {
    const symx_t *s = &x->v[j - 1];
    if (best != NULL && s->start != best->start) break;
    if (q - s->start < s->size) best = s;
  }
  return best != NULL ? best->name : dw.addrname(m, q);
}

static char *sym_strdup(const char *s) {
  char *d = strdup(s ? s : "??");
  return d ? d : (char *)"??";
}

static char *sym_name(const char *raw) {
  if (raw == NULL) return (char *)"??";
  if (demangle != NULL && raw[0] == '_' && raw[1] == 'Z') {
    int status = -1;
    char *d = demangle(raw, NULL, NULL, &status);
    if (d != NULL && status == 0) return d;
    free(d);
  }
  return sym_strdup(raw);
}

/* Is the code at q memsnap's own: in the shared libmemsnap.so that holds
 * this function, in the Python extension _memsnap.*.so, or in the torch
 * shim (libmemsnap_torch.so, libmemsnap_torch_npu.so)? */
static bool sym_own(uintptr_t q) {
  static void *own_base; /* libmemsnap.so's base; sym_lock held */
  static bool own_known;
  if (!own_known) {
    Dl_info me;
    own_known = true;
    if (dladdr((void *)(uintptr_t)&sym_own, &me) && me.dli_fname) {
      const char *b = strrchr(me.dli_fname, '/');
      b = b ? b + 1 : me.dli_fname;
      if (strncmp(b, "libmemsnap.so", 13) == 0) own_base = me.dli_fbase;
    }
  }
  Dl_info di;
  if (q == 0 || !dladdr((void *)q, &di)) return false;
  if (own_base != NULL && di.dli_fbase == own_base) return true;
  const char *b = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
  b = b ? b + 1 : di.dli_fname;
  return b != NULL && (strncmp(b, "_memsnap.", 9) == 0 ||
                       strncmp(b, "libmemsnap_torch", 16) == 0);
}

/* Resolve one pc (not cached).  sym_lock held. */
static void sym_lookup_locked(uintptr_t pc, msnap_csym_t *out) {
  /* pc is a return address: look at the call instruction before it. */
  uintptr_t q = pc ? pc - 1 : pc;
  out->name = "??";
  out->filename = "??";
  out->line = 0;
  out->own = sym_own(q);
  if (dw.dwfl != NULL) {
    Dwfl_Module *m = dw.addrmodule(dw.dwfl, q);
    if (m == NULL) {
      /* Maybe a library loaded after the last report: report again, at
       * most every 200 ms (addresses outside every module -- JIT code --
       * would otherwise re-read /proc/self/maps each time). */
      static int64_t last_report_us;
      int64_t now = msnap__clock_now_us();
      if (now - last_report_us > 200000) {
        last_report_us = now;
        dw.report_begin_add(dw.dwfl);
        dw.proc_report(dw.dwfl, getpid());
        dw.report_end(dw.dwfl, NULL, NULL);
        m = dw.addrmodule(dw.dwfl, q);
      }
    }
    if (m != NULL) {
      const char *n = sym_addrname(m, q);
      Dwfl_Line *l = dw.getsrc(m, q);
      int line = 0;
      const char *f = l ? dw.lineinfo(l, NULL, &line, NULL, NULL, NULL) : NULL;
      if (n != NULL) out->name = sym_name(n);
      if (f != NULL) {
        out->filename = sym_strdup(f);
        out->line = line;
      }
      if (n != NULL) {
        if (f == NULL) {
          Dl_info di;
          if (dladdr((void *)q, &di) && di.dli_fname)
            out->filename = sym_strdup(di.dli_fname);
        }
        return;
      }
    }
  }
  Dl_info di;
  if (dladdr((void *)q, &di) != 0) {
    if (di.dli_sname) out->name = sym_name(di.dli_sname);
    if (di.dli_fname) out->filename = sym_strdup(di.dli_fname);
  }
}

void msnap__symbolize(uintptr_t pc, msnap_csym_t *out) {
  msnap__mutex_lock(&sym_lock, MSNAP_RANK_SYMBOLS);
  if (!sym_inited) sym_init_locked();
  if (sym_cap == 0 || (sym_used + 1) * 2 > sym_cap) {
    size_t cap = sym_cap ? sym_cap * 2 : 1024;
    sym_slot_t *n = calloc(cap, sizeof *n);
    if (n != NULL) {
      for (size_t i = 0; i < sym_cap; i++) {
        if (sym_cache[i].pc == 0) continue;
        size_t j = (size_t)(XXH3_64bits(&sym_cache[i].pc, sizeof(uintptr_t)) &
                            (cap - 1));
        while (n[j].pc != 0) j = (j + 1) & (cap - 1);
        n[j] = sym_cache[i];
      }
      free(sym_cache);
      sym_cache = n;
      sym_cap = cap;
    }
  }
  if (sym_cap == 0 || pc == 0) {
    sym_lookup_locked(pc, out);
    msnap__mutex_unlock(&sym_lock, MSNAP_RANK_SYMBOLS);
    return;
  }
  size_t j = (size_t)(XXH3_64bits(&pc, sizeof pc) & (sym_cap - 1));
  while (sym_cache[j].pc != 0 && sym_cache[j].pc != pc)
    j = (j + 1) & (sym_cap - 1);
  if (sym_cache[j].pc == 0) {
    if ((sym_used + 1) * 2 > sym_cap) { /* growth failed: no caching */
      sym_lookup_locked(pc, out);
      msnap__mutex_unlock(&sym_lock, MSNAP_RANK_SYMBOLS);
      return;
    }
    sym_cache[j].pc = pc;
    sym_lookup_locked(pc, &sym_cache[j].sym);
    sym_used++;
  }
  *out = sym_cache[j].sym;
  msnap__mutex_unlock(&sym_lock, MSNAP_RANK_SYMBOLS);
}

long msnap__symbolize_check(uintptr_t lo, uintptr_t hi, size_t step,
                            char *msg, size_t len) {
  long n = 0;
  if (step == 0) step = 1;
  msnap__mutex_lock(&sym_lock, MSNAP_RANK_SYMBOLS);
  if (!sym_inited) sym_init_locked();
  for (uintptr_t q = lo; dw.dwfl != NULL && q < hi; q += step) {
    Dwfl_Module *m = dw.addrmodule(dw.dwfl, q);
    if (m == NULL) continue;
    symx_mod_t *x = symx_of(m);
    if (x == NULL || x->v == NULL) continue;
    const char *a = sym_addrname(m, q), *b = dw.addrname(m, q);
    n++;
    if ((a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0)) {
      snprintf(msg, len, "symbol index: %#llx is %s, libdw says %s",
               (unsigned long long)q, a ? a : "(none)", b ? b : "(none)");
      n = MSNAP_ESTATE;
      break;
    }
    if (hi - q <= step) break;
  }
  msnap__mutex_unlock(&sym_lock, MSNAP_RANK_SYMBOLS);
  return n;
}

const char *msnap__symbolizer_name(void) {
  msnap__mutex_lock(&sym_lock, MSNAP_RANK_SYMBOLS);
  if (!sym_inited) sym_init_locked();
  const char *n = dw.dwfl ? "libdw" : "dladdr";
  msnap__mutex_unlock(&sym_lock, MSNAP_RANK_SYMBOLS);
  return n;
}

/* unwind_lock, then sym_lock, then the stack table lock (innermost). */
/* Fork safety (alloc/fork.c): rank order MSNAP_RANK_STACK_TABLE <
 * MSNAP_RANK_UNWIND < MSNAP_RANK_UNWIND_CACHE (unwind.c's rule cache) <
 * MSNAP_RANK_SYMBOLS; released in reverse. */
void msnap__stack_atfork(int phase) {
  if (phase == MSNAP_FORK_PREPARE) {
    msnap__fork_mutex(&tab_lock, phase);
    msnap__fork_mutex(&unwind_lock, phase);
    msnap__unwind_atfork(phase);
    msnap__fork_mutex(&sym_lock, phase);
  } else {
    msnap__fork_mutex(&sym_lock, phase);
    msnap__unwind_atfork(phase);
    msnap__fork_mutex(&unwind_lock, phase);
    msnap__fork_mutex(&tab_lock, phase);
  }
}
