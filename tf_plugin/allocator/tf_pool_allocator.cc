// TensorFlow adapter: makes the device StreamAwarePool the allocator of
// TensorFlow's CPU device.
//
// Note [Becoming TensorFlow's CPU allocator]
// ProcessState asks AllocatorFactoryRegistry for the highest-priority factory
// when it first builds the CPU device. TF's own CPU allocator registers at
// priority 100 and oneDNN's at 200; ours registers at 300 when this library
// is loaded. That only works if the library is loaded before TensorFlow
// creates its context (tf_plugin/__init__.py checks and refuses otherwise:
// registering after the first allocator was handed out is a fatal CHECK).
// TF_CPU_ALLOCATOR_USE_BFC=1 makes TensorFlow build its own BFC allocator
// and bypass the registry, so the Python loader refuses that setting.
//
// Attribution: the executor wraps every kernel in a
// ScopedMemoryDebugAnnotation holding the op name and the step id. The step
// id maps to a job's stream (device_pool.h); the op name is copied into the
// pool's event trace.
//
// Note [Host fallback for conversions]
// Some TensorFlow paths outside op kernels do not check for a failed
// allocation: converting a large numpy array into an eager tensor writes
// through the null pointer and kills the process. Such allocations carry no
// op annotation. When the pool cannot serve one, it is served from host
// memory instead, counted (pool_stats()["host_fallback"]) and logged, so one
// job's oversized input fails later in a kernel with a clean OOM instead of
// taking the process down. This matches a real GPU system, where tensors
// built from Python data start out in host memory anyway. Op kernels never
// fall back: they get ResourceExhaustedError.
//
// Note [Host fallback while building]
// Building a job's step instantiates functions, and instantiation constant-
// folds: GraphRunner computes a folded constant and DeepCopy()s it into a
// tensor from the CPU allocator without checking the allocation. Inside the
// enclosing eager op's annotation the pool would return null and the memcpy
// kills the process (seen: a job built beside a running one in a 110 MiB
// pool with 3 MiB largest free chunk, __memcpy in tensor::DeepCopy under
// ConstantFold). A thread that builds beside running jobs therefore opens a
// host-fallback scope (SetThreadHostFallback): there, every allocation the
// pool cannot serve comes from host memory, counted as above. The host then
// treats any fallback during the build as the build running out of pool
// memory (the job waits, torn down), so nothing stays outside the pool.
//
// Note [Waiting for frees]
// Jobs that share the pool free their step's temporaries all the time; an
// allocation that fails now often fits a few milliseconds later, when a
// neighbour's step has freed (and the pool coalesced) its scratch. Seen: a
// residual net asked 27.0 MiB with 75.5 MiB free, largest chunk 26.4 MiB,
// beside a CNN whose 22 MiB convolution scratch came and went; the job
// failed. So, as TensorFlow's BFC allocator does (retry_on_failure), an op
// kernel's allocation that fails waits for frees: it retries after each
// deallocation until SetAllocationWaitMs() milliseconds have passed (0, the
// default, waits never; JobHost sets run.allocation_wait_ms), and only then
// counts and traces the OOM. Allocations outside op kernels and
// host-fallback scopes never wait. AllocationWaitStats() counts the waits,
// those that ended with memory, and the time waited; pool_stats() shows them.
//
// OOM message: TensorFlow's ResourceExhaustedError reads "OOM when allocating
// tensor ... by allocator <Name()>". After a failed allocation, Name()
// returns the pool's own explanation for the failing thread (what, where and
// what to do), so the error the user sees says why.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tf_plugin/allocator/device_pool.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"
#include "xla/tsl/framework/allocator.h"
#include "xla/tsl/framework/allocator_registry.h"
#include "xla/tsl/platform/logging.h"

namespace tensile {
namespace {

constexpr char kAllocatorName[] = "tensile_pool";
thread_local std::string t_last_oom_message;
thread_local bool t_host_fallback = false;  // Note [Host fallback while building]

// Note [Waiting for frees]
std::atomic<int64_t> g_wait_ms{0};
std::mutex g_wait_mu;
std::condition_variable g_freed;
int64_t g_free_epoch = 0;             // guarded by g_wait_mu: bumped by every free
AllocationWaitStats g_wait_stats;     // guarded by g_wait_mu

void NotifyFreed() {
  {
    std::lock_guard<std::mutex> lock(g_wait_mu);
    g_free_epoch += 1;
  }
  g_freed.notify_all();
}

// Live host-fallback allocations: pointer -> bytes. Rare, so a locked map.
std::mutex g_fallback_mu;
std::unordered_map<void*, size_t> g_fallback_sizes;
HostFallbackStats g_fallback_stats;

void* FallbackAllocate(size_t num_bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, StreamAwarePool::kMinChunkBytes,
                     std::max<size_t>(num_bytes, 1)) != 0) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  g_fallback_sizes[p] = num_bytes;
  g_fallback_stats.num_allocs += 1;
  g_fallback_stats.current += static_cast<int64_t>(num_bytes);
  g_fallback_stats.peak = std::max(g_fallback_stats.peak, g_fallback_stats.current);
  return p;
}

size_t FallbackSize(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  auto it = g_fallback_sizes.find(const_cast<void*>(ptr));
  return it == g_fallback_sizes.end() ? 0 : it->second;
}

void FallbackFree(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_fallback_mu);
    auto it = g_fallback_sizes.find(ptr);
    if (it != g_fallback_sizes.end()) {
      g_fallback_stats.current -= static_cast<int64_t>(it->second);
      g_fallback_sizes.erase(it);
    }
  }
  std::free(ptr);
}

class TensilePoolAllocator : public tsl::Allocator {
 private:
  // Note [Waiting for frees]: retries after each free until the deadline.
  void* WaitForFrees(size_t num_bytes, StreamId stream, std::string_view op,
                     int64_t wait_ms) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(wait_ms);
    void* p = nullptr;
    std::unique_lock<std::mutex> lock(g_wait_mu);
    g_wait_stats.waits += 1;
    g_wait_stats.waiting += 1;
    int64_t seen = g_free_epoch;
    while (p == nullptr) {
      if (!g_freed.wait_until(lock, deadline, [&] { return g_free_epoch != seen; })) break;
      seen = g_free_epoch;
      lock.unlock();
      p = pool_->TryAllocate(num_bytes, stream, op);
      lock.lock();
    }
    g_wait_stats.waiting -= 1;
    if (p != nullptr) g_wait_stats.served += 1;
    g_wait_stats.waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start).count();
    return p;
  }

 public:
  explicit TensilePoolAllocator(StreamAwarePool* pool) : pool_(pool) {}

  std::string Name() override {
    if (t_last_oom_message.empty()) return kAllocatorName;
    return std::string(kAllocatorName) + " (" + t_last_oom_message + ")";
  }

  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    if (alignment > StreamAwarePool::kMinChunkBytes) {
      t_last_oom_message = "alignment " + std::to_string(alignment) +
                           " above the pool's " +
                           std::to_string(StreamAwarePool::kMinChunkBytes);
      return nullptr;
    }
    const auto& annotation =
        tsl::profiler::ScopedMemoryDebugAnnotation::CurrentAnnotation();
    const StreamId stream = StreamForAllocation(annotation.pending_step_id);
    const int64_t wait_ms = g_wait_ms.load(std::memory_order_relaxed);
    void* p = nullptr;
    if (wait_ms > 0 && !annotation.pending_op_name.empty() && !t_host_fallback) {
      p = pool_->TryAllocate(num_bytes, stream, annotation.pending_op_name);
      if (p == nullptr) p = WaitForFrees(num_bytes, stream, annotation.pending_op_name, wait_ms);
    }
    if (p == nullptr) p = pool_->Allocate(num_bytes, stream, annotation.pending_op_name);
    if (p == nullptr && (annotation.pending_op_name.empty() || t_host_fallback)) {
      LOG(WARNING) << "tensile pool: "
                   << pool_->DescribeOom(num_bytes, stream, "<no op>")
                   << " -- outside any op kernel, served from host memory "
                      "instead (see pool_stats()['host_fallback'])";
      return FallbackAllocate(num_bytes);
    }
    if (p == nullptr) {
      t_last_oom_message = pool_->DescribeOom(num_bytes, stream,
                                              annotation.pending_op_name);
    } else if (!t_last_oom_message.empty()) {
      t_last_oom_message.clear();
    }
    return p;
  }

  void DeallocateRaw(void* ptr) override {
    if (ptr != nullptr && !pool_->Owns(ptr)) {
      FallbackFree(ptr);
      return;
    }
    const auto& annotation =
        tsl::profiler::ScopedMemoryDebugAnnotation::CurrentAnnotation();
    pool_->Deallocate(ptr, annotation.pending_op_name);
    if (g_wait_ms.load(std::memory_order_relaxed) > 0) NotifyFreed();
  }

  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override {
    return pool_->Owns(ptr) ? pool_->RequestedSize(ptr) : FallbackSize(ptr);
  }
  size_t AllocatedSize(const void* ptr) const override {
    return pool_->Owns(ptr) ? pool_->AllocatedSize(ptr) : FallbackSize(ptr);
  }
  int64_t AllocationId(const void* ptr) const override {
    return pool_->AllocationId(ptr);
  }

  std::optional<tsl::AllocatorStats> GetStats() override {
    const PoolStats s = pool_->Stats();
    tsl::AllocatorStats out;
    out.num_allocs = s.counters.num_allocs;
    out.bytes_in_use = s.counters.current;
    out.peak_bytes_in_use = s.counters.peak;
    out.largest_alloc_size = s.counters.largest_alloc;
    out.bytes_limit = s.capacity;
    out.bytes_reserved = 0;
    out.peak_bytes_reserved = 0;
    out.largest_free_block_bytes = s.largest_free_chunk;
    out.pool_bytes = s.capacity;
    out.peak_pool_bytes = s.capacity;
    return out;
  }

  bool ClearStats() override {
    pool_->ResetPeak();
    return true;
  }

  tsl::AllocatorMemoryType GetMemoryType() const override {
    return tsl::AllocatorMemoryType::kHostPageable;
  }

 private:
  StreamAwarePool* pool_;
};

// Hands out pool memory to TensorFlow code that asks the registry for a
// SubAllocator (NUMA-aware BFC paths); attributed to the default stream.
class TensilePoolSubAllocator : public tsl::SubAllocator {
 public:
  TensilePoolSubAllocator() : tsl::SubAllocator({}, {}) {}
  void* Alloc(size_t alignment, size_t num_bytes,
              size_t* bytes_received) override {
    void* p = GetOrCreateDevicePool().Allocate(num_bytes, kDefaultStream,
                                               "sub_allocator");
    *bytes_received = p == nullptr ? 0 : num_bytes;
    return p;
  }
  void Free(void* ptr, size_t num_bytes) override {
    GetOrCreateDevicePool().Deallocate(ptr, "sub_allocator");
  }
  bool SupportsCoalescing() const override { return false; }
};

class TensilePoolAllocatorFactory : public tsl::AllocatorFactory {
 public:
  tsl::Allocator* CreateAllocator() override {
    return new TensilePoolAllocator(&GetOrCreateDevicePool());
  }
  tsl::SubAllocator* CreateSubAllocator(int numa_node) override {
    return new TensilePoolSubAllocator();
  }
};

}  // namespace

void SetAllocationWaitMs(int64_t ms) { g_wait_ms.store(std::max<int64_t>(0, ms)); }

AllocationWaitStats GetAllocationWaitStats() {
  std::lock_guard<std::mutex> lock(g_wait_mu);
  AllocationWaitStats s = g_wait_stats;
  s.wait_ms = g_wait_ms.load();
  return s;
}

bool SetThreadHostFallback(bool on) {
  const bool previous = t_host_fallback;
  t_host_fallback = on;
  return previous;
}

HostFallbackStats GetHostFallbackStats() {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  return g_fallback_stats;
}

}  // namespace tensile

namespace tsl {
// Priority 300: above TF's default (100) and oneDNN's (200) CPU allocators.
REGISTER_MEM_ALLOCATOR("TensilePoolAllocator", 300,
                       ::tensile::TensilePoolAllocatorFactory);
}  // namespace tsl
