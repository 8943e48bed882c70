"""Search outputs: results.json, objective.png and params.png.

Everything comes from the study, so the outputs of a resumed search, or of
any one worker of a shared study, describe every trial in the study.

results.json schema::

    {"schema_version": the runtime's SCHEMA_VERSION,
     "study": {"name", "storage", "direction", "metric", "n_trials"},
     "pool": {"capacity"},
     "worker": {"host", "pid", "wall_s", "trials_run", "trials_per_hour", "requeued"},
     "counts": {"COMPLETE": n, "PRUNED": n, "FAIL": n, ...},
     "best": {"number", "value", "params"} | null,
     "trials": [TrialRecord: {"number", "state", "params", "value",
                 "job": TrialFacts (the job's JobRecord facts, started_at, ended_at),
                 "worker", "interrupted", "retry_of", "intermediate_values"}]}

``started_at`` / ``ended_at`` are Unix times of the job's admission and end
(training only: the probe step runs before admission).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tensile_tf.runtime.records import SCHEMA_VERSION, JobRecord
from tensile_tf.search import storage as st


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


@dataclass
class TrialFacts:
    """What a trial's job did: its JobRecord's facts (the results.json
    schema, tensile_tf.runtime.records) plus wall-clock times. The driver
    stores it in the trial's user attributes (``storage.JOB_ATTR``) and
    results.json reads it back through ``from_attrs``, so both sides share
    one set of keys."""

    job: str | None = None
    status: str | None = None          # JobStatus value, or "invalid" (the trial's params make no job)
    steps: int | None = None
    steps_requested: int | None = None
    peak_pool_bytes: int | None = None
    training_peak_pool_bytes: int | None = None
    persistent_bytes: int | None = None
    temporary_bytes: int | None = None
    leaked_bytes: int | None = None
    median_step_s: float | None = None
    final_loss: float | None = None
    error: str | None = None
    error_type: str | None = None
    traceback_path: str | None = None
    started_at: float | None = None    # Unix time of admission
    ended_at: float | None = None

    @classmethod
    def of(cls, record: JobRecord, *, started_at: float | None, ended_at: float | None) -> "TrialFacts":
        return cls(job=record.name, status=record.status, steps=record.steps,
                   steps_requested=record.steps_requested, peak_pool_bytes=record.peak_pool_bytes,
                   training_peak_pool_bytes=record.training_peak_pool_bytes,
                   persistent_bytes=record.persistent_bytes, temporary_bytes=record.temporary_bytes,
                   leaked_bytes=record.leaked_bytes, median_step_s=record.median_step_s,
                   final_loss=record.final_loss, error=record.error, error_type=record.error_type,
                   traceback_path=record.traceback_path, started_at=started_at, ended_at=ended_at)

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any] | None) -> "TrialFacts":
        """Reads what ``to_attrs`` stored (a study written by an older
        version may lack keys: they read as None)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (attrs or {}).items() if k in known})

    def to_attrs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrialRecord:
    """One trial in the search's results.json."""

    number: int
    state: str                          # Optuna's TrialState name
    params: dict[str, Any]
    value: float | None
    job: TrialFacts
    worker: dict[str, Any] | None
    interrupted: str | None             # why the trial was cut short (it was re-queued)
    retry_of: int | None
    intermediate_values: dict[str, float | None]

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> "TrialRecord":
        attrs = t.user_attrs
        return cls(number=t.number, state=t.state.name, params=t.params,
                   value=_finite(t.value) if t.state == TrialState.COMPLETE else None,
                   job=TrialFacts.from_attrs(attrs.get(st.JOB_ATTR)), worker=attrs.get(st.WORKER_ATTR),
                   interrupted=attrs.get(st.INTERRUPTED_ATTR), retry_of=attrs.get(st.RETRY_ATTR),
                   intermediate_values={str(k): _finite(v) for k, v in sorted(t.intermediate_values.items())})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trial_dict(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return TrialRecord.of(t).to_dict()


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:
        return None


def results_dict(study: optuna.Study, *, storage_url: str, metric: str, n_trials: int | None,
                 capacity: int | None, result=None) -> dict[str, Any]:
    trials = [trial_dict(t) for t in study.get_trials(deepcopy=False)]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    best = best_trial(study)
    worker: dict[str, Any] = dict(st.this_worker())
    if result is not None:
        ended = [r for r in result.trials if r.told is not None]
        worker.update(wall_s=result.wall_s, trials_run=len(ended),
                      trials_per_hour=len(ended) / result.wall_s * 3600 if result.wall_s > 0 else None,
                      requeued=result.requeued,
                      most_trials_running=result.host_result.most_jobs_running if result.host_result else None)
    return {
        "schema_version": SCHEMA_VERSION,
        "study": {"name": study.study_name, "storage": st.redact(storage_url),
                  "direction": study.direction.name.lower(), "metric": metric, "n_trials": n_trials},
        "pool": {"capacity": capacity},
        "worker": worker,
        "counts": counts,
        "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params},
        "trials": trials,
    }


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_COLORS = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red"}


def _shown_value(t: dict[str, Any]) -> float | None:
    """COMPLETE: the objective; PRUNED: its last reported value."""
    if t["state"] == "COMPLETE":
        return t["value"]
    if t["state"] == "PRUNED" and t["intermediate_values"]:
        return list(t["intermediate_values"].values())[-1]
    return None


def write_objective_png(results: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    maximize = results["study"]["direction"] == "maximize"
    for state, color in _COLORS.items():
        pts = [(t["number"], _shown_value(t)) for t in results["trials"] if t["state"] == state]
        pts = [(n, v) for n, v in pts if v is not None]
        if pts:
            ax.scatter(*zip(*pts), color=color, label=state.lower(), s=28, zorder=3)
    fails = [t["number"] for t in results["trials"] if t["state"] == "FAIL"]
    for n in fails:
        ax.axvline(n, color=_COLORS["FAIL"], alpha=0.25, linewidth=1)
    best, line = None, []
    for t in sorted(results["trials"], key=lambda t: t["number"]):
        if t["state"] == "COMPLETE" and t["value"] is not None:
            if best is None or (t["value"] > best if maximize else t["value"] < best):
                best = t["value"]
        if best is not None:
            line.append((t["number"], best))
    if line:
        ax.step(*zip(*line), where="post", color="black", linewidth=1, label="best so far")
    if fails:
        ax.plot([], [], color=_COLORS["FAIL"], alpha=0.4, label="failed (no value)")
    shown = [v for v in map(_shown_value, results["trials"]) if v is not None]
    if shown and min(shown) > 0 and max(shown) / min(shown) > 100:
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel(results["study"]["metric"])
    ax.set_title(f"study {results['study']['name']}: objective by trial ({results['study']['direction']})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_params_png(results: dict[str, Any], path: Path) -> None:
    plt = _plt()
    names = sorted({k for t in results["trials"] for k in t["params"]})
    cols = max(1, min(3, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        values = [t["params"][name] for t in results["trials"] if name in t["params"]]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        labels = sorted({json.dumps(v) for v in values}) if not numeric else None
        for state, color in _COLORS.items():
            pts = [(t["params"][name], _shown_value(t)) for t in results["trials"]
                   if t["state"] == state and name in t["params"] and _shown_value(t) is not None]
            if not pts:
                continue
            xs = [x if numeric else labels.index(json.dumps(x)) for x, _ in pts]
            ax.scatter(xs, [y for _, y in pts], color=color, s=24, label=state.lower())
        if numeric and values and min(values) > 0 and max(values) / min(values) >= 20:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize="small")
        ax.set_xlabel(name)
        ax.set_ylabel(results["study"]["metric"])
    if names:
        axes.flat[0].legend(fontsize="small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.suptitle("parameters against objective (pruned: last reported value)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_search_outputs(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "objective": out / "objective.png", "params": out / "params.png"}
    paths["results"].write_text(json.dumps(results, indent=2, default=str))
    write_objective_png(results, paths["objective"])
    write_params_png(results, paths["params"])
    return paths
