"""The planning pipeline of a job's step, as named phases:

1. **capture** (``tensile_tf.tf.capture``): the step's ops and tensors as a
   ``JobGraph``, ordered as TensorFlow's executor runs them
   (``tensile_tf.tf.executor_order.executor_order``);
2. **step memory** (``tensile_tf.tf.step_memory``): what the pool's trace of
   real steps adds to the graph (scratch, forwarded buffers, views, data held
   beside the step), read from the step as it will run: a planned step runs
   its ops chained in plan order, so a plan-order capture also measures the
   *plan-order step* (``plan_order_step``: the step's ops chained, no event:
   the rewrite's chain alone, before any plan exists; Note [Memory of the
   step as planned] in tensile_tf/tf/step_memory.py);
3. **latencies**: each op's measured time on that step (or, for a cold
   start, predicted: ``capture_cold``);
4. **plan** (``tensile_tf.scheduler``, pure): every job's access sequence
   planned together for one pool and one swap link;
5. **rewrite** (``tensile_tf.tf.rewrite``): each job's plan made into the
   ``PlannedStep`` its thread runs.

Phases 1-3 are ``capture_for_planning`` (per job, right after its probe step,
while the pool can still hold it); 4-5 are ``plan_captured`` (all jobs at
once). The host (tensile_tf/runtime/planning.py) and the benchmarks call
these two.

Note [Example batch]
Capture and tracing need an example of the step's arguments. The batch a
job's probe ran is one more batch in the pool, beside the batch each step
reads: the quickstart's mlp-b held 3.2 MiB before each step where the graph's
parameters and one batch are 2.4 MiB, and its measured peak was 18% above the
prediction. A captured job keeps only the batch's TensorSpecs
(``batch_specs``: ``get_concrete_function`` with them returns the function
traced with the batch, no second trace), and the runtime drops the batch
after the job's first training step (``release_first_batch`` in
tensile_tf/runtime/job_thread.py), so a job holds one batch, as the planner
counts.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from tensile_tf.scheduler import DEFAULT_BANDWIDTH_BYTES_PER_S, Plan, PlannerJob
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency_predictor import cold_start_latency
from tensile_tf.scheduler.planner import collections_paused, plan_in_step_order
from tensile_tf.tf.capture import capture_job_graph, measure_op_latencies
from tensile_tf.tf.rewrite import REWRITE_PREFIX, PlannedStep, RewriteReport, apply_plan, chain_in_plan_order
from tensile_tf.tf.rewrite.plan_table import TableCall, ready_table_step, table_step_for, why_no_table_step
from tensile_tf.tf.rewrite.table_then_rewrite import build_table_in_background, table_then_rewritten_step
from tensile_tf.tf.executor_order import executor_order
from tensile_tf.tf.step_memory import (MIN_TRACED_STEPS, StepMemory, UnplannedPeaks, apply_step_memory,
                                       measure_step_memory)


LATENCY_REPEATS = 3   # profiled steps a capture's latency table is the mean of


def batch_specs(args: Sequence) -> tuple:
    """The TensorSpecs of a step's arguments (other values as they are):
    enough to look up the traced function (Note [Example batch])."""
    import tensorflow as tf

    return tuple(tf.TensorSpec.from_tensor(a) if isinstance(a, tf.Tensor) else a for a in args)


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
    #: what its predicted unplanned peak is made of: the traced steps' spread, scratch that
    #: meets (Note [Scratch that meets] in tensile_tf/tf/unplanned_peaks.py); None: not traced
    unplanned_peaks: UnplannedPeaks | None = None

    def for_job(self, name: str) -> "CapturedJob":
        """The same capture under another job's name: the job that took over this one's traced
        step (Note [Captures kept with the step] in tensile_tf/runtime/traced_step_reuse.py)."""
        graph = JobGraph(name, self.graph.ops, self.graph.tensors)
        return replace(self, job=replace(self.job, name=name), graph=graph,
                       planner_job=replace(self.planner_job, graph=graph, unplanned_step_ran_out=False))


def capture_for_planning(job: JobToPlan, *, latency_repeats: int = LATENCY_REPEATS, with_temp: bool = True,
                         step_order: str = "plan") -> CapturedJob:
    """Runs the job's step a few times (variables restored afterwards, also
    when a step fails) to capture its graph, scratch bytes and op latencies.
    ``step_order``: how the planned step will run its ops (the planner's
    ``step_order``, or "auto"); the latencies are measured on a step that runs
    them that way, "auto" in plan order, where it falls back to (Note [Latency
    time base] in tensile_tf/scheduler/latency.py).
    Errors name the job."""
    try:
        graph = graph_for_planning(job)
        chained = plan_order_step(job, graph) if step_order != "free" else None
        memory = None
        if with_temp:
            memory = measure_step_memory(job.step_fn, job.example_args, graph)
            if chained is not None:   # Note [Memory of the step as planned]
                memory = _as_planned(memory, job, graph, chained)
        lat = None
        if chained is not None:
            lat = measure_plan_order_latencies(job, graph, repeats=latency_repeats, chained=chained)
        if lat is None:
            lat = measure_op_latencies(job.step_fn, job.example_args, graph=graph, repeats=latency_repeats)
        return captured_job(job, graph, memory, lat)
    except Exception as e:  # noqa: BLE001 - name the job
        raise RuntimeError(f"job '{job.name}': could not capture or profile its train step: {e}") from e


def graph_for_planning(job: JobToPlan) -> JobGraph:
    """Phase 1: the job's graph in executor order."""
    graph = capture_job_graph(job.name, job.step_fn, job.example_args, optimizer=job.optimizer)
    return executor_order(graph, job.step_fn, job.example_args)


def captured_job(job: JobToPlan, graph: JobGraph, memory: StepMemory | None, latencies) -> CapturedJob:
    """The capture of phases 1-3: ``memory`` (None: not traced) written into the graph, the batch
    kept as its specs (Note [Example batch])."""
    peaks = apply_step_memory(graph, memory) if memory is not None else None
    job = replace(job, example_args=batch_specs(job.example_args))
    return CapturedJob(job, graph, PlannerJob(graph, latencies, job.start_offset_s, job.max_swapping_rate),
                       unplanned_peaks=peaks)


def with_memory_as_planned(free: StepMemory, as_planned: StepMemory) -> StepMemory:
    """Note [Memory of the step as planned]: scratch, forwarded bytes and views from the chained
    step's trace; what the executor's threads hold and what the job holds between steps from the
    free step's."""
    return replace(free, scratch=as_planned.scratch, forwarded=as_planned.forwarded, views=as_planned.views)


def plan_order_latencies(table):
    """A latency table measured on the chained step (Note [Latency time base])."""
    return replace(table, source=f"{table.source}, plan order", step_order="plan")


def plan_order_step(job: JobToPlan, graph: JobGraph) -> PlannedStep:
    """The job's step with its ops chained in plan order and no events: the
    rewrite's chain alone (Note [Plan order] in tensile_tf/tf/rewrite/), the
    step a planned step will be before a plan adds its events."""
    return chain_in_plan_order(job.step_fn, job.example_args, job.name, graph)


def _as_planned(free: StepMemory, job: JobToPlan, graph: JobGraph, chained: PlannedStep) -> StepMemory:
    """Note [Memory of the step as planned]: scratch, forwarded bytes and
    views from the chained step's trace; what the executor's threads hold
    and what the job holds between steps from the free step's. The free
    step's trace stands where the chained step does not fit the pool."""
    try:
        as_planned = measure_step_memory(job.step_fn, job.example_args, graph, steps=MIN_TRACED_STEPS,
                                         run_fn=chained.fn, op_name_prefix=REWRITE_PREFIX + "/")
    except tf.errors.ResourceExhaustedError:
        return free
    return with_memory_as_planned(free, as_planned)


def measure_plan_order_latencies(job: JobToPlan, graph: JobGraph, *, repeats: int = 3,
                                 chained: PlannedStep | None = None):
    """The op latencies of the job's step with its ops chained in plan order
    (``chained``, else ``chained_step``), as a planned step runs them (Note
    [Latency time base] in tensile_tf/scheduler/latency.py); the variables
    are restored. None when the chained step does not fit the pool (it can
    peak above the free one on a branchy graph): the caller measures the step
    as it runs free."""
    chained = chained or plan_order_step(job, graph)
    try:
        table = measure_op_latencies(job.step_fn, job.example_args, graph=graph, repeats=repeats, run_fn=chained.fn)
    except tf.errors.ResourceExhaustedError:
        return None
    return plan_order_latencies(table)


def capture_cold(job: JobToPlan) -> CapturedJob:
    """Captures a job for planning without running its step (§IV-A cold
    start): for a job whose vanilla step does not fit the pool, so it can be
    neither profiled nor measured. Static shapes (dynamic ones count 0),
    no scratch bytes; op latencies from the learned predictor that `tensile
    calibrate` cached, with the step's compute kernels timed alone (Note
    [Kernels timed alone]), else ``ColdStartLatency`` (bytes touched)."""
    from tensile_tf.tf.calibration import cached_predictor
    from tensile_tf.tf.kernel_timing import time_kernels_alone
    try:
        graph = capture_job_graph(job.name, job.step_fn, job.example_args, optimizer=job.optimizer,
                                  measure_dynamic=False)
        graph = executor_order(graph, job.step_fn, job.example_args)
    except Exception as e:  # noqa: BLE001 - name the job
        raise RuntimeError(f"job '{job.name}': could not capture its train step: {e}") from e
    predictor = cached_predictor()
    alone = None
    if predictor is not None and predictor.alone_scale is not None:
        try:
            alone = time_kernels_alone(job.step_fn, job.example_args, graph, predictor.times_alone)
        except Exception as e:  # noqa: BLE001 - the MLP predicts every op then; say so
            warnings.warn(f"job '{job.name}': its kernels could not be timed alone ({type(e).__name__}: {e}); "
                          "its cold-start latencies come from the learned predictor alone", stacklevel=2)
    latencies = cold_start_latency(graph, predictor, alone)
    job = replace(job, example_args=batch_specs(job.example_args))   # Note [Example batch]
    return CapturedJob(job, graph, PlannerJob(graph, latencies, job.start_offset_s, job.max_swapping_rate), cold=True)


def plan_captured(captured: Sequence[CapturedJob], *, pool_bytes: int | None,
                  bandwidth_bytes_per_s: float | None = None, enable_recompute: bool = True,
                  delta_scale: float = 1.0, horizon_iterations: float = 2.0,
                  coincident_peaks: bool = False,
                  peaking_jobs: int | None = None,
                  unplanned_peaking_jobs: int | None = None,
                  strategy: str = "tensile", step_order: str = "plan",
                  unchain: bool = True, current: Mapping[str, PlannedStep] | None = None,
                  rewrite_unchanged: bool = True,
                  on_step_made: Callable[[str, PlannedStep], None] | None = None,
                  plan_steps: str = "table_then_rewrite", link_lanes: int = 1,
                  combined_bytes_per_s: float | None = None,
                  ) -> tuple[Plan, dict[str, PlannedStep]]:
    """Plans captured jobs together and rewrites each one's step.
    ``peaking_jobs``: with ``coincident_peaks``, how many jobs' peaks meet
    (Note [Paired peaks] in tensile_tf.scheduler.peak_analysis);
    ``unplanned_peaking_jobs``: how many meet while no job runs a plan (whether
    the unplanned steps fit; default ``peaking_jobs``).
    ``unchain``: a plan-order step leaves its ops free inside runs where the
    footprint has slack (Note [Unchained runs] in
    tensile_tf.scheduler.unchained_runs); False chains every op.
    ``strategy``: the planner's policy, TENSILE's Algorithm 3 or a baseline
    on the same sequences, link and swap ops (``scheduler.baselines.STRATEGIES``).
    ``step_order``: "plan" chains each planned step's ops in plan order,
    "free" leaves them to the executor's threads, "auto" takes the free-order
    plan when it meets the budget by swaps alone and plans in plan order
    otherwise (Note [Free-order plans] in tensile_tf.scheduler.peak_analysis).
    ``current``: each job's planned step now (a re-plan), reused where the
    new plan rewrites the step the same way; ``rewrite_unchanged`` False: a
    plan that leaves a step as it is gets the job's own step back, no
    rewrite (Note [Re-plans users do not feel]). ``on_step_made(name,
    step)``: called as each job's step is made (not for one reused).
    ``plan_steps``: "rewrite" rewrites each plan into its own step;
    "table" runs a plan that only swaps on the job's plan-table step,
    built once and told each plan through its table (Note [Plans read at
    run time] in tf_plugin/swap/plan_table.h; ``RewriteReport.plan_table``
    says, for each step, whether the table carries it and if not why);
    "table_then_rewrite" (the run's default) runs such a plan on the table
    step until its rewritten step is built by the background work each
    step carries (Note [Table first, rewritten when ready]).
    ``link_lanes``, ``combined_bytes_per_s``: the link's lanes and cap on
    both directions (Note [A lane per direction] in
    tensile_tf/scheduler/swap_scheduling.py)."""
    from tensile_tf.scheduler.baselines import STRATEGIES

    if strategy not in STRATEGIES:
        raise ValueError(f"planner strategy {strategy!r}: choose one of {sorted(STRATEGIES)}")
    t0 = time.perf_counter()
    # Note [Re-plans users do not feel]: no collection in the planner or the rewrites; one region, so
    # that the collection it defers does not land between the two
    with collections_paused():
        plan = plan_in_step_order(STRATEGIES[strategy], [c.planner_job for c in captured], step_order,
                                  pool_bytes=pool_bytes,
                                  bandwidth_bytes_per_s=bandwidth_bytes_per_s or DEFAULT_BANDWIDTH_BYTES_PER_S,
                                  horizon_iterations=horizon_iterations, enable_recompute=enable_recompute,
                                  coincident_peaks=coincident_peaks, peaking_jobs=peaking_jobs,
                                  unplanned_peaking_jobs=unplanned_peaking_jobs, unchain=unchain,
                                  link_lanes=link_lanes, combined_bytes_per_s=combined_bytes_per_s)
        plan.planning_s = time.perf_counter() - t0   # the whole planner: its passes and the plan's unchained runs
        steps = {}
        for c in captured:
            jp, mine = plan.jobs[c.job.name], (current or {}).get(c.job.name)
            # a table step's rows are timed by the latencies now: encoded again, not reused
            if (mine is not None and delta_scale == 1.0 and mine.job_plan.rewrites_like(jp)
                    and not isinstance(mine.fn, TableCall)):
                steps[c.job.name] = replace(mine, job_plan=jp,       # the same rewrite: reused, not redone
                                            instantiate_s=None, instantiate_error=None)   # nor instantiated
            elif not jp.changes_step and not rewrite_unchanged:
                steps[c.job.name] = PlannedStep(c.job.step_fn, jp, RewriteReport(c.job.name))
            else:
                steps[c.job.name] = _made_step(c, jp, delta_scale, plan_steps)
                made = steps[c.job.name]
                if on_step_made is not None and (getattr(made.fn, "needs_instantiation", False)
                                                 or made.background is not None):
                    on_step_made(c.job.name, steps[c.job.name])   # e.g. instantiated while the next job's is made
    return plan, steps


def _made_step(c: CapturedJob, jp, delta_scale: float, plan_steps: str) -> PlannedStep:
    """The job's step under ``jp``: on its plan-table step when asked and
    the table carries the plan, else rewritten (Note [Table first,
    rewritten when ready] for ``table_then_rewrite``)."""
    why = ""
    if plan_steps in ("table", "table_then_rewrite") and delta_scale == 1.0:
        latencies = c.planner_job.latencies
        try:
            if plan_steps == "table":
                table, _ = table_step_for(c.job.step_fn, c.job.example_args, c.graph, c.job.name, latencies)
            else:
                table = ready_table_step(c.job.step_fn, c.graph)
            encoded = why_no_table_step(c.job.step_fn) if table is None else table.encode(jp, latencies)
        except Exception as e:  # noqa: BLE001 - the plan is rewritten instead, and says why
            encoded = f"the plan-table step failed ({type(e).__name__}: {e})"
        if not isinstance(encoded, str):
            encoded.report.plan_table = "table"
            if plan_steps == "table":
                return table.planned_step(jp, encoded)
            return table_then_rewritten_step(table, jp, encoded, lambda: _rewritten(c, jp, "rewritten after the table"))
        why = f"rewritten: {encoded}"
    step = _rewritten(c, jp, why, delta_scale)
    if plan_steps == "table_then_rewrite" and why.endswith("being built") and jp.changes_step:
        step.background = build_table_in_background(c)   # for the job's later plans
    return step


def _rewritten(c: CapturedJob, jp, why: str, delta_scale: float = 1.0) -> PlannedStep:
    step = apply_plan(c.job.step_fn, c.job.example_args, jp, c.graph, delta_scale=delta_scale)
    step.report.plan_table = why
    return step
