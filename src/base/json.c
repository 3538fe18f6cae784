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

void msnap__json_dbl(msnap_json_t *j, double v) {
  pre(j);
  if (!isfinite(v)) {
    puts_(j, "null");
    return;
  }
  /* The fewest significant digits (%.Ng, N = 1..17) that read back as v
   * (17 always do): 0.969 rather than 0.96899999999999997, the digits of
   * Python's repr.  Doubles are rare in the output (ratios, settings). */
  char b[40];
  int n = 0;
  int prec = 1;
  for (; prec <= 17; prec++) {
    n = snprintf(b, sizeof b, "%.*g", prec, v);
    if (prec == 17 || strtod(b, NULL) == v) break;
  }
  /* %g writes 100 as 1e+02 when one digit suffices; as repr, numbers
   * from 1 to 1e16 keep their integer digits (more correctly rounded
   * digits still read back as v). */
  const char *e = strchr(b, 'e');
  long x = e ? strtol(e + 1, NULL, 10) : -1;
  if (x >= prec && x < 16)
    n = snprintf(b, sizeof b, "%.*g", (int)x + 1, v);
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
