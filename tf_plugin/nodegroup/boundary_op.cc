// TensileNodeGroupBarrier: a job's touch point with the CounterBarriers at
// one node-group boundary (counter_barrier.h). The graph rewrite
// (tf_plugin/nodegroup/rewrite.py) gives it control inputs from the leaf
// nodes of group `boundary - 1` and control outputs to the root nodes of
// group `boundary`.
//
// An AsyncOpKernel that never blocks its thread (Note [Never block a
// TensorFlow thread]); stateful so that Grappler neither prunes, dedups nor
// constant-folds it. A wait honours the step's cancellation: a cancelled
// step's waiter fails with CANCELLED; a timed-out one with
// DEADLINE_EXCEEDED, naming the barrier and the jobs it waited for.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tf_plugin/nodegroup/counter_barrier.h"

namespace tensile {
namespace nodegroup {

REGISTER_OP("TensileNodeGroupBarrier")
    .Attr("job: int")
    .Attr("boundary: int")
    .Attr("num_groups: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Node-group boundary `boundary` (0..num_groups) of job `job` (its pool stream):
arrives at the CounterBarrier after the pair of group boundary-1 and waits at
the one before the pair of group `boundary` (Waterwave, seed 004 §4.3).
)doc");

namespace {

absl::Status ToStatus(const Outcome& o) {
  switch (o.code) {
    case Code::kOk: return absl::OkStatus();
    case Code::kCancelled: return absl::CancelledError(o.message);
    case Code::kDeadlineExceeded: return absl::DeadlineExceededError(o.message);
    case Code::kInvalidArgument: return absl::InvalidArgumentError(o.message);
    case Code::kAborted: return absl::AbortedError(o.message);
  }
  return absl::UnknownError(o.message);
}

}  // namespace

class NodeGroupBarrierOp : public tensorflow::AsyncOpKernel {
 public:
  explicit NodeGroupBarrierOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    tensorflow::int64 job = 0, boundary = 0, num_groups = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &job));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("boundary", &boundary));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_groups", &num_groups));
    job_ = static_cast<JobKey>(job);
    boundary_ = static_cast<int>(boundary);
    num_groups_ = static_cast<int>(num_groups);
  }

  // Arriving is cheap, so the executor runs this op inline, the moment the
  // group's leaves are done, instead of queueing it on the inter-op pool
  // behind other jobs' compute (an AsyncOpKernel is "expensive" for ever;
  // Note [Swap ops run inline] in tf_plugin/swap/swap_ops.cc).
  bool IsExpensive() override { return false; }

  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    NodeGroupPipeline& pipeline = DevicePipeline();
    const uint64_t id = pipeline.NewWaiterId();
    tensorflow::CancellationManager* cm = ctx->cancellation_manager();
    tensorflow::CancellationToken token = tensorflow::CancellationManager::kInvalidToken;
    if (cm != nullptr) {
      token = cm->get_cancellation_token();
      // Registered before Boundary can park the waiter, so no cancel is missed.
      if (!cm->RegisterCallback(token, [id] { DevicePipeline().Cancel(id); })) {
        pipeline.Cancel(id);  // already cancelled: Boundary reports it
        token = tensorflow::CancellationManager::kInvalidToken;
      }
    }
    pipeline.Boundary(id, job_, boundary_, num_groups_,
                      [ctx, cm, token, done = std::move(done)](const Outcome& o) {
                        if (cm != nullptr && token != tensorflow::CancellationManager::kInvalidToken) {
                          cm->TryDeregisterCallback(token);
                        }
                        if (!o.ok()) ctx->SetStatus(ToStatus(o));
                        done();
                      });
  }

 private:
  JobKey job_ = 0;
  int boundary_ = 0;
  int num_groups_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TensileNodeGroupBarrier").Device(tensorflow::DEVICE_CPU),
                        NodeGroupBarrierOp);

}  // namespace nodegroup
}  // namespace tensile
