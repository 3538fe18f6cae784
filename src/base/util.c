/*
 * util.c -- small helpers every layer uses: array growth (the one place
 * where a capacity is computed and an array reallocated), a growable text
 * buffer, PyTorch's format_size, unguessable numbers.  No state but the
 * counter msnap__random_u64 mixes in when getrandom is missing.
 *
 * Invariants of a msnap_strbuf_t: len < cap whenever p != NULL, and
 * p[len] == '\0'; err is sticky.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "base/base.h"

int msnap__grow_to(void **p, void *capp, size_t cap_size, uint64_t need,
                   size_t size) {
  uint64_t cap = cap_size == 4 ? *(uint32_t *)capp : *(uint64_t *)capp;
  if (need <= cap) return 0;
  uint64_t max = cap_size == 4 ? UINT32_MAX - 1 : UINT64_MAX / 2;
  if (need > max || size == 0) return MSNAP_ENOMEM;
  uint64_t nc = cap ? cap : 16;
  while (nc < need) nc += nc / 2 + 16;
  if (nc > max) nc = max;
  if (nc > SIZE_MAX / size) return MSNAP_ENOMEM;
  void *np = realloc(*p, (size_t)nc * size);
  if (np == NULL) return MSNAP_ENOMEM;
  *p = np;
  if (cap_size == 4)
    *(uint32_t *)capp = (uint32_t)nc;
  else
    *(uint64_t *)capp = nc;
  return 0;
}

/* Below this size malloc serves scratch memory (its heap pages are
 * usually resident already). */
#define PREFAULT_MIN ((size_t)1 << 20)
/* From this size on, scratch memory asks for transparent huge pages
 * (MADV_HUGEPAGE, honoured where THP is "madvise" or "always"): one fault
 * and no page-table work per 2 MiB.  Populating 80 MiB took 20 ms with
 * 4 KiB pages and 9 ms with huge pages on the development VM, against
 * 33 ms of page faults when written without prefaulting. */
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_SIZE ((size_t)2 << 20)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PREFAULT_MALLOC 1 /* keep the sanitizers' view of the heap */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define PREFAULT_MALLOC 1
#endif
#endif
#if !defined(MAP_POPULATE) || !defined(MAP_ANONYMOUS)
#define PREFAULT_MALLOC 1
#endif

#ifndef PREFAULT_MALLOC
/* Bytes mapped for a request of `bytes` (huge-page sizes round up). */
static size_t prefault_span(size_t bytes) {
  if (bytes < HUGE_MIN) return bytes;
  return (bytes + HUGE_SIZE - 1) & ~(HUGE_SIZE - 1);
}
#endif

void *msnap__prefaulted_alloc(size_t bytes) {
  if (bytes == 0) return NULL;
#ifndef PREFAULT_MALLOC
  if (bytes >= HUGE_MIN && bytes <= SIZE_MAX - 2 * HUGE_SIZE) {
    /* a 2 MiB-aligned span: map with slack, trim both ends */
    size_t span = prefault_span(bytes);
    char *q = mmap(NULL, span + HUGE_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)q + HUGE_SIZE - 1) & ~(HUGE_SIZE - 1));
    if (a > q) munmap(q, (size_t)(a - q));
    if (a + span < q + span + HUGE_SIZE)
      munmap(a + span, (size_t)(q + span + HUGE_SIZE - (a + span)));
    msnap__prefault(a, span);
    return a;
  }
  if (bytes >= PREFAULT_MIN) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
#endif
  return malloc(bytes);
}

void msnap__prefaulted_free(void *p, size_t bytes) {
  if (p == NULL) return;
#ifndef PREFAULT_MALLOC
  if (bytes >= PREFAULT_MIN) {
    munmap(p, prefault_span(bytes));
    return;
  }
#endif
  (void)bytes;
  free(p);
}

void msnap__prefault(void *p, size_t bytes) {
#if !defined(PREFAULT_MALLOC) && defined(MADV_POPULATE_WRITE)
  uintptr_t pg = 4096;
  uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1);
  uintptr_t b = ((uintptr_t)p + bytes) & ~(pg - 1);
  if (bytes < PREFAULT_MIN || b <= a) return;
#ifdef MADV_HUGEPAGE
  if (bytes >= HUGE_MIN) {
    /* the whole 2 MiB units inside the range */
    uintptr_t ha = (a + HUGE_SIZE - 1) & ~(uintptr_t)(HUGE_SIZE - 1);
    uintptr_t hb = b & ~(uintptr_t)(HUGE_SIZE - 1);
    if (hb > ha) (void)madvise((void *)ha, hb - ha, MADV_HUGEPAGE);
  }
#endif
  (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

int msnap__grow(void **p, uint32_t *cap, uint32_t n, uint32_t extra,
                size_t size) {
  return msnap__grow_to(p, cap, sizeof *cap, (uint64_t)n + extra, size);
}

void msnap__strbuf_append(msnap_strbuf_t *b, const char *s, size_t n) {
  if (b->err) return;
  if (MSNAP_GROW(b->p, b->cap, (uint64_t)b->len + n + 1) != 0) {
    b->err = MSNAP_ENOMEM;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void msnap__strbuf_printf(msnap_strbuf_t *b, const char *fmt, ...) {
  if (b->err) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->p ? b->cap - b->len : 0;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->err = MSNAP_EINVAL;
      return;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    if (MSNAP_GROW(b->p, b->cap, (uint64_t)b->len + (size_t)n + 1) != 0) {
      b->err = MSNAP_ENOMEM;
      return;
    }
  }
}

/* format_size (allocator-algorithm §8.3): bytes up to 1 KiB, then KiB,
 * MiB, GiB with two decimals. */
void msnap__format_size(uint64_t size, char *buf, size_t len) {
  if (size <= 1024)
    snprintf(buf, len, "%" PRIu64 " bytes", size);
  else if (size <= 1048576)
    snprintf(buf, len, "%.2f KiB", (double)size / 1024.0);
  else if (size <= 1073741824)
    snprintf(buf, len, "%.2f MiB", (double)size / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", (double)size / 1073741824.0);
}

uint64_t msnap__random_u64(void) {
  static atomic_uint counter;
  uint64_t k;
  if (getrandom(&k, sizeof k, GRND_NONBLOCK) == (ssize_t)sizeof k) return k;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
               (uint64_t)(uintptr_t)&ts ^
               (uint64_t)atomic_fetch_add(&counter, 1u) << 40;
  return msnap__mix64(x);
}
