"""Typed records: what the runtime knows about jobs and the run, and the one
schema they are written in (results.json, compare.json, the search driver).

Every record is a dataclass; nothing crosses a module boundary as a dict read
with ``.get``. ``to_dict()`` gives the JSON form; the schema is versioned by
``SCHEMA_VERSION`` (bumped whenever a key changes meaning or disappears).

Peaks follow one rule everywhere (Note [Training window]):

Note [Training window]
A job's first step is special: it runs unplanned (it measures the job and
builds its optimizer slots), its allocations include one-time work, and it
may run alone while others wait. Peaks credited to a plan, or compared
between runs, are therefore taken over the *training window*: every step
after the first, the same steps in every run. Each step's own peak
(``StepRecord.peak_bytes``: the job's stream peak within that step) is
recorded, so a comparison also knows each run's step-to-step spread and
never credits a plan with less than that noise (tensile_tf.reports.compare).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from tensile_tf.config.device_links import describe_swap_link
from tensile_tf.runtime.job_runtime import JobProgress, JobRuntime
from tensile_tf.runtime.job_times import JobTimes
from tensile_tf.runtime.plan_segments import PlanSegment, plan_segments
from tensile_tf.runtime.replan_records import DriftCheck, JobReplan, ReplanRecord  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from tensile_tf.jobs.job import Job

SCHEMA_VERSION = 3


class JobStatus(str, Enum):
    pending = "pending"      # submitted, not probed yet
    queued = "queued"        # waiting for memory
    running = "running"
    finished = "finished"
    stopped = "stopped"      # ended early by its on_step callback (e.g. pruned)
    failed = "failed"
    rejected = "rejected"    # can never fit the pool
    interrupted = "interrupted"  # the run was stopped (Ctrl-C, SIGTERM) before the job finished


FINAL_STATUSES = frozenset({JobStatus.finished, JobStatus.stopped, JobStatus.failed, JobStatus.rejected,
                            JobStatus.interrupted})


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class StepRecord:
    index: int
    start_s: float       # seconds since the run started
    duration_s: float
    loss: float
    peak_bytes: int = 0  # the job's stream peak within this step (Note [Training window])
    plan: int | None = None   # the plan it ran under, its number (Note [Plan segments]); None: unplanned


@dataclass
class PlanRecord:
    """The plan a job runs: its budget, the planner's prediction (labelled as
    such) and what the rewrite carried out."""

    budget_bytes: int
    budget_met: bool
    predicted_vanilla_peak_bytes: int
    predicted_planned_peak_bytes: int
    predicted_msr: float
    swap_outs: int
    swap_ins: int
    recomputes: int
    planning_s: float
    cold_start: bool
    swapped_bytes_per_step: int = 0
    recomputed_ops: int = 0
    rewrite: dict[str, Any] = field(default_factory=dict)   # RewriteReport.to_dict()
    source: str = "planned"      # "planned" (this run) or the plan.json it was loaded from
    order_only: bool = False     # no events, run in plan order (Note [Free-running steps] in scheduler.peak_analysis)
    step_order: str = "plan"     # "free": ops on TF's inter-op threads (Note [Free-order plans] there)
    plan_number: int | None = None   # its index in the run's plans (planner.plans; Note [Plan segments])
    headroom: float | None = None    # a cold start's: the free pool's share its probe's plan left (Note [Cold-start headroom])
    reason: str = ""             # why it was made: "start", "cold start", "departure of j0", ...
    # what predicted_vanilla_peak_bytes is made of: the traced steps' spread, scratch that meets
    # (UnplannedPeaks.to_dict(); Note [Scratch that meets] in tensile_tf/tf/unplanned_peaks.py); None: not traced
    unplanned_peaks: dict[str, Any] | None = None

    @property
    def changes_step(self) -> bool:
        return bool(self.swap_outs or self.swap_ins or self.recomputes or self.order_only)


@dataclass
class JobState:
    """Everything the host knows about one job. The serialisable part is
    ``JobRecord.of(state)``; the TensorFlow side is ``rt``, dropped at teardown
    (Note [Record apart from runtime] in tensile_tf/runtime/job_runtime.py)."""

    job: "Job"
    status: JobStatus = JobStatus.pending
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    traceback_path: str | None = None   # the whole traceback, written into the output directory
    steps_done: int = 0
    records: list[StepRecord] = field(default_factory=list)
    persistent_bytes: int | None = None
    temporary_bytes: int | None = None
    peak_bytes: int = 0              # the job's own peak pool bytes, first step included
    leaked_bytes: int = 0            # bytes still attributed to it after teardown
    late_free_s: float = 0.0         # how long the teardown waited for its last bytes (Note [Late frees are not leaks])
    kept_by_caller_bytes: int = 0    # what the caller's variables keep in its stream (Note [Bytes the caller keeps])
    # Note [Work outside the steps, inside the allowance] (work_outside_steps.py)
    outside_steps_peak_bytes: int = 0
    outside_steps_allowance_bytes: int | None = None
    outside_steps_need_bytes: int = 0    # its probe's validation batch, admitted with its T
    bytes_per_example: int | None = field(default=None, repr=False)
    stream: int | None = None
    attempts: int = 0                # probes / builds
    admitted_at_s: float | None = None
    ended_at_s: float | None = None
    plan: PlanRecord | None = None   # the last plan it ran (each, in order: plan_history)
    plan_history: list[PlanRecord] = field(default_factory=list)   # Note [Plan segments]
    plan_attempt: int = field(default=0, repr=False)   # the build (``attempts``) that adopted ``plan``
    planned_needs: tuple[int, int] | None = None   # (P, T) admission uses once planned
    plan_error: str | None = None
    plan_deferred: str | None = None   # why it was not captured for a plan (Note [Captures a plan needs])
    captured_at_step: int | None = None   # its capture from training steps, adopted after this step (H14)
    cold_planned: bool = False    # planned before its step ever ran (Note [Cold-start planning])
    probe_plan_peak_bytes: int | None = None   # a cold-planned job: the predicted peak of the plan its probe ran
    arrived_at_s: float | None = None   # when the job arrived (``arrive_at_s``; 0: at the start)
    waits: list[dict] = field(default_factory=list)   # why it was not started yet: {"at_s", "why"}, each change once
    weights_digest: str | None = None    # sha256 of the final variables (record_weights=True)
    traced_step_from: str | None = None  # the ended job whose traced step it took over (traced_step_reuse.py)
    captured_from: str | None = None     # the ended job whose capture it was planned from (same module)
    times: JobTimes = field(default_factory=JobTimes)   # Note [Where a trial's time goes] (job_times.py)
    end_notified: bool = field(default=False, repr=False)  # on_end called
    awaiting_switches: bool = field(default=False, repr=False)  # jointly planned on arrival, starts once all switched
    held_for_cores: bool = field(default=False, repr=False)   # Note [Plans only for idle cores] in planning.py
    drift_checks: list[DriftCheck] = field(default_factory=list, repr=False)   # its latency monitor's, oldest first
    # Note [Record apart from runtime] (job_runtime.py): the TensorFlow side, dropped at teardown,
    # and the progress the job thread publishes after each step for other threads to read
    rt: JobRuntime = field(default_factory=JobRuntime, repr=False, compare=False)
    progress: JobProgress = field(default_factory=JobProgress, repr=False, compare=False)
    progress_step_s: list[float] = field(default_factory=list, repr=False, compare=False)   # training steps', sorted
    validation: list = field(default_factory=list)   # datasets.ValidationRecord, oldest first
    model_path: str | None = None       # the trained model, saved in Keras' format (relative to the output dir)
    checkpoints: list[str] = field(default_factory=list)   # models saved every checkpoint_every steps (same folder)

    def wait(self, at_s: float, why: str) -> bool:
        """Records why the job is not started, once per change of reason. True if this is a new reason."""
        if self.waits and self.waits[-1]["why"] == why:
            return False
        self.waits.append({"at_s": round(at_s, 6), "why": why})
        return True

    def run_plan(self, record: PlanRecord) -> None:
        """The job runs under ``record`` from its next step on (Note [Plan segments])."""
        self.plan = record
        self.plan_attempt = self.attempts
        self.plan_history.append(record)

    @property
    def plan_number(self) -> int | None:
        """The number of the plan its next step runs under (None: unplanned; a
        plan of an earlier build, torn down and rebuilt, is not this build's)."""
        plan = self.plan
        return plan.plan_number if plan is not None and self.plan_attempt == self.attempts else None

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def last_loss(self) -> float | None:
        return self.records[-1].loss if self.records else None

    @property
    def training_records(self) -> list[StepRecord]:
        """The steps of the training window (Note [Training window])."""
        return [r for r in self.records if r.index >= 1]

    @property
    def median_step_s(self) -> float | None:
        # Step 0 includes one-time work (first-call overheads); leave it out when we can.
        times = sorted(r.duration_s for r in self.training_records or self.records)
        return times[len(times) // 2] if times else None

    @property
    def training_peak_bytes(self) -> int | None:
        """The job's peak over the training window (None: it trained no step after its first)."""
        peaks = [r.peak_bytes for r in self.training_records]
        return max(peaks) if peaks else None

    @property
    def measured(self) -> bool:
        return self.persistent_bytes is not None


@dataclass(frozen=True)
class JobRecord:
    """One job in results.json (and in a search trial's user attributes)."""

    name: str
    status: str
    error: str | None
    error_type: str | None
    traceback_path: str | None    # relative to results.json's folder: the failure's whole traceback
    steps: int
    steps_requested: int
    median_step_s: float | None
    peak_pool_bytes: int
    training_peak_pool_bytes: int | None
    training_peak_spread_bytes: int | None   # max - min of the per-step peaks of the training window
    persistent_bytes: int | None
    temporary_bytes: int | None
    leaked_bytes: int
    final_loss: float | None
    losses: list[float | None]
    step_peak_bytes: list[int]
    step_seconds: list[float]          # each step's wall time (step 0 includes one-time tracing work)
    arrived_at_s: float | None
    waits: list[dict]                  # why it was not started when it arrived: {"at_s", "why"}, oldest first
    admitted_at_s: float | None
    ended_at_s: float | None
    weights_digest: str | None
    validation: list[Any]              # each validation: step, at_s, loss, metrics, seconds
    model_path: str | None
    checkpoints: list[str]             # the model every checkpoint_every steps, oldest first (relative paths)
    plan: PlanRecord | None            # the last plan it ran
    plan_error: str | None
    plan_deferred: str | None = None   # Note [Captures a plan needs] (planning.py)
    captured_at_step: int | None = None   # Note [Captures from training steps] (training_capture.py)
    times: dict[str, float] = field(default_factory=dict)   # seconds per phase (Note [Where a trial's time goes])
    plan_segments: list[PlanSegment] = field(default_factory=list)   # its steps, plan by plan (Note [Plan segments])
    traced_step_from: str | None = None   # the ended job whose traced step it trained (None: its own trace)
    captured_from: str | None = None      # the ended job whose capture planned it (None: its own, or unplanned)
    late_free_s: float = 0.0              # the teardown's wait for its last bytes (Note [Late frees are not leaks])
    kept_by_caller_bytes: int = 0         # bytes of the variables its caller still holds (Note [Bytes the caller keeps])
    # validation and the saved sample: the most they took above the job's bytes, and the room admission
    # counted for them (Note [Work outside the steps, inside the allowance] in work_outside_steps.py)
    outside_steps_peak_bytes: int = 0
    outside_steps_allowance_bytes: int | None = None
    outside_steps_need_bytes: int = 0     # measured at the probe (one validation batch) and admitted

    @classmethod
    def of(cls, s: JobState) -> "JobRecord":
        window = [r.peak_bytes for r in s.training_records]
        return cls(
            name=s.name, status=s.status.value, error=s.error, error_type=s.error_type,
            traceback_path=s.traceback_path, steps=s.steps_done, steps_requested=s.job.steps, median_step_s=s.median_step_s,
            peak_pool_bytes=s.peak_bytes, training_peak_pool_bytes=s.training_peak_bytes,
            training_peak_spread_bytes=(max(window) - min(window)) if window else None,
            persistent_bytes=s.persistent_bytes, temporary_bytes=s.temporary_bytes,
            leaked_bytes=s.leaked_bytes, final_loss=finite_or_none(s.last_loss),
            losses=[finite_or_none(r.loss) for r in s.records], step_peak_bytes=[r.peak_bytes for r in s.records],
            step_seconds=[round(r.duration_s, 6) for r in s.records],
            arrived_at_s=s.arrived_at_s, waits=list(s.waits), admitted_at_s=s.admitted_at_s, ended_at_s=s.ended_at_s, weights_digest=s.weights_digest,
            validation=list(s.validation), model_path=s.model_path,
            checkpoints=list(s.checkpoints), plan=s.plan, plan_error=s.plan_error, plan_deferred=s.plan_deferred,
            captured_at_step=s.captured_at_step,
            times=s.times.to_dict(),
            plan_segments=plan_segments(s.records, s.plan_history), traced_step_from=s.traced_step_from,
            captured_from=s.captured_from,
            late_free_s=round(s.late_free_s, 4), kept_by_caller_bytes=s.kept_by_caller_bytes, outside_steps_peak_bytes=s.outside_steps_peak_bytes,
            outside_steps_allowance_bytes=s.outside_steps_allowance_bytes,
            outside_steps_need_bytes=s.outside_steps_need_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MemorySample:
    t_s: float
    pool_current: int
    jobs: dict[str, int]


@dataclass
class PoolRecord:
    """The pool over the run. ``peak`` is the whole run's (probes and
    planning included); ``training_peak`` the peak since the jobs probed at
    the start began training."""

    capacity: int
    peak: int
    training_peak: int
    current: int
    start_current: int               # bytes the pool held when the run started (the baseline)
    run_ooms: int
    stats: dict[str, Any]                # pool_stats() at the end, without "jobs" (C++ vocabulary)
    # allocations stitched from free pieces during the run (Note [Stitched allocations])
    run_stitched: int = 0
    nodegroup: dict[str, Any] | None = None   # NodeGroupCoordinator.summary()
    # what ran outside every job of the run, by the pool's stream ("default": eager work no job owns;
    # "parked:N": steps kept for reuse): {"peak_bytes" (since training began, as training_peak),
    # "bytes_at_end"} (issue 57: a job's validation once ran here, unseen)
    outside_jobs: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class TraceCoverage:
    """How much of the run the pool's event trace covers (Note [Trace
    coverage] in tensile_tf.reports.outputs)."""

    events_in_run: int        # alloc / free / sync / oom events the pool saw during the run
    events_kept: int          # of those, still in the pool's bounded trace at the end
    kept_from_s: float | None  # run time of the oldest kept event
    samples: int              # memory samples (the whole run, every sample_interval_s)
    how_to_keep_all: str = ("the per-job memory samples cover the whole run; for every pool event, "
                            "set TENSILE_POOL_TRACE_EVENTS to at least events_in_run")

    @property
    def events_dropped(self) -> int:
        return max(0, self.events_in_run - self.events_kept)


@dataclass
class SwapLinkRecord:
    """The swap link over the run (planner runs): tf_plugin.swap's stats."""

    bandwidth_bytes_per_s: int | None     # the emulated link's cap (None: none was set, as in a run before issue 57)
    bytes_out: int
    bytes_in: int
    late_swap_ins: int
    checked_swap_ins: int
    host_store_peak_bytes: int
    channel: dict[str, Any]
    host: dict[str, Any]
    #: Note [Links named for a device]: the device link's name, and in words what the link stands for
    device_link: str | None = None
    stands_for: str = ""
    #: Note [Lanes of a device link]: 1 (one transfer at a time) or 2 (a lane per direction), and the
    #: cap on both directions together (None: none)
    lanes: int = 1
    combined_bytes_per_s: float | None = None
    # what the planner planned the link for: the same bandwidth, or where the link is unlimited (None
    # above) PCIe 3 x16's 12 GiB/s (scheduler.planner.DEFAULT_BANDWIDTH_BYTES_PER_S; docs/planner.md)
    planned_bytes_per_s: float | None = None

    @classmethod
    def of(cls, bandwidth: int | None, stats: dict[str, Any], device_link: str | None = None,
           lanes: int = 1) -> "SwapLinkRecord":
        from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S

        channel, host = stats.get("channel", {}), stats.get("host", {})
        return cls(bandwidth, int(channel.get("bytes_out", 0)), int(channel.get("bytes_in", 0)),
                   int(channel.get("late_swap_ins", 0)), int(channel.get("checked_swap_ins", 0)),
                   int(host.get("peak", 0)), channel, host, device_link,
                   describe_swap_link(bandwidth, device_link, lanes), lanes,
                   channel.get("combined_bytes_per_s") or None,
                   float(bandwidth) if bandwidth else float(DEFAULT_BANDWIDTH_BYTES_PER_S))


@dataclass
class PlanSummary:
    """One Plan the run made (plan.json holds it whole)."""

    jobs: list[str]
    budget_bytes: int | None
    budget_met: bool
    predicted_pool_vanilla_peak_bytes: int
    predicted_pool_planned_peak_bytes: int
    predicted_sum_of_job_peaks_bytes: int
    predicted_msr: float
    bandwidth_bytes_per_s: float
    planning_s: float
    iterations: int
    stop_reason: str
    peak_model: str          # timeline | coincident | paired (config.PlanPeaks)
    swap_outs: dict[str, int]        # per job (a job's ``plan`` is the last plan it ran)
    recomputes: dict[str, int]
    # jobs of one graph planned as this many representatives (Note [Identical jobs planned by representatives]
    # in tensile_tf/scheduler/identical_jobs.py) on the fastest of their latency tables, which the slowest job's
    # table exceeds by this share (None: each on its own; Note [Jobs of one graph planned on their fastest latencies])
    representatives: int = 0
    latency_spread: float | None = None

    @classmethod
    def of(cls, plan) -> "PlanSummary":
        return cls(list(plan.jobs), plan.pool_bytes, plan.budget_met, plan.pool_vanilla_peak_bytes,
                   plan.pool_planned_peak_bytes, plan.sum_of_job_peaks_bytes, plan.msr,
                   plan.bandwidth_bytes_per_s, plan.planning_s, plan.iterations, plan.stop_reason,
                   plan.peak_model, {name: len(jp.swap_outs) for name, jp in plan.jobs.items()},
                   {name: len(jp.recomputes) for name, jp in plan.jobs.items()},
                   plan.representatives, plan.latency_spread)


@dataclass
class PlannerRecord:
    plans: list[PlanSummary]
    swap: SwapLinkRecord
    replans: list[ReplanRecord] = field(default_factory=list)
    drift_checks: list[DriftCheck] = field(default_factory=list)


@dataclass
class RunResult:
    """What ``JobHost.run()`` returns; ``results_document()`` is results.json."""

    capacity: int
    pool: PoolRecord
    jobs: list[JobState]
    samples: list[MemorySample]
    pool_events: list[dict[str, Any]]   # the pool's trace (C++ event dicts), oldest first
    started_at: float                   # time.time() at start
    wall_s: float
    trace_origin_ns: int                # steady-clock ns at the run's start (pool event times)
    trace: TraceCoverage
    most_jobs_running: int = 0          # the most jobs admission let train at once
    interrupted: str | None = None      # why the run was stopped early (a signal), None if it ran to its end
    planner: PlannerRecord | None = None
    plans: list[Any] = field(default_factory=list, repr=False)   # every scheduler.Plan made, in order
    settings: dict[str, Any] = field(default_factory=dict)   # the run's keys as resolved, and TENSILE_* in effect

    @property
    def failed_jobs(self) -> list[JobState]:
        return [s for s in self.jobs if s.status in (JobStatus.failed, JobStatus.rejected)]

    @property
    def status(self) -> str:
        """finished (every job finished), interrupted, or failed (a job
        failed, was rejected or stopped)."""
        if self.interrupted is not None:
            return "interrupted"
        return "finished" if all(s.status == JobStatus.finished for s in self.jobs) else "failed"

    def results_document(self) -> dict[str, Any]:
        trace = asdict(self.trace) | {"events_dropped": self.trace.events_dropped}
        return {
            "schema_version": SCHEMA_VERSION,
            "status": self.status,
            "interrupted": self.interrupted,
            "pool": asdict(self.pool),
            "wall_s": self.wall_s,
            "most_jobs_running": self.most_jobs_running,
            "trace": trace,
            "jobs": [JobRecord.of(s).to_dict() for s in self.jobs],
            "planner": asdict(self.planner) if self.planner is not None else None,
            "settings": self.settings,
        }
