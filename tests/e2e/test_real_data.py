"""Real examples for YAML jobs (tensile_tf/jobs/datasets.py): scikit-learn's
bundled digits, the user's .npz, .npy and TFRecord files and image
directories, a validation split with
Keras metrics, and the outputs a Keras user expects: TensorBoard event
files and the trained model in Keras' format."""
import json

import numpy as np
import pytest

from tests.e2e.test_cli import tensile, write

JOB = """
  - name: {name}
    model: {{builder: "tensile_tf.jobs.zoo:mlp", args: {{hidden: [64]}}}}
    input_shape: {shape}
    data: {data}
    batch_size: 64
    optimizer: {{name: adam, learning_rate: 0.01}}
    steps: 60
    validate_every: 20
    metrics: [accuracy, sparse_top_k_categorical_accuracy]
    seed: 1
"""


def _write_data(folder) -> dict[str, str]:
    """Each data kind's files, from scikit-learn's digits: name -> the job's ``data:``."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float32) / 16.0, d.target.astype(np.int64)
    np.savez(folder / "digits.npz", images=x, labels=y)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    np.savez(folder / "train.npz", x=x[:1400], y=y[:1400])
    np.savez(folder / "val.npz", x=x[1400:], y=y[1400:])
    np.savez(folder / "wrong.npz", x=np.zeros((100, 64), np.float32), y=np.zeros(100, np.int32))
    for part in range(2):   # two files, one glob
        with tf.io.TFRecordWriter(str(folder / f"digits-{part}.tfrecord")) as w:
            for xs, label in zip(d.data[part::2] / 16.0, d.target[part::2]):
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=xs.tolist())),
                    "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString())
    for k, (image, label) in enumerate(zip(d.images[:600], d.target[:600])):
        sub = folder / "images" / f"digit_{label}"
        sub.mkdir(parents=True, exist_ok=True)
        pixels = tf.constant((image * 255 / 16).astype(np.uint8)[..., None])
        tf.io.write_file(str(sub / f"{k}.png"), tf.io.encode_png(pixels))
    corrupt = folder / "corrupt_images"
    for k in range(2):   # a good image first: the bad one is the second file the loader reads
        (corrupt / f"digit_{k}").mkdir(parents=True)
        tf.io.write_file(str(corrupt / f"digit_{k}" / "a.png"), tf.io.encode_png(tf.zeros([8, 8, 1], tf.uint8)))
    (corrupt / "digit_0" / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    return {
        "digits": "{kind: digits, validation_split: 0.2}",
        "npz": f"{{kind: npz, path: {folder / 'digits.npz'}, x_key: images, y_key: labels, validation_split: 0.25}}",
        "npy": f"{{kind: npy, path: {folder / 'x.npy'}, labels_path: {folder / 'y.npy'}, validation_split: 0.25}}",
        "own_validation": f"{{kind: npz, path: {folder / 'train.npz'}, validation_path: {folder / 'val.npz'}}}",
        "tfrecord": f"{{kind: tfrecord, path: '{folder}/digits-*.tfrecord', x_key: pixels, y_key: digit, "
                    "validation_split: 0.25}",
        "images": f"{{kind: image_dir, path: '{folder / 'images'}', validation_split: 0.25}}",
        "wrong_key": f"{{kind: npz, path: {folder / 'wrong.npz'}, y_key: labels, validation_split: 0.2}}",
        "corrupt_image": f"{{kind: image_dir, path: '{corrupt}', validation_split: 0.25}}",
    }


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    """One `tensile run` of a job per data kind, side by side in one pool (and
    one whose file lacks the array its y_key names: it fails alone)."""
    folder = tmp_path_factory.mktemp("real_data")
    data = _write_data(folder)
    jobs = "".join(JOB.format(name=name, data=d, shape="[8, 8, 1]" if "image" in name else "[64]")
                   + ("    checkpoint_every: 25\n" if name == "digits" else "") for name, d in data.items())
    cfg = write(folder, "pool: 512MiB\nrun: {out_dir: unused, concurrency: 3}\njobs:" + jobs)
    out = folder / "out"
    proc = tensile("run", str(cfg), "--out", str(out))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]   # wrong_key and corrupt_image failed, alone
    jobs = {j["name"]: j for j in json.loads((out / "results.json").read_text())["jobs"]}
    return out, jobs


def test_an_image_that_does_not_decode_is_named_with_data_path(data_run, tmp_path):
    """Issue 57: TensorFlow's "jpeg::Uncompress failed" named neither the file nor data.path. The
    job fails alone, naming both; `tensile validate --data` finds it before anything trains, and
    plain `tensile validate` (no data read) passes the same config."""
    out, jobs = data_run
    job = jobs["corrupt_image"]
    assert job["status"] in ("failed", "rejected"), job
    assert "b.jpg" in job["error"] and "corrupt_images" in job["error"] and "data.path" in job["error"], job["error"]
    folder = out.parent
    cfg = write(tmp_path, "pool: 64MiB\njobs:" + JOB.format(
        name="corrupt_image", shape="[8, 8, 1]",
        data=f"{{kind: image_dir, path: '{folder / 'corrupt_images'}', validation_split: 0.25}}"))
    assert tensile("validate", str(cfg)).returncode == 0
    checked = tensile("validate", "--data", str(cfg))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "b.jpg" in checked.stderr and "cannot decode" in checked.stderr and "Traceback" not in checked.stderr


def _trained_and_validated(job) -> None:
    assert job["status"] == "finished" and [v["step"] for v in job["validation"]] == [20, 40, 60], job
    # held-out digits, 10 classes (chance 0.1): a trained MLP gets most right
    assert job["validation"][-1]["metrics"]["accuracy"] > 0.5, job["validation"]


def test_digits_trains_validates_and_writes_tensorboard_and_a_model_keras_loads(data_run):
    out, jobs = data_run
    job = jobs["digits"]
    assert job["status"] == "finished" and len(job["losses"]) == 60
    _trained_and_validated(job)
    last = job["validation"][-1]
    assert last["loss"] < job["validation"][0]["loss"] * 1.5, job["validation"]
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

    # checkpoint_every: the model after steps 25 and 50 (the finished one is the model above)
    assert job["checkpoints"] == ["models/digits.step25.keras", "models/digits.step50.keras"]
    earlier = keras.models.load_model(out / job["checkpoints"][0])
    assert not np.allclose(earlier(sample["x"], training=False).numpy(), sample["predictions"], atol=1e-4)


@pytest.mark.parametrize("kind", ["npz", "npy"])
def test_a_jobs_own_numpy_files_train_it(data_run, kind):
    _trained_and_validated(data_run[1][kind])


def test_validation_data_of_its_own_is_used_instead_of_a_split(data_run):
    job = data_run[1]["own_validation"]
    _trained_and_validated(job)
    # all 397 validation examples were judged: accuracy is a multiple of 1/397
    accuracy = job["validation"][-1]["metrics"]["accuracy"]
    assert abs(accuracy * 397 - round(accuracy * 397)) < 1e-3


def test_tfrecord_files_train_a_job(data_run):
    _trained_and_validated(data_run[1]["tfrecord"])


def test_a_directory_of_images_trains_a_job_through_keras_loader(data_run):
    # the folders' sorted names are the classes, so digit_3's images are class 3
    _trained_and_validated(data_run[1]["images"])


def test_a_file_without_the_named_array_fails_that_job_alone(data_run):
    jobs = data_run[1]
    job = jobs["wrong_key"]
    assert job["status"] == "failed" and "has no array 'labels'" in job["error"] and "y_key" in job["error"], job
    assert all(j["status"] == "finished" for name, j in jobs.items() if name not in ("wrong_key", "corrupt_image"))


def test_bad_data_is_refused_with_where_and_what_to_do(tmp_path):
    from tests.e2e.test_bad_inputs import cli_in_process

    one_job = "pool: 256MiB\nrun: {{out_dir: unused}}\njobs:" + JOB
    cfg = write(tmp_path, one_job.format(name="digits", shape="[64]",
                                         data=f"{{kind: npz, path: {tmp_path / 'missing.npz'}, validation_split: 0.2}}"))
    # `tensile validate` makes the checks `tensile run` makes first, in this process (whose pool is not
    # the config's: `run` would install the config's pool before checking the data's references)
    code, _, err = cli_in_process("validate", str(cfg))
    assert code == 2 and "jobs[0].data.path" in err and "does not exist" in err, err
    cfg = write(tmp_path, one_job.format(name="digits", shape="[64]", data="{kind: digits}"))  # nothing held out
    code, _, err = cli_in_process("validate", str(cfg))
    assert code == 2 and "validation_split" in err, err


PLANNED_DIGITS = """
pool: 64MiB
run: {{out_dir: unused, planner: tensile, plan_budget: {budget}, swap_bandwidth: 16GiB}}
jobs:
  - name: digits
    model: {{builder: "tensile_tf.jobs.zoo:mlp", args: {{hidden: [512, 512]}}}}
    input_shape: [64]
    data: {{kind: digits, validation_split: 0.2}}
    batch_size: 64
    optimizer: {{name: adam, learning_rate: 0.003}}
    steps: 30
    validate_every: 10
    checkpoint_every: 10
    metrics: [accuracy]
    seed: 1
"""


def test_validation_and_checkpoints_of_a_planned_job_see_its_real_variables(tmp_path):
    # A plan that keeps parameters or slots on the host between steps: validation and the
    # checkpoints bring them back first (JobThread._variables_on_device), so what they see is
    # what the same job computes without swaps, to the bit (the plan never changes training)
    runs = {}
    for name, budget in (("planned", "3MiB"), ("roomy", "60MiB")):
        (tmp_path / name).mkdir()
        cfg = write(tmp_path / name, PLANNED_DIGITS.format(budget=budget))
        out = tmp_path / name / "out"
        proc = tensile("run", str(cfg), "--out", str(out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = json.loads((out / "results.json").read_text())
        (job,) = runs[name]["jobs"]
        assert job["status"] == "finished" and job["checkpoints"] == [
            "models/digits.step10.keras", "models/digits.step20.keras"], job
    start = runs["planned"]["planner"]["plans"][0]
    assert sum(start["swap_outs"].values()) > 0, start   # the plan moved tensors
    # ... and keeps variables (Adam's slots) on the host between steps: the path under test
    assert runs["planned"]["jobs"][0]["plan"]["rewrite"]["restore_needed"], runs["planned"]["jobs"][0]["plan"]
    assert not sum(runs["roomy"]["planner"]["plans"][0]["swap_outs"].values())
    planned, roomy = runs["planned"]["jobs"][0], runs["roomy"]["jobs"][0]
    assert planned["losses"] == roomy["losses"]
    assert planned["validation"] and [(v["step"], v["loss"], v["metrics"]) for v in planned["validation"]] == \
        [(v["step"], v["loss"], v["metrics"]) for v in roomy["validation"]]
