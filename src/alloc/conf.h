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
/* expandable_segments_reserve classes kept (more are ignored, with a
 * warning) and the longest class name. */
#define MSNAP_RESERVE_CLASSES 16
#define MSNAP_RESERVE_CLASS_LEN 48
/* A per-segment VA reserve (PyTorch's ExpandableSegmentReserveSpec): a
 * fraction of the device's memory, or GiB (value with a 'G' suffix). */
typedef struct msnap_reserve_spec_s {
  bool is_fraction;
  double value; /* > 0 */
} msnap_reserve_spec_t;
typedef struct msnap_reserve_class_s {
  char name[MSNAP_RESERVE_CLASS_LEN];
  msnap_reserve_spec_t spec;
} msnap_reserve_class_t;
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
  /* pinned host allocator: thresholds in bytes, UINT64_MAX (no limit)
   * by default as AcceleratorAllocatorConfig's SIZE_MAX; the reserve
   * segment 0 = none */
  uint64_t pinned_max_round_threshold; /* pinned_max_round_threshold_mb  */
  uint64_t pinned_max_cached_size;     /* pinned_max_cached_size_mb      */
  uint64_t pinned_reserve_segment_size; /* pinned_reserve_segment_size_mb */
  /* cuda: expandable_segments_reserve (reserve_set: configured) and
   * expandable_segments_reserve_by_class (pytorch#192269). */
  bool reserve_set;
  msnap_reserve_spec_t reserve;
  uint32_t nreserve_classes;
  msnap_reserve_class_t reserve_classes[MSNAP_RESERVE_CLASSES];
  /* set by a caller that only asks whether a string parses (memsnap
   * replay's check of --alloc-conf before the allocator is made): the
   * warnings on stderr for ignored values are left to the real parse */
  bool quiet;
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
/* The VA one expandable segment of a stream tagged `cls` ("" = untagged)
 * reserves on a device of `total` bytes (expandable_segments_reserve_
 * decision + clamp_reserve_bytes): the configured reserve of the class,
 * else the default reserve, capped at the historical total + total / 8;
 * total + total / 8 when none is configured. */
uint64_t msnap__conf_reserve_bytes(const msnap_conf_t *c, const char *cls,
                                   uint64_t total);
/* Invariant checker of a conf: 0, or MSNAP_ESTATE with the violation. */
int msnap__conf_check(const msnap_conf_t *c, char *msg, size_t msg_len);

#endif /* MSNAP_CONF_H */
