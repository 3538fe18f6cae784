/*
 * conf.c -- the allocator configuration (PYTORCH_{CUDA,NPU}_ALLOC_CONF).
 *
 * Invariants of msnap_conf_t:
 *   - raw is never NULL: it is the static "" or a heap copy of the last
 *     applied string (owned by the struct, freed by msnap__conf_destroy).
 *   - max_non_split_rounding_size >= large_segment_size after init and
 *     after every successful parse unless max_non_split_rounding_mb says
 *     otherwise (it is validated >= large_segment_size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msnap_internal.h"

#define MiB ((uint64_t)1 << 20)

static char empty_raw[1];

void msnap__conf_init(msnap_conf_t *c, msnap_profile_t profile) {
  memset(c, 0, sizeof *c);
  c->profile = profile;
  c->raw = empty_raw;
  c->max_split_size = SIZE_MAX;
  c->large_segment_size = 20 * MiB;
  c->max_non_split_rounding_size = 20 * MiB;
  c->garbage_collection_threshold = 0.0;
  c->per_process_memory_fraction = 1.0;
  c->base_addr_aligned_kb = 16;
  c->segment_size_mb = 0;
}

void msnap__conf_destroy(msnap_conf_t *c) {
  if (c->raw != NULL && c->raw != empty_raw) free(c->raw);
  c->raw = empty_raw;
}

int msnap__conf_parse(msnap_conf_t *c, const char *s, char *err,
                      size_t errlen) {
  if (s == NULL || *s == '\0') return 0;
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "alloc conf: parser not implemented yet in \"%s\"",
             s);
  (void)c;
  return MSNAP_ECONF;
}

int msnap__conf_from_env(msnap_profile_t profile, const char **out,
                         char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  if (profile == MSNAP_PROFILE_CUDA) {
    const char *v = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (v == NULL) v = getenv("PYTORCH_ALLOC_CONF");
    *out = v;
    return 0;
  }
  *out = getenv("PYTORCH_NPU_ALLOC_CONF");
  if (*out == NULL) *out = getenv("PYTORCH_ALLOC_CONF");
  return 0;
}
