// CudaBackend (cuda_backend.h): the policy is in the header.
#include "tf_plugin/allocator/cuda_backend.h"

#include <cuda_runtime.h>

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

}  // namespace

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
}

CudaBackend::~CudaBackend() {
  cudaDeviceSynchronize();
  for (StreamState& s : streams_) {
    if (s.event) cudaEventDestroy(s.event);
    if (s.stream) cudaStreamDestroy(s.stream);
  }
  if (corruptions_) cudaFree(corruptions_);
}

std::string CudaBackend::Name() const {
  return std::string("cuda (") + (options_.event_per_free ? "event per free" : "event at sync") +
         (options_.spin_ns > 0 ? ", stream s spins " + std::to_string(options_.spin_ns) + "*s ns"
                               : std::string()) +
         ")";
}

std::string CudaBackend::DeviceDescription() const { return device_; }

void* CudaBackend::Reserve(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the error: the pool reports the failure
    return nullptr;
  }
  return p;
}

void CudaBackend::Release(void* base, size_t) { cudaFree(base); }

CudaBackend::StreamState& CudaBackend::StateFor(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = static_cast<size_t>(stream < 0 ? 0 : stream);
  if (streams_.size() <= i) streams_.resize(i + 1);
  StreamState& s = streams_[i];
  if (s.stream == nullptr) {
    Check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    Check(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreate");
  }
  return s;
}

CUstream_st* CudaBackend::StreamFor(StreamId stream) { return StateFor(stream).stream; }

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
    if (streams_[i].stream != nullptr) {
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
