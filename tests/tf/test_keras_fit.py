"""Job.from_keras (Note [fit's loop in a job] in tensile_tf/jobs/keras_fit.py): a compiled
keras.Model trained in the pool as model.fit trains it, callbacks included.

One module-wide reference: the same model trained by model.fit. Jobs train copies of it
concurrently in one pool; each must end with fit's weights bit for bit and fit's History
(deterministic ops, shuffle=False, jit_compile off: where from_keras is fit's loop; fit's inputs,
shuffling and partial batches: tests/tf/test_keras_inputs.py). Callbacks must have their effects: EarlyStopping stops,
ModelCheckpoint writes a file that loads, TensorBoard writes events, ReduceLROnPlateau lowers
the learning rate, CSVLogger writes a row an epoch."""
import csv

import numpy as np
import pytest

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
import keras  # noqa: E402

from tensile_tf.jobs.job import Job  # noqa: E402
from tensile_tf.jobs.keras_fit import KerasJobError  # noqa: E402
from tensile_tf.runtime import JobHost, JobStatus  # noqa: E402
from tensile_tf.runtime.work_outside_steps import admitted_temporary_bytes  # noqa: E402
from tensile_tf.tf.determinism import enable_deterministic_training  # noqa: E402

enable_deterministic_training()

BATCH, EPOCHS = 32, 3
rng = np.random.default_rng(0)
X = rng.normal(size=(256, 16)).astype(np.float32)
Y = (X[:, :4].argmax(axis=1)).astype(np.int32)
XV = rng.normal(size=(64, 16)).astype(np.float32)
YV = (XV[:, :4].argmax(axis=1)).astype(np.int32)


def compiled_model(seed: int = 1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    return model


@pytest.fixture(scope="module")
def fit_reference():
    model = compiled_model()
    history = model.fit(X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=(XV, YV),
                        verbose=0)
    return model, history.history


@pytest.fixture(scope="module")
def concurrent_jobs(tmp_path_factory):
    """Two copies of the reference trained concurrently, and a third with callbacks."""
    out = tmp_path_factory.mktemp("keras")
    a, b, c = compiled_model(), compiled_model(), compiled_model()
    lr_seen = []

    class LearningRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            lr_seen.append(float(self.model.optimizer.learning_rate))

    callbacks = [
        # loss never improves by 10: stops after its second epoch (patience 1)
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1),
        keras.callbacks.ModelCheckpoint(str(out / "best.keras"), monitor="val_loss"),
        keras.callbacks.TensorBoard(log_dir=str(out / "tb")),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10.0, patience=0, factor=0.5),
        keras.callbacks.CSVLogger(str(out / "log.csv")),
        LearningRate(),
    ]
    jobs = {
        "a": Job.from_keras("a", a, X, Y, batch_size=BATCH, epochs=EPOCHS, validation_data=(XV, YV),
                            shuffle=False),
        "b": Job.from_keras("b", b, X, Y, batch_size=BATCH, epochs=EPOCHS, validation_data=(XV, YV),
                            shuffle=False),
        "c": Job.from_keras("c", c, X, Y, batch_size=BATCH, epochs=EPOCHS, validation_data=(XV, YV),
                            shuffle=False, callbacks=callbacks),
    }
    host = JobHost(admission="none")
    states = {name: host.submit(job) for name, job in jobs.items()}
    result = host.run()
    return dict(models={"a": a, "b": b, "c": c}, jobs=jobs, states=states, result=result, out=out,
                lr_seen=lr_seen)


def test_from_keras_trains_what_fit_trains_bit_for_bit(fit_reference, concurrent_jobs):
    reference, history = fit_reference
    assert concurrent_jobs["result"].most_jobs_running == 3
    for name in ("a", "b"):
        state, model = concurrent_jobs["states"][name], concurrent_jobs["models"][name]
        assert state.status == JobStatus.finished and state.steps_done == EPOCHS * 256 // BATCH
        for mine, theirs in zip(model.weights, reference.weights):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=f"{name}: {mine.path}")
        for mine, theirs in zip(model.optimizer.variables, reference.optimizer.variables):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
        assert concurrent_jobs["jobs"][name].history.history == history   # loss, accuracy, val_* per epoch
        # the probe's one validation batch (its metrics put back: the history above is fit's) is admitted,
        # and each epoch's evaluate stayed within it (Note [Work outside the steps, inside the allowance])
        assert state.outside_steps_need_bytes > 0
        assert state.outside_steps_allowance_bytes == admitted_temporary_bytes(state, state.temporary_bytes) \
            >= state.outside_steps_need_bytes
        assert state.outside_steps_peak_bytes <= state.outside_steps_allowance_bytes
        # the host's per-step loss is fit's batch log: the epoch's running mean, last one = epoch loss
        assert state.records[-1].loss == pytest.approx(history["loss"][-1], rel=1e-6)


def test_callbacks_have_their_effects(concurrent_jobs, fit_reference):
    state, out = concurrent_jobs["states"]["c"], concurrent_jobs["out"]
    history = concurrent_jobs["jobs"]["c"].history.history
    # EarlyStopping: stopped after epoch 2 of 3, at that step boundary
    assert state.status == JobStatus.stopped and state.steps_done == 2 * 256 // BATCH
    assert len(history["loss"]) == 2 and set(history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    # its first epoch is the reference's first epoch (same model, same batches)
    assert history["loss"][0] == fit_reference[1]["loss"][0]
    # ModelCheckpoint wrote a model that loads and predicts
    loaded = keras.models.load_model(out / "best.keras")
    assert loaded.predict(XV[:4], verbose=0).shape == (4, 4)
    # TensorBoard wrote event files for training and validation
    assert list((out / "tb" / "train").glob("events.out.tfevents.*"))
    assert list((out / "tb" / "validation").glob("events.out.tfevents.*"))
    # ReduceLROnPlateau: the first epoch improves on nothing seen; the second did not improve by
    # 10, so it halved the learning rate (read after it, in the same on_epoch_end)
    assert concurrent_jobs["lr_seen"] == pytest.approx([0.01, 0.005])
    # CSVLogger: a row an epoch
    rows = list(csv.DictReader((out / "log.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1]


def test_bad_keras_input_says_what_to_change():
    with pytest.raises(KerasJobError, match="not compiled; call model.compile"):
        Job.from_keras("raw", keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)]), X, Y)
    with pytest.raises(KerasJobError, match="job 'mismatch': Data cardinality is ambiguous"):   # fit's words
        Job.from_keras("mismatch", compiled_model(), X, YV)


def test_a_planned_keras_job_still_trains_what_fit_trains():
    """The correctness invariant for Keras' own step: planned for a budget below its peak (swaps
    and recomputation in fit's train_step, metrics included), the job still ends with fit's
    weights and History bit for bit, its partial batches run through the planned step."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 256)).astype(np.float32)   # batches of 128: the last of 116 (Note [fit's batches])
    y = (x[:, :8].argmax(axis=1)).astype(np.int32)

    def wide():
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((256,)), *[keras.layers.Dense(512, activation="relu")
                                                         for _ in range(3)], keras.layers.Dense(8)])
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    reference = wide()
    history = reference.fit(x, y, batch_size=128, epochs=2, shuffle=False, verbose=0).history
    model = wide()
    job = Job.from_keras("planned", model, x, y, batch_size=128, epochs=2, shuffle=False)
    host = JobHost(admission="none", planner="tensile", plan_budget="6MiB", swap_bandwidth="1TiB")
    state = host.submit(job)
    result = host.run()
    assert state.status == JobStatus.finished and state.steps_done == 2 * 4, state.error   # 3 of 128, 1 of 116
    plan = result.planner.plans[0]
    assert sum(plan.swap_outs.values()) + sum(plan.recomputes.values()) > 0, plan
    for mine, theirs in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)
    assert job.history.history == history


def test_a_saved_keras_model_is_a_yaml_jobs_model(tmp_path):
    """model: {keras_file: PATH}: the saved model trains with its compiled optimizer, loss and
    metrics (not the job's optimizer: key), through fit's own step."""
    from tensile_tf.config.schema import JobSpec

    saved = compiled_model(seed=3)
    saved.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    saved.save(tmp_path / "model.keras")
    spec = JobSpec.model_validate(dict(name="saved", model={"keras_file": str(tmp_path / "model.keras")},
                                       input_shape=[16], classes=4, batch_size=32, steps=6, seed=3,
                                       optimizer={"name": "adam", "learning_rate": 0.5}))
    job, built = Job.from_spec(spec), []
    build = job.build
    job.build = lambda: built.append(build()) or built[-1]   # keep the TrainStep the host releases
    host = JobHost(admission="none")
    state = host.submit(job)
    host.run()
    assert state.status == JobStatus.finished, state.error
    optimizer = built[-1].optimizer
    assert type(optimizer).__name__ == "SGD" and float(optimizer.learning_rate) == pytest.approx(0.05)
    assert int(optimizer.iterations) == 6   # it is the one that trained
    assert [r.loss for r in state.records] and all(np.isfinite(r.loss) for r in state.records)


@pytest.mark.parametrize("made_first", [True, False])
def test_a_saved_keras_models_step_is_traced_once(tmp_path, monkeypatch, made_first):
    """Note [Variables made before the trace] (tensile_tf/jobs/keras_fit.py): a keras_file job's
    compile metrics and optimizer slots are made when it is built, so its step is traced once;
    the control (nothing made first) is traced twice, as the first trace creates variables."""
    from tensile_tf.config.schema import JobSpec
    from tensile_tf.jobs import job as job_module, keras_fit

    saved = compiled_model(seed=3)
    saved.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    saved.save(tmp_path / "model.keras")
    traces, load = [], keras_fit.saved_keras_model

    def counted(name, path):
        model = load(name, path)
        own = model.train_step
        model.train_step = lambda data: traces.append(1) or own(data)   # runs once per trace
        return model

    monkeypatch.setattr(keras_fit, "saved_keras_model", counted)
    if not made_first:
        monkeypatch.setattr(job_module, "_batch_specs", lambda batches: None)
    spec = JobSpec.model_validate(dict(name="saved", model={"keras_file": str(tmp_path / "model.keras")},
                                       input_shape=[16], classes=4, batch_size=32, steps=3, seed=3))
    host = JobHost(admission="none")
    state = host.submit(Job.from_spec(spec))
    host.run()
    assert state.status == JobStatus.finished, state.error
    assert len(traces) == (1 if made_first else 2)


def test_steps_instead_of_epochs_ends_a_partial_last_epoch():
    job = Job.from_keras("steps", compiled_model(), X, Y, batch_size=BATCH, steps=12, validation_data=(XV, YV))
    host = JobHost(admission="none")
    state = host.submit(job)
    host.run()
    assert state.status == JobStatus.finished and state.steps_done == 12
    history = job.history.history
    assert len(history["loss"]) == 2 and len(history["val_loss"]) == 2   # 8 steps, then 4: two epoch ends


def test_fits_other_arguments_are_taken_as_fit_takes_them():
    """Issue 58: ``verbose`` reaches the callbacks' params, ``validation_freq`` and ``validation_steps``
    validate as fit does; a model compiled with jit_compile=True is told, at submit, that its step
    runs without XLA; a value fit refuses is refused with the key's name."""
    seen: dict = {"val": []}

    class Record(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["params"] = dict(self.params)

        def on_epoch_end(self, epoch, logs=None):
            seen["val"].append("val_loss" in logs)

    model = compiled_model()
    job = Job.from_keras("freq", model, X, Y, batch_size=BATCH, epochs=4, verbose=0, validation_data=(XV, YV),
                         validation_freq=2, validation_steps=1, callbacks=[Record()])
    host = JobHost(admission="none")
    state = host.submit(job)
    host.run()
    assert state.status == JobStatus.finished, state.error
    assert seen["params"]["verbose"] == 0 and seen["params"]["epochs"] == 4
    assert seen["val"] == [False, True, False, True]            # epochs 2 and 4, as fit's validation_freq=2
    # validation_steps=1: the first validation batch only (the weights are the last epoch end's)
    first = model.evaluate(XV, YV, batch_size=BATCH, steps=1, verbose=0, return_dict=True)
    whole = model.evaluate(XV, YV, batch_size=BATCH, verbose=0, return_dict=True)
    assert job.history.history["val_loss"][-1] == first["loss"] != whole["loss"]
    class Compiled(keras.Sequential):      # XLA as a device machine would resolve it (this CPU turns it off)
        jit_compile = property(lambda self: True, lambda self, value: None)

    xla = Compiled([keras.Input((16,)), keras.layers.Dense(4, activation="softmax")])
    xla.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", jit_compile=True)
    with pytest.warns(UserWarning, match="without XLA"):
        Job.from_keras("xla", xla, X, Y, batch_size=BATCH)
    for bad, key in (({"validation_freq": 0}, "validation_freq"), ({"verbose": 3}, "verbose"),
                     ({"validation_steps": 0}, "validation_steps")):
        with pytest.raises(KerasJobError, match=key):
            Job.from_keras("bad", compiled_model(), X, Y, batch_size=BATCH, **bad)


def test_an_ended_jobs_record_keeps_no_model_and_its_weights_leave_the_pool():
    """Job.as_ended (Note [A trial's model given back] in tensile_tf/search/packed_tuner.py): the
    host's result keeps every job's record for as long as the caller keeps the result (a packed
    search's: the whole search); once the caller drops its model and Job, the model is freed and
    its bytes leave the pool, though the result is kept. Control: the caller's own Job keeps it."""
    import gc
    import weakref

    import tf_plugin

    def run(keep_the_job: bool):
        model = compiled_model(seed=4)
        job = Job.from_keras("ended", model, X, Y, batch_size=BATCH, epochs=1, shuffle=False)
        host = JobHost(admission="none")
        state = host.submit(job)
        result = host.run()
        assert state.status == JobStatus.finished and job.history.history["loss"]
        stream = state.stream
        model_ref = weakref.ref(model)
        del model, state
        kept = job if keep_the_job else None
        del job
        gc.collect()
        held = tf_plugin.device_pool().stats()["jobs"].get(f"released-{stream}", {}).get("current", 0)
        return result, model_ref() is not None, held, kept

    result, alive, held, _ = run(keep_the_job=False)
    assert result.jobs[0].job.step_hooks is None and not alive
    assert held == 0
    result, alive, held, kept = run(keep_the_job=True)
    assert alive and held > 0 and kept.history is not None
