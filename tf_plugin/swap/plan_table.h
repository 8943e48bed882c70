// The plan table: a planned step's swaps read at run time, so that a
// re-plan that only moves swaps is a table write, not a rewrite of the step
// (issue 43: "re-plans users do not feel").
//
// Note [Plans read at run time]
// A re-plan used to rewrite every re-planned job's step (0.7-0.9 s of
// Python per ResNet50 step) and instantiate the new function (TensorFlow's
// graph optimisations and executor, 3-5 s): about 4 s of CPU per job, which
// no thread can hide on two cores. A plan-table step is rewritten once per
// job, chained in plan order (Note [Plan order] in
// tensile_tf/tf/rewrite/rewriter.py), with
//   * ticks: TensileOpTick(index k) runs once op k is done, after the ops
//     that take longest (Note [Fewer ticks] in plan_table.py: a trigger
//     between two ticks waits for the one before, with a longer delta t);
//   * a swap slot at every gap of every activation the planner may swap:
//     TensileSwapSlotOut(version) -> handle and TensileSwapSlotIn(handle) ->
//     version, the consumers after the gap rewired to the slot's output;
//     the next gap's slot reads that output (a chain per tensor);
//   * variable slots at every gap of every variable it may swap, and two at
//     the gap across iterations (early: out and in at the step's start;
//     late: out after the step's last access, in at the next step's start):
//     TensileVarSlotOut / TensileVarSlotIn with the control edges the
//     rewrite gives TensileVarSwapOut / TensileVarSwapIn.
// Which slots swap, and when, is the table's: one SlotPlan per slot.
//
// Policy:
//  1. A step reads the plan once: the first slot or tick of a step takes
//     the table's current plan, and every slot of that step follows it. A
//     table written while a step runs applies from the next step. Each
//     step's plan generation is counted (`last_step_generation`).
//  2. An inactive slot swaps nothing: an activation slot passes its tensor
//     through (the slot holds one reference from its swap-out to its
//     swap-in, so the buffer lives exactly as long as without the slot); a
//     variable slot completes at once.
//  3. An active slot starts its transfer once its tick has run in this
//     step (at once for tick -1, or a tick already passed), plus its delta
//     t: the trigger op and delta of seed 000 §III-C. The transfers are
//     transfers.h's, the same as a rewritten plan's. An activation slot
//     with copy_out = false drops its device reference at once and its
//     swap-in reads the host copy of the tensor's earlier slot (Note [Host
//     copies serve several gaps] in activation_swaps.py); `host_reads`
//     swap-ins read a copy, the last one frees it.
//  4. No slot waits for an op at or after the op its output serves (the
//     encoder, tensile_tf/tf/rewrite/plan_table.py, drops such a trigger
//     as the rewrite drops an anchor that would close a cycle): a wait
//     never deadlocks a step. A waiting slot honours the step's
//     cancellation; a new step of the same table cancels the waiters and
//     drops what an unfinished step (a failed one) held, as does
//     DropPlanTableStep (the job's teardown). What a step retires (its
//     waiters, its held tensors) is released after the table's lock: a
//     freed buffer goes back to the pool, which may wake other jobs.
//     Ticks follow only ops of the step's own GraphDef (an op inlined
//     from a call's body has no node there), and an across-iteration
//     variable slot waits only for ticks before the variable's first
//     access: its reads wait on it, so a later tick would never run.
//  5. A table lives while its name is known or a kernel of its step holds
//     it: the Python step forgets the name when it is collected
//     (ForgetPlanTable), and the kernels go with the step's function.
//
// No TensorFlow in this header.
#ifndef TF_PLUGIN_SWAP_PLAN_TABLE_H_
#define TF_PLUGIN_SWAP_PLAN_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tensile {

// One slot's entry in a plan (policy 2, 3).
struct SlotPlan {
  bool active = false;
  bool copy_out = true;     // activation: copy to the host (else the earlier slot's host copy serves)
  int32_t host_reads = 1;   // activation with copy_out: how many swap-ins read this copy
  int64_t out_tick = -1;    // the tick the swap-out waits for (-1: none)
  int64_t out_delta_ns = 0;
  int64_t in_tick = -1;
  int64_t in_delta_ns = 0;
};

struct PlanTableStats {
  int64_t slots = 0;                  // in the plan last written
  int64_t generation = 0;             // of the plan last written
  int64_t last_step_generation = -1;  // the plan the last step read (policy 1)
  int64_t steps = 0;
  int64_t swap_outs = 0;              // slot runs by what they did
  int64_t swap_ins = 0;
  int64_t host_reuses = 0;            // active swap-outs with copy_out = false
  int64_t passed = 0;                 // inactive slot runs
  int64_t waits = 0;                  // active slots that waited for their tick
  int64_t cancelled = 0;              // waits ended by a cancellation or a new step
};

void SetPlanTable(const std::string& table, std::vector<SlotPlan> slots, int64_t generation);
PlanTableStats GetPlanTableStats(const std::string& table);
// Drops what the table's last step holds (policy 4); returns the held tensors dropped.
int64_t DropPlanTableStep(const std::string& table);
// Forgets the table's name (false if unknown): the table goes once no
// kernel of its step holds it. A later use of the name makes a new table.
bool ForgetPlanTable(const std::string& table);
// How many table names are known (tests: a forgotten step leaves none).
int64_t PlanTablesKnown();

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_PLAN_TABLE_H_
