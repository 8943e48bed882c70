"""The planned step: the edited GraphDef imported into a fresh ``tf.function``
with the same inputs and the captured variable handles fed explicitly (phase
5 of ``apply_plan``), and ``chain_in_plan_order``, the step chained in plan
order with no event (what a plan-order capture measures before any plan
exists).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import tensorflow as tf

from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.tf.capture import variable_keys
from tensile_tf.tf.rewrite.graph_edit import _PREFIX, _TENSILE_OPS, RewriteReport
from tensile_tf.tf.rewrite.rewriter import _Rewriter
from tf_plugin import swap as _swap
from tf_plugin.tf_internals import (NotInstantiated, eager_function_from_graph_def, exempt_from_automatic_control_deps,
                                   instantiate_eager_function, op_is_stateful)


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
    # Note [Instantiated off the job's thread]
    instantiate_s: float | None = None        # how long instantiating it took, off the job's thread
    instantiate_error: str | None = None      # why it could not be (its first call instantiates it then)
    _instantiation: concurrent.futures.Future | None = field(repr=False, default=None)
    # Note [Table first, rewritten when ready] in table_then_rewrite.py: work for the background
    # worker once the step is instantiated (called with the job's stream scope), started once
    background: Callable[[Callable[[], ContextManager]], None] | None = field(repr=False, default=None)

    def __call__(self, *args):
        self.wait_ready()   # never a second instantiation beside the one under way
        return self.fn(*args)

    def instantiate_in_background(self, scope: Callable[[], ContextManager] | None = None) -> None:
        """Starts instantiating the step on a worker thread (Note
        [Instantiated off the job's thread]); ``scope``: a context the worker
        runs it in (the job's stream, so what it allocates is the job's)."""
        if self._instantiation is None and getattr(self.fn, "needs_instantiation", False):
            self._instantiation = _instantiator().submit(self._instantiate, scope or contextlib.nullcontext)
        self.start_background(scope)

    def start_background(self, scope: Callable[[], ContextManager] | None = None) -> None:
        """Hands ``background`` to the background worker (once), to run after
        this step's instantiation (Note [Table first, rewritten when ready])."""
        work, self.background = self.background, None
        if work is not None:   # a method is held weakly while queued (a function holds its own data weakly):
            # nothing queued keeps a job torn down meanwhile alive
            ref = weakref.WeakMethod(work) if hasattr(work, "__self__") else (lambda: work)
            _background_worker().submit(_after, self._instantiation, ref, scope or contextlib.nullcontext)

    def wait_ready(self) -> None:
        """Waits for an instantiation under way, if any."""
        if self._instantiation is not None:
            self._instantiation.result()

    @property
    def ready(self) -> bool:
        """Whether a call runs without instantiating first: nothing started,
        or the instantiation finished (well or not)."""
        return self._instantiation is None or self._instantiation.done()

    def _instantiate(self, scope: Callable[[], ContextManager]) -> None:
        t = time.perf_counter()
        try:
            with scope():
                self.fn.instantiate()
        except Exception as e:  # noqa: BLE001 - the step's first call instantiates it then, and raises what is real
            self.instantiate_error = str(e) if isinstance(e, NotInstantiated) else f"{type(e).__name__}: {e}"
        self.instantiate_s = time.perf_counter() - t

    def evict(self) -> None:
        if self._evict_fn is not None:
            self._evict_fn()

    def restore(self) -> None:
        if self._restore_fn is not None:
            self._restore_fn()
        _swap.drain_swap_channel()


@functools.cache
def _instantiator() -> concurrent.futures.ThreadPoolExecutor:
    """The worker threads that instantiate planned steps, one per core up to
    four (TensorFlow holds no GIL while it instantiates). Made on first use,
    by the run loop's thread."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)),
                                                 thread_name_prefix="tensile-instantiate")


@functools.cache
def _background_worker() -> concurrent.futures.ThreadPoolExecutor:
    """One thread for the rewrites and builds no job waits for (Note [Table
    first, rewritten when ready]): one at a time, so they queue behind each
    other rather than beside the run loop's own work."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensile-background")


def wait_for_background() -> None:
    """Waits until the background worker has done everything handed to it
    so far (tests and benchmarks: runs that must not depend on its pace)."""
    _background_worker().submit(lambda: None).result()


def _after(before: concurrent.futures.Future | None, ref: Callable[[], Callable | None],
           scope: Callable[[], ContextManager]) -> None:
    if before is not None:
        concurrent.futures.wait([before])
    work = ref()
    if work is not None:
        work(scope)


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
    traced one), unless it was instantiated before (Note [Instantiated off
    the job's thread]).

    Note [Instantiated off the job's thread]
    A new step's first call instantiates its function: TensorFlow's graph
    optimisations (Grappler, 2.8 s of it for the ResNet50 step above) and
    its executor, 3.3-3.7 s in all, where a step runs in 0.4-1.0 s. On a
    re-plan that was the job's thread's first step under the new plan
    (4-7 s). No public API instantiates a function without running it, but
    TensorFlow checks a call's cancellation manager after it instantiates
    and before it starts the function ("Function was cancelled before it was
    started"), and keeps the instantiation in the eager context's cache,
    whose key holds the function, its attributes and its inputs' devices and
    dtypes (a resource's too), not their shapes or values. So
    ``instantiate()`` calls the function with a manager cancelled
    beforehand, empty tensors of its arguments' dtypes on the example
    arguments' devices and the captured handles: no op runs, no variable
    changes, no pool byte is taken for the arguments, and the job's first
    real call finds the instantiation made (ResNet50 step: 3.3 s then 0.8 s,
    against 4.0 s for a first call alone). TensorFlow holds no GIL while it
    instantiates, so ``instantiate_in_background`` runs it on a worker
    thread while the job trains on its old plan; a re-plan's switch is
    taken only once its step is ready (``take_switch`` in
    tensile_tf/runtime/replanning.py), and a call while one is under way
    waits for it instead of instantiating twice. If the call was not
    cancelled before it started, the reason is kept (``instantiate_error``)
    and the first call instantiates as before."""

    _made = itertools.count()
    needs_instantiation = True   # PlannedStep.instantiate_in_background

    def __init__(self, graph_def, nodes: dict, cf, name: str, devices: Sequence[str] = ()):
        """``nodes``: ``graph_def``'s nodes by name (the rewrite's index);
        ``devices``: the example arguments' devices (``instantiate``)."""
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
        self._argument_specs = [(t.dtype, t.shape) for t in arguments]
        self.devices = list(devices)

    def instantiate(self) -> None:
        """Instantiates the function without running it (Note [Instantiated
        off the job's thread]): its arguments as empty tensors of their dtypes
        on the example arguments' devices, then the captured handles."""
        empty = []
        for (dtype, shape), device in itertools.zip_longest(self._argument_specs, self.devices):
            if dtype in (tf.resource, tf.variant):
                raise NotInstantiated(f"{self.function.name.decode()}: a {dtype.name} argument")
            dims = [0] + [d or 1 for d in shape.as_list()[1:]] if shape.rank else []
            with tf.device(device or None):
                empty.append(tf.zeros(dims, dtype))
        instantiate_eager_function(self.function, empty + self.captured)

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
    devices = [getattr(x, "device", "") for x in tf.nest.flatten(example_args, expand_composites=True)]
    fn = _ImportedStep(gdef, rw.edit.nodes, cf, job_plan.name, devices)   # made by the caller (a re-plan: the run loop)
    restore_fn = evict_fn = None
    if rw.report.restore_needed:
        handles = variable_handles(cf, rw.report.restore_needed)

        # Run op by op, not traced: a trace per plan cost more than the ops
        # (Note [A planned step without a trace]).
        def restore_fn():
            for h in handles:
                _swap.ops.tensile_var_swap_in(h)

        def evict_fn():
            for h in handles:
                _swap.ops.tensile_var_swap_out(h, label=f"{job_plan.name}:evict")
    return PlannedStep(fn, job_plan, rw.report, gdef, restore_fn, evict_fn)


def variable_handles(cf, names: Sequence[str]) -> list:
    """The captured handles of the variables ``names`` ("var:NAME") of the
    traced step ``cf``, each once."""
    var_keys = variable_keys(cf.graph)
    wanted, seen, handles = set(names), set(), []
    for ext, _ in cf.graph.captures:
        if var_keys.get(id(ext)) in wanted and id(ext) not in seen:
            seen.add(id(ext))
            handles.append(ext)
    return handles


def chain_in_plan_order(step_fn, example_args: Sequence, name: str, graph: JobGraph) -> PlannedStep:
    """The step with its ops chained in plan order and no event (Note [Plan
    order] in tensile_tf/tf/rewrite/rewriter.py): a plan-order capture
    measures its memory and latencies on it before any plan exists."""
    return apply_plan(step_fn, example_args, JobPlan(name, step_order="plan"), graph,
                      check_lateness=False, enforce_order=True)
