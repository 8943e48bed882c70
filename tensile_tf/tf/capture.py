"""Job graph capture and op latency measurement: the TensorFlow adapter of the
planner (seed 000 §III-A job graph, §IV-A measured latencies).

``capture_job_graph`` reads the FuncGraph of a traced train step: ops in
creation order (a topological order of the graph, which is the order TENSILE
assumes), tensors with byte sizes from static shapes (measured from the pool
trace where a shape is dynamic), producers and consumers, the model inputs, and
the resource variables the step reads and writes in place. Variables become
persistent tensors: ``ReadVariableOp`` outputs alias the variable's buffer on
the CPU device, so their readers read the variable itself. Function calls
(``StatefulPartitionedCall`` / ``PartitionedCall``) are inlined; control flow
(``While``, ``If``, ``Case``) stays one op.

``measure_op_latencies`` profiles real steps with ``tf.profiler`` (TF 2.21 no
longer fills RunMetadata step stats for functions) and reads per-op durations
from the XSpace; the variables are restored afterwards, so measuring does not
train the model.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

import tensile_tf.tf.pool  # noqa: F401  (loads the plugin before any op)
from tensile_tf.tf.pool import traced_op_matches  # noqa: E402
from tf_plugin.tf_internals import called_function_graph, new_xspace
from tensile_tf.scheduler.job_graph import VARIABLE_PREFIX, JobGraph, OpNode, TensorInfo
from tensile_tf.scheduler.latency import LatencyTable
from tensile_tf.tf.profile_events import bind_node_names, op_durations

CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
SKIP_OPS = frozenset({"NoOp", "Placeholder", "Const", "VarHandleOp"})
ALIAS_OPS = frozenset({"ReadVariableOp", "Identity", "IdentityN"})
_UPDATE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter", "Assign")
_SLOT_HINTS = ("momentum", "velocity", "moment", "accumulator", "_m:", "_v:", "slot")


def inlined_call(op: tf.Operation, prefix: str):
    """(the function graph a call op runs, the prefix its ops are named
    under in the JobGraph), or None: not a call, or a call of a function that
    cannot be read (it stays one op). The one place both the capture and
    ``traced_ops`` name a called function's ops."""
    if op.type not in CALL_OPS:
        return None
    try:
        fgraph = called_function_graph(op)
    except Exception:  # noqa: BLE001 - unknown call: keep it as one op
        return None
    return None if fgraph is None else (fgraph, prefix + op.name + "/")


def traced_ops(graph, prefix: str = ""):
    """(name, op) of every op of a traced graph, call ops inlined under their
    name as a prefix, as ``capture_job_graph`` names them."""
    for op in graph.get_operations():
        inlined = inlined_call(op, prefix)
        if inlined is not None:
            yield from traced_ops(*inlined)
        else:
            yield prefix + op.name, op


def _is_update_op(op_type: str) -> bool:
    """Ops that write their resource inputs in place (the optimizer's updates)."""
    return op_type.startswith(_UPDATE_PREFIXES[:3]) or op_type in (
        "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _static_bytes(t: tf.Tensor) -> int | None:
    if t.dtype in (tf.resource, tf.variant):
        return 0
    if t.dtype == tf.string:
        return None
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return int(shape.num_elements()) * t.dtype.size


def variable_keys(fg) -> dict[int, str]:
    """Each variable a traced graph ``fg`` captures, by its handle's id: its tensor's name in the
    JobGraph, ``var:NAME``. Variables that share a name (every unnamed ``tf.Variable`` is
    "Variable") are told apart in capture order: ``var:NAME``, ``var:NAME#1``, ... ('#' is in no
    TensorFlow name). Before, they were one tensor, the size of one of them (issue 58: two weights
    of 32 KiB counted 8 bytes). The capture, the rewriter and the planned step all name them here."""
    vars_by_handle = {id(v.handle): v for v in fg.variables}
    keys: dict[int, str] = {}
    seen: dict[str, int] = {}
    for ext, _ in fg.captures:
        v = vars_by_handle.get(id(ext))
        if v is None or id(ext) in keys:
            continue
        base = VARIABLE_PREFIX + v.name.split(":")[0]
        k = seen[base] = seen.get(base, -1) + 1
        keys[id(ext)] = base if k == 0 else f"{base}#{k}"
    return keys


class _Capture:
    def __init__(self, name: str, optimizer: Any | None):
        self.name = name
        self.ops: list[OpNode] = []
        self.tensors: dict[str, TensorInfo] = {}
        self.alias: dict[str, str | None] = {}      # graph tensor name (with prefix) -> canonical tensor
        self.unknown: dict[str, tuple[str, int]] = {}  # canonical tensor -> (op, output index) with dynamic shape
        self.opt_ids: set[int] = set()
        self.opt_names: set[str] = set()
        for ov in getattr(optimizer, "variables", None) or []:
            tv = getattr(ov, "value", ov)
            for obj in (ov, tv):
                h = getattr(obj, "handle", None)
                if h is not None:
                    self.opt_ids.add(id(h))
            self.opt_names.add(getattr(tv, "name", "").split(":")[0])
            self.opt_names.add(getattr(ov, "path", ""))
        self.var_meta: dict[str, dict] = {}

    def add_tensor(self, key: str, size: int, kind: str, producer: str | None) -> None:
        if key not in self.tensors:
            self.tensors[key] = TensorInfo(key, size, kind, producer)

    def walk(self, graph, prefix: str, input_map: dict[str, str | None]) -> None:
        for op in graph.get_operations():
            opname = prefix + op.name
            if op.type == "Placeholder":
                t = op.outputs[0]
                self.alias[prefix + t.name] = input_map.get(t.name, None)
                continue
            if op.type in ("Const", "VarHandleOp"):
                for t in op.outputs:
                    size = _static_bytes(t) or 0
                    key = prefix + t.name
                    if size and op.type == "Const":
                        self.add_tensor(key, size, "state", None)
                        self.alias[key] = key
                    else:
                        self.alias[key] = None
                continue
            if op.type == "NoOp":
                continue
            ins = [self.alias.get(prefix + t.name) for t in op.inputs]
            if op.type in ALIAS_OPS:
                for t, src in zip(op.outputs, ins if op.type == "IdentityN" else ins[:1] * len(op.outputs)):
                    self.alias[prefix + t.name] = src
                if op.type == "ReadVariableOp" and ins and ins[0] is not None:
                    self.ops.append(OpNode(opname, op.type, inputs=[ins[0]]))
                continue
            if op.type in CALL_OPS and self._inline(op, prefix, ins):
                continue
            update = _is_update_op(op.type)
            reads, writes = [], []
            for t, src in zip(op.inputs, ins):
                if src is None:
                    continue
                if update and t.dtype == tf.resource:
                    writes.append(src)
                else:
                    reads.append(src)
            outs = []
            for t in op.outputs:
                key = prefix + t.name
                size = _static_bytes(t)
                if t.dtype in (tf.resource, tf.variant):
                    self.alias[key] = None
                    continue
                self.add_tensor(key, size or 0, "activation", opname)
                if size is None:
                    self.unknown[key] = (opname, t.value_index)
                self.alias[key] = key
                outs.append(key)
            try:
                stateful = bool(op.op_def.is_stateful)
            except Exception:  # noqa: BLE001 - ops without an OpDef are treated as stateful
                stateful = True
            self.ops.append(OpNode(opname, op.type, list(dict.fromkeys(reads)), outs,
                                   list(dict.fromkeys(writes)), 0, stateful))

    def _inline(self, op, prefix: str, ins: list) -> bool:
        inlined = inlined_call(op, prefix)
        if inlined is None:
            return False
        fgraph, inner = inlined
        input_map = {ph.name: src for ph, src in zip(fgraph.inputs, ins)}
        self.walk(fgraph, inner, input_map)
        for t, inner_out in zip(op.outputs, fgraph.outputs):
            self.alias[prefix + t.name] = self.alias.get(inner + inner_out.name)
        return True


def capture_job_graph(name: str, step_fn: Callable, args: Sequence, *, optimizer: Any | None = None,
                      measure_dynamic: bool = True) -> JobGraph:
    """The JobGraph of ``step_fn`` (a ``tf.function``) traced with ``args``.

    ``optimizer`` (a Keras optimizer) tells slots (its variables) from state;
    without it, updated non-trainable variables whose names look like slots
    ("momentum", "velocity", ...) are slots. Dynamic-shape tensors get their
    sizes from one measured step's pool trace (``measure_dynamic``); otherwise 0.
    """
    if not hasattr(step_fn, "get_concrete_function"):
        raise TypeError(f"job '{name}': step_fn must be a tf.function (has no get_concrete_function); "
                        "wrap it with tf.function(fn, jit_compile=False)")
    cf = step_fn.get_concrete_function(*args)
    fg = cf.graph
    cap = _Capture(name, optimizer)
    vars_by_handle = {id(v.handle): v for v in fg.variables}
    var_keys = variable_keys(fg)
    input_map: dict[str, str | None] = {}
    captured_internal = set()
    for ext, internal in fg.captures:
        captured_internal.add(internal.name)
        v = vars_by_handle.get(id(ext))
        if v is not None:
            key = var_keys[id(ext)]
            cap.add_tensor(key, int(v.shape.num_elements() or 0) * v.dtype.size, "state", None)
            cap.var_meta[key] = {"trainable": bool(v.trainable), "name": v.name,
                                 "slot": id(ext) in cap.opt_ids or v.name.split(":")[0] in cap.opt_names}
            input_map[internal.name] = key
        elif ext.dtype != tf.resource:
            key = "captured:" + internal.name
            cap.add_tensor(key, _static_bytes(internal) or 0, "state", None)
            input_map[internal.name] = key
        else:
            input_map[internal.name] = None
    for ph in fg.inputs:
        if ph.name in captured_internal:
            continue
        key = "input:" + ph.name
        cap.add_tensor(key, _static_bytes(ph) or 0, "input", None)
        if _static_bytes(ph) is None:
            cap.unknown[key] = ("", -1)
        input_map[ph.name] = key
    cap.walk(fg, "", input_map)

    # consumers / updaters, variable kinds
    for op in cap.ops:
        for t in op.inputs:
            if op.name not in cap.tensors[t].consumers:
                cap.tensors[t].consumers.append(op.name)
        for t in op.updates:
            cap.tensors[t].updated_by.append(op.name)
    for key, meta in cap.var_meta.items():
        info = cap.tensors[key]
        if not info.updated_by:
            info.kind = "state"
        elif meta["trainable"]:
            info.kind = "parameter"
        elif info.size_bytes > 4 * 8 and (meta["slot"] if optimizer is not None
                                          else any(h in meta["name"].lower() for h in _SLOT_HINTS)):
            info.kind = "slot"
        else:
            info.kind = "state"
    if cap.unknown and measure_dynamic:
        _fill_dynamic_sizes(cap, step_fn, args, fg)
    # drop tensors nobody touches (e.g. unused captured constants)
    used = {t for o in cap.ops for t in (*o.inputs, *o.outputs, *o.updates)}
    tensors = {k: v for k, v in cap.tensors.items() if k in used or v.kind == "input"}
    return JobGraph(name, cap.ops, tensors)


def snapshot_variables(fg) -> Callable[[], None]:
    """Copies the graph's variables to host memory (numpy, outside the pool:
    copies in the pool would pin chunks while the measured steps run);
    returns a function that writes them back in place."""
    saved = [(v, np.array(v.numpy(), copy=True)) for v in fg.variables]

    def restore() -> None:
        for v, val in saved:
            v.assign(val)
    return restore


def _fill_dynamic_sizes(cap: _Capture, step_fn, args, fg) -> None:
    """Sizes of dynamic-shape outputs from the pool trace of one step (bytes the
    op allocated, split evenly over its dynamic outputs)."""
    restore = snapshot_variables(fg)
    n0 = len(tensile_tf.pool_trace())
    try:
        step_fn(*args)
    finally:
        restore()  # also when the step fails (out of memory): it may have updated some variables
    trace = tensile_tf.pool_trace()[n0:]
    by_op: dict[str, int] = defaultdict(int)
    for ev in trace:
        if ev.get("kind") == "alloc" and ev.get("op"):
            by_op[ev["op"]] += int(ev["bytes"])
    per_op: dict[str, list[str]] = defaultdict(list)
    for key, (opname, _) in cap.unknown.items():
        per_op[opname].append(key)
    for opname, keys in per_op.items():
        total = sum(b for traced, b in by_op.items() if traced_op_matches(traced, opname))
        for key in keys:
            cap.tensors[key].size_bytes = total // max(1, len(keys))


def _load_xspace(logdir: str):
    files = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise RuntimeError(f"tf.profiler wrote no .xplane.pb under {logdir}; cannot measure op latencies")
    xs = new_xspace()
    with open(files[0], "rb") as f:
        xs.ParseFromString(f.read())
    return xs


# One profiler per process: a job's profiled training step takes it, or is skipped.
_PROFILER = threading.Lock()


@contextlib.contextmanager
def profiling(blocking: bool = True):
    """Runs the block under the process's one profiler; yields a namespace whose ``xspace`` is
    the profile once the block has ended (None: another held the profiler and ``blocking`` is
    False, so the block ran unprofiled)."""
    out = SimpleNamespace(xspace=None)
    if not _PROFILER.acquire(blocking=blocking):
        yield out
        return
    logdir = tempfile.mkdtemp(prefix="tensile_profile_")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            yield out
        finally:
            tf.profiler.experimental.stop()
        out.xspace = _load_xspace(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
        _PROFILER.release()


def measure_op_latencies(step_fn: Callable, args: Sequence, *, graph: JobGraph | None = None,
                         repeats: int = 3, warmup: int = 1, run_fn: Callable | None = None) -> LatencyTable:
    """Per-op seconds (mean over ``repeats`` profiled steps) as a LatencyTable.

    Op names are the graph's node names; ops fused or removed by Grappler are not
    in the profile and fall back to their op type's median (see LatencyTable).
    With ``graph``, the table is put on the profiled steps' median wall time
    (Note [Latency time base] in tensile_tf/scheduler/latency.py).
    ``run_fn``: the function profiled instead of ``step_fn`` (a rewrite of it
    that updates the same variables); ``step_fn``'s variables are restored.
    """
    cf = step_fn.get_concrete_function(*args)
    restore = snapshot_variables(cf.graph)
    run_fn = run_fn or step_fn
    try:
        for _ in range(warmup):
            run_fn(*args)
        walls = []
        with profiling() as profile:   # one profiler per process (a running job may be sampling its latencies)
            for _ in range(repeats):
                t0 = time.perf_counter()
                run_fn(*args)
                walls.append(time.perf_counter() - t0)
    finally:
        restore()
    return latencies_of_profiles([profile.xspace], graph, repeats, walls)


def latencies_of_profiles(xspaces: Sequence, graph: JobGraph | None, steps: int,
                          walls: Sequence[float]) -> LatencyTable:
    """The latency table of ``steps`` profiled steps (in one or more XSpaces), put on their median
    wall time with ``graph`` (Note [Latency time base] in tensile_tf/scheduler/latency.py)."""
    table = _latencies_from_xspace(xspaces, graph, steps)
    return table.on_wall_time(graph, statistics.median(walls)) if graph is not None else table


def _latencies_from_xspace(xspaces: Sequence, graph: JobGraph | None, repeats: int) -> LatencyTable:
    """Per-op mean seconds over ``repeats`` steps recorded in XSpaces."""
    # Note [Profiles of one job's steps] in tensile_tf/tf/profile_events.py: only this job's steps' events
    events: dict[str, list[int]] = defaultdict(list)
    for xs in xspaces:
        for node, durations in op_durations(xs, bind_node_names(graph)).items():
            events[node] += durations
    seconds = {k: sum(v) * 1e-12 / repeats for k, v in events.items()}
    op_types = {}
    if graph is not None:
        op_types = {o.name: o.op_type for o in graph.ops}
        by_suffix = {}
        for prof_name in seconds:
            by_suffix.setdefault(prof_name.rsplit("/", 1)[-1], []).append(prof_name)
        for o in graph.ops:  # inlined function bodies may carry a different prefix
            if o.name not in seconds:
                cands = [c for c in by_suffix.get(o.name.rsplit("/", 1)[-1], []) if o.name.endswith(c) or c.endswith(o.name)]
                if len(cands) == 1:
                    seconds[o.name] = seconds[cands[0]]
    if not seconds:
        raise RuntimeError("profiling recorded no TensorFlow ops; is step_fn a tf.function that runs ops?")
    known = {k: v for k, v in seconds.items() if not op_types or k in op_types}
    return LatencyTable.from_measurements(known or seconds, op_types, default_s=1e-6, source="tf.profiler")


def profiled_step(step_fn: Callable, args: Sequence, graph: JobGraph) -> tuple[Any, LatencyTable | None]:
    """Runs ONE real training step (its updates are kept) and, if the
    process's profiler is free, records its op latencies. Returns the
    step's output and the LatencyTable (None when another job held the
    profiler: the step ran unprofiled)."""
    with profiling(blocking=False) as profile:
        t0 = time.perf_counter()
        out = step_fn(*args)
        wall_s = time.perf_counter() - t0
    if profile.xspace is None:
        return out, None
    return out, latencies_of_profiles([profile.xspace], graph, 1, [wall_s])
