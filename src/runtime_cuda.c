/*
 * runtime_cuda.c -- the "cuda" device runtime (placeholder: the dlopen-based
 * implementation follows).  init reports MSNAP_ENORUNTIME.
 */
#include "msnap_internal.h"

static int cuda_init(void **ctx) {
  (void)ctx;
  return msnap__set_error(MSNAP_ENORUNTIME,
                          "cuda runtime: libcudart.so could not be loaded (not "
                          "implemented yet; set MEMSNAP_CUDA_LIBRARY to its path)");
}

static void cuda_fini(void *ctx) { (void)ctx; }

static const msnap_runtime_ops_t cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
};

const msnap_runtime_ops_t *msnap_runtime_cuda(void) { return &cuda_ops; }
