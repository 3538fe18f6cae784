/*
 * create.c -- allocator creation (msnap__allocator_new; the public
 * msnap_allocator_create is the api layer's, which adds the OOM
 * auto-dump) and destruction (msnap_allocator_destroy).
 *
 * Creation order: runtime (options or MEMSNAP_RUNTIME, "sim" by default;
 * explicit sim sizes go through msnap__sim_create), profile (options, else
 * MEMSNAP_PROFILE, else the runtime's own: msnap__runtime_profile), conf
 * defaults then the alloc-conf string (options or
 * the profile's environment variables), caching switch, runtime init, one
 * msnap_device_t per device (fraction seeded from the conf, max_split_size
 * stat frozen, an empty trace ring), history off, the workspace allocator.
 * Destruction returns every segment, mapping, reservation, event, raw
 * allocation and workspace buffer to the runtime, live allocations
 * included, and releases the library-owned OOM observers.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_core.h"
#include "alloc/host.h"

void msnap_options_init(msnap_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->version = MSNAP_OPTIONS_VERSION;
  o->profile = -1;
  o->caching_disabled = -1;
  o->sim_host_backed = -1;
}

static int device_init(msnap_allocator_t *a, msnap_device_t *d, int id) {
  memset(d, 0, sizeof *d);
  msnap__lock_init(&d->lock, (uint32_t)id);
  msnap__ring_init(&d->ring);
  d->id = id;
  d->a = a;
  d->stats.size = sizeof d->stats;
  d->stats.version = MSNAP_STATS_VERSION;
  d->stats.max_split_size = (int64_t)a->conf.max_split_size;
  msnap__bpool_init(&d->large, false, NULL);
  msnap__bpool_init(&d->small, true, NULL);
  size_t f = 0, t = 0;
  if (a->rt->mem_get_info(a->rt_ctx, id, &f, &t) == 0)
    d->device_total = t;
  msnap__set_fraction_locked(d, a->conf.per_process_memory_fraction);
  return 0;
}

static void errbuf(const msnap_options_t *o, const char *msg) {
  if (o && o->error_buf && o->error_buf_len > 0)
    snprintf(o->error_buf, o->error_buf_len, "%s", msg);
}

/*
 * The profile of an allocator created without one (no option, no
 * MEMSNAP_PROFILE): the runtime's own.  acl runs torch_npu's allocator
 * (npu); cuda runs PyTorch's (cuda); the sim stands for a device without
 * saying whose, and takes PyTorch's (cuda): the upstream allocator is the
 * reference every recording in circulation and torch.cuda.memory follow,
 * so a script tried on a laptop behaves as `torch.cuda` does.  NPU users
 * on the sim say MEMSNAP_PROFILE=npu (or configure(profile="npu")).
 * A runtime table of another name (a test fake) counts as its name says:
 * "acl"/"npu"/"ascend" npu, anything else cuda.
 */
msnap_profile_t msnap__runtime_profile(const msnap_runtime_ops_t *rt) {
  const char *n = rt && rt->name ? rt->name : "sim";
  if (!strcmp(n, "acl") || !strcmp(n, "npu") || !strcmp(n, "ascend"))
    return MSNAP_PROFILE_NPU;
  return MSNAP_PROFILE_CUDA;
}

int msnap__allocator_new(const msnap_options_t *opts,
                         msnap_allocator_t **out) {
  msnap_options_t defaults;
  const msnap_options_t *o = opts;
  char err[512] = "";
  if (!out)
    return msnap__set_error(MSNAP_EINVAL, "msnap_allocator_create: NULL out");
  if (!o) {
    msnap_options_init(&defaults);
    o = &defaults;
  }
  /* the fields every version has end at sim_host_backed (newer fields are
   * read only when `size` covers them) */
  if (o->size < offsetof(msnap_options_t, sim_host_backed) ||
      o->version != MSNAP_OPTIONS_VERSION)
    return msnap__set_error(MSNAP_EINVAL,
                            "allocator_create: options size %u / version %u "
                            "not supported (use msnap_options_init)",
                            o->size, o->version);
  /* a memory size out of the sim's range is an error, never a rounded
   * value (as MEMSNAP_SIM_MEMORY: README); more devices than the sim has
   * are its MSNAP_SIM_MAX_DEVICES */
  if (o->sim_devices < 0 ||
      (o->sim_memory != 0 && (o->sim_memory < MSNAP_SIM_MIN_MEMORY ||
                              o->sim_memory > MSNAP_SIM_MAX_MEMORY)) ||
      o->caching_disabled < -1 || o->caching_disabled > 1) {
    snprintf(err, sizeof err,
             "options out of range: sim_devices %d (0 or more), sim_memory "
             "%" PRIu64 " (0 or %" PRIu64 "..%" PRIu64 "), "
             "caching_disabled %d (-1, 0 or 1)",
             o->sim_devices, o->sim_memory, (uint64_t)MSNAP_SIM_MIN_MEMORY,
             (uint64_t)MSNAP_SIM_MAX_MEMORY, o->caching_disabled);
    errbuf(o, err);
    return msnap__set_error(MSNAP_EINVAL, "%s", err);
  }
  const msnap_runtime_ops_t *rt = o->runtime;
  const char *rt_name = NULL;
  if (!rt) {
    rt_name = o->runtime_name ? o->runtime_name : msnap__env_runtime();
    if (!rt_name)
      rt_name = "sim";
    rt = msnap_runtime_by_name(rt_name);
    if (!rt) {
      snprintf(err, sizeof err, "unknown device runtime '%s'", rt_name);
      errbuf(o, err);
      return msnap__set_error(MSNAP_EINVAL, "%s", err);
    }
  }
  msnap_profile_t profile;
  if (o->profile >= 0) {
    if (o->profile != MSNAP_PROFILE_NPU && o->profile != MSNAP_PROFILE_CUDA) {
      snprintf(err, sizeof err, "invalid profile %d (0 = npu, 1 = cuda)",
               o->profile);
      errbuf(o, err);
      return msnap__set_error(MSNAP_EINVAL, "%s", err);
    }
    profile = (msnap_profile_t)o->profile;
  } else {
    int rc = msnap__env_profile(&profile, msnap__runtime_profile(rt));
    if (rc != 0) {
      snprintf(err, sizeof err, "%s", msnap_last_error());
      errbuf(o, err);
      return rc;
    }
  }
  msnap_allocator_t *a = calloc(1, sizeof *a);
  if (!a)
    return msnap__set_error(MSNAP_ENOMEM, "out of host memory");
  a->profile = profile;
  a->rt = rt;
  a->next_mempool_id = 1;
  pthread_mutex_init(&a->raw_lock, NULL);
  pthread_mutex_init(&a->obs_lock, NULL);
  msnap__hsettings_init(&a->hist);
  msnap__hsettings_init(&a->host_hist);
  atomic_init(&a->hist_max_entries, 0);
  msnap__ann_init(&a->ann);
  msnap__conf_init(&a->conf, profile);

  const char *conf_str = o->alloc_conf;
  int rc = 0;
  if (!conf_str) {
    rc = msnap__conf_from_env(profile, &conf_str, err, sizeof err);
    if (rc != 0)
      goto fail_conf;
  }
  if (conf_str) {
    rc = msnap__conf_parse(&a->conf, conf_str, err, sizeof err);
    if (rc != 0)
      goto fail_conf;
  }
  bool no_cache = o->caching_disabled >= 0 ? o->caching_disabled != 0
                                           : msnap__env_no_caching(profile);
  atomic_init(&a->caching_enabled, !no_cache);

  /* Options of older callers end before sim_host_backed: from the env. */
  int host_backed = o->size >= offsetof(msnap_options_t, sim_host_backed) +
                                   sizeof o->sim_host_backed
                        ? o->sim_host_backed
                        : -1;
  if (rt == msnap_runtime_sim() &&
      (o->sim_devices > 0 || o->sim_memory > 0 || host_backed >= 0))
    rc = msnap__sim_create_ex(
        o->sim_devices > 0
            ? o->sim_devices
            : (int)msnap__env_count(MSNAP_ENV_SIM_DEVICES, 1, 1,
                                    MSNAP_SIM_MAX_DEVICES),
        o->sim_memory > 0
            ? o->sim_memory
            : msnap__env_size_range(MSNAP_ENV_SIM_MEMORY, 64ull << 30,
                                    MSNAP_SIM_MIN_MEMORY,
                                    MSNAP_SIM_MAX_MEMORY),
        host_backed >= 0 ? host_backed != 0
                         : msnap__env_bool(MSNAP_ENV_SIM_HOST_BACKED, false),
        &a->rt_ctx);
  else
    rc = rt->init(&a->rt_ctx);
  if (rc != 0) {
    /* The runtime's own message names the library and the variable that
     * overrides it; keep it. */
    const char *why = msnap_last_error();
    snprintf(err, sizeof err, "device runtime '%s' failed to initialise: %s",
             rt->name ? rt->name : "?",
             why && why[0] ? why : msnap_strerror(rc));
    goto fail_rt;
  }
  int n = 0;
  rc = rt->device_count(a->rt_ctx, &n);
  if (rc != 0 || n <= 0) {
    snprintf(err, sizeof err, "device runtime '%s' reports no device",
             rt->name ? rt->name : "?");
    rc = rc ? rc : MSNAP_ERUNTIME;
    goto fail_init;
  }
  a->devices = calloc((size_t)n, sizeof *a->devices);
  if (!a->devices) {
    rc = MSNAP_ENOMEM;
    snprintf(err, sizeof err, "out of host memory");
    goto fail_init;
  }
  a->ndevices = n;
  a->npu_pad = msnap__npu_pad_from(rt, a->rt_ctx);
  for (int i = 0; i < n; i++)
    device_init(a, &a->devices[i], i);
  rc = msnap__ws_create(a);
  if (rc != 0) {
    for (int i = 0; i < n; i++) msnap__ring_destroy(&a->devices[i].ring);
    free(a->devices);
    snprintf(err, sizeof err, "out of host memory");
    goto fail_init;
  }
  atomic_init(&a->bad_fork, false);
  msnap__fork_register(a);
  *out = a;
  return 0;

fail_init:
  rt->fini(a->rt_ctx);
fail_rt:
fail_conf:
  if (!err[0])
    snprintf(err, sizeof err, "%s", msnap_strerror(rc));
  errbuf(o, err);
  msnap__conf_destroy(&a->conf);
  msnap__ann_destroy(&a->ann);
  pthread_mutex_destroy(&a->obs_lock);
  pthread_mutex_destroy(&a->raw_lock);
  free(a);
  return msnap__set_error(rc, "%s", err);
}

/* Return every segment of d to the runtime and free all host memory. */
static void device_destroy(msnap_allocator_t *a, msnap_device_t *d) {
  msnap__lock(&d->lock);
  /* Wait for outstanding events (their blocks are released below). */
  for (uint32_t i = 0; i < d->nevqs; i++) {
    msnap_evq_t *q = &d->evqs[i];
    for (uint32_t k = 0; k < q->n; k++) {
      uint64_t ev = q->v[(q->head + k) % q->cap].event;
      a->rt->event_synchronize(a->rt_ctx, d->id, ev);
      if (a->rt->event_destroy(a->rt_ctx, d->id, ev) != 0)
        a->rt->event_destroy(a->rt_ctx, d->id, ev);
    }
    free(q->v);
  }
  free(d->evqs);
  for (uint32_t i = 0; i < d->nevent_pool; i++)
    if (a->rt->event_destroy(a->rt_ctx, d->id, d->event_pool[i]) != 0)
      a->rt->event_destroy(a->rt_ctx, d->id, d->event_pool[i]);
  free(d->event_pool);
  while (d->segments) {
    msnap_segment_t *s = d->segments;
    msnap_block_t *b = s->head;
    while (b) {
      msnap_block_t *nx = b->next;
      if (b->stack)
        msnap__stack_unref(b->stack);
      free(b->stream_uses);
      free(b);
      b = nx;
    }
    if (s->expandable) {
      msnap__expandable_teardown(d, s);
    } else if (a->rt->free(a->rt_ctx, d->id, s->base) != 0) {
      a->rt->free(a->rt_ctx, d->id, s->base);
    }
    msnap__segment_delete(d, s);
  }
  while (d->free_objs) {
    msnap_block_t *b = d->free_objs;
    d->free_objs = b->link;
    free(b->stream_uses);
    free(b);
  }
  while (d->ppools) {
    msnap_ppool_t *pp = d->ppools;
    d->ppools = pp->next;
    free(pp);
  }
  free(d->scopes);
  msnap__idset_free(&d->oom_pools);
  free(d->capture_streams);
  free(d->retired);
  free(d->map.buckets);
  msnap__ring_destroy(&d->ring);
  msnap__unlock(&d->lock);
  msnap__lock_destroy(&d->lock);
}

void msnap_allocator_destroy(msnap_allocator_t *a) {
  if (!a)
    return;
  msnap__fork_unregister(a);
  /* A forked child on a real runtime must not touch the parent's device
   * context: nothing is released (the process is a copy). */
  if (atomic_load(&a->bad_fork))
    return;
  msnap__host_destroy(a); /* before the runtime goes */
  msnap__ws_destroy(a);   /* likewise */
  msnap__oom_observers_destroy(a);
  for (int i = 0; i < a->ndevices; i++)
    device_destroy(a, &a->devices[i]);
  msnap__raw_release_all(a);
  free(a->devices);
  a->rt->fini(a->rt_ctx);
  msnap__conf_destroy(&a->conf);
  msnap__ann_destroy(&a->ann);
  pthread_mutex_destroy(&a->obs_lock);
  pthread_mutex_destroy(&a->raw_lock);
  free(a->stream_classes);
  free(a);
}
