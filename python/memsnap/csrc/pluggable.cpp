// pluggable.cpp -- allocation entry points for torch's pluggable allocators
// that raise torch.OutOfMemoryError.
//
// torch.cuda.memory.CUDAPluggableAllocator and torch_npu's
// NPUPluggableAllocator call
//     void* alloc_fn(size_t size, int device, stream_t stream)
// and never check the result for NULL (torch_npu then builds a DataPtr on
// nullptr; PyTorch raises no OutOfMemoryError, pytorch/pytorch#133280).
// An exception thrown by alloc_fn propagates through their malloc into
// torch's Python bindings, which turn c10::OutOfMemoryError into
// torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class;
// torch_npu raises it too).  msnap_torch_malloc throws it after memsnap's
// OOM sequence ran (the `oom` trace entry, the OOM observers, the
// OOM_SNAPSHOT_ENABLE dump), with memsnap's message in PyTorch's shape.
#include "shim.h"

#include <sys/types.h>

#include <cstdio>

#include <c10/util/Exception.h>

namespace memsnap_torch {

msnap_allocator_t* allocator() {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr) {
    const char* why = msnap_default_error();
    TORCH_CHECK(false, "memsnap: the allocator could not be created: ",
                why != nullptr ? why : "unknown error");
  }
  return a;
}

void throw_error(int rc, const char* what) {
  const char* text = msnap_last_error();
  if (text == nullptr || text[0] == '\0') text = msnap_strerror(rc);
  if (rc == MSNAP_EOOM || rc == MSNAP_EREJECTED)
    TORCH_CHECK_WITH(OutOfMemoryError, false, text);
  TORCH_CHECK(false, what, ": ", text);
}

void* malloc_or_throw(size_t size, int device, uint64_t stream) {
  if (size == 0) return nullptr;
  uint64_t ptr = 0;
  int rc = msnap_malloc(allocator(), device, size, stream, &ptr);
  if (rc < 0) throw_error(rc, "memsnap malloc");
  return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
}

void free_or_report(void* ptr) {
  if (ptr == nullptr) return;
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr) return;
  int rc = msnap_free(a, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)));
  if (rc < 0) {
    const char* text = msnap_last_error();
    std::fprintf(stderr, "memsnap: free failed: %s\n",
                 text != nullptr && text[0] ? text : msnap_strerror(rc));
  }
}

} // namespace memsnap_torch

extern "C" {

// alloc_fn of the pluggable allocators.  A negative size is a c10::Error.
__attribute__((visibility("default"))) void* msnap_torch_malloc(
    ssize_t size, int device, void* stream) {
  TORCH_CHECK(size >= 0, "memsnap: invalid allocation size ", size);
  return memsnap_torch::malloc_or_throw(
      static_cast<size_t>(size), device,
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream)));
}

// free_fn: size, device and stream are what the loader remembered; memsnap
// knows them already.
__attribute__((visibility("default"))) void msnap_torch_free(
    void* ptr, ssize_t size, int device, void* stream) {
  (void)size;
  (void)device;
  (void)stream;
  memsnap_torch::free_or_report(ptr);
}

} // extern "C"
