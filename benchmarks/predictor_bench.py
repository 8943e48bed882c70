"""Issue 43 benchmark: the learned cold-start latency predictor against the
bytes-touched guess (seed 000 §IV-A; tensile_tf/scheduler/latency_predictor.py),
on models it never saw, beside the floor that measurement noise sets.

    PYTHONPATH=. python benchmarks/predictor_bench.py [--families vgg16,mobilenetv2] [--repeats 3]

Every calibration model of ``tensile calibrate`` (tensile_tf/tf/calibration.py)
and each held-out family (keras.applications at 32x32, batch 16, never in
the calibration set) is built and profiled once, as calibration does. Then,
for each model, the error (``relative_error``: summed |predicted - measured|
op seconds over the measured step) of:
* the predictor fitted without that model (``tensile calibrate``'s own
  hold-out: its other batch size stays in the training set);
* the predictor fitted without its whole family (no batch size of it);
* the bytes-touched guess (``ColdStartLatency``), the issue's reference.
The ratio learned / bytes-touched is what the goal bounds (<= 0.5). The
noise floor: the same model built and profiled a second time, its op
latencies (matched by position: the same code traces the same op order)
taken as the prediction of the first run's.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensile_tf

tensile_tf.install(os.environ.get("TENSILE_POOL_BYTES", "2GiB"))  # before any TF op

import keras  # noqa: E402

from tensile_tf.scheduler import ColdStartLatency  # noqa: E402
from tensile_tf.scheduler.latency_predictor import LatencyPredictor, relative_error  # noqa: E402
from tensile_tf.tf.calibration import CALIBRATION_MODELS, CalibrationModel, measure_model  # noqa: E402

FAMILIES = {
    "vgg16": lambda: keras.applications.VGG16(weights=None, input_shape=(32, 32, 3), classes=10),
    "mobilenetv2": lambda: keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10),
    "resnet50": lambda: keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10),
}


def family(model: str) -> str:
    return model.split("-b")[0]


def bytes_touched_error(m) -> float:
    guess = ColdStartLatency(m.graph)
    return relative_error({o.name: guess.latency_s(o) for o in m.graph.ops}, m.measured)


def remeasured_error(first, again) -> float:
    """``again``'s latencies as the prediction of ``first``'s, op by op in order."""
    as_first = {a.name: again.measured[b.name] for a, b in zip(first.graph.ops, again.graph.ops)
                if a.op_type == b.op_type and b.name in again.measured}
    return relative_error(as_first, first.measured)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="vgg16,mobilenetv2", help=f"held-out families: {', '.join(FAMILIES)}")
    ap.add_argument("--repeats", type=int, default=3, help="profiled steps per model (calibration's default)")
    ap.add_argument("--noise", default="mlp-b256,small_cnn-b64,transformer-b8,residual_net-b64",
                    help="models profiled a second time for the noise floor")
    args = ap.parse_args()
    models = dict(CALIBRATION_MODELS)
    for f in filter(None, args.families.split(",")):
        models[f"{f}-b16"] = CalibrationModel(f"{f}-b16", FAMILIES[f], (32, 32, 3), 16)
    measured = {}
    for name, m in models.items():
        measured[name] = measure_model(m, repeats=args.repeats)
        print(f"measured {name}: {len(measured[name].samples)} ops", flush=True)
    calibration = [n for n in measured if n in CALIBRATION_MODELS]
    print(f"\n{'model':<22} {'bytes-touched':>13} {'learned, model out':>19} {'ratio':>6} "
          f"{'learned, family out':>20} {'ratio':>6} {'noise floor':>12}")
    worst = {"model": 0.0, "family": 0.0}
    for name, m in measured.items():
        rest = [n for n in calibration if n != name]
        others = [n for n in calibration if family(n) != family(name)]
        learned = relative_error(LatencyPredictor.fit([s for n in rest for s in measured[n].samples]).predict(m.graph),
                                 m.measured)
        by_family = relative_error(
            LatencyPredictor.fit([s for n in others for s in measured[n].samples]).predict(m.graph), m.measured)
        base = bytes_touched_error(m)
        noise = ""
        if name in args.noise.split(","):
            noise = f"{remeasured_error(m, measure_model(models[name], repeats=args.repeats)) / base:.2f}"
        worst["model"] = max(worst["model"], learned / base)
        worst["family"] = max(worst["family"], by_family / base)
        print(f"{name:<22} {base:>13.2f} {learned:>19.2f} {learned / base:>6.2f} {by_family:>20.2f} "
              f"{by_family / base:>6.2f} {noise:>12}", flush=True)
    print(f"\nworst ratio (goal <= 0.5): model held out {worst['model']:.2f}, family held out {worst['family']:.2f}; "
          "noise floor: a second profile of the same model as the prediction, over bytes-touched's error")


if __name__ == "__main__":
    main()
