/*
 * runtime_acl.c -- the "acl" device runtime (placeholder: the dlopen-based
 * implementation follows).  init reports MSNAP_ENORUNTIME.
 */
#include "msnap_internal.h"

static int acl_init(void **ctx) {
  (void)ctx;
  return msnap__set_error(MSNAP_ENORUNTIME,
                          "acl runtime: libascendcl.so could not be loaded (not "
                          "implemented yet; set MEMSNAP_ACL_LIBRARY to its path)");
}

static void acl_fini(void *ctx) { (void)ctx; }

static const msnap_runtime_ops_t acl_ops = {
    .name = "acl",
    .init = acl_init,
    .fini = acl_fini,
};

const msnap_runtime_ops_t *msnap_runtime_acl(void) { return &acl_ops; }
