"""Predicted vs measured vanilla peak, per job of the given configs.

Each job alone, in one process: build it under its own pool stream, run one
step (traces, creates the optimizer's slots), then STEPS steps each with its
own stream peak (the training window of Note [Training window]); capture it
the way the runtime does (``capture_for_planning``: executor order, scratch
bytes, latencies) and ask the planner for its vanilla peak. Prints one line
per job: measured (largest and smallest per-step peak), predicted, error.

    PYTHONPATH=. python benchmarks/prediction_accuracy_bench.py configs/quickstart.yaml configs/nodegroup.yaml
"""
from __future__ import annotations

import argparse
import gc

import tensile_tf

tensile_tf.install("3GiB")  # before any TensorFlow op

from tensile_tf.config.schema import load_config  # noqa: E402
from tensile_tf.pipeline import JobToPlan, capture_for_planning  # noqa: E402
from tensile_tf.jobs.job import Job  # noqa: E402
from tensile_tf.tf.pool import JobStream  # noqa: E402
from tensile_tf.scheduler import Planner  # noqa: E402


def measure(spec, steps: int) -> tuple[list[int], int]:
    stream = JobStream(spec.name)
    with stream.eager_scope():
        train = Job.from_spec(spec).build()
        fn = stream.step_function(train.step_fn)
        fn(*train.next_batch())   # traces, creates the optimizer's slots; its batch is dropped (Note [Example batch])
        peaks = []
        for _ in range(steps):
            batch = train.next_batch()
            stream.reset_peak()
            fn(*batch)
            peaks.append(stream.stats()["peak"])
        captured = capture_for_planning(JobToPlan(spec.name, fn, batch, optimizer=train.optimizer))
    plan = Planner([captured.planner_job], pool_bytes=None, max_iterations=0).plan()
    predicted = plan.jobs[spec.name].vanilla_peak_bytes
    del train, fn, batch, captured
    gc.collect()
    stream.release()
    return peaks, predicted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--inter-op", type=int, default=0,
                        help="TensorFlow inter-op threads (1: one op at a time; default: TensorFlow's)")
    args = parser.parse_args()
    if args.inter_op:
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    print(f"{'config':<28} {'job':<16} {'measured MiB (min)':>20} {'predicted MiB':>14} {'error':>7}")
    for path in args.configs:
        for spec in load_config(path).jobs:
            peaks, predicted = measure(spec, args.steps)
            measured = max(peaks)
            print(f"{path:<28} {spec.name:<16} {measured / 2**20:>11.1f} ({min(peaks) / 2**20:6.1f}) "
                  f"{predicted / 2**20:>14.1f} {(predicted - measured) / measured:>+7.1%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
