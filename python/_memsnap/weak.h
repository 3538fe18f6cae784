/*
 * weak.h -- every libmemsnap function the extension calls, declared weak.
 *
 * The C core is written in parallel with the extension.  Declaring the
 * functions weak lets the module build and import against a libmemsnap.so
 * that lacks some of them: a missing function has address NULL, and
 * module.c then leaves out the Python functions that need it (their names
 * are listed in _memsnap.MISSING, and the tests skip on them).  With a
 * complete library the declarations change nothing.
 */
#ifndef MSNAP_PY_WEAK_H
#define MSNAP_PY_WEAK_H

#include "memsnap.h"

#define MSNAP_PY_CORE_FUNCS(X)                                                \
  X(msnap_strerror) X(msnap_err_name) X(msnap_free_string)                    \
  X(msnap_options_init) X(msnap_allocator_create) X(msnap_allocator_destroy)  \
  X(msnap_default) X(msnap_default_error) X(msnap_device_count)               \
  X(msnap_profile) X(msnap_runtime) X(msnap_last_error) X(msnap_malloc)       \
  X(msnap_free) X(msnap_record_stream) X(msnap_empty_cache)                   \
  X(msnap_allocation_size) X(msnap_set_allocator_settings)                    \
  X(msnap_allocator_settings) X(msnap_set_memory_fraction)                    \
  X(msnap_get_memory_fraction) X(msnap_set_caching_enabled)                   \
  X(msnap_caching_enabled) X(msnap_mem_get_info) X(msnap_mempool_create)      \
  X(msnap_mempool_release) X(msnap_begin_allocate_to_pool)                    \
  X(msnap_end_allocate_to_pool) X(msnap_mempool_use_count)                    \
  X(msnap_stats_get) X(msnap_reset_peak_stats)                                \
  X(msnap_reset_accumulated_stats) X(msnap_memory_summary)                    \
  X(msnap_check_invariants) X(msnap_history_options_init)                     \
  X(msnap_record_history) X(msnap_history_enabled) X(msnap_action_parse)      \
  X(msnap_set_frame_hook) X(msnap_set_memory_metadata)                        \
  X(msnap_get_memory_metadata) X(msnap_annotate_memory)                       \
  X(msnap_record_annotation) X(msnap_compile_context_push)                    \
  X(msnap_compile_context_pop) X(msnap_allocation_traceback)                  \
  X(msnap_snapshot_options_init) X(msnap_snapshot_pickle)                     \
  X(msnap_dump_snapshot) X(msnap_attach_oom_observer)                         \
  X(msnap_write_usage_report) X(msnap_workspace_malloc)                       \
  X(msnap_workspace_free) X(msnap_runtime_ctx) X(msnap_sim_fail_nth)          \
  X(msnap_sim_live_allocations) X(msnap_host_malloc) X(msnap_host_free)      \
  X(msnap_host_record_stream) X(msnap_host_empty_cache)                       \
  X(msnap_host_stats_get) X(msnap_host_timing_get)                            \
  X(msnap_host_reset_peak_stats) X(msnap_host_reset_accumulated_stats)

#define MSNAP_PY_WEAK_(f) _Pragma(MSNAP_PY_STR_(weak f))
#define MSNAP_PY_STR_(x) #x
MSNAP_PY_CORE_FUNCS(MSNAP_PY_WEAK_)

#endif /* MSNAP_PY_WEAK_H */
