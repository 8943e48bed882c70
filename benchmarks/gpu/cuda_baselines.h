// What GPU users have today, as ReplayAllocators for pool_replay's pair-cost
// mode (trace_replay.h): cudaMallocAsync / cudaFreeAsync on the job's stream
// (the device's default memory pool, release threshold raised to the
// maximum so freed memory stays cached, as a training framework sets it),
// and cudaMalloc / cudaFree. PyTorch's caching allocator is
// torch_caching_replay.cc (it needs PyTorch's headers and libraries).
#ifndef BENCHMARKS_GPU_CUDA_BASELINES_H_
#define BENCHMARKS_GPU_CUDA_BASELINES_H_

#include <memory>
#include <string>

#include "tf_plugin/allocator/trace_replay.h"

namespace tensile {

// kind: "cudaMallocAsync" or "cudaMalloc"; one CUDA stream per job.
std::unique_ptr<ReplayAllocator> MakeCudaBaseline(const std::string& kind, int32_t streams);
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device 0.
std::string CudaDeviceDescription();

}  // namespace tensile

#endif  // BENCHMARKS_GPU_CUDA_BASELINES_H_
