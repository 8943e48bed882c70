// CudaBackend (cuda_backend.h): the policy is in the header.
#include "tf_plugin/allocator/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace tensile {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA backend: ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

constexpr size_t kWordsPerGranule = kPatternGranule / sizeof(unsigned long long);

__global__ void FillPattern(unsigned long long* p, size_t granules,
                            unsigned long long pattern) {
  for (size_t g = blockIdx.x * size_t{blockDim.x} + threadIdx.x; g < granules;
       g += size_t{gridDim.x} * blockDim.x) {
    p[g * kWordsPerGranule] = pattern;
  }
}

// One block per buffer, so the buffer counts once however many words differ.
__global__ void VerifyPattern(const unsigned long long* p, size_t granules,
                              unsigned long long pattern,
                              unsigned long long* corruptions) {
  int bad = 0;
  for (size_t g = threadIdx.x; g < granules; g += blockDim.x) {
    bad |= p[g * kWordsPerGranule] != pattern;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicAdd(corruptions, 1ull);
}

// A slow stream on purpose (policy 4).
__global__ void SpinFor(long long ns) {
  const long long start = clock64();
  // clock64 counts SM cycles; ~1 GHz or more, so cycles >= ns is at least ns.
  while (clock64() - start < ns) {
  }
}

size_t Granules(size_t bytes) {
  return (bytes + kPatternGranule - 1) / kPatternGranule;
}

// A driver entry point through the runtime (Note [Stitching on a CUDA
// arena]): nullptr when the driver lacks it.
void* DriverEntry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

}  // namespace

// Policy 1: the driver's virtual memory management, as loaded.
struct CudaBackend::Vmm {
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  CUmemAllocationProp prop = {};
  CUmemAccessDesc access = {};

  // Loads the entry points; false where any is missing.
  bool Load(int device) {
    reserve = reinterpret_cast<PFN_cuMemAddressReserve_v10020>(DriverEntry("cuMemAddressReserve"));
    address_free = reinterpret_cast<PFN_cuMemAddressFree_v10020>(DriverEntry("cuMemAddressFree"));
    create = reinterpret_cast<PFN_cuMemCreate_v10020>(DriverEntry("cuMemCreate"));
    release = reinterpret_cast<PFN_cuMemRelease_v10020>(DriverEntry("cuMemRelease"));
    map = reinterpret_cast<PFN_cuMemMap_v10020>(DriverEntry("cuMemMap"));
    unmap = reinterpret_cast<PFN_cuMemUnmap_v10020>(DriverEntry("cuMemUnmap"));
    set_access = reinterpret_cast<PFN_cuMemSetAccess_v10020>(DriverEntry("cuMemSetAccess"));
    granularity = reinterpret_cast<PFN_cuMemGetAllocationGranularity_v10020>(
        DriverEntry("cuMemGetAllocationGranularity"));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return reserve && address_free && create && release && map && unmap && set_access &&
           granularity;
  }
  // Maps handles[0..n) at `at`, one granule each, and makes them accessible;
  // on failure unmaps what it mapped.
  bool MapGranules(char* at, const unsigned long long* handles, size_t n, size_t g) {
    for (size_t i = 0; i < n; ++i) {
      if (map(reinterpret_cast<CUdeviceptr>(at + i * g), g, 0, handles[i], 0) != CUDA_SUCCESS) {
        UnmapGranules(at, i, g);
        return false;
      }
    }
    if (set_access(reinterpret_cast<CUdeviceptr>(at), n * g, &access, 1) != CUDA_SUCCESS) {
      UnmapGranules(at, n, g);
      return false;
    }
    return true;
  }
  // cuMemUnmap takes whole mappings only: one per granule.
  void UnmapGranules(char* at, size_t n, size_t g) {
    for (size_t i = 0; i < n; ++i) unmap(reinterpret_cast<CUdeviceptr>(at + i * g), g);
  }
};

CudaBackend::CudaBackend(Options options) : options_(options) {
  Check(cudaSetDevice(options_.device), "cudaSetDevice");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, options_.device), "cudaGetDeviceProperties");
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major,
                prop.minor, prop.totalGlobalMem / double(size_t{1} << 30));
  device_ = buf;
  void* counter = nullptr;
  Check(cudaMalloc(&counter, sizeof(unsigned long long)), "cudaMalloc (counter)");
  corruptions_ = static_cast<unsigned long long*>(counter);
  Check(cudaMemset(corruptions_, 0, sizeof(unsigned long long)), "cudaMemset");
  if (options_.stitch) {
    auto vmm = std::make_unique<Vmm>();
    size_t g = 0;
    if (vmm->Load(options_.device) &&
        vmm->granularity(&g, &vmm->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
        g > 0) {
      granularity_ = g;
      vmm_ = std::move(vmm);
    }
  }
}

CudaBackend::~CudaBackend() {
  cudaDeviceSynchronize();
  for (StreamState& s : streams_) {
    if (s.event) cudaEventDestroy(s.event);
    if (s.stream && !s.adopted) cudaStreamDestroy(s.stream);
  }
  if (corruptions_) cudaFree(corruptions_);
}

std::string CudaBackend::Name() const {
  const std::string arena =
      vmm_ ? "vmm arena, stitch " + std::to_string(granularity_ >> 10) + " KiB" : "cudaMalloc arena";
  return "cuda (" + arena + ", " + (options_.event_per_free ? "event per free" : "event at sync") +
         (options_.spin_ns > 0 ? ", stream s spins " + std::to_string(options_.spin_ns) + "*s ns"
                               : std::string()) +
         ")";
}

std::string CudaBackend::DeviceDescription() const { return device_; }

void* CudaBackend::Reserve(size_t bytes) {
  if (vmm_ && arena_ == nullptr) {
    // Policy 1: reserve, then one handle per granule, each mapped at its offset.
    const size_t g = granularity_;
    const size_t n = (bytes + g - 1) / g;
    char* at = static_cast<char*>(ReserveAddressRange(n * g));
    if (at == nullptr) return nullptr;
    handles_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (vmm_->create(&h, g, &vmm_->prop, 0) != CUDA_SUCCESS) {
        for (size_t j = 0; j < i; ++j) vmm_->release(handles_[j]);
        handles_.clear();
        ReleaseAddressRange(at, n * g);
        return nullptr;
      }
      handles_[i] = h;
    }
    if (!vmm_->MapGranules(at, handles_.data(), n, g)) {
      for (unsigned long long h : handles_) vmm_->release(h);
      handles_.clear();
      ReleaseAddressRange(at, n * g);
      return nullptr;
    }
    arena_ = at;
    arena_bytes_ = n * g;
    return at;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the error: the pool reports the failure
    return nullptr;
  }
  return p;
}

void CudaBackend::Release(void* base, size_t bytes) {
  if (base == nullptr || base != arena_) {
    cudaFree(base);
    return;
  }
  cudaDeviceSynchronize();
  vmm_->UnmapGranules(arena_, handles_.size(), granularity_);
  for (unsigned long long h : handles_) vmm_->release(h);
  handles_.clear();
  ReleaseAddressRange(arena_, arena_bytes_);
  arena_ = nullptr;
  arena_bytes_ = 0;
  (void)bytes;
}

void* CudaBackend::ReserveAddressRange(size_t bytes) {
  if (!vmm_) return nullptr;
  const size_t g = granularity_;
  CUdeviceptr p = 0;
  if (vmm_->reserve(&p, (bytes + g - 1) / g * g, g, 0, 0) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<void*>(p);
}

void CudaBackend::ReleaseAddressRange(void* at, size_t bytes) {
  if (!vmm_ || at == nullptr) return;
  const size_t g = granularity_;
  vmm_->address_free(reinterpret_cast<CUdeviceptr>(at), (bytes + g - 1) / g * g);
}

bool CudaBackend::MapArenaPiece(void* at, size_t arena_offset, size_t bytes) {
  const size_t g = granularity_;
  if (!vmm_ || arena_ == nullptr || arena_offset % g != 0 || bytes % g != 0 ||
      arena_offset + bytes > arena_bytes_) {
    return false;
  }
  return vmm_->MapGranules(static_cast<char*>(at), handles_.data() + arena_offset / g, bytes / g, g);
}

void CudaBackend::UnmapToReserved(void* at, size_t bytes) {
  // The pool has waited for the freeing stream (Note [Stitched allocations]).
  if (vmm_) vmm_->UnmapGranules(static_cast<char*>(at), bytes / granularity_, granularity_);
}

CudaBackend::StreamState& CudaBackend::StateFor(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = static_cast<size_t>(stream < 0 ? 0 : stream);
  if (streams_.size() <= i) streams_.resize(i + 1);
  StreamState& s = streams_[i];
  if (!s.ready) {
    Check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    Check(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreate");
    s.ready = true;
  }
  return s;
}

CUstream_st* CudaBackend::StreamFor(StreamId stream) { return StateFor(stream).stream; }

void CudaBackend::AdoptStream(StreamId stream, CUstream_st* cuda_stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = static_cast<size_t>(stream < 0 ? 0 : stream);
  if (streams_.size() <= i) streams_.resize(i + 1);
  StreamState& s = streams_[i];
  if (s.ready) throw std::runtime_error("CUDA backend: stream " + std::to_string(stream) +
                                       " already in use; adopt it before its first use");
  Check(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreate");
  s.stream = cuda_stream;
  s.adopted = true;
  s.ready = true;
}

FreeTicket CudaBackend::RecordFree(StreamId stream) {
  StreamState& s = StateFor(stream);
  const FreeTicket t = ++s.freed;
  if (options_.event_per_free) {
    Check(cudaEventRecord(s.event, s.stream), "cudaEventRecord");
    s.recorded = t;
  }
  return t;
}

bool CudaBackend::FreeCompleted(StreamId stream, FreeTicket ticket) {
  StreamState& s = StateFor(stream);
  if (s.completed >= ticket) return true;
  if (s.recorded < ticket) return false;  // event at sync: not recorded yet
  if (cudaEventQuery(s.event) != cudaSuccess) {
    cudaGetLastError();  // cudaErrorNotReady is not an error
    return false;
  }
  s.completed = s.recorded;
  return true;
}

void CudaBackend::WaitForFree(StreamId stream, FreeTicket ticket) {
  StreamState& s = StateFor(stream);
  if (s.completed >= ticket) return;
  if (s.recorded < ticket) {
    // Policy 3, event at sync: what the stream queued so far includes the
    // work before this free.
    Check(cudaEventRecord(s.event, s.stream), "cudaEventRecord");
    s.recorded = s.freed;
  }
  Check(cudaEventSynchronize(s.event), "cudaEventSynchronize");
  s.completed = s.recorded;
}

void CudaBackend::SynchronizeAllStreams() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].ready) {
      Check(cudaStreamSynchronize(streams_[i].stream), "cudaStreamSynchronize");
    }
  }
}

void CudaBackend::Spin(StreamId stream) {
  if (options_.spin_ns <= 0) return;
  SpinFor<<<1, 1, 0, StreamFor(stream)>>>(options_.spin_ns * (stream < 1 ? 1 : stream));
}

void CudaBackend::EnqueueFill(StreamId stream, void* ptr, size_t bytes, uint64_t pattern) {
  Spin(stream);
  const size_t g = Granules(bytes);
  const unsigned blocks = static_cast<unsigned>(g / 256 + 1 < 1024 ? g / 256 + 1 : 1024);
  FillPattern<<<blocks, 256, 0, StreamFor(stream)>>>(
      static_cast<unsigned long long*>(ptr), g, pattern);
  Check(cudaGetLastError(), "FillPattern launch");
}

void CudaBackend::EnqueueVerify(StreamId stream, void* ptr, size_t bytes, uint64_t pattern) {
  Spin(stream);
  VerifyPattern<<<1, 256, 0, StreamFor(stream)>>>(
      static_cast<const unsigned long long*>(ptr), Granules(bytes), pattern, corruptions_);
  Check(cudaGetLastError(), "VerifyPattern launch");
}

int64_t CudaBackend::DrainAndCountCorruptions() {
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  unsigned long long n = 0;
  Check(cudaMemcpy(&n, corruptions_, sizeof(n), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return static_cast<int64_t>(n);
}

}  // namespace tensile
