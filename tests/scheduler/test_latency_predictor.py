"""The learned cold-start predictor (tensile_tf/scheduler/latency_predictor.py)
on synthetic graphs whose latencies follow a known law, kernels timed alone
and fused chains (Notes [Kernels timed alone], [Fused kernels]), and its cache."""
import dataclasses
import math

import pytest

from tensile_tf.scheduler import ColdStartLatency, GraphBuilder, LatencyTable
from tensile_tf.scheduler.latency_predictor import (FUSED_AWAY_S, LatencyPredictor, LearnedLatency,
                                                    cold_start_latency, fit_alone_scale, fused_chains, load_cached, on_fused_kernels,
                                                    op_features, relative_error, samples_from)

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
    assert loaded.op_types == predictor.op_types == {"x", "MatMul", "Relu"}
    assert loaded.alone_scale is None
    scaled = dataclasses.replace(predictor, alone_scale=0.7)
    scaled.save(path, ENV)
    assert load_cached(path, ENV)[0].alone_scale == 0.7
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


def conv_block():
    """conv -> bias -> relu (fused: each is its producer's sole consumer);
    conv2 -> bias2, read twice (fused, no activation); mm read twice (not fused);
    cumsum, a type the predictor never saw."""
    b = GraphBuilder("blocks")
    b.op("x", outputs={"x0": 4096})
    b.op("conv", op_type="Conv2D", inputs=["x0"], outputs={"c": 4096})
    b.op("bias", op_type="BiasAdd", inputs=["c"], outputs={"cb": 4096})
    b.op("relu", op_type="Relu", inputs=["cb"], outputs={"r": 4096})
    b.op("conv2", op_type="Conv2D", inputs=["r"], outputs={"c2": 4096})
    b.op("bias2", op_type="BiasAdd", inputs=["c2"], outputs={"c2b": 4096})
    b.op("relu2", op_type="Relu", inputs=["c2b"], outputs={"r2": 4096})
    b.op("add", op_type="AddV2", inputs=["c2b", "r2"], outputs={"s": 4096})
    b.op("mm", op_type="MatMul", inputs=["s"], outputs={"m": 4096})
    b.op("bias3", op_type="BiasAdd", inputs=["m"], outputs={"mb": 4096})
    b.op("cumsum", op_type="Cumsum", inputs=["m", "mb"], outputs={"out": 4096})
    return b.build()


def test_fused_chains_follow_sole_consumers_and_carry_the_chain_to_its_last_op():
    g = conv_block()
    assert fused_chains(g) == [["conv", "bias", "relu"], ["conv2", "bias2"]]
    seconds = {"conv": 3.0, "bias": 0.5, "relu": 0.25, "conv2": 2.0, "bias2": 1.0, "mm": 4.0}
    moved = on_fused_kernels(g, seconds, heads=["conv", "conv2", "mm"])
    gone = FUSED_AWAY_S   # one kernel at its head's seconds, on the op the profile names it after
    assert moved == pytest.approx({"conv": gone, "bias": gone, "relu": 3.0, "conv2": gone, "bias2": 2.0, "mm": 4.0})
    # only the chains whose head was timed
    assert on_fused_kernels(g, {"conv": 3.0, "bias": 0.5, "conv2": 2.0}, heads=["conv2"]) == pytest.approx({
        "conv": 3.0, "bias": 0.5, "conv2": gone, "bias2": 2.0})


def test_kernels_timed_alone_are_scaled_and_predicted_where_the_profile_finds_them(predictor):
    g = conv_block()
    alone = {"conv": 1e-3, "conv2": 2e-3, "mm": 3e-3, "cumsum": 4e-3, "relu2": 5e-3}
    mlp = predictor.predict(g)
    assert predictor.predict(g, alone) == mlp                 # no scale fitted: the MLP predicts every op
    scaled = dataclasses.replace(predictor, alone_scale=0.5)
    assert not scaled.times_alone("Relu") and scaled.times_alone("MatMul") and scaled.times_alone("Cumsum")
    got = scaled.predict(g, alone)
    assert got["mm"] == pytest.approx(1.5e-3) and got["cumsum"] == pytest.approx(2e-3)   # a kernel; a type never seen
    assert got["relu2"] == mlp["relu2"]                       # a known type the MLP predicts, timed or not
    assert got["conv"] == got["bias"] == FUSED_AWAY_S         # fused: the chain's seconds on its last op
    assert got["relu"] == pytest.approx(0.5e-3)               # the scale covers bias and activation
    assert got["bias2"] == pytest.approx(1e-3) and got["conv2"] == FUSED_AWAY_S
    model = cold_start_latency(g, scaled, alone)
    assert model.latency_s(g.op("relu")) == got["relu"] and "4 kernels timed alone" in model.source


def test_the_scale_of_kernels_alone_is_measured_over_alone_where_the_profile_puts_them():
    g = conv_block()
    alone = {"conv": 2e-3, "conv2": 4e-3, "mm": 6e-3, "add": 1.0}          # add: not a kernel, not counted
    measured = {"relu": 1.4e-3, "bias2": 2.8e-3, "mm": 4.2e-3, "add": 0.1}  # 0.7x, on the chains' last ops
    assert fit_alone_scale([(g, measured, alone)]) == pytest.approx(0.7)
    # a chain's head the profile did see is not weighed against the little left on it
    assert fit_alone_scale([(g, {**measured, "conv": 5e-3}, alone)]) == pytest.approx(0.7)
    # nor a chain whose head did not run alone
    untimed = {k: v for k, v in alone.items() if k != "conv"}
    assert fit_alone_scale([(g, {**measured, "conv": 5e-3, "bias": 1e-3}, untimed)]) == pytest.approx(0.7)
    assert fit_alone_scale([(g, {}, alone)]) is None
