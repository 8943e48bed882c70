// The transfers of transfers.h. Moved here from swap_ops.cc unchanged in
// what they copy, allocate and account, so that the plan table's slots run
// the very same transfers as a rewritten plan.
#include "tf_plugin/swap/transfers.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <utility>

#include "tensorflow/core/framework/tensor_shape.h"
#include "tf_plugin/swap/host_copy.h"
#include "tf_plugin/swap/host_store.h"
#include "tf_plugin/swap/swap_channel.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"

namespace tensile {

using tensorflow::DataType;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;

namespace {
std::atomic<int64_t> g_next_handle{1};

// Submits `work` (which sets *status on failure) to the channel; `done(status)` after it.
void Submit(TransferKind kind, StreamId stream, int64_t not_before_ns, std::shared_ptr<absl::Status> status,
            std::function<int64_t()> work, TransferDone done) {
  SwapChannel::Transfer t;
  t.kind = kind;
  t.not_before_ns = not_before_ns;
  t.stream = stream;
  t.work = std::move(work);
  t.done = [status, done = std::move(done)]() { done(*status); };
  GetSwapChannel().Submit(std::move(t));
}
}  // namespace

int64_t NewHostHandle() { return g_next_handle.fetch_add(1); }

std::string VarKey(const tensorflow::ResourceHandle& h) { return h.container() + "/" + h.name(); }

void StartSwapOut(Tensor in, int64_t handle, int refs, const std::string& label, StreamId stream,
                  int64_t not_before_ns, TransferDone done) {
  auto status = std::make_shared<absl::Status>();
  auto work = [in, handle, stream, refs, label, status]() mutable -> int64_t {
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
  Submit(TransferKind::kSwapOut, stream, not_before_ns, status, std::move(work), std::move(done));
}

void StartSwapIn(OpKernelContext* ctx, int64_t handle, DataType dtype, const std::string* op_name,
                 const std::string& label, int64_t not_before_ns, TransferDone done) {
  const int64_t step = ctx->step_id();
  auto status = std::make_shared<absl::Status>();
  auto work = [ctx, handle, step, op_name, dtype, label, status]() -> int64_t {
    // Attribute the pool allocation to this op and step (the executor's
    // annotation lives on its own thread, not ours).
    tsl::profiler::ScopedMemoryDebugAnnotation annotation(*op_name, step);
    std::shared_ptr<HostEntry> e = GetHostStore().Acquire(handle);
    if (e == nullptr) {
      *status = absl::InternalError(
          "swap-in '" + label + "': no host copy for handle " + std::to_string(handle) +
          " (its swap-out failed, or more swap-ins read it than planned)");
      return 0;
    }
    if (static_cast<int>(dtype) != e->dtype) {
      *status = absl::InternalError("swap-in '" + label + "': dtype differs from the swapped-out tensor");
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
    if (e->bytes > 0) std::memcpy(const_cast<char*>(out->tensor_data().data()), e->data.get(), e->bytes);
    return static_cast<int64_t>(e->bytes);
  };
  Submit(TransferKind::kSwapIn, StreamForStep(step), not_before_ns, status, std::move(work), std::move(done));
}

void StartVarSwapOut(Var* var, const std::string& key, const std::string& label, bool copy, StreamId stream,
                     int64_t not_before_ns, TransferDone done) {
  auto status = std::make_shared<absl::Status>();
  auto work = [var, key, label, copy, stream, status]() -> int64_t {
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
  Submit(TransferKind::kSwapOut, stream, not_before_ns, status, std::move(work), std::move(done));
}

void StartVarSwapIn(OpKernelContext* ctx, Var* var, const std::string& key, bool keep_host,
                    const std::string* op_name, StreamId stream, int64_t not_before_ns, TransferDone done) {
  const int64_t step = ctx->step_id();
  auto status = std::make_shared<absl::Status>();
  auto work = [ctx, var, key, keep_host, step, op_name, status]() -> int64_t {
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
        if (status->ok() && !keep_host) GetHostStore().DropVariable(key);
      }
    }
    var->Unref();
    return moved;
  };
  Submit(TransferKind::kSwapIn, stream, not_before_ns, status, std::move(work), std::move(done));
}

}  // namespace tensile
