"""What is live at a job's step peak: for each of N steps of one job of a
config (alone, in one process), the step's peak and, for steps whose peak is
above --above MiB, the largest allocations alive at that moment (from the
pool's event trace). Tells which ops' tensors and scratch overlap when a
step peaks higher than the planner predicts.

    PYTHONPATH=. python benchmarks/step_peak_live_set.py configs/nodegroup.yaml --job cnn-a --steps 30 --above 70
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensile_tf  # noqa: E402

tensile_tf.install("3GiB")  # before any TensorFlow op
import tf_plugin  # noqa: E402
from tensile_tf.config.schema import load_config  # noqa: E402
from tensile_tf.jobs.job import Job  # noqa: E402
from tensile_tf.tf.pool import JobStream  # noqa: E402

MiB = 2**20


def live_at_peak(trace: list[dict]) -> list[tuple[str, int]]:
    """The allocations alive when the trace's running total was largest."""
    live: dict[int, tuple[str, int]] = {}
    current, best, best_live = 0, -1, {}
    for e in trace:
        if e["kind"] == "alloc":
            live[e["offset"]] = (e["op"], e["bytes"])
            current += e["bytes"]
            if current > best:
                best, best_live = current, dict(live)
        elif e["kind"] == "free" and e["offset"] in live:
            current -= live.pop(e["offset"])[1]
    return sorted(best_live.values(), key=lambda a: -a[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--job", help="job name (default: the first)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--above", type=float, default=0.0, help="show the live set of steps peaking above this (MiB)")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    jobs = load_config(args.config).jobs
    spec = next((j for j in jobs if j.name == args.job), None) if args.job else jobs[0]
    if spec is None:
        sys.exit(f"{args.config} has no job {args.job!r} (it has {', '.join(j.name for j in jobs)})")
    stream = JobStream(spec.name)
    pool = tf_plugin.device_pool()
    peaks: dict[float, int] = {}
    with stream.eager_scope():
        train = Job.from_spec(spec).build()
        fn = stream.step_function(train.step_fn)
        fn(*train.next_batch())  # traces, creates the optimizer's slots
        for step in range(1, args.steps + 1):
            pool.clear_trace()
            stream.reset_peak()
            fn(*train.next_batch())
            peak = stream.stats()["peak"] / MiB
            peaks[round(peak, 1)] = peaks.get(round(peak, 1), 0) + 1
            if peak > args.above:
                top = live_at_peak(pool.trace())[:args.top]
                print(f"step {step}: peak {peak:.1f} MiB; largest live: "
                      + ", ".join(f"{op or '?'} {size / MiB:.1f}" for op, size in top), flush=True)
    print("step peaks (MiB: steps):", ", ".join(f"{p}: {n}" for p, n in sorted(peaks.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
