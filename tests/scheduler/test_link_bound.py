"""The swap link's ceiling (tensile_tf/scheduler/link_bound.py) and the
planner's bottleneck restarts (Note [Bottleneck first] in planner_passes.py).

Hand-worked: the nested-capacity cut on three tensors, and a job whose only
swap candidate must come back within one short op, so the deadline-aware
bound is far below bandwidth x period; the working-set floor of that job.
Properties: no swap-only plan goes below the deadline-aware bound, no plan
below the floor; restarts never raise a plan's peak."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tensile_tf.scheduler import GraphBuilder, LatencyTable, Planner, PlannerJob
from tensile_tf.scheduler.planner import NO_GAIN
from tensile_tf.scheduler.swap_scheduling import scheduling_swap
from tensile_tf.scheduler.link_bound import (nested_capacity, swap_link_bound, unplanned_peak_and_period,
                                             working_set_floor)
from tests.scheduler.test_planner_properties import check_invariants, scenarios


def test_nested_capacity_is_the_min_cut_over_window_lengths():
    # windows 1, 2, 10 s; 8, 8, 8 bytes; 5 bytes/s.
    # rho=0: all 24 | rho=1: 5 + 16 = 21 | rho=2: 10 + 8 = 18 | rho=10: 50  ->  18
    assert nested_capacity(np.array([1.0, 2.0, 10.0]), np.array([8, 8, 8]), 5.0) == 18.0
    # a fast link moves everything
    assert nested_capacity(np.array([1.0, 2.0, 10.0]), np.array([8, 8, 8]), 1e9) == 24.0
    # tied windows count together: two 8-byte tensors in 1 s at 5 bytes/s -> 5
    assert nested_capacity(np.array([1.0, 1.0]), np.array([8, 8]), 5.0) == 5.0
    assert nested_capacity(np.array([]), np.array([], dtype=np.int64), 5.0) == 0.0


def short_return_graph():
    """a (100 B) is made at step 0 and read again at step 5; the peak is step 3,
    whose output big (300 B) is read by nobody, and after it a 0.1 s op:

      0 make_a 1 s | 1 idle1 1 s | 2 idle2 1 s | 3 peak 1 s | 4 tail 0.1 s | 5 use_a 1 s
    """
    b = GraphBuilder("short")
    b.tensor("x", 1, "input")
    b.op("make_a", inputs=["x"], outputs={"a": 100})
    b.op("idle1", inputs=["x"], outputs={"i1": 1})
    b.op("idle2", inputs=["i1"], outputs={"i2": 1})
    b.op("peak", inputs=["i2"], outputs={"big": 300})
    b.op("tail", inputs=["i2"], outputs={"s": 1})
    b.op("use_a", inputs=["a", "s"], outputs={"out": 1})
    lat = LatencyTable({"make_a": 1.0, "idle1": 1.0, "idle2": 1.0, "peak": 1.0, "tail": 0.1, "use_a": 1.0})
    return PlannerJob(b.build(), lat)


def test_deadline_bound_counts_only_what_can_come_back_in_time():
    job = short_return_graph()
    # step 3 holds x (1) + a (100) + i2 (1) + big (300) = 402. At 100 bytes/s a's out-window
    # before step 3 is 2 s (200 B) and its in-window after it 0.1 s (10 B): at most 10 B away.
    bound = swap_link_bound([job], 100.0)
    assert bound.vanilla_peak_bytes == 402
    assert bound.deadline_bound_peak_bytes == 402 - 10
    assert bound.bound_step == {"short": "peak"}
    # the period is 5.1 s: bandwidth x period / 2 = 255 B would allow all of a
    assert bound.bandwidth_bound_peak_bytes == 402 - 255
    # a fast link: all of a can be away at step 3
    assert swap_link_bound([job], 1e6).deadline_bound_peak_bytes == 302
    # the planner cannot pass the bound: on the slow link a cannot come back in 0.1 s
    planner = Planner([job], pool_bytes=1, bandwidth_bytes_per_s=100.0, enable_recompute=False)
    assert planner.plan().pool_planned_peak_bytes == 402
    fast = Planner([job], pool_bytes=1, bandwidth_bytes_per_s=1e6, enable_recompute=False).plan()
    assert fast.pool_planned_peak_bytes == 302


def test_a_device_link_moves_its_share_of_the_step_peak_per_step():
    """Note [Links named for a device]: h200-pcie5 moves 33% of a step's peak per step, so
    for short (peak 402 B, step 5.1 s) it is 0.33 x 402 / 5.1 bytes/s; for two jobs, the
    peaks and step times summed."""
    from tensile_tf.config.device_links import DEVICE_LINKS, describe_swap_link, device_link_bandwidth
    from tensile_tf.config.schema import RunSpec

    peak, period = unplanned_peak_and_period(short_return_graph())
    assert (peak, round(period, 6)) == (402, 5.1)
    h200 = DEVICE_LINKS["h200-pcie5"]
    assert device_link_bandwidth(h200, [peak], [period]) == int(0.33 * 402 / 5.1)
    assert device_link_bandwidth(h200, [402, 1000], [5.1, 2.0]) == int(0.33 * 1402 / 7.1)
    assert RunSpec(swap_bandwidth="H200-PCIe5").swap_bandwidth == "h200-pcie5"
    assert RunSpec(swap_bandwidth="110MiB").swap_bandwidth == 110 * 2**20
    assert describe_swap_link(None).startswith("unlimited")
    assert describe_swap_link(26, "h200-pcie5").endswith("0.0 MiB/s here")
    with pytest.raises(ValueError, match="neither bytes per second .* nor a device link .*h200-pcie5"):
        RunSpec(swap_bandwidth="h100")


def test_working_set_floor_is_the_largest_step_with_what_no_plan_moves():
    # make_a: x + a = 101 | idle1: x + i1 = 2 | peak: x + i2 + big = 302 | use_a: x + a + s + out = 103
    assert working_set_floor([short_return_graph()]) == 302


def test_two_jobs_floor_holds_whatever_their_alignment():
    # Note [Floor whatever the alignment]: short's floor runs 2 .. 302; while
    # one copy peaks the other holds at least 2
    job = short_return_graph()
    assert working_set_floor([job, job]) == 302 + 2
    # a copy started later holds nothing before it starts, but while it peaks
    # the first copy runs and holds its 2
    later = PlannerJob(job.graph, job.latencies, start_offset_s=0.5)
    assert working_set_floor([job, later]) == 302 + 2
    # a one-op job (3 bytes, every step) beside short adds 3 to short's peak;
    # started later it may not have started when short peaks
    b = GraphBuilder("small")
    b.tensor("u", 1, "input")
    b.op("one", inputs=["u"], outputs={"v": 2})
    small = PlannerJob(b.build(), LatencyTable({"one": 1.0}))
    assert working_set_floor([job, small]) == 302 + 3
    assert working_set_floor([job, PlannerJob(small.graph, small.latencies, start_offset_s=0.5)]) == 302


def test_a_recompute_that_moves_one_jobs_peak_off_the_others_stays_above_the_floor():
    # found by the property test below (CI, stop 25): on the unplanned grid the
    # two jobs' floors summed to 10 bytes; recomputing t0_0 lengthened each
    # step so the peaks no longer met, and the plan peaked at 9
    def job(name, n, last_s, temp):
        b = GraphBuilder(name)
        b.tensor("x", 1, "input").tensor("w0", 1, "parameter")
        for k in range(n):
            b.op(f"op{k}", inputs=["x"], outputs={f"t{k}_0": 1, **({f"t{k}_1": 1} if k == n - 1 and n > 2 else {})},
                 temp_bytes=temp if k == n - 1 else 0)
        b.op("upd0", inputs=["t0_0"], updates=["w0"])
        g = b.build()
        return PlannerJob(g, LatencyTable({**{o.name: 1.0 for o in g.ops}, f"op{n - 1}": last_s}))
    jobs = [job("job0", 2, 1.0, 3), job("job1", 8, 0.5, 2)]
    plan = Planner(jobs, pool_bytes=1, bandwidth_bytes_per_s=1e12).plan()
    assert plan.pool_planned_peak_bytes >= working_set_floor(jobs)


# The properties run a fixed example set (derandomize) so CI does not turn on
# what a random search meets. A random search (2000 examples each) once found
# a plan under the working-set floor and a swap-only plan under the deadline
# bound: both were one gap swapped twice (Note [One swap per gap] in
# swap_scheduling; the hand-worked case at the end of this file). At that fix
# both properties passed 2000 random examples.
@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scenarios())
def test_no_plan_goes_below_the_working_set_floor(scn):
    jobs, _, _ = scn
    plan = Planner(jobs, pool_bytes=1, bandwidth_bytes_per_s=1e12).plan()   # swaps and recomputation, any link
    assert plan.pool_planned_peak_bytes >= working_set_floor(jobs)


@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scenarios())
def test_no_swap_only_plan_goes_below_the_deadline_aware_link_bound(scn):
    jobs, bandwidth, frac = scn
    budget = None if frac is None else max(1, int(Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes * frac))
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth, enable_recompute=False)
    plan = planner.plan()
    bound = swap_link_bound(jobs, bandwidth)
    assert plan.pool_planned_peak_bytes >= bound.deadline_bound_peak_bytes
    # the deadline-aware bound is the tighter one, and no bound lies above the unplanned peak
    assert bound.deadline_bound_peak_bytes >= bound.bandwidth_bound_peak_bytes
    assert bound.deadline_bound_peak_bytes <= bound.vanilla_peak_bytes


@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scenarios())
def test_bottleneck_restarts_never_raise_the_peak_and_keep_the_invariants(scn):
    jobs, bandwidth, frac = scn
    budget = None if frac is None else max(1, int(Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes * frac))
    once = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth, bottleneck_restarts=0).plan()
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    plan = planner.plan()
    # ranked as the planner ranks passes (Note [Chain limits tried]): a peak within the budget counts as
    # the budget; two plans that meet it differ by step time and bytes moved, not by how far under they are
    # (found: a pass that recomputes first met a 2763 B budget at 2506 B, the restarted swaps at 2754 B)
    assert max(plan.pool_planned_peak_bytes, budget or 0) <= max(once.pool_planned_peak_bytes, budget or 0)
    check_invariants(planner, plan)


def slow_link_graph():
    """A case where the first pass spends the link on the wrong peak (found by
    a hypothesis search of the property graphs, kept as it came): nine ops of
    1 s, a 3-byte t1_0 kept from op1 to op7, a parameter pair and a slot
    updated at the end, a max swapping rate of 0.5; 20 bytes/s, budget 30% of
    the unplanned peak."""
    b = GraphBuilder("job0")
    b.tensor("x", 1, "input").tensor("w0", 1, "parameter").tensor("w1", 1, "parameter").tensor("m0", 2, "slot")
    for k in range(9):
        if k == 7:
            b.op("op7", inputs=["t1_0"], outputs={"t7_0": 1})
        else:
            b.op(f"op{k}", inputs=["x"], outputs={f"t{k}_0": 3 if k == 1 else 1}, temp_bytes={2: 1, 4: 2}.get(k, 0))
    for i, v in enumerate(["w0", "w1", "m0"]):
        b.op(f"upd{i}", inputs=["t0_0"], updates=[v])
    g = b.build()
    return PlannerJob(g, LatencyTable({o.name: 1.0 for o in g.ops}), max_swapping_rate=0.5)


def test_a_restart_serving_the_last_peak_first_lowers_it():
    job = slow_link_graph()
    budget = int(Planner([job], max_iterations=0).plan().pool_vanilla_peak_bytes * 0.3)
    kw = dict(pool_bytes=budget, bandwidth_bytes_per_s=20.0, enable_recompute=False)
    once = Planner([job], bottleneck_restarts=0, **kw).plan()
    planner = Planner([job], **kw)
    plan = planner.plan()
    assert plan.pool_planned_peak_bytes < once.pool_planned_peak_bytes
    assert planner.bottlenecks     # the restart that won served a remembered step first
    check_invariants(planner, plan)


def test_a_plan_that_peaks_no_lower_than_the_unplanned_steps_is_not_applied():
    # Note [Never above unplanned]: `peak` runs beside other ops when free (observed
    # concurrent_bytes -150: the executor frees an input sooner), so the unplanned step peaks
    # at 252 while plan order holds 402; on a 100 B/s link the planner takes off only what
    # comes back in time, still above 252
    job = short_return_graph()
    job.graph.op("peak").concurrent_bytes = -150
    kept = Planner([job], pool_bytes=200, bandwidth_bytes_per_s=100.0)
    kept.keep_plans_without_gain = True
    worse = kept.plan()
    assert worse.pool_vanilla_peak_bytes == 252 and worse.pool_planned_peak_bytes > 252
    assert any(jp.swap_outs or jp.recomputes for jp in worse.jobs.values())
    plan = Planner([job], pool_bytes=200, bandwidth_bytes_per_s=100.0).plan()
    assert plan.stop_reason == NO_GAIN
    assert not any(jp.swap_outs or jp.swap_ins or jp.recomputes for jp in plan.jobs.values())
    assert plan.pool_planned_peak_bytes == plan.pool_vanilla_peak_bytes == 252


def test_a_swapped_gap_is_booked_once():
    """Found by a random search of the floor property (kept as it came, tidied):
    w0 (2 bytes) is read at op9 and updated at the end. Swapped for the peak
    at op6 it came back, by rounding, one op early, during op7; op7 then
    peaked and the planner booked w0's gap a second time, so the footprint
    took w0 off twice over op1..op6 and predicted 5 bytes under a 6-byte
    floor. Note [One swap per gap]: one booking, back during op8."""
    b = GraphBuilder("job0")
    b.tensor("x", 1, "input").tensor("w0", 2, "parameter")
    for k in range(13):
        b.op(f"op{k}", inputs=["w0" if k == 9 else "x"], outputs={f"t{k}_0": 1}, temp_bytes={6: 4, 7: 3}.get(k, 0))
    b.op("upd0", inputs=["t0_0"], updates=["w0"])
    g = b.build()
    lat = {o.name: 1.0 for o in g.ops} | {f"op{k}": 0.05 for k in range(7)} | {"op7": 0.5}
    jobs = [PlannerJob(g, LatencyTable(lat))]
    planner = Planner(jobs, pool_bytes=1, bandwidth_bytes_per_s=1e12)
    plan = planner.plan()
    assert plan.pool_planned_peak_bytes >= working_set_floor(jobs) == 6
    check_invariants(planner, plan)
    js = planner.jobs[0]
    w0 = js.tas.tindex["w0"]
    (dec,) = [d for d in planner.order if d.i == w0]
    assert dec.in_step == js.tas.step_index["op8"]
    # the gap is booked: no second swap of it, for any step inside it
    for m in range(dec.release_step + 1, dec.in_step):
        assert scheduling_swap(planner.jobs, planner.channel, js, w0, m) is None
