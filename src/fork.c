/*
 * fork.c -- fork safety: pthread_atfork handlers for every allocator.
 *
 * A process may fork while other threads hold memsnap locks (an allocating
 * thread holds its device lock, a dumping thread the stack table...).  The
 * child has only the forking thread, so such a lock would stay held
 * forever and the child would hang on its first allocation.  The prepare
 * handler therefore takes every memsnap lock, in an order that extends
 * every "held while taking" relation of the library (docs/design.md,
 * Locks):
 *
 *   1. the registry lock (this file) and oom_dump_lock;
 *   2. per registered allocator: device locks 0..n-1, raw_lock, the
 *      workspace lock, the pinned host lock, the recorder lock;
 *   3. unwind_lock, sym_lock, the stack table lock;
 *   4. the creation locks of the recorder, workspace and host states,
 *      clock_lock;
 *   5. per allocator on the sim runtime: the sim context lock;
 *   6. the environment warn-once lock.
 *
 * Locks of groups 3-6 are leaves or inner to the earlier groups; no lock
 * of one allocator is ever taken while holding another allocator's.  The
 * parent and child handlers release them all in reverse order, so both see
 * a consistent state.
 *
 * Then, as PyTorch does for CUDA ("bad fork", torch/cuda/__init__.py
 * _after_fork), an allocator on a real device runtime (anything but the
 * sim) is marked in the child: the device context belongs to the parent,
 * so every call that would reach the runtime fails with MSNAP_ESTATE and
 * the advice to use the 'spawn' start method; msnap_free of an inherited
 * allocation is a silent no-op (as torch frees a block in the child
 * without a device call); statistics and snapshots of the inherited state
 * keep working.  On the sim runtime the child simply goes on with its
 * copy (host-backed memory is copied on write by the kernel).
 *
 * Invariants: the registry holds exactly the allocators created and not
 * yet destroyed, each once; `bad_fork` is set only in a forked child and
 * only for non-sim runtimes.
 */
#include <stdio.h>
#include <unistd.h>

#include "alloc_core.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static msnap_allocator_t *reg_head; /* reg_lock; linked through fork_next */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static bool is_sim(const msnap_allocator_t *a) {
  return a->rt == msnap_runtime_sim();
}

/* Group 2 of one allocator; release in reverse order. */
static void alloc_locks(msnap_allocator_t *a, int phase) {
  if (phase == MSNAP_FORK_PREPARE) {
    for (int i = 0; i < a->ndevices; i++) msnap__lock(&a->devices[i].lock);
    pthread_mutex_lock(&a->raw_lock);
    msnap__workspace_atfork(a, phase);
    msnap__host_atfork(a, phase);
    msnap__history_atfork(a, phase);
  } else {
    msnap__history_atfork(a, phase);
    msnap__host_atfork(a, phase);
    msnap__workspace_atfork(a, phase);
    pthread_mutex_unlock(&a->raw_lock);
    for (int i = a->ndevices - 1; i >= 0; i--)
      msnap__unlock(&a->devices[i].lock);
  }
}

static void prepare(void) {
  pthread_mutex_lock(&reg_lock);
  msnap__oom_atfork(MSNAP_FORK_PREPARE);
  for (msnap_allocator_t *a = reg_head; a != NULL; a = a->fork_next)
    alloc_locks(a, MSNAP_FORK_PREPARE);
  msnap__stack_atfork(MSNAP_FORK_PREPARE);
  msnap__history_atfork(NULL, MSNAP_FORK_PREPARE);
  msnap__workspace_atfork(NULL, MSNAP_FORK_PREPARE);
  msnap__host_atfork(NULL, MSNAP_FORK_PREPARE);
  msnap__clock_atfork(MSNAP_FORK_PREPARE);
  for (msnap_allocator_t *a = reg_head; a != NULL; a = a->fork_next)
    if (is_sim(a)) msnap__sim_atfork(a->rt_ctx, MSNAP_FORK_PREPARE);
  msnap__env_atfork(MSNAP_FORK_PREPARE);
}

static void release(int phase) {
  msnap__env_atfork(phase);
  for (msnap_allocator_t *a = reg_head; a != NULL; a = a->fork_next)
    if (is_sim(a)) msnap__sim_atfork(a->rt_ctx, phase);
  msnap__clock_atfork(phase);
  msnap__host_atfork(NULL, phase);
  msnap__workspace_atfork(NULL, phase);
  msnap__history_atfork(NULL, phase);
  msnap__stack_atfork(phase);
  for (msnap_allocator_t *a = reg_head; a != NULL; a = a->fork_next) {
    alloc_locks(a, phase);
    if (phase == MSNAP_FORK_CHILD && !is_sim(a))
      atomic_store(&a->bad_fork, true);
  }
  msnap__oom_atfork(phase);
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
