// cuda_hooks.cpp -- the optional hooks of torch.cuda's
// CUDAPluggableAllocator, for memsnap.torch.use_allocator("cuda").
//
// torch/csrc/cuda/CUDAPluggableAllocator.h offers set_init_fn,
// set_reset_fn, set_memory_fraction_fn, set_base_alloc_fn,
// set_record_stream_fn, set_begin_allocate_to_pool,
// set_end_allocate_to_pool_fn and set_release_pool, but torch's Python
// binding exposes none of them (torch.cuda.memory.CUDAPluggableAllocator
// only takes the alloc/free names).  msnap_torch_cuda_install_hooks finds
// torch's current allocator (change_current_allocator made it memsnap's
// CUDAPluggableAllocator) and sets them all, so that
// torch.cuda.empty_cache(), Tensor.record_stream, the memory fraction,
// getBaseAllocation (IPC) and MemPool / graph-pool routing reach memsnap.
//
// Built only with a CUDA torch and the CUDA runtime headers (meson:
// python/meson.build); linked against libtorch_cuda and libc10_cuda.
#include "shim.h"

#include <cstdio>
#include <functional>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

namespace {

using memsnap_torch::as_u64;
using memsnap_torch::report;

using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

msnap_mempool_id_t pool_id(c10::cuda::MempoolId_t id) {
  return msnap_mempool_id_t{static_cast<uint64_t>(id.first),
                            static_cast<uint64_t>(id.second)};
}

void record_stream(void* ptr, cudaStream_t stream) {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr || ptr == nullptr) return;
  int rc = msnap_record_stream(a, as_u64(ptr), as_u64(stream));
  if (rc < 0) report("record_stream", rc);
}

// beginAllocateToPool(device, pool, filter): memsnap routes one stream or
// all of them.  The filter is probed with the device's current stream and
// with another stream (the default one, or a pool stream when the current
// stream is the default): both accepted -> every stream (torch's
// thread-based MemPool routing and use_mem_pool), only the current one ->
// that stream (graph capture), neither -> nothing is routed (warned).
void begin_allocate_to_pool(int device, c10::cuda::MempoolId_t id,
                            std::function<bool(cudaStream_t)> filter) {
  msnap_allocator_t* a = memsnap_torch::allocator();
  cudaStream_t cur = c10::cuda::getCurrentCUDAStream(
                         static_cast<c10::DeviceIndex>(device))
                         .stream();
  cudaStream_t other =
      cur != nullptr ? nullptr
                     : c10::cuda::getStreamFromPool(
                           false, static_cast<c10::DeviceIndex>(device))
                           .stream();
  bool on_cur = filter(cur), on_other = filter(other);
  if (!on_cur && !on_other) {
    std::fprintf(stderr,
                 "memsnap: beginAllocateToPool on device %d: the filter "
                 "accepts neither the current nor another stream; nothing "
                 "is routed to pool (%llu, %llu)\n",
                 device, static_cast<unsigned long long>(id.first),
                 static_cast<unsigned long long>(id.second));
    return;
  }
  int rc = msnap_begin_allocate_to_pool(a, device, pool_id(id), as_u64(cur),
                                        on_cur && on_other);
  if (rc < 0) memsnap_torch::throw_error(rc, "memsnap beginAllocateToPool");
}

void end_allocate_to_pool(int device, c10::cuda::MempoolId_t id) {
  int rc = msnap_end_allocate_to_pool(memsnap_torch::allocator(), device,
                                      pool_id(id));
  if (rc < 0) memsnap_torch::throw_error(rc, "memsnap endAllocateToPool");
}

void release_pool(int device, c10::cuda::MempoolId_t id) {
  int rc = msnap_mempool_release(memsnap_torch::allocator(), device,
                                 pool_id(id));
  if (rc < 0) report("releasePool", rc);
}

std::string install_error;

} // namespace

extern "C" {

// Set every hook on torch's current CUDA allocator, which must be a
// CUDAPluggableAllocator.  NULL, or the error text.
__attribute__((visibility("default"))) const char*
msnap_torch_cuda_install_hooks(void) {
  auto* current = c10::cuda::CUDACachingAllocator::get();
  auto* p = dynamic_cast<CUDAPluggableAllocator*>(current);
  if (p == nullptr) {
    install_error = "torch's current CUDA allocator is not a "
                    "CUDAPluggableAllocator (call "
                    "torch.cuda.memory.change_current_allocator first)";
    return install_error.c_str();
  }
  p->set_init_fn(&msnap_plugin_init);
  p->set_reset_fn(&msnap_plugin_empty_cache);
  p->set_memory_fraction_fn(&msnap_plugin_memory_fraction);
  p->set_base_alloc_fn(&msnap_plugin_get_base_allocation);
  p->set_record_stream_fn(&record_stream);
  p->set_begin_allocate_to_pool(&begin_allocate_to_pool);
  p->set_end_allocate_to_pool_fn(&end_allocate_to_pool);
  p->set_release_pool(&release_pool);
  return nullptr;
}

} // extern "C"
