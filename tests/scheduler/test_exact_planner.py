"""The exact planner (CP-SAT) on tiny graphs: plans worked out by hand, the
greedy planner measured against it, and the check that keeps the two
models from drifting apart (Note [The exact planner] in
tensile_tf/scheduler/exact_planner.py)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensile_tf.scheduler import GraphBuilder, LatencyTable, Plan, Planner, PlannerJob
from tensile_tf.scheduler.exact_candidates import check_plan
from tensile_tf.scheduler.exact_planner import ExactPlanner
from tests.scheduler.graphs import fig1_graph, recompute_graph
from tests.scheduler.test_planner_properties import job_graphs

pytest.importorskip("ortools", reason='the exact planner needs OR-Tools: pip install -e ".[exact]"')


def unit(g):
    return LatencyTable({o.name: 1.0 for o in g.ops})


def two_lane_graph():
    """Found by search: at 200 B/s with unit latencies one lane reaches 858 B,
    a lane per direction 734 (w0's copy out and m0's way back share the
    optimizer phase)."""
    b = GraphBuilder("lanes")
    b.tensor("x", 6, "input").tensor("w0", 161, "parameter").tensor("w1", 109, "parameter")
    b.tensor("m0", 147, "slot").tensor("m1", 37, "slot")
    b.op("op0", inputs=["x", "w0"], outputs={"t0": 247}, temp_bytes=32)
    b.op("op1", inputs=["w0", "w1", "x"], outputs={"t1": 188}, temp_bytes=1)
    b.op("upd0", inputs=["t0"], updates=["w0"])
    b.op("upd1", inputs=["t0"], updates=["w1"])
    b.op("upd2", inputs=["t0"], updates=["m0"])
    b.op("upd3", inputs=["t1"], updates=["m1"])
    return b.build()


def test_fig1_minimised_by_hand():
    # u2's scratch makes the peak (510); w1, updated by u1, can be away over it: 410, the floor
    g = fig1_graph()
    r = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1e9).solve()
    assert r.optimal and r.peak_bytes == r.bound_bytes == 410
    assert r.plan_peak_bytes == 410
    # w1 must be away over u2; at u1 (411) one byte is enough, but the loss is read by metric right
    # after u1 (a swap-in counts from the step it starts in), so w2 is away over u1 instead
    jp = r.plan.jobs[g.name]
    assert {e.tensor for e in jp.swap_ins} == {"w1", "w2"}
    greedy = Planner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1e9).plan()
    assert r.swapped_bytes <= greedy.jobs[g.name].swapped_bytes_per_iteration


def test_recomputation_chosen_where_no_swap_fits():
    # a slow link (no transfer fits) leaves recomputation: drop `a` after f2, re-run f1 before b1 (320 B)
    g = recompute_graph()
    r = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1.0).solve()
    assert r.optimal and r.peak_bytes == r.plan_peak_bytes == 320
    ev, = r.plan.jobs[g.name].recomputes
    assert (ev.target, ev.ops, ev.before_op) == ("a", ["f1"], "b1")
    assert r.recompute_s == pytest.approx(1.0)
    # a control without recomputation: nothing fits, the unplanned peak stays
    r0 = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1.0, recompute=False).solve()
    assert r0.optimal and r0.peak_bytes == 420


def test_a_budget_below_the_floor_is_proven_out_of_reach():
    g = fig1_graph()
    r = ExactPlanner([PlannerJob(g, unit(g))], pool_bytes=400, bandwidth_bytes_per_s=1e9).solve()
    assert r.status == "infeasible" and r.plan is None and r.bound_bytes == 410


def test_a_lane_per_direction_lets_a_copy_out_and_one_back_overlap():
    g = two_lane_graph()
    one = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=200.0, lanes=1, recompute=False).solve()
    two = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=200.0, lanes=2, recompute=False).solve()
    assert one.optimal and two.optimal
    assert (one.peak_bytes, two.peak_bytes) == (858, 734)
    jp = two.plan.jobs[g.name]
    spans = [(e.start_s, e.start_s + e.duration_s, e.kind) for e in jp.swap_outs + jp.swap_ins]
    overlapping = [(a, b) for a in spans for b in spans
                   if a[2] == "swap_out" and b[2] == "swap_in" and a[0] < b[1] and b[0] < a[1]]
    assert overlapping, spans


def test_exact_plans_are_plans():
    g = recompute_graph()
    r = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1.0).solve()
    again = Plan.from_json(r.plan.to_json())
    assert again.jobs[g.name].recomputes == r.plan.jobs[g.name].recomputes
    assert again.jobs[g.name].graph_fingerprint == g.fingerprint()
    assert r.plan.refusal(g.name, g.fingerprint(), len(g.ops)) is None


@st.composite
def cases(draw):
    g, lat = draw(job_graphs("a"))
    return g, lat, draw(st.sampled_from([20.0, 100.0, 500.0, 1e9])), draw(st.sampled_from([None, 0.5, 0.7, 0.9]))


# few examples: in a suite worker that ran TensorFlow each solve is a child interpreter (~1 s;
# Note [CP-SAT beside TensorFlow] in tensile_tf/scheduler/exact_planner.py)
@settings(max_examples=12, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_greedy_plans_are_points_of_the_exact_model(case):
    """Every greedy plan passes check_plan (its absences follow from its
    transfer times by the model's rule, no lane holds two transfers), and
    within the model the exact planner is never worse: at most the greedy
    minimised peak, and every budget the greedy plan meets is feasible."""
    g, lat, bw, frac = case
    jobs = [PlannerJob(g, lat)]
    vanilla = Planner(jobs, bandwidth_bytes_per_s=bw).plan().pool_vanilla_peak_bytes
    budget = None if frac is None else int(vanilla * frac)
    greedy = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bw)
    plan = greedy.plan()
    check = check_plan(greedy)
    assert check.agrees, check.problems
    exact = ExactPlanner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bw, time_limit_s=20).solve(hint=greedy)
    assert exact.status in ("optimal", "infeasible")
    if exact.plan is not None:
        assert exact.plan_peak_bytes <= exact.peak_bytes
    if check.outside_model:
        return
    if budget is None:
        assert exact.peak_bytes <= plan.pool_planned_peak_bytes
    elif plan.budget_met:
        assert exact.status == "optimal" and exact.plan_peak_bytes <= budget


@settings(max_examples=8, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_two_lanes_never_plan_worse_than_one(case):
    g, lat, bw, _ = case
    jobs = [PlannerJob(g, lat)]
    one = ExactPlanner(jobs, bandwidth_bytes_per_s=bw, lanes=1, recompute=False).solve()
    two = ExactPlanner(jobs, bandwidth_bytes_per_s=bw, lanes=2, recompute=False).solve()
    assert two.peak_bytes <= one.peak_bytes


def test_two_jobs_are_planned_for_the_sum_of_their_peaks():
    a, b = fig1_graph("a"), fig1_graph("b")
    r = ExactPlanner([PlannerJob(a, unit(a)), PlannerJob(b, unit(b))], bandwidth_bytes_per_s=1e9).solve()
    assert r.optimal and r.peak_bytes == r.plan_peak_bytes == 820
    with pytest.raises(ValueError, match="sum of their peaks"):
        ExactPlanner([PlannerJob(a, unit(a)), PlannerJob(b, unit(b))], coincident_peaks=False)


def test_isolated_solves_share_one_child_and_a_dead_one_is_replaced():
    """Note [One solver child per process] (tensile_tf/scheduler/solver_child.py)."""
    import os
    import signal

    from tensile_tf.scheduler.solver_child import SolverChild

    g = recompute_graph()

    def solve():
        r = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1.0, isolate=True).solve()
        assert r.optimal and r.peak_bytes == 320
        return SolverChild.pid(), SolverChild.started

    first, started = solve()
    assert solve() == (first, started)   # the second solve asked the same child
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    pid, again = solve()
    assert again == started + 1 and pid not in (None, first)


def test_a_solve_in_a_child_interpreter_reads_the_same_plan():
    """Note [CP-SAT beside TensorFlow]: where TensorFlow is loaded the solve runs
    in a child interpreter; forced here, it reads back the plan worked out by hand
    (test_recomputation_chosen_where_no_swap_fits)."""
    g = recompute_graph()
    child = ExactPlanner([PlannerJob(g, unit(g))], bandwidth_bytes_per_s=1.0, isolate=True).solve()
    assert child.optimal and child.peak_bytes == child.plan_peak_bytes == 320
    ev, = child.plan.jobs[g.name].recomputes
    assert (ev.target, ev.ops, ev.before_op) == ("a", ["f1"], "b1")
