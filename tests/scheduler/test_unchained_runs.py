"""Runs of plan order whose ops may run free (tensile_tf/scheduler/unchained_runs.py,
Note [Unchained runs]).

Hand-worked: a six-op chain whose first three ops fit together under the peak
and whose peak ops stay one by one; two jobs whose run bounds would meet the
other's peak on the pool's time axis keep their chains. Property: on every
planned scenario each job's run bounds stay at or under its planned peak, and
the runs are contiguous stretches of the plan order."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensile_tf.scheduler import GraphBuilder, JobFootprint, Plan, Planner, PlannerJob, UniformLatency
from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.peak_analysis import PoolTimeline
from tensile_tf.scheduler.unchained_runs import run_bounds, unchained_runs
from tests.scheduler.test_planner_properties import scenarios

UNIT = UniformLatency(1.0)


def six_op_chain(name: str = "six"):
    b = GraphBuilder(name)
    b.tensor("x", 10, "input")
    b.op("f1", inputs=["x"], outputs={"a": 10})
    b.op("f2", inputs=["a"], outputs={"b": 10})
    b.op("f3", inputs=["b"], outputs={"c": 10})
    b.op("f4", inputs=["c"], outputs={"big": 100})
    b.op("f5", inputs=["big"], outputs={"d": 10})
    b.op("f6", inputs=["d"], outputs={"e": 10})
    return b.build()


def test_the_ops_before_the_peak_form_one_run_and_the_peak_stays_chained():
    # steps (plan order): f1 20 | f2 30 | f3 30 | f4 120 | f5 120 | f6 30.
    # f1..f3 all at once hold x, a, b, c = 40 (and f4's inputs are all held already);
    # adding f4 (big) makes 140 > 120. f4 with f5 holds x, c, big, d = 130; f5 with f6 130.
    tas = TensorAccessSequence(six_op_chain(), UNIT)
    fp = JobFootprint(tas)
    assert fp.F.tolist() == [20, 30, 30, 120, 120, 30]
    runs, bound = run_bounds(tas, fp, 120)
    assert runs == [(0, 2), (3, 3), (4, 4), (5, 5)]
    assert bound.tolist() == [40, 40, 40, 120, 120, 30]
    # a lower limit splits the first run; a run of one keeps its planned footprint
    runs, bound = run_bounds(tas, fp, 35)
    assert runs == [(0, 1), (2, 2), (3, 3), (4, 4), (5, 5)] and bound.tolist() == [30, 30, 30, 120, 120, 30]


def test_scratch_counts_without_forwarding_credit_in_a_run():
    """An op that forwards its output into its input's buffer gets no new
    memory chained; in a run its input may still be read by another op, so
    the run counts the scratch it would need without forwarding."""
    b = GraphBuilder("fwd")
    b.tensor("x", 10, "input")
    b.op("f1", inputs=["x"], outputs={"a": 10})
    b.op("f2", inputs=["a"], outputs={"b": 10}, temp_bytes=10)
    b.op("f3", inputs=["b"], outputs={"c": 10})
    g = b.build()
    g.ops[1].forwarded_bytes = 10
    tas = TensorAccessSequence(g, UNIT)
    fp = JobFootprint(tas)
    assert fp.F.tolist() == [20, 30, 30]               # f2's scratch is its forwarded output
    runs, bound = run_bounds(tas, fp, 45)
    assert runs == [(0, 1), (2, 2)] and bound.tolist() == [40, 40, 30]   # x, a, b and f2's 10 bytes


def test_two_jobs_whose_run_bounds_would_meet_the_others_peak_keep_their_chains():
    # job B starts 2 s after job A: A's f4 (120) runs beside B's f2 (30, bound 40), and
    # the plan's pool peak (150 = 120 + 30) would be passed by the run bound (160).
    seqs = [TensorAccessSequence(six_op_chain(n), UNIT) for n in ("A", "B")]
    fps = [JobFootprint(s) for s in seqs]
    timeline = PoolTimeline(seqs, [0.0, 2.0], 2.0)
    planned = timeline.pool_peak([f.F for f in fps])
    assert planned == 150
    assert unchained_runs(seqs, fps, [True, True], timeline, planned) is None
    # one job running unplanned (free-running footprint) gets no runs; alone each gets f1..f3
    assert unchained_runs(seqs[:1], fps[:1], [True], PoolTimeline(seqs[:1], [0.0], 2.0), 120) == [[["f1", "f3"]]]
    runs = unchained_runs(seqs, fps, [True, False], timeline, 10**6)
    assert runs == [[["f1", "f3"]], []]


def test_a_planned_step_carries_its_runs_through_json_and_a_chained_plan_has_none():
    b = GraphBuilder("six")
    b.tensor("x", 10, "input").tensor("w", 40, "parameter")
    b.op("f1", inputs=["x", "w"], outputs={"a": 10})
    for k, (i, o, size) in enumerate([("a", "b", 10), ("b", "c", 10), ("c", "big", 100), ("big", "d", 10),
                                      ("d", "e", 10)], start=2):
        b.op(f"f{k}", inputs=[i], outputs={o: size})
    b.op("upd", inputs=["e"], updates=["w"])
    g = b.build()
    kw = dict(pool_bytes=125, bandwidth_bytes_per_s=1e9, enable_recompute=False)
    plan = Planner([PlannerJob(g, UNIT)], **kw).plan()
    jp = plan.jobs["six"]
    assert jp.swap_outs and jp.unchained_runs and all(len(r) == 2 for r in jp.unchained_runs)
    assert Plan.from_json(plan.to_json()) == plan
    assert Planner([PlannerJob(g, UNIT)], unchain=False, **kw).plan().jobs["six"].unchained_runs == []
    assert Planner([PlannerJob(g, UNIT)], step_order="free", **kw).plan().jobs["six"].unchained_runs == []


@settings(suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scenarios())
def test_run_bounds_stay_under_each_jobs_planned_peak(scn):
    jobs, bandwidth, frac = scn
    budget = None if frac is None else max(1, int(Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes * frac))
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    plan = planner.plan()
    for js in planner.jobs:
        tas, fp = js.tas, js.fp
        peak = int(fp.F.max(initial=0))
        runs, bound = run_bounds(tas, fp, peak)
        assert (bound <= max(peak, 0)).all() and (bound >= fp.F).all()
        assert [a for a, _ in runs] == [0] + [b + 1 for _, b in runs[:-1]] and runs[-1][1] == tas.n - 1
        assert all(tas.is_original[a] for a, _ in runs)
        order = [o.name for o in js.graph.ops]
        for first, last in plan.jobs[js.name].unchained_runs:
            assert order.index(first) < order.index(last)


def test_a_buffer_a_view_pins_counts_in_a_run_while_its_owner_is_away():
    """Note [Views]: h is taken off over pad_1..pad_2, but a stateful view of
    it (not made again by the rewrite) holds its buffer, so the footprint
    counts it and so does every run over those steps."""
    from tensile_tf.scheduler.unchained_runs import residency_intervals
    from tests.scheduler.test_planner_by_hand import _viewed_graph

    tas = TensorAccessSequence(_viewed_graph(view_stateful=True), UNIT)
    fp = JobFootprint(tas)
    h = tas.tindex["h"]
    fp.add_absence(h, 3, 6)
    t, lo, hi = residency_intervals(tas, fp)
    for k in (3, 4, 5):
        assert h not in fp.resident_at(k)
        assert ((t == h) & (lo <= k) & (hi >= k)).any()
    runs, bound = run_bounds(tas, fp, 160)
    assert runs == [(0, 3), (4, 5), (6, 7)] and bound.tolist() == [101, 101, 101, 101, 160, 160, 112, 112]


def _reference_run_bounds(tas, fp, limit):
    """Note [Runs from residency intervals]'s oracle: the same greedy runs
    from every step's resident set, asked for step by step (the pass as it
    was before it read intervals)."""
    import numpy as np
    n = tas.n
    bound = fp.F.astype(np.int64).copy()
    held_at = [fp.resident_at(k) for k in range(n)]
    for i, ranges in fp.absences.items():
        for a, b in ranges:
            for k in (a + np.flatnonzero(fp._freed_by_absence(i, a, b) == 0)).tolist():
                if tas.first[i] <= k <= tas.last[i]:
                    held_at[k] = np.union1d(held_at[k], [i])
    scratch = [max(0, int(tas.ops_by_name[o].temp_bytes)) for o in tas.step_op]
    units, k = [], 0
    while k < n:
        e = k
        while e + 1 < n and not tas.is_original[e + 1]:
            e += 1
        units.append((k, e))
        k = e + 1

    def hold(first, last, held):
        added = 0
        for k in range(first, last + 1):
            for i in held_at[k].tolist():
                if i not in held:
                    held.add(i)
                    added += int(tas.size[i])
            added += scratch[k]
        return added

    def arriving(k, held):
        if k >= n:
            return 0
        return sum(int(tas.size[i]) for i in held_at[k].tolist() if tas.first[i] < k and i not in held)

    runs, u = [], 0
    while u < len(units):
        a, b = units[u]
        held: set = set()
        total = hold(a, b, held)
        v = u
        while v + 1 < len(units):
            c, d = units[v + 1]
            trial = set(held)
            more = hold(c, d, trial)
            if total + more + arriving(d + 1, trial) > limit:
                break
            held, total, v, b = trial, total + more, v + 1, d
        if v > u:
            bound[a:b + 1] = np.maximum(bound[a:b + 1], total + arriving(b + 1, held))
        runs.append((a, b))
        u = v + 1
    return runs, bound


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.floats(0.3, 1.2))
def test_runs_from_intervals_match_the_step_by_step_oracle(scn, limit_frac):
    """Note [Runs from residency intervals]: on planned scenarios (swaps,
    recomputations, views) and limits below and above each job's peak, the
    interval pass cuts the same runs with the same bounds as asking every
    step for its resident set."""
    import numpy as np
    jobs, bandwidth, frac = scn
    budget = None if frac is None else max(1, int(Planner(jobs, max_iterations=0).plan().pool_vanilla_peak_bytes * frac))
    planner = Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    planner.plan()
    for js in planner.jobs:
        limit = int(int(js.fp.F.max(initial=0)) * limit_frac)
        runs, bound = run_bounds(js.tas, js.fp, limit)
        want_runs, want_bound = _reference_run_bounds(js.tas, js.fp, limit)
        assert runs == want_runs
        assert np.array_equal(bound, want_bound)
