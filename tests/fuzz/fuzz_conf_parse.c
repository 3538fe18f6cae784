/*
 * fuzz_conf_parse.c -- fuzz target for the alloc-conf parser
 * (msnap__conf_parse, PYTORCH_{CUDA,NPU}_ALLOC_CONF).
 *
 * The input, cut at its first NUL, is parsed in both profiles.  Checked:
 *   - the result is 0 or MSNAP_ECONF, nothing else;
 *   - on MSNAP_ECONF the conf is bit-for-bit unchanged and the message is
 *     non-empty and NUL-terminated inside the buffer;
 *   - on success the conf passes msnap__conf_check and the values are in
 *     range (garbage_collection_threshold in [0, 1), roundup divisions 0
 *     or powers of two, memory fraction in [0, 1]), and parsing the same
 *     text into fresh defaults again gives the same settings (the parser
 *     keeps no hidden state);
 *   - the same holds for the run-time parser (msnap__conf_parse_runtime,
 *     _set_allocator_settings) applied on top of the first result.
 * Any violation prints what and aborts (a crash for libFuzzer, a failed
 * test for the corpus replay).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "runtime/runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "fuzz_conf_parse: %s: ", #cond);                        \
      fprintf(stderr, __VA_ARGS__);                                           \
      fputc('\n', stderr);                                                    \
      abort();                                                                \
    }                                                                         \
  } while (0)

/* The scalar settings of a conf (everything but the raw string). */
static void scalars(const msnap_conf_t *c, msnap_conf_t *out) {
  *out = *c;
  out->raw = NULL;
}

static bool same_settings(const msnap_conf_t *a, const msnap_conf_t *b) {
  msnap_conf_t x, y;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  scalars(a, &x);
  scalars(b, &y);
  /* Field by field: padding is not part of the settings. */
  bool same = x.max_split_size == y.max_split_size &&
              x.max_non_split_rounding_size == y.max_non_split_rounding_size &&
              x.large_segment_size == y.large_segment_size &&
              x.garbage_collection_threshold ==
                  y.garbage_collection_threshold &&
              x.expandable_segments == y.expandable_segments &&
              x.release_lock_on_malloc == y.release_lock_on_malloc &&
              x.per_process_memory_fraction == y.per_process_memory_fraction &&
              x.throw_on_malloc_oom == y.throw_on_malloc_oom &&
              x.page_size_1g == y.page_size_1g &&
              x.base_addr_aligned_kb == y.base_addr_aligned_kb &&
              x.segment_size_mb == y.segment_size_mb;
  for (int i = 0; i < MSNAP_ROUNDUP_INTERVALS; i++)
    same = same && x.roundup_power2_divisions[i] ==
                       y.roundup_power2_divisions[i];
  return same;
}

static void check_ranges(const msnap_conf_t *c, const char *text) {
  FZ_CHECK(c->garbage_collection_threshold >= 0.0 &&
               c->garbage_collection_threshold < 1.0,
           "garbage_collection_threshold %g out of [0,1) after \"%s\"",
           c->garbage_collection_threshold, text);
  FZ_CHECK(c->per_process_memory_fraction >= 0.0 &&
               c->per_process_memory_fraction <= 1.0,
           "per_process_memory_fraction %g out of [0,1] after \"%s\"",
           c->per_process_memory_fraction, text);
  for (int i = 0; i < MSNAP_ROUNDUP_INTERVALS; i++) {
    uint64_t d = c->roundup_power2_divisions[i];
    FZ_CHECK((d & (d - 1)) == 0,
             "roundup_power2_divisions[%d] = %llu is not a power of two "
             "after \"%s\"",
             i, (unsigned long long)d, text);
  }
  FZ_CHECK(c->raw != NULL, "raw conf string is NULL after \"%s\"", text);
  char msg[256] = "";
  FZ_CHECK(msnap__conf_check(c, msg, sizeof msg) == 0,
           "conf check after \"%s\": %s", text, msg);
}

static void one_profile(msnap_profile_t profile, const char *text) {
  msnap_conf_t c, before;
  char err[256];
  msnap__conf_init(&c, profile);
  memcpy(&before, &c, sizeof c);
  memset(err, 'x', sizeof err);
  int rc = msnap__conf_parse(&c, text, err, sizeof err);
  FZ_CHECK(rc == 0 || rc == MSNAP_ECONF, "rc %d (%s) for \"%s\"", rc,
           msnap_err_name(rc), text);
  if (rc == MSNAP_ECONF) {
    FZ_CHECK(memchr(err, '\0', sizeof err) != NULL,
             "error message not NUL-terminated for \"%s\"", text);
    FZ_CHECK(err[0] != '\0', "empty error message for \"%s\"", text);
    FZ_CHECK(memcmp(&before, &c, sizeof c) == 0,
             "conf changed by a failed parse of \"%s\" (%s)", text, err);
  } else {
    check_ranges(&c, text);
    /* The parser is a function of (defaults, text): no hidden state. */
    msnap_conf_t again;
    msnap__conf_init(&again, profile);
    rc = msnap__conf_parse(&again, text, err, sizeof err);
    FZ_CHECK(rc == 0, "second parse of \"%s\" failed: %s", text, err);
    FZ_CHECK(same_settings(&c, &again),
             "two parses of \"%s\" disagree", text);
    msnap__conf_destroy(&again);
  }
  /* The run-time parser on top of the current settings. */
  memcpy(&before, &c, sizeof c);
  rc = msnap__conf_parse_runtime(&c, text, err, sizeof err);
  FZ_CHECK(rc == 0 || rc == MSNAP_ECONF, "runtime parse rc %d (%s) for "
           "\"%s\"", rc, msnap_err_name(rc), text);
  if (rc == 0)
    check_ranges(&c, text);
  else
    FZ_CHECK(memcmp(&before, &c, sizeof c) == 0 && err[0] != '\0',
             "failed runtime parse of \"%s\" changed the conf or gave no "
             "message", text);
  msnap__conf_destroy(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096)
    return 0;
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  one_profile(MSNAP_PROFILE_CUDA, text);
  one_profile(MSNAP_PROFILE_NPU, text);
  free(text);
  return 0;
}
