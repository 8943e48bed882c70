"""A job's capture collected from its own training steps, on its own thread.

Note [Captures from training steps]
A capture (Note [Planning in the host] in planning.py) runs the job's step
about 16 times on the run loop's thread, variables restored afterwards:
steps that train nothing, taken from the cores the running jobs train on,
while the run loop neither starts nor ends a job. On the compute-bound CNN
search of issue 58, one capture of a 1024-batch trial cost 4.8-5.2 s against
0.3 s a step (about 16 steps of a 30-step trial), the run loop held a
finished trial's end 5-6 s behind it, and every plan made from such captures
swapped nothing (the pool held the trials as they ran).

So a job probed after the start that the capture rule would capture (Note
[Captures a plan needs]), that fits now beside the running jobs, unplanned,
and that has steps left for the capture and as many again
(``captured_in_time``: until its capture is ready it is outside joint plans,
so a newcomer that needs one with it waits; a job shorter than that, such
as the 6-step trials of tests/search/test_planned_search.py, which meet
only when planned together, is captured on the run loop as before),
starts at once on its own step, and its thread collects the
capture from the job's own training steps (``TrainingCapture.step``, around
``run_step``): every measured step is one of its training steps, on its own
batches, in its order, so nothing is restored and the job computes what it
computes unplanned (the chained step runs the same ops on the same inputs:
Note [Plan order] in tensile_tf/tf/rewrite/rewriter.py).

1. At its first step: its graph in executor order and, for a plan-order
   planner, its step chained in plan order (``plan_order_step``): tracing
   and graph work, no step run (a graph with dynamic shapes runs one, its
   variables restored: ``capture_job_graph``).
2. Free steps with the pool's trace on (``traced_step``), as
   ``measure_step_memory`` traces them: one untraced first (the step
   function's first run, where the job's step was traced again for its
   batch after its probe, also allocates what later runs reuse), then up to
   TRACED_STEPS, fewer once they took TRACED_SECONDS of step time (at least
   MIN_TRACED_STEPS; the waits for data between them do not count). A step
   whose trace another reader holds (``POOL_TRACE``) runs untraced and is
   not counted.
3. The chained step once, untraced and outside training (variables restored:
   its first run also allocates what later runs reuse, and it may peak above
   the free step: out of memory, the latencies come from free steps, as for
   ``capture_for_planning``).
4. ``latency_repeats`` training steps on the chained step (the free one, for
   a free-order planner or after 3) under the profiler (``profiling``, one
   per process: a step that finds it taken runs unprofiled and is not
   counted), the first MIN_TRACED_STEPS of them also traced (Note [Memory of
   the step as planned]).
Each measures the step function's call alone (``_Measured``): the Keras
hooks ``run_step`` calls around it (callbacks, an epoch's validation) are
neither traced nor profiled, and the wall times are the call's.

The thread then runs the job's own step again and hands the capture to the
run loop (``RunLoopInbox.capture_ready``: Note [Threads and hand-offs], H14),
which adopts it (``rt.captured``): from then on the job is planned together
with newcomers that do not fit beside it (Note [Joint re-plan on arrival]),
and its capture is parked with its step at its end (Note [Captures kept with
the step]). Until then it is outside every re-plan, counted at its measured
needs, as a job whose capture was deferred. A job that ends first is never
captured (its record's ``captured_at_step`` stays None). Its record says at
which of its steps the capture was adopted (``captured_at_step``), and the
capture's time is in its steps (``times.capture`` holds only the setup).
Not done: such a job has no latency monitor (Note [Latency drift]: the
run loop makes one only for a job planned before its thread starts), so
its latencies are the capture's for the rest of its run.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import tensorflow as tf

from tensile_tf.pipeline import (LATENCY_REPEATS, CapturedJob, JobToPlan, batch_specs, captured_job, graph_for_planning,
                                 plan_order_latencies, plan_order_step, with_memory_as_planned)
from tensile_tf.runtime.failures import summarize_error
from tensile_tf.tf.capture import latencies_of_profiles, profiling, snapshot_variables
from tensile_tf.tf.rewrite import REWRITE_PREFIX
from tensile_tf.tf.step_memory import MIN_TRACED_STEPS, TRACED_SECONDS, TRACED_STEPS, step_memory_of, traced_step

# Steps a capture may spend waiting for the profiler or the pool's trace before it gives up
PATIENCE_STEPS = 16


def steps_to_capture(step_s: float, repeats: int = LATENCY_REPEATS) -> int:
    """Training steps a capture takes at ``step_s`` a step: the traced free steps (up to
    TRACED_STEPS, fewer once TRACED_SECONDS passed) and the profiled ones."""
    traced = min(TRACED_STEPS, max(MIN_TRACED_STEPS, math.ceil(TRACED_SECONDS / max(step_s, 1e-6)) + 1))
    return 1 + traced + repeats   # the untraced first one too


def captured_in_time(state) -> bool:
    """Whether the job has steps left for its capture and as many again: a job captured from its
    training steps is outside joint plans until then (Note [Captures from training steps])."""
    step_s = state.records[-1].duration_s if state.records else 0.0
    return state.job.steps - state.steps_done >= 2 * steps_to_capture(step_s)


@dataclass
class CaptureReady:
    """A job thread's message (Note [Threads and hand-offs], H14): its capture from training steps."""

    job: str
    captured: CapturedJob | None     # None: it failed (``error``)
    at_step: int
    error: str | None = None


class TrainingCapture:
    """Note [Captures from training steps] for one job, driven by its thread."""

    def __init__(self, job: JobToPlan, step_order: str, latency_repeats: int = LATENCY_REPEATS):
        self.job = job
        self.step_order = step_order
        self.repeats = latency_repeats
        self.graph = None
        self.chained = None          # the plan-order step (None: a free-order planner, or it did not fit)
        self.warmed = False          # the chained step ran once (phase 3)
        self.first_run = False       # the free step ran once, untraced (phase 2)
        self.free: list = []         # traced free steps
        self.as_planned: list = []   # traced chained steps
        self.profiles: list = []     # XSpaces of profiled training steps
        self.walls: list[float] = []
        self.traced_s = 0.0          # the traced free steps' own time (their step function's calls)
        self.idle = 0                # steps that could measure nothing (profiler or trace taken)
        self.result: CaptureReady | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    def _memory_traced(self) -> bool:
        if len(self.free) >= TRACED_STEPS:
            return True
        return len(self.free) >= MIN_TRACED_STEPS and self.traced_s > TRACED_SECONDS

    def step(self, state, batch: tuple, run: Callable[[], None]) -> None:
        """Runs one training step of ``state`` (``run()``: ``run_step`` on ``batch``), measured as
        the capture's phase asks; the capture's own failures end the capture, not the step."""
        try:
            measure = self._prepare(state, batch)
        except Exception as e:  # noqa: BLE001 - the job trains on, uncaptured
            measure = None
            self._fail(state, e)
        if measure is None:
            run()
            return
        measure(state, run)
        if not self.done and self.idle > PATIENCE_STEPS:
            self._fail(state, RuntimeError(f"the profiler or the pool's trace was taken for {self.idle} steps"))

    def _prepare(self, state, batch: tuple):
        """What the next step measures (None: nothing)."""
        if self.done:
            return None
        if self.graph is None:
            self.job = replace(self.job, example_args=tuple(batch))
            self.graph = graph_for_planning(self.job)
            self.chained = plan_order_step(self.job, self.graph) if self.step_order != "free" else None
            self.job = replace(self.job, example_args=batch_specs(batch))   # Note [Example batch]
        if not self.first_run:
            self.first_run = True
            return None
        if not self._memory_traced():
            return self._free_step
        if self.chained is not None and not self.warmed:
            self._warm_chained(batch)
        return self._profiled_step

    def _free_step(self, state, run) -> None:
        measured = _Measured.run(state, run, state.rt.step_fn, trace=True, profile=False)
        if measured.error is not None:
            self._fail(state, measured.error)
        elif measured.traced is None:
            self.idle += 1
        else:
            self.free.append(measured.traced)
            self.traced_s += measured.wall_s

    def _warm_chained(self, batch: tuple) -> None:
        """Phase 3: the chained step's first run, outside training."""
        self.warmed = True
        restore = snapshot_variables(self.job.step_fn.get_concrete_function(*self.job.example_args).graph)
        try:
            self.chained.fn(*batch)
        except tf.errors.ResourceExhaustedError:
            self.chained = None   # it peaks above the free step here: latencies of the free one
        finally:
            restore()

    def _profiled_step(self, state, run) -> None:
        chained = self.chained
        measured = _Measured.run(state, run, chained.fn if chained is not None else state.rt.step_fn,
                                 trace=chained is not None and len(self.as_planned) < MIN_TRACED_STEPS, profile=True)
        if measured.error is not None:
            self._fail(state, measured.error)
            return
        if measured.xspace is None:
            self.idle += 1
            return
        self.profiles.append(measured.xspace)
        self.walls.append(measured.wall_s)
        if measured.traced is not None:
            self.as_planned.append(measured.traced)
        if len(self.profiles) >= self.repeats:
            try:
                self._finish(state)
            except Exception as e:  # noqa: BLE001 - the job trains on, uncaptured
                self._fail(state, e)

    def _finish(self, state) -> None:
        memory = step_memory_of(self.free, self.graph)
        if self.as_planned:   # Note [Memory of the step as planned]
            memory = with_memory_as_planned(memory, step_memory_of(self.as_planned, self.graph,
                                                                    REWRITE_PREFIX + "/"))
        latencies = latencies_of_profiles(self.profiles, self.graph, len(self.profiles), self.walls)
        if self.chained is not None:
            latencies = plan_order_latencies(latencies)
        captured = captured_job(self.job, self.graph, memory, latencies)
        self.result = CaptureReady(state.name, captured, state.steps_done)
        self._drop()

    def _fail(self, state, error: BaseException) -> None:
        self.result = CaptureReady(state.name, None, state.steps_done,
                                   f"its capture from training steps failed: {summarize_error(error)}")
        self._drop()

    def _drop(self) -> None:
        self.chained = self.free = self.as_planned = self.profiles = None


class _Measured:
    """The job's step function for one training step, measured around its call alone: the Keras
    hooks ``run_step`` calls around it (callbacks, an epoch's validation) are neither traced nor
    profiled, as the run loop's capture runs the step function alone."""

    def __init__(self, fn, trace: bool, profile: bool):
        self.fn, self.trace, self.profile = fn, trace, profile
        self.traced = self.xspace = self.error = None
        self.wall_s = 0.0

    @classmethod
    def run(cls, state, run: Callable[[], None], fn, *, trace: bool, profile: bool) -> "_Measured":
        """``run()`` (one training step of ``state``) with ``fn`` measured as its step function."""
        measured = cls(fn, trace, profile)
        own, state.rt.step_fn = state.rt.step_fn, measured
        try:
            run()
        finally:
            state.rt.step_fn = own
        return measured

    def __call__(self, *args):
        out = []

        def call() -> None:
            t0 = time.perf_counter()
            out.append(self.fn(*args))
            self.wall_s = time.perf_counter() - t0

        try:
            with profiling(blocking=False) if self.profile else contextlib.nullcontext() as profile:
                if self.trace:
                    self.traced = traced_step(call, blocking=False)
                else:
                    call()
            self.xspace = profile.xspace if profile is not None else None
        except Exception as e:  # noqa: BLE001 - the step's own failure is the job's; the measuring's, the capture's
            if not out:
                raise
            self.error = e
        return out[0]
