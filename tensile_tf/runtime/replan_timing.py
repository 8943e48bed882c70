"""When a re-plan would come too late for the jobs it is for.

Note [Re-plans for jobs about to end]
A re-plan helps a job only from the step it switches at. On three models
planned together (6 steps each, issue 56) both re-plans at departures
finished after the jobs they were for had ended: their cost paid for
nothing. So a re-plan for running jobs (a departure, a latency drift; never
an arrival's, which the newcomer needs) is not started when every job it is
for has less left to run (its steps to go times its median step) than the
re-plan is expected to take: the median of the earlier re-plans' time from
start until their jobs' steps were built (planner, rewrite and the slowest
instantiation), or before any, the last plan's planning time. It is
recorded (``planner.replans``, ``skipped`` says why) with no plan and no
jobs. Where no job has a measured step yet nothing is skipped.

Note [One re-plan per burst]
A search ends trials in bursts: several jobs leave within a few steps, and
a drifting job asks for a re-plan while another ends. One re-plan per event
planned the same running jobs again and again, each plan replacing one its
jobs had not switched to yet. The run loop now takes every message waiting
in its inbox at once (``RunLoopInbox.drain``: the events that came while
it tore a job down or planned), tears every ended job down first, and then
makes one re-plan for the whole burst (``Replanner.on_events``): for the
jobs still running, with every event that asks for one (``burst_reasons``)
in its reason and in ``planner.replans[].events``. A departure asks for one
when the job that left was planned and a running job's plan swaps or
recomputes (more room relaxes it); a drift, when the job that drifted still
runs planned and a plan swaps or recomputes (latencies time the swaps and
recomputations; a plan of neither peaks the same however long its ops
take, unless the combined peak is read off the timelines, ``plan_peaks:
timeline``). On the compute-bound CNN search of issue 58, jobs planned
together on arrival with no swaps drifted +438-595% from their cold
capture's predicted latencies, and each asked for a re-plan that could
change nothing (3 of 7 re-plans). No job may wait for admission (it gets
the freed memory first). A search refills each departure: the jobs its job
source gives are taken in the same burst, before the re-plan, and where one
was planned together with the running jobs on arrival (Note [Joint re-plan
on arrival] in replanning.py), that plan is the re-plan for the pool as it
now is, and the departures ask for nothing more. Before, each departure
relaxed the running jobs' plans and the next trial's arrival tightened them
again a moment later: on the memory-bound io-mem search, 8 departure
re-plans among 24 (now 1 among 13).

Note [Background work for a job about to end]
The background worker's work for a job (Note [Table first, rewritten when
ready] in tensile_tf/tf/rewrite/table_then_rewrite.py: the plan-table step
built after the job's first plan, a later plan rewritten while the job runs
it on its table) pays only from the step after it is done. A job's steps run
beside it on the same cores: short jobs (a search's trials, the test suite's
runs of 3-20 steps) paid for table steps they ended before using. So the
work is not started where the job has less left to run than the work is
expected to take: its step's own instantiation time, measured just before on
the instantiation worker (``PlannedStep.instantiate_s``; a table step's
build or a plan's rewrite instantiates a step as large, and rewrites it
first). Where the job has no measured step yet, the work runs. A table step
not built says why in the next plan's record (``rewrite.plan_table``:
"rewritten: its plan-table step was not built: the job ends in ..."); a
rewrite not done leaves the job on its table step, and its record says so.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, ContextManager, Sequence

from tensile_tf.scheduler.link_bound import unplanned_peak_and_period


def expected_replan_s(records: Sequence, plans: Sequence) -> float | None:
    """The seconds a re-plan is expected to take until its jobs' steps are built: the median of
    the earlier re-plans (``ReplanRecord``s that made a plan), else the last plan's planning time;
    None before any plan."""
    done = sorted(r.planning_s + r.rewrite_s + max((j.instantiate_s or 0.0 for j in r.jobs), default=0.0)
                  for r in records if r.plan is not None)
    if done:
        return done[len(done) // 2]
    return plans[-1].planning_s if plans else None


def ends_before_switch(jobs: Sequence, expected_s: float | None) -> str | None:
    """Why a re-plan for ``jobs`` (runtime ``JobState``s) would come too late, every one of
    them ending within ``expected_s``; None where one would run on after it, or nothing is known."""
    if expected_s is None or not jobs:
        return None
    left = {}
    for s in jobs:
        left[s.name] = time_left_s(s)
        if left[s.name] is None or left[s.name] > expected_s:
            return None
    ends = ", ".join(f"{name} in {t:.2f} s" for name, t in left.items())
    return f"every job it was for ends before it could switch (expected {expected_s:.2f} s; {ends})"


def time_left_s(s) -> float | None:
    """Seconds runtime ``JobState`` ``s`` has left to run: its steps to go times its median step (None
    before a measured step), from the job thread's snapshot (Note [Record apart from runtime])."""
    done = s.progress
    median = done.median_step_s
    return None if median is None else max(0, s.job.steps - done.steps_done) * median


def background_scope_for(s, step) -> Callable[[], ContextManager]:
    """The scope the background worker runs ``step``'s instantiation and work for job ``s`` in (its
    stream): the work not started where ``s`` ends first (Note [Background work for a job about to
    end]; the instantiation itself always runs, its time unknown until it ends)."""
    return lambda: s.rt.background_scope(step.instantiate_s, lambda: time_left_s(s))


def burst_reasons(departed: Sequence, requests: Sequence, jobs: Sequence, *, peaks_follow_timing: bool = False) \
        -> list[str]:
    """Note [One re-plan per burst]: the events of a burst that ask for a re-plan of ``jobs`` (the
    running planned ``JobState``s): ``departed`` jobs (torn down) and drift ``requests``.
    ``peaks_follow_timing``: the plans' combined peak is read off the jobs' timelines (``plan_peaks:
    timeline``), so a drift may move it even where no plan swaps."""
    relaxable = any(s.plan is not None and (s.plan.swap_outs or s.plan.recomputes) for s in jobs)
    running = {s.name for s in jobs}
    reasons = [f"departure of {d.name}" for d in departed if d.plan is not None and relaxable]
    reasons += [r.reason for r in requests if r.job in running and (relaxable or peaks_follow_timing)]
    return list(dict.fromkeys(reasons))    # one drift request per job and reason


def running_plan(state):
    """What the job runs now: its plan, or for a job captured from its training steps and never
    planned, its own step as a plan would predict it (no swaps; Note [Captures from training steps])."""
    if state.plan is not None:
        return state.plan
    peak, _ = unplanned_peak_and_period(state.rt.captured.planner_job)
    return SimpleNamespace(predicted_planned_peak_bytes=peak, swap_outs=0, recomputes=0)
