"""Search outputs: results.json and Optuna's own plots (OPTUNA_PLOTS:
objective.png, params.png, importances.png, parallel_coordinates.png,
contour.png; a plot Optuna cannot draw yet is named in ``plots_skipped``).

Everything comes from the study, so the outputs of a resumed search, or of
any one worker of a shared study, describe every trial in the study.

results.json schema::

    {"schema_version": the runtime's SCHEMA_VERSION,
     "study": {"name", "storage", "direction", "metric", "n_trials"},
     "pool": {"capacity"},
     "worker": {"host", "pid", "wall_s", "trials_run", "trials_per_hour", "requeued",
                "most_trials_running", "time_breakdown": seconds per phase summed over this
                worker's trials (Note [Where a trial's time goes]) and "tell", "core_waits":
                trial starts put off while the cores were busy (Note [Admitting by the cores]),
                "core_gains": {trials at once: measured throughput over one fewer} (Note
                [Admitting by marginal throughput])},
     "counts": {"COMPLETE": n, "PRUNED": n, "FAIL": n, ...},
     "packing_oom_retries": n (trials re-queued after a packing OOM, run alone),
     "best": {"number", "value", "params"} | null,
     "trials": [TrialRecord: {"number", "state", "params", "value",
                 "job": TrialFacts (the job's JobRecord facts, started_at, ended_at),
                 "worker", "interrupted", "retry_of", "intermediate_values"}],
     "plots_skipped": {"plot": "why"}}

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
    validation: list[dict[str, Any]] | None = None   # each validation: step, at_s, loss, metrics, seconds
    error: str | None = None
    error_type: str | None = None
    traceback_path: str | None = None
    started_at: float | None = None    # Unix time of admission
    ended_at: float | None = None
    times: dict[str, float] | None = None   # seconds per phase (Note [Where a trial's time goes])
    traced_step_from: str | None = None   # the ended trial's job whose traced step it trained (traced_step_reuse.py)

    @classmethod
    def of(cls, record: JobRecord, *, started_at: float | None, ended_at: float | None) -> "TrialFacts":
        return cls(job=record.name, status=record.status, steps=record.steps,
                   steps_requested=record.steps_requested, peak_pool_bytes=record.peak_pool_bytes,
                   training_peak_pool_bytes=record.training_peak_pool_bytes,
                   persistent_bytes=record.persistent_bytes, temporary_bytes=record.temporary_bytes,
                   leaked_bytes=record.leaked_bytes, median_step_s=record.median_step_s,
                   final_loss=record.final_loss,
                   validation=[v if isinstance(v, dict) else asdict(v) for v in record.validation],
                   error=record.error, error_type=record.error_type,
                   traceback_path=record.traceback_path, started_at=started_at, ended_at=ended_at,
                   times=record.times, traced_step_from=record.traced_step_from)

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
                      most_trials_running=result.host_result.most_jobs_running if result.host_result else None,
                      time_breakdown=result.time_breakdown, core_waits=result.core_waits,
                      core_gains={str(k): v for k, v in result.core_gains.items()})
    return {
        "schema_version": SCHEMA_VERSION,
        "study": {"name": study.study_name, "storage": st.redact(storage_url),
                  "direction": study.direction.name.lower(), "metric": metric, "n_trials": n_trials},
        "pool": {"capacity": capacity},
        "worker": worker,
        "counts": counts,
        # trials that ran out of pool memory beside others and were re-queued to run alone
        "packing_oom_retries": sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get(st.OOM_RETRIES_ATTR)),
        "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params},
        "trials": trials,
    }


# Optuna's own plots (optuna.visualization.matplotlib), file -> function name.
# The slice plot draws a log-searched parameter on a log axis.
OPTUNA_PLOTS = {
    "objective": "plot_optimization_history",
    "params": "plot_slice",
    "importances": "plot_param_importances",
    "parallel_coordinates": "plot_parallel_coordinate",
    "contour": "plot_contour",
}


def write_optuna_plots(study: optuna.Study, out: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Each of OPTUNA_PLOTS as OUT/NAME.png; returns (written, skipped with
    Optuna's reason: e.g. importances need two finished trials, a contour
    two parameters)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import NullFormatter
    from optuna.visualization import matplotlib as vis

    written, skipped = {}, {}
    for name, function in OPTUNA_PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = getattr(vis, function)(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            skipped[name] = f"{function}: {e}"
            continue
        fig = (np.asarray(axes).flat[0] if isinstance(axes, np.ndarray) else axes).figure
        if not fig.axes or not any(ax.has_data() for ax in fig.axes):
            skipped[name] = f"{function}: nothing to draw yet (no finished trial with these parameters)"
            plt.close(fig)
            continue
        for ax in fig.axes:   # log axes: decade labels only (minor labels overlap on short ranges)
            for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
                if scale == "log":
                    axis.set_minor_formatter(NullFormatter())
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written[name] = path
    return written, skipped


def write_search_outputs(results: dict[str, Any], out_dir: str | Path, study: optuna.Study) -> dict[str, Path]:
    """results.json and Optuna's plots (OPTUNA_PLOTS; the plots that could
    not be drawn are listed in results.json ``plots_skipped``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = write_optuna_plots(study, out)
    results = dict(results, plots_skipped=skipped)
    paths = {"results": out / "results.json", **written}
    paths["results"].write_text(json.dumps(results, indent=2, default=str))
    return paths
