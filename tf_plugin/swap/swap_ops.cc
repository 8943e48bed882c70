// Swap and recomputation ops: how a TENSILE plan runs inside a TensorFlow
// step (seed 000 §III-B "Swap Executor", §III-C "Swap Event").
//
//   TensileSwapOut(tensor) -> handle      device -> host copy of an activation
//   TensileSwapIn(handle) -> tensor       host -> fresh pool allocation
//   TensileSwapCheck()                    lateness probe for one swap-in
//   TensileVarSwapOut(resource)           variable's buffer -> host, leaves the pool
//   TensileVarSwapIn(resource)            variable's buffer back into the pool
//   TensileRecomputeGate(xs) -> xs        starts a recomputation clone
//
// Every op is stateful, so Grappler neither prunes, folds, dedups nor
// reorders it (DESIGN.md: it deletes same-device Identity nodes and drops
// redundant control edges). The four swap ops are AsyncOpKernels: their
// transfer and their `done` run on the SwapChannel's thread, never blocking
// an inter-op thread.
//
// Note [Release by rewiring]
// A swap-out does not free anything itself. The graph rewrite points every
// consumer after the gap at the swap-in's output, so the original buffer's
// last readers are the accesses before the gap plus the swap-out; TF's
// executor frees it when the last of them is done, which is the plan's
// release point. A consumer after the gap has the swap-in's output as a data
// input: it cannot run before the copy is back (a late swap-in makes it
// wait, never read stale data).
//
// Note [Swap ops run inline]
// TensorFlow's executor runs an op whose kernel says IsExpensive() on the
// inter-op thread pool and an inexpensive one inline, on the thread that
// finished its last input. A kernel starts out expensive, and only a
// synchronous kernel's measured cost can make it cheap: an AsyncOpKernel
// stays expensive for ever. So every swap op went through the inter-op
// pool's queue, behind whatever compute the jobs had queued there. With two
// jobs the queue is long: measured (two planned Transformer jobs), one
// job's 25 forward swap-outs were all reached 6-30 ms after their tensors'
// last reads, at the same instant, and the job's own peak doubled (8 MiB
// planned, 16 measured) while its plan alone ran as planned. Starting a
// transfer only submits it to the SwapChannel, so these kernels say they
// are cheap: each starts the moment its trigger op and inputs are done.
//
// Note [Late swap-ins]
// A swap-in is late when the op the plan puts right before its consumer has
// finished and the data is not back yet: the consumer, all else being ready,
// waits. TensileSwapCheck runs after that op (control edge) and looks up the
// swap-in's state for this step; the channel counts checked and late ones.
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tf_plugin/allocator/device_pool.h"
#include "tf_plugin/swap/swap_channel.h"
#include "tf_plugin/swap/transfers.h"

namespace tensile {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("TensileSwapOut")
    .Input("tensor: T")
    .Output("handle: int64")
    .Attr("T: type")
    .Attr("num_swap_ins: int >= 1 = 1")
    .Attr("delta_s: float = 0")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Copies `tensor` to the host store (outside the device pool), starting
`delta_s` seconds after the op is reached, on the swap channel. Returns a
handle; the host copy stays until `num_swap_ins` swap-ins have read it.
)doc");

REGISTER_OP("TensileSwapIn")
    .Input("handle: int64")
    .Output("tensor: T")
    .Attr("T: type")
    .Attr("shape: shape")
    .Attr("delta_s: float = 0")
    .Attr("label: string = ''")
    .Attr("event: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Copies the host copy behind `handle` back into a fresh pool allocation,
starting `delta_s` seconds after the op is reached, on the swap channel.
)doc");

REGISTER_OP("TensileSwapCheck")
    .Attr("event: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Counts swap-in `event` as late if its data is not back yet.");

REGISTER_OP("TensileVarSwapOut")
    .Input("resource: resource")
    .Attr("copy: bool = true")
    .Attr("delta_s: float = 0")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Moves a resource variable's buffer out of the device pool: copies it to the
host store (unless `copy` is false: the host copy is still current) and
leaves the variable holding an empty tensor until TensileVarSwapIn.
A variable already swapped out is left as it is.
)doc");

REGISTER_OP("TensileVarSwapIn")
    .Input("resource: resource")
    .Attr("keep_host: bool = false")
    .Attr("delta_s: float = 0")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Brings a swapped-out variable back into the pool (a no-op if it is in).
`keep_host`: keep the host copy for a later swap-out with copy=false.
)doc");

REGISTER_OP("TensileRecomputeGate")
    .Input("x: T")
    .Output("y: T")
    .Attr("T: list(type) >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Forwards its inputs (no copy). A recomputation clone reads them through this
gate, which the rewrite starts with a control edge from the plan's trigger
op; being stateful, it also keeps Grappler from merging the clone back into
the original op.
)doc");

namespace {

int64_t DeltaNs(OpKernelConstruction* ctx) {
  float delta_s = 0;
  if (!ctx->GetAttr("delta_s", &delta_s).ok()) return 0;
  return delta_s > 0 ? static_cast<int64_t>(delta_s * 1e9) : 0;
}

// Note [Late swap-ins]: (step id, event) -> state.
enum class InState { kInFlight, kDone, kProbedEarly };
std::mutex g_late_mu;
std::map<std::pair<int64_t, std::string>, InState> g_late;

void SwapInStarted(int64_t step, const std::string& event) {
  if (event.empty()) return;
  std::lock_guard<std::mutex> lock(g_late_mu);
  g_late.emplace(std::make_pair(step, event), InState::kInFlight);
}

void SwapInDone(int64_t step, const std::string& event) {
  if (event.empty()) return;
  std::lock_guard<std::mutex> lock(g_late_mu);
  auto it = g_late.find(std::make_pair(step, event));
  if (it == g_late.end()) return;
  if (it->second == InState::kProbedEarly) {
    g_late.erase(it);
  } else {
    it->second = InState::kDone;
  }
}

// True if late.
bool ProbeSwapIn(int64_t step, const std::string& event) {
  std::lock_guard<std::mutex> lock(g_late_mu);
  auto key = std::make_pair(step, event);
  auto it = g_late.find(key);
  if (it != g_late.end() && it->second == InState::kDone) {
    g_late.erase(it);
    return false;
  }
  if (it == g_late.end()) {
    g_late.emplace(key, InState::kProbedEarly);
  } else {
    it->second = InState::kProbedEarly;
  }
  return true;
}


// The four swap kernels: each starts its transfer (transfers.h) and
// completes when it is done. Starting one is cheap (Note [Swap ops run
// inline]).
class TransferKernel : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  bool IsExpensive() override { return false; }
};

// The op's `done`, after the transfer: its status first.
TransferDone Finish(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done) {
  return [ctx, done = std::move(done)](const absl::Status& s) {
    if (!s.ok()) ctx->SetStatus(s);
    done();
  };
}

class SwapOutOp : public TransferKernel {
 public:
  explicit SwapOutOp(OpKernelConstruction* ctx) : TransferKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_swap_ins", &num_swap_ins_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    if (label_.empty()) label_ = name();
    delta_ns_ = DeltaNs(ctx);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor in = ctx->input(0);
    OP_REQUIRES_ASYNC(
        ctx, tensorflow::DataTypeCanUseMemcpy(in.dtype()),
        absl::InvalidArgumentError("TensileSwapOut '" + label_ + "': dtype " +
                                   tensorflow::DataTypeString(in.dtype()) +
                                   " cannot be copied byte for byte"),
        done);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out),
                         done);
    const int64_t handle = NewHostHandle();
    out->scalar<int64_t>()() = handle;
    StartSwapOut(std::move(in), handle, num_swap_ins_, label_, StreamForStep(ctx->step_id()),
                 SwapChannel::NowNs() + delta_ns_, Finish(ctx, std::move(done)));
  }

 private:
  int num_swap_ins_ = 1;
  int64_t delta_ns_ = 0;
  std::string label_;
};

class SwapInOp : public TransferKernel {
 public:
  explicit SwapInOp(OpKernelConstruction* ctx) : TransferKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("event", &event_));
    if (label_.empty()) label_ = name();
    delta_ns_ = DeltaNs(ctx);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int64_t handle = ctx->input(0).scalar<int64_t>()();
    const int64_t step = ctx->step_id();
    SwapInStarted(step, event_);
    const std::string event = event_;
    auto finish = Finish(ctx, std::move(done));
    StartSwapIn(ctx, handle, dtype_, &name() /* the kernel outlives the call */, label_,
                SwapChannel::NowNs() + delta_ns_,
                [step, event, finish = std::move(finish)](const absl::Status& s) {
                  SwapInDone(step, event);
                  finish(s);
                });
  }

 private:
  DataType dtype_;
  int64_t delta_ns_ = 0;
  std::string label_;
  std::string event_;
};

class SwapCheckOp : public OpKernel {
 public:
  explicit SwapCheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("event", &event_));
  }
  bool IsExpensive() override { return false; }  // Note [Swap ops run inline]
  void Compute(OpKernelContext* ctx) override {
    GetSwapChannel().RecordLateness(ProbeSwapIn(ctx->step_id(), event_));
  }

 private:
  std::string event_;
};

class VarSwapOutOp : public TransferKernel {
 public:
  explicit VarSwapOutOp(OpKernelConstruction* ctx) : TransferKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("copy", &copy_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    delta_ns_ = DeltaNs(ctx);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const tensorflow::ResourceHandle& h = tensorflow::HandleFromInput(ctx, 0);
    tensorflow::core::RefCountPtr<Var> ref;
    OP_REQUIRES_OK_ASYNC(ctx, tensorflow::LookupResource(ctx, h, &ref), done);
    StartVarSwapOut(ref.release(), VarKey(h), label_.empty() ? h.name() : label_, copy_,
                    StreamForStep(ctx->step_id()), SwapChannel::NowNs() + delta_ns_,
                    Finish(ctx, std::move(done)));
  }

 private:
  bool copy_ = true;
  int64_t delta_ns_ = 0;
  std::string label_;
};

class VarSwapInOp : public TransferKernel {
 public:
  explicit VarSwapInOp(OpKernelConstruction* ctx) : TransferKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_host", &keep_host_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    delta_ns_ = DeltaNs(ctx);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const tensorflow::ResourceHandle& h = tensorflow::HandleFromInput(ctx, 0);
    tensorflow::core::RefCountPtr<Var> ref;
    OP_REQUIRES_OK_ASYNC(ctx, tensorflow::LookupResource(ctx, h, &ref), done);
    StartVarSwapIn(ctx, ref.release(), VarKey(h), keep_host_, &name(), StreamForStep(ctx->step_id()),
                   SwapChannel::NowNs() + delta_ns_, Finish(ctx, std::move(done)));
  }

 private:
  bool keep_host_ = false;
  int64_t delta_ns_ = 0;
  std::string label_;
};

class RecomputeGateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  bool IsExpensive() override { return false; }  // Note [Swap ops run inline]
  void Compute(OpKernelContext* ctx) override {
    for (int i = 0; i < ctx->num_inputs(); ++i) ctx->set_output(i, ctx->input(i));
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TensileSwapOut").Device(tensorflow::DEVICE_CPU), SwapOutOp);
REGISTER_KERNEL_BUILDER(Name("TensileSwapIn").Device(tensorflow::DEVICE_CPU), SwapInOp);
REGISTER_KERNEL_BUILDER(Name("TensileSwapCheck").Device(tensorflow::DEVICE_CPU), SwapCheckOp);
REGISTER_KERNEL_BUILDER(Name("TensileVarSwapOut").Device(tensorflow::DEVICE_CPU), VarSwapOutOp);
REGISTER_KERNEL_BUILDER(Name("TensileVarSwapIn").Device(tensorflow::DEVICE_CPU), VarSwapInOp);
REGISTER_KERNEL_BUILDER(Name("TensileRecomputeGate").Device(tensorflow::DEVICE_CPU), RecomputeGateOp);

}  // namespace tensile
