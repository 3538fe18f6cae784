// record.cpp -- record_function ranges into memsnap's history, through
// at::RecordFunction callbacks, as PyTorch's CUDA allocator gets them
// (torch/csrc/cuda/memory_snapshot.cpp, setRecordFunctionCallbacks):
//
//   - USER_SCOPE ranges (torch.profiler.record_function, which enters an
//     at::RecordFunction through torch.ops.profiler._record_function_enter_new,
//     and C++ RECORD_USER_SCOPE) become external_annotations START/END
//     entries: a global callback with global_record_annotations, else a
//     thread-local one on the thread that enabled history (torch's choice:
//     it also runs where that thread's state is propagated, e.g. autograd's
//     device threads).  Added once; the choice holds until history is
//     disabled.
//   - FUNCTION ranges named "Torch-Compiled Region..." (torch.compile's
//     runtime opens them from C++) push / pop memsnap's thread-local
//     compile context: a global callback, added once compile_context=True.
//
// Disabling history removes both (nothing runs per range then).  Two cases
// torch does not meet, since memsnap.torch may act from another thread than
// the enabling one (torch imported later, by another thread; history
// disabled by another thread):
//   - the enabling thread is not the calling one: a global callback that
//     records the enabling thread only (pthread_self(), which is Python's
//     threading.get_ident() on POSIX);
//   - a thread-local callback cannot be removed from another thread: it is
//     switched off (an atomic flag) and removed by its thread when that
//     thread next turns history on or off; meanwhile no second thread-local
//     one is added (a global filtered one instead), so a range is never
//     recorded twice.
#include "shim.h"

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace memsnap_torch {
namespace {

// The device types memsnap.torch passes (python/memsnap/_shim.py).
static_assert(static_cast<int>(c10::DeviceType::CUDA) == 1);
static_assert(static_cast<int>(c10::DeviceType::PrivateUse1) == 20);

constexpr char kCompiledPrefix[] = "Torch-Compiled Region";

std::mutex g_mutex; // the handles below
at::CallbackHandle g_annotations = 0; // USER_SCOPE -> external_annotations
bool g_annotations_local = false;     // ... registered thread-locally
at::CallbackHandle g_compile = 0;     // FUNCTION -> compile context
// A thread-local callback that another thread could not remove (switched
// off), and whether the calling thread holds it.
at::CallbackHandle g_stale_local = 0;
thread_local bool t_holds_local = false;

std::atomic<bool> g_local_on{false}; // the thread-local callback records
std::atomic<pthread_t> g_thread{};   // the enabling thread (filtered one)
std::atomic<int> g_device_type{-1};  // whose current device is `device`

// The current device of memsnap's device type (memsnap.memory's current
// device): the device guard's, 0 without one.
int current_device() {
  int t = g_device_type.load(std::memory_order_relaxed);
  if (t < 0) return 0;
  try {
    auto type = static_cast<c10::DeviceType>(t);
    if (!c10::impl::hasDeviceGuardImpl(type)) return 0;
    auto index = c10::impl::getDeviceGuardImpl(type)->getDevice().index();
    return index < 0 ? 0 : index;
  } catch (...) {
    return 0;
  }
}

void annotate(const at::RecordFunction& fn, bool start) {
  msnap_allocator_t* a = msnap_default();
  if (a == nullptr) return;
  const char* name = fn.name();
  int rc = msnap_record_annotation(a, current_device(),
                                   name != nullptr ? name : "", start);
  if (rc < 0) report("record_function annotation", rc);
}

std::unique_ptr<at::ObserverContext> start_all(const at::RecordFunction& fn) {
  annotate(fn, true);
  return nullptr;
}
void end_all(const at::RecordFunction& fn, at::ObserverContext*) {
  annotate(fn, false);
}

std::unique_ptr<at::ObserverContext> start_local(const at::RecordFunction& fn) {
  if (g_local_on.load(std::memory_order_relaxed)) annotate(fn, true);
  return nullptr;
}
void end_local(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_local_on.load(std::memory_order_relaxed)) annotate(fn, false);
}

bool on_enabling_thread() {
  return pthread_equal(pthread_self(), g_thread.load(std::memory_order_relaxed));
}
std::unique_ptr<at::ObserverContext> start_thread(const at::RecordFunction& fn) {
  if (on_enabling_thread()) annotate(fn, true);
  return nullptr;
}
void end_thread(const at::RecordFunction& fn, at::ObserverContext*) {
  if (on_enabling_thread()) annotate(fn, false);
}

bool compiled_region(const at::RecordFunction& fn) {
  const char* name = fn.name();
  return name != nullptr &&
         std::strncmp(name, kCompiledPrefix, sizeof kCompiledPrefix - 1) == 0;
}
std::unique_ptr<at::ObserverContext> start_compile(const at::RecordFunction& fn) {
  if (compiled_region(fn)) {
    int rc = msnap_compile_context_push(fn.name());
    if (rc < 0) report("compile context push", rc);
  }
  return nullptr;
}
void end_compile(const at::RecordFunction& fn, at::ObserverContext*) {
  // a range entered before the callback was added never pushed: its end
  // runs only the callbacks its start ran (RecordFunction keeps them)
  if (compiled_region(fn)) {
    int rc = msnap_compile_context_pop();
    if (rc < 0) report("compile context pop", rc);
  }
}

// The calling thread's stale thread-local callback, removed.
void drop_stale_here() {
  if (g_stale_local != 0 && t_holds_local) {
    at::removeCallback(g_stale_local);
    g_stale_local = 0;
    t_holds_local = false;
  }
}

void remove_all() {
  if (g_annotations != 0) {
    if (!g_annotations_local || t_holds_local) {
      at::removeCallback(g_annotations);
      if (g_annotations_local) t_holds_local = false;
    } else {
      g_stale_local = g_annotations; // its thread removes it
    }
    g_local_on.store(false);
    g_annotations = 0;
    g_annotations_local = false;
  }
  if (g_compile != 0) {
    at::removeCallback(g_compile);
    g_compile = 0;
  }
}

void add(bool compile_context, bool global_annotations, pthread_t thread) {
  if (g_annotations == 0) {
    if (global_annotations) {
      g_annotations = at::addGlobalCallback(
          at::RecordFunctionCallback(start_all, end_all)
              .scopes({at::RecordScope::USER_SCOPE}));
    } else if (pthread_equal(pthread_self(), thread) && g_stale_local == 0) {
      g_annotations = at::addThreadLocalCallback(
          at::RecordFunctionCallback(start_local, end_local)
              .scopes({at::RecordScope::USER_SCOPE}));
      g_annotations_local = true;
      t_holds_local = true;
      g_local_on.store(true);
    } else {
      g_thread.store(thread);
      g_annotations = at::addGlobalCallback(
          at::RecordFunctionCallback(start_thread, end_thread)
              .scopes({at::RecordScope::USER_SCOPE}));
    }
  }
  if (compile_context && g_compile == 0) {
    g_compile = at::addGlobalCallback(
        at::RecordFunctionCallback(start_compile, end_compile)
            .scopes({at::RecordScope::FUNCTION}));
  }
}

} // namespace
} // namespace memsnap_torch

extern "C" {

// History turned on (enabled != 0: add the callbacks that are missing) or
// off (remove them).  `thread` is the enabling thread (Python's
// threading.get_ident()); `device_type` a c10::DeviceType whose current
// device annotations name (-1: device 0).  NULL, or the error text.
__attribute__((visibility("default"))) const char* msnap_torch_record_functions(
    int enabled, int compile_context, int global_annotations,
    unsigned long thread, int device_type) {
  using namespace memsnap_torch;
  static thread_local std::string err;
  std::lock_guard<std::mutex> g(g_mutex);
  try {
    g_device_type.store(device_type);
    drop_stale_here();
    if (enabled)
      add(compile_context != 0, global_annotations != 0,
          static_cast<pthread_t>(thread));
    else
      remove_all();
  } catch (const std::exception& e) {
    err = e.what();
    return err.c_str();
  }
  return nullptr;
}

// The device type whose current device annotations name (see above).
__attribute__((visibility("default"))) void msnap_torch_record_device(
    int device_type) {
  memsnap_torch::g_device_type.store(device_type);
}

// Which callbacks are registered: 1 = annotations (2 = thread-local), 4 =
// compile context, 8 = a stale thread-local one (switched off).
__attribute__((visibility("default"))) int msnap_torch_record_callbacks(void) {
  using namespace memsnap_torch;
  std::lock_guard<std::mutex> g(g_mutex);
  return (g_annotations != 0 ? 1 : 0) | (g_annotations_local ? 2 : 0) |
         (g_compile != 0 ? 4 : 0) | (g_stale_local != 0 ? 8 : 0);
}

} // extern "C"
