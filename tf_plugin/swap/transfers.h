// The four transfers a swap op starts on the SwapChannel (seed 000 §III-B,
// "Swap Executor"), one function each. Two kinds of ops start them: the
// fixed swap ops a plan's rewrite puts into a step (swap_ops.cc), and the
// swap slots of a plan-table step, which read at run time whether and when
// to swap (plan_table_ops.cc). Each function submits its transfer and
// returns; `done(status)` runs on the channel thread once the transfer is
// over (SwapChannel policy 4: no TensorFlow thread waits for a copy).
#ifndef TF_PLUGIN_SWAP_TRANSFERS_H_
#define TF_PLUGIN_SWAP_TRANSFERS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tf_plugin/allocator/device_pool.h"

namespace tensile {

using TransferDone = std::function<void(const absl::Status&)>;

// A fresh handle for an activation's host copy.
int64_t NewHostHandle();

// The host store's key of a resource variable.
std::string VarKey(const tensorflow::ResourceHandle& h);

// Copies `in` to a new host-store entry under `handle` that `refs` swap-ins
// will read, then drops this reference to the device buffer.
void StartSwapOut(tensorflow::Tensor in, int64_t handle, int refs, const std::string& label,
                  StreamId stream, int64_t not_before_ns, TransferDone done);

// Copies the host copy behind `handle` into output 0 of `ctx`, a fresh pool
// allocation of `dtype` (the allocation is charged to `op_name` and the
// step). Takes one of the entry's references.
void StartSwapIn(tensorflow::OpKernelContext* ctx, int64_t handle, tensorflow::DataType dtype,
                 const std::string* op_name, const std::string& label, int64_t not_before_ns,
                 TransferDone done);

// Moves `var`'s buffer to the host store (unless `copy` is false and the
// host copy is current) and leaves the variable empty. Takes over one
// reference to `var`.
void StartVarSwapOut(tensorflow::Var* var, const std::string& key, const std::string& label, bool copy,
                     StreamId stream, int64_t not_before_ns, TransferDone done);

// Brings a swapped-out `var` back into a fresh pool buffer (a no-op if it is
// in); `keep_host`: keep its host copy. Takes over one reference to `var`.
void StartVarSwapIn(tensorflow::OpKernelContext* ctx, tensorflow::Var* var, const std::string& key,
                    bool keep_host, const std::string* op_name, StreamId stream, int64_t not_before_ns,
                    TransferDone done);

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_TRANSFERS_H_
