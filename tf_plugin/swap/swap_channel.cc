#include "tf_plugin/swap/swap_channel.h"

#include "tf_plugin/plugin_settings.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace tensile {

int64_t SwapChannel::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

SwapChannel::SwapChannel() { lanes_[0].thread = std::thread([this] { Loop(0); }); }

SwapChannel::~SwapChannel() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  for (Lane& lane : lanes_) {
    lane.cv.notify_all();
    if (lane.thread.joinable()) lane.thread.join();
  }
}

void SwapChannel::Submit(Transfer t) {
  int lane = 0;
  {
    MutexLock lock(mu_);
    lane = num_lanes_ == 2 && t.kind == TransferKind::kSwapIn ? 1 : 0;  // policy 2
    const int64_t now = NowNs();
    lanes_[lane].queue.push(Queued{std::max(t.not_before_ns, now), next_seq_++, now, std::move(t)});
    stats_.pending += 1;
    stats_.max_queue_depth = std::max<int64_t>(stats_.max_queue_depth,
                                               lanes_[0].queue.size() + lanes_[1].queue.size());
  }
  lanes_[lane].cv.notify_all();
}

void SwapChannel::SetBandwidth(double bytes_per_s) {
  MutexLock lock(mu_);
  bandwidth_ = bytes_per_s > 0 ? bytes_per_s : 0;
}

void SwapChannel::SetCombinedBandwidth(double bytes_per_s) {
  MutexLock lock(mu_);
  combined_ = bytes_per_s > 0 ? bytes_per_s : 0;
}

bool SwapChannel::SetLanes(int lanes) {
  if (lanes != 1 && lanes != 2) return false;
  MutexLock lock(mu_);
  num_lanes_ = lanes;
  if (lanes == 2 && !lanes_[1].thread.joinable()) {
    lanes_[1].thread = std::thread([this] { Loop(1); });  // waits for mu_ before it reads anything
  }
  return true;
}

int SwapChannel::Lanes() {
  MutexLock lock(mu_);
  return num_lanes_;
}

// Policy 3: min(each way, combined / lanes), either cap absent (0) left out.
double SwapChannel::LaneRateLocked() const {
  double rate = bandwidth_;
  if (combined_ > 0) {
    const double share = combined_ / num_lanes_;
    rate = rate > 0 ? std::min(rate, share) : share;
  }
  return rate;
}

double SwapChannel::Bandwidth() {
  MutexLock lock(mu_);
  return bandwidth_;
}

void SwapChannel::Drain() {
  MutexLock lock(mu_);
  idle_cv_.wait(lock.native(), [this]() TENSILE_REQUIRES(mu_) { return stats_.pending == 0; });
}

void SwapChannel::RecordLateness(bool late) {
  MutexLock lock(mu_);
  stats_.checked_swap_ins += 1;
  if (late) stats_.late_swap_ins += 1;
}

SwapChannelStats SwapChannel::Stats() {
  MutexLock lock(mu_);
  SwapChannelStats s = stats_;
  s.bandwidth_bytes_per_s = bandwidth_;
  s.combined_bytes_per_s = combined_;
  s.lane_bytes_per_s = LaneRateLocked();
  s.lanes = num_lanes_;
  return s;
}

void SwapChannel::ResetStats() {
  MutexLock lock(mu_);
  const int64_t pending = stats_.pending;
  const bool raised = stats_.thread_priority_raised;
  stats_ = SwapChannelStats();
  stats_.pending = pending;
  stats_.thread_priority_raised = raised;
}

void SwapChannel::SetLogCapacity(size_t capacity) {
  MutexLock lock(mu_);
  log_capacity_ = capacity;
  log_.assign(capacity, TransferRecord());
  log_next_ = 0;
}

std::vector<TransferRecord> SwapChannel::Log() {
  MutexLock lock(mu_);
  std::vector<TransferRecord> out;
  if (log_capacity_ == 0) return out;
  const uint64_t n = std::min<uint64_t>(log_next_, log_capacity_);
  for (uint64_t i = log_next_ - n; i < log_next_; ++i) out.push_back(log_[i % log_capacity_]);
  return out;
}

// Policy 3: the calling thread's nice value, the settings' swap_thread_nice
// (TENSILE_SWAP_THREAD_NICE, default -10; 0 or more leaves it alone). True if
// it was raised.
static bool RaiseThreadPriority() {
  const int nice = CurrentPluginSettings().swap_thread_nice;
  if (nice >= 0) return false;
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  return setpriority(PRIO_PROCESS, tid, nice) == 0;
}

void SwapChannel::Loop(int lane) {
  const bool raised = RaiseThreadPriority();
  MutexLock lock(mu_);
  stats_.thread_priority_raised = lane == 0 ? raised : stats_.thread_priority_raised && raised;
  Lane& mine = lanes_[lane];
  while (true) {
    mine.cv.wait(lock.native(), [&]() TENSILE_REQUIRES(mu_) { return stop_ || !mine.queue.empty(); });
    if (stop_ && mine.queue.empty()) return;
    const int64_t due = mine.queue.top().not_before_ns;
    const int64_t now = NowNs();
    if (due > now) {
      // An earlier transfer may arrive meanwhile: wake on submit too.
      mine.cv.wait_for(lock.native(), std::chrono::nanoseconds(due - now));
      continue;
    }
    Queued q = std::move(const_cast<Queued&>(mine.queue.top()));
    mine.queue.pop();
    const double bandwidth = LaneRateLocked();
    lock.Unlock();

    const int64_t start = NowNs();
    const int64_t bytes = q.t.work ? q.t.work() : 0;
    const int64_t copied = NowNs();
    if (bandwidth > 0) {
      const int64_t link_ns = static_cast<int64_t>(1e9 * bytes / bandwidth);
      if (copied - start < link_ns) {
        std::this_thread::sleep_for(
            std::chrono::nanoseconds(link_ns - (copied - start)));
      }
    }
    const int64_t end = NowNs();
    if (q.t.done) q.t.done();
    const int64_t done_end = NowNs();

    lock.Lock();
    stats_.pending -= 1;
    if (stats_.pending == 0) idle_cv_.notify_all();
    (q.t.kind == TransferKind::kSwapOut ? stats_.swap_outs : stats_.swap_ins) += 1;
    (q.t.kind == TransferKind::kSwapOut ? stats_.bytes_out : stats_.bytes_in) += bytes;
    stats_.busy_ns += end - start;
    stats_.lane_busy_ns[lane] += end - start;
    stats_.copy_ns += copied - start;
    stats_.done_ns += done_end - end;
    stats_.queue_wait_ns += start - q.not_before_ns;
    if (log_capacity_ > 0) {
      log_[log_next_++ % log_capacity_] =
          TransferRecord{q.t.kind, lane, q.t.stream, bytes, q.submitted_ns, q.not_before_ns, start, end};
    }
  }
}

SwapChannel& GetSwapChannel() {
  static SwapChannel* channel = [] {
    auto* c = new SwapChannel();  // never destroyed: ops may run at exit
    const double cap = CurrentPluginSettings().swap_bandwidth_bytes_per_s;
    if (cap > 0) c->SetBandwidth(cap);
    return c;
  }();
  return *channel;
}

}  // namespace tensile
