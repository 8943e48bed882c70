"""Plan execution for running jobs: capture -> measure -> plan -> rewrite.

The two halves every caller uses (the host's planning, tensile_tf/runtime/
planning.py, and the benchmarks): ``capture_for_planning`` (per job: its
graph in executor order, its ops' scratch memory and latencies, measured by
running its step) and ``plan_captured`` (all jobs at once: one Plan for one
pool and one swap channel, and each job's rewritten ``PlannedStep``). The
host captures each job right after its probe step, while the pool can still
hold it, and plans later.

Note [Scratch memory]
Some kernels allocate large buffers that are neither inputs nor outputs:
TensorFlow's CPU convolution backprops build im2col-style patch buffers of
about kernel_h * kernel_w times the input activation. They decide the peak of
every convolutional network on this CPU and no plan can swap them.
``measure_temp_bytes`` reads them from the pool's event trace of one step
(an allocation freed by the op that made it) and stores them as each op's
``temp_bytes``, so the planner's footprint (and its predicted peak) counts
them, as §IV-B counts every allocation the step makes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import tensorflow as tf

import tf_plugin
from tensile_tf.capture import capture_job_graph, measure_op_latencies, snapshot_variables
from tensile_tf.rewrite import PlannedStep, apply_plan
from tensile_tf.scheduler import DEFAULT_BANDWIDTH_BYTES_PER_S, ColdStartLatency, Plan, Planner, PlannerJob
from tensile_tf.scheduler.job_graph import JobGraph


def _size_matches(a: int, b: int) -> bool:
    return abs(a - b) <= max(256, b // 100)   # the pool rounds requests up to its chunk granularity


def measure_temp_bytes(step_fn, args: Sequence, graph: JobGraph) -> dict[str, int]:
    """Per op, the scratch bytes resident while it runs (Note [Scratch
    memory], Note [Concurrent scratch]), from the pool's trace of one step.
    The variables are restored afterwards."""
    pool = tf_plugin.device_pool()
    restore = snapshot_variables(step_fn.get_concrete_function(*args).graph)
    pool.clear_trace()
    try:
        step_fn(*args)
    finally:
        restore()  # also when the step fails (out of memory)
    trace = pool.trace()
    # Allocations freed within the step: (op name as traced, bytes, alloc index, free index).
    live: dict[int, tuple[str, int, int]] = {}
    freed: list[tuple[str, int, int, int]] = []
    for k, ev in enumerate(trace):
        if ev["kind"] == "alloc":
            live[ev["offset"]] = (ev["op"], ev["bytes"], k)
        elif ev["kind"] == "free" and ev["offset"] in live:
            op, size, start = live.pop(ev["offset"])
            if op:
                freed.append((op, size, start, k))
    # The trace keeps 63 characters of an op name: a truncated name may stand
    # for several ops (Conv2DBackpropInput / ...Filter).
    by_name = {o.name: o for o in graph.ops}
    ops_of: dict[str, list] = {}
    for name in {f[0] for f in freed}:
        if name in by_name:
            ops_of[name] = [by_name[name]]
        elif len(name) >= 63:
            ops_of[name] = [o for o in graph.ops if o.name.startswith(name)]
    scratch: list[tuple[str, int, int, int]] = []
    for name, ops in ops_of.items():
        outputs = [graph.tensors[t].size_bytes for o in ops for t in o.outputs]
        for alloc in sorted((f for f in freed if f[0] == name), key=lambda f: -f[1]):
            match = next((i for i, size in enumerate(outputs) if _size_matches(alloc[1], size)), None)
            if match is not None:
                outputs.pop(match)   # one of the op's outputs, counted as a tensor already
            else:
                scratch.append(alloc)
    if not scratch:
        return {}
    # A truncated name's buffers are shared out among the ops it may stand for.
    own: dict[str, int] = {}
    for name, size, _, _ in scratch:
        for o in ops_of[name]:
            own[o.name] = own.get(o.name, 0) + size // len(ops_of[name])
    # Note [Concurrent scratch]: siblings (ops reading a common activation) are
    # ready together; with k inter-op threads up to k of them run at once, so
    # each one's step also holds its k - 1 largest siblings' scratch.
    threads = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1
    inputs_of = {name: {t for t in by_name[name].inputs if not graph.tensors[t].persistent} for name in own}
    out: dict[str, int] = {}
    for name, size in own.items():
        siblings = sorted((own[other] for other in own if other != name and inputs_of[name] & inputs_of[other]),
                          reverse=True)
        out[name] = size + sum(siblings[:threads - 1])
    return out


_LAZY_OPS = frozenset({"ReadVariableOp", "Const", "Identity", "NoOp", "Placeholder"})


def executor_order(graph: JobGraph, step_fn, args: Sequence) -> JobGraph:
    """The JobGraph with its ops in the order the planned step will run them
    (Note [Plan order] in tensile_tf.rewrite). Depth first over the traced
    GraphDef (data and control edges): the op that became ready last runs
    next, so an optimizer update runs as soon as its gradient exists (in
    creation order all of backprop precedes all of the optimizer and every
    gradient piles up). Variable reads and other trivial ops run just before
    their first consumer: a read run early keeps an alias of the variable's
    buffer alive, and the optimizer's in-place update must then copy it."""
    gdef = step_fn.get_concrete_function(*args).graph.as_graph_def()
    nodes = list(gdef.node)
    index = {n.name: k for k, n in enumerate(nodes)}
    preds: list[set[int]] = []
    succ: list[list[int]] = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        srcs = {index[i.lstrip("^").split(":")[0]] for i in n.input if i.lstrip("^").split(":")[0] in index}
        preds.append(srcs)
        for j in srcs:
            succ[j].append(k)
    lazy = [n.op in _LAZY_OPS for n in nodes]
    done = [False] * len(nodes)
    rank: dict[str, int] = {}
    missing = [len([p for p in preds[k] if not lazy[p]]) for k in range(len(nodes))]
    ready = [k for k in reversed(range(len(nodes))) if missing[k] == 0 and not lazy[k]]

    def emit(k: int) -> None:
        """Runs k after whatever it still waits for (lazy predecessors, and
        anything they wait for, e.g. a node-group barrier's leaves), depth
        first, predecessors before successors."""
        stack = [(k, False)]
        while stack:
            x, expanded = stack.pop()
            if done[x]:
                continue
            if not expanded:
                stack.append((x, True))
                stack.extend((p, False) for p in preds[x] if not done[p])
                continue
            done[x] = True
            rank[nodes[x].name] = len(rank)
            if not lazy[x]:
                for j in reversed(succ[x]):
                    if not lazy[j]:
                        missing[j] -= 1
                        if missing[j] == 0 and not done[j]:
                            ready.append(j)

    while ready:
        k = ready.pop()
        if not done[k]:
            emit(k)
    for k in range(len(nodes)):
        if not done[k]:
            emit(k)
    unranked = len(rank)  # ops the GraphDef lacks keep their relative order, after the rest
    order = sorted(range(len(graph.ops)), key=lambda k: (rank.get(graph.ops[k].name, unranked), k))
    return JobGraph(graph.name, [graph.ops[k] for k in order], graph.tensors)


@dataclass
class JobToPlan:
    """What capture and planning need of a job."""

    name: str
    step_fn: Any                 # a traced tf.function (the host's attributed step)
    example_args: tuple
    optimizer: Any = None
    max_swapping_rate: float = 1.0
    start_offset_s: float = 0.0


@dataclass
class CapturedJob:
    """A job traced and profiled for planning: its graph in executor order
    (with scratch bytes) and the planner's view of it."""

    job: JobToPlan
    graph: JobGraph
    planner_job: PlannerJob
    cold: bool = False           # captured without running the step (capture_cold)


def capture_for_planning(job: JobToPlan, *, latency_repeats: int = 3, with_temp: bool = True) -> CapturedJob:
    """Runs the job's step a few times (variables restored afterwards, also
    when a step fails) to capture its graph, scratch bytes and op latencies.
    Errors name the job."""
    try:
        graph = capture_job_graph(job.name, job.step_fn, job.example_args, optimizer=job.optimizer)
        graph = executor_order(graph, job.step_fn, job.example_args)
        if with_temp:
            temps = measure_temp_bytes(job.step_fn, job.example_args, graph)
            for o in graph.ops:
                o.temp_bytes = temps.get(o.name, o.temp_bytes)
        lat = measure_op_latencies(job.step_fn, job.example_args, graph=graph, repeats=latency_repeats)
    except Exception as e:  # noqa: BLE001 - name the job
        raise RuntimeError(f"job '{job.name}': could not capture or profile its train step: {e}") from e
    return CapturedJob(job, graph, PlannerJob(graph, lat, job.start_offset_s, job.max_swapping_rate))


def capture_cold(job: JobToPlan) -> CapturedJob:
    """Captures a job for planning without running its step (§IV-A cold
    start): for a job whose vanilla step does not fit the pool, so it can be
    neither profiled nor measured. Static shapes (dynamic ones count 0),
    no scratch bytes, ``ColdStartLatency`` predictions."""
    try:
        graph = capture_job_graph(job.name, job.step_fn, job.example_args, optimizer=job.optimizer,
                                  measure_dynamic=False)
        graph = executor_order(graph, job.step_fn, job.example_args)
    except Exception as e:  # noqa: BLE001 - name the job
        raise RuntimeError(f"job '{job.name}': could not capture its train step: {e}") from e
    return CapturedJob(job, graph, PlannerJob(graph, ColdStartLatency(graph), job.start_offset_s,
                                              job.max_swapping_rate), cold=True)


def plan_captured(captured: Sequence[CapturedJob], *, pool_bytes: int | None,
                  bandwidth_bytes_per_s: float | None = None, enable_recompute: bool = True,
                  delta_scale: float = 1.0, horizon_iterations: float = 2.0,
                  coincident_peaks: bool = False,
                  peaking_jobs: int | None = None) -> tuple[Plan, dict[str, PlannedStep]]:
    """Plans captured jobs together and rewrites each one's step.
    ``peaking_jobs``: with ``coincident_peaks``, how many jobs' peaks meet
    (Note [Paired peaks] in tensile_tf.scheduler.peak_analysis)."""
    plan = Planner([c.planner_job for c in captured], pool_bytes=pool_bytes,
                   bandwidth_bytes_per_s=bandwidth_bytes_per_s or DEFAULT_BANDWIDTH_BYTES_PER_S,
                   horizon_iterations=horizon_iterations, enable_recompute=enable_recompute,
                   coincident_peaks=coincident_peaks, peaking_jobs=peaking_jobs).plan()
    steps = {c.job.name: apply_plan(c.job.step_fn, c.job.example_args, plan.jobs[c.job.name], c.graph,
                                    delta_scale=delta_scale)
             for c in captured}
    return plan, steps
