"""Trials per hour of a KerasTuner random search (or Hyperband, ``--tuner hyperband``) on
digits-sized models, three ways on the same cores (issues 42, 58):

- ``packed``: ``PackedRandomSearch`` / ``PackedHyperband`` (tensile_tf/search/packed_tuner.py),
  ``--concurrent`` trials at once as jobs in one device pool, one process;
- ``sequential``: KerasTuner's own ``RandomSearch`` / ``Hyperband``, one trial at a time, one
  process, plain TensorFlow (no pool);
- ``distributed``: KerasTuner's own distributed mode: a chief process serving the oracle over
  gRPC and ``--concurrent`` worker processes (``--workers``), each a tuner running one trial at a
  time;
- ``distributed-packed``: the same chief, each worker a packed tuner with its own pool running
  ``--concurrent`` trials at once (Note [Packed workers of KerasTuner's chief]).

Each mode runs in fresh processes on the same hypermodel (an MLP on scikit-learn's bundled 8x8
digits, units / dropout / learning rate searched), the same oracle seed, ``--trials`` trials of
``--epochs`` epochs (Hyperband: at most ``--epochs``, its brackets' own). The data is fit's as a
user gives it: 1,797 examples, 20% held out, batches of 64 (the last one partial), shuffled by
fit each epoch (its default). Reported: wall time from the first process's start to the last's
end, trials per hour, trials completed, trials lost (failed or invalid; for ``packed`` also those
retried alone), and how many trials' scores equal the sequential search's, trial by trial (the
same oracle seed proposes the same trials, and the hypermodel seeds Keras at each build, so a
trial's initial weights and fit's shuffling do not depend on the trials before it; issue 58 asks
for all of them), and how many are the same trial by id too (a packed Hyperband hands out the
sequential search's trials in its order, Note [Promotions wait for their round]).

    PYTHONPATH=. python benchmarks/keras_tuner_bench.py --trials 16 --epochs 5 --concurrent 2
    PYTHONPATH=. python benchmarks/keras_tuner_bench.py --tuner hyperband --epochs 9 --modes packed,sequential
    PYTHONPATH=. python benchmarks/keras_tuner_bench.py --model io-mem --pool 30MiB --trials 16 --epochs 2 \
        --workers 2 --modes distributed-packed,distributed --kill-worker-at 30   # memory-bound, a worker lost

``--kill-worker-at S`` kills worker ``tuner0`` S seconds in and starts it again with the same
``KERASTUNER_TUNER_ID`` (the chief's oracle hands it back the trials it was running, which start
over): trials lost counts the chief's trials that did not complete.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRIAL_SCRIPT = r'''
import json, os, sys
mode, directory, trials, epochs, concurrent = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tuner_kind, model_kind, pool = sys.argv[6], sys.argv[7], sys.argv[8]
if mode == "packed":
    import tensile_tf
    tensile_tf.install(pool)
import keras, keras_tuner, numpy as np
from sklearn.datasets import load_digits

def build_io_mem(hp):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), *[keras.layers.Dense(256, activation="relu") for _ in range(12)],
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(hp.Float("lr", 1e-4, 1e-3, sampling="log")),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    return model

def io_mem_data(steps):
    """Two fixed random batches of 1,024 x 64, each delivered 200 ms after it is asked for (a slow
    loader; the sleep leaves the cores and the GIL to other trials), as search_bench.py's io-mem."""
    import time, tensorflow as tf
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1024, 64)).astype(np.float32) for _ in range(2)]
    ys = [rng.integers(0, 10, 1024).astype(np.int32) for _ in range(2)]
    def batches():
        for k in range(steps):
            time.sleep(0.2)
            yield xs[k % 2], ys[k % 2]
    spec = (tf.TensorSpec([1024, 64], tf.float32), tf.TensorSpec([1024], tf.int32))
    return tf.data.Dataset.from_generator(batches, output_signature=spec)

def build(hp):
    keras.utils.set_random_seed(1)   # the hypermodel seeds itself: each trial the same seeds, packed or not
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(hp.Int("units", 32, 512, step=32), activation="relu"),
                              keras.layers.Dropout(hp.Float("dropout", 0.0, 0.4, step=0.1)),
                              keras.layers.Dense(hp.Int("units2", 32, 256, step=32), activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-3, 1e-2, sampling="log")),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model

if model_kind == "io-mem":   # memory-bound and stalled on data: epochs of 30 late batches, scored on the loss
    build, x, y = build_io_mem, io_mem_data(30 * epochs), None   # fit does not restart data given steps_per_epoch
    fit_kwargs = dict(epochs=epochs, steps_per_epoch=30)
    kwargs = dict(objective="loss", seed=1, directory=directory, project_name="bench")
    run_settings = dict(planner="tensile", admission="sum")   # as search_bench.py: free-running trials
else:
    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)
    order = np.random.default_rng(1).permutation(len(x)); x, y = x[order], y[order]
    fit_kwargs = dict(epochs=epochs, batch_size=64, validation_split=0.2)
    kwargs = dict(objective="val_accuracy", seed=1, directory=directory, project_name="bench")
    run_settings = {}
if tuner_kind == "hyperband":
    kwargs.update(max_epochs=epochs, hyperband_iterations=1)
else:
    kwargs.update(max_trials=trials)
if mode == "packed":
    from tensile_tf.search.packed_tuner import PackedHyperband, PackedRandomSearch
    packed = PackedHyperband if tuner_kind == "hyperband" else PackedRandomSearch
    tuner = packed(build, concurrent_trials=concurrent, **run_settings, **kwargs)
else:
    tuner = (keras_tuner.Hyperband if tuner_kind == "hyperband" else keras_tuner.RandomSearch)(build, **kwargs)
tuner.search(x, y, verbose=0, **fit_kwargs)
if os.environ.get("KERASTUNER_TUNER_ID", "chief") == "chief":
    statuses = [t.status for t in tuner.oracle.trials.values()]
    # each trial's hyperparameters and score, to compare trial by trial with another mode's; a Hyperband
    # trial names the trial it continues by id, and ids follow the order trials were asked for
    scores = {tid: [json.dumps({k: v for k, v in t.hyperparameters.values.items() if k != "tuner/trial_id"},
                               sort_keys=True), t.score]
              for tid, t in tuner.oracle.trials.items()}
    print(json.dumps({"completed": statuses.count("COMPLETED"), "lost": len(statuses) - statuses.count("COMPLETED"),
                      "scores": scores,
                      "packing": getattr(tuner, "packing", None),
                      "most_at_once": tuner.last_run.most_jobs_running if getattr(tuner, "last_run", None) else None}))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mode(mode: str, a: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TENSILE_POOL_BYTES", None)
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "trial_script.py"
        script.write_text(TRIAL_SCRIPT)
        args = [str(a.trials), str(a.epochs), str(a.concurrent), a.tuner, a.model, a.pool]
        t0 = time.perf_counter()
        if mode in ("distributed", "distributed-packed"):
            port = str(free_port())
            base = dict(env, KERASTUNER_ORACLE_IP="127.0.0.1", KERASTUNER_ORACLE_PORT=port)
            # the chief serves the oracle; each worker a plain tuner, or a packed one (--concurrent trials at once)
            worker = "packed" if mode == "distributed-packed" else mode
            def start(tid: str) -> subprocess.Popen:
                return subprocess.Popen([sys.executable, str(script), worker if tid != "chief" else mode, d, *args],
                                        env=dict(base, KERASTUNER_TUNER_ID=tid),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            procs = [start(tid) for tid in ["chief"] + [f"tuner{k}" for k in range(a.workers or a.concurrent)]]
            killed = None
            if a.kill_worker_at is not None:   # a worker lost mid-search, started again as a cluster manager would
                time.sleep(max(0.0, t0 + a.kill_worker_at - time.perf_counter()))
                if procs[1].poll() is None:
                    procs[1].kill()
                    procs[1].communicate()
                    killed = round(time.perf_counter() - t0, 1)
                    procs[1] = start("tuner0")   # the same KERASTUNER_TUNER_ID: the oracle hands it its trials
            outs = [p.communicate(timeout=3600) for p in procs]
            rc = max(p.returncode for p in procs)
            out = outs[0][0]
            err = "\n".join(e for _, e in outs)
        else:
            p = subprocess.run([sys.executable, str(script), mode, d, *args], env=env, capture_output=True,
                               text=True, timeout=3600)
            rc, out, err = p.returncode, p.stdout, p.stderr
        wall = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        return {"mode": mode, "error": err[-1500:]}
    got = json.loads(lines[-1])
    if mode in ("distributed", "distributed-packed") and a.kill_worker_at is not None:
        got["worker_killed_at_s"] = killed   # None: it had ended before
    return {"mode": mode, "wall_s": wall, "trials_per_hour": got["completed"] / wall * 3600, **got}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--modes", default="packed,sequential,distributed")
    ap.add_argument("--tuner", choices=["random", "hyperband"], default="random")
    ap.add_argument("--workers", type=int, default=None,
                    help="distributed modes: worker processes (default --concurrent)")
    ap.add_argument("--model", choices=["digits", "io-mem"], default="digits",
                    help="io-mem: the memory-bound search (a deep MLP, 30 batches 200 ms late an epoch, planner on)")
    ap.add_argument("--pool", default="256MiB", help="each packed process's pool")
    ap.add_argument("--kill-worker-at", type=float, default=None, metavar="S",
                    help="distributed modes: kill worker tuner0 S seconds in (SIGKILL) and start it again with "
                         "the same KERASTUNER_TUNER_ID; its running trials go back to it, none may be lost")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for mode in a.modes.split(","):
        row = run_mode(mode, a)
        rows.append(row)
        if "error" in row:
            print(f"{mode:12s} failed: {row['error']}", flush=True)
        else:
            print(f"{mode:12s} {row['completed']:3d} trials completed, {row['lost']} lost in {row['wall_s']:6.1f} s: "
                  f"{row['trials_per_hour']:7.0f} trials/hour"
                  + (f"  (retried alone {row['packing']['retried_alone']}, at most {row['most_at_once']} at once)"
                     if row.get("packing") else "")
                  + (f"  (worker tuner0 killed at {row['worker_killed_at_s']} s and started again)"
                     if row.get("worker_killed_at_s") is not None else ""), flush=True)
    seq = next((r for r in rows if r["mode"] == "sequential" and "scores" in r), None)
    for row in rows:   # trial by trial: a trial of the same hyperparameters has the same score
        if seq is not None and row is not seq and "scores" in row:
            pairs = [Counter(tuple(v) for v in r["scores"].values()) for r in (row, seq)]
            same = sum((pairs[0] & pairs[1]).values())   # each sequential trial matched once
            row["scores_equal_to_sequential"] = f"{same} of {len(seq['scores'])}"
            by_id = sum(row["scores"].get(tid) == v for tid, v in seq["scores"].items())
            row["trials_equal_by_id"] = f"{by_id} of {len(seq['scores'])}"   # the same id, hyperparameters, score
            print(f"{row['mode']:12s} scores equal to the sequential search's: {row['scores_equal_to_sequential']}"
                  f" (the same trial id too: {row['trials_equal_by_id']})")
    if a.json:
        Path(a.json).write_text(json.dumps({"tuner": a.tuner, "trials": a.trials, "epochs": a.epochs,
                                            "concurrent": a.concurrent, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
