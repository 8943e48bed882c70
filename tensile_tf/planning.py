"""Plan several jobs from their train steps: capture -> measure -> plan.

The TensorFlow side (``capture``) turns each job's ``tf.function`` into a
JobGraph and a LatencyTable; the pure planner (``tensile_tf.scheduler``) turns
them into one ``Plan`` for the shared pool.
"""
from __future__ import annotations

from typing import Any, Sequence

from tensile_tf.capture import capture_job_graph, measure_op_latencies
from tf_plugin import human_bytes
from tensile_tf.scheduler import DEFAULT_BANDWIDTH_BYTES_PER_S, Plan, Planner, PlannerJob


def _fmt(n: float) -> str:
    return human_bytes(int(n))


def planner_jobs(jobs: Sequence[Any], *, latency_repeats: int = 3) -> list[PlannerJob]:
    """Captures and measures each job (objects with .name, .step_fn, .example_args,
    .optimizer, .max_swapping_rate, .start_offset_s). Jobs sharing a step function
    and argument shapes are captured once."""
    out: list[PlannerJob] = []
    for job in jobs:
        name = job.name
        args = tuple(job.example_args)
        try:
            graph = capture_job_graph(name, job.step_fn, args, optimizer=getattr(job, "optimizer", None))
            lat = measure_op_latencies(job.step_fn, args, graph=graph, repeats=latency_repeats)
        except Exception as e:  # noqa: BLE001 - name the job in whatever went wrong
            raise RuntimeError(f"job '{name}': could not capture or profile its train step: {e}") from e
        out.append(PlannerJob(graph, lat, float(getattr(job, "start_offset_s", 0.0) or 0.0),
                              float(getattr(job, "max_swapping_rate", 1.0) or 1.0)))
    return out


def plan_jobs(jobs: Sequence[Any], *, pool_bytes: int | None, bandwidth_bytes_per_s: float | None = None,
              horizon_iterations: float = 2.0, stop_at_budget: bool = True, enable_recompute: bool = True,
              latency_repeats: int = 3) -> Plan:
    """Captures, measures and plans ``jobs`` for a pool of ``pool_bytes`` (None:
    minimise the peak by swapping only). ``bandwidth_bytes_per_s``: the swap link
    (default: PCIe 3.0 x16, 12 GiB/s)."""
    pjobs = planner_jobs(jobs, latency_repeats=latency_repeats)
    planner = Planner(pjobs, pool_bytes=pool_bytes,
                      bandwidth_bytes_per_s=bandwidth_bytes_per_s or DEFAULT_BANDWIDTH_BYTES_PER_S,
                      horizon_iterations=horizon_iterations, stop_at_budget=stop_at_budget,
                      enable_recompute=enable_recompute)
    return planner.plan()


def format_plan_summary(plan: Plan) -> str:
    """Predicted vanilla and planned peaks per job and for the pool, one line each."""
    rows = [f"{'job':<20} {'vanilla peak':>13} {'planned peak':>13} {'MSR':>6} {'swaps':>6} "
            f"{'recomp':>6} {'iter s':>9} {'+recomp s':>9}"]
    for jp in plan.jobs.values():
        rows.append(f"{jp.name:<20} {_fmt(jp.vanilla_peak_bytes):>13} {_fmt(jp.planned_peak_bytes):>13} "
                    f"{jp.msr:>6.1%} {len(jp.swap_ins):>6} {len(jp.recomputes):>6} "
                    f"{jp.iteration_s:>9.4f} {jp.planned_iteration_s - jp.iteration_s:>9.4f}")
    rows.append(f"{'pool (time-aligned)':<20} {_fmt(plan.pool_vanilla_peak_bytes):>13} "
                f"{_fmt(plan.pool_planned_peak_bytes):>13} {plan.msr:>6.1%}")
    budget = "none (minimise)" if plan.pool_bytes is None else _fmt(plan.pool_bytes)
    rows.append(f"budget {budget}: {'met' if plan.budget_met else 'NOT met'}; sum of per-job peaks "
                f"{_fmt(plan.sum_of_job_peaks_bytes)}; swap link {_fmt(plan.bandwidth_bytes_per_s)}/s; "
                f"{plan.iterations} iterations, {plan.planning_s * 1e3:.1f} ms; stop: {plan.stop_reason}")
    return "\n".join(rows)
