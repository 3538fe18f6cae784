/*
 * fake_rt.h -- a deterministic device runtime for the allocator tests.
 *
 * Device malloc hands out increasing addresses (a bump pointer aligned to
 * 2 MiB per device, never reused), so "S1 < S2" in the worked examples
 * holds; VMM reservations come from a separate increasing range.  Events
 * complete at once unless manual mode is on.  fake_fail_nth() makes the
 * nth call of a named site fail with a chosen code.  fake_live() counts
 * live allocations, reservations, mapped handles and events.
 */
#ifndef FAKE_RT_H
#define FAKE_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "memsnap.h"

typedef struct fake_cfg_s {
  int devices;         /* default 1            */
  uint64_t total;      /* default 64 GiB       */
  bool no_vmm;         /* hide the VMM ops     */
  /* What soc_name / cann_version report (NULL: the op is absent, as on a
   * runtime that cannot tell). */
  const char *soc_name, *cann_version;
} fake_cfg_t;

/* Reset the fake (before creating an allocator) and return its ops. */
const msnap_runtime_ops_t *fake_rt(const fake_cfg_t *cfg);
void fake_set_manual_events(bool manual);
/* Complete every event recorded so far on `stream`. */
void fake_complete_events(uint64_t stream);
/* The nth call (1 = next) of `call` ("malloc", "free", "event_create",
 * "event_record", "event_query", "event_synchronize", "vmm_reserve",
 * "vmm_map", "vmm_unmap", "vmm_release", NULL = any) returns `code`. */
void fake_fail_nth(const char *call, uint64_t nth, int code);
uint64_t fake_live(void);
/* Number of calls to a site so far. */
uint64_t fake_calls(const char *call);
/* Base address the next device malloc on device 0 would return. */
uint64_t fake_next_address(int device);
/* Device bytes in use (malloc + mapped). */
uint64_t fake_used(int device);

#endif
