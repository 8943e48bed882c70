#ifndef TF_PLUGIN_PLUGIN_SETTINGS_H_
#define TF_PLUGIN_PLUGIN_SETTINGS_H_

// What the plugin runs with: the device pool, the swap link and the host
// store. Python resolves each setting once (tensile_tf/tf/plugin_settings.py,
// from the environment table in tensile_tf/config/environment.py and the
// run's config) and hands them all over in one call, ConfigurePlugin. The
// plugin reads no environment variable for them (issue 57: the swap link's
// cap, the host store's size and the copy threads' priority were read here,
// documented nowhere, and the pool's size was parsed three times). Where
// Python never called (the library loaded on its own) the defaults below
// apply. The pool's C interface (pool_c_abi.cc) is for programs without
// Python and reads its own variables.
//
// Invariants:
// - Each object reads its settings once, when it is created: the pool when
//   TensorFlow creates its CPU device, the swap channel and the host store
//   at their first use. ConfigurePlugin after the pool exists throws
//   std::logic_error (a process has one pool).
// - The swap link's cap can change later (SwapChannel::SetBandwidth: a run's
//   `run.swap_bandwidth`); this is its value until then.

#include <cstddef>

namespace tensile {

struct PluginSettings {
  size_t pool_bytes = size_t{4} << 30;         // the device pool's capacity
  bool pool_stitch = true;                     // Note [Stitched allocations]
  size_t pool_trace_events = size_t{1} << 16;  // the pool's event ring
  double swap_bandwidth_bytes_per_s = 0;       // the link's cap; 0: unlimited
  int swap_thread_nice = -10;                  // copy threads; >= 0: as the process
  size_t host_bytes = size_t{16} << 30;        // the host store's capacity
  size_t host_cache_bytes = size_t{2} << 30;   // pinned buffers kept; 0: none
};

// Replaces the settings; before the device pool exists, else throws
// std::logic_error.
void ConfigurePlugin(const PluginSettings& settings);
// The settings in effect (ConfigurePlugin's, else the defaults).
PluginSettings CurrentPluginSettings();

}  // namespace tensile

#endif  // TF_PLUGIN_PLUGIN_SETTINGS_H_
