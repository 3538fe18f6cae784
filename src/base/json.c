/*
 * json.c -- the streaming JSON writer (json.h).
 *
 * Invariants: depth is the number of open containers, in
 * [0, MSNAP_JSON_MAX_DEPTH); bit d of nonempty is set once container d
 * received a value (so the next one needs a comma); after_key is true between a key
 * and the value written for it.  Every byte goes to the sink, whose error
 * is sticky.
 *
 * Strings: '"' and '\' are escaped, control characters (< 0x20, and 0x7f)
 * are written as \n \r \t or \u00XX, and with MSNAP_JSON_HTML also < > &
 * (so that the text can sit inside an HTML <script> element).  Everything
 * else is UTF-8, passed through when valid and repaired when not, by the
 * one policy of utf8.c (as the snapshot model reads it).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static void put(msnap_json_t *j, const char *p, size_t n) {
  msnap__sink_write(j->out, p, n);
}

static void puts_(msnap_json_t *j, const char *p) { put(j, p, strlen(p)); }

void msnap__json_init(msnap_json_t *j, msnap_sink_t *out, unsigned flags) {
  memset(j, 0, sizeof *j);
  j->out = out;
  j->flags = flags;
}

int msnap__json_err(const msnap_json_t *j) { return j->out->err; }

static bool nonempty(const msnap_json_t *j) {
  return (j->nonempty[j->depth / 64] >> (j->depth % 64)) & 1;
}

static void set_nonempty(msnap_json_t *j, bool v) {
  uint64_t bit = 1ull << (j->depth % 64);
  if (v)
    j->nonempty[j->depth / 64] |= bit;
  else
    j->nonempty[j->depth / 64] &= ~bit;
}

static void indent(msnap_json_t *j) {
  if (!(j->flags & MSNAP_JSON_PRETTY)) return;
  put(j, "\n", 1);
  for (int i = 0; i < j->depth; i++) put(j, "  ", 2);
}

/* Before a value: a comma (and a new line when pretty) inside
 * containers, nothing right after a key. */
static void pre(msnap_json_t *j) {
  if (j->after_key) {
    j->after_key = false;
    return;
  }
  if (j->depth > 0) {
    if (nonempty(j)) put(j, ",", 1);
    indent(j);
  }
  set_nonempty(j, true);
}

static void string(msnap_json_t *j, const char *s, size_t len) {
  static const char hx[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)s;
  bool html = j->flags & MSNAP_JSON_HTML;
  put(j, "\"", 1);
  size_t run = 0, i = 0;
  while (i < len) {
    unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\' &&
        !(html && (c == '<' || c == '>' || c == '&'))) {
      i++;
      continue;
    }
    size_t bad = 0, seq = c >= 0x80 ? msnap__utf8_seq(p + i, len - i, &bad) : 0;
    if (seq > 0) {
      i += seq;
      continue;
    }
    put(j, s + run, i - run);
    if (c >= 0x80) {
      put(j, "\xef\xbf\xbd", 3); /* U+FFFD */
      i += bad;
    } else {
      char e[6] = {'\\', 'u', '0', '0', hx[c >> 4], hx[c & 15]};
      switch (c) {
      case '"': put(j, "\\\"", 2); break;
      case '\\': put(j, "\\\\", 2); break;
      case '\n': put(j, "\\n", 2); break;
      case '\r': put(j, "\\r", 2); break;
      case '\t': put(j, "\\t", 2); break;
      default: put(j, e, 6); break;
      }
      i++;
    }
    run = i;
  }
  put(j, s + run, len - run);
  put(j, "\"", 1);
}

static void open_(msnap_json_t *j, char c) {
  pre(j);
  if (j->depth + 1 >= MSNAP_JSON_MAX_DEPTH) {
    if (!j->out->err) j->out->err = MSNAP_ELIMIT;
    return;
  }
  put(j, &c, 1);
  j->depth++;
  set_nonempty(j, false);
}

static void close_(msnap_json_t *j, char c) {
  if (j->out->err) return;
  bool had = nonempty(j);
  if (j->depth > 0) j->depth--;
  if (had) indent(j);
  put(j, &c, 1);
}

void msnap__json_obj(msnap_json_t *j) { open_(j, '{'); }
void msnap__json_obj_end(msnap_json_t *j) { close_(j, '}'); }
void msnap__json_arr(msnap_json_t *j) { open_(j, '['); }
void msnap__json_arr_end(msnap_json_t *j) { close_(j, ']'); }

void msnap__json_key(msnap_json_t *j, const char *k, size_t len) {
  pre(j);
  string(j, k, len);
  if (j->flags & MSNAP_JSON_PRETTY)
    put(j, ": ", 2);
  else
    put(j, ":", 1);
  j->after_key = true;
}

void msnap__json_ckey(msnap_json_t *j, const char *k) {
  msnap__json_key(j, k, strlen(k));
}

void msnap__json_str(msnap_json_t *j, const char *s, size_t len) {
  pre(j);
  string(j, s, len);
}

void msnap__json_cstr(msnap_json_t *j, const char *s) {
  if (s == NULL)
    msnap__json_null(j);
  else
    msnap__json_str(j, s, strlen(s));
}

/* v in decimal, ending at end (no NUL); returns its first character.
 * (snprintf's cost dominated the viewer's pages: numbers are most of
 * them.) */
static char *u64_text(uint64_t v, char *end) {
  do {
    *--end = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  return end;
}

void msnap__json_i64(msnap_json_t *j, int64_t v) {
  char b[24], *e = b + sizeof b;
  /* the magnitude as unsigned: INT64_MIN has no positive int64_t */
  char *p = u64_text(v < 0 ? 0u - (uint64_t)v : (uint64_t)v, e);
  if (v < 0)
    *--p = '-';
  pre(j);
  put(j, p, (size_t)(e - p));
}

void msnap__json_u64(msnap_json_t *j, uint64_t v) {
  char b[24], *e = b + sizeof b;
  char *p = u64_text(v, e);
  pre(j);
  put(j, p, (size_t)(e - p));
}

/* The first p (1..17) significant digits of a positive v into d, *x the
 * decimal exponent of the first: rounded from d17 (v's 17 digits, %.16e,
 * exponent x17) half up -- which is how printf rounds v itself, except
 * when those digits end in 5 and zeros after digit p (they may have been
 * rounded up to that tie): then printf rounds v to p digits. */
static void dbl_round(double v, int p, const char *d17, int x17, char *d,
                      int *x) {
  memcpy(d, d17, (size_t)p);
  *x = x17;
  if (p == 17) return;
  bool tail = false;
  for (int i = p + 1; i < 17; i++) tail |= d17[i] != '0';
  if (d17[p] == '5' && !tail) {
    char b[40];
    snprintf(b, sizeof b, "%.*e", p - 1, v);
    d[0] = b[0];
    memcpy(d + 1, b + 2, (size_t)(p - 1));
    *x = atoi(b + p + (p > 1) + 1);
    return;
  }
  if (d17[p] < '5') return;
  int i = p - 1;
  for (; i >= 0 && d[i] == '9'; i--) d[i] = '0';
  if (i >= 0) {
    d[i]++;
  } else { /* 99..9 rounds up to 10..0 */
    d[0] = '1';
    ++*x;
  }
}

/* Whether the digits d[0..p) with exponent x read back as v. */
static bool dbl_reads_back(double v, const char *d, int p, int x) {
  char b[40];
  int n = 0;
  b[n++] = d[0];
  b[n++] = '.';
  memcpy(b + n, d + 1, (size_t)(p - 1));
  n += p - 1;
  b[n++] = 'e';
  if (x < 0) {
    b[n++] = '-';
    x = -x;
  }
  if (x >= 100) b[n++] = (char)('0' + x / 100);
  if (x >= 10) b[n++] = (char)('0' + x / 10 % 10);
  b[n++] = (char)('0' + x % 10);
  b[n] = '\0';
  return strtod(b, NULL) == v;
}

void msnap__json_dbl(msnap_json_t *j, double v) {
  pre(j);
  if (!isfinite(v)) {
    puts_(j, "null");
    return;
  }
  /* The fewest significant digits (%.Ng, N = 1..17) that read back as v
   * (17 always do): 0.969 rather than 0.96899999999999997, the digits of
   * Python's repr.  As repr, numbers from 1e-4 to 1e16 are written without
   * an exponent (100, not 1e+02; integers keep their integer digits).
   * Found with one %.16e and one or two strtod, not one snprintf and
   * strtod per N (16 M floats: 68 s): for a normal double, two decimals
   * of 15 digits are further apart than the doubles that read back as v,
   * so when any N <= 15 reads back, the 15 digits of v do, and they are
   * those N digits followed by zeros; else 16 digits are tried, then 17. */
  char b[48];
  int n = 0;
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  if (j->dbl_len && bits == j->dbl_bits) {
    /* the last double again (a list of one value repeated: the text of
     * the last one is kept) */
    n = j->dbl_len;
    memcpy(b, j->dbl_text, (size_t)n + 1);
  } else if (v == 0 || !isnormal(v)) {
    /* zero and subnormals (far less than one ulp apart): each N */
    int prec = 1;
    for (; prec <= 17; prec++) {
      n = snprintf(b, sizeof b, "%.*g", prec, v);
      if (prec == 17 || strtod(b, NULL) == v) break;
    }
  } else {
    double a = fabs(v);
    char e17[40], d17[17], d[17];
    snprintf(e17, sizeof e17, "%.16e", a); /* d.dddddddddddddddde[+-]xx */
    d17[0] = e17[0];
    memcpy(d17 + 1, e17 + 2, 16);
    int x17 = (e17[20] - '0') * 10 + (e17[21] - '0'), x, prec = 15;
    if (e17[22]) x17 = x17 * 10 + (e17[22] - '0');
    if (e17[19] == '-') x17 = -x17;
    x = x17;
    dbl_round(a, 15, d17, x17, d, &x);
    if (!dbl_reads_back(a, d, 15, x)) {
      prec = 16;
      dbl_round(a, 16, d17, x17, d, &x);
      if (!dbl_reads_back(a, d, 16, x)) {
        prec = 17;
        memcpy(d, d17, 17);
        x = x17;
      }
    }
    int k = prec; /* the digits without trailing zeros (%g drops them) */
    while (k > 1 && d[k - 1] == '0') k--;
    if (v < 0) b[n++] = '-';
    if (x >= -4 && x < (prec == 17 ? 17 : 16)) {
      /* %.Ng without an exponent, and from 1e(N-1) to 1e16 the integer
       * digits that %.(x+1)g writes (v is that integer then) */
      if (x < 0) {
        b[n++] = '0';
        b[n++] = '.';
        for (int i = -1; i > x; i--) b[n++] = '0';
        memcpy(b + n, d, (size_t)k);
        n += k;
      } else if (k <= x + 1) {
        memcpy(b + n, d, (size_t)k);
        n += k;
        for (int i = k; i <= x; i++) b[n++] = '0';
      } else {
        memcpy(b + n, d, (size_t)x + 1);
        n += x + 1;
        b[n++] = '.';
        memcpy(b + n, d + x + 1, (size_t)(k - x - 1));
        n += k - x - 1;
      }
    } else {
      b[n++] = d[0];
      if (k > 1) {
        b[n++] = '.';
        memcpy(b + n, d + 1, (size_t)k - 1);
        n += k - 1;
      }
      n += snprintf(b + n, sizeof b - (size_t)n, "e%c%02d", x < 0 ? '-' : '+',
                    x < 0 ? -x : x);
    }
    b[n] = '\0';
  }
  if (n < (int)sizeof j->dbl_text) {
    memcpy(j->dbl_text, b, (size_t)n + 1);
    j->dbl_len = (uint8_t)n;
    j->dbl_bits = bits;
  }
  if ((j->flags & MSNAP_JSON_FLOAT_POINT) && !strpbrk(b, ".eE")) {
    b[n++] = '.';
    b[n++] = '0';
  }
  put(j, b, (size_t)n);
}

void msnap__json_bool(msnap_json_t *j, bool v) {
  pre(j);
  puts_(j, v ? "true" : "false");
}

void msnap__json_null(msnap_json_t *j) {
  pre(j);
  puts_(j, "null");
}
