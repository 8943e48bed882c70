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


def held_sgd_regression(hold_dir, free_trials=2, hold_at_step=2, batch_size=32, learning_rate=0.05, **kw):
    """``sgd_regression`` whose trials after the first ``free_trials`` (by
    the order their learning rates first reach this factory; a trial built
    again, or retried with its parameters, keeps its place) stop at step
    ``hold_at_step``, create ``HOLD_DIR/held-<place>`` and wait until
    ``HOLD_DIR/release`` exists: a test kills the search while exactly those
    trials are running, then resumes it with ``release`` in place."""
    import os
    from pathlib import Path

    from tests.job_factories import wait_for_file

    folder = Path(hold_dir)
    key = repr(float(learning_rate))
    place = 0
    while True:   # the first free place, or the one this learning rate already has
        slot = folder / f"place-{place}"
        try:
            fd = os.open(slot, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if slot.read_text() == key:
                break
            place += 1
            continue
        with os.fdopen(fd, "w") as out:
            out.write(key)
        break
    job = sgd_regression(batch_size=batch_size, learning_rate=learning_rate, **kw)
    if place < free_trials:
        return job
    batch = job.batches[0]
    calls = {"n": 0}

    def batches():
        calls["n"] += 1
        if calls["n"] == hold_at_step + 1:
            (folder / f"held-{place}").touch()
            wait_for_file(folder / "release")
        return batch

    return TrainStep(step_fn=job.step_fn, batches=batches, variables=job.variables)


def meeting_sgd_regression(meet_dir, parties=2, meet_at_step=2, batch_size=32, learning_rate=0.05, **kw):
    """``sgd_regression`` whose step ``meet_at_step`` waits until trials of
    ``parties`` different processes have reached it (each writes
    ``MEET_DIR/<pid>``): every worker of a scale-out test runs a trial,
    whichever starts first and however fast the machine is."""
    import os
    import time
    from pathlib import Path

    folder = Path(meet_dir)
    job = sgd_regression(batch_size=batch_size, learning_rate=learning_rate, **kw)
    batch = job.batches[0]
    calls = {"n": 0}

    def batches():
        calls["n"] += 1
        if calls["n"] == meet_at_step + 1:
            (folder / str(os.getpid())).touch()
            while len(list(folder.iterdir())) < parties:
                time.sleep(0.01)
        return batch

    return TrainStep(step_fn=job.step_fn, batches=batches, variables=job.variables)
