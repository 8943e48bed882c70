"""Objective metrics: a trial's step records (or its validations) -> one number.

The same function gives the intermediate values reported for pruning (on the
steps done so far) and the final value told to the study, so a pruner always
compares like with like, in the study's direction.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

# final_loss averages this many last steps: one step's loss depends on which
# of the cycled batches it saw, and would rank trials by batch luck.
FINAL_WINDOW = 10

METRICS: dict[str, str] = {
    "final_loss": f"mean loss of the last {FINAL_WINDOW} steps",
    "last_loss": "the last step's loss",
    "best_loss": "the lowest step loss",
    "mean_loss": "mean loss over all steps",
    "examples_per_second": "batch size / median step time",
    "val_loss": "the last validation's loss (data.validation_split)",
    "val_accuracy": "the last validation's accuracy",
}


def _losses(records: Sequence) -> list[float]:
    return [r.loss for r in records]


def metric_value(metric: str, records: Sequence, batch_size: int | None, validation: Sequence = ()) -> float:
    """The metric over step records (objects with .loss and .duration_s), or
    over the job's validations so far (``val_*``: the last one's; objects
    with .loss and .metrics); NaN if undefined."""
    if metric.startswith("val_"):
        if not validation:
            return math.nan
        last = validation[-1]
        return last.loss if metric == "val_loss" else last.metrics.get(metric.removeprefix("val_"), math.nan)
    losses = _losses(records)
    if not losses:
        return math.nan
    if metric == "final_loss":
        tail = losses[-FINAL_WINDOW:]
        return sum(tail) / len(tail)
    if metric == "last_loss":
        return losses[-1]
    if metric == "best_loss":
        finite = [x for x in losses if math.isfinite(x)]
        return min(finite) if finite else math.nan
    if metric == "mean_loss":
        return sum(losses) / len(losses)
    if metric == "examples_per_second":
        # Step 0 includes one-time work; leave it out when there is more.
        times = sorted(r.duration_s for r in (records[1:] or records))
        median = times[len(times) // 2]
        return (batch_size or 1) / median if median > 0 else math.nan
    raise ValueError(f"unknown objective metric {metric!r}; known: {', '.join(METRICS)}")


def metric_function(metric: str) -> Callable[..., float]:
    """(records, batch_size, validation=()) -> the metric."""
    if metric not in METRICS:
        raise ValueError(f"unknown objective metric {metric!r}; known: {', '.join(METRICS)}")
    return lambda records, batch_size, validation=(): metric_value(metric, records, batch_size, validation)
