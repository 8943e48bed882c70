// TensileBindStep: binds the running step's TensorFlow step id to a job's
// pool stream, so the allocator attributes the step's allocations to the job
// (device_pool.h). A job's train step runs it before its other ops.
//
// Stateful so that Grappler neither prunes nor constant-folds it.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tf_plugin/allocator/device_pool.h"

namespace tensile {

REGISTER_OP("TensileBindStep")
    .Attr("stream: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Binds this step's id to pool stream `stream` (a job registered with the
device pool), attributing the step's allocations to that job.
)doc");

class TensileBindStepOp : public tensorflow::OpKernel {
 public:
  explicit TensileBindStepOp(tensorflow::OpKernelConstruction* ctx)
      : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stream", &stream_));
  }
  void Compute(tensorflow::OpKernelContext* ctx) override {
    BindStepToStream(ctx->step_id(), static_cast<StreamId>(stream_));
  }

 private:
  tensorflow::int64 stream_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TensileBindStep").Device(tensorflow::DEVICE_CPU),
                        TensileBindStepOp);

}  // namespace tensile
