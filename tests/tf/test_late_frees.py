"""Note [Late frees are not leaks] (runtime/teardown_memory.py): bytes a job's
tensors hold after its teardown's collection, freed while the teardown waits,
are not counted as leaked, and the record says how long it waited; the
control, with no wait, counts them. The held tensor is let go at the
teardown's first poll, so the test does not depend on timing."""
import numpy as np
import tensorflow as tf

from tensile_tf.jobs.job import Job, TrainStep
from tensile_tf.runtime import JobHost, JobStatus
from tensile_tf.runtime import teardown_memory

HELD: dict = {}


def _job(name):
    w = tf.Variable(np.ones((256, 8), np.float32))

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    def batches():
        HELD["x"] = tf.ones((512, 256)) * 0.5     # made on the job's thread, in its stream; kept past its end
        return (HELD["x"],)

    return Job.from_train_step(name, TrainStep(step_fn=step, batches=batches, variables=[w]), steps=3)


def _run(monkeypatch, wait_s):
    def release_then_sleep(seconds):
        HELD.clear()
        return None

    monkeypatch.setattr(teardown_memory, "_sleep", release_then_sleep)
    monkeypatch.setattr(teardown_memory, "LATE_FREE_WAIT_S", wait_s)
    host = JobHost()
    state = host.submit(_job(f"late-{wait_s}"))
    host.run()
    HELD.clear()
    return state


def test_a_tensor_freed_while_the_teardown_waits_is_not_a_leak(monkeypatch):
    state = _run(monkeypatch, 5.0)
    assert state.status == JobStatus.finished
    assert state.leaked_bytes == 0 and state.late_free_s > 0


def test_the_control_without_a_wait_counts_the_held_tensor(monkeypatch):
    state = _run(monkeypatch, 0.0)
    assert state.status == JobStatus.finished
    assert state.leaked_bytes >= 512 * 256 * 4 and state.late_free_s < 0.01

