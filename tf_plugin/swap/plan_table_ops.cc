// The plan table's ops and kernels: Note [Plans read at run time] in
// plan_table.h is the spec.
//
//   TensileOpTick()                          op `index` of the step is done
//   TensileSwapSlotOut(version) -> handle    an activation slot's swap-out side
//   TensileSwapSlotIn(handle) -> version     its swap-in side
//   TensileVarSlotOut(resource)              a variable slot's swap-out
//   TensileVarSlotIn(resource)               its swap-in
//
// All stateful (Grappler keeps them) and inline (Note [Swap ops run inline]
// in swap_ops.cc). Every slot names its table and its index in the plan.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_plugin/allocator/device_pool.h"
#include "tf_plugin/swap/plan_table.h"
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

REGISTER_OP("TensileOpTick")
    .Attr("table: string")
    .Attr("index: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Op `index` of the step (plan order) is done: wakes the slots waiting for it.");

REGISTER_OP("TensileSwapSlotOut")
    .Input("tensor: T")
    .Output("handle: int64")
    .Attr("T: type")
    .Attr("table: string")
    .Attr("slot: int")
    .Attr("chain: int")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("The swap-out side of activation slot `slot`: holds `tensor` (inactive) or copies it out.");

REGISTER_OP("TensileSwapSlotIn")
    .Input("handle: int64")
    .Output("tensor: T")
    .Attr("T: type")
    .Attr("shape: shape")
    .Attr("table: string")
    .Attr("slot: int")
    .Attr("chain: int")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("The swap-in side of activation slot `slot`: passes the tensor on, or copies it back.");

REGISTER_OP("TensileVarSlotOut")
    .Input("resource: resource")
    .Attr("table: string")
    .Attr("slot: int")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Variable slot `slot`'s swap-out (TensileVarSwapOut when active).");

REGISTER_OP("TensileVarSlotIn")
    .Input("resource: resource")
    .Attr("table: string")
    .Attr("slot: int")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Variable slot `slot`'s swap-in (TensileVarSwapIn when active).");

namespace {

using Fire = std::function<void(bool ok)>;

struct Waiter {
  uint64_t id;
  Fire fire;
};

struct StepState;

// What a new step retires (policy 4): the old step's waiters, fired
// cancelled, and its state, whose held tensors are freed; both after the
// table's lock is released (a freed buffer goes back to the pool).
struct Retired {
  std::vector<Waiter> waiters;
  std::unique_ptr<StepState> state;
};

// What one step of a table holds (policy 1, 2, 3).
struct StepState {
  int64_t step_id = 0;
  std::shared_ptr<const std::vector<SlotPlan>> plan;
  int64_t reached = -1;                           // the highest tick run
  std::multimap<int64_t, Waiter> waiters;         // by tick
  std::unordered_map<int64_t, Tensor> held;       // slot -> the tensor an inactive slot passes on
  std::unordered_map<int64_t, int64_t> host;      // chain -> handle of its current host copy
};

class PlanTable {
 public:
  // The plan slot `slot` follows in step `step_id` (inactive beyond the plan).
  SlotPlan Entry(int64_t step_id, int64_t slot) {
    Retired retired;
    SlotPlan e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      e = EntryLocked(StepLocked(step_id, &retired), slot);
    }
    Cancel(retired);
    return e;
  }

  void Hold(int64_t step_id, int64_t slot, const Tensor& t) {
    Retired retired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepLocked(step_id, &retired)->held[slot] = t;
    }
    Cancel(retired);
  }

  bool Take(int64_t step_id, int64_t slot, Tensor* out) {
    Retired retired;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepState* s = StepLocked(step_id, &retired);
      auto it = s->held.find(slot);
      if (it != s->held.end()) {
        *out = std::move(it->second);
        s->held.erase(it);
        found = true;
      }
    }
    Cancel(retired);
    return found;
  }

  void SetHost(int64_t step_id, int64_t chain, int64_t handle) {
    Retired retired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepLocked(step_id, &retired)->host[chain] = handle;
    }
    Cancel(retired);
  }

  int64_t Host(int64_t step_id, int64_t chain) {
    Retired retired;
    int64_t handle = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepState* s = StepLocked(step_id, &retired);
      auto it = s->host.find(chain);
      if (it != s->host.end()) handle = it->second;
    }
    Cancel(retired);
    return handle;
  }

  // Tick `index` of step `step_id` ran: fires the waiters due.
  void Tick(int64_t step_id, int64_t index) {
    Retired retired;
    std::vector<Waiter> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepState* s = StepLocked(step_id, &retired);
      if (index > s->reached) s->reached = index;
      auto end = s->waiters.upper_bound(index);
      for (auto it = s->waiters.begin(); it != end; ++it) due.push_back(std::move(it->second));
      s->waiters.erase(s->waiters.begin(), end);
    }
    Cancel(retired);
    for (Waiter& w : due) w.fire(true);
  }

  // Runs `fire(true)` once tick `index` of the step has run (at once if it
  // has, or for -1), `fire(false)` if the step is cancelled first.
  void AfterTick(OpKernelContext* ctx, int64_t index, Fire fire) {
    if (index < 0) {
      fire(true);
      return;
    }
    tensorflow::CancellationManager* cm = ctx->cancellation_manager();
    const uint64_t id = next_waiter_.fetch_add(1);
    const int64_t step_id = ctx->step_id();
    auto token = std::make_shared<tensorflow::CancellationToken>(tensorflow::CancellationManager::kInvalidToken);
    auto once = std::make_shared<std::atomic<bool>>(false);
    Fire wrapped = [fire = std::move(fire), cm, once, token](bool ok) mutable {
      if (once->exchange(true)) return;
      if (cm != nullptr && *token != tensorflow::CancellationManager::kInvalidToken) {
        cm->TryDeregisterCallback(*token);  // never blocks, also from inside the callback
      }
      fire(ok);
    };
    if (cm != nullptr) {  // registered before the waiter is parked, so no cancellation is missed
      *token = cm->get_cancellation_token();
      if (!cm->RegisterCallback(*token, [this, id, step_id] { CancelWaiter(step_id, id); })) {
        *token = tensorflow::CancellationManager::kInvalidToken;
        wrapped(false);  // cancelled already
        return;
      }
    }
    Retired retired;
    bool now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StepState* s = StepLocked(step_id, &retired);
      if (s->reached >= index) {
        now = true;
      } else {
        s->waiters.emplace(index, Waiter{id, wrapped});
        ++stats_.waits;
      }
    }
    Cancel(retired);
    if (now) {
      wrapped(true);
    } else if (cm != nullptr && (cm->IsCancelling() || cm->IsCancelled())) {
      // The callback may have run before the waiter was parked. StartCancel
      // sets "cancelled" only after every callback ran, and "cancelling"
      // before: tested in this order, one of the two is seen.
      CancelWaiter(step_id, id);
    }
  }

  void Count(bool active, bool copied, bool swap_in) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active) {
      ++stats_.passed;
    } else if (swap_in) {
      ++stats_.swap_ins;
    } else if (copied) {
      ++stats_.swap_outs;
    } else {
      ++stats_.host_reuses;
    }
  }

  void Set(std::vector<SlotPlan> slots, int64_t generation) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.slots = static_cast<int64_t>(slots.size());
    stats_.generation = generation;
    plan_ = std::make_shared<const std::vector<SlotPlan>>(std::move(slots));
  }

  PlanTableStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  int64_t DropStep() {
    std::unique_ptr<StepState> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = std::move(step_);
    }
    if (gone == nullptr) return 0;
    const int64_t held = static_cast<int64_t>(gone->held.size());
    Retired retired;
    for (auto& [tick, w] : gone->waiters) retired.waiters.push_back(std::move(w));
    retired.state = std::move(gone);
    Cancel(retired);
    return held;
  }

 private:
  void CancelWaiter(int64_t step_id, uint64_t id) {
    Fire fire;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (step_ == nullptr || step_->step_id != step_id) return;  // fired with its step already
      for (auto it = step_->waiters.begin(); it != step_->waiters.end(); ++it) {
        if (it->second.id == id) {
          fire = std::move(it->second.fire);
          step_->waiters.erase(it);
          ++stats_.cancelled;
          break;
        }
      }
    }
    if (fire) fire(false);
  }

  // Outside the lock: fires the retired waiters cancelled and frees the retired state.
  void Cancel(Retired& retired) {
    if (!retired.waiters.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.cancelled += static_cast<int64_t>(retired.waiters.size());
      }
      for (Waiter& w : retired.waiters) w.fire(false);
      retired.waiters.clear();
    }
    retired.state.reset();
  }

  // Policy 1 and 4: the state of `step_id`, a new one (with the current
  // plan) if another step's is there; that step goes to `retired`.
  StepState* StepLocked(int64_t step_id, Retired* retired) {
    if (step_ != nullptr && step_->step_id == step_id) return step_.get();
    if (step_ != nullptr) {
      for (auto& [tick, w] : step_->waiters) retired->waiters.push_back(std::move(w));
      retired->state = std::move(step_);
    }
    step_ = std::make_unique<StepState>();
    step_->step_id = step_id;
    step_->plan = plan_;
    ++stats_.steps;
    stats_.last_step_generation = stats_.generation;
    return step_.get();
  }

  static SlotPlan EntryLocked(StepState* s, int64_t slot) {
    if (s->plan == nullptr || slot < 0 || slot >= static_cast<int64_t>(s->plan->size())) return SlotPlan();
    return (*s->plan)[slot];
  }

  std::mutex mu_;
  std::shared_ptr<const std::vector<SlotPlan>> plan_;
  std::unique_ptr<StepState> step_;
  PlanTableStats stats_;
  std::atomic<uint64_t> next_waiter_{1};
};

std::mutex g_tables_mu;
std::map<std::string, std::shared_ptr<PlanTable>>& Tables() {
  static auto* tables = new std::map<std::string, std::shared_ptr<PlanTable>>();
  return *tables;
}

// A table lives while its name is known (ForgetPlanTable drops the name)
// or a kernel of its step holds it.
std::shared_ptr<PlanTable> TableNamed(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_tables_mu);
  auto& slot = Tables()[name];
  if (slot == nullptr) slot = std::make_shared<PlanTable>();
  return slot;
}

class SlotKernel : public AsyncOpKernel {
 public:
  explicit SlotKernel(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    std::string table;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table", &table));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    if (label_.empty()) label_ = name();
    table_ = TableNamed(table);
  }
  bool IsExpensive() override { return false; }  // Note [Swap ops run inline]

 protected:
  SlotPlan Entry(OpKernelContext* ctx) { return table_->Entry(ctx->step_id(), slot_); }

  static TransferDone Finish(OpKernelContext* ctx, DoneCallback done) {
    return [ctx, done = std::move(done)](const absl::Status& s) {
      if (!s.ok()) ctx->SetStatus(s);
      done();
    };
  }

  // `start` once tick `index` has run; the op fails CANCELLED if the step is cancelled first.
  void AfterTick(OpKernelContext* ctx, int64_t index, DoneCallback done, std::function<void(DoneCallback)> start) {
    const std::string label = label_;
    table_->AfterTick(ctx, index, [ctx, label, done = std::move(done), start = std::move(start)](bool ok) mutable {
      if (!ok) {
        ctx->SetStatus(absl::CancelledError("swap slot '" + label + "': its step was cancelled while it waited"));
        done();
        return;
      }
      start(std::move(done));
    });
  }

  std::shared_ptr<PlanTable> table_;
  int64_t slot_ = 0;
  std::string label_;
};

class OpTickOp : public OpKernel {
 public:
  explicit OpTickOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string table;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table", &table));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("index", &index_));
    table_ = TableNamed(table);
  }
  bool IsExpensive() override { return false; }
  void Compute(OpKernelContext* ctx) override { table_->Tick(ctx->step_id(), index_); }

 private:
  std::shared_ptr<PlanTable> table_;
  int64_t index_ = 0;
};

class SwapSlotOutOp : public SlotKernel {
 public:
  explicit SwapSlotOutOp(OpKernelConstruction* ctx) : SlotKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor in = ctx->input(0);
    Tensor* handle_out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &handle_out), done);
    handle_out->scalar<int64_t>()() = slot_;
    const SlotPlan e = Entry(ctx);
    OP_REQUIRES_ASYNC(ctx, !e.active || !e.copy_out || tensorflow::DataTypeCanUseMemcpy(in.dtype()),
                      absl::InvalidArgumentError("swap slot '" + label_ + "': dtype " +
                                                 tensorflow::DataTypeString(in.dtype()) +
                                                 " cannot be copied byte for byte"),
                      done);
    table_->Count(e.active, e.copy_out, false);
    if (!e.active) {
      table_->Hold(ctx->step_id(), slot_, in);  // policy 2
      done();
      return;
    }
    if (!e.copy_out) {  // policy 3: the earlier slot's host copy serves; our reference goes now
      done();
      return;
    }
    const int64_t handle = NewHostHandle();
    table_->SetHost(ctx->step_id(), chain_, handle);
    const std::string label = label_;
    const StreamId stream = StreamForStep(ctx->step_id());
    AfterTick(ctx, e.out_tick, std::move(done), [ctx, in, handle, e, label, stream](DoneCallback done) mutable {
      StartSwapOut(std::move(in), handle, e.host_reads, label, stream, SwapChannel::NowNs() + e.out_delta_ns,
                   Finish(ctx, std::move(done)));
    });
  }

 private:
  int64_t chain_ = 0;
};

class SwapSlotInOp : public SlotKernel {
 public:
  explicit SwapSlotInOp(OpKernelConstruction* ctx) : SlotKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const SlotPlan e = Entry(ctx);
    table_->Count(e.active, e.copy_out, true);
    if (!e.active) {
      Tensor t;
      OP_REQUIRES_ASYNC(ctx, table_->Take(ctx->step_id(), slot_, &t),
                        absl::InternalError("swap slot '" + label_ + "': its swap-out held no tensor"), done);
      ctx->set_output(0, t);
      done();
      return;
    }
    const int64_t handle = table_->Host(ctx->step_id(), chain_);
    OP_REQUIRES_ASYNC(ctx, handle >= 0,
                      absl::InternalError("swap slot '" + label_ + "': no host copy of its tensor in this step "
                                          "(the plan table reuses a copy no earlier slot made)"),
                      done);
    const DataType dtype = dtype_;
    const std::string* op_name = &name();
    const std::string label = label_;
    AfterTick(ctx, e.in_tick, std::move(done), [ctx, handle, dtype, op_name, label, e](DoneCallback done) {
      StartSwapIn(ctx, handle, dtype, op_name, label, SwapChannel::NowNs() + e.in_delta_ns,
                  Finish(ctx, std::move(done)));
    });
  }

 private:
  DataType dtype_;
  int64_t chain_ = 0;
};

// A variable slot's two sides (kIn: the swap-in): the transfers of
// TensileVarSwapOut (copy always) and TensileVarSwapIn, when active.
template <bool kIn>
class VarSlotOp : public SlotKernel {
 public:
  using SlotKernel::SlotKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const SlotPlan e = Entry(ctx);
    table_->Count(e.active, true, kIn);
    if (!e.active) {
      done();
      return;
    }
    const tensorflow::ResourceHandle& h = tensorflow::HandleFromInput(ctx, 0);
    tensorflow::core::RefCountPtr<Var> ref;
    OP_REQUIRES_OK_ASYNC(ctx, tensorflow::LookupResource(ctx, h, &ref), done);
    Var* var = ref.release();
    const std::string key = VarKey(h), label = label_;
    const std::string* op_name = &name();
    const StreamId stream = StreamForStep(ctx->step_id());
    AfterTick(ctx, kIn ? e.in_tick : e.out_tick, std::move(done),
              [ctx, var, key, label, op_name, stream, e](DoneCallback done) {
                if (kIn) {
                  StartVarSwapIn(ctx, var, key, /*keep_host=*/false, op_name, stream,
                                 SwapChannel::NowNs() + e.in_delta_ns, Finish(ctx, std::move(done)));
                } else {
                  StartVarSwapOut(var, key, label, /*copy=*/true, stream, SwapChannel::NowNs() + e.out_delta_ns,
                                  Finish(ctx, std::move(done)));
                }
              });
  }
};

}  // namespace

void SetPlanTable(const std::string& table, std::vector<SlotPlan> slots, int64_t generation) {
  TableNamed(table)->Set(std::move(slots), generation);
}

// The table of that name, or null: a lookup that makes no table (a name forgotten stays forgotten).
std::shared_ptr<PlanTable> FindTable(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_tables_mu);
  auto it = Tables().find(name);
  return it == Tables().end() ? nullptr : it->second;
}

PlanTableStats GetPlanTableStats(const std::string& table) {
  const std::shared_ptr<PlanTable> t = FindTable(table);
  return t == nullptr ? PlanTableStats() : t->Stats();
}

int64_t DropPlanTableStep(const std::string& table) {
  const std::shared_ptr<PlanTable> t = FindTable(table);
  return t == nullptr ? 0 : t->DropStep();
}

bool ForgetPlanTable(const std::string& table) {
  std::shared_ptr<PlanTable> gone;  // freed outside the lock, if no kernel holds it
  std::lock_guard<std::mutex> lock(g_tables_mu);
  auto it = Tables().find(table);
  if (it == Tables().end()) return false;
  gone = std::move(it->second);
  Tables().erase(it);
  return true;
}

int64_t PlanTablesKnown() {
  std::lock_guard<std::mutex> lock(g_tables_mu);
  return static_cast<int64_t>(Tables().size());
}

REGISTER_KERNEL_BUILDER(Name("TensileOpTick").Device(tensorflow::DEVICE_CPU), OpTickOp);
REGISTER_KERNEL_BUILDER(Name("TensileSwapSlotOut").Device(tensorflow::DEVICE_CPU), SwapSlotOutOp);
REGISTER_KERNEL_BUILDER(Name("TensileSwapSlotIn").Device(tensorflow::DEVICE_CPU), SwapSlotInOp);
REGISTER_KERNEL_BUILDER(Name("TensileVarSlotOut").Device(tensorflow::DEVICE_CPU), VarSlotOp<false>);
REGISTER_KERNEL_BUILDER(Name("TensileVarSlotIn").Device(tensorflow::DEVICE_CPU), VarSlotOp<true>);

}  // namespace tensile
