"""JobHost: runs many training jobs at once in one process on the device pool.

The run, in order (the main thread does every step but the training loops):

1. ``submit(job)`` queues jobs; nothing runs yet.
2. ``run()`` *probes* each job in submit order, serially, with no job thread
   running (probing.py): build, trace, first step, P and T measured.
3. With the planner on, the jobs probed at the start are planned together
   (planning.py) and admitted on the plan's prediction.
4. Admission (admission.py, the Salus safety condition): a job runs only if
   it fits beside the running ones; others wait; one that can never fit is
   rejected with the reason.
5. Admitted jobs train in their own threads (job_thread.py); the node-group
   pipeline (nodegroup.py), when on, pairs the running jobs' node groups.
6. When a job ends, the main thread tears it down (its pool bytes must go
   back to zero) and admits waiting jobs, until none runs or waits. Jobs
   with ``arrive_at_s`` join the waiting ones at that time; with re-planning
   on, one that does not fit is planned together with the running jobs
   (Note [Joint re-plan on arrival] in replanning.py), and a departure
   relaxes the running jobs' plans (Note [Re-planning on events]).
7. The records (records.py) are the RunResult.

Stopping early: ``request_stop(reason)`` (the CLI calls it on Ctrl-C or
SIGTERM; safe from a signal handler) admits and probes nothing more; every
running job ends ``interrupted`` at its next step boundary and is torn down
as usual, jobs not started yet end ``interrupted`` too, and the RunResult
(``interrupted`` = the reason) holds everything that ran.

Failure isolation: an exception in one job (OOM included) marks that job failed
with its error; the others go on. Collaborators: arrivals.py (the waiting line,
joint plans on arrival), outcome.py (the memory sampler, the RunResult). Threads
and hand-offs: Note [Threads and hand-offs] in threads.py."""
from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Callable, Protocol

import tf_plugin
from tensile_tf.config.device_links import link_lanes
from tensile_tf.config.schema import PipelineKind, PlannerKind, PlanPeaks, RunSpec
from tensile_tf.tf.determinism import disable_graph_dependent_rewrites
from tensile_tf.jobs.job import Job
from tensile_tf.tf.pool import allocation_wait, ensure_pool, pool_stats
from tensile_tf.runtime.admission import AdmissionControl
from tensile_tf.runtime.arrivals import Arrivals
from tensile_tf.runtime.job_thread import JobThread, RunClock
from tensile_tf.runtime.nodegroup import NodeGroupCoordinator
from tensile_tf.runtime.outcome import MemorySampler, RunWindow, held_outside_jobs, run_result
from tensile_tf.runtime.planning import JobPlanning, PlanningSettings, SavedPlan
from tensile_tf.runtime.probing import JobLifecycle, ProbeOutcome
from tensile_tf.runtime.teardown_memory import objects_before_the_run_frozen
from tensile_tf.runtime.replanning import LatencyMonitor, Replanner, ReplanRequest
from tensile_tf.runtime.traced_step_reuse import TracedStepShelf
from tensile_tf.runtime.records import FINAL_STATUSES, JobState, JobStatus, RunResult
from tensile_tf.runtime.threads import RunLoopInbox, StepGate, StopRequest
from tensile_tf.runtime.training_capture import CaptureReady
from tensile_tf.scheduler import DEFAULT_BANDWIDTH_BYTES_PER_S


class ProgressSink(Protocol):
    def update(self, state: JobState, pool: dict[str, Any]) -> None: ...
    # optional: note(text), a line for run-level events such as a re-plan


def run_spec_with(run: RunSpec | None, settings: dict[str, Any]) -> RunSpec:
    """``run`` (default: RunSpec's defaults) with ``settings`` (RunSpec's
    fields, e.g. ``planner="tensile"``) put over it, validated as the YAML's
    ``run:`` section is."""
    unknown = sorted(set(settings) - set(RunSpec.model_fields))
    if unknown:
        raise TypeError(f"JobHost() got unexpected keyword argument(s): {', '.join(unknown)}")
    run = run if run is not None else RunSpec()
    return RunSpec.model_validate(run.model_dump() | settings) if settings else run


class JobHost:
    """Runs jobs concurrently in one process on the shared device pool.

    >>> host = JobHost(pool_bytes="2GiB")
    >>> host.submit(Job.from_train_step("mine", TrainStep(step_fn, batches), steps=100))
    >>> result = host.run()

    ``pool`` (or ``pool_bytes``): the pool's capacity, created now if given.
    ``run``: the settings of a config's ``run:`` section (RunSpec); keyword
    arguments named as RunSpec's fields (``concurrency=2``,
    ``planner="tensile"``, ...) override them. The other keywords are what a
    config does not say: ``progress`` (a ProgressSink), ``sample_interval_s``
    (the memory samples), ``record_weights`` (a digest of each job's final
    variables), ``saved_plan`` (``tensile run --plan``: exactly that plan)
    and ``model_dir`` (each finished job's model, saved).
    """

    def __init__(self, pool: int | str | None = None, run: RunSpec | None = None, *,
                 progress: ProgressSink | None = None, sample_interval_s: float = 0.05,
                 record_weights: bool = False, saved_plan: SavedPlan | None = None,
                 model_dir: str | Path | None = None, pool_bytes: int | str | None = None, **run_settings: Any):
        if pool_bytes is not None and pool is not None:
            raise TypeError("JobHost: give pool or pool_bytes, not both")
        pool = pool_bytes if pool_bytes is not None else pool
        self.run_spec = spec = run_spec_with(run, run_settings)
        if pool is not None:
            ensure_pool(pool)
        self.capacity = tf_plugin.device_pool().capacity
        self.planner, self.pipeline_kind = spec.planner, spec.pipeline
        self.plan_peaks = spec.plan_peaks if spec.plan_peaks is not None else PlanPeaks.for_pipeline(spec.pipeline)
        # Note [Links named for a device]: a named link becomes bytes per second at the first plan
        self.device_link = spec.swap_bandwidth if isinstance(spec.swap_bandwidth, str) else None
        # unset (or 0): PCIe 3 x16, 12 GiB/s, for the emulated link and the planner alike (one meaning, issue 57)
        self.swap_bandwidth = None if self.device_link else (spec.swap_bandwidth or DEFAULT_BANDWIDTH_BYTES_PER_S)
        self.record_weights = record_weights
        self.model_dir = Path(model_dir) if model_dir is not None else None   # each finished job's model, saved
        self.allocation_wait_ms = spec.allocation_wait_ms   # Note [Waiting for frees], while run() runs
        self.sample_interval_s = sample_interval_s
        self.progress = progress
        self.states: list[JobState] = []
        self.admission = AdmissionControl(self.capacity, spec.admission, spec.concurrency)
        self.planning = None
        if self.planner == PlannerKind.tensile:
            self.planning = JobPlanning(self.capacity, PlanningSettings(
                self.plan_peaks, self.swap_bandwidth, spec.plan_budget or None, saved_plan, spec.plan_order,
                # Note [Table first, rewritten when ready]: a run that never re-plans builds no table step
                plan_steps=spec.plan_steps if spec.replan or spec.plan_steps != "table_then_rewrite" else "rewrite",
                device_link=self.device_link,
                link_lanes=link_lanes(self.device_link, spec.link_lanes)))   # Note [Lanes of a device link]
            self.admission.plan_budget = spec.plan_budget or None   # Note [Captures a plan needs] (planning.py)
        self.replanner = None
        self.replan_threshold = spec.replan_threshold
        if self.planning is not None and spec.replan and saved_plan is None:   # --plan runs exactly that plan
            self.replanner = Replanner(self.planning, lambda: self.clock.now(), held_outside_jobs,
                                       switch_when_ready=spec.replan_switch == "ready")
        self.pipeline = None
        if self.pipeline_kind == PipelineKind.nodegroup:
            self.pipeline = NodeGroupCoordinator(self.capacity, spec.split_size, timeout_s=spec.barrier_timeout_s)
        if self.planning is not None or self.pipeline is not None:
            # Rewritten steps must compute what the unplanned ones compute
            # (Note [Graph-dependent Grappler rewrites] in tensile_tf.tf.determinism).
            disable_graph_dependent_rewrites()
        self.clock = RunClock()
        # Note [Reusing a finished job's traced step]: pipelined steps are per job; a planned job parks its
        # unplanned step (Note [Reuse under a planner]); a saved plan names its first owner's ops
        self.shelf = TracedStepShelf(spec.reuse_traced_steps and self.pipeline is None and saved_plan is None,
                                     planned=self.planning is not None)
        self.admission.make_room = lambda state: self.shelf.evict(keep_for=state)
        self.admission.kept_for = self.shelf.bytes_for   # Note [Steps kept for the jobs that wait]
        self.lifecycle = JobLifecycle(self.states, self.clock, self.admission, held_outside_jobs,
                                      pipeline=self.pipeline, planning=self.planning, shelf=self.shelf)
        self.arrivals = Arrivals(self)
        # Between the threads (Note [Threads and hand-offs] in threads.py):
        self.inbox = RunLoopInbox()      # job threads -> run loop: ended jobs, re-plan requests
        self.stop = StopRequest()        # anyone -> job threads: end at the next step boundary
        self.gate = StepGate()           # run loop -> job threads: park at a step boundary
        self._threads: dict[str, JobThread] = {}   # the run loop's own: the jobs it started and has not joined
        self.most_running = 0

    @classmethod
    def from_config(cls, pool: int, run: RunSpec, **kwargs) -> "JobHost":
        """The host a config's ``pool:`` and ``run:`` section describe (every
        command builds its host here); ``kwargs`` override or add settings."""
        return cls(pool, run, **kwargs)

    held_outside_jobs = staticmethod(held_outside_jobs)

    @property
    def concurrency(self) -> int | None:
        return self.admission.concurrency

    @property
    def plans(self) -> list:
        return self.planning.plans if self.planning is not None else []

    def request_stop(self, reason: str) -> None:
        """Stops the run at the jobs' next step boundaries (see the module
        docstring). Never blocks: safe from a signal handler."""
        self.stop.request(reason)

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()

    def submit(self, job: Job) -> JobState:
        if any(s.name == job.name for s in self.states):
            raise ValueError(f"JobHost: a job named {job.name!r} was already submitted")
        state = JobState(job=job)
        self.states.append(state)
        return state

    # ----------------------------------------------------------- the run

    def run(self, job_source: Callable[[], Job | None] | None = None, *, jobs_at_most: int | None = None,
            busy_for_a_plan: Callable[[int, int], str | None] | None = None) -> RunResult:
        """Runs every submitted job; returns when all have ended (see ``_run``). An allocation that does
        not fit waits up to ``allocation_wait_ms`` for others' frees (Note [Waiting for frees] in
        tf_plugin/allocator/tf_pool_allocator.cc). ``jobs_at_most``: the most jobs ``job_source`` keeps
        running at once (a search's ``max_concurrent``; Note [Captures a plan needs]); ``busy_for_a_plan``:
        asked before a job is planned in beside running ones (Note [Plans only for idle cores], planning.py)."""
        self.admission.jobs_at_most, self.admission.busy_for_a_plan = jobs_at_most, busy_for_a_plan
        # Note [Teardown without a full collection] in teardown_memory.py
        with allocation_wait(self.allocation_wait_ms), objects_before_the_run_frozen():
            return self._run(job_source)

    def _run(self, job_source: Callable[[], Job | None] | None = None) -> RunResult:
        """Runs every submitted job; returns when all have ended. ``job_source``, if given, is
        asked for another job whenever no job is waiting and fewer than ``concurrency`` run; it
        returns a Job, or None for "nothing more now". The run ends when no job runs or waits and
        the source has nothing more (search drivers keep the pool full with it)."""
        link = self.planning.settings if self.planning else None
        window = RunWindow.open(self.clock, planner=link is not None,
                                swap_bandwidth=link.swap_bandwidth if link else None, lanes=link.link_lanes if link else 1,
                                combined_bytes_per_s=link.combined_bytes_per_s if link else None)
        self.most_running = 0
        sampler = MemorySampler(self.clock, self.sample_interval_s)
        sampler.start()
        line = self.arrivals
        line.reset(self.states)
        self.gate = StepGate()
        try:
            admitted = self._probe_start(line.waiting, line.later)
            window.training_starts()
            if self.pipeline is not None and admitted:
                # Note [Jobs that start together join one schedule] in nodegroup.py
                self.pipeline.jobs_started([(s.name, s.stream, s.persistent_bytes, s.temporary_bytes)
                                            for s in admitted])
            for state in admitted:
                self.start_job(state)
            while True:
                if self.stopping:
                    if not self._threads:
                        break  # every running job has ended at a step boundary
                else:
                    self._pull_jobs(job_source)
                    line.arrive()
                if not (self._threads or line.waiting or line.later):
                    break
                if not self._threads and not self.stopping:
                    line.admit_waiting()
                    if not self._threads and not line.later:
                        break  # what waits cannot run even alone
                next_arrival = line.next_in(self.clock.now())
                # a search driver's source is asked often (Note [Admitting by the cores] reads the cores then)
                tick = 0.1 if job_source is not None else 0.25
                message = self.inbox.next(tick if next_arrival is None else min(tick, next_arrival))
                if message is None:
                    self._idle()
                else:
                    self._serve_burst([message, *self.inbox.drain()], job_source)
        finally:
            self.shelf.evict()   # the parked steps' bytes back before the run's end is read
            samples = sampler.stop()
        self._end_the_unstarted()
        return run_result(self, window, samples)

    def _idle(self) -> None:
        """No message for a while: progress lines; a newcomer planned on arrival starts once every running
        job switched (Note [Joint re-plan on arrival]); one held for busy cores is planned in once they are not."""
        for state in self.states:
            if state.status == JobStatus.running:
                self.report(state)
        if any(s.awaiting_switches or s.held_for_cores for s in self.arrivals.waiting) and not self.stopping:
            self.arrivals.admit_waiting()   # a joint plan's switches taken, or the cores asked again

    def _serve_burst(self, messages: list, job_source) -> None:
        """Note [One re-plan per burst] in replan_timing.py: every ended job of the burst torn down, the
        jobs ``job_source`` refills it with taken, then one re-plan for its departures (unless a refill's
        joint plan re-planned the running jobs already) and drift requests (Note [Latency drift])."""
        for ready in [m for m in messages if isinstance(m, CaptureReady)]:   # before any end its thread posted after
            self.arrivals.adopt_capture(ready)
        departed = [m for m in messages if not isinstance(m, (ReplanRequest, CaptureReady))]
        for ended in departed:
            self._job_ended(ended)
        if self.replanner is None or self.stopping:
            return
        line, made = self.arrivals, len(self.replanner.records)
        self._pull_jobs(job_source)
        refilled = any(r.newcomer is not None and r.error is None for r in self.replanner.records[made:])
        running = self.running()
        requests = [m for m in messages if isinstance(m, ReplanRequest)]
        replan = self.replanner.on_events([] if refilled else departed, requests, running, len(line.waiting),
                                          line.outside_replan_need(running))
        if replan is not None:
            self.note_replan(replan)

    def _job_ended(self, ended: JobState) -> None:
        """A job thread's last message (Note [Threads and hand-offs], H2):
        join it, tear the job down, admit what waits."""
        self._threads.pop(ended.name).join()
        ended.times.wait_ends()   # end_wait
        self.lifecycle.teardown(ended)
        self.report(ended)
        self.notify_end(ended)
        if self.stopping:
            return
        self.arrivals.new_event()   # a departure is a new event for the waiting jobs
        self.arrivals.admit_waiting()

    def _end_the_unstarted(self) -> None:
        """Jobs still waiting when the run ends: rejected (they never fit even
        alone) or, when the run was stopped, interrupted."""
        for state in self.arrivals.waiting:
            if self.stopping:
                continue  # ended below, as never started
            state.status = JobStatus.rejected  # could not be admitted even when alone
            state.error = state.error or "never fit the pool"
            self.notify_end(state)
        if self.stopping:
            for state in self.states:  # pending, or probed and kept waiting: never started
                if state.status in (JobStatus.pending, JobStatus.queued):
                    state.status = JobStatus.interrupted
                    state.error = state.error or f"not started: {self.stop.reason}"
                    if state.rt.train is not None or state.rt.job_stream is not None:
                        self.lifecycle.teardown(state)
                    self.notify_end(state)

    def _probe_start(self, waiting: deque, arrivals: deque) -> list[JobState]:
        """Probes every submitted job serially, before any job thread starts;
        with the planner on, plans the built ones together. Returns the jobs
        to start; the rest wait in ``waiting``; ``arrivals`` come later."""
        admitted: list[JobState] = []
        hold = self.planning is not None
        for state in self.states:
            if self.stopping:
                break
            if state in arrivals:
                continue
            state.arrived_at_s = 0.0
            outcome = self.lifecycle.probe(state, admitted, hold=hold)
            if outcome == ProbeOutcome.run:
                admitted.append(state)
            elif outcome in (ProbeOutcome.queued, ProbeOutcome.hold):
                waiting.append(state)
            self.report(state)
            self.notify_end(state)
        if hold and not self.stopping:
            admitted = self._plan_start(waiting)
        return [] if self.stopping else admitted

    def _plan_start(self, waiting: deque) -> list[JobState]:
        """Plans the built, probed jobs together; admits those that fit with
        their planned needs, in submit order; tears down the rest."""
        built = [s for s in waiting if s.rt.train is not None]
        plan = None
        if built:
            budget = self.planning.start_budget(built, held_outside_jobs())
            plan = self.planning.plan(built, budget, saved_plan_allowed=True)
        # A plan that met its budget is the admission prediction for the jobs
        # in it (their combined peak over time, not the sum of their peaks).
        jointly = set(plan.jobs) if plan is not None and plan.budget_met else set()
        admitted: list[JobState] = []
        for state in built:
            if (state.name in jointly and self.admission.has_room(len(admitted))) or \
                    self.admission.fits(state, admitted, held_outside_jobs()):
                waiting.remove(state)
                admitted.append(state)
            elif state.job.rebuildable:
                self.lifecycle.teardown(state)
        return admitted

    def plan_only(self):
        """``tensile plan``: probes and plans the submitted jobs exactly as
        ``run()`` does at its start, then tears them down without training.
        Returns the Plan (None if nothing could be planned)."""
        if self.planning is None:
            raise ValueError("JobHost.plan_only needs planner='tensile'")
        self.clock.restart()
        self._probe_start(deque(), deque())
        for state in self.states:
            self.lifecycle.teardown(state)
        return self.plans[-1] if self.plans else None

    def running(self) -> list[JobState]:
        """The jobs whose threads the run loop started and has not joined, in
        submit order: a job that has just ended still holds its pool bytes
        until it is torn down (Note [Threads and hand-offs], H2)."""
        return [s for s in self.states if s.name in self._threads]

    def start_job(self, state: JobState) -> None:
        """Starts the job's thread (Note [Threads and hand-offs], H1: what the
        state holds now is written before the thread starts)."""
        if self.replanner is not None and state.rt.captured is not None and state.plan is not None:
            state.rt.latency_monitor = LatencyMonitor(state, self.replan_threshold,
                                                   lambda job, why: self.inbox.ask_replan(ReplanRequest(job, why)),
                                                   self.clock.now)
        state.status = JobStatus.running
        state.admitted_at_s = self.clock.now()
        state.times.wait_ends()   # admission_wait (Note [Where a trial's time goes])
        if self.pipeline is not None:   # a no-op for a job that joined with the run's start
            self.pipeline.job_started(state.name, state.stream, state.persistent_bytes, state.temporary_bytes)
        on_end = (lambda s: self.pipeline.job_ended(s.name, s.stream)) if self.pipeline is not None else None
        # Note [Overlap after measuring] in nodegroup.py
        after_step = (lambda s: self.pipeline.step_ended(s.stream, s.records[-1].peak_bytes)) \
            if self.pipeline is not None else None
        thread = JobThread(state, self.clock, self.inbox, record_weights=self.record_weights, on_end=on_end,
                           stop=self.stop, gate=self.gate, model_dir=self.model_dir, after_step=after_step)
        self._threads[state.name] = thread
        # Jobs whose threads the host holds at once (an ended job counts until
        # the run loop joins it): what admission let run together.
        self.most_running = max(self.most_running, len(self._threads))
        thread.start()

    def _pull_jobs(self, job_source) -> None:
        """Takes new jobs from job_source while there is room, and admits them."""
        if job_source is None:
            return
        waiting = self.arrivals.waiting
        while not waiting and self.admission.has_room(len(self._threads)):
            job = job_source()
            if job is None:
                return
            state = self.submit(job)
            state.arrived_at_s = self.clock.now()
            state.times.wait_begins("arrival_wait")
            waiting.append(state)
            self.arrivals.admit_waiting()

    # ------------------------------------------------------- bookkeeping

    def notify_end(self, state: JobState) -> None:
        """Calls the job's on_end once, when it reached a final status (also
        for jobs failed or rejected while probing, or never admitted)."""
        if state.end_notified or state.status not in FINAL_STATUSES:
            return
        state.end_notified = True
        if state.job.on_end is not None:
            try:
                state.job.on_end(state)
            except Exception as e:  # noqa: BLE001 - a callback must not stop the host
                state.error = (state.error or "") + f" [on_end callback failed: {e!r}]"

    def note_wait(self, state: JobState, why: str) -> None:
        """Records (and shows, once per reason) why ``state`` is not started."""
        note = getattr(self.progress, "note", None)
        if state.wait(self.clock.now(), why) and note is not None:
            note(f"{state.name} waits: {why}")

    def note_replan(self, record) -> None:
        note = getattr(self.progress, "note", None)
        if note is None:
            return
        if record.skipped:
            note(f"re-plan ({record.reason}) not started: {record.skipped}")
        elif record.error:
            note(f"re-plan ({record.reason}) failed, jobs keep their plans: {record.error}")
        else:
            jobs = ", ".join(f"{j.name} swaps {j.swaps_before}->{j.swaps_after}" for j in record.jobs)
            note(f"re-planned ({record.reason}) in {record.planning_s * 1e3:.0f} ms + rewrite "
                 f"{record.rewrite_s:.2f} s: {jobs}")

    def report(self, state: JobState) -> None:
        if self.progress is not None:
            self.progress.update(state, pool_stats())
