// The process-wide device pool: the one StreamAwarePool that serves every
// tensor of TensorFlow's CPU device (our emulated accelerator, DESIGN.md),
// and the map from TensorFlow step ids to pool streams (jobs).
//
// No TensorFlow in this file: the TF adapter, the custom ops and the Python
// bindings all reach the device pool through it.
#ifndef TF_PLUGIN_ALLOCATOR_DEVICE_POOL_H_
#define TF_PLUGIN_ALLOCATOR_DEVICE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "tf_plugin/allocator/stream_aware_pool.h"
#include "tf_plugin/plugin_settings.h"

namespace tensile {

// The pool's capacity, stitching and trace ring are PluginSettings'
// (tf_plugin/plugin_settings.h), handed over by Python in one call.
// The capacity the pool has, or will be created with.
size_t DevicePoolCapacity();
// The pool, creating it on first call. TensorFlow's allocator factory calls
// this when it builds the CPU device.
StreamAwarePool& GetOrCreateDevicePool();
// The pool if TensorFlow has created it, else nullptr.
StreamAwarePool* DevicePoolIfCreated();
// Whether the device pool stitches (Note [Stitched allocations]): the
// settings' pool_stitch (TENSILE_POOL_STITCH=0 turns it off, for measuring
// what stitching changes).
bool DevicePoolStitching();

// Step attribution: a job's train step runs the TensileBindStep op first,
// which binds the step's TensorFlow step id to the job's stream. The
// allocator maps each allocation's step id back to its stream; allocations of
// unbound steps go to kDefaultStream. One binding per stream (a job runs one
// step at a time), so lookups scan a short array without locks.
void BindStepToStream(int64_t step_id, StreamId stream);
void UnbindStream(StreamId stream);
StreamId StreamForStep(int64_t step_id);

// Eager attribution: ops TensorFlow runs inline on the calling thread (eager
// ops, variable creation, tf.data iteration) carry no bound step id. A job's
// thread names its stream here; such allocations are attributed to it.
// Returns the previous value.
StreamId SetThreadStream(StreamId stream);
StreamId ThreadStream();
// StreamForStep(step_id), else the calling thread's stream.
StreamId StreamForAllocation(int64_t step_id);

// Host fallback (Note [Host fallback for conversions] in tf_pool_allocator.cc):
// allocations made outside any op kernel that the pool cannot serve.
struct HostFallbackStats {
  int64_t num_allocs = 0;  // cumulative
  int64_t current = 0;     // bytes live now
  int64_t peak = 0;
};
HostFallbackStats GetHostFallbackStats();
// Note [Host fallback while building]: while on, every allocation of the
// calling thread that the pool cannot serve falls back to host memory.
// Returns the previous setting.
bool SetThreadHostFallback(bool on);

// Note [Waiting for frees] (tf_pool_allocator.cc): how long an op kernel's
// failed allocation waits for other jobs' frees before it is an OOM.
struct AllocationWaitStats {
  int64_t wait_ms = 0;     // the setting
  int64_t waits = 0;       // allocations that waited (cumulative)
  int64_t served = 0;      // of those, served after waiting
  int64_t waiting = 0;     // waiting now
  int64_t waited_ns = 0;   // time spent waiting, summed
};
void SetAllocationWaitMs(int64_t ms);
AllocationWaitStats GetAllocationWaitStats();

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_DEVICE_POOL_H_
