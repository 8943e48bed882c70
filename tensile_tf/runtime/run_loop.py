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

Failure isolation: an exception in one job (OOM included) marks that job
failed with its error; the others go on.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Protocol

import tf_plugin
from tensile_tf.config.schema import Admission, PipelineKind, PlannerKind, PlanOrder, PlanPeaks, RunSpec
from tensile_tf.tf.determinism import disable_graph_dependent_rewrites
from tensile_tf.jobs.job import Job
from tensile_tf.tf.pool import allocation_wait, ensure_pool, pool_stats
from tensile_tf.runtime.admission import AdmissionControl
from tensile_tf.runtime.job_thread import JobThread, RunClock
from tensile_tf.runtime.nodegroup import NodeGroupCoordinator
from tensile_tf.runtime.planning import JobPlanning, PlanningSettings, SavedPlan
from tensile_tf.runtime.probing import JobLifecycle, ProbeOutcome
from tensile_tf.runtime.replanning import LatencyMonitor, Replanner, ReplanRequest, StepGate
from tensile_tf.runtime.records import (
    FINAL_STATUSES,
    JobState,
    JobStatus,
    MemorySample,
    PlannerRecord,
    PlanSummary,
    PoolRecord,
    RunResult,
    SwapLinkRecord,
    TraceCoverage,
)
from tensile_tf.units import parse_bytes


class ProgressSink(Protocol):
    def update(self, state: JobState, pool: dict[str, Any]) -> None: ...
    # optional: note(text), a line for run-level events such as a re-plan


class JobHost:
    """Runs jobs concurrently in one process on the shared device pool.

    >>> host = JobHost(pool_bytes="2GiB")
    >>> host.submit(Job.from_train_step("mine", TrainStep(step_fn, batches), steps=100))
    >>> result = host.run()
    """

    def __init__(self, pool_bytes: int | str | None = None, *, concurrency: int | None = None,
                 admission: Admission | str = Admission.salus, sample_interval_s: float = 0.05,
                 progress: ProgressSink | None = None, pipeline: PipelineKind | str = PipelineKind.none,
                 split_size: int | str = "auto", barrier_timeout_s: float = 60.0,
                 planner: PlannerKind | str = PlannerKind.none, swap_bandwidth: int | str | None = None,
                 plan_budget: int | str | None = None, plan_peaks: PlanPeaks | str | None = None,
                 plan_order: PlanOrder | str = PlanOrder.plan,
                 record_weights: bool = False, saved_plan: SavedPlan | None = None, replan: bool = True,
                 replan_threshold: float = 0.2, model_dir: str | Path | None = None,
                 allocation_wait_ms: int = 1000):
        if pool_bytes is not None:
            ensure_pool(pool_bytes)
        self.capacity = tf_plugin.device_pool().capacity
        self.planner, self.pipeline_kind = PlannerKind(planner), PipelineKind(pipeline)
        self.plan_peaks = PlanPeaks(plan_peaks) if plan_peaks is not None else PlanPeaks.for_pipeline(self.pipeline_kind)
        self.swap_bandwidth = parse_bytes(swap_bandwidth, what="swap_bandwidth") if swap_bandwidth else None
        self.record_weights = record_weights
        self.model_dir = Path(model_dir) if model_dir is not None else None   # each finished job's model, saved
        self.allocation_wait_ms = allocation_wait_ms   # Note [Waiting for frees], while run() runs
        self.sample_interval_s = sample_interval_s
        self.progress = progress
        self.states: list[JobState] = []
        self.admission = AdmissionControl(self.capacity, Admission(admission), concurrency)
        self.planning = None
        if self.planner == PlannerKind.tensile:
            self.planning = JobPlanning(self.capacity, PlanningSettings(
                self.plan_peaks, self.swap_bandwidth,
                parse_bytes(plan_budget, what="plan_budget") if plan_budget else None, saved_plan,
                PlanOrder(plan_order)))
        self.replanner = None
        self.replan_threshold = replan_threshold
        if self.planning is not None and replan and saved_plan is None:   # --plan runs exactly that plan
            self.replanner = Replanner(self.planning, lambda: self.clock.now(), self._held_outside_jobs)
        self.pipeline = None
        if self.pipeline_kind == PipelineKind.nodegroup:
            split = split_size if split_size == "auto" else parse_bytes(split_size, what="split_size")
            self.pipeline = NodeGroupCoordinator(self.capacity, split, timeout_s=barrier_timeout_s)
        if self.planning is not None or self.pipeline is not None:
            # Rewritten steps must compute what the unplanned ones compute
            # (Note [Graph-dependent Grappler rewrites] in tensile_tf.tf.determinism).
            disable_graph_dependent_rewrites()
        self.clock = RunClock()
        self.lifecycle = JobLifecycle(self.states, self.clock, self.admission, self._held_outside_jobs,
                                      pipeline=self.pipeline, planning=self.planning)
        self._ended: queue.Queue[JobState | ReplanRequest] = queue.Queue()   # ended jobs; re-plan requests
        self._stop = threading.Event()
        self._stop_reason: str | None = None
        self._threads: dict[str, JobThread] = {}
        self._most_running = 0
        self._joint_tried: set[str] = set()   # waiting jobs tried for a joint plan since the last event
        self._gate = StepGate()

    @classmethod
    def from_config(cls, pool: int, run: "RunSpec", **kwargs) -> "JobHost":
        """The host a config's ``pool:`` and ``run:`` section describe (every
        command builds its host here); ``kwargs`` override or add settings."""
        settings = dict(concurrency=run.concurrency, admission=run.admission, pipeline=run.pipeline,
                        split_size=run.split_size, barrier_timeout_s=run.barrier_timeout_s, planner=run.planner,
                        swap_bandwidth=run.swap_bandwidth, plan_budget=run.plan_budget, plan_peaks=run.plan_peaks,
                        plan_order=run.plan_order, replan=run.replan, replan_threshold=run.replan_threshold,
                        allocation_wait_ms=run.allocation_wait_ms)
        return cls(pool, **(settings | kwargs))

    @property
    def concurrency(self) -> int | None:
        return self.admission.concurrency

    @property
    def plans(self) -> list:
        return self.planning.plans if self.planning is not None else []

    def request_stop(self, reason: str) -> None:
        """Stops the run at the jobs' next step boundaries (see the module
        docstring). Only sets a flag: safe from a signal handler."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def submit(self, job: Job) -> JobState:
        if any(s.name == job.name for s in self.states):
            raise ValueError(f"JobHost: a job named {job.name!r} was already submitted")
        state = JobState(job=job)
        self.states.append(state)
        return state

    # ----------------------------------------------------------- the run

    def run(self, job_source: Callable[[], Job | None] | None = None) -> RunResult:
        """Runs every submitted job; returns when all have ended (see ``_run``).
        Meanwhile an allocation that does not fit waits up to
        ``allocation_wait_ms`` for the other jobs' frees (Note [Waiting for
        frees] in tf_plugin/allocator/tf_pool_allocator.cc)."""
        with allocation_wait(self.allocation_wait_ms):
            return self._run(job_source)

    def _run(self, job_source: Callable[[], Job | None] | None = None) -> RunResult:
        """Runs every submitted job; returns when all have ended.

        ``job_source``, if given, is asked for another job whenever no job is
        waiting and fewer than ``concurrency`` run; it returns a Job, or None
        for "nothing more now". The run ends when no job runs or waits and the
        source has nothing more (search drivers keep the pool full with it).
        """
        started_at, pool = time.time(), tf_plugin.device_pool()
        before = pool_stats()
        self.clock.restart()
        self._most_running = 0
        pool.reset_peak()
        if self.planning is not None:
            from tf_plugin import swap

            swap.set_swap_bandwidth(self.swap_bandwidth or 0)
            swap.reset_swap_stats()
        origin_ns = time.monotonic_ns()
        samples: list[MemorySample] = []
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(samples, stop_sampling),
                                   name="tensile-memory-sampler", daemon=True)
        sampler.start()
        waiting: deque[JobState] = deque()
        # Jobs that arrive later (``arrive_at_s``), soonest first.
        arrivals = deque(sorted((s for s in self.states if s.status == JobStatus.pending and _arrive_at(s) > 0),
                                key=_arrive_at))
        self._joint_tried.clear()
        self._gate = StepGate()
        try:
            admitted = self._probe_start(waiting, arrivals)
            # Peaks from here on are the training's (probing and planning ran vanilla steps).
            start_peak = pool.stats()["peak"]
            pool.reset_peak()
            if self.pipeline is not None and admitted:
                # Note [Jobs that start together join one schedule] in nodegroup.py
                self.pipeline.jobs_started([(s.name, s.stream, s.persistent_bytes, s.temporary_bytes)
                                            for s in admitted])
            for state in admitted:
                self._start(state)
            while True:
                if self.stopping:
                    if not self._threads:
                        break  # every running job has ended at a step boundary
                else:
                    self._pull_jobs(job_source, waiting)
                    self._arrive(arrivals, waiting)
                if not (self._threads or waiting or arrivals):
                    break
                if not self._threads and not self.stopping:
                    self._admit_waiting(waiting)
                    if not self._threads and not arrivals:
                        break  # what waits cannot run even alone
                timeout = 0.25
                if arrivals:
                    timeout = min(timeout, max(0.0, _arrive_at(arrivals[0]) - self.clock.now()))
                try:
                    ended = self._ended.get(timeout=timeout)
                except queue.Empty:
                    for state in self.states:
                        if state.status == JobStatus.running:
                            self._report(state)
                    if any(s.awaiting_switches for s in waiting) and not self.stopping:
                        self._admit_waiting(waiting)   # Note [Joint re-plan on arrival]: switched yet?
                    continue
                if isinstance(ended, ReplanRequest):   # Note [Latency drift]
                    self._serve_replan_request(ended, len(waiting))
                    continue
                self._threads.pop(ended.name).join()
                self.lifecycle.teardown(ended)
                self._report(ended)
                self._notify_end(ended)
                if not self.stopping:
                    self._joint_tried.clear()   # a departure is a new event for the waiting jobs
                    self._admit_waiting(waiting)
                    if self.replanner is not None:
                        running = self._running()
                        replan = self.replanner.on_departure(ended, running, len(waiting),
                                                             self._outside_replan_need(running))
                        if replan is not None:
                            self._note_replan(replan)
        finally:
            stop_sampling.set()
            sampler.join()
        for state in waiting:
            if self.stopping:
                continue  # ended below, as never started
            state.status = JobStatus.rejected  # could not be admitted even when alone
            state.error = state.error or "never fit the pool"
            self._notify_end(state)
        if self.stopping:
            for state in self.states:  # pending, or probed and kept waiting: never started
                if state.status in (JobStatus.pending, JobStatus.queued):
                    state.status = JobStatus.interrupted
                    state.error = state.error or f"not started: {self._stop_reason}"
                    if state.train is not None or state.job_stream is not None:
                        self.lifecycle.teardown(state)
                    self._notify_end(state)
        return self._result(started_at, origin_ns, before, start_peak, samples)

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
            self._report(state)
            self._notify_end(state)
        if hold and not self.stopping:
            admitted = self._plan_start(waiting)
        return [] if self.stopping else admitted

    def _plan_start(self, waiting: deque) -> list[JobState]:
        """Plans the built, probed jobs together; admits those that fit with
        their planned needs, in submit order; tears down the rest."""
        built = [s for s in waiting if s.train is not None]
        plan = None
        if built:
            budget = self.planning.start_budget(built, self._held_outside_jobs())
            plan = self.planning.plan(built, budget, saved_plan_allowed=True)
        # A plan that met its budget is the admission prediction for the jobs
        # in it (their combined peak over time, not the sum of their peaks).
        jointly = set(plan.jobs) if plan is not None and plan.budget_met else set()
        admitted: list[JobState] = []
        for state in built:
            if (state.name in jointly and self.admission.has_room(len(admitted))) or \
                    self.admission.fits(state, admitted, self._held_outside_jobs()):
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
        waiting: deque[JobState] = deque()
        self.clock.restart()
        self._probe_start(waiting, deque())
        for state in self.states:
            self.lifecycle.teardown(state)
        return self.plans[-1] if self.plans else None

    def _running(self) -> list[JobState]:
        return [s for s in self.states if s.status == JobStatus.running]

    def _arrive(self, arrivals: deque, waiting: deque) -> None:
        """Jobs whose ``arrive_at_s`` came join the waiting jobs, then admission runs."""
        arrived = False
        while arrivals and _arrive_at(arrivals[0]) <= self.clock.now():
            state = arrivals.popleft()
            state.arrived_at_s = _arrive_at(state)   # its waiting counts from then, however busy the loop was
            waiting.append(state)
            arrived = True
        if arrived:
            self._admit_waiting(waiting)

    def _admit_waiting(self, waiting: deque) -> None:
        """Starts queued jobs that fit now, in submit order (later small jobs may pass)."""
        awaiting = [s for s in waiting if s.awaiting_switches]
        if awaiting:
            # Note [Joint re-plan on arrival]: the joint plan holds room for the
            # newcomer; nothing else is admitted or planned until it starts.
            for state in awaiting:
                self._start_jointly_planned(state, waiting, self._running())
            return
        for state in list(waiting):
            active = self._running()
            if not self.admission.has_room(len(active)):
                for queued in waiting:
                    self._wait(queued, f"{len(active)} jobs run, the concurrency limit")
                return
            if not state.measured:
                # Probing runs a step. With nothing running, nothing can be
                # disturbed; otherwise only a job whose predicted needs fit.
                predicted = self.admission.predict(state) is not None
                if self._threads and not (predicted and self.admission.fits(state, active, self._held_outside_jobs())):
                    self._plan_arrival(state, waiting, active)
                    continue
                waiting.remove(state)
                outcome = self.lifecycle.probe(state, active)
                if outcome == ProbeOutcome.run:
                    self._plan_alone(state, active)
                    self._start(state)
                elif outcome == ProbeOutcome.queued:
                    waiting.append(state)
                self._report(state)
                self._notify_end(state)
                continue
            if not self.admission.fits(state, active, self._held_outside_jobs()):
                if self._threads:
                    self._plan_arrival(state, waiting, active)
                else:
                    self._wait(state, "its measured needs do not fit the pool left to jobs")
                continue
            waiting.remove(state)
            if state.train is None and not self.lifecycle.build(state):
                if state.status == JobStatus.queued:
                    waiting.append(state)
                self._report(state)
                self._notify_end(state)
                continue
            if self.planning is not None and state.planned_step is None and state.captured is None:
                self.planning.capture(state)
            self._plan_alone(state, active)
            self._start(state)

    def _outside_replan_need(self, running: list[JobState]) -> int:
        """Bytes the running jobs a re-plan cannot change (unplanned) need."""
        inside = {s.name for s in Replanner.replannable(running)}
        return sum(sum(self.admission.predict(s) or (0, 0)) for s in running if s.name not in inside)

    def _plan_arrival(self, state: JobState, waiting: deque, active: list[JobState]) -> None:
        """Note [Joint re-plan on arrival] in replanning.py: ``state`` does not
        fit beside ``active``; plan it together with them, once per event."""
        if state.name in self._joint_tried:
            return
        later = "; waits for a running job to end"
        if self.replanner is None or self.pipeline is not None:
            self._wait(state, "does not fit beside the running jobs and re-planning is off" + later)
            return
        if not Replanner.replannable(active):
            self._wait(state, "does not fit beside the running jobs, and none of them runs a plan "
                       "a joint re-plan could tighten" + later)
            return
        self._joint_tried.add(state.name)
        with self._gate.closed([s.name for s in active], self._stop):
            paused_from = time.perf_counter()
            if self.stopping or (state.train is None and not self.lifecycle.build(state)):
                if state.status not in (JobStatus.queued, JobStatus.pending):   # failed or rejected building
                    waiting.remove(state)
                elif not self.stopping:
                    self._wait(state, "building it for a joint plan ran out of the pool memory "
                               "the running jobs leave" + later)
                self._report(state)
                self._notify_end(state)
                return
            record = None
            if self.planning.capture_cold(state):
                record = self.replanner.on_arrival(state, active, self._outside_replan_need(active))
            else:
                self._wait(state, f"could not be captured for a joint plan ({state.plan_error})" + later)
        if record is not None:
            record.paused_s = time.perf_counter() - paused_from
            self._note_replan(record)
        if record is not None and record.error is None:
            state.awaiting_switches = True
            self._start_jointly_planned(state, waiting, active)
            return
        if record is not None:
            self._wait(state, f"the joint plan with the running jobs failed ({record.error})" + later)
        state.captured = None   # planned later, from a real capture, when it is admitted
        if state.job.rebuildable:
            self.lifecycle.teardown(state)

    def _start_jointly_planned(self, state: JobState, waiting: deque, active: list[JobState]) -> None:
        """Probes (its planned step) and starts a job planned on arrival once
        every running job has switched to the joint plan (Note [Hot swap])."""
        if any(s.pending_switch is not None for s in active):
            return
        state.awaiting_switches = False
        waiting.remove(state)
        outcome = self.lifecycle.probe(state, active, hold=True)
        if outcome == ProbeOutcome.hold:
            self._start(state)   # admitted on the joint plan's prediction
        elif outcome == ProbeOutcome.queued:
            waiting.append(state)
        self._report(state)
        self._notify_end(state)

    def _plan_alone(self, state: JobState, alongside: list[JobState]) -> None:
        """A job admitted after the start is planned alone for what the running jobs leave."""
        if self.planning is None or state.cold_planned or state.planned_step is not None:
            return
        needs = [self.admission.predict(s) or (0, 0) for s in alongside if s is not state]
        budget = self.planning.alone_budget(sum(p + t for p, t in needs), self._held_outside_jobs())
        self.planning.plan([state], budget)

    def _start(self, state: JobState) -> None:
        if self.replanner is not None and state.captured is not None and state.plan is not None:
            state.latency_monitor = LatencyMonitor(state, self.replan_threshold,
                                                   lambda job, why: self._ended.put(ReplanRequest(job, why)),
                                                   self.clock.now)
        state.status = JobStatus.running
        state.admitted_at_s = self.clock.now()
        if self.pipeline is not None:   # a no-op for a job that joined with the run's start
            self.pipeline.job_started(state.name, state.stream, state.persistent_bytes, state.temporary_bytes)
        on_end = (lambda s: self.pipeline.job_ended(s.name, s.stream)) if self.pipeline is not None else None
        # Note [Overlap after measuring] in nodegroup.py
        after_step = (lambda s: self.pipeline.step_ended(s.stream, s.records[-1].peak_bytes)) \
            if self.pipeline is not None else None
        thread = JobThread(state, self.clock, self._ended, record_weights=self.record_weights, on_end=on_end,
                           stop=self._stop, gate=self._gate, model_dir=self.model_dir, after_step=after_step)
        self._threads[state.name] = thread
        # Jobs whose threads the host holds at once (an ended job counts until
        # the run loop joins it): what admission let run together.
        self._most_running = max(self._most_running, len(self._threads))
        thread.start()

    def _pull_jobs(self, job_source, waiting: deque) -> None:
        """Takes new jobs from job_source while there is room, and admits them."""
        if job_source is None:
            return
        while not waiting and self.admission.has_room(len(self._threads)):
            job = job_source()
            if job is None:
                return
            state = self.submit(job)
            state.arrived_at_s = self.clock.now()
            waiting.append(state)
            self._admit_waiting(waiting)

    # ------------------------------------------------------- bookkeeping

    def _notify_end(self, state: JobState) -> None:
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

    def _serve_replan_request(self, request: "ReplanRequest", waiting: int) -> None:
        """Note [Latency drift]: a job's monitor asked for a re-plan."""
        if self.replanner is None or self.stopping or waiting:
            return
        running = self._running()
        jobs = Replanner.replannable(running)
        if any(s.name == request.job for s in jobs):
            self._note_replan(self.replanner.replan(jobs, request.reason, self._outside_replan_need(running)))

    def _wait(self, state: JobState, why: str) -> None:
        """Records (and shows, once per reason) why ``state`` is not started."""
        note = getattr(self.progress, "note", None)
        if state.wait(self.clock.now(), why) and note is not None:
            note(f"{state.name} waits: {why}")

    def _note_replan(self, record) -> None:
        note = getattr(self.progress, "note", None)
        if note is None:
            return
        if record.error:
            note(f"re-plan ({record.reason}) failed, jobs keep their plans: {record.error}")
        else:
            jobs = ", ".join(f"{j.name} swaps {j.swaps_before}->{j.swaps_after}" for j in record.jobs)
            note(f"re-planned ({record.reason}) in {record.planning_s * 1e3:.0f} ms + rewrite "
                 f"{record.rewrite_s:.2f} s: {jobs}")

    def _report(self, state: JobState) -> None:
        if self.progress is not None:
            self.progress.update(state, pool_stats())

    def _sample(self, samples: list[MemorySample], stop: threading.Event) -> None:
        """Samples the pool from the run's start to its end: the first sample
        before any job's first step, the last after every job ended."""
        pool = tf_plugin.device_pool()
        stopped = False
        while not stopped:
            stopped = stop.wait(self.sample_interval_s) if samples else False
            s = pool.stats()
            samples.append(MemorySample(self.clock.now(), s["current"],
                                        {name: j["current"] for name, j in s["jobs"].items()}))

    @staticmethod
    def _held_outside_jobs() -> int:
        """Pool bytes held outside every job (eager tensors, stray state)."""
        return pool_stats()["jobs"].get("default", {}).get("current", 0)

    def _result(self, started_at: float, origin_ns: int, before: dict, start_peak: int,
                samples: list[MemorySample]) -> RunResult:
        wall = self.clock.now()
        stats = pool_stats()
        pool = tf_plugin.device_pool()
        events = pool.trace()
        in_run = stats["trace_recorded"] - before["trace_recorded"]
        kept = [e for e in events if e["time_ns"] >= origin_ns]
        coverage = TraceCoverage(events_in_run=in_run, events_kept=len(kept),
                                 kept_from_s=(kept[0]["time_ns"] - origin_ns) / 1e9 if kept else None,
                                 samples=len(samples))
        pool_record = PoolRecord(
            capacity=self.capacity, peak=max(stats["peak"], start_peak), training_peak=stats["peak"],
            current=stats["current"], start_current=before["current"], run_ooms=stats["num_ooms"] - before["num_ooms"],
            stats={k: v for k, v in stats.items() if k != "jobs"},
            run_stitched=stats["num_stitched"] - before["num_stitched"],
            nodegroup=self.pipeline.summary() if self.pipeline is not None else None)
        planner = None
        if self.planning is not None:
            from tf_plugin import swap

            planner = PlannerRecord([PlanSummary.of(p) for p in self.plans],
                                    SwapLinkRecord.of(self.swap_bandwidth, swap.swap_stats()),
                                    self.replanner.finish(self.states) if self.replanner is not None else [],
                                    [c for s in self.states if s.latency_monitor is not None
                                     for c in s.latency_monitor.checks])
        return RunResult(capacity=self.capacity, pool=pool_record, jobs=list(self.states), samples=samples,
                         pool_events=kept, started_at=started_at, wall_s=wall, trace_origin_ns=origin_ns,
                         trace=coverage, most_jobs_running=self._most_running,
                         interrupted=self._stop_reason if self.stopping else None, planner=planner,
                         plans=list(self.plans))


def _arrive_at(state: JobState) -> float:
    spec = state.job.spec
    return spec.arrive_at_s if spec is not None else 0.0
