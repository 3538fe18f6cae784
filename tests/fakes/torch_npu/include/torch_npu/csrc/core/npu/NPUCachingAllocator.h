// Stand-in for torch_npu/csrc/core/npu/NPUCachingAllocator.h (tests only):
// the statistics types, which torch_npu takes from c10 as the real header
// does (using c10::CachingDeviceAllocator::DeviceStats and friends).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace c10_npu::NPUCachingAllocator {
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
} // namespace c10_npu::NPUCachingAllocator
