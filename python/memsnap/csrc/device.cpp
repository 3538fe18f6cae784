// device.cpp -- memsnap as a PyTorch device through PrivateUse1.
//
// memsnap.torch.register_device(name) renames PrivateUse1 to `name` and
// calls msnap_torch_device_init(), which registers (once per process):
//
//   - c10::DeviceAllocator for PrivateUse1: allocate() is msnap_malloc
//     on the current device and stream (torch.OutOfMemoryError on OOM),
//     the deleter msnap_free: every tensor, view base, resize and garbage
//     collection goes through memsnap's caching allocator, as a real
//     backend's tensors go through its allocator; its statistics, resets,
//     empty_cache and mem_get_info serve torch.accelerator's memory
//     functions; while torch.profiler records memory, each allocation,
//     free and OOM is reported to it as CUDA's allocator reports them;
//   - at::HostAllocator for PrivateUse1: the pinned host allocator below
//     (torch.accelerator.empty_host_cache, host_memory_stats);
//   - a DeviceGuardImplInterface: MEMSNAP_SIM_DEVICES devices, a
//     thread-local current device and current stream per device (stream
//     ids are memsnap stream handles, 0 = default stream), events that
//     complete when recorded (every operator runs synchronously);
//   - at::PrivateUse1HooksInterface (device count, primary context,
//     storage resize, pointer -> device, pinned host memory: the
//     pinned allocator and isPinnedPtr over memsnap's pinned host
//     caching allocator);
//   - the aten kernels a device must provide: empty.memory_format,
//     empty_strided, _copy_from, _copy_from_and_resize, resize_, view,
//     as_strided, _reshape_alias, unfold (at::native::unfold, a view
//     over as_strided), set_ (3 overloads), _local_scalar_dense,
//     record_stream;
//   - kernels computed on the CPU over the device bytes, their results
//     allocated on the device through memsnap: convolution_overrideable and
//     convolution_backward_overrideable (what at::convolution calls for a
//     PrivateUse1 tensor), native_batch_norm (its running statistics are
//     updated in place, which cpu_fallback cannot do);
//   - a boxed fallback for every other operator: the operators of
//     kCpuOperators run on the CPU through PyTorch's own
//     at::native::cpu_fallback (inputs copied to the CPU, outputs and
//     mutated arguments copied back, so outputs are allocated on the
//     device through memsnap as a device kernel would); any other one
//     raises NotImplementedError "operator aten::X is not implemented for
//     the memsnap device 'npu'".
//   - torch.autocast(<name>): the AutocastPrivateUse1 kernels
//     (autocast.cpp).
//
// The device memory is the host-backed sim runtime's (real host memory at
// the device addresses), which is what makes copies and CPU kernels on
// device tensors possible; init refuses any other runtime.
//
// No state lives here beyond the registrations and the per-thread current
// device/stream; memsnap's allocator checks its own invariants.
#include "shim.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

namespace memsnap_torch {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

// Operators computed on the CPU (over the host-backed device memory) by
// at::native::cpu_fallback: what a small MLP, a small transformer
// (nn.TransformerEncoderLayer, LayerNorm, scaled_dot_product_attention) and
// a small CNN (with the kernels below) need for their forward and backward
// passes, the usual losses, and the SGD / Adam / AdamW updates (their
// foreach forms too), plus common elementwise operators and reductions.
// No view or aliasing operator: cpu_fallback returns copies.  Every overload (including in-place and out= forms) of a
// listed name is computed.  docs/python.md lists them; anything else
// raises NotImplementedError.
const std::unordered_set<std::string>& cpu_operators() {
  static const std::unordered_set<std::string> names = {
      // elementwise arithmetic
      "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::rsub",
      "aten::mul", "aten::mul_", "aten::div", "aten::div_", "aten::neg",
      "aten::neg_", "aten::abs", "aten::abs_", "aten::pow", "aten::pow_",
      "aten::sqrt", "aten::sqrt_", "aten::rsqrt", "aten::exp", "aten::exp_",
      "aten::log", "aten::log_", "aten::reciprocal", "aten::sign",
      "aten::addcmul", "aten::addcmul_", "aten::addcdiv", "aten::addcdiv_",
      "aten::lerp", "aten::lerp_", "aten::clamp", "aten::clamp_",
      "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max",
      "aten::maximum", "aten::minimum", "aten::where",
      "aten::fill_", "aten::zero_", "aten::eq", "aten::ne", "aten::lt",
      "aten::le", "aten::gt", "aten::ge", "aten::isnan", "aten::isfinite",
      "aten::logical_not", "aten::logical_and", "aten::logical_or",
      "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor",
      "aten::bitwise_not", "aten::ceil", "aten::floor", "aten::round",
      "aten::trunc", "aten::masked_select",
      // activations and their gradients
      "aten::relu", "aten::relu_", "aten::threshold_backward",
      "aten::sigmoid", "aten::sigmoid_backward", "aten::tanh",
      "aten::tanh_backward", "aten::gelu", "aten::gelu_backward",
      "aten::silu", "aten::silu_backward", "aten::_softmax",
      "aten::_softmax_backward_data", "aten::_log_softmax",
      "aten::_log_softmax_backward_data",
      // normalization (native_layer_norm has a CompositeExplicitAutograd
      // kernel, math_native_layer_norm, which a backend fallback never
      // overrides: register_all registers this fallback for it by name,
      // so the device allocates what CUDA's kernel does, the output, mean
      // and rstd, and no temporaries of the math path)
      "aten::native_layer_norm", "aten::native_batch_norm_backward",
      "aten::native_layer_norm_backward",
      // GroupNorm (math_group_norm, over var_mean) and its backward
      "aten::native_group_norm_backward",
      // pooling
      "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward",
      "aten::avg_pool2d", "aten::avg_pool2d_backward",
      "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward",
      "aten::adaptive_max_pool2d", "aten::adaptive_max_pool2d_backward",
      // attention: the masks of scaled_dot_product_attention's math path and
      // nn.Transformer, and the inference fast paths of
      // nn.TransformerEncoderLayer and nn.MultiheadAttention
      "aten::triu", "aten::tril", "aten::isneginf", "aten::isposinf",
      "aten::_transformer_encoder_layer_fwd",
      "aten::_native_multi_head_attention",
      // linear algebra
      "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::dot",
      "aten::mv", "aten::addmv",
      // reductions
      "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max",
      "aten::min", "aten::argmax", "aten::argmin", "aten::norm",
      "aten::linalg_vector_norm", "aten::all", "aten::any",
      "aten::var", "aten::var_mean", "aten::std", "aten::std_mean",
      // more elementwise operators (rotary position embeddings: sin and
      // cos; softplus, log1p, erf, nan_to_num; integer division)
      "aten::sin", "aten::sin_", "aten::cos", "aten::cos_", "aten::log1p",
      "aten::log1p_", "aten::erf", "aten::erf_", "aten::softplus",
      "aten::softplus_backward", "aten::nan_to_num", "aten::nan_to_num_",
      "aten::floor_divide", "aten::floor_divide_", "aten::remainder",
      "aten::fmod", "aten::xlogy", "aten::roll", "aten::prod", "aten::sgn",
      "aten::_unique2", "aten::unfold_backward",
      // more activations and their gradients, more elementwise
      // functions
      "aten::leaky_relu", "aten::leaky_relu_", "aten::leaky_relu_backward",
      "aten::elu", "aten::elu_", "aten::elu_backward", "aten::hardtanh",
      "aten::hardtanh_", "aten::hardtanh_backward", "aten::hardswish",
      "aten::hardswish_", "aten::hardswish_backward", "aten::hardsigmoid",
      "aten::hardsigmoid_backward", "aten::mish", "aten::mish_backward",
      "aten::glu", "aten::glu_backward", "aten::log2", "aten::log10",
      "aten::tan", "aten::atan", "aten::atan2", "aten::asin", "aten::acos",
      "aten::sinh", "aten::cosh", "aten::asinh", "aten::acosh", "aten::atanh",
      "aten::exp2", "aten::expm1", "aten::hypot", "aten::heaviside",
      "aten::polar", "aten::complex", "aten::angle",
      "aten::bincount", "aten::trace", "aten::median", "aten::kthvalue",
      "aten::mode", "aten::_logcumsumexp", "aten::_cummax_helper",
      "aten::_cummin_helper", "aten::searchsorted", "aten::bucketize",
      "aten::masked_scatter_", "aten::index_fill_", "aten::index_copy",
      "aten::index_copy_", "aten::put_", "aten::take", "aten::exponential_",
      "aten::huber_loss", "aten::huber_loss_backward",
      "aten::linalg_inv_ex", "aten::_cdist_forward", "aten::_cdist_backward",
      "aten::im2col", "aten::col2im", "aten::_embedding_bag_forward_only",
      "aten::_embedding_bag", "aten::_embedding_bag_backward",
      "aten::_embedding_bag_dense_backward",
      "aten::_embedding_bag_per_sample_weights_backward", "aten::randperm",
      "aten::tril_indices", "aten::triu_indices",
      "aten::reflection_pad1d", "aten::reflection_pad1d_backward",
      "aten::reflection_pad2d", "aten::reflection_pad2d_backward",
      "aten::replication_pad1d", "aten::replication_pad1d_backward",
      "aten::replication_pad2d", "aten::replication_pad2d_backward",
      // BCE's gradient with respect to a target that needs one, PReLU,
      // 3-D padding, more resampling modes and selections
      "aten::logit", "aten::logit_backward", "aten::_prelu_kernel",
      "aten::_prelu_kernel_backward", "aten::erfinv", "aten::nanmedian",
      "aten::_pdist_forward", "aten::_pdist_backward", "aten::_unique",
      "aten::unique_dim", "aten::unique_consecutive",
      "aten::repeat_interleave",
      "aten::reflection_pad3d", "aten::reflection_pad3d_backward",
      "aten::replication_pad3d", "aten::replication_pad3d_backward",
      "aten::upsample_bicubic2d", "aten::upsample_bicubic2d_backward",
      "aten::upsample_trilinear3d", "aten::upsample_trilinear3d_backward",
      "aten::_upsample_nearest_exact1d",
      "aten::_upsample_nearest_exact1d_backward",
      "aten::_upsample_nearest_exact2d",
      "aten::_upsample_nearest_exact2d_backward",
      "aten::_upsample_nearest_exact3d",
      "aten::_upsample_nearest_exact3d_backward",
      "aten::_upsample_bilinear2d_aa", "aten::_upsample_bilinear2d_aa_backward",
      "aten::_upsample_bicubic2d_aa", "aten::_upsample_bicubic2d_aa_backward",
      // resampling (F.interpolate: nearest, linear, bilinear)
      "aten::upsample_nearest1d", "aten::upsample_nearest1d_backward",
      "aten::upsample_nearest2d", "aten::upsample_nearest2d_backward",
      "aten::upsample_nearest3d", "aten::upsample_nearest3d_backward",
      "aten::upsample_linear1d", "aten::upsample_linear1d_backward",
      "aten::upsample_bilinear2d", "aten::upsample_bilinear2d_backward",
      // losses
      "aten::mse_loss", "aten::mse_loss_backward", "aten::nll_loss_forward",
      "aten::nll_loss_backward", "aten::l1_loss",
      "aten::log_sigmoid_forward", "aten::log_sigmoid_backward",
      "aten::smooth_l1_loss", "aten::smooth_l1_loss_backward",
      "aten::binary_cross_entropy", "aten::binary_cross_entropy_backward",
      // data movement within the device
      "aten::cat", "aten::stack", "aten::index_select", "aten::gather",
      "aten::scatter", "aten::scatter_add", "aten::masked_fill",
      "aten::masked_fill_", "aten::embedding_dense_backward",
      // advanced indexing: z[idx], z[mask] (index.Tensor, which reaches
      // the device as index.Tensor_out), z[mask] = v and index_put_
      // (_index_put_impl_), index_add
      "aten::index", "aten::_index_put_impl_", "aten::index_add",
      "aten::nonzero",
      // scans, sorting and selection (flip: cumsum's and cumprod's
      // backward, torch/csrc/autograd/FunctionsManual.cpp)
      "aten::cumsum", "aten::cumsum_", "aten::cumprod", "aten::sort",
      "aten::topk", "aten::flip",
      // factories that fill what they allocate
      "aten::arange", "aten::linspace", "aten::eye",
      // random (the CPU generator, seeded by torch.manual_seed)
      "aten::normal_", "aten::uniform_", "aten::bernoulli_",
      "aten::random_", "aten::native_dropout", "aten::native_dropout_backward",
      "aten::multinomial",
      // optimizer foreach kernels (SGD, Adam, AdamW)
      "aten::_foreach_add", "aten::_foreach_add_", "aten::_foreach_sub_",
      "aten::_foreach_mul", "aten::_foreach_mul_", "aten::_foreach_div",
      "aten::_foreach_div_", "aten::_foreach_neg", "aten::_foreach_sqrt",
      "aten::_foreach_sqrt_", "aten::_foreach_addcmul_",
      "aten::_foreach_addcdiv_", "aten::_foreach_lerp_",
      "aten::_foreach_zero_", "aten::_foreach_copy_",
      "aten::_foreach_maximum_", "aten::_foreach_norm",
      "aten::_foreach_pow", "aten::_foreach_reciprocal_",
      // fused=True optimizers (their CPU kernels, aten/src/ATen/native/
      // FusedAdam.cpp, FusedAdagrad.cpp, FusedSGD.cpp)
      "aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_",
      "aten::_fused_adagrad_",
      // torch.amp.GradScaler: unscale the gradients and note infs/NaNs,
      // then grow or back off the scale
      "aten::_amp_foreach_non_finite_check_and_unscale_",
      "aten::_amp_update_scale_",
  };
  return names;
}

int device_count() {
  msnap_allocator_t* a = msnap_default();
  int n = a != nullptr ? msnap_device_count(a) : 0;
  return n > 0 ? n : 0;
}

// Per thread: current device, and current stream id per device.
thread_local c10::DeviceIndex tl_device = 0;
// Set when a thread other than the registering one sets a device: torch's
// autograd engine starts one worker thread per device index and sets its
// device (torch/csrc/autograd/engine.cpp, set_device).
std::atomic<bool> g_worker_threads{false};
std::thread::id g_init_thread;
thread_local std::vector<c10::StreamId> tl_streams;
std::atomic<c10::StreamId> next_stream{1};

void check_index(c10::DeviceIndex d) {
  int n = device_count();
  TORCH_CHECK(d >= 0 && d < n, "memsnap device: invalid device index ",
              static_cast<int>(d),
              " (", n, " device", n == 1 ? "" : "s",
              "; MEMSNAP_SIM_DEVICES sets the count)");
}

c10::StreamId current_stream_id(c10::DeviceIndex d) {
  if (d < 0 || static_cast<size_t>(d) >= tl_streams.size()) return 0;
  return tl_streams[static_cast<size_t>(d)];
}

uint64_t stream_handle(c10::StreamId id) { return static_cast<uint64_t>(id); }

// record_stream of the allocation at `base` (a storage's data pointer).
void record_on_stream(void* base, c10::StreamId id) {
  if (base == nullptr) return;
  int rc = msnap_record_stream(allocator(), as_u64(base), stream_handle(id));
  if (rc < 0) throw_error(rc, "memsnap record_stream");
}

// ---- the allocator ----------------------------------------------------------

// torch.profiler(profile_memory=True): every allocation and free of the
// device is reported as CUDA's caching allocator reports them
// (c10::reportMemoryUsageToProfiler with the block's size, negative for a
// free, and the device's allocated and reserved bytes after it;
// c10::reportOutOfMemoryToProfiler before an OOM is raised).  Only when
// c10::memoryProfilingEnabled() (the calling thread's profiler state asks
// for memory): then the block size and the device's two totals are read
// through memsnap's C API (msnap_allocation_size, and msnap_stats_get,
// which copies the device's whole statistics struct: the C API has no
// cheaper accessor of the two figures).  A failed query reports nothing.
bool device_totals(c10::DeviceIndex d, size_t* allocated, size_t* reserved) {
  msnap_stats_t m;
  std::memset(&m, 0, sizeof m);
  m.size = sizeof m;
  m.version = MSNAP_STATS_VERSION;
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr || msnap_stats_get(a, d, &m) < 0) return false;
  *allocated = static_cast<size_t>(m.allocated_bytes[MSNAP_STAT_ALL].current);
  *reserved = static_cast<size_t>(m.reserved_bytes[MSNAP_STAT_ALL].current);
  return true;
}

void report_usage(void* ptr, int64_t delta, c10::DeviceIndex d) {
  size_t allocated = 0, reserved = 0;
  if (device_totals(d, &allocated, &reserved))
    c10::reportMemoryUsageToProfiler(ptr, delta, allocated, reserved,
                                     c10::Device(kType, d));
}

// The rounded size of the live block at ptr (0 when unknown).
int64_t block_size(void* ptr) {
  size_t n = 0;
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr || msnap_allocation_size(a, as_u64(ptr), &n) < 0) return 0;
  return static_cast<int64_t>(n);
}

// Free a block of device d (-1: not known; the deleter of raw_deallocate).
void free_on(void* ptr, int d) {
  if (ptr == nullptr || !c10::memoryProfilingEnabled()) {
    free_or_report(ptr);
    return;
  }
  if (d < 0) d = device_count() == 1 ? 0 : tl_device;
  int64_t size = block_size(ptr);
  free_or_report(ptr);
  if (size != 0) report_usage(ptr, -size, static_cast<c10::DeviceIndex>(d));
}

void raw_delete(void* ptr) { free_on(ptr, -1); }

// The deleter of a DataPtr of device D: a c10 deleter gets only the
// pointer, and a free reported to the profiler names its device (and that
// device's totals), so each device's DataPtrs carry their own deleter.
// Devices up to the sim's 64 (MEMSNAP_SIM_DEVICES's range).
constexpr int kDeleterDevices = 64;
template <int D>
void delete_on(void* ptr) { free_on(ptr, D); }
template <int... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> make_deleters(
    std::integer_sequence<int, D...>) {
  return {{&delete_on<D>...}};
}
constexpr auto kDeleters =
    make_deleters(std::make_integer_sequence<int, kDeleterDevices>{});

c10::DeleterFnPtr deleter_of(c10::DeviceIndex d) {
  return d >= 0 && d < kDeleterDevices ? kDeleters[static_cast<size_t>(d)]
                                       : &raw_delete;
}

// memsnap's msnap_stat_t as torch's c10::CachingAllocator::Stat (the same
// four fields).
c10::CachingAllocator::Stat to_stat(const msnap_stat_t& m) {
  c10::CachingAllocator::Stat s;
  s.current = m.current;
  s.peak = m.peak;
  s.allocated = m.allocated;
  s.freed = m.freed;
  return s;
}

void to_stat_array(c10::CachingAllocator::StatArray& out,
                   const msnap_stat_t (&in)[MSNAP_STAT_TYPES]) {
  for (size_t t = 0; t < MSNAP_STAT_TYPES; t++) out[t] = to_stat(in[t]);
}

// The device allocator as torch's c10::DeviceAllocator (c10/core/
// CachingDeviceAllocator.h), the interface torch.accelerator's memory
// functions reach through c10::getDeviceAllocator (torch/csrc/
// DeviceAccelerator.cpp): memory_stats, memory_allocated/reserved and
// their peaks, reset_*_memory_stats, empty_cache, get_memory_info --
// the same figures as memsnap.memory and torch.<name>.
struct CachingAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex d = tl_device;
    void* p = nullptr;
    try {
      p = malloc_or_throw(n, d, stream_handle(current_stream_id(d)));
    } catch (const c10::OutOfMemoryError&) {
      size_t allocated = 0, reserved = 0;
      if (c10::memoryProfilingEnabled() &&
          device_totals(d, &allocated, &reserved))
        c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(n), allocated,
                                         reserved, c10::Device(kType, d));
      throw;
    }
    if (p != nullptr && c10::memoryProfilingEnabled())
      report_usage(p, block_size(p), d);
    return {p, p, deleter_of(d), c10::Device(kType, d)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count)
      const override {
    // Host-backed device memory: a plain copy is the device-to-device copy.
    if (count != 0) std::memcpy(dest, src, count);
  }
  bool initialized() override { return msnap_default() != nullptr; }
  void emptyCache(c10::MempoolId_t mempool_id) override {
    // torch.accelerator.empty_cache() asks for the default pools ({0, 0}):
    // every device, as CUDA's emptyCache.
    TORCH_CHECK_NOT_IMPLEMENTED(
        mempool_id.first == 0 && mempool_id.second == 0,
        "memsnap device: emptyCache of a private pool (", mempool_id.first,
        ", ", mempool_id.second, ") is not implemented: a pool's cached "
        "blocks are released when the pool is deleted");
    int rc = msnap_empty_cache(allocator(), -1);
    if (rc < 0) throw_error(rc, "memsnap empty_cache");
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    record_on_stream(ptr.get(), stream.id());
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override {
    check_index(device);
    msnap_stats_t m;
    std::memset(&m, 0, sizeof m);
    m.size = sizeof m;
    m.version = MSNAP_STATS_VERSION;
    int rc = msnap_stats_get(allocator(), device, &m);
    if (rc < 0) throw_error(rc, "memsnap memory_stats");
    c10::CachingDeviceAllocator::DeviceStats out;
#define MSNAP_TO_ARRAY_(n) to_stat_array(out.n, m.n);
    MSNAP_STAT_ARRAY_FIELDS(MSNAP_TO_ARRAY_)
#undef MSNAP_TO_ARRAY_
#define MSNAP_TO_ONE_(n) out.n = to_stat(m.n);
    MSNAP_STAT_FIELDS(MSNAP_TO_ONE_)
#undef MSNAP_TO_ONE_
#define MSNAP_TO_COUNTER_(n) out.n = m.n;
    MSNAP_COUNTER_FIELDS(MSNAP_TO_COUNTER_)
#undef MSNAP_TO_COUNTER_
    size_t n = 0;
    rc = msnap_pool_stats_get(allocator(), device, nullptr, 0, &n);
    if (rc < 0) throw_error(rc, "memsnap memory_stats");
    std::vector<msnap_pool_stats_t> pools(n);
    if (n != 0) {
      rc = msnap_pool_stats_get(allocator(), device, pools.data(), n, &n);
      if (rc < 0) throw_error(rc, "memsnap memory_stats");
    }
    for (size_t i = 0; i < std::min(n, pools.size()); i++) {
      c10::MempoolId_t id{pools[i].id.first, pools[i].id.second};
      to_stat_array(out.reserved_bytes_by_private_pools[id],
                    pools[i].reserved_bytes);
    }
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_index(device);
    int rc = msnap_reset_accumulated_stats(allocator(), device);
    if (rc < 0) throw_error(rc, "memsnap reset_accumulated_memory_stats");
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_index(device);
    int rc = msnap_reset_peak_stats(allocator(), device);
    if (rc < 0) throw_error(rc, "memsnap reset_peak_memory_stats");
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_index(device);
    size_t free_bytes = 0, total_bytes = 0;
    int rc = msnap_mem_get_info(allocator(), device, &free_bytes, &total_bytes);
    if (rc < 0) throw_error(rc, "memsnap mem_get_info");
    return {free_bytes, total_bytes};
  }
};

CachingAllocator g_allocator;

// ---- pinned host memory --------------------------------------------------------

// Pinned host memory for the device (what tensor.pin_memory(), DataLoader's
// pin_memory=True and torch.empty(..., pin_memory=True) ask of
// getPinnedMemoryAllocator(), as CUDA's CachingHostAllocator): blocks of
// memsnap's pinned host caching allocator (msnap_host_malloc, its stats in
// host_memory_stats(), its history in host_segments/host_traces).  Under
// the host-backed sim runtime they are real host memory.  The live block
// addresses are kept for isPinnedPtr (torch asks it with a storage's base
// pointer, as cudaPointerGetAttributes is asked in CUDAHooks).
std::mutex g_pinned_mutex;
std::unordered_set<void*> g_pinned;

void pinned_delete(void* ptr) {
  if (ptr == nullptr) return;
  {
    const std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(ptr);
  }
  int rc = msnap_host_free(allocator(), as_u64(ptr));
  if (rc < 0) report("pinned host free", rc);
}

// Also torch's at::HostAllocator for the device type (ATen/core/
// CachingHostAllocator.h), what torch.accelerator.empty_host_cache() and
// host_memory_stats() and the pinned copies' record_event reach through
// at::getHostAllocator: without one registered torch dereferences null.
struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t n) override {
    uint64_t p = 0;
    if (n != 0) {
      int rc = msnap_host_malloc(allocator(), n, &p);
      if (rc < 0) throw_error(rc, "memsnap pinned host allocation");
      const std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(reinterpret_cast<void*>(p));
    }
    void* ptr = reinterpret_cast<void*>(p);
    return {ptr, ptr, &pinned_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_delete; }
  void copy_data(void* dest, const void* src, std::size_t count)
      const override {
    if (count != 0) std::memcpy(dest, src, count);
  }
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    (void)ctx; // the context of memsnap's pinned blocks is the pointer
    if (ptr == nullptr || !is_pinned(ptr)) return false;
    int rc = msnap_host_record_stream(allocator(), as_u64(ptr),
                                      stream_handle(stream.id()));
    if (rc < 0) throw_error(rc, "memsnap pinned record_stream");
    return true;
  }
  void empty_cache() override {
    int rc = msnap_host_empty_cache(allocator());
    if (rc < 0) throw_error(rc, "memsnap empty_host_cache");
  }
  // The mapping of msnap_host_stats_get (include/memsnap.h), as
  // memsnap.memory.host_memory_stats gives it.
  at::HostStats get_stats() override {
    msnap_stats_t m;
    std::memset(&m, 0, sizeof m);
    m.size = sizeof m;
    m.version = MSNAP_STATS_VERSION;
    int rc = msnap_host_stats_get(allocator(), &m);
    if (rc < 0) throw_error(rc, "memsnap host_memory_stats");
    msnap_duration_stat_t at = {0, 0, 0, 0}, ft = {0, 0, 0, 0};
    rc = msnap_host_timing_get(allocator(), &at, &ft);
    if (rc < 0) throw_error(rc, "memsnap host_memory_stats");
    at::HostStats h;
    h.active_requests = to_stat(m.active[MSNAP_STAT_ALL]);
    h.active_bytes = to_stat(m.active_bytes[MSNAP_STAT_ALL]);
    h.allocations = to_stat(m.segment[MSNAP_STAT_ALL]);
    h.allocated_bytes = to_stat(m.reserved_bytes[MSNAP_STAT_ALL]);
    h.host_alloc_time.total = at.total;
    h.host_alloc_time.max = at.max;
    h.host_alloc_time.min = at.min;
    h.host_alloc_time.count = at.count;
    h.host_free_time.total = ft.total;
    h.host_free_time.max = ft.max;
    h.host_free_time.min = ft.min;
    h.host_free_time.count = ft.count;
    h.num_host_alloc = m.num_device_alloc;
    h.num_host_free = m.num_device_free;
    return h;
  }
  void reset_accumulated_stats() override {
    int rc = msnap_host_reset_accumulated_stats(allocator());
    if (rc < 0) throw_error(rc, "memsnap reset_accumulated_host_memory_stats");
  }
  void reset_peak_stats() override {
    int rc = msnap_host_reset_peak_stats(allocator());
    if (rc < 0) throw_error(rc, "memsnap reset_peak_host_memory_stats");
  }
  static bool is_pinned(const void* data) {
    const std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return g_pinned.count(const_cast<void*>(data)) != 0;
  }
};

PinnedAllocator g_pinned_allocator;

bool is_pinned_ptr(const void* data) {
  return PinnedAllocator::is_pinned(data);
}

// ---- the device guard --------------------------------------------------------

struct Event {
  std::chrono::steady_clock::time_point recorded;
};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, tl_device}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "memsnap device guard: expected a ",
                c10::get_privateuse1_backend(), " device, got ", d);
    if (std::this_thread::get_id() != g_init_thread)
      g_worker_threads.store(true);
    if (d.has_index()) {
      check_index(d.index());
      tl_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  // A device without an index means the current one.
  static c10::Device indexed(c10::Device d) {
    return d.has_index() ? d : c10::Device(kType, tl_device);
  }
  c10::Stream getStream(c10::Device d) const override {
    d = indexed(d);
    return c10::Stream(c10::Stream::UNSAFE, d, current_stream_id(d.index()));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, indexed(d));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    (void)priority;
    return c10::Stream(c10::Stream::UNSAFE, indexed(d),
                       next_stream.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d,
                                      bool high_priority) const override {
    return getNewStream(d, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::DeviceIndex d = s.device_index();
    c10::Stream old(c10::Stream::UNSAFE, s.device(), current_stream_id(d));
    if (d >= 0) {
      if (tl_streams.size() <= static_cast<size_t>(d))
        tl_streams.resize(static_cast<size_t>(d) + 1, 0);
      tl_streams[static_cast<size_t>(d)] = s.id();
    }
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  // Every operator runs synchronously: an event is complete once recorded.
  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    (void)stream;
    (void)device_index;
    (void)flag;
    Event* e = static_cast<Event*>(*event);
    if (e == nullptr) *event = e = new Event();
    e->recorded = std::chrono::steady_clock::now();
  }
  void block(void* event, const c10::Stream& stream) const override {
    (void)event;
    (void)stream;
  }
  bool queryEvent(void* event) const override {
    (void)event;
    return true;
  }
  void destroyEvent(void* event, const c10::DeviceIndex device_index)
      const noexcept override {
    (void)device_index;
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    (void)stream;
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    (void)stream;
  }
  void synchronizeEvent(void* event) const override { (void)event; }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    (void)device_index;
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    record_on_stream(data_ptr.get(), stream.id());
  }
  double elapsedTime(void* event1, void* event2,
                     const c10::DeviceIndex device_index) const override {
    (void)device_index;
    TORCH_CHECK(event1 != nullptr && event2 != nullptr,
                "Both events must be recorded before calculating elapsed "
                "time.");
    auto dt = static_cast<Event*>(event2)->recorded -
              static_cast<Event*>(event1)->recorded;
    return std::chrono::duration<double, std::milli>(dt).count();
  }
};

// ---- the PrivateUse1 hooks ------------------------------------------------------

// The current device of this thread set to d for a scope (as
// c10::DeviceGuard, without going through the registry).
struct ScopedDevice {
  explicit ScopedDevice(c10::DeviceIndex d) : saved(tl_device) {
    tl_device = d;
  }
  ~ScopedDevice() { tl_device = saved; }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  c10::DeviceIndex saved;
};

// resize_bytes for a device storage: allocate through memsnap on the
// storage's own device, copy, free the old block; a size of 0 keeps the
// device (as PyTorch's resize_bytes_cuda, aten/src/ATen/native/cuda/
// Resize.cpp: a CUDAGuard on the storage's device, an empty DataPtr of
// Device(kCUDA, device)).
void resize_storage_bytes(c10::StorageImpl* storage, size_t size_bytes) {
  TORCH_CHECK(storage->resizable(),
              "Trying to resize storage that is not resizable");
  const c10::Device old_device = storage->data_ptr().device();
  const c10::DeviceIndex d = old_device.type() == kType &&
                                     old_device.has_index()
                                 ? old_device.index()
                                 : tl_device;
  c10::DataPtr fresh(nullptr, c10::Device(kType, d));
  if (size_bytes != 0) {
    ScopedDevice guard(d);
    fresh = storage->allocator()->allocate(size_bytes);
  }
  const c10::DataPtr& old = storage->data_ptr();
  size_t keep = std::min(size_bytes, storage->nbytes());
  if (old.get() != nullptr && keep > 0)
    std::memcpy(fresh.get(), old.get(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(size_bytes);
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    (void)device_index;
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
    tl_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = tl_device;
    check_index(device);
    tl_device = device;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned_ptr(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device_index) const override {
    (void)device_index;
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "random number generators are not implemented for the memsnap "
        "device '", c10::get_privateuse1_backend(), "': random operators run "
        "on the CPU with the CPU generator (torch.manual_seed seeds it)");
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    (void)getDefaultGenerator(device_index);
    return {};
  }
  at::Device getDeviceFromPtr(void* data) const override {
    (void)data;
    return {kType, tl_device};
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---- kernels ---------------------------------------------------------------------

// The device of a factory call, after the checks every factory makes.
c10::Device factory_device(std::optional<c10::Device> device,
                           std::optional<c10::Layout> layout,
                           std::optional<bool> pin_memory) {
  c10::Device dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kType, "memsnap: not a memsnap device: ", dev);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the memsnap device supports only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "Only dense CPU tensors can be pinned");
  return dev;
}

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(factory_device(device, layout, pin_memory));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_generic(size, &g_allocator, ks,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(factory_device(device, layout, pin_memory));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_strided_generic(size, stride, &g_allocator, ks,
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor over the same (host-backed) bytes as device tensor t.
at::Tensor as_cpu(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       t.options().device(at::kCPU));
}

// The CPU alias of device tensor t keeps t's conjugate and negative
// bits (lazy conj() / neg views, ATen/native/MathBitsFallback.h), which
// the CPU copy then resolves as it does for CPU tensors.
at::Tensor with_bits(at::Tensor cpu, const at::Tensor& t) {
  if (t.is_conj()) cpu = cpu.conj();
  if (t.is_neg()) cpu = cpu._neg_view();
  return cpu;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst,
                     bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(),
              "memsnap _copy_from: undefined tensor");
  TORCH_CHECK(self.sizes() == dst.sizes(), "memsnap _copy_from: sizes ",
              self.sizes(), " and ", dst.sizes(), " differ");
  if (self.numel() == 0) return dst;
  at::Tensor src_cpu = self.is_cpu() ? self : with_bits(as_cpu(self), self);
  at::Tensor dst_cpu = dst.is_cpu() ? dst : with_bits(as_cpu(dst), dst);
  at::native::copy_(dst_cpu, src_cpu, non_blocking);
  return dst;
}

// A resize allocates through the storage's allocator on the current
// device (at::native::resize_ -> resize_bytes_cpu): run it with the
// tensor's own device current, as resize_cuda_ runs under a device guard.
c10::DeviceIndex tensor_device_index(const at::Tensor& t) {
  return t.device().has_index() ? t.device().index() : tl_device;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  {
    ScopedDevice guard(tensor_device_index(dst));
    at::native::resize_(dst, self.sizes(), std::nullopt);
  }
  return copy_from(self, dst, false);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  ScopedDevice guard(tensor_device_index(self));
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size),
                             memory_format);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                      c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride,
                                    std::move(storage_offset));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source,
                                      c10::SymInt storage_offset,
                                      c10::SymIntArrayRef size,
                                      c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, std::move(source),
                              std::move(storage_offset), size, stride);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(self);
}

void record_stream(at::Tensor& self, c10::Stream s) {
  record_on_stream(self.storage().data_ptr().get(), s.id());
}

// A device tensor with the sizes, strides and bytes of CPU tensor `cpu`,
// allocated through memsnap on `like`'s device (an undefined tensor stays
// undefined).
at::Tensor to_device(const at::Tensor& cpu, const at::Tensor& like) {
  if (!cpu.defined()) return cpu;
  at::Tensor out = at::empty_strided(cpu.sizes(), cpu.strides(),
                                     cpu.options().device(like.device()));
  return copy_from(cpu, out, false);
}

std::optional<at::Tensor> as_cpu(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return as_cpu(*t);
}

// native_batch_norm updates running_mean and running_var in place, but its
// schema does not mark them mutable (`Tensor?`), so cpu_fallback would not
// copy them back: the CPU kernel runs on CPU tensors over the device bytes.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  std::optional<c10::Device> common;
  const char* m = "aten::native_batch_norm";
  c10::impl::check_and_update_common_device(common, input, m, "input");
  c10::impl::check_and_update_common_device(common, weight, m, "weight");
  c10::impl::check_and_update_common_device(common, bias, m, "bias");
  c10::impl::check_and_update_common_device(common, running_mean, m,
                                            "running_mean");
  c10::impl::check_and_update_common_device(common, running_var, m,
                                            "running_var");
  auto [out, mean, invstd] = at::native_batch_norm(
      as_cpu(input), as_cpu(weight), as_cpu(bias), as_cpu(running_mean),
      as_cpu(running_var), training, momentum, eps);
  return {to_device(out, input), to_device(mean, input),
          to_device(invstd, input)};
}

// Convolutions.  For a PrivateUse1 tensor at::convolution and
// at::convolution_backward pick ConvBackend::Overrideable and call these two
// operators (aten/src/ATen/native/Convolution.cpp, select_conv_backend); the
// CPU computes them over the device bytes, the results are allocated on the
// device through memsnap.
at::Tensor convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
    c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  std::optional<c10::Device> common;
  const char* m = "aten::convolution_overrideable";
  c10::impl::check_and_update_common_device(common, input, m, "input");
  c10::impl::check_and_update_common_device(common, weight, m, "weight");
  c10::impl::check_and_update_common_device(common, bias, m, "bias");
  at::Tensor out = at::convolution_symint(
      as_cpu(input), as_cpu(weight), as_cpu(bias), stride, padding, dilation,
      transposed, output_padding, std::move(groups));
  return to_device(out, input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::SymIntArrayRef stride,
    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
    c10::SymIntArrayRef output_padding, c10::SymInt groups,
    std::array<bool, 3> output_mask) {
  std::optional<c10::Device> common;
  const char* m = "aten::convolution_backward_overrideable";
  c10::impl::check_and_update_common_device(common, grad_output, m,
                                            "grad_output");
  c10::impl::check_and_update_common_device(common, input, m, "input");
  c10::impl::check_and_update_common_device(common, weight, m, "weight");
  // The bias has one element per output channel.
  std::vector<c10::SymInt> bias_sizes{grad_output.sym_size(1)};
  auto [gi, gw, gb] = at::convolution_backward_symint(
      as_cpu(grad_output), as_cpu(input), as_cpu(weight),
      output_mask[2] ? std::optional<c10::SymIntArrayRef>(bias_sizes)
                     : std::nullopt,
      stride, padding, dilation, transposed, output_padding, std::move(groups),
      output_mask);
  return {to_device(gi, input), to_device(gw, weight),
          to_device(gb, weight)};
}

// nn.TransformerEncoder's inference fast path asks whether the padding
// mask is left-aligned before turning the batch into a nested tensor
// (torch/nn/modules/transformer.py, TransformerEncoder.forward).  Nested
// tensors exist for the CPU and CUDA only (NestedTensorCPU/CUDA kernels),
// so the device answers no: the encoder then runs the padded path, whose
// outputs at the unpadded positions are the same (the padded positions
// hold computed values, not the nested path's zeros).
bool nested_tensor_from_mask_left_aligned(const at::Tensor& t,
                                          const at::Tensor& mask) {
  (void)t;
  TORCH_CHECK(mask.scalar_type() == at::ScalarType::Bool,
              "Expected mask to be of ScalarType Bool, but got ",
              mask.scalar_type(), " instead.");
  return false;
}

// The arguments of one operator share one device, as a CUDA kernel
// requires: the wrappers PyTorch generates for a backend check every
// tensor argument (c10::impl::check_and_update_common_device,
// ATen/core/op_registration/adaption.h), and TensorIterator's operators
// take a 0-dim CPU tensor as a scalar; indexing takes CPU indices.
// cpu_fallback moves every argument to the CPU, so without this check an
// operator on tensors of two devices (npu:0 and the CPU, npu:0 and npu:1)
// would compute, or fail later with an unrelated error.  The error is
// torch's own (common_device_check_failure), naming the operator.
class CommonDevice {
 public:
  explicit CommonDevice(const c10::OperatorHandle& op) : op_(op) {}

  void check(const at::Tensor& t, const std::string& arg) {
    if (!t.defined() || (t.is_cpu() && t.dim() == 0)) return;
    if (!common_.has_value()) {
      common_ = t.device();
    } else if (*common_ != t.device()) {
      const std::string method = c10::toString(op_.schema().operator_name());
      c10::impl::common_device_check_failure(*common_, t, method.c_str(),
                                             arg.c_str());
    }
  }

  void check(const c10::IValue& v, const std::string& arg, bool indices) {
    if (v.isTensor()) {
      check(v.toTensor(), arg);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) check(t, arg);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
        if (t.has_value() && !(indices && t->is_cpu())) check(*t, arg);
    }
  }

 private:
  const c10::OperatorHandle& op_;
  std::optional<c10::Device> common_;
};

void check_common_device(const c10::OperatorHandle& op,
                         const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  if (stack.size() < n) return;
  // aten::index and aten::index_put(_): `indices` may stay on the CPU
  // (advanced indexing moves them, aten/src/ATen/native/TensorAdvancedIndexing.cpp)
  const std::string& name = op.schema().operator_name().name;
  const bool index_op = name == "aten::index" || name == "aten::index_put" ||
                        name == "aten::index_put_" ||
                        name == "aten::_index_put_impl_";
  CommonDevice d(op);
  for (size_t i = 0; i < n; i++)
    d.check(stack[stack.size() - n + i], args[i].name(),
            index_op && args[i].name() == "indices");
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.schema().operator_name();
  const auto& ops = cpu_operators();
  // (first for every operator: tensors of two devices are the caller's
  // mistake, whether or not the device computes the operator -- a CPU
  // input to a device nn.Conv2d reaches _slow_conv2d_forward here)
  check_common_device(op, *stack);
  if (ops.count(name.name) ||
      (!name.overload_name.empty() &&
       ops.count(name.name + "." + name.overload_name))) {
    at::native::cpu_fallback(op, stack);
    return;
  }
  // nn.LSTM / nn.GRU (and their cells) call these fused kernels on a
  // PrivateUse1 device (aten/src/ATen/native/RNN.cpp, LSTMCell / GRUCell);
  // PyTorch has them for CUDA only, so there is no CPU kernel to run.
  const bool rnn = name.name == "aten::_thnn_fused_lstm_cell" ||
                   name.name == "aten::_thnn_fused_gru_cell";
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "operator ", name, " is not implemented for the memsnap device '",
      c10::get_privateuse1_backend(), "' (",
      rnn ? "the fused recurrent cell nn.LSTM and nn.GRU use on a "
            "non-CPU device: PyTorch has no CPU kernel of it; run the "
            "recurrent layer on the CPU"
          : "memsnap computes only the operators listed in its "
            "docs/python.md, on the CPU; move the tensors to the CPU for "
            "this one",
      ")");
}

std::mutex init_mutex;
std::string init_error;
bool init_done = false;

// The device needs the host-backed sim runtime (copies and CPU kernels
// read and write the device addresses).
void check_runtime() {
  msnap_allocator_t* a = allocator();
  const msnap_runtime_ops_t* rt = msnap_runtime(a);
  TORCH_CHECK(rt == msnap_runtime_sim() &&
                  msnap_sim_host_backed(msnap_runtime_ctx(a)),
              "the memsnap device needs the host-backed sim runtime "
              "(MEMSNAP_RUNTIME=sim, MEMSNAP_SIM_HOST_BACKED=1 before "
              "memsnap's allocator is first used); this process runs '",
              rt != nullptr && rt->name != nullptr ? rt->name : "?",
              "'", rt == msnap_runtime_sim() ? " without host backing" : "");
}

void register_all() {
  check_runtime();
  g_init_thread = std::this_thread::get_id();
  c10::SetAllocator(kType, &g_allocator);
  at::setHostAllocator(kType, &g_pinned_allocator);
  static c10::impl::DeviceGuardImplRegistrar guard_registrar(kType,
                                                             new GuardImpl());
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  static torch::Library impl(torch::Library::IMPL, "aten",
                             c10::DispatchKey::PrivateUse1, __FILE__,
                             __LINE__);
  impl.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  impl.impl("empty_strided", TORCH_FN(empty_strided));
  impl.impl("_copy_from", TORCH_FN(copy_from));
  impl.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  impl.impl("resize_", TORCH_FN(resize_));
  impl.impl("view", TORCH_FN(view));
  impl.impl("as_strided", TORCH_FN(as_strided));
  // a view (Tensor.unfold, and Tensor.repeat's kernel through it): the
  // CPU's and CUDA's own kernel, sizes and strides over as_strided
  impl.impl("unfold", TORCH_FN(at::native::unfold));
  // complex views (rotary embeddings written with complex numbers)
  impl.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  impl.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  impl.impl("_reshape_alias", TORCH_FN(reshape_alias));
  impl.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  impl.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  impl.impl("set_.source_Storage_storage_offset",
            TORCH_FN(set_source_storage_offset));
  impl.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  impl.impl("record_stream", TORCH_FN(record_stream));
  impl.impl("_nested_tensor_from_mask_left_aligned",
            TORCH_FN(nested_tensor_from_mask_left_aligned));
  impl.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  impl.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  impl.impl("convolution_backward_overrideable",
            TORCH_FN(convolution_backward_overrideable));
  // mse_loss's and smooth_l1_loss's functional forms would otherwise go
  // through the structured out= kernel with a 0-dim output, which
  // PyTorch's CPU kernel resizes (and warns about); compute the
  // functional forms themselves on the CPU.
  impl.impl("mse_loss",
            torch::CppFunction::makeFromBoxedFunction<&fallback>());
  impl.impl("smooth_l1_loss",
            torch::CppFunction::makeFromBoxedFunction<&fallback>());
  impl.impl("native_layer_norm",
            torch::CppFunction::makeFromBoxedFunction<&fallback>());
  // A copy from or to a tensor with the conjugate or negative bit (the
  // gradient of a complex product): the math-bit fallbacks would resolve
  // the bit with clone, whose copy_ calls _copy_from again, without end.
  // copy_from keeps the bits on its CPU aliases instead (with_bits), as
  // CUDA's copy kernel handles them itself.
  static torch::Library conj(torch::Library::IMPL, "aten",
                             c10::DispatchKey::Conjugate, __FILE__, __LINE__);
  conj.impl("_copy_from", torch::CppFunction::makeFallthrough());
  conj.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  static torch::Library neg(torch::Library::IMPL, "aten",
                            c10::DispatchKey::Negative, __FILE__, __LINE__);
  neg.impl("_copy_from", torch::CppFunction::makeFallthrough());
  neg.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  static torch::Library fb(torch::Library::IMPL, "_",
                           c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fb.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
  register_autocast();
}

// Run f under init_mutex unless the device is registered; NULL, or the
// error text (valid until the next call).
template <class F>
const char* init_step(F&& f) {
  std::lock_guard<std::mutex> g(init_mutex);
  if (init_done) return nullptr;
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    init_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    init_error = e.what();
  }
  return init_error.c_str();
}
} // namespace
} // namespace memsnap_torch

extern "C" {

// Whether the device can be registered in this process.  NULL, or why not.
__attribute__((visibility("default"))) const char* msnap_torch_device_check(
    void) {
  return memsnap_torch::init_step([] { memsnap_torch::check_runtime(); });
}

// Register the device (idempotent).  NULL, or the error text.
__attribute__((visibility("default"))) const char* msnap_torch_device_init(
    void) {
  return memsnap_torch::init_step([] {
    memsnap_torch::register_all();
    memsnap_torch::init_done = true;
  });
}

// The calling thread's current device (the device guard's).
__attribute__((visibility("default"))) int msnap_torch_current_device(void) {
  return memsnap_torch::tl_device;
}

// Make `device` current on the calling thread.  NULL, or the error text.
__attribute__((visibility("default"))) const char* msnap_torch_set_device(
    int device) {
  static thread_local std::string err;
  try {
    memsnap_torch::check_index(static_cast<c10::DeviceIndex>(device));
  } catch (const c10::Error& e) {
    err = e.what_without_backtrace();
    return err.c_str();
  }
  memsnap_torch::tl_device = static_cast<c10::DeviceIndex>(device);
  return nullptr;
}

// The calling thread's current stream of `device` (a memsnap stream
// handle; 0 = the default stream).
__attribute__((visibility("default"))) int64_t msnap_torch_current_stream(
    int device) {
  return memsnap_torch::current_stream_id(
      static_cast<c10::DeviceIndex>(device));
}

// Whether torch's autograd engine started its device threads for this
// device type (they call the guard's setDevice from their own thread).
__attribute__((visibility("default"))) int msnap_torch_worker_threads(void) {
  return memsnap_torch::g_worker_threads.load() ? 1 : 0;
}

// The operator names the fallback computes on the CPU, one per line (for
// the documentation test).
__attribute__((visibility("default"))) const char* msnap_torch_cpu_operators(
    void) {
  static std::string text;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> v(memsnap_torch::cpu_operators().begin(),
                               memsnap_torch::cpu_operators().end());
    std::sort(v.begin(), v.end());
    for (const auto& s : v) text += s + "\n";
  });
  return text.c_str();
}

} // extern "C"
