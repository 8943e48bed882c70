"""The planner's fast paths against the plain forms they replace (issue 56):
Note [One build of the tensor side] (scheduler/access_sequence.py), a plan's
copies' absences added at once (``JobFootprint.add_absences``), a link
booked at once (``SwapChannel.reserve_many``), and
``SwapChannel.is_free`` for the swap-in at its trigger's end."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.captures.capture import load_capture
from tensile_tf.scheduler import Planner, PlannerJob
from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.peak_analysis import JobFootprint
from tensile_tf.scheduler.swap_channel import IN, OUT, SwapChannel
from tests.scheduler.test_planner_properties import scenarios

CAPTURES = Path(__file__).resolve().parents[2] / "benchmarks" / "captures"
SMALL = ["mlp_b32", "small_cnn_b16", "residual_net_b8", "transformer_b4"]


def _accesses_by_hand(graph) -> tuple[list[list[int]], list[list[str]], list[list[int]]]:
    """acc, acc_kind and writes of a sequence without recomputations, step by step as seed 000
    §III-C reads them: an op's inputs read (TUA), its updates and outputs written; two accesses
    of one tensor in one step are one, of the kind that writes."""
    index = {t: i for i, t in enumerate(graph.tensors)}
    acc = [[] for _ in index]
    kinds = [[] for _ in index]
    writes = [[] for _ in index]
    for k, op in enumerate(graph.ops):
        for names, kind in ((op.inputs, "TUA"), (op.updates, "UPDATE"), (op.outputs, "TGA")):
            for t in names:
                i = index[t]
                if acc[i] and acc[i][-1] == k:
                    kinds[i][-1] = kind if kind != "TUA" else kinds[i][-1]
                else:
                    acc[i].append(k)
                    kinds[i].append(kind)
                if kind != "TUA" and k not in writes[i]:
                    writes[i].append(k)
    return acc, kinds, writes


@pytest.mark.parametrize("stem", SMALL)
def test_the_op_loop_records_every_access_as_read_by_hand(stem):
    graph, lat = load_capture(CAPTURES / f"{stem}.json")
    tas = TensorAccessSequence(graph, lat)
    acc, kinds, writes = _accesses_by_hand(graph)
    merged = set(tas.read_as_owner.values())      # Note [Views read as their owner]: their reads added after
    assert tas.writes == writes
    for i in range(len(acc)):
        if i not in merged:
            assert (tas.acc[i], tas.acc_kind[i]) == (acc[i], kinds[i]), tas.tensor_names[i]
    persistent = tas.persistent
    assert (tas.first[persistent] == 0).all() and (tas.last[persistent] == tas.n - 1).all()


def _same_sequence(a: TensorAccessSequence, b: TensorAccessSequence) -> None:
    skip = {"_structure_cache", "_tensor_side"}
    assert a.__dict__.keys() == b.__dict__.keys()
    for key in a.__dict__.keys() - skip:
        x, y = a.__dict__[key], b.__dict__[key]
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), key
        else:
            assert x == y, key


@pytest.mark.parametrize("stem", ["residual_net_b32", "transformer_b4", "small_cnn_b16"])
def test_a_sequence_built_like_another_is_the_sequence_built_alone(stem):
    """With recomputations a plan chose (a slow link makes the planner recompute), the sequence
    built from the plain one (its tensor side shared, Note [Recompute steps inserted into a built
    sequence]: its steps and accesses moved, the recompute steps inserted) is the one the op loop
    builds from the graph alone, access kinds included."""
    graph, lat = load_capture(CAPTURES / f"{stem}.json")
    planner = Planner([PlannerJob(graph, lat)], pool_bytes=None, bandwidth_bytes_per_s=110 * 2**20)
    planner.plan()
    recomputes = planner.jobs[0].recomputes
    assert recomputes, "the plan recomputed nothing: the case checks nothing"
    plain = TensorAccessSequence(graph, lat)
    alone = TensorAccessSequence(graph, lat, recomputes)
    like = TensorAccessSequence(graph, lat, recomputes, like=plain)
    assert like._tensor_side is plain._tensor_side
    _same_sequence(like, alone)
    assert like.acc_kind == alone.acc_kind
    assert alone.n == plain.n + sum(len(ev.ops) for ev in recomputes)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_link_booked_at_once_is_the_link_booked_one_by_one(data):
    """``SwapChannel.reserve_many`` (its repeats as arrays) books what ``reserve`` books, in
    each lane the same starts, ends and tags, and each reservation the same repeats."""
    periods = [data.draw(st.sampled_from([1.0, 1.5, 2.25, 0.7])) for _ in range(2)]
    lanes = data.draw(st.sampled_from([1, 2]))
    make = lambda: SwapChannel(1.0, 6.0, [0.0, 0.4], periods, lanes=lanes)  # noqa: E731
    one_by_one, bookings = make(), []
    for _ in range(data.draw(st.integers(0, 16))):
        j, d = data.draw(st.integers(0, 1)), data.draw(st.sampled_from([0.05, 0.2, 0.5, 0.013]))
        direction = data.draw(st.sampled_from([OUT, IN]))
        tau = one_by_one.earliest(j, data.draw(st.floats(-0.5, 2.0)), 3.0, d, direction=direction)
        if tau is not None:
            one_by_one.reserve(j, tau, d, direction=direction)
            bookings.append((j, tau, d, direction))
    at_once = make()
    assert at_once.reserve_many(bookings) == list(one_by_one.reserved)
    assert at_once.reserved == one_by_one.reserved and at_once._booked == one_by_one._booked
    for lane in range(lanes):
        a, b = at_once._lanes[lane], one_by_one._lanes[lane]
        assert (a.starts, a.ends, a.tags) == (b.starts, b.ends, b.tags)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_absences_added_at_once_are_the_absences_added_one_by_one(scenario, data):
    jobs, _, _ = scenario
    tas = TensorAccessSequence(jobs[0].graph, jobs[0].latencies)
    if tas.n < 2:
        return
    absences = []
    for _ in range(data.draw(st.integers(1, 20))):
        i = data.draw(st.integers(0, len(tas.tensor_names) - 1))
        lo = data.draw(st.integers(-tas.n, 2 * tas.n))
        absences.append((i, lo, data.draw(st.integers(lo, lo + tas.n - 1))))
    one, batch = JobFootprint(tas), JobFootprint(tas)
    ranges = [one.add_absence(*a) for a in absences]
    assert batch.add_absences(absences) == ranges
    assert np.array_equal(one.F, batch.F) and one.absences == batch.absences


def test_absences_of_views_added_at_once_free_what_one_by_one_frees():
    """The control for the views' path (Note [Views]): the transformer's owners of views are
    added through ``add_absence`` inside the batch."""
    graph, lat = load_capture(CAPTURES / "transformer_b4.json")
    tas = TensorAccessSequence(graph, lat)
    owners = [i for i in tas.view_spans if tas.size[i] > 0] + list(tas.handed_over)
    assert owners, "no view in the capture: the case checks nothing"
    absences = [(i, int(tas.first[i]), int(tas.first[i]) + tas.n // 2) for i in owners[:20]]
    one, batch = JobFootprint(tas), JobFootprint(tas)
    for a in absences:
        one.add_absence(*a)
    batch.add_absences(absences)
    assert np.array_equal(one.F, batch.F) and one.absences == batch.absences


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_is_free_says_what_latest_says_at_its_upper_end(data):
    periods = [data.draw(st.sampled_from([1.0, 1.5, 2.25])) for _ in range(2)]
    channel = SwapChannel(1.0, 6.0, [0.0, data.draw(st.sampled_from([0.0, 0.4]))], periods,
                          lanes=data.draw(st.sampled_from([1, 2])))
    for _ in range(data.draw(st.integers(0, 12))):
        j, d = data.draw(st.integers(0, 1)), data.draw(st.sampled_from([0.05, 0.2, 0.5]))
        direction = data.draw(st.sampled_from([OUT, IN]))
        tau = channel.earliest(j, data.draw(st.floats(0.0, 2.0)), 3.0, d, direction=direction)
        if tau is not None:
            channel.reserve(j, tau, d, direction=direction)
    for _ in range(10):
        j, d = data.draw(st.integers(0, 1)), data.draw(st.sampled_from([0.05, 0.3]))
        direction = data.draw(st.sampled_from([OUT, IN]))
        tau = data.draw(st.floats(0.0, 3.0))
        latest = channel.latest(j, 0.0, tau, d, direction=direction)
        assert channel.is_free(j, tau, d, direction=direction) == (latest is not None and abs(latest - tau) <= 1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_the_peak_were_an_absence_back_is_the_peak_after_putting_it_back(scenario, data):
    """Note [Transfers that lower no peak] asks ``pool_peak_if_added`` with ``absence_delta``
    (one int for a tensor whose absence frees every step): the peak it answers is the peak the
    timeline sums once the absence is removed, views' absences included."""
    from tensile_tf.scheduler.peak_analysis import PoolTimeline
    jobs, _, _ = scenario
    tases = [TensorAccessSequence(pj.graph, pj.latencies) for pj in jobs]
    fps = [JobFootprint(t) for t in tases]
    timeline = PoolTimeline(tases, [pj.start_offset_s for pj in jobs])
    added = []
    for _ in range(data.draw(st.integers(1, 8))):
        j = data.draw(st.integers(0, len(jobs) - 1))
        if tases[j].n < 2:
            continue
        i = data.draw(st.integers(0, len(tases[j].tensor_names) - 1))
        lo = data.draw(st.integers(0, tases[j].n - 1))
        added.append((j, i, fps[j].add_absence(i, lo, data.draw(st.integers(lo + 1, lo + tases[j].n - 1)))))
    for j, i, ranges in added:
        steps, delta = fps[j].absence_delta(i, ranges)
        asked = timeline.pool_peak_if_added([f.F for f in fps], j, steps, delta)
        fps[j].remove_absence(i, ranges)
        assert asked == timeline.pool_peak([f.F for f in fps])
        for a, b in ranges:
            fps[j].add_absence(i, a, b)
