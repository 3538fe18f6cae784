/*
 * test_pickle_read.c -- the safe pickle VM against CPython's pickle
 * (protocols 0..5, canonical text equality) and against hostile input
 * (code-executing opcodes, deep nesting, huge declared lengths, bad memo
 * indices, stack underflow): every case must return the right error with
 * an "offset N: ..." message, never crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "canon.h"
#include "testutil.h"

static int canon_of(const void *p, size_t n, char **text,
                    msnap_read_error_t *err) {
  msnap_membuf_t mb = {0};
  int rc = test_pickle_canon(p, n, &mb, err);
  *text = mb.data;
  return rc;
}

/* Every CPython pickle of gen_cases.py gives the same canonical text, or
 * EUNSAFE for the ones that need GLOBAL/REDUCE (bytes below protocol 3,
 * sets below protocol 4). */
static void test_cpython_protocols(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  assert_non_null(dir);
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "python3 '%s/tests/pickle/gen_cases.py' '%s' >/dev/null",
           tu_src(), dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s/MANIFEST", dir);
  FILE *m = fopen(cmd, "r");
  assert_non_null(m);
  char name[128], expect[16];
  int proto, ncases = 0, nunsafe = 0;
  while (fscanf(m, "%127s %d %15s", name, &proto, expect) == 3) {
    char path[8192];
    size_t n = 0, cn = 0;
    snprintf(path, sizeof path, "%s/%s.p%d", dir, name, proto);
    unsigned char *data = tu_slurp(path, &n);
    assert_non_null(data);
    snprintf(path, sizeof path, "%s/%s.canon", dir, name);
    char *want = (char *)tu_slurp(path, &cn);
    assert_non_null(want);
    want = realloc(want, cn + 1);
    want[cn] = 0;
    char *got = NULL;
    msnap_read_error_t err;
    int rc = canon_of(data, n, &got, &err);
    if (strcmp(expect, "unsafe") == 0) {
      if (rc != MSNAP_EUNSAFE)
        fprintf(stderr, "%s p%d: rc %d\n", name, proto, rc);
      assert_int_equal(rc, MSNAP_EUNSAFE);
      assert_non_null(strstr(err.msg, "offset "));
      assert_non_null(strstr(err.msg, "refused"));
      nunsafe++;
    } else {
      if (rc != 0) fprintf(stderr, "%s p%d: %s\n", name, proto, err.msg);
      assert_int_equal(rc, 0);
      if (strcmp(got, want) != 0)
        fprintf(stderr, "%s p%d:\n got  %.300s\n want %.300s\n", name,
                proto, got, want);
      assert_string_equal(got, want);
      ncases++;
    }
    free(got);
    free(want);
    free(data);
  }
  fclose(m);
  assert_true(ncases >= 60);
  assert_true(nunsafe >= 5);
  tu_rmrf(dir);
  free(dir);
}

static int run_bytes(const void *p, size_t n, msnap_read_error_t *err) {
  char *t = NULL;
  int rc = canon_of(p, n, &t, err);
  free(t);
  return rc;
}

#define RUN(lit, err) run_bytes(lit, sizeof(lit) - 1, err)

static void test_refuses_code(void **state) {
  (void)state;
  msnap_read_error_t err;
  /* protocol 0: os.system via GLOBAL + REDUCE */
  assert_int_equal(RUN("cos\nsystem\n(S'echo pwned'\ntR.", &err),
                   MSNAP_EUNSAFE);
  assert_string_equal(err.msg,
                      "offset 0: opcode GLOBAL (0x63) would import or call "
                      "code (os.system); refused: this pickle holds Python "
                      "objects, not only the dicts and lists of a memory "
                      "snapshot (while decoding GLOBAL)");
  assert_int_equal(err.offset, 0);
  /* protocol 4: STACK_GLOBAL form, after a valid prefix */
  assert_int_equal(RUN("\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04" "echo"
                       "\x85R.",
                       &err),
                   MSNAP_EUNSAFE);
  assert_non_null(strstr(err.msg, "offset 14: opcode STACK_GLOBAL"));
  /* REDUCE alone, BUILD, INST, OBJ, NEWOBJ, EXT1, PERSID, buffers */
  static const char *const bad[] = {
      "N)R.", "}}b.", "(iGLOB\nX\n.", "(o.", "\x80\x02N)\x81.",
      "\x80\x02\x82\x01.", "Pid\n.", "N\x51.", "\x80\x05\x97.",
      "\x80\x05N\x98.", "\x80\x04N)}\x92."};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = run_bytes(bad[i], strlen(bad[i]), &err);
    if (rc != MSNAP_EUNSAFE) fprintf(stderr, "case %zu: %s\n", i, err.msg);
    assert_int_equal(rc, MSNAP_EUNSAFE);
  }
  /* an out-of-band buffer is named as such, not as code */
  assert_int_equal(RUN("\x80\x05\x97.", &err), MSNAP_EUNSAFE);
  assert_non_null(strstr(err.msg, "opcode NEXT_BUFFER (0x97) takes an "
                                  "out-of-band buffer"));
  assert_null(strstr(err.msg, "import"));
}

static void test_deep_nesting(void **state) {
  (void)state;
  msnap_read_error_t err;
  size_t n = 1000000;
  char *p = malloc(2 * n + 8);
  /* a million MARKs */
  memset(p, '(', n);
  p[n] = '.';
  assert_int_equal(run_bytes(p, n + 1, &err), MSNAP_ELIMIT);
  assert_non_null(strstr(err.msg, "nested deeper"));
  /* 60000 lists (within the pool's first MSNAP_PICKLE_POOL_FREE), each
   * appended into the one below */
  size_t k = 60000;
  memset(p, ']', k);
  memset(p + k, 'a', k - 1);
  p[2 * k - 1] = '.';
  assert_int_equal(run_bytes(p, 2 * k, &err), MSNAP_ELIMIT);
  assert_non_null(strstr(err.msg, "nested deeper than 1000"));
  /* a million: the pool of live containers is bounded by the input */
  memset(p, ']', n);
  memset(p + n, 'a', n - 1);
  p[2 * n - 1] = '.';
  assert_int_equal(run_bytes(p, 2 * n, &err), MSNAP_ELIMIT);
  assert_non_null(strstr(err.msg, "live containers"));
  /* a million TUPLE1 */
  p[0] = ')';
  memset(p + 1, 0x85, n);
  p[n + 1] = '.';
  assert_int_equal(run_bytes(p, n + 2, &err), MSNAP_ELIMIT);
  /* 1000 levels are fine */
  memset(p, ']', 999);
  memset(p + 999, 'a', 998);
  p[1997] = '.';
  assert_int_equal(run_bytes(p, 1998, &err), 0);
  free(p);
}

static void test_huge_lengths(void **state) {
  (void)state;
  msnap_read_error_t err;
  /* BINUNICODE8 declaring 2^62 bytes */
  assert_int_equal(RUN("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40xx.",
                       &err),
                   MSNAP_EFORMAT);
  assert_string_equal(err.msg,
                      "offset 2: the pickle is truncated (the input ends "
                      "early): needs 4611686018427387904 bytes but only 3 "
                      "remain (while decoding BINUNICODE8)");
  /* BINBYTES8 2^64-1, BYTEARRAY8 */
  assert_int_equal(RUN("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffxx.",
                       &err),
                   MSNAP_EFORMAT);
  assert_int_equal(RUN("\x80\x05\x96\xff\xff\xff\xff\xff\xff\xff\x7f.", &err),
                   MSNAP_EFORMAT);
  /* LONG4 huge and negative */
  assert_int_equal(RUN("\x80\x02\x8b\xff\xff\xff\x7f\x01.", &err),
                   MSNAP_EFORMAT);
  assert_int_equal(RUN("\x80\x02\x8b\xff\xff\xff\xff\x01.", &err),
                   MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "negative LONG4 length"));
  /* BINUNICODE 4 GiB, FRAME larger than the rest */
  assert_int_equal(RUN("X\xff\xff\xff\xff" "ab.", &err), MSNAP_EFORMAT);
  assert_int_equal(RUN("\x80\x04\x95\x00\x00\x00\x00\x01\x00\x00\x00N.",
                       &err),
                   MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "the pickle is truncated (the input ends "
                                  "early): a frame of 4294967296 bytes but "
                                  "only 2 remain"));
  /* a 100000-digit LONG literal (quadratic to convert) is refused */
  char *lit = malloc(100010);
  lit[0] = 'L';
  memset(lit + 1, '7', 100000);
  memcpy(lit + 100001, "L\n.", 3);
  assert_int_equal(run_bytes(lit, 100004, &err), MSNAP_ELIMIT);
  assert_non_null(strstr(err.msg, "100000 digits"));
  free(lit);
}

static void test_memo_and_stack(void **state) {
  (void)state;
  msnap_read_error_t err;
  assert_int_equal(RUN("]h\x05.", &err), MSNAP_EFORMAT);
  assert_string_equal(err.msg,
                      "offset 1: memo key 5 is not defined (while decoding "
                      "BINGET)");
  assert_int_equal(RUN("]j\xff\xff\xff\xff.", &err), MSNAP_EFORMAT);
  assert_int_equal(RUN("]r\xfe\xff\xff\xff.", &err), MSNAP_ELIMIT);
  assert_int_equal(RUN("g99999999999\n.", &err), MSNAP_EFORMAT);
  assert_int_equal(RUN("a.", &err), MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "stack underflow"));
  assert_int_equal(RUN(".", &err), MSNAP_EFORMAT);
  assert_int_equal(RUN("N(.", &err), MSNAP_EFORMAT); /* pop below MARK */
  assert_int_equal(RUN("", &err), MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "the pickle is truncated (the input ends "
                                  "early): it ended without STOP"));
  assert_int_equal(RUN("NNu.", &err), MSNAP_EFORMAT); /* no MARK */
  assert_int_equal(RUN("N(Ne.", &err), MSNAP_EFORMAT); /* APPENDS to None */
  assert_int_equal(RUN("}]]s.", &err), MSNAP_EFORMAT); /* unhashable key */
  assert_int_equal(RUN("\x80\x06N.", &err), MSNAP_EFORMAT);
  assert_int_equal(RUN("\xffN.", &err), MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "unknown opcode 0xff"));
  /* recursive list: readable, but printing it is refused */
  assert_int_equal(RUN("]\x94h\x00" "a.", &err), MSNAP_EFORMAT);
  if (!strstr(err.msg, "recursive")) fprintf(stderr, "%s\n", err.msg);
  assert_non_null(strstr(err.msg, "recursive"));
  /* the stack holds at most MSNAP_PICKLE_MAX_STACK items, whether pushed
   * by opcodes or memo references; exactly that many are fine */
  {
    size_t n = MSNAP_PICKLE_MAX_STACK;
    char *p = malloc(2 * n + 16);
    size_t k = 0;
    p[k++] = '(';
    for (size_t i = 0; i < n; i++) p[k++] = 'N';
    p[k++] = 'l';
    p[k++] = '.';
    assert_int_equal(run_bytes(p, k, &err), 0);
    k = 0;
    for (size_t i = 0; i <= n; i++) p[k++] = 'N';
    p[k++] = '.';
    assert_int_equal(run_bytes(p, k, &err), MSNAP_ELIMIT);
    assert_non_null(strstr(err.msg, "more than 1048576 items on the stack"));
    assert_non_null(strstr(err.msg, "offset 1048576:"));
    k = 0;
    p[k++] = 'N';
    p[k++] = 0x94; /* MEMOIZE */
    for (size_t i = 0; i < n; i++) {
      p[k++] = 'h';
      p[k++] = 0;
    }
    p[k++] = '.';
    assert_int_equal(run_bytes(p, k, &err), MSNAP_ELIMIT);
    assert_non_null(strstr(err.msg, "items on the stack"));
    free(p);
  }
  /* trailing bytes after STOP are ignored (MemoryViz pads with zeros) */
  char *t = NULL;
  assert_int_equal(canon_of("K\x07.\x00\x00", 5, &t, &err), 0);
  assert_string_equal(t, "i7");
  free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpython_protocols),
      cmocka_unit_test(test_refuses_code),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_huge_lengths),
      cmocka_unit_test(test_memo_and_stack),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
