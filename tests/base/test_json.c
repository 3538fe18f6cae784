/*
 * test_json.c -- the JSON writer (src/base/json.c): structure and commas,
 * pretty and HTML modes, numbers (doubles in their shortest exact form),
 * the depth limit, and strings checked as
 * UTF-8.  The UTF-8 rule is checked against CPython: random byte strings
 * are written, and json.loads of the output must equal
 * bytes.decode("utf-8", "replace") of the input, an encoded surrogate
 * (ED A0..BF 80..BF) giving one U+FFFD (skipped, saying so, when python3
 * is missing).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/json.h"

/* A writer into memory; text() finishes and returns the NUL-terminated
 * output (freed by the caller). */
typedef struct out_s {
  msnap_membuf_t mb;
  msnap_sink_t sink;
  msnap_json_t j;
} out_t;

static void open_out(out_t *o, unsigned flags) {
  memset(o, 0, sizeof *o);
  assert_int_equal(msnap__sink_init_mem(&o->sink, &o->mb), 0);
  msnap__json_init(&o->j, &o->sink, flags);
}

static char *text(out_t *o, int *err) {
  *err = msnap__json_err(&o->j);
  msnap__sink_write(&o->sink, "", 1);
  msnap__sink_finish(&o->sink);
  return o->mb.data;
}

static void expect(out_t *o, const char *want) {
  int err;
  char *got = text(o, &err);
  assert_int_equal(err, 0);
  assert_string_equal(got, want);
  free(got);
}

static void test_structure(void **state) {
  (void)state;
  out_t o;
  open_out(&o, 0);
  msnap__json_obj(&o.j);
  msnap__json_ckey(&o.j, "a");
  msnap__json_arr(&o.j);
  msnap__json_i64(&o.j, -3);
  msnap__json_u64(&o.j, UINT64_MAX);
  msnap__json_bool(&o.j, true);
  msnap__json_null(&o.j);
  msnap__json_cstr(&o.j, NULL);
  msnap__json_arr_end(&o.j);
  msnap__json_ckey(&o.j, "b");
  msnap__json_obj(&o.j);
  msnap__json_obj_end(&o.j);
  msnap__json_ckey(&o.j, "c");
  msnap__json_dbl(&o.j, 1.0 / 0.0);
  msnap__json_obj_end(&o.j);
  expect(&o, "{\"a\":[-3,18446744073709551615,true,null,null],\"b\":{},"
             "\"c\":null}");

  open_out(&o, MSNAP_JSON_PRETTY);
  msnap__json_obj(&o.j);
  msnap__json_ckey(&o.j, "k");
  msnap__json_arr(&o.j);
  msnap__json_i64(&o.j, 1);
  msnap__json_i64(&o.j, 2);
  msnap__json_arr_end(&o.j);
  msnap__json_ckey(&o.j, "e");
  msnap__json_arr(&o.j);
  msnap__json_arr_end(&o.j);
  msnap__json_obj_end(&o.j);
  expect(&o, "{\n  \"k\": [\n    1,\n    2\n  ],\n  \"e\": []\n}");
}

static void test_numbers_and_escapes(void **state) {
  (void)state;
  out_t o;
  open_out(&o, MSNAP_JSON_FLOAT_POINT);
  msnap__json_arr(&o.j);
  msnap__json_dbl(&o.j, 2.0);
  msnap__json_dbl(&o.j, 0.5);
  msnap__json_dbl(&o.j, 1e300);
  msnap__json_str(&o.j, "q\"b\\n\n\t\r\x01\x7f<&>", 13);
  msnap__json_arr_end(&o.j);
  expect(&o, "[2.0,0.5,1e+300,"
             "\"q\\\"b\\\\n\\n\\t\\r\\u0001\\u007f<&>\"]");
  open_out(&o, MSNAP_JSON_HTML);
  msnap__json_arr(&o.j);
  msnap__json_dbl(&o.j, 2.0);
  msnap__json_cstr(&o.j, "</script>&");
  msnap__json_arr_end(&o.j);
  expect(&o, "[2,\"\\u003c/script\\u003e\\u0026\"]");
}

/* Valid UTF-8 passes through; each maximal invalid subpart becomes one
 * U+FFFD (the replacement examples of the Unicode standard, ch. 3.9),
 * but an encoded surrogate (a Python lone surrogate) is one code point
 * and one U+FFFD. */
static void test_utf8(void **state) {
  (void)state;
  static const struct {
    const char *in, *want;
  } cases[] = {
      {"\xc3\xa9t\xc3\xa9", "\"\xc3\xa9t\xc3\xa9\""},             /* été */
      {"\xe2\x82\xac\xf0\x9f\x98\x80", "\"\xe2\x82\xac\xf0\x9f\x98\x80\""},
      {"a\x80z", "\"a\xef\xbf\xbdz\""},                            /* lone */
      {"\xc0\xaf", "\"\xef\xbf\xbd\xef\xbf\xbd\""},                /* overlong */
      {"\xed\xa0\x80", "\"\xef\xbf\xbd\""}, /* surrogate: one code point */
      {"a\xed\xb2\x80" "b", "\"a\xef\xbf\xbd" "b\""}, /* Python's 'a\udc80b' */
      {"\xed\xa0", "\"\xef\xbf\xbd\xef\xbf\xbd\""},   /* cut surrogate */
      {"\xf4\x90\x80\x80",
       "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""},   /* > 10FFFF */
      {"\xe2\x82", "\"\xef\xbf\xbd\""},                         /* cut off */
      {"\xe2\x82x", "\"\xef\xbf\xbdx\""},
      {"\xf0\x9f\x98", "\"\xef\xbf\xbd\""},
      {"\xff\xfe", "\"\xef\xbf\xbd\xef\xbf\xbd\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    out_t o;
    open_out(&o, 0);
    msnap__json_cstr(&o.j, cases[i].in);
    expect(&o, cases[i].want);
  }
}

/* Random bytes: the output decodes, and to what CPython's decoder with
 * errors="replace" makes of the input -- but one U+FFFD for an encoded
 * surrogate (the error handler "m": a lone surrogate of a str that
 * pickle wrote with "surrogatepass" is one code point). */
static void test_utf8_against_cpython(void **state) {
  (void)state;
  if (system("python3 -c 'import json' 2>/dev/null") != 0) {
    print_message("python3 missing: CPython cross-check skipped\n");
    skip();
  }
  char dir[] = "/tmp/msnap_json_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char inp[64], outp[64];
  snprintf(inp, sizeof inp, "%s/in.bin", dir);
  snprintf(outp, sizeof outp, "%s/out.json", dir);
  FILE *fi = fopen(inp, "wb"), *fo = fopen(outp, "wb");
  assert_non_null(fi);
  assert_non_null(fo);
  msnap_sink_t sink;
  assert_int_equal(msnap__sink_init_file(&sink, fo), 0);
  msnap_json_t j;
  msnap__json_init(&j, &sink, 0);
  msnap__json_arr(&j);
  unsigned seed = 12345;
  static const unsigned char pick[] = {0x00, 0x1f, 0x22, 0x5c, 0x41, 0x7f,
                                       0x80, 0xbf, 0xc0, 0xc2, 0xdf, 0xe0,
                                       0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff};
  for (int n = 0; n < 2000; n++) {
    unsigned char b[12];
    size_t len = (size_t)(rand_r(&seed) % sizeof b);
    for (size_t k = 0; k < len; k++)
      b[k] = rand_r(&seed) % 3 ? pick[rand_r(&seed) % sizeof pick]
                               : (unsigned char)rand_r(&seed);
    uint32_t l32 = (uint32_t)len;
    fwrite(&l32, sizeof l32, 1, fi);
    fwrite(b, 1, len, fi);
    msnap__json_str(&j, (const char *)b, len);
  }
  msnap__json_arr_end(&j);
  assert_int_equal(msnap__json_err(&j), 0);
  fclose(fi);
  fclose(fo);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import codecs,json,struct,sys\n"
           "def m(e):\n"
           "  b=e.object[e.start:e.start+3]\n"
           "  if len(b)==3 and b[0]==0xed and 0xa0<=b[1]<=0xbf and "
           "0x80<=b[2]<=0xbf: return (chr(0xfffd),e.start+3)\n"
           "  return codecs.replace_errors(e)\n"
           "codecs.register_error(\"m\",m)\n"
           "raw=open(sys.argv[1],\"rb\").read(); got=json.load(open("
           "sys.argv[2],encoding=\"utf-8\"))\n"
           "want=[]; i=0\n"
           "while i < len(raw):\n"
           "  (n,)=struct.unpack_from(\"<I\",raw,i); i+=4\n"
           "  want.append(raw[i:i+n].decode(\"utf-8\",\"m\")); i+=n\n"
           "sys.exit(0 if got==want else 1)' %s %s",
           inp, outp);
  int rc = system(cmd);
  unlink(inp);
  unlink(outp);
  rmdir(dir);
  assert_int_equal(rc, 0);
}

/* Doubles: the fewest digits that read back as the same double. */
static void test_doubles_shortest(void **state) {
  (void)state;
  out_t o;
  open_out(&o, MSNAP_JSON_FLOAT_POINT);
  msnap__json_arr(&o.j);
  static const double v[] = {0.1, 0.969, 1.0 / 3.0, 5e-324, 1.7976931348623157e308,
                             -2.5, 100.0, 123456789012345678.0};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    msnap__json_dbl(&o.j, v[i]);
  msnap__json_arr_end(&o.j);
  expect(&o, "[0.1,0.969,0.3333333333333333,5e-324,1.7976931348623157e+308,"
             "-2.5,100.0,1.2345678901234568e+17]");
  /* random bit patterns: every finite one reads back exactly */
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int k = 0; k < 20000; k++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double d;
    memcpy(&d, &x, sizeof d);
    if (d != d || d - d != 0.0) continue; /* NaN, infinity */
    open_out(&o, 0);
    msnap__json_dbl(&o.j, d);
    int err;
    char *got = text(&o, &err);
    assert_int_equal(err, 0);
    assert_true(strtod(got, NULL) == d);
    assert_true(strlen(got) <= 24);
    free(got);
  }
}

/* The definition the writer's doubles follow, as it was first written:
 * one snprintf and strtod per N, the first %.Ng (N = 1..17) that reads
 * back, then integer digits for 1e(N-1) <= |v| < 1e16. */
static int ref_dbl(double v, char *b, size_t cap) {
  int n = 0, prec = 1;
  for (; prec <= 17; prec++) {
    n = snprintf(b, cap, "%.*g", prec, v);
    if (prec == 17 || strtod(b, NULL) == v) break;
  }
  const char *e = strchr(b, 'e');
  long x = e ? strtol(e + 1, NULL, 10) : -1;
  if (x >= prec && x < 16) n = snprintf(b, cap, "%.*g", (int)x + 1, v);
  return n;
}

static void expect_ref(double d) {
  if (d != d || d - d != 0.0) return; /* (null: test_numbers_and_escapes) */
  char want[48];
  ref_dbl(d, want, sizeof want);
  out_t o;
  open_out(&o, 0);
  msnap__json_dbl(&o.j, d);
  int err;
  char *got = text(&o, &err);
  assert_int_equal(err, 0);
  if (strcmp(got, want) != 0)
    fail_msg("%a: wrote %s, the definition gives %s", d, got, want);
  free(got);
}

/* The writer finds those digits with one %.16e and one or two strtod: the
 * same text for random bit patterns, decimals of 1 to 17 digits at every
 * exponent (ties of printf's rounding among them), integers, powers of 2
 * and 10 and their neighbours, subnormals and zeros. */
static void test_doubles_definition(void **state) {
  (void)state;
  uint64_t x = 0x2545f4914f6cdd1dull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
  for (int k = 0; k < 30000; k++) {
    uint64_t bits = NEXT();
    double d;
    memcpy(&d, &bits, sizeof d);
    if (d != d || d - d != 0.0) continue;
    expect_ref(d);
  }
  char buf[64];
  for (int k = 0; k < 30000; k++) {
    int digits = 1 + (int)(NEXT() % 17), ex = (int)(NEXT() % 640) - 330;
    int n = 0;
    buf[n++] = (char)('1' + NEXT() % 9);
    buf[n++] = '.';
    for (int i = 1; i < digits; i++) buf[n++] = (char)('0' + NEXT() % 10);
    /* a 5 last now and then: a tie of rounding to fewer digits */
    if (digits > 1 && NEXT() % 4 == 0) buf[n - 1] = '5';
    snprintf(buf + n, sizeof buf - (size_t)n, "e%d", ex);
    double d = strtod(buf, NULL);
    expect_ref(d);
    expect_ref(-d);
    expect_ref(nextafter(d, 0));
    expect_ref(nextafter(d, INFINITY));
  }
  for (int i = 0; i < 2000; i++) {
    expect_ref((double)i);
    expect_ref(i * 0.001);
    expect_ref(i / 7.0);
    expect_ref(1.25 * i);
  }
  for (int e = -1074; e <= 1023; e++) {
    double d = ldexp(1.0, e);
    expect_ref(d);
    expect_ref(nextafter(d, 0));
    expect_ref(nextafter(d, INFINITY));
  }
  for (int e = -325; e <= 308; e++) {
    snprintf(buf, sizeof buf, "1e%d", e);
    double d = strtod(buf, NULL);
    expect_ref(d);
    expect_ref(nextafter(d, 0));
    expect_ref(nextafter(d, INFINITY));
    expect_ref(d * 9.999999999999999);
  }
  static const double v[] = {0.0, -0.0, 5e-324, 2.2250738585072009e-308,
                             2.2250738585072014e-308, 1e15, 1e16, 1e17,
                             9007199254740993.0, 9999999999999998.0,
                             1.0000000000000002, 0.30000000000000004,
                             123456789012345678.0, 1e-4, 1e-5, 0.00012345};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) expect_ref(v[i]);
  /* one writer: a double repeated (the writer keeps the last text) */
  out_t o;
  open_out(&o, MSNAP_JSON_FLOAT_POINT);
  msnap__json_arr(&o.j);
  static const double r[] = {1.0, 1.0, 0.1, 0.1, 0.1, -0.0, 0.0, 0.0, 1e22,
                             1e22, 2.5, 1.0};
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
    msnap__json_dbl(&o.j, r[i]);
  msnap__json_arr_end(&o.j);
  expect(&o, "[1.0,1.0,0.1,0.1,0.1,-0.0,0.0,0.0,1e+22,1e+22,2.5,1.0]");
#undef NEXT
}

static void test_depth_limit(void **state) {
  (void)state;
  out_t o;
  open_out(&o, 0);
  for (int i = 0; i < MSNAP_JSON_MAX_DEPTH + 5; i++) msnap__json_arr(&o.j);
  int err;
  free(text(&o, &err));
  assert_int_equal(err, MSNAP_ELIMIT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_structure),
      cmocka_unit_test(test_numbers_and_escapes),
      cmocka_unit_test(test_doubles_shortest),
      cmocka_unit_test(test_doubles_definition),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_utf8_against_cpython),
      cmocka_unit_test(test_depth_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
