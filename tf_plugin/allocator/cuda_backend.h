// CudaBackend: the StreamAwarePool's arena in GPU memory, its streams CUDA
// streams. Built only where CUDA is found (benchmarks/gpu/CMakeLists.txt;
// tests/pool/test_cuda_backend_builds.py compiles it wherever nvcc is); the
// TensorFlow plugin never includes it (its device is TF's CPU device,
// DESIGN.md), so the CPU build is unchanged.
//
// Policy:
//  1. The arena is one cudaMalloc of the pool's capacity. No stitching
//     (StitchGranularity() == 0): Note [Stitched allocations] on a device
//     needs cuMemCreate / cuMemMap at 2 MiB granularity, not done yet.
//  2. Each pool stream is a CUDA stream (cudaStreamNonBlocking), created on
//     first use: a job's kernels are ordered among themselves and against
//     nothing else, as TensorFlow's per-device compute stream is not, and
//     as Waterwave's one-stream-per-job is.
//  3. Note [Stream order on an asynchronous device] (pool_backend.h), two
//     ways, chosen by Options::event_per_free:
//      - true (the rule as written): RecordFree records the stream's event
//        (cudaEventRecord; one event per stream, re-recorded: the pool only
//        ever waits for a stream's newest free) and WaitForFree is
//        cudaEventSynchronize on it: a sync waits for exactly the work
//        queued before each stream's newest free.
//      - false: RecordFree only notes the free; WaitForFree records the
//        event then and waits for it, so a sync also waits for work the
//        stream queued after the free. No CUDA call per free.
//     benchmarks/gpu/check.sh measures both (pair cost and race test).
//  4. The StreamKernels are two CUDA kernels (fill, verify); with
//     Options::spin_ns > 0, each is preceded on stream s by a kernel that
//     spins s * spin_ns nanoseconds: a slow stream on purpose, so that with
//     the stream rule off pending work of one stream is still queued when
//     another stream's later work runs.
//
// No TensorFlow in this file, and no CUDA header: cudaStream_t is
// CUstream_st*, cudaEvent_t is CUevent_st*.
#ifndef TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_
#define TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "tf_plugin/allocator/pool_backend.h"
#include "tf_plugin/allocator/stream_kernels.h"

struct CUstream_st;
struct CUevent_st;

namespace tensile {

class CudaBackend : public PoolBackend, public StreamKernels {
 public:
  struct Options {
    int device = 0;
    bool event_per_free = true;  // policy 3
    int64_t spin_ns = 0;         // policy 4
  };

  // Throws std::runtime_error (with CUDA's message) when there is no usable
  // device.
  explicit CudaBackend(Options options);
  ~CudaBackend() override;

  void* Reserve(size_t bytes) override;
  void Release(void* base, size_t bytes) override;
  void SynchronizeAllStreams() override;
  std::string Name() const override;
  bool Asynchronous() const override { return true; }
  FreeTicket RecordFree(StreamId stream) override;
  bool FreeCompleted(StreamId stream, FreeTicket ticket) override;
  void WaitForFree(StreamId stream, FreeTicket ticket) override;

  void EnqueueFill(StreamId stream, void* ptr, size_t bytes,
                   uint64_t pattern) override;
  void EnqueueVerify(StreamId stream, void* ptr, size_t bytes,
                     uint64_t pattern) override;
  int64_t DrainAndCountCorruptions() override;
  std::string KernelsName() const override { return Name(); }

  // The CUDA stream of pool stream `stream` (created on first use).
  CUstream_st* StreamFor(StreamId stream);
  // "NVIDIA H200 (sm_90, 139.8 GiB)".
  std::string DeviceDescription() const;

 private:
  struct StreamState {
    CUstream_st* stream = nullptr;
    CUevent_st* event = nullptr;   // recorded at the newest free (policy 3)
    uint64_t freed = 0;            // tickets issued
    uint64_t recorded = 0;         // newest ticket the event stands for
    uint64_t completed = 0;        // newest ticket known complete
  };
  StreamState& StateFor(StreamId stream);
  void Spin(StreamId stream);

  const Options options_;
  std::mutex mu_;
  std::deque<StreamState> streams_;  // by pool stream id; stable references
  unsigned long long* corruptions_ = nullptr;  // device counter
  std::string device_;
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_
