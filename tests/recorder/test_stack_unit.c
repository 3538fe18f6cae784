/*
 * test_stack_unit.c -- the stack/string intern table (dedup, reference
 * counts, id reuse), interpreter-frame hooks (retain, deferred release),
 * C-frame symbolization, and the CFI unwinder (record/unwind.c) against
 * libunwind and glibc backtrace(): the same return addresses through
 * frames with and without frame pointers, alloca frames, deep recursion,
 * call paths that change between captures at the same stack depth (the
 * replay of the thread's last walk) and after forgetting it; and that
 * the fork handler (msnap__stack_atfork) holds the CFI rule cache's lock
 * with the others until the parent's release.
 */
#include <alloca.h>
#include <dlfcn.h>
#include <link.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "record/history.h"
#include "record/stack.h"

static void check_table(void) {
  char msg[256];
  int rc = msnap__stack_check(msg, sizeof msg);
  if (rc != 0) fail_msg("%s", msg);
}

static void test_intern_dedup_and_free(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  uintptr_t c1[] = {0x1000, 0x2000, 0x3000};
  uintptr_t c2[] = {0x1000, 0x2000, 0x3001};
  uint32_t a = msnap__stack_intern(c1, 3, NULL, 0, NULL);
  uint32_t b = msnap__stack_intern(c1, 3, NULL, 0, NULL);
  uint32_t c = msnap__stack_intern(c2, 3, NULL, 0, NULL);
  uint32_t d = msnap__stack_intern(c1, 2, NULL, 0, NULL);
  check_table();
  assert_int_not_equal(a, 0);
  assert_int_equal(a, b);
  assert_int_not_equal(a, c);
  assert_int_not_equal(a, d);
  assert_int_equal(msnap__stack_refcount(a), 2);
  assert_int_equal(msnap__stack_live(), live0 + 3);
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(c, &v), 0);
  assert_int_equal(v.nc, 3);
  assert_int_equal(v.c[2], 0x3001);
  assert_int_equal(v.npy, 0);
  assert_int_equal(msnap__stack_intern(NULL, 0, NULL, 0, NULL), 0);

  msnap__stack_unref(a);
  assert_int_equal(msnap__stack_refcount(a), 1);
  msnap__stack_unref(b);
  assert_int_equal(msnap__stack_refcount(a), 0);
  assert_int_equal(msnap__stack_view(a, &v), MSNAP_EINVAL);
  check_table();
  /* the id is reused for the next new entry */
  uintptr_t c3[] = {0x42};
  uint32_t e = msnap__stack_intern(c3, 1, NULL, 0, NULL);
  assert_int_equal(e, a);
  /* and re-interning the freed contents makes a fresh entry */
  uint32_t f = msnap__stack_intern(c1, 3, NULL, 0, NULL);
  assert_int_not_equal(f, 0);
  assert_int_equal(msnap__stack_refcount(f), 1);
  msnap__stack_unref(c);
  msnap__stack_unref(d);
  msnap__stack_unref(e);
  msnap__stack_unref(f);
  check_table();
  assert_int_equal(msnap__stack_live(), live0);
}

static void test_many_stacks(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  enum { N = 5000 };
  uint32_t *ids = calloc(N, sizeof *ids);
  for (uintptr_t i = 0; i < N; i++) {
    uintptr_t c[2] = {i, i * 7};
    ids[i] = msnap__stack_intern(c, 2, NULL, 0, NULL);
    assert_int_not_equal(ids[i], 0);
  }
  check_table();
  for (uintptr_t i = 0; i < N; i += 2) msnap__stack_unref(ids[i]);
  check_table();
  for (uintptr_t i = 1; i < N; i += 2) {
    uintptr_t c[2] = {i, i * 7};
    uint32_t id = msnap__stack_intern(c, 2, NULL, 0, NULL);
    assert_int_equal(id, ids[i]);
    msnap__stack_unref(id);
    msnap__stack_unref(ids[i]);
  }
  check_table();
  assert_int_equal(msnap__stack_live(), live0);
  free(ids);
}

static void test_strings(void **state) {
  (void)state;
  uint32_t a = msnap__str_intern("hello", 5);
  uint32_t b = msnap__str_intern("hello world", 5); /* not NUL-terminated */
  assert_int_equal(a, b);
  size_t len;
  assert_string_equal(msnap__str_get(a, &len), "hello");
  assert_int_equal(len, 5);
  assert_int_equal(msnap__str_intern("", 0), 0);
  assert_string_equal(msnap__str_get(0, &len), "");
  assert_int_equal(len, 0);
  /* a string is not a stack, even with the same bytes */
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(a, &v), MSNAP_EINVAL);
  msnap__stack_unref(a);
  msnap__stack_unref(b);
  check_table();
}

/* A fake interpreter: frames are (code, offset) pairs; retain/release
 * count per code object. */
static int fake_refs[8];
static int fake_depth = 3;
static int fake_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
  int n = fake_depth < max ? fake_depth : max;
  for (int i = 0; i < n; i++) {
    frames[i][0] = (uintptr_t)(i + 1);
    frames[i][1] = (uintptr_t)(10 * i);
  }
  return n;
}
static void fake_retain(void *ctx, const uintptr_t f[2]) {
  (void)ctx;
  fake_refs[f[0]]++;
}
static void fake_release(void *ctx, const uintptr_t f[2]) {
  (void)ctx;
  fake_refs[f[0]]--;
}
static int fake_resolve(void *ctx, const uintptr_t f[2], const char **name,
                        const char **filename, int64_t *line) {
  (void)ctx;
  static const char *names[] = {"?", "inner", "middle", "outer"};
  *name = names[f[0]];
  *filename = "model.py";
  *line = (int64_t)f[1] + 1;
  return 0;
}

static void test_frame_hook(void **state) {
  (void)state;
  msnap_frame_hook_t h = {.capture = fake_capture,
                          .retain = fake_retain,
                          .release = fake_release,
                          .resolve = fake_resolve};
  assert_int_equal(msnap_set_frame_hook(&h), 0);
  memset(fake_refs, 0, sizeof fake_refs);
  uint32_t s = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_not_equal(s, 0);
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(s, &v), 0);
  assert_int_equal(v.nc, 0);
  assert_int_equal(v.npy, 3);
  assert_int_equal(v.py[2][0], 3);
  assert_int_equal(v.py[2][1], 20);
  assert_non_null(v.hook);
  assert_int_equal(fake_refs[1], 1);
  /* the same stack again: no new retain */
  uint32_t s2 = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_equal(s2, s);
  assert_int_equal(fake_refs[1], 1);
  msnap__stack_unref(s2);
  msnap__stack_unref(s);
  /* this thread's cache still holds it */
  assert_int_equal(msnap__stack_refcount(s), 1);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_refcount(s), 0);
  /* release is deferred to the next capturing thread */
  assert_int_equal(fake_refs[1], 1);
  fake_depth = 1;
  uint32_t s3 = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_equal(fake_refs[2], 0);
  assert_int_equal(fake_refs[3], 0);
  assert_int_equal(fake_refs[1], 1); /* s3 retains frame 1 */
  msnap__stack_unref(s3);
  /* removing the hook drains pending releases */
  assert_int_equal(msnap_set_frame_hook(NULL), 0);
  assert_int_equal(fake_refs[1], 0);
  assert_null(msnap__frame_hook());
  /* python-only capture without a hook: a stack without frames (torch:
   * an empty gathered context, `frames: []`), outside the table */
  size_t live = msnap__stack_live();
  uint32_t e = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_equal(e, MSNAP_STACK_ID_EMPTY);
  assert_int_equal(msnap__stack_view(e, &v), 0);
  assert_int_equal(v.nc + v.npy, 0);
  assert_int_equal(msnap__stack_refcount(e), 1);
  msnap__stack_ref(e);
  msnap__stack_unref(e);
  msnap__stack_unref(e);
  assert_int_equal(msnap__stack_refcount(e), 1);
  assert_int_equal(msnap__stack_live(), live);
  /* no stacks asked for: none */
  assert_int_equal(msnap__stack_capture(0, 0), 0);
  fake_depth = 3;
  /* a hook without capture is refused */
  msnap_frame_hook_t bad = {0};
  assert_int_equal(msnap_set_frame_hook(&bad), MSNAP_EINVAL);
  check_table();
}

/* capture_token: the token decides a repeated stack without comparing
 * frames, only through the same hook and without C frames; a stack found
 * by comparison takes the newer token. */
static uint64_t fake_token;
static int fake_shift; /* added to each frame's offset: frames that differ */
static int fake_known_skips; /* captures that left the frames unwritten */
static int fake_capture_token(void *ctx, uintptr_t (*frames)[2], int max,
                              uint64_t *token) {
  int n = fake_capture(ctx, frames, max);
  for (int i = 0; i < n; i++) frames[i][1] += (uintptr_t)fake_shift;
  if (*token != 0 && *token == fake_token) {
    /* the library holds these frames: leave garbage where they were */
    for (int i = 0; i < n; i++) frames[i][0] = frames[i][1] = 0xdead;
    fake_known_skips++;
  }
  *token = fake_token;
  return n;
}

/* A hook that breaks its word on the offered token: it returns it with a
 * count over the maximum and writes nothing; asked again, with nothing
 * offered, it writes its 3 frames. */
static int liar_capture_token(void *ctx, uintptr_t (*frames)[2], int max,
                              uint64_t *token) {
  if (*token == fake_token) {
    *token = fake_token;
    return max + 5;
  }
  *token = fake_token;
  return fake_capture(ctx, frames, max);
}

static void test_frame_hook_token(void **state) {
  (void)state;
  msnap_frame_hook_t h = {.capture = fake_capture,
                          .retain = fake_retain,
                          .release = fake_release,
                          .resolve = fake_resolve,
                          .capture_token = fake_capture_token};
  assert_int_equal(msnap_set_frame_hook(&h), 0);
  memset(fake_refs, 0, sizeof fake_refs);
  fake_depth = 3;
  fake_shift = 0;
  fake_token = 7;
  uint32_t a = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_not_equal(a, 0);
  check_table();
  /* the same frames under a new token: found by comparison */
  fake_token = 8;
  uint32_t a2 = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_equal(a2, a);
  /* token 8 now names a's frames: the frames are not read (a hook that
   * broke its promise would get the named stack) */
  fake_shift = 1;
  uint32_t a3 = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_equal(a3, a);
  /* no token: the frames decide */
  fake_token = 0;
  uint32_t b = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_not_equal(b, a);
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(b, &v), 0);
  assert_int_equal(v.npy, 3);
  assert_int_equal(v.py[0][1], 1);
  /* with C frames the token is not used either */
  fake_token = 8;
  uint32_t c = msnap__stack_capture(MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP,
                                    0);
  assert_int_not_equal(c, a);
  assert_int_equal(msnap__stack_view(c, &v), 0);
  assert_true(v.nc > 0);
  assert_int_equal(v.npy, 3);
  assert_int_equal(v.py[0][1], 1);
  check_table();
  msnap__stack_unref(a);
  msnap__stack_unref(a2);
  msnap__stack_unref(a3);
  msnap__stack_unref(b);
  msnap__stack_unref(c);
  /* A loop's two stacks alternating (tokens 20 and 21): after the first
   * of each, the library offers the token of two captures ago, the hook
   * leaves the frames unwritten, and each capture is still its stack. */
  msnap__stack_tcache_flush();
  fake_known_skips = 0;
  uint32_t ids[8];
  for (int i = 0; i < 8; i++) {
    fake_token = 20 + (uint64_t)(i % 2);
    fake_shift = 100 * (i % 2);
    ids[i] = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
    assert_int_not_equal(ids[i], 0);
    assert_int_equal(msnap__stack_view(ids[i], &v), 0);
    assert_int_equal(v.npy, 3);
    assert_int_equal(v.py[0][0], 1);
    assert_int_equal(v.py[0][1], (uint64_t)(100 * (i % 2)));
    assert_int_equal(v.py[2][1], (uint64_t)(20 + 100 * (i % 2)));
    if (i >= 2) assert_int_equal(ids[i], ids[i - 2]);
    check_table();
  }
  assert_int_not_equal(ids[0], ids[1]);
  assert_int_equal(fake_known_skips, 6);
  /* one stack again and again: after the first (two captures ago was
   * the other stack) it is offered its own token */
  fake_known_skips = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t again = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
    assert_int_equal(again, ids[7]);
    msnap__stack_unref(again);
  }
  assert_int_equal(fake_known_skips, 3);
  /* a hook that returns the offered token with another count breaks its
   * word: the library captures again, frames written, and stays sane */
  fake_depth = 2;
  uint32_t odd = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
  assert_int_not_equal(odd, 0);
  msnap__stack_unref(odd);
  fake_depth = 3;
  for (int i = 0; i < 8; i++) msnap__stack_unref(ids[i]);
  check_table();
  msnap__stack_tcache_flush();
  /* the offered token returned with a count over the maximum, frames
   * unwritten: captured again, nothing read from the unwritten buffer */
  msnap_frame_hook_t liar = h;
  liar.capture_token = liar_capture_token;
  assert_int_equal(msnap_set_frame_hook(&liar), 0);
  fake_token = 30;
  fake_shift = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t l = msnap__stack_capture(MSNAP_STACKS_PYTHON, 0);
    assert_int_not_equal(l, 0);
    assert_int_equal(msnap__stack_view(l, &v), 0);
    assert_int_equal(v.npy, 3);
    assert_int_equal(v.py[2][0], 3);
    msnap__stack_unref(l);
    check_table();
  }
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_refcount(a), 0);
  assert_int_equal(msnap_set_frame_hook(NULL), 0);
  assert_int_equal(fake_refs[1], 0);
  fake_shift = 0;
  fake_token = 0;
  check_table();
}

static volatile uint32_t no_tail_call;
__attribute__((noinline)) static uint32_t capture_here(void) {
  uint32_t s = msnap__stack_capture(MSNAP_STACKS_CPP, 0);
  no_tail_call++; /* keeps this frame on the stack during the call */
  return s;
}

static void test_c_capture_and_symbols(void **state) {
  (void)state;
  uint32_t s = capture_here();
  assert_int_not_equal(s, 0);
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(s, &v), 0);
  assert_true(v.nc >= 3);
  /* innermost frame is capture_here (the capture function skips itself) */
  msnap_csym_t sym;
  msnap__symbolize(v.c[0], &sym);
  print_message("unwinder %s, symbolizer %s: %s %s:%lld\n",
                msnap__stack_unwinder_name(), msnap__symbolizer_name(),
                sym.name, sym.filename, (long long)sym.line);
  if (strcmp(msnap__symbolizer_name(), "libdw") == 0) {
    assert_string_equal(sym.name, "capture_here");
    assert_non_null(strstr(sym.filename, "test_stack_unit.c"));
    assert_true(sym.line > 0);
    msnap__symbolize(v.c[1], &sym);
    assert_string_equal(sym.name, "test_c_capture_and_symbols");
  }
  /* an address nobody maps: "??", never an error */
  msnap__symbolize(0x10, &sym);
  assert_string_equal(sym.name, "??");
  assert_string_equal(sym.filename, "??");
  assert_int_equal(sym.line, 0);
  /* a libc function through dladdr or libdw (its address from dlsym: a
   * function pointer taken in the executable may be a PLT stub) */
  void *fn = dlsym(RTLD_DEFAULT, "qsort");
  assert_non_null(fn);
  msnap__symbolize((uintptr_t)fn + 1, &sym);
  assert_string_not_equal(sym.name, "??");
  msnap__stack_unref(s);
}

/* The executable segment of the module holding `addr` (dl_iterate_phdr). */
typedef struct text_range_s {
  uintptr_t addr, lo, hi;
} text_range_t;

static int find_text(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  text_range_t *t = arg;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (t->addr >= lo && t->addr < hi) {
      t->lo = lo;
      t->hi = hi;
      return 1;
    }
  }
  return 0;
}

/* C frames' names come from an index of each big module's symbols
 * (stack.c, symx): it must name every address as libdw's own lookup,
 * dwfl_module_addrname, does.  libc has thousands of symbols (indexed);
 * every 197th byte of its code is compared. */
static void test_symbol_index_matches_libdw(void **state) {
  (void)state;
  if (strcmp(msnap__symbolizer_name(), "libdw") != 0) {
    print_message("SKIP: no libdw, no symbol index\n");
    skip();
  }
  text_range_t t = {(uintptr_t)dlsym(RTLD_DEFAULT, "qsort"), 0, 0};
  assert_true(t.addr != 0);
  assert_int_equal(dl_iterate_phdr(find_text, &t), 1);
  char msg[512] = "";
  long n = msnap__symbolize_check(t.lo, t.hi, 197, msg, sizeof msg);
  print_message("libc code %#lx-%#lx: %ld addresses compared%s%s\n",
                (unsigned long)t.lo, (unsigned long)t.hi, n, n < 0 ? ": " : "",
                msg);
  assert_true(n > 1000);
  /* and the names the index gives are the ones symbolize reports
   * ("qsort"; under AddressSanitizer dlsym finds its interceptor,
   * "__interceptor_qsort", and the code compared above is the sanitizer
   * runtime's) */
  msnap_csym_t sym;
  msnap__symbolize(t.addr + 1, &sym);
  assert_non_null(strstr(sym.name, "qsort"));
}

/* ---- the CFI unwinder against libunwind and backtrace() ------------------ */

#define UW_MAX 128
typedef struct uw_run_s {
  uintptr_t cfi[UW_MAX], cfi_cold[UW_MAX], bt[UW_MAX];
  void *lu[UW_MAX];
  int ncfi, ncold, nbt, nlu;
  uintptr_t here; /* return address into the function that captured */
} uw_run_t;

static int (*lu_backtrace)(void **, int);
static uw_run_t uw;

/* Captures with every unwinder from one frame; the walks are compared
 * from `here` (the first frame they share) outward. */
__attribute__((noinline)) static void uw_capture(void) {
  uw.here = (uintptr_t)__builtin_return_address(0);
  uw.ncfi = msnap__unwind_cfi(uw.cfi, UW_MAX);
  msnap__unwind_forget();
  uw.ncold = msnap__unwind_cfi(uw.cfi_cold, UW_MAX);
  uw.nbt = backtrace((void **)uw.bt, UW_MAX);
  uw.nlu = lu_backtrace ? lu_backtrace(uw.lu, UW_MAX) : 0;
  no_tail_call++;
}

static int uw_from_here(const uintptr_t *v, int n) {
  for (int i = 0; i < n && i < 8; i++)
    if (v[i] == uw.here) return i;
  return -1;
}

/* The walks agree from `here` on, over the frames both reached. */
static void uw_expect_same(const char *what, const uintptr_t *a, int na,
                           const uintptr_t *b, int nb, bool same_length) {
  int ia = uw_from_here(a, na), ib = uw_from_here(b, nb);
  if (ia < 0 || ib < 0) fail_msg("%s: caller not found", what);
  int la = na - ia, lb = nb - ib;
  if (same_length && la != lb)
    fail_msg("%s: %d frames against %d", what, la, lb);
  int l = la < lb ? la : lb;
  assert_true(l >= 3);
  for (int i = 0; i < l; i++)
    if (a[ia + i] != b[ib + i])
      fail_msg("%s: frame %d differs (%#lx, %#lx)", what, i,
               (unsigned long)a[ia + i], (unsigned long)b[ib + i]);
}

static void uw_check(const char *what) {
  assert_true(uw.ncfi > 0);
  assert_true(uw.ncold > 0);
  /* the replay of the last walk gives what a walk by rules gives */
  uw_expect_same(what, uw.cfi, uw.ncfi, uw.cfi_cold, uw.ncold, true);
  uw_expect_same(what, uw.cfi, uw.ncfi, uw.bt, uw.nbt, uw.nbt < UW_MAX &&
                                                          uw.ncfi < UW_MAX);
  if (lu_backtrace)
    uw_expect_same(what, uw.cfi, uw.ncfi, (const uintptr_t *)uw.lu, uw.nlu,
                   uw.nlu < UW_MAX && uw.ncfi < UW_MAX);
}

static volatile int uw_sink;

/* Frames of different shapes: with a frame pointer (this file's
 * default), without one, and with a variable-size frame (alloca: the CFA
 * follows the frame pointer). */
__attribute__((noinline)) static void uw_fp(int d, int kind);
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, optimize("omit-frame-pointer")))
#else
__attribute__((noinline))
#endif
static void uw_nofp(int d, int kind) {
  volatile char pad[40];
  pad[d % 40] = (char)d;
  if (d <= 0) uw_capture();
  else uw_fp(d - 1, kind);
  uw_sink += pad[0];
}
__attribute__((noinline)) static void uw_alloca(int d, int kind) {
  volatile char *p = alloca(64 + (size_t)(d % 7) * 48);
  p[0] = (char)d;
  if (d <= 0) uw_capture();
  else uw_fp(d - 1, kind);
  uw_sink += p[0];
}
__attribute__((noinline)) static void uw_fp(int d, int kind) {
  if (d <= 0) {
    uw_capture();
  } else if ((d + kind) % 3 == 0) {
    uw_nofp(d - 1, kind);
  } else if ((d + kind) % 3 == 1) {
    uw_alloca(d - 1, kind);
  } else {
    uw_fp(d - 1, kind);
  }
  uw_sink++;
}

/* Two call sites at the same depth, so that consecutive captures share
 * their outer frames and stack addresses but not their inner frames. */
__attribute__((noinline)) static void uw_site_a(int d) { uw_fp(d, 0); uw_sink++; }
__attribute__((noinline)) static void uw_site_b(int d) { uw_fp(d, 1); uw_sink++; }

static void test_cfi_unwinder(void **state) {
  (void)state;
  void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (h != NULL)
    *(void **)&lu_backtrace = dlsym(h, "unw_backtrace");
  else
    print_message("libunwind.so.8 missing: compared with backtrace() only\n");
  uintptr_t probe[4];
  if (msnap__unwind_cfi(probe, 4) < 0) {
    print_message("CFI unwinder not supported here: SKIP\n");
    skip();
  }
  static const int depths[] = {0, 1, 2, 5, 17, 40, 200};
  /* Rules from objects found by _dl_find_object (where libc has it),
   * then, the cache emptied, through dl_iterate_phdr (older libcs). */
  for (int finder = 1; finder >= 0; finder--) {
    bool has = msnap__unwind_test_finder(finder == 1);
    if (finder == 1 && !has)
      print_message("libc has no _dl_find_object: dl_iterate_phdr only\n");
    for (int r = 0; r < 3; r++) {
      for (size_t i = 0; i < sizeof depths / sizeof depths[0]; i++) {
        char what[80];
        snprintf(what, sizeof what, "site a, depth %d, %s", depths[i],
                 finder ? "_dl_find_object" : "dl_iterate_phdr");
        uw_site_a(depths[i]);
        uw_check(what);
        snprintf(what, sizeof what, "site b, depth %d, %s", depths[i],
                 finder ? "_dl_find_object" : "dl_iterate_phdr");
        uw_site_b(depths[i]);
        uw_check(what);
      }
    }
  }
  char msg[256];
  if (msnap__unwind_check(msg, sizeof msg) != 0) fail_msg("%s", msg);
  assert_true(msnap__unwind_cached() > 0);
  (void)msnap__unwind_test_finder(true);
  /* the recorder's capture: the caller is the innermost frame */
  assert_int_equal(msnap__stack_set_unwinder("cfi"), 0);
  assert_string_equal(msnap__stack_unwinder_name(), "cfi");
  uint32_t s1 = capture_here();
  msnap_stack_view_t v;
  assert_int_equal(msnap__stack_view(s1, &v), 0);
  Dl_info di;
  if (dladdr((void *)(v.c[0] - 1), &di) && di.dli_sname)
    assert_string_equal(di.dli_sname, "capture_here");
  msnap__stack_unref(s1);
  if (h != NULL) dlclose(h);
}

/* A thread that takes the rule cache's lock (msnap__unwind_check), the
 * stack table's (msnap__stack_check) and the unwinder choice's
 * (msnap__stack_set_unwinder), in turn. */
static atomic_int fork_steps;
static void *fork_locker(void *arg) {
  (void)arg;
  char msg[128];
  if (msnap__unwind_check(msg, sizeof msg) != 0) return (void *)1;
  atomic_store(&fork_steps, 1);
  if (msnap__stack_check(msg, sizeof msg) != 0) return (void *)1;
  atomic_store(&fork_steps, 2);
  (void)msnap__stack_set_unwinder(msnap__stack_unwinder_name());
  atomic_store(&fork_steps, 3);
  return NULL;
}

/* Run fn on a thread while fork's prepare handler holds its locks:
 * *progress must stay at `during` until the parent handler releases
 * them, then reach `after`; fn returns NULL on success. */
static void while_prepared(void *(*fn)(void *), atomic_int *progress,
                           int during, int after) {
  msnap__stack_atfork(MSNAP_FORK_PREPARE);
  atomic_store(progress, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, NULL), 0);
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  assert_int_equal(atomic_load(progress), during);
  msnap__stack_atfork(MSNAP_FORK_PARENT);
  void *rc = (void *)1;
  assert_int_equal(pthread_join(t, &rc), 0);
  assert_null(rc);
  assert_int_equal(atomic_load(progress), after);
}

static void test_fork_handler_holds_rule_lock(void **state) {
  (void)state;
  (void)msnap__stack_unwinder_name(); /* chosen before the handler runs */
  uintptr_t probe[4];
  (void)msnap__unwind_cfi(probe, 4);
  /* prepare holds every lock: the thread waits at the first one */
  while_prepared(fork_locker, &fork_steps, 0, 3);
}

/* Fork's prepare handler holds the loader guard for writing: a walk that
 * may enter dl_iterate_phdr (a fallback unwinder, a rule computed without
 * _dl_find_object) waits until the fork is done, so that no child inherits
 * glibc's loader lock from it. */
static atomic_int guard_passed;
static void *guard_walker(void *arg) {
  (void)arg;
  msnap__unwind_loader_enter();
  atomic_store(&guard_passed, 1);
  msnap__unwind_loader_leave();
  return NULL;
}

static void test_fork_handler_holds_loader_guard(void **state) {
  (void)state;
  while_prepared(guard_walker, &guard_passed, 0, 1);
  /* readers share it */
  msnap__unwind_loader_enter();
  msnap__unwind_loader_enter();
  msnap__unwind_loader_leave();
  msnap__unwind_loader_leave();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_intern_dedup_and_free),
      cmocka_unit_test(test_many_stacks),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_frame_hook),
      cmocka_unit_test(test_frame_hook_token),
      cmocka_unit_test(test_c_capture_and_symbols),
      cmocka_unit_test(test_symbol_index_matches_libdw),
      cmocka_unit_test(test_cfi_unwinder),
      cmocka_unit_test(test_fork_handler_holds_rule_lock),
      cmocka_unit_test(test_fork_handler_holds_loader_guard),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
