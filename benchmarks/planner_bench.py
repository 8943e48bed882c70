"""Planner benchmark (issue 4): planning time for 1, 2 and 4 jobs of real model
graphs at batch 16, and the predicted MSR = (vanilla peak - planned peak) / vanilla peak.

    PYTHONPATH=. python benchmarks/planner_bench.py [--models resnet50,vgg16,...] [--json OUT]
    PYTHONPATH=. python benchmarks/planner_bench.py --capture --models resnet50,transformer,resnet50+transformer \
        --jobs 1,2,4,8,16 --budgets 60%,minimise

``--capture`` plans the saved captures (benchmarks/captures/, the same
inputs at every commit) without TensorFlow. "minimise" runs only for 1 job (it swaps every tensor that fits, thousands of
swaps; see RESULTS.md). Each model's Keras train step (Adam, jit_compile=False) is traced and captured
once, its op latencies are profiled once; the jobs of a run are copies of that
graph. Two budgets: "minimise" (no budget: swap until nothing more fits, the
seed's behaviour) and "60%" (pool budget = 60% of the vanilla pool peak: swap,
then recompute). Re-plan: every op latency scaled by a random factor in
[0.9, 1.1] (a §IV-E drift), then Planner.replan.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tensile_tf.scheduler import JobGraph, LatencyTable, Planner, PlannerJob  # noqa: E402

BATCH = 16


def transformer_encoder(keras, seq=128, d=256, heads=4, layers=4, vocab=8000, classes=10):
    inp = keras.Input((seq,), dtype="int32")
    x = keras.layers.Embedding(vocab, d)(inp)
    for _ in range(layers):
        a = keras.layers.MultiHeadAttention(heads, d // heads)(x, x)
        x = keras.layers.LayerNormalization()(x + a)
        f = keras.layers.Dense(4 * d, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(d)(f))
    out = keras.layers.Dense(classes)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inp, out)


def _application(name: str, shape: tuple):
    def build(keras):
        return getattr(keras.applications, name)(weights=None, input_shape=shape, classes=10,
                                                 classifier_activation=None), shape
    return build


MODELS = {
    "vgg16": _application("VGG16", (64, 64, 3)),
    "resnet50": _application("ResNet50", (64, 64, 3)),
    "inceptionv3": _application("InceptionV3", (75, 75, 3)),
    "densenet121": _application("DenseNet121", (64, 64, 3)),
    "transformer": lambda keras: (transformer_encoder(keras), None),
}


def capture(name: str):
    """(graph, latencies, seconds) of ``name``'s train step, captured by the runtime now (TensorFlow)."""
    os.environ.setdefault("TENSILE_POOL_BYTES", "8GiB")
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    import keras
    import tensorflow as tf

    from tensile_tf.pipeline import JobToPlan, capture_for_planning
    keras.utils.set_random_seed(0)
    model, shape = MODELS[name](keras)
    opt = keras.optimizers.Adam(1e-3)
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = lossf(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if shape is None:
        x = tf.random.uniform([BATCH, 128], 0, 8000, dtype=tf.int32)
    else:
        x = tf.random.normal([BATCH, *shape])
    y = tf.zeros([BATCH], tf.int32)
    # The runtime's capture (executor order, scratch bytes, profiled latencies).
    t0 = time.perf_counter()
    captured = capture_for_planning(JobToPlan(name, step, (x, y), optimizer=opt), latency_repeats=2)
    return captured.graph, captured.planner_job.latencies, time.perf_counter() - t0


def copies(members: list[tuple[JobGraph, LatencyTable]], k: int) -> list[PlannerJob]:
    """k jobs, the members in turn (one model's copies, or a mix), each named apart."""
    if k == 1 and len(members) == 1:
        return [PlannerJob(*members[0])]
    return [PlannerJob(JobGraph(f"{g.name}-{i}", g.ops, g.tensors), lat)
            for i, (g, lat) in ((i, members[i % len(members)]) for i in range(k))]


def perturbed(lat: LatencyTable, seed: int) -> LatencyTable:
    rng = np.random.default_rng(seed)
    return LatencyTable({k: v * rng.uniform(0.9, 1.1) for k, v in lat.seconds.items()}, dict(lat.by_type),
                        lat.default_s, "perturbed")


def bench(members, k: int, budget_frac: float | None, repeats: int = 3):
    best, best_re = float("inf"), float("inf")
    plan = replan = None
    for r in range(repeats):
        jobs = copies(members, k)
        budget = None
        if budget_frac is not None:
            vanilla = Planner(jobs, pool_bytes=None, max_iterations=0).plan().pool_vanilla_peak_bytes
            budget = int(vanilla * budget_frac)
        planner = Planner(jobs, pool_bytes=budget)
        t0 = time.perf_counter()
        plan = planner.plan()
        best = min(best, time.perf_counter() - t0)
        new = {jp.graph.name: perturbed(jp.latencies, 100 + r + i) for i, jp in enumerate(jobs)}
        t0 = time.perf_counter()
        replan = planner.replan(new)
        best_re = min(best_re, time.perf_counter() - t0)
    return {
        "jobs": k, "budget": "minimise" if budget_frac is None else f"{int(budget_frac * 100)}%",
        "plan_s": best, "replan_s": best_re, "iterations": plan.iterations,
        "vanilla_pool_peak_MiB": plan.pool_vanilla_peak_bytes / 2**20,
        "planned_pool_peak_MiB": plan.pool_planned_peak_bytes / 2**20,
        "msr": plan.msr, "replan_msr": replan.msr, "budget_met": plan.budget_met,
        "swaps": sum(len(j.swap_ins) for j in plan.jobs.values()),
        "recomputes": sum(len(j.recomputes) for j in plan.jobs.values()),
        "stop": plan.stop_reason,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jobs", default="1,2,4")
    ap.add_argument("--json", default=None, help="write all rows as JSON here")
    ap.add_argument("--capture", action="store_true",
                    help="plan the saved captures benchmarks/captures/bench_<model>_b16.json.gz (pure: no TensorFlow; "
                         "regenerate them with benchmarks/captures/capture.py --only bench) instead of capturing now")
    ap.add_argument("--budgets", default=None,
                    help="minimise and/or percentages of the unplanned peak, each for every --jobs "
                         "(default: minimise for one job, 60%% for each)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="plans (and re-plans) per row, the best time printed (default: 3 with a budget, 1 minimised)")
    a = ap.parse_args()
    rows = []
    fracs = [None if b == "minimise" else float(b.rstrip("%")) / 100 for b in (a.budgets or "minimise,60%").split(",")]
    loaded: dict[str, tuple] = {}
    for name in a.models.split(","):
        members = []
        for part in name.split("+"):        # "resnet50+transformer": a mix, the models in turn
            if part not in loaded:
                if a.capture:
                    from benchmarks.captures.capture import capture_path, load_capture
                    path = capture_path(f"bench_{part}_b{BATCH}")
                    loaded[part] = (*load_capture(path), f"saved capture {path.name}")
                else:
                    graph, lat, cap_s = capture(part)
                    loaded[part] = (graph, lat, f"capture and profile {cap_s:.2f} s")
            graph, lat, source = loaded[part]
            members.append((graph, lat))
            n_act = sum(t.kind == "activation" for t in graph.tensors.values())
            print(f"## {part}: {len(graph.ops)} ops, {n_act} activations, {len(graph.updated_variables)} updated "
                  f"variables; {source}, step {lat.total_s(graph) * 1e3:.1f} ms, "
                  f"latency coverage {lat.covered(graph):.0%}", flush=True)
        ops = sum(len(g.ops) for g, _ in members)
        for k in (int(x) for x in a.jobs.split(",")):
            for frac in (f for f in fracs if k == 1 or f is not None or a.budgets):
                row = {"model": name, "ops": ops, **bench(members, k, frac, a.repeats or (1 if frac is None else 3))}
                rows.append(row)
                print(f"  {k} job(s) budget={row['budget']:<8} plan {row['plan_s'] * 1e3:8.1f} ms  "
                      f"replan {row['replan_s'] * 1e3:8.1f} ms  iters {row['iterations']:4d}  "
                      f"pool {row['vanilla_pool_peak_MiB']:8.1f} -> {row['planned_pool_peak_MiB']:8.1f} MiB  "
                      f"MSR {row['msr']:6.1%}  swaps {row['swaps']:4d} recomputes {row['recomputes']:3d}  "
                      f"met={row['budget_met']}  ({row['stop']})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
