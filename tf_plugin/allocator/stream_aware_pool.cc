#include "tf_plugin/allocator/stream_aware_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace tensile {

// ---------------------------------------------------------------- backends

HostBackend::~HostBackend() {
  if (fd_ >= 0) close(fd_);
}

void* HostBackend::Reserve(size_t bytes) {
  // A sparse memory file: its pages exist once touched, so a large pool is
  // address space until used (as MAP_NORESERVE anonymous memory).
  const int fd = stitchable_ ? memfd_create("tensile-pool", MFD_CLOEXEC) : -1;
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    // A granularity above the page size: the arena starts on a multiple of
    // it (reserve `g` more, map the file at the aligned address, give the
    // slack back).
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t g = granularity_ > page ? granularity_ : 0;
    void* at = nullptr;
    if (g > 0) {
      void* r = mmap(nullptr, bytes + g, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (r != MAP_FAILED) {
        const uintptr_t lo = reinterpret_cast<uintptr_t>(r);
        const uintptr_t aligned = (lo + g - 1) / g * g;
        const size_t tail = (lo + bytes + g) - (aligned + bytes);
        if (aligned > lo) munmap(r, aligned - lo);
        if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
        at = reinterpret_cast<void*>(aligned);
      }
    }
    void* p = mmap(at, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_NORESERVE | (at ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED && at != nullptr) munmap(at, bytes);
    if (p != MAP_FAILED) {
      fd_ = fd;
      madvise(p, bytes, MADV_DONTFORK);
      return p;
    }
  }
  if (fd >= 0) close(fd);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, MADV_DONTFORK);
  return p;
}

void HostBackend::Release(void* base, size_t bytes) { munmap(base, bytes); }

size_t HostBackend::StitchGranularity() const {
  if (fd_ < 0) return 0;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return granularity_ > page ? granularity_ / page * page : page;
}

void* HostBackend::ReserveAddressRange(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, MADV_DONTFORK);
  return p;
}

void HostBackend::ReleaseAddressRange(void* at, size_t bytes) {
  munmap(at, bytes);
}

bool HostBackend::MapArenaPiece(void* at, size_t arena_offset, size_t bytes) {
  if (fd_ < 0) return false;
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 fd_, static_cast<off_t>(arena_offset));
  if (p == MAP_FAILED) return false;
  madvise(p, bytes, MADV_DONTFORK);
  return true;
}

void HostBackend::UnmapToReserved(void* at, size_t bytes) {
  mmap(at, bytes, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

// MakeBackend: async_host_backend.cc (it knows both host backends).

std::string HumanBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(v) >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit]);
  }
  return buf;
}

size_t EnvByteCount(const char* name, size_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  return end != env && *end == '\0' ? static_cast<size_t>(v) : fallback;
}

// -------------------------------------------------------------------- pool

StreamAwarePool::StreamAwarePool(std::string name, size_t capacity,
                                 std::unique_ptr<PoolBackend> backend,
                                 size_t trace_capacity, bool stitch)
    : name_(std::move(name)),
      backend_(std::move(backend)),
      capacity_(capacity / kMinChunkBytes * kMinChunkBytes),
      synced_(kMinChunkBytes),
      trace_(trace_capacity) {
  if (capacity_ == 0) {
    throw std::invalid_argument("pool '" + name_ + "': capacity " +
                                std::to_string(capacity) +
                                " bytes is below the minimum of " +
                                std::to_string(kMinChunkBytes));
  }
  base_ = static_cast<char*>(backend_->Reserve(capacity_));
  if (base_ == nullptr) {
    throw std::runtime_error("pool '" + name_ + "': backend '" +
                             backend_->Name() + "' could not reserve " +
                             HumanBytes(capacity_) +
                             "; choose a smaller pool capacity");
  }
  handle_by_slot_ = static_cast<int32_t*>(
      std::calloc(capacity_ / kMinChunkBytes, sizeof(int32_t)));
  if (handle_by_slot_ == nullptr) {
    backend_->Release(base_, capacity_);
    throw std::runtime_error("pool '" + name_ + "': out of host memory for "
                             "its chunk index");
  }
  stream_counters_.resize(1);
  stream_names_.push_back("default");
  unsynced_.push_back(std::make_unique<FreeChunkSet>(kMinChunkBytes));
  unsynced_ticket_.push_back(0);
  async_backend_ = backend_->Asynchronous();

  ChunkHandle h = NewChunk();
  chunks_[h].offset = 0;
  chunks_[h].size = capacity_;
  InsertFree(h, kSyncedOwner);

  // Note [Stitched allocations]: pieces are whole units of the backend's
  // granularity, so only a granularity that is a multiple of the chunk size
  // (and an arena that starts on one) can stitch.
  const size_t g = stitch ? backend_->StitchGranularity() : 0;
  if (g > 0 && g % kMinChunkBytes == 0 &&
      reinterpret_cast<uintptr_t>(base_) % g == 0) {
    const size_t bytes = (capacity_ + g - 1) / g * g * 2;
    window_ = static_cast<char*>(backend_->ReserveAddressRange(bytes));
    if (window_ != nullptr) {
      window_bytes_ = bytes;
      granularity_ = g;
      window_free_[0] = bytes;
    }
  }
}

StreamAwarePool::~StreamAwarePool() {
  std::free(handle_by_slot_);
  if (window_ != nullptr) backend_->ReleaseAddressRange(window_, window_bytes_);
  if (base_ != nullptr) backend_->Release(base_, capacity_);
}

StreamAwarePool::ChunkHandle StreamAwarePool::NewChunk() {
  if (!free_handles_.empty()) {
    ChunkHandle h = free_handles_.back();
    free_handles_.pop_back();
    chunks_[h] = Chunk();
    return h;
  }
  chunks_.emplace_back();
  return static_cast<ChunkHandle>(chunks_.size() - 1);
}

FreeChunkSet& StreamAwarePool::SetFor(StreamId owner) {
  if (owner == kSyncedOwner) return synced_;
  return *unsynced_[owner];
}

void StreamAwarePool::InsertFree(ChunkHandle h, StreamId owner) {
  Chunk& c = chunks_[h];
  c.in_use = false;
  c.requested = 0;
  c.owner = owner;
  FreeChunkSet& set = SetFor(owner);
  set.Insert(c.size, c.offset, h);
  if (owner != kSyncedOwner) unsynced_bytes_ += c.size;
}

void StreamAwarePool::RemoveFree(ChunkHandle h) {
  Chunk& c = chunks_[h];
  FreeChunkSet& set = SetFor(c.owner);
  set.Erase(c.size, c.offset);
  if (c.owner != kSyncedOwner) unsynced_bytes_ -= c.size;
}

void StreamAwarePool::Merge(ChunkHandle a, ChunkHandle b) {
  Chunk& ca = chunks_[a];
  Chunk& cb = chunks_[b];
  ca.size += cb.size;
  ca.next = cb.next;
  if (cb.next != kNoChunk) chunks_[cb.next].prev = a;
  free_handles_.push_back(b);
}

MemoryCounters& StreamAwarePool::CountersFor(StreamId stream) {
  return stream_counters_[stream];
}

void* StreamAwarePool::Carve(ChunkHandle h, size_t bytes, size_t requested,
                             StreamId stream, std::string_view op) {
  RemoveFree(h);
  const StreamId set_owner = chunks_[h].owner;
  if (chunks_[h].size - bytes >= kMinChunkBytes) {
    InsertFree(SplitOff(h, bytes), set_owner);
  }
  Chunk& c = chunks_[h];
  c.in_use = true;
  c.owner = stream;
  c.requested = requested;
  c.allocation_id = next_allocation_id_++;
  handle_by_slot_[c.offset / kMinChunkBytes] = h + 1;

  const int64_t size = static_cast<int64_t>(c.size);
  CountAllocation(size, requested, stream);
  trace_.Record(PoolEventKind::kAlloc, stream, size,
                static_cast<int64_t>(c.offset), counters_.current, op);
  return base_ + c.offset;
}

void StreamAwarePool::CountAllocation(int64_t size, size_t requested,
                                      StreamId stream) {
  for (MemoryCounters* m : {&counters_, &CountersFor(stream)}) {
    m->current += size;
    m->peak = std::max(m->peak, m->current);
    m->allocated += size;
    m->num_allocs += 1;
    m->largest_alloc = std::max(m->largest_alloc, size);
  }
  requested_current_ += static_cast<int64_t>(requested);
}

void StreamAwarePool::CountFree(int64_t size, size_t requested,
                                StreamId stream) {
  for (MemoryCounters* m : {&counters_, &CountersFor(stream)}) {
    m->current -= size;
    m->freed += size;
    m->num_frees += 1;
  }
  requested_current_ -= static_cast<int64_t>(requested);
}

bool StreamAwarePool::InWindow(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  return window_ != nullptr && p >= window_ && p < window_ + window_bytes_;
}

bool StreamAwarePool::PageInterior(const Chunk& c, size_t* lo,
                                   size_t* hi) const {
  *lo = (c.offset + granularity_ - 1) / granularity_ * granularity_;
  *hi = (c.offset + c.size) / granularity_ * granularity_;
  return *hi > *lo;
}

StreamAwarePool::ChunkHandle StreamAwarePool::SplitOff(ChunkHandle h,
                                                       size_t keep) {
  ChunkHandle rest = NewChunk();  // may reallocate chunks_
  Chunk& c = chunks_[h];
  Chunk& r = chunks_[rest];
  r.offset = c.offset + keep;
  r.size = c.size - keep;
  r.prev = h;
  r.next = c.next;
  if (c.next != kNoChunk) chunks_[c.next].prev = rest;
  c.next = rest;
  c.size = keep;
  return rest;
}

StreamAwarePool::ChunkHandle StreamAwarePool::SplitOut(ChunkHandle h,
                                                       size_t at,
                                                       size_t bytes) {
  // h keeps the head [offset, at) when there is one (handle 0 stays the
  // chunk at offset 0), the piece gets its own handle, the tail another.
  ChunkHandle piece = h;
  if (at > chunks_[h].offset) {
    piece = SplitOff(h, at - chunks_[h].offset);
    InsertFree(h, kSyncedOwner);
  }
  if (chunks_[piece].size > bytes) {
    InsertFree(SplitOff(piece, bytes), kSyncedOwner);
  }
  return piece;
}

bool StreamAwarePool::TakeWindowRange(size_t bytes, size_t* offset) {
  for (auto it = window_free_.begin(); it != window_free_.end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const size_t rest = it->second - bytes;
    window_free_.erase(it);
    if (rest > 0) window_free_[*offset + bytes] = rest;
    return true;
  }
  return false;
}

void StreamAwarePool::GiveWindowRange(size_t offset, size_t bytes) {
  auto it = window_free_.emplace(offset, bytes).first;
  auto next = std::next(it);
  if (next != window_free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    window_free_.erase(next);
  }
  if (it != window_free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      window_free_.erase(it);
    }
  }
}

void* StreamAwarePool::StitchLocked(size_t bytes, size_t rounded,
                                    StreamId stream, std::string_view op) {
  const size_t g = granularity_;
  const size_t need = (rounded + g - 1) / g * g;
  // The page-aligned interior of every free chunk, largest first (fewest
  // pieces); lowest offset on ties, so the choice is deterministic.
  struct Candidate {
    size_t interior;
    size_t start;
    ChunkHandle h;
  };
  std::vector<Candidate> candidates;
  for (ChunkHandle h : synced_.Handles()) {
    size_t lo, hi;
    if (PageInterior(chunks_[h], &lo, &hi)) candidates.push_back({hi - lo, lo, h});
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              return a.interior != b.interior ? a.interior > b.interior
                                              : a.start < b.start;
            });
  std::vector<Candidate> chosen;
  size_t have = 0;
  for (const Candidate& c : candidates) {
    if (have >= need) break;
    chosen.push_back({std::min(c.interior, need - have), c.start, c.h});
    have += chosen.back().interior;
  }
  size_t woff = 0;
  if (have < need || !TakeWindowRange(need, &woff)) return nullptr;
  // Map in arena order (the window's layout is the pieces' offset order).
  std::sort(chosen.begin(), chosen.end(),
            [](const Candidate& a, const Candidate& b) { return a.start < b.start; });
  size_t at = woff;
  for (const Candidate& c : chosen) {
    if (!backend_->MapArenaPiece(window_ + at, c.start, c.interior)) {
      backend_->UnmapToReserved(window_ + woff, need);
      GiveWindowRange(woff, need);
      return nullptr;
    }
    at += c.interior;
  }
  Stitched rec;
  rec.size = need;
  rec.requested = bytes;
  rec.stream = stream;
  rec.allocation_id = next_allocation_id_++;
  for (const Candidate& c : chosen) {
    RemoveFree(c.h);
    const ChunkHandle p = SplitOut(c.h, c.start, c.interior);
    Chunk& piece = chunks_[p];
    piece.in_use = true;
    piece.piece = true;
    piece.owner = stream;
    piece.requested = 0;
    piece.allocation_id = rec.allocation_id;
    rec.pieces.push_back(p);
  }
  CountAllocation(static_cast<int64_t>(need), bytes, stream);
  ++num_stitched_;
  stitched_current_ += static_cast<int64_t>(need);
  trace_.Record(PoolEventKind::kAlloc, stream, static_cast<int64_t>(need),
                static_cast<int64_t>(capacity_ + woff), counters_.current, op);
  for (ChunkHandle p : rec.pieces) {
    trace_.Record(PoolEventKind::kPiece, stream,
                  static_cast<int64_t>(chunks_[p].size),
                  static_cast<int64_t>(chunks_[p].offset), counters_.current,
                  op);
  }
  stitched_.emplace(woff, std::move(rec));
  return window_ + woff;
}

void* StreamAwarePool::Allocate(size_t bytes, StreamId stream,
                                std::string_view op) {
  return AllocateImpl(bytes, stream, op, /*count_oom=*/true);
}

void* StreamAwarePool::TryAllocate(size_t bytes, StreamId stream,
                                   std::string_view op) {
  return AllocateImpl(bytes, stream, op, /*count_oom=*/false);
}

void* StreamAwarePool::AllocateImpl(size_t bytes, StreamId stream,
                                    std::string_view op, bool count_oom) {
  const size_t rounded =
      std::max<size_t>(1, (bytes + kMinChunkBytes - 1) / kMinChunkBytes) *
      kMinChunkBytes;
  MutexLock lock(mu_);
  if (stream < 0 || stream >= static_cast<StreamId>(unsynced_.size()) ||
      stream_names_[stream].empty()) {
    stream = kDefaultStream;  // unknown streams are attributed to default
  }
  if (rounded <= capacity_) {
    // 1-2. The stream's own unsynced chunks and the synced chunks: both are
    //      safe without a sync, so take the best fit across the two (own
    //      chunk on equal size). See Note [Best fit across own and synced].
    ChunkHandle h = unsynced_[stream]->BestFit(rounded);
    const ChunkHandle synced = synced_.BestFit(rounded);
    if (synced != kNoChunk &&
        (h == kNoChunk || chunks_[synced].size < chunks_[h].size)) {
      h = synced;
    }
    // 3. Other streams' unsynced chunks, which need a sync first. The sync
    //    also coalesces, so it can help even when only this stream's
    //    unsynced chunks sit next to synced ones.
    if (h == kNoChunk && unsynced_bytes_ > 0) {
      SyncAndCoalesceLocked(/*forced_by_allocate=*/true);
      h = synced_.BestFit(rounded);
    }
    if (h != kNoChunk) return Carve(h, rounded, bytes, stream, op);
    // 7. Note [Stitched allocations]: every free chunk is synced now.
    if (window_ != nullptr && rounded >= kStitchMinBytes &&
        unsynced_bytes_ == 0) {
      if (void* p = StitchLocked(bytes, rounded, stream, op)) return p;
    }
  }
  if (!count_oom) return nullptr;
  counters_.num_ooms += 1;
  CountersFor(stream).num_ooms += 1;
  trace_.Record(PoolEventKind::kOom, stream, static_cast<int64_t>(bytes), -1,
                counters_.current, op);
  return nullptr;
}

StreamAwarePool::ChunkHandle StreamAwarePool::HandleFor(
    const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  if (p < base_ || p >= base_ + capacity_) return kNoChunk;
  const size_t offset = static_cast<size_t>(p - base_);
  if (offset % kMinChunkBytes != 0) return kNoChunk;
  return handle_by_slot_[offset / kMinChunkBytes] - 1;
}

const StreamAwarePool::Stitched* StreamAwarePool::StitchedFor(
    const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  if (!InWindow(p)) {
    return nullptr;
  }
  auto it = stitched_.find(static_cast<size_t>(p - window_));
  return it == stitched_.end() ? nullptr : &it->second;
}

void StreamAwarePool::DeallocateStitchedLocked(void* ptr, std::string_view op) {
  const size_t woff = static_cast<size_t>(static_cast<char*>(ptr) - window_);
  auto it = stitched_.find(woff);
  if (it == stitched_.end()) {
    std::fprintf(stderr,
                 "tensile pool '%s': Deallocate(%p) of a stitch-window "
                 "pointer it did not hand out (double free or foreign "
                 "pointer); aborting\n",
                 name_.c_str(), ptr);
    std::abort();
  }
  Stitched rec = std::move(it->second);
  stitched_.erase(it);
  // Note [Stitched allocations]: on an asynchronous backend the stream's
  // queued work may still reach the pieces through the window; unmap only
  // after it has passed this free.
  if (async_backend_) {
    backend_->WaitForFree(rec.stream, backend_->RecordFree(rec.stream));
    ++num_stream_waits_;
  }
  backend_->UnmapToReserved(window_ + woff, rec.size);
  GiveWindowRange(woff, rec.size);
  const int64_t size = static_cast<int64_t>(rec.size);
  CountFree(size, rec.requested, rec.stream);
  stitched_current_ -= size;
  trace_.Record(PoolEventKind::kFree, rec.stream, size,
                static_cast<int64_t>(capacity_ + woff), counters_.current, op);
  for (ChunkHandle p : rec.pieces) {
    chunks_[p].piece = false;
    ReturnChunkStamped(p, rec.stream);
  }
}

void StreamAwarePool::Deallocate(void* ptr, std::string_view op) {
  if (ptr == nullptr) return;
  MutexLock lock(mu_);
  if (InWindow(ptr)) {
    DeallocateStitchedLocked(ptr, op);
    return;
  }
  ChunkHandle h = HandleFor(ptr);
  if (h == kNoChunk || !chunks_[h].in_use) {
    std::fprintf(stderr,
                 "tensile pool '%s': Deallocate(%p) of a pointer it did not "
                 "hand out (double free or foreign pointer); aborting\n",
                 name_.c_str(), ptr);
    std::abort();
  }
  Chunk& c = chunks_[h];
  const StreamId stream = c.owner;
  const int64_t size = static_cast<int64_t>(c.size);
  handle_by_slot_[c.offset / kMinChunkBytes] = 0;
  CountFree(size, c.requested, stream);
  trace_.Record(PoolEventKind::kFree, stream, size,
                static_cast<int64_t>(c.offset), counters_.current, op);
  ReturnChunkStamped(h, stream);
}

void StreamAwarePool::ReturnChunkStamped(ChunkHandle h, StreamId stream) {
  if (!stream_rule_) {
    ReturnChunk(h, kSyncedOwner);
    return;
  }
  // Note [Stream order on an asynchronous device].
  if (async_backend_) unsynced_ticket_[stream] = backend_->RecordFree(stream);
  ReturnChunk(h, stream);
}

void StreamAwarePool::ReturnChunk(ChunkHandle h, StreamId stream) {
  // Coalesce only with neighbours in this stream's own unsynced set.
  const Chunk& c = chunks_[h];
  ChunkHandle prev = c.prev;
  ChunkHandle next = c.next;
  if (next != kNoChunk && !chunks_[next].in_use &&
      chunks_[next].owner == stream) {
    RemoveFree(next);
    Merge(h, next);
  }
  if (prev != kNoChunk && !chunks_[prev].in_use &&
      chunks_[prev].owner == stream) {
    RemoveFree(prev);
    Merge(prev, h);
    h = prev;
  }
  InsertFree(h, stream);
}

void StreamAwarePool::SyncAndCoalesce() {
  MutexLock lock(mu_);
  SyncAndCoalesceLocked(/*forced_by_allocate=*/false);
}

void StreamAwarePool::SetStreamRuleForTesting(bool on) {
  MutexLock lock(mu_);
  stream_rule_ = on;
}

void StreamAwarePool::SetSyncWaitsForTesting(bool on) {
  MutexLock lock(mu_);
  sync_waits_ = on;
}

void StreamAwarePool::WaitForStreamLocked(StreamId stream) {
  FreeTicket& ticket = unsynced_ticket_[stream];
  if (ticket == 0) return;
  if (sync_waits_) backend_->WaitForFree(stream, ticket);
  ticket = 0;
  ++num_stream_waits_;
}

void StreamAwarePool::SyncAndCoalesceLocked(bool forced_by_allocate) {
  // Policy 6: wait only for the streams that hold unsynced chunks, each up
  // to its newest free (Note [Stream order on an asynchronous device]).
  if (async_backend_) {
    for (StreamId s = 0; s < static_cast<StreamId>(unsynced_ticket_.size()); ++s) {
      WaitForStreamLocked(s);
    }
  } else {
    backend_->SynchronizeAllStreams();
  }
  ++num_syncs_;
  if (forced_by_allocate) ++num_allocator_syncs_;
  trace_.Record(PoolEventKind::kSync, kSyncedOwner, 0, -1,
                counters_.current, forced_by_allocate ? "allocate" : "explicit");
  // Every free chunk becomes synced; then one pass in address order merges
  // runs of free neighbours.
  for (auto& set : unsynced_) set->Clear();
  unsynced_bytes_ = 0;
  synced_.Clear();
  // Handle 0 is the chunk at offset 0 forever: Merge only retires the later
  // of two neighbours.
  for (ChunkHandle h = 0; h != kNoChunk; h = chunks_[h].next) {
    if (chunks_[h].in_use) continue;
    while (chunks_[h].next != kNoChunk && !chunks_[chunks_[h].next].in_use) {
      Merge(h, chunks_[h].next);
    }
    InsertFree(h, kSyncedOwner);
  }
}

StreamId StreamAwarePool::RegisterStream(const std::string& name) {
  MutexLock lock(mu_);
  for (StreamId s = 1; s < static_cast<StreamId>(stream_names_.size()); ++s) {
    // Reuse a released id only once nothing of its old job is live.
    if (stream_names_[s].empty() && stream_counters_[s].current == 0) {
      stream_names_[s] = name.empty() ? "stream-" + std::to_string(s) : name;
      stream_counters_[s] = MemoryCounters();
      return s;
    }
  }
  const StreamId s = static_cast<StreamId>(stream_names_.size());
  if (s >= kMaxStreams) {
    throw std::runtime_error("pool '" + name_ + "': more than " +
                             std::to_string(kMaxStreams) +
                             " streams registered at once; release finished "
                             "jobs' streams");
  }
  stream_names_.push_back(name.empty() ? "stream-" + std::to_string(s) : name);
  stream_counters_.emplace_back();
  unsynced_.push_back(std::make_unique<FreeChunkSet>(kMinChunkBytes));
  unsynced_ticket_.push_back(0);
  return s;
}

void StreamAwarePool::ReleaseStream(StreamId stream) {
  MutexLock lock(mu_);
  if (stream <= kDefaultStream ||
      stream >= static_cast<StreamId>(stream_names_.size())) {
    return;
  }
  // The job is gone; once its queued work has passed its newest free
  // (Note [Stream order on an asynchronous device]) nothing can still be
  // using its freed chunks.
  if (async_backend_) WaitForStreamLocked(stream);
  FreeChunkSet& set = *unsynced_[stream];
  for (ChunkHandle h : set.Handles()) {
    RemoveFree(h);
    InsertFree(h, kSyncedOwner);
  }
  stream_names_[stream].clear();
}

void StreamAwarePool::RenameStream(StreamId stream, const std::string& name) {
  MutexLock lock(mu_);
  if (stream <= kDefaultStream ||
      stream >= static_cast<StreamId>(stream_names_.size()) ||
      stream_names_[stream].empty() || name.empty()) {
    return;
  }
  stream_names_[stream] = name;
}

bool StreamAwarePool::Owns(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  return (p >= base_ && p < base_ + capacity_) || InWindow(p);
}

bool StreamAwarePool::Accessible(const void* ptr, size_t bytes) const {
  const char* p = static_cast<const char*>(ptr);
  if (p >= base_ && p <= base_ + capacity_ &&
      bytes <= static_cast<size_t>(base_ + capacity_ - p)) {
    return true;
  }
  MutexLock lock(mu_);
  if (!InWindow(p)) {
    return false;
  }
  const size_t off = static_cast<size_t>(p - window_);
  auto it = stitched_.upper_bound(off);
  if (it == stitched_.begin()) return false;
  --it;
  return off + bytes <= it->first + it->second.size;
}

int64_t StreamAwarePool::OffsetOf(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  if (InWindow(p)) {
    return static_cast<int64_t>(capacity_ + (p - window_));
  }
  return static_cast<int64_t>(p - base_);
}

char* StreamAwarePool::AddressOf(int64_t offset) const {
  if (offset >= static_cast<int64_t>(capacity_) && window_ != nullptr) {
    return window_ + (offset - static_cast<int64_t>(capacity_));
  }
  return base_ + offset;
}

size_t StreamAwarePool::RequestedSize(const void* ptr) const {
  MutexLock lock(mu_);
  if (const Stitched* s = StitchedFor(ptr)) return s->requested;
  ChunkHandle h = HandleFor(ptr);
  return h == kNoChunk ? 0 : chunks_[h].requested;
}

size_t StreamAwarePool::AllocatedSize(const void* ptr) const {
  MutexLock lock(mu_);
  if (const Stitched* s = StitchedFor(ptr)) return s->size;
  ChunkHandle h = HandleFor(ptr);
  return h == kNoChunk ? 0 : chunks_[h].size;
}

int64_t StreamAwarePool::AllocationId(const void* ptr) const {
  MutexLock lock(mu_);
  if (const Stitched* s = StitchedFor(ptr)) return s->allocation_id;
  ChunkHandle h = HandleFor(ptr);
  return h == kNoChunk ? 0 : chunks_[h].allocation_id;
}

int64_t StreamAwarePool::LargestFreeChunkLocked() const {
  int64_t largest = static_cast<int64_t>(synced_.LargestSize());
  for (const auto& set : unsynced_) {
    largest = std::max<int64_t>(largest, static_cast<int64_t>(set->LargestSize()));
  }
  return largest;
}

int64_t StreamAwarePool::SyncCount() const {
  MutexLock lock(mu_);
  return num_syncs_;
}

PoolStats StreamAwarePool::Stats() const {
  MutexLock lock(mu_);
  PoolStats s;
  s.name = name_;
  s.backend = backend_->Name();
  s.capacity = static_cast<int64_t>(capacity_);
  s.counters = counters_;
  s.requested_current = requested_current_;
  s.free_bytes = s.capacity - counters_.current;
  s.synced_free_bytes = synced_.bytes();
  s.unsynced_free_bytes = unsynced_bytes_;
  s.largest_free_chunk = LargestFreeChunkLocked();
  s.num_free_chunks = static_cast<int64_t>(synced_.size());
  for (const auto& set : unsynced_) {
    s.num_free_chunks += static_cast<int64_t>(set->size());
  }
  s.num_live_chunks = static_cast<int64_t>(chunks_.size() -
                                           free_handles_.size()) -
                      s.num_free_chunks;
  s.fragmentation =
      s.free_bytes > 0
          ? 1.0 - static_cast<double>(s.largest_free_chunk) / s.free_bytes
          : 0.0;
  s.num_syncs = num_syncs_;
  s.num_allocator_syncs = num_allocator_syncs_;
  s.num_stream_waits = num_stream_waits_;
  s.stream_rule = stream_rule_;
  s.num_stitched = num_stitched_;
  s.stitched_current = stitched_current_;
  s.num_live_stitched = static_cast<int64_t>(stitched_.size());
  s.trace_recorded = trace_.recorded();
  s.trace_dropped = trace_.dropped();
  return s;
}

std::vector<StreamStats> StreamAwarePool::AllStreamStats() const {
  MutexLock lock(mu_);
  std::vector<StreamStats> out;
  for (StreamId s = 0; s < static_cast<StreamId>(stream_names_.size()); ++s) {
    const MemoryCounters& m = stream_counters_[s];
    if (stream_names_[s].empty() && m.current == 0) continue;
    StreamStats st;
    st.stream = s;
    st.name = stream_names_[s].empty() ? "released-" + std::to_string(s)
                                       : stream_names_[s];
    st.counters = m;
    st.unsynced_free_bytes = unsynced_[s]->bytes();
    out.push_back(std::move(st));
  }
  return out;
}

void StreamAwarePool::ResetPeak() {
  MutexLock lock(mu_);
  counters_.peak = counters_.current;
  for (auto& m : stream_counters_) m.peak = m.current;
}

void StreamAwarePool::ResetStreamPeak(StreamId stream) {
  MutexLock lock(mu_);
  if (stream < 0 || stream >= static_cast<StreamId>(stream_counters_.size())) return;
  stream_counters_[stream].peak = stream_counters_[stream].current;
}

std::vector<ChunkInfo> StreamAwarePool::Chunks() const {
  MutexLock lock(mu_);
  std::vector<ChunkInfo> out;
  for (ChunkHandle h = 0; h != kNoChunk; h = chunks_[h].next) {
    const Chunk& c = chunks_[h];
    out.push_back(ChunkInfo{static_cast<int64_t>(c.offset),
                            static_cast<int64_t>(c.size),
                            static_cast<int64_t>(c.requested), c.in_use,
                            c.owner});
  }
  return out;
}

std::vector<PoolEvent> StreamAwarePool::Trace() const {
  MutexLock lock(mu_);
  return trace_.Snapshot();
}

void StreamAwarePool::ClearTrace() {
  MutexLock lock(mu_);
  trace_.Clear();
}

void StreamAwarePool::SetTraceEnabled(bool enabled) {
  MutexLock lock(mu_);
  trace_.set_enabled(enabled);
}

std::string StreamAwarePool::DescribeOom(size_t bytes, StreamId stream,
                                         std::string_view op) const {
  MutexLock lock(mu_);
  const bool known = stream >= 0 &&
                     stream < static_cast<StreamId>(stream_names_.size()) &&
                     !stream_names_[stream].empty();
  const std::string job = known ? stream_names_[stream] : "default";
  size_t free_chunks = synced_.size();
  for (const auto& set : unsynced_) free_chunks += set->size();
  std::ostringstream msg;
  msg << "pool '" << name_ << "' out of memory: job '" << job << "' op '"
      << (op.empty() ? "<unknown>" : std::string(op)) << "' asked "
      << HumanBytes(static_cast<int64_t>(bytes)) << ", "
      << HumanBytes(static_cast<int64_t>(capacity_) - counters_.current)
      << " free of " << HumanBytes(static_cast<int64_t>(capacity_)) << " in "
      << free_chunks << " chunks (largest " << HumanBytes(LargestFreeChunkLocked());
  if (window_ != nullptr && bytes >= kStitchMinBytes) {
    // Note [Stitched allocations]: what a stitch could gather, in whole pages.
    int64_t pages = 0;
    for (ChunkHandle h = 0; h != kNoChunk; h = chunks_[h].next) {
      size_t lo, hi;
      if (!chunks_[h].in_use && PageInterior(chunks_[h], &lo, &hi)) {
        pages += static_cast<int64_t>(hi - lo);
      }
    }
    msg << "; stitching found " << HumanBytes(pages) << " in whole pages";
  }
  // Who held the pool at this very allocation, largest first (Note [What
  // held the pool] in tensile_tf/runtime/failures.py: what a job's record
  // reads a moment later may have been freed by then).
  std::vector<std::pair<int64_t, std::string>> held;
  for (StreamId s = 0; s < static_cast<StreamId>(stream_names_.size()); ++s) {
    const int64_t current = stream_counters_[s].current;
    if (current <= 0) continue;
    held.emplace_back(current, stream_names_[s].empty()
                                   ? "released-" + std::to_string(s)
                                   : stream_names_[s]);
  }
  std::sort(held.begin(), held.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  constexpr size_t kHoldersNamed = 6;
  for (size_t i = 0; i < held.size() && i < kHoldersNamed; ++i) {
    msg << (i == 0 ? "; held by " : ", ") << held[i].second << " "
        << HumanBytes(held[i].first);
  }
  if (held.size() > kHoldersNamed) {
    msg << " and " << held.size() - kHoldersNamed << " more";
  }
  msg << "); raise the pool capacity (TENSILE_POOL_BYTES or "
         "tensile_tf.configure_pool), lower the batch size, or enable a "
         "memory plan (swapping / recomputation)";
  return msg.str();
}

std::string StreamAwarePool::CheckInvariants() const {
  MutexLock lock(mu_);
  std::ostringstream err;
  ChunkHandle h = 0;
  size_t expect_offset = 0;
  int64_t live = 0, synced = 0, unsynced = 0;
  size_t free_chunks = 0;
  std::vector<int64_t> per_stream(unsynced_.size(), 0);
  ChunkHandle prev = kNoChunk;
  for (; h != kNoChunk; prev = h, h = chunks_[h].next) {
    const Chunk& c = chunks_[h];
    if (c.prev != prev) err << "chunk at " << c.offset << ": bad prev link; ";
    if (c.offset != expect_offset) {
      err << "chunk at " << c.offset << ": expected offset " << expect_offset
          << " (gap or overlap); ";
    }
    if (c.size == 0 || c.size % kMinChunkBytes != 0) {
      err << "chunk at " << c.offset << ": bad size " << c.size << "; ";
    }
    expect_offset = c.offset + c.size;
    if (c.in_use) {
      live += c.size;
      if (c.piece) {
        if (handle_by_slot_[c.offset / kMinChunkBytes] != 0) {
          err << "stitched piece at " << c.offset << " in the index; ";
        }
      } else if (handle_by_slot_[c.offset / kMinChunkBytes] != h + 1) {
        err << "live chunk at " << c.offset << " missing from index; ";
      }
    } else {
      const FreeChunkSet& set =
          c.owner == kSyncedOwner ? synced_ : *unsynced_[c.owner];
      ++free_chunks;
      if (set.Find(c.size, c.offset) != h) {
        err << "free chunk at " << c.offset << " missing from its set; ";
      }
      if (c.owner == kSyncedOwner) {
        synced += c.size;
      } else {
        unsynced += c.size;
        per_stream[c.owner] += c.size;
      }
      // Neighbours in the same unsynced set must have been coalesced.
      if (prev != kNoChunk && !chunks_[prev].in_use &&
          chunks_[prev].owner == c.owner && c.owner != kSyncedOwner) {
        err << "free chunks at " << chunks_[prev].offset << " and "
            << c.offset << " of stream " << c.owner << " not coalesced; ";
      }
    }
  }
  if (expect_offset != capacity_) {
    err << "chunks end at " << expect_offset << ", capacity " << capacity_
        << "; ";
  }
  if (live != counters_.current) {
    err << "live bytes " << live << " != current " << counters_.current << "; ";
  }
  if (live + synced + unsynced != static_cast<int64_t>(capacity_)) {
    err << "bytes not conserved; ";
  }
  size_t set_entries = synced_.size();
  for (const auto& set : unsynced_) set_entries += set->size();
  if (set_entries != free_chunks) {
    err << "free sets hold " << set_entries << " entries for " << free_chunks
        << " free chunks (stale entries); ";
  }
  if (synced != synced_.bytes()) err << "synced byte count drifted; ";
  if (unsynced != unsynced_bytes_) err << "unsynced byte count drifted; ";
  for (size_t s = 0; s < unsynced_.size(); ++s) {
    if (per_stream[s] != unsynced_[s]->bytes()) {
      err << "stream " << s << " unsynced byte count drifted; ";
    }
  }
  // Note [Stitched allocations]: each stitched allocation is exactly its
  // live pieces, and the window's free and used ranges tile it.
  int64_t stitched_bytes = 0;
  size_t window_used = 0;
  for (const auto& [woff, rec] : stitched_) {
    size_t pieces = 0;
    for (ChunkHandle p : rec.pieces) {
      const Chunk& c = chunks_[p];
      if (!c.in_use || !c.piece || c.owner != rec.stream ||
          c.allocation_id != rec.allocation_id) {
        err << "stitched allocation at window offset " << woff
            << ": piece at " << c.offset << " not its live piece; ";
      }
      pieces += c.size;
    }
    if (pieces != rec.size || rec.size % granularity_ != 0) {
      err << "stitched allocation at window offset " << woff << ": pieces hold "
          << pieces << " bytes of " << rec.size << "; ";
    }
    stitched_bytes += static_cast<int64_t>(rec.size);
    window_used += rec.size;
  }
  size_t window_free = 0;
  for (const auto& [off, bytes] : window_free_) window_free += bytes;
  if (stitched_bytes != stitched_current_) err << "stitched byte count drifted; ";
  if (window_ != nullptr && window_used + window_free != window_bytes_) {
    err << "stitch window ranges do not tile the window; ";
  }
  int64_t stream_current = 0;
  for (const auto& m : stream_counters_) stream_current += m.current;
  if (stream_current != counters_.current) {
    err << "per-stream current does not add up to pool current; ";
  }
  return err.str();
}

}  // namespace tensile
