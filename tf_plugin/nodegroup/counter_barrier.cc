#include "tf_plugin/nodegroup/counter_barrier.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "tf_plugin/allocator/device_pool.h"

namespace tensile {
namespace nodegroup {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kCancelled: return "cancelled";
    case Code::kDeadlineExceeded: return "deadline_exceeded";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kAborted: return "aborted";
  }
  return "unknown";
}

NodeGroupPipeline::NodeGroupPipeline(std::function<void()> on_pair_start)
    : on_pair_start_(std::move(on_pair_start)),
      latest_(std::make_shared<Version>()) {
  notifier_ = std::thread([this] { NotifierLoop(); });
}

NodeGroupPipeline::~NodeGroupPipeline() {
  std::vector<Release> left;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& [id, w] : waiters_) {
      left.push_back({std::move(w.done), {Code::kAborted, "nodegroup pipeline shut down"}});
    }
    waiters_.clear();
  }
  cv_.notify_all();
  notifier_.join();
  for (Release& r : left) r.done(r.outcome);
}

int64_t NodeGroupPipeline::SetSchedule(const std::map<JobKey, JobSchedule>& jobs,
                                      int num_pairs) {
  if (num_pairs < 0) throw std::invalid_argument("num_pairs must be >= 0");
  auto v = std::make_shared<Version>();
  v->num_pairs = num_pairs;
  v->jobs = jobs;
  v->barriers.resize(num_pairs);
  for (const auto& [job, js] : jobs) {
    int last = -1;
    for (size_t g = 0; g < js.pair_of_group.size(); ++g) {
      const int pair = js.pair_of_group[g];
      if (pair <= last || pair >= num_pairs) {
        throw std::invalid_argument(
            "nodegroup schedule: job '" + js.name + "' (stream " + std::to_string(job) +
            "): node group " + std::to_string(g) + " is in pair " + std::to_string(pair) +
            "; pairs must increase strictly within [0, " + std::to_string(num_pairs) + ")");
      }
      last = pair;
      v->barriers[pair].succ.insert(job);
      v->barriers[(pair + 1) % num_pairs].prev.insert(job);
    }
  }
  MutexLock lock(mu_);
  v->number = latest_->number + 1;
  for (const auto& [job, js] : jobs) job_names_[job] = js.name;
  latest_ = v;
  return v->number;
}

void NodeGroupPipeline::SetTimeout(double seconds) {
  MutexLock lock(mu_);
  timeout_s_ = seconds;
}

double NodeGroupPipeline::timeout() const {
  MutexLock lock(mu_);
  return timeout_s_;
}

uint64_t NodeGroupPipeline::NewWaiterId() {
  MutexLock lock(mu_);
  issued_.insert(next_waiter_id_);
  return next_waiter_id_++;
}

bool NodeGroupPipeline::ReadyLocked(const Version& v, int k, int64_t generation) const {
  // Barrier 0 wraps around: generation n waits for iteration n-1's last pair.
  const int64_t need = k == 0 ? generation : generation + 1;
  const Barrier& b = v.barriers[k];
  for (JobKey j : b.prev) {
    auto it = b.arrived.find(j);
    if ((it == b.arrived.end() ? 0 : it->second) < need) return false;
  }
  return true;
}

bool NodeGroupPipeline::OpenLocked(Version& v, int k, int64_t generation) {
  Barrier& b = v.barriers[k];
  if (generation < b.opened) return false;
  b.opened = generation + 1;
  counters_.pair_starts += 1;
  return true;
}

void NodeGroupPipeline::ReleaseReadyLocked(Version& v, int k, std::vector<Release>* out,
                                           bool* pair_start, bool by_leave) {
  Barrier& b = v.barriers[k];
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint64_t> still;
  for (uint64_t id : b.waiting) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) continue;
    Waiter& w = it->second;
    if (!ReadyLocked(v, k, w.generation)) {
      still.push_back(id);
      continue;
    }
    if (OpenLocked(v, k, w.generation)) *pair_start = true;
    counters_.wait_seconds += std::chrono::duration<double>(now - w.parked_at).count();
    (by_leave ? counters_.released_by_leave : counters_.released) += 1;
    if (w.hand_over) {
      hand_overs_.push_back({id, w.job, w.num_groups, std::move(w.done)});  // RunHandOversLocked
    } else {
      out->push_back({std::move(w.done), {}});
    }
    waiters_.erase(it);
  }
  b.waiting = std::move(still);
}

void NodeGroupPipeline::RemoveJobLocked(Version& v, JobKey job, std::vector<Release>* out,
                                        bool* pair_start) {
  v.jobs.erase(job);
  v.next_boundary.erase(job);
  for (Barrier& b : v.barriers) {
    b.prev.erase(job);
    b.succ.erase(job);
    b.arrived.erase(job);
    b.passed.erase(job);
  }
  // The job's own parked waits go on: it is no longer paced by anyone.
  const auto now = std::chrono::steady_clock::now();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& w = it->second;
    if (w.job == job && w.version.get() == &v) {
      auto& ids = v.barriers[w.barrier].waiting;
      ids.erase(std::remove(ids.begin(), ids.end(), it->first), ids.end());
      counters_.wait_seconds += std::chrono::duration<double>(now - w.parked_at).count();
      counters_.released_by_leave += 1;
      out->push_back({std::move(w.done), {}});
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (int k = 0; k < v.num_pairs; ++k) ReleaseReadyLocked(v, k, out, pair_start, true);
}

void NodeGroupPipeline::FastForwardLocked(Version& v, JobKey job, int from,
                                          std::vector<Release>* out, bool* pair_start) {
  const std::vector<int>& pairs = v.jobs.at(job).pair_of_group;
  const int n = static_cast<int>(pairs.size());
  for (int b = std::max(from, 1); b <= n; ++b) {
    const int k = (pairs[b - 1] + 1) % v.num_pairs;
    v.barriers[k].arrived[job] += 1;
    if (b < n) v.barriers[pairs[b]].passed[job] += 1;
    ReleaseReadyLocked(v, k, out, pair_start, false);
  }
}

void NodeGroupPipeline::RemoveJobFromVersionsLocked(JobKey job, const Version* keep,
                                                      std::vector<Release>* out, bool* pair_start) {
  std::set<Version*> seen;
  std::vector<std::shared_ptr<Version>> versions = {latest_};
  for (const auto& [j, v] : job_version_) versions.push_back(v);
  for (const auto& v : versions) {
    if (v && v.get() != keep && seen.insert(v.get()).second) RemoveJobLocked(*v, job, out, pair_start);
  }
}

void NodeGroupPipeline::Leave(JobKey job) {
  std::vector<Release> out;
  bool pair_start = false;
  {
    MutexLock lock(mu_);
    RemoveJobFromVersionsLocked(job, /*keep=*/nullptr, &out, &pair_start);
    job_version_.erase(job);
    RunHandOversLocked(&out, &pair_start);
  }
  Deliver(std::move(out), pair_start);
}

void NodeGroupPipeline::Boundary(uint64_t waiter_id, JobKey job, int boundary, int num_groups,
                                 DoneFn done) {
  std::vector<Release> out;
  bool pair_start = false;
  Outcome now_outcome;
  bool parked = false;
  {
    MutexLock lock(mu_);
    counters_.boundaries += 1;
    issued_.erase(waiter_id);
    if (cancelled_early_.erase(waiter_id) > 0) {
      counters_.cancellations += 1;
      now_outcome = {Code::kCancelled, "nodegroup barrier: the step was cancelled"};
    } else {
      std::shared_ptr<Version> current = job_version_[job];
      auto old_it = current == nullptr ? decltype(current->jobs.end()){} : current->jobs.find(job);
      if (boundary == 0 && current != latest_ && current != nullptr && old_it != current->jobs.end() &&
          !old_it->second.pair_of_group.empty()) {
        // Note [Hand-over at the old barrier]: first the wait this boundary
        // makes in the version the job ran, then the newest version.
        Version& old = *current;
        int& next = old.next_boundary[job];
        if (next != 0) FastForwardLocked(old, job, next, &out, &pair_start);
        next = 0;
        parked = WaitLocked(waiter_id, job, current, old_it->second.pair_of_group[0], &done, &pair_start,
                            /*hand_over=*/true, num_groups) ||
                 EnterLatestLocked(waiter_id, job, num_groups, &done, &out, &pair_start, &now_outcome);
      } else if (boundary == 0 && current != latest_) {
        parked = EnterLatestLocked(waiter_id, job, num_groups, &done, &out, &pair_start, &now_outcome);
      } else {
        parked = BoundaryInVersionLocked(waiter_id, job, boundary, num_groups, current, &done, &out,
                                         &pair_start, &now_outcome);
      }
      RunHandOversLocked(&out, &pair_start);
    }
  }
  if (parked) cv_.notify_all();  // a new deadline for the notifier
  Deliver(std::move(out), pair_start);
  if (!parked) done(now_outcome);
}

bool NodeGroupPipeline::EnterLatestLocked(uint64_t waiter_id, JobKey job, int num_groups, DoneFn* done,
                                          std::vector<Release>* out, bool* pair_start, Outcome* outcome) {
  // Leave every older version still in use, not only the one this job ran
  // under: a version installed while it was between them names it too, and
  // other jobs there would wait for it forever.
  RemoveJobFromVersionsLocked(job, /*keep=*/latest_.get(), out, pair_start);
  job_version_[job] = latest_;
  return BoundaryInVersionLocked(waiter_id, job, 0, num_groups, latest_, done, out, pair_start, outcome);
}

bool NodeGroupPipeline::BoundaryInVersionLocked(uint64_t waiter_id, JobKey job, int boundary, int num_groups,
                                                const std::shared_ptr<Version>& current, DoneFn* done,
                                                std::vector<Release>* out, bool* pair_start,
                                                Outcome* outcome) {
  Version* v = current.get();
  auto js_it = v == nullptr ? decltype(v->jobs.end()){} : v->jobs.find(job);
  if (v == nullptr || js_it == v->jobs.end()) {
    counters_.passthrough += 1;  // not paced: alone, probing, or left
    return false;
  }
  if (static_cast<int>(js_it->second.pair_of_group.size()) != num_groups || boundary < 0 ||
      boundary > num_groups) {
    *outcome = {Code::kInvalidArgument,
                "nodegroup barrier: job '" + js_it->second.name + "' (stream " + std::to_string(job) +
                    ") reached boundary " + std::to_string(boundary) + " of a step cut into " +
                    std::to_string(num_groups) + " node groups, but schedule version " +
                    std::to_string(v->number) + " has " +
                    std::to_string(js_it->second.pair_of_group.size()) +
                    " groups for it; the schedule was made for another partition"};
    return false;
  }
  const std::vector<int>& pairs = js_it->second.pair_of_group;
  int& next = v->next_boundary[job];
  if (boundary == 0 && next != 0) FastForwardLocked(*v, job, next, out, pair_start);
  next = boundary == num_groups ? 0 : boundary + 1;
  if (boundary > 0) {
    const int k = (pairs[boundary - 1] + 1) % v->num_pairs;
    v->barriers[k].arrived[job] += 1;  // the seed's prev_count decrement
    ReleaseReadyLocked(*v, k, out, pair_start, false);
  }
  return boundary < num_groups &&
         WaitLocked(waiter_id, job, current, pairs[boundary], done, pair_start, /*hand_over=*/false, num_groups);
}

bool NodeGroupPipeline::WaitLocked(uint64_t waiter_id, JobKey job, const std::shared_ptr<Version>& version,
                                   int k, DoneFn* done, bool* pair_start, bool hand_over, int num_groups) {
  const int64_t generation = version->barriers[k].passed[job]++;  // the seed's succ_count decrement
  if (ReadyLocked(*version, k, generation)) {
    if (OpenLocked(*version, k, generation)) *pair_start = true;
    return false;
  }
  Waiter w;
  w.job = job;
  w.version = version;
  w.barrier = k;
  w.generation = generation;
  w.parked_at = std::chrono::steady_clock::now();
  w.has_deadline = timeout_s_ > 0;
  if (w.has_deadline) {
    w.deadline = w.parked_at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(timeout_s_));
  }
  w.hand_over = hand_over;
  w.num_groups = num_groups;
  w.done = std::move(*done);
  waiters_.emplace(waiter_id, std::move(w));
  version->barriers[k].waiting.push_back(waiter_id);
  counters_.waits += 1;
  return true;
}

void NodeGroupPipeline::RunHandOversLocked(std::vector<Release>* out, bool* pair_start) {
  while (!hand_overs_.empty()) {
    HandOver h = std::move(hand_overs_.back());
    hand_overs_.pop_back();
    Outcome outcome;
    if (!EnterLatestLocked(h.waiter_id, h.job, h.num_groups, &h.done, out, pair_start, &outcome)) {
      out->push_back({std::move(h.done), outcome});
    }
  }
}

void NodeGroupPipeline::Cancel(uint64_t waiter_id) {
  std::vector<Release> out;
  {
    MutexLock lock(mu_);
    auto it = waiters_.find(waiter_id);
    if (it == waiters_.end()) {
      // Not parked: already released (nothing to do), or Boundary has not
      // run yet (it will see the cancellation).
      if (issued_.count(waiter_id) > 0) cancelled_early_.insert(waiter_id);
      return;
    }
    Waiter& w = it->second;
    auto& ids = w.version->barriers[w.barrier].waiting;
    ids.erase(std::remove(ids.begin(), ids.end(), waiter_id), ids.end());
    counters_.cancellations += 1;
    out.push_back({std::move(w.done),
                   {Code::kCancelled, "nodegroup barrier: job '" + JobLabelLocked(*w.version, w.job) +
                                          "' step was cancelled while waiting at CounterBarrier " +
                                          std::to_string(w.barrier)}});
    waiters_.erase(it);
  }
  Deliver(std::move(out), false);
}

std::string NodeGroupPipeline::JobLabelLocked(const Version& v, JobKey job) const {
  auto it = job_names_.find(job);
  const std::string name = it == job_names_.end() ? "?" : it->second;
  return name + "' (stream " + std::to_string(job) + ")";
}

std::string NodeGroupPipeline::TimeoutMessageLocked(const Waiter& w, double waited_s) const {
  const Version& v = *w.version;
  const Barrier& b = v.barriers[w.barrier];
  const int64_t need = w.barrier == 0 ? w.generation : w.generation + 1;
  std::string missing;
  for (JobKey j : b.prev) {
    auto it = b.arrived.find(j);
    if ((it == b.arrived.end() ? 0 : it->second) < need) {
      missing += (missing.empty() ? "'" : ", '") + JobLabelLocked(v, j);
    }
  }
  const int prev_pair = (w.barrier + v.num_pairs - 1) % std::max(1, v.num_pairs);
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f", waited_s);
  return "nodegroup pipeline: job '" + JobLabelLocked(v, w.job) + " waited " + secs +
         " s at CounterBarrier " + std::to_string(w.barrier) + " (before node group pair " +
         std::to_string(w.barrier) + ", schedule version " + std::to_string(v.number) +
         ", generation " + std::to_string(w.generation) + ") for job(s) " +
         (missing.empty() ? std::string("<none>") : missing) +
         " to finish their node groups of pair " + std::to_string(prev_pair) +
         ". A job may be stuck, or ended without leaving the pipeline; if steps are "
         "this slow, raise run.barrier_timeout_s";
}

void NodeGroupPipeline::Deliver(std::vector<Release> releases, bool pair_start) {
  // The pair-start hook first: the released groups must see synced chunks.
  if (pair_start && on_pair_start_) on_pair_start_();
  if (releases.empty()) return;
  {
    MutexLock lock(mu_);
    for (Release& r : releases) ready_.push_back(std::move(r));
  }
  cv_.notify_all();
}

void NodeGroupPipeline::NotifierLoop() {
  MutexLock lock(mu_);
  while (true) {
    auto earliest = std::chrono::steady_clock::time_point::max();
    for (const auto& [id, w] : waiters_) {
      if (w.has_deadline) earliest = std::min(earliest, w.deadline);
    }
    if (ready_.empty() && !stopping_) {
      if (earliest == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock.native());
      } else {
        cv_.wait_until(lock.native(), earliest);
      }
    }
    if (stopping_ && ready_.empty()) return;
    std::vector<Release> run(std::make_move_iterator(ready_.begin()),
                             std::make_move_iterator(ready_.end()));
    ready_.clear();
    const auto now = std::chrono::steady_clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      Waiter& w = it->second;
      if (w.has_deadline && w.deadline <= now) {
        const double waited = std::chrono::duration<double>(now - w.parked_at).count();
        auto& ids = w.version->barriers[w.barrier].waiting;
        ids.erase(std::remove(ids.begin(), ids.end(), it->first), ids.end());
        counters_.timeouts += 1;
        counters_.wait_seconds += waited;
        run.push_back({std::move(w.done),
                       {Code::kDeadlineExceeded, TimeoutMessageLocked(w, waited)}});
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (run.empty()) continue;
    lock.Unlock();
    for (Release& r : run) r.done(r.outcome);
    lock.Lock();
  }
}

PipelineStats NodeGroupPipeline::Stats() const {
  MutexLock lock(mu_);
  PipelineStats s = counters_;
  s.version = latest_->number;
  s.num_pairs = latest_->num_pairs;
  s.waiting_now = static_cast<int>(waiters_.size());
  s.timeout_seconds = timeout_s_;
  for (const auto& [job, js] : latest_->jobs) s.jobs.push_back(job);
  for (int k = 0; k < latest_->num_pairs; ++k) {
    const Barrier& b = latest_->barriers[k];
    BarrierStats bs;
    bs.index = k;
    int64_t gen = std::numeric_limits<int64_t>::max();
    for (JobKey j : b.succ) {
      auto it = b.passed.find(j);
      gen = std::min<int64_t>(gen, it == b.passed.end() ? 0 : it->second);
    }
    if (b.succ.empty()) gen = 0;
    bs.generation = gen;
    const int64_t need = k == 0 ? gen : gen + 1;
    for (JobKey j : b.prev) {
      auto it = b.arrived.find(j);
      if ((it == b.arrived.end() ? 0 : it->second) < need) bs.prev_count += 1;
      bs.prev_jobs.push_back(j);
    }
    for (JobKey j : b.succ) {
      auto it = b.passed.find(j);
      if ((it == b.passed.end() ? 0 : it->second) <= gen) bs.succ_count += 1;
      bs.succ_jobs.push_back(j);
    }
    bs.opened = b.opened;
    bs.waiting = static_cast<int>(b.waiting.size());
    s.barriers.push_back(std::move(bs));
  }
  return s;
}

NodeGroupPipeline& DevicePipeline() {
  // Never destroyed: TensorFlow may run barrier ops during process exit.
  static NodeGroupPipeline* pipeline = new NodeGroupPipeline([] {
    if (StreamAwarePool* pool = DevicePoolIfCreated()) pool->SyncAndCoalesce();
  });
  return *pipeline;
}

}  // namespace nodegroup
}  // namespace tensile
