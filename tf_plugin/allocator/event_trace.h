// EventTrace: a bounded ring buffer of pool events (alloc, free, sync, oom).
// The newest `capacity` events are kept; older ones are overwritten and
// counted in dropped(). Events hold the op name inline (truncated) so that
// recording one never allocates heap memory on the allocation hot path.
//
// Not thread safe: the pool records under its own lock.
// No TensorFlow in this file.
//
// Note [Event timestamps]. A steady_clock read costs ~32 ns on the 2-core VM
// (`__vdso_clock_gettime` was 15% of the allocate/free profile; two reads per
// allocate/free pair, benchmarks/RESULTS.md "Allocate/free pair cost"). On
// x86-64 with an invariant TSC (CPUID 0x80000007 EDX bit 8: constant rate,
// never stops) an event records the raw `__rdtsc()` instead, a few ns, and
// Snapshot() converts ticks to steady-clock nanoseconds with the rate
// measured between the trace's anchor (taken at construction and at each
// Clear) and the snapshot: the same clock as Python's time.monotonic_ns(),
// so event times still compare with times taken outside the pool. Without
// an invariant TSC, events read the steady clock as before.
//
// Note [Ring index without division]. The slot an event goes to was
// `next_ % capacity`, a 64-bit division per event (two per allocate/free
// pair, ~10 ns of the trace's ~46 ns per pair on the 2-core VM); a slot index
// that wraps at the capacity gives the same slot without one.
#ifndef TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_
#define TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_

#include <chrono>
#include <cstdint>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tensile {

// kPiece: one arena piece of the stitched allocation recorded just before
// (Note [Stitched allocations] in stream_aware_pool.h).
enum class PoolEventKind : uint8_t { kAlloc = 0, kFree = 1, kSync = 2, kOom = 3, kPiece = 4 };

inline const char* PoolEventKindName(PoolEventKind kind) {
  switch (kind) {
    case PoolEventKind::kAlloc: return "alloc";
    case PoolEventKind::kFree: return "free";
    case PoolEventKind::kSync: return "sync";
    case PoolEventKind::kOom: return "oom";
    case PoolEventKind::kPiece: return "piece";
  }
  return "unknown";
}

// Note [Truncated op names]: a name longer than kOpNameBytes - 1 is kept as
// its first kOpNameHead bytes, '~' and its last bytes. The tail is what tells
// sibling ops apart (".../Conv2DBackpropInput" vs ".../Conv2DBackpropFilter"),
// and TensorFlow op names never contain '~', so a reader knows the name was
// cut and matches it by prefix and suffix (tensile_tf.tf.pool.traced_op_matches).
struct PoolEvent {
  static constexpr size_t kOpNameBytes = 64;
  static constexpr size_t kOpNameHead = 20;
  int64_t time_ns = 0;      // steady clock, nanoseconds
  PoolEventKind kind = PoolEventKind::kAlloc;
  int32_t stream = 0;       // the job ("stream") the event belongs to
  int64_t bytes = 0;        // chunk bytes (alloc/free), requested bytes (oom)
  int64_t offset = -1;      // arena offset of the chunk (>= capacity: in the
                            // stitch window); -1 for sync/oom
  int64_t pool_current = 0; // pool bytes in use after the event
  char op[kOpNameBytes] = {0};  // op name, NUL terminated (Note [Truncated op names])

  std::string op_name() const { return std::string(op); }
};

inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Note [Event timestamps]: whether this CPU's TSC runs at a constant rate
// and never stops.
inline bool InvariantTsc() {
#if defined(__x86_64__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, eax, ebx, ecx, edx);
  return (edx >> 8) & 1u;
#else
  return false;
#endif
}

// An event's raw timestamp: TSC ticks where invariant, else steady-clock ns.
inline int64_t RawEventTime(bool tsc) {
#if defined(__x86_64__)
  if (tsc) return static_cast<int64_t>(__rdtsc());
#endif
  (void)tsc;
  return SteadyNowNs();
}

class EventTrace {
 public:
  explicit EventTrace(size_t capacity)
      : events_(capacity), tsc_(InvariantTsc()) {
    Anchor();
  }

  // Note [Event timestamps]: "tsc" or "steady_clock".
  const char* clock() const { return tsc_ ? "tsc" : "steady_clock"; }

  bool enabled() const { return !events_.empty() && enabled_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }

  void Record(PoolEventKind kind, int32_t stream, int64_t bytes,
              int64_t offset, int64_t pool_current, std::string_view op) {
    if (!enabled()) return;
    PoolEvent& e = events_[slot_];   // Note [Ring index without division]
    e.time_ns = RawEventTime(tsc_);   // converted in Snapshot()
    e.kind = kind;
    e.stream = stream;
    e.bytes = bytes;
    e.offset = offset;
    e.pool_current = pool_current;
    constexpr size_t kMax = PoolEvent::kOpNameBytes - 1;
    if (op.size() <= kMax) {
      if (!op.empty()) std::memcpy(e.op, op.data(), op.size());
      e.op[op.size()] = '\0';
    } else {  // Note [Truncated op names]
      constexpr size_t kHead = PoolEvent::kOpNameHead;
      constexpr size_t kTail = kMax - kHead - 1;
      std::memcpy(e.op, op.data(), kHead);
      e.op[kHead] = '~';
      std::memcpy(e.op + kHead + 1, op.data() + op.size() - kTail, kTail);
      e.op[kMax] = '\0';
    }
    ++next_;
    if (++slot_ == events_.size()) slot_ = 0;
  }

  // Events oldest first, times in steady-clock nanoseconds.
  std::vector<PoolEvent> Snapshot() const {
    std::vector<PoolEvent> out;
    if (events_.empty()) return out;
    const uint64_t n = next_ < events_.size() ? next_ : events_.size();
    out.reserve(n);
    for (uint64_t i = next_ - n; i < next_; ++i) {
      out.push_back(events_[i % events_.size()]);
    }
    if (tsc_) {  // Note [Event timestamps]: ticks -> ns at the rate since the anchor
      const int64_t now_ns = SteadyNowNs();
      const int64_t now_ticks = RawEventTime(true);
      const double ns_per_tick =
          now_ticks > anchor_ticks_
              ? static_cast<double>(now_ns - anchor_ns_) /
                    static_cast<double>(now_ticks - anchor_ticks_)
              : 0.0;
      for (PoolEvent& e : out) {
        e.time_ns = anchor_ns_ + static_cast<int64_t>(
                                     static_cast<double>(e.time_ns - anchor_ticks_) *
                                     ns_per_tick);
      }
    }
    return out;
  }

  void Clear() {
    next_ = 0;
    slot_ = 0;
    Anchor();
  }
  uint64_t recorded() const { return next_; }
  uint64_t dropped() const {
    return next_ > events_.size() ? next_ - events_.size() : 0;
  }
  size_t capacity() const { return events_.size(); }

 private:
  void Anchor() {
    anchor_ns_ = SteadyNowNs();
    anchor_ticks_ = RawEventTime(tsc_);
  }

  std::vector<PoolEvent> events_;
  uint64_t next_ = 0;  // total events recorded so far
  size_t slot_ = 0;    // next_ % capacity, kept without a division
  bool enabled_ = true;
  bool tsc_ = false;          // Note [Event timestamps]
  int64_t anchor_ns_ = 0;     // steady clock at the anchor
  int64_t anchor_ticks_ = 0;  // raw event time at the anchor
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_
