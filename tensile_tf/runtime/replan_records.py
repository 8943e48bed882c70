"""The records of re-planning while jobs run (Note [Re-planning on events] in
tensile_tf/runtime/replanning.py): each re-plan, each job's part in it, each
latency-drift check. Part of results.json's schema; ``records.py`` re-exports
them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JobReplan:
    """One job's part in a re-plan (predictions, labelled as such)."""

    name: str
    predicted_peak_before_bytes: int       # the job's planned peak under the plan it ran
    predicted_peak_after_bytes: int
    swaps_before: int
    swaps_after: int
    recomputes_before: int
    recomputes_after: int
    median_step_s_before: float | None     # measured, over the steps run before the switch
    median_step_s_after: float | None = None   # measured, over the steps after it (filled at the end)
    switched_at_step: int | None = None    # the job's first step on the new plan (None: never switched)
    # Note [Instantiated off the job's thread]: the new step instantiated on a
    # worker while the job trained on; the switch waits for it (None: a step
    # reused, or none to instantiate)
    instantiate_s: float | None = None
    instantiate_error: str | None = None   # why it could not be (the job's first call instantiated it)


@dataclass
class ReplanRecord:
    """A re-plan while jobs run (Note [Re-planning on events] in runtime/replanning.py)."""

    at_s: float
    reason: str                            # e.g. "departure of j0"
    budget_bytes: int
    planning_s: float                      # the planner
    rewrite_s: float                       # rewriting the jobs' steps (their instantiation: each job's instantiate_s)
    predicted_peak_sum_before_bytes: int   # the jobs' predicted planned peaks, summed, under their plans
    predicted_peak_sum_after_bytes: int    # the same under the new plan
    jobs: list[JobReplan]
    error: str | None = None               # a re-plan that failed: the jobs kept their plans
    newcomer: str | None = None            # an arrival's job, planned with the running ones
    paused_s: float = 0.0                  # the running jobs parked at a step boundary (arrivals)
    parked: str | None = None              # why they were parked while the newcomer built (None: they were not)
    plan: int | None = None                # the plan it made: its index in planner.plans (None: it failed or was skipped)
    # Note [Re-plans for jobs about to end] (runtime/replan_timing.py): not started, and why (every job it was for ends first)
    skipped: str | None = None
    # Note [One re-plan per burst] (runtime/replan_timing.py): the events it was made for, one re-plan for them all
    events: list[str] = field(default_factory=list)


@dataclass
class DriftCheck:
    """One profiled training step of a job (Note [Latency drift] in runtime/replanning.py)."""

    job: str
    step: int
    at_s: float
    change_rate: float            # |s' - s| / s of the EWMA-corrected latencies vs the current plan's
    profiled_step_s: float        # the profiled step's wall time
    median_step_s: float | None   # the job's median step before it
    replan_requested: bool
    step_order_changed: bool = False   # the table was of the step run in another order: replaced, no re-plan
