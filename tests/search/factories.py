"""Train steps for search tests (YAML: tests.search.factories:NAME)."""
import numpy as np
import tensorflow as tf

from tensile_tf.jobs.job import TrainStep


def sgd_regression(batch_size=32, learning_rate=0.05, width=32, seed=0, **_):
    """Linear regression on a fixed batch by plain SGD: the loss at step k
    falls monotonically with the learning rate (below divergence), so
    trials rank by learning rate, deterministically. Traces in milliseconds."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal((width, 1)).astype("float32")
    x = rng.standard_normal((batch_size, width)).astype("float32")
    y = x @ w_true
    w = tf.Variable(np.zeros((width, 1), "float32"))
    lr = tf.constant(learning_rate, tf.float32)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        w.assign_sub(lr * tape.gradient(loss, w))
        return loss

    return TrainStep(step_fn=step, batches=[(tf.constant(x), tf.constant(y))], variables=[w])
