#include "benchmarks/gpu/cuda_baselines.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <vector>

namespace tensile {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

class CudaMallocAsyncAllocator : public ReplayAllocator {
 public:
  explicit CudaMallocAsyncAllocator(int32_t streams) {
    Check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    Check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute");
    uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
    streams_.resize(static_cast<size_t>(streams) + 1);
    for (auto& s : streams_) Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  }
  ~CudaMallocAsyncAllocator() override {
    cudaDeviceSynchronize();
    for (auto& s : streams_) cudaStreamDestroy(s);
  }
  std::string Name() const override {
    return "cudaMallocAsync/cudaFreeAsync (default pool, release threshold max)";
  }
  void* Alloc(size_t bytes, StreamId stream) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, bytes, streams_[stream]) == cudaSuccess ? p : nullptr;
  }
  void Free(void* ptr, StreamId stream) override { cudaFreeAsync(ptr, streams_[stream]); }
  int64_t FootprintPeak() override {
    cudaDeviceSynchronize();
    uint64_t high = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high);
    return static_cast<int64_t>(high);
  }

 private:
  cudaMemPool_t pool_ = nullptr;
  std::vector<cudaStream_t> streams_;
};

class CudaMallocAllocator : public ReplayAllocator {
 public:
  std::string Name() const override { return "cudaMalloc/cudaFree"; }
  void* Alloc(size_t bytes, StreamId) override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void Free(void* ptr, StreamId) override { cudaFree(ptr); }
};

}  // namespace

std::unique_ptr<ReplayAllocator> MakeCudaBaseline(const std::string& kind, int32_t streams) {
  if (kind == "cudaMallocAsync") return std::make_unique<CudaMallocAsyncAllocator>(streams);
  if (kind == "cudaMalloc") return std::make_unique<CudaMallocAllocator>();
  throw std::runtime_error("unknown CUDA baseline " + kind);
}

std::string CudaDeviceDescription() {
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                prop.totalGlobalMem / double(size_t{1} << 30));
  return buf;
}

}  // namespace tensile
