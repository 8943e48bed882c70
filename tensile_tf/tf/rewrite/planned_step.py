"""The planned step: the edited GraphDef imported into a fresh ``tf.function``
with the same inputs and the captured variable handles fed explicitly (phase
5 of ``apply_plan``), and ``chain_in_plan_order``, the step chained in plan
order with no event (what a plan-order capture measures before any plan
exists).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tensorflow as tf

from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.tf.rewrite.graph_edit import _PREFIX, _TENSILE_OPS, RewriteReport
from tensile_tf.tf.rewrite.rewriter import _Rewriter
from tf_plugin import swap as _swap
from tf_plugin.tf_internals import eager_function_from_graph_def, exempt_from_automatic_control_deps, op_is_stateful


@dataclass
class PlannedStep:
    """A job's train step with a plan applied. Call it like the original step.

    ``restore()`` brings variables the plan keeps on the host between steps
    back into the pool (before reading weights outside the step, replacing
    the plan, or ending the job); ``evict()`` moves them out, so that the
    first planned step starts the way every later one does (without it, the
    first step runs with them still in the pool, at a higher peak)."""

    fn: Callable
    job_plan: JobPlan
    report: RewriteReport
    graph_def: Any = field(repr=False, default=None)
    _restore_fn: Callable | None = field(repr=False, default=None)
    _evict_fn: Callable | None = field(repr=False, default=None)

    def __call__(self, *args):
        return self.fn(*args)

    def evict(self) -> None:
        if self._evict_fn is not None:
            self._evict_fn()

    def restore(self) -> None:
        if self._restore_fn is not None:
            self._restore_fn()
        _swap.drain_swap_channel()


@functools.lru_cache(maxsize=None)
def _must_run(op_type: str) -> bool:
    """Whether a node of this type runs though nothing reads it: a stateful
    op, as tf.function's automatic control dependencies make every stateful
    op a must-run control output, or a call of a library function (no
    registered op to say)."""
    stateful = op_is_stateful(op_type)
    return stateful is None or stateful


class _ImportedStep:
    """The edited GraphDef as a function of the eager context, called like
    the job's step (phase 5 of ``apply_plan``).

    Note [A planned step without a trace]
    The planned step was a ``tf.function`` whose body imported the edited
    GraphDef (``import_graph_def``), and tracing it made a Python op for
    each of the graph's nodes: 1.2 s for a ResNet50 train step (14,461
    nodes, 64x64, batch 16) with collections off, 2-3 s with them on, four
    times in a re-plan of four such jobs. The graph needs no Python ops: it
    is imported into a bare C graph, made a FunctionDef there
    (``TF_GraphToFunction``) and registered in the eager context, 0.2 s for
    the same step (``eager_function_from_graph_def`` in
    tf_plugin/tf_internals.py). What ran is what the traced import ran:
    the same nodes under the same ``tensile/`` names, the step's
    arguments and then its captured variable handles as the function's
    inputs, its outputs packed into the step's output structure. Two things
    the trace added by itself are given by hand. One: the nodes that must
    run though nothing reads them (the swap checks, the step's updates, a
    node-group barrier); TensorFlow's automatic control dependencies made
    every stateful node a control output of the traced function, and every
    stateful node is one here too. Two: ``_XlaMustCompile`` off. The
    function's first call still instantiates it (TensorFlow's graph
    optimizations and executor, about 3.3 s for that step, as for a
    traced one)."""

    _made = itertools.count()

    def __init__(self, graph_def, nodes: dict, cf, name: str):
        """``nodes``: ``graph_def``'s nodes by name (the rewrite's index)."""
        fg = cf.graph
        captured = {internal.name: ext for ext, internal in fg.captures}
        arguments = [t for t in fg.inputs if t.name not in captured]
        captures = [t for t in fg.inputs if t.name in captured]
        must_run = sorted(name for name, n in nodes.items() if _must_run(n.op))
        label = f"planned_{name}_{next(self._made)}".replace("-", "_").replace(".", "_")
        self.function = eager_function_from_graph_def(
            graph_def, label, prefix=_PREFIX, inputs=[t.name for t in arguments + captures],
            outputs=[t.name for t in fg.outputs], control_outputs=must_run, like=cf)
        self.captured = [captured[t.name] for t in captures]
        self.arguments = len(arguments)

    def __call__(self, *args):
        flat = [x if isinstance(x, tf.Tensor) else tf.convert_to_tensor(x)
                for x in tf.nest.flatten(args, expand_composites=True)]
        if len(flat) != self.arguments:
            raise TypeError(f"{self.function.name.decode()}: {len(flat)} input tensors, "
                            f"the step takes {self.arguments}")
        return self.function.call_preflattened(flat + self.captured)


def apply_plan(step_fn, example_args: Sequence, job_plan: JobPlan, graph: JobGraph, *,
               delta_scale: float = 1.0, check_lateness: bool = True,
               enforce_order: bool | None = None) -> PlannedStep:
    """Rewrites ``step_fn`` (a tf.function, traced with ``example_args``) so it
    executes ``job_plan``; ``graph`` is the JobGraph the plan was made from.
    ``enforce_order``: chain the ops in plan order (Note [Plan order]); by
    default as the plan says (``JobPlan.step_order``).

    ``delta_scale`` scales the plan's delta t (0: start each transfer as soon
    as its trigger op ends)."""
    # Note [Automatic control dependencies]: tf.function chains the stateful
    # ops it traces in program order, so in a traced function holding swap ops
    # (the restore and evict functions below; the planned step itself when it
    # was a traced import, Note [A planned step without a trace]) every swap op
    # would wait for the one created before it (a swap-in for an unrelated
    # swap-out, a lateness probe for its own swap-in). The rewrite orders its
    # ops with explicit edges, so they join TF's order-insensitive must-run ops.
    exempt_from_automatic_control_deps(_TENSILE_OPS)
    if enforce_order is None:
        enforce_order = job_plan.step_order == "plan"
    cf = step_fn.get_concrete_function(*example_args)
    rw = _Rewriter(cf, graph, job_plan, delta_scale, check_lateness, enforce_order)
    gdef = rw.run()
    fn = _ImportedStep(gdef, rw.edit.nodes, cf, job_plan.name)   # made by the caller (a re-plan: the run loop)
    restore_fn = evict_fn = None
    if rw.report.restore_needed:
        handles = []
        vars_by_handle = {id(v.handle): v for v in cf.graph.variables}
        wanted = set(rw.report.restore_needed)
        seen = set()
        for ext, _ in cf.graph.captures:
            v = vars_by_handle.get(id(ext))
            if v is not None and "var:" + v.name.split(":")[0] in wanted and id(ext) not in seen:
                seen.add(id(ext))
                handles.append(ext)

        # Run op by op, not traced: a trace per plan cost more than the ops
        # (Note [A planned step without a trace]).
        def restore_fn():
            for h in handles:
                _swap.ops.tensile_var_swap_in(h)

        def evict_fn():
            for h in handles:
                _swap.ops.tensile_var_swap_out(h, label=f"{job_plan.name}:evict")
    return PlannedStep(fn, job_plan, rw.report, gdef, restore_fn, evict_fn)


def chain_in_plan_order(step_fn, example_args: Sequence, name: str, graph: JobGraph) -> PlannedStep:
    """The step with its ops chained in plan order and no event (Note [Plan
    order] in tensile_tf/tf/rewrite/rewriter.py): a plan-order capture
    measures its memory and latencies on it before any plan exists."""
    return apply_plan(step_fn, example_args, JobPlan(name, step_order="plan"), graph,
                      check_lateness=False, enforce_order=True)
