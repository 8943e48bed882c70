"""Training that a plan cannot change: the Grappler settings under which a
rewritten step computes bit for bit what the original step computes.

Note [Graph-dependent Grappler rewrites]
``enable_op_determinism`` makes one graph compute the same bits every run;
it does not make two graphs that compute the same function agree. Grappler
rewrites each function before it runs, and two of its optimizers reassociate
floating-point arithmetic where the graph's structure allows it:

- ``arithmetic_optimization`` (e.g. AddOpsRewrite turns a tree of adds into
  one AddN; HoistCommonFactor turns a*b + a*c into a*(b + c));
- ``constant_folding`` (ConstantPushDown: (x + c1) + c2 -> x + (c1 + c2)).

A plan's rewrite adds control edges (Note [Plan order] in
tensile_tf/tf/rewrite/rewriter.py), swap ops between producers and consumers, and clones;
the node-group pipeline adds barrier ops. Those block some of these
rewrites, so the planned step sums in another order. Measured on the zoo
Transformer (64x128, batch 16, Adam, 3 steps): a plan with no events at all
(only the order edges and the re-import) gave a step-2 loss 1 ulp off
(0x4048aa55 vs 0x4048aa56) and other weights; with both optimizers off, the
vanilla run, the empty plan and plans swapping 41 activations and 15
variables gave identical losses and weights (turning off only one of the two
was not enough; no other optimizer made a difference).

A third one cannot be reached through ``tf.config.optimizer``: the memory
optimizer's SchedulingPass. When its static estimate of the step's peak is
above half the device's memory, it replaces each AddN of more than two
inputs (gradient aggregation: DenseNet's concatenations, Inception's
branches) by a temporary variable that AssignAdds the inputs *in the order
they arrive*. The sum then follows the executor's schedule: InceptionV3's
vanilla step changed its step-2 loss between two processes, and DenseNet121
with a plan of no events differed from vanilla (step-2 loss `58111740` vs
`5d111740`). With ``memory_optimization: NO_MEM_OPT`` in the context's
ConfigProto (set on the private ``Context._config``: eager TensorFlow has no
public switch for it), DenseNet121 vanilla and the empty plan agree bit for
bit. Grappler's own swapping heuristics live in the same optimizer and have
no business under a TENSILE plan anyway.

So wherever a graph is rewritten (``planner: tensile``, ``pipeline:
nodegroup``, ``--compare-vanilla``) tensile_tf turns these three optimizers off
for the whole process, the unplanned jobs included: every job then computes
exactly what its unplanned step computes under the same settings. The cost
is the speed these rewrites would have bought (none measurable on the zoo
models here). Grappler's other optimizers (layout, remapping, dependency,
loop, shape, function) stay on: they did not change a bit.
"""
from __future__ import annotations

import tensile_tf.tf.pool  # noqa: F401  (loads the plugin before any op)
import tensorflow as tf  # noqa: E402

from tf_plugin.tf_internals import memory_optimizer_off, turn_off_memory_optimizer  # noqa: E402

GRAPH_DEPENDENT_REWRITES = ("arithmetic_optimization", "constant_folding")


def disable_graph_dependent_rewrites() -> None:
    """Turns off the Grappler optimizers whose floating-point results depend on
    the graph's structure or on the executor's schedule (Note
    [Graph-dependent Grappler rewrites]). Affects functions instantiated
    afterwards, in this thread and in threads started afterwards."""
    turn_off_memory_optimizer()  # its AddN scheduling pass sums in arrival order
    # also drops this thread's cached function-call options, so they are rebuilt from the config
    tf.config.optimizer.set_experimental_options({name: False for name in GRAPH_DEPENDENT_REWRITES})


def graph_dependent_rewrites_enabled() -> bool:
    """Whether any of GRAPH_DEPENDENT_REWRITES, or the memory optimizer, is still on."""
    opts = tf.config.optimizer.get_experimental_options()
    return any(opts.get(name, True) for name in GRAPH_DEPENDENT_REWRITES) or not memory_optimizer_off()


def enable_deterministic_training() -> None:
    """Deterministic kernels plus fixed Grappler rewrites: a planned or
    pipelined step then trains bit for bit like the unplanned one."""
    tf.config.experimental.enable_op_determinism()
    disable_graph_dependent_rewrites()
