"""Trains a small Keras CNN deterministically and prints its losses and a
digest of its weights as JSON (last line). With --pool the device pool serves
every tensor; without it TensorFlow's own CPU allocator does. Used by tests
to show that the pool changes nothing training computes."""
import argparse
import hashlib
import json

parser = argparse.ArgumentParser()
parser.add_argument("--pool", action="store_true")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

if args.pool:
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op

    tensile_tf.configure_pool("512MiB")
import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(7)
tf.config.experimental.enable_op_determinism()

model = keras.Sequential([
    keras.Input((16, 16, 3)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(10),
])
opt = keras.optimizers.Adam(1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((args.batch, 16, 16, 3)).astype("float32"))
y = tf.constant(rng.integers(0, 10, args.batch))


@tf.function(jit_compile=False)
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


losses = [float(train_step(x, y)) for _ in range(args.steps)]
digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights)).hexdigest()
result = {"losses": losses, "weights_sha256": digest}
if args.pool:
    result["pool"] = {k: v for k, v in tensile_tf.pool_stats().items() if k != "jobs"}
print(json.dumps(result))
