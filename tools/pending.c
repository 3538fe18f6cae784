/*
 * pending.c -- TEMPORARY weak fallbacks for core functions the CLI calls
 * that other branches are still writing (reader/writer on `pickle`,
 * allocator on `alloc`, runtime on `runtime`, recorder on `recorder`).
 * Each one answers MSNAP_ENOTSUP (or "absent").  A real definition in the
 * core library is strong and replaces the fallback at link time, so this
 * file changes nothing once the pieces are merged; delete it when main
 * defines every function below.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "msnap_internal.h"

#define WEAK __attribute__((weak))

WEAK const char *msnap_strerror(int err) {
  (void)err;
  return "error (error table not built yet)";
}
WEAK const char *msnap_err_name(int err) {
  (void)err;
  return "MSNAP_E?";
}
WEAK const char *msnap_action_name(int action) {
  static const char *names[] = {
#define X_(n, s) s,
      MSNAP_ACTION_MAP(X_)
#undef X_
  };
  if (action < 0 || action >= MSNAP_ACTION_COUNT)
    return NULL;
  return names[action];
}
WEAK const char *msnap_last_error(void) { return ""; }

WEAK int msnap__snap_read_file(const char *path, msnap_snap_t **out,
                               msnap_read_error_t *err) {
  (void)path;
  (void)out;
  snprintf(err->msg, sizeof err->msg,
           "the snapshot reader is not in this build yet");
  return MSNAP_ENOTSUP;
}
WEAK void msnap__snap_free(msnap_snap_t *s) { (void)s; }
WEAK const char *msnap__snap_str(const msnap_snap_t *s, msnap_str_t id,
                                 size_t *len) {
  (void)s;
  (void)id;
  if (len)
    *len = 0;
  return "";
}
WEAK int msnap__snap_check_model(const msnap_snap_t *s, char *msg,
                                 size_t len) {
  (void)s;
  (void)msg;
  (void)len;
  return 0;
}
WEAK int msnap__snap_write_file(const msnap_snap_t *s, const char *path,
                                bool json) {
  (void)s;
  (void)path;
  (void)json;
  return MSNAP_ENOTSUP;
}
WEAK int msnap__snapshot_take(msnap_allocator_t *a,
                              const msnap_snapshot_options_t *o,
                              msnap_snap_t **out) {
  (void)a;
  (void)o;
  (void)out;
  return MSNAP_ENOTSUP;
}

WEAK void msnap_options_init(msnap_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_OPTIONS_VERSION;
  o->profile = -1;
  o->caching_disabled = -1;
}
WEAK int msnap_allocator_create(const msnap_options_t *o,
                                msnap_allocator_t **out) {
  (void)o;
  (void)out;
  return MSNAP_ENOTSUP;
}
WEAK void msnap_allocator_destroy(msnap_allocator_t *a) { (void)a; }
WEAK void *msnap_runtime_ctx(msnap_allocator_t *a) {
  (void)a;
  return NULL;
}
WEAK int msnap_malloc(msnap_allocator_t *a, int device, size_t size,
                      uint64_t stream, uint64_t *ptr) {
  (void)a, (void)device, (void)size, (void)stream, (void)ptr;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_free(msnap_allocator_t *a, uint64_t ptr) {
  (void)a, (void)ptr;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_empty_cache(msnap_allocator_t *a, int device) {
  (void)a, (void)device;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_allocation_size(msnap_allocator_t *a, uint64_t ptr,
                               size_t *size) {
  (void)a, (void)ptr, (void)size;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_stats_get(msnap_allocator_t *a, int device,
                         msnap_stats_t *out) {
  (void)a, (void)device, (void)out;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_reset_peak_stats(msnap_allocator_t *a, int device) {
  (void)a, (void)device;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_check_invariants(msnap_allocator_t *a, char *msg,
                                size_t msg_len) {
  (void)a, (void)msg, (void)msg_len;
  return 0;
}
WEAK void msnap_sim_set_next_address(void *ctx, int device,
                                     uint64_t address) {
  (void)ctx, (void)device, (void)address;
}
WEAK void msnap_history_options_init(msnap_history_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_HISTORY_OPTIONS_VERSION;
  o->enabled = true;
  o->context = MSNAP_CONTEXT_ALL;
  o->stacks = MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP;
  o->max_entries = UINT64_MAX;
  o->record_device = true;
}
WEAK int msnap_record_history(msnap_allocator_t *a,
                              const msnap_history_options_t *o) {
  (void)a, (void)o;
  return MSNAP_ENOTSUP;
}
WEAK void msnap_snapshot_options_init(msnap_snapshot_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_SNAPSHOT_OPTIONS_VERSION;
  o->device = -1;
  o->include_traces = true;
}
WEAK int msnap_dump_snapshot(msnap_allocator_t *a,
                             const msnap_snapshot_options_t *o,
                             const char *path) {
  (void)a, (void)o, (void)path;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_record_annotation(msnap_allocator_t *a, int device,
                                 const char *name, bool is_start) {
  (void)a, (void)device, (void)name, (void)is_start;
  return MSNAP_ENOTSUP;
}
WEAK msnap_str_t msnap__snap_intern(msnap_snap_t *s, const char *p,
                                    size_t len) {
  (void)s, (void)p, (void)len;
  return 0;
}
WEAK int msnap__snap_set_devices(msnap_snap_t *s, uint32_t ndevices) {
  (void)s, (void)ndevices;
  return MSNAP_ENOTSUP;
}
WEAK int msnap_set_frame_hook(const msnap_frame_hook_t *hook) {
  (void)hook;
  return MSNAP_ENOTSUP;
}
