// NodeGroupPipeline and CounterBarrier: the runtime of Waterwave's node-group
// pipeline (seed 004 §4.3, Fig. 6).
//
// A schedule (tf_plugin/nodegroup/schedule.py, Algorithm 1) puts every node
// group of every job into a numbered node group *pair*; pair k may start only
// when pair k-1 has finished. CounterBarrier k sits between them: its *prev*
// participants are the jobs with a group in pair k-1, its *succ* participants
// the jobs with a group in pair k. Each job's step carries one
// TensileNodeGroupBarrier op per group boundary b (b = 0 before its first
// group, b = num_groups after its last), with control edges from the leaf
// nodes of group b-1 and to the root nodes of group b. That op calls
// Boundary(job, b): it *arrives* at the barrier after group b-1's pair (the
// seed's prev_count decrement) and *waits* at the barrier before group b's
// pair until every prev participant has arrived (prev_count == 0), then
// passes (succ_count decrement). When a barrier opens, the pool's
// SyncAndCoalesce runs once, so the chunks freed in pair k-1 serve the
// allocations of pair k (the "memory flow" of Fig. 5).
//
// Note [Generations instead of resets]
// The seed resets a CB "when succ_count becomes zero". Jobs here run their
// iterations freely, so a fast job may arrive at a barrier for its next
// iteration before a slow job has passed it in the current one; a reset
// would lose that arrival. Instead every participant keeps monotone counts
// (arrived, passed); the n-th wait of a job (generation n) opens when every
// prev participant has arrived n+1 times. prev_count and succ_count of the
// seed are derived from them (BarrierStats) for the oldest open generation.
// Barrier 0 wraps around: its prev participants are the jobs of the *last*
// pair, and generation n needs only n arrivals, so the first iteration starts
// at once and iteration n+1 of pair 0 follows pair `last` of iteration n.
// Deadlock freedom: a wait of (generation n, pair k) depends only on arrivals
// of (n, k-1), or of (n-1, last) for k = 0, and on the job's own earlier
// groups; all are smaller in (generation, pair) order.
//
// Note [Versions: adding and removing barriers between iterations]
// SetSchedule installs a new *version* (new barriers) without touching the
// graphs: the ops only name (job, boundary). A job switches to the newest
// version at its boundary 0 (between iterations), leaving every older
// version first (not only its own: a version installed while the job was
// running an older one names it too), which releases old-version waiters
// that counted on it. So jobs can
// come and go: a job that ends or fails calls Leave(), which removes it from
// every barrier of every version and releases waits that it was holding up.
//
// Note [Hand-over at the old barrier]
// A job that ran an older version in which it is paced switches only once
// that version lets it start its next iteration: it first waits at its own
// first barrier there, for the generation it is about to start, and moves
// to the newest version when that wait opens. Before, it switched at once:
// version n+1's generation 0 needs no arrivals, so the job started its next
// iteration while the others were still in the old version's last pairs,
// and leaving the old version released their waits, so for the rest of that
// iteration no two jobs were paired. That is the likely reason re-pairing two
// Transformer jobs while they trained failed at batch 44 and 33 where 44 had
// passed (benchmarks/RESULTS.md, Issue 20, twelfth session), and every
// arrival into a running pipeline paid the same. Now the old pairing
// holds until each job has finished its old iteration in step with the
// others, and the jobs enter the new version one pair apart, as its own
// barriers order them. The hand-over wait is the wait the job would have
// made had no version been installed, and leaving a version only releases
// waits, so the deadlock-freedom argument of Note [Generations instead of
// resets] still holds within each version. A job new to the pipeline (in no
// older version) and a job the old version did not pace enter at once; the
// hand-over does not look at the step's node groups (its partition may have
// changed with the version).
//
// Note [A step that did not finish]
// A step that fails or is cancelled mid-way (an OOM, a timed-out wait) never
// reaches its later boundaries, so its arrivals for this generation are
// missing and its next iteration would wait for itself. At boundary 0 the
// pipeline sees that the job's previous iteration stopped at boundary b and
// counts the skipped boundaries b+1..num_groups as if their groups had run
// instantly (their memory was freed when TensorFlow aborted the step), so
// every counter stays aligned with the other jobs' generations.
//
// Note [Never block a TensorFlow thread]
// A barrier op that blocks an inter-op thread deadlocks a 2-core machine
// (DESIGN.md). Boundary() never blocks: it calls `done` inline when the job
// may go on at once, and otherwise parks the callback; a waiter is released
// from the pipeline's own notifier thread, which also fails waits past their
// deadline (DeadlineExceeded naming the barrier and the missing jobs).
// Cancel() withdraws a parked waiter (TensorFlow step cancellation).
//
// No TensorFlow in this file; the op adapter is boundary_op.cc.
#ifndef TF_PLUGIN_NODEGROUP_COUNTER_BARRIER_H_
#define TF_PLUGIN_NODEGROUP_COUNTER_BARRIER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "tf_plugin/thread_annotations.h"

namespace tensile {
namespace nodegroup {

using JobKey = int32_t;  // the job's pool stream id

enum class Code { kOk, kCancelled, kDeadlineExceeded, kInvalidArgument, kAborted };
const char* CodeName(Code code);

struct Outcome {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
};
using DoneFn = std::function<void(const Outcome&)>;

// One job in a schedule: its name (for messages) and the pair of each of its
// node groups, strictly increasing.
struct JobSchedule {
  std::string name;
  std::vector<int> pair_of_group;
};

// A CounterBarrier as seen from outside, for the oldest generation not yet
// passed by every succ participant.
struct BarrierStats {
  int index = 0;
  int64_t generation = 0;
  int prev_count = 0;   // prev participants that have not arrived for it
  int succ_count = 0;   // succ participants that have not passed it
  int64_t opened = 0;   // generations opened so far (SyncAndCoalesce each)
  int waiting = 0;      // parked waiters now
  std::vector<JobKey> prev_jobs;
  std::vector<JobKey> succ_jobs;
};

struct PipelineStats {
  int64_t version = 0;
  int num_pairs = 0;
  std::vector<JobKey> jobs;
  int64_t boundaries = 0;        // Boundary calls
  int64_t passthrough = 0;       // by jobs outside the schedule
  int64_t waits = 0;             // waits that had to park
  int64_t released = 0;          // parked waits released because the barrier opened
  int64_t released_by_leave = 0; // ... because a job left
  int64_t timeouts = 0;
  int64_t cancellations = 0;
  int64_t pair_starts = 0;       // barrier openings (each runs the pair-start hook)
  double wait_seconds = 0.0;     // total time parked
  int waiting_now = 0;
  double timeout_seconds = 0.0;
  std::vector<BarrierStats> barriers;  // of the newest version
};

class NodeGroupPipeline {
 public:
  // `on_pair_start` runs once per barrier opening, before the waiters of the
  // new pair go on (the device pool's SyncAndCoalesce).
  explicit NodeGroupPipeline(std::function<void()> on_pair_start);
  ~NodeGroupPipeline();
  NodeGroupPipeline(const NodeGroupPipeline&) = delete;
  NodeGroupPipeline& operator=(const NodeGroupPipeline&) = delete;

  // Installs a new schedule version; returns its number. Throws
  // std::invalid_argument (with the job and group) if a job's pairs are not
  // strictly increasing within [0, num_pairs).
  int64_t SetSchedule(const std::map<JobKey, JobSchedule>& jobs, int num_pairs);
  // Removes `job` from every barrier of every version; waits it held up are
  // released, and its own parked waits go on (status ok).
  void Leave(JobKey job);
  // Seconds a wait may park before it fails; <= 0: forever.
  void SetTimeout(double seconds);
  double timeout() const;

  // A fresh waiter id, for registering a cancellation callback before
  // calling Boundary (so a cancel can never miss the waiter).
  uint64_t NewWaiterId();
  // Boundary `boundary` (0..num_groups) of `job`'s step; see the file comment.
  // Calls done exactly once: inline if the job may go on now, else later from
  // the notifier thread (released, timed out, cancelled).
  void Boundary(uint64_t waiter_id, JobKey job, int boundary, int num_groups, DoneFn done);
  // Withdraws waiter `waiter_id` (done gets kCancelled); a no-op for
  // released waiters; remembered if Boundary has not parked it yet.
  void Cancel(uint64_t waiter_id);

  PipelineStats Stats() const;

 private:
  struct Barrier {
    std::set<JobKey> prev, succ;
    std::map<JobKey, int64_t> arrived;  // prev participant -> arrivals
    std::map<JobKey, int64_t> passed;   // succ participant -> waits begun
    int64_t opened = 0;                 // generations whose pair has started
    std::vector<uint64_t> waiting;      // parked waiter ids
  };
  struct Version {
    int64_t number = 0;
    int num_pairs = 0;
    std::map<JobKey, JobSchedule> jobs;
    std::vector<Barrier> barriers;  // barrier k: before pair k
    std::map<JobKey, int> next_boundary;  // the boundary each job reaches next
  };
  struct Waiter {
    JobKey job = 0;
    std::shared_ptr<Version> version;
    int barrier = 0;
    int64_t generation = 0;
    std::chrono::steady_clock::time_point parked_at;
    std::chrono::steady_clock::time_point deadline;
    bool has_deadline = false;
    // Note [Hand-over at the old barrier]: released, the job moves to the
    // newest version and makes its boundary 0 there (num_groups: its step's).
    bool hand_over = false;
    int num_groups = 0;
    DoneFn done;
  };
  struct Release {
    DoneFn done;
    Outcome outcome;
  };

  // Private methods require mu_ held unless they say otherwise (the compiler
  // checks: Note [Locks a compiler checks] in tf_plugin/thread_annotations.h).
  bool ReadyLocked(const Version& v, int k, int64_t generation) const TENSILE_REQUIRES(mu_);
  // Marks generation `generation` of barrier k opened; true if that is new
  // (the pair-start hook must run).
  bool OpenLocked(Version& v, int k, int64_t generation) TENSILE_REQUIRES(mu_);
  // Releases every parked waiter of barrier k that is ready now.
  void ReleaseReadyLocked(Version& v, int k, std::vector<Release>* out, bool* pair_start,
                          bool by_leave) TENSILE_REQUIRES(mu_);
  void RemoveJobLocked(Version& v, JobKey job, std::vector<Release>* out, bool* pair_start) TENSILE_REQUIRES(mu_);
  // RemoveJobLocked on the latest version and every version a job runs
  // under, except `keep` (nullptr: all).
  void RemoveJobFromVersionsLocked(JobKey job, const Version* keep, std::vector<Release>* out,
                                   bool* pair_start) TENSILE_REQUIRES(mu_);
  // Note [A step that did not finish]: counts the arrivals and passes of
  // boundaries [from, num_groups] that the job's aborted step skipped.
  void FastForwardLocked(Version& v, JobKey job, int from, std::vector<Release>* out,
                         bool* pair_start) TENSILE_REQUIRES(mu_);
  // Boundary 0 of `job` in the newest version, after leaving the older ones:
  // done goes to *out, or the job parks (true) under `waiter_id`.
  bool EnterLatestLocked(uint64_t waiter_id, JobKey job, int num_groups, DoneFn* done,
                         std::vector<Release>* out, bool* pair_start, Outcome* outcome) TENSILE_REQUIRES(mu_);
  // Boundary `boundary` of `job` in version `current`; parks (true) or sets *outcome.
  bool BoundaryInVersionLocked(uint64_t waiter_id, JobKey job, int boundary, int num_groups,
                               const std::shared_ptr<Version>& current, DoneFn* done,
                               std::vector<Release>* out, bool* pair_start, Outcome* outcome) TENSILE_REQUIRES(mu_);
  // The job's next wait at barrier k of `version` (the seed's succ_count
  // decrement): opens it if ready, else parks `done` there (true).
  bool WaitLocked(uint64_t waiter_id, JobKey job, const std::shared_ptr<Version>& version, int k,
                  DoneFn* done, bool* pair_start, bool hand_over, int num_groups) TENSILE_REQUIRES(mu_);
  // Moves the hand-over waiters that ReleaseReadyLocked released into the
  // newest version, until none is left.
  void RunHandOversLocked(std::vector<Release>* out, bool* pair_start) TENSILE_REQUIRES(mu_);
  std::string JobLabelLocked(const Version& v, JobKey job) const TENSILE_REQUIRES(mu_);
  std::string TimeoutMessageLocked(const Waiter& w, double waited_s) const TENSILE_REQUIRES(mu_);
  void Deliver(std::vector<Release> releases, bool pair_start) TENSILE_EXCLUDES(mu_);
  void NotifierLoop() TENSILE_EXCLUDES(mu_);

  std::function<void()> on_pair_start_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TENSILE_GUARDED_BY(mu_) = false;
  std::shared_ptr<Version> latest_ TENSILE_GUARDED_BY(mu_);
  std::map<JobKey, std::shared_ptr<Version>> job_version_ TENSILE_GUARDED_BY(mu_);  // version a job runs under
  std::map<JobKey, std::string> job_names_ TENSILE_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ TENSILE_GUARDED_BY(mu_);
  std::unordered_set<uint64_t> issued_ TENSILE_GUARDED_BY(mu_);           // ids not yet given to Boundary
  std::unordered_set<uint64_t> cancelled_early_ TENSILE_GUARDED_BY(mu_);  // ... and cancelled meanwhile
  std::deque<Release> ready_ TENSILE_GUARDED_BY(mu_);
  struct HandOver {
    uint64_t waiter_id;
    JobKey job;
    int num_groups;
    DoneFn done;
  };
  std::vector<HandOver> hand_overs_ TENSILE_GUARDED_BY(mu_);  // released hand-over waits, to move on
  uint64_t next_waiter_id_ TENSILE_GUARDED_BY(mu_) = 1;
  double timeout_s_ TENSILE_GUARDED_BY(mu_) = 60.0;
  PipelineStats counters_ TENSILE_GUARDED_BY(mu_);
  std::thread notifier_;
};

// The process-wide pipeline whose pair-start hook syncs the device pool.
NodeGroupPipeline& DevicePipeline();

}  // namespace nodegroup
}  // namespace tensile

#endif  // TF_PLUGIN_NODEGROUP_COUNTER_BARRIER_H_
