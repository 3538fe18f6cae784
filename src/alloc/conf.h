/*
 * conf.h -- the allocator's configuration (conf.c): PyTorch's and
 * torch_npu's alloc-conf strings (PYTORCH_{CUDA,NPU}_ALLOC_CONF and
 * _set_allocator_settings) parsed into msnap_conf_t.  Invariants:
 * msnap__conf_check (see conf.c).
 */
#ifndef MSNAP_CONF_H
#define MSNAP_CONF_H

#include "base/base.h"

/* ---- conf.c: alloc-conf parsing (PYTORCH_{CUDA,NPU}_ALLOC_CONF) --------- */
#define MSNAP_ROUNDUP_INTERVALS 16
typedef struct msnap_conf_s {
  msnap_profile_t profile;
  char *raw;                          /* last applied string ("" if none) */
  uint64_t max_split_size;            /* SIZE_MAX = unlimited            */
  uint64_t max_non_split_rounding_size;
  uint64_t large_segment_size;        /* default 20 MiB                  */
  double garbage_collection_threshold;
  uint64_t roundup_power2_divisions[MSNAP_ROUNDUP_INTERVALS];
  bool expandable_segments;
  bool release_lock_on_malloc;        /* release_lock_on_{cuda,npu}malloc */
  bool pinned_use_host_register;
  uint64_t pinned_num_register_threads;
  bool pinned_use_background_threads;
  bool graph_capture_record_stream_reuse;
  double per_process_memory_fraction; /* 1.0 default                     */
  bool throw_on_malloc_oom;           /* throw_on_{cuda,npu}malloc_oom   */
  /* npu-only */
  bool page_size_1g;                  /* page_size:1g                    */
  uint64_t base_addr_aligned_kb;      /* default 16                      */
  uint64_t segment_size_mb;           /* 0 = unset                       */
  bool multi_stream_lazy_reclaim;
  bool large_segment_size_set;
  /* pinned host allocator (recorded for allocator_settings; 0 = unset) */
  uint64_t pinned_max_round_threshold; /* pinned_max_round_threshold_mb  */
  uint64_t pinned_max_cached_size;     /* pinned_max_cached_size_mb      */
  uint64_t pinned_reserve_segment_size; /* pinned_reserve_segment_size_mb */
} msnap_conf_t;
/* Defaults of a profile. */
void msnap__conf_init(msnap_conf_t *c, msnap_profile_t profile);
void msnap__conf_destroy(msnap_conf_t *c);
/* Parse `s` into *c with PyTorch's reset semantics (allocator-algorithm
 * §17).  On error returns MSNAP_ECONF, leaves *c unchanged and writes a
 * message naming the offending token into err. */
int msnap__conf_parse(msnap_conf_t *c, const char *s, char *err,
                      size_t errlen);
/* The alloc-conf string from the environment for a profile (NULL if none);
 * MSNAP_ECONF when both NPU variables are set. */
int msnap__conf_from_env(msnap_profile_t profile, const char **out,
                         char *err, size_t errlen);
/* msnap__conf_parse for a run-time change (_set_allocator_settings): in
 * the npu profile only the keys torch_npu accepts at run time are allowed
 * (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
 * release_lock_on_npumalloc, throw_on_npumalloc_oom,
 * per_process_memory_fraction, pinned_max_round_threshold_mb,
 * pinned_max_cached_size_mb); the cuda profile accepts every key. */
int msnap__conf_parse_runtime(msnap_conf_t *c, const char *s, char *err,
                              size_t errlen);
/* roundup_power2_divisions entry for a (>= 512) size: the size class is
 * floor(log2(size)) - 20 clamped to [0, 15] (allocator-algorithm §3.1). */
uint64_t msnap__roundup_divisions(const msnap_conf_t *c, size_t size);
/* Invariant checker of a conf: 0, or MSNAP_ESTATE with the violation. */
int msnap__conf_check(const msnap_conf_t *c, char *msg, size_t msg_len);

#endif /* MSNAP_CONF_H */
