// Replays a recorded sequence of allocate/free calls against several
// allocators and reports nanoseconds per allocate/free pair. Built and run by
// benchmarks/alloc_pair_bench.py (see there for how the sequence is recorded
// from a real model); no Python runs while this program times anything.
//
// Allocators compared (all single-threaded, same sequence, same sizes):
//   tensile_pool          tensile::StreamAwarePool reached the way the TF
//                         adapter reaches it (tf_pool_allocator.cc): read the
//                         thread's ScopedMemoryDebugAnnotation, map its step
//                         id to a stream, Allocate/Deallocate with the op
//                         name; event trace on (as in production).
//   tensile_pool_notrace  the same pool with its event trace disabled.
//   tensile_pool_core     pool.Allocate/Deallocate called directly, no op
//                         name, trace off: the data structure alone.
//   bfc                   tsl::BFCAllocator over tensorflow::BasicCPUAllocator,
//                         allow_growth, 64 GiB limit: exactly what
//                         TF_CPU_ALLOCATOR_USE_BFC=1 builds (process_state.cc).
//   tf_default            tsl::cpu_allocator(): the allocator TensorFlow's CPU
//                         device uses when no plugin is loaded (with oneDNN on
//                         this is MklCPUAllocator: aligned malloc below 256 KiB,
//                         a BFC above). Its Name() is printed.
//   aligned_malloc        tsl::port::AlignedMalloc / AlignedFree (alignment 64).
//   noop                  no allocator: the harness's own cost per pair (loop,
//                         annotations), to subtract from the others.
//
// Every call (for every allocator) runs inside a
// tsl::profiler::ScopedMemoryDebugAnnotation holding the recorded op name, as
// TensorFlow's executor does around each kernel, so allocators that read it
// (BFC, the pool adapter) see what they would see in TensorFlow. A new
// annotation is made only when the op name changes (once per kernel, roughly).
//
// Input (text, written by alloc_pair_bench.py):
//   tensile-replay 1
//   names <n>            then n lines: op names ("-" = empty)
//   persistent <n>       then n lines: <bytes> <stream>
//   timed <n> <slots>    then n lines: A <slot> <bytes> <stream> <name>
//                                   or F <slot> <name>
// Persistent chunks are allocated once, untimed, and stay live (variables and
// other tensors that outlive the recorded window). The timed list holds every
// allocation once and its matching free, so each pass leaves the allocator as
// it found it and can be repeated.
//
// Output: one JSON object per line on stdout: {"allocator", "name",
// "ns_per_pair": [thread CPU ns per pair, one value per sample],
// "wall_ns_per_pair": [the same in wall-clock ns], "pairs_per_pass",
// "passes_per_sample"}. CPU time is the headline: on a shared machine wall
// time also counts the time this thread waited for a core.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tensorflow/core/common_runtime/pool_allocator.h"  // BasicCPUAllocator
#include "tf_plugin/allocator/device_pool.h"
#include "tf_plugin/allocator/stream_aware_pool.h"
#include "tsl/platform/mem.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"
#include "xla/tsl/framework/allocator.h"
#include "xla/tsl/framework/bfc_allocator.h"

namespace {

constexpr size_t kAlignment = 64;  // tsl::Allocator::kAllocatorAlignment
constexpr int64_t kStepId = -7;    // any; unbound, so the default stream

struct Op {
  bool alloc;
  int32_t slot;
  int32_t stream;
  int32_t name;
  size_t bytes;
};

struct Replay {
  std::vector<std::string> names;
  std::vector<std::pair<size_t, int32_t>> persistent;
  std::vector<Op> timed;
  int32_t slots = 0;
  int32_t max_stream = 0;
  size_t pairs() const { return static_cast<size_t>(slots); }
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "alloc_replay: %s\n", msg.c_str());
  std::exit(2);
}

Replay Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die("cannot open " + path);
  Replay r;
  std::string word;
  int version = 0;
  in >> word >> version;
  if (word != "tensile-replay" || version != 1) Die(path + ": bad header");
  size_t n = 0;
  in >> word >> n;
  if (word != "names") Die("expected 'names'");
  r.names.resize(n);
  for (auto& s : r.names) {
    in >> s;
    if (s == "-") s.clear();
  }
  in >> word >> n;
  if (word != "persistent") Die("expected 'persistent'");
  r.persistent.resize(n);
  for (auto& p : r.persistent) {
    in >> p.first >> p.second;
    r.max_stream = std::max(r.max_stream, p.second);
  }
  in >> word >> n >> r.slots;
  if (word != "timed") Die("expected 'timed'");
  r.timed.resize(n);
  for (Op& op : r.timed) {
    char k;
    in >> k;
    op.alloc = (k == 'A');
    if (op.alloc) {
      in >> op.slot >> op.bytes >> op.stream >> op.name;
      r.max_stream = std::max(r.max_stream, op.stream);
    } else {
      in >> op.slot >> op.name;
      op.bytes = 0;
      op.stream = 0;
    }
    if (!in) Die("truncated timed list");
    if (op.slot < 0 || op.slot >= r.slots) Die("slot out of range");
    if (op.name < 0 || op.name >= static_cast<int32_t>(r.names.size())) {
      Die("name index out of range");
    }
  }
  return r;
}

// One allocator under test. Alloc/Free are called inside the annotation.
class Subject {
 public:
  virtual ~Subject() = default;
  virtual std::string Key() const = 0;
  virtual std::string Name() = 0;
  virtual void* Alloc(size_t bytes, int32_t stream, std::string_view op) = 0;
  virtual void Free(void* p, std::string_view op) = 0;
};

// The pool, entered as tf_pool_allocator.cc's TensilePoolAllocator does.
class PoolAdapterSubject : public Subject {
 public:
  PoolAdapterSubject(std::string key, bool trace, int32_t max_stream)
      : key_(std::move(key)),
        pool_("bench", tensile::kDefaultDevicePoolBytes,
              std::make_unique<tensile::HostBackend>()) {
    pool_.SetTraceEnabled(trace);
    for (int32_t s = 1; s <= max_stream; ++s) {
      pool_.RegisterStream("stream-" + std::to_string(s));
    }
  }
  std::string Key() const override { return key_; }
  std::string Name() override { return "tensile::StreamAwarePool"; }
  void* Alloc(size_t bytes, int32_t stream, std::string_view) override {
    const auto& annotation =
        tsl::profiler::ScopedMemoryDebugAnnotation::CurrentAnnotation();
    tensile::StreamId s = tensile::StreamForStep(annotation.pending_step_id);
    if (s == tensile::kDefaultStream) s = stream;  // recorded attribution
    return pool_.Allocate(bytes, s, annotation.pending_op_name);
  }
  void Free(void* p, std::string_view) override {
    const auto& annotation =
        tsl::profiler::ScopedMemoryDebugAnnotation::CurrentAnnotation();
    pool_.Deallocate(p, annotation.pending_op_name);
  }
  tensile::StreamAwarePool& pool() { return pool_; }

 private:
  std::string key_;
  tensile::StreamAwarePool pool_;
};

// The pool's data structure alone.
class PoolCoreSubject : public Subject {
 public:
  explicit PoolCoreSubject(int32_t max_stream)
      : pool_("bench-core", tensile::kDefaultDevicePoolBytes,
              std::make_unique<tensile::HostBackend>()) {
    pool_.SetTraceEnabled(false);
    for (int32_t s = 1; s <= max_stream; ++s) {
      pool_.RegisterStream("stream-" + std::to_string(s));
    }
  }
  std::string Key() const override { return "tensile_pool_core"; }
  std::string Name() override { return "tensile::StreamAwarePool (core)"; }
  void* Alloc(size_t bytes, int32_t stream, std::string_view) override {
    return pool_.Allocate(bytes, stream);
  }
  void Free(void* p, std::string_view) override { pool_.Deallocate(p); }

 private:
  tensile::StreamAwarePool pool_;
};

class TslAllocatorSubject : public Subject {
 public:
  TslAllocatorSubject(std::string key, tsl::Allocator* a, bool owned)
      : key_(std::move(key)), a_(a), owned_(owned) {}
  ~TslAllocatorSubject() override {
    if (owned_) delete a_;
  }
  std::string Key() const override { return key_; }
  std::string Name() override { return a_->Name(); }
  void* Alloc(size_t bytes, int32_t, std::string_view) override {
    return a_->AllocateRaw(kAlignment, bytes);
  }
  void Free(void* p, std::string_view) override { a_->DeallocateRaw(p); }

 private:
  std::string key_;
  tsl::Allocator* a_;
  bool owned_;
};

class AlignedMallocSubject : public Subject {
 public:
  std::string Key() const override { return "aligned_malloc"; }
  std::string Name() override { return "tsl::port::AlignedMalloc"; }
  void* Alloc(size_t bytes, int32_t, std::string_view) override {
    return tsl::port::AlignedMalloc(bytes,
                                    static_cast<std::align_val_t>(kAlignment));
  }
  void Free(void* p, std::string_view) override { tsl::port::AlignedFree(p); }
};

// Harness cost: the replay loop and annotations with no allocator work.
class NoopSubject : public Subject {
 public:
  std::string Key() const override { return "noop"; }
  std::string Name() override { return "none (harness baseline)"; }
  void* Alloc(size_t, int32_t, std::string_view) override {
    return reinterpret_cast<void*>(&byte_);
  }
  void Free(void* p, std::string_view) override { sink_ = p; }

 private:
  char byte_ = 0;
  void* volatile sink_ = nullptr;
};

std::unique_ptr<Subject> MakeSubject(const std::string& key,
                                     const Replay& r) {
  if (key == "tensile_pool") {
    return std::make_unique<PoolAdapterSubject>(key, true, r.max_stream);
  }
  if (key == "tensile_pool_notrace") {
    return std::make_unique<PoolAdapterSubject>(key, false, r.max_stream);
  }
  if (key == "tensile_pool_core") {
    return std::make_unique<PoolCoreSubject>(r.max_stream);
  }
  if (key == "bfc") {
    // process_state.cc, TF_CPU_ALLOCATOR_USE_BFC branch.
    tsl::BFCAllocator::Options opts;
    opts.allow_growth = true;
    auto* sub = new tensorflow::BasicCPUAllocator(tsl::port::kNUMANoAffinity,
                                                  {}, {});
    auto* bfc = new tsl::BFCAllocator(std::unique_ptr<tsl::SubAllocator>(sub),
                                      size_t{1} << 36,
                                      "bfc_cpu_allocator_for_gpu", opts);
    return std::make_unique<TslAllocatorSubject>(key, bfc, /*owned=*/true);
  }
  if (key == "tf_default") {
    return std::make_unique<TslAllocatorSubject>(key, tsl::cpu_allocator(),
                                                 /*owned=*/false);
  }
  if (key == "aligned_malloc") return std::make_unique<AlignedMallocSubject>();
  if (key == "noop") return std::make_unique<NoopSubject>();
  Die("unknown allocator '" + key + "'");
}

// One pass over the timed list; returns false on an allocation failure.
// The annotation is replaced only when the recorded op name changes: TF's
// executor sets it once per kernel, and a kernel makes one or more calls.
bool Pass(Subject& s, const Replay& r, std::vector<void*>& ptrs) {
  std::optional<tsl::profiler::ScopedMemoryDebugAnnotation> annotation;
  int32_t current = -1;
  for (const Op& op : r.timed) {
    const std::string& name = r.names[op.name];
    if (op.name != current) {
      annotation.reset();
      annotation.emplace(name.c_str(), kStepId);
      current = op.name;
    }
    if (op.alloc) {
      void* p = s.Alloc(op.bytes, op.stream, name);
      if (p == nullptr) return false;
      ptrs[op.slot] = p;
    } else {
      s.Free(ptrs[op.slot], name);
    }
  }
  return true;
}

struct Args {
  std::string replay;
  std::vector<std::string> allocators;
  int samples = 15;
  int warmup_passes = 3;
  double min_sample_ms = 100.0;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + k);
      return argv[++i];
    };
    if (k == "--samples") {
      a.samples = std::stoi(next());
    } else if (k == "--warmup-passes") {
      a.warmup_passes = std::stoi(next());
    } else if (k == "--min-sample-ms") {
      a.min_sample_ms = std::stod(next());
    } else if (k == "--allocators") {
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) a.allocators.push_back(item);
    } else if (a.replay.empty()) {
      a.replay = k;
    } else {
      Die("unexpected argument " + k);
    }
  }
  if (a.replay.empty()) Die("usage: alloc_replay REPLAY [--samples N] ...");
  if (a.allocators.empty()) {
    a.allocators = {"tensile_pool", "tensile_pool_notrace", "tensile_pool_core",
                    "bfc", "tf_default", "aligned_malloc", "noop"};
  }
  return a;
}

double NowNs() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// CPU time of this thread: time the thread spent descheduled (this machine
// is shared) does not count.
double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  const Replay r = Load(args.replay);

  struct Run {
    std::unique_ptr<Subject> subject;
    std::vector<void*> persistent;
    std::vector<void*> ptrs;
    int passes_per_sample = 1;
    std::vector<double> ns_per_pair;       // thread CPU time
    std::vector<double> wall_ns_per_pair;  // wall clock
  };
  std::vector<Run> runs;
  for (const std::string& key : args.allocators) {
    Run run;
    run.subject = MakeSubject(key, r);
    // Long-lived tensors first (untimed), as when the window was recorded.
    for (const auto& [bytes, stream] : r.persistent) {
      void* p = run.subject->Alloc(bytes, stream, "persistent");
      if (p == nullptr) Die(key + ": persistent allocation failed");
      run.persistent.push_back(p);
    }
    run.ptrs.assign(r.slots, nullptr);
    // Warm up: regions grown, caches and free lists in steady state; then
    // choose passes per sample so that one sample lasts min_sample_ms.
    double t0 = NowNs();
    for (int i = 0; i < args.warmup_passes; ++i) {
      if (!Pass(*run.subject, r, run.ptrs)) Die(key + ": allocation failed");
    }
    const double per_pass_ns =
        (NowNs() - t0) / std::max(1, args.warmup_passes);
    run.passes_per_sample = std::max(
        1, static_cast<int>(args.min_sample_ms * 1e6 / std::max(per_pass_ns, 1.0)));
    runs.push_back(std::move(run));
  }

  // Samples interleaved across allocators, so drift on a busy machine hits
  // all of them alike.
  for (int sample = 0; sample < args.samples; ++sample) {
    for (Run& run : runs) {
      const double w0 = NowNs();
      const double c0 = ThreadCpuNs();
      for (int i = 0; i < run.passes_per_sample; ++i) {
        if (!Pass(*run.subject, r, run.ptrs)) {
          Die(run.subject->Key() + ": allocation failed");
        }
      }
      const double cpu = ThreadCpuNs() - c0;
      const double wall = NowNs() - w0;
      const double pairs =
          static_cast<double>(run.passes_per_sample) * r.pairs();
      run.ns_per_pair.push_back(cpu / pairs);
      run.wall_ns_per_pair.push_back(wall / pairs);
    }
  }

  for (Run& run : runs) {
    std::ostringstream out;
    out << "{\"allocator\": \"" << run.subject->Key() << "\", \"name\": \""
        << run.subject->Name() << "\", \"pairs_per_pass\": " << r.pairs()
        << ", \"passes_per_sample\": " << run.passes_per_sample
        << ", \"ns_per_pair\": [";
    for (size_t i = 0; i < run.ns_per_pair.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.2f", i ? ", " : "",
                    run.ns_per_pair[i]);
      out << buf;
    }
    out << "], \"wall_ns_per_pair\": [";
    for (size_t i = 0; i < run.wall_ns_per_pair.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.2f", i ? ", " : "",
                    run.wall_ns_per_pair[i]);
      out << buf;
    }
    out << "]";
    if (auto* pool = dynamic_cast<PoolAdapterSubject*>(run.subject.get())) {
      const tensile::PoolStats s = pool->pool().Stats();
      out << ", \"pool_syncs\": " << s.num_syncs
          << ", \"pool_allocator_syncs\": " << s.num_allocator_syncs
          << ", \"pool_free_chunks\": " << s.num_free_chunks
          << ", \"pool_peak\": " << s.counters.peak;
    }
    out << "}";
    std::cout << out.str() << std::endl;
    for (void* p : run.persistent) run.subject->Free(p, "persistent");
  }
  return 0;
}
