// npu.cpp -- memsnap under torch_npu: the pieces that need torch_npu's C++
// types (built as libmemsnap_torch_npu.so against the installed torch_npu's
// headers; the tests build it against stand-in headers made from the real
// signatures, tests/fakes/torch_npu/).
//
//   - msnap_npu_record_stream / msnap_npu_erase_stream: the record_stream_fn
//     and erase_stream_fn of torch_npu's NPUPluggableAllocator.  torch_npu
//     passes a c10_npu::NPUStream by value (NPUPluggableAllocator::
//     recordStream calls record_stream_fn_(ptr.get(), stream)); NPUStream
//     has a user-declared destructor, so the Itanium ABI passes it by
//     invisible reference: a C function taking void* would receive the
//     address of a temporary on the host, not the stream.  The parameter
//     type here is the one the installed header declares for
//     set_record_stream_fn (NPUStream, or aclrtStream in the versions that
//     convert first), and memsnap gets the stream's aclrtStream, the
//     handle torch_npu's allocate() passes to alloc_fn.
//   - msnap_npu_get_device_stats / msnap_npu_reset_peak_stats: the
//     get_device_stats_fn / reset_peak_status_fn of the torch_npu versions
//     that have them, so torch.npu.memory_stats() describes memsnap.
//   - msnap_npu_install_runtime: memsnap's default allocator on the acl
//     runtime with torch_npu's task queue respected.  torch_npu launches
//     kernels through a per-device queue (TASK_QUEUE_ENABLE); its caching
//     allocator synchronizes with npuSynchronizeDevice (drain every queue,
//     then aclrtSynchronizeDevice) and records events as queue tasks
//     (LaunchRecordEventTask), so an event really follows the kernels
//     queued before it.  memsnap's acl runtime calls ACL directly; this
//     ops table drains first: device_synchronize calls npuSynchronizeDevice
//     before the runtime's own synchronize, and event_record drains the
//     device's queue (NPUStream::stream() of the default stream waits for
//     MakeSureQueueEmpty) before aclrtRecordEvent.  Same ordering as
//     torch_npu; it waits for the launcher thread where torch_npu enqueues.
#include "shim.h"

#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/npu/NPUPluggableAllocator.h"

namespace {

using memsnap_torch::as_u64;
using memsnap_torch::report;

using Pluggable = torch::npu::NPUPluggableAllocator::NPUPluggableAllocator;
using DeviceStats = c10_npu::NPUCachingAllocator::DeviceStats;

// The stream parameter of record_stream_fn in the installed header.
template <class M>
struct hook_stream_arg;
template <class C, class A>
struct hook_stream_arg<void (C::*)(std::function<void(void*, A)>)> {
  using type = A;
};
using StreamArg =
    hook_stream_arg<decltype(&Pluggable::set_record_stream_fn)>::type;

// The aclrtStream of a stream argument, without draining the task queue
// where the header offers stream(bool need_empty).
template <class S>
auto raw_stream(const S& s, int) -> decltype(s.stream(false)) {
  return s.stream(false);
}
template <class S>
aclrtStream raw_stream(const S& s, long) {
  return s.stream();
}
aclrtStream to_handle(const c10_npu::NPUStream& s) { return raw_stream(s, 0); }
[[maybe_unused]] aclrtStream to_handle(aclrtStream s) { return s; }

void fill(c10::CachingAllocator::StatArray& out, const msnap_stat_t* in) {
  for (size_t t = 0; t < out.size() && t < MSNAP_STAT_TYPES; t++) {
    out[t].current = in[t].current;
    out[t].peak = in[t].peak;
    out[t].allocated = in[t].allocated;
    out[t].freed = in[t].freed;
  }
}

void fill_one(c10::CachingAllocator::Stat& out, const msnap_stat_t& in) {
  out.current = in.current;
  out.peak = in.peak;
  out.allocated = in.allocated;
  out.freed = in.freed;
}

// ---- the queue-aware acl runtime ------------------------------------------

const msnap_runtime_ops_t* acl() { return msnap_runtime_acl(); }

// Wait until device's task queue handed every queued task to ACL.
void drain_queue(int device) {
  const c10::DeviceGuard guard(
      c10::Device(c10::DeviceType::PrivateUse1,
                  static_cast<c10::DeviceIndex>(device)));
  (void)c10_npu::getDefaultNPUStream(static_cast<c10::DeviceIndex>(device))
      .stream();
}

int queued_device_synchronize(void* ctx, int device) {
  try {
    c10_npu::npuSynchronizeDevice(false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memsnap: npuSynchronizeDevice failed: %s\n",
                 e.what());
  }
  return acl()->device_synchronize(ctx, device);
}

int queued_event_record(void* ctx, int device, uint64_t event,
                        uint64_t stream) {
  try {
    drain_queue(device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memsnap: draining the NPU task queue failed: %s\n",
                 e.what());
    return MSNAP_ERUNTIME;
  }
  return acl()->event_record(ctx, device, event, stream);
}

msnap_runtime_ops_t queued_ops() {
  msnap_runtime_ops_t o = *acl();
  o.device_synchronize = queued_device_synchronize;
  o.event_record = queued_event_record;
  return o;
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) void msnap_npu_record_stream(
    void* ptr, StreamArg stream) {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr || ptr == nullptr) return;
  int rc = msnap_record_stream(a, as_u64(ptr), as_u64(to_handle(stream)));
  if (rc < 0) report("record_stream", rc);
}

__attribute__((visibility("default"))) void msnap_npu_erase_stream(
    void* ptr, StreamArg stream) {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr || ptr == nullptr) return;
  int rc = msnap_erase_stream(a, as_u64(ptr), as_u64(to_handle(stream)));
  if (rc < 0) report("erase_stream", rc);
}

// get_device_stats_fn: memsnap's statistics as torch_npu's DeviceStats.
__attribute__((visibility("default"))) DeviceStats msnap_npu_get_device_stats(
    int device) {
  DeviceStats out;
  msnap_allocator_t* a = msnap_default();
  msnap_stats_t st{};
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  if (a == nullptr || msnap_stats_get(a, device, &st) < 0) {
    report("get_device_stats", MSNAP_EINVAL);
    return out;
  }
  fill(out.allocation, st.allocation);
  fill(out.segment, st.segment);
  fill(out.active, st.active);
  fill(out.inactive_split, st.inactive_split);
  fill(out.allocated_bytes, st.allocated_bytes);
  fill(out.reserved_bytes, st.reserved_bytes);
  fill(out.active_bytes, st.active_bytes);
  fill(out.inactive_split_bytes, st.inactive_split_bytes);
  fill(out.requested_bytes, st.requested_bytes);
  fill_one(out.oversize_allocations, st.oversize_allocations);
  fill_one(out.oversize_segments, st.oversize_segments);
  out.num_alloc_retries = st.num_alloc_retries;
  out.num_ooms = st.num_ooms;
  out.num_sync_all_streams = st.num_sync_all_streams;
  out.num_device_alloc = st.num_device_alloc;
  out.num_device_free = st.num_device_free;
  out.max_split_size = st.max_split_size;
  return out;
}

// reset_peak_status_fn.
__attribute__((visibility("default"))) void msnap_npu_reset_peak_stats(
    int device) {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr) return;
  int rc = msnap_reset_peak_stats(a, device);
  if (rc < 0) report("reset_peak_stats", rc);
}

// Make memsnap's default allocator use the queue-aware acl runtime.  Must
// run before that allocator exists.  NULL, or the error text.
__attribute__((visibility("default"))) const char* msnap_npu_install_runtime(
    void) {
  static msnap_runtime_ops_t ops = queued_ops();
  static std::string err;
  int rc = msnap_set_default_runtime(&ops);
  if (rc == 0) return nullptr;
  err = msnap_last_error();
  return err.c_str();
}

} // extern "C"
