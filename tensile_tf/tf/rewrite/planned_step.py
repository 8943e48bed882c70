"""The planned step: the edited GraphDef imported into a fresh ``tf.function``
with the same inputs and the captured variable handles fed explicitly (phase
5 of ``apply_plan``), and ``chain_in_plan_order``, the step chained in plan
order with no event (what a plan-order capture measures before any plan
exists).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tensorflow as tf

from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.tf.rewrite.graph_edit import _PREFIX, _TENSILE_OPS, RewriteReport
from tensile_tf.tf.rewrite.rewriter import _Rewriter
from tf_plugin import swap as _swap
from tf_plugin.tf_internals import exempt_from_automatic_control_deps


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


def _import_as_function(gdef, cf, name: str) -> Callable:
    fg = cf.graph
    cap_names = {internal.op.name for _, internal in fg.captures}
    args = [t for t in fg.inputs if t.op.name not in cap_names]
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in args]
    returns = [t.name for t in fg.outputs]
    captures = list(fg.captures)
    structure = cf.structured_outputs

    def planned(*xs):
        g = tf.compat.v1.get_default_graph()
        input_map = {ph.name: x for ph, x in zip(args, xs)}
        for ext, internal in captures:
            input_map[internal.name] = g.capture(ext)
        outs = tf.graph_util.import_graph_def(gdef, input_map=input_map, return_elements=returns,
                                              name=_PREFIX)
        return tf.nest.pack_sequence_as(structure, outs, expand_composites=True) if returns else None

    planned.__name__ = f"planned_{name}".replace("-", "_").replace(".", "_")
    return tf.function(planned, input_signature=specs, jit_compile=False, autograph=False)


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
    # ops it traces in program order. The re-imported step is traced inside a
    # tf.function, so every swap op would wait for the one created before it
    # (a swap-in for an unrelated swap-out, a lateness probe for its own
    # swap-in). The rewrite orders its ops with explicit edges, so they join
    # TF's order-insensitive must-run ops.
    exempt_from_automatic_control_deps(_TENSILE_OPS)
    if enforce_order is None:
        enforce_order = job_plan.step_order == "plan"
    cf = step_fn.get_concrete_function(*example_args)
    rw = _Rewriter(cf, graph, job_plan, delta_scale, check_lateness, enforce_order)
    gdef = rw.run()
    fn = _import_as_function(gdef, cf, job_plan.name)
    # Traced here, by the caller (the run loop, for a re-plan), not at the job's
    # first planned step on its own thread (Note [Re-plans users do not feel]).
    fn.get_concrete_function()
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

        def restore():
            for h in handles:
                _swap.ops.tensile_var_swap_in(h)

        def evict():
            for h in handles:
                _swap.ops.tensile_var_swap_out(h, label=f"{job_plan.name}:evict")

        restore_fn = tf.function(restore, autograph=False)
        evict_fn = tf.function(evict, autograph=False)
    return PlannedStep(fn, job_plan, rw.report, gdef, restore_fn, evict_fn)


def chain_in_plan_order(step_fn, example_args: Sequence, name: str, graph: JobGraph) -> PlannedStep:
    """The step with its ops chained in plan order and no event (Note [Plan
    order] in tensile_tf/tf/rewrite/rewriter.py): a plan-order capture
    measures its memory and latencies on it before any plan exists."""
    return apply_plan(step_fn, example_args, JobPlan(name, step_order="plan"), graph,
                      check_lateness=False, enforce_order=True)
