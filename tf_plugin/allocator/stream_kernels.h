// StreamKernels: the device work the race test queues on every buffer for
// its lifetime (tests/pool/test_stream_race.py, trace_replay.h). A backend
// whose streams run work asynchronously implements it next to PoolBackend:
// AsyncHostBackend (worker threads) and CudaBackend (CUDA kernels).
//
// The two kernels touch the first 8 bytes of every kPatternGranule-byte
// granule of a buffer. Chunks start on, and are multiples of, the pool's
// 256-byte chunk size, so two buffers whose requested bytes overlap share at
// least one granule start: any overlap in time and space is seen.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_STREAM_KERNELS_H_
#define TF_PLUGIN_ALLOCATOR_STREAM_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "tf_plugin/allocator/pool_backend.h"

namespace tensile {

constexpr size_t kPatternGranule = 256;

class StreamKernels {
 public:
  virtual ~StreamKernels() = default;
  // Queues on `stream`: write `pattern` at the start of each granule of
  // [ptr, ptr + bytes).
  virtual void EnqueueFill(StreamId stream, void* ptr, size_t bytes,
                           uint64_t pattern) = 0;
  // Queues on `stream`: check those words; a buffer holding any other value
  // counts as one corrupted buffer.
  virtual void EnqueueVerify(StreamId stream, void* ptr, size_t bytes,
                             uint64_t pattern) = 0;
  // Waits for all queued work; returns the corrupted buffers seen so far.
  virtual int64_t DrainAndCountCorruptions() = 0;
  // The replay calls this once after each allocate or free it makes. A
  // backend in lockstep (AsyncHostBackend) advances its clock here; a real
  // device ignores it.
  virtual void Tick() {}
  // What the kernels run on, for reports ("async-host lockstep lag 8", ...).
  virtual std::string KernelsName() const = 0;
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_STREAM_KERNELS_H_
