// CudaBackend: the StreamAwarePool's arena in GPU memory, its streams CUDA
// streams. Built only where CUDA is found (benchmarks/gpu/CMakeLists.txt;
// tests/stream_order/test_cuda_backend_builds.py compiles it wherever nvcc is); the
// TensorFlow plugin never includes it (its device is TF's CPU device,
// DESIGN.md), so the CPU build is unchanged.
//
// Policy:
//  1. With Options::stitch (the default) the arena is virtual memory
//     (Note [Stitching on a CUDA arena]): one cuMemAddressReserve of the
//     capacity, backed granule by granule by cuMemCreate handles of the
//     device's minimum granularity (cuMemGetAllocationGranularity; 2 MiB on
//     current GPUs), each cuMemMap'ed at its offset, cuMemSetAccess on the
//     whole. StitchGranularity() is that granularity, and the pool stitches
//     as on the host (Note [Stitched allocations] in stream_aware_pool.h).
//     Without Options::stitch, or where the device or driver has no virtual
//     memory management, the arena is one cudaMalloc and never stitches.
//  2. Each pool stream is a CUDA stream (cudaStreamNonBlocking), created on
//     first use: a job's kernels are ordered among themselves and against
//     nothing else, as TensorFlow's per-device compute stream is not, and
//     as Waterwave's one-stream-per-job is. AdoptStream binds a pool stream
//     to a stream someone else made (PyTorch's, pool_c_abi.h) instead; the
//     backend records its events there and never destroys it.
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
// Note [Stitching on a CUDA arena]
// Without stitching, two jobs' traces (ResNet50 + Transformer) replayed
// together on the CUDA arena need 0.995x the sum of their own arenas; the
// host backend, stitching 4 KiB pages, needs 0.842x (issue 41). The device
// has the same primitive as mmap (GMLake, ASPLOS '24; PyTorch's expandable
// segments): a physical allocation (cuMemCreate) may be mapped at several
// reserved addresses at once. cuMemMap maps a handle only from its start
// (its offset argument "must be zero"), and cuMemUnmap only whole mappings,
// so the arena is one handle per granule, and a stitched piece of k
// granules is k mappings of the handles it covers, unmapped one by one.
// Pieces are whole granules: a 2 MiB granule on the device against a 4 KiB
// page on the host, so fewer free chunks hold a stitchable interior. The
// host backend at the device's granularity (HostBackend(true, 2 MiB): the
// same capacity, a base on a granule, the same offsets) places every chunk
// and piece as this arena does, so the device's footprint is measured on
// any machine. Measured so (pool_replay --mode arena, ResNet50 64x64 b8 +
// Transformer traces): together 207 MiB against 183 + 37 MiB alone, 0.941x
// the sum (4 KiB pages: 170 MiB, 0.842x; no stitching: 220 MiB, 0.995x).
// On a GPU check.sh adds the rows of this arena itself, stitched and not. The rule of
// Note [Stitched allocations] holds unchanged: the pool unmaps a stitched
// range only after the freeing stream passed its free (its kernels reach
// the pieces through the window; PyTorch's expandable segments likewise
// synchronize the stream before cuMemUnmap, "MemUnmap and MemRelease do not
// appear to synchronize in all cases"). Driver entry points come through
// the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda.
//
// No TensorFlow in this file, and no CUDA header: cudaStream_t is
// CUstream_st*, cudaEvent_t is CUevent_st*.
#ifndef TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_
#define TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_

#include <cstdint>
#include <deque>
#include <memory>
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
    bool stitch = true;          // policy 1: a virtual-memory arena
  };

  // Throws std::runtime_error (with CUDA's message) when there is no usable
  // device.
  explicit CudaBackend(Options options);
  ~CudaBackend() override;

  void* Reserve(size_t bytes) override;
  void Release(void* base, size_t bytes) override;
  // Policy 1 (0 until a virtual-memory arena is reserved).
  size_t StitchGranularity() const override { return arena_ ? granularity_ : 0; }
  void* ReserveAddressRange(size_t bytes) override;
  void ReleaseAddressRange(void* at, size_t bytes) override;
  bool MapArenaPiece(void* at, size_t arena_offset, size_t bytes) override;
  void UnmapToReserved(void* at, size_t bytes) override;
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
  // Policy 2: pool stream `stream` runs on `cuda_stream` (nullptr: the
  // legacy default stream), which outlives this backend. Before its first use.
  void AdoptStream(StreamId stream, CUstream_st* cuda_stream);
  // "NVIDIA H200 (sm_90, 139.8 GiB)".
  std::string DeviceDescription() const;
  // Policy 1: the stitch piece size of a virtual-memory arena (0: none).
  size_t DeviceGranularity() const { return vmm_ ? granularity_ : 0; }

 private:
  struct StreamState {
    bool ready = false;            // stream and event made (or adopted)
    bool adopted = false;          // not ours to destroy
    CUstream_st* stream = nullptr;
    CUevent_st* event = nullptr;   // recorded at the newest free (policy 3)
    uint64_t freed = 0;            // tickets issued
    uint64_t recorded = 0;         // newest ticket the event stands for
    uint64_t completed = 0;        // newest ticket known complete
  };
  StreamState& StateFor(StreamId stream);
  void Spin(StreamId stream);

  // Policy 1: driver entry points (null: no virtual memory management).
  struct Vmm;
  std::unique_ptr<Vmm> vmm_;
  size_t granularity_ = 0;
  char* arena_ = nullptr;                  // the virtual-memory arena
  size_t arena_bytes_ = 0;                 // whole granules
  std::vector<unsigned long long> handles_;  // one per arena granule

  const Options options_;
  std::mutex mu_;
  std::deque<StreamState> streams_;  // by pool stream id; stable references
  unsigned long long* corruptions_ = nullptr;  // device counter
  std::string device_;
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_CUDA_BACKEND_H_
