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
"""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from typing import Any

from tensile_tf.runtime.records import JobState, JobStatus, RunResult
from tensile_tf.units import human_bytes


def _bits(losses: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in losses]  # NaN == NaN, -0.0 != 0.0


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _msr(vanilla: int | None, planned: int | None) -> float | None:
    return (vanilla - planned) / vanilla if vanilla and planned is not None else None


def _window_peaks(state: JobState, steps: int) -> list[int]:
    return [r.peak_bytes for r in state.records if 1 <= r.index < steps]


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
    credited_msr: float | None           # msr when above vanilla's spread and the plan changed the step, else 0
    predicted_vanilla_peak_bytes: int | None
    predicted_msr: float | None
    vanilla_median_step_s: float | None
    planned_median_step_s: float | None
    time_ratio: float | None
    plan_changes_step: bool
    swapped_bytes_per_step: int
    swap_outs: int
    recomputed_ops: int
    plan_error: str | None
    losses_match: bool
    weights_match: bool


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
    changes = p.plan is not None and p.plan.changes_step
    credited = None
    if msr is not None:
        beyond_noise = spread is not None and vpeak - ppeak > spread
        credited = msr if changes and beyond_noise else 0.0
    return JobComparison(
        name=v.name, vanilla_status=v.status.value, planned_status=p.status.value, window_steps=steps,
        vanilla_peak_bytes=vpeak, planned_peak_bytes=ppeak, vanilla_spread_bytes=spread, msr=msr,
        credited_msr=credited,
        predicted_vanilla_peak_bytes=p.plan.predicted_vanilla_peak_bytes if p.plan else None,
        predicted_msr=p.plan.predicted_msr if p.plan else None,
        vanilla_median_step_s=v.median_step_s, planned_median_step_s=p.median_step_s,
        time_ratio=_ratio(p.median_step_s, v.median_step_s), plan_changes_step=changes,
        swapped_bytes_per_step=p.plan.swapped_bytes_per_step if p.plan else 0,
        swap_outs=(p.plan.rewrite.get("activation_swap_outs", 0) + p.plan.rewrite.get("variable_swap_outs", 0))
        if p.plan else 0,
        recomputed_ops=p.plan.recomputed_ops if p.plan else 0, plan_error=p.plan_error,
        losses_match=both_finished and _bits([r.loss for r in v.records]) == _bits([r.loss for r in p.records]),
        weights_match=both_finished and v.weights_digest is not None and v.weights_digest == p.weights_digest)


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


def format_comparison(c: Comparison) -> str:
    """The comparison as a plain-text table (one row per job, then the pool)."""
    head = (f"{'job':<16} {'vanilla peak':>12} {'±spread':>9} {'planned peak':>12} {'MSR':>7} {'credited':>8} "
            f"{'pred MSR':>8} {'time ratio':>10} {'swap/step':>10} {'recomp':>6} {'losses':>7} {'weights':>7}")
    rows = [head]
    for j in c.jobs:
        tr = f"{j.time_ratio:.3f}" if j.time_ratio is not None else "-"
        rows.append(
            f"{j.name:<16} {human_bytes(j.vanilla_peak_bytes):>12} {human_bytes(j.vanilla_spread_bytes):>9} "
            f"{human_bytes(j.planned_peak_bytes):>12} {_pct(j.msr):>7} {_pct(j.credited_msr):>8} "
            f"{_pct(j.predicted_msr):>8} {tr:>10} {human_bytes(j.swapped_bytes_per_step):>10} {j.recomputed_ops:>6} "
            f"{'same' if j.losses_match else 'DIFF':>7} {'same' if j.weights_match else 'DIFF':>7}")
        if j.msr and not j.credited_msr:
            why = "the plan does not change its step" if not j.plan_changes_step else \
                "within vanilla's own step-to-step spread"
            rows.append(f"  {j.name}: the {_pct(j.msr)} difference is not credited to the plan: {why}")
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
