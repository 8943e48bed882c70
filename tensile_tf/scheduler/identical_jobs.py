"""Identical jobs planned as two representatives, their plans copied to
every job (not in the seeds; issue 56).

Note [Identical jobs planned by representatives]
Jobs that share one graph, one latency table, one start offset and one
swapping rate (the planner benchmark's copies; a search's trials that took
over a finished trial's traced step and its capture, Note [Captures kept
with the step] in tensile_tf/runtime/traced_step_reuse.py) differ only in
their names. Planned jointly, their cost grows with every transfer on the
shared link: from 6 ResNet50 jobs (64x64, batch 16, 60% of their unplanned
peak) the one 12 GiB/s lane is saturated, and 16 such jobs took 329 s to
plan (4,494.2 MiB against a 3,982.1 MiB budget; history/issue-56).

So k >= ``representatives_from`` identical jobs are planned as
``representatives`` = 2 jobs, each standing for c = ceil(k / 2) of them:
the two are planned jointly (one pass: the first chain limit, swaps first)
with a budget of B / c on a link of 1/c of each lane's rate, so each of
their transfers takes c times as long as it will. Each representative's
plan is then copied to its c jobs (the second one's last copy left out
where k is odd): copy i of a transfer starts i·d after the
representative's, d its time at the link's real rate, so the c copies sit
back to back inside the representative's transfer. Every copy starts no
earlier and ends no later than the representative's transfer, so:
  * a swap-out's copy ends, and its tensor is released, no later, and a
    swap-in's copy starts, and its tensor is back, no earlier: each job's
    footprint is at most its representative's at every time;
  * the copies of one transfer never overlap, and transfers the
    representatives' lane kept apart stay apart (``SwapChannel.reserve_many``
    books every copy and would raise on an overlap).
So the pool holds at most c times the representatives' planned peak
(c·f0 + c·f1 <= c·B / c), and the plan's peak is worked out again on the
jobs' own timeline, as any plan's is; it may be lower. Recomputations are
copied as they are (a copy's sequence is its representative's). A job's
copied absences are added at once (``JobFootprint.add_absences``: one
prefix sum instead of a slice of ``F`` each, 922 a job for 16 ResNet50 jobs).

Why two and not one: a representative's jobs all get one plan, and two
let the planner give half the jobs other swaps than the other half. On the
saved ResNet50 capture at 60% (one plan each, chains of 4, swaps first):

| jobs | joint plan | 1 representative (bound) | 2 representatives, copied |
| --- | --- | --- | --- |
| 6 | 1,493.0 MiB (met), 3.3-4.9 s | | 1,487.3 (met), 1.7 s |
| 8 | 2,037.8 MiB, 49.7 s | 2,084.7 | 2,052.1, 1.9 s |
| 16 | 4,494.2 MiB, 329 s | 4,510.4-4,525.8 | **4,413.7**, 3.4-4.2 s |

(the bound: c x one representative's planned peak; the times of the last
column are the whole plan, copies included, on a day when 4 jobs planned
in 0.32-0.50 s against 0.19 s on a normal one.) Four representatives of 16 jobs
planned worse (4,532.7 MiB) in 130 s: the count is not a dial to turn up.
Eight jobs plan 0.7% above the joint plan, at a 24th of its time.
The representatives plan one pass because the passes after it cost 3-6x
its time and, on 16 jobs, none planned lower (history/issue-56,
forty-second session); where the budget is met the joint planner, too,
stops after its first pass.

Minimise mode (no budget) plans the two representatives minimised, with
every pass the joint planner would run (each chain limit, recomputation
first): on the saved Transformer capture 8 jobs minimise to 550.6 MiB in
0.33 s as representatives against 575.7 MiB in 5.2 s jointly, and 16
jobs to 1,570.1 MiB in 4.6 s, where the joint plan had not finished after
600 s. 6 and 8 ResNet50 jobs minimise to 1,443.8 and 2,052.1 MiB in 5.3
and 3.0 s.

Note [Jobs of one graph planned on their fastest latencies]
Copies stay identical only until each job measures its own op latencies:
a search's trials, or the benchmark's copies after its drift (each op
scaled by its own factor in [0.9, 1.1] per job), then differ in their
tables alone, and a re-plan planned every job as itself, jointly: 74 s
for 16 ResNet50 jobs at 60% (59 s with the reverse delete of Note
[Transfers that lower no peak] as it is now), 8 s for 8. So jobs that share
everything but their tables, each a measured ``LatencyTable`` of one step
order, are planned as identical jobs on one table: op by op the fastest of
theirs. A plan places its events by op (a transfer starts delta t seconds
after its trigger op ends, less than one op's time), so what a job holds at
each of its steps is its plan's on any table; the table decides where the
planner puts triggers and releases. On the fastest, every job's ops take
at least what the plan assumed, so each swap-in is back and each swap-out
done by the op the plan gives them, as planned or earlier: no job waits on
a transfer for being slower than the table (the link's sharing aside). The
cost is time: a job's step is predicted up to ``latency_spread`` faster
than its own table says (``Plan.latency_spread``: how much slower than the
merged table the slowest job's ops sum; results.json's plan records carry
it). Jobs more than ``alike_latencies_within`` (0.2, the default
``run.replan_threshold``: a table that close to its plan's asks for no
re-plan) slower are planned jointly, each on its own table, as before. A
re-plan of such jobs plans them afresh this way, not warm-started from the
previous decisions; one that finds them apart puts every job back on its
own table. The caller's ``PlannerJob`` objects are never written (a
running job's latency monitor writes its table).
Measured on the saved capture ``bench_resnet50_b16`` (``planner_bench.py
--capture``, the re-plan after its drift): 16 jobs 59 s -> 5.2 s, 4,283.7
-> 4,471.4 MiB (the joint re-plan, warm-started from the copies, planned
3% lower, in 11x the time); spread 10%.

Not for: jobs that differ in anything the plan reads (each is planned
jointly as before), the paired-peaks model
(``peaking_jobs``: not a sum the copies can be bounded by), and the
policies of ``scheduler.baselines`` (their own loops).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import LatencyTable
from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.scheduler.state import JobState, SwapDecision
from tensile_tf.scheduler.swap_channel import IN, OUT
from tensile_tf.scheduler.unchained_runs import named_runs, run_bounds

if TYPE_CHECKING:
    from tensile_tf.scheduler.planner import Planner

_EPS = 1e-12


def identical_jobs(planner: "Planner", *, latencies: bool = True) -> bool:
    """Whether every job of ``planner`` is the same job under another name
    (the Note: one graph's ops and tensors, one latency table, one start offset,
    swapping rate and cold-start flag; ``latencies`` False: any tables)."""
    first = planner.specs[0]
    return all(pj.graph.ops is first.graph.ops and pj.graph.tensors is first.graph.tensors
               and (pj.latencies is first.latencies or not latencies) and pj.start_offset_s == first.start_offset_s
               and pj.max_swapping_rate == first.max_swapping_rate
               and pj.unplanned_step_ran_out == first.unplanned_step_ran_out for pj in planner.specs)


def plans_by_representatives(planner: "Planner", *, latencies: bool = True) -> bool:
    """Whether ``planner`` plans its jobs as representatives (the Note; ``latencies`` False: jobs
    that may differ in their tables, Note [Jobs of one graph planned on their fastest latencies])."""
    return (planner.representatives_from > 0 and len(planner.specs) >= planner.representatives_from
            and planner.peaking_jobs is None
            and planner.max_iterations > 0 and identical_jobs(planner, latencies=latencies))


def fastest_latencies(planner: "Planner") -> tuple[LatencyTable, float] | None:
    """Note [Jobs of one graph planned on their fastest latencies]: the
    jobs' measured tables merged op by op into the fastest, and how much
    slower than it the slowest job's step is (its ops summed); None where
    the jobs differ in more than their tables, a table is not measured, or
    a job is more than ``alike_latencies_within`` slower."""
    if not plans_by_representatives(planner, latencies=False):
        return None
    tables = list({id(pj.latencies): pj.latencies for pj in planner.specs}.values())
    if not all(isinstance(t, LatencyTable) and t.step_order == tables[0].step_order for t in tables):
        return None
    ops = planner.specs[0].graph.ops
    seconds = np.array([[t.latency_s(o) for o in ops] for t in tables])
    fastest = seconds.min(axis=0)
    low = float(fastest.sum())
    spread = float(seconds.sum(axis=1).max()) / low - 1.0 if low > 0 else math.inf
    if spread > planner.alike_latencies_within:
        return None
    table = LatencyTable(dict(zip((o.name for o in ops), fastest.tolist())), {},
                         min(t.default_s for t in tables), f"the fastest of {len(tables)} jobs' tables, op by op",
                         tables[0].step_order)
    return table, spread


def plan_alike_jobs(planner: "Planner") -> int:
    """Plans ``planner``'s jobs by representatives where they are identical
    (Note [Identical jobs planned by representatives]) or differ only in
    their tables, on the fastest of them (Note [Jobs of one graph planned on
    their fastest latencies]; ``planner.latency_spread`` says how much
    slower the slowest job's table is). Returns how many representatives
    planned: 0 where neither applies, nothing planned."""
    planner.latency_spread = None
    if plans_by_representatives(planner):
        return plan_by_representatives(planner)
    merged = fastest_latencies(planner)
    if merged is None:
        return 0
    own = list(planner.specs)     # the caller's jobs are not written: a running job's monitor writes its table
    planner.specs = [replace(pj, latencies=merged[0]) for pj in own]
    try:
        planned = plan_by_representatives(planner)
    finally:
        planner.specs = own
    planner.latency_spread = merged[1]
    return planned


def plan_by_representatives(planner: "Planner") -> int:
    """Plans ``planner``'s identical jobs as its ``representatives`` and copies
    their plans to every job (the Note), leaving ``planner`` in the state a
    joint plan leaves it in (its jobs' sequences, decisions, timeline and
    link). Returns how many representatives planned."""
    g = planner.representatives
    k = len(planner.specs)
    c = math.ceil(k / g)
    first = planner.specs[0]
    reps = [replace(first, graph=JobGraph(f"{first.graph.name}~representative{r}", first.graph.ops,
                                          first.graph.tensors)) for r in range(g)]
    combined = planner.link["combined_bytes_per_s"]
    minimise = planner.pool_bytes is None
    rep = type(planner)(reps, pool_bytes=None if minimise else planner.pool_bytes // c,
                        bandwidth_bytes_per_s=planner.bandwidth / c,
                        horizon_iterations=planner.horizon_iterations, stop_at_budget=planner.stop_at_budget,
                        enable_recompute=planner.enable_recompute,
                        max_chain=planner.chain_limits if minimise else planner.chain_limits[0],
                        max_iterations=planner.max_iterations, coincident_peaks=planner.coincident_peaks,
                        bottleneck_restarts=planner.bottleneck_restarts, step_order=planner.step_order,
                        drop_idle_swaps=planner.drop_idle_swaps, unchain=False, link_lanes=planner.link["lanes"],
                        combined_bytes_per_s=None if combined is None else combined / c)
    rep.representatives_from = 0
    rep.recompute_first_passes = minimise
    rep._structures = planner.__dict__.setdefault("_structures", {})   # one sequence structure for the graph
    # its passes only: a Plan of the representatives is not made (the copies' is; 0.07 s for two ResNet50)
    rep._plan_minimised() if minimise else rep._plan_each_chain_limit()   # noqa: SLF001
    planner._init_state()   # noqa: SLF001 - the planner's own state, as a pass starts it
    kept: OrderedDict = planner.__dict__.setdefault("_recompute_structures", OrderedDict())
    kept.update(rep.__dict__.get("_recompute_structures", {}))   # Note [Sequences built once per recomputation set]
    members = {r: [j for j in range(k) if j // c == r] for r in range(g)}
    for r, src in enumerate(rep.jobs):
        for j in members[r]:
            js = planner.jobs[j]
            js.recomputes, js.no_recompute = list(src.recomputes), set(src.no_recompute)
            if js.recomputes:
                js.tas = planner._sequence_with_recomputes(js)   # noqa: SLF001
            planner._restart_job(js)                              # noqa: SLF001
    planner._new_timeline()                                       # noqa: SLF001
    bookings: list[tuple[int, float, float, str]] = []
    absent: dict[int, list[tuple[SwapDecision, tuple[int, int, int]]]] = {}   # job -> its copies' absences, in order
    for dec in rep.order:
        for copy, j in enumerate(members[dec.j]):
            new = _copied_decision(planner, planner.jobs[j], dec, copy, c, bookings)
            absent.setdefault(j, []).append((new, (dec.i, new.release_step + 1, new.in_step)))
            planner.order.append(new)
    for j, copies in absent.items():
        for (new, _), ranges in zip(copies, planner.jobs[j].fp.add_absences([a for _, a in copies])):
            new.absent = ranges
    tags = iter(planner.channel.reserve_many(bookings))    # in the order the copies booked them
    for new in planner.order:
        if new.out_start is not None:
            new.out_tag = next(tags)
        new.in_tag = next(tags)
    planner.representative_planner, planner.representative_members = rep, members
    planner.stop_reason, planner.iterations = rep.stop_reason, rep.iterations
    planner.recompute_rounds, planner.dropped_swaps = rep.recompute_rounds, rep.dropped_swaps
    planner.bottlenecks = []
    return g


def _copied_decision(planner: "Planner", js: JobState, dec: SwapDecision, copy: int, c: int,
                     bookings: list) -> SwapDecision:
    """Copy ``copy`` of a representative's swap for job ``js``: its transfers
    ``copy``·d after the representative's, d their time at the link's rate,
    added to ``bookings`` for the planner's link (the Note)."""
    tas, channel = js.tas, planner.channel
    d = channel.duration(int(tas.size[dec.i]))
    if d * c > dec.in_dur * (1 + 1e-9) + _EPS:
        raise RuntimeError("identical jobs: a copy's transfers do not fit its representative's (planner bug)")
    shift = copy * d
    w = dec.version
    version_key = (dec.i, w % tas.n) if w is not None else (dec.i, -1)
    base = tas.end_u(w) if w is not None else tas.start_u(dec.p)
    out_start = None if dec.out_start is None else dec.out_start + shift
    if out_start is not None:
        bookings.append((js.j, out_start, d, OUT))
        out_end = out_start + d
    else:
        out_end = base + js.host_copies[version_key]     # the copy's own earlier swap-out of this version
    release_step = max(dec.p, tas.step_done_by_u(out_end))
    in_start = dec.in_start + shift
    in_step = tas.step_at_u(in_start)
    if not (release_step <= dec.release_step and dec.in_step <= in_step <= dec.q - 1):
        raise RuntimeError("identical jobs: a copy's swap is off the device longer than its representative's "
                           "(planner bug)")
    bookings.append((js.j, in_start, d, IN))
    new = SwapDecision(js.j, dec.i, dec.p, dec.q, dec.m, out_start, d, in_start, d, release_step, in_step,
                       version=w, names=dec.names)     # its absence: added by the caller, a job's at once
    if out_start is not None:
        js.swapped_out.add(dec.i)
        js.host_copies[version_key] = out_end - base
    js.decisions.append(new)
    return new


def copied_unchained_runs(planner: "Planner", plans: dict[str, JobPlan], ordered: dict[int, bool],
                          pool_limit: int) -> list[list[list[str]]] | None:
    """Note [Unchained runs] for jobs planned by representatives: each job
    gets its representative's runs, cut at the representative's own planned
    peak, and its bounds, which are at least the job's own (a copy holds no
    more than its representative at any step, the Note above); so each job's
    planned peak in ``plans`` becomes its representative's where it runs in
    plan order (``ordered``). None where the jobs' bounds, summed as the
    timeline sums footprints, would pass ``pool_limit``: every job then
    keeps its full chain. (Each job's runs cut at its own peak
    and checked as ``unchained_runs`` checks them cost 2 s a plan for 16
    ResNet50 jobs, and on 6 and 16 copies of the saved capture they too
    passed the pool's peak: no runs.)"""
    rep, members = planner.representative_planner, planner.representative_members
    k = len(planner.jobs)
    per_job: list[list[list[str]]] = [[] for _ in range(k)]
    peaks: list[int | None] = [None] * k
    held = [planner.jobs[j].fp.free_running for j in range(k)]
    for r, src in enumerate(rep.jobs):
        chained = [j for j in members[r] if ordered[j]]
        if not chained:
            continue
        runs, bound = run_bounds(src.tas, src.fp, int(src.fp.F.max(initial=0)))
        named = named_runs(src.tas, runs)
        for j in chained:
            per_job[j], held[j], peaks[j] = named, bound, int(bound.max(initial=0))
    if k > 1 and planner.timeline.pool_peak(held) > pool_limit:
        return None
    for js, peak in zip(planner.jobs, peaks):
        if peak is not None:
            plans[js.name].planned_peak_bytes = max(plans[js.name].planned_peak_bytes, peak)
    return per_job
