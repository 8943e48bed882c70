"""Run outputs: results.json, trace.json (Chrome / Perfetto) and memory.png.

results.json is ``RunResult.results_document()`` (schema in
tensile_tf/runtime/records.py, versioned by ``SCHEMA_VERSION``). trace.json
holds one track per job with its steps (complete events), the per-job pool
bytes sampled over the whole run, the pool's exact bytes in use from its
event trace, and the pool's sync and OOM events.

Note [Trace coverage]
The pool keeps its last TENSILE_POOL_TRACE_EVENTS events (a ring; a 55 s
four-job run makes about a million). The sampled per-job series covers the
whole run at ``sample_interval_s``; the exact counter covers what the ring
kept. results.json's ``trace`` says how many events the run made, how many
were kept and from when, and trace.json's metadata repeats it, so nothing
is dropped silently.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tensile_tf.config.schema import PlanPeaks
from tensile_tf.runtime.records import RunResult, finite_or_none
from tensile_tf.units import human_bytes

# Chrome traces cap comfortably around a few hundred thousand events.
_MAX_COUNTER_EVENTS = 50_000


def chrome_trace(result: RunResult) -> dict[str, Any]:
    cov = result.trace
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "tensile jobs"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "device pool"}},
    ]
    for tid, s in enumerate(result.jobs, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": s.name}})
        for r in s.records:
            events.append({"ph": "X", "name": f"step {r.index}", "pid": 1, "tid": tid,
                           "ts": r.start_s * 1e6, "dur": r.duration_s * 1e6,
                           "args": {"loss": finite_or_none(r.loss), "peak_bytes": r.peak_bytes}})
        if s.error:
            events.append({"ph": "i", "name": f"{s.status.value}: {s.error[:200]}", "pid": 1, "tid": tid,
                           "s": "t", "ts": (s.ended_at_s or 0) * 1e6})
    for r in _replans(result):   # Note [Re-planning on events]
        events.append({"ph": "i", "name": f"re-plan: {r.reason}" + (" (failed)" if r.error else " (not started)" if r.skipped else ""),
                       "pid": 1, "s": "p", "ts": r.at_s * 1e6,
                       "args": {"jobs": [j.name for j in r.jobs], "error": r.error, "skipped": r.skipped,
                                "predicted_peak_sum_before_bytes": r.predicted_peak_sum_before_bytes,
                                "predicted_peak_sum_after_bytes": r.predicted_peak_sum_after_bytes}})
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
    metadata = {"pool_events_in_run": cov.events_in_run, "pool_events_kept": cov.events_kept,
                "pool_events_dropped": cov.events_dropped, "exact_counter_from_s": cov.kept_from_s,
                "counter_stride": stride, "sampled_series": f"{cov.samples} samples over the whole run",
                "note": cov.how_to_keep_all}
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}


def _replans(result: RunResult) -> list:
    return result.planner.replans if result.planner is not None else []


# Pool streams that are not jobs, named for a reader.
_OTHER_SERIES = {"default": "outside any job (eager tensors, inputs)"}


def write_memory_png(result: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in result.jobs]
    others = sorted({n for m in result.samples for n in m.jobs} - set(names))
    series = names + others
    labels = [f"job {n}" for n in names] + [_OTHER_SERIES.get(n, f"stream {n}") for n in others]
    t = [m.t_s for m in result.samples]
    stacks = [[m.jobs.get(n, 0) / 2**20 for m in result.samples] for n in series]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if t:
        ax.stackplot(t, stacks, labels=labels, alpha=0.85)
    capacity = result.capacity / 2**20
    used = max((sum(col) for col in zip(*stacks)), default=0.0)
    # Scaled to what was used; the capacity line when it is near, else named in the title.
    top = capacity * 1.05 if capacity <= max(used, 1e-9) * 2.5 else max(used * 1.3, 1.0)
    if capacity <= top:
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"pool capacity ({capacity:.0f} MiB)")
    for k, r in enumerate(_replans(result)):
        ax.axvline(r.at_s, color="tab:red" if r.error else "tab:purple", linestyle=":", linewidth=1.2,
                   label=("re-plan" if k == 0 else None))
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("pool memory in use (MiB)")
    title = "device pool memory in use, stacked by job"
    if capacity > top:
        title += f" (pool capacity {capacity:.0f} MiB, above the chart)"
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    ax.set_ylim(0, top)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# How ``tensile plan`` labels the pool's prediction, by the peak model it was planned with.
_POOL_ROW = {PlanPeaks.timeline: "pool (time-aligned)", PlanPeaks.coincident: "pool (sum of peaks)",
             PlanPeaks.paired: "pool (paired peaks)"}


def format_plan_summary(plan) -> str:
    """A Plan's *predicted* vanilla (free-running) and planned peaks per job
    and for the pool, one line each (``tensile plan``)."""
    rows = [f"{'job (predicted)':<20} {'vanilla peak':>13} {'planned peak':>13} {'MSR':>6} {'swaps':>6} "
            f"{'recomp':>6} {'iter s':>9} {'+recomp s':>9}"]
    for jp in plan.jobs.values():
        rows.append(f"{jp.name:<20} {human_bytes(jp.vanilla_peak_bytes):>13} {human_bytes(jp.planned_peak_bytes):>13} "
                    f"{jp.msr:>6.1%} {len(jp.swap_ins):>6} {len(jp.recomputes):>6} "
                    f"{jp.iteration_s:>9.4f} {jp.planned_iteration_s - jp.iteration_s:>9.4f}"
                    + ("  (in plan order, no swaps)" if jp.order_only else "")
                    + ("  (ops free of plan order)" if jp.step_order == "free" and jp.changes_step else ""))
    pool_row = _POOL_ROW[PlanPeaks(plan.peak_model)]
    rows.append(f"{pool_row:<20} {human_bytes(plan.pool_vanilla_peak_bytes):>13} "
                f"{human_bytes(plan.pool_planned_peak_bytes):>13} {plan.msr:>6.1%}")
    budget = "none (minimise)" if plan.pool_bytes is None else human_bytes(plan.pool_bytes)
    rows.append(f"budget {budget}: {'met' if plan.budget_met else 'NOT met'}; sum of per-job peaks "
                f"{human_bytes(plan.sum_of_job_peaks_bytes)}; swap link {human_bytes(plan.bandwidth_bytes_per_s)}/s; "
                f"{plan.iterations} iterations, {plan.planning_s * 1e3:.1f} ms; stop: {plan.stop_reason}")
    return "\n".join(rows)


def format_unplanned_peaks(plan, peaks) -> str:
    """Per job of ``plan``, what its predicted unplanned peak is made of: the
    spread of the traced free-running steps and, when the prediction is
    above them, the scratch that meets in the worst step (``tensile plan``;
    Note [Scratch that meets] in tensile_tf/tf/unplanned_peaks.py). ``peaks``:
    job -> ``UnplannedPeaks`` (or None: a cold capture, nothing traced)."""
    rows = []
    for name in plan.jobs:
        p = peaks.get(name)
        rows.append(f"{name}: " + (p.describe() if p is not None else "unplanned peak not traced (cold start)"))
    return "\n".join(rows)


def write_failure_tracebacks(result: RunResult, out: Path) -> None:
    """Each failed job's whole traceback into ``failures/JOB.txt``; the job's
    ``traceback_path`` (relative to results.json) points at it."""
    for state in result.jobs:
        if state.traceback:
            path = out / "failures" / f"{state.name}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_text(f"job {state.name!r} {state.status.value}: {state.error}\n\n{state.traceback}")
            state.traceback_path = str(path.relative_to(out))


def write_tensorboard(result: RunResult, out: Path) -> None:
    """One TensorBoard run per job (``tensorboard --logdir OUT/tensorboard``):
    per step its loss, step time and the pool bytes its step peaked at; each
    validation's loss and metrics; each re-plan it took part in (its planned
    swap-outs after it, at the step it switched), from what the run recorded."""
    import tensorflow as tf

    for state in result.jobs:
        if not state.records:
            continue
        writer = tf.summary.create_file_writer(str(out / state.name))
        with writer.as_default():
            for r in state.records:
                if r.loss is not None and math.isfinite(r.loss):
                    tf.summary.scalar("train/loss", r.loss, step=r.index)
                tf.summary.scalar("train/step_time_s", r.duration_s, step=r.index)
                tf.summary.scalar("memory/step_peak_pool_MiB", r.peak_bytes / 2**20, step=r.index)
            for v in state.validation:
                tf.summary.scalar("validation/loss", v.loss, step=v.step)
                for name, value in v.metrics.items():
                    tf.summary.scalar(f"validation/{name}", value, step=v.step)
            for r in _replans(result):
                for j in r.jobs:
                    if j.name == state.name and j.switched_at_step is not None:
                        tf.summary.scalar("plan/swap_outs_per_step", j.swaps_after, step=j.switched_at_step)
                        tf.summary.text("plan/re-plans", f"{r.reason}: swaps {j.swaps_before} -> {j.swaps_after}",
                                        step=j.switched_at_step)
        writer.flush()
        writer.close()


def write_outputs(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Writes results.json, trace.json, memory.png and tensorboard/ (and
    failed jobs' tracebacks, failures/) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_failure_tracebacks(result, out)
    paths = {"results": out / "results.json", "trace": out / "trace.json", "memory": out / "memory.png",
             "tensorboard": out / "tensorboard"}
    paths["results"].write_text(json.dumps(result.results_document(), indent=2))
    paths["trace"].write_text(json.dumps(chrome_trace(result)))
    write_memory_png(result, paths["memory"])
    write_tensorboard(result, paths["tensorboard"])
    return paths
