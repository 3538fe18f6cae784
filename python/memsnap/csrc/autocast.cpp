// autocast.cpp -- torch.autocast on the memsnap device.
//
// torch.autocast(<name>) turns on the AutocastPrivateUse1 dispatch key; a
// backend must give that key a kernel for every operator, or every
// operator inside the region fails ("Could not run 'aten::linear' with
// arguments from the 'Autocast<name>' backend").  register_autocast()
// does what PyTorch does for AutocastCUDA / AutocastXPU
// (aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, Autocast, m)),
// with PyTorch's own op lists and wrappers from ATen/autocast_mode.h:
//
//   - a fallthrough for every operator (no cast);
//   - AT_FORALL_LOWER_PRECISION_FP: matmuls, linear, convolutions,
//     scaled_dot_product_attention run in the autocast dtype
//     (torch.get_autocast_dtype(<name>), bf16 or fp16);
//   - AT_FORALL_FP32 / AT_FORALL_FP32_SET_OPT_DTYPE and the norm overloads:
//     softmax, log_softmax, layer_norm, the losses, exp/log, sum... in fp32;
//   - AT_FORALL_PROMOTE: the widest input type (addcmul, index_put...).
//
// The kernels only cast and redispatch below the autocast key, so the
// computation is the device's (docs/python.md); torch's CPU autocast
// gives the same dtypes for the ops both lists share.
#include "shim.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace memsnap_torch {

void register_autocast() {
  static torch::Library fallthrough(torch::Library::IMPL, "_",
                                    c10::DispatchKey::AutocastPrivateUse1,
                                    __FILE__, __LINE__);
  fallthrough.fallback(torch::CppFunction::makeFallthrough());

  static torch::Library m(torch::Library::IMPL, "aten",
                          c10::DispatchKey::AutocastPrivateUse1, __FILE__,
                          __LINE__);
  // The signatures in AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE are written
  // for namespace at (where autocast_mode.cpp expands them).
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
#define MSNAP_LOWER_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define MSNAP_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define MSNAP_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define MSNAP_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(MSNAP_LOWER_PRECISION_FP)
  AT_FORALL_FP32(MSNAP_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(MSNAP_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(MSNAP_PROMOTE)
#undef MSNAP_LOWER_PRECISION_FP
#undef MSNAP_FP32
#undef MSNAP_FP32_SET_OPT_DTYPE
#undef MSNAP_PROMOTE
}

} // namespace memsnap_torch
