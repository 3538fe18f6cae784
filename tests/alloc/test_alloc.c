/* test_alloc.c -- placeholder, filled below. */
#include "talloc.h"
static void smoke(void **state) {
  (void)state;
  msnap_allocator_t *a = mk(CUDA, NULL);
  uint64_t p = M(a, 100);
  F(a, p);
  done(a);
}
int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(smoke)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
