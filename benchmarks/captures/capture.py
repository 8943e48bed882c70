"""Captures of small zoo models, and of the planner benchmark's models
(``benchmarks/planner_bench.py``: VGG16, ResNet50, InceptionV3, DenseNet121
and its Transformer at batch 16, gzipped), kept as files so the planner
benchmarks plan the same inputs at every commit (the planning time and the
plan depend on the capture's profiled latencies). Regenerate with one command:

    PYTHONPATH=. python benchmarks/captures/capture.py [--only zoo|bench] [--models vgg16,...]

Each file is ``{"graph": JobGraph.to_dict(), "latencies": {...}, "model": ..., "batch": ...}``:
the graph in executor order with scratch bytes and the op latencies, as
``tensile_tf.pipeline.capture_for_planning`` returns them (Adam, plan order).
``load_capture`` reads one back without TensorFlow.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: (file stem, zoo builder, input shape, batch)
CAPTURES = [
    ("mlp_b32", "mlp", (784,), 32), ("mlp_b256", "mlp", (784,), 256),
    ("small_cnn_b16", "small_cnn", (32, 32, 3), 16), ("small_cnn_b64", "small_cnn", (32, 32, 3), 64),
    ("residual_net_b8", "residual_net", (32, 32, 3), 8), ("residual_net_b32", "residual_net", (32, 32, 3), 32),
    ("transformer_b4", "transformer_encoder", (32, 64), 4), ("transformer_b16", "transformer_encoder", (32, 64), 16),
]


def load_capture(path: str | Path):
    """(JobGraph, LatencyTable) of a saved capture; pure."""
    from tensile_tf.scheduler import JobGraph, LatencyTable
    path = Path(path)
    d = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    lat = d["latencies"]
    return JobGraph.from_dict(d["graph"]), LatencyTable(lat["seconds"], lat["by_type"], lat["default_s"], "capture")


#: the planner benchmark's models (benchmarks/planner_bench.py MODELS), saved as bench_<model>_b16.json.gz
BENCH_MODELS = ("vgg16", "resnet50", "inceptionv3", "densenet121", "transformer")


def capture_path(stem: str) -> Path:
    """The saved capture named ``stem`` (a zoo capture, or ``bench_<model>_b16``)."""
    return HERE / (f"{stem}.json.gz" if stem.startswith("bench_") else f"{stem}.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("zoo", "bench"), default=None)
    ap.add_argument("--models", default=",".join(BENCH_MODELS), help="the planner benchmark's models to capture")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE.parent.parent))
    if a.only != "bench":
        _capture_zoo()
    if a.only != "zoo":
        from benchmarks.planner_bench import BATCH, capture   # installs the pool before any TF op
        for name in a.models.split(","):
            graph, lat, seconds = capture(name)
            out = {"model": name, "batch": BATCH, "source": "benchmarks/planner_bench.py",
                   "graph": graph.to_dict(),
                   "latencies": {"seconds": dict(lat.seconds), "by_type": dict(lat.by_type), "default_s": lat.default_s}}
            capture_path(f"bench_{name}_b{BATCH}").write_bytes(gzip.compress(json.dumps(out).encode(), mtime=0))
            print(f"bench_{name}_b{BATCH}: {len(graph.ops)} ops, step {sum(lat.seconds.values()) * 1e3:.1f} ms, "
                  f"captured in {seconds:.1f} s", flush=True)


def _capture_zoo() -> None:
    os.environ.setdefault("TENSILE_POOL_BYTES", "2GiB")
    import tensile_tf
    tensile_tf.install()
    import keras
    import tensorflow as tf

    from tensile_tf.jobs import zoo
    from tensile_tf.pipeline import JobToPlan, capture_for_planning

    for stem, builder, shape, batch in CAPTURES:
        keras.utils.set_random_seed(0)
        model = getattr(zoo, builder)(input_shape=shape)
        opt = keras.optimizers.Adam(1e-3)
        lossf = keras.losses.SparseCategoricalCrossentropy()

        @tf.function(jit_compile=False)
        def step(x, y, model=model, opt=opt, lossf=lossf):
            with tf.GradientTape() as tape:
                loss = lossf(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        x = tf.random.normal([batch, *shape])
        y = tf.zeros([batch], tf.int32)
        captured = capture_for_planning(JobToPlan(stem, step, (x, y), optimizer=opt), latency_repeats=3)
        lat = captured.planner_job.latencies
        out = {"model": builder, "input_shape": list(shape), "batch": batch, "graph": captured.graph.to_dict(),
               "latencies": {"seconds": dict(lat.seconds), "by_type": dict(lat.by_type), "default_s": lat.default_s}}
        (HERE / f"{stem}.json").write_text(json.dumps(out))
        print(f"{stem}: {len(captured.graph.ops)} ops, step {sum(lat.seconds.values()) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
