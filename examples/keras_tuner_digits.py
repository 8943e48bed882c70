"""A KerasTuner random search whose trials train two at a time in one 128 MiB pool
(tensile_tf.search.packed_tuner): scikit-learn's bundled 8x8 digits (no download), 20% held out.
KerasTuner's own results, best model and resume (run it again: finished trials are kept).
About a minute on 2 cores:

    python examples/keras_tuner_digits.py --out runs/kt_digits
"""
import argparse

import tensile_tf

tensile_tf.install("128MiB")   # the device pool, before TensorFlow's first op

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from tensile_tf.search.packed_tuner import PackedRandomSearch  # noqa: E402


def build(hp) -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(hp.Int("units", 32, 256, step=32), activation="relu"),
                              keras.layers.Dropout(hp.Float("dropout", 0.0, 0.4, step=0.2)),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-3, 1e-2, sampling="log")),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out", default="runs/kt_digits")
    args = ap.parse_args()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(1).permutation(len(x))
    x, y = x[order], y[order]

    tuner = PackedRandomSearch(build, objective="val_accuracy", max_trials=args.trials, seed=1,
                               directory=args.out, project_name="digits", concurrent_trials=2)
    tuner.search(x, y, epochs=args.epochs, batch_size=64, validation_split=0.2,
                 callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=3)])
    tuner.results_summary(num_trials=3)
    best = tuner.get_best_hyperparameters()[0].values
    print(f"best: {best}; trials run here {tuner.packing['trials']}, retried alone "
          f"{tuner.packing['retried_alone']}, at most {tuner.last_run.most_jobs_running} at once")


if __name__ == "__main__":
    main()
