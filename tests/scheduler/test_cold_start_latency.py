"""ColdStartLatency: the planner's latency guess for a job that never ran
(Note [Cold-start planning] in tensile_tf/runtime/planning.py)."""
import pytest

from tensile_tf.scheduler import ColdStartLatency, GraphBuilder, Planner, PlannerJob
from tests.scheduler.graphs import fig1_graph


def _graph():
    b = GraphBuilder("cold")
    b.tensor("x", 4000, "input").tensor("w", 1000, "parameter")
    b.op("matmul", op_type="MatMul", inputs=["x", "w"], outputs={"y": 4000})
    b.op("relu", op_type="Relu", inputs=["y"], outputs={"r": 4000})
    b.op("sum", op_type="Sum", inputs=["r"], outputs={"s": 4})
    return b.build()


def test_latency_is_overhead_plus_bytes_touched_over_rate_with_a_factor_for_compute_bound_ops():
    g = _graph()
    model = ColdStartLatency(g, bytes_per_s=1000.0, overhead_s=0.5, compute_factor=3.0)
    ops = {o.name: o for o in g.ops}
    assert model.latency_s(ops["matmul"]) == pytest.approx(0.5 + 3.0 * (4000 + 1000 + 4000) / 1000)
    assert model.latency_s(ops["relu"]) == pytest.approx(0.5 + (4000 + 4000) / 1000)
    assert model.latency_s(ops["sum"]) == pytest.approx(0.5 + 4004 / 1000)


@pytest.mark.parametrize("kw", [{"bytes_per_s": 0}, {"overhead_s": -1}, {"compute_factor": 0}])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError, match="ColdStartLatency"):
        ColdStartLatency(_graph(), **kw)


def test_a_cold_plan_meets_a_budget_like_a_measured_one():
    g = fig1_graph()
    plan = Planner([PlannerJob(g, ColdStartLatency(g))], pool_bytes=450).plan()
    assert plan.budget_met and plan.pool_planned_peak_bytes <= 450 < plan.pool_vanilla_peak_bytes
