#include "tf_plugin/allocator/device_pool.h"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace tensile {
namespace {

std::mutex g_config_mu;
size_t g_configured_capacity = 0;  // 0 = not configured
std::atomic<StreamAwarePool*> g_device_pool{nullptr};

constexpr int64_t kUnboundStep = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> g_step_by_stream[kMaxStreams];
std::atomic<StreamId> g_bound_stream_limit{0};  // streams < this may be bound

struct StepTableInit {
  StepTableInit() {
    for (auto& s : g_step_by_stream) s.store(kUnboundStep);
  }
} g_step_table_init;

size_t CapacityLocked() {
  if (g_configured_capacity != 0) return g_configured_capacity;
  const size_t bytes = EnvByteCount("TENSILE_POOL_BYTES", 0);
  return bytes > 0 ? bytes : kDefaultDevicePoolBytes;
}

}  // namespace

void ConfigureDevicePool(size_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_device_pool.load() != nullptr) {
    throw std::logic_error(
        "the device pool already exists (TensorFlow created its CPU device); "
        "set its capacity before the first TensorFlow op, right after "
        "`import tensile_tf`, or with TENSILE_POOL_BYTES");
  }
  g_configured_capacity = capacity_bytes;
}

size_t DevicePoolCapacity() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (StreamAwarePool* pool = g_device_pool.load()) return pool->capacity();
  return CapacityLocked();
}

StreamAwarePool& GetOrCreateDevicePool() {
  if (StreamAwarePool* pool = g_device_pool.load()) return *pool;
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (StreamAwarePool* pool = g_device_pool.load()) return *pool;
  // Never destroyed: TensorFlow frees tensors during process exit.
  // TENSILE_POOL_TRACE_EVENTS: the event trace's ring size (default 65536;
  // recording a whole run for benchmarks/fragmentation_replay.py needs more).
  const size_t trace_events = EnvByteCount("TENSILE_POOL_TRACE_EVENTS", 0);
  auto* pool = new StreamAwarePool("device", CapacityLocked(),
                                   std::make_unique<HostBackend>(DevicePoolStitching()),
                                   trace_events > 0 ? trace_events : size_t{1} << 16,
                                   DevicePoolStitching());
  g_device_pool.store(pool);
  return *pool;
}

StreamAwarePool* DevicePoolIfCreated() { return g_device_pool.load(); }

bool DevicePoolStitching() {
  const char* env = std::getenv("TENSILE_POOL_STITCH");
  return env == nullptr || std::string(env) != "0";
}

void BindStepToStream(int64_t step_id, StreamId stream) {
  if (stream <= kDefaultStream || stream >= kMaxStreams) return;
  g_step_by_stream[stream].store(step_id, std::memory_order_release);
  StreamId limit = g_bound_stream_limit.load();
  while (limit <= stream &&
         !g_bound_stream_limit.compare_exchange_weak(limit, stream + 1)) {
  }
}

void UnbindStream(StreamId stream) {
  if (stream <= kDefaultStream || stream >= kMaxStreams) return;
  g_step_by_stream[stream].store(kUnboundStep, std::memory_order_release);
}

StreamId StreamForStep(int64_t step_id) {
  const StreamId limit = g_bound_stream_limit.load(std::memory_order_acquire);
  for (StreamId s = 1; s < limit; ++s) {
    if (g_step_by_stream[s].load(std::memory_order_acquire) == step_id) {
      return s;
    }
  }
  return kDefaultStream;
}

namespace {
thread_local StreamId t_thread_stream = kDefaultStream;
}  // namespace

StreamId SetThreadStream(StreamId stream) {
  const StreamId previous = t_thread_stream;
  t_thread_stream = stream;
  return previous;
}

StreamId ThreadStream() { return t_thread_stream; }

StreamId StreamForAllocation(int64_t step_id) {
  const StreamId s = StreamForStep(step_id);
  return s != kDefaultStream ? s : t_thread_stream;
}

}  // namespace tensile
