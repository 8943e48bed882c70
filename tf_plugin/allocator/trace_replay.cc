#include "tf_plugin/allocator/trace_replay.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tf_plugin/allocator/stream_aware_pool.h"

namespace tensile {
namespace {

size_t RoundUp(size_t bytes) {
  const size_t c = StreamAwarePool::kMinChunkBytes;
  return std::max<size_t>(1, (bytes + c - 1) / c) * c;
}

// One operation of the interleaved schedule: job j's op i.
struct Step {
  int32_t job;
  const Trace::Op* op;
};

std::vector<Step> Interleave(const std::vector<Trace>& jobs) {
  std::vector<Step> out;
  size_t longest = 0;
  for (const Trace& t : jobs) longest = std::max(longest, t.timed.size());
  for (size_t i = 0; i < longest; ++i) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (i < jobs[j].timed.size()) {
        out.push_back(Step{static_cast<int32_t>(j), &jobs[j].timed[i]});
      }
    }
  }
  return out;
}

std::vector<int32_t> SlotBase(const std::vector<Trace>& jobs) {
  std::vector<int32_t> base;
  int32_t total = 0;
  for (const Trace& t : jobs) {
    base.push_back(total);
    total += t.slots;
  }
  base.push_back(total);
  return base;
}

double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

double WallNs() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n') ? ' ' : c;
  }
  return out;
}

}  // namespace

int64_t Trace::LiveBytesPeak() const {
  int64_t live = 0;
  for (size_t b : persistent) live += static_cast<int64_t>(RoundUp(b));
  std::vector<size_t> size(static_cast<size_t>(slots), 0);
  int64_t peak = live;
  for (const Op& op : timed) {
    if (op.alloc) {
      size[op.slot] = RoundUp(op.bytes);
      live += static_cast<int64_t>(size[op.slot]);
      peak = std::max(peak, live);
    } else {
      live -= static_cast<int64_t>(size[op.slot]);
    }
  }
  return peak;
}

Trace LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open trace " + path);
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(path + ": " + what +
                             " (expected the tensile-replay 1 format of "
                             "benchmarks/alloc_replay.cc)");
  };
  Trace t;
  t.name = path.substr(path.find_last_of('/') + 1);
  std::string word;
  int version = 0;
  size_t n = 0;
  in >> word >> version;
  if (word != "tensile-replay" || version != 1) fail("bad header");
  in >> word >> n;
  if (word != "names") fail("expected 'names'");
  for (size_t i = 0; i < n; ++i) in >> word;  // op names: unused here
  in >> word >> n;
  if (word != "persistent") fail("expected 'persistent'");
  t.persistent.resize(n);
  for (size_t& b : t.persistent) {
    int32_t stream;
    in >> b >> stream;
  }
  in >> word >> n >> t.slots;
  if (word != "timed" || !in) fail("expected 'timed'");
  t.timed.resize(n);
  std::vector<int8_t> state(static_cast<size_t>(std::max(t.slots, 0)), 0);
  for (Trace::Op& op : t.timed) {
    char k = 0;
    int32_t stream, name;
    in >> k >> op.slot;
    op.alloc = (k == 'A');
    if (op.alloc) {
      in >> op.bytes >> stream >> name;
    } else {
      in >> name;
    }
    if (!in) fail("truncated timed list");
    if (op.slot < 0 || op.slot >= t.slots) fail("slot out of range");
    // Each slot: allocated once, then freed once.
    int8_t& s = state[op.slot];
    if ((op.alloc && s != 0) || (!op.alloc && s != 1)) {
      fail("slot " + std::to_string(op.slot) + " not allocated then freed once");
    }
    s += 1;
  }
  return t;
}

RaceResult ReplayOnStreams(const std::vector<Trace>& jobs,
                           std::unique_ptr<PoolBackend> backend,
                           StreamKernels* kernels, const RaceOptions& o) {
  RaceResult r;
  r.backend = backend->Name();
  r.jobs = static_cast<int64_t>(jobs.size());
  const double t0 = WallNs();
  StreamAwarePool pool("replay", o.capacity, std::move(backend), 1 << 10,
                       o.stitch);
  pool.SetTraceEnabled(false);
  pool.SetStreamRuleForTesting(o.stream_rule);
  pool.SetSyncWaitsForTesting(o.sync_waits);
  std::vector<StreamId> stream;
  for (const Trace& t : jobs) stream.push_back(pool.RegisterStream(t.name));

  // Note [What the race replay checks]: per granule, the stream that freed
  // it last (-1: never freed) and the pool's sync count at that free.
  const size_t granules = pool.capacity() / kPatternGranule;
  std::vector<int32_t> freed_by(granules, -1);
  std::vector<int64_t> freed_at_sync(granules, 0);
  uint64_t next_pattern = 1;
  struct Live {
    void* ptr = nullptr;
    size_t bytes = 0;
    uint64_t pattern = 0;
  };
  const std::vector<int32_t> base = SlotBase(jobs);
  std::vector<Live> live(static_cast<size_t>(base.back()));

  auto allocate = [&](int32_t job, size_t bytes, Live* out) -> bool {
    const StreamId s = stream[job];
    void* p = pool.Allocate(bytes, s);
    if (p == nullptr) {
      r.oom = true;
      r.oom_message = pool.DescribeOom(bytes, s, "replay");
      return false;
    }
    const int64_t off = pool.OffsetOf(p);
    if (off + static_cast<int64_t>(RoundUp(bytes)) <= static_cast<int64_t>(pool.capacity())) {
      r.high_water = std::max<int64_t>(r.high_water, off + RoundUp(bytes));
      const int64_t syncs = pool.SyncCount();
      bool cross = false, early = false;
      for (size_t g = off / kPatternGranule; g * kPatternGranule < off + bytes; ++g) {
        if (freed_by[g] >= 0 && freed_by[g] != s) {
          cross = true;
          if (syncs <= freed_at_sync[g]) early = true;
        }
      }
      r.cross_stream_reuses += cross;
      r.reuses_before_sync += early;
    }
    *out = Live{p, bytes, next_pattern++ * 0x9E3779B97F4A7C15ull};
    if (kernels) kernels->EnqueueFill(s, p, bytes, out->pattern);
    return true;
  };
  auto release = [&](int32_t job, Live* l) {
    const StreamId s = stream[job];
    if (kernels) kernels->EnqueueVerify(s, l->ptr, l->bytes, l->pattern);
    const int64_t off = pool.OffsetOf(l->ptr);
    if (off < static_cast<int64_t>(pool.capacity())) {
      const int64_t syncs = pool.SyncCount();
      for (size_t g = off / kPatternGranule; g * kPatternGranule < off + l->bytes; ++g) {
        freed_by[g] = s;
        freed_at_sync[g] = syncs;
      }
    }
    pool.Deallocate(l->ptr);
    *l = Live{};
  };

  std::vector<std::vector<Live>> persistent(jobs.size());
  for (size_t j = 0; j < jobs.size() && !r.oom; ++j) {
    for (size_t b : jobs[j].persistent) {
      persistent[j].emplace_back();
      if (!allocate(static_cast<int32_t>(j), b, &persistent[j].back())) break;
      if (kernels) kernels->Tick();
    }
  }
  const std::vector<Step> schedule = Interleave(jobs);
  for (int pass = 0; pass < o.passes && !r.oom; ++pass) {
    for (const Step& step : schedule) {
      Live& l = live[base[step.job] + step.op->slot];
      if (step.op->alloc) {
        if (!allocate(step.job, step.op->bytes, &l)) break;
        ++r.pairs;
      } else {
        release(step.job, &l);
      }
      if (kernels) kernels->Tick();
    }
  }
  // Free what is still live (an OOM stops a pass midway), then drain.
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int32_t i = base[j]; i < base[j + 1]; ++i) {
      if (live[i].ptr != nullptr) release(static_cast<int32_t>(j), &live[i]);
    }
    for (Live& l : persistent[j]) {
      if (l.ptr != nullptr) release(static_cast<int32_t>(j), &l);
    }
  }
  r.corrupted_buffers = kernels ? kernels->DrainAndCountCorruptions() : -1;
  const PoolStats st = pool.Stats();
  r.syncs = st.num_syncs;
  r.allocator_syncs = st.num_allocator_syncs;
  r.stream_waits = st.num_stream_waits;
  r.peak_bytes = st.counters.peak;
  r.invariant_error = pool.CheckInvariants();
  r.wall_seconds = (WallNs() - t0) / 1e9;
  return r;
}

int64_t SmallestArena(const std::vector<Trace>& jobs, int64_t step,
                      bool stitch) {
  return SmallestArena(jobs, step, stitch,
                       [stitch] { return std::make_unique<HostBackend>(stitch); });
}

int64_t SmallestArena(
    const std::vector<Trace>& jobs, int64_t step, bool stitch,
    const std::function<std::unique_ptr<PoolBackend>()>& make_backend) {
  auto fits = [&](int64_t capacity) {
    RaceOptions o;
    o.capacity = static_cast<size_t>(capacity);
    o.passes = 2;
    o.stitch = stitch;
    return !ReplayOnStreams(jobs, make_backend(), nullptr, o).oom;
  };
  int64_t live_sum = 0;
  for (const Trace& t : jobs) live_sum += t.LiveBytesPeak();
  // No arena below the busiest live set of all jobs together can serve
  // them; start the search from the largest single job's need.
  int64_t lo = step, hi = std::max<int64_t>(live_sum, step);
  while (!fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  // fits(hi); search (lo, hi] on multiples of step.
  lo = lo / step * step;
  while (hi - lo > step) {
    const int64_t mid = (lo + (hi - lo) / 2) / step * step;
    if (mid <= lo || mid >= hi) break;
    (fits(mid) ? hi : lo) = mid;
  }
  return hi;
}

namespace {

class PoolReplayAllocator : public ReplayAllocator {
 public:
  PoolReplayAllocator(std::unique_ptr<PoolBackend> backend, size_t capacity,
                      int32_t streams, std::string name)
      : name_(std::move(name)), pool_("pair-replay", capacity, std::move(backend)) {
    pool_.SetTraceEnabled(false);
    for (int32_t s = 1; s <= streams; ++s) {
      pool_.RegisterStream("stream-" + std::to_string(s));
    }
  }
  std::string Name() const override { return name_; }
  void* Alloc(size_t bytes, StreamId stream) override {
    return pool_.Allocate(bytes, stream);
  }
  void Free(void* ptr, StreamId) override { pool_.Deallocate(ptr); }
  int64_t FootprintPeak() override { return pool_.Stats().counters.peak; }

 private:
  std::string name_;
  StreamAwarePool pool_;
};

}  // namespace

std::unique_ptr<ReplayAllocator> MakePoolReplayAllocator(
    std::unique_ptr<PoolBackend> backend, size_t capacity, int32_t streams,
    const std::string& name) {
  return std::make_unique<PoolReplayAllocator>(std::move(backend), capacity,
                                               streams, name);
}

double PairTiming::MedianCpuNs() const {
  if (cpu_ns_per_pair.empty()) return 0;
  std::vector<double> v = cpu_ns_per_pair;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

PairTiming TimePairs(const std::vector<Trace>& jobs, ReplayAllocator& a,
                     int samples, double min_sample_ms) {
  PairTiming t;
  t.allocator = a.Name();
  const std::vector<Step> schedule = Interleave(jobs);
  const std::vector<int32_t> base = SlotBase(jobs);
  std::vector<void*> ptr(static_cast<size_t>(base.back()), nullptr);
  for (const Trace& j : jobs) t.pairs_per_pass += j.slots;
  std::vector<std::pair<void*, StreamId>> persistent;
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t b : jobs[j].persistent) {
      void* p = a.Alloc(b, static_cast<StreamId>(j + 1));
      if (p == nullptr) throw std::runtime_error(a.Name() + ": persistent allocation failed");
      persistent.emplace_back(p, static_cast<StreamId>(j + 1));
    }
  }
  auto pass = [&] {
    for (const Step& s : schedule) {
      void*& p = ptr[base[s.job] + s.op->slot];
      const StreamId stream = static_cast<StreamId>(s.job + 1);
      if (s.op->alloc) {
        p = a.Alloc(s.op->bytes, stream);
        if (p == nullptr) throw std::runtime_error(a.Name() + ": allocation failed");
      } else {
        a.Free(p, stream);
      }
    }
  };
  const double w0 = WallNs();
  for (int i = 0; i < 3; ++i) pass();
  const double per_pass = (WallNs() - w0) / 3;
  t.passes_per_sample =
      std::max<int64_t>(1, static_cast<int64_t>(min_sample_ms * 1e6 / std::max(per_pass, 1.0)));
  for (int s = 0; s < samples; ++s) {
    const double c0 = ThreadCpuNs(), s0 = WallNs();
    for (int64_t i = 0; i < t.passes_per_sample; ++i) pass();
    const double pairs = static_cast<double>(t.passes_per_sample * t.pairs_per_pass);
    t.cpu_ns_per_pair.push_back((ThreadCpuNs() - c0) / pairs);
    t.wall_ns_per_pair.push_back((WallNs() - s0) / pairs);
  }
  t.footprint_peak = a.FootprintPeak();
  for (auto& [p, stream] : persistent) a.Free(p, stream);
  return t;
}

std::string ToJson(const RaceResult& r) {
  std::ostringstream o;
  o << "{\"kind\": \"race\", \"backend\": \"" << Escape(r.backend)
    << "\", \"jobs\": " << r.jobs << ", \"pairs\": " << r.pairs
    << ", \"corrupted_buffers\": " << r.corrupted_buffers
    << ", \"reuses_before_sync\": " << r.reuses_before_sync
    << ", \"cross_stream_reuses\": " << r.cross_stream_reuses
    << ", \"syncs\": " << r.syncs << ", \"allocator_syncs\": " << r.allocator_syncs
    << ", \"stream_waits\": " << r.stream_waits
    << ", \"peak_bytes\": " << r.peak_bytes << ", \"high_water\": " << r.high_water
    << ", \"oom\": " << (r.oom ? "true" : "false") << ", \"oom_message\": \""
    << Escape(r.oom_message) << "\", \"invariant_error\": \""
    << Escape(r.invariant_error) << "\", \"wall_seconds\": " << r.wall_seconds
    << "}";
  return o.str();
}

std::string ToJson(const PairTiming& t) {
  std::ostringstream o;
  o << "{\"kind\": \"pair_cost\", \"allocator\": \"" << Escape(t.allocator)
    << "\", \"pairs_per_pass\": " << t.pairs_per_pass
    << ", \"passes_per_sample\": " << t.passes_per_sample
    << ", \"median_cpu_ns_per_pair\": " << t.MedianCpuNs()
    << ", \"footprint_peak\": " << t.footprint_peak << ", \"cpu_ns_per_pair\": [";
  for (size_t i = 0; i < t.cpu_ns_per_pair.size(); ++i) {
    o << (i ? ", " : "") << t.cpu_ns_per_pair[i];
  }
  o << "], \"wall_ns_per_pair\": [";
  for (size_t i = 0; i < t.wall_ns_per_pair.size(); ++i) {
    o << (i ? ", " : "") << t.wall_ns_per_pair[i];
  }
  o << "]}";
  return o.str();
}

}  // namespace tensile
