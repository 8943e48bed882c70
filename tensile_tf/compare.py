"""``tensile run --compare-vanilla``: one config run unplanned and planned.

``compare_runs`` takes the two RunResults and reports, per job and for the
pool, the metrics of DESIGN.md: vanilla and planned training peak (VMP, EMP:
peaks while the jobs train, after the probe step and planning, which run
the vanilla step in both runs), MSR =
(VMP - EMP) / VMP, time ratio = ETC / VTC (median step), bytes over the swap
link, recomputed ops, late swap-ins, and whether the losses and the final
weights (model and optimizer variables) matched bit for bit. The plan must
never change what training computes, so a mismatch is a bug.
"""
from __future__ import annotations

import struct
from typing import Any

from tf_plugin import human_bytes
from tensile_tf.host import JobStatus, RunResult


def _bits(losses: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in losses]  # NaN == NaN, -0.0 != 0.0


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _msr(vanilla: int | None, planned: int | None) -> float | None:
    return (vanilla - planned) / vanilla if vanilla and planned is not None else None


def compare_runs(vanilla: RunResult, planned: RunResult) -> dict[str, Any]:
    by_name = {s.name: s for s in planned.jobs}
    jobs = []
    for v in vanilla.jobs:
        p = by_name.get(v.name)
        if p is None:
            continue
        both_finished = v.status == JobStatus.finished and p.status == JobStatus.finished
        rewrite = (p.plan or {}).get("rewrite", {})
        jobs.append({
            "name": v.name,
            "vanilla_status": v.status.value,
            "planned_status": p.status.value,
            "vanilla_peak_bytes": v.training_peak_bytes,
            "planned_peak_bytes": p.training_peak_bytes,
            "msr": _msr(v.training_peak_bytes, p.training_peak_bytes),
            "predicted_msr": (p.plan or {}).get("predicted_msr"),
            "vanilla_median_step_s": v.median_step_s,
            "planned_median_step_s": p.median_step_s,
            "time_ratio": _ratio(p.median_step_s, v.median_step_s),
            "swapped_bytes_per_step": rewrite.get("swapped_bytes_per_step", 0),
            "swap_outs": rewrite.get("activation_swap_outs", 0) + rewrite.get("variable_swap_outs", 0),
            "recomputed_ops": rewrite.get("recomputed_ops", 0),
            "plan_error": p.plan_error,
            "losses_match": both_finished and _bits([r.loss for r in v.records]) == _bits([r.loss for r in p.records]),
            "weights_match": both_finished and v.weights_digest is not None
            and v.weights_digest == p.weights_digest,
        })
    channel = (planned.planner or {}).get("swap", {}).get("channel", {})
    host = (planned.planner or {}).get("swap", {}).get("host", {})
    vpeak, ppeak = vanilla.pool["training_peak"], planned.pool["training_peak"]
    pool = {
        "capacity": vanilla.capacity,
        "vanilla_peak_bytes": vpeak,
        "planned_peak_bytes": ppeak,
        "msr": _msr(vpeak, ppeak),
        "vanilla_run_peak_bytes": vanilla.pool["peak"],
        "planned_run_peak_bytes": planned.pool["peak"],
        "vanilla_wall_s": vanilla.wall_s,
        "planned_wall_s": planned.wall_s,
        "wall_ratio": _ratio(planned.wall_s, vanilla.wall_s),
        "swapped_bytes": channel.get("bytes_out", 0) + channel.get("bytes_in", 0),
        "late_swap_ins": channel.get("late_swap_ins", 0),
        "checked_swap_ins": channel.get("checked_swap_ins", 0),
        "host_store_peak_bytes": host.get("peak", 0),
        "swap_bandwidth_bytes_per_s": (planned.planner or {}).get("swap_bandwidth"),
        "vanilla_ooms": vanilla.pool["run_ooms"],
        "planned_ooms": planned.pool["run_ooms"],
    }
    return {"jobs": jobs, "pool": pool,
            "all_match": bool(jobs) and all(j["losses_match"] and j["weights_match"] for j in jobs)}


def _b(n: int | None) -> str:
    return human_bytes(n) if n is not None else "-"


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def format_comparison(c: dict[str, Any]) -> str:
    """The comparison as a plain-text table (one row per job, then the pool)."""
    head = (f"{'job':<16} {'vanilla peak':>12} {'planned peak':>12} {'MSR':>7} {'pred MSR':>8} "
            f"{'time ratio':>10} {'swap/step':>10} {'recomp':>6} {'losses':>7} {'weights':>7}")
    rows = [head]
    for j in c["jobs"]:
        tr = f"{j['time_ratio']:.3f}" if j["time_ratio"] is not None else "-"
        rows.append(
            f"{j['name']:<16} {_b(j['vanilla_peak_bytes']):>12} {_b(j['planned_peak_bytes']):>12} "
            f"{_pct(j['msr']):>7} {_pct(j['predicted_msr']):>8} {tr:>10} "
            f"{human_bytes(j['swapped_bytes_per_step']):>10} {j['recomputed_ops']:>6} "
            f"{'same' if j['losses_match'] else 'DIFF':>7} {'same' if j['weights_match'] else 'DIFF':>7}")
        if j["vanilla_status"] != "finished" or j["planned_status"] != "finished":
            rows.append(f"  {j['name']}: vanilla {j['vanilla_status']}, planned {j['planned_status']}")
        if j["plan_error"]:
            rows.append(f"  {j['name']}: not planned: {j['plan_error']}")
    p = c["pool"]
    wr = f"{p['wall_ratio']:.3f}" if p["wall_ratio"] is not None else "-"
    rows.append(f"{'pool':<16} {human_bytes(p['vanilla_peak_bytes']):>12} {human_bytes(p['planned_peak_bytes']):>12} "
                f"{_pct(p['msr']):>7} {'':>8} {wr:>10} (wall)")
    link = human_bytes(p["swap_bandwidth_bytes_per_s"]) + "/s" if p["swap_bandwidth_bytes_per_s"] else "unlimited"
    rows.append(f"swap link {link}: {human_bytes(p['swapped_bytes'])} moved, {p['late_swap_ins']} late swap-ins "
                f"of {p['checked_swap_ins']} checked, host store peak {human_bytes(p['host_store_peak_bytes'])}; "
                f"OOMs vanilla {p['vanilla_ooms']}, planned {p['planned_ooms']}")
    rows.append("training identical bit for bit: " + ("yes" if c["all_match"] else "NO"))
    return "\n".join(rows)
