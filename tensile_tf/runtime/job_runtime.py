"""A job's live side: the TensorFlow objects it trains with and the plan switch offered to it.

Note [Record apart from runtime]
What the runtime knows about a job has three lives, kept in three objects (as Optuna keeps a
``FrozenTrial`` apart from the ``Trial`` a user's objective holds):

* ``JobState`` (records.py): the host's knowledge of the job, the fields results.json is made
  from, each owned by one thread at a time (Note [Threads and hand-offs] in threads.py);
* ``JobRuntime`` (here, ``JobState.rt``): the TensorFlow handles (the traced and planned steps,
  the model and optimizer, the job's pool stream, the batch it was traced with), the capture
  it was planned from, the latency monitor and the plan switch. Never serialised; the teardown
  drops them, and a job that ended holds an empty one (``JobRuntime()``), so nothing a finished
  job trained with outlives it in the record;
* ``JobRecord`` and ``StepRecord`` (records.py): frozen. A ``StepRecord`` is made once per step
  by the job's thread; ``JobRecord.of`` makes the results.json form once the job ended.
  ``JobState.progress`` is a frozen ``JobProgress`` the job thread replaces whole after each
  step: the progress lines and the re-plan timing on the run loop read it, one reference, never
  the list the job thread appends to (H11 in threads.py).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tensile_tf.runtime.threads import Handoff

if TYPE_CHECKING:
    from tensile_tf.jobs.job import TrainStep
    from tensile_tf.tf.pool import JobStream


class BackgroundWorkAbandoned(RuntimeError):
    """Background work for a job that was torn down or ends first (``JobRuntime.background_scope``)."""

    said_plainly = True   # its message is the whole reason: records quote it without the class name


@dataclass(eq=False)
class JobRuntime:
    """The live TensorFlow side of one job (Note [Record apart from runtime])."""

    train: "TrainStep | None" = None
    step_fn: Callable | None = None
    job_stream: "JobStream | None" = None
    first_batch: tuple | None = None    # until the first training step (Note [Example batch] in pipeline.py)
    batch_specs: tuple | None = None    # the first batch's TensorSpecs, after it
    sample_inputs: Any = None           # a few of its inputs, on the host (the saved sample)
    custom_gradients: set[str] = field(default_factory=set)
    planned_step: Any = None            # rewrite.PlannedStep
    # replanning.StepSwitch from the run loop to the job thread (Note [Threads and hand-offs], H3)
    switch: Handoff = field(default_factory=Handoff)
    latency_monitor: Any = None         # replanning.LatencyMonitor (its checks are the state's drift_checks)
    captured: Any = None                # execution.CapturedJob of the current build
    # the capture parked with the step it took over, for its planning (Note [Captures kept with the step])
    taken_capture: Any = None
    # Note [Captures from training steps]: the capture its thread collects (training_capture.TrainingCapture)
    training_capture: Any = None

    # Note [Table first, rewritten when ready] in tensile_tf/tf/rewrite/table_then_rewrite.py: the
    # background worker works for the job (in its stream) only until the job's teardown
    _background_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _background_ended: bool = False

    @contextlib.contextmanager
    def background_scope(self, expected_s: float | None = None,
                         left_s: Callable[[], float | None] | None = None) -> Iterator[None]:
        """The job's stream scope for the background worker; raises
        BackgroundWorkAbandoned once ``end_background_work`` ran, or where the job has
        ``left_s()`` seconds to run, fewer than the ``expected_s`` the work is expected to take
        (Note [Background work for a job about to end] in replan_timing.py)."""
        left = left_s() if left_s is not None and expected_s is not None else None
        if left is not None and left < expected_s:
            raise BackgroundWorkAbandoned(f"the job ends in {left:.2f} s, before the work would be done "
                                          f"(at least {expected_s:.2f} s)")
        with self._background_lock:
            stream = self.job_stream
            if self._background_ended or stream is None:
                raise BackgroundWorkAbandoned("the job was torn down")
            with stream.eager_scope():
                yield

    def end_background_work(self) -> None:
        """The teardown's: waits for the background work under way for the job, stops any later
        work, and drops the plan-table step kept beside the job's traced step (its kernels' constants
        are in the job's stream; a job that takes the step over builds its own)."""
        with self._background_lock:
            self._background_ended = True
        step_fn = self.captured.job.step_fn if self.captured is not None else self.step_fn
        if step_fn is not None:
            from tensile_tf.tf.rewrite.plan_table import forget_table_step

            forget_table_step(step_fn)

    @property
    def pending_switch(self) -> Any:
        """The StepSwitch offered and not yet applied (None: none); read-only, the hand-off is ``switch``."""
        return self.switch.peek()

    @property
    def example_args(self) -> tuple | None:
        """What tracing the job's step needs: the first batch while it is held, its TensorSpecs
        after (Note [Example batch] in tensile_tf/pipeline.py)."""
        return self.first_batch if self.first_batch is not None else self.batch_specs


@dataclass(frozen=True)
class JobProgress:
    """A job's progress after its latest step, replaced whole by its thread (Note [Record apart from runtime])."""

    steps_done: int = 0
    last_loss: float | None = None
    median_step_s: float | None = None
