/*
 * workload.h -- a deterministic allocator workload that reaches every
 * runtime call site the allocator uses (device malloc/free or VMM
 * map/unmap/reserve/release, event create/record/query/synchronize),
 * tolerating failures: used by the fault-injection tests.  `complete`
 * completes the events recorded on a stream (fake or sim runtime).
 */
#ifndef WORKLOAD_H
#define WORKLOAD_H

#include "talloc.h"

static inline void fi_workload(msnap_allocator_t *a,
                               void (*complete)(uint64_t stream)) {
  static const uint64_t sizes[] = {700,      3 * MiB, 100000, 12 * MiB,
                                   1 * MiB, 25 * MiB, 512,    5 * MiB};
  uint64_t live[8] = {0};
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 8; i++) {
      uint64_t p = 0;
      int rc = msnap_malloc(a, 0, sizes[(i + round) % 8], (uint64_t)(i % 2),
                            &p);
      INV(a);
      if (rc == 0) {
        live[i] = p;
        if (i % 3 == 0)
          (void)msnap_record_stream(a, p, 77);
        if (i % 4 == 2) /* never completed: empty_cache synchronizes */
          (void)msnap_record_stream(a, p, 78);
        INV(a);
      }
    }
    for (int i = 0; i < 8; i += 2) {
      if (live[i]) {
        assert_int_equal(msnap_free(a, live[i]), 0);
        live[i] = 0;
        INV(a);
      }
    }
    complete(77);
    uint64_t p = 0;
    if (msnap_malloc(a, 0, 2048, 1, &p) == 0) {
      INV(a);
      assert_int_equal(msnap_free(a, p), 0);
    }
    INV(a);
    (void)msnap_empty_cache(a, -1);
    INV(a);
    for (int i = 1; i < 8; i += 2) {
      if (live[i]) {
        assert_int_equal(msnap_free(a, live[i]), 0);
        live[i] = 0;
        INV(a);
      }
    }
  }
}

#endif
