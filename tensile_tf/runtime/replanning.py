"""Re-planning while jobs run (seed 000 §IV-E: the plan follows the jobs).

Note [Re-planning on events]
A plan is made for the jobs that run when it is made. When a planned job
ends (finished, failed or stopped), the memory its plan held is free. If no
job waits for admission (a waiting job gets that memory first), the running
planned jobs are planned again *together* for the pool (the start's budget
rule, ``JobPlanning.start_budget``), from their captured graphs and
latencies: with more room the planner needs fewer swaps, so their steps get
faster. The planner and the rewrite (retracing each job's step) run on the
run loop's thread, never on a job's thread; each job switches at its next
step boundary (Note [Hot swap]). A re-plan that fails (planner or rewrite
error) leaves every job on the plan it runs and is recorded with the error.
Every re-plan is in results.json (``planner.replans``: time, reason, jobs,
predicted peaks and swaps before and after, measured step times before and
after the switch), in trace.json (an instant event) and on ``memory.png``
(a mark).

Note [Hot swap]
Before a step, the job thread takes a pending ``StepSwitch``: the variables
the old plan keeps on the host come back into the pool (``restore``), the
new plan's cross-iteration variables leave it (``evict``), and the new step
runs from then on. Between two steps no activation is alive, so the pool
holds the job's parameters and slots once and never two plans' peaks. A
plan never changes what a step computes, so training stays bit for bit
across a switch (tests/e2e/test_replanning.py). A newer switch replaces one
not yet taken; the older one is then recorded as never switched.

Note [Latency drift]
Now and then a job's training step runs under the profiler
(``capture.profiled_step``: a real step, one job at a time; a busy profiler
skips). Its op latencies correct the job's latency table by EWMA (§IV-E,
``LatencyTable.ewma_update``, alpha EWMA_ALPHA), and the change rate
|s' - s| / s of the corrected table against the table of the job's current
plan (``LatencyTable.change_rate``) above ``run.replan_threshold`` asks the
run loop for a re-plan of the running planned jobs ("latency drift of JOB"),
made from the corrected tables. The first check is at step
FIRST_CHECK_STEP; then every max(MIN_CHECK_INTERVAL, extra / (OVERHEAD_SHARE
x median step)) steps, where extra is what the last profiled step took
beyond the median, so profiling costs at most OVERHEAD_SHARE (2%) of the
job's time. Every check is in results.json (``planner.drift_checks``).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tensile_tf.execution import plan_captured
from tensile_tf.runtime.failures import summarize_error
from tensile_tf.runtime.records import DriftCheck, JobReplan, JobState, JobStatus, PlanRecord, ReplanRecord
from tensile_tf.scheduler import LatencyTable

EWMA_ALPHA = 0.3
FIRST_CHECK_STEP = 8
MIN_CHECK_INTERVAL = 20
OVERHEAD_SHARE = 0.02


@dataclass
class StepSwitch:
    """What a job thread switches to at its next step boundary (Note [Hot swap])."""

    step: Any                      # the new rewrite.PlannedStep, or None: the unplanned step
    record: PlanRecord
    needs: tuple[int, int]         # (P, T) admission uses under the new plan
    replan: JobReplan


def take_switch(state: JobState) -> None:
    """Called by the job's thread before a step (inside its stream scope)."""
    switch = state.pending_switch
    if switch is None:
        return
    state.pending_switch = None
    if state.planned_step is not None:
        state.planned_step.restore()       # the old plan's host-side variables back first
    if switch.step is not None:
        switch.step.evict()                # the new plan's first step starts as every later one
        state.step_fn = switch.step
    else:
        state.step_fn = state.captured.job.step_fn
    state.planned_step = switch.step
    state.plan = switch.record
    state.planned_needs = switch.needs
    switch.replan.switched_at_step = state.steps_done


def _median_step_s(state: JobState, lo: int, hi: int | None) -> float | None:
    times = [r.duration_s for r in state.records[lo:hi]]
    return statistics.median(times) if times else None


@dataclass
class ReplanRequest:
    """A job thread's request to the run loop (Note [Latency drift])."""

    job: str
    reason: str


class LatencyMonitor:
    """Note [Latency drift] for one planned job (used by its thread)."""

    def __init__(self, state: JobState, threshold: float, request: Callable[[str, str], None],
                 now: Callable[[], float]):
        self.state = state
        self.threshold = threshold
        self.request = request
        self.now = now
        self.baseline = state.captured.planner_job.latencies   # the table the current plan was made with
        self.next_step = FIRST_CHECK_STEP
        self.checks: list[DriftCheck] = []

    def due(self) -> bool:
        return self.state.steps_done >= self.next_step and isinstance(self.baseline, LatencyTable)

    def observe(self, measured: LatencyTable | None, step_s: float) -> None:
        """After a profiled step (``measured`` None: the profiler was busy)."""
        state = self.state
        median = state.median_step_s
        if measured is None:
            self.next_step = state.steps_done + 1
            return
        job = state.captured.planner_job
        current = job.latencies if isinstance(job.latencies, LatencyTable) else self.baseline
        corrected = current.ewma_update(measured.seconds, EWMA_ALPHA)
        job.latencies = corrected
        rate = self.baseline.change_rate(corrected, state.captured.graph)
        drifted = rate > self.threshold
        self.checks.append(DriftCheck(state.name, state.steps_done, self.now(), rate, step_s, median, drifted))
        if drifted:
            self.request(state.name, f"latency drift of {state.name} ({rate:+.0%} vs its plan)")
        extra = max(0.0, step_s - (median or step_s))
        interval = MIN_CHECK_INTERVAL if not median else max(MIN_CHECK_INTERVAL,
                                                               math.ceil(extra / (OVERHEAD_SHARE * median)))
        self.next_step = state.steps_done + interval

    def replanned(self) -> None:
        self.baseline = self.state.captured.planner_job.latencies


class Replanner:
    """Note [Re-planning on events], for the run loop."""

    def __init__(self, planning, now: Callable[[], float], held_outside_jobs: Callable[[], int]):
        self.planning = planning
        self.now = now
        self.held_outside_jobs = held_outside_jobs
        self.records: list[ReplanRecord] = []

    def on_departure(self, ended: JobState, running: Sequence[JobState], waiting: int) -> ReplanRecord | None:
        """Re-plans the running planned jobs after ``ended`` (a planned job,
        torn down already) left, unless a job waits."""
        if waiting or ended.plan is None:
            return None
        jobs = [s for s in running if s.status == JobStatus.running and s.captured is not None
                and not s.captured.cold and s.plan is not None]
        if not jobs:
            return None
        return self.replan(jobs, f"departure of {ended.name}")

    def replan(self, jobs: Sequence[JobState], reason: str) -> ReplanRecord:
        at = self.now()
        budget = self.planning.start_budget(jobs, self.held_outside_jobs())
        before = {s.name: (s.plan, len(s.records)) for s in jobs}
        record = ReplanRecord(at_s=at, reason=reason, budget_bytes=budget, planning_s=0.0, rewrite_s=0.0,
                              predicted_peak_sum_before_bytes=sum(p.predicted_planned_peak_bytes
                                                                   for p, _ in before.values()),
                              predicted_peak_sum_after_bytes=0, jobs=[])
        t0 = time.perf_counter()
        try:
            plan, steps = plan_captured([s.captured for s in jobs], pool_bytes=budget,
                                        bandwidth_bytes_per_s=self.planning.settings.swap_bandwidth)
            switches = {}
            for s in jobs:
                jp = plan.jobs[s.name]
                step = steps[s.name] if jp.changes_step else None
                new, needs = self.planning.plan_record(s, plan, steps[s.name], budget, "re-planned")
                old, done = before[s.name]
                job = JobReplan(s.name, old.predicted_planned_peak_bytes, new.predicted_planned_peak_bytes,
                                old.swap_outs, new.swap_outs, old.recomputes, new.recomputes,
                                _median_step_s(s, 1, done))
                switches[s.name] = StepSwitch(step, new, needs, job)
                record.jobs.append(job)
        except Exception as e:  # noqa: BLE001 - the jobs keep the plans they run
            record.error = summarize_error(e)
            record.jobs = []
            self.records.append(record)
            return record
        elapsed = time.perf_counter() - t0
        record.planning_s, record.rewrite_s = plan.planning_s, max(0.0, elapsed - plan.planning_s)
        record.predicted_peak_sum_after_bytes = sum(j.predicted_peak_after_bytes for j in record.jobs)
        self.planning.plans.append(plan)
        for s in jobs:
            if s.latency_monitor is not None:
                s.latency_monitor.replanned()
            switch = switches[s.name]
            if s.planned_needs is not None:   # admission holds the larger of the two until the switch
                switch_needs = tuple(max(a, b) for a, b in zip(s.planned_needs, switch.needs))
                s.planned_needs = switch_needs
            s.pending_switch = switch
        self.records.append(record)
        return record

    def finish(self, states: Sequence[JobState]) -> list[ReplanRecord]:
        """Fills each switched job's measured step time after the switch."""
        by_name = {s.name: s for s in states}
        for record in self.records:
            for job in record.jobs:
                state = by_name.get(job.name)
                if state is not None and job.switched_at_step is not None:
                    job.median_step_s_after = _median_step_s(state, job.switched_at_step, None)
        return self.records
