"""Data for benchmarks/search_bench.py's "io" trials: scikit-learn's bundled
digits, each batch delivered after a fixed wait, as a loader reading from
network storage or decoding on a slow host would (emulated: the wait is a
sleep, which leaves the CPU and Python's GIL free for other trials)."""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf


def digits_with_latency(batch_size: int, seed: int, latency_ms: float = 20.0) -> tf.data.Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)

    def batches():
        rng = np.random.default_rng(seed)
        while True:
            order = rng.permutation(len(x))
            for k in range(0, len(x) - batch_size + 1, batch_size):
                time.sleep(latency_ms / 1000.0)
                idx = order[k:k + batch_size]
                yield x[idx], y[idx]

    spec = (tf.TensorSpec([batch_size, 64], tf.float32), tf.TensorSpec([batch_size], tf.int32))
    return tf.data.Dataset.from_generator(batches, output_signature=spec)


def wide_with_latency(batch_size: int, seed: int, input_dim: int = 784, classes: int = 10,
                      latency_ms: float = 20.0, prefetch: int = 0) -> tf.data.Dataset:
    """The "io-mem" trials' data: fixed random (x, y) batches of ``input_dim`` features (a wide
    input, so a trial's activations fill the pool), each delivered after ``latency_ms``;
    ``prefetch``: batches the loader prepares ahead while the step runs (``Dataset.prefetch``)."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((batch_size, input_dim)).astype(np.float32) for _ in range(2)]
    ys = [rng.integers(0, classes, batch_size).astype(np.int32) for _ in range(2)]

    def batches():
        k = 0
        while True:
            time.sleep(latency_ms / 1000.0)
            yield xs[k % 2], ys[k % 2]
            k += 1

    spec = (tf.TensorSpec([batch_size, input_dim], tf.float32), tf.TensorSpec([batch_size], tf.int32))
    data = tf.data.Dataset.from_generator(batches, output_signature=spec)
    return data.prefetch(prefetch) if prefetch else data
