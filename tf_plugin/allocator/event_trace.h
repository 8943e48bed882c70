// EventTrace: a bounded ring buffer of pool events (alloc, free, sync, oom).
// The newest `capacity` events are kept; older ones are overwritten and
// counted in dropped(). Events hold the op name inline (truncated) so that
// recording one never allocates heap memory on the allocation hot path.
//
// Not thread safe: the pool records under its own lock.
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_
#define TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tensile {

enum class PoolEventKind : uint8_t { kAlloc = 0, kFree = 1, kSync = 2, kOom = 3 };

inline const char* PoolEventKindName(PoolEventKind kind) {
  switch (kind) {
    case PoolEventKind::kAlloc: return "alloc";
    case PoolEventKind::kFree: return "free";
    case PoolEventKind::kSync: return "sync";
    case PoolEventKind::kOom: return "oom";
  }
  return "unknown";
}

// Note [Truncated op names]: a name longer than kOpNameBytes - 1 is kept as
// its first kOpNameHead bytes, '~' and its last bytes. The tail is what tells
// sibling ops apart (".../Conv2DBackpropInput" vs ".../Conv2DBackpropFilter"),
// and TensorFlow op names never contain '~', so a reader knows the name was
// cut and matches it by prefix and suffix (tensile_tf.memory.traced_op_matches).
struct PoolEvent {
  static constexpr size_t kOpNameBytes = 64;
  static constexpr size_t kOpNameHead = 20;
  int64_t time_ns = 0;      // steady clock, nanoseconds
  PoolEventKind kind = PoolEventKind::kAlloc;
  int32_t stream = 0;       // the job ("stream") the event belongs to
  int64_t bytes = 0;        // chunk bytes (alloc/free), requested bytes (oom)
  int64_t offset = -1;      // arena offset of the chunk; -1 for sync/oom
  int64_t pool_current = 0; // pool bytes in use after the event
  char op[kOpNameBytes] = {0};  // op name, NUL terminated (Note [Truncated op names])

  std::string op_name() const { return std::string(op); }
};

inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class EventTrace {
 public:
  explicit EventTrace(size_t capacity) : events_(capacity) {}

  bool enabled() const { return !events_.empty() && enabled_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }

  void Record(PoolEventKind kind, int32_t stream, int64_t bytes,
              int64_t offset, int64_t pool_current, std::string_view op) {
    if (!enabled()) return;
    PoolEvent& e = events_[next_ % events_.size()];
    e.time_ns = SteadyNowNs();
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
  }

  // Events oldest first.
  std::vector<PoolEvent> Snapshot() const {
    std::vector<PoolEvent> out;
    if (events_.empty()) return out;
    const uint64_t n = next_ < events_.size() ? next_ : events_.size();
    out.reserve(n);
    for (uint64_t i = next_ - n; i < next_; ++i) {
      out.push_back(events_[i % events_.size()]);
    }
    return out;
  }

  void Clear() { next_ = 0; }
  uint64_t recorded() const { return next_; }
  uint64_t dropped() const {
    return next_ > events_.size() ? next_ - events_.size() : 0;
  }
  size_t capacity() const { return events_.size(); }

 private:
  std::vector<PoolEvent> events_;
  uint64_t next_ = 0;  // total events recorded so far
  bool enabled_ = true;
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_EVENT_TRACE_H_
