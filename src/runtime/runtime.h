/*
 * runtime.h -- the runtime layer's internal interface (runtime.c, sim.c,
 * acl.c, cuda.c).  The runtimes themselves are const ops tables
 * (msnap_runtime_ops_t, public in memsnap.h: msnap_runtime_sim / _acl /
 * _cuda / _by_name); this header adds the sim runtime's test entry points.
 * The runtime layer calls only base.
 */
#ifndef MSNAP_RUNTIME_H
#define MSNAP_RUNTIME_H

#include "base/base.h"

/* ---- sim.c --------------------------------------------------------------- */
/* Host (pinned) memory is also simulated: no host RAM behind it. */
/* Create a sim runtime context with explicit parameters (the ops table's
 * init reads MEMSNAP_SIM_DEVICES / MEMSNAP_SIM_MEMORY instead); devices is
 * clamped to [1, 64], memory to [2 MiB, 256 TiB].  Free with the sim ops
 * table's fini. */
int msnap__sim_create(int devices, uint64_t memory, void **ctx);
/* The same with the host-backed option (real host memory behind device
 * and pinned addresses; see sim.c).  MSNAP_EOOM when the address space
 * cannot be reserved. */
int msnap__sim_create_ex(int devices, uint64_t memory, bool host_backed,
                         void **ctx);
/* Fork safety: the context's lock (alloc/fork.c; ctx NULL or not a sim
 * context: nothing). */
void msnap__sim_atfork(void *ctx, int phase);
/* Invariant checker of a sim context: 0, or MSNAP_ESTATE with the first
 * violation in msg. */
int msnap__sim_check(void *ctx, char *msg, size_t msg_len);

/* ---- acl.c -------------------------------------------------------------- */
/* torch_npu isCannOOM (NPUException.cpp): the text names CANN's OOM
 * ("EL0004" or "Failed to allocate"). */
bool msnap__is_cann_oom_text(const char *text);

#endif /* MSNAP_RUNTIME_H */
