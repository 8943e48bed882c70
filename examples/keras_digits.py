"""Two compiled Keras models trained at once in one 64 MiB pool, as model.fit trains them,
with their callbacks: scikit-learn's bundled 8x8 digits (no download), 20% held out.
Under a minute on 2 cores:

    python examples/keras_digits.py --out runs/keras_digits
    tensorboard --logdir runs/keras_digits/tensorboard

Writes results.json, trace.json, memory.png (the pool over time) and each model's best
checkpoint; prints each model's History.
"""
import argparse
from pathlib import Path

import tensile_tf

tensile_tf.install("64MiB")   # the device pool, before TensorFlow's first op

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402


def compiled(model: keras.Model, learning_rate: float) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--out", default="runs/keras_digits")
    args = ap.parse_args()
    out = Path(args.out)

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    keras.utils.set_random_seed(1)
    order = np.random.default_rng(1).permutation(len(x))   # the bundled digits are sorted by writer
    x, y = x[order], y[order]

    keras.utils.set_random_seed(1)
    mlp = compiled(keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten(),
                                     keras.layers.Dense(128, activation="relu"),
                                     keras.layers.Dense(10, activation="softmax")], name="mlp"), 0.003)
    cnn = compiled(keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                                     keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")],
                                    name="cnn"), 0.003)

    def callbacks(name: str) -> list:
        return [keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
                keras.callbacks.ModelCheckpoint(str(out / f"{name}.keras"), monitor="val_loss",
                                                save_best_only=True)]

    fitted = tensile_tf.fit_concurrently(
        [tensile_tf.KerasFit("mlp", mlp, x, y, batch_size=64, epochs=args.epochs, validation_split=0.2,
                             callbacks=callbacks("mlp")),
         tensile_tf.KerasFit("cnn", cnn, x[..., None], y, batch_size=64, epochs=args.epochs,
                             validation_split=0.2, callbacks=callbacks("cnn"))],
        out_dir=out)
    for name, history in fitted.histories.items():
        h = history.history
        print(f"{name}: {len(h['loss'])} epochs, val_accuracy {h['val_accuracy'][-1]:.3f}, "
              f"best val_loss {min(h['val_loss']):.4f}")
    raise SystemExit(0 if fitted.finished else 1)


if __name__ == "__main__":
    main()
