/*
 * utf8.c -- the one UTF-8 policy of memsnap (base.h): what is valid
 * (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF)
 * and how the rest is repaired: each maximal ill-formed subpart (an
 * invalid byte, a lead byte whose sequence breaks off) becomes one
 * U+FFFD, as CPython's bytes.decode("utf-8", "replace"), except that an
 * encoded surrogate (ED A0..BF 80..BF: a lone surrogate of a Python str,
 * as pickle writes it with "surrogatepass") is one code point and becomes
 * one U+FFFD, not three.  The snapshot model (model/snapshot.c), the JSON
 * writer (json.c) and the CLI's text and SVG output all use it, so a
 * string reads the same in every output.
 */
#include <string.h>

#include "base/base.h"

size_t msnap__utf8_seq(const unsigned char *p, size_t n, size_t *bad) {
  unsigned char c = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf; /* range of the second byte */
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    need = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    need = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f; /* U+D800..DFFF are not scalar values */
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    *bad = 1;
    return 0;
  }
  if (c == 0xed && n >= 3 && p[1] >= 0xa0 && (p[1] & 0xc0) == 0x80 &&
      (p[2] & 0xc0) == 0x80) {
    *bad = 3; /* an encoded surrogate: one code point */
    return 0;
  }
  size_t k = 1;
  for (; k < need && k < n; k++) {
    unsigned char b = p[k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
    if (b < l || b > h) break;
  }
  if (k == need) return need;
  *bad = k;
  return 0;
}

size_t msnap__utf8_valid_prefix(const unsigned char *p, size_t len) {
  size_t i = 0, bad;
  for (;;) {
    /* ASCII eight bytes at a time */
    while (i + 8 <= len) {
      uint64_t w;
      memcpy(&w, p + i, 8);
      if (w & UINT64_C(0x8080808080808080)) break;
      i += 8;
    }
    while (i < len && p[i] < 0x80) i++;
    if (i >= len) return len;
    size_t k = msnap__utf8_seq(p + i, len - i, &bad);
    if (k == 0) return i;
    i += k;
  }
}

size_t msnap__utf8_repair(const unsigned char *p, size_t len, char *out) {
  size_t k = 0, i = 0;
  while (i < len) {
    size_t v = msnap__utf8_valid_prefix(p + i, len - i);
    memcpy(out + k, p + i, v);
    k += v;
    i += v;
    if (i >= len) break;
    size_t bad = 1;
    (void)msnap__utf8_seq(p + i, len - i, &bad);
    memcpy(out + k, "\xef\xbf\xbd", 3); /* U+FFFD */
    k += 3;
    i += bad;
  }
  return k;
}

size_t msnap__utf8_cut(const unsigned char *p, size_t len, size_t max) {
  if (len <= max) return len;
  size_t k = max;
  /* back over continuation bytes to the start of the sequence that
   * crosses max (at most 3) */
  while (k > 0 && max - k < 3 && (p[k] & 0xc0) == 0x80) k--;
  return (p[k] & 0xc0) == 0x80 ? max : k;
}
