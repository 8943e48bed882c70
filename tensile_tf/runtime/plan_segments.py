"""A job's steps, plan by plan.

Note [Plan segments]
A job's steps may run under several plans: the one it started with, then
each re-plan it switched to at a step boundary (Note [Hot swap] in
tensile_tf/runtime/replanning.py). Each step records the number of the plan
it ran under (``StepRecord.plan``: the plan's index in the run's plans,
results.json's ``planner.plans``; None: the job's own step, unplanned, such
as the probe before the start's plan). A job whose plan leaves its step as
it is still runs under that plan. A *segment* is a maximal run of
consecutive steps under one plan. results.json lists each job's
(``plan_segments``), and ``--compare-vanilla`` compares each planned one on
its own (Note [Honest comparison] in tensile_tf/reports/compare.py), so no
figure measured under one plan is reported as another's. ``PlanRecord``
carries its number and why it was made (``reason``: "start", "cold start",
"planned alone", or the re-plan's reason, e.g. "departure of j0");
``JobState.plan_history`` keeps the PlanRecord of every plan the job ran
(``JobState.plan`` is the last).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from tensile_tf.runtime.records import PlanRecord, StepRecord

UNPLANNED = "unplanned"


@dataclass
class PlanSegment:
    """Consecutive steps of one job under one plan (Note [Plan segments])."""

    plan: int | None                # the plan's number (index in planner.plans); None: unplanned
    reason: str                     # why the plan was made; "unplanned"
    first_step: int
    last_step: int
    steps: int
    median_step_s: float | None     # over its steps after the job's first (all of them if it has none)
    training_peak_bytes: int | None   # its largest step peak after the job's first (Note [Training window])
    swap_outs: int                  # the plan's, per step (planned)
    swap_ins: int
    recomputes: int
    changes_step: bool              # False: the plan left the job's step as it is
    predicted_planned_peak_bytes: int | None


def step_runs(records: Sequence["StepRecord"]) -> list[list["StepRecord"]]:
    """The records split into maximal runs of consecutive steps under one plan."""
    runs: list[list[StepRecord]] = []
    for r in records:
        if runs and runs[-1][-1].plan == r.plan:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def plans_by_number(history: Sequence["PlanRecord"]) -> dict[int, "PlanRecord"]:
    return {p.plan_number: p for p in history if p.plan_number is not None}


def plan_label(number: int | None, reason: str) -> str:
    """How text names a plan: "plan 2 (departure of j0)"."""
    if number is None:
        return "the unplanned step"
    return f"plan {number} ({reason})" if reason else f"plan {number}"


def plan_segments(records: Sequence["StepRecord"], history: Sequence["PlanRecord"]) -> list[PlanSegment]:
    """The job's steps (``JobState.records``) as segments, with each plan's
    figures from its PlanRecord in ``history`` (``JobState.plan_history``)."""
    plans = plans_by_number(history)
    out = []
    for run in step_runs(records):
        window = [r for r in run if r.index >= 1]
        number = run[0].plan
        plan = plans.get(number) if number is not None else None
        out.append(PlanSegment(
            plan=number, reason=plan.reason if plan is not None else "" if number is not None else UNPLANNED,
            first_step=run[0].index, last_step=run[-1].index, steps=len(run),
            median_step_s=statistics.median(r.duration_s for r in window or run),
            training_peak_bytes=max((r.peak_bytes for r in window), default=None),
            swap_outs=plan.swap_outs if plan else 0, swap_ins=plan.swap_ins if plan else 0,
            recomputes=plan.recomputes if plan else 0, changes_step=bool(plan and plan.changes_step),
            predicted_planned_peak_bytes=plan.predicted_planned_peak_bytes if plan else None))
    return out
