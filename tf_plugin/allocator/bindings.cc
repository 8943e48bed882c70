// pybind11 bindings: standalone StreamAwarePools (tests, benchmarks, users)
// and the process-wide device pool that serves TensorFlow. Both are the same
// class, so one set of methods serves both. Addresses cross the boundary as
// arena offsets. Allocation failure raises tf_plugin.PoolOutOfMemory.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "tf_plugin/allocator/device_pool.h"
#include "tf_plugin/allocator/stream_aware_pool.h"

namespace py = pybind11;
using tensile::StreamAwarePool;

namespace tensile::nodegroup {
void AddNodeGroupBindings(py::module_& m);  // tf_plugin/nodegroup/bindings.cc
}
namespace tensile {
// tf_plugin/swap/swap_bindings.cc: host store and swap channel.
void RegisterSwapBindings(py::module_& m);
}  // namespace tensile

namespace {

py::dict CountersDict(const tensile::MemoryCounters& m) {
  py::dict d;
  d["current"] = m.current;
  d["peak"] = m.peak;
  d["allocated"] = m.allocated;
  d["freed"] = m.freed;
  d["num_allocs"] = m.num_allocs;
  d["num_frees"] = m.num_frees;
  d["num_ooms"] = m.num_ooms;
  d["largest_alloc"] = m.largest_alloc;
  return d;
}

py::dict StatsDict(StreamAwarePool& pool) {
  const tensile::PoolStats s = pool.Stats();
  py::dict d = CountersDict(s.counters);
  d["name"] = s.name;
  d["backend"] = s.backend;
  d["capacity"] = s.capacity;
  d["requested_current"] = s.requested_current;
  d["free"] = s.free_bytes;
  d["synced_free"] = s.synced_free_bytes;
  d["unsynced_free"] = s.unsynced_free_bytes;
  d["largest_free_chunk"] = s.largest_free_chunk;
  d["num_free_chunks"] = s.num_free_chunks;
  d["num_live_chunks"] = s.num_live_chunks;
  d["fragmentation"] = s.fragmentation;
  d["num_syncs"] = s.num_syncs;
  d["num_allocator_syncs"] = s.num_allocator_syncs;
  d["num_stream_waits"] = s.num_stream_waits;
  d["num_stitched"] = s.num_stitched;
  d["stitched_current"] = s.stitched_current;
  d["num_live_stitched"] = s.num_live_stitched;
  d["stitching"] = pool.stitching();
  d["trace_recorded"] = s.trace_recorded;
  d["trace_dropped"] = s.trace_dropped;
  py::dict jobs;
  for (const tensile::StreamStats& st : pool.AllStreamStats()) {
    py::dict j = CountersDict(st.counters);
    j["stream"] = st.stream;
    j["unsynced_free"] = st.unsynced_free_bytes;
    jobs[py::str(st.name)] = j;
  }
  d["jobs"] = jobs;
  return d;
}

char* CheckedRange(StreamAwarePool& pool, int64_t offset, int64_t nbytes) {
  if (offset < 0 || nbytes < 0 ||
      !pool.Accessible(pool.AddressOf(offset), static_cast<size_t>(nbytes))) {
    throw py::index_error(
        "range outside the pool's arena and its live stitched allocations");
  }
  return pool.AddressOf(offset);
}

}  // namespace

PYBIND11_MODULE(_tensile_plugin, m) {
  m.doc() = "tensile-tf runtime: the StreamAwarePool and the device pool.";
  // Leaked on purpose: the type must outlive interpreter finalization.
  static PyObject* pool_oom = PyErr_NewExceptionWithDoc(
      "tf_plugin._tensile_plugin.PoolOutOfMemory",
      "A StreamAwarePool could not serve an allocation.", PyExc_MemoryError,
      nullptr);
  m.add_object("PoolOutOfMemory", py::handle(pool_oom).inc_ref());

  m.attr("MIN_CHUNK_BYTES") = StreamAwarePool::kMinChunkBytes;
  m.attr("DEFAULT_STREAM") = tensile::kDefaultStream;
  m.attr("SYNCED") = tensile::kSyncedOwner;
#ifdef TENSILE_BUILT_AGAINST_TF
  m.attr("BUILT_AGAINST_TF") = TENSILE_BUILT_AGAINST_TF;
#endif

  py::class_<StreamAwarePool>(m, "StreamAwarePool", R"doc(
Waterwave stream-aware allocator over one fixed arena (seed 004, Listing 1).
Streams are jobs; allocate() returns an arena offset.)doc")
      .def(py::init([](int64_t capacity, const std::string& name,
                       const std::string& backend, int64_t trace_capacity,
                       bool stitch) {
             if (capacity <= 0) throw py::value_error("capacity must be > 0");
             return new StreamAwarePool(name, static_cast<size_t>(capacity),
                                        tensile::MakeBackend(backend, stitch),
                                        static_cast<size_t>(trace_capacity),
                                        stitch);
           }),
           py::arg("capacity"), py::arg("name") = "pool",
           py::arg("backend") = "host", py::arg("trace_capacity") = 1 << 16,
           py::arg("stitch") = true)
      .def(
          "allocate",
          [](StreamAwarePool& p, int64_t nbytes, int stream,
             const std::string& op) {
            if (nbytes < 0) throw py::value_error("nbytes must be >= 0");
            void* ptr;
            {
              py::gil_scoped_release release;
              ptr = p.Allocate(static_cast<size_t>(nbytes), stream, op);
            }
            if (ptr == nullptr) {
              PyErr_SetString(pool_oom,
                              p.DescribeOom(nbytes, stream, op).c_str());
              throw py::error_already_set();
            }
            return p.OffsetOf(ptr);
          },
          py::arg("nbytes"), py::arg("stream") = 0, py::arg("op") = "",
          "Allocates nbytes for `stream`; returns the offset (>= capacity: a "
          "stitched allocation in the stitch window).")
      .def(
          "deallocate",
          [](StreamAwarePool& p, int64_t offset, const std::string& op) {
            char* ptr = offset >= 0 ? p.AddressOf(offset) : nullptr;
            if (ptr == nullptr || !p.Owns(ptr) || p.AllocatedSize(ptr) == 0) {
              throw py::value_error("no live allocation at offset " +
                                    std::to_string(offset));
            }
            py::gil_scoped_release release;
            p.Deallocate(ptr, op);
          },
          py::arg("offset"), py::arg("op") = "")
      .def("sync_and_coalesce", &StreamAwarePool::SyncAndCoalesce,
           py::call_guard<py::gil_scoped_release>())
      .def("register_stream", &StreamAwarePool::RegisterStream,
           py::arg("name"))
      .def("release_stream", &StreamAwarePool::ReleaseStream,
           py::arg("stream"))
      .def("rename_stream", &StreamAwarePool::RenameStream,
           py::arg("stream"), py::arg("name"))
      .def("stats", &StatsDict)
      .def("reset_peak", &StreamAwarePool::ResetPeak)
      .def("reset_stream_peak", &StreamAwarePool::ResetStreamPeak, py::arg("stream"))
      .def("chunks",
           [](StreamAwarePool& p) {
             py::list out;
             for (const tensile::ChunkInfo& c : p.Chunks()) {
               py::dict d;
               d["offset"] = c.offset;
               d["size"] = c.size;
               d["requested"] = c.requested;
               d["in_use"] = c.in_use;
               d["owner"] = c.owner;
               out.append(d);
             }
             return out;
           })
      .def("trace",
           [](StreamAwarePool& p) {
             py::list out;
             for (const tensile::PoolEvent& e : p.Trace()) {
               py::dict d;
               d["time_ns"] = e.time_ns;
               d["kind"] = tensile::PoolEventKindName(e.kind);
               d["stream"] = e.stream;
               d["bytes"] = e.bytes;
               d["offset"] = e.offset;
               d["pool_current"] = e.pool_current;
               d["op"] = e.op_name();
               out.append(d);
             }
             return out;
           })
      .def("clear_trace", &StreamAwarePool::ClearTrace)
      .def("set_trace_enabled", &StreamAwarePool::SetTraceEnabled,
           py::arg("enabled"))
      .def("check_invariants",
           [](StreamAwarePool& p) {
             const std::string err = p.CheckInvariants();
             if (!err.empty()) {
               throw std::logic_error("pool '" + p.name() +
                                      "' invariant broken: " + err);
             }
           })
      .def(
          "fill",
          [](StreamAwarePool& p, int64_t offset, int64_t nbytes, int value) {
            std::memset(CheckedRange(p, offset, nbytes), value & 0xff, nbytes);
          },
          py::arg("offset"), py::arg("nbytes"), py::arg("value"),
          "Writes `value` into arena bytes (tests: detect overlapping chunks).")
      .def(
          "holds",
          [](StreamAwarePool& p, int64_t offset, int64_t nbytes, int value) {
            const unsigned char* b = reinterpret_cast<const unsigned char*>(
                CheckedRange(p, offset, nbytes));
            for (int64_t i = 0; i < nbytes; ++i) {
              if (b[i] != static_cast<unsigned char>(value & 0xff)) {
                return false;
              }
            }
            return true;
          },
          py::arg("offset"), py::arg("nbytes"), py::arg("value"),
          "True if every arena byte in the range equals `value`.")
      .def_property_readonly("name", &StreamAwarePool::name)
      .def_property_readonly("capacity", &StreamAwarePool::capacity);

  // The device pool.
  // The plugin's settings in one call (tf_plugin/plugin_settings.h), from
  // tensile_tf/tf/plugin_settings.py.
  m.def(
      "configure_plugin",
      [](int64_t pool_bytes, bool pool_stitch, int64_t pool_trace_events, double swap_bandwidth_bytes_per_s,
         int swap_thread_nice, int64_t host_bytes, int64_t host_cache_bytes) {
        if (pool_bytes <= 0) throw py::value_error("pool_bytes must be > 0");
        if (pool_trace_events <= 0) throw py::value_error("pool_trace_events must be > 0");
        if (swap_bandwidth_bytes_per_s < 0) throw py::value_error("swap_bandwidth_bytes_per_s must be >= 0");
        if (host_bytes <= 0) throw py::value_error("host_bytes must be > 0");
        if (host_cache_bytes < 0) throw py::value_error("host_cache_bytes must be >= 0");
        tensile::PluginSettings s;
        s.pool_bytes = static_cast<size_t>(pool_bytes);
        s.pool_stitch = pool_stitch;
        s.pool_trace_events = static_cast<size_t>(pool_trace_events);
        s.swap_bandwidth_bytes_per_s = swap_bandwidth_bytes_per_s;
        s.swap_thread_nice = swap_thread_nice;
        s.host_bytes = static_cast<size_t>(host_bytes);
        s.host_cache_bytes = static_cast<size_t>(host_cache_bytes);
        tensile::ConfigurePlugin(s);
      },
      py::arg("pool_bytes"), py::arg("pool_stitch"), py::arg("pool_trace_events"),
      py::arg("swap_bandwidth_bytes_per_s"), py::arg("swap_thread_nice"), py::arg("host_bytes"),
      py::arg("host_cache_bytes"));
  m.def("plugin_settings", []() {
    const tensile::PluginSettings s = tensile::CurrentPluginSettings();
    py::dict d;
    d["pool_bytes"] = s.pool_bytes;
    d["pool_stitch"] = s.pool_stitch;
    d["pool_trace_events"] = s.pool_trace_events;
    d["swap_bandwidth_bytes_per_s"] = s.swap_bandwidth_bytes_per_s;
    d["swap_thread_nice"] = s.swap_thread_nice;
    d["host_bytes"] = s.host_bytes;
    d["host_cache_bytes"] = s.host_cache_bytes;
    return d;
  });
  m.def("device_pool_capacity", &tensile::DevicePoolCapacity);
  m.def(
      "device_pool",
      []() { return tensile::DevicePoolIfCreated(); },
      py::return_value_policy::reference,
      "The pool serving TensorFlow's CPU device, or None before TensorFlow "
      "created the device.");
  m.def("unbind_stream", &tensile::UnbindStream, py::arg("stream"));
  m.def("stream_for_step", &tensile::StreamForStep, py::arg("step_id"));
  m.def("set_thread_stream", &tensile::SetThreadStream, py::arg("stream"),
        "Attributes this thread's eager allocations to `stream`; returns the "
        "previous stream.");
  m.def("thread_stream", &tensile::ThreadStream);
  m.def("set_thread_host_fallback", &tensile::SetThreadHostFallback, py::arg("on"),
        "Note [Host fallback while building]: this thread's allocations the "
        "pool cannot serve come from host memory while on; returns the "
        "previous setting.");
  m.def("set_allocation_wait_ms", &tensile::SetAllocationWaitMs, py::arg("ms"),
        "Note [Waiting for frees]: an op kernel's failed allocation waits up "
        "to `ms` for other jobs' frees before it is an OOM (0: never).");
  m.def("allocation_wait_stats", []() {
    const tensile::AllocationWaitStats s = tensile::GetAllocationWaitStats();
    py::dict d;
    d["wait_ms"] = s.wait_ms;
    d["waits"] = s.waits;
    d["served"] = s.served;
    d["waiting"] = s.waiting;
    d["waited_s"] = static_cast<double>(s.waited_ns) / 1e9;
    return d;
  });
  m.def("host_fallback_stats", []() {
    const tensile::HostFallbackStats s = tensile::GetHostFallbackStats();
    py::dict d;
    d["num_allocs"] = s.num_allocs;
    d["current"] = s.current;
    d["peak"] = s.peak;
    return d;
  });
  m.def("human_bytes", &tensile::HumanBytes, py::arg("nbytes"));

  tensile::nodegroup::AddNodeGroupBindings(m);
  tensile::RegisterSwapBindings(m);
}
