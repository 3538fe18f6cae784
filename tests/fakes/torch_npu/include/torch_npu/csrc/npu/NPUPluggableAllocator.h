// Stand-in for torch_npu/csrc/npu/NPUPluggableAllocator.h (tests only).
//
// The hook setters and the calls that use the hooks, with the real
// signatures (record_stream_fn and erase_stream_fn take a
// c10_npu::NPUStream; get_device_stats_fn returns DeviceStats).  The real
// class derives from NPUCachingAllocator::NPUAllocator and takes DataPtrs;
// the stand-in keeps only what the tests drive through
// fake_torch_npu.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace torch::npu::NPUPluggableAllocator {

using streamType = c10_npu::NPUStream;

struct NPUPluggableAllocator {
  NPUPluggableAllocator(
      std::function<void*(size_t, int, aclrtStream)> alloc_fn,
      std::function<void(void*, size_t, int, aclrtStream)> free_fn);

  void set_init_fn(std::function<void(int)> init_fn);
  void set_reset_fn(std::function<void(bool)> reset_fn);
  void set_memory_fraction_fn(
      std::function<void(double, int)> memory_fraction_fn);
  void set_base_alloc_fn(std::function<void*(void*, size_t*)> base_alloc_fn);
  void set_record_stream_fn(
      std::function<void(void* ptr, c10_npu::NPUStream stream)>
          record_stream_fn);
  void set_erase_stream_fn(
      std::function<void(void* ptr, c10_npu::NPUStream stream)>
          erase_stream_fn);
  void set_get_device_stats_fn(
      std::function<c10_npu::NPUCachingAllocator::DeviceStats(int)>
          get_device_stats_fn);
  void set_reset_peak_status_fn(std::function<void(int)> reset_peak_status_fn);

  void* malloc(size_t size, int device, aclrtStream stream);
  void raw_delete(void* ptr);
  void init(int device_count);
  void setMemoryFraction(double fraction, int device);
  void emptyCache(bool check_error);
  void* getBaseAllocation(void* ptr, size_t* size);
  void recordStream(void* ptr, streamType stream);
  void eraseStream(void* ptr, streamType stream);
  c10_npu::NPUCachingAllocator::DeviceStats getDeviceStats(int device);
  void resetPeakStats(int device);

 protected:
  struct Meta {
    size_t size;
    int device;
    aclrtStream stream;
  };
  std::function<void*(size_t, int, aclrtStream)> alloc_fn_;
  std::function<void(void*, size_t, int, aclrtStream)> free_fn_;
  std::function<void(int)> init_fn_;
  std::function<void(bool)> reset_fn_;
  std::function<void(double, int)> memory_fraction_fn_;
  std::function<void*(void*, size_t*)> base_alloc_fn_;
  std::function<void(void* ptr, c10_npu::NPUStream stream)> record_stream_fn_;
  std::function<void(void* ptr, c10_npu::NPUStream stream)> erase_stream_fn_;
  std::function<c10_npu::NPUCachingAllocator::DeviceStats(int)>
      get_device_stats_fn_;
  std::function<void(int)> reset_peak_status_fn_;
  std::mutex allocator_mutex_;
  std::unordered_map<void*, Meta> allocation_metadata_;
};

} // namespace torch::npu::NPUPluggableAllocator
