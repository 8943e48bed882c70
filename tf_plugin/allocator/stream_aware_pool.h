// StreamAwarePool: a fixed-capacity, best-fit allocator with splitting and
// coalescing whose free chunks are kept per stream (Waterwave, seed 004 §4.2,
// Listing 1). Here a "stream" is a training job: every allocation carries the
// stream of the op that asked for it.
//
// Policy, in order:
//  1. One arena of `capacity` bytes is reserved up front from a PoolBackend.
//     It is the device memory: nothing is ever allocated outside it, and a
//     request that does not fit fails (the caller turns that into an OOM).
//  2. Every chunk's offset and size are multiples of kMinChunkBytes.
//  3. Free chunks live in exactly one FreeChunkSet: the unsynced set of the
//     stream that freed them, or the one synced set (free_chunk_set.h: size
//     bins of sorted vectors, Note [Size-binned free sets]). At start the
//     whole arena is one synced free chunk.
//  4. Allocate(bytes, stream) takes the best fit (smallest chunk that fits,
//     lowest offset on ties) from the chunks it may use without a sync: the
//     stream's own unsynced set and the synced set together (its own chunk
//     on equal size); and only when neither has one, after SyncAndCoalesce(),
//     from the synced set again, which now also holds every other stream's
//     former unsynced chunks. A chunk is split when the remainder is at least
//     kMinChunkBytes; the remainder stays in the set it came from.
//  5. Deallocate puts the chunk in its stream's unsynced set and coalesces it
//     only with address neighbours in that same set. Coalescing with a synced
//     neighbour is deferred: it would turn synced bytes into unsynced bytes
//     that other streams can no longer take (Listing 1, Deallocate).
//  6. SyncAndCoalesce() waits, through the backend, until each stream with
//     unsynced chunks has finished the work it queued before its newest
//     free (Note [Stream order on an asynchronous device], pool_backend.h),
//     moves every unsynced chunk to the synced set and coalesces all free
//     neighbours. ReleaseStream waits the same way for the one stream.
//  7. A request of at least kStitchMinBytes that no single chunk serves even
//     after the sync of step 4 is stitched when the free chunks together
//     hold it (Note [Stitched allocations]); only then is it an OOM.
//
// Note [Stitched allocations]
// Best fit on a fixed arena fails large requests while the bytes are free:
// four small CNN jobs at batch 40 in 120 MiB each failed asking 23.6 MiB
// with 60-80 MiB free (largest chunks 5-22.5 MiB), and replays of two
// InceptionV3 jobs need arenas 1.20-1.47x their peak bytes, where a 26.9 MiB
// scratch request finds only smaller holes (benchmarks/RESULTS.md, issue 20).
// No placement policy closes that gap: even an oracle that knows every
// lifetime needs 1.15x. Virtual memory does (GMLake, ASPLOS '24; CUDA's
// cuMemMap): the pool carves the page-aligned interiors of free synced
// chunks, largest first, until they hold the request, maps them in offset
// order into one fresh range of a reserved address window, and returns the
// window address. The pieces are ordinary live chunks of the arena (flagged
// `piece`), so every count, the invariants and the stream rule (no other
// stream's unsynced chunk before a sync: all free chunks are synced here,
// step 4 has just synced) hold unchanged. Deallocate unmaps the range and
// frees each piece into the owner's unsynced set, as any chunk. Costs: a
// few mmap calls, on the rare path that would otherwise fail; a stitched
// tensor's pages are reached through a second mapping (its page-table
// entries are made on first touch). Measured (RESULTS.md, issue 20, eleventh
// session): replays of recorded runs need arenas 1.01x their peak bytes
// (1.09-1.47x without); one small CNN job trains batch 65 in 120 MiB instead
// of 52, and four jobs 52 each instead of 39; an allocate/free pair costs
// ~3 ns more, inside BFC's own run-to-run spread; ResNet50's step time did
// not grow. The trace records a stitched allocation as one "alloc" event at
// its window offset (offset >= capacity) followed by one "piece" event per
// arena piece, so readers that pair allocs and frees by offset see one
// allocation. On an asynchronous backend (Note [Stream order on an
// asynchronous device]) Deallocate waits for the freeing stream's queued
// work before it unmaps the range, since that work reaches the pieces
// through the window (found by the race replay: a verify kernel read an
// unmapped window page). Pools whose backend has no address-space primitives
// (StitchGranularity() == 0) or built with stitch = false never stitch. On
// a GPU the pieces are 2 MiB granules (Note [Stitching on a CUDA arena] in
// tf_plugin/allocator/cuda_backend.h).
//
// Note [Best fit across own and synced]
// Listing 1 searches the stream's own unsynced chunks first and the synced
// chunks only when none fits. On a fixed arena that order fragments: a
// stream that has just freed a large temporary takes small requests out of
// it even when a synced chunk fits them exactly, and the next large request
// finds no hole. Both sets are safe for the stream without a sync, so the
// search order is a placement choice, not a correctness one; best fit across
// both keeps the Waterwave guarantee (no other stream's unsynced chunk before
// a sync) and needs far less headroom. Replaying a recorded small_cnn step
// (peak 55.3 MiB), the smallest arena that served it fell from 80.9 MiB
// (seed order) to 64.5 MiB (benchmarks/RESULTS.md, "Fragmentation").
//
// Invariant relied on by the TF adapter and checked by CheckInvariants():
// a chunk freed by stream A is never handed to stream B != A before a sync.
// On an asynchronous backend that sync has waited for A's work queued before
// the free, so B's kernels never meet A's (tests/pool/test_stream_race.py
// replays recorded traces on queued streams and checks the buffers' bytes;
// with the rule off on purpose, SetStreamRuleForTesting(false), it finds the
// corruption).
//
// Thread safe: one mutex guards all state (as TF's BFCAllocator); the
// compiler checks which (Note [Locks a compiler checks] in
// tf_plugin/thread_annotations.h).
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_STREAM_AWARE_POOL_H_
#define TF_PLUGIN_ALLOCATOR_STREAM_AWARE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tf_plugin/allocator/event_trace.h"
#include "tf_plugin/allocator/free_chunk_set.h"
#include "tf_plugin/allocator/pool_backend.h"
#include "tf_plugin/thread_annotations.h"

namespace tensile {

// StreamId: pool_backend.h.
// Allocations made outside any registered job (eager ops, variable creation,
// input conversion) belong to this stream.
constexpr StreamId kDefaultStream = 0;
constexpr StreamId kMaxStreams = 1024;

// Byte counters, one vocabulary for the pool and for each stream.
struct MemoryCounters {
  int64_t current = 0;          // bytes in live chunks now
  int64_t peak = 0;             // max of current since creation / ResetPeak
  int64_t allocated = 0;        // bytes handed out, cumulative
  int64_t freed = 0;            // bytes given back, cumulative
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_ooms = 0;
  int64_t largest_alloc = 0;    // largest single chunk handed out
};

struct StreamStats {
  StreamId stream = 0;
  std::string name;
  MemoryCounters counters;
  int64_t unsynced_free_bytes = 0;  // bytes in this stream's unsynced set
};

struct PoolStats {
  std::string name;
  std::string backend;
  int64_t capacity = 0;
  MemoryCounters counters;
  int64_t requested_current = 0;   // bytes asked for by live allocations
  int64_t free_bytes = 0;          // capacity - current
  int64_t synced_free_bytes = 0;
  int64_t unsynced_free_bytes = 0;
  int64_t largest_free_chunk = 0;  // largest chunk an allocation could get
                                   // after a sync (synced or unsynced)
  int64_t num_free_chunks = 0;
  int64_t num_live_chunks = 0;
  double fragmentation = 0.0;      // 1 - largest_free_chunk / free_bytes
  int64_t num_syncs = 0;           // SyncAndCoalesce calls, all causes
  int64_t num_allocator_syncs = 0; // syncs forced by Allocate (step 4)
  // Note [Stream order on an asynchronous device]: streams whose free
  // tickets syncs (and ReleaseStream) waited for; 0 on a host backend.
  int64_t num_stream_waits = 0;
  bool stream_rule = true;         // false only in tests that break it
  // Note [Stitched allocations]: cumulative count, and the bytes and count
  // of stitched allocations live now.
  int64_t num_stitched = 0;
  int64_t stitched_current = 0;
  int64_t num_live_stitched = 0;
  uint64_t trace_recorded = 0;
  uint64_t trace_dropped = 0;
};

// A chunk as seen from outside, for tests and snapshots.
struct ChunkInfo {
  int64_t offset = 0;
  int64_t size = 0;
  int64_t requested = 0;  // 0 for free chunks
  bool in_use = false;
  // For a live chunk: the stream that allocated it. For a free chunk: the
  // stream whose unsynced set holds it, or kSyncedOwner.
  StreamId owner = 0;
};
constexpr StreamId kSyncedOwner = -1;

class StreamAwarePool {
 public:
  static constexpr size_t kMinChunkBytes = 256;
  // Policy 7: smaller requests are never stitched (they rarely fail while
  // their bytes are free, and a stitch costs system calls).
  static constexpr size_t kStitchMinBytes = size_t{1} << 20;

  // Reserves `capacity` bytes (rounded down to kMinChunkBytes) from
  // `backend`. Throws std::runtime_error if the backend cannot reserve it.
  // `stitch`: Note [Stitched allocations] (if the backend can).
  StreamAwarePool(std::string name, size_t capacity,
                  std::unique_ptr<PoolBackend> backend,
                  size_t trace_capacity = 1 << 16, bool stitch = true);
  ~StreamAwarePool();
  StreamAwarePool(const StreamAwarePool&) = delete;
  StreamAwarePool& operator=(const StreamAwarePool&) = delete;

  // Returns a pointer into the arena of at least `bytes` bytes, aligned to
  // kMinChunkBytes, or nullptr when no chunk can be found even after a sync
  // (an OOM: counted and traced; DescribeOom() says why).
  void* Allocate(size_t bytes, StreamId stream, std::string_view op = {});
  // Allocate without counting or tracing a failure: nullptr means "not now"
  // (the TF adapter's bounded wait for frees, Note [Waiting for frees] in
  // tf_pool_allocator.cc, calls Allocate once more when it gives up).
  void* TryAllocate(size_t bytes, StreamId stream, std::string_view op = {});
  // Frees a pointer returned by Allocate. The chunk joins the unsynced set of
  // the stream that allocated it. Unknown pointers abort (memory corruption).
  void Deallocate(void* ptr, std::string_view op = {});
  // Waterwave's SyncAndCoalesce: every free chunk becomes synced and all free
  // neighbours coalesce.
  void SyncAndCoalesce();
  // Tests only: with the rule off, a freed chunk goes straight to the synced
  // set (no ticket, no wait), so another stream may take it at once, as a
  // stream-unaware allocator would. Breaks the invariant below on purpose,
  // to prove that the race test catches it.
  void SetStreamRuleForTesting(bool on);
  // Tests only: the rule's bookkeeping kept, but syncs (and ReleaseStream)
  // do not wait for the streams' frees: the bug an asynchronous backend
  // would have if it treated a sync as bookkeeping alone.
  void SetSyncWaitsForTesting(bool on);

  // Streams. Names are for reports; ids are small and reused after release.
  StreamId RegisterStream(const std::string& name);
  // Forgets a stream's name; its live chunks stay attributed to it. Its
  // unsynced free chunks become synced (the job is gone, nothing can race).
  void ReleaseStream(StreamId stream);
  // Gives a registered stream another name (its chunks and counters stay):
  // a job's stream taken over by the next job of the same graph (Note
  // [Reusing a finished job's traced step] in
  // tensile_tf/runtime/traced_step_reuse.py). No-op for a released id.
  void RenameStream(StreamId stream, const std::string& name);

  // In the arena or in the stitch window.
  bool Owns(const void* ptr) const;
  // Whether [ptr, ptr + bytes) lies in the arena or inside one live stitched
  // allocation (tests write and read through both addresses).
  bool Accessible(const void* ptr, size_t bytes) const;
  bool stitching() const { return window_ != nullptr; }
  // Offsets name addresses in reports and the Python bindings: [0, capacity)
  // the arena, [capacity, capacity + window) the stitch window.
  int64_t OffsetOf(const void* ptr) const;
  char* AddressOf(int64_t offset) const;
  size_t RequestedSize(const void* ptr) const;
  size_t AllocatedSize(const void* ptr) const;
  int64_t AllocationId(const void* ptr) const;

  PoolStats Stats() const;
  // SyncAndCoalesce calls so far (cheap, unlike Stats()).
  int64_t SyncCount() const;
  std::vector<StreamStats> AllStreamStats() const;
  // Sets peak := current for the pool and every stream.
  void ResetPeak();
  // Sets one stream's peak to its current bytes (others' peaks untouched).
  void ResetStreamPeak(StreamId stream);
  std::vector<ChunkInfo> Chunks() const;
  std::vector<PoolEvent> Trace() const;
  void ClearTrace();
  void SetTraceEnabled(bool enabled);
  // Human-readable reason the last Allocate of `bytes` for `stream` failed,
  // in the form of STYLE.md rule 6, with the streams that held the pool
  // then, largest first ("held by j1 20.0 MiB, default 1.0 MiB").
  std::string DescribeOom(size_t bytes, StreamId stream,
                          std::string_view op) const;
  // Empty if every invariant holds, else a description of the first broken.
  std::string CheckInvariants() const;

  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }
  char* base() const { return base_; }

 private:
  using ChunkHandle = int32_t;
  static constexpr ChunkHandle kNoChunk = -1;

  // A contiguous piece of the arena, live or free. Chunks form a doubly
  // linked list in address order (prev/next), as in BFC's Chunk.
  struct Chunk {
    size_t offset = 0;
    size_t size = 0;
    size_t requested = 0;  // 0 when free
    bool in_use = false;
    StreamId owner = kSyncedOwner;  // see ChunkInfo::owner
    int64_t allocation_id = 0;
    bool piece = false;  // live, part of a stitched allocation
    ChunkHandle prev = kNoChunk;
    ChunkHandle next = kNoChunk;
  };

  // Note [Stitched allocations]: one allocation mapped from several pieces.
  struct Stitched {
    size_t size = 0;        // window bytes = the pieces' bytes
    size_t requested = 0;
    StreamId stream = 0;
    int64_t allocation_id = 0;
    std::vector<ChunkHandle> pieces;  // in window order
  };


  // Private methods require mu_ held unless they say otherwise (the compiler
  // checks: TENSILE_REQUIRES).
  FreeChunkSet& SetFor(StreamId owner) TENSILE_REQUIRES(mu_);
  void InsertFree(ChunkHandle h, StreamId owner) TENSILE_REQUIRES(mu_);
  void RemoveFree(ChunkHandle h) TENSILE_REQUIRES(mu_);
  // Hands `bytes` of free chunk h to `stream`, splitting off the rest.
  void* AllocateImpl(size_t bytes, StreamId stream, std::string_view op,
                     bool count_oom) TENSILE_EXCLUDES(mu_);  // takes mu_
  void* Carve(ChunkHandle h, size_t bytes, size_t requested, StreamId stream,
              std::string_view op) TENSILE_REQUIRES(mu_);
  // Counts a new live allocation of `size` bytes for `stream`, and its free.
  void CountAllocation(int64_t size, size_t requested, StreamId stream) TENSILE_REQUIRES(mu_);
  void CountFree(int64_t size, size_t requested, StreamId stream) TENSILE_REQUIRES(mu_);
  // Whether ptr lies in the stitch window.
  bool InWindow(const void* ptr) const;  // reads only what the constructor set
  // Note [Stitched allocations]: [lo, hi), the whole pages of chunk c; false
  // when it holds none.
  bool PageInterior(const Chunk& c, size_t* lo, size_t* hi) const TENSILE_REQUIRES(mu_);
  // Puts live chunk h, just freed by `stream`, into the stream's unsynced
  // set, coalescing with free neighbours in that set (policy 5).
  void ReturnChunk(ChunkHandle h, StreamId stream) TENSILE_REQUIRES(mu_);
  // ReturnChunk after stamping the free with the backend's ticket; with the
  // stream rule off (tests), straight to the synced set instead.
  void ReturnChunkStamped(ChunkHandle h, StreamId stream) TENSILE_REQUIRES(mu_);
  // Waits for `stream`'s newest unsynced free, if any (policy 6).
  void WaitForStreamLocked(StreamId stream) TENSILE_REQUIRES(mu_);
  // Note [Stitched allocations]. Requires every free chunk synced.
  void* StitchLocked(size_t bytes, size_t rounded, StreamId stream,
                     std::string_view op) TENSILE_REQUIRES(mu_);
  // Cuts chunk h after its first `keep` bytes; returns the handle of the
  // rest, in no free set.
  ChunkHandle SplitOff(ChunkHandle h, size_t keep) TENSILE_REQUIRES(mu_);
  // Splits [at, at + bytes) out of free chunk h (removed from its set); the
  // rest stays free in the synced set. Returns the handle of the piece.
  ChunkHandle SplitOut(ChunkHandle h, size_t at, size_t bytes) TENSILE_REQUIRES(mu_);
  void DeallocateStitchedLocked(void* ptr, std::string_view op) TENSILE_REQUIRES(mu_);
  const Stitched* StitchedFor(const void* ptr) const TENSILE_REQUIRES(mu_);
  // Window address ranges: first fit over window_free_ (offset -> bytes).
  bool TakeWindowRange(size_t bytes, size_t* offset) TENSILE_REQUIRES(mu_);
  void GiveWindowRange(size_t offset, size_t bytes) TENSILE_REQUIRES(mu_);
  // Merges free chunk `b` (the next neighbour of `a`) into `a`; neither may
  // be in a FreeChunkSet.
  void Merge(ChunkHandle a, ChunkHandle b) TENSILE_REQUIRES(mu_);
  ChunkHandle NewChunk() TENSILE_REQUIRES(mu_);
  void SyncAndCoalesceLocked(bool forced_by_allocate) TENSILE_REQUIRES(mu_);
  ChunkHandle HandleFor(const void* ptr) const TENSILE_REQUIRES(mu_);
  MemoryCounters& CountersFor(StreamId stream) TENSILE_REQUIRES(mu_);
  int64_t LargestFreeChunkLocked() const TENSILE_REQUIRES(mu_);

  const std::string name_;
  std::unique_ptr<PoolBackend> backend_;
  size_t capacity_ = 0;
  char* base_ = nullptr;

  mutable Mutex mu_;
  std::vector<Chunk> chunks_ TENSILE_GUARDED_BY(mu_);
  std::vector<ChunkHandle> free_handles_ TENSILE_GUARDED_BY(mu_);
  // Live chunk lookup by address: index (offset / kMinChunkBytes) holds
  // handle + 1 (0 = none). Allocated with calloc so untouched pages cost
  // nothing, as BFC's RegionManager.
  int32_t* handle_by_slot_ TENSILE_GUARDED_BY(mu_) = nullptr;
  FreeChunkSet synced_ TENSILE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<FreeChunkSet>> unsynced_ TENSILE_GUARDED_BY(mu_);  // by stream id
  int64_t unsynced_bytes_ TENSILE_GUARDED_BY(mu_) = 0;  // sum over unsynced_

  MemoryCounters counters_ TENSILE_GUARDED_BY(mu_);
  int64_t requested_current_ TENSILE_GUARDED_BY(mu_) = 0;
  std::vector<MemoryCounters> stream_counters_ TENSILE_GUARDED_BY(mu_);  // by stream id
  std::vector<std::string> stream_names_ TENSILE_GUARDED_BY(mu_);        // "" = free id
  int64_t num_syncs_ TENSILE_GUARDED_BY(mu_) = 0;
  int64_t num_allocator_syncs_ TENSILE_GUARDED_BY(mu_) = 0;
  int64_t next_allocation_id_ TENSILE_GUARDED_BY(mu_) = 1;
  // Note [Stream order on an asynchronous device]: whether the backend's
  // streams are asynchronous, and per stream id the ticket of its newest free
  // since its unsynced set was last emptied (0: none).
  bool async_backend_ = false;
  std::vector<FreeTicket> unsynced_ticket_ TENSILE_GUARDED_BY(mu_);
  int64_t num_stream_waits_ TENSILE_GUARDED_BY(mu_) = 0;
  bool stream_rule_ TENSILE_GUARDED_BY(mu_) = true;
  bool sync_waits_ TENSILE_GUARDED_BY(mu_) = true;
  // Note [Stitched allocations]: the window is twice the arena's address
  // space (reserved, inaccessible until a stitch maps pieces into it).
  char* window_ = nullptr;
  size_t window_bytes_ = 0;
  size_t granularity_ = 0;
  std::map<size_t, size_t> window_free_ TENSILE_GUARDED_BY(mu_);
  std::map<size_t, Stitched> stitched_ TENSILE_GUARDED_BY(mu_);  // by window offset
  int64_t num_stitched_ TENSILE_GUARDED_BY(mu_) = 0;
  int64_t stitched_current_ TENSILE_GUARDED_BY(mu_) = 0;
  EventTrace trace_ TENSILE_GUARDED_BY(mu_);
};

// "64.0 MiB": human-readable bytes for messages.
std::string HumanBytes(int64_t bytes);

// The byte count in environment variable `name` (plain decimal digits), or
// `fallback` when it is unset or not a number. The Python layer validates
// these variables (and accepts "8GiB"); a bad value reaching C++ falls back
// rather than crash TensorFlow.
size_t EnvByteCount(const char* name, size_t fallback);

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_STREAM_AWARE_POOL_H_
