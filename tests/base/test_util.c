/*
 * test_util.c -- the base layer's small helpers: the array-growth helper
 * (MSNAP_GROW, msnap__grow) on 32- and 64-bit capacities, the growable
 * text buffer, format_size and the 16-byte-key map (with its checker after
 * every insertion).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "base/map16.h"

static void test_grow(void **state) {
  (void)state;
  uint64_t *a = NULL;
  uint32_t cap32 = 0;
  for (uint32_t n = 0; n < 5000; n++) {
    assert_int_equal(MSNAP_GROW(a, cap32, n + 1), 0);
    assert_true(cap32 >= n + 1);
    a[n] = n;
  }
  for (uint32_t n = 0; n < 5000; n++) assert_int_equal(a[n], n);
  uint32_t before = cap32;
  assert_int_equal(MSNAP_GROW(a, cap32, 10), 0); /* room: no change */
  assert_int_equal(cap32, before);
  /* More than a 32-bit capacity holds: refused, nothing changed. */
  uint64_t *keep = a;
  assert_int_equal(MSNAP_GROW(a, cap32, (uint64_t)UINT32_MAX + 5),
                   MSNAP_ENOMEM);
  assert_ptr_equal(a, keep);
  assert_int_equal(cap32, before);
  free(a);

  char *c = NULL;
  size_t capz = 0;
  assert_int_equal(MSNAP_GROW(c, capz, 1), 0);
  assert_int_equal(capz, 16);
  assert_int_equal(MSNAP_GROW(c, capz, 17), 0);
  assert_int_equal(capz, 40); /* 16 + 16/2 + 16 */
  assert_int_equal(MSNAP_GROW(c, capz, (uint64_t)SIZE_MAX), MSNAP_ENOMEM);
  assert_int_equal(capz, 40);
  free(c);

  uint32_t *v = NULL, cap = 0;
  assert_int_equal(msnap__grow((void **)&v, &cap, 0, 3, sizeof *v), 0);
  assert_int_equal(cap, 16);
  assert_int_equal(msnap__grow((void **)&v, &cap, 16, 1, sizeof *v), 0);
  assert_true(cap > 16);
  free(v);
}

static void test_strbuf(void **state) {
  (void)state;
  msnap_strbuf_t b = {0};
  msnap__strbuf_printf(&b, "%s", "");
  assert_int_equal(b.len, 0);
  for (int i = 0; i < 1000; i++) msnap__strbuf_printf(&b, "%d,", i);
  msnap__strbuf_append(&b, "end", 3);
  assert_int_equal(b.err, 0);
  assert_int_equal(strlen(b.p), b.len);
  assert_true(b.len < b.cap);
  assert_memory_equal(b.p, "0,1,2,3,", 8);
  assert_string_equal(b.p + b.len - 7, "999,end");
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  size_t len0 = b.len;
  msnap__strbuf_printf(&b, "[%s]", big);
  assert_int_equal(b.len, len0 + sizeof big + 1);
  assert_int_equal(b.p[b.len], '\0');
  free(b.p);
}

static void test_format_size(void **state) {
  (void)state;
  char buf[32];
  msnap__format_size(1024, buf, sizeof buf);
  assert_string_equal(buf, "1024 bytes");
  msnap__format_size(1536, buf, sizeof buf);
  assert_string_equal(buf, "1.50 KiB");
  msnap__format_size(3ull << 20, buf, sizeof buf);
  assert_string_equal(buf, "3.00 MiB");
  msnap__format_size(5ull << 30, buf, sizeof buf);
  assert_string_equal(buf, "5.00 GiB");
}

static void check_map(const msnap_map16_t *m) {
  char msg[128];
  if (msnap__map16_check(m, msg, sizeof msg) != 0) fail_msg("%s", msg);
}

static void test_map16(void **state) {
  (void)state;
  msnap_map16_t m = {0};
  check_map(&m);
  bool fresh;
  for (uint64_t i = 0; i < 3000; i++) {
    uint32_t *v = msnap__map16_slot(&m, i * 7919, i % 3, &fresh);
    assert_non_null(v);
    assert_true(fresh);
    *v = (uint32_t)i + 1;
    check_map(&m);
  }
  assert_int_equal(m.n, 3000);
  for (uint64_t i = 0; i < 3000; i++) {
    uint32_t *v = msnap__map16_slot(&m, i * 7919, i % 3, &fresh);
    assert_false(fresh);
    assert_int_equal(*v, i + 1);
  }
  /* the second word is part of the key */
  uint32_t *v = msnap__map16_slot(&m, 0, 1, &fresh);
  assert_true(fresh);
  assert_int_equal(*v, 0);
  check_map(&m);
  /* the checker catches a broken count */
  m.n++;
  char msg[128];
  assert_int_equal(msnap__map16_check(&m, msg, sizeof msg), MSNAP_ESTATE);
  assert_non_null(strstr(msg, "count"));
  m.n--;
  msnap__map16_free(&m);
  assert_null(m.t);
  assert_int_equal(m.cap, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grow),
      cmocka_unit_test(test_strbuf),
      cmocka_unit_test(test_format_size),
      cmocka_unit_test(test_map16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
