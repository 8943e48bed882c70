"""Step orders by hand: a plan for steps that run their ops chained in plan
order, free on the executor's threads, or "auto" (Note [Free-order plans] in
peak_analysis, ``plan_in_step_order``)."""
import pytest

from tensile_tf.scheduler import Plan, Planner, PlannerJob, UniformLatency
from tensile_tf.scheduler.planner import UNPLANNED_FITS_IN_ORDER, plan_in_step_order
from tests.scheduler.graphs import fig1_graph, recompute_graph

UNIT = UniformLatency(1.0)


def test_a_free_order_plan_is_planned_on_the_free_running_footprint():
    """Note [Free-order plans]: the executor's threads add 20 B beside `metric`
    (observed concurrency). Both orders swap w1 across iterations for a 431 B
    budget; the plan-order footprint leaves the concurrency out, the free-order
    one carries it wherever the plan leaves the step as it was."""
    def planned(step_order):
        g = fig1_graph()
        next(o for o in g.ops if o.name == "metric").concurrent_bytes = 20
        planner = Planner([PlannerJob(g, UNIT)], bandwidth_bytes_per_s=100.0, pool_bytes=431,
                          enable_recompute=False, step_order=step_order)
        return planner, planner.plan()

    ordered, plan_ordered = planned("plan")
    free, plan_free = planned("free")
    events = [[(e.tensor, e.trigger_op, e.start_s) for e in jp.swap_outs + jp.swap_ins]
              for jp in (plan_ordered.jobs["job"], plan_free.jobs["job"])]
    assert events[0] == events[1] == [("w1", "u1", 6.0), ("w1", None, 0.0)]
    # the same absences, taken off footprints that differ by the concurrency at `metric` (step 6)
    assert (free.jobs[0].fp.F - ordered.jobs[0].fp.F).tolist() == [0, 0, 0, 0, 0, 0, 20, 0]
    assert plan_ordered.jobs["job"].vanilla_peak_bytes == plan_free.jobs["job"].vanilla_peak_bytes == 510
    assert plan_free.jobs["job"].planned_peak_bytes == 431 and plan_free.budget_met
    assert (plan_ordered.jobs["job"].step_order, plan_free.jobs["job"].step_order) == ("plan", "free")
    assert Plan.from_json(plan_free.to_json()).jobs["job"].step_order == "free"


def test_a_free_order_plan_counts_the_concurrency_against_the_budget():
    """Beside b1 (431 B in plan order) the threads add 30 B: the swap of w1
    that meets 431 B in plan order leaves b1 at 461 B in free order, so the
    free-order plan also moves w2 out over b1 (b1: 461 - 100 = 361 B)."""
    def planned(step_order):
        g = fig1_graph()
        next(o for o in g.ops if o.name == "b1").concurrent_bytes = 30
        return Planner([PlannerJob(g, UNIT)], bandwidth_bytes_per_s=100.0, pool_bytes=431,
                       enable_recompute=False, step_order=step_order).plan().jobs["job"]

    ordered, free = planned("plan"), planned("free")
    assert (ordered.planned_peak_bytes, [e.tensor for e in ordered.swap_outs]) == (431, ["w1"])
    assert free.planned_peak_bytes == 411
    assert sorted((e.tensor, e.trigger_op) for e in free.swap_outs) == [("w1", "u1"), ("w2", "load")]


def test_an_unknown_step_order_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="step_order must be one of plan, free"):
        Planner([PlannerJob(fig1_graph(), UNIT)], step_order="fast")


@pytest.mark.parametrize("op, concurrent, order, planned", [("metric", 20, "free", 431), ("u2", 100, "plan", 431)])
def test_auto_step_order_takes_the_free_order_plan_only_when_it_meets_the_budget(op, concurrent, order, planned):
    """Note [Free-order plans]: beside `metric` the threads add 20 B, which the
    swap of w1 takes off with the rest: the free-order plan meets 431 B. Beside
    u2 they add 100 B of u2's own time (w2 is updated there, no swap reaches
    it): free order cannot go below 510 B, so "auto" plans in plan order."""
    g = fig1_graph()
    next(o for o in g.ops if o.name == op).concurrent_bytes = concurrent
    kwargs = dict(bandwidth_bytes_per_s=100.0, pool_bytes=431, enable_recompute=False)
    free = plan_in_step_order(Planner, [PlannerJob(g, UNIT)], "free", **kwargs)
    assert free.budget_met == (order == "free")
    auto = plan_in_step_order(Planner, [PlannerJob(g, UNIT)], "auto", **kwargs)
    assert (auto.jobs["job"].step_order, auto.pool_planned_peak_bytes, auto.budget_met) == (order, planned, True)
    with pytest.raises(ValueError, match="choose one of plan, free, auto"):
        plan_in_step_order(Planner, [PlannerJob(g, UNIT)], "fastest", **kwargs)


def test_auto_step_order_keeps_plan_order_for_a_plan_that_recomputes():
    """Note [Free-order plans]: a free-order plan's recomputations and swaps
    ran far above their prediction on InceptionV3's capped link, so "auto"
    takes free order only for a plan of swaps alone."""
    kwargs = dict(bandwidth_bytes_per_s=1.0, pool_bytes=330)
    free = plan_in_step_order(Planner, [PlannerJob(recompute_graph(), UNIT)], "free", **kwargs)
    assert free.budget_met and free.jobs["rc"].recomputes
    auto = plan_in_step_order(Planner, [PlannerJob(recompute_graph(), UNIT)], "auto", **kwargs)
    assert auto.jobs["rc"].step_order == "plan" and auto.budget_met and auto.jobs["rc"].recomputes


def test_a_job_whose_unplanned_step_ran_out_runs_in_plan_order_where_its_prediction_fits():
    """Note [Cold-start planning]: a cold capture sees no concurrency, so its
    predicted unplanned peak (510 B) fits a 600 B pool its unplanned step just
    ran out of; the planner then still runs it in plan order, with no swaps."""
    def planned(ran_out):
        return Planner([PlannerJob(fig1_graph(), UNIT, unplanned_step_ran_out=ran_out)],
                       bandwidth_bytes_per_s=100.0, pool_bytes=600, enable_recompute=False).plan().jobs["job"]

    free, ordered = planned(False), planned(True)
    assert not free.changes_step and not free.order_only
    assert ordered.order_only and ordered.changes_step and ordered.step_order == "plan"
    assert not (ordered.swap_outs or ordered.swap_ins or ordered.recomputes)
    # planned beside it, a job whose own unplanned step fits keeps running free
    b = fig1_graph("b")
    next(o for o in b.ops if o.name == "u2").concurrent_bytes = 100   # its plan order would lower its peak
    both = Planner([PlannerJob(fig1_graph(), UNIT, unplanned_step_ran_out=True), PlannerJob(b, UNIT)],
                   bandwidth_bytes_per_s=100.0, pool_bytes=2000, enable_recompute=False).plan()
    assert both.jobs["job"].order_only and not both.jobs["b"].changes_step, both.jobs
    assert both.stop_reason == UNPLANNED_FITS_IN_ORDER   # the loop planned nothing: no swaps for either
    # "auto" takes the free-order plan only if it changes the step of a job that ran out
    auto = plan_in_step_order(Planner, [PlannerJob(fig1_graph(), UNIT, unplanned_step_ran_out=True)], "auto",
                              bandwidth_bytes_per_s=100.0, pool_bytes=600, enable_recompute=False)
    assert auto.jobs["job"].order_only and auto.jobs["job"].step_order == "plan"
