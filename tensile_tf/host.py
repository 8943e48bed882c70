"""JobHost: runs many training jobs at once in one process on the device pool.

Lifecycle, in order (the main thread does every step but the training loops):

1. ``submit(job)`` queues jobs; nothing runs yet.
2. ``run()`` first *probes* each job in submit order, serially, with no job
   thread running: build it (its variables land in its own pool stream),
   trace its step once (``jit_compile=False``) and run its first step. The
   step measures the job's persistent bytes P (variables, optimizer slots)
   and temporary peak T (activations; seed 002 calls these persistent and
   ephemeral memory).
3. Admission control (seed 002 §2.2, the Salus safety condition): a job runs
   only if, with it, sum(P) + max(T) over running jobs fits the pool less
   POOL_HEADROOM (``admission="sum"`` uses sum(T), safe for free-running
   jobs; ``"none"`` admits up to the concurrency limit). A probed job that does not fit yet is
   torn down (if it can be rebuilt) and queued with its measurement; a job
   whose P + T exceeds the pool, or whose first step runs out of memory with
   the pool otherwise empty, is rejected with the reason.
4. Admitted jobs train in their own threads, all at once (TensorFlow
   releases the GIL); each step is attributed to the job's stream.
5. When a job ends (finished, failed, NaN loss), the main thread tears it
   down: drops every reference, collects garbage, checks that its stream's
   bytes went back to zero, releases the stream, and admits queued jobs.

Failure isolation: an exception in one job (OOM included) marks that job
failed with its error; the others go on.

With ``planner="tensile"`` (Note [Planning in the host]) the jobs probed at
the start are planned together (seed 000: one plan, one swap link, for the
whole pool) and run their planned steps; admission then uses each job's
planned temporary bytes instead of its measured T.

Note [Planning in the host]
Every job is probed with its vanilla step first: the probe measures P and T
and, on the way, builds the optimizer's slots, so the traced step is the one
the plan rewrites. The jobs probed at the start of ``run()`` stay built and
are planned together for the pool's capacity less POOL_HEADROOM and, if the
plan meets that budget, admitted together on its prediction; a job
admitted later (queued, or from job_source) is planned alone for what the
running jobs leave (capacity - sum of their needs). The plan's predicted
saving for a job (its predicted vanilla peak - planned peak) is taken off
its measured T for admission. A job whose planning fails runs vanilla with
the reason in ``plan_error``. Before a planned job ends, variables its plan
keeps on the host between steps come back into the pool (``restore()``), so
weights read after the run are the real ones.

Note [Cold-start planning]
A job whose vanilla step does not fit what the pool has left cannot be
probed, profiled or planned the usual way, yet fitting it is what swapping
is for. With the planner on, the host snapshots the job's variables (host
copies) before its probe; if the probe runs out of memory it writes them
back (the failed step may have updated some), captures the traced graph
without running it (static sizes, no scratch bytes, op latencies from
``ColdStartLatency``: seed 000 §IV-A's cold start) and plans it alone for the
pool's free bytes less COLD_START_HEADROOM (and at most ``plan_budget``). The
planned step is then the probe: P and T are measured on it, and admission
uses them as they are. The start's joint plan includes such jobs and leaves
COLD_START_HEADROOM free when any of its jobs was captured cold (the jobs were
each planned alone for what the others' persistent memory left, not for
running together). A capture whose profiling steps run out of memory falls
back to the same cold capture. If it runs out of memory too, the job is queued or
rejected as any probe that does not fit. ``plan["cold_start"]`` marks such
jobs in results.json.
"""
from __future__ import annotations

import gc
import math
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Protocol

import tensorflow as tf

import tf_plugin
from tensile_tf.config import Admission
from tensile_tf.determinism import disable_graph_dependent_rewrites
from tensile_tf.jobs import Job, TrainStep
from tensile_tf.memory import JobStream, configure_pool, parse_bytes, pool_stats
from tensile_tf.tf_internals import custom_gradient_names, forget_custom_gradients


# Share of the pool that plans and admission leave free when jobs share it:
# chunks fragment (replayed steps needed 1.06-1.17x their peak bytes as arena,
# benchmarks/RESULTS.md "Fragmentation"), and the planner's peak prediction
# is within ~10-15% of what the pool measures. A job alone may use it all.
POOL_HEADROOM = 0.10
# A cold-start plan (Note [Cold-start planning]) times its swaps by guessed
# latencies: the deep MLP of tests/e2e/test_planner_run.py measured up to 20%
# above the plan's predicted peak (transfers finishing later than guessed hold
# their device copies longer). Its budget leaves this share free instead.
COLD_START_HEADROOM = 0.25
PLAN_PEAKS = ("timeline", "coincident", "paired")  # how jobs planned together overlap; see JobHost
_COLD_RETRY = object()  # _run_probe_step's answer: out of memory, plan cold and retry


class JobStatus(str, Enum):
    pending = "pending"      # submitted, not probed yet
    queued = "queued"        # waiting for memory
    running = "running"
    finished = "finished"
    stopped = "stopped"      # ended early by its on_step callback (e.g. pruned)
    failed = "failed"
    rejected = "rejected"    # can never fit the pool


_FINAL = frozenset({JobStatus.finished, JobStatus.stopped, JobStatus.failed, JobStatus.rejected})


class NonFiniteLoss(RuntimeError):
    """A job's loss became NaN or infinite and the job is configured to stop."""


@dataclass
class StepRecord:
    index: int
    start_s: float       # seconds since the run started
    duration_s: float
    loss: float


@dataclass
class JobState:
    """Everything the host knows about one job; plain data for reports."""

    job: Job
    status: JobStatus = JobStatus.pending
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    steps_done: int = 0
    records: list[StepRecord] = field(default_factory=list)
    persistent_bytes: int | None = None
    temporary_bytes: int | None = None
    peak_bytes: int = 0              # the job's own peak pool bytes
    training_peak_bytes: int | None = None  # its peak while training in its thread (see RunResult)
    leaked_bytes: int = 0            # bytes still attributed to it after teardown
    stream: int | None = None
    attempts: int = 0                # probes / builds
    admitted_at_s: float | None = None
    ended_at_s: float | None = None
    # Runtime objects, dropped at teardown.
    train: TrainStep | None = field(default=None, repr=False)
    step_fn: Callable | None = field(default=None, repr=False)
    job_stream: JobStream | None = field(default=None, repr=False)
    first_batch: tuple | None = field(default=None, repr=False)
    custom_gradients: set[str] = field(default_factory=set, repr=False)
    # TENSILE plan (planner="tensile"): a summary for reports, the needs it
    # gives admission, why planning failed; the planned step at runtime.
    plan: dict[str, Any] | None = None
    planned_needs: tuple[int, int] | None = None
    plan_error: str | None = None
    planned_step: Any = field(default=None, repr=False)
    captured: Any = field(default=None, repr=False)   # execution.CapturedJob of the current build
    cold_planned: bool = False    # planned before its step ever ran (Note [Cold-start planning])
    weights_digest: str | None = None    # sha256 of the final variables (record_weights=True)
    end_notified: bool = field(default=False, repr=False)  # on_end called

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def last_loss(self) -> float | None:
        return self.records[-1].loss if self.records else None

    @property
    def median_step_s(self) -> float | None:
        # Step 0 includes one-time work (first-call overheads); leave it out when we can.
        times = sorted(r.duration_s for r in self.records[1:] or self.records)
        return times[len(times) // 2] if times else None

    @property
    def measured(self) -> bool:
        return self.persistent_bytes is not None


class ProgressSink(Protocol):
    def update(self, state: JobState, pool: dict[str, Any]) -> None: ...


@dataclass
class MemorySample:
    t_s: float
    pool_current: int
    jobs: dict[str, int]


@dataclass
class RunResult:
    capacity: int
    # pool_stats() at the end; "peak" is the whole run's, "training_peak" the
    # peak since the jobs probed at the start began training (a job's
    # training_peak_bytes likewise; for a job probed later it includes its probe).
    pool: dict[str, Any]
    jobs: list[JobState]
    samples: list[MemorySample]
    pool_events: list[dict[str, Any]]
    started_at: float  # time.time() at start
    wall_s: float
    trace_origin_ns: int  # steady-clock ns at the run's start (pool event times)
    planner: dict[str, Any] | None = None  # planner="tensile": plans made and swap stats


def summarize_error(message: str, limit: int = 2000) -> str:
    """The informative part of an error message, on one line.

    TensorFlow's graph execution errors open with "Graph execution error:" and
    a Python stack of where the failing node was defined; the cause follows,
    then "[[{{node NAME}}]]". Keep the cause and the node.
    """
    cause, node = [], None
    for line in message.splitlines():
        text = line.strip()
        if not text or text == "Graph execution error:" or text.startswith("Detected at node") \
                or line.startswith("  File "):
            continue
        if text.startswith("[[{{node "):
            node = text[len("[[{{node "):].split("}}")[0]
            continue
        cause.append(text)
    summary = " ".join(cause[:4])
    if node:
        summary += f" (at node {node})"
    return summary[:limit]


def variables_digest(variables) -> str:
    """sha256 over the variables' dtypes, shapes and bytes, in order (not their
    names: a rebuilt model's variables get new unique names)."""
    import hashlib

    h = hashlib.sha256()
    for v in variables:
        value = v.numpy()
        h.update(f"{value.dtype}:{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def _plan_summary(plan) -> dict[str, Any]:
    return {"jobs": list(plan.jobs), "budget_bytes": plan.pool_bytes, "budget_met": plan.budget_met,
            "predicted_pool_vanilla_peak_bytes": plan.pool_vanilla_peak_bytes,
            "predicted_pool_planned_peak_bytes": plan.pool_planned_peak_bytes,
            "predicted_sum_of_job_peaks_bytes": plan.sum_of_job_peaks_bytes,
            "predicted_msr": plan.msr, "bandwidth_bytes_per_s": plan.bandwidth_bytes_per_s,
            "planning_s": plan.planning_s, "iterations": plan.iterations, "stop_reason": plan.stop_reason}


def _make_pipeline(kind: str, capacity: int, split_size: int | str, timeout_s: float):
    if kind in (None, "none"):
        return None
    if kind != "nodegroup":
        raise ValueError(f"JobHost: pipeline must be 'none' or 'nodegroup', got {kind!r}")
    from tensile_tf.pipeline import NodeGroupCoordinator
    split = split_size if split_size == "auto" else parse_bytes(split_size, what="split_size")
    return NodeGroupCoordinator(capacity, split, timeout_s=timeout_s)


class JobHost:
    """Runs jobs concurrently in one process on the shared device pool.

    >>> host = JobHost(pool_bytes="2GiB")
    >>> host.submit(Job.from_train_step("mine", TrainStep(step_fn, batches), steps=100))
    >>> result = host.run()
    """

    def __init__(self, pool_bytes: int | str | None = None, *, concurrency: int | None = None,
                 admission: Admission | str = Admission.salus, sample_interval_s: float = 0.05,
                 progress: ProgressSink | None = None, pipeline: str = "none",
                 split_size: int | str = "auto", barrier_timeout_s: float = 60.0,
                 planner: str = "none", swap_bandwidth: int | str | None = None,
                 plan_budget: int | str | None = None, plan_peaks: str | None = None,
                 record_weights: bool = False):
        self._ensure_pool(pool_bytes)
        if planner not in ("none", "tensile"):
            raise ValueError(f"JobHost: planner must be 'none' or 'tensile', got {planner!r}")
        if plan_peaks is None:  # the pipeline pairs the jobs; free-running jobs follow the timeline
            plan_peaks = "paired" if pipeline == "nodegroup" else "timeline"
        if plan_peaks not in PLAN_PEAKS:
            raise ValueError(f"JobHost: plan_peaks must be one of {', '.join(PLAN_PEAKS)}, got {plan_peaks!r}")
        self.planner = planner
        # Jobs planned together: for their time-aligned footprints, the sum of their
        # peaks (Note [Coincident peaks] in tensile_tf.scheduler.peak_analysis), or
        # every job's floor plus two peaks, as the node-group pipeline pairs them
        # (Note [Paired peaks]).
        self.plan_peaks = plan_peaks
        # The emulated swap link (bytes/s; None: unlimited). The planner assumes
        # this link, or PCIe 3.0 x16 when it is unlimited.
        self.swap_bandwidth = parse_bytes(swap_bandwidth, what="swap_bandwidth") if swap_bandwidth else None
        # Bytes the jobs planned at the start may use together (None: the
        # pool less POOL_HEADROOM).
        self.plan_budget = parse_bytes(plan_budget, what="plan_budget") if plan_budget else None
        self.record_weights = record_weights
        self.plans: list[Any] = []        # every Plan made, in order (scheduler.Plan)
        self._run_peak = 0                # pool peak of the start's probes and planning
        self.capacity = tf_plugin.device_pool().capacity
        # Node-group pipeline (seed 004): None unless pipeline == "nodegroup".
        self._pipeline = _make_pipeline(pipeline, self.capacity, split_size, barrier_timeout_s)
        if planner == "tensile" or self._pipeline is not None:
            # Rewritten steps must compute what the unplanned ones compute
            # (Note [Graph-dependent Grappler rewrites] in tensile_tf.determinism).
            disable_graph_dependent_rewrites()
        self.concurrency = concurrency
        self.admission = Admission(admission)
        self.sample_interval_s = sample_interval_s
        self.progress = progress
        self.states: list[JobState] = []
        self._events: queue.Queue[JobState] = queue.Queue()
        self._measured_by_signature: dict[str, tuple[int, int, int]] = {}
        self._t0 = time.perf_counter()

    @staticmethod
    def _ensure_pool(pool_bytes: int | str | None) -> None:
        if pool_bytes is None:
            return
        want = parse_bytes(pool_bytes, what="pool_bytes")
        pool = tf_plugin._plugin.device_pool()  # noqa: SLF001
        if pool is None:
            configure_pool(want)
        elif abs(pool.capacity - want) >= tf_plugin.MIN_CHUNK_BYTES:
            raise RuntimeError(
                f"JobHost: the device pool already exists with {tf_plugin.human_bytes(pool.capacity)}, "
                f"not the {tf_plugin.human_bytes(want)} asked for. A process has one pool: "
                "create the JobHost (or call tensile_tf.configure_pool) before the first TensorFlow op.")

    def submit(self, job: Job) -> JobState:
        if any(s.name == job.name for s in self.states):
            raise ValueError(f"JobHost: a job named {job.name!r} was already submitted")
        state = JobState(job=job)
        self.states.append(state)
        return state

    # ----------------------------------------------------------- main loop

    def run(self, job_source: Callable[[], Job | None] | None = None) -> RunResult:
        """Runs every submitted job; returns when all have ended.

        ``job_source``, if given, is asked for another job whenever no job is
        waiting and fewer than ``concurrency`` run; it returns a Job, or None
        for "nothing more now". The run ends when no job runs or waits and the
        source has nothing more (search drivers keep the pool full with it).
        """
        started_at = time.time()
        ooms_before = pool_stats()["num_ooms"]
        self._t0 = time.perf_counter()
        self._run_peak = 0
        tf_plugin.device_pool().reset_peak()
        if self.planner == "tensile":
            from tf_plugin import swap

            swap.set_swap_bandwidth(self.swap_bandwidth or 0)
            swap.reset_swap_stats()
        origin_ns = time.monotonic_ns()
        samples: list[MemorySample] = []
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(samples, stop_sampling),
                                   name="tensile-memory-sampler", daemon=True)
        sampler.start()
        running: dict[str, threading.Thread] = {}
        waiting: deque[JobState] = deque(self.states)
        try:
            # Probe every job serially before any job thread starts.
            admitted: list[JobState] = []
            planning = self.planner == "tensile"
            for state in list(waiting):
                waiting.popleft()
                self._probe(state, admitted, keep_built=planning)
                if state.status == JobStatus.running:
                    admitted.append(state)
                elif state.status == JobStatus.queued:
                    waiting.append(state)
                self._report(state)
                self._ended(state)
            if planning:
                admitted = self._plan_initial(waiting)
            # Peaks from here on are the training's (probing and planning run vanilla steps).
            self._run_peak = tf_plugin.device_pool().stats()["peak"]
            tf_plugin.device_pool().reset_peak()
            for state in admitted:
                self._start_thread(state, running)
            while True:
                self._pull_jobs(job_source, waiting, running)
                if not (running or waiting):
                    break
                if not running and waiting:
                    self._admit_waiting(waiting, running)
                    if not running:
                        break
                try:
                    ended = self._events.get(timeout=0.25)
                except queue.Empty:
                    for state in self.states:
                        if state.status == JobStatus.running:
                            self._report(state)
                    continue
                running.pop(ended.name).join()
                self._teardown(ended)
                self._report(ended)
                self._ended(ended)
                self._admit_waiting(waiting, running)
        finally:
            stop_sampling.set()
            sampler.join()
        for state in waiting:  # could not be admitted even when alone
            state.status = JobStatus.rejected
            state.error = state.error or "never fit the pool"
            self._ended(state)
        wall = time.perf_counter() - self._t0
        pool = pool_stats()
        pool["training_peak"] = pool["peak"]  # since the jobs probed at the start began training
        pool["peak"] = max(pool["peak"], self._run_peak)
        pool["run_ooms"] = pool["num_ooms"] - ooms_before  # num_ooms counts since the process began
        if self._pipeline is not None:
            pool["nodegroup"] = self._pipeline.summary()
        planner = None
        if self.planner == "tensile":
            from tf_plugin import swap

            planner = {"swap_bandwidth": self.swap_bandwidth, "swap": swap.swap_stats(),
                       "plans": [_plan_summary(p) for p in self.plans]}
        return RunResult(capacity=self.capacity, pool=pool, jobs=list(self.states),
                         samples=samples, pool_events=tf_plugin.device_pool().trace(),
                         started_at=started_at, wall_s=wall, trace_origin_ns=origin_ns, planner=planner)

    # ------------------------------------------------------------- planning

    def _plan_initial(self, waiting: deque) -> list[JobState]:
        """Plans the built, probed jobs together; admits those that fit with
        their planned needs, in submit order; tears down the rest."""
        built = [s for s in waiting if s.train is not None]
        plan = None
        if built:
            # A cold capture among them (Note [Cold-start planning]): its guessed
            # latencies need the larger headroom.
            cold = any(s.captured is not None and s.captured.cold for s in built)
            headroom = COLD_START_HEADROOM if cold else POOL_HEADROOM
            budget = int((self.capacity - self._reserved_by_others()) * (1 - headroom))
            if self.plan_budget is not None:
                budget = min(budget, self.plan_budget)
            plan = self._plan(built, budget)
        # A plan that met its budget is the admission prediction for the jobs
        # in it (their combined peak over time, not the sum of their peaks).
        jointly = set(plan.jobs) if plan is not None and plan.budget_met else set()
        admitted: list[JobState] = []
        for state in built:
            room = self.concurrency is None or len(admitted) < self.concurrency
            if (state.name in jointly and room) or self._fits(state, admitted):
                waiting.remove(state)
                admitted.append(state)
            elif state.job.rebuildable:
                self._teardown(state)
        return admitted

    def _plan_alone(self, state: JobState, alongside: list[JobState]) -> None:
        """Plans a job admitted after the start for what the running jobs leave."""
        needs = [self._predict(s) or (0, 0) for s in alongside if s is not state]
        free = self.capacity - self._reserved_by_others() - sum(p + t for p, t in needs)
        self._plan([state], int(max(0, free) * (1 - POOL_HEADROOM)))

    def _capture(self, state: JobState) -> None:
        """Traces and profiles a built, probed job for planning, while the pool
        can still run its vanilla step (Note [Planning in the host])."""
        from tensile_tf.execution import JobToPlan, capture_cold, capture_for_planning

        job = JobToPlan(state.name, state.step_fn, state.first_batch, optimizer=state.train.optimizer)
        out_of_memory = False
        try:
            with state.job_stream.eager_scope():
                state.captured = capture_for_planning(job)
        except Exception as e:  # noqa: BLE001 - the job still runs, unplanned
            out_of_memory = isinstance(e.__cause__, tf.errors.ResourceExhaustedError)
            state.plan_error = summarize_error(getattr(e, "message", None) or str(e)) or type(e).__name__
        if out_of_memory:
            # The profiling steps did not fit beside the others (or fragmented
            # the pool); they restored the variables they had changed. Plan
            # from the graph alone (Note [Cold-start planning]).
            try:
                state.captured = capture_cold(job)
                state.plan_error = None
            except Exception as e:  # noqa: BLE001
                state.plan_error = summarize_error(str(e)) or type(e).__name__

    def _plan(self, states: list[JobState], budget: int):
        """TENSILE over ``states`` for ``budget`` pool bytes; each job's step
        becomes its planned step (Note [Planning in the host]). Returns the
        Plan, or None if there was nothing to plan or planning failed."""
        from tensile_tf.execution import plan_captured

        states = [s for s in states if s.captured is not None]
        if not states:
            return None
        try:
            plan, steps = plan_captured([s.captured for s in states], pool_bytes=budget,
                                        bandwidth_bytes_per_s=self.swap_bandwidth,
                                        coincident_peaks=self.plan_peaks != "timeline",
                                        peaking_jobs=2 if self.plan_peaks == "paired" else None)
        except Exception as e:  # noqa: BLE001 - the jobs still run, unplanned
            why = summarize_error(getattr(e, "message", None) or str(e)) or type(e).__name__
            for s in states:
                s.plan_error = why
            return None
        self.plans.append(plan)
        for s in states:
            jp, step = plan.jobs[s.name], steps[s.name]
            if jp.swap_outs or jp.swap_ins or jp.recomputes:
                with s.job_stream.eager_scope():
                    if s.planned_step is not None:
                        s.planned_step.restore()  # the old plan's variables back before the new plan
                    step.evict()  # the first planned step starts as every later one
                s.planned_step = step
                s.step_fn = step
            # else: nothing to do for this job; it keeps its own step.
            # The predicted saving comes off the measured P + T (variables swapped
            # across iterations lower P itself).
            # (A cold-planned job's P and T were measured on a planned step already.)
            saved = 0 if s.cold_planned else max(0, jp.vanilla_peak_bytes - jp.planned_peak_bytes)
            p_bytes, t_bytes = s.persistent_bytes or 0, s.temporary_bytes or 0
            total = max(0, p_bytes + t_bytes - saved)
            s.planned_needs = (min(p_bytes, total), total - min(p_bytes, total))
            s.plan = {
                "budget_bytes": budget,
                "budget_met": plan.budget_met,
                "predicted_vanilla_peak_bytes": jp.vanilla_peak_bytes,
                "predicted_planned_peak_bytes": jp.planned_peak_bytes,
                "predicted_msr": jp.msr,
                "swap_outs": len(jp.swap_outs),
                "swap_ins": len(jp.swap_ins),
                "recomputes": len(jp.recomputes),
                "planning_s": plan.planning_s,
                "cold_start": s.captured.cold,
                "rewrite": step.report.to_dict(),
            }
        return plan

    def _pull_jobs(self, job_source, waiting: deque, running: dict) -> None:
        """Takes new jobs from job_source while there is room, and admits them."""
        if job_source is None:
            return
        while not waiting and (self.concurrency is None or len(running) < self.concurrency):
            job = job_source()
            if job is None:
                return
            waiting.append(self.submit(job))
            self._admit_waiting(waiting, running)

    def _ended(self, state: JobState) -> None:
        """Calls the job's on_end once, when it reached a final status (also
        for jobs failed or rejected while probing, or never admitted)."""
        if state.end_notified or state.status not in _FINAL:
            return
        state.end_notified = True
        if state.job.on_end is not None:
            try:
                state.job.on_end(state)
            except Exception as e:  # noqa: BLE001 - a callback must not stop the host
                state.error = (state.error or "") + f" [on_end callback failed: {e!r}]"

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _report(self, state: JobState) -> None:
        if self.progress is not None:
            self.progress.update(state, pool_stats())

    def _sample(self, samples: list[MemorySample], stop: threading.Event) -> None:
        pool = tf_plugin.device_pool()
        while True:
            s = pool.stats()
            samples.append(MemorySample(self._now(), s["current"],
                                        {name: j["current"] for name, j in s["jobs"].items()}))
            if stop.wait(self.sample_interval_s):
                return

    # ---------------------------------------------------------- admission

    def _reserved_by_others(self) -> int:
        """Pool bytes held outside every job (eager tensors, stray state)."""
        return pool_stats()["jobs"].get("default", {}).get("current", 0)

    def _fits(self, state: JobState, alongside: list[JobState]) -> bool:
        group = [s for s in alongside if s is not state] + [state]
        if self.concurrency is not None and len(group) > self.concurrency:
            return False
        if self.admission == Admission.none:
            return True
        needs = [self._predict(s) or (0, 0) for s in group]
        persistent = sum(p for p, _ in needs)
        temps = [t for _, t in needs]
        temporary = max(temps) if self.admission == Admission.salus else sum(temps)
        room = self.capacity - self._reserved_by_others()
        if len(group) > 1:
            room = int(room * (1 - POOL_HEADROOM))
        return persistent + temporary <= room

    @staticmethod
    def _signature(state: JobState) -> str | None:
        """What makes two YAML jobs' memory comparable: all but batch size and scalars."""
        spec = state.job.spec
        if spec is None:
            return None
        return spec.model_dump_json(include={"model", "input_shape", "classes", "data", "loss"}) + \
            spec.optimizer.name

    def _predict(self, state: JobState) -> tuple[int, int] | None:
        """(P, T) measured, else scaled from a measured job of the same signature.

        Temporary memory scales with the batch; persistent memory is taken as
        the larger of the two (synthetic batches grow with it too), so the
        prediction errs on the safe side.
        """
        if state.planned_needs is not None:
            return state.planned_needs
        if state.measured:
            return state.persistent_bytes, state.temporary_bytes
        sig = self._signature(state)
        ref = self._measured_by_signature.get(sig) if sig else None
        if ref is None:
            return None
        batch, p, t = ref
        scale = state.job.spec.batch_size / batch
        return int(p * max(1.0, scale)), int(t * scale)

    def _never_fits(self, state: JobState) -> bool:
        return (state.persistent_bytes or 0) + (state.temporary_bytes or 0) > self.capacity

    def _admit_waiting(self, waiting: deque, running: dict) -> None:
        """Starts queued jobs that fit now, in submit order (later small jobs may pass)."""
        for state in list(waiting):
            active = [s for s in self.states if s.status == JobStatus.running]
            if self.concurrency is not None and len(active) >= self.concurrency:
                return
            if not state.measured:
                # Probing runs a step. With nothing running, nothing can be
                # disturbed; otherwise only a job whose predicted needs fit.
                predicted = self._predict(state) is not None
                if running and not (predicted and self._fits(state, active)):
                    continue
                waiting.remove(state)
                self._probe(state, active)
                if state.status == JobStatus.running:
                    self._start_thread(state, running)
                elif state.status == JobStatus.queued:
                    waiting.append(state)
                self._report(state)
                self._ended(state)
                continue
            if not self._fits(state, active):
                continue
            waiting.remove(state)
            if state.train is None and not self._build(state):
                if state.status == JobStatus.queued:
                    waiting.append(state)
                self._report(state)
                self._ended(state)
                continue
            if self.planner == "tensile" and state.planned_step is None:
                self._capture(state)
                self._plan_alone(state, active)
            self._start_thread(state, running)

    # ------------------------------------------------- probe, build, teardown

    def _build(self, state: JobState) -> bool:
        """Builds and traces the job under its own stream. False if it failed."""
        state.attempts += 1
        state.job_stream = JobStream(state.name)
        state.stream = state.job_stream.stream
        state.records.clear()
        state.steps_done = 0
        registered_before = custom_gradient_names()
        failed = False
        try:
            with state.job_stream.eager_scope():
                state.train = state.job.build()
                transform = self._pipeline.graph_transform(state.name, state.stream) if self._pipeline else None
                state.step_fn = state.job_stream.step_function(state.train.step_fn, graph_transform=transform)
                state.first_batch = state.train.next_batch()
                state.step_fn.get_concrete_function(*state.first_batch)  # trace once, here, serially
        except tf.errors.ResourceExhaustedError as e:
            # Building (variables, optimizer slots) ran out of pool memory.
            if any(s.train is not None and s is not state for s in self.states):
                state.status = JobStatus.queued  # others hold memory: try again later
            else:
                self._fail(state, e, status=JobStatus.rejected)
            failed = True
        except Exception as e:  # noqa: BLE001 - a bad job must not stop the host
            self._fail(state, e)
            failed = True
        # See Note [Custom gradients keep traced jobs alive] in tf_internals.
        state.custom_gradients |= custom_gradient_names() - registered_before
        if failed:
            # Outside the except block: its traceback would keep the job's objects alive.
            self._teardown(state)
        return not failed

    def _probe(self, state: JobState, alongside: list[JobState], *, keep_built: bool = False) -> None:
        """Build, trace, run step 1 measuring P and T; then admit, queue or reject.

        ``keep_built``: leave a measured job built and queued, admission to
        follow once the start's jobs are planned together."""
        if not self._build(state):
            return
        stream = state.job_stream
        pool = tf_plugin.device_pool()
        # The stream is new (built just now), so its peak is this build's and
        # this probe's: no pool-wide reset needed (it would hide others' peaks).
        before = stream.stats()["current"]
        # Note [Cold-start planning]: with the planner on, a vanilla probe that
        # runs out of memory is retried with a plan made without running the step.
        snapshot = self._snapshot_variables(state) if self.planner == "tensile" else None
        outcome = self._run_probe_step(state, out_of_memory=_COLD_RETRY if snapshot is not None else None)
        if outcome is _COLD_RETRY:
            outcome = self._probe_cold_planned(state, snapshot)
        del snapshot
        if outcome is not None:
            # Outside the except blocks: a live traceback would keep the job's objects alive.
            state.status = outcome
            self._teardown(state)
            return
        after = stream.stats()
        state.persistent_bytes = after["current"]
        state.temporary_bytes = max(0, after["peak"] - max(before, after["current"]))
        sig = self._signature(state) if not state.cold_planned else None  # planned bytes: not a vanilla job's
        if sig is not None:
            self._measured_by_signature[sig] = (state.job.spec.batch_size, state.persistent_bytes,
                                                state.temporary_bytes)
        if self._never_fits(state):
            self._fail(state, RuntimeError(
                f"needs {tf_plugin.human_bytes(state.persistent_bytes)} persistent + "
                f"{tf_plugin.human_bytes(state.temporary_bytes)} temporary, more than the pool's "
                f"{tf_plugin.human_bytes(self.capacity)}; raise the pool or lower the batch size"),
                status=JobStatus.rejected)
            self._teardown(state)
            return
        if state.steps_done >= state.job.steps:
            state.status = JobStatus.finished
            self._teardown(state)
            return
        if self.planner == "tensile" and not state.cold_planned:
            self._capture(state)
        if keep_built:
            state.status = JobStatus.queued
            return
        if self._fits(state, alongside):
            if self.planner == "tensile" and not state.cold_planned:
                self._plan_alone(state, alongside)
            state.status = JobStatus.running
            return
        state.status = JobStatus.queued
        if state.job.rebuildable:
            self._teardown(state)

    @staticmethod
    def _snapshot_variables(state: JobState):
        """Host copies of the job's variables (restores them), or None."""
        from tensile_tf.capture import snapshot_variables

        try:
            return snapshot_variables(state.step_fn.get_concrete_function(*state.first_batch).graph)
        except Exception:  # noqa: BLE001 - no snapshot: an OOM probe is then not retried
            return None

    def _probe_cold_planned(self, state: JobState, restore_variables) -> JobStatus | None:
        """Note [Cold-start planning]: the vanilla probe ran out of memory. Undo
        what the failed step wrote, plan the job from its traced graph alone for
        the memory the pool has left, and probe with the planned step. Returns
        None on success (P and T are then the planned step's), else the probe's
        outcome (queued or rejected, as for an OOM probe; failed)."""
        from tensile_tf.execution import JobToPlan, capture_cold

        restore_variables()
        gc.collect()  # whatever the failed step's frames still held
        stream = state.job_stream
        others = tf_plugin.device_pool().stats()["current"] - stream.stats()["current"]
        budget = int(max(0, self.capacity - others) * (1 - COLD_START_HEADROOM))
        if self.plan_budget is not None:
            budget = min(budget, self.plan_budget)
        job = JobToPlan(state.name, state.step_fn, state.first_batch, optimizer=state.train.optimizer)
        try:
            state.captured = capture_cold(job)
        except Exception as e:  # noqa: BLE001 - reported; the job cannot run vanilla either
            state.plan_error = summarize_error(str(e)) or type(e).__name__
        state.cold_planned = True
        if state.captured is None or self._plan([state], budget) is None or state.planned_step is None:
            state.cold_planned = False
            if any(s.train is not None and s is not state for s in self.states):
                return JobStatus.queued  # as for any probe that does not fit beside others
            self._fail(state, RuntimeError(
                f"its first step ran out of pool memory and no cold-start plan could be applied "
                f"({state.plan_error or 'the plan has no swaps or recomputation'}); raise the pool or lower "
                "the batch size"), status=JobStatus.rejected)
            return JobStatus.rejected
        state.planned_needs = None  # the planned probe measures them
        stream.reset_peak()
        return self._run_probe_step(state)

    def _run_probe_step(self, state: JobState, *, out_of_memory: Any = None) -> Any:
        """Runs the job's first step. Returns None if it ran; else what became
        of the job: queued (out of memory while others hold memory: try again
        later), rejected (out of memory alone), failed; or ``out_of_memory``,
        if given, when the step ran out of memory."""
        try:
            with state.job_stream.eager_scope():
                self._run_step(state, state.first_batch)
        except tf.errors.ResourceExhaustedError as e:
            if out_of_memory is not None:
                return out_of_memory
            if any(s.train is not None and s is not state for s in self.states):
                return JobStatus.queued  # try again when the pool is emptier
            self._fail(state, e, status=JobStatus.rejected)
            return JobStatus.rejected
        except Exception as e:  # noqa: BLE001 - a bad job must not stop the host
            self._fail(state, e)
            return JobStatus.failed
        return None

    def _run_step(self, state: JobState, batch: tuple) -> None:
        start = self._now()
        t = time.perf_counter()
        loss = state.step_fn(*batch)
        value = float(tf.reduce_mean(loss)) if loss is not None else math.nan
        duration = time.perf_counter() - t
        state.records.append(StepRecord(state.steps_done, start, duration, value))
        state.steps_done += 1
        stats = state.job_stream.stats()
        state.peak_bytes = max(state.peak_bytes, stats.get("peak", 0))
        if state.job.stop_on_nan and not math.isfinite(value):
            raise NonFiniteLoss(f"job {state.name!r}: loss became {value} at step {state.steps_done - 1}; "
                                "lower the learning rate, or set stop_on_nan: false")

    def _start_thread(self, state: JobState, running: dict) -> None:
        state.status = JobStatus.running
        state.admitted_at_s = self._now()
        if self._pipeline is not None:
            self._pipeline.job_started(state.name, state.stream, state.persistent_bytes, state.temporary_bytes)
        thread = threading.Thread(target=self._train, args=(state,), name=f"job-{state.name}", daemon=True)
        running[state.name] = thread
        thread.start()

    def _train(self, state: JobState) -> None:
        """A job's thread: its remaining steps. Never raises."""
        try:
            with state.job_stream.eager_scope():
                status = JobStatus.finished
                while state.steps_done < state.job.steps:
                    first = state.steps_done == 0 and state.first_batch is not None
                    self._run_step(state, state.first_batch if first else state.train.next_batch())
                    if state.job.on_step is not None and state.job.on_step(state) is False:
                        status = JobStatus.stopped
                        break
                if state.planned_step is not None:
                    state.planned_step.restore()  # variables the plan keeps on the host
                if self.record_weights:
                    optimizer_vars = list(getattr(state.train.optimizer, "variables", None) or [])
                    state.weights_digest = variables_digest([*state.train.variables, *optimizer_vars])
            state.status = status
        except BaseException as e:  # noqa: BLE001 - isolate the failure to this job
            self._fail(state, e)
        finally:
            state.ended_at_s = self._now()
            if self._pipeline is not None:  # release the barriers others wait at, at once
                self._pipeline.job_ended(state.name, state.stream)
            self._events.put(state)

    def _fail(self, state: JobState, error: BaseException, status: JobStatus = JobStatus.failed) -> None:
        state.status = status
        state.error_type = type(error).__name__
        message = getattr(error, "message", None) or str(error)
        state.error = summarize_error(message) or state.error_type
        state.traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-8000:]
        state.ended_at_s = self._now()

    def _teardown(self, state: JobState) -> None:
        """Drops the job's objects; its pool bytes must return to zero."""
        stream = state.job_stream
        planned, state.planned_step = state.planned_step, None
        state.captured = None  # a rebuild traces new ops; it is captured and planned again
        state.cold_planned = False
        state.planned_needs = None
        if planned is not None:
            from tf_plugin import swap

            try:  # variables left on the host by a failed step: back, then dropped with the job
                planned.restore()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
            swap.drain_swap_channel()
            if stream is not None:
                swap.release_stream_host_copies(stream.stream)  # activation copies a failed step left
            del planned
        state.train = None
        state.step_fn = None
        state.first_batch = None
        if state.status in (JobStatus.finished, JobStatus.stopped, JobStatus.failed, JobStatus.rejected):
            state.job.forget()
        forget_custom_gradients(state.custom_gradients)
        state.custom_gradients = set()
        if stream is None:
            return
        if self._pipeline is not None:
            self._pipeline.job_ended(state.name, state.stream)
        gc.collect()
        stats = stream.stats()
        state.peak_bytes = max(state.peak_bytes, stats.get("peak", 0))
        if state.admitted_at_s is not None:
            state.training_peak_bytes = stats.get("peak", 0)
        state.leaked_bytes = stats.get("current", 0)
        stream.release()
        state.job_stream = None
