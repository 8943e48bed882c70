"""Note [Restarts that serve nothing new] (scheduler/planner_passes.py) and
Note [Sequences built once per recomputation set] (scheduler/planner_rebuilds.py):
work the planner leaves out because it would repeat work done. Each is checked
against its control (the planner that repeats it) on saved captures: the same
plan, decision for decision, and the mechanism ran."""
import pytest

from tensile_tf.scheduler import Planner
from tests.scheduler.test_planner_rebuilds import _jobs

CAPPED = 110 * 2**20


class EveryRestartRun(Planner):
    skip_restarts_that_serve_nothing_new = False


class EverySequenceBuilt(Planner):
    recompute_structures_kept = 0


def _events(plan):
    return {name: (jp.swap_outs, jp.swap_ins, jp.recomputes) for name, jp in plan.jobs.items()}


def _planned(cls, stem, k, bandwidth, frac):
    jobs = _jobs(stem, k)
    budget = None if frac is None else int(frac * Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes)
    planner = cls(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    return planner, planner.plan()


def test_a_restart_left_out_would_have_planned_the_same():
    # the mlp_b32 cases leave restarts out; in the mlp_b256 and Transformer cases a restart lowers the peak
    cases = [("mlp_b32", 1, CAPPED, None), ("mlp_b32", 1, CAPPED, 0.5), ("mlp_b32", 2, 1e15, None),
             ("mlp_b256", 1, CAPPED, 0.5), ("transformer_b4", 1, CAPPED, 0.7)]
    skipped = restarts_kept = 0
    for case in cases:
        planner, plan = _planned(Planner, *case)
        control, full = _planned(EveryRestartRun, *case)
        assert control.restarts_skipped == 0
        assert plan.pool_planned_peak_bytes == full.pool_planned_peak_bytes, case
        assert _events(plan) == _events(full), case
        skipped += planner.restarts_skipped
        restarts_kept += bool(planner.bottlenecks)
    assert skipped > 0 and restarts_kept >= 2


@pytest.mark.parametrize("stem,k,bandwidth,frac", [("small_cnn_b16", 2, CAPPED, 0.5), ("residual_net_b8", 2, CAPPED, 0.5),
                                                   ("small_cnn_b64", 1, 1e15, None)])
def test_a_sequence_built_once_plans_as_one_built_again(stem, k, bandwidth, frac):
    planner, plan = _planned(Planner, stem, k, bandwidth, frac)
    control, full = _planned(EverySequenceBuilt, stem, k, bandwidth, frac)
    assert planner.recompute_structures_reused > 0 and control.recompute_structures_reused == 0
    assert plan.pool_planned_peak_bytes == full.pool_planned_peak_bytes
    assert _events(plan) == _events(full)
    # each job's sequence is its own copy: its name, the structure shared
    assert {js.tas.job for js in planner.jobs} == {js.name for js in planner.jobs}
