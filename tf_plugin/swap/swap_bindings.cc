// pybind11 bindings of the swap runtime: host store and swap channel stats
// and settings. Registered into the plugin's one module by bindings.cc.
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include "tf_plugin/swap/host_store.h"
#include "tf_plugin/swap/plan_table.h"
#include "tf_plugin/swap/swap_channel.h"

namespace py = pybind11;

namespace tensile {

void RegisterSwapBindings(py::module_& m) {
  m.def("host_store_stats", []() {
    const HostStoreStats s = GetHostStore().Stats();
    py::dict d;
    d["capacity"] = s.capacity;
    d["current"] = s.current;
    d["peak"] = s.peak;
    d["allocated"] = s.allocated;
    d["freed"] = s.freed;
    d["num_puts"] = s.num_puts;
    d["num_frees"] = s.num_frees;
    d["num_rejected"] = s.num_rejected;
    d["num_entries"] = s.num_entries;
    d["cached"] = s.cached;
    d["cache_hits"] = s.cache_hits;
    d["cache_misses"] = s.cache_misses;
    return d;
  });
  m.def(
      "configure_host_store",
      [](int64_t capacity) {
        if (capacity <= 0) throw py::value_error("host store capacity must be > 0");
        GetHostStore().SetCapacity(static_cast<size_t>(capacity));
      },
      py::arg("capacity"));
  m.def("host_store_reset_peak", []() { GetHostStore().ResetPeak(); });
  m.def(
      "configure_host_cache",
      [](int64_t cache_limit) {
        if (cache_limit < 0) throw py::value_error("host cache limit must be >= 0 (0: no cache)");
        GetHostStore().SetCacheLimit(static_cast<size_t>(cache_limit));
      },
      py::arg("cache_limit"));
  m.def(
      "host_store_release_stream",
      [](int stream) { return GetHostStore().ReleaseStream(stream); },
      py::arg("stream"),
      "Drops the activation copies a job put (after a failed step); returns bytes.");
  m.def("swap_channel_stats", []() {
    const SwapChannelStats s = GetSwapChannel().Stats();
    py::dict d;
    d["bandwidth_bytes_per_s"] = s.bandwidth_bytes_per_s;
    d["combined_bytes_per_s"] = s.combined_bytes_per_s;
    d["lane_bytes_per_s"] = s.lane_bytes_per_s;
    d["lanes"] = s.lanes;
    d["swap_outs"] = s.swap_outs;
    d["swap_ins"] = s.swap_ins;
    d["bytes_out"] = s.bytes_out;
    d["bytes_in"] = s.bytes_in;
    d["busy_s"] = s.busy_ns * 1e-9;
    d["busy_s_by_lane"] = py::make_tuple(s.lane_busy_ns[0] * 1e-9, s.lane_busy_ns[1] * 1e-9);
    d["copy_s"] = s.copy_ns * 1e-9;
    d["done_s"] = s.done_ns * 1e-9;
    d["queue_wait_s"] = s.queue_wait_ns * 1e-9;
    d["max_queue_depth"] = s.max_queue_depth;
    d["thread_priority_raised"] = s.thread_priority_raised;
    d["pending"] = s.pending;
    d["late_swap_ins"] = s.late_swap_ins;
    d["checked_swap_ins"] = s.checked_swap_ins;
    return d;
  });
  m.def("reset_swap_channel_stats", []() { GetSwapChannel().ResetStats(); });
  m.def(
      "set_swap_log_capacity",
      [](int64_t capacity) {
        if (capacity < 0) throw py::value_error("log capacity must be >= 0 (0: off)");
        GetSwapChannel().SetLogCapacity(static_cast<size_t>(capacity));
      },
      py::arg("capacity"));
  m.def("swap_channel_log", []() {
    py::list out;
    for (const TransferRecord& r : GetSwapChannel().Log()) {
      py::dict d;
      d["kind"] = r.kind == TransferKind::kSwapOut ? "swap_out"
                                                       : "swap_in";
      d["lane"] = r.lane;
      d["stream"] = r.stream;
      d["bytes"] = r.bytes;
      d["submitted_ns"] = r.submitted_ns;
      d["not_before_ns"] = r.not_before_ns;
      d["start_ns"] = r.start_ns;
      d["end_ns"] = r.end_ns;
      out.append(d);
    }
    return out;
  });
  m.def(
      "set_swap_bandwidth",
      [](double bytes_per_s) {
        if (bytes_per_s < 0) throw py::value_error("bandwidth must be >= 0 (0: unlimited)");
        GetSwapChannel().SetBandwidth(bytes_per_s);
      },
      py::arg("bytes_per_s"));
  m.def("swap_bandwidth", []() { return GetSwapChannel().Bandwidth(); });
  m.def(
      "set_swap_combined_bandwidth",
      [](double bytes_per_s) {
        if (bytes_per_s < 0) throw py::value_error("combined bandwidth must be >= 0 (0: no cap)");
        GetSwapChannel().SetCombinedBandwidth(bytes_per_s);
      },
      py::arg("bytes_per_s"));
  m.def(
      "set_swap_lanes",
      [](int lanes) {
        if (!GetSwapChannel().SetLanes(lanes)) throw py::value_error("swap link lanes must be 1 or 2");
      },
      py::arg("lanes"), "1: one transfer at a time either way; 2: a lane per direction (swap_channel.h).");
  m.def("swap_lanes", []() { return GetSwapChannel().Lanes(); });
  m.def(
      "drain_swap_channel", []() { GetSwapChannel().Drain(); },
      py::call_guard<py::gil_scoped_release>(),
      "Waits until every submitted transfer is done.");
  m.def(
      "set_plan_table",
      [](const std::string& table, const std::vector<std::tuple<bool, bool, int, int64_t, double, int64_t, double>>& rows,
         int64_t generation) {
        std::vector<SlotPlan> slots;
        slots.reserve(rows.size());
        for (const auto& [active, copy_out, host_reads, out_tick, out_delta_s, in_tick, in_delta_s] : rows) {
          SlotPlan e;
          e.active = active;
          e.copy_out = copy_out;
          e.host_reads = host_reads;
          e.out_tick = out_tick;
          e.out_delta_ns = out_delta_s > 0 ? static_cast<int64_t>(out_delta_s * 1e9) : 0;
          e.in_tick = in_tick;
          e.in_delta_ns = in_delta_s > 0 ? static_cast<int64_t>(in_delta_s * 1e9) : 0;
          slots.push_back(e);
        }
        py::gil_scoped_release release;
        SetPlanTable(table, std::move(slots), generation);
      },
      py::arg("table"), py::arg("rows"), py::arg("generation"),
      "Writes a plan into a plan-table step's table (Note [Plans read at run time] in plan_table.h); "
      "rows: (active, copy_out, host_reads, out_tick, out_delta_s, in_tick, in_delta_s) per slot.");
  m.def(
      "plan_table_stats",
      [](const std::string& table) {
        const PlanTableStats s = GetPlanTableStats(table);
        py::dict d;
        d["slots"] = s.slots;
        d["generation"] = s.generation;
        d["last_step_generation"] = s.last_step_generation;
        d["steps"] = s.steps;
        d["swap_outs"] = s.swap_outs;
        d["swap_ins"] = s.swap_ins;
        d["host_reuses"] = s.host_reuses;
        d["passed"] = s.passed;
        d["waits"] = s.waits;
        d["cancelled"] = s.cancelled;
        return d;
      },
      py::arg("table"));
  m.def(
      "drop_plan_table_step",
      [](const std::string& table) {
        py::gil_scoped_release release;  // frees held tensors and fires cancelled waiters
        return DropPlanTableStep(table);
      },
      py::arg("table"),
      "Drops what the table's last step holds; returns the tensors dropped.");
  m.def(
      "forget_plan_table",
      [](const std::string& table) {
        py::gil_scoped_release release;  // frees the table's last step, if no kernel holds it
        return ForgetPlanTable(table);
      },
      py::arg("table"), "Forgets the table's name; it goes once no kernel of its step holds it.");
  m.def("plan_tables_known", []() { return PlanTablesKnown(); });
}

}  // namespace tensile
