// The pool behind a C ABI (pool_c_abi.h): the policy is in the header.
#include "tf_plugin/allocator/pool_c_abi.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tf_plugin/allocator/async_host_backend.h"
#include "tf_plugin/allocator/stream_aware_pool.h"
#ifdef TENSILE_WITH_CUDA
#include "tf_plugin/allocator/cuda_backend.h"
#endif

namespace tensile {
namespace {

#ifdef TENSILE_WITH_CUDA
constexpr const char* kDefaultBackend = "cuda";
constexpr const char* kBuiltIn = "cuda, async-host, host";
#else
constexpr const char* kDefaultBackend = "async-host";
constexpr const char* kBuiltIn = "async-host, host (built without CUDA)";
#endif

// The process's pool and what it knows of the caller's streams.
struct Process {
  std::unique_ptr<StreamAwarePool> pool;
  StreamKernels* kernels = nullptr;  // the backend's, when it has them
#ifdef TENSILE_WITH_CUDA
  CudaBackend* cuda = nullptr;       // to adopt streams (policy 2)
#endif
  int device = -1;                   // -1: any (host backends)
  std::map<const void*, StreamId> streams;  // caller's handle -> pool stream
};

std::mutex g_mu;             // guards g_process and its streams map
Process* g_process = nullptr;  // never deleted at exit (policy 5)
thread_local std::string g_error;

int Fail(const std::string& why) {
  g_error = why;
  return -1;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// Requires g_mu. Throws std::exception with the reason.
void InitLocked(const std::string& backend, uint64_t capacity, int flags) {
  if (g_process != nullptr) {
    if (g_process->pool->Stats().counters.current > 0) {
      throw std::runtime_error(
          "tensile_pool_init: the pool already holds " +
          HumanBytes(g_process->pool->Stats().counters.current) +
          " of live allocations; free them (or call it before the first allocation)");
    }
    delete g_process;
    g_process = nullptr;
  }
  auto p = std::make_unique<Process>();
  const bool stitch = (flags & TENSILE_POOL_STITCH) != 0;
  std::unique_ptr<PoolBackend> b;
  if (backend == "async-host") {
    // Lockstep with no one ticking: queued work runs only when the pool
    // waits for it, the most asynchronous a device can be (MakeBackend).
    AsyncHostBackend::Options o;
    o.stitchable = stitch;
    auto a = std::make_unique<AsyncHostBackend>(o);
    p->kernels = a.get();
    b = std::move(a);
  } else if (backend == "host") {
    b = std::make_unique<HostBackend>(stitch);
#ifdef TENSILE_WITH_CUDA
  } else if (backend == "cuda") {
    CudaBackend::Options o;
    const char* dev = std::getenv("TENSILE_POOL_DEVICE");
    o.device = dev ? std::atoi(dev) : 0;
    o.stitch = stitch;
    auto c = std::make_unique<CudaBackend>(o);
    p->kernels = c.get();
    p->cuda = c.get();
    p->device = o.device;
    b = std::move(c);
#endif
  } else {
    throw std::invalid_argument("tensile_pool_init: unknown backend '" + backend +
                                "'; built in: " + kBuiltIn);
  }
  p->pool = std::make_unique<StreamAwarePool>("c-abi", static_cast<size_t>(capacity),
                                              std::move(b), 1 << 10, stitch);
  p->pool->SetTraceEnabled(false);
  g_process = p.release();
}

// Requires g_mu. Policy 1: the pool from the environment.
Process* ProcessLocked() {
  if (g_process == nullptr) {
    const char* backend = std::getenv("TENSILE_POOL_BACKEND");
    const char* stitch = std::getenv("TENSILE_POOL_STITCH");
    InitLocked(backend && *backend ? backend : kDefaultBackend,
               EnvByteCount("TENSILE_POOL_BYTES", size_t{1} << 30),
               stitch && std::string(stitch) == "0" ? 0 : TENSILE_POOL_STITCH);
  }
  return g_process;
}

// Requires g_mu. Policy 2: the pool stream of a caller's stream handle.
StreamId StreamLocked(Process* p, const void* handle) {
  auto it = p->streams.find(handle);
  if (it != p->streams.end()) return it->second;
  const StreamId id = p->pool->RegisterStream("stream " + Hex(handle));
#ifdef TENSILE_WITH_CUDA
  if (p->cuda) p->cuda->AdoptStream(id, static_cast<CUstream_st*>(const_cast<void*>(handle)));
#endif
  p->streams.emplace(handle, id);
  return id;
}

}  // namespace
}  // namespace tensile

using namespace tensile;  // NOLINT: the C functions below only

extern "C" {

int tensile_pool_init(const char* backend, uint64_t capacity, int flags) {
  std::lock_guard<std::mutex> lock(g_mu);
  try {
    InitLocked(backend ? backend : kDefaultBackend, capacity, flags);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  return 0;
}

int tensile_pool_shutdown(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_process == nullptr) return 0;
  const int64_t live = g_process->pool->Stats().counters.current;
  if (live > 0) {
    return Fail("tensile_pool_shutdown: " + HumanBytes(live) +
                " still allocated; free every allocation first");
  }
  delete g_process;
  g_process = nullptr;
  return 0;
}

void* tensile_pool_alloc(ssize_t size, int device, void* stream) {
  StreamAwarePool* pool;
  StreamId id;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Process* p;
    try {
      p = ProcessLocked();
      if (p->device >= 0 && device != p->device) {
        Fail("tensile pool: asked for device " + std::to_string(device) +
             " but the pool is on device " + std::to_string(p->device) +
             "; set TENSILE_POOL_DEVICE, or keep the job on the pool's device");
        return nullptr;
      }
      id = StreamLocked(p, stream);
    } catch (const std::exception& e) {
      Fail(e.what());
      return nullptr;
    }
    pool = p->pool.get();
  }
  if (size <= 0) return nullptr;
  // Outside g_mu: the pool has its own lock, and a sync may wait on a stream.
  void* ptr = pool->Allocate(static_cast<size_t>(size), id);
  if (ptr == nullptr) {
    g_error = pool->DescribeOom(static_cast<size_t>(size), id, "tensile_pool_alloc");
    std::fprintf(stderr, "%s\n", g_error.c_str());
  }
  return ptr;
}

void tensile_pool_free(void* ptr, ssize_t /*size*/, int /*device*/, void* /*stream*/) {
  if (ptr == nullptr) return;
  StreamAwarePool* pool;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_process == nullptr) {
      std::fprintf(stderr, "tensile_pool_free(%p) without a pool; aborting\n", ptr);
      std::abort();
    }
    pool = g_process->pool.get();
  }
  pool->Deallocate(ptr);  // policy 3: to the allocating stream
}

int64_t tensile_pool_stats_json(char* buf, uint64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_process == nullptr) return Fail("tensile_pool_stats_json: no pool yet");
  const StreamAwarePool& pool = *g_process->pool;
  const PoolStats s = pool.Stats();
  std::ostringstream o;
  o << "{\"kind\": \"pool_stats\", \"backend\": \"" << s.backend
    << "\", \"capacity\": " << s.capacity << ", \"current\": " << s.counters.current
    << ", \"peak\": " << s.counters.peak << ", \"allocated\": " << s.counters.allocated
    << ", \"freed\": " << s.counters.freed << ", \"num_allocs\": " << s.counters.num_allocs
    << ", \"num_frees\": " << s.counters.num_frees << ", \"num_ooms\": " << s.counters.num_ooms
    << ", \"syncs\": " << s.num_syncs << ", \"allocator_syncs\": " << s.num_allocator_syncs
    << ", \"stream_waits\": " << s.num_stream_waits << ", \"stitched\": " << s.num_stitched
    << ", \"stitched_current\": " << s.stitched_current
    << ", \"largest_free_chunk\": " << s.largest_free_chunk
    << ", \"invariant_error\": \"" << pool.CheckInvariants() << "\", \"streams\": [";
  const std::vector<StreamStats> all = pool.AllStreamStats();
  bool first = true;
  for (const auto& [handle, id] : g_process->streams) {
    for (const StreamStats& st : all) {
      if (st.stream != id) continue;
      o << (first ? "" : ", ") << "{\"stream\": " << id << ", \"handle\": \"" << Hex(handle)
        << "\", \"current\": " << st.counters.current << ", \"peak\": " << st.counters.peak
        << ", \"num_allocs\": " << st.counters.num_allocs
        << ", \"unsynced_free_bytes\": " << st.unsynced_free_bytes << "}";
      first = false;
    }
  }
  o << "]}";
  const std::string json = o.str();
  if (buf != nullptr && n > json.size()) {
    json.copy(buf, json.size());
    buf[json.size()] = '\0';
  }
  return static_cast<int64_t>(json.size());
}

void tensile_pool_reset_peak(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_process != nullptr) g_process->pool->ResetPeak();
}

void tensile_pool_sync(void) {
  StreamAwarePool* pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_process != nullptr) pool = g_process->pool.get();
  }
  if (pool != nullptr) pool->SyncAndCoalesce();
}

const char* tensile_pool_last_error(void) { return g_error.c_str(); }

static int Enqueue(bool fill, void* stream, void* ptr, uint64_t bytes, uint64_t pattern) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_process == nullptr || g_process->kernels == nullptr) {
    return Fail("tensile_pool_enqueue: no pool, or its backend has no kernels (host)");
  }
  if (!g_process->pool->Accessible(ptr, static_cast<size_t>(bytes))) {
    return Fail("tensile_pool_enqueue: [" + Hex(ptr) + ", +" + std::to_string(bytes) +
                ") is not inside one allocation of the pool");
  }
  const StreamId id = StreamLocked(g_process, stream);
  if (fill) {
    g_process->kernels->EnqueueFill(id, ptr, static_cast<size_t>(bytes), pattern);
  } else {
    g_process->kernels->EnqueueVerify(id, ptr, static_cast<size_t>(bytes), pattern);
  }
  return 0;
}

int tensile_pool_enqueue_fill(void* stream, void* ptr, uint64_t bytes, uint64_t pattern) {
  return Enqueue(true, stream, ptr, bytes, pattern);
}

int tensile_pool_enqueue_verify(void* stream, void* ptr, uint64_t bytes, uint64_t pattern) {
  return Enqueue(false, stream, ptr, bytes, pattern);
}

int64_t tensile_pool_drain_corruptions(void) {
  StreamKernels* k = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_process == nullptr || g_process->kernels == nullptr) {
      return Fail("tensile_pool_drain_corruptions: no pool, or its backend has no kernels");
    }
    k = g_process->kernels;
  }
  return k->DrainAndCountCorruptions();
}

}  // extern "C"
