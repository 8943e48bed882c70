// pybind11 bindings of the node-group pipeline: the process-wide pipeline
// that the TensileNodeGroupBarrier ops use (and that syncs the device pool),
// and standalone pipelines for tests. Added to the plugin module by
// AddNodeGroupBindings (called from tf_plugin/allocator/bindings.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <future>
#include <memory>

#include "tf_plugin/nodegroup/counter_barrier.h"

namespace py = pybind11;

namespace tensile {
namespace nodegroup {
namespace {

py::dict StatsDict(const NodeGroupPipeline& p) {
  const PipelineStats s = p.Stats();
  py::dict d;
  d["version"] = s.version;
  d["num_pairs"] = s.num_pairs;
  d["jobs"] = s.jobs;
  d["boundaries"] = s.boundaries;
  d["passthrough"] = s.passthrough;
  d["waits"] = s.waits;
  d["released"] = s.released;
  d["released_by_leave"] = s.released_by_leave;
  d["timeouts"] = s.timeouts;
  d["cancellations"] = s.cancellations;
  d["pair_starts"] = s.pair_starts;
  d["wait_seconds"] = s.wait_seconds;
  d["waiting_now"] = s.waiting_now;
  d["timeout_seconds"] = s.timeout_seconds;
  py::list barriers;
  for (const BarrierStats& b : s.barriers) {
    py::dict bd;
    bd["index"] = b.index;
    bd["generation"] = b.generation;
    bd["prev_count"] = b.prev_count;
    bd["succ_count"] = b.succ_count;
    bd["opened"] = b.opened;
    bd["waiting"] = b.waiting;
    bd["prev_jobs"] = b.prev_jobs;
    bd["succ_jobs"] = b.succ_jobs;
    barriers.append(bd);
  }
  d["barriers"] = barriers;
  return d;
}

int64_t SetScheduleFromPython(NodeGroupPipeline& p, const py::dict& jobs, int num_pairs) {
  std::map<JobKey, JobSchedule> table;
  for (auto item : jobs) {
    const JobKey job = item.first.cast<JobKey>();
    auto entry = item.second.cast<std::pair<std::string, std::vector<int>>>();
    table[job] = JobSchedule{entry.first, entry.second};
  }
  try {
    return p.SetSchedule(table, num_pairs);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

// Runs Boundary and waits for its outcome with the GIL released (tests and
// tools drive barriers from Python threads this way). Returns (code, message).
std::pair<std::string, std::string> BoundaryBlocking(NodeGroupPipeline& p, JobKey job,
                                                     int boundary, int num_groups) {
  auto promise = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> future = promise->get_future();
  Outcome o;
  {
    py::gil_scoped_release release;
    p.Boundary(p.NewWaiterId(), job, boundary, num_groups,
               [promise](const Outcome& out) { promise->set_value(out); });
    o = future.get();
  }
  return {CodeName(o.code), o.message};
}

}  // namespace

void AddNodeGroupBindings(py::module_& m) {
  py::class_<NodeGroupPipeline>(m, "NodeGroupPipeline", R"doc(
Waterwave node-group pipeline runtime: CounterBarriers between node group
pairs (seed 004 §4.3). set_schedule({job: (name, [pair of each group])},
num_pairs) installs a version; boundary(job, b, num_groups) is what the
TensileNodeGroupBarrier op does, blocking here for tests.)doc")
      .def(py::init([] { return new NodeGroupPipeline(nullptr); }))
      .def("set_schedule", &SetScheduleFromPython, py::arg("jobs"), py::arg("num_pairs"))
      .def("leave", &NodeGroupPipeline::Leave, py::arg("job"),
           py::call_guard<py::gil_scoped_release>())
      .def("set_timeout", &NodeGroupPipeline::SetTimeout, py::arg("seconds"))
      .def_property_readonly("timeout", &NodeGroupPipeline::timeout)
      .def("boundary", &BoundaryBlocking, py::arg("job"), py::arg("boundary"),
           py::arg("num_groups"))
      .def("stats", &StatsDict);
  m.def("device_pipeline", &DevicePipeline, py::return_value_policy::reference,
        "The pipeline the TensileNodeGroupBarrier ops use; its barrier openings "
        "run SyncAndCoalesce on the device pool.");
}

}  // namespace nodegroup
}  // namespace tensile
