/*
 * view_model.h -- the data of `memsnap view`: one JSON object per input
 * file, pre-aggregated and cut to a byte budget (level of detail), written
 * by view_model.c and drawn by view.js.  The shape is documented at the top
 * of view_model.c.
 */
#ifndef MSNAP_VIEW_MODEL_H
#define MSNAP_VIEW_MODEL_H

#include <stdint.h>

#include "cli.h"

typedef struct vm_opts_s {
  uint64_t budget;    /* at most this many bytes of data per file         */
  uint32_t detail;    /* at most this many bands per timeline and device  */
  const char *step;   /* annotation name of one step (NULL: automatic)     */
  uint64_t overhead;  /* of the budget, bytes of the page around this
                         file's object (its share of the HTML markup)     */
} vm_opts_t;

/* What was kept, for `--json` and the benchmark. */
typedef struct vm_stats_s {
  uint64_t entries;       /* trace entries of every device               */
  uint64_t embedded;      /* of them, in the event lists                  */
  uint64_t allocations;   /* allocations (bands) of every device          */
  uint64_t bands;         /* of them, drawn one by one                    */
  uint64_t ooms, leak_sites;
  uint64_t estimate;      /* bytes of the file's object, as written       */
  char step_why[288];     /* --step NAME gave no steps on a device: why
                             (its first device's; "" otherwise)           */
} vm_stats_t;

/* Write the JSON object of one file (path as shown, model s) to j.  0, or
 * -1 on ENOMEM (the object is then incomplete). */
int vm_write_file(cli_json_t *j, const char *path, const msnap_snap_t *s,
                  const vm_opts_t *o, vm_stats_t *st);

#endif /* MSNAP_VIEW_MODEL_H */
