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
gives the bytes one example takes (``bytes_per_example``; fixed costs
included, so it errs on the safe side). The rest runs in calls of
``T // bytes_per_example`` examples (at least one: a model whose one
example exceeds T still runs, one at a time, and the record shows it).
Predictions are those of the whole batch within float rounding (the saved
sample is checked with rtol 1e-5). Validation is measured, not split: its
loss must be the same bits with and without a plan (test_real_data
compares them), and a batch split by the allowance, which a plan changes,
changes the bits (0.37581685 against 0.37581686 on the digits). What the
work took at most above the job's bytes before it is recorded
(``outside_steps_peak_bytes``), beside the room it had
(``outside_steps_allowance_bytes``): a validation batch larger than the
room shows there. A job admission counted nothing for (``admission: none``
and no probe) runs its work whole, as before.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

#: Note [Work outside the steps, inside the allowance]: False runs the work whole (the control of its test).
KEEP_WITHIN_ALLOWANCE = True


def allowance_bytes(state) -> int | None:
    """The T admission counts for the job (planned, else measured), or None where it counted none."""
    if state.planned_needs is not None:
        return int(state.planned_needs[1])
    return int(state.temporary_bytes) if state.temporary_bytes is not None else None


def examples_per_call(state, n: int) -> int:
    """How many of ``n`` examples one call may take within the job's allowance (``n``: no limit known)."""
    allowance = allowance_bytes(state)
    per = getattr(state, "bytes_per_example", None)
    if not KEEP_WITHIN_ALLOWANCE or allowance is None or not per:
        return n
    return int(max(1, min(n, allowance // per)))


class OutsideStepsMeter:
    """The job's stream peak above what it held when the work began, folded into the job's record."""

    def __init__(self, state):
        self.state = state
        self.stream = state.job_stream
        self.base = 0
        if self.stream is not None:
            # the job's peak so far (its last validation included) is kept before the reset
            state.peak_bytes = max(state.peak_bytes, int(self.stream.stats().get("peak", 0)))
            self.stream.reset_peak()
            self.base = int(self.stream.stats().get("current", 0))

    def above_base(self) -> int:
        return max(0, int(self.stream.stats().get("peak", 0)) - self.base) if self.stream is not None else 0

    def done(self) -> None:
        s = self.state
        s.outside_steps_peak_bytes = max(s.outside_steps_peak_bytes, self.above_base())
        if self.stream is not None:
            s.peak_bytes = max(s.peak_bytes, int(self.stream.stats().get("peak", 0)))
        s.outside_steps_allowance_bytes = allowance_bytes(s)


def measure_bytes_per_example(state, predict: Callable[[Any], Any], x) -> Any:
    """``predict`` of ``x``'s first example, which measures ``bytes_per_example`` where it is not known
    yet (and the allowance is kept); returns that prediction, or None where nothing was measured."""
    if getattr(state, "bytes_per_example", None) or not KEEP_WITHIN_ALLOWANCE or allowance_bytes(state) is None:
        return None
    meter = OutsideStepsMeter(state)
    out = np.asarray(predict(x[:1]))
    state.bytes_per_example = max(1, meter.above_base())
    meter.done()
    return out


def predict_within_allowance(state, predict: Callable[[Any], Any], x) -> np.ndarray:
    """``predict(x)`` as numpy, in calls that keep the job within its allowance (module docstring)."""
    first = measure_bytes_per_example(state, predict, x) if len(x) > 1 else None
    meter = OutsideStepsMeter(state)
    start = 0 if first is None else 1
    size = max(1, examples_per_call(state, len(x)))
    parts = ([] if first is None else [first]) + [np.asarray(predict(x[i:i + size]))
                                                 for i in range(start, len(x), size)]
    meter.done()
    return np.concatenate(parts) if parts else np.asarray(predict(x))
