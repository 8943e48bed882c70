"""Note [Work outside the steps, inside the allowance] (runtime/work_outside_steps.py):
the saved sample runs within the temporary bytes admission counted for the
job, and validation is measured at the probe and admitted. A conv net trained at batch 1 validates 32
examples in batches of 4 and saves a sample of 16: predicted whole (the
control) the sample takes more than the job's T; in calls sized from the
measured bytes of the call before it stays within it, and the saved
predictions are the whole batch's."""
import math
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tensile_tf.jobs.datasets import Validator
from tensile_tf.jobs.job import Job, TrainStep
from tensile_tf.runtime import JobHost, JobStatus
from tensile_tf.runtime import work_outside_steps


def _job(name: str, validation_batch: int = 4) -> Job:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((96, 96, 3)), keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                              keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(1, 96, 96, 3)).astype(np.float32), np.array([1])
    vx, vy = rng.normal(size=(32, 96, 96, 3)).astype(np.float32), rng.integers(0, 10, 32)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = lossf(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    validator = Validator(model, lossf, vx, vy, batch_size=validation_batch, metric_names=[], every=1)
    train = TrainStep(step_fn=step, batches=[(x, y)], variables=model.trainable_variables, model=model,
                      optimizer=opt, validator=validator)
    return Job.from_train_step(name, train, steps=3)


def _run(tmp_path: Path, name: str, validation_batch: int = 4, *, with_result: bool = False):
    host = JobHost(model_dir=tmp_path / "models")
    state = host.submit(_job(name, validation_batch))
    result = host.run()
    assert state.status == JobStatus.finished, state.error
    return (state, result) if with_result else state


def test_validation_and_the_sample_stay_within_the_jobs_temporary_bytes(tmp_path, monkeypatch):
    kept = _run(tmp_path, "kept")
    allowance = kept.outside_steps_allowance_bytes
    assert allowance == work_outside_steps.admitted_temporary_bytes(kept, kept.temporary_bytes) and allowance > 0
    assert 0 < kept.outside_steps_peak_bytes <= allowance
    assert kept.bytes_per_example * 16 > allowance     # by the measure, 16 at once would not fit
    sample = np.load(tmp_path / "models" / "kept.sample.npz")
    whole = kept.rt.train.model if kept.rt.train is not None else None
    if whole is not None:      # the runtime objects may be dropped at teardown
        np.testing.assert_allclose(whole(sample["x"], training=False).numpy(), sample["predictions"], rtol=1e-5,
                                   atol=1e-6)
    reloaded = keras.models.load_model(tmp_path / "models" / "kept.keras")
    np.testing.assert_allclose(reloaded(sample["x"], training=False).numpy(), sample["predictions"], rtol=1e-5,
                               atol=1e-6)
    assert [v.step for v in kept.validation] == [2, 3]      # between two steps, and after the last

    monkeypatch.setattr(work_outside_steps, "KEEP_WITHIN_ALLOWANCE", False)
    whole_run = _run(tmp_path, "whole")      # the control: the same work, each call whole
    assert whole_run.outside_steps_peak_bytes > whole_run.outside_steps_allowance_bytes


def test_a_validation_batch_larger_than_the_step_is_measured_at_the_probe_and_admitted(tmp_path, monkeypatch):
    """Validation in batches of 32 at a training batch of 1: one batch takes more than the step's T.
    The probe measures it and admission counts it, so every validation stays within what the job
    was admitted with; the control (no probe measurement) validates beyond its allowance."""
    admitted = _run(tmp_path, "admitted", validation_batch=32)
    need, t = admitted.outside_steps_need_bytes, admitted.temporary_bytes
    assert need > t > 0                                   # the batch needs more than the step
    allowance = admitted.outside_steps_allowance_bytes
    assert allowance == math.ceil(need * (1 + work_outside_steps.OUTSIDE_STEPS_HEADROOM))
    assert 0 < admitted.outside_steps_peak_bytes <= allowance   # every validation, and the sample, within it
    assert [v.step for v in admitted.validation] == [2, 3]

    monkeypatch.setattr(work_outside_steps, "MEASURE_AT_PROBE", False)
    control = _run(tmp_path, "control", validation_batch=32)
    assert control.outside_steps_need_bytes == 0
    assert control.outside_steps_allowance_bytes == control.temporary_bytes
    assert control.outside_steps_peak_bytes > control.outside_steps_allowance_bytes
    assert [v.loss for v in control.validation] == [v.loss for v in admitted.validation]   # the same bits


def test_validation_runs_on_the_jobs_stream_and_what_ran_outside_every_job_is_named(tmp_path, monkeypatch):
    """Validation's tf.function binds its runs to the job's stream, as the job's step does: its
    bytes are the job's, not the pool's "default" stream's, which results.json names
    (``pool.outside_jobs``). The control (unbound) shows the batch there instead."""
    state, result = _run(tmp_path, "bound", validation_batch=32, with_result=True)
    batch_bytes = 32 * 96 * 96 * 64 * 4      # one conv map of the batch
    assert state.outside_steps_need_bytes > batch_bytes
    assert result.pool.outside_jobs["default"]["peak_bytes"] < batch_bytes, result.pool.outside_jobs

    monkeypatch.setattr(work_outside_steps, "ATTRIBUTE_TO_THE_JOB", False)
    state, result = _run(tmp_path, "unbound", validation_batch=32, with_result=True)
    assert state.outside_steps_need_bytes < batch_bytes
    assert result.pool.outside_jobs["default"]["peak_bytes"] > batch_bytes, result.pool.outside_jobs
