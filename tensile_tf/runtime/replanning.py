"""Re-planning while jobs run (seed 000 §IV-E: the plan follows the jobs).

Note [Re-planning on events]
A plan is made for the jobs that run when it is made. When a planned job
ends (finished, failed or stopped), the memory its plan held is free. If no
job waits for admission (a waiting job gets that memory first), the running
planned jobs are planned again *together* for the pool (the start's budget
rule, ``JobPlanning.start_budget``), from their captured graphs and
latencies: with more room the planner needs fewer swaps, so their steps get
faster. The planner and the rewrite run on the run loop's thread and each
new step is instantiated on a worker thread, never on a job's thread; each
job switches at a step boundary once its new step is instantiated (Note
[Hot swap], ``run.replan_switch``). A re-plan that fails (planner or rewrite
error) leaves every job on the plan it runs and is recorded with the error.
Every re-plan is in results.json (``planner.replans``: time, reason, jobs,
predicted peaks and swaps before and after, measured step times before and
after the switch), in trace.json (an instant event) and on ``memory.png``
(a mark).

Note [Hot swap]
Before a step, the job thread takes the ``StepSwitch`` the run loop offered
(``JobState.rt.switch``, a ``Handoff``: Note [Threads and hand-offs] in
threads.py), if there is one and its step is instantiated (or, with
``run.replan_switch: next_step``, waiting for that): the variables
the old plan keeps on the host come back into the pool (``restore``), the
new plan's cross-iteration variables leave it (``evict``), and the new step
runs from then on. Between two steps no activation is alive, so the pool
holds the job's parameters and slots once and never two plans' peaks. A
plan never changes what a step computes, so training stays bit for bit
across a switch (tests/e2e/test_replanning.py). A newer switch replaces one
not yet taken; the older one is then recorded as never switched. The switch
also carries the latency table its plan was made with, which becomes the
job's latency monitor's baseline as the job switches (Note [Latency drift]):
the monitor is its job thread's alone.

Note [Latency drift]
Now and then a job's training step runs under the profiler
(``capture.profiled_step``: a real step, one job at a time; a busy profiler
skips). Its op latencies correct the job's latency table by EWMA (§IV-E,
``LatencyTable.ewma_update``, alpha EWMA_ALPHA), and the change rate
|s' - s| / s of the corrected table against the table of the job's current
plan (``LatencyTable.change_rate``) above ``run.replan_threshold`` asks the
run loop for a re-plan of the running planned jobs ("latency drift of JOB"),
made from the corrected tables. Checks are at least MIN_CHECK_INTERVAL
steps apart, the first at step FIRST_CHECK_STEP or later, and each only
while the profiled steps' extra time so far (each one's wall time beyond
the job's median step), plus the next one's expected extra (the last one's;
one median step before the first), stays within OVERHEAD_SHARE (2%) of the
job's training time: profiling costs at most 2% of the job's time, however
slow the profiler is on its graph (seen: +0.01 s on a small CNN, +1.25 s on
a ResNet beside three other jobs). Every check is in results.json
(``planner.drift_checks``).
A cold-started job (Note [Cold-start planning] in planning.py) was planned
on predicted latencies (seed 000 §IV-A); its first check replaces the
prediction with the measured table, and the change rate against the
prediction decides its re-plan: predicted at cold start, corrected while
running.
A table is compared only with a table of a step that ran its ops the same
way (``LatencyTable.step_order``). A plan-order plan is made on the step
chained in plan order (Note [Latency time base] in
tensile_tf/scheduler/latency.py), but a job whose plan leaves its step as it
is runs its own step, free: the Transformer's chained step takes 1.3x the
free one, so its first check read that as drift and asked for a re-plan
nobody needed. Where the profiled step ran in another order than the job's
table, its measurement replaces the table (EWMA starts again from it) and
becomes the baseline, without a re-plan; the check is recorded with
``step_order_changed``. A later plan that chains the step is again first
measured that way.

Note [Re-plans users do not feel]
What a re-plan costs until every job runs its new plan, four ResNet50-size
jobs (39,524 ops, 64x64, batch 16) on a 2-core machine (issue 43,
``benchmarks/replan_time_bench.py``):
* The planner: 0.6 s. Its reported time once left out the plan's unchained
  runs (``planning_s`` now times the whole call), which took about 3 s
  asking every step for its resident set; they now read each tensor's
  residency intervals (Note [Runs from residency intervals] in
  tensile_tf/scheduler/unchained_runs.py). A full garbage collection over
  everything the run holds fell inside it now and then (2.0-2.8 s, the
  outliers once reported as unexplained): the planner and the rewrites
  make no garbage cycles worth collecting, so they run with collections
  paused (``scheduler.planner.collections_paused``).
* The rewrite: graph editing and making the function, 0.7-1.0 s per job.
  Making the function used to trace a ``tf.function`` that imported the
  edited GraphDef, a Python op per node (1.8 s a job, more with
  collections); it is now registered from a bare C graph (Note [A planned
  step without a trace] in tensile_tf/tf/rewrite/planned_step.py), where
  the step is made (the run loop), not at the job's first planned step on
  its own thread.
* Instantiation: a new function's first call instantiates it (TensorFlow's
  graph optimisation and executor, 3-4.5 s per ResNet50 step here), and
  that was the job's first step under the new plan (4-7 s against 1 s). A
  worker thread now instantiates each step as soon as it is rewritten,
  without running it, while the jobs train on their old plans and the next
  job's step is rewritten (Note [Instantiated off the job's thread] in
  tensile_tf/tf/rewrite/planned_step.py); the job switches once its step is
  ready (``run.replan_switch``). First steps under a new plan: 1.2-1.6 s.
* Reuse: a job whose new plan rewrites its step exactly as its current plan
  did (``JobPlan.rewrites_like``: every event and the order, predictions left
  out) keeps the step it runs, nothing rewritten; a job whose new plan
  leaves its step as it is gets its own step back without a rewrite.
Measured (10 re-plans, half to new plans with latencies drifted up to 10%,
issue 43's history): until every job can switch, plans already built
median 0.80 s; new plans median 9.6 s counting the instantiation (planner
0.8 s, rewrites 2.8-3.6 s, instantiation 3.0-5.1 s per job on two cores),
against 3.1 s plus a 4-6 s first step before it moved off the jobs'
threads.
* Plan tables (``run.plan_steps: table``): each job's step is rewritten
  once, with swap slots that read their plan from a table (Note [Plans read
  at run time] in tf_plugin/swap/plan_table.h); a new plan that only swaps
  is a table write the job's next step reads: nothing rewritten, no new
  function, nothing to instantiate. Four ResNet50 jobs, 10 re-plans (new
  plans and reused): every job can switch after 0.62-0.80 s (median 0.73
  s), the planner's time. A job's first plan that swaps builds its table
  step once (four jobs: 19.6 s, rewrites 5.0 s), and the table step costs
  about 5% of each step against the same plan rewritten (its slots' nodes).
* Garbage collection: what a re-plan that builds steps allocates makes a
  full collection due (1.7 s over everything the run holds), which then
  fell inside the next re-plan, however fast. Such a re-plan now collects
  at its end (``gc.collect()``, after the switches are offered), where it
  is slow anyway; a re-plan that writes tables allocates little.

Note [Joint re-plan on arrival]
A job that arrives (``arrive_at_s``, or a search driver's next trial) and
does not fit beside the running jobs would wait for one to end. With the
controller on, the host instead builds it, captures its graph without
running a step (the cold capture: static sizes, predicted latencies) and
plans it *together* with the running planned jobs for the pool
(``Replanner.on_arrival``), tightening their plans. Only a joint plan that
meets its budget is applied: the running jobs get their switches (Note [Hot
swap]), and the newcomer's planned step becomes its probe, run only once
every running job has switched, so the pool never holds an old plan's peak
beside the newcomer. Admission holds each running job at the larger of its
old and new needs until it switches. A joint plan that misses its budget,
or fails, changes nothing (recorded with the reason); the newcomer is torn
down and waits as before. Each waiting job is tried once per event (an
arrival, a departure), never in a loop. Until the newcomer starts, no other
job is admitted or planned on arrival: the joint plan holds its room (seen:
a second arrival planned with the running jobs but without the first
newcomer, both admitted, and a running job ran out of memory).

Building beside a running step in a full pool can take the memory that
step's plan counted on (seen: the running job's Adam update ran out of
memory during the newcomer's build in a 110 MiB pool). So, when memory
requires it, the running jobs are parked at their next step boundary
(``StepGate`` in threads.py) while the newcomer is built, captured and
planned: between steps a job holds only its persistent bytes, so the build
has the room it needs and no running step can be starved. Memory requires
it when the newcomer's predicted persistent bytes (admission's prediction:
a measured job like it, or the job's own estimate) do not fit what the pool
has free less the running jobs' temporaries, or when nothing predicts them
(``Arrivals.build_needs_parking``); otherwise the running jobs train on
while it builds (a Keras model's build: about 8 s for MobileNetV2). The
pause, and why there was one, are recorded (``ReplanRecord.paused_s``,
``parked``). With the node-group pipeline on, no job is parked (a parked
job would hold its partner at a CounterBarrier) and arrivals wait as before.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from tensile_tf.config.schema import PlanPeaks
from tensile_tf.runtime.failures import summarize_error
from tensile_tf.runtime.records import DriftCheck, JobReplan, JobState, JobStatus, PlanRecord, ReplanRecord
from tensile_tf.runtime.replan_timing import (background_scope_for, burst_reasons, ends_before_switch,
                                             expected_replan_s, running_plan)
from tensile_tf.scheduler import LatencyTable

EWMA_ALPHA = 0.3
FIRST_CHECK_STEP = 8
MIN_CHECK_INTERVAL = 20
OVERHEAD_SHARE = 0.02


@dataclass
class StepSwitch:
    """What a job thread switches to at a step boundary (Note [Hot swap])."""

    step: Any                      # the new rewrite.PlannedStep, or None: the unplanned step
    record: PlanRecord
    needs: tuple[int, int]         # (P, T) admission uses under the new plan
    replan: JobReplan
    baseline: Any = None           # the latency table the new plan was made with (the monitor's, Note [Latency drift])
    when_ready: bool = True        # taken once its step is instantiated, else at the next step boundary (waiting)


def take_switch(state: JobState) -> StepSwitch | None:
    """Called by the job's thread before a step (inside its stream scope):
    takes the switch the run loop offered, if any, and runs the new step from
    now on (Note [Threads and hand-offs], H3). Returns the switch taken."""
    switch = state.rt.switch.take(ready=lambda sw: not sw.when_ready or sw.step is None or sw.step.ready)
    if switch is None:
        return None   # none, or its step is still being instantiated: this step runs the old plan
    try:
        if switch.step is not None:
            switch.step.wait_ready()   # run.replan_switch: next_step waits here for what is left
        if state.rt.planned_step is not None:
            state.rt.planned_step.restore()       # the old plan's host-side variables back first
        if switch.step is not None:
            switch.step.evict()                # the new plan's first step starts as every later one
            state.rt.step_fn = switch.step
        else:
            state.rt.step_fn = state.rt.captured.job.step_fn
        state.rt.planned_step = switch.step
        state.run_plan(switch.record)   # Note [Plan segments]
        state.planned_needs = switch.needs
        if state.rt.latency_monitor is not None and switch.baseline is not None:
            state.rt.latency_monitor.replanned(switch.baseline)
        switch.replan.switched_at_step = state.steps_done
        if switch.step is not None and switch.step.instantiate_s is not None:
            switch.replan.instantiate_s = switch.step.instantiate_s
            switch.replan.instantiate_error = switch.step.instantiate_error
    finally:
        state.rt.switch.settle()   # after planned_needs: admission reads peek(), then planned_needs
    return switch


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
        self.baseline = state.rt.captured.planner_job.latencies   # the table the current plan was made with
        self.next_step = FIRST_CHECK_STEP
        self.checks: list[DriftCheck] = state.drift_checks   # the record's: it outlives the monitor
        self.spent_s = 0.0   # what the profiled steps took beyond the median, summed
        # The next check's expected cost: unknown before the first, which a
        # cold-started job takes at FIRST_CHECK_STEP whatever it costs (its
        # plan rests on predictions); a measured job's first check waits for
        # the budget one median step of extra time needs.
        self.expected_extra_s: float | None = 0.0 if state.rt.captured.cold else None

    def due(self) -> bool:
        state = self.state
        if state.steps_done < self.next_step:
            return False
        trained = sum(r.duration_s for r in state.training_records)
        median = state.median_step_s or 0.0
        expected = self.expected_extra_s if self.expected_extra_s is not None else median
        deficit = (self.spent_s + expected) / OVERHEAD_SHARE - (trained + expected)
        if deficit <= 0:
            return True
        if median > 0:   # not before the budget can allow it: no sums and medians every step meanwhile
            self.next_step = state.steps_done + max(1, math.ceil(deficit / median))
        return False

    def observe(self, measured: LatencyTable | None, step_s: float) -> None:
        """After a profiled step (``measured`` None: the profiler was busy)."""
        state = self.state
        median = state.median_step_s
        if measured is None:
            self.next_step = state.steps_done + 1
            return
        job = state.rt.captured.planner_job
        graph = state.rt.captured.graph
        measured = replace(measured, step_order=self.step_order())
        # A cold-started job's latencies are a model's predictions, not a
        # table: its first measurement replaces them, as it replaces a table
        # of the step run in another order (Note [Latency drift]).
        reordered = isinstance(job.latencies, LatencyTable) and job.latencies.step_order != measured.step_order
        corrected = (job.latencies.ewma_update(measured.seconds, EWMA_ALPHA)
                     if isinstance(job.latencies, LatencyTable) and not reordered else measured)
        job.latencies = corrected
        before = sum(self.baseline.latency_s(op) for op in graph.ops)
        after = corrected.total_s(graph)
        rate = abs(after - before) / before if before > 0 else math.inf
        drifted = rate > self.threshold and not reordered
        self.checks.append(DriftCheck(state.name, state.steps_done, self.now(), rate, step_s, median, drifted,
                                      step_order_changed=reordered))
        if reordered:
            self.baseline = corrected
        if drifted:
            self.request(state.name, f"latency drift of {state.name} ({rate:+.0%} vs its plan)")
        extra = max(0.0, step_s - (median or step_s))
        self.spent_s += extra
        self.expected_extra_s = extra
        self.next_step = state.steps_done + MIN_CHECK_INTERVAL

    def step_order(self) -> str:
        """How the job's step runs its ops now: "plan" where its plan
        replaced the step with one chained in plan order, else "free"."""
        plan = self.state.plan
        return "plan" if plan is not None and plan.changes_step and plan.step_order == "plan" else "free"

    def replanned(self, baseline: LatencyTable) -> None:
        """The job switched to a plan made with ``baseline`` (its thread, at the switch)."""
        self.baseline = baseline


class JointPlanMissesBudget(RuntimeError):
    """Note [Joint re-plan on arrival]: the newcomer does not fit even planned."""


class Replanner:
    """Note [Re-planning on events], for the run loop."""

    def __init__(self, planning, now: Callable[[], float], held_outside_jobs: Callable[[], int],
                 switch_when_ready: bool = True):
        self.planning = planning
        self.switch_when_ready = switch_when_ready   # run.replan_switch (Note [Instantiated off the job's thread])
        self.now = now
        self.held_outside_jobs = held_outside_jobs
        self.records: list[ReplanRecord] = []

    @staticmethod
    def replannable(running: Sequence[JobState]) -> list[JobState]:
        """The running jobs a re-plan may change: planned, with a captured graph, or captured from
        their training steps (Note [Captures from training steps]: running their own step)."""
        return [s for s in running if s.status == JobStatus.running and s.rt.captured is not None
                and (s.plan is not None or s.captured_at_step is not None)]

    def on_events(self, departed: Sequence[JobState], requests: Sequence[ReplanRequest],
                  running: Sequence[JobState], waiting: int, others_need: int) -> ReplanRecord | None:
        """Note [One re-plan per burst] in replan_timing.py: one re-plan of the running planned jobs
        for every departure (jobs torn down already) and drift request of a burst, unless a job
        waits. ``others_need``: bytes the running jobs outside the re-plan hold (unplanned ones)."""
        if waiting:
            return None
        jobs = self.replannable(running)
        reasons = burst_reasons(departed, requests, jobs,
                                peaks_follow_timing=self.planning.settings.plan_peaks == PlanPeaks.timeline)
        if not reasons:
            return None
        record = self.replan(jobs, "; ".join(reasons), others_need)
        record.events = reasons
        return record

    def on_arrival(self, newcomer: JobState, running: Sequence[JobState], others_need: int) -> ReplanRecord | None:
        """Note [Joint re-plan on arrival]: plans ``newcomer`` (built and
        captured) together with the running planned jobs. None if none runs."""
        jobs = self.replannable(running)
        if not jobs:
            return None
        return self.replan(jobs, f"arrival of {newcomer.name}", others_need, newcomer=newcomer)

    def replan(self, jobs: Sequence[JobState], reason: str, others_need: int = 0, *,
               newcomer: JobState | None = None) -> ReplanRecord:
        """Plans ``jobs`` (and ``newcomer``) together for the pool less
        ``others_need``; queues each running job's switch. A newcomer's plan
        is adopted at once (it has not started) and needs the budget met."""
        at = self.now()
        everyone = [*jobs, newcomer] if newcomer is not None else list(jobs)
        skipped = None if newcomer is not None else ends_before_switch(
            jobs, expected_replan_s(self.records, self.planning.plans))
        if skipped is not None:     # Note [Re-plans for jobs about to end] in runtime/replan_timing.py
            record = ReplanRecord(at_s=at, reason=reason, budget_bytes=0, planning_s=0.0, rewrite_s=0.0,
                                  predicted_peak_sum_before_bytes=sum(running_plan(s).predicted_planned_peak_bytes
                                                                       for s in jobs),
                                  predicted_peak_sum_after_bytes=0, jobs=[], skipped=skipped)
            self.records.append(record)
            return record
        budget = max(0, self.planning.start_budget(everyone, self.held_outside_jobs() + others_need))
        before = {s.name: (running_plan(s), len(s.records)) for s in jobs}
        record = ReplanRecord(at_s=at, reason=reason, budget_bytes=budget, planning_s=0.0, rewrite_s=0.0,
                              predicted_peak_sum_before_bytes=sum(p.predicted_planned_peak_bytes
                                                                   for p, _ in before.values()),
                              predicted_peak_sum_after_bytes=0, jobs=[],
                              newcomer=newcomer.name if newcomer is not None else None)
        t0 = time.perf_counter()
        try:
            states = {s.name: s for s in everyone}   # the scope: the job's stream, until its teardown or end
            built: list[str] = []

            def instantiate(name: str, step) -> None:   # Note [Instantiated off the job's thread]
                if getattr(step.fn, "needs_instantiation", False):   # not a table step's (background work only)
                    built.append(name)
                step.instantiate_in_background(background_scope_for(states[name], step))

            plan, steps = self.planning.plan_captured([s.rt.captured for s in everyone], budget,
                                                      current={s.name: s.rt.planned_step for s in jobs
                                                               if s.rt.planned_step is not None},
                                                      on_step_made=instantiate)
            if newcomer is not None and not plan.budget_met:
                raise JointPlanMissesBudget(
                    f"the joint plan predicts {plan.pool_planned_peak_bytes / 2**20:.1f} MiB for a budget of "
                    f"{budget / 2**20:.1f} MiB: the running jobs keep their plans and {newcomer.name} waits")
            switches = {}
            number = len(self.planning.plans)   # Note [Plan segments]: its index once appended below
            for s in jobs:
                jp = plan.jobs[s.name]
                step = steps[s.name] if jp.changes_step else None
                new, needs = self.planning.plan_record(s, plan, steps[s.name], budget, "re-planned")
                new.plan_number, new.reason = number, reason
                old, done = before[s.name]
                job = JobReplan(s.name, old.predicted_planned_peak_bytes, new.predicted_planned_peak_bytes,
                                old.swap_outs, new.swap_outs, old.recomputes, new.recomputes,
                                _median_step_s(s, 1, done))
                switches[s.name] = StepSwitch(step, new, needs, job, when_ready=self.switch_when_ready)
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
        record.plan = number
        if newcomer is not None:
            self.planning.adopt(newcomer, plan, steps[newcomer.name], budget, "planned", number, reason)
            newcomer.cold_planned = newcomer.rt.captured.cold
            newcomer.probe_plan_peak_bytes = plan.jobs[newcomer.name].planned_peak_bytes
            if not newcomer.steps_done:   # its probe (the planned step) measures them; one probed already (Note
                newcomer.planned_needs = None   # [A capture kept for the joint plan]) is admitted on the plan's
            record.predicted_peak_sum_after_bytes += plan.jobs[newcomer.name].planned_peak_bytes
        for s in jobs:
            # The job thread takes it at its next step boundary once its step is
            # instantiated (run.replan_switch); until it has, admission holds the
            # larger of its needs and these (AdmissionControl.predict).
            switch = switches[s.name]
            switch.baseline = s.rt.captured.planner_job.latencies   # what the plan was made with
            s.rt.switch.offer(switch)   # one not taken yet is replaced: never switched (Note [Hot swap])
        self.records.append(record)
        if built:   # Note [Re-plans users do not feel]: the collection the new steps make due, here
            gc.collect()
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
