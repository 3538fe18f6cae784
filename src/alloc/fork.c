/*
 * fork.c -- fork safety: pthread_atfork handlers for every allocator.
 *
 * A process may fork while other threads hold memsnap locks (an allocating
 * thread holds its device lock, a dumping thread the stack table...).  The
 * child has only the forking thread, so such a lock would stay held
 * forever and the child would hang on its first allocation.  The prepare
 * handler therefore takes every memsnap lock of the alloc layer and below,
 * rank by rank in the lock order of base.h (msnap_rank_t), each rank for
 * every registered allocator before the next rank:
 *
 *   the registry lock (this file; outermost, never taken elsewhere with
 *   another memsnap lock held), device locks (allocator by allocator,
 *   device 0..n-1), the host creation lock, host locks, workspace locks,
 *   raw-allocation locks, OOM observer locks, annotation ring locks, sim
 *   runtime contexts, the stack table / unwinder choice / CFI rule cache /
 *   symbol locks, the clock lock, the environment warn-once lock.
 *
 * Every other thread takes locks in increasing rank and never holds two
 * allocators' locks at once, so a prepare handler that waits for a lock
 * never waits for a thread that waits for it.  The api layer's OOM dump
 * lock (MSNAP_RANK_OOM_DUMP, outer to all of these) has its own handlers
 * in api/oom_dump.c, registered after these so that pthread_atfork runs
 * its prepare first.  The parent and child handlers release everything in
 * the reverse order.  The locks are taken raw: the rank checker (debug
 * builds) would rightly reject one thread holding them all, which only
 * happens here.
 *
 * Then, as PyTorch does for CUDA ("bad fork", torch/cuda/__init__.py
 * _after_fork; torch_npu likewise), an allocator on a real device runtime
 * (anything but the sim) is marked in the child: the device context
 * belongs to the parent, so every call that would reach the runtime fails
 * with MSNAP_ESTATE and the advice to use the 'spawn' start method;
 * msnap_free of an inherited allocation is a silent no-op (torch frees a
 * block in the child without a device call); statistics and snapshots of
 * the inherited state keep working.  On the sim runtime the child goes on
 * with its copy (host-backed memory is copied on write by the kernel).
 *
 * Invariants: the registry holds exactly the allocators created and not
 * yet destroyed, each once; `bad_fork` is set only in a forked child and
 * only for non-sim runtimes.
 */
#include <stdio.h>
#include <unistd.h>

#include "alloc/alloc_core.h"
#include "record/stack.h"
#include "runtime/runtime.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static msnap_allocator_t *reg_head; /* reg_lock; linked through fork_next */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static bool is_sim(const msnap_allocator_t *a) {
  return a->rt == msnap_runtime_sim();
}

#define EACH(a) \
  for (msnap_allocator_t *a = reg_head; a != NULL; a = a->fork_next)

static void prepare(void) {
  const int ph = MSNAP_FORK_PREPARE;
  pthread_mutex_lock(&reg_lock);
  EACH(a) for (int i = 0; i < a->ndevices; i++)
    msnap__lock_raw(&a->devices[i].lock);
  msnap__host_atfork(NULL, ph);
  EACH(a) msnap__host_atfork(a, ph);
  EACH(a) msnap__workspace_atfork(a, ph);
  EACH(a) msnap__fork_mutex(&a->raw_lock, ph);
  EACH(a) msnap__fork_mutex(&a->obs_lock, ph);
  EACH(a) msnap__fork_mutex(&a->ann.lock, ph);
  EACH(a) if (is_sim(a)) msnap__sim_atfork(a->rt_ctx, ph);
  msnap__stack_atfork(ph);
  msnap__clock_atfork(ph);
  msnap__env_atfork(ph);
}

/* The reverse of prepare.  The registry list is walked forwards for each
 * rank: within one rank the order of release does not matter. */
static void release(int ph) {
  msnap__env_atfork(ph);
  msnap__clock_atfork(ph);
  msnap__stack_atfork(ph);
  EACH(a) if (is_sim(a)) msnap__sim_atfork(a->rt_ctx, ph);
  EACH(a) msnap__fork_mutex(&a->ann.lock, ph);
  EACH(a) msnap__fork_mutex(&a->obs_lock, ph);
  EACH(a) msnap__fork_mutex(&a->raw_lock, ph);
  EACH(a) msnap__workspace_atfork(a, ph);
  EACH(a) msnap__host_atfork(a, ph);
  msnap__host_atfork(NULL, ph);
  EACH(a) {
    for (int i = a->ndevices - 1; i >= 0; i--)
      msnap__unlock_raw(&a->devices[i].lock);
    if (ph == MSNAP_FORK_CHILD && !is_sim(a))
      atomic_store(&a->bad_fork, true);
  }
  pthread_mutex_unlock(&reg_lock);
}

static void parent(void) { release(MSNAP_FORK_PARENT); }
static void child(void) { release(MSNAP_FORK_CHILD); }

static void install(void) { pthread_atfork(prepare, parent, child); }

void msnap__fork_register(msnap_allocator_t *a) {
  pthread_once(&atfork_once, install);
  pthread_mutex_lock(&reg_lock);
  a->fork_next = reg_head;
  reg_head = a;
  pthread_mutex_unlock(&reg_lock);
}

void msnap__fork_unregister(msnap_allocator_t *a) {
  pthread_mutex_lock(&reg_lock);
  for (msnap_allocator_t **p = &reg_head; *p != NULL; p = &(*p)->fork_next) {
    if (*p == a) {
      *p = a->fork_next;
      break;
    }
  }
  pthread_mutex_unlock(&reg_lock);
}

int msnap__fork_check(msnap_allocator_t *a, const char *what) {
  if (msnap_likely(!atomic_load_explicit(&a->bad_fork, memory_order_relaxed)))
    return 0;
  return msnap__set_error(
      MSNAP_ESTATE,
      "%s: cannot use the '%s' device runtime in a forked subprocess (its "
      "device context belongs to the parent process). To use the device "
      "with multiprocessing, you must use the 'spawn' start method",
      what, a->rt->name ? a->rt->name : "?");
}

bool msnap_in_bad_fork(msnap_allocator_t *a) {
  return a != NULL && atomic_load(&a->bad_fork);
}
