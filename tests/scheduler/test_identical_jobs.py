"""Note [Identical jobs planned by representatives]: identical jobs planned
as two representatives, each plan copied to its jobs back to back inside
its transfers."""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensile_tf.scheduler import JobGraph, Plan, Planner, PlannerJob, SwapChannel
from tensile_tf.scheduler.planner import NO_GAIN
from tests.scheduler.test_planner_properties import check_invariants, job_graphs


@st.composite
def identical_jobs(draw):
    g, lat = draw(job_graphs("job"))
    k = draw(st.integers(6, 9))
    offset = draw(st.sampled_from([0.0, 1.3]))
    rate = draw(st.sampled_from([1.0, 0.5]))
    jobs = [PlannerJob(JobGraph(f"job-{i}", g.ops, g.tensors), lat, offset, rate) for i in range(k)]
    options = dict(bandwidth_bytes_per_s=draw(st.sampled_from([20.0, 100.0, 500.0, 5000.0])),
                   coincident_peaks=draw(st.booleans()), link_lanes=draw(st.sampled_from([1, 2])))
    return jobs, draw(st.sampled_from([None, 0.3, 0.6, 0.9])), options


def _budget(jobs, frac, options):
    """The budget at ``frac`` of the jobs' unplanned pool peak (None: minimise)."""
    if frac is None:
        return None
    vanilla = Planner(jobs, max_iterations=0, **options).plan().pool_vanilla_peak_bytes
    return max(1, int(vanilla * frac))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(identical_jobs())
def test_every_copy_holds_no_more_than_its_representative_and_the_plan_keeps_the_invariants(scn):
    jobs, frac, options = scn
    planner = Planner(jobs, pool_bytes=_budget(jobs, frac, options), **options)
    plan = planner.plan()
    assert plan.representatives == 2
    check_invariants(planner, plan)            # every transfer of every copy on the one link, none overlapping
    assert Plan.from_json(plan.to_json()) == plan
    if plan.stop_reason == NO_GAIN:            # the jobs run unplanned: nothing was copied
        return
    rep, k = planner.representative_planner, len(jobs)
    c = math.ceil(k / 2)
    for j, js in enumerate(planner.jobs):
        src = rep.jobs[j // c]
        assert len(js.decisions) == len(src.decisions) and js.recomputes == src.recomputes
        assert (js.fp.F <= src.fp.F).all(), js.name     # a copy is off the device at least as long
        assert plan.jobs[js.name].planned_peak_bytes >= int(js.fp.F.max())
    assert planner._pool_peak() <= c * rep._pool_peak()
    assert plan.pool_planned_peak_bytes <= c * rep._pool_peak()


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(identical_jobs())
def test_the_same_jobs_are_planned_jointly_below_the_count_or_when_they_differ(scn):
    """The controls: representatives_from above the count, and jobs whose
    tables differ by more than ``alike_latencies_within``, plan jointly;
    equal latencies in separate tables plan by representatives, on a table
    no job is slower than (Note [Jobs of one graph planned on their fastest
    latencies])."""
    jobs, frac, options = scn
    budget = _budget(jobs, frac or 0.6, options)    # a budget: joint minimise mode is slow to no purpose here
    fewer = Planner(jobs, pool_bytes=budget, **options)
    fewer.representatives_from = len(jobs) + 1
    assert fewer.plan().representatives == 0
    lat = jobs[0].latencies
    equal = [PlannerJob(pj.graph, type(lat)(dict(lat.seconds)), pj.start_offset_s, pj.max_swapping_rate)
             for pj in jobs]
    plan = Planner(equal, pool_bytes=budget, **options).plan()
    assert plan.representatives == 2 and plan.latency_spread == 0.0
    apart = [PlannerJob(pj.graph, type(lat)({o: s * (1.5 if i % 2 else 1.0) for o, s in lat.seconds.items()}),
                        pj.start_offset_s, pj.max_swapping_rate) for i, pj in enumerate(jobs)]
    plan = Planner(apart, pool_bytes=budget, **options).plan()
    assert plan.representatives == 0 and plan.latency_spread is None


def test_a_link_booked_at_once_refuses_overlapping_transfers():
    channel = SwapChannel(1.0, 10.0, [0.0, 0.0], [5.0, 5.0])
    tags = channel.reserve_many([(0, 0.0, 1.0, "out"), (1, 1.0, 1.0, "out"), (1, 2.5, 1.0, "in")])
    assert len(tags) == 3 and channel.busy_intervals()[:3] == [(0.0, 1.0), (1.0, 2.0), (2.5, 3.5)]
    with pytest.raises(RuntimeError, match="overlapping"):
        SwapChannel(1.0, 10.0, [0.0, 0.0], [5.0, 5.0]).reserve_many([(0, 0.0, 1.0, "out"), (1, 0.5, 1.0, "in")])
    with pytest.raises(RuntimeError, match="empty link"):
        channel.reserve_many([(0, 4.0, 0.5, "out")])


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(identical_jobs(), st.floats(0.5, 2.0))
def test_a_replan_of_copies_plans_them_on_their_fastest_latencies_or_each_job_as_itself(scn, scale):
    """Note [Jobs of one graph planned on their fastest latencies]: one job's
    table scaled; within ``alike_latencies_within`` of the fastest the jobs
    are planned afresh by representatives on it, beyond it (the control)
    each job as itself, on its own table."""
    jobs, frac, options = scn
    planner = Planner(jobs, pool_bytes=_budget(jobs, frac, options), **options)
    assert planner.plan().representatives == 2 and planner.plan().latency_spread is None
    lat = jobs[0].latencies
    scaled = type(lat)({o: s * scale for o, s in lat.seconds.items()}, dict(lat.by_type), lat.default_s * scale)
    plan = planner.replan({jobs[0].graph.name: scaled})
    assert jobs[0].latencies is scaled and all(pj.latencies is lat for pj in jobs[1:])   # the callers' tables kept
    spread = abs(scale - 1.0) / min(scale, 1.0)      # the slowest table's sum over the fastest's
    if spread > planner.alike_latencies_within + 1e-9:
        assert plan.representatives == 0 and planner.representative_planner is None and plan.latency_spread is None
        assert all(js.latencies is pj.latencies for js, pj in zip(planner.jobs, jobs))
    elif spread < planner.alike_latencies_within - 1e-9:
        assert plan.representatives == 2 and plan.latency_spread == pytest.approx(spread, rel=1e-6)
        fastest = planner.jobs[0].latencies        # every job's state on the one table, op by op the faster
        assert all(js.latencies is fastest for js in planner.jobs)
        assert all(fastest.latency_s(o) == min(lat.latency_s(o), scaled.latency_s(o)) for o in jobs[0].graph.ops)
        again = planner.replan({jobs[0].graph.name: type(lat)({o: s * 3 for o, s in lat.seconds.items()},
                                                              dict(lat.by_type), lat.default_s * 3)})
        assert again.representatives == 0 and again.latency_spread is None     # apart: each job as itself
        assert all(js.latencies is pj.latencies for js, pj in zip(planner.jobs, jobs))
        check_invariants(planner, again)
        return
    check_invariants(planner, plan)
