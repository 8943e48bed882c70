"""Note [Recomputation first] (scheduler/planner_passes.py) and Note
[Recomputations that pin a larger one] (scheduler/recompute.py), on the
saved captures of benchmarks/captures/ (pure: no TensorFlow), each against
the exact planner's proven optimum and with the mechanism turned off as the
control."""
from pathlib import Path

import pytest

from benchmarks.captures.capture import load_capture
from tensile_tf.scheduler import Planner, PlannerJob
from tensile_tf.scheduler import recompute as recompute_module
from tensile_tf.scheduler.exact_candidates import check_plan

CAPTURES = Path(__file__).resolve().parents[2] / "benchmarks" / "captures"
UNLIMITED = 1e15


class SwapsFirstOnly(Planner):
    recompute_first_passes = False


def _job(stem: str) -> PlannerJob:
    graph, lat = load_capture(CAPTURES / f"{stem}.json")
    return PlannerJob(graph, lat)


def test_recomputing_first_reaches_the_proven_optimum_where_swapping_first_stays_11_percent_above():
    pytest.importorskip("ortools")
    from tensile_tf.scheduler.exact_planner import ExactPlanner

    jobs = [_job("small_cnn_b64")]
    planner = Planner(jobs, bandwidth_bytes_per_s=UNLIMITED)
    plan = planner.plan()
    exact = ExactPlanner(jobs, bandwidth_bytes_per_s=UNLIMITED, time_limit_s=30).solve()
    assert exact.status == "optimal"
    assert plan.pool_planned_peak_bytes <= exact.plan_peak_bytes
    assert planner.recompute_first                     # the pass kept is the one that recomputed first
    (job,) = plan.jobs.values()
    assert any(ev.target.endswith("conv2d_2_1/Relu:0") for ev in job.recomputes)   # the 4 MiB ReLU output rebuilt
    assert check_plan(planner).agrees
    # the controls: swaps first only, and recompute-first without the ranking that defers a pinning rebuild
    control = SwapsFirstOnly(jobs, bandwidth_bytes_per_s=UNLIMITED).plan()
    assert control.pool_planned_peak_bytes > 1.10 * exact.plan_peak_bytes
    try:
        recompute_module._pinning_after_pinned, kept = (lambda jobs, cands: cands), recompute_module._pinning_after_pinned
        msps_only = Planner(jobs, bandwidth_bytes_per_s=UNLIMITED).plan()
    finally:
        recompute_module._pinning_after_pinned = kept
    assert msps_only.pool_planned_peak_bytes > 1.10 * exact.plan_peak_bytes


def test_a_budget_swaps_first_missed_is_met_by_recomputing_first():
    jobs = [_job("small_cnn_b16")]
    vanilla = Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes
    budget = int(0.5 * vanilla)
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=110 * 2**20)
    assert planner.plan().budget_met and planner.recompute_first
    assert not SwapsFirstOnly(jobs, pool_bytes=budget, bandwidth_bytes_per_s=110 * 2**20).plan().budget_met


def test_a_budget_swaps_meet_never_plans_a_pass_that_recomputes_first():
    jobs = [_job("small_cnn_b16")]
    vanilla = Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes
    passes = []

    class Counting(Planner):
        def _plan_pass(self):
            passes.append(self.recompute_first)
            super()._plan_pass()

    planner = Counting(jobs, pool_bytes=int(0.8 * vanilla), bandwidth_bytes_per_s=UNLIMITED)
    assert planner.plan().budget_met
    assert passes and not any(passes) and not planner.recompute_first
