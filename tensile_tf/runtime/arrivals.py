"""The waiting line of a run: jobs that arrive, wait and are admitted (the
run loop's collaborator; everything here runs on the main thread).

A job waits in ``waiting`` from when it arrives (the run's start, its
``arrive_at_s``, or a search driver's ``job_source``) until it starts or
ends; jobs with ``arrive_at_s`` wait in ``later``, soonest first, until
then. ``admit_waiting`` starts, in submit order, every waiting job that fits
beside the running ones (probing first the ones never measured); one that
does not fit while others run is planned together with them when re-planning
is on (Note [Joint re-plan on arrival] in replanning.py), else it waits.

Note [A capture kept for the joint plan]
A newcomer predicted to fit is probed and, with the planner on, captured
(profiled steps on the run loop); measured too big beside the running jobs,
it is planned together with them at once (``plan_arrival``). It was torn
down between the two, its capture with it, then built again and captured
cold (its graph alone, guessed latencies) for the joint plan: on the
memory-bound io-mem search of issue 58, three trials of twelve paid a 1.8 s
capture and a second build each, on the run loop every arrival waits for,
and were planned from the guess. Such a job now stays built from its probe
to the joint plan, which plans it from the capture its probe made, and
starts on the plan's predicted needs without a second probe (its probe step
was its first training step: a second would train on its first batch
again; 2-4 of 12 trials' scores moved when it did); if no joint plan is
made, it is torn down then (``_drop_build``), as before.
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING

from tensile_tf.runtime.probing import ProbeOutcome
from tensile_tf.runtime.records import JobState, JobStatus
from tensile_tf.runtime.replanning import Replanner
from tensile_tf.runtime.training_capture import CaptureReady
from tensile_tf.tf.pool import pool_stats
from tensile_tf.units import human_bytes

if TYPE_CHECKING:
    from tensile_tf.runtime.run_loop import JobHost


def arrive_at(state: JobState) -> float:
    """When the job arrives, in run seconds (0: at the start)."""
    spec = state.job.spec
    return spec.arrive_at_s if spec is not None else 0.0


class Arrivals:
    """The waiting jobs of one run, for ``host`` (see the module docstring)."""

    def __init__(self, host: "JobHost"):
        self.host = host
        self.waiting: deque[JobState] = deque()
        self.later: deque[JobState] = deque()   # arrive_at_s still to come, soonest first
        self.joint_tried: set[str] = set()      # waiting jobs tried for a joint plan since the last event

    def reset(self, states: list[JobState]) -> None:
        """A run starts with ``states``: those with a later ``arrive_at_s`` wait for it."""
        self.waiting.clear()
        self.later = deque(sorted((s for s in states if s.status == JobStatus.pending and arrive_at(s) > 0),
                                  key=arrive_at))
        self.joint_tried.clear()

    def next_in(self, now: float) -> float | None:
        """Seconds until the next later arrival (None: none comes)."""
        return max(0.0, arrive_at(self.later[0]) - now) if self.later else None

    def new_event(self) -> None:
        """A departure: each waiting job may be tried for a joint plan again."""
        self.joint_tried.clear()

    def arrive(self) -> None:
        """Jobs whose ``arrive_at_s`` came join the waiting jobs, then admission runs."""
        arrived = False
        while self.later and arrive_at(self.later[0]) <= self.host.clock.now():
            state = self.later.popleft()
            state.arrived_at_s = arrive_at(state)   # its waiting counts from then, however busy the loop was
            state.times.wait_begins("arrival_wait")
            self.waiting.append(state)
            arrived = True
        if arrived:
            self.admit_waiting()

    def admit_waiting(self) -> None:
        """Starts waiting jobs that fit now, in submit order (later small jobs may pass)."""
        host, waiting = self.host, self.waiting
        awaiting = [s for s in waiting if s.awaiting_switches]
        if awaiting:
            # Note [Joint re-plan on arrival]: the joint plan holds room for the
            # newcomer; nothing else is admitted or planned until it starts.
            for state in awaiting:
                self.start_jointly_planned(state, host.running())
            return
        for state in list(waiting):
            active = host.running()
            if not host.admission.has_room(len(active)):
                for queued in waiting:
                    host.note_wait(queued, f"{len(active)} jobs run, the concurrency limit")
                return
            if not state.measured:
                # Probing runs a step. With nothing running, nothing can be
                # disturbed; otherwise only a job whose predicted needs fit.
                predicted = host.admission.predict(state) is not None
                if active and not (predicted and host.admission.fits(state, active, host.held_outside_jobs())):
                    self.plan_arrival(state, active)
                    continue
                waiting.remove(state)
                outcome = host.lifecycle.probe(state, active)
                if outcome == ProbeOutcome.run:
                    self.plan_alone(state, active)
                    host.start_job(state)
                elif outcome == ProbeOutcome.queued:
                    waiting.append(state)
                    if active and state.measured:   # measured, it does not fit: planned together now, not
                        self.plan_arrival(state, active)   # at the next event (Note [Joint re-plan on arrival])
                host.report(state)
                host.notify_end(state)
                continue
            if not host.admission.fits(state, active, host.held_outside_jobs()):
                if active:
                    self.plan_arrival(state, active)
                else:
                    host.note_wait(state, "its measured needs do not fit the pool left to jobs")
                continue
            waiting.remove(state)
            if state.rt.train is None and not host.lifecycle.build(state):
                if state.status == JobStatus.queued:
                    waiting.append(state)
                host.report(state)
                host.notify_end(state)
                continue
            if host.planning is not None and state.rt.planned_step is None and state.rt.captured is None:
                host.planning.capture(state, host.admission.holds_the_limit_unplanned(   # Note [Captures a plan
                    state, active, host.held_outside_jobs()), in_training=True)          # needs] (planning.py)
            self.plan_alone(state, active)
            host.start_job(state)

    def adopt_capture(self, ready: CaptureReady) -> None:
        """Note [Captures from training steps]: a running job's capture from its training steps
        (Note [Threads and hand-offs], H14) makes it one a joint plan may change: the waiting
        jobs are tried again."""
        state = next(s for s in self.host.states if s.name == ready.job)
        if ready.captured is None:
            state.plan_error = ready.error
            return
        state.rt.captured, state.captured_at_step = ready.captured, ready.at_step
        self.host.planning.unplanned_peaks[state.name] = ready.captured.unplanned_peaks
        self.new_event()
        if not self.host.stopping:
            self.admit_waiting()

    def outside_replan_need(self, running: list[JobState]) -> int:
        """Bytes the running jobs a re-plan cannot change (unplanned) need."""
        inside = {s.name for s in Replanner.replannable(running)}
        return sum(sum(self.host.admission.predict(s) or (0, 0)) for s in running if s.name not in inside)

    def plan_arrival(self, state: JobState, active: list[JobState]) -> None:
        """Note [Joint re-plan on arrival] in replanning.py: ``state`` does not
        fit beside ``active``; plan it together with them, once per event."""
        host = self.host
        if state.name in self.joint_tried:
            return self._drop_build(state)
        later = "; waits for a running job to end"
        if host.replanner is None or host.pipeline is not None:
            host.note_wait(state, "does not fit beside the running jobs and re-planning is off" + later)
            return self._drop_build(state)
        if not Replanner.replannable(active):
            host.note_wait(state, "does not fit beside the running jobs, and none of them runs a plan "
                           "a joint re-plan could tighten" + later)
            return self._drop_build(state)
        busy = host.admission.plans_held_for_cores(len(active))
        state.held_for_cores = busy is not None   # Note [Plans only for idle cores] in planning.py
        if busy is not None:
            host.note_wait(state, f"does not fit beside the running jobs unplanned, and no plan fits it in: {busy}"
                           "; asked again while it waits")
            return self._drop_build(state)
        self.joint_tried.add(state.name)
        parked = self.build_needs_parking(state, active)
        gate = host.gate.closed([s.name for s in active], host.stop) if parked else contextlib.nullcontext()
        with gate:
            paused_from = time.perf_counter()
            if host.stopping or (state.rt.train is None and not host.lifecycle.build(state)):
                if state.status not in (JobStatus.queued, JobStatus.pending):   # failed or rejected building
                    self.waiting.remove(state)
                elif not host.stopping:
                    host.note_wait(state, "building it for a joint plan ran out of the pool memory "
                                   "the running jobs leave" + later)
                host.report(state)
                host.notify_end(state)
                return
            record = None
            # its probe's capture (Note [A capture kept for the joint plan]), the capture of the step it took
            # over, else its graph alone (Note [Captures kept with the step])
            if state.rt.captured is not None or host.planning.capture_taken(state) or host.planning.capture_cold(state):
                record = host.replanner.on_arrival(state, active, self.outside_replan_need(active))
            else:
                host.note_wait(state, f"could not be captured for a joint plan ({state.plan_error})" + later)
        if record is not None:
            record.paused_s = time.perf_counter() - paused_from if parked else 0.0
            record.parked = parked
            host.note_replan(record)
        if record is not None and record.error is None:
            state.awaiting_switches = True
            self.start_jointly_planned(state, active)
            return
        if record is not None:
            host.note_wait(state, f"the joint plan with the running jobs failed ({record.error})" + later)
        self._drop_build(state)

    def _drop_build(self, state: JobState) -> None:
        """A waiting job not planned together now: its capture dropped (planned later, from a real
        capture, when it is admitted), and its build, if it can be built again."""
        state.rt.captured = None
        if state.job.rebuildable and state.rt.train is not None:
            self.host.lifecycle.teardown(state)

    def build_needs_parking(self, state: JobState, active: list[JobState]) -> str | None:
        """Note [Joint re-plan on arrival]: why the running jobs must be
        parked while ``state`` builds (None: they need not be). Its build
        holds about its predicted persistent bytes; the running steps may
        still take their temporaries out of what the pool has free."""
        if state.rt.train is not None:
            return None    # built already: nothing more is allocated before the plan
        host = self.host
        needs = host.admission.predict(state)
        if needs is None:
            return "its build's needs are unknown (no measured job like it)"
        stats = pool_stats()
        room = host.capacity - stats["current"] - sum((host.admission.predict(s) or (0, 0))[1] for s in active)
        if needs[0] > room:
            return (f"its build needs about {human_bytes(needs[0])}, the pool has {human_bytes(max(0, room))} "
                    "beside the running steps' temporaries")
        return None

    def start_jointly_planned(self, state: JobState, active: list[JobState]) -> None:
        """Probes (its planned step) and starts a job planned on arrival once
        every running job runs the joint plan (Note [Hot swap]): its switch
        taken and applied (Note [Threads and hand-offs], H3). One its probe
        kept built (Note [A capture kept for the joint plan]) ran its first
        step already: it starts on the plan's needs, its next step planned."""
        if any(s.rt.switch.pending for s in active):
            return
        host = self.host
        state.awaiting_switches = False
        self.waiting.remove(state)
        outcome = ProbeOutcome.hold if state.steps_done else host.lifecycle.probe(state, active, hold=True)
        if outcome == ProbeOutcome.hold:
            host.start_job(state)   # admitted on the joint plan's prediction
        elif outcome == ProbeOutcome.queued:
            self.waiting.append(state)
        host.report(state)
        host.notify_end(state)

    def plan_alone(self, state: JobState, alongside: list[JobState]) -> None:
        """A job admitted after the start is planned alone for what the running jobs leave."""
        planning = self.host.planning
        if planning is None or state.cold_planned or state.rt.planned_step is not None:
            return
        needs = [self.host.admission.predict(s) or (0, 0) for s in alongside if s is not state]
        budget = planning.alone_budget(sum(p + t for p, t in needs), self.host.held_outside_jobs())
        planning.plan([state], budget)
