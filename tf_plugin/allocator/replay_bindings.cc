// tf_plugin._pool_replay: the pool, its host backends and the trace replay
// of trace_replay.h as a Python module WITHOUT TensorFlow (setup.py builds it
// from these sources alone), so the stream-ordering race test runs in the
// default suite in seconds. benchmarks/gpu/pool_replay.cc is the same replay
// as a command, with the CUDA backend where CUDA is found.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "tf_plugin/allocator/async_host_backend.h"
#include "tf_plugin/allocator/trace_replay.h"

namespace py = pybind11;

namespace {

std::vector<tensile::Trace> Load(const std::vector<std::string>& paths) {
  std::vector<tensile::Trace> jobs;
  for (const std::string& p : paths) jobs.push_back(tensile::LoadTrace(p));
  return jobs;
}

py::object Json(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

}  // namespace

PYBIND11_MODULE(_pool_replay, m) {
  m.doc() = "Trace replay of the StreamAwarePool on host backends (no TensorFlow)";
  // Local: the TensorFlow plugin's std::runtime_error must stay RuntimeError.
  py::register_local_exception<std::runtime_error>(m, "ReplayError");

  m.def("live_bytes_peak",
        [](const std::string& path) { return tensile::LoadTrace(path).LiveBytesPeak(); },
        py::arg("path"),
        "Live bytes at the busiest point of one pass of the trace (256-byte chunks).");

  m.def(
      "replay_on_streams",
      [](const std::vector<std::string>& paths, const std::string& backend,
         size_t capacity, int passes, bool stream_rule, bool sync_waits,
         bool kernels, int64_t lag_ticks, int64_t delay_us, bool stitch) {
        const std::vector<tensile::Trace> jobs = Load(paths);
        tensile::RaceOptions o;
        o.capacity = capacity;
        o.passes = passes;
        o.stream_rule = stream_rule;
        o.sync_waits = sync_waits;
        o.stitch = stitch;
        std::unique_ptr<tensile::PoolBackend> b;
        tensile::StreamKernels* k = nullptr;
        if (backend == "host") {
          b = std::make_unique<tensile::HostBackend>(stitch);
        } else if (backend == "async-host" || backend == "async-host-free") {
          tensile::AsyncHostBackend::Options ao;
          ao.lockstep = backend == "async-host";
          ao.lag_ticks = lag_ticks;
          ao.delay_us = delay_us;
          ao.stitchable = stitch;
          auto a = std::make_unique<tensile::AsyncHostBackend>(ao);
          if (kernels) k = a.get();
          b = std::move(a);
        } else {
          throw std::runtime_error("unknown backend '" + backend +
                                   "': host, async-host (lockstep) or "
                                   "async-host-free (free-running)");
        }
        std::string out;
        {
          py::gil_scoped_release release;
          out = tensile::ToJson(tensile::ReplayOnStreams(jobs, std::move(b), k, o));
        }
        return Json(out);
      },
      py::arg("paths"), py::arg("backend") = "async-host",
      py::arg("capacity") = size_t{1} << 30, py::arg("passes") = 2,
      py::arg("stream_rule") = true, py::arg("sync_waits") = true,
      py::arg("kernels") = true, py::arg("lag_ticks") = 512, py::arg("delay_us") = 0, py::arg("stitch") = true,
      "Replays the traces concurrently, trace i on stream i + 1 (trace_replay.h); "
      "returns the RaceResult as a dict.");

  m.def(
      "smallest_arena",
      [](const std::vector<std::string>& paths, int64_t step, bool stitch) {
        const std::vector<tensile::Trace> jobs = Load(paths);
        py::gil_scoped_release release;
        return tensile::SmallestArena(jobs, step, stitch);
      },
      py::arg("paths"), py::arg("step") = int64_t{1} << 20, py::arg("stitch") = true,
      "Smallest arena (to `step` bytes) serving the traces replayed concurrently.");
}
