"""Plan execution by graph rewrite: a job's traced train step plus its
``JobPlan`` -> a new step function that runs the plan's swaps and
recomputations and computes exactly what the original computes (seed 000
§III-B "Executor", §III-C, §IV-C/D).

Phases, top to bottom (``apply_plan``), each in its module:

1. Read the traced step's GraphDef (DESIGN.md route 2: GraphDef edit +
   re-import with the captured variable handles fed explicitly); bypass the
   optimizer's gradient ``IdentityN`` (Note [No gradient barrier]) and chain
   the ops in plan order (Note [Plan order]).
2. Activation swaps: ``TensileSwapOut`` reads the tensor (data edge), started
   after its trigger op (control edge); each ``TensileSwapIn`` reads the
   swap-out's handle, is started by its trigger op (control edge), and every
   consumer after its gap now reads the swap-in's output instead. The device
   copy is freed by TensorFlow's refcounting once the accesses before the gap
   and the swap-out are done (Note [Release by rewiring] in
   tf_plugin/swap/swap_ops.cc); consumers of a view of the tensor read the
   view made again from the swap-in (Note [Views made again]). A
   ``TensileSwapCheck`` after the op the plan puts right before the consumer
   counts late swap-ins.
3. Variable swaps (parameters, optimizer slots, other state), within an
   iteration or across iterations: see Note [Variable swaps].
4. Recomputation: the chain's ops are cloned; their inputs from outside the
   chain pass through a ``TensileRecomputeGate`` started by the trigger op;
   every consumer of the target (or of a view of it) from ``before_op`` on
   reads the clone.
5. Register the edited GraphDef as a function of the eager context, its
   arguments the step's inputs and then its captured variable handles
   (Note [A planned step without a trace] in ``planned_step``).

Modules: ``graph_edit`` (GraphDef editing), ``rewriter`` (phase 1 and the
dispatch), ``activation_swaps``, ``variable_swaps``, ``recomputation``,
``views``, ``planned_step`` (phase 5).
"""
from tensile_tf.tf.rewrite.graph_edit import ALIAS_OPS, REWRITE_PREFIX, RewriteReport, bypassed_identity_n
from tensile_tf.tf.rewrite.planned_step import PlannedStep, apply_plan, chain_in_plan_order

__all__ = ["ALIAS_OPS", "REWRITE_PREFIX", "PlannedStep", "RewriteReport", "apply_plan", "bypassed_identity_n",
           "chain_in_plan_order"]
