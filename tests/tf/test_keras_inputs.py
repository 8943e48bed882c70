"""Issue 58 item 3: every input model.fit takes, iterated as fit iterates it (Note [fit's batches]
in tensile_tf/jobs/keras_fit.py).

One module-wide run: each case is trained by model.fit and, as a job, by Job.from_keras on a
copy of the same model, right after the same ``keras.utils.set_random_seed`` (which decides fit's
shuffling); all the jobs train concurrently in one pool. Each must end with fit's History and
weights bit for bit (np.array_equal): example counts that are not a multiple of the batch
(the last partial batch trains), fit's shuffling (on by default, and "batch"), validation_split,
class_weight, a two-input
two-output functional model fed a dict of arrays, a list of arrays, a tf.data dataset of
(dict, dict), a keras.utils.PyDataset, a batch larger than the data; callbacks see fit's params."""
import threading
import time

import numpy as np
import pytest

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensile_tf.jobs.job import Job  # noqa: E402
from tensile_tf.jobs.keras_fit import KerasJobError  # noqa: E402
from tensile_tf.runtime import JobHost, JobStatus, teardown_memory  # noqa: E402
from tensile_tf.tf.determinism import enable_deterministic_training  # noqa: E402

enable_deterministic_training()

N, EPOCHS = 100, 2   # 100 examples: batches of 32 leave a partial batch of 4
rng = np.random.default_rng(0)
A = rng.normal(size=(N, 8)).astype(np.float32)
B = rng.normal(size=(N, 5)).astype(np.float32)
CLS = A[:, :3].argmax(axis=1).astype(np.int32)
REG = (A[:, :2].sum(axis=1, keepdims=True) * B[:, :1]).astype(np.float32)


def two_in_two_out():
    keras.utils.set_random_seed(1)
    a, b = keras.Input((8,), name="a"), keras.Input((5,), name="b")
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(h),
                                           "reg": keras.layers.Dense(1, name="reg")(h)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                  metrics={"cls": ["accuracy"]}, jit_compile=False)
    return model


def one_in_one_out():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    return model


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return -(-N // 24)

    def __getitem__(self, i):
        s = slice(24 * i, 24 * (i + 1))
        return {"a": A[s], "b": B[s]}, {"cls": CLS[s], "reg": REG[s]}


def dict_dataset():
    return tf.data.Dataset.from_tensor_slices(({"a": A, "b": B}, {"cls": CLS, "reg": REG})).shuffle(N).batch(32)


# name: (model, the data as fit's x and keyword arguments, made anew for fit and for the job)
CASES = {
    "arrays": (one_in_one_out, lambda: dict(x=A, y=CLS, batch_size=32, validation_split=0.2,
                                            class_weight={0: 1.0, 1: 2.0, 2: 0.5})),
    "dict": (two_in_two_out, lambda: dict(x={"a": A, "b": B}, y={"cls": CLS, "reg": REG}, batch_size=32,
                                          shuffle="batch")),
    "list": (two_in_two_out, lambda: dict(x=[A, B], y=[CLS, REG], batch_size=32, shuffle=False)),
    "dataset-of-dicts": (two_in_two_out, lambda: dict(x=dict_dataset())),
    # a PyDataset shuffles with Python's global random as each epoch begins (Note [fit's batches])
    "py-dataset": (two_in_two_out, lambda: dict(x=Batches(), shuffle=False)),
    "batch-above-data": (two_in_two_out, lambda: dict(x={"a": A, "b": B}, y={"cls": CLS, "reg": REG},
                                                      batch_size=128)),
}


class Params(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen, self.batches, self.validation_autotuning = None, [], []

    def on_epoch_end(self, epoch, logs=None):
        # whether fit's validation dataset is iterated with tf.data's autotuning (None: its default, on)
        iterator = getattr(self.model, "_eval_epoch_iterator", None)
        if iterator is not None:
            self.validation_autotuning.append(iterator._get_iterator().options().autotune.enabled)

    def on_train_begin(self, logs=None):
        self.seen = dict(self.params)

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)


@pytest.fixture(scope="module")
def trained():
    fits, jobs, models, params = {}, {}, {}, {}
    for name, (make, data) in CASES.items():
        model, seen = make(), Params()
        keras.utils.set_random_seed(7)   # decides fit's shuffling (Note [fit's batches])
        fits[name] = (model, model.fit(**data(), epochs=EPOCHS, verbose=0, callbacks=[seen]).history, seen)
        model, params[name] = make(), Params()
        traces, own_step = [], model.train_step   # the batch size each trace of the job's step had
        model.train_step = lambda batch, own_step=own_step, traces=traces: (
            traces.append(tf.nest.flatten(batch)[0].shape[0]) or own_step(batch))
        keras.utils.set_random_seed(7)
        kwargs = data()
        jobs[name] = Job.from_keras(name, model, kwargs.pop("x"), epochs=EPOCHS, verbose=0, callbacks=[params[name]],
                                    **kwargs)
        models[name] = (model, traces)
    host = JobHost(admission="none")
    states = {name: host.submit(job) for name, job in jobs.items()}
    # the test keeps every model to compare its weights, so each job's stream still holds its optimizer's
    # slots at teardown: no wait frees them (Note [Late frees are not leaks]), six of 5 s each
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(teardown_memory, "LATE_FREE_WAIT_S", 0.0)
        host.run()
    return dict(fits=fits, jobs=jobs, models=models, states=states, params=params)


@pytest.mark.parametrize("name", list(CASES))
def test_every_input_fit_takes_trains_what_fit_trains_bit_for_bit(trained, name):
    reference, history, fit_params = trained["fits"][name]
    state, (model, traces) = trained["states"][name], trained["models"][name]
    job = trained["jobs"][name]
    assert state.status == JobStatus.finished, state.error
    assert state.steps_done == EPOCHS * fit_params.seen["steps"]   # the partial batches are steps
    assert job.history.history == history
    for mine, theirs in zip(model.weights, reference.weights):
        assert np.array_equal(mine.numpy(), theirs.numpy()), f"{name}: {mine.path}"
    for mine, theirs in zip(model.optimizer.variables, reference.optimizer.variables):
        assert np.array_equal(mine.numpy(), theirs.numpy()), f"{name}: {mine.path}"
    # the callbacks saw fit's params and fit's batch numbers
    assert trained["params"][name].seen == fit_params.seen
    assert trained["params"][name].batches == fit_params.batches
    # traced with fit's shapes, the batch dimension free (every case has a partial batch): no trace
    # for one batch size, the trace took them all (tf.function traces twice where the first makes variables)
    assert traces and set(traces) == {None}, (name, traces)


def test_a_partial_batch_takes_no_more_than_a_whole_one(trained):
    """Note [fit's batches]: the partial batch runs the step the probe measured (admission's T),
    with fewer rows; what it took is in the step's record."""
    state = trained["states"]["list"]   # in order, 4 steps an epoch: 32, 32, 32, 4
    peaks = [r.peak_bytes for r in state.records]
    assert len(peaks) == 8
    for partial in (3, 7):
        assert peaks[partial] <= max(peaks[1:3] + peaks[4:7]), peaks
    assert state.peak_bytes >= max(peaks)


def test_seed_and_inputs_fit_refuses():
    """``seed`` is keras.utils.set_random_seed before the data is made: the order fit draws after
    the same call. What fit cannot take, or a job cannot, is refused with what to do."""
    seeded = Job.from_keras("seeded", one_in_one_out(), A, CLS, batch_size=32, seed=7).build()
    model = one_in_one_out()   # its own seed
    keras.utils.set_random_seed(7)
    from_global = Job.from_keras("global", model, A, CLS, batch_size=32).build()
    keras.utils.set_random_seed(8)
    other = Job.from_keras("other", model, A, CLS, batch_size=32).build()
    seen = [[train.next_batch()[1].numpy() for _ in range(4)] for train in (seeded, from_global, other)]
    assert all(np.array_equal(a, b) for a, b in zip(seen[0], seen[1]))
    assert not np.array_equal(seen[0][0], seen[2][0])

    def endless():
        while True:
            yield A[:32], CLS[:32]

    with pytest.raises(KerasJobError, match="length is unknown .* give steps_per_epoch"):
        Job.from_keras("gen", one_in_one_out(), endless())
    assert Job.from_keras("gen", one_in_one_out(), endless(), steps_per_epoch=3, epochs=2).steps == 6
    with pytest.raises(KerasJobError, match="job 'both': .*class_weight.*sample_weight"):   # Keras' own words
        Job.from_keras("both", one_in_one_out(), A, CLS, class_weight={0: 1.0, 1: 1.0, 2: 1.0},
                       sample_weight=np.ones(N, np.float32))
    per_execution = one_in_one_out()
    per_execution.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4,
                          jit_compile=False)
    with pytest.raises(KerasJobError, match="steps_per_execution=1"):
        Job.from_keras("spe", per_execution, A, CLS)


def test_a_several_input_models_sample_is_saved_per_input_and_output(tmp_path):
    """JOB.sample.npz (Note [Work outside the steps, inside the allowance]) for a model of two
    inputs and two outputs: one array per input (``x.a``, ``x.b``) and per output, which the saved
    model predicts again."""
    host = JobHost(admission="none", model_dir=tmp_path / "models")
    state = host.submit(Job.from_keras("two", two_in_two_out(), {"a": A, "b": B}, {"cls": CLS, "reg": REG},
                                       batch_size=32, steps=2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(teardown_memory, "LATE_FREE_WAIT_S", 0.0)
        host.run()
    assert state.status == JobStatus.finished, state.error
    sample = np.load(tmp_path / "models" / "two.sample.npz")
    assert sorted(sample.files) == ["predictions.cls", "predictions.reg", "x.a", "x.b"]
    assert sample["x.a"].shape == (16, 8) and sample["predictions.cls"].shape == (16, 3)
    reloaded = keras.models.load_model(tmp_path / "models" / "two.keras")
    again = reloaded({"a": sample["x.a"], "b": sample["x.b"]}, training=False)
    for out in ("cls", "reg"):
        np.testing.assert_allclose(again[out].numpy(), sample[f"predictions.{out}"], rtol=1e-5, atol=1e-6)


class CountedBatches(keras.utils.PyDataset):
    """A PyDataset read by Keras' enqueuer (two worker threads), counting its epoch ends."""

    def __init__(self):
        super().__init__(workers=2)
        self.epoch_ends = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return A[24 * i:24 * (i + 1)], CLS[24 * i:24 * (i + 1)]

    def on_epoch_end(self):
        self.epoch_ends += 1


def test_a_py_datasets_last_epoch_ends_as_fits_does_and_its_workers_stop():
    # Note [The last epoch ended]: fit ends its last epoch too (the dataset's on_epoch_end, the enqueuer's
    # threads stopped); a job used to stop inside it, leaving both undone (one call short, 6 threads a job)
    fit_data, job_data = CountedBatches(), CountedBatches()
    one_in_one_out().fit(fit_data, epochs=EPOCHS, verbose=0)
    before = set(threading.enumerate())
    host = JobHost(admission="none")
    state = host.submit(Job.from_keras("py-dataset-workers", one_in_one_out(), job_data, epochs=EPOCHS, verbose=0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(teardown_memory, "LATE_FREE_WAIT_S", 0.0)
        host.run()
    assert state.status == JobStatus.finished, state.error
    assert (job_data.epoch_ends, fit_data.epoch_ends) == (EPOCHS + 1,) * 2   # fit's reset ends one too
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, left


def test_every_dataset_a_job_iterates_has_tf_datas_autotuning_off(trained):
    # Note [No autotuning thread per job] (tensile_tf/jobs/datasets.py): an autotuned iterator's
    # destructor could wait out its tuning thread's sleep (up to 60 s) inside a collection
    for name, job in trained["jobs"].items():
        assert job.step_hooks.batches.epoch_iterator._get_iterator().options().autotune.enabled is False, name
    assert trained["params"]["arrays"].validation_autotuning == [False] * EPOCHS
    # the control: fit itself iterates with tf.data's default (so the check above can fail)
    assert trained["fits"]["arrays"][2].validation_autotuning == [None] * EPOCHS


class MadeAhead(keras.callbacks.Callback):
    """At each batch's end, whether the dataset already made the next batch (waiting up to
    ``wait_s`` for it): only a prefetch makes it before the loop asks for it."""

    def __init__(self, made: list, wait_s: float):
        super().__init__()
        self.made, self.wait_s, self.ahead = made, wait_s, []

    def on_train_batch_end(self, batch, logs=None):
        deadline = time.monotonic() + self.wait_s
        while len(self.made) < batch + 2 and time.monotonic() < deadline:   # batch + 1: the next one's index
            time.sleep(0.01)
        self.ahead.append(len(self.made) >= batch + 2)


def counted_batches(made: list) -> tf.data.Dataset:
    """An endless loader of (8,) batches that notes each one it makes; no prefetch of its own."""
    def batches():
        while True:
            made.append(1)
            yield A[:16], CLS[:16]
    spec = (tf.TensorSpec([16, 8], tf.float32), tf.TensorSpec([16], tf.int32))
    return tf.data.Dataset.from_generator(batches, output_signature=spec)


def test_a_datasets_next_batch_is_made_while_the_step_runs_as_under_fit():
    # Note [The prefetch tf.data would add] (tensile_tf/jobs/datasets.py): fit's tf.data injects a
    # prefetch (autotuning on, op determinism off); a job, autotuning off, adds it back. The next batch
    # then exists before the loop asks for it (the callback runs between the step and the next fetch).
    from tensorflow.python.framework import config as tf_config

    from tensile_tf.jobs import datasets, keras_fit

    def ahead(wait_s: float, *, under_fit: bool = False, without_prefetch: bool = False) -> list[bool]:
        made = []
        seen = MadeAhead(made, wait_s)
        kwargs = dict(epochs=1, steps_per_epoch=4, verbose=0, callbacks=[seen])
        if under_fit:
            one_in_one_out().fit(counted_batches(made), **kwargs)
            return seen.ahead
        with pytest.MonkeyPatch.context() as patch:
            if without_prefetch:   # the control: autotuning off, nothing added (the job before the Note)
                patch.setattr(keras_fit, "iterated_as_tf_data_would", datasets.iterated_without_autotuning)
            host = JobHost(admission="none")
            state = host.submit(Job.from_keras("made-ahead", one_in_one_out(), counted_batches(made), **kwargs))
            patch.setattr(teardown_memory, "LATE_FREE_WAIT_S", 0.0)
            host.run()
        assert state.status == JobStatus.finished, state.error
        return seen.ahead

    # this module trains under op determinism: tf.data injects no prefetch, and a job adds none
    assert ahead(0.3, under_fit=True) == [False] * 4
    assert ahead(0.3) == [False] * 4
    tf_config.disable_op_determinism()
    try:
        assert ahead(30.0, under_fit=True) == [True] * 4
        assert ahead(30.0) == [True] * 4
        # without the prefetch nothing makes the next batch until the loop asks: never within the wait
        assert ahead(0.3, without_prefetch=True) == [False] * 4
        # a pipeline already ending in a prefetch (Keras' adapters' do) is not given another
        ends_in_prefetch = counted_batches([]).prefetch(2)
        assert datasets.iterated_as_tf_data_would(ends_in_prefetch)._input_dataset is ends_in_prefetch
        given = datasets.iterated_as_tf_data_would(counted_batches([]))
        assert type(given._input_dataset).__name__ == "_PrefetchDataset"
        assert given.options().autotune.enabled is False
    finally:
        tf_config.enable_op_determinism()
