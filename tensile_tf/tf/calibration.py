"""``tensile calibrate``: measures op latencies on this machine and fits the
cold-start predictor (seed 000 §IV-A; tensile_tf/scheduler/latency_predictor.py).

Each calibration model (small models of the zoo at two batch sizes) is
built, traced and profiled as the runtime profiles a job
(``capture_job_graph``, ``measure_op_latencies``); every measured op is a
sample. Its ops are also timed one at a time (``time_kernels_alone``), which
fits the scale a cold start puts on its own kernels timed alone (Note
[Kernels timed alone] in tensile_tf/scheduler/latency_predictor.py).
Before fitting on all of them, each model is held out in turn: the
predictor fitted on the others predicts it, and its error is printed beside
the bytes-touched model's (``ColdStartLatency``), so a user sees what the
predictor buys on models it never saw. The fitted predictor is cached
(Note [Predictor cache]) under the user cache directory, or where
``TENSILE_LATENCY_PREDICTOR`` says; ``capture_cold`` uses it from then on.
"""
from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from tensile_tf.jobs import zoo
from tensile_tf.tf.capture import capture_job_graph, measure_op_latencies
from tensile_tf.jobs.job import supervised_train_step
from tensile_tf.scheduler import ColdStartLatency
from tensile_tf.scheduler.latency_predictor import (PROFILED_STEPS, LatencyPredictor, LatencySample, fit_alone_scale,
                                                    load_cached, relative_error, samples_from)
from tensile_tf.tf.kernel_timing import time_kernels_alone

PREDICTOR_PATH_ENV = "TENSILE_LATENCY_PREDICTOR"


@dataclass(frozen=True)
class CalibrationModel:
    name: str
    build: Callable[[], keras.Model]
    input_shape: tuple[int, ...]
    batch: int


def _models() -> dict[str, CalibrationModel]:
    out = {}
    for batch in (32, 256):
        out[f"mlp-b{batch}"] = CalibrationModel(f"mlp-b{batch}", lambda: zoo.mlp((784,), 10), (784,), batch)
    for batch in (16, 64):
        out[f"small_cnn-b{batch}"] = CalibrationModel(f"small_cnn-b{batch}", lambda: zoo.small_cnn((32, 32, 3), 10),
                                                      (32, 32, 3), batch)
        out[f"residual_net-b{batch}"] = CalibrationModel(f"residual_net-b{batch}",
                                                         lambda: zoo.residual_net((32, 32, 3), 10), (32, 32, 3), batch)
    for batch in (8, 32):
        out[f"transformer-b{batch}"] = CalibrationModel(f"transformer-b{batch}",
                                                        lambda: zoo.transformer_encoder((64, 128), 10), (64, 128), batch)
    return out


CALIBRATION_MODELS = _models()


def machine_environment() -> dict[str, Any]:
    """What a predictor is valid for (Note [Predictor cache])."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "tensorflow": tf.__version__}


def predictor_path() -> Path:
    explicit = os.environ.get(PREDICTOR_PATH_ENV)
    if explicit:
        return Path(explicit)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tensile-tf")) / "latency_predictor.joblib"


_warned: set[str] = set()


def cached_predictor() -> LatencyPredictor | None:
    """The cached predictor for this machine, or None (one warning per
    reason and process when a cache exists but cannot be used)."""
    predictor, problem = load_cached(predictor_path(), machine_environment())
    if problem and problem not in _warned:
        _warned.add(problem)
        warnings.warn(problem, stacklevel=2)
    return predictor


@dataclass
class ModelSamples:
    model: str
    graph: Any
    measured: dict[str, float]
    samples: list[LatencySample]
    alone: dict[str, float]   # every op that runs alone, timed alone (Note [Kernels timed alone])


def measure_model(m: CalibrationModel, *, repeats: int = PROFILED_STEPS, seed: int = 0) -> ModelSamples:
    """Builds, traces and profiles one calibration model's train step."""
    keras.utils.set_random_seed(seed)
    model = m.build()
    optimizer = keras.optimizers.Adam(1e-3)
    step = tf.function(supervised_train_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy()))
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((m.batch, *m.input_shape)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, m.batch).astype("int32"))
    step(x, y)   # builds the optimizer's slots
    graph = capture_job_graph(m.name, step, (x, y), optimizer=optimizer)
    table = measure_op_latencies(step, (x, y), graph=graph, repeats=repeats)
    alone = time_kernels_alone(step, (x, y), graph, lambda op_type: True)
    return ModelSamples(m.name, graph, dict(table.seconds), samples_from(m.name, graph, table), alone)


def fit_predictor(models: Sequence[ModelSamples]) -> LatencyPredictor:
    """The MLP on every op of ``models``, and the scale of their kernels timed alone."""
    return LatencyPredictor.fit([s for m in models for s in m.samples],
                                alone_scale=fit_alone_scale((m.graph, m.measured, m.alone) for m in models))


def bytes_touched_error(m: ModelSamples) -> float:
    """``relative_error`` of the bytes-touched guess (``ColdStartLatency``) on ``m``."""
    baseline = ColdStartLatency(m.graph)
    return relative_error({o.name: baseline.latency_s(o) for o in m.graph.ops}, m.measured)


@dataclass
class HoldoutRow:
    model: str
    ops: int
    learned_error: float        # relative_error of the predictor fitted without this model, kernels timed alone
    bytes_touched_error: float  # relative_error of ColdStartLatency
    mlp_error: float            # the same predictor's MLP alone, no kernel timed


def calibrate(names: Sequence[str] | None = None, *, path: Path | None = None, repeats: int = PROFILED_STEPS,
              progress: Callable[[str], None] = print) -> tuple[LatencyPredictor, list[HoldoutRow], Path]:
    """Measures the models, reports held-out errors, fits on all, caches."""
    names = list(names or CALIBRATION_MODELS)
    unknown = [n for n in names if n not in CALIBRATION_MODELS]
    if unknown:
        raise ValueError(f"unknown calibration model(s) {unknown}; known: {sorted(CALIBRATION_MODELS)}")
    if len(names) < 2:
        raise ValueError("calibrate needs at least two models (one is held out to measure the error)")
    measured = []
    for n in names:
        progress(f"measuring {n} ...")
        measured.append(measure_model(CALIBRATION_MODELS[n], repeats=repeats))
    rows = []
    for held in measured:
        predictor = fit_predictor([m for m in measured if m is not held])
        learned = relative_error(predictor.predict(held.graph, held.alone), held.measured)
        mlp = relative_error(predictor.predict(held.graph), held.measured)
        rows.append(HoldoutRow(held.model, len(held.samples), learned, bytes_touched_error(held), mlp))
    predictor = fit_predictor(measured)
    path = path or predictor_path()
    predictor.save(path, machine_environment())
    return predictor, rows, path
