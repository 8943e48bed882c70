"""Minimise mode (``pool_bytes=None``, Note [Minimise mode] in
scheduler/planner_passes.py): swaps and recomputation, a loop that stops
only when no candidate of any job lowers the peak, and a series of passes
aimed at targets. By hand on small graphs; as a property, no budgeted plan
of the same jobs peaks lower than the minimised one."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensile_tf.scheduler import GraphBuilder, Planner, PlannerJob, UniformLatency
from tensile_tf.scheduler.planner_passes import MINIMISED
from tests.scheduler.graphs import recompute_graph
from tests.scheduler.test_planner_properties import check_invariants, scenarios

UNIT = UniformLatency(1.0)
SLOW_LINK = 1.0   # bytes/s: no swap fits, only recomputation lowers a peak


def test_minimise_mode_recomputes_to_what_a_budget_reaches():
    # recompute_graph: dropping a after f2 and re-running f1 before b1 takes f3 and f4 from 420 to 320
    job = PlannerJob(recompute_graph(), UNIT)
    planner = Planner([job], bandwidth_bytes_per_s=SLOW_LINK)
    plan = planner.plan()
    (ev,) = plan.jobs["rc"].recomputes
    assert (ev.target, ev.ops) == ("a", ["f1"])
    budgeted = Planner([job], bandwidth_bytes_per_s=SLOW_LINK, pool_bytes=320).plan()
    assert plan.pool_planned_peak_bytes == budgeted.pool_planned_peak_bytes == 320 < plan.pool_vanilla_peak_bytes
    assert plan.stop_reason.startswith(MINIMISED) and "recomputation" in plan.stop_reason
    check_invariants(planner, plan)
    # enable_recompute=False still means swaps only: nothing fits the link, nothing is planned
    swaps_only = Planner([job], bandwidth_bytes_per_s=SLOW_LINK, enable_recompute=False).plan()
    assert not swaps_only.jobs["rc"].recomputes and swaps_only.pool_planned_peak_bytes == 420
    assert "no swap of any job" in Planner([job], bandwidth_bytes_per_s=1e9, enable_recompute=False).plan().stop_reason


def _two_candidates_graph():
    """Steps (unit latency): fB 110 | fA 260 | u 261 | peak1 561 | useA 561 | peak2 311 | useB 311.
    A (150 B, one op to rebuild) has the highest MSPS at peak1 but is read at useA,
    which stays at 561; B (100 B) is away over peak1, useA and peak2."""
    b = GraphBuilder("two")
    b.tensor("x", 10, "input")
    b.op("fB", inputs=["x"], outputs={"B": 100})
    b.op("fA", inputs=["x"], outputs={"A": 150})
    b.op("u", inputs=["A", "B"], outputs={"h": 1})
    b.op("peak1", inputs=["h"], outputs={"big1": 300})
    b.op("useA", inputs=["A", "big1"], outputs={"k": 1})
    b.op("peak2", inputs=["k"], outputs={"big2": 200})
    b.op("useB", inputs=["B", "big2"], outputs={"g": 1})
    return b.build()


def test_minimise_mode_keeps_going_past_a_candidate_that_lowers_nothing():
    # the first recomputation tried (A) leaves useA at 561; the loop goes on to B: 461
    rounds = []

    class Counting(Planner):
        def _recompute_round(self, pa, need):
            rounds.append(super()._recompute_round(pa, need))
            return rounds[-1]

    planner = Counting([PlannerJob(_two_candidates_graph(), UNIT)], bandwidth_bytes_per_s=SLOW_LINK)
    plan = planner.plan()
    assert rounds[:3] == [False, True, None]      # A lowered nothing, B did, then none was left
    assert [e.target for e in plan.jobs["two"].recomputes] == ["B"]
    assert plan.pool_planned_peak_bytes == 461 and plan.pool_vanilla_peak_bytes == 561
    check_invariants(planner, plan)


@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True, deadline=None, max_examples=30)
@given(scenarios(), st.floats(0.0, 1.0))
def test_no_plan_at_a_budget_the_series_aimed_at_peaks_below_the_minimised_plan(scn, where):
    """Note [Minimise mode]: a pass aimed at b is the budgeted plan at b until it meets b, then only
    lowers the peak, so no plan at a budget the series aimed at peaks lower. At budgets it did not
    aim at that is measured, not promised (a random budget once planned 2,022 B against the
    minimised 2,025: generated examples change with the constants Hypothesis finds in the loaded
    modules, derandomized or not, so the test keeps to what is promised)."""
    jobs, bandwidth, _ = scn
    planner = Planner(jobs, pool_bytes=None, bandwidth_bytes_per_s=bandwidth)
    minimised = planner.plan()
    check_invariants(planner, minimised)
    aimed = [t for t in planner.minimise_targets if t]     # the bisection's budgets (not the chase, not 0)
    if not aimed:
        return
    budget = aimed[min(len(aimed) - 1, int(where * len(aimed)))]
    budgeted = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth).plan()
    assert minimised.pool_planned_peak_bytes <= budgeted.pool_planned_peak_bytes, (budget, aimed)


def test_no_iterations_plan_nothing_in_minimise_mode_too():
    """``max_iterations=0`` is how benchmarks and tests ask for the unplanned
    figures (a budget is then a share of them): minimise mode books nothing,
    restarts included."""
    from tensile_tf.scheduler import LatencyTable, Planner, PlannerJob
    from tests.scheduler.graphs import fig1_graph

    g = fig1_graph()
    jobs = [PlannerJob(g, LatencyTable({o.name: 1.0 for o in g.ops}))]
    plan = Planner(jobs, bandwidth_bytes_per_s=1e9, max_iterations=0).plan()
    assert not any(jp.swap_outs or jp.swap_ins or jp.recomputes for jp in plan.jobs.values())
    assert plan.pool_planned_peak_bytes == 510
    # the control: with iterations the same planner does plan (w1 away over u2)
    assert Planner(jobs, bandwidth_bytes_per_s=1e9).plan().pool_planned_peak_bytes == 410
