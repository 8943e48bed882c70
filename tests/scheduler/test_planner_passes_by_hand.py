"""The passes around Algorithm 3 by hand (scheduler.planner_passes): reverse
delete (Note [Transfers that lower no peak]) and chain limits tried (Note
[Chain limits tried]), on small graphs whose answers are worked out here."""
from hypothesis import HealthCheck, given, settings

from tensile_tf.scheduler import GraphBuilder, JobGraph, Planner, PlannerJob, UniformLatency
from tests.scheduler.graphs import FIG1_STEP_BYTES, fig1_graph
from tests.scheduler.test_planner_properties import scenarios

UNIT = UniformLatency(1.0)


def _idle_swap_graph() -> JobGraph:
    """z (100 B) is read at the start and near the end; x (110 B) lives
    inside z's gap, around `first_peak` (10 B of scratch); u (150 B) is
    made and read at once at the end, so no swap lowers the last steps."""
    b = GraphBuilder("idle")
    b.op("make_z", outputs={"z": 100})
    b.op("pad_1", outputs={})
    b.op("pad_2", outputs={})
    b.op("make_x", outputs={"x": 110})
    b.op("pad_3", outputs={})
    b.op("pad_4", outputs={})
    b.op("first_peak", outputs={}, temp_bytes=10)
    b.op("pad_5", outputs={})
    b.op("pad_6", outputs={})
    b.op("use_x", inputs=["x"], outputs={"x2": 1})
    b.op("pad_7", outputs={})
    b.op("pad_8", outputs={})
    b.op("use_z", inputs=["z", "x2"], outputs={"z2": 1})
    b.op("make_u", outputs={"u": 150})
    b.op("use_u", inputs=["u", "z2"], outputs={"y": 1})
    return b.build()


def test_a_swap_that_lowers_no_peak_of_the_final_plan_is_dropped():
    # Note [Transfers that lower no peak]: Algorithm 2 swaps both z and x to
    # bring `first_peak` (220 B) and `make_x` (210 B) under the 160 B budget.
    # With z away, `first_peak` holds x and its scratch, 120 B, below the
    # final peak (152 B at `use_u`): x's transfers lower nothing.
    def planned(drop):
        planner = Planner([PlannerJob(_idle_swap_graph(), UNIT)], bandwidth_bytes_per_s=1e6, pool_bytes=160,
                          enable_recompute=False, drop_idle_swaps=drop)
        return planner, planner.plan()

    kept, plan_kept = planned(False)
    assert sorted(e.tensor for e in plan_kept.jobs["idle"].swap_outs) == ["x", "z"]
    assert kept.dropped_swaps == 0 and plan_kept.jobs["idle"].swapped_bytes_per_iteration == 420
    dropped, plan = planned(True)
    jp = plan.jobs["idle"]
    assert [e.tensor for e in jp.swap_outs] == ["z"] and [(e.tensor, e.serves_op) for e in jp.swap_ins] == [("z", "use_z")]
    assert dropped.dropped_swaps == 1 and jp.swapped_bytes_per_iteration == 200
    assert plan.pool_planned_peak_bytes == plan_kept.pool_planned_peak_bytes == 152 and plan.budget_met
    steps = [o.name for o in _idle_swap_graph().ops]
    assert dropped.jobs[0].fp.F[steps.index("first_peak")] == 120


def test_a_baseline_keeps_every_swap_its_policy_books():
    # Note [Transfers that lower no peak]: the pass is TENSILE's, not vDNN's or Capuchin's
    from tensile_tf.scheduler.baselines import CapuchinPlanner, VDNNPlanner

    for cls in (VDNNPlanner, CapuchinPlanner):
        planner = cls([PlannerJob(_idle_swap_graph(), UNIT)], bandwidth_bytes_per_s=1e6, pool_bytes=160)
        planner.plan()
        assert not planner.drop_idle_swaps and planner.dropped_swaps == 0


def test_a_free_order_plan_keeps_its_swaps():
    # Note [Transfers that lower no peak]: a free-order plan's footprint is not
    # the step as it runs, so the swaps it calls idle stay
    planner = Planner([PlannerJob(_idle_swap_graph(), UNIT)], bandwidth_bytes_per_s=1e6, pool_bytes=160,
                      enable_recompute=False, step_order="free")
    plan = planner.plan()
    assert sorted(e.tensor for e in plan.jobs["idle"].swap_outs) == ["x", "z"] and planner.dropped_swaps == 0


def _five_op_chain_graph():
    """c (100) is rebuilt for b1 only from x, through four released
    intermediates: a chain of five ops."""
    b = GraphBuilder("chain5")
    b.tensor("x", 10, "input")
    src = "x"
    for k in range(1, 5):
        b.op(f"f{k}", inputs=[src], outputs={f"a{k}": 20})
        src = f"a{k}"
    b.op("f5", inputs=["a4"], outputs={"c": 100})
    b.op("f6", inputs=["c"], outputs={"big": 300})
    b.op("f7", inputs=["big"], outputs={"s": 10})
    b.op("b1", inputs=["s", "c"], outputs={"g": 10})
    # f7 holds x, c, big, s = 420; with c rebuilt for b1 it holds 320, and f6 410
    return b.build()


def test_the_planner_tries_a_longer_chain_when_the_first_limit_rebuilds_nothing():
    """Note [Chain limits tried]: with chains of at most 4 ops c cannot be
    rebuilt and the budget is missed; the pass at 6 rebuilds it with all five
    ops, and that plan is kept."""
    job = PlannerJob(_five_op_chain_graph(), UNIT)
    four = Planner([job], bandwidth_bytes_per_s=1.0, pool_bytes=410, max_chain=4).plan()
    assert not four.jobs["chain5"].recomputes and four.pool_planned_peak_bytes == 420
    planner = Planner([job], bandwidth_bytes_per_s=1.0, pool_bytes=410)
    plan = planner.plan()
    (ev,) = plan.jobs["chain5"].recomputes
    assert ev.target == "c" and ev.ops == ["f1", "f2", "f3", "f4", "f5"]
    assert plan.pool_planned_peak_bytes == 410 and plan.budget_met
    assert planner.max_chain == 6 and set(planner.pass_costs) == {4, 6}
    assert planner.pass_costs[6] < planner.pass_costs[4]


def test_a_plan_that_tries_no_recomputation_is_planned_once():
    """Note [Chain limits tried]: swaps meet the budget, so no longer chain could
    change the plan: one pass, at the first limit."""
    planner = Planner([PlannerJob(fig1_graph(), UNIT)], bandwidth_bytes_per_s=1e6,
                      pool_bytes=max(FIG1_STEP_BYTES) - 100)
    planner.plan()
    assert planner.recompute_rounds == 0 and list(planner.pass_costs) == [4] and planner.max_chain == 4


def _events(plan):
    return {name: (sorted((e.tensor, str(e.trigger_op), round(e.delta_s, 9)) for e in jp.swap_outs + jp.swap_ins),
                   sorted((e.target, tuple(e.ops)) for e in jp.recomputes)) for name, jp in plan.jobs.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_longer_limit_is_not_planned_when_no_chain_was_cut(scenario):
    """Note [Chain limits tried]: the pass at 6 is skipped where the pass at 4 cut no chain short;
    the control plans every limit, and both make the same plan."""
    jobs, bandwidth, frac = scenario
    vanilla = Planner(jobs, bandwidth_bytes_per_s=bandwidth, max_iterations=0).plan().pool_vanilla_peak_bytes
    budget = None if frac is None else max(1, int(vanilla * frac))

    class EveryLimit(Planner):
        skip_uncut_chain_limits = False

    skipping = Planner(jobs, bandwidth_bytes_per_s=bandwidth, pool_bytes=budget)
    plan = skipping.plan()
    control = EveryLimit(jobs, bandwidth_bytes_per_s=bandwidth, pool_bytes=budget).plan()
    assert plan.pool_planned_peak_bytes == control.pool_planned_peak_bytes
    assert _events(plan) == _events(control)


def test_a_pass_that_cut_a_chain_is_counted():
    """The chain limit's cuts are counted (``limit_hits``): the five-op chain at a limit of 4."""
    planner = Planner([PlannerJob(_five_op_chain_graph(), UNIT)], bandwidth_bytes_per_s=1.0, pool_bytes=410,
                      max_chain=4)
    planner.plan()
    assert planner.chain_limit_hits[0] > 0
