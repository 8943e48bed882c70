// PyTorch's CUDA caching allocator on the same traces, for check.sh: the
// allocator PyTorch users train with today, reached through its C++ API
// (c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete), one
// CUDA stream per job, timed by the same loop as the pool
// (trace_replay.h TimePairs). Built by CMakeLists.txt only when check.sh
// finds PyTorch (TORCH_ROOT); needs no Python at run time.
//
//   torch_caching_replay [--samples N] [--min-sample-ms X] TRACE...
//
// Prints one JSON line (trace_replay.h ToJson) with "footprint_peak" = the
// allocator's reserved-bytes peak (what it took from the device).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tf_plugin/allocator/trace_replay.h"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

class TorchCachingAllocator : public tensile::ReplayAllocator {
 public:
  explicit TorchCachingAllocator(int32_t streams) {
    cca::init(c10::cuda::device_count());
    streams_.resize(static_cast<size_t>(streams) + 1);
    for (auto& s : streams_) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cca::resetPeakStats(0);
  }
  ~TorchCachingAllocator() override {
    cudaDeviceSynchronize();
    for (auto& s : streams_) cudaStreamDestroy(s);
  }
  std::string Name() const override {
    return "PyTorch CUDA caching allocator (raw_alloc_with_stream / raw_delete)";
  }
  void* Alloc(size_t bytes, tensile::StreamId stream) override {
    return cca::raw_alloc_with_stream(bytes, streams_[stream]);
  }
  void Free(void* ptr, tensile::StreamId) override { cca::raw_delete(ptr); }
  int64_t FootprintPeak() override {
    const auto stats = cca::getDeviceStats(0);
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }

 private:
  std::vector<cudaStream_t> streams_;
};

}  // namespace

int main(int argc, char** argv) {
  int samples = 11;
  double min_sample_ms = 200;
  std::vector<tensile::Trace> jobs;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "--samples" && i + 1 < argc) {
        samples = std::stoi(argv[++i]);
      } else if (k == "--min-sample-ms" && i + 1 < argc) {
        min_sample_ms = std::stod(argv[++i]);
      } else {
        jobs.push_back(tensile::LoadTrace(k));
      }
    }
    if (jobs.empty()) {
      std::fprintf(stderr, "usage: torch_caching_replay [--samples N] TRACE...\n");
      return 2;
    }
    TorchCachingAllocator a(static_cast<int32_t>(jobs.size()));
    const tensile::PairTiming t = tensile::TimePairs(jobs, a, samples, min_sample_ms);
    std::string json = tensile::ToJson(t);
    json.pop_back();
    std::string traces = "[";
    for (size_t i = 0; i < jobs.size(); ++i) traces += (i ? ", \"" : "\"") + jobs[i].name + "\"";
    std::cout << json << ", \"mode\": \"pairs\", \"jobs\": " << jobs.size()
              << ", \"traces\": " << traces << "]}" << std::endl;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_caching_replay: %s\n", e.what());
    return 1;
  }
  return 0;
}
