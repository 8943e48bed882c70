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
#include "tf_plugin/swap/host_copy.h"
#include "tf_plugin/swap/host_store.h"
#include "tf_plugin/swap/swap_channel.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"

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

std::atomic<int64_t> g_next_handle{1};

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

std::string VarKey(const tensorflow::ResourceHandle& h) {
  return h.container() + "/" + h.name();
}

// The four swap kernels: each starts a transfer on the SwapChannel and
// completes when it is done. Starting one is cheap (Note [Swap ops run
// inline]).
class TransferKernel : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  bool IsExpensive() override { return false; }
};

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
    const int64_t handle = g_next_handle.fetch_add(1);
    out->scalar<int64_t>()() = handle;
    const StreamId stream = StreamForStep(ctx->step_id());
    auto status = std::make_shared<absl::Status>();
    SwapChannel::Transfer t;
    t.kind = TransferKind::kSwapOut;
    t.not_before_ns = SwapChannel::NowNs() + delta_ns_;
    t.stream = stream;
    const int refs = num_swap_ins_;
    const std::string label = label_;
    t.work = [in, handle, stream, refs, label, status]() mutable -> int64_t {
      const size_t bytes = in.TotalBytes();
      std::string error;
      std::shared_ptr<HostEntry> e = GetHostStore().Reserve(bytes, label, &error);
      if (e == nullptr) {
        *status = absl::ResourceExhaustedError(error);
        in = Tensor();
        return 0;
      }
      if (bytes > 0) CopyToHost(e->data.get(), in.tensor_data().data(), bytes);  // Note [Swap-outs bypass the cache]
      e->dtype = static_cast<int>(in.dtype());
      for (int d = 0; d < in.dims(); ++d) e->shape.push_back(in.dim_size(d));
      e->refs = refs;
      e->stream = stream;
      GetHostStore().Insert(handle, std::move(e));
      in = Tensor();  // our reference to the device copy goes now
      return static_cast<int64_t>(bytes);
    };
    t.done = [ctx, status, done]() {
      if (!status->ok()) ctx->SetStatus(*status);
      done();
    };
    GetSwapChannel().Submit(std::move(t));
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
    auto status = std::make_shared<absl::Status>();
    SwapChannel::Transfer t;
    t.kind = TransferKind::kSwapIn;
    t.not_before_ns = SwapChannel::NowNs() + delta_ns_;
    t.stream = StreamForStep(ctx->step_id());
    const std::string* op_name = &name();  // the kernel outlives the call
    const DataType dtype = dtype_;
    const std::string label = label_;
    t.work = [ctx, handle, step, op_name, dtype, label, status]() -> int64_t {
      // Attribute the pool allocation to this op and step (the executor's
      // annotation lives on its own thread, not ours).
      tsl::profiler::ScopedMemoryDebugAnnotation annotation(*op_name, step);
      std::shared_ptr<HostEntry> e = GetHostStore().Acquire(handle);
      if (e == nullptr) {
        *status = absl::InternalError(
            "TensileSwapIn '" + label + "': no host copy for handle " +
            std::to_string(handle) +
            " (its swap-out failed, or more swap-ins read it than planned)");
        return 0;
      }
      if (static_cast<int>(dtype) != e->dtype) {
        *status = absl::InternalError("TensileSwapIn '" + label +
                                      "': dtype differs from the swapped-out tensor");
        return 0;
      }
      TensorShape shape;
      for (int64_t d : e->shape) shape.AddDim(d);
      Tensor* out = nullptr;
      absl::Status s = ctx->allocate_output(0, shape, &out);
      if (!s.ok()) {
        *status = s;
        return 0;
      }
      if (e->bytes > 0) std::memcpy(const_cast<char*>(out->tensor_data().data()),
                                    e->data.get(), e->bytes);
      return static_cast<int64_t>(e->bytes);
    };
    const std::string event = event_;
    t.done = [ctx, status, done, step, event]() {
      SwapInDone(step, event);
      if (!status->ok()) ctx->SetStatus(*status);
      done();
    };
    GetSwapChannel().Submit(std::move(t));
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
    Var* var = ref.release();  // unreffed by the transfer
    const std::string key = VarKey(h);
    const std::string label = label_.empty() ? h.name() : label_;
    const bool copy = copy_;
    const StreamId stream = StreamForStep(ctx->step_id());
    auto status = std::make_shared<absl::Status>();
    SwapChannel::Transfer t;
    t.kind = TransferKind::kSwapOut;
    t.not_before_ns = SwapChannel::NowNs() + delta_ns_;
    t.stream = stream;
    t.work = [var, key, label, copy, stream, status]() -> int64_t {
      int64_t moved = 0;
      Tensor old;  // freed after the lock is dropped
      {
        tensorflow::mutex_lock lock(*var->mu());
        Tensor* cur = var->tensor();
        const bool resident = var->is_initialized && cur->IsInitialized() &&
                              !(cur->NumElements() == 0 && GetHostStore().HasVariable(key));
        if (resident) {
          if (copy || !GetHostStore().HasVariable(key)) {
            const size_t bytes = cur->TotalBytes();
            std::string error;
            std::shared_ptr<HostEntry> e = GetHostStore().Reserve(bytes, label, &error);
            if (e == nullptr) {
              *status = absl::ResourceExhaustedError(error);
            } else {
              if (bytes > 0) CopyToHost(e->data.get(), cur->tensor_data().data(), bytes);
              e->dtype = static_cast<int>(cur->dtype());
              for (int d = 0; d < cur->dims(); ++d) e->shape.push_back(cur->dim_size(d));
              e->stream = stream;
              GetHostStore().PutVariable(key, std::move(e));
              moved = static_cast<int64_t>(bytes);
            }
          }
          if (status->ok()) {
            old = *cur;
            *cur = Tensor(cur->dtype(), TensorShape({0}));
          }
        }
      }
      var->Unref();
      return moved;
    };
    t.done = [ctx, status, done]() {
      if (!status->ok()) ctx->SetStatus(*status);
      done();
    };
    GetSwapChannel().Submit(std::move(t));
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
    Var* var = ref.release();
    const std::string key = VarKey(h);
    const bool keep = keep_host_;
    const int64_t step = ctx->step_id();
    const std::string* op_name = &name();
    auto status = std::make_shared<absl::Status>();
    SwapChannel::Transfer t;
    t.kind = TransferKind::kSwapIn;
    t.not_before_ns = SwapChannel::NowNs() + delta_ns_;
    t.stream = StreamForStep(ctx->step_id());
    t.work = [ctx, var, key, keep, step, op_name, status]() -> int64_t {
      tsl::profiler::ScopedMemoryDebugAnnotation annotation(*op_name, step);
      int64_t moved = 0;
      {
        tensorflow::mutex_lock lock(*var->mu());
        Tensor* cur = var->tensor();
        std::shared_ptr<HostEntry> e = GetHostStore().GetVariable(key);
        if (e != nullptr && cur->NumElements() == 0) {
          TensorShape shape;
          for (int64_t d : e->shape) shape.AddDim(d);
          if (shape.num_elements() == 0) {
            *cur = Tensor(static_cast<DataType>(e->dtype), shape);
          } else {
            Tensor fresh;
            absl::Status s = ctx->allocate_temp(static_cast<DataType>(e->dtype), shape, &fresh);
            if (!s.ok()) {
              *status = s;
            } else {
              std::memcpy(const_cast<char*>(fresh.tensor_data().data()), e->data.get(), e->bytes);
              *cur = fresh;
              moved = static_cast<int64_t>(e->bytes);
            }
          }
          if (status->ok() && !keep) GetHostStore().DropVariable(key);
        }
      }
      var->Unref();
      return moved;
    };
    t.done = [ctx, status, done]() {
      if (!status->ok()) ctx->SetStatus(*status);
      done();
    };
    GetSwapChannel().Submit(std::move(t));
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
