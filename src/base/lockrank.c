/*
 * lockrank.c -- the lock-rank checker of debug builds (MSNAP_DEBUG >= 1).
 *
 * Each thread keeps the list of the ranked locks it holds, in the order it
 * took them.  Taking lock (rank, sub) is legal only when (rank, sub) is
 * greater than every held lock's (rank, sub) compared as a pair, and when
 * no held lock is in `never_with` of the new one (the host lock is never
 * held together with a device lock, in either order).  A violation calls
 * the test hook with the text, or prints it and aborts: "lock order
 * violation: taking <new> while holding <held>".  Releases may come in any
 * order (the most recent matching entry is dropped).
 *
 * The table of ranks (base.h, msnap_rank_t) is the lock order of
 * docs/design.md.  In builds with MSNAP_DEBUG == 0 the library never calls
 * in here (the calls sit behind `if (msnap_debug_level >= 1)`), so the
 * hot path pays nothing; the functions still exist so that tests link.
 *
 * Invariants: a thread's held list has at most HELD_MAX entries (more is
 * itself reported as a violation: it means a lock was never released);
 * every entry's rank is in [1, MSNAP_RANK_COUNT).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

/* Every device lock at once (msnap_set_allocator_settings), plus a few. */
#define HELD_MAX (MSNAP_SIM_MAX_DEVICES * 2 + 16)

typedef struct held_s {
  uint8_t rank;
  uint32_t sub;
} held_t;

static MSNAP_TLS held_t held[HELD_MAX];
static MSNAP_TLS uint32_t nheld;

static const char *const rank_names[MSNAP_RANK_COUNT] = {
    [MSNAP_RANK_OOM_DUMP] = "OOM dump lock",
    [MSNAP_RANK_DEVICE] = "device lock",
    [MSNAP_RANK_HOST_CREATE] = "host allocator creation lock",
    [MSNAP_RANK_HOST] = "host allocator lock",
    [MSNAP_RANK_WORKSPACE] = "workspace lock",
    [MSNAP_RANK_RAW] = "raw allocation lock",
    [MSNAP_RANK_OBSERVERS] = "OOM observer lock",
    [MSNAP_RANK_ANNOTATIONS] = "annotation ring lock",
    [MSNAP_RANK_RUNTIME] = "sim runtime lock",
    [MSNAP_RANK_STACK_TABLE] = "stack table lock",
    [MSNAP_RANK_UNWIND] = "unwinder lock",
    [MSNAP_RANK_UNWIND_CACHE] = "CFI rule cache lock",
    [MSNAP_RANK_SYMBOLS] = "symbol cache lock",
    [MSNAP_RANK_CLOCK] = "clock lock",
    [MSNAP_RANK_ENV] = "environment warning lock",
};

/* Pairs that are never held together, whatever the order. */
static bool never_together(unsigned x, unsigned y) {
  return (x == MSNAP_RANK_HOST && y == MSNAP_RANK_DEVICE) ||
         (x == MSNAP_RANK_DEVICE && y == MSNAP_RANK_HOST);
}

static void (*_Atomic violation_hook)(const char *msg);

const char *msnap__rank_name(msnap_rank_t rank) {
  if ((unsigned)rank >= MSNAP_RANK_COUNT || rank_names[rank] == NULL)
    return "unknown lock";
  return rank_names[rank];
}

void msnap__rank_set_hook(void (*hook)(const char *msg)) {
  atomic_store(&violation_hook, hook);
}

static void violation(const char *msg) {
  void (*hook)(const char *) = atomic_load(&violation_hook);
  if (hook != NULL) {
    hook(msg);
    return;
  }
  fprintf(stderr, "memsnap: %s\n", msg);
  abort();
}

static void describe(char *buf, size_t len, unsigned rank, uint32_t sub) {
  if (rank == MSNAP_RANK_DEVICE)
    snprintf(buf, len, "%s %u", msnap__rank_name(rank), (unsigned)sub);
  else
    snprintf(buf, len, "%s", msnap__rank_name(rank));
}

void msnap__rank_acquire(msnap_rank_t rank, uint32_t sub) {
  for (uint32_t i = 0; i < nheld; i++) {
    unsigned hr = held[i].rank;
    bool bad = never_together(hr, rank) || hr > (unsigned)rank ||
               (hr == (unsigned)rank && held[i].sub >= sub);
    if (bad) {
      char a[64], b[64], msg[256];
      describe(a, sizeof a, rank, sub);
      describe(b, sizeof b, hr, held[i].sub);
      snprintf(msg, sizeof msg,
               "lock order violation: taking the %s while holding the %s "
               "(order: docs/design.md, Locks)", a, b);
      violation(msg);
      break;
    }
  }
  if (nheld == HELD_MAX) {
    violation("lock order violation: too many locks held by one thread "
              "(a lock was not released)");
    return;
  }
  held[nheld++] = (held_t){(uint8_t)rank, sub};
}

void msnap__rank_release(msnap_rank_t rank, uint32_t sub) {
  for (uint32_t i = nheld; i-- > 0;) {
    if (held[i].rank == (uint8_t)rank && held[i].sub == sub) {
      for (uint32_t k = i + 1; k < nheld; k++) held[k - 1] = held[k];
      nheld--;
      return;
    }
  }
  char a[64], msg[160];
  describe(a, sizeof a, rank, sub);
  snprintf(msg, sizeof msg, "lock order violation: releasing the %s, "
           "which this thread does not hold", a);
  violation(msg);
}

bool msnap__rank_held(msnap_rank_t rank, uint32_t sub) {
  for (uint32_t i = 0; i < nheld; i++)
    if (held[i].rank == (uint8_t)rank &&
        (sub == UINT32_MAX || held[i].sub == sub))
      return true;
  return false;
}
