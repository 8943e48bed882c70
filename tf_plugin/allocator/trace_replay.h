// Replays recorded allocation traces on several streams at once, without
// TensorFlow: the stream-ordering race test (tests/pool/test_stream_race.py),
// the pair-cost and footprint figures of benchmarks/gpu/check.sh, and the
// same on any backend (host, async host, CUDA).
//
// A trace (benchmarks/traces/*.replay, written by
// benchmarks/traces/record_traces.py from real TensorFlow runs of this
// project's pool) is the "tensile-replay 1" text of alloc_replay.cc: chunks
// live for the whole window ("persistent"), then a list in which every slot
// is allocated once and freed once, so a pass leaves the allocator as it
// found it and passes repeat. Trace i is replayed as job i on stream i + 1;
// the jobs' operations are interleaved one by one, round robin ("2 jobs" in
// the tables of DESIGN.md).
//
// Note [What the race replay checks]
// With kernels, every buffer gets queued work for its whole lifetime: a fill
// of a pattern unique to the allocation right after Allocate, a verify of it
// right before Deallocate, both on the buffer's stream. Two findings:
//  - corrupted buffers: a verify read another allocation's pattern, i.e. two
//    streams' queued work met on the same bytes (what a broken stream rule
//    does to training on a GPU);
//  - reuses before a sync: bookkeeping the replay keeps itself, per 256-byte
//    granule: which stream freed it last and the pool's sync count then; an
//    allocation by another stream with no sync since is the rule broken,
//    seen without any kernel.
// The replay also counts cross-stream reuses (after a sync: the sharing the
// pool exists for), so a test can show the rule was exercised, not avoided.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_TRACE_REPLAY_H_
#define TF_PLUGIN_ALLOCATOR_TRACE_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tf_plugin/allocator/pool_backend.h"
#include "tf_plugin/allocator/stream_kernels.h"

namespace tensile {

struct Trace {
  struct Op {
    bool alloc = false;
    int32_t slot = 0;
    size_t bytes = 0;  // allocations only
  };
  std::string name;
  std::vector<size_t> persistent;
  std::vector<Op> timed;
  int32_t slots = 0;
  // Live bytes at the busiest point of a pass, persistent included, each
  // request rounded up to the pool's 256-byte chunks: what any allocator
  // must hold for this job alone.
  int64_t LiveBytesPeak() const;
};

// Throws std::runtime_error naming the file and line on bad input.
Trace LoadTrace(const std::string& path);

struct RaceOptions {
  size_t capacity = size_t{1} << 30;  // arena bytes
  int passes = 2;
  bool stream_rule = true;  // false: SetStreamRuleForTesting(false)
  bool sync_waits = true;   // false: SetSyncWaitsForTesting(false)
  bool stitch = true;
};

struct RaceResult {
  std::string backend;
  int64_t jobs = 0;
  int64_t pairs = 0;                 // allocate/free pairs replayed
  int64_t corrupted_buffers = 0;     // -1 when no kernels ran
  int64_t reuses_before_sync = 0;    // the rule broken (bookkeeping)
  int64_t cross_stream_reuses = 0;   // after a sync: sharing
  int64_t syncs = 0;
  int64_t allocator_syncs = 0;
  int64_t stream_waits = 0;
  int64_t peak_bytes = 0;            // pool's live-bytes peak
  int64_t high_water = 0;            // highest arena byte ever handed out
  bool oom = false;
  std::string oom_message;
  std::string invariant_error;       // CheckInvariants() at the end
  double wall_seconds = 0;
};

// Replays `jobs` concurrently through a fresh pool over `backend`. With
// `kernels` (the same object as the backend, or null) every buffer gets the
// pattern work of Note [What the race replay checks]. Stops at the first
// allocation the pool cannot serve (result.oom).
RaceResult ReplayOnStreams(const std::vector<Trace>& jobs,
                           std::unique_ptr<PoolBackend> backend,
                           StreamKernels* kernels, const RaceOptions& options);

// The smallest arena, to `step` bytes, in which the pool (synchronous host
// backend, stream rule on) serves `jobs` replayed concurrently.
int64_t SmallestArena(const std::vector<Trace>& jobs, int64_t step,
                      bool stitch = true);
// The same on the backends `make_backend` returns, one per trial (a device
// arena: its stitch granularity decides what stitching recovers; without
// kernels the placement is the backend's alone). Throws what the backend
// throws.
int64_t SmallestArena(
    const std::vector<Trace>& jobs, int64_t step, bool stitch,
    const std::function<std::unique_ptr<PoolBackend>()>& make_backend);

// What the pair-cost replay drives: one allocator, several streams.
class ReplayAllocator {
 public:
  virtual ~ReplayAllocator() = default;
  virtual std::string Name() const = 0;
  virtual void* Alloc(size_t bytes, StreamId stream) = 0;
  virtual void Free(void* ptr, StreamId stream) = 0;
  // Bytes the allocator held from the device at its peak (its footprint),
  // or -1 when it cannot say.
  virtual int64_t FootprintPeak() { return -1; }
};

// The pool as a ReplayAllocator (trace off, streams 1..jobs registered).
std::unique_ptr<ReplayAllocator> MakePoolReplayAllocator(
    std::unique_ptr<PoolBackend> backend, size_t capacity, int32_t streams,
    const std::string& name);

struct PairTiming {
  std::string allocator;
  int64_t pairs_per_pass = 0;
  int64_t passes_per_sample = 0;
  std::vector<double> cpu_ns_per_pair;   // thread CPU time, one per sample
  std::vector<double> wall_ns_per_pair;
  int64_t footprint_peak = -1;
  double MedianCpuNs() const;
};

// Times allocate/free pairs of `jobs` interleaved on their streams, as
// alloc_replay.cc does for one job: warm-up passes, then `samples` samples
// of at least `min_sample_ms` each. Throws std::runtime_error when the
// allocator fails an allocation.
PairTiming TimePairs(const std::vector<Trace>& jobs, ReplayAllocator& a,
                     int samples, double min_sample_ms);

// One JSON object (one line) per result, for check.sh and the tests.
std::string ToJson(const RaceResult& r);
std::string ToJson(const PairTiming& t);

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_TRACE_REPLAY_H_
