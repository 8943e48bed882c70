"""The learned cold-start latency predictor (seed 000 §IV-A).

Before a job's step has run, the planner needs each op's latency. The seed
predicts it with an MLP over op features; this module is that predictor:
``LatencyPredictor`` fits scikit-learn's ``MLPRegressor`` (op type one-hot,
log bytes read / written / updated, a log FLOPs proxy, input and output
counts; target log seconds) to latencies measured on the user's own machine
by ``tensile calibrate`` (tensile_tf/tf/calibration.py), which caches it in the
user cache directory. ``cold_start_latency`` returns ``LearnedLatency`` when a
predictor is given and ``ColdStartLatency`` (bytes touched, no training)
otherwise.

Note [FLOPs proxy]
A JobGraph keeps tensor sizes, not shapes. For a matrix product C = A B with
A m x k, B k x n: |A| |B| |C| = (m k n)^2, so sqrt(|A| |B| |C|) is m k n, the
product's multiply-adds, up to the element size. The feature is
log(sqrt(product of the op's two largest inputs and its largest output));
for convolutions and elementwise ops it is a size, not FLOPs, and the
regressor weighs it per op type.

Note [Predictor cache]
The cache holds the fitted predictor and what it was fitted for: the feature
version, the scikit-learn version and the machine (``environment``, from the
caller: CPU model, cores, TensorFlow version). ``load_cached`` returns the
predictor, or None and one line that says why it is not used (unreadable,
made for another machine or version) and what rebuilds it (``tensile
calibrate``); a missing cache is silent. It never raises: a cold start then
falls back to the bytes-touched model.

Pure: no TensorFlow; scikit-learn and joblib are imported when a predictor is
fitted or loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensile_tf.scheduler.job_graph import JobGraph, OpNode
from tensile_tf.scheduler.latency import ColdStartLatency, LatencyModel, LatencyTable

FEATURE_VERSION = 1
NUMERIC_FEATURES = ("log_in_bytes", "log_out_bytes", "log_update_bytes", "log_flops_proxy", "inputs", "outputs")
CALIBRATE_COMMAND = "tensile calibrate"


def op_features(graph: JobGraph, op: OpNode) -> dict[str, Any]:
    """The features of one op (Note [FLOPs proxy])."""
    size = graph.tensors
    ins = sorted((size[t].size_bytes for t in op.inputs if t in size), reverse=True)
    outs = sorted((size[t].size_bytes for t in op.outputs if t in size), reverse=True)
    upd = sum(size[t].size_bytes for t in op.updates if t in size)
    proxy = math.sqrt(max(1, (ins[0] if ins else 1)) * max(1, (ins[1] if len(ins) > 1 else 1))
                      * max(1, (outs[0] if outs else 1)))
    return {"op_type": op.op_type or "?", "log_in_bytes": math.log1p(sum(ins)), "log_out_bytes": math.log1p(sum(outs)),
            "log_update_bytes": math.log1p(upd), "log_flops_proxy": math.log(proxy),
            "inputs": len(op.inputs), "outputs": len(op.outputs)}


@dataclass
class LatencySample:
    """One measured op: its features and seconds, and the model it came from."""

    model: str
    features: dict[str, Any]
    seconds: float


def samples_from(model: str, graph: JobGraph, measured: LatencyTable) -> list[LatencySample]:
    """Training samples: the graph's ops that the profile measured (positive seconds)."""
    return [LatencySample(model, op_features(graph, o), measured.seconds[o.name])
            for o in graph.ops if measured.seconds.get(o.name, 0) > 0]


@dataclass
class LatencyPredictor:
    """An MLP regressor of log op seconds over ``op_features``."""

    pipeline: Any = None
    trained_on: list[str] = field(default_factory=list)    # model names
    samples: int = 0

    @classmethod
    def fit(cls, samples: Sequence[LatencySample], *, seed: int = 0) -> "LatencyPredictor":
        if len(samples) < 10:
            raise ValueError(f"too few latency samples to fit a predictor: {len(samples)} (need at least 10)")
        import numpy as np
        from sklearn.compose import ColumnTransformer
        from sklearn.neural_network import MLPRegressor
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OneHotEncoder, StandardScaler

        frame = _matrix([s.features for s in samples])
        target = np.log(np.array([s.seconds for s in samples]))
        numeric = list(range(1, 1 + len(NUMERIC_FEATURES)))
        columns = ColumnTransformer([("type", OneHotEncoder(handle_unknown="ignore"), [0]),
                                     ("size", StandardScaler(), numeric)])
        pipeline = make_pipeline(columns, MLPRegressor(hidden_layer_sizes=(64, 64), max_iter=800, alpha=1e-3,
                                                       early_stopping=True, random_state=seed))
        pipeline.fit(frame, target)
        return cls(pipeline, sorted({s.model for s in samples}), len(samples))

    def predict_features(self, features: Sequence[Mapping[str, Any]]) -> list[float]:
        import numpy as np

        if not features:
            return []
        return np.exp(self.pipeline.predict(_matrix(features))).tolist()

    def predict(self, graph: JobGraph) -> dict[str, float]:
        """Seconds per op of ``graph``."""
        return dict(zip((o.name for o in graph.ops), self.predict_features([op_features(graph, o) for o in graph.ops])))

    # -- cache (Note [Predictor cache]) ---------------------------------------
    def save(self, path: str | Path, environment: Mapping[str, Any]) -> None:
        import joblib
        import sklearn

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump({"meta": _meta(environment, sklearn.__version__), "pipeline": self.pipeline,
                     "trained_on": self.trained_on, "samples": self.samples}, path)


def _matrix(features: Sequence[Mapping[str, Any]]):
    """Rows of (op type, numeric features...) as a numpy object array."""
    import numpy as np

    return np.array([[f["op_type"], *(float(f[k]) for k in NUMERIC_FEATURES)] for f in features], dtype=object)


def _meta(environment: Mapping[str, Any], sklearn_version: str) -> dict[str, Any]:
    return {"feature_version": FEATURE_VERSION, "sklearn": sklearn_version, "environment": dict(environment)}


def load_cached(path: str | Path, environment: Mapping[str, Any]) -> tuple[LatencyPredictor | None, str | None]:
    """The cached predictor, or None and why not (None when there is no cache)."""
    path = Path(path)
    if not path.exists():
        return None, None
    try:
        import joblib
        import sklearn

        blob = joblib.load(path)
        meta = blob["meta"]
        pipeline = blob["pipeline"]
    except Exception as e:  # noqa: BLE001 - any unreadable cache: fall back, say so
        return None, (f"{path}: the latency predictor cache is unreadable ({type(e).__name__}: {e}); cold starts use "
                      f"the bytes-touched model; run `{CALIBRATE_COMMAND}` to rebuild it")
    want = _meta(environment, sklearn.__version__)
    if meta != want:
        differs = sorted(k for k in set(meta) | set(want) if meta.get(k) != want.get(k))
        if "environment" in differs:
            env = meta.get("environment", {})
            differs = [f"environment.{k}" for k in sorted(set(env) | set(want["environment"]))
                       if env.get(k) != want["environment"].get(k)] + [d for d in differs if d != "environment"]
        return None, (f"{path}: the latency predictor was calibrated for another setup ({', '.join(differs)} "
                      f"differ); cold starts use the bytes-touched model; run `{CALIBRATE_COMMAND}` to rebuild it")
    return LatencyPredictor(pipeline, list(blob.get("trained_on", [])), int(blob.get("samples", 0))), None


@dataclass
class LearnedLatency:
    """Cold-start latencies from a ``LatencyPredictor`` (predicted once per graph)."""

    graph: JobGraph
    predictor: LatencyPredictor
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seconds = self.predictor.predict(self.graph)
        self.source = f"cold-start (learned on {len(self.predictor.trained_on)} models)"

    def latency_s(self, op: OpNode) -> float:
        s = self.seconds.get(op.name)
        if s is None:   # an op not in the graph it was made for
            s = self.predictor.predict_features([op_features(self.graph, op)])[0]
            self.seconds[op.name] = s
        return s


def cold_start_latency(graph: JobGraph, predictor: LatencyPredictor | None) -> LatencyModel:
    """§IV-A cold start: the learned predictor when there is one, else bytes touched."""
    return LearnedLatency(graph, predictor) if predictor is not None else ColdStartLatency(graph)


def relative_error(predicted: Mapping[str, float], measured: Mapping[str, float]) -> float:
    """Summed absolute error over the summed measured seconds, over the ops both know:
    how far a predicted step's timeline is off, as a share of the step."""
    common = [k for k in measured if k in predicted and measured[k] > 0]
    total = sum(measured[k] for k in common)
    return sum(abs(predicted[k] - measured[k]) for k in common) / total if total > 0 else float("nan")

