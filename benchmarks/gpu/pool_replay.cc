// pool_replay: the StreamAwarePool's trace replay as a command, without
// TensorFlow (tf_plugin/allocator/trace_replay.h). benchmarks/gpu/check.sh
// builds it with CMake (the CUDA backend and the cudaMallocAsync / cudaMalloc
// baselines where CUDA is found: -DTENSILE_WITH_CUDA) and runs each mode.
//
//   pool_replay [options] TRACE...      trace i is job i, on stream i + 1
//
//   --mode race     the race test: replay with pattern kernels on every
//                   buffer, stream rule on and off (--rules), in an arena of
//                   --arena-factor x the smallest arena that serves the jobs
//   --mode arena    footprint: smallest arena for each job alone and for all
//                   together, and each job's live-bytes peak, with and
//                   without stitching: on the host backend at page and at
//                   --piece-bytes granularity (the CUDA arena's, 2 MiB: the
//                   device's placement, predicted), and with --backend cuda
//                   on the CUDA arena itself (Note [Stitching on a CUDA
//                   arena] in tf_plugin/allocator/cuda_backend.h)
//   --mode pairs    CPU ns per allocate/free pair (median of --samples):
//                   the pool on the host backend, on CUDA (event per free,
//                   event at sync), cudaMallocAsync and cudaMalloc
//   --backend B     race mode: async-host (lockstep), async-host-free, cuda
//   --rules on,off  --passes N  --lag-ticks N  --delay-us N  --spin-ns N
//   --samples N  --min-sample-ms X  --capacity BYTES (pairs mode arena)
//   --piece-bytes N (arena mode, host at a device's granularity; 2 MiB)
//
// Output: one JSON object per line (trace_replay.h ToJson, plus "mode",
// "traces", "device" and the mode's own fields); check.sh's summarize.py
// turns them into the table.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tf_plugin/allocator/async_host_backend.h"
#include "tf_plugin/allocator/trace_replay.h"
#ifdef TENSILE_WITH_CUDA
#include "benchmarks/gpu/cuda_baselines.h"
#include "tf_plugin/allocator/cuda_backend.h"
#endif

namespace {

struct Args {
  std::vector<std::string> traces;
  std::string mode = "race";
  std::string backend = "async-host";
  std::vector<std::string> rules = {"on", "off"};
  int passes = 2;
  int64_t lag_ticks = 512;
  int64_t delay_us = 20;
  int64_t spin_ns = 20000;
  double arena_factor = 1.0;
  int samples = 11;
  double min_sample_ms = 200;
  size_t capacity = size_t{4} << 30;
  size_t piece_bytes = size_t{2} << 20;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "pool_replay: %s\nsee the header of benchmarks/gpu/pool_replay.cc\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage("missing value after " + k);
      return argv[++i];
    };
    if (k == "--mode") a.mode = next();
    else if (k == "--backend") a.backend = next();
    else if (k == "--rules") a.rules = Split(next());
    else if (k == "--passes") a.passes = std::stoi(next());
    else if (k == "--lag-ticks") a.lag_ticks = std::stoll(next());
    else if (k == "--delay-us") a.delay_us = std::stoll(next());
    else if (k == "--spin-ns") a.spin_ns = std::stoll(next());
    else if (k == "--arena-factor") a.arena_factor = std::stod(next());
    else if (k == "--samples") a.samples = std::stoi(next());
    else if (k == "--min-sample-ms") a.min_sample_ms = std::stod(next());
    else if (k == "--capacity") a.capacity = std::stoull(next());
    else if (k == "--piece-bytes") a.piece_bytes = std::stoull(next());
    else if (k == "--help" || k == "-h") Usage("usage");
    else if (!k.empty() && k[0] == '-') Usage("unknown option " + k);
    else a.traces.push_back(k);
  }
  if (a.traces.empty()) Usage("no trace given");
  if (a.mode != "race" && a.mode != "arena" && a.mode != "pairs") {
    Usage("unknown --mode " + a.mode + " (race, arena, pairs)");
  }
  return a;
}

std::string TraceList(const std::vector<tensile::Trace>& jobs) {
  std::string s = "[";
  for (size_t i = 0; i < jobs.size(); ++i) {
    s += (i ? ", \"" : "\"") + jobs[i].name + "\"";
  }
  return s + "]";
}

// Appends `extra` (", \"k\": v, ...") inside a one-line JSON object.
std::string With(const std::string& json, const std::string& extra) {
  return json.substr(0, json.size() - 1) + extra + "}";
}

struct Made {
  std::unique_ptr<tensile::PoolBackend> backend;
  tensile::StreamKernels* kernels = nullptr;
  std::string device = "host";
};

Made MakeBackend(const Args& a) {
  Made m;
  if (a.backend == "async-host" || a.backend == "async-host-free") {
    tensile::AsyncHostBackend::Options o;
    o.lockstep = a.backend == "async-host";
    o.lag_ticks = a.lag_ticks;
    o.delay_us = a.delay_us;
    auto b = std::make_unique<tensile::AsyncHostBackend>(o);
    m.kernels = b.get();
    m.backend = std::move(b);
    return m;
  }
#ifdef TENSILE_WITH_CUDA
  if (a.backend == "cuda") {
    tensile::CudaBackend::Options o;
    o.spin_ns = a.spin_ns;
    auto b = std::make_unique<tensile::CudaBackend>(o);
    m.device = b->DeviceDescription();
    m.kernels = b.get();
    m.backend = std::move(b);
    return m;
  }
#endif
  Usage("backend '" + a.backend + "' is not built in (async-host, async-host-free" +
#ifdef TENSILE_WITH_CUDA
        ", cuda" +
#endif
        std::string(")"));
}

// The backend for one arena trial: the host (pages, or `piece_bytes`
// pieces) or, with TENSILE_WITH_CUDA, the CUDA arena (stitch on or off).
using BackendFactory = std::function<std::unique_ptr<tensile::PoolBackend>()>;

#ifdef TENSILE_WITH_CUDA
BackendFactory CudaArena(bool stitch) {
  return [stitch] {
    tensile::CudaBackend::Options o;
    o.stitch = stitch;
    return std::unique_ptr<tensile::PoolBackend>(new tensile::CudaBackend(o));
  };
}
#endif

void Race(const Args& a, const std::vector<tensile::Trace>& jobs) {
  // The smallest arena on the backend's own granularity: on CUDA, the
  // virtual-memory arena's (Note [Stitching on a CUDA arena]).
  BackendFactory sizing = [] { return std::make_unique<tensile::HostBackend>(true); };
#ifdef TENSILE_WITH_CUDA
  if (a.backend == "cuda") sizing = CudaArena(true);
#endif
  const int64_t smallest = tensile::SmallestArena(jobs, int64_t{1} << 20, true, sizing);
  const size_t capacity = static_cast<size_t>(smallest * a.arena_factor) / 256 * 256;
  for (const std::string& rule : a.rules) {
    Made m = MakeBackend(a);
    tensile::RaceOptions o;
    o.capacity = capacity;
    o.passes = a.passes;
    o.stream_rule = rule == "on";
    const std::string device = m.device;
    const tensile::RaceResult r =
        tensile::ReplayOnStreams(jobs, std::move(m.backend), m.kernels, o);
    std::cout << With(tensile::ToJson(r),
                      ", \"mode\": \"race\", \"rule\": \"" + rule +
                          "\", \"capacity\": " + std::to_string(capacity) +
                          ", \"device\": \"" + device +
                          "\", \"traces\": " + TraceList(jobs))
              << std::endl;
  }
}

// Footprint of the jobs together against the sum of their own, with and
// without stitching, on each arena of the header's --mode arena.
void Arena(const Args& a, const std::vector<tensile::Trace>& jobs) {
  int64_t sum_live = 0;
  for (const tensile::Trace& t : jobs) sum_live += t.LiveBytesPeak();
  struct Config {
    std::string backend;
    int64_t piece_bytes;  // stitch granularity; 0: no stitching
    BackendFactory make;
  };
  const size_t pieces = a.piece_bytes;
  std::vector<Config> configs = {
      {"host", static_cast<int64_t>(sysconf(_SC_PAGESIZE)), [] { return std::make_unique<tensile::HostBackend>(true); }},
      {"host", 0, [] { return std::make_unique<tensile::HostBackend>(false); }},
      {"host", static_cast<int64_t>(pieces),
       [pieces] { return std::make_unique<tensile::HostBackend>(true, pieces); }},
  };
  auto emit = [&](const Config& c, const std::string& device) {
    const bool stitch = c.piece_bytes > 0;
    int64_t sum_alone = 0;
    std::string alone = "[";
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t s = tensile::SmallestArena({jobs[i]}, int64_t{1} << 20, stitch, c.make);
      sum_alone += s;
      alone += (i ? ", " : "") + std::to_string(s);
    }
    alone += "]";
    const int64_t together = tensile::SmallestArena(jobs, int64_t{1} << 20, stitch, c.make);
    std::cout << "{\"kind\": \"arena\", \"mode\": \"arena\", \"traces\": " << TraceList(jobs)
              << ", \"backend\": \"" << c.backend << "\", \"device\": \"" << device
              << "\", \"stitch\": " << (stitch ? "true" : "false")
              << ", \"piece_bytes\": " << c.piece_bytes
              << ", \"smallest_arena_alone\": " << alone
              << ", \"sum_smallest_alone\": " << sum_alone
              << ", \"sum_live_peaks\": " << sum_live
              << ", \"smallest_arena_together\": " << together
              << ", \"together_over_sum\": "
              << static_cast<double>(together) / static_cast<double>(sum_alone) << "}"
              << std::endl;
  };
  // The host rows first: a device that fails below leaves them printed.
  for (const Config& c : configs) emit(c, "host");
#ifdef TENSILE_WITH_CUDA
  if (a.backend == "cuda") {
    tensile::CudaBackend probe(tensile::CudaBackend::Options{});
    const std::string device = probe.DeviceDescription();
    emit({"cuda", static_cast<int64_t>(probe.DeviceGranularity()), CudaArena(true)}, device);
    emit({"cuda", 0, CudaArena(false)}, device);
  }
#endif
}

void Pairs(const Args& a, const std::vector<tensile::Trace>& jobs) {
  const int32_t streams = static_cast<int32_t>(jobs.size());
  auto emit = [&](tensile::ReplayAllocator& alloc, const std::string& device) {
    const tensile::PairTiming t = tensile::TimePairs(jobs, alloc, a.samples, a.min_sample_ms);
    std::cout << With(tensile::ToJson(t), ", \"mode\": \"pairs\", \"jobs\": " +
                                              std::to_string(jobs.size()) + ", \"device\": \"" +
                                              device + "\", \"traces\": " + TraceList(jobs))
              << std::endl;
  };
  {
    auto pool = tensile::MakePoolReplayAllocator(std::make_unique<tensile::HostBackend>(),
                                                 a.capacity, streams,
                                                 "tensile pool, host backend (core, trace off)");
    emit(*pool, "host");
  }
#ifdef TENSILE_WITH_CUDA
  // The device rows need a GPU; without one (check.sh's dry run) they are
  // reported as skipped, with CUDA's reason, and the host row stands.
  try {
    for (bool per_free : {true, false}) {
      tensile::CudaBackend::Options o;
      o.event_per_free = per_free;
      auto b = std::make_unique<tensile::CudaBackend>(o);
      const std::string device = b->DeviceDescription();
      auto pool = tensile::MakePoolReplayAllocator(
          std::move(b), a.capacity, streams,
          per_free ? "tensile pool, CUDA backend (event per free)"
                   : "tensile pool, CUDA backend (event at sync)");
      emit(*pool, device);
    }
    for (const std::string& kind : {std::string("cudaMallocAsync"), std::string("cudaMalloc")}) {
      auto baseline = tensile::MakeCudaBaseline(kind, streams);
      emit(*baseline, tensile::CudaDeviceDescription());
    }
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "pool_replay: CUDA rows skipped: %s\n", e.what());
  }
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  try {
    std::vector<tensile::Trace> jobs;
    for (const std::string& p : a.traces) jobs.push_back(tensile::LoadTrace(p));
    if (a.mode == "race") Race(a, jobs);
    if (a.mode == "arena") Arena(a, jobs);
    if (a.mode == "pairs") Pairs(a, jobs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pool_replay: %s\n", e.what());
    return 1;
  }
  return 0;
}
