"""Building, probing and tearing down a job (the main thread does all three,
serially, while no other job builds).

* ``build``: the job's model, optimizer and data under its own pool stream;
  its step traced once (``jit_compile=False``), with the node-group barriers
  when the pipeline is on.
* ``probe``: build, run the first step and measure persistent bytes P
  (variables, optimizer slots) and temporary peak T (activations; seed 002
  calls them persistent and ephemeral memory), then say whether the job can
  run now (``ProbeOutcome``). With the planner on, a probe that runs out of
  memory is retried with a cold-start plan (Note [Cold-start planning] in
  planning.py) and a probed job is captured for planning.
* ``teardown``: drop every reference, collect garbage, check that the
  stream's bytes went back to zero, release the stream.
"""
from __future__ import annotations

import gc
from enum import Enum
from typing import Callable, Sequence

import tensorflow as tf

import tf_plugin
from tensile_tf.jobs.job import JobDoesNotFit
from tensile_tf.tf.pool import JobStream, host_fallback_scope, pool_stats
from tensile_tf.runtime.admission import AdmissionControl
from tensile_tf.runtime.failures import record_failure, total_need
from tensile_tf.runtime.job_thread import RunClock, run_step, variables_on_device
from tensile_tf.runtime.nodegroup import SPLIT_PROBE_RUNS, NodeGroupCoordinator
from tensile_tf.runtime.planning import COLD_START_HEADROOMS, JobPlanning
from tensile_tf.runtime.job_runtime import JobProgress, JobRuntime
from tensile_tf.runtime.records import FINAL_STATUSES, JobState, JobStatus
from tensile_tf.runtime.teardown_memory import CallerObjects, collect_garbage, wait_for_late_frees
from tensile_tf.runtime.traced_step_reuse import TracedStepShelf, trace_step
from tensile_tf.runtime.work_outside_steps import admitted_temporary_bytes, attribute_validation, measure_at_probe
from tf_plugin.tf_internals import custom_gradient_names, forget_custom_gradients


class ProbeOutcome(str, Enum):
    run = "run"              # measured; may start now
    hold = "hold"            # measured and kept built (the start's jobs, planned together next)
    queued = "queued"        # does not fit yet; try again when memory frees
    ended = "ended"          # failed, rejected or already finished


class _OutOfMemory(Exception):
    """The probe step ran out of pool memory (internal signal)."""


class JobLifecycle:
    def __init__(self, states: list[JobState], clock: RunClock, admission: AdmissionControl,
                 held_outside_jobs: Callable[[], int], *, pipeline: NodeGroupCoordinator | None,
                 planning: JobPlanning | None, shelf: TracedStepShelf | None = None):
        self.states = states
        self.shelf = shelf   # Note [Reusing a finished job's traced step] (traced_step_reuse.py)
        self.clock = clock
        self.admission = admission
        self.held_outside_jobs = held_outside_jobs
        self.pipeline = pipeline
        self.planning = planning

    def _others_built(self, state: JobState) -> bool:
        return any(s.rt.train is not None and s is not state for s in self.states)

    def fail(self, state: JobState, error: BaseException, status: JobStatus = JobStatus.failed,
             preface: str = "") -> None:
        record_failure(state, error, self.clock.now(), status, preface)

    # ------------------------------------------------------------ build

    def build(self, state: JobState, alongside: Sequence[JobState] | None = None) -> bool:
        """Builds and traces the job under its own stream (for every batch size where it may park
        and, beside ``alongside``, is expected to need no plan). False if it failed
        (then queued, if others hold the memory it lacked, else failed or rejected)."""
        state.attempts += 1
        parked = self.shelf.take(state) if self.shelf is not None else None
        state.rt.job_stream = parked.stream if parked is not None else JobStream(state.name)
        taken = [parked] if parked is not None else []   # the only reference, handed to _take_over
        del parked
        state.stream = state.rt.job_stream.stream
        state.traced_step_from = state.captured_from = None
        state.records.clear()
        state.validation.clear()
        state.steps_done = 0
        state.progress, state.progress_step_s = JobProgress(), []
        registered_before = custom_gradient_names()
        failed = False
        beside_others = self._others_built(state)
        try:
            # Note [Host fallback while building]: beside running jobs the pool
            # may be full; an allocation it cannot serve must not crash TF's
            # constant folding. Any fallback means the build did not fit.
            state.times.wait_ends()   # arrival_wait (Note [Where a trial's time goes])
            with state.rt.job_stream.eager_scope(), host_fallback_scope() as fell_back:
                with state.times.timed("build"):
                    state.rt.train = state.job.build()
                    state.rt.first_batch = state.rt.train.next_batch()
                with state.times.timed("trace"):
                    if taken:
                        self._take_over(state, taken.pop())
                    if state.traced_step_from is None:
                        transform = self.pipeline.graph_transform(state.name, state.stream) if self.pipeline else None
                        state.rt.step_fn = state.rt.job_stream.step_function(state.rt.train.step_fn, graph_transform=transform)
                        no_plan = alongside is not None and self.admission.holds_the_limit_unplanned(
                            state, alongside, self.held_outside_jobs()) is not None   # Note [Captures a plan needs]
                        trace_step(state.rt.step_fn, state.rt.first_batch,   # once, here, serially
                                   any_batch=self.shelf is not None and self.shelf.traces_any_batch(state, no_plan),
                                   input_specs=getattr(state.rt.train, "input_specs", None))
                    attribute_validation(state, state.rt.job_stream)   # its allocations the job's, as its step's
                if fell_back():
                    raise tf.errors.ResourceExhaustedError(
                        None, None, f"out of memory while building job {state.name!r}: {fell_back()} "
                        "allocation(s) the pool could not serve (served from host memory, then given back)")
        except tf.errors.ResourceExhaustedError as e:
            # Building (variables, optimizer slots) ran out of pool memory.
            if beside_others or self._evict_parked():
                state.status = JobStatus.queued  # others hold memory: try again later
            else:
                self.fail(state, e, status=JobStatus.rejected)
            failed = True
        except JobDoesNotFit as e:  # its data can never fit the machine
            self.fail(state, e, status=JobStatus.rejected)
            failed = True
        except Exception as e:  # noqa: BLE001 - a bad job must not stop the host
            self.fail(state, e)
            failed = True
        taken.clear()   # a step taken and not trained (the build failed) goes with the job's stream
        # See Note [Custom gradients keep traced jobs alive] in tf_plugin.tf_internals.
        state.rt.custom_gradients |= custom_gradient_names() - registered_before
        if failed:
            # Outside the except block: its traceback would keep the job's objects alive.
            self.teardown(state)
        return not failed

    def _take_over(self, state: JobState, parked) -> None:
        """Note [Reusing a finished job's traced step]: the job's own values into
        the parked step's variables; its own model and optimizer dropped."""
        adopted = self.shelf.adopt(parked, state.rt.train)
        if adopted is not None:
            state.rt.train, state.rt.step_fn, state.traced_step_from = adopted, parked.step_fn, parked.owner
            state.rt.taken_capture = parked.captured   # Note [Captures kept with the step]
        else:   # not taken: the registry must let go of the parked step now, not at the job's teardown
            forget_custom_gradients(parked.custom_gradients)
            state.rt.custom_gradients -= parked.custom_gradients
        del adopted, parked
        gc.collect()   # the job's own model (or the parked one, not taken) leaves the pool now, before P is measured

    def _evict_parked(self) -> bool:
        """Parked steps dropped to make room; True if they held pool bytes."""
        return self.shelf is not None and self.shelf.evict() > 0

    # ------------------------------------------------------------ probe

    def probe(self, state: JobState, alongside: Sequence[JobState], *, hold: bool = False) -> ProbeOutcome:
        """Build, trace, run step 1 measuring P and T; then say what follows.
        ``hold``: keep a measured job built, admission to follow once the
        start's jobs are planned together (or, for a job built and planned
        already on arrival, once it is measured)."""
        if state.rt.train is None:
            if not self.build(state, None if hold else alongside):
                return ProbeOutcome.queued if state.status == JobStatus.queued else ProbeOutcome.ended
            self._tune_split(state, alongside)
        stream = state.rt.job_stream
        # The stream is new (built just now), so its peak is this build's and
        # this probe's: no pool-wide reset needed (it would hide others' peaks).
        before = stream.stats()["current"]
        with state.times.timed("probe_step"):
            ended = self._probe_step(state)
        if ended is not None:
            # Outside the except blocks: a live traceback would keep the job's objects alive.
            state.status = ended
            self.teardown(state)
            return ProbeOutcome.queued if ended == JobStatus.queued else ProbeOutcome.ended
        after = stream.stats()
        state.persistent_bytes = after["current"]
        state.temporary_bytes = max(0, state.records[-1].peak_bytes - max(before, after["current"]))
        validated = True
        try:   # Note [Work outside the steps, inside the allowance]: its validation's bytes, admitted with T
            with stream.eager_scope():
                measure_at_probe(state, lambda: variables_on_device(state))
        except Exception as e:  # noqa: BLE001 - the job's validation failed: the job's failure, not the host's
            out_of_memory = isinstance(e, tf.errors.ResourceExhaustedError)
            self.fail(state, e, status=JobStatus.rejected if out_of_memory else JobStatus.failed)
            validated = False
        if not validated:   # outside the except block: its traceback would keep the job's objects alive
            self.teardown(state)
            return ProbeOutcome.ended
        self.admission.remember(state)
        if self.admission.never_fits(state):
            self.fail(state, RuntimeError(
                f"needs {tf_plugin.human_bytes(state.persistent_bytes)} persistent + "
                f"{tf_plugin.human_bytes(admitted_temporary_bytes(state, state.temporary_bytes))} temporary, "
                f"more than the pool's "
                f"{tf_plugin.human_bytes(self.admission.capacity)}; raise `pool:` or lower the job's "
                "`batch_size:`"), status=JobStatus.rejected)
            self.teardown(state)
            return ProbeOutcome.ended
        if state.steps_done >= state.job.steps:
            state.status = JobStatus.finished
            self.teardown(state)
            return ProbeOutcome.ended
        fits = not hold and self.admission.fits(state, alongside, self.held_outside_jobs())
        # a job planned on arrival was captured for that plan (cold, or from the step it took over)
        if self.planning is not None and state.rt.captured is None:   # Note [Captures a plan needs] (planning.py)
            with state.times.timed("capture"):   # none while the pool is slack; from its training steps if it fits
                self.planning.capture(state, None if hold else self.admission.holds_the_limit_unplanned(
                    state, alongside, self.held_outside_jobs()), in_training=fits)
        state.times.wait_begins("admission_wait")   # ends when admitted (JobHost.start_job)
        if hold:
            state.status = JobStatus.queued
            return ProbeOutcome.hold
        if fits:
            return ProbeOutcome.run
        state.status = JobStatus.queued
        # Note [A capture kept for the joint plan] in arrivals.py: a captured job beside running ones stays built
        if state.job.rebuildable and not (state.rt.captured is not None and alongside):
            self.teardown(state)
        return ProbeOutcome.queued

    def _tune_split(self, state: JobState, alongside: Sequence[JobState]) -> None:
        """Note [Split size tuning] in tensile_tf/runtime/nodegroup.py: runs
        the job's step SPLIT_PROBE_RUNS times alone with each candidate
        split's barriers (variables restored after each run) and keeps the
        split whose higher peak was lowest (``tuned_split``). A candidate
        that fails is left out (one out of memory ends it); a job planned on
        arrival keeps the split it was planned with, and one that arrives
        while others train the static rule's (its candidates would run
        unpaired beside their steps)."""
        pipe = self.pipeline
        if pipe is None or not pipe.tunes_split or state.rt.planned_step is not None:
            return
        if any(s.status == JobStatus.running for s in alongside if s is not state):
            pipe.note_split_tuning(state.name, skipped="other jobs were training when it arrived")
            return
        from tensile_tf.tf.capture import snapshot_variables

        base, candidates = pipe.split_candidates(state.stream)
        steps = {base: state.rt.step_fn}
        peaks: dict[int, int | None] = {}
        registered_before = custom_gradient_names()
        stream = state.rt.job_stream
        restore = snapshot_variables(state.rt.step_fn.get_concrete_function(*state.rt.first_batch).graph)
        held_before, pool_before, stopped = stream.stats()["current"], pool_stats()["current"], {}
        for split in candidates:      # smallest first
            ran_out = False           # Note [Split size tuning]: then the larger splits peak alike or higher alone
            try:
                with stream.eager_scope():
                    if split not in steps:
                        transform = pipe.graph_transform(state.name, state.stream, split=split)
                        steps[split] = stream.step_function(state.rt.train.step_fn, graph_transform=transform)
                    for run in range(SPLIT_PROBE_RUNS):
                        if run:
                            restore()   # each run starts from the same variables (the last: in finally)
                        before = stream.stats()["current"]
                        stream.reset_peak()
                        steps[split](*state.rt.first_batch)
                        peaks[split] = max(peaks.get(split) or 0, stream.stats()["peak"] - before)
            except Exception as e:  # noqa: BLE001 - a candidate that fails is not chosen; the probe tells the rest
                peaks[split] = None
                ran_out = isinstance(e, tf.errors.ResourceExhaustedError)
            finally:
                restore()
            if ran_out:
                stopped = {"stopped": f"split {split} ran out of memory alone; the larger ones were not run"}
                break
        state.rt.custom_gradients |= custom_gradient_names() - registered_before
        chosen = pipe.choose_split(state.name, state.stream, base, peaks)
        pipe.note_split_tuning(state.name, **stopped)
        state.rt.step_fn = steps.pop(chosen)
        steps.clear()   # the candidates not chosen, and what their functions hold in the pool
        gc.collect()
        # what the job and the pool held before and after: the candidates leave nothing behind
        pipe.note_split_tuning(state.name, stream_bytes={"before": held_before, "after": stream.stats()["current"],
                                                         "pool_before": pool_before,
                                                         "pool_after": pool_stats()["current"]})

    def _probe_step(self, state: JobState) -> JobStatus | None:
        """Runs the first step (with a cold-start plan, if the vanilla step
        ran out of memory and the planner is on). None if it ran; else what
        became of the job."""
        # A job planned before its probe (on arrival) probes with its planned step.
        restore = self._snapshot_variables(state) if self.planning is not None and not state.cold_planned else None
        try:
            self._run_probe_step(state, raise_oom=restore is not None)
            return None
        except _OutOfMemory:
            pass
        except _ProbeEnded as e:
            return e.status
        # Note [Cold-start planning]: undo what the failed step wrote, plan the
        # job from its traced graph alone, and probe with the planned step,
        # with the least headroom first (Note [Cold-start headroom]).
        restore()
        gc.collect()  # whatever the failed step's frames still held
        others = tf_plugin.device_pool().stats()["current"] - state.rt.job_stream.stats()["current"]
        for headroom in COLD_START_HEADROOMS:
            if not self.planning.plan_cold(state, others, headroom):
                if self._others_built(state):
                    return JobStatus.queued  # as for any probe that does not fit beside others
                self.fail(state, RuntimeError(
                    f"its first step ran out of pool memory and no cold-start plan could be applied "
                    f"({state.plan_error or 'the plan has no swaps or recomputation'}); raise `pool:` or lower "
                    "the job's `batch_size:`"), status=JobStatus.rejected)
                return JobStatus.rejected
            try:
                self._run_probe_step(state, raise_oom=headroom != COLD_START_HEADROOMS[-1])
                return None
            except _OutOfMemory:
                try:
                    self._undo_planned_probe(state, restore)   # and plan again, with more headroom
                except Exception as e:  # noqa: BLE001 - the job fails, not the host
                    self.fail(state, e)
                    return JobStatus.failed
            except _ProbeEnded as e:
                return e.status
        return None

    @staticmethod
    def _undo_planned_probe(state: JobState, restore) -> None:
        """A cold plan's probe ran out of memory: every variable it swapped
        out (across iterations, or within the step the failure cut short)
        back in the pool, then as it was; the host copies it made dropped."""
        from tf_plugin import swap

        job = state.rt.captured.job
        with state.rt.job_stream.eager_scope():
            for v in job.step_fn.get_concrete_function(*job.example_args).graph.variables:
                swap.ops.tensile_var_swap_in(v.handle)   # a variable not swapped out is left as it is
            if state.rt.planned_step is not None:
                state.rt.planned_step.restore()   # and what the plan's own step holds (a plan table's step)
            swap.drain_swap_channel()
        swap.release_stream_host_copies(state.rt.job_stream.stream)
        restore()
        state.rt.step_fn, state.rt.planned_step = job.step_fn, None   # the job's own step, planned again from it
        gc.collect()

    def _run_probe_step(self, state: JobState, *, raise_oom: bool) -> None:
        """Runs the job's first step; raises _OutOfMemory (``raise_oom``) or
        _ProbeEnded with what became of the job."""
        try:
            with state.rt.job_stream.eager_scope():
                run_step(state, state.rt.first_batch, self.clock)
        except tf.errors.ResourceExhaustedError as e:
            if raise_oom:
                raise _OutOfMemory() from None
            if self._others_built(state) or self._evict_parked():
                raise _ProbeEnded(JobStatus.queued) from None  # try again when the pool is emptier
            self.fail(state, e, status=JobStatus.rejected, preface=total_need(state, self.admission.capacity))
            raise _ProbeEnded(JobStatus.rejected) from None
        except Exception as e:  # noqa: BLE001 - a bad job must not stop the host
            self.fail(state, e)
            raise _ProbeEnded(JobStatus.failed) from None

    @staticmethod
    def _snapshot_variables(state: JobState):
        """Host copies of the job's variables (restores them), or None."""
        from tensile_tf.tf.capture import snapshot_variables

        try:
            return snapshot_variables(state.rt.step_fn.get_concrete_function(*state.rt.first_batch).graph)
        except Exception:  # noqa: BLE001 - no snapshot: an OOM probe is then not retried
            return None

    # --------------------------------------------------------- teardown

    def teardown(self, state: JobState) -> None:
        """Drops the job's objects; its pool bytes must return to zero."""
        with state.times.timed("teardown"):
            self._teardown(state)

    def _teardown(self, state: JobState) -> None:
        state.rt.end_background_work()   # Note [Table first, rewritten when ready]: none in its stream after this
        stream = state.rt.job_stream
        planned, state.rt.planned_step = state.rt.planned_step, None
        state.rt.switch.clear()   # a switch its thread never took: its step holds the job's variables
        # the step its plans were made from (Note [Reuse under a planner] in traced_step_reuse.py)
        captured, taken, state.rt.captured, state.rt.taken_capture = state.rt.captured, state.rt.taken_capture, None, None
        unplanned_step = captured.job.step_fn if captured is not None else state.rt.step_fn
        # Note [Captures kept with the step]: a capture of the graph the job ran (not a cold one), or the one it took
        captured = captured if captured is not None and not captured.cold else taken
        if state.status not in FINAL_STATUSES:
            state.plan = state.captured_at_step = None   # this build's (each plan ran stays in plan_history)
        state.cold_planned = False
        state.probe_plan_peak_bytes = None
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
        if (stream is not None and self.shelf is not None and state.status in (JobStatus.finished, JobStatus.stopped)
                and self.shelf.park(state, unplanned_step, captured)):   # Note [Reusing a finished job's traced step]
            state.peak_bytes = max(state.peak_bytes, stream.stats().get("peak", 0))   # renamed, its counters kept
            stream = state.rt.job_stream = None
        del unplanned_step, captured
        # Note [Bytes the caller keeps] in teardown_memory.py: a handed-over job's model its caller holds
        caller = CallerObjects(state.rt.train) if not state.job.rebuildable and state.status in FINAL_STATUSES \
            else None
        attribute_validation(state, None)   # a Keras model's own test_step back
        state.rt.train = None
        state.rt.step_fn = None
        state.rt.first_batch = None
        if state.status in FINAL_STATUSES:
            state.job.forget()
            state.job = state.job.as_ended()   # the record reaches no model (Job.as_ended)
        forget_custom_gradients(state.rt.custom_gradients)
        state.rt.custom_gradients = set()
        if state.status in FINAL_STATUSES:   # Note [Record apart from runtime]: an ended job keeps no TensorFlow object
            state.rt = JobRuntime()
        if stream is None:
            return
        if self.pipeline is not None:
            self.pipeline.job_ended(state.name, state.stream)
        def still_held() -> bool:
            return stream.stats()["current"] > 0 and not (caller is not None and caller.hold())

        collect_garbage(still_held)
        state.late_free_s = wait_for_late_frees(still_held)
        stats = stream.stats()
        state.peak_bytes = max(state.peak_bytes, stats.get("peak", 0))
        state.kept_by_caller_bytes = stats.get("current", 0) if caller is not None and caller.hold() else 0
        state.leaked_bytes = stats.get("current", 0) - state.kept_by_caller_bytes
        stream.release()
        state.rt.job_stream = None


class _ProbeEnded(Exception):
    def __init__(self, status: JobStatus):
        super().__init__(status.value)
        self.status = status
