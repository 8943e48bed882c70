"""How long deleting a tf.data iterator takes, with tf.data's autotuning on (its default) and
with it off as jobs iterate (Note [No autotuning thread per job] in tensile_tf/jobs/datasets.py), and
with it off and the prefetch a Keras job adds (Note [The prefetch tf.data would add]).

Each trial makes an iterator over a small parallel map with a prefetch, takes batches from it for
``--live-s`` seconds (the autotuning thread's sleep doubles after each optimization, 10 ms up to
60 s) and deletes it, timing the ``del``. A deletion that waits out the autotuning thread's sleep
takes up to that sleep; one that wakes it takes about a millisecond.

    python benchmarks/iterator_teardown_bench.py --trials 20 --live-s 1.5
"""
from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

from tensile_tf.jobs.datasets import iterated_as_tf_data_would, iterated_without_autotuning


def one_deletion(dataset: tf.data.Dataset, live_s: float) -> float:
    """Seconds the ``del`` of an iterator over ``dataset`` took after ``live_s`` of use."""
    iterator = iter(dataset)
    t_end = time.monotonic() + live_s
    while time.monotonic() < t_end:
        next(iterator)
    t0 = time.perf_counter()
    del iterator
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="iterators made and deleted per mode")
    ap.add_argument("--live-s", type=float, default=1.5, help="seconds each iterator is used before its deletion")
    args = ap.parse_args()
    plain = (tf.data.Dataset.range(10**9).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
             .batch(32).prefetch(tf.data.AUTOTUNE))
    synchronous = tf.data.Dataset.range(10**9).map(lambda x: x * 2).batch(32)   # ends in no prefetch
    modes = {"autotuning on (tf.data's default)": plain,
             "autotuning off (as jobs iterate)": iterated_without_autotuning(plain),
             # Note [The prefetch tf.data would add]: a Keras job's dataset ending in no prefetch
             "off, prefetch(1) added (Keras jobs)": iterated_as_tf_data_would(synchronous)}
    print(f"{args.trials} iterators per mode, each used {args.live_s:.1f} s, then deleted; interleaved")
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.trials):
        for mode, dataset in modes.items():
            times[mode].append(one_deletion(dataset, args.live_s))
    print(f"{'mode':36s} {'median ms':>10s} {'max ms':>9s} {'> 50 ms':>8s}")
    for mode, ts in times.items():
        slow = sum(t > 0.05 for t in ts)
        print(f"{mode:36s} {statistics.median(ts) * 1e3:10.1f} {max(ts) * 1e3:9.1f} {slow:5d}/{len(ts)}")


if __name__ == "__main__":
    main()
