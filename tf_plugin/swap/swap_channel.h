// SwapChannel: the Swap Executor of seed 000 §III-B (Fig. 5): the link
// between device and host (like one PCIe link), shared by every job, with
// a thread per lane: one lane for both directions (the seed's), or a lane
// per direction as a GPU's copy engines (Note [A lane per direction] in
// tensile_tf/scheduler/swap_scheduling.py).
//
// Policy:
//  1. A transfer is submitted with a not-before time (its trigger op's end
//     plus the plan's delta t). Each lane's thread runs its lane's
//     transfers one at a time, earliest not-before first (ties: submission
//     order), never before their not-before time: the Execution Queue of
//     Fig. 5, one per lane.
//  2. Lanes (SetLanes, 1 by default): with 1 every transfer takes lane 0;
//     with 2 swap-outs (device to host) take lane 0 and swap-ins lane 1,
//     each lane with its own thread, queue and throttle, so an out and an
//     in run at once. A change applies to transfers submitted after it;
//     the second thread starts the first time two lanes are asked for.
//     Note [Two lanes keep data order].
//  3. Bandwidth cap (bytes/s each way, 0 = unlimited), and an optional
//     combined cap on both directions together (0 = none): a lane moves at
//     most min(each way, combined / lanes), the rate the planner books a
//     lane at (Note [Lanes of a device link] in
//     tensile_tf/config/device_links.py: the H200 moves 55 GB/s each way,
//     92-94 GB/s both together). A transfer of B bytes occupies its lane for
//     at least B / rate seconds; the thread sleeps out the rest after the
//     copy. This emulates a GPU's link on a CPU-only machine (DESIGN.md,
//     "What is real and what is emulated").
//  4. The threads stand in for a GPU's copy engines, which run beside the
//     compute units: each asks for a higher CPU priority (nice
//     TENSILE_SWAP_THREAD_NICE, default -10) so that job threads busy on
//     every core do not delay transfers that are due (measured: two
//     Transformer jobs on 2 cores, transfers waited 1-3 ms past their
//     not-before time on an idle link; the doubled per-job peaks seen then
//     had another cause, Note [Swap ops run inline] in swap_ops.cc). Where
//     the process may not raise priorities they run at the default one
//     (`thread_priority_raised` in the stats: true if every lane's was).
//  5. A transfer's completion callback runs on its lane's thread after the
//     copy, outside the lock. TensorFlow op kernels pass their `done` here:
//     no inter-op thread ever waits for a transfer (a blocked inter-op
//     thread deadlocks a 2-core machine, DESIGN.md).
//  6. The log (SetLogCapacity, off by default; a ring, bounded) records
//     each finished transfer's lane, start and end: whether an out and an
//     in overlapped is read from it, not from a clock outside.
//
// Note [Two lanes keep data order]
// One lane ran transfers in not-before order, two lanes may run a later
// swap-in before an earlier swap-out. No transfer relies on that order:
// an activation's swap-in takes its swap-out's handle, so TensorFlow
// starts the swap-in op (which submits it) only after the swap-out op's
// `done`, i.e. after its copy; a variable's swap-in has a control edge
// from its swap-out within a step, and across iterations the swap-out
// ends before its step does and the swap-in starts in the next step
// (tensile_tf/tf/rewrite/variable_swaps.py, plan_table.h). So on two
// lanes only transfers of different tensors overlap.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_SWAP_SWAP_CHANNEL_H_
#define TF_PLUGIN_SWAP_SWAP_CHANNEL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "tf_plugin/thread_annotations.h"

namespace tensile {

enum class TransferKind { kSwapOut = 0, kSwapIn = 1 };

struct SwapChannelStats {
  double bandwidth_bytes_per_s = 0;  // each way; 0: unlimited
  double combined_bytes_per_s = 0;   // both ways together; 0: no cap (policy 3)
  double lane_bytes_per_s = 0;       // what a lane moves at most; 0: unlimited
  int32_t lanes = 1;                 // policy 2
  int64_t swap_outs = 0;             // transfers done, by kind
  int64_t swap_ins = 0;
  int64_t bytes_out = 0;
  int64_t bytes_in = 0;
  int64_t busy_ns = 0;               // lanes occupied (copy + emulated time), summed
  int64_t lane_busy_ns[2] = {0, 0};  // of which each lane's
  int64_t copy_ns = 0;               // of which real memcpy
  int64_t done_ns = 0;               // completion callbacks (TF's `done`), after the link
  int64_t queue_wait_ns = 0;         // not-before reached -> transfer started
  int64_t max_queue_depth = 0;
  int64_t pending = 0;               // submitted, not finished
  int64_t late_swap_ins = 0;         // consumer was ready before the data
  int64_t checked_swap_ins = 0;      // swap-ins with a lateness probe
  bool thread_priority_raised = false;  // policy 3
};

// One finished transfer, for the channel's timeline (steady clock, ns).
struct TransferRecord {
  TransferKind kind = TransferKind::kSwapOut;
  int32_t lane = 0;           // the lane that ran it (policy 2)
  int32_t stream = 0;         // the job (pool stream) whose op submitted it
  int64_t bytes = 0;
  int64_t submitted_ns = 0;
  int64_t not_before_ns = 0;  // max(submitted, trigger + delta t)
  int64_t start_ns = 0;       // the link took it
  int64_t end_ns = 0;         // copy and emulated link time done
};

class SwapChannel {
 public:
  // `work` does the copy and returns the bytes moved; `done` completes the
  // op. Both run on the channel thread.
  struct Transfer {
    TransferKind kind = TransferKind::kSwapOut;
    int32_t stream = 0;         // the submitting job's pool stream (for the log)
    int64_t not_before_ns = 0;  // steady clock
    std::function<int64_t()> work;
    std::function<void()> done;
  };

  SwapChannel();
  ~SwapChannel();
  SwapChannel(const SwapChannel&) = delete;
  SwapChannel& operator=(const SwapChannel&) = delete;

  void Submit(Transfer t);
  void SetBandwidth(double bytes_per_s);  // each way (policy 3)
  double Bandwidth();
  void SetCombinedBandwidth(double bytes_per_s);  // 0: no combined cap
  // 1 or 2 (policy 2); false for any other count.
  bool SetLanes(int lanes);
  int Lanes();
  // Blocks the caller until every submitted transfer is done (tests, plan
  // replacement). Never called from an op kernel.
  void Drain();
  void RecordLateness(bool late);
  SwapChannelStats Stats();
  void ResetStats();
  // The last `capacity` finished transfers, oldest first (capacity 0: off,
  // the default). Setting it clears the log.
  void SetLogCapacity(size_t capacity);
  std::vector<TransferRecord> Log();
  static int64_t NowNs();

 private:
  struct Queued {
    int64_t not_before_ns;
    uint64_t seq;
    int64_t submitted_ns;
    Transfer t;
  };
  struct Later {
    bool operator()(const Queued& a, const Queued& b) const {
      return a.not_before_ns != b.not_before_ns ? a.not_before_ns > b.not_before_ns
                                                : a.seq > b.seq;
    }
  };
  struct Lane {
    std::priority_queue<Queued, std::vector<Queued>, Later> queue;
    std::condition_variable cv;
    std::thread thread;
  };
  void Loop(int lane) TENSILE_EXCLUDES(mu_);
  double LaneRateLocked() const TENSILE_REQUIRES(mu_);  // policy 3; 0: unlimited

  mutable Mutex mu_;
  std::condition_variable idle_cv_;
  // A lane's queue is read and written under mu_; its cv is notified and its
  // thread joined without it (so the array is not guarded as a whole).
  Lane lanes_[2];
  int num_lanes_ TENSILE_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ TENSILE_GUARDED_BY(mu_) = 0;
  bool stop_ TENSILE_GUARDED_BY(mu_) = false;
  double bandwidth_ TENSILE_GUARDED_BY(mu_) = 0;
  double combined_ TENSILE_GUARDED_BY(mu_) = 0;
  SwapChannelStats stats_ TENSILE_GUARDED_BY(mu_);
  std::vector<TransferRecord> log_ TENSILE_GUARDED_BY(mu_);  // ring of log_capacity_
  size_t log_capacity_ TENSILE_GUARDED_BY(mu_) = 0;
  uint64_t log_next_ TENSILE_GUARDED_BY(mu_) = 0;
};

// The process-wide channel. Bandwidth: TENSILE_SWAP_BANDWIDTH (bytes/s),
// else unlimited; one lane until SetLanes (the run sets run.link_lanes).
SwapChannel& GetSwapChannel();

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_SWAP_CHANNEL_H_
