/* test_env.c -- environment options (base/env.c): the table of
 * variables, the typed reads and the parsers behind them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "runtime/runtime.h"

/* Run fn with stderr redirected to a temporary file; returns its text. */
static char captured[4096];
static void capture_begin(FILE **tmp, int *saved) {
  fflush(stderr);
  *tmp = tmpfile();
  assert_non_null(*tmp);
  *saved = dup(2);
  dup2(fileno(*tmp), 2);
}
static const char *capture_end(FILE *tmp, int saved) {
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(captured, 1, sizeof captured - 1, tmp);
  captured[n] = '\0';
  fclose(tmp);
  return captured;
}

/* The sim runtime brought up with VAR=VALUE (then unset): its device
 * count and device 0's total memory, and what it printed on stderr. */
static const char *sim_with(const char *var, const char *value, int *ndev,
                            size_t *total) {
  setenv(var, value, 1);
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  void *ctx = NULL;
  const msnap_runtime_ops_t *rt = msnap_runtime_sim();
  assert_int_equal(rt->init(&ctx), 0);
  size_t fr = 0;
  assert_int_equal(rt->device_count(ctx, ndev), 0);
  assert_int_equal(rt->mem_get_info(ctx, 0, &fr, total), 0);
  rt->fini(ctx);
  unsetenv(var);
  return capture_end(tmp, saved);
}

static void test_profile(void **state) {
  (void)state;
  msnap_profile_t p = MSNAP_PROFILE_NPU;
  /* unset: the caller's default (the runtime's own profile) */
  unsetenv("MEMSNAP_PROFILE");
  assert_int_equal(msnap__env_profile(&p, MSNAP_PROFILE_CUDA), 0);
  assert_int_equal(p, MSNAP_PROFILE_CUDA);
  msnap__env_profile(&p, MSNAP_PROFILE_NPU);
  assert_int_equal(p, MSNAP_PROFILE_NPU);
  setenv("MEMSNAP_PROFILE", "", 1);
  msnap__env_profile(&p, MSNAP_PROFILE_CUDA);
  assert_int_equal(p, MSNAP_PROFILE_CUDA);
  setenv("MEMSNAP_PROFILE", "cuda", 1);
  msnap__env_profile(&p, MSNAP_PROFILE_NPU);
  assert_int_equal(p, MSNAP_PROFILE_CUDA);
  setenv("MEMSNAP_PROFILE", "npu", 1);
  msnap__env_profile(&p, MSNAP_PROFILE_CUDA);
  assert_int_equal(p, MSNAP_PROFILE_NPU);
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  setenv("MEMSNAP_PROFILE", "rocm", 1);
  p = MSNAP_PROFILE_NPU;
  msnap__env_profile(&p, MSNAP_PROFILE_CUDA);
  msnap__env_profile(&p, MSNAP_PROFILE_CUDA); /* no second warning */
  const char *out = capture_end(tmp, saved);
  assert_int_equal(p, MSNAP_PROFILE_CUDA);
  assert_non_null(strstr(out, "invalid MEMSNAP_PROFILE 'rocm'"));
  assert_non_null(strstr(out, "using cuda"));
  assert_null(strstr(strstr(out, "rocm") + 1, "MEMSNAP_PROFILE 'rocm'"));
  unsetenv("MEMSNAP_PROFILE");
}

/* RANK / WORLD_SIZE / LOCAL_RANK: whole numbers, -1 when unset or bad. */
static void test_rank(void **state) {
  (void)state;
  unsetenv("RANK");
  assert_int_equal(msnap__env_rank(MSNAP_ENV_RANK), -1);
  setenv("RANK", "3", 1);
  assert_int_equal(msnap__env_rank(MSNAP_ENV_RANK), 3);
  setenv("WORLD_SIZE", "0", 1); /* a world has at least one rank */
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  assert_int_equal(msnap__env_rank(MSNAP_ENV_WORLD_SIZE), -1);
  setenv("LOCAL_RANK", "1x", 1);
  assert_int_equal(msnap__env_rank(MSNAP_ENV_LOCAL_RANK), -1);
  const char *out = capture_end(tmp, saved);
  assert_non_null(strstr(out, "invalid WORLD_SIZE '0'"));
  assert_non_null(strstr(out, "invalid LOCAL_RANK '1x'"));
  setenv("WORLD_SIZE", "8", 1);
  assert_int_equal(msnap__env_rank(MSNAP_ENV_WORLD_SIZE), 8);
  setenv("RANK", "99999999999", 1);
  capture_begin(&tmp, &saved);
  assert_int_equal(msnap__env_rank(MSNAP_ENV_RANK), -1);
  capture_end(tmp, saved);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
}

static void test_runtime(void **state) {
  (void)state;
  unsetenv("MEMSNAP_RUNTIME");
  assert_string_equal(msnap__env_runtime(), "sim");
  setenv("MEMSNAP_RUNTIME", "acl", 1);
  assert_string_equal(msnap__env_runtime(), "acl");
  setenv("MEMSNAP_RUNTIME", "", 1);
  assert_string_equal(msnap__env_runtime(), "sim");
  unsetenv("MEMSNAP_RUNTIME");
}

static void test_size(void **state) {
  (void)state;
  const char *v = "MEMSNAP_TEST_SIZE";
  unsetenv(v);
  assert_int_equal(msnap__env_parse_size(v, getenv(v), 7), 7);
  static const struct {
    const char *text;
    uint64_t value;
  } ok[] = {
      {"0", 0},
      {"123", 123},
      {"64G", 68719476736ull},
      {"64g", 68719476736ull},
      {"64GiB", 68719476736ull},
      {"64GB", 68719476736ull},
      {"2k", 2048},
      {"3M", 3145728},
      {"1T", 1099511627776ull},
      {" 5M ", 5242880},
      {"18446744073709551615", UINT64_MAX},
      {"18446744073709551616", UINT64_MAX}, /* clamped */
      {"99999999999999999999999", UINT64_MAX},
      {"20000000T", UINT64_MAX}, /* suffix overflow, clamped */
      {"16777215T", 16777215ull << 40},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    setenv(v, ok[i].text, 1);
    assert_int_equal(msnap__env_parse_size(v, getenv(v), 7), ok[i].value);
  }
  static const char *bad[] = {"abc", "-5", "12X", "1.5.2G", "G", "5 M B x"};
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(v, bad[i], 1);
    assert_int_equal(msnap__env_parse_size(v, getenv(v), 42), 42);
  }
  const char *out = capture_end(tmp, saved);
  /* Warned once, naming the value and the variable. */
  assert_non_null(strstr(out, "invalid size 'abc' in MEMSNAP_TEST_SIZE"));
  assert_null(strstr(out, "'-5'"));
  unsetenv(v);
}

/*
 * The forms of a size, from the table Python's memsnap.predict.parse_size
 * is tested with too (tests/runtime/size_forms.txt): the two parsers
 * accept the same texts and give the same bytes.
 */
static void test_size_forms_table(void **state) {
  (void)state;
  const char *root = getenv("MEMSNAP_SOURCE_ROOT");
  if (root == NULL) {
    print_message("SKIP size_forms.txt: MEMSNAP_SOURCE_ROOT is not set\n");
    skip();
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/runtime/size_forms.txt", root);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256];
  int rows = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *bar = strrchr(line, '|');
    if (line[0] == '#' || bar == NULL)
      continue;
    *bar = '\0';
    const char *want = bar + 1;
    uint64_t got = 7;
    bool ok = msnap__parse_size(line, &got);
    if (strcmp(want, "invalid") == 0) {
      if (ok)
        fail_msg("'%s': accepted (%llu), the table says invalid", line,
                 (unsigned long long)got);
    } else {
      uint64_t v = strtoull(want, NULL, 10);
      if (!ok || got != v)
        fail_msg("'%s': %s %llu, the table says %llu", line,
                 ok ? "got" : "refused", (unsigned long long)got,
                 (unsigned long long)v);
    }
    rows++;
  }
  fclose(f);
  assert_true(rows >= 40);
  /* MEMSNAP_SIM_MEMORY takes them: 1.5G is a 1.5 GiB device, no warning */
  int n = 0;
  size_t tot = 0;
  const char *out = sim_with("MEMSNAP_SIM_MEMORY", "1.5G", &n, &tot);
  assert_int_equal(tot, (size_t)3 << 29);
  assert_null(strstr(out, "MEMSNAP_SIM_MEMORY"));
}

/*
 * MEMSNAP_SIM_DEVICES is a count, not a size: 1..64, plain decimal.  Bad
 * values warn naming the variable and the accepted range (never the size
 * suffixes) and give the default.
 */
static void test_count(void **state) {
  (void)state;
  const char *v = "MEMSNAP_TEST_COUNT";
  unsetenv(v);
  assert_int_equal(msnap__env_parse_count(v, getenv(v), 1, 1, 64), 1);
  setenv(v, "2", 1);
  assert_int_equal(msnap__env_parse_count(v, getenv(v), 1, 1, 64), 2);
  setenv(v, " 64 ", 1);
  assert_int_equal(msnap__env_parse_count(v, getenv(v), 1, 1, 64), 64);
  static const char *bad[] = {"-1", "0", "65", "1K", "abc", "2.0",
                              "99999999999999999999999"};
  /* A fresh variable per value (each warns once); the warned-once table
   * keeps the name pointers, hence static storage. */
  static char names[16][64];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(names[i], sizeof names[i], "MEMSNAP_TEST_COUNT_%zu", i);
    setenv(names[i], bad[i], 1);
    FILE *tmp;
    int saved;
    capture_begin(&tmp, &saved);
    assert_int_equal(
        msnap__env_parse_count(names[i], getenv(names[i]), 1, 1, 64), 1);
    const char *out = capture_end(tmp, saved);
    char want[160];
    snprintf(want, sizeof want,
             "ignoring invalid %s '%s' (expected a whole number from 1 to "
             "64); using 1",
             names[i], bad[i]);
    if (strstr(out, want) == NULL)
      fail_msg("count '%s': got warning \"%s\"", bad[i], out);
    assert_null(strstr(out, "suffix"));
    unsetenv(names[i]);
  }
  /* The real variable through the sim runtime: -1 warns about the count
   * and the runtime still comes up with one device. */
  int n = 0;
  size_t tot = 0;
  const char *out = sim_with("MEMSNAP_SIM_DEVICES", "-1", &n, &tot);
  assert_int_equal(n, 1);
  assert_non_null(strstr(out, "MEMSNAP_SIM_DEVICES '-1' (expected a whole "
                              "number from 1 to 64)"));
  assert_null(strstr(out, "suffix"));
}

/* MEMSNAP_SIM_MEMORY=0 warns (naming the variable) instead of silently
 * becoming the 64 GiB default; so do sizes outside the sim's 2M..256T,
 * which are never clamped. */
static void test_size_range(void **state) {
  (void)state;
  const char *v = "MEMSNAP_TEST_SIZE_MIN";
  setenv(v, "64M", 1);
  assert_int_equal(msnap__env_parse_size_range(v, getenv(v), 7, 1,
                                               UINT64_MAX),
                   64ull << 20);
  setenv(v, "0", 1);
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  assert_int_equal(msnap__env_parse_size_range(v, getenv(v), 7, 1,
                                               UINT64_MAX), 7);
  const char *out = capture_end(tmp, saved);
  assert_non_null(strstr(out, "ignoring MEMSNAP_TEST_SIZE_MIN '0': it must "
                              "be at least 1 byte (a number"));
  unsetenv(v);
  /* A malformed value and one out of range warn in one form, the default
   * written as a size both times (MEMSNAP_INPUT_LIMIT said "using 8G" for
   * "0" but "using 8589934592" for "abc"). */
  static const char *forms[] = {"0", "abc"};
  static char fnames[2][64];
  for (size_t i = 0; i < 2; i++) {
    snprintf(fnames[i], sizeof fnames[i], "MEMSNAP_TEST_SIZE_FORM_%zu", i);
    setenv(fnames[i], forms[i], 1);
    capture_begin(&tmp, &saved);
    assert_int_equal(msnap__env_parse_size_range(fnames[i], getenv(fnames[i]),
                                                 8ull << 30, 1, UINT64_MAX),
                     8ull << 30);
    out = capture_end(tmp, saved);
    char want[200];
    snprintf(want, sizeof want,
             "ignoring %s '%s': it must be at least 1 byte (a number with an "
             "optional K, M, G, T or P suffix); using 8G\n",
             fnames[i], forms[i]);
    if (strstr(out, want) == NULL)
      fail_msg("size '%s': got warning \"%s\"", forms[i], out);
    unsetenv(fnames[i]);
  }
  /* The real variable through the sim runtime: out-of-range sizes give
   * the default device (the first one warns: once per variable). */
  static const struct {
    const char *value;
    size_t total;
  } sim[] = {{"0", (size_t)64 << 30},   {"1M", (size_t)64 << 30},
             {"1.9M", (size_t)64 << 30}, {"2M", (size_t)2 << 20},
             {"256T", (size_t)1 << 48},  {"300T", (size_t)64 << 30}};
  for (size_t i = 0; i < sizeof sim / sizeof sim[0]; i++) {
    int n = 0;
    size_t tot = 0;
    out = sim_with("MEMSNAP_SIM_MEMORY", sim[i].value, &n, &tot);
    if (tot != sim[i].total)
      fail_msg("MEMSNAP_SIM_MEMORY=%s: a device of %zu bytes", sim[i].value,
               tot);
    if (i == 0 && !strstr(out, "ignoring MEMSNAP_SIM_MEMORY '0': it must be "
                               "from 2M to 256T"))
      fail_msg("MEMSNAP_SIM_MEMORY=0: warning \"%s\"", out);
  }
  /* The warning of each out-of-range value names the range (a fresh
   * variable per value: each warns once; names in static storage). */
  static const char *bad[] = {"1M", "1.9M", "300T", "2097151"};
  static char names[4][64];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(names[i], sizeof names[i], "MEMSNAP_TEST_SIZE_RANGE_%zu", i);
    setenv(names[i], bad[i], 1);
    capture_begin(&tmp, &saved);
    assert_int_equal(msnap__env_parse_size_range(names[i], getenv(names[i]),
                                                 5, (uint64_t)2 << 20,
                                                 (uint64_t)1 << 48), 5);
    out = capture_end(tmp, saved);
    char want[160];
    snprintf(want, sizeof want,
             "ignoring %s '%s': it must be from 2M to 256T (a number with an "
             "optional K, M, G, T or P suffix); using 5 bytes",
             names[i], bad[i]);
    if (strstr(out, want) == NULL)
      fail_msg("size '%s': got warning \"%s\"", bad[i], out);
    unsetenv(names[i]);
  }
}

static void test_no_caching(void **state) {
  (void)state;
  unsetenv("PYTORCH_NO_NPU_MEMORY_CACHING");
  unsetenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_NPU));
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_CUDA));
  setenv("PYTORCH_NO_NPU_MEMORY_CACHING", "1", 1);
  assert_true(msnap__env_no_caching(MSNAP_PROFILE_NPU));
  /* The CUDA profile reads only its own variable. */
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_CUDA));
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);
  assert_true(msnap__env_no_caching(MSNAP_PROFILE_CUDA));
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0", 1);
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_CUDA));
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "true", 1);
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_CUDA));
  setenv("PYTORCH_NO_NPU_MEMORY_CACHING", " 1", 1);
  assert_false(msnap__env_no_caching(MSNAP_PROFILE_NPU));
  const char *out = capture_end(tmp, saved);
  assert_non_null(strstr(out,
                         "Ignoring invalid value for boolean flag "
                         "PYTORCH_NO_CUDA_MEMORY_CACHING: truevalid values "
                         "are 0 or 1.\n"));
  assert_non_null(strstr(out,
                         "Ignoring invalid value for boolean flag "
                         "PYTORCH_NO_NPU_MEMORY_CACHING:  1valid values "
                         "are 0 or 1.\n"));
  unsetenv("PYTORCH_NO_NPU_MEMORY_CACHING");
  unsetenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
}

/* The table: every variable has a distinct name, and msnap__env_get
 * reads exactly that variable. */
static void test_table(void **state) {
  (void)state;
  for (int i = 0; i < MSNAP_ENV_COUNT; i++) {
    const char *name = msnap__env_name((msnap_env_t)i);
    assert_non_null(name);
    assert_string_not_equal(name, "?");
    for (int k = 0; k < i; k++)
      assert_string_not_equal(name, msnap__env_name((msnap_env_t)k));
  }
  assert_string_equal(msnap__env_name(MSNAP_ENV_OOM_SNAPSHOT_PATH),
                      "OOM_SNAPSHOT_PATH");
  setenv("MEMSNAP_CLOCK_FALLBACK", "x", 1);
  assert_string_equal(msnap__env_get(MSNAP_ENV_CLOCK_FALLBACK), "x");
  unsetenv("MEMSNAP_CLOCK_FALLBACK");
  assert_null(msnap__env_get(MSNAP_ENV_CLOCK_FALLBACK));
  assert_null(msnap__env_get(MSNAP_ENV_COUNT));
}

/* OOM_SNAPSHOT_ENABLE as torch_npu parses it (strtol). */
static void test_oom_snapshot_mode(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int mode;
  } cases[] = {{"", 0}, {"0", 0}, {"1", 1}, {"2", 2}, {"3", 1},
               {"-1", 1}, {"2x", 2}, {"00", 0}};
  unsetenv("OOM_SNAPSHOT_ENABLE");
  assert_int_equal(msnap__env_oom_snapshot_mode(), 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv("OOM_SNAPSHOT_ENABLE", cases[i].text, 1);
    assert_int_equal(msnap__env_oom_snapshot_mode(), cases[i].mode);
  }
  FILE *tmp;
  int saved;
  capture_begin(&tmp, &saved);
  setenv("OOM_SNAPSHOT_ENABLE", "yes", 1);
  assert_int_equal(msnap__env_oom_snapshot_mode(), 0);
  const char *out = capture_end(tmp, saved);
  assert_non_null(strstr(out, "OOM_SNAPSHOT_ENABLE='yes' is not a number"));
  unsetenv("OOM_SNAPSHOT_ENABLE");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_profile),
      cmocka_unit_test(test_rank),
      cmocka_unit_test(test_runtime),
      cmocka_unit_test(test_size),
      cmocka_unit_test(test_size_forms_table),
      cmocka_unit_test(test_count),
      cmocka_unit_test(test_size_range),
      cmocka_unit_test(test_no_caching),
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_oom_snapshot_mode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
