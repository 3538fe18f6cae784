// fake_torch_npu.cpp -- a stand-in libtorch_npu.so for memsnap's tests.
//
// What memsnap's NPU shim (python/memsnap/csrc/npu.cpp) and the stand-in
// Python package (python/torch_npu/) need of torch_npu, behaving as
// torch_npu does:
//
//   - NPUStream::stream() waits until the current device's task queue is
//     empty (here: a per-device count of queued tasks, fake_npu_launch adds
//     one) and returns the ACL stream; stream(false) does not drain;
//     npuSynchronizeDevice drains every queue, then calls
//     aclrtSynchronizeDevice of the loaded libascendcl.so;
//   - a DeviceGuardImplInterface for PrivateUse1 (torch_npu registers its
//     own): per-thread current device and stream;
//   - NPUPluggableAllocator: malloc records (size, device, stream) as the
//     real one and calls alloc_fn; raw_delete calls free_fn with them;
//     recordStream/eraseStream call their hooks with an NPUStream by value;
//     getDeviceStats/resetPeakStats/emptyCache/setMemoryFraction/init/
//     getBaseAllocation call theirs;
//   - extern "C" fake_npu_* entry points for ctypes (the stand-in of
//     torch_npu._C): an exception thrown by alloc_fn is caught by its C++
//     type, c10::OutOfMemoryError first, as torch's Python bindings do.
//
// ACL stream handles are fake addresses: 0x5000000 + device * 0x10000 +
// (stream id + 1) * 0x10.  fake_npu_counter("drains") counts queue
// drains; "acl_records_at_drain" is fake_acl_control("record_calls") at
// the last drain (to check that a drain precedes an event record).
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/npu/NPUPluggableAllocator.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxDevices = 8;
std::atomic<long> pending[kMaxDevices];
std::atomic<long> drains{0}, syncs{0}, acl_records_at_drain{-1};
thread_local c10::DeviceIndex tl_device = 0;
thread_local c10::StreamId tl_stream[kMaxDevices] = {};

// A symbol of the ACL library memsnap loaded (MEMSNAP_ACL_LIBRARY, opened
// by memsnap without RTLD_GLOBAL), or NULL before it is loaded.
void* acl_sym(const char* name) {
  const char* path = std::getenv("MEMSNAP_ACL_LIBRARY");
  void* h = dlopen(path != nullptr ? path : "libascendcl.so",
                   RTLD_NOW | RTLD_NOLOAD);
  void* sym = h != nullptr ? dlsym(h, name) : dlsym(RTLD_DEFAULT, name);
  if (h != nullptr) dlclose(h);
  return sym;
}

long acl_control(const char* what, long value) {
  using fn_t = long (*)(const char*, long);
  auto fn = reinterpret_cast<fn_t>(acl_sym("fake_acl_control"));
  return fn != nullptr ? fn(what, value) : -1;
}

int device_count() {
  const char* d = std::getenv("FAKE_ACL_DEVICES");
  int n = d != nullptr ? std::atoi(d) : 2;
  return n > 0 && n <= kMaxDevices ? n : 2;
}

aclrtStream handle(c10::DeviceIndex device, c10::StreamId id) {
  return reinterpret_cast<aclrtStream>(static_cast<uintptr_t>(
      0x5000000 + device * 0x10000 + (id + 1) * 0x10));
}

void drain(c10::DeviceIndex device) {
  pending[device].store(0);
  acl_records_at_drain.store(acl_control("record_calls", 0));
  drains.fetch_add(1);
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, tl_device);
  }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) tl_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex i = d.has_index() ? d.index() : tl_device;
    return c10::Stream(c10::Stream::UNSAFE,
                       c10::Device(c10::DeviceType::PrivateUse1, i),
                       tl_stream[i]);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Stream old = getStream(s.device());
    tl_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

using Pluggable = torch::npu::NPUPluggableAllocator::NPUPluggableAllocator;
std::mutex current_mutex;
std::shared_ptr<Pluggable> current;  // change_current_allocator's
bool current_used = false;

c10_npu::NPUStream make_stream(int device, int64_t id) {
  return c10_npu::NPUStream(c10::Stream(
      c10::Stream::UNSAFE,
      c10::Device(c10::DeviceType::PrivateUse1,
                  static_cast<c10::DeviceIndex>(device)),
      id));
}

thread_local std::string last_error;

} // namespace

// ---- c10_npu ---------------------------------------------------------------

namespace c10_npu {

NPUStream::NPUStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream_.device_type() == c10::DeviceType::PrivateUse1,
              "not an NPU stream");
}

aclrtStream NPUStream::stream() const {
  drain(tl_device);
  return handle(device_index(), id());
}

aclrtStream NPUStream::stream(const bool need_empty) const {
  if (need_empty) return stream();
  return handle(device_index(), id());
}

NPUStream getNPUStreamFromPool(c10::DeviceIndex device) {
  static std::atomic<c10::StreamId> next{1};
  return make_stream(device < 0 ? tl_device : device, next.fetch_add(1));
}

NPUStream getDefaultNPUStream(c10::DeviceIndex device_index) {
  return make_stream(device_index < 0 ? tl_device : device_index, 0);
}

NPUStream getCurrentNPUStream(c10::DeviceIndex device_index) {
  c10::DeviceIndex d = device_index < 0 ? tl_device : device_index;
  return make_stream(d, tl_stream[d]);
}

aclrtStream getCurrentNPUStreamNoWait(c10::DeviceIndex device_index) {
  c10::DeviceIndex d = device_index < 0 ? tl_device : device_index;
  return handle(d, tl_stream[d]);
}

bool npuSynchronizeDevice(bool check_error) {
  for (int d = 0; d < device_count(); d++) drain(static_cast<c10::DeviceIndex>(d));
  using fn_t = int (*)(void);
  auto fn = reinterpret_cast<fn_t>(acl_sym("aclrtSynchronizeDevice"));
  int rc = fn != nullptr ? fn() : 0;
  syncs.fetch_add(1);
  TORCH_CHECK(!check_error || rc == 0, "aclrtSynchronizeDevice failed: ", rc);
  return rc == 0;
}

void setCurrentNPUStream(NPUStream stream) {
  tl_stream[stream.device_index()] = stream.id();
}

} // namespace c10_npu

// ---- NPUPluggableAllocator ------------------------------------------------------

namespace torch::npu::NPUPluggableAllocator {

NPUPluggableAllocator::NPUPluggableAllocator(
    std::function<void*(size_t, int, aclrtStream)> alloc_fn,
    std::function<void(void*, size_t, int, aclrtStream)> free_fn)
    : alloc_fn_(std::move(alloc_fn)), free_fn_(std::move(free_fn)) {}

void NPUPluggableAllocator::set_init_fn(std::function<void(int)> f) {
  init_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_reset_fn(std::function<void(bool)> f) {
  reset_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_memory_fraction_fn(
    std::function<void(double, int)> f) {
  memory_fraction_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_base_alloc_fn(
    std::function<void*(void*, size_t*)> f) {
  base_alloc_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_record_stream_fn(
    std::function<void(void* ptr, c10_npu::NPUStream stream)> f) {
  record_stream_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_erase_stream_fn(
    std::function<void(void* ptr, c10_npu::NPUStream stream)> f) {
  erase_stream_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_get_device_stats_fn(
    std::function<c10_npu::NPUCachingAllocator::DeviceStats(int)> f) {
  get_device_stats_fn_ = std::move(f);
}
void NPUPluggableAllocator::set_reset_peak_status_fn(std::function<void(int)> f) {
  reset_peak_status_fn_ = std::move(f);
}

// As torch_npu: the result is recorded without a NULL check.
void* NPUPluggableAllocator::malloc(size_t size, int device, aclrtStream stream) {
  void* r = alloc_fn_(size, device, stream);
  std::lock_guard<std::mutex> g(allocator_mutex_);
  allocation_metadata_.emplace(r, Meta{size, device, stream});
  return r;
}

void NPUPluggableAllocator::raw_delete(void* ptr) {
  Meta m{};
  {
    std::lock_guard<std::mutex> g(allocator_mutex_);
    auto it = allocation_metadata_.find(ptr);
    TORCH_CHECK(it != allocation_metadata_.end(),
                "Trying to free a pointer not allocated here");
    m = it->second;
    allocation_metadata_.erase(it);
  }
  free_fn_(ptr, m.size, m.device, m.stream);
}

void NPUPluggableAllocator::init(int device_count) {
  if (init_fn_) init_fn_(device_count);
}
void NPUPluggableAllocator::setMemoryFraction(double fraction, int device) {
  if (memory_fraction_fn_) memory_fraction_fn_(fraction, device);
}
void NPUPluggableAllocator::emptyCache(bool check_error) {
  if (reset_fn_) reset_fn_(check_error);
}
void* NPUPluggableAllocator::getBaseAllocation(void* ptr, size_t* size) {
  return base_alloc_fn_ ? base_alloc_fn_(ptr, size) : ptr;
}
void NPUPluggableAllocator::recordStream(void* ptr, streamType stream) {
  if (record_stream_fn_) record_stream_fn_(ptr, stream);
}
void NPUPluggableAllocator::eraseStream(void* ptr, streamType stream) {
  if (erase_stream_fn_) erase_stream_fn_(ptr, stream);
}
c10_npu::NPUCachingAllocator::DeviceStats NPUPluggableAllocator::getDeviceStats(
    int device) {
  TORCH_CHECK(static_cast<bool>(get_device_stats_fn_),
              "get_device_stats_fn_ is not define, please set by "
              "set_get_device_stats_fn");
  return get_device_stats_fn_(device);
}
void NPUPluggableAllocator::resetPeakStats(int device) {
  if (reset_peak_status_fn_) reset_peak_status_fn_(device);
}

} // namespace torch::npu::NPUPluggableAllocator

// ---- the ctypes side (the stand-in's torch_npu._C) ------------------------------

namespace {

Pluggable* get_current() {
  std::lock_guard<std::mutex> g(current_mutex);
  TORCH_CHECK(current != nullptr, "no current NPU allocator");
  return current.get();
}

// Run f; on a C++ exception keep its text and return the kind: 1 for
// c10::OutOfMemoryError, 2 for any other error.
template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    last_error = e.what_without_backtrace();
    return 1;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 2;
  }
}

} // namespace

EXPORT const char* fake_npu_last_error(void) { return last_error.c_str(); }

// _npu_customAllocator: a new allocator (owned by the caller until
// fake_npu_change_current); init_fn runs at once, as torch_npu's
// createCustomAllocator does.
EXPORT void* fake_npu_custom_allocator(uint64_t alloc_fn, uint64_t free_fn) {
  using A = void*(size_t, int, aclrtStream);
  using F = void(void*, size_t, int, aclrtStream);
  return new Pluggable(reinterpret_cast<A*>(alloc_fn),
                       reinterpret_cast<F*>(free_fn));
}

// The _NPUPluggableAllocator.set_*_fn(func_ptr) bindings: the raw pointer
// becomes a std::function of the declared type, as torch_npu's pybind
// lambdas do.  Returns 0, or -1 for an unknown hook name.
EXPORT int fake_npu_set_hook(void* alloc, const char* name, uint64_t fn) {
  auto* a = static_cast<Pluggable*>(alloc);
  std::string n = name;
  if (n == "init") a->set_init_fn(reinterpret_cast<void (*)(int)>(fn));
  else if (n == "reset") a->set_reset_fn(reinterpret_cast<void (*)(bool)>(fn));
  else if (n == "memory_fraction")
    a->set_memory_fraction_fn(reinterpret_cast<void (*)(double, int)>(fn));
  else if (n == "base_alloc")
    a->set_base_alloc_fn(reinterpret_cast<void* (*)(void*, size_t*)>(fn));
  else if (n == "record_stream")
    a->set_record_stream_fn(
        reinterpret_cast<void (*)(void*, c10_npu::NPUStream)>(fn));
  else if (n == "erase_stream")
    a->set_erase_stream_fn(
        reinterpret_cast<void (*)(void*, c10_npu::NPUStream)>(fn));
  else if (n == "get_device_stats")
    a->set_get_device_stats_fn(
        reinterpret_cast<c10_npu::NPUCachingAllocator::DeviceStats (*)(int)>(fn));
  else if (n == "reset_peak_status")
    a->set_reset_peak_status_fn(reinterpret_cast<void (*)(int)>(fn));
  else return -1;
  return 0;
}

// _npu_changeCurrentAllocator: refused once a tensor was allocated.
EXPORT int fake_npu_change_current(void* alloc) {
  std::lock_guard<std::mutex> g(current_mutex);
  if (current_used) {
    last_error = "Can't swap an already initialized allocator";
    return 2;
  }
  current.reset(static_cast<Pluggable*>(alloc));
  current->init(tl_device);
  return 0;
}

// What allocating a tensor does: the current allocator, on the current
// device and its current stream (getCurrentNPUStreamNoWait).
EXPORT int fake_npu_alloc(size_t size, void** out) {
  return guarded([&] {
    Pluggable* a = get_current();
    {
      std::lock_guard<std::mutex> g(current_mutex);
      current_used = true;
    }
    *out = a->malloc(size, tl_device,
                     c10_npu::getCurrentNPUStreamNoWait(tl_device));
  });
}

EXPORT int fake_npu_free(void* ptr) {
  return guarded([&] { get_current()->raw_delete(ptr); });
}

// Tensor.record_stream(torch.npu.Stream) / HCCL's eraseStream.
EXPORT int fake_npu_record_stream(void* ptr, int device, int64_t stream_id) {
  return guarded([&] { get_current()->recordStream(ptr, make_stream(device, stream_id)); });
}
EXPORT int fake_npu_erase_stream(void* ptr, int device, int64_t stream_id) {
  return guarded([&] { get_current()->eraseStream(ptr, make_stream(device, stream_id)); });
}

EXPORT int fake_npu_empty_cache(int check_error) {
  return guarded([&] { get_current()->emptyCache(check_error != 0); });
}

EXPORT int fake_npu_set_memory_fraction(double fraction, int device) {
  return guarded([&] { get_current()->setMemoryFraction(fraction, device); });
}

EXPORT int fake_npu_base_alloc(void* ptr, void** base, size_t* size) {
  return guarded([&] { *base = get_current()->getBaseAllocation(ptr, size); });
}

// A few fields of getDeviceStats(device), by name (torch's memory_stats
// keys): allocated_bytes.all.current, reserved_bytes.all.current,
// allocated_bytes.all.peak, allocation.all.current, num_device_alloc.
EXPORT int fake_npu_stat(int device, const char* name, int64_t* out) {
  return guarded([&] {
    auto s = get_current()->getDeviceStats(device);
    std::string n = name;
    if (n == "allocated_bytes.all.current") *out = s.allocated_bytes[0].current;
    else if (n == "allocated_bytes.all.peak") *out = s.allocated_bytes[0].peak;
    else if (n == "reserved_bytes.all.current") *out = s.reserved_bytes[0].current;
    else if (n == "allocation.all.current") *out = s.allocation[0].current;
    else if (n == "num_device_alloc") *out = s.num_device_alloc;
    else TORCH_CHECK(false, "unknown stat ", n);
  });
}

EXPORT int fake_npu_reset_peak(int device) {
  return guarded([&] { get_current()->resetPeakStats(device); });
}

// A kernel launched on `device`: queued until the queue is drained.
EXPORT void fake_npu_launch(int device) { pending[device].fetch_add(1); }

EXPORT long fake_npu_counter(const char* name) {
  std::string n = name;
  if (n == "drains") return drains.load();
  if (n == "syncs") return syncs.load();
  if (n == "acl_records_at_drain") return acl_records_at_drain.load();
  if (n.rfind("pending", 0) == 0) return pending[std::atoi(n.c_str() + 7)].load();
  return -1;
}

EXPORT uint64_t fake_npu_stream_handle(int device, int64_t id) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(
      handle(static_cast<c10::DeviceIndex>(device), id)));
}

EXPORT void fake_npu_set_device(int device) {
  tl_device = static_cast<c10::DeviceIndex>(device);
}
EXPORT int fake_npu_current_device(void) { return tl_device; }
EXPORT int fake_npu_device_count(void) { return device_count(); }
EXPORT void fake_npu_set_stream(int device, int64_t id) { tl_stream[device] = id; }
