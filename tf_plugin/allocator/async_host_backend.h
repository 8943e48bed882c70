// AsyncHostBackend: host memory whose streams behave like a device's.
//
// Note [A host backend that behaves like a device]
// HostBackend's streams are synchronous: a CPU kernel has finished with a
// buffer when TensorFlow frees it, so the stream rule (policy 4-6 of
// stream_aware_pool.h) is never put to the test there. This backend gives
// each stream a worker thread that runs the work queued on it (the pattern
// kernels of stream_kernels.h) in queue order and later than it was queued,
// so a buffer freed by stream A can still be written by A's pending work
// after Deallocate returns, exactly as on a GPU. RecordFree queues a marker
// and returns its sequence number as the ticket; WaitForFree waits until the
// stream's worker has passed it (CUDA: cudaEventSynchronize).
//
// "Later" comes in two modes:
//  - Lockstep (deterministic; the race test asserts on it). Work runs only
//    when the replay calls Tick() (once per allocate or free) or when the
//    pool waits for a ticket. Work queued on stream s at tick t becomes
//    runnable at tick t + lag_ticks * s: stream 2 lags twice as far behind
//    as stream 1, so pending work of one stream is still queued while
//    another stream's later work runs, which is what a slow stream on a GPU
//    does and what makes a broken rule show. Tick() then runs each stream's
//    runnable work, stream after stream, and returns when it has run, so
//    the order of every write and check is a function of the trace alone: no
//    timing, no thread interleaving.
//    The lag must be long for a missing wait to show: the chunks a sync
//    hands over were mostly freed long before it. Measured on the
//    ResNet50 + Transformer traces in their smallest arena: a pool whose
//    syncs did not wait (SetSyncWaitsForTesting(false)) corrupted 0
//    buffers at 8 ticks per stream, 0 at 128 and 107 at 512 (the default);
//    the correct pool 0 at each.
//  - Free-running (real concurrency; for check.sh and stress runs). Each
//    worker runs as soon as it can, but never before delay_us * s
//    microseconds after the work was queued. The order between streams is
//    the scheduler's; only "no corruption with the rule on" may be asserted.
//
// A pool waiting for a ticket in lockstep makes that stream's work runnable
// up to the ticket (a GPU also runs a stream's work while the host waits on
// it), so a sync never deadlocks on the clock.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_ASYNC_HOST_BACKEND_H_
#define TF_PLUGIN_ALLOCATOR_ASYNC_HOST_BACKEND_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tf_plugin/allocator/pool_backend.h"
#include "tf_plugin/allocator/stream_kernels.h"

namespace tensile {

class AsyncHostBackend : public HostBackend, public StreamKernels {
 public:
  struct Options {
    bool lockstep = true;
    int64_t lag_ticks = 512; // lockstep: stream s lags lag_ticks * s ticks
    int64_t delay_us = 0;    // free-running: stream s lags delay_us * s us
    bool stitchable = true;  // as HostBackend
  };

  explicit AsyncHostBackend(Options options);
  ~AsyncHostBackend() override;

  // PoolBackend.
  std::string Name() const override;
  void SynchronizeAllStreams() override;
  bool Asynchronous() const override { return true; }
  FreeTicket RecordFree(StreamId stream) override;
  bool FreeCompleted(StreamId stream, FreeTicket ticket) override;
  void WaitForFree(StreamId stream, FreeTicket ticket) override;

  // StreamKernels.
  void EnqueueFill(StreamId stream, void* ptr, size_t bytes,
                   uint64_t pattern) override;
  void EnqueueVerify(StreamId stream, void* ptr, size_t bytes,
                     uint64_t pattern) override;
  int64_t DrainAndCountCorruptions() override;
  void Tick() override;
  std::string KernelsName() const override { return Name(); }

  // Work items run so far, all streams (for tests: the workers did run).
  int64_t ItemsRun() const { return items_run_.load(); }

 private:
  enum class Kind { kFill, kVerify, kMarker };
  struct Item {
    Kind kind;
    char* ptr;
    size_t bytes;
    uint64_t pattern;
    uint64_t seq;
    int64_t ready_tick;                              // lockstep
    std::chrono::steady_clock::time_point ready_at;  // free-running
  };
  struct Worker {
    StreamId stream = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    uint64_t enqueued = 0;      // seq of the newest item queued
    uint64_t completed = 0;     // seq of the newest item run
    uint64_t demand = 0;        // lockstep: run through this seq now
    int64_t allowed_tick = 0;   // lockstep: run items ready at or before
    bool running = false;       // an item is being run (lock released)
    bool stop = false;
    std::thread thread;
  };

  Worker& WorkerFor(StreamId stream);
  std::vector<Worker*> AllWorkers();  // the workers made so far
  uint64_t Enqueue(StreamId stream, Kind kind, char* ptr, size_t bytes,
                   uint64_t pattern);
  // Whether the worker may run its front item now (worker lock held).
  bool Runnable(const Worker& w) const;
  void Loop(Worker* w);
  void Run(const Item& item);

  const Options options_;
  std::mutex workers_mu_;
  std::vector<std::unique_ptr<Worker>> workers_;  // by stream id; may be null
  std::atomic<int64_t> clock_{0};
  std::atomic<int64_t> corruptions_{0};
  std::atomic<int64_t> items_run_{0};
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_ASYNC_HOST_BACKEND_H_
