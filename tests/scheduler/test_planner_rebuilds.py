"""Note [Rebuilds of the jobs that changed] (scheduler/planner_rebuilds.py):
a recomputation round rebuilds only the jobs it changed, the others keeping
their transfers on a copy of the link. Checked against the full rebuild it
replaces (the control: every job replayed) on saved captures, and as a
property on random jobs: the partial rebuild runs, and its plans keep the
planner's invariants."""
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from benchmarks.captures.capture import load_capture
from tensile_tf.scheduler import JobGraph, Planner, PlannerJob
from tensile_tf.scheduler.swap_channel import SwapChannel
from tests.scheduler.test_planner_properties import check_invariants, scenarios

CAPTURES = Path(__file__).resolve().parents[2] / "benchmarks" / "captures"


class Counting(Planner):
    """Counts the rebuilds that stayed partial."""

    def _rebuild_changed_jobs(self, restructure, tases):
        done = super()._rebuild_changed_jobs(restructure, tases)
        self.__dict__.setdefault("partial", []).append(done)
        return done


class EveryJobReplayed(Planner):
    """The control: every rebuild replays every job (the planner before the note)."""

    def _rebuild_changed_jobs(self, restructure, tases):
        return False


def _jobs(stem: str, k: int) -> list[PlannerJob]:
    graph, lat = load_capture(CAPTURES / f"{stem}.json")
    if k == 1:
        return [PlannerJob(graph, lat)]
    return [PlannerJob(JobGraph(f"{graph.name}-{i}", graph.ops, graph.tensors), lat, start_offset_s=0.01 * i)
            for i in range(k)]


def test_partial_rebuilds_plan_the_peaks_of_full_ones_on_saved_captures():
    cases = [("small_cnn_b64", 1, 1e15, None), ("residual_net_b32", 1, 110 * 2**20, None),
             ("residual_net_b8", 2, 110 * 2**20, 0.5)]
    partial_rounds = 0
    for stem, k, bandwidth, frac in cases:
        jobs = _jobs(stem, k)
        budget = None
        if frac is not None:
            budget = int(frac * Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes)
        partial = Counting(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
        plan = partial.plan()
        full = EveryJobReplayed(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth).plan()
        assert plan.pool_planned_peak_bytes == full.pool_planned_peak_bytes, stem
        check_invariants(partial, plan)
        partial_rounds += sum(partial.__dict__.get("partial", []))
    assert partial_rounds > 0          # the mechanism ran: some rebuilds stayed partial


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=60)
@given(scenarios())
def test_plans_made_with_partial_rebuilds_keep_the_invariants(scn):
    jobs, bandwidth, frac = scn
    budget = None if frac is None else max(1, int(Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes * frac))
    planner = Counting(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    check_invariants(planner, planner.plan())


def test_a_copy_of_the_link_keeps_the_other_jobs_transfers_and_their_repeats():
    channel = SwapChannel(1.0, 10.0, [0.0, 0.0], [4.0, 5.0])
    a = channel.reserve(0, 1.0, 0.5, direction="out")          # job 0 at 1, 5, 9
    b = channel.reserve(1, 2.0, 0.5, direction="in")           # job 1 at 2, 7
    copy = channel.without({b}, [4.0, 6.0], 12.0)              # job 1 changed; the horizon grew to 12
    assert copy.busy_intervals() == [(1.0, 1.5), (5.0, 5.5), (9.0, 9.5)]   # job 0's repeat at 13 is past 12
    assert channel.busy_intervals() == [(1.0, 1.5), (2.0, 2.5), (5.0, 5.5), (7.0, 7.5), (9.0, 9.5)]  # untouched
    longer = channel.without({b}, [4.0, 6.0], 14.0)
    assert longer.busy_intervals() == [(1.0, 1.5), (5.0, 5.5), (9.0, 9.5), (13.0, 13.5)]
    blocked = SwapChannel(1.0, 10.0, [0.0, 0.0], [4.0, 5.0])
    blocked.reserve(0, 1.0, 0.5, direction="out")
    blocked.reserve(1, 3.0, 0.5, direction="out")              # job 1 at 3, 8; over 14 s also at 13, as job 0
    assert blocked.without(set(), [4.0, 5.0], 14.0) is None    # an added repeat overlaps: the caller replays all
    assert a in copy.reserved and b not in copy.reserved
