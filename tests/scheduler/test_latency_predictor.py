"""The learned cold-start predictor (tensile_tf/scheduler/latency_predictor.py)
on synthetic graphs whose latencies follow a known law, and its cache."""
import math

import pytest

from tensile_tf.scheduler import ColdStartLatency, GraphBuilder, LatencyTable
from tensile_tf.scheduler.latency_predictor import (LatencyPredictor, LearnedLatency, cold_start_latency,
                                                    load_cached, op_features, relative_error, samples_from)

ENV = {"cpu": "test cpu", "cores": 2, "tensorflow": "x"}


def chain(name: str, scale: int, n: int = 12):
    """MatMul -> Relu layers; sizes grow with ``scale``."""
    b = GraphBuilder(name)
    b.op("x", outputs={"x0": 4096 * scale})
    prev = "x0"
    for i in range(n):
        b.op(f"mm{i}", op_type="MatMul", inputs=[prev], outputs={f"h{i}": 4096 * scale * (1 + i % 3)})
        b.op(f"relu{i}", op_type="Relu", inputs=[f"h{i}"], outputs={f"r{i}": 4096 * scale * (1 + i % 3)})
        prev = f"r{i}"
    return b.build()


def law(graph):
    """A MatMul costs 3 ns per output byte, anything else 0.5 ns per byte touched."""
    out = {}
    for o in graph.ops:
        touched = sum(graph.tensors[t].size_bytes for t in (*o.inputs, *o.outputs))
        out[o.name] = 3e-9 * graph.tensors[o.outputs[0]].size_bytes if o.op_type == "MatMul" else 0.5e-9 * touched
    return out


@pytest.fixture(scope="module")
def predictor():
    samples = []
    for k, scale in enumerate((1, 2, 4, 8, 16, 32)):
        g = chain(f"m{k}", scale)
        samples += samples_from(g.name, g, LatencyTable(law(g)))
    return LatencyPredictor.fit(samples)


def test_features_name_the_op_type_and_its_sizes():
    g = chain("g", 1)
    f = op_features(g, g.op("mm0"))
    assert f["op_type"] == "MatMul" and f["inputs"] == f["outputs"] == 1
    assert f["log_in_bytes"] == pytest.approx(math.log1p(4096))


def test_learned_latencies_beat_bytes_touched_on_an_unseen_size(predictor):
    g = chain("unseen", 12)
    truth = law(g)
    learned = relative_error(predictor.predict(g), truth)
    baseline = ColdStartLatency(g)
    bytes_touched = relative_error({o.name: baseline.latency_s(o) for o in g.ops}, truth)
    assert learned < 0.5 * bytes_touched, (learned, bytes_touched)
    model = cold_start_latency(g, predictor)
    assert isinstance(model, LearnedLatency) and model.latency_s(g.op("mm3")) > 0
    assert isinstance(cold_start_latency(g, None), ColdStartLatency)


def test_cache_round_trips_and_refuses_another_machine_or_a_broken_file(predictor, tmp_path):
    path = tmp_path / "p.joblib"
    assert load_cached(path, ENV) == (None, None)            # no cache: silent
    predictor.save(path, ENV)
    loaded, problem = load_cached(path, ENV)
    assert problem is None and loaded.trained_on == predictor.trained_on
    g = chain("g", 3)
    assert loaded.predict(g) == pytest.approx(predictor.predict(g))
    stale, problem = load_cached(path, {**ENV, "cpu": "another cpu"})
    assert stale is None and "environment.cpu" in problem and "tensile calibrate" in problem
    path.write_bytes(b"not a predictor")
    broken, problem = load_cached(path, ENV)
    assert broken is None and "unreadable" in problem and "tensile calibrate" in problem


def test_too_few_samples_is_refused():
    g = chain("tiny", 1, n=2)
    with pytest.raises(ValueError, match="too few"):
        LatencyPredictor.fit(samples_from("tiny", g, LatencyTable(law(g))))
