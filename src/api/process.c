/*
 * process.c -- who this process is in a distributed job: global rank,
 * world size, local rank, host name and pid, for snapshots (the
 * `process_info` top-level key, api/snapshot.c) and OOM dump names
 * (api/oom_dump.c).
 *
 * Sources, first that knows wins, per field:
 *   1. msnap_set_process_rank() (the Python package calls it with
 *      torch.distributed's get_rank()/get_world_size() once the process
 *      group is initialised);
 *   2. the environment: RANK, WORLD_SIZE, LOCAL_RANK (torchrun, torch's
 *      elastic launcher, and most schedulers set them), read through the
 *      one table of base/env.c on every call.
 * Unknown fields are -1 and are left out of process_info.
 *
 * Invariants: the three stored values are -1 or >= 0 (world size >= 1);
 * a known rank and a known local rank are below a known world size (a
 * node's local ranks are a subset of the job's ranks: torchrun's
 * LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE); each field is an atomic
 * read and written on its own (no lock: a reader racing a writer sees
 * either value of each field).
 */
#include <stdatomic.h>
#include <unistd.h>

#include "api/api.h"

static atomic_int set_rank = -1, set_world = -1, set_local = -1;

int msnap_set_process_rank(int rank, int world_size, int local_rank) {
  if (rank < -1 || world_size < -1 || world_size == 0 || local_rank < -1 ||
      (rank >= 0 && world_size > 0 && rank >= world_size) ||
      (local_rank >= 0 && world_size > 0 && local_rank >= world_size))
    return msnap__set_error(MSNAP_EINVAL,
                            "set_process_rank: invalid rank %d / world size "
                            "%d / local rank %d (-1 = unknown)",
                            rank, world_size, local_rank);
  atomic_store(&set_rank, rank);
  atomic_store(&set_world, world_size);
  atomic_store(&set_local, local_rank);
  return 0;
}

void msnap__process_get(msnap_process_t *p) {
  int r = atomic_load(&set_rank), w = atomic_load(&set_world),
      l = atomic_load(&set_local);
  p->rank = r >= 0 ? r : msnap__env_rank(MSNAP_ENV_RANK);
  p->world_size = w >= 1 ? w : msnap__env_rank(MSNAP_ENV_WORLD_SIZE);
  p->local_rank = l >= 0 ? l : msnap__env_rank(MSNAP_ENV_LOCAL_RANK);
  p->pid = (int64_t)getpid();
  if (gethostname(p->host, sizeof p->host) != 0)
    p->host[0] = 0;
  p->host[sizeof p->host - 1] = 0;
}
