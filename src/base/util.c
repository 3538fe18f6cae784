/*
 * util.c -- small helpers every layer uses: array growth and PyTorch's
 * format_size.  No state.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

/*
 * Make room for `extra` more elements of `size` bytes in *p (cap in *cap,
 * used n).  Returns 0 or MSNAP_ENOMEM (then *p is unchanged).
 */
int msnap__grow(void **p, uint32_t *cap, uint32_t n, uint32_t extra,
                size_t size) {
  if ((uint64_t)n + extra <= *cap) return 0;
  uint64_t need = (uint64_t)n + extra;
  if (need > UINT32_MAX - 1) return MSNAP_ENOMEM;
  uint64_t nc = *cap ? *cap : 16;
  while (nc < need) nc += nc / 2 + 16;
  if (nc > UINT32_MAX - 1) nc = UINT32_MAX - 1;
  if (nc > SIZE_MAX / size) return MSNAP_ENOMEM;
  void *np = realloc(*p, (size_t)nc * size);
  if (!np) return MSNAP_ENOMEM;
  *p = np;
  *cap = (uint32_t)nc;
  return 0;
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
