/*
 * util.c -- small helpers every layer uses: array growth (the one place
 * where a capacity is computed and an array reallocated), a growable text
 * buffer, PyTorch's format_size.  No state.
 *
 * Invariants of a msnap_strbuf_t: len < cap whenever p != NULL, and
 * p[len] == '\0'; err is sticky.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
