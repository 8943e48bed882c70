"""The baseline policies of tensile_tf/scheduler/baselines.py on hand-built
graphs whose schedules are worked out by hand: vDNN's offload-after-forward
and one-layer-ahead prefetch, and Capuchin's swap-if-it-hides-else-recompute
(seed 003 §4.5). Unit op latencies; every number below follows from them."""
from tensile_tf.scheduler import GraphBuilder, PlannerJob, UniformLatency
from tensile_tf.scheduler.baselines import STRATEGIES, CapuchinPlanner, VDNNPlanner
from tests.scheduler.graphs import recompute_graph


def two_layer_graph():
    """Two layers (Conv2D reading a parameter) whose inputs a0 and a1 are
    kept for their backward ops:

      0 load | 1 c1 (a0, w1) | 2 c2 (a1, w2) | 3 loss | 4 head1 | 5 head2 | 6 g2 (a1) | 7 g1 (a0)
    """
    b = GraphBuilder("cnn")
    b.tensor("x", 10, "input").tensor("w1", 10, "parameter").tensor("w2", 10, "parameter")
    b.op("load", inputs=["x"], outputs={"a0": 100})
    b.op("c1", op_type="Conv2D", inputs=["a0", "w1"], outputs={"a1": 100})
    b.op("c2", op_type="Conv2D", inputs=["a1", "w2"], outputs={"a2": 10})
    b.op("loss", inputs=["a2"], outputs={"l": 1})
    b.op("head1", inputs=["l"], outputs={"h1": 1})
    b.op("head2", inputs=["h1"], outputs={"h2": 1})
    b.op("g2", op_type="Conv2DBackpropFilter", inputs=["h2", "a1"], outputs={"gw2": 10})
    b.op("g1", op_type="Conv2DBackpropFilter", inputs=["h2", "a0"], outputs={"gw1": 10})
    return b.build()


FAST_LINK = 1e9   # bytes/s: a 100-byte transfer takes 0.1 microseconds against 1 s ops


def test_vdnn_offloads_each_layer_input_after_its_forward_use_and_prefetches_one_layer_ahead():
    planner = VDNNPlanner([PlannerJob(two_layer_graph(), UniformLatency(1.0))], bandwidth_bytes_per_s=FAST_LINK)
    plan = planner.plan()
    js = planner.jobs[0]
    tas = js.tas
    by_tensor = {tas.tensor_names[d.i]: d for d in js.decisions}
    assert set(by_tensor) == {"a0", "a1"}
    # out as soon as the forward use ends: a0 after c1 (step 1), a1 after c2 (step 2)
    assert by_tensor["a0"].out_start == tas.end_u(1) and by_tensor["a1"].out_start == tas.end_u(2)
    # a1 is needed first in backward (g2, step 6): prefetched when head2 (step 5) starts; a0
    # (g1, step 7) when the backward pass reaches the previous offloaded layer, g2 (step 6)
    assert by_tensor["a1"].in_start == tas.start_u(5) and by_tensor["a0"].in_start == tas.start_u(6)
    # released after the step in which each copy ends: a0 absent over steps 3-5, a1 over step 4
    assert (by_tensor["a0"].release_step, by_tensor["a0"].in_step) == (2, 6)
    assert (by_tensor["a1"].release_step, by_tensor["a1"].in_step) == (3, 5)
    assert js.fp.is_absent(tas.tindex["a0"], 4) and js.fp.is_absent(tas.tindex["a1"], 4)
    assert plan.stop_reason.startswith("vDNN") and plan.iterations == 1


def capuchin_graph():
    """`a` idles from f2 (step 1) to b1 (step 6) while `big` makes the peak:

      0 f1 110 | 1 f2 120 | 2 f3 130 | 3 f4 420 | 4 f5 420 | 5 f6 130 | 6 b1 130
    """
    b = GraphBuilder("cap")
    b.tensor("x", 10, "input")
    b.op("f1", inputs=["x"], outputs={"a": 100})
    b.op("f2", inputs=["a"], outputs={"h": 10})
    b.op("f3", inputs=["h"], outputs={"h2": 10})
    b.op("f4", inputs=["h2"], outputs={"big": 300})
    b.op("f5", inputs=["big"], outputs={"s": 10})
    b.op("f6", inputs=["s"], outputs={"s2": 10})
    b.op("b1", inputs=["s2", "a"], outputs={"g": 10})
    return b.build()


def test_capuchin_swaps_a_tensor_whose_swap_hides_with_its_in_trigger():
    # FreeTime = (6 s - copy) - (2 s + copy) > 0: swapped. The swap-out starts at the
    # evicted-access (f2's end) and ends inside f3, so `a` leaves after f3; the swap-in is
    # triggered by the last access before SwapInStartTime, f6's (seed 003 §4.4): `a` is
    # off the device over f4 and f5, the peak: 420 - 100
    plan = CapuchinPlanner([PlannerJob(capuchin_graph(), UniformLatency(1.0))], pool_bytes=330,
                           bandwidth_bytes_per_s=FAST_LINK).plan()
    jp = plan.jobs["cap"]
    assert [(e.tensor, e.trigger_op) for e in jp.swap_outs] == [("a", "f2")] and not jp.recomputes
    assert [(e.trigger_op, e.delta_s) for e in jp.swap_ins] == [("f5", 0.0)]   # issued as f5 ends: f6 starts
    assert plan.pool_planned_peak_bytes == 320 and plan.budget_met


def test_capuchin_recomputes_a_tensor_whose_swap_cannot_hide():
    # 100 bytes at 40 B/s: 2.5 s each way. FreeTime = (6 - 2.5) - (2 + 2.5) = -1 s < 0,
    # so Capuchin compares recomputation (MSPS): f1 re-runs before b1
    plan = CapuchinPlanner([PlannerJob(capuchin_graph(), UniformLatency(1.0))], pool_bytes=330,
                           bandwidth_bytes_per_s=40.0).plan()
    jp = plan.jobs["cap"]
    assert not jp.swap_outs and [(e.target, e.ops) for e in jp.recomputes] == [("a", ["f1"])]
    assert plan.pool_planned_peak_bytes <= 330 and plan.budget_met


def test_every_strategy_leaves_a_job_that_fits_unplanned_alone():
    job = PlannerJob(recompute_graph(), UniformLatency(1.0))
    for name, cls in STRATEGIES.items():
        plan = cls([job], pool_bytes=1000, bandwidth_bytes_per_s=FAST_LINK).plan()   # fits unplanned
        assert not plan.jobs["rc"].swap_outs and not plan.jobs["rc"].recomputes, name
