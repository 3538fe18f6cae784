/*
 * stack.h -- the process-wide intern table of captured stacks and strings
 * (stack.c).
 *
 * One table serves every allocator.  An entry is either a STACK (raw C
 * return addresses, innermost first, plus raw interpreter frames from the
 * msnap_frame_hook_t, innermost first) or a STRING (user metadata,
 * compile context, annotation text).  Both live in one id space: ids are
 * small integers, 0 means "none" (no stack / the empty string), and
 * msnap__stack_ref / msnap__stack_unref count references for either
 * kind.
 *
 * Invariants (msnap__stack_check):
 *   - every live entry is in the hash index exactly once and in its id
 *     slot; identical contents are never interned twice;
 *   - a live entry has refs >= 1, except transiently between the last
 *     unref and its removal under the table lock;
 *   - freed ids are on the free list and their slots are NULL.
 *
 * Ownership: intern/capture return an id holding ONE reference for the
 * caller.  Views of an entry (msnap__stack_view, msnap__str_get) are valid
 * while the caller holds a reference.
 *
 * Interpreter frames: hook->retain is called once per frame when a stack
 * holding it is created; hook->release is DEFERRED when the stack dies and
 * called on the next thread whose capture() returned frames (such a thread
 * runs the interpreter, e.g. holds the GIL), or by msnap_set_frame_hook.
 *
 * Lock: the table lock (MSNAP_RANK_STACK_TABLE) is taken inside the
 * device, host and annotation locks, never the other way round; reference
 * counts are atomics and need no lock except when a count drops to zero.
 */
#ifndef MSNAP_STACK_H
#define MSNAP_STACK_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define MSNAP_STACK_MAX_C 128
#define MSNAP_STACK_MAX_PY 256

typedef struct msnap_stack_view_s {
  const uintptr_t *c;        /* nc return addresses, innermost first */
  uint32_t nc;
  const uintptr_t (*py)[2];  /* npy raw interpreter frames             */
  uint32_t npy;
  const msnap_frame_hook_t *hook; /* hook that captured py (or NULL)   */
} msnap_stack_view_t;

/* The id of a captured stack without a frame (stacks "python" on a thread
 * that runs no Python code, such as autograd's device threads; a C stack
 * nothing could unwind).  PyTorch's gathered context then exists and is
 * empty, and the snapshot says `frames: []` where a context is recorded
 * (torch/csrc/cuda/memory_snapshot.cpp: a trace entry has `frames` when
 * its context is set).  Not a table entry: beyond every real id,
 * references on it are not counted (ref and unref do nothing, refcount
 * says 1), its view has no frame. */
#define MSNAP_STACK_ID_EMPTY UINT32_C(0xfffffffe)

/* Intern a stack; returns its id with one reference, 0 when both parts are
 * empty or on host ENOMEM. */
uint32_t msnap__stack_intern(const uintptr_t *c, uint32_t nc,
                             const uintptr_t (*py)[2], uint32_t npy,
                             const msnap_frame_hook_t *hook);
/* Capture the calling thread's stack: C frames when stacks has
 * MSNAP_STACKS_CPP (dropping the `skip` innermost ones, i.e. memsnap's own
 * frames), interpreter frames when it has MSNAP_STACKS_PYTHON and a hook
 * is installed.  Returns an id with one reference, MSNAP_STACK_ID_EMPTY
 * when no frame was found, 0 when stacks is 0 or on host ENOMEM. */
uint32_t msnap__stack_capture(unsigned stacks, int skip);
/* The same, for a caller that uses the id only until a matching
 * msnap__stack_unpin on this thread (an allocator call): on a hit in the
 * thread's stack cache, or when the new stack enters it, the id is
 * borrowed from the cache, whose slot stays pinned (*pin: its pin
 * counter) -- no atomic operation; otherwise (*pin NULL) the caller owns
 * one reference. */
uint32_t msnap__stack_capture_pinned(unsigned stacks, int skip,
                                     uint8_t **pin);
/* End a pin (NULL: no-op), on the thread that captured it. */
void msnap__stack_unpin(uint8_t *pin);
/* The DWARF CFI unwinder (unwind.c): return addresses of the calling
 * thread, innermost first, the first one inside msnap__unwind_cfi itself;
 * at most max.  -1 when it cannot follow this stack (the caller then uses
 * another unwinder).  Rules are cached per return address for the life
 * of the process. */
int msnap__unwind_cfi(uintptr_t *out, int max);
/* The calling thread's stack [lo, hi) (pthread_getattr_np, once per
 * thread; hi 1 when unknown): the bounds every stack walk reads within. */
void msnap__thread_stack(uintptr_t *lo, uintptr_t *hi);
/* Forget the calling thread's last walk (tests: the next capture walks
 * every frame by rule). */
void msnap__unwind_forget(void);
/* Rules in the unwind cache (tests). */
size_t msnap__unwind_cached(void);
/* Structure check of the unwind cache: 0 or MSNAP_ESTATE with msg. */
int msnap__unwind_check(char *msg, size_t len);
/* Fork safety: the loader guard and the rule cache's lock
 * (msnap__stack_atfork calls it at the rank MSNAP_RANK_UNWIND_CACHE). */
void msnap__unwind_atfork(int phase);
/* Around a walk that may enter dl_iterate_phdr (libunwind, backtrace):
 * no fork happens inside it (see unwind.c on the loader's lock). */
void msnap__unwind_loader_enter(void);
void msnap__unwind_loader_leave(void);
/* Tests: find objects with _dl_find_object (true, the default where libc
 * has it) or through dl_iterate_phdr (false), and empty the rule cache so
 * that the next walks compute their rules that way.  Returns whether libc
 * has _dl_find_object. */
bool msnap__unwind_test_finder(bool find_object_on);
/* The C unwinder in use (MEMSNAP_UNWIND): "cfi" (default where
 * supported: x86_64, aarch64), "libunwind", "backtrace" (glibc) or "fp".
 * With "cfi", a stack it cannot follow is unwound by libunwind when
 * libunwind.so.8 loads, else by backtrace(). */
const char *msnap__stack_unwinder_name(void);
/* Switch the unwinder ("cfi", "libunwind", "backtrace", "fp") for tests
 * and benchmarks that compare them in one process: 0, or MSNAP_EINVAL
 * when it is unknown or unavailable here. */
int msnap__stack_set_unwinder(const char *name);
/* Intern a string (len bytes, need not be NUL-terminated).  "" gives 0. */
uint32_t msnap__str_intern(const char *s, size_t len);
/* Text of a string id ("" for 0); valid while a reference is held. */
const char *msnap__str_get(uint32_t id, size_t *len);
/* The parts of a stack id; MSNAP_EINVAL for 0, a string or a dead id. */
int msnap__stack_view(uint32_t id, msnap_stack_view_t *v);
/* One more / one less reference on a stack or string id (0: no-op); the
 * entry dies at zero (the table lock is taken then). */
void msnap__stack_ref(uint32_t id);
void msnap__stack_unref(uint32_t id);
/* Current reference count (tests); 0 for a dead id. */
uint32_t msnap__stack_refcount(uint32_t id);
/* Live entries (stacks + strings) in the table (tests, leak checks). */
size_t msnap__stack_live(void);
/* The installed interpreter-frame hook or NULL. */
const msnap_frame_hook_t *msnap__frame_hook(void);
/* Call the deferred hook->release of dead stacks now (tests, shutdown);
 * the caller must be allowed to run the hook. */
void msnap__stack_drain_releases(void);
/* Drop the calling thread's cache of recently captured stacks (each
 * thread keeps references on its last few stacks; msnap_set_frame_hook
 * and thread exit flush it too); pinned slots stay. */
void msnap__stack_tcache_flush(void);
/* Structure check (see top of file): 0 or MSNAP_ESTATE with msg. */
int msnap__stack_check(char *msg, size_t len);

/* Symbol of a C return address: function name, source file and line
 * ("??", "??", 0 when unknown; never fails).  Looked up once per address
 * (libdw via dlopen when available, else dladdr) and cached for the life
 * of the process; the strings are never freed. */
typedef struct msnap_csym_s {
  const char *name, *filename;
  int64_t line;
  /* memsnap's own code: the shared libmemsnap.so, the Python extension
   * _memsnap.*.so or the torch shim libmemsnap_torch*.so (not a program
   * that links the core statically) -- snapshots leave these frames out. */
  bool own;
} msnap_csym_t;
void msnap__symbolize(uintptr_t pc, msnap_csym_t *out);
/* Whether libdw was found ("libdw" or "dladdr"). */
const char *msnap__symbolizer_name(void);
/* Tests: the symbol index (stack.c, symx) against libdw's own lookup,
 * dwfl_module_addrname, at every `step` bytes of [lo, hi).  Returns the
 * number of addresses compared in indexed modules (0 without libdw or
 * when none is indexed), or MSNAP_ESTATE with both names in msg at the
 * first address where they differ. */
long msnap__symbolize_check(uintptr_t lo, uintptr_t hi, size_t step,
                            char *msg, size_t len);

/* Fork safety: the stack table, unwinder choice, CFI rule cache and symbol
 * locks (alloc/fork.c calls it at their rank). */
void msnap__stack_atfork(int phase);

#endif /* MSNAP_STACK_H */
