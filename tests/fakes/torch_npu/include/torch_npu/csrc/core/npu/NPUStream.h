// Stand-in for torch_npu/csrc/core/npu/NPUStream.h (tests only).
//
// The declarations memsnap's NPU shim uses, with the real signatures and
// the real class shape: NPUStream wraps a c10::Stream and has a
// user-declared destructor, so it is not trivially copyable and the
// Itanium C++ ABI passes it by invisible reference, as torch_npu's own
// build does.  The stand-in implementation (fake_torch_npu.cpp) simulates
// the per-device task queue that stream() drains.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "third_party/acl/inc/acl/acl.h"

#define C10_NPU_API __attribute__((visibility("default")))

namespace c10_npu {

class C10_NPU_API NPUStream {
 public:
  enum Unchecked { UNCHECKED };

  explicit NPUStream(c10::Stream stream);
  explicit NPUStream(Unchecked, c10::Stream stream) : stream_(stream) {}
  ~NPUStream() {}

  bool operator==(const NPUStream& other) const noexcept {
    return unwrap() == other.unwrap();
  }
  bool operator!=(const NPUStream& other) const noexcept {
    return unwrap() != other.unwrap();
  }
  // Implicit conversion to the ACL stream (drains the task queue first).
  operator aclrtStream() const { return stream(); }
  operator c10::Stream() const { return unwrap(); }

  c10::DeviceType device_type() const { return c10::DeviceType::PrivateUse1; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::Device device() const {
    return c10::Device(c10::DeviceType::PrivateUse1, device_index());
  }
  c10::StreamId id() const { return stream_.id(); }

  // The ACL stream, after the current device's task queue is empty.
  aclrtStream stream() const;
  // need_empty false: without draining the task queue.
  aclrtStream stream(const bool need_empty) const;
  c10::Stream unwrap() const { return stream_; }

 private:
  c10::Stream stream_;
};

C10_NPU_API NPUStream getNPUStreamFromPool(c10::DeviceIndex device = -1);
C10_NPU_API NPUStream getDefaultNPUStream(c10::DeviceIndex device_index = -1);
C10_NPU_API NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);
aclrtStream getCurrentNPUStreamNoWait(c10::DeviceIndex device_index = -1);
// Drain every device's task queue, then aclrtSynchronizeDevice.
C10_NPU_API bool npuSynchronizeDevice(bool check_error = true);
C10_NPU_API void setCurrentNPUStream(NPUStream stream);

} // namespace c10_npu
