// PoolBackend: where the StreamAwarePool's arena comes from and what "sync"
// means. The pool core talks only to this interface, so the same algorithm can
// run on host memory (this project's emulated device, see DESIGN.md) or on a
// CUDA arena whose Synchronize() waits on real streams and events.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_
#define TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tensile {

// A stream: one training job's queue of device work. Ids are the pool's.
using StreamId = int32_t;

// Note [Stream order on an asynchronous device]
// On a GPU, Deallocate runs on the CPU while the freeing stream's kernels
// that read or write the chunk may still be queued. The same stream may
// reuse the chunk at once (its later kernels run after them, in stream
// order), but another stream's kernels are ordered against nothing and may
// run first: handing the chunk over before the freeing stream's queued work
// has finished corrupts both jobs. So every free is stamped: RecordFree
// marks the point in the freeing stream's queue after which the chunk is no
// longer used (CUDA: an event recorded on the stream) and returns a ticket;
// the pool keeps, per stream, the ticket of its newest free still in its
// unsynced set, and SyncAndCoalesce waits for each such ticket (CUDA:
// cudaEventSynchronize) and for nothing else: not for work the streams
// queued after those frees, nor for streams with nothing unsynced. Tickets
// grow in stream order, so the newest ticket covers every older free of the
// stream. A backend whose streams run synchronously (HostBackend: a CPU
// kernel has finished with a buffer when TensorFlow frees it) reports
// Asynchronous() == false and the pool never asks it for tickets.
// Measured: benchmarks/RESULTS.md, "The pool on real devices".
using FreeTicket = uint64_t;  // 0: nothing to wait for

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  // Reserves `bytes` of arena memory, aligned to at least 4096 bytes.
  // Returns nullptr if the memory cannot be reserved.
  virtual void* Reserve(size_t bytes) = 0;
  // Gives back what Reserve returned.
  virtual void Release(void* base, size_t bytes) = 0;
  // Waits until every stream's outstanding work has finished, so that chunks
  // freed by any stream may be handed to any other (Waterwave Listing 1,
  // SyncAndCoalesce).
  virtual void SynchronizeAllStreams() = 0;
  virtual std::string Name() const = 0;

  // Note [Stream order on an asynchronous device]. Whether streams run work
  // after it was queued; if false the pool never calls the three below.
  virtual bool Asynchronous() const { return false; }
  // Called by Deallocate (pool lock held): stamps the point in `stream`'s
  // queue after which the chunk freed now is unused. Cheap: never waits.
  virtual FreeTicket RecordFree(StreamId /*stream*/) { return 0; }
  // Whether `stream` has passed `ticket`; never waits.
  virtual bool FreeCompleted(StreamId /*stream*/, FreeTicket /*ticket*/) {
    return true;
  }
  // Blocks until `stream` has passed `ticket`.
  virtual void WaitForFree(StreamId /*stream*/, FreeTicket /*ticket*/) {}

  // Address-space primitives for Note [Stitched allocations]
  // (stream_aware_pool.h): map pieces of the arena, in order, into one
  // contiguous range of fresh addresses (CUDA: cuMemAddressReserve and
  // cuMemMap, granularity 2 MiB; GMLake, ASPLOS '24). A backend that cannot
  // returns 0 from StitchGranularity() and its pool never stitches.
  //
  // The size and alignment of a piece: arena offsets and lengths mapped are
  // multiples of it. 0: no stitching.
  virtual size_t StitchGranularity() const { return 0; }
  // Reserves `bytes` of inaccessible address space; nullptr on failure.
  virtual void* ReserveAddressRange(size_t /*bytes*/) { return nullptr; }
  virtual void ReleaseAddressRange(void* /*at*/, size_t /*bytes*/) {}
  // Maps arena bytes [arena_offset, arena_offset + bytes) at `at`, inside a
  // reserved range, so both addresses reach the same memory. False on failure.
  virtual bool MapArenaPiece(void* /*at*/, size_t /*arena_offset*/,
                             size_t /*bytes*/) {
    return false;
  }
  // Makes [at, at + bytes) reserved and inaccessible again.
  virtual void UnmapToReserved(void* /*at*/, size_t /*bytes*/) {}
};

// Host memory: the arena is one mmap'ed region (pages are touched lazily, so
// a large pool costs nothing until used). CPU kernels have finished with a
// buffer when TensorFlow frees it, so synchronizing streams is a no-op; the
// pool still keeps the synced / unsynced bookkeeping so the algorithm is the
// one a GPU backend would run.
//
// The arena is a shared mapping of an anonymous memory file (memfd_create),
// so a page of it can be mapped a second time elsewhere (stitching, at page
// granularity). Built with `stitchable = false`, or where memfd_create is
// missing, the arena is private anonymous memory (the pool before stitching)
// and StitchGranularity() is 0. Either way the arena is not inherited
// by fork()ed children (MADV_DONTFORK): a child never shares, nor copies,
// the device memory.
//
// `granularity` (a multiple of the page size; 0: the page size) is the
// stitch piece size. A device's is coarser (CUDA: 2 MiB, cuda_backend.h
// policy 1); a host arena at the device's granularity places every chunk
// and piece as the device arena would, so the footprint a device pool needs
// is measured without the device (pool_replay --mode arena). The arena then
// starts on a multiple of `granularity`.
class HostBackend : public PoolBackend {
 public:
  explicit HostBackend(bool stitchable = true, size_t granularity = 0)
      : stitchable_(stitchable), granularity_(granularity) {}
  ~HostBackend() override;
  void* Reserve(size_t bytes) override;
  void Release(void* base, size_t bytes) override;
  void SynchronizeAllStreams() override {}
  std::string Name() const override { return "host"; }
  size_t StitchGranularity() const override;
  void* ReserveAddressRange(size_t bytes) override;
  void ReleaseAddressRange(void* at, size_t bytes) override;
  bool MapArenaPiece(void* at, size_t arena_offset, size_t bytes) override;
  void UnmapToReserved(void* at, size_t bytes) override;

 private:
  bool stitchable_ = true;
  size_t granularity_ = 0;  // 0: the page size
  int fd_ = -1;  // the arena's memory file; -1 when private anonymous
};

// "host" or "async-host" (AsyncHostBackend, lockstep: async_host_backend.h).
// `stitch`: whether the backend should support Note [Stitched allocations].
// Defined in async_host_backend.cc.
std::unique_ptr<PoolBackend> MakeBackend(const std::string& name, bool stitch = true);

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_
