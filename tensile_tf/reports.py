"""Run outputs: results.json, trace.json (Chrome / Perfetto) and memory.png.

results.json schema::

    {"pool": {"capacity", "peak", "current", "stats": {...pool_stats()...}},
     "wall_s": float,
     "jobs": [{"name", "status", "error", "error_type", "steps", "median_step_s",
               "peak_pool_bytes", "persistent_bytes", "temporary_bytes",
               "leaked_bytes", "final_loss", "losses", "weights_digest",
               "plan": {...} or null, "plan_error"}],
     "planner": {"plans": [...], "swap": {"channel": {...}, "host": {...}}} (planner runs)}

trace.json holds one track per job with its steps (complete events), the
pool's bytes in use as a counter, and the pool's sync and OOM events.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tensile_tf.host import RunResult

# Chrome traces cap comfortably around a few hundred thousand events.
_MAX_COUNTER_EVENTS = 50_000


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def results_dict(result: RunResult) -> dict[str, Any]:
    jobs = []
    for s in result.jobs:
        jobs.append({
            "name": s.name,
            "status": s.status.value,
            "error": s.error,
            "error_type": s.error_type,
            "steps": s.steps_done,
            "steps_requested": s.job.steps,
            "median_step_s": s.median_step_s,
            "peak_pool_bytes": s.peak_bytes,
            "training_peak_pool_bytes": s.training_peak_bytes,
            "persistent_bytes": s.persistent_bytes,
            "temporary_bytes": s.temporary_bytes,
            "leaked_bytes": s.leaked_bytes,
            "final_loss": _finite(s.last_loss),
            "losses": [_finite(r.loss) for r in s.records],
            "admitted_at_s": s.admitted_at_s,
            "ended_at_s": s.ended_at_s,
            "weights_digest": s.weights_digest,
            "plan": s.plan,
            "plan_error": s.plan_error,
        })
    stats = {k: v for k, v in result.pool.items() if k != "jobs"}
    return {
        "pool": {"capacity": result.capacity, "peak": result.pool["peak"],
                 "training_peak": result.pool.get("training_peak"),
                 "run_ooms": result.pool.get("run_ooms"),
                 "current": result.pool["current"], "stats": stats},
        "wall_s": result.wall_s,
        "jobs": jobs,
        **({"planner": result.planner} if result.planner is not None else {}),
    }


def chrome_trace(result: RunResult) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "tensile jobs"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "device pool"}},
    ]
    for tid, s in enumerate(result.jobs, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": s.name}})
        for r in s.records:
            events.append({"ph": "X", "name": f"step {r.index}", "pid": 1, "tid": tid,
                           "ts": r.start_s * 1e6, "dur": r.duration_s * 1e6,
                           "args": {"loss": _finite(r.loss)}})
        if s.error:
            events.append({"ph": "i", "name": f"{s.status.value}: {s.error[:200]}", "pid": 1, "tid": tid,
                           "s": "t", "ts": (s.ended_at_s or 0) * 1e6})
    names = sorted({name for m in result.samples for name in m.jobs})
    for m in result.samples:
        events.append({"ph": "C", "name": "pool bytes by job", "pid": 2, "ts": m.t_s * 1e6,
                       "args": {name: m.jobs.get(name, 0) for name in names}})
    pool_events = result.pool_events
    stride = max(1, len(pool_events) // _MAX_COUNTER_EVENTS)
    for i, e in enumerate(pool_events):
        ts = (e["time_ns"] - result.trace_origin_ns) / 1e3
        if ts < 0:
            continue
        if e["kind"] in ("sync", "oom"):
            events.append({"ph": "i", "name": e["kind"], "pid": 2, "tid": 1, "s": "p", "ts": ts,
                           "args": {"stream": e["stream"], "bytes": e["bytes"], "op": e["op"]}})
        elif i % stride == 0:
            events.append({"ph": "C", "name": "pool current bytes", "pid": 2, "ts": ts,
                           "args": {"current": e["pool_current"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_memory_png(result: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in result.jobs]
    others = sorted({n for m in result.samples for n in m.jobs} - set(names))
    series = names + others
    t = [m.t_s for m in result.samples]
    stacks = [[m.jobs.get(n, 0) / 2**20 for m in result.samples] for n in series]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if t:
        ax.stackplot(t, stacks, labels=series, alpha=0.85)
    ax.axhline(result.capacity / 2**20, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("pool bytes in use (MiB)")
    ax.set_title("device pool usage by job")
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    ax.set_ylim(0, result.capacity / 2**20 * 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Writes results.json, trace.json and memory.png into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "trace": out / "trace.json", "memory": out / "memory.png"}
    paths["results"].write_text(json.dumps(results_dict(result), indent=2))
    paths["trace"].write_text(json.dumps(chrome_trace(result)))
    write_memory_png(result, paths["memory"])
    return paths
