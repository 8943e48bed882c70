"""Train steps for host and CLI tests (referenced from YAML as tests.job_factories:NAME)."""
import numpy as np
import tensorflow as tf

from tensile_tf.jobs import TrainStep


def dense_regression(batch_size=32, width=256, fail_at_step=None, nan_at_step=None, seed=0, **_):
    """A two-layer regression step. Optionally raises (fail_at_step) or produces
    a NaN loss (nan_at_step) at runtime, from inside the traced step."""
    rng = np.random.default_rng(seed)
    w1 = tf.Variable(rng.standard_normal((64, width)).astype("float32") * 0.05)
    w2 = tf.Variable(rng.standard_normal((width, 1)).astype("float32") * 0.05)
    counter = tf.Variable(0, dtype=tf.int64)
    x = tf.constant(rng.standard_normal((batch_size, 64)).astype("float32"))
    y = tf.constant(rng.standard_normal((batch_size, 1)).astype("float32"))

    def step(x, y):
        counter.assign_add(1)
        if fail_at_step is not None:
            tf.debugging.assert_less(counter, tf.constant(fail_at_step + 1, tf.int64),
                                     message="injected failure")
        with tf.GradientTape() as tape:
            h = tf.nn.relu(x @ w1)
            loss = tf.reduce_mean((h @ w2 - y) ** 2)
        gw1, gw2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.01 * gw1)
        w2.assign_sub(0.01 * gw2)
        if nan_at_step is not None:  # the reported loss only; gradients stay finite
            loss = loss + tf.where(counter > nan_at_step, np.float32("nan"), np.float32(0))
        return loss

    return TrainStep(step_fn=step, batches=[(x, y)], variables=[w1, w2, counter])


def activation_hog(batch_size=1024, width=4096, seed=0, **_):
    """A step whose temporary peak is about 3 * batch_size * width * 4 bytes."""
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.standard_normal((width, width // 64)).astype("float32") * 0.01)
    x = tf.constant(rng.standard_normal((batch_size, width)).astype("float32"))

    def step(x):
        with tf.GradientTape() as tape:
            a = tf.nn.relu(x * 1.5)
            b = tf.nn.relu(a - 0.1)
            loss = tf.reduce_mean(tf.matmul(b, w))
        g = tape.gradient(loss, w)
        w.assign_sub(0.01 * g)
        return loss

    return TrainStep(step_fn=step, batches=[(x,)], variables=[w])
