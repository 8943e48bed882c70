// SwapChannel: the Swap Executor of seed 000 §III-B (Fig. 5): ONE link
// between device and host (like one PCIe link), shared by every job, with
// its own thread.
//
// Policy:
//  1. A transfer is submitted with a not-before time (its trigger op's end
//     plus the plan's delta t). The thread runs transfers one at a time,
//     earliest not-before first (ties: submission order), never before
//     their not-before time: the Execution Queue of Fig. 5.
//  2. Bandwidth cap (bytes/s, 0 = unlimited): a transfer of B bytes occupies
//     the link for at least B / cap seconds; the thread sleeps out the rest
//     after the copy. This emulates a GPU's link on a CPU-only machine
//     (DESIGN.md, "What is real and what is emulated").
//  3. The thread stands in for a GPU's copy engine, which runs beside the
//     compute units: it asks for a higher CPU priority (nice
//     TENSILE_SWAP_THREAD_NICE, default -10) so that job threads busy on
//     every core do not delay transfers that are due (measured: two
//     Transformer jobs on 2 cores, transfers waited 1-3 ms past their
//     not-before time on an idle link; the doubled per-job peaks seen then
//     had another cause, Note [Swap ops run inline] in swap_ops.cc). Where
//     the process may not raise priorities it runs at the default one
//     (`thread_priority_raised` in the stats says which).
//  4. A transfer's completion callback runs on the channel thread after the
//     copy, outside the lock. TensorFlow op kernels pass their `done` here:
//     no inter-op thread ever waits for a transfer (a blocked inter-op
//     thread deadlocks a 2-core machine, DESIGN.md).
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

namespace tensile {

enum class TransferKind { kSwapOut = 0, kSwapIn = 1 };

struct SwapChannelStats {
  double bandwidth_bytes_per_s = 0;  // 0: unlimited
  int64_t swap_outs = 0;             // transfers done, by kind
  int64_t swap_ins = 0;
  int64_t bytes_out = 0;
  int64_t bytes_in = 0;
  int64_t busy_ns = 0;               // link occupied (copy + emulated time)
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
  void SetBandwidth(double bytes_per_s);
  double Bandwidth();
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
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::priority_queue<Queued, std::vector<Queued>, Later> queue_;
  uint64_t next_seq_ = 0;
  bool stop_ = false;
  double bandwidth_ = 0;
  SwapChannelStats stats_;
  std::vector<TransferRecord> log_;  // ring of log_capacity_
  size_t log_capacity_ = 0;
  uint64_t log_next_ = 0;
  std::thread thread_;
};

// The process-wide channel. Bandwidth: TENSILE_SWAP_BANDWIDTH (bytes/s),
// else unlimited.
SwapChannel& GetSwapChannel();

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_SWAP_CHANNEL_H_
