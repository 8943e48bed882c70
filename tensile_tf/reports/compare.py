"""``tensile run --compare-vanilla``: one config run unplanned and planned.

``compare_runs`` takes the two RunResults and reports, per job and for the
pool, the metrics of DESIGN.md: vanilla and planned peak (VMP, EMP), MSR =
(VMP - EMP) / VMP, time ratio = ETC / VTC (median step), bytes over the swap
link, recomputed ops, late swap-ins, and whether the losses and the final
weights (model and optimizer variables) matched bit for bit. The plan must
never change what training computes, so a mismatch is a bug.

Note [Honest comparison]
Both runs are measured by one rule over one window: a job's peak is the
largest of its per-step peaks over the training window (every step after
the first, the same step indices in both runs; Note [Training window] in
tensile_tf/runtime/records.py); the pool's peak is its peak since training
began. Vanilla's own spread, the largest minus the smallest of its per-step
peaks over that window, is how much the same unplanned step varies from one
iteration to the next (the executor's order, the other jobs beside it). A
saving is *credited* (``credited_msr``) only when it exceeds that spread and
the plan changed the step; otherwise it is reported as noise, never as the
plan's.

A job re-planned while it ran (Note [Re-planning on events] in
tensile_tf/runtime/replanning.py) ran its steps under several plans (Note
[Plan segments] in tensile_tf/runtime/plan_segments.py). Each plan is then
compared over its own steps (``JobComparison.segments``): the time ratio,
peaks and MSR of the steps it ran, against vanilla's same step indices, and
its saving is credited by the rule above with *its* plan and vanilla's
spread over those steps, or over the whole window if that is larger (a plan
that ran a step or two would otherwise see no spread at all). The job's whole-window figures stay, but belong to
no one plan: their saving is credited only if every plan the job ran in the
window changed its step (the last plan's swaps and prediction are kept in
the job's fields, and the text prints each plan's on a row of its own).
"""
from __future__ import annotations

import struct
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from tensile_tf.runtime.plan_segments import plan_label, plans_by_number, step_runs
from tensile_tf.runtime.records import JobState, JobStatus, PlanRecord, RunResult, StepRecord
from tensile_tf.units import human_bytes


def _bits(losses: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in losses]  # NaN == NaN, -0.0 != 0.0


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _msr(vanilla: int | None, planned: int | None) -> float | None:
    return (vanilla - planned) / vanilla if vanilla and planned is not None else None


def _window_peaks(state: JobState, steps: int) -> list[int]:
    return [r.peak_bytes for r in state.records if 1 <= r.index < steps]


def _credit(msr: float | None, vpeak: int | None, ppeak: int | None, spread: int | None,
            changes: bool) -> float | None:
    """Note [Honest comparison]: msr if the plan changed the step and the saving exceeds vanilla's spread."""
    if msr is None:
        return None
    return msr if changes and spread is not None and vpeak - ppeak > spread else 0.0


@dataclass
class SegmentComparison:
    """One plan's steps in both runs (Note [Honest comparison])."""

    plan: int | None                     # its number: index in the planned run's planner.plans
    reason: str                          # why it was made ("start", "departure of j0", ...)
    first_step: int                      # its steps in the window (the same indices in vanilla)
    last_step: int
    steps: int
    vanilla_peak_bytes: int | None
    planned_peak_bytes: int | None
    vanilla_spread_bytes: int | None     # vanilla's spread over these steps (at least the whole window's)
    msr: float | None
    credited_msr: float | None           # msr when above that spread and this plan changed the step, else 0
    vanilla_median_step_s: float | None
    planned_median_step_s: float | None
    time_ratio: float | None
    changes_step: bool
    swap_outs: int                       # what this plan's rewrite carried out, per step
    swap_ins: int
    recomputed_ops: int
    swapped_bytes_per_step: int
    predicted_msr: float | None

    @property
    def label(self) -> str:
        return plan_label(self.plan, self.reason)


def _rewrite_swaps(plan: PlanRecord | None, kind: str) -> int:
    return plan.rewrite.get(f"activation_{kind}", 0) + plan.rewrite.get(f"variable_{kind}", 0) if plan else 0


def _compare_segment(vanilla: dict[int, StepRecord], run: list[StepRecord], plan: PlanRecord | None,
                     window_spread: int) -> SegmentComparison:
    v = [vanilla[r.index] for r in run]
    vpeak, ppeak = max(r.peak_bytes for r in v), max(r.peak_bytes for r in run)
    # a plan that ran a step or two sees almost no spread of its own: the whole window's is the floor
    spread = max(vpeak - min(r.peak_bytes for r in v), window_spread)
    msr = _msr(vpeak, ppeak)
    changes = plan is not None and plan.changes_step
    vtime, ptime = statistics.median(r.duration_s for r in v), statistics.median(r.duration_s for r in run)
    return SegmentComparison(
        plan=run[0].plan, reason=plan.reason if plan else "", first_step=run[0].index, last_step=run[-1].index,
        steps=len(run), vanilla_peak_bytes=vpeak, planned_peak_bytes=ppeak, vanilla_spread_bytes=spread, msr=msr,
        credited_msr=_credit(msr, vpeak, ppeak, spread, changes), vanilla_median_step_s=vtime,
        planned_median_step_s=ptime, time_ratio=_ratio(ptime, vtime), changes_step=changes,
        swap_outs=_rewrite_swaps(plan, "swap_outs"), swap_ins=_rewrite_swaps(plan, "swap_ins"),
        recomputed_ops=plan.recomputed_ops if plan else 0,
        swapped_bytes_per_step=plan.swapped_bytes_per_step if plan else 0,
        predicted_msr=plan.predicted_msr if plan else None)


def _segments(v: JobState, p: JobState, steps: int) -> tuple[list[SegmentComparison], bool | None]:
    """The planned run's window, plan by plan (Note [Plan segments]), and
    whether every plan it ran there changed the step (None: its steps carry
    no plan numbers, e.g. records made before they did)."""
    vanilla = {r.index: r for r in v.records}
    window = [r for r in p.records if 1 <= r.index < steps and r.index in vanilla]
    if not any(r.plan is not None for r in p.records) or not window:
        return [], None
    plans = plans_by_number(p.plan_history)
    runs = step_runs(window)
    vw = [vanilla[r.index].peak_bytes for r in window]
    segments = [_compare_segment(vanilla, run, plans.get(run[0].plan), max(vw) - min(vw))
                for run in runs if run[0].plan is not None]
    return segments, len(segments) == len(runs) and all(s.changes_step for s in segments)


@dataclass
class JobComparison:
    name: str
    vanilla_status: str
    planned_status: str
    window_steps: int                    # steps 1..window_steps-1 in both runs
    vanilla_peak_bytes: int | None
    planned_peak_bytes: int | None
    vanilla_spread_bytes: int | None     # Note [Honest comparison]
    msr: float | None                    # measured, whatever its cause
    credited_msr: float | None           # msr when above vanilla's spread and every plan run changed the step, else 0
    predicted_vanilla_peak_bytes: int | None   # the last plan's (each plan's: segments)
    predicted_msr: float | None                # the last plan's
    vanilla_median_step_s: float | None
    planned_median_step_s: float | None
    time_ratio: float | None             # over the whole run; each plan's over its steps: segments
    plan_changes_step: bool              # every plan the job ran in the window changed its step
    swapped_bytes_per_step: int          # the last plan's
    swap_outs: int                       # the last plan's
    recomputed_ops: int                  # the last plan's
    plan_error: str | None
    losses_match: bool
    weights_match: bool
    segments: list[SegmentComparison] = field(default_factory=list)   # each plan over its steps, in order

    @property
    def plans_run(self) -> int:
        """How many plans ran the job's window (0: unknown or none)."""
        return len(self.segments)


@dataclass
class PoolComparison:
    capacity: int
    vanilla_peak_bytes: int
    planned_peak_bytes: int
    msr: float | None
    vanilla_run_peak_bytes: int
    planned_run_peak_bytes: int
    vanilla_wall_s: float
    planned_wall_s: float
    wall_ratio: float | None
    swapped_bytes: int
    late_swap_ins: int
    checked_swap_ins: int
    host_store_peak_bytes: int
    swap_bandwidth_bytes_per_s: int | None
    vanilla_ooms: int
    planned_ooms: int
    swap_link: str = ""   # what the link stands for (Note [Links named for a device])


@dataclass
class Comparison:
    jobs: list[JobComparison]
    pool: PoolComparison
    all_match: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _compare_job(v: JobState, p: JobState) -> JobComparison:
    both_finished = v.status == JobStatus.finished and p.status == JobStatus.finished
    steps = min(v.steps_done, p.steps_done)
    vw, pw = _window_peaks(v, steps), _window_peaks(p, steps)
    vpeak, ppeak = (max(vw) if vw else None), (max(pw) if pw else None)
    spread = (max(vw) - min(vw)) if vw else None
    msr = _msr(vpeak, ppeak)
    segments, every_plan_changes = _segments(v, p, steps)
    changes = every_plan_changes if every_plan_changes is not None else p.plan is not None and p.plan.changes_step
    credited = _credit(msr, vpeak, ppeak, spread, changes)
    return JobComparison(
        name=v.name, vanilla_status=v.status.value, planned_status=p.status.value, window_steps=steps,
        vanilla_peak_bytes=vpeak, planned_peak_bytes=ppeak, vanilla_spread_bytes=spread, msr=msr,
        credited_msr=credited,
        predicted_vanilla_peak_bytes=p.plan.predicted_vanilla_peak_bytes if p.plan else None,
        predicted_msr=p.plan.predicted_msr if p.plan else None,
        vanilla_median_step_s=v.median_step_s, planned_median_step_s=p.median_step_s,
        time_ratio=_ratio(p.median_step_s, v.median_step_s), plan_changes_step=changes,
        swapped_bytes_per_step=p.plan.swapped_bytes_per_step if p.plan else 0,
        swap_outs=_rewrite_swaps(p.plan, "swap_outs"),
        recomputed_ops=p.plan.recomputed_ops if p.plan else 0, plan_error=p.plan_error,
        losses_match=both_finished and _bits([r.loss for r in v.records]) == _bits([r.loss for r in p.records]),
        weights_match=both_finished and v.weights_digest is not None and v.weights_digest == p.weights_digest,
        segments=segments)


def compare_runs(vanilla: RunResult, planned: RunResult) -> Comparison:
    by_name = {s.name: s for s in planned.jobs}
    jobs = [_compare_job(v, by_name[v.name]) for v in vanilla.jobs if v.name in by_name]
    link = planned.planner.swap if planned.planner is not None else None
    vpeak, ppeak = vanilla.pool.training_peak, planned.pool.training_peak
    pool = PoolComparison(
        capacity=vanilla.capacity, vanilla_peak_bytes=vpeak, planned_peak_bytes=ppeak, msr=_msr(vpeak, ppeak),
        vanilla_run_peak_bytes=vanilla.pool.peak, planned_run_peak_bytes=planned.pool.peak,
        vanilla_wall_s=vanilla.wall_s, planned_wall_s=planned.wall_s,
        wall_ratio=_ratio(planned.wall_s, vanilla.wall_s),
        swapped_bytes=(link.bytes_out + link.bytes_in) if link else 0,
        late_swap_ins=link.late_swap_ins if link else 0, checked_swap_ins=link.checked_swap_ins if link else 0,
        host_store_peak_bytes=link.host_store_peak_bytes if link else 0,
        swap_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s if link else None,
        vanilla_ooms=vanilla.pool.run_ooms, planned_ooms=planned.pool.run_ooms,
        swap_link=link.stands_for if link else "")
    return Comparison(jobs, pool, all_match=bool(jobs) and all(j.losses_match and j.weights_match for j in jobs))


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def _not_credited_why(changes_step: bool) -> str:
    return "the plan does not change its step" if not changes_step else "within vanilla's own step-to-step spread"


def _segment_row(s: SegmentComparison) -> str:
    """One plan over its steps: every figure on the row is that plan's."""
    steps = f"step {s.first_step}" if s.first_step == s.last_step else f"steps {s.first_step}-{s.last_step}"
    tr = f"{s.time_ratio:.2f}" if s.time_ratio is not None else "-"
    credit = ""
    if s.credited_msr:
        credit = " (credited)"
    elif s.msr is not None and s.msr > 0:
        credit = f" (not credited to plan {s.plan}: {_not_credited_why(s.changes_step)})"
    return (f"    {s.label}, {steps}: time ratio {tr}, MSR {_pct(s.msr)}{credit}; peak vanilla "
            f"{human_bytes(s.vanilla_peak_bytes)} ±{human_bytes(s.vanilla_spread_bytes)}, planned "
            f"{human_bytes(s.planned_peak_bytes)}; swap-outs {s.swap_outs}, swap-ins {s.swap_ins}, "
            f"recomputed ops {s.recomputed_ops}, swapped {human_bytes(s.swapped_bytes_per_step)}/step")


def _whole_run_why(j: JobComparison) -> str:
    """Why the whole window's saving is not credited, naming the plans that did not change the step."""
    if j.plan_changes_step:
        return _not_credited_why(True)
    unchanged = [s.label for s in j.segments if not s.changes_step]
    if len(j.segments) <= 1 and (unchanged or not j.segments):
        return _not_credited_why(False)
    if unchanged:
        return f"{', '.join(unchanged)} {'does' if len(unchanged) == 1 else 'do'} not change its step"
    return "some of its steps in the window ran unplanned"


def _job_rows(j: JobComparison) -> list[str]:
    several = j.plans_run > 1   # the last plan's columns would speak for plans that did not run those steps
    tr = f"{j.time_ratio:.3f}" if j.time_ratio is not None else "-"
    pred, swapped, recomp = ("-", "-", "-") if several else \
        (_pct(j.predicted_msr), human_bytes(j.swapped_bytes_per_step), str(j.recomputed_ops))
    rows = [f"{j.name:<16} {human_bytes(j.vanilla_peak_bytes):>12} {human_bytes(j.vanilla_spread_bytes):>9} "
            f"{human_bytes(j.planned_peak_bytes):>12} {_pct(j.msr):>7} {_pct(j.credited_msr):>8} "
            f"{pred:>8} {tr:>10} {swapped:>10} {recomp:>6} "
            f"{'same' if j.losses_match else 'DIFF':>7} {'same' if j.weights_match else 'DIFF':>7}"]
    if j.msr and not j.credited_msr:
        whose = "the whole run's" if several else "the"
        to = "" if several else f" to {j.segments[0].label if j.segments else 'the plan'}"
        rows.append(f"  {j.name}: {whose} {_pct(j.msr)} difference is not credited{to}: {_whole_run_why(j)}")
    if several:
        rows.append(f"  {j.name}: ran {j.plans_run} plans; the row above is the whole run's; each plan over its "
                    "own steps (the same steps in vanilla):")
        rows.extend(_segment_row(s) for s in j.segments)
    elif j.segments:
        s = j.segments[0]
        rows.append(f"  {j.name}: steps {s.first_step}-{s.last_step} ran {s.label}")
    return rows


def format_comparison(c: Comparison) -> str:
    """The comparison as a plain-text table (one row per job, each plan a job
    ran on a row of its own when it ran several, then the pool)."""
    head = (f"{'job':<16} {'vanilla peak':>12} {'±spread':>9} {'planned peak':>12} {'MSR':>7} {'credited':>8} "
            f"{'pred MSR':>8} {'time ratio':>10} {'swap/step':>10} {'recomp':>6} {'losses':>7} {'weights':>7}")
    rows = [head]
    for j in c.jobs:
        rows.extend(_job_rows(j))
        if j.vanilla_status != "finished" or j.planned_status != "finished":
            rows.append(f"  {j.name}: vanilla {j.vanilla_status}, planned {j.planned_status}")
        if j.plan_error:
            rows.append(f"  {j.name}: not planned: {j.plan_error}")
    p = c.pool
    wr = f"{p.wall_ratio:.3f}" if p.wall_ratio is not None else "-"
    rows.append(f"{'pool':<16} {human_bytes(p.vanilla_peak_bytes):>12} {'':>9} {human_bytes(p.planned_peak_bytes):>12} "
                f"{_pct(p.msr):>7} {'':>8} {'':>8} {wr:>10} (wall)")
    link = p.swap_link or (human_bytes(p.swap_bandwidth_bytes_per_s) + "/s" if p.swap_bandwidth_bytes_per_s
                           else "unlimited")
    rows.append(f"swap link {link}: {human_bytes(p.swapped_bytes)} moved, {p.late_swap_ins} late swap-ins "
                f"of {p.checked_swap_ins} checked, host store peak {human_bytes(p.host_store_peak_bytes)}; "
                f"OOMs vanilla {p.vanilla_ooms}, planned {p.planned_ooms}")
    rows.append("training identical bit for bit: " + ("yes" if c.all_match else "NO"))
    return "\n".join(rows)
