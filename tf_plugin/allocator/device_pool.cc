#include "tf_plugin/allocator/device_pool.h"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace tensile {
namespace {

std::mutex g_config_mu;
PluginSettings g_settings;  // guarded by g_config_mu
std::atomic<StreamAwarePool*> g_device_pool{nullptr};

constexpr int64_t kUnboundStep = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> g_step_by_stream[kMaxStreams];
std::atomic<StreamId> g_bound_stream_limit{0};  // streams < this may be bound

struct StepTableInit {
  StepTableInit() {
    for (auto& s : g_step_by_stream) s.store(kUnboundStep);
  }
} g_step_table_init;

}  // namespace

void ConfigurePlugin(const PluginSettings& settings) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_device_pool.load() != nullptr) {
    throw std::logic_error(
        "the device pool already exists (TensorFlow created its CPU device); "
        "set its capacity before the first TensorFlow op, right after "
        "`import tensile_tf`, or with TENSILE_POOL_BYTES");
  }
  g_settings = settings;
}

PluginSettings CurrentPluginSettings() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  return g_settings;
}

size_t DevicePoolCapacity() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (StreamAwarePool* pool = g_device_pool.load()) return pool->capacity();
  return g_settings.pool_bytes;
}

StreamAwarePool& GetOrCreateDevicePool() {
  if (StreamAwarePool* pool = g_device_pool.load()) return *pool;
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (StreamAwarePool* pool = g_device_pool.load()) return *pool;
  // Never destroyed: TensorFlow frees tensors during process exit.
  // pool_trace_events: the event trace's ring (recording a whole run for
  // benchmarks/fragmentation_replay.py needs more than the default).
  auto* pool = new StreamAwarePool("device", g_settings.pool_bytes,
                                   std::make_unique<HostBackend>(g_settings.pool_stitch),
                                   g_settings.pool_trace_events > 0 ? g_settings.pool_trace_events : size_t{1} << 16,
                                   g_settings.pool_stitch);
  g_device_pool.store(pool);
  return *pool;
}

StreamAwarePool* DevicePoolIfCreated() { return g_device_pool.load(); }

bool DevicePoolStitching() { return CurrentPluginSettings().pool_stitch; }

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
