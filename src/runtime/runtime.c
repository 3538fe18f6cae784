/*
 * runtime.c -- choosing a device runtime by name.
 *
 * Each runtime file exports one getter returning its static const ops
 * table; this file maps the names users write (MEMSNAP_RUNTIME, the
 * runtime_name option) to those getters.  "npu" and "ascend" are accepted
 * as aliases of "acl".
 */
#include <strings.h>

#include "runtime/runtime.h"

const msnap_runtime_ops_t *msnap_runtime_by_name(const char *name) {
  if (name == NULL) return NULL;
  if (strcasecmp(name, "sim") == 0) return msnap_runtime_sim();
  if (strcasecmp(name, "acl") == 0 || strcasecmp(name, "npu") == 0 ||
      strcasecmp(name, "ascend") == 0)
    return msnap_runtime_acl();
  if (strcasecmp(name, "cuda") == 0) return msnap_runtime_cuda();
  return NULL;
}
