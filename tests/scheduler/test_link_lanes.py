"""A lane per direction (Note [A lane per direction] in
tensile_tf/scheduler/swap_scheduling.py; Note [Lanes of a device link] in
tensile_tf/config/device_links.py): the planner's channel, its link bound,
the baselines under the same link, and ``run.link_lanes``.

Hand-worked: a swap-in and a swap-out that need the same second (one lane
serves one of them: the pool peak stays; two serve both), the link bounds
of short_return_graph on one and two lanes. Properties: a two-lane plan
never books two transfers of one direction at once, and no swap-only plan
goes below the two-lane deadline bound."""
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from tensile_tf.scheduler import GraphBuilder, LatencyTable, Plan, Planner, PlannerJob
from tensile_tf.scheduler.baselines import CapuchinPlanner, VDNNPlanner
from tensile_tf.scheduler.link_bound import swap_link_bound
from tensile_tf.scheduler.swap_channel import IN, OUT, SwapChannel, lane_bandwidth
from tests.scheduler.test_link_bound import short_return_graph
from tests.scheduler.test_planner_properties import scenarios


def crossing_graph():
    """a is needed back for op4 and b must leave before it, in the same second:

      0 make_a 1 s (a 100) | 1 idle 1 s | 2 peak_a 1 s (big_a 300, b 100) | 3 mid 1 s
      4 peak_b 1 s (reads a; big_b 300) | 5 idle 1 s | 6 use_b 1 s (reads b)

    Unplanned, op2 and op4 each hold 502 B. Taking a off at op2 brings it back
    during op3; taking b off at op4 sends it out during op3. At 120 B/s each
    transfer takes 0.83 s: one lane carries one of the two within op3's
    second, two lanes carry both."""
    b = GraphBuilder("cross")
    b.tensor("x", 1, "input")
    b.op("make_a", inputs=["x"], outputs={"a": 100})
    b.op("idle", inputs=["x"], outputs={"i": 1})
    b.op("peak_a", inputs=["i"], outputs={"big_a": 300, "b": 100})
    b.op("mid", inputs=["x"], outputs={"m": 1})
    b.op("peak_b", inputs=["a", "m"], outputs={"big_b": 300})
    b.op("idle2", inputs=["x"], outputs={"j": 1})
    b.op("use_b", inputs=["b", "j"], outputs={"out": 1})
    g = b.build()
    return PlannerJob(g, LatencyTable({o.name: 1.0 for o in g.ops}))


def spans_by_lane(planner: Planner, plan: Plan, lanes: int) -> dict[int, list[tuple]]:
    """Every repetition over the horizon of every planned transfer, by the
    lane its direction books."""
    out: dict[int, list[tuple]] = {}
    H = planner.timeline.horizon_s
    for js in planner.jobs:
        T = js.tas.period_s
        jp = plan.jobs[js.name]
        for e in jp.swap_outs + jp.swap_ins:
            lane = 1 if lanes == 2 and e.kind == "swap_in" else 0
            k_lo = math.ceil((-js.offset_s - e.start_s - e.duration_s) / T)
            k_hi = math.floor((H - js.offset_s - e.start_s) / T)
            for k in range(k_lo, k_hi + 1):
                g0 = js.offset_s + k * T + e.start_s
                out.setdefault(lane, []).append((g0, g0 + e.duration_s, e.kind, e.tensor))
    return {lane: sorted(s) for lane, s in out.items()}


def assert_lanes_apart(spans: dict[int, list[tuple]]) -> None:
    for lane, s in spans.items():
        for a, b in zip(s, s[1:]):
            assert a[1] <= b[0] + 1e-7, f"lane {lane}: overlapping transfers {a} and {b}"


def out_in_overlap(spans: dict[int, list[tuple]]) -> bool:
    every = [x for s in spans.values() for x in s]
    outs = [x for x in every if x[2] == "swap_out"]
    ins = [x for x in every if x[2] == "swap_in"]
    return any(min(o[1], i[1]) - max(o[0], i[0]) > 1e-7 for o in outs for i in ins)


def test_two_lanes_let_an_out_and_an_in_share_a_second_one_lane_never_does():
    one = SwapChannel(100.0, 10.0, [0.0], [10.0])
    two = SwapChannel(100.0, 10.0, [0.0], [10.0], lanes=2)
    for ch in (one, two):
        d = ch.duration(100)
        assert d == 1.0
        out = ch.reserve(0, 2.0, d, direction=OUT)
        # an in wanted within [2.5, 4]: one lane pushes it after the out, two lanes take it at once
        at = ch.earliest(0, 2.5, 3.0, d, direction=IN)
        assert at == (2.5 if ch.lanes == 2 else 3.0)
        inn = ch.reserve(0, at, d, direction=IN)
        assert (ch.lane_of(out), ch.lane_of(inn)) == ((0, 1) if ch.lanes == 2 else (0, 0))
        # a second out still waits for the first, on either link
        assert ch.earliest(0, 2.0, 5.0, d, direction=OUT) == (3.0 if ch.lanes == 2 else 4.0)
    assert two.busy_intervals(0) == [(2.0, 3.0)] and two.busy_intervals(1) == [(2.5, 3.5)]
    assert two.busy_intervals() == [(2.0, 3.0), (2.5, 3.5)]
    assert one.busy_intervals() == one.busy_intervals(0) == [(2.0, 3.0), (3.0, 4.0)]
    two.release(inn)
    assert two.busy_intervals(1) == [] and two.busy_intervals(0) == [(2.0, 3.0)]
    assert two.utilisation() == pytest.approx(1.0 / 20)
    with pytest.raises(RuntimeError, match="overlapping"):
        two.reserve(0, 2.5, 1.0, direction=OUT)
    with pytest.raises(ValueError, match="lanes must be 1 or 2"):
        SwapChannel(100.0, 10.0, [0.0], [10.0], lanes=3)
    with pytest.raises(ValueError, match="direction"):
        one.lane("both")


def test_a_combined_cap_books_each_lane_at_its_share():
    # the H200: 55 each way, 92 both ways: a lane at 46; one lane at the each-way rate
    assert lane_bandwidth(55.0, 2, 92.0) == 46.0
    assert lane_bandwidth(55.0, 2, 120.0) == 55.0
    assert lane_bandwidth(55.0, 1, None) == lane_bandwidth(55.0, 2, None) == 55.0
    ch = SwapChannel(55.0, 10.0, [0.0], [10.0], lanes=2, combined_bytes_per_s=92.0)
    assert ch.duration(92) == 2.0


def test_two_lanes_lower_the_peak_where_the_link_is_the_bottleneck():
    job = crossing_graph()
    kw = dict(pool_bytes=1, bandwidth_bytes_per_s=120.0, enable_recompute=False)
    p1 = Planner([job], **kw)
    one = p1.plan()
    p2 = Planner([job], link_lanes=2, **kw)
    two = p2.plan()
    assert one.pool_vanilla_peak_bytes == two.pool_vanilla_peak_bytes == 502
    assert one.pool_planned_peak_bytes == 502            # one of the two swaps fits op3, the other peak stays
    assert two.pool_planned_peak_bytes == 402            # both fit: a in and b out at once
    s1, s2 = spans_by_lane(p1, one, 1), spans_by_lane(p2, two, 2)
    assert_lanes_apart(s1)
    assert_lanes_apart(s2)
    assert not out_in_overlap(s1) and out_in_overlap(s2)
    # the planner's own channel agrees: each lane's intervals apart, the lanes together not
    for lane in (0, 1):
        iv = p2.channel.busy_intervals(lane)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(iv, iv[1:]))
    every = p2.channel.busy_intervals()
    assert any(a[1] > b[0] + 1e-9 for a, b in zip(every, every[1:]))


def test_one_lane_is_the_seeds_link_bit_for_bit():
    job = crossing_graph()
    kw = dict(pool_bytes=1, bandwidth_bytes_per_s=120.0, enable_recompute=False)
    for budget in (1, 450):
        kw["pool_bytes"] = budget
        seed, one = (replace(Planner([job], **k, **kw).plan(), planning_s=0.0) for k in ({}, {"link_lanes": 1}))
        assert seed.to_json() == one.to_json()


@pytest.mark.parametrize("cls", [VDNNPlanner, CapuchinPlanner])
def test_baselines_book_the_same_lanes(cls):
    job = crossing_graph()
    planner = cls([job], pool_bytes=1, bandwidth_bytes_per_s=120.0, enable_recompute=False, link_lanes=2)
    plan = planner.plan()
    assert planner.channel.lanes == 2
    assert_lanes_apart(spans_by_lane(planner, plan, 2))


def test_the_link_bound_per_lane():
    job = short_return_graph()     # peak 402 at step 3; a (100 B) back within 0.1 s; period 5.1 s
    one = swap_link_bound([job], 100.0)
    two = swap_link_bound([job], 100.0, lanes=2)
    assert (one.lanes, two.lanes) == (1, 2)
    assert one.bandwidth_bound_peak_bytes == 402 - 255           # bandwidth x T / 2
    assert two.bandwidth_bound_peak_bytes == 0                   # bandwidth x T = 510 B: all of it
    assert one.deadline_bound_peak_bytes == two.deadline_bound_peak_bytes == 402 - 10
    # a combined cap of 120 B/s: each lane at 60 B/s
    capped = swap_link_bound([job], 100.0, lanes=2, combined_bytes_per_s=120.0)
    assert capped.bandwidth_bound_peak_bytes == 402 - 306
    assert capped.deadline_bound_peak_bytes == 402 - 6


@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True, max_examples=60)
@given(scenarios())
def test_two_lane_plans_keep_each_lane_apart_and_stay_above_the_two_lane_bound(scn):
    jobs, bandwidth, frac = scn
    vanilla = Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes
    budget = None if frac is None else max(1, int(vanilla * frac))
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth, enable_recompute=False, link_lanes=2)
    plan = planner.plan()
    assert_lanes_apart(spans_by_lane(planner, plan, 2))
    bound = swap_link_bound(jobs, bandwidth, lanes=2)
    assert plan.pool_planned_peak_bytes >= bound.deadline_bound_peak_bytes
    assert bound.deadline_bound_peak_bytes >= bound.bandwidth_bound_peak_bytes
    # a second lane only adds link time: the bound never rises (a greedy plan may)
    assert bound.deadline_bound_peak_bytes <= swap_link_bound(jobs, bandwidth).deadline_bound_peak_bytes


def test_run_link_lanes_parses_and_defaults():
    from tensile_tf.config.device_links import combined_bandwidth, link_lanes
    from tensile_tf.config.schema import RunSpec

    assert RunSpec().link_lanes is None
    assert RunSpec(link_lanes=2).link_lanes == 2 and RunSpec(link_lanes=1).link_lanes == 1
    with pytest.raises(ValueError):
        RunSpec(link_lanes=3)
    # the default: two lanes on a link named for a device, one otherwise; link_lanes: 1 keeps the seed's
    assert link_lanes("h200-pcie5") == 2 and link_lanes(None) == 1
    assert link_lanes("h200-pcie5", 1) == 1 and link_lanes(None, 2) == 2
    # a device link's combined cap: 92/55 of its each-way rate, on two lanes only
    assert combined_bandwidth("h200-pcie5", 550, 2) == pytest.approx(920)
    assert combined_bandwidth("h200-pcie5", 550, 1) is None and combined_bandwidth(None, 550, 2) is None
