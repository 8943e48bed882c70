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

Note [Kernels timed alone]
The features carry sizes, not shapes, and a kernel's speed on a CPU turns
on its shapes: VGG16's Conv2DBackpropInput at 2x2 pixels and 512 channels
ran 2 GMAC/s here, at 8x8 45 GMAC/s (issue 43); the Transformer's batched
products are sized by batch x heads. Fitted on the calibration models, the
MLP alone stayed at 0.7-1.2 of the bytes-touched error on the Transformer
and on Keras families it never saw. So a cold start also runs the job's own
compute kernels (``KERNELS_TIMED_ALONE``) and every op of a type the
predictor never saw, one at a time, on inputs of their static shapes
(tensile_tf/tf/kernel_timing.py: milliseconds a model, up to 4 s for VGG16's
slow kernels), and predicts those ops as ``alone_scale`` x their time alone.
``alone_scale`` is fitted at calibration: the calibration models' measured
seconds of those ops over their times alone (0.6-0.8 on two cores, where a
profiled step's ops share the cores and are put on its wall time, Note
[Latency time base]). The MLP predicts the rest: thousands of small ops whose
cost is dispatch and bytes. Measured by benchmarks/predictor_bench.py
(benchmarks/RESULTS.md).

Note [Fused kernels]
TensorFlow's remapper runs Conv2D or MatMul, its BiasAdd and an activation
as one kernel (``_FusedConv2D``, ``_FusedMatMul``) named after the chain's
last op; the profile puts the whole chain's seconds there and none on the
others (VGG16: every Conv2D 0 ms, its Relu 1.5-4.6 ms). It fuses an op into
the next only when the next is its output's sole consumer. ``fused_chains``
finds those chains in a JobGraph, and a kernel timed alone is predicted where
the profile will find it: the chain's seconds on its last op.

Pure: no TensorFlow; scikit-learn and joblib are imported when a predictor is
fitted or loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tensile_tf.scheduler.job_graph import JobGraph, OpNode
from tensile_tf.scheduler.latency import ColdStartLatency, LatencyModel, LatencyTable

FEATURE_VERSION = 2   # 2: the scale of kernels timed alone and the op types trained on
NUMERIC_FEATURES = ("log_in_bytes", "log_out_bytes", "log_update_bytes", "log_flops_proxy", "inputs", "outputs")
CALIBRATE_COMMAND = "tensile calibrate"
#: Profiled steps per calibration model. Small models' op times vary step to step: over 3 steps a
#: second profile of the same model missed the first by 0.2-0.5 of the bytes-touched error, over
#: 10 by 0.04-0.3 (benchmarks/predictor_bench.py, issue 43); a model costs a second or two more.
PROFILED_STEPS = 10
#: Note [Kernels timed alone]: compute-bound kernels a cold start times on their own shapes.
KERNELS_TIMED_ALONE = frozenset({
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
    "MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad"})
#: Note [Fused kernels]: what the remapper fuses, head -> BiasAdd -> activation.
FUSED_HEADS = frozenset({"Conv2D", "MatMul"})
FUSED_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})
#: What an op fused into the next is given: what a measured table gives an op the profile never saw.
FUSED_AWAY_S = LatencyTable.default_s


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


def fused_chains(graph: JobGraph) -> list[list[str]]:
    """Note [Fused kernels]: each Conv2D or MatMul whose sole consumer is a
    BiasAdd (and that one's an activation), as [head, BiasAdd(, activation)]."""
    by_name = {o.name: o for o in graph.ops}

    def sole_consumer(op: OpNode, types) -> OpNode | None:
        if len(op.outputs) != 1 or op.outputs[0] not in graph.tensors:
            return None
        readers = graph.tensors[op.outputs[0]].consumers
        nxt = by_name.get(readers[0]) if len(readers) == 1 else None
        return nxt if nxt is not None and nxt.op_type in types else None

    chains = []
    for op in graph.ops:
        if op.op_type not in FUSED_HEADS:
            continue
        bias = sole_consumer(op, {"BiasAdd"})
        if bias is None:
            continue
        act = sole_consumer(bias, FUSED_ACTIVATIONS)
        chains.append([op.name, bias.name] + ([act.name] if act is not None else []))
    return chains


def on_fused_kernels(graph: JobGraph, seconds: Mapping[str, float], heads: Iterable[str]) -> dict[str, float]:
    """``seconds`` with each fused chain whose head is in ``heads`` (kernels
    timed alone) predicted as one kernel on its last op, at its head's seconds:
    what ``alone_scale`` was fitted on (Note [Fused kernels]); the chain's
    other ops get FUSED_AWAY_S."""
    out = dict(seconds)
    keep = set(heads)
    for chain in fused_chains(graph):
        if chain[0] in keep and chain[0] in out:
            out[chain[-1]] = out[chain[0]]
            for n in chain[:-1]:
                out[n] = FUSED_AWAY_S
    return out


def fit_alone_scale(models: Iterable[tuple[JobGraph, Mapping[str, float], Mapping[str, float]]]) -> float | None:
    """Note [Kernels timed alone]: over (graph, measured, alone) of the
    calibration models, the measured seconds of their KERNELS_TIMED_ALONE
    ops over their seconds alone (both where the profile puts them). None: none measured."""
    measured_s = alone_s = 0.0
    for graph, measured, alone in models:
        kinds = {o.name: o.op_type for o in graph.ops}
        timed = {k: v for k, v in alone.items() if kinds.get(k) in KERNELS_TIMED_ALONE}
        away = {n for chain in fused_chains(graph) if chain[0] in timed for n in chain[:-1]}
        for name, s in on_fused_kernels(graph, timed, heads=timed).items():
            if name not in away and s > 0 and measured.get(name, 0) > 0:
                measured_s += measured[name]
                alone_s += s
    return measured_s / alone_s if alone_s > 0 else None


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
    """An MLP regressor of log op seconds over ``op_features``, and the scale
    of kernels timed alone (Note [Kernels timed alone])."""

    pipeline: Any = None
    trained_on: list[str] = field(default_factory=list)    # model names
    samples: int = 0
    op_types: frozenset[str] = frozenset()   # the op types it was fitted on
    alone_scale: float | None = None         # measured / alone seconds; None: predicts every op itself

    def times_alone(self, op_type: str) -> bool:
        """Whether a cold start times this op type alone (Note [Kernels timed alone])."""
        return self.alone_scale is not None and (op_type in KERNELS_TIMED_ALONE or op_type not in self.op_types)

    @classmethod
    def fit(cls, samples: Sequence[LatencySample], *, seed: int = 0,
            alone_scale: float | None = None) -> "LatencyPredictor":
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
        return cls(pipeline, sorted({s.model for s in samples}), len(samples),
                   frozenset(s.features["op_type"] for s in samples), alone_scale)

    def predict_features(self, features: Sequence[Mapping[str, Any]]) -> list[float]:
        import numpy as np

        if not features:
            return []
        return np.exp(self.pipeline.predict(_matrix(features))).tolist()

    def predict(self, graph: JobGraph, alone: Mapping[str, float] | None = None) -> dict[str, float]:
        """Seconds per op of ``graph``; ``alone``: seconds of its ops timed
        alone, which replace the MLP's for the ops ``times_alone`` names."""
        out = dict(zip((o.name for o in graph.ops), self.predict_features([op_features(graph, o) for o in graph.ops])))
        if not alone or self.alone_scale is None:
            return out
        timed = {o.name for o in graph.ops if o.name in alone and self.times_alone(o.op_type)}
        out.update({name: self.alone_scale * alone[name] for name in timed})
        return on_fused_kernels(graph, out, heads=timed)

    # -- cache (Note [Predictor cache]) ---------------------------------------
    def save(self, path: str | Path, environment: Mapping[str, Any]) -> None:
        import joblib
        import sklearn

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump({"meta": _meta(environment, sklearn.__version__), "pipeline": self.pipeline,
                     "trained_on": self.trained_on, "samples": self.samples, "op_types": sorted(self.op_types),
                     "alone_scale": self.alone_scale}, path)


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
    return LatencyPredictor(pipeline, list(blob.get("trained_on", [])), int(blob.get("samples", 0)),
                            frozenset(blob.get("op_types", ())), blob.get("alone_scale")), None


@dataclass
class LearnedLatency:
    """Cold-start latencies from a ``LatencyPredictor`` (predicted once per
    graph), with ``alone``: the graph's ops timed alone (Note [Kernels timed alone])."""

    graph: JobGraph
    predictor: LatencyPredictor
    alone: Mapping[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seconds = self.predictor.predict(self.graph, self.alone)
        timed = sum(1 for o in self.graph.ops if o.name in self.alone and self.predictor.times_alone(o.op_type))
        self.source = f"cold-start (learned on {len(self.predictor.trained_on)} models" + (
            f"; {timed} kernels timed alone)" if timed else ")")

    def latency_s(self, op: OpNode) -> float:
        s = self.seconds.get(op.name)
        if s is None:   # an op not in the graph it was made for
            s = self.predictor.predict_features([op_features(self.graph, op)])[0]
            self.seconds[op.name] = s
        return s


def cold_start_latency(graph: JobGraph, predictor: LatencyPredictor | None,
                       alone: Mapping[str, float] | None = None) -> LatencyModel:
    """§IV-A cold start: the learned predictor when there is one (with the
    ops timed ``alone``), else bytes touched."""
    return LearnedLatency(graph, predictor, alone or {}) if predictor is not None else ColdStartLatency(graph)


def relative_error(predicted: Mapping[str, float], measured: Mapping[str, float]) -> float:
    """Summed absolute error over the summed measured seconds, over the ops both know:
    how far a predicted step's timeline is off, as a share of the step."""
    common = [k for k in measured if k in predicted and measured[k] > 0]
    total = sum(measured[k] for k in common)
    return sum(abs(predicted[k] - measured[k]) for k in common) / total if total > 0 else float("nan")

