"""A job's steps and its training thread.

``run_step`` is every step the host runs (probes included): it resets the
job's stream peak, runs the step, and records duration, loss and the step's
own peak (Note [Training window] in records.py). ``JobThread`` runs a job's
remaining steps in its own thread (TensorFlow releases the GIL, so jobs
train at once), and reports the end, whatever it was, in the run loop's inbox.
What the thread owns and how it hands things to the run loop: Note [Threads
and hand-offs] in threads.py.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import time
from bisect import insort
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from tensile_tf.tf.capture import profiled_step
from tensile_tf.runtime.failures import NonFiniteLoss, record_failure
from tensile_tf.runtime.job_runtime import JobProgress
from tensile_tf.runtime.records import JobState, JobStatus, StepRecord
from tensile_tf.runtime.replanning import take_switch
from tensile_tf.runtime.threads import RunLoopInbox, StepGate, StopRequest
from tensile_tf.runtime.work_outside_steps import OutsideStepsMeter, predict_within_allowance


class RunClock:
    """Seconds since the run started (every ``*_s`` time in the records)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0


def run_step(state: JobState, batch: tuple, clock: RunClock) -> None:
    """Runs one step of the job (under the profiler when its latency monitor
    asks, Note [Latency drift]); raises NonFiniteLoss if its loss is NaN or
    infinite and the job stops on that."""
    hooks = state.job.step_hooks
    if hooks is not None:   # e.g. Keras callbacks (Note [fit's loop in a job] in tensile_tf/jobs/keras_fit.py)
        hooks.before(state, lambda: variables_on_device(state))
    stream = state.rt.job_stream
    stream.reset_peak()
    start = clock.now()
    monitor = state.rt.latency_monitor
    profile = monitor is not None and monitor.due()
    t = time.perf_counter()
    if profile:
        loss, measured = profiled_step(state.rt.step_fn, batch, state.rt.captured.graph)
    else:
        loss = state.rt.step_fn(*batch)
    value = float(tf.reduce_mean(loss)) if loss is not None else math.nan
    duration = time.perf_counter() - t
    if profile:
        monitor.observe(measured, duration)
    peak = stream.stats().get("peak", 0)
    state.records.append(StepRecord(state.steps_done, start, duration, value, peak, state.plan_number))
    state.steps_done += 1
    state.peak_bytes = max(state.peak_bytes, peak)
    # one reference the run loop reads (Note [Record apart from runtime] in job_runtime.py); its median is
    # median_step_s's, kept sorted step by step (sorting every record each step costs a long job's steps)
    window = state.progress_step_s
    if state.steps_done > 1:
        insort(window, duration)
    median = window[len(window) // 2] if window else duration
    state.progress = JobProgress(state.steps_done, value, median)
    if state.job.stop_on_nan and not math.isfinite(value):
        raise NonFiniteLoss(f"job {state.name!r}: loss became {value} at step {state.steps_done - 1}; "
                            "lower the learning rate, or set stop_on_nan: false")
    if hooks is not None:
        meter = OutsideStepsMeter(state)   # Note [Work outside the steps, inside the allowance]: fit's callbacks,
        hooks.after(state, lambda: variables_on_device(state))   # evaluate
        meter.done()


@contextlib.contextmanager
def variables_on_device(state: JobState, between_steps: bool = True):
    """Between two steps, the variables the plan keeps on the host come
    back for the duration (validation, saving, callbacks) and leave again after."""
    planned = state.rt.planned_step if between_steps else None
    if planned is not None:
        planned.restore()
    try:
        yield
    finally:
        if planned is not None:
            planned.evict()


def release_first_batch(state: JobState) -> None:
    """Note [Example batch] (tensile_tf/pipeline.py): after the job's first
    training step its first batch leaves the pool; its TensorSpecs trace the
    step from then on, and a few inputs stay on the host for save_model."""
    from tensile_tf.pipeline import batch_specs

    batch, state.rt.first_batch = state.rt.first_batch, None
    state.rt.batch_specs = batch_specs(batch)
    inputs_of = getattr(state.rt.train, "inputs_of", None)
    first = inputs_of(batch) if inputs_of is not None else batch[0]   # a Keras job's x: maybe a dict or a list
    state.rt.sample_inputs = tf.nest.map_structure(lambda a: a[:16].numpy() if hasattr(a, "numpy") else a[:16], first)


def save_model(state: JobState, model_dir: Path, *, checkpoint: bool = False) -> None:
    """The job's trained model in Keras' format (MODEL_DIR/JOB.keras), with
    JOB.sample.npz: a few inputs and what the model predicted for them, so a
    reader can check that the file predicts what the job's model did.
    ``checkpoint``: the model so far, MODEL_DIR/JOB.stepN.keras (listed in
    ``checkpoints``), no sample."""
    import numpy as np

    model = getattr(state.rt.train, "model", None)
    if model is None or not hasattr(model, "save"):
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / (f"{state.name}.step{state.steps_done}.keras" if checkpoint else f"{state.name}.keras")
    model.save(path)
    if checkpoint:
        state.checkpoints.append(str(Path(model_dir.name) / path.name))
        return
    validator = state.rt.train.validator
    if state.rt.first_batch is not None:   # a job whose only step was its probe
        release_first_batch(state)
    x = validator.x[:16] if validator is not None else state.rt.sample_inputs
    # Note [Work outside the steps, inside the allowance] in work_outside_steps.py
    predictions = predict_within_allowance(state, lambda xb: model(xb, training=False), x)
    np.savez(model_dir / f"{state.name}.sample.npz", **_named_arrays("x", x), **_named_arrays("predictions", predictions))
    state.model_path = str(Path(model_dir.name) / path.name)


def _named_arrays(name: str, nested) -> dict:
    """``{name: array}``, or for a Keras model's several inputs or outputs (a dict or list of
    arrays) ``{name.KEY: array}`` for each (``name.0``, ``name.1`` for a list)."""
    if not isinstance(nested, (dict, list, tuple)):
        return {name: nested}
    items = nested.items() if isinstance(nested, dict) else enumerate(nested)
    return {f"{name}.{key}": np.asarray(a) for key, a in items}


def variables_digest(variables) -> str:
    """sha256 over the variables' dtypes, shapes and bytes, in order (not their
    names: a rebuilt model's variables get new unique names)."""
    h = hashlib.sha256()
    for v in variables:
        value = v.numpy()
        h.update(f"{value.dtype}:{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


class JobThread:
    """Trains one admitted job to its end in a thread of its own.

    ``after_step(state)`` runs in the thread after each step (the pipeline
    calibrates the job there); ``on_end(state)`` runs in the thread when the
    job ends (the pipeline releases its barriers there, at once); then the
    state goes in the ``inbox`` (its last act), where the host's run loop
    picks it up. Never raises. When ``stop`` is set (the run is interrupted)
    the job ends, ``interrupted``, before its next step.
    """

    def __init__(self, state: JobState, clock: RunClock, inbox: RunLoopInbox, *,
                 record_weights: bool, on_end: Callable[[JobState], None] | None = None,
                 stop: StopRequest | threading.Event | None = None, gate: StepGate | None = None,
                 model_dir: Path | None = None, after_step: Callable[[JobState], None] | None = None):
        self.state = state
        self.clock = clock
        self.inbox = inbox
        self.record_weights = record_weights
        self.on_end = on_end
        self.stop = stop or StopRequest()
        self.gate = gate
        self.model_dir = model_dir
        self.after_step = after_step
        self.thread = threading.Thread(target=self._train, name=f"job-{state.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join()

    _variables_on_device = staticmethod(variables_on_device)

    def _validate(self, state: JobState, *, between_steps: bool) -> None:
        """Validation sees the real variables (``_variables_on_device``)."""
        validator = state.rt.train.validator
        with self._variables_on_device(state, between_steps):
            meter = OutsideStepsMeter(state)   # Note [Work outside the steps, inside the allowance]: measured
            state.validation.append(validator.run(state.steps_done, self.clock.now()))
            meter.done()

    def _checkpoint(self, state: JobState) -> None:
        """The model so far, in Keras' format (``checkpoint_every``)."""
        with self._variables_on_device(state):
            save_model(state, self.model_dir, checkpoint=True)

    def _train(self) -> None:
        state = self.state
        began, steps_before, data_before = time.perf_counter(), len(state.records), state.times.data
        try:
            with state.rt.job_stream.eager_scope():
                status = JobStatus.finished
                spec = state.job.spec
                offset = spec.start_offset_s if spec is not None else 0.0
                if offset > self.clock.now():  # the planner timed the job to start then (start_offset_s)
                    self.stop.wait(offset - self.clock.now())
                # on_step runs after every step: the first one ran as the job's probe, before this thread
                if state.steps_done > 0 and state.job.on_step is not None and state.job.on_step(state) is False:
                    status = JobStatus.stopped
                while status == JobStatus.finished and state.steps_done < state.job.steps:
                    if self.gate is not None:   # Note [Joint re-plan on arrival]: parked while a newcomer builds
                        self.gate.at_boundary(state.name, self.stop)
                    if self.stop.is_set():  # the run is being stopped: end at this step boundary
                        status = JobStatus.interrupted
                        break
                    take_switch(state)   # Note [Hot swap]: a re-plan's new step, at this step boundary
                    if state.steps_done == 0 and state.rt.first_batch is not None:
                        batch = state.rt.first_batch
                    else:
                        with state.times.timed("data"):
                            batch = state.rt.train.next_batch()
                    capture = state.rt.training_capture   # Note [Captures from training steps]
                    if capture is None:
                        run_step(state, batch, self.clock)
                    else:
                        capture.step(state, batch, lambda: run_step(state, batch, self.clock))
                        if capture.done:
                            state.rt.training_capture = None
                            self.inbox.capture_ready(capture.result)   # H14: the run loop adopts it
                    if self.after_step is not None:
                        self.after_step(state)
                    if state.rt.first_batch is not None:   # its first step ran (here or as its probe)
                        release_first_batch(state)
                    validator = state.rt.train.validator
                    if validator is not None and validator.due(state.steps_done, state.job.steps) \
                            and state.steps_done < state.job.steps:
                        self._validate(state, between_steps=True)
                    every = spec.checkpoint_every if spec is not None else None
                    if every and self.model_dir is not None and state.steps_done % every == 0 \
                            and state.steps_done < state.job.steps:
                        self._checkpoint(state)
                    if state.job.on_step is not None and state.job.on_step(state) is False:
                        status = JobStatus.stopped
                        break
                if state.rt.planned_step is not None:
                    state.rt.planned_step.restore()  # variables the plan keeps on the host
                if state.rt.train.validator is not None and state.steps_done > 0 and not (
                        state.validation and state.validation[-1].step == state.steps_done):
                    self._validate(state, between_steps=False)   # at the end, whatever stopped it
                if self.model_dir is not None and status == JobStatus.finished:
                    save_model(state, self.model_dir)
                if self.record_weights:
                    optimizer_vars = list(getattr(state.rt.train.optimizer, "variables", None) or [])
                    state.weights_digest = variables_digest([*state.rt.train.variables, *optimizer_vars])
            state.status = status
        except BaseException as e:  # noqa: BLE001 - isolate the failure to this job
            record_failure(state, e, self.clock.now())
        finally:
            if self.gate is not None:
                self.gate.leave(state.name)
            state.ended_at_s = self.clock.now()
            try:
                if self.on_end is not None:
                    self.on_end(state)
            finally:   # even if the hook failed: the run loop waits for this
                # Note [Where a trial's time goes]: the steps, and the rest of the thread's time
                stepped = sum(r.duration_s for r in state.records[steps_before:])
                state.times.add("steps", stepped)
                fetched = state.times.data - data_before
                state.times.add("between_steps", time.perf_counter() - began - stepped - fetched)
                state.times.wait_begins("end_wait")
                self.inbox.job_ended(state)   # Note [Threads and hand-offs], H2: the record is the run loop's now
