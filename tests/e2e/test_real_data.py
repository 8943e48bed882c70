"""Real examples for YAML jobs (tensile_tf/datasets.py): scikit-learn's
bundled digits, the user's .npz and .npy files, a validation split with
Keras metrics, and the outputs a Keras user expects: TensorBoard event
files and the trained model in Keras' format."""
import json

import numpy as np
import pytest

from tests.e2e.test_cli import tensile, write

DIGITS = """
pool: 256MiB
run: {{out_dir: unused}}
jobs:
  - name: digits
    model: {{builder: "tensile_tf.zoo:mlp", args: {{hidden: [64]}}}}
    input_shape: [64]
    data: {data}
    batch_size: 64
    optimizer: {{name: adam, learning_rate: 0.01}}
    steps: 60
    validate_every: 20
    metrics: [accuracy, sparse_top_k_categorical_accuracy]
    seed: 1
"""


def _run(tmp_path, data):
    cfg = write(tmp_path, DIGITS.format(data=data))
    out = tmp_path / "out"
    proc = tensile("run", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = json.loads((out / "results.json").read_text())["jobs"]
    return out, job


def test_digits_trains_validates_and_writes_tensorboard_and_a_model_keras_loads(tmp_path):
    out, job = _run(tmp_path, "{kind: digits, validation_split: 0.2}")
    assert job["status"] == "finished" and len(job["losses"]) == 60
    steps = [v["step"] for v in job["validation"]]
    assert steps == [20, 40, 60], job["validation"]
    last = job["validation"][-1]
    # 360 held-out digits, 10 classes (chance 0.1): a trained MLP gets most right
    assert last["metrics"]["accuracy"] > 0.5 and last["loss"] < job["validation"][0]["loss"] * 1.5, job["validation"]
    assert last["metrics"]["sparse_top_k_categorical_accuracy"] >= last["metrics"]["accuracy"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(out / "tensorboard" / "digits"), size_guidance={"tensors": 0})  # keep all
    events.Reload()

    def scalars(tag):   # TF2 summaries are tensors
        return [(e.step, round(float(make_ndarray(e.tensor_proto)), 5)) for e in events.Tensors(tag)]

    assert scalars("train/loss") == [(i, round(x, 5)) for i, x in enumerate(job["losses"])]
    assert scalars("validation/accuracy") == [(v["step"], round(v["metrics"]["accuracy"], 5))
                                              for v in job["validation"]]
    assert len(scalars("memory/step_peak_pool_MiB")) == 60

    import keras

    assert job["model_path"] == "models/digits.keras"
    model = keras.models.load_model(out / job["model_path"])
    sample = np.load(out / "models" / "digits.sample.npz")
    np.testing.assert_allclose(model(sample["x"], training=False).numpy(), sample["predictions"], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("kind", ["npz", "npy"])
def test_a_jobs_own_numpy_files_train_it(tmp_path, kind):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float32) / 16.0, d.target.astype(np.int64)
    if kind == "npz":
        np.savez(tmp_path / "digits.npz", images=x, labels=y)
        data = f"{{kind: npz, path: {tmp_path / 'digits.npz'}, x_key: images, y_key: labels, validation_split: 0.25}}"
    else:
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "y.npy", y)
        data = f"{{kind: npy, path: {tmp_path / 'x.npy'}, labels_path: {tmp_path / 'y.npy'}, validation_split: 0.25}}"
    out, job = _run(tmp_path, data)
    assert job["status"] == "finished" and [v["step"] for v in job["validation"]] == [20, 40, 60]
    assert job["validation"][-1]["metrics"]["accuracy"] > 0.5, job["validation"]


def test_bad_data_is_refused_with_where_and_what_to_do(tmp_path):
    cfg = write(tmp_path, DIGITS.format(data=f"{{kind: npz, path: {tmp_path / 'missing.npz'}, validation_split: 0.2}}"))
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "jobs[0].data.path" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    np.savez(tmp_path / "wrong.npz", x=np.zeros((100, 64), np.float32), y=np.zeros(100, np.int32))
    cfg = write(tmp_path, DIGITS.format(data=f"{{kind: npz, path: {tmp_path / 'wrong.npz'}, y_key: labels, "
                                             "validation_split: 0.2}"))
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out2"))
    assert proc.returncode == 1, proc.stdout[-2000:]
    (job,) = json.loads((tmp_path / "out2" / "results.json").read_text())["jobs"]
    assert job["status"] == "failed" and "has no array 'labels'" in job["error"] and "y_key" in job["error"], job
    cfg = write(tmp_path, DIGITS.format(data="{kind: digits}"))   # validate_every, nothing held out
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out3"))
    assert proc.returncode == 2 and "validation_split" in proc.stderr, proc.stderr
