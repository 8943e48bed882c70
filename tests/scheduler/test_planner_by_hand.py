"""Plans for small graphs, checked against answers worked out by hand (see graphs.py):
Algorithm 3, its latencies and views. Step orders are in test_planner_step_order.py,
the passes around Algorithm 3 in test_planner_passes_by_hand.py."""
import json
from dataclasses import replace

import pytest

from tensile_tf.scheduler import (GraphBuilder, JobFootprint, JobGraph, LatencyTable, Plan, Planner, PlannerJob,
                                  TensorAccessSequence, UniformLatency)
from tensile_tf.scheduler.planner import UNPLANNED_FITS
from tests.scheduler.graphs import FIG1_STEP_BYTES, fig1_graph, recompute_graph

UNIT = UniformLatency(1.0)


def test_access_sequence_and_activity_analysis_footprint():
    tas = TensorAccessSequence(fig1_graph(), UNIT)
    assert tas.period_s == 8.0
    assert tas.accesses_of("w1")[0].op == "f1" and [a.kind for a in tas.accesses_of("w1")] == ["TUA", "UPDATE"]
    assert [a.kind for a in tas.accesses_of("g2")] == ["TGA", "TUA"]
    assert JobFootprint(tas).base.tolist() == FIG1_STEP_BYTES


def test_fig1_parameter_swapped_across_iterations():
    plan = Planner([PlannerJob(fig1_graph(), UNIT)], bandwidth_bytes_per_s=100.0, pool_bytes=431).plan()
    jp = plan.jobs["job"]
    assert (jp.vanilla_peak_bytes, jp.planned_peak_bytes) == (510, 431)
    assert plan.stop_reason == "budget met" and plan.budget_met
    (out,), (inn,) = jp.swap_outs, jp.swap_ins
    # out right after its optimizer update, during `metric`; dropped when the copy ends
    assert (out.tensor, out.trigger_op, out.delta_s, out.start_s, out.duration_s) == ("w1", "u1", 0.0, 6.0, 1.0)
    assert out.release_after_op == "metric" and out.cross_iteration
    # back in at the start of the next iteration, just in time for f1
    assert (inn.tensor, inn.trigger_op, inn.delta_s, inn.serves_op) == ("w1", None, 0.0, "f1")
    assert inn.cross_iteration and inn.iteration_shift == 0
    assert any(r.tensor == "w1" and r.reason == "swap" for r in jp.releases)


def test_no_swap_without_a_feasible_swap_in():
    # at 50 B/s, w1 needs 2 s each way; the 1 s windows cannot hold it: no passive swap-in, no swap
    plan = Planner([PlannerJob(fig1_graph(), UNIT)], bandwidth_bytes_per_s=50.0, pool_bytes=431,
                   enable_recompute=False).plan()
    assert plan.jobs["job"].swap_outs == [] and plan.pool_planned_peak_bytes == 510 and not plan.budget_met


@pytest.mark.parametrize("bandwidth, planned, swapped_jobs", [(100.0, 920, {"A"}), (200.0, 862, {"A", "B"})])
def test_fig3_two_jobs_whose_peaks_coincide_share_one_channel(bandwidth, planned, swapped_jobs):
    jobs = [PlannerJob(fig1_graph("A"), UNIT), PlannerJob(fig1_graph("B"), UNIT)]
    plan = Planner(jobs, bandwidth_bytes_per_s=bandwidth, pool_bytes=862, enable_recompute=False).plan()
    assert plan.pool_vanilla_peak_bytes == plan.sum_of_job_peaks_bytes == 1020
    assert plan.pool_planned_peak_bytes == planned
    assert {j for j, jp in plan.jobs.items() if jp.swap_outs} == swapped_jobs
    spans = sorted((e.start_s, e.start_s + e.duration_s) for jp in plan.jobs.values()
                   for e in jp.swap_outs + jp.swap_ins)
    assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


def test_offset_jobs_use_the_time_aligned_sum_not_the_sum_of_peaks():
    jobs = [PlannerJob(fig1_graph("A"), UNIT), PlannerJob(fig1_graph("B"), UNIT, start_offset_s=4.0)]
    plan = Planner(jobs, max_iterations=0).plan()
    # A's step s meets B's step (s - 4) mod 8: worst is u2 (510) + b2 (331)
    assert plan.pool_vanilla_peak_bytes == 841 < plan.sum_of_job_peaks_bytes == 1020


def test_coincident_peaks_plan_holds_for_any_alignment_of_the_jobs():
    def plan(coincident):
        jobs = [PlannerJob(fig1_graph("A"), UNIT), PlannerJob(fig1_graph("B"), UNIT, start_offset_s=4.0)]
        return Planner(jobs, bandwidth_bytes_per_s=200.0, pool_bytes=700, enable_recompute=False,
                       coincident_peaks=coincident).plan()

    timeline, coincident = plan(False), plan(True)
    # the time-aligned plan meets 700 only while B stays 4 s behind A: aligned, its job peaks add to 862
    assert timeline.budget_met and timeline.pool_planned_peak_bytes == 651
    assert sum(jp.planned_peak_bytes for jp in timeline.jobs.values()) == 862
    # coincident peaks (seed's MP = sum MP_j): the prediction is the sum of job peaks, whatever the alignment
    assert coincident.pool_vanilla_peak_bytes == coincident.sum_of_job_peaks_bytes == 1020
    assert coincident.pool_planned_peak_bytes == sum(jp.planned_peak_bytes for jp in coincident.jobs.values()) == 820
    assert all(jp.swap_outs for jp in coincident.jobs.values())


def test_recomputation_by_msps_when_swapping_cannot_help():
    plan = Planner([PlannerJob(recompute_graph(), UNIT)], bandwidth_bytes_per_s=1.0, pool_bytes=330).plan()
    jp = plan.jobs["rc"]
    assert jp.swap_outs == []
    (ev,) = jp.recomputes
    assert (ev.target, ev.release_after_op, ev.before_op, ev.trigger_op, ev.ops) == ("a", "f2", "b1", "f4", ["f1"])
    assert ev.msps == pytest.approx(100.0) and ev.time_s == 1.0
    assert (jp.vanilla_peak_bytes, jp.planned_peak_bytes) == (420, 320)
    assert (jp.iteration_s, jp.planned_iteration_s) == (5.0, 6.0)
    assert plan.budget_met


def test_recompute_chain_rebuilds_a_released_input_too():
    b = GraphBuilder("chain")
    b.tensor("x", 10, "input")
    b.op("f1", inputs=["x"], outputs={"a": 50})
    b.op("f2", inputs=["a"], outputs={"c": 100})          # a's last use: gone by b1
    b.op("f3", inputs=["c"], outputs={"big": 300})
    b.op("f4", inputs=["big"], outputs={"s": 10})
    b.op("b1", inputs=["s", "c"], outputs={"g": 10})
    # steps: f1 60 | f2 160 | f3 410 (c read) | f4 420 (x, c, big, s) | b1 130
    plan = Planner([PlannerJob(b.build(), UNIT)], bandwidth_bytes_per_s=1.0, pool_bytes=410).plan()
    (ev,) = plan.jobs["chain"].recomputes
    assert ev.target == "c" and ev.ops == ["f1", "f2"] and ev.time_s == 2.0
    assert ev.release_after_op == "f3" and ev.before_op == "b1"
    # f4 drops to 320; the chain (x, s, transient a, c) peaks at 170; f3 keeps 410
    assert plan.pool_planned_peak_bytes == 410 and plan.pool_vanilla_peak_bytes == 420


def test_stateful_producers_are_never_recomputed():
    b = GraphBuilder("rng")
    b.tensor("x", 10, "input")
    b.op("dropout", inputs=["x"], outputs={"a": 100}, stateful=True)
    b.op("f2", inputs=["a"], outputs={"h": 10})
    b.op("f3", inputs=["h"], outputs={"big": 300})
    b.op("b1", inputs=["big", "a"], outputs={"g": 10})
    plan = Planner([PlannerJob(b.build(), UNIT)], bandwidth_bytes_per_s=1.0, pool_bytes=330).plan()
    assert plan.jobs["rng"].recomputes == [] and not plan.budget_met


def test_max_swapping_rate_caps_a_jobs_share():
    quiet = GraphBuilder("quiet").tensor("x", 10, "input").op("f", inputs=["x"], outputs={"y": 1}).build()

    def swaps(rate):
        jobs = [PlannerJob(fig1_graph("A"), UNIT, max_swapping_rate=rate), PlannerJob(quiet, UNIT)]
        return len(Planner(jobs, bandwidth_bytes_per_s=1000.0).plan().jobs["A"].swap_outs)
    assert swaps(0.5) == 1 < swaps(1.0)


def test_plan_json_round_trip():
    plan = Planner([PlannerJob(fig1_graph("A"), UNIT), PlannerJob(recompute_graph("B"), UNIT)],
                   bandwidth_bytes_per_s=100.0, pool_bytes=700).plan()
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan and json.loads(again.to_json()) == json.loads(text)


def test_replan_warm_start_matches_a_fresh_plan_when_nothing_changed():
    jobs = [PlannerJob(fig1_graph("A"), UNIT), PlannerJob(fig1_graph("B"), UNIT, start_offset_s=2.0)]
    planner = Planner(jobs, bandwidth_bytes_per_s=300.0)
    first = planner.plan()
    again = planner.replan({"A": UniformLatency(1.0)})
    assert again.pool_planned_peak_bytes == first.pool_planned_peak_bytes
    slower = planner.replan({"A": UniformLatency(1.5)})
    assert slower.jobs["A"].iteration_s == 12.0
    assert slower.pool_planned_peak_bytes <= slower.pool_vanilla_peak_bytes


def test_latency_table_falls_back_by_op_type_and_updates_by_ewma():
    g = fig1_graph()
    t = LatencyTable.from_measurements({"f1": 2.0, "b1": 4.0}, {o.name: o.op_type for o in g.ops} | {"f1": "X", "b1": "X"})
    assert t.latency_s(g.op("f1")) == 2.0 and t.latency_s(g.op("load")) == t.default_s
    t2 = t.ewma_update({"f1": 4.0}, alpha=0.5)
    assert t2.seconds["f1"] == 3.0 and LatencyTable.from_json(t2.to_json()) == t2
    with pytest.raises(ValueError, match="latency of op 'bad'"):
        LatencyTable.from_measurements({"bad": -1.0})


def test_a_table_is_put_on_its_steps_wall_time():
    """Note [Latency time base]: ops that ran side by side add up to more than
    the step took; the table is scaled so that the planner's step lasts the
    measured wall time, and a table that adds up to less is left as it is."""
    g = fig1_graph()
    types = {o.name: o.op_type for o in g.ops} | {"f1": "X", "b1": "X"}
    t = LatencyTable.from_measurements({o.name: 1.0 for o in g.ops} | {"f1": 2.0, "b1": 4.0}, types)
    total = t.total_s(g)
    half = t.on_wall_time(g, total / 2)
    assert half.total_s(g) == pytest.approx(total / 2)
    assert half.seconds["f1"] == pytest.approx(1.0) and half.seconds["b1"] == pytest.approx(2.0)
    assert half.by_type["X"] == pytest.approx(t.by_type["X"] / 2) and half.default_s == pytest.approx(t.default_s / 2)
    assert "x0.50 to the step's wall time" in half.source
    assert TensorAccessSequence(g, half).period_s == pytest.approx(total / 2)
    assert t.on_wall_time(g, total * 2) is t
    with pytest.raises(ValueError, match="wall time must be > 0"):
        t.on_wall_time(g, 0.0)
    # the order the measured step ran its ops in stays with the table (Note [Latency drift])
    chained = replace(t, step_order="plan")
    assert chained.on_wall_time(g, total / 2).step_order == "plan"
    assert chained.ewma_update({"f1": 3.0}).step_order == "plan"
    assert LatencyTable.from_json(chained.to_json()) == chained
    assert LatencyTable.from_json(t.to_json()).step_order == "free"


def test_graph_validation_names_the_problem():
    b = GraphBuilder("bad").tensor("x", 1, "input")
    b.op("f", inputs=["x"], outputs={"y": 1})
    g = b.build()
    g.ops.reverse()
    g.ops.insert(0, g.ops.pop())
    with pytest.raises(ValueError, match="appears twice|before its producer"):
        JobGraph("bad", [g.ops[0], g.ops[0]], g.tensors)
    with pytest.raises(ValueError, match="undeclared tensor 'nope'"):
        GraphBuilder("bad").op("f", inputs=["nope"])
    assert JobGraph.from_dict(fig1_graph().to_dict()) == fig1_graph()


def test_paired_peaks_count_every_floor_and_two_peaks():
    """Note [Paired peaks]: under the node-group pipeline only two jobs run groups
    at a time; the others hold their floor."""
    floor, top = min(FIG1_STEP_BYTES), max(FIG1_STEP_BYTES)
    jobs = [PlannerJob(fig1_graph(name), UNIT) for name in "ABCD"]
    paired = Planner(jobs, max_iterations=0, coincident_peaks=True, peaking_jobs=2).plan()
    coincident = Planner(jobs, max_iterations=0, coincident_peaks=True).plan()
    assert coincident.pool_vanilla_peak_bytes == 4 * top
    assert paired.pool_vanilla_peak_bytes == 4 * floor + 2 * (top - floor) < 4 * top
    # With two jobs the pair is every job: the coincident rule.
    two = Planner(jobs[:2], max_iterations=0, coincident_peaks=True, peaking_jobs=2).plan()
    assert two.pool_vanilla_peak_bytes == 2 * top
    # A budget between the two: the paired plan meets it by swapping, the coincident one cannot.
    budget = paired.pool_vanilla_peak_bytes - 50
    met = Planner(jobs, bandwidth_bytes_per_s=1000.0, pool_bytes=budget, enable_recompute=False,
                  coincident_peaks=True, peaking_jobs=2).plan()
    assert met.budget_met and met.pool_planned_peak_bytes <= budget
    assert not Planner(jobs, bandwidth_bytes_per_s=1000.0, pool_bytes=budget, enable_recompute=False,
                       coincident_peaks=True).plan().budget_met


def test_unplanned_pipeline_jobs_that_fit_with_one_peak_get_no_plan():
    """Note [Paired peaks]: whether node-group jobs need a plan is judged with one
    peak above the floors (UNPLANNED_PAIRED_PEAKING_JOBS), what a plan makes room
    for with two (PAIRED_PEAKING_JOBS). Two jobs, a budget between the two."""
    from tensile_tf.scheduler.peak_analysis import PAIRED_PEAKING_JOBS, UNPLANNED_PAIRED_PEAKING_JOBS

    floor, top = min(FIG1_STEP_BYTES), max(FIG1_STEP_BYTES)
    jobs = [PlannerJob(fig1_graph(name), UNIT) for name in "AB"]
    budget = 2 * floor + (top - floor) + 10     # one peak fits, two do not
    kw = dict(bandwidth_bytes_per_s=1000.0, pool_bytes=budget, enable_recompute=False, coincident_peaks=True,
              peaking_jobs=PAIRED_PEAKING_JOBS)
    pipeline = Planner(jobs, unplanned_peaking_jobs=UNPLANNED_PAIRED_PEAKING_JOBS, **kw).plan()
    assert pipeline.stop_reason == UNPLANNED_FITS and pipeline.peak_model == "paired"
    assert not any(jp.swap_outs or jp.recomputes for jp in pipeline.jobs.values())
    # what it predicts for the unplanned steps is the one-peak model's, within the budget
    assert pipeline.budget_met and pipeline.pool_planned_peak_bytes == pipeline.pool_vanilla_peak_bytes == budget - 10
    # Judged with two peaks, the same jobs are planned: swaps are booked.
    planned = Planner(jobs, **kw).plan()
    assert planned.stop_reason != UNPLANNED_FITS and any(jp.swap_outs for jp in planned.jobs.values())


def _viewed_graph(view_stateful: bool = False) -> JobGraph:
    """r = reshape(h) shares h's buffer; r is read at `early` and `late_r`,
    h itself last, at `use_h`; `other` needs 50 bytes of scratch between the
    reads, with an op on each side of it (a swap's transfers take op boundaries)."""
    b = GraphBuilder("views")
    b.op("make_h", outputs={"h": 100})
    b.op("reshape", inputs=["h"], outputs={"r": 100}, stateful=view_stateful)
    b.op("early", inputs=["r"], outputs={"e": 1})
    b.op("pad_1", outputs={})
    b.op("other", outputs={"o": 10}, temp_bytes=50)
    b.op("pad_2", outputs={})
    b.op("late_r", inputs=["r", "o"], outputs={"y": 1})
    b.op("use_h", inputs=["h", "y"], outputs={"z": 1})
    g = b.build()
    g.tensors["r"].view_of = "h"
    return g


def test_a_view_has_no_bytes_and_its_reads_are_its_owners():
    # Note [Views]: r has no bytes and keeps h's buffer until r's last read.
    # Note [Views read as their owner]: r's reads are h's accesses, so h has a
    # gap around `other` (between `early` and `late_r`), and h away there frees
    # its 100 bytes: the rewrite makes r again from h's swap-in for `late_r`.
    tas = TensorAccessSequence(_viewed_graph(), UNIT)
    fp = JobFootprint(tas)
    h, r = tas.tindex["h"], tas.tindex["r"]
    assert fp.base.tolist() == [100, 100, 101, 100, 160, 110, 111, 102]
    assert not tas.swappable[r] and not tas.handed_over
    assert tas.read_as_owner == {r: h} and h not in tas.view_spans
    assert tas.acc[h] == [0, 1, 2, 6, 7]
    fp.add_absence(h, 4, 5)
    assert fp.F.tolist() == [100, 100, 101, 100, 60, 110, 111, 102]
    # the planner finds that gap: h out after `early`, back in for `late_r`
    plan = Planner([PlannerJob(_viewed_graph(), UNIT)], bandwidth_bytes_per_s=1e6, pool_bytes=120,
                   enable_recompute=False).plan()
    jp = plan.jobs["views"]
    assert [(e.tensor, e.release_after_op) for e in jp.swap_outs] == [("h", "early")]
    assert [(e.tensor, e.serves_op) for e in jp.swap_ins] == [("h", "late_r")]
    assert plan.pool_planned_peak_bytes == 111 and plan.budget_met


def test_a_view_the_rewrite_cannot_make_again_pins_its_owners_buffer():
    # Note [Views read as their owner]: a stateful view op is not cloned, so
    # while r is live an absence of h frees nothing
    tas = TensorAccessSequence(_viewed_graph(view_stateful=True), UNIT)
    fp = JobFootprint(tas)
    h = tas.tindex["h"]
    assert not tas.read_as_owner and tas.view_spans == {h: [(1, 6)]}
    assert tas.acc[h] == [0, 1, 7]
    fp.add_absence(h, 4, 5)
    assert fp.F.tolist() == fp.base.tolist()


def test_a_view_that_outlives_its_owner_takes_the_buffer():
    # Note [View takes the buffer]: h's last own reader is `reshape`; r's is
    # `late`. From step 2 the buffer is r's, so r is what a plan can swap.
    b = GraphBuilder("views")
    b.op("make_h", outputs={"h": 100})
    b.op("reshape", inputs=["h"], outputs={"r": 100})
    b.op("other", outputs={"o": 10})
    b.op("late", inputs=["r", "o"], outputs={"y": 1})
    g = b.build()
    assert JobFootprint(TensorAccessSequence(g, UNIT)).base.tolist() == [100, 200, 110, 111]
    g.tensors["r"].view_of = "h"
    tas = TensorAccessSequence(g, UNIT)
    fp = JobFootprint(tas)
    h, r = tas.tindex["h"], tas.tindex["r"]
    assert fp.base.tolist() == [100, 100, 110, 111]
    assert tas.handed_over == {r: h} and tas.swappable[r] and int(tas.size[r]) == 100
    assert (tas.first[h], tas.last[h], tas.first[r], tas.last[r]) == (0, 1, 2, 3)
    # r away over step 2 frees the buffer there
    fp.add_absence(r, 2, 3)
    assert fp.F.tolist() == [100, 100, 10, 111]
    # an absence reaching back before the handover frees nothing while h still holds it
    fp2 = JobFootprint(tas)
    fp2.add_absence(r, 1, 3)
    assert fp2.F.tolist() == [100, 100, 10, 111]
