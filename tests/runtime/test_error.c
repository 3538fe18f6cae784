/* test_error.c -- error table, last-error buffer (per thread). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api.h"
#include "runtime/runtime.h"

static void test_table(void **state) {
  (void)state;
  assert_string_equal(msnap_strerror(MSNAP_EOOM), "device out of memory");
  assert_string_equal(msnap_err_name(MSNAP_EOOM), "MSNAP_EOOM");
  assert_string_equal(msnap_err_name(MSNAP_ENOSPC), "MSNAP_ENOSPC");
  assert_string_equal(msnap_strerror(MSNAP_ECONF),
                      "invalid allocator configuration");
  assert_string_equal(msnap_strerror(0), "success");
  assert_string_equal(msnap_err_name(0), "MSNAP_OK");
  assert_string_equal(msnap_strerror(-999), "unknown error");
  assert_string_equal(msnap_err_name(12345), "MSNAP_EUNKNOWN");
  /* Every code from -1 to -16 has a distinct name. */
  for (int e = -1; e >= -16; e--) {
    assert_string_not_equal(msnap_strerror(e), "unknown error");
    for (int f = e - 1; f >= -16; f--)
      assert_string_not_equal(msnap_err_name(e), msnap_err_name(f));
  }
}

static void test_set_error(void **state) {
  (void)state;
  assert_int_equal(msnap__set_error(MSNAP_EBADPTR,
                                    "invalid device pointer: 0x%llx",
                                    0x7f0000001000ull),
                   MSNAP_EBADPTR);
  assert_string_equal(msnap_last_error(),
                      "invalid device pointer: 0x7f0000001000");
  /* The argument may alias the buffer itself. */
  msnap__set_error(MSNAP_EIO, "wrapped: %s", msnap_last_error());
  assert_string_equal(msnap_last_error(),
                      "wrapped: invalid device pointer: 0x7f0000001000");
  msnap__set_error(MSNAP_EOOM, NULL);
  assert_string_equal(msnap_last_error(), "device out of memory");
  /* Truncation keeps a NUL and marks the cut. */
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  msnap__set_error(MSNAP_EINVAL, "%s", big);
  size_t n = strlen(msnap_last_error());
  assert_true(n < sizeof big);
  assert_string_equal(msnap_last_error() + n - 3, "...");
  char *s = strdup("owned");
  msnap_free_string(s);
  msnap_free_string(NULL);
}

static void *other_thread(void *arg) {
  (void)arg;
  /* A fresh thread starts with an empty message. */
  char *seen = strdup(msnap_last_error());
  msnap__set_error(MSNAP_EINVAL, "thread message");
  return seen;
}

static void test_thread_local(void **state) {
  (void)state;
  msnap__set_error(MSNAP_EINVAL, "main message");
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
  void *seen;
  pthread_join(t, &seen);
  assert_string_equal((char *)seen, "");
  free(seen);
  assert_string_equal(msnap_last_error(), "main message");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_set_error),
      cmocka_unit_test(test_thread_local),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
