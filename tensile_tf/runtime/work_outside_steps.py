"""What a job runs outside its training steps (validation, the sample
prediction of ``save_model``) kept within the temporary bytes admission
counted for it.

Note [Work outside the steps, inside the allowance]. Admission counts each
job's (P, T): P held between steps, T above it while a step runs (planned:
the plan's T, ``planned_needs``; else its probe step's). Work a job does
between its steps or after its last one is not a step, and it used to run
whole: three models planned together at a 150 MiB budget (trained bit for
bit at 124 MiB) ended with the pool at 246.4 MiB, because two jobs wrote
``JOB.sample.npz`` at once, each an eager prediction of 16 examples that took
107 and 128 MiB with no plan to lower it (issue 57). Between steps and after
the last one, the job's step is not running, so its T is free: the work runs
in that room. The first call predicts one example, and the job's stream
peak above what the job held when it began (``JobStream.reset_peak``)
gives the bytes one example takes (fixed costs included). Each later call is sized from the call before it:
as many examples as that call's bytes per example fit into T (an upper
bound where the bytes are a fixed cost plus a cost per example, since the
next call is no smaller), at most twice the last call's (a kernel that
picks another algorithm for a larger batch costs at most one doubling),
and at least one (a model one example of which exceeds T still runs, one
at a time, and the record shows it). One call of a whole batch sized from
one example's bytes alone (T // those bytes, 9 of 16) once peaked 0.9 MiB
above a 71.0 MiB T on a loaded machine.
Predictions are those of the whole batch within float rounding (the saved
sample is checked with rtol 1e-5). Validation is not split: its loss must
be the same bits with and without a plan (test_real_data compares them),
and a batch split by the allowance, which a plan changes, changes the bits
(0.37581685 against 0.37581686 on the digits). It is measured and admitted
instead: the probe, after the job's first step, runs one batch of the job's
validation (``Validator.run_one_batch``; a Keras job's ``evaluate`` of one
batch, its metrics put back: ``FitLoop.run_one_validation_batch``), and
its peak above the job's bytes is ``outside_steps_need_bytes``. Admission
counts the larger of T and that need with ``OUTSIDE_STEPS_HEADROOM`` more
(``admitted_temporary_bytes``): one measured batch is a sample of the
executor's interleaving, which frees a tensor before the peak or after it
(the same 32-example batch of a conv net peaked at 151.0 MB in one run's
probe and 154.5 MB in its later validation, 2.3% apart, either way round
from run to run). So a
validation batch larger than a step's T (a plan's T, lowered by swapping,
or a larger validation batch) is in what admission let the job take. What
the work took at most above the job's bytes is recorded
(``outside_steps_peak_bytes``) beside the room it had
(``outside_steps_allowance_bytes``), fit's hooks (callbacks, ``evaluate``)
included. A job admission counted nothing for (``admission: none`` and no
probe) runs its work whole, as before.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

#: Note [Work outside the steps, inside the allowance]: False runs the work whole (the control of its test).
KEEP_WITHIN_ALLOWANCE = True


#: Note [Work outside the steps, inside the allowance]: False skips the probe's validation batch (the
#: control of its test): admission then counts the step's T alone.
MEASURE_AT_PROBE = True


#: Note [Work outside the steps, inside the allowance]: the share admission adds to a measured need.
OUTSIDE_STEPS_HEADROOM = 0.10


def admitted_temporary_bytes(state, step_temporary_bytes: int) -> int:
    """The T admission counts for a job whose step takes ``step_temporary_bytes``: the larger of
    that and what its work outside the steps was measured to need, with the headroom."""
    need = math.ceil(int(state.outside_steps_need_bytes) * (1 + OUTSIDE_STEPS_HEADROOM))
    return max(int(step_temporary_bytes), need)


def allowance_bytes(state) -> int | None:
    """The T admission counts for the job (planned, else measured), or None where it counted none."""
    if state.planned_needs is not None:
        return admitted_temporary_bytes(state, state.planned_needs[1])
    return admitted_temporary_bytes(state, state.temporary_bytes) if state.temporary_bytes is not None else None


def one_validation_batch(state) -> Callable[[], Any] | None:
    """One batch of the job's validation, nothing recorded: a YAML or TrainStep job's
    ``Validator``, else a Keras job's fit loop; None where the job validates nothing."""
    validator = getattr(state.rt.train, "validator", None)
    if validator is not None:
        return validator.run_one_batch
    hooks = state.job.step_hooks
    return getattr(hooks, "run_one_validation_batch", None) if hooks is not None else None


def measure_at_probe(state, on_device: Callable[[], Any]) -> None:
    """After the probe step: one batch of the job's validation, its peak above the job's bytes
    kept as ``outside_steps_need_bytes`` (at least what its work outside the steps took so far)."""
    run = one_validation_batch(state)
    if not MEASURE_AT_PROBE or run is None or state.rt.job_stream is None:
        return
    meter = OutsideStepsMeter(state)
    with on_device():
        run()
    state.outside_steps_need_bytes = max(state.outside_steps_need_bytes, state.outside_steps_peak_bytes,
                                         meter.above_base())
    meter.done()


def next_call_size(allowance: int, last_size: int, last_bytes: int, left: int) -> int:
    """Note [Work outside the steps, inside the allowance]: the examples of the next call, from the
    last call's: as many as ``last_bytes / last_size`` a piece fits into ``allowance`` (an upper
    bound where the bytes are a fixed cost plus a cost per example, as the next call is no smaller),
    at most twice the last call, at least one (and at most ``left``)."""
    fits = allowance * last_size // max(1, last_bytes)
    return int(max(1, min(left, 2 * last_size, fits)))


class OutsideStepsMeter:
    """The job's stream peak above what it held when the work began, folded into the job's record."""

    def __init__(self, state):
        self.state = state
        self.stream = state.rt.job_stream
        self.base = 0
        if self.stream is not None:
            self._keep_job_peak()   # the job's peak so far (its last validation included), before the reset
            self.stream.reset_peak()
            self.base = int(self.stream.stats().get("current", 0))

    def _keep_job_peak(self) -> None:
        self.state.peak_bytes = max(self.state.peak_bytes, int(self.stream.stats().get("peak", 0)))

    def above_base(self) -> int:
        return max(0, int(self.stream.stats().get("peak", 0)) - self.base) if self.stream is not None else 0

    def done(self) -> None:
        s = self.state
        s.outside_steps_peak_bytes = max(s.outside_steps_peak_bytes, self.above_base())
        if self.stream is not None:
            self._keep_job_peak()
        s.outside_steps_allowance_bytes = allowance_bytes(s)


def predict_within_allowance(state, predict: Callable[[Any], Any], x) -> Any:
    """``predict(x)`` as numpy, in calls that keep the job within its allowance (module docstring):
    one example first, then calls sized by ``next_call_size`` from the call before. ``x`` and the
    predictions may be nested (a dict or list of arrays: a Keras model's inputs and outputs)."""
    import tensorflow as tf

    def as_numpy(out):
        return tf.nest.map_structure(np.asarray, out)

    n = len(tf.nest.flatten(x)[0])
    allowance = allowance_bytes(state)
    if not KEEP_WITHIN_ALLOWANCE or allowance is None or n <= 1:
        meter = OutsideStepsMeter(state)
        out = as_numpy(predict(x))
        meter.done()
        return out
    parts, i, size = [], 0, 1
    while i < n:
        meter = OutsideStepsMeter(state)
        parts.append(as_numpy(predict(tf.nest.map_structure(lambda a, lo=i, hi=i + size: a[lo:hi], x))))
        used = meter.above_base()
        meter.done()
        i += size
        state.bytes_per_example = max(1, used // size)
        size = next_call_size(allowance, size, used, n - i)
    return tf.nest.map_structure(lambda *pieces: np.concatenate(pieces), *parts)


#: Note [Work outside the steps, inside the allowance]: False leaves validation's tf.functions unbound
#: (the control of its test: their bytes then go to the pool's "default" stream, outside every job).
ATTRIBUTE_TO_THE_JOB = True


def attribute_validation(state, stream) -> None:
    """The job's validation traced to bind its runs to the job's stream (``JobStream.attributed``),
    as its training step is: a tf.function's ops run on TensorFlow's threads, and without it one
    batch of 16 conv maps counted 1.7 MiB for the job where it took more than the step's 71 MiB.
    ``stream`` None undoes it (the job's teardown)."""
    attributed = stream.attributed if stream is not None and ATTRIBUTE_TO_THE_JOB else None
    validator = getattr(state.rt.train, "validator", None)
    if validator is not None:
        validator.attribute_to(attributed)
    hooks = state.job.step_hooks
    if hooks is not None and hasattr(hooks, "attribute_to"):
        hooks.attribute_to(attributed)
