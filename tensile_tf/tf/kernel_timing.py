"""Times a traced step's kernels one at a time, on inputs of their static
shapes, for a cold start (Note [Kernels timed alone] in
tensile_tf/scheduler/latency_predictor.py).

A job cold-starts because its step does not fit the pool, so its step cannot
run; one kernel at a time can. ``time_kernels_alone`` walks the traced step
as the capture does (call ops inlined, the same op names as the JobGraph),
and for each op the caller wants that has static shapes, no resource,
variant or string tensors and no side effects, it runs the op eagerly
(``tf.raw_ops``, the op's own attributes) on random inputs of its shapes,
once to warm up and then ``repeats`` times, and keeps the fastest run. Ops
with the same type, input shapes and attributes are timed once. Integer
inputs are the values the graph gives them when it knows them (a
convolution gradient's ``input_sizes``, a reshape's shape), else zeros.

Memory: every allocation the pool cannot serve comes from host memory
(``host_fallback_scope``): a cold-started job's pool is full by definition.
An op that still fails (an input it cannot take at zero) is left to the
predictor. What the runs allocate is freed when they return, and is the
job's while it is held: the run loop captures a cold job inside its
stream's scope (``JobPlanning.capture_cold``), so the pool counts it
against that job, not as memory no job holds.

Time: the runs share the cores with whatever trains beside them, so a job
cold-started beside running jobs is timed as it will run, among them; the
calibrated scale was measured on a quiet machine, one model at a time.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.tf.capture import ALIAS_OPS, SKIP_OPS, traced_ops
from tensile_tf.tf.pool import host_fallback_scope

_NOT_TIMED = SKIP_OPS | ALIAS_OPS
_OPAQUE = (tf.resource, tf.variant, tf.string)


def time_kernels_alone(step_fn, args: Sequence, graph: JobGraph, wanted: Callable[[str], bool], *,
                       repeats: int = 3) -> dict[str, float]:
    """Seconds of each op of ``graph`` whose type ``wanted`` names, run alone (the module docstring)."""
    names = {o.name for o in graph.ops}
    fg = step_fn.get_concrete_function(*args).graph
    by_signature: dict[tuple, float | None] = {}
    seconds: dict[str, float] = {}
    with host_fallback_scope():
        for name, op in traced_ops(fg):
            if name not in names or op.type in _NOT_TIMED or not wanted(op.type) or not _timeable(op):
                continue
            known = _known_ints(op)
            key = _signature(op, known)
            if key not in by_signature:
                by_signature[key] = _time_alone(op, known, repeats)
            if by_signature[key] is not None:
                seconds[name] = by_signature[key]
    return seconds


def _timeable(op: tf.Operation) -> bool:
    tensors = [*op.inputs, *op.outputs]
    try:
        stateful = op.op_def.is_stateful
    except Exception:  # noqa: BLE001 - no OpDef (as in the capture): taken as stateful, never run
        return False
    return (not stateful and all(t.dtype not in _OPAQUE for t in tensors)
            and all(t.shape.is_fully_defined() for t in op.inputs))


def _signature(op: tf.Operation, known: list) -> tuple:
    attrs = sorted((k, v.SerializeToString()) for k, v in op.node_def.attr.items() if not k.startswith("_"))
    return op.type, tuple(tuple(t.shape.as_list()) for t in op.inputs), tuple(attrs), tuple(known)


def _known_ints(op: tf.Operation) -> list:
    """The values the graph gives the op's integer inputs (None: not known)."""
    out = []
    for t in op.inputs:
        value = None
        if t.dtype.is_integer:
            value = tf.get_static_value(t)
            if value is None and t.op.type in ("Shape", "ShapeN"):   # the shape of a static-shaped tensor
                source = t.op.inputs[t.value_index if t.op.type == "ShapeN" else 0]
                if source.shape.is_fully_defined():
                    value = np.array(source.shape.as_list(), dtype=t.dtype.as_numpy_dtype)
        out.append(None if value is None else np.asarray(value, dtype=t.dtype.as_numpy_dtype).tobytes())
    return out


def _inputs(op: tf.Operation, known_ints: list) -> list:
    values, rng = [], np.random.default_rng(0)
    for t, known in zip(op.inputs, known_ints):
        if known is not None:
            values.append(tf.constant(np.frombuffer(known, dtype=t.dtype.as_numpy_dtype).reshape(t.shape.as_list())))
        elif t.dtype.is_floating or t.dtype.is_complex:
            values.append(tf.cast(rng.standard_normal(t.shape.as_list()).astype(np.float32), t.dtype))
        else:
            values.append(tf.zeros(t.shape, t.dtype))
    return values


def _call(op: tf.Operation, values: list) -> Callable[[], object]:
    """``tf.raw_ops.<type>`` with the op's inputs and the attributes its inputs do not imply."""
    implied, kwargs, i = set(), {}, 0
    for arg in op.op_def.input_arg:
        implied.update(a for a in (arg.type_attr, arg.number_attr, arg.type_list_attr) if a)
        if arg.number_attr or arg.type_list_attr:
            n = op.get_attr(arg.number_attr) if arg.number_attr else len(op.get_attr(arg.type_list_attr))
            kwargs[arg.name], i = values[i:i + n], i + n
        else:
            kwargs[arg.name], i = values[i], i + 1
    kwargs.update({a.name: op.get_attr(a.name) for a in op.op_def.attr if a.name not in implied})
    kernel = getattr(tf.raw_ops, op.type)
    return lambda: kernel(**kwargs)


def _time_alone(op: tf.Operation, known_ints: list, repeats: int) -> float | None:
    """The fastest of ``repeats`` runs after a warm-up; None if it cannot run alone."""
    try:
        run = _call(op, _inputs(op, known_ints))
        run()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
        return best
    except Exception:  # noqa: BLE001 - not runnable alone (e.g. an index input at zero): the predictor's
        return None
