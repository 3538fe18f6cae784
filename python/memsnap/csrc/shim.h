// shim.h -- the C++ layer between torch's ABI and memsnap's C API.
//
// memsnap's core is C (include/memsnap.h); this shim is the smallest C++
// torch's ABI demands: c10::OutOfMemoryError thrown across torch's
// allocator calls, torch's c10::Allocator / DeviceGuardImplInterface /
// PrivateUse1HooksInterface objects, and (npu.cpp) torch_npu's NPUStream
// passed by value.  Everything works on msnap_default(), the process-wide
// allocator that memsnap.memory and libmemsnap.so's msnap_plugin_* use.
//
// Entry points that Python calls through ctypes are extern "C" and never
// throw (they return an error text, or NULL); the functions torch calls
// may throw c10 exceptions, as torch's own allocators do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "memsnap.h"

namespace memsnap_torch {

// A pointer as memsnap's address / stream handle.
inline uint64_t as_u64(const void* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

// A hook that torch calls cannot raise into torch's allocator: print the
// failure ("memsnap: <hook> failed: <text>"), as libmemsnap.so's
// msnap_plugin_* do.
inline void report(const char* hook, int rc) {
  const char* text = msnap_last_error();
  std::fprintf(stderr, "memsnap: %s failed: %s\n", hook,
               text != nullptr && text[0] ? text : msnap_strerror(rc));
}

// msnap_default(), or a c10::Error naming why it could not be created.
msnap_allocator_t* allocator();

// Throw for a failed memsnap call `rc`: c10::OutOfMemoryError (Python:
// torch.OutOfMemoryError) for MSNAP_EOOM / MSNAP_EREJECTED with memsnap's
// message (PyTorch's shape: "... out of memory. Tried to allocate ..."),
// c10::Error (RuntimeError) with "<what>: <text>" otherwise.
[[noreturn]] void throw_error(int rc, const char* what);

// msnap_malloc on `device` and `stream` that throws instead of returning
// an error; size 0 gives nullptr.
void* malloc_or_throw(size_t size, int device, uint64_t stream);

// msnap_free; an unknown pointer is reported on stderr (a deleter cannot
// throw).
void free_or_report(void* ptr);
// Register torch.autocast's AutocastPrivateUse1 kernels (autocast.cpp);
// device.cpp calls it once, when the device is registered.
void register_autocast();

} // namespace memsnap_torch
