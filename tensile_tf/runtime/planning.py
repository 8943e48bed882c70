"""TENSILE inside the host (``run.planner: tensile``): capture, plan, cold start.

One path for every caller: ``tensile run``, ``tensile plan`` (the host's
``plan_only``), ``--compare-vanilla``, the search driver and the benchmarks
all probe a job, capture it with ``execution.capture_for_planning``
(executor order, measured scratch bytes, profiled latencies) and plan it with
``execution.plan_captured`` for the budget ``start_budget`` gives. So the
plan ``tensile plan`` writes is the plan ``tensile run`` makes, and ``tensile
run --plan plan.json`` runs exactly that plan (``SavedPlan``).

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
pool's free bytes less a headroom (and at most ``plan_budget``; Note
[Cold-start headroom]). A cold capture sees no scratch bytes nor what the
executor's threads hold beside each op, so its predicted unplanned peak can
fit a pool its unplanned step just ran out of: the job is planned with
``PlannerJob.unplanned_step_ran_out``, and its plan runs in plan order even
with no swaps (``order_only``; Note [Free-running steps]); the flag stays
with the job, so its re-plans keep it in plan order too (its free-running
peak was never measured to fit). The small CNN of
cold_start_bench.py, with allocations that fail at once (``run.
allocation_wait_ms: 0``), was refused for a plan "with no swaps" before.
The planned step is then the probe: P and T are
measured on it, and admission uses them as they are. The start's joint plan
includes such jobs and leaves COLD_START_HEADROOM free when any of its jobs
was captured cold. A capture whose profiling steps run out of memory falls
back to the same cold capture. ``plan.cold_start`` marks such jobs in
results.json, ``plan.headroom`` the share of the free pool its planned
probe's plan left (the start's joint plan leaves the same).

Note [Cold-start headroom]
A cold plan times its swaps by predicted latencies, and its step can peak
above the plan's prediction: the deep MLP of tests/e2e/test_planner_run.py
measured up to 20% above it (transfers finishing later than guessed hold
their device copies longer). A fixed 25% headroom made every cold plan swap
for a quarter of the pool it did not use, and refused jobs that fit only
with less: the small CNN's plan saves at most 14% (issue 43). So the planned
probe measures what the guess cannot: the job is planned first with
POOL_HEADROOM (what any shared pool keeps free), and its planned probe runs
with the variables' snapshot kept; if that step runs out of memory, the
variables are written back, the host copies the failed step made are
dropped, and the job is planned again with COLD_START_HEADROOM; only if that
step fails too is the job refused. What ran is recorded: the headroom
(``plan.headroom``) and the probe's measured peak beside the plan's
prediction (``probe_plan_peak_bytes``, the job's first ``step_peak_bytes``).

Note [Captures a plan needs]
A capture runs the job's step about ten times (profiled, and chained in
plan order), on the run loop's thread and the cores the other jobs train on.
Where the pool holds every job as it runs, no plan changes a step, and the
capture, the plan made alone and its re-plans are work for nothing: on the
compute-bound CNN search of issue 58 (640 MiB pool, at most 4 trials) the
planned trials paid 25.9 s of captures, traced a step for each batch size
(Note [Reuse under a planner]) and ran at 0.78x the trials per hour of the
same search unplanned. So a job probed after the start (not one of the
start's jobs, planned together) is not captured when the pool holds,
unplanned, the jobs beside it, itself and as many more like it as may run at
once (``concurrency``, or the job source's own limit: a search's
``max_concurrent``, ``JobHost.run(jobs_at_most=)``), within ``plan_budget``
where one caps the jobs' bytes (``AdmissionControl.holds_the_limit_unplanned``):
no newcomer like it can need a plan while it runs. Its record says why
(``plan_deferred``); it runs its own step, outside every re-plan, counted
at its measured needs (``Arrivals.outside_replan_need``). A job the same
rule expects (from its predicted needs) to need no plan is traced for every
batch size, as without a planner, so trials of other batch sizes take its
step over; where it is captured after all, its step is traced again for its
own batch first (``traced_for_its_batch``). Where there is no limit, or the
pool would not hold as many like it, it is captured as before: on the
memory-bound io-mem search (20 MiB a trial unplanned, 48 MiB pool, 4 at
once) every trial is. On the CNN search, in pairs of runs of the same
commit: 7 of 12 trials deferred, captures 26.0 s -> 9.8-10.3 s, planned 832
and 808 trials/hour against 942 and 906 unplanned (0.88x, 0.89x; the code
before, the same hour: 0.80x); what was left was the captures of the trials a
plan may need (batches 512 and 1024: one cost about 16 steps' profiling),
now taken from their training steps where they fit when they start (Note
[Captures from training steps] in training_capture.py).

Note [Plans only for idle cores]
A plan buys room: more jobs at once than the pool holds unplanned. That room
pays only where another job adds throughput. Beside jobs that keep the cores
busy, one more shares the same cores and adds its build, its trace, its
capture, the joint plan and the running jobs' plan switches. A search driver
starts a trial beside busy cores on the chance of a gain (Note [Admitting by
marginal throughput] in core_meter.py: one start at a time, each measured),
and on the compute-bound CNN search of issue 58 (640 MiB pool, at most 4
trials) such starts were planned in: 4 trials at once where the pool holds 3
unplanned, at 0.91x the trials per hour of the search unplanned (909 and 875
against 999 and 957, alternated). So the host asks the job source's rule
(``JobHost.run(busy_for_a_plan=)``; a search driver's
``CoreAdmission.busy_for_a_plan``) before it
- plans a job in beside running ones (``Arrivals.plan_arrival``): only where
  the share of the cores the running jobs keep busy is below SATURATED, or
  starts to one more job gained the margin as often as a refusal needs.
  Otherwise the job waits for memory, as without a planner
  (``held_for_cores``; its wait says why), and is asked about again at every
  idle tick of the run loop (0.1 s) while it waits: the question is answered
  when it is asked, not when the job started (an earlier try kept the share
  each trial started on: the memory-bound io-mem search reads busy while its
  trials are set up, and its trials were held back for good);
- captures a job for such a plan (``AdmissionControl.holds_the_limit_unplanned``):
  the same question, the job counted at a running one's share (``newcomers``);
  the first job (nothing measured) is not captured. One not captured says why
  (``plan_deferred``); its step is traced for every batch size, to be taken over.
The share is the training share: the process's CPU time less the run loop
thread's (``thread_cpu_clock``: builds, traces, captures set jobs up and end);
counted in, they read the io-mem search's cores as busy while its trials wait
on their data half the time, and left 3-5 of 12 trials uncaptured (1.28x-1.33x
against 1.45x-1.53x). Figures: benchmarks/RESULTS.md (issue 58's rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import tensorflow as tf

from tensile_tf.config.device_links import DEVICE_LINKS, combined_bandwidth, device_link_bandwidth
from tensile_tf.config.schema import PlanOrder, PlanPeaks
from tensile_tf.pipeline import CapturedJob, JobToPlan, capture_cold, capture_for_planning, plan_captured
from tensile_tf.tf.rewrite import apply_plan
from tensile_tf.runtime.admission import POOL_HEADROOM
from tensile_tf.runtime.failures import summarize_error
from tensile_tf.runtime.records import JobState, PlanRecord
from tensile_tf.runtime.replan_timing import background_scope_for
from tensile_tf.runtime.training_capture import TrainingCapture, captured_in_time
from tensile_tf.scheduler import Plan
from tensile_tf.scheduler.link_bound import unplanned_peak_and_period
from tensile_tf.scheduler.peak_analysis import PAIRED_PEAKING_JOBS, UNPLANNED_PAIRED_PEAKING_JOBS
from tf_plugin.tf_internals import custom_gradient_names

# A cold-start plan's headrooms, tried in order (Note [Cold-start headroom]):
# the shared pool's, then the one that held the deep MLP's measured overshoot.
COLD_START_HEADROOM = 0.25
COLD_START_HEADROOMS = (POOL_HEADROOM, COLD_START_HEADROOM)


class SavedPlanMismatch(RuntimeError):
    """A plan.json given to ``tensile run --plan`` was made for other graphs."""


@dataclass
class SavedPlan:
    """A plan loaded from plan.json, applied instead of planning afresh."""

    plan: Plan
    path: str

    @classmethod
    def load(cls, path: str | Path) -> "SavedPlan":
        text = Path(path).read_text(encoding="utf-8")
        return cls(Plan.from_json(text), str(path))


@dataclass
class PlanningSettings:
    plan_peaks: PlanPeaks
    swap_bandwidth: int | None = None     # the link the planner plans for and the emulated link runs at
    plan_budget: int | None = None        # most bytes the start's joint plan may use
    saved_plan: SavedPlan | None = None
    plan_order: PlanOrder = PlanOrder.plan   # Note [Free-order plans] in tensile_tf.scheduler.peak_analysis
    plan_steps: str = "table_then_rewrite"   # run.plan_steps (Note [Plans read at run time] in tf_plugin/swap/plan_table.h)
    #: Note [Links named for a device]: the device link's name; swap_bandwidth is
    #: None until the first plan resolves it from the captured jobs
    device_link: str | None = None
    #: Note [Lanes of a device link]: the link's lanes (config.device_links.link_lanes), for the planner and C++
    link_lanes: int = 1
    #: Note [Captures from training steps]: a job that starts at once is captured by its thread
    capture_in_training: bool = True

    @property
    def combined_bytes_per_s(self) -> float | None:
        """The cap on both directions together (a device link's, on two lanes), or None."""
        return combined_bandwidth(self.device_link, self.swap_bandwidth, self.link_lanes)


class JobPlanning:
    """Captures and plans the host's jobs; keeps every Plan made."""

    def __init__(self, capacity: int, settings: PlanningSettings):
        self.capacity = capacity
        self.settings = settings
        self.plans: list[Plan] = []
        #: job -> what its last capture's predicted unplanned peak is made of (UnplannedPeaks, or None)
        self.unplanned_peaks: dict[str, object] = {}

    # --------------------------------------------------------- budgets

    def start_budget(self, built: Sequence[JobState], held_outside_jobs: int) -> int:
        """Bytes the start's joint plan may use: the pool less POOL_HEADROOM
        (when a job was captured cold: the headroom its planned probe ran
        with, else COLD_START_HEADROOM), at most plan_budget."""
        cold = [s for s in built if s.rt.captured is not None and s.rt.captured.cold]
        # Note [Cold-start headroom]: the headroom the cold jobs' planned probes ran with, if each ran one
        ran = [s.plan.headroom for s in cold if s.plan is not None and s.plan.headroom is not None]
        headroom = (max(ran) if len(ran) == len(cold) else COLD_START_HEADROOM) if cold else POOL_HEADROOM
        budget = int((self.capacity - held_outside_jobs) * (1 - headroom))
        return min(budget, self.settings.plan_budget) if self.settings.plan_budget is not None else budget

    def alone_budget(self, others_need: int, held_outside_jobs: int) -> int:
        """A job admitted after the start: what the running jobs leave, and at most what
        ``plan_budget`` (the combined peak's cap, as at the start) leaves beside their needs."""
        free = self.capacity - held_outside_jobs - others_need
        budget = int(max(0, free) * (1 - POOL_HEADROOM))
        if self.settings.plan_budget is not None:
            budget = min(budget, max(0, self.settings.plan_budget - others_need))
        return budget

    # ---------------------------------------------------------- capture

    @staticmethod
    def _to_plan(state: JobState) -> JobToPlan:
        spec = state.job.spec
        return JobToPlan(state.name, state.rt.step_fn, state.rt.first_batch, optimizer=state.rt.train.optimizer,
                         max_swapping_rate=spec.max_swapping_rate if spec is not None else 1.0,
                         start_offset_s=spec.start_offset_s if spec is not None else 0.0)

    def capture(self, state: JobState, slack: str | None = None, *, in_training: bool = False) -> None:
        """Traces and profiles a built, probed job, while the pool can still
        run its vanilla step (Note [Planning in the host]); none while the pool is
        ``slack`` (why it needs no plan: Note [Captures a plan needs]). ``in_training``:
        it starts now, unplanned, and its thread captures it from its training steps
        (Note [Captures from training steps] in training_capture.py)."""
        state.plan_deferred = slack
        if slack is not None:
            return   # a capture it took over stays with the step (rt.taken_capture), parked again at its end
        if self.capture_taken(state):
            return
        self.traced_for_its_batch(state)
        job = self._to_plan(state)
        if in_training and self.settings.capture_in_training and captured_in_time(state):
            state.rt.training_capture = TrainingCapture(job, self.settings.plan_order.value)
            return
        out_of_memory = False
        try:
            with state.rt.job_stream.eager_scope():
                state.rt.captured = capture_for_planning(job, step_order=self.settings.plan_order.value)
            self.unplanned_peaks[state.name] = state.rt.captured.unplanned_peaks   # for `tensile plan`
        except Exception as e:  # noqa: BLE001 - the job still runs, unplanned
            out_of_memory = isinstance(e.__cause__, tf.errors.ResourceExhaustedError)
            state.plan_error = summarize_error(e)
        if out_of_memory:
            # The profiling steps did not fit beside the others (or fragmented
            # the pool); they restored the variables they had changed. Plan
            # from the graph alone (Note [Cold-start planning]).
            self.capture_cold(state)

    @staticmethod
    def traced_for_its_batch(state: JobState) -> None:
        """Note [Captures a plan needs]: a step traced for every batch size (its job was expected
        to need no plan) is traced again for the job's own batch before it is captured: a capture
        of the batch-free trace would count its activations as nothing."""
        from tensile_tf.runtime.traced_step_reuse import batch_size_traced

        if getattr(state.rt.train, "input_specs", None) is not None:   # a Keras job's own specs (fit's shapes)
            return
        if batch_size_traced(state.rt.step_fn.get_concrete_function(*state.rt.first_batch)) is not None:
            return
        registered_before = custom_gradient_names()
        with state.rt.job_stream.eager_scope():
            step = state.rt.job_stream.step_function(state.rt.train.step_fn)
            step.get_concrete_function(*state.rt.first_batch)
        state.rt.step_fn = step
        state.rt.custom_gradients |= custom_gradient_names() - registered_before   # forgotten at its teardown

    def capture_taken(self, state: JobState) -> bool:
        """Note [Captures kept with the step] in traced_step_reuse.py: the capture parked with the
        step the job took over, as the job's own. False: it took over none (or it was used)."""
        taken, state.rt.taken_capture = state.rt.taken_capture, None
        if taken is None:
            return False
        state.rt.captured, state.captured_from = taken.for_job(state.name), taken.job.name
        self.unplanned_peaks[state.name] = state.rt.captured.unplanned_peaks
        return True

    def capture_cold(self, state: JobState) -> bool:
        """The graph alone, no step run (Note [Cold-start planning]). False if it failed."""
        try:
            self.traced_for_its_batch(state)
            with state.rt.job_stream.eager_scope():   # what timing its kernels alone allocates is the job's
                state.rt.captured = capture_cold(self._to_plan(state))
            state.plan_error = None
            return True
        except Exception as e:  # noqa: BLE001 - reported; the job runs unplanned or is rejected
            state.plan_error = summarize_error(e)
            return False

    def plan_cold(self, state: JobState, others_bytes: int, headroom: float = COLD_START_HEADROOM) -> bool:
        """Note [Cold-start planning]: plans a job whose vanilla probe ran out
        of memory, alone, for what the others leave less ``headroom`` (Note
        [Cold-start headroom]). True if its step now carries a plan that changes it."""
        budget = int(max(0, self.capacity - others_bytes) * (1 - headroom))
        if self.settings.plan_budget is not None:
            budget = min(budget, self.settings.plan_budget)
        if not self.capture_cold(state):
            return False
        # its unplanned step just ran out of memory here: it runs in plan order at least (Note [Cold-start planning])
        state.rt.captured.planner_job.unplanned_step_ran_out = True
        state.cold_planned = True
        if self.plan([state], budget) is None or state.rt.planned_step is None:
            state.cold_planned = False
            return False
        state.plan.headroom = headroom
        state.probe_plan_peak_bytes = state.plan.predicted_planned_peak_bytes
        state.planned_needs = None  # the planned probe measures them
        return True

    # ------------------------------------------------------------- plan

    def _saved_plan_for(self, captured: Sequence[CapturedJob]) -> Plan:
        saved = self.settings.saved_plan
        for c in captured:
            why = saved.plan.refusal(c.job.name, c.graph.fingerprint(), len(c.graph.ops))
            if why is not None:
                raise SavedPlanMismatch(f"{saved.path}: {why}; make a new plan with `tensile plan CONFIG`")
        return saved.plan

    def _resolve_device_link(self, captured: Sequence[CapturedJob]) -> None:
        """Note [Links named for a device]: once, at the first plan, the named link
        becomes bytes per second for the jobs captured, and the swap channel runs at it."""
        s = self.settings
        if s.device_link is None or s.swap_bandwidth is not None or not captured:
            return
        from tf_plugin import swap

        measured = [unplanned_peak_and_period(c.planner_job) for c in captured]
        s.swap_bandwidth = device_link_bandwidth(DEVICE_LINKS[s.device_link], [p for p, _ in measured],
                                                 [t for _, t in measured])
        swap.configure_swap_link(s.swap_bandwidth, s.link_lanes, s.combined_bytes_per_s)

    def plan_captured(self, captured: Sequence[CapturedJob], budget: int, current=None, on_step_made=None):
        """``execution.plan_captured`` with the run's settings (peak model,
        link): the start's plan, a later job's and every re-plan alike.
        ``current``: the jobs' planned steps now, reused where a re-plan
        rewrites a step the same way (Note [Re-plans users do not feel]);
        ``on_step_made(name, step)`` as each new step is made."""
        self._resolve_device_link(captured)
        peaks = self.settings.plan_peaks
        paired = peaks == PlanPeaks.paired   # Note [Paired peaks]
        return plan_captured(list(captured), pool_bytes=budget, bandwidth_bytes_per_s=self.settings.swap_bandwidth,
                             coincident_peaks=peaks != PlanPeaks.timeline,
                             peaking_jobs=PAIRED_PEAKING_JOBS if paired else None,
                             unplanned_peaking_jobs=UNPLANNED_PAIRED_PEAKING_JOBS if paired else None,
                             step_order=self.settings.plan_order.value, current=current, rewrite_unchanged=False,
                             on_step_made=on_step_made, plan_steps=self.settings.plan_steps,
                             link_lanes=self.settings.link_lanes,
                             combined_bytes_per_s=self.settings.combined_bytes_per_s)

    def plan(self, states: list[JobState], budget: int, *, saved_plan_allowed: bool = False) -> Plan | None:
        """TENSILE over ``states`` for ``budget`` pool bytes; each job's step
        becomes its planned step. Returns the Plan, or None if there was
        nothing to plan or planning failed (the reason in ``plan_error``).
        ``saved_plan_allowed``: apply the saved plan (``--plan``) instead of
        planning; raises SavedPlanMismatch if it was made for other graphs."""
        states = [s for s in states if s.rt.captured is not None]
        if not states:
            return None
        try:
            if saved_plan_allowed and self.settings.saved_plan is not None:
                plan = self._saved_plan_for([s.rt.captured for s in states])
                steps = {s.name: apply_plan(s.rt.step_fn, s.rt.example_args, plan.jobs[s.name], s.rt.captured.graph)
                         for s in states}
            else:
                plan, steps = self.plan_captured([s.rt.captured for s in states], budget)
        except SavedPlanMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - the jobs still run, unplanned
            why = summarize_error(e)
            for s in states:
                s.plan_error = why
            return None
        self.plans.append(plan)
        source = self.settings.saved_plan.path if saved_plan_allowed and self.settings.saved_plan else "planned"
        # Note [Plan segments]: its number in self.plans, and why it was made (the start's plan, plan_cold, plan_alone)
        reason = "start" if saved_plan_allowed else "cold start" if states[0].cold_planned else "planned alone"
        for s in states:
            self.adopt(s, plan, steps[s.name], budget, source, len(self.plans) - 1, reason)
        return plan

    @classmethod
    def adopt(cls, s: JobState, plan: Plan, step, budget: int, source: str, number: int | None = None,
              reason: str = "") -> None:
        """Makes ``step`` the job's step (if the plan changes it) and records
        the plan and the needs admission will use."""
        jp = plan.jobs[s.name]
        if jp.changes_step:
            with s.rt.job_stream.eager_scope():
                if s.rt.planned_step is not None:
                    s.rt.planned_step.restore()  # the old plan's variables back before the new plan
                step.evict()  # the first planned step starts as every later one
            s.rt.planned_step = step
            s.rt.step_fn = step
            if step.background is not None:   # Note [Table first, rewritten when ready], step 1; not for a job
                step.instantiate_in_background(background_scope_for(s, step))   # about to end (replan_timing.py)
        record, s.planned_needs = cls.plan_record(s, plan, step, budget, source)
        record.plan_number, record.reason = number, reason
        s.run_plan(record)   # Note [Plan segments]

    @staticmethod
    def plan_record(s: JobState, plan: Plan, step, budget: int, source: str) -> tuple[PlanRecord, tuple[int, int]]:
        """The job's PlanRecord under ``plan`` and the (P, T) admission will use."""
        jp = plan.jobs[s.name]
        # The predicted saving comes off the measured P + T (variables swapped
        # across iterations lower P itself). A cold-planned job's P and T were
        # measured on a planned step already: against that plan's prediction
        # (a re-plan may also need more than the probe's plan did).
        if s.cold_planned:
            saved = (s.probe_plan_peak_bytes - jp.planned_peak_bytes) if s.probe_plan_peak_bytes is not None else 0
        else:
            saved = max(0, jp.vanilla_peak_bytes - jp.planned_peak_bytes)
        p_bytes, t_bytes = s.persistent_bytes or 0, s.temporary_bytes or 0
        total = max(0, p_bytes + t_bytes - saved)
        if not s.cold_planned:
            # the probe measured one step; the prediction is the worst step the plan runs, beside
            # scratch that may meet (Note [Scratch that meets] in tensile_tf/tf/unplanned_peaks.py)
            total = max(total, jp.planned_peak_bytes)
        needs = (min(p_bytes, total), total - min(p_bytes, total))
        report = step.report
        record = PlanRecord(
            budget_bytes=budget, budget_met=plan.budget_met,
            predicted_vanilla_peak_bytes=jp.vanilla_peak_bytes, predicted_planned_peak_bytes=jp.planned_peak_bytes,
            predicted_msr=jp.msr, swap_outs=len(jp.swap_outs), swap_ins=len(jp.swap_ins),
            recomputes=len(jp.recomputes), planning_s=plan.planning_s, cold_start=s.rt.captured.cold,
            swapped_bytes_per_step=report.swapped_bytes_per_step, recomputed_ops=report.recomputed_ops,
            rewrite=report.to_dict(), source=source, order_only=jp.order_only,
            step_order=jp.step_order,
            headroom=s.plan.headroom if s.plan is not None and s.rt.captured.cold else None,
            unplanned_peaks=peaks.to_dict() if (peaks := getattr(s.rt.captured, "unplanned_peaks", None)) else None)
        getattr(getattr(step, "fn", None), "plan_records", []).append(record.rewrite)   # Note [Table first, rewritten when ready]
        return record, needs
