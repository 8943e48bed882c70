"""Train steps for host and CLI tests (referenced from YAML as tests.job_factories:NAME)."""
import numpy as np
import tensorflow as tf

from tensile_tf.jobs.job import TrainStep


def dense_regression(batch_size=32, width=256, fail_at_step=None, nan_at_step=None, seed=0, meet_folder=None,
                     meet_deadline_s=120, **_):
    """A two-layer regression step. Optionally raises (fail_at_step) or produces
    a NaN loss (nan_at_step) at runtime, from inside the traced step; with
    ``meet_folder``, its batches wait for a peer at the third (``meet_peers``)."""
    rng = np.random.default_rng(seed)
    w1 = tf.Variable(rng.standard_normal((64, width)).astype("float32") * 0.05)
    w2 = tf.Variable(rng.standard_normal((width, 1)).astype("float32") * 0.05)
    counter = tf.Variable(0, dtype=tf.int64)
    x = tf.constant(rng.standard_normal((batch_size, 64)).astype("float32"))
    y = tf.constant(rng.standard_normal((batch_size, 1)).astype("float32"))

    def step(x, y):
        counter.assign_add(1)
        if fail_at_step is not None:
            tf.debugging.assert_less(counter, tf.constant(fail_at_step + 1, tf.int64),
                                     message="injected failure")
        with tf.GradientTape() as tape:
            h = tf.nn.relu(x @ w1)
            loss = tf.reduce_mean((h @ w2 - y) ** 2)
        gw1, gw2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.01 * gw1)
        w2.assign_sub(0.01 * gw2)
        if nan_at_step is not None:  # the reported loss only; gradients stay finite
            loss = loss + tf.where(counter > nan_at_step, np.float32("nan"), np.float32(0))
        return loss

    if meet_folder is None:
        return TrainStep(step_fn=step, batches=[(x, y)], variables=[w1, w2, counter])
    arrived = meet_peers(meet_folder, deadline_s=meet_deadline_s)

    def batches():
        arrived()
        return (x, y)

    return TrainStep(step_fn=step, batches=batches, variables=[w1, w2, counter])


def activation_hog(batch_size=1024, width=4096, seed=0, **_):
    """A step whose temporary peak is about 3 * batch_size * width * 4 bytes."""
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.standard_normal((width, width // 64)).astype("float32") * 0.01)
    x = tf.constant(rng.standard_normal((batch_size, width)).astype("float32"))

    def step(x):
        with tf.GradientTape() as tape:
            a = tf.nn.relu(x * 1.5)
            b = tf.nn.relu(a - 0.1)
            loss = tf.reduce_mean(tf.matmul(b, w))
        g = tape.gradient(loss, w)
        w.assign_sub(0.01 * g)
        return loss

    return TrainStep(step_fn=step, batches=[(x,)], variables=[w])


def _relu_regression_step(w):
    """One SGD step of mean(relu(x @ w) ** 2) on the single variable w."""
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.relu(x @ w) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return step


def growing_batch(grow_at_step=3, small=64, big=16384, width=1024, seed=0, **_):
    """Batches become huge at `grow_at_step`: the step then runs out of pool
    memory mid-run (a realistic OOM: a longer sequence or a bigger batch)."""
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.standard_normal((width, 16)).astype("float32") * 0.01)
    calls = {"n": 0}

    def batches():
        n = big if calls["n"] >= grow_at_step else small
        calls["n"] += 1
        return (tf.random.stateless_normal((n, width), seed=[seed, calls["n"]]),)

    return TrainStep(step_fn=_relu_regression_step(w), batches=batches, variables=[w])


def regression_dataset(batch_size=32, seed=0, **_):
    """A tf.data pipeline of (x, y) batches for `data: {kind: function}`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size * 8, 32)).astype("float32")
    y = rng.integers(0, 10, batch_size * 8).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def signals_progress(marker, mark_at_step=3, batch_size=32, width=64, seed=0, hold_until=None, **_):
    """A small regression step whose batch source creates the file ``marker``
    when step ``mark_at_step`` asks for its batch: a test waits for that file
    (what the job did, not a sleep) before it signals the process. With
    ``hold_until`` (a path), that step then waits until the file exists: the
    job is mid-run for as long as the test needs, without training thousands
    of steps to get there."""
    from pathlib import Path

    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.standard_normal((32, width)).astype("float32") * 0.05)
    x = tf.constant(rng.standard_normal((batch_size, 32)).astype("float32"))
    calls = {"n": 0}

    def batches():
        calls["n"] += 1
        if calls["n"] == mark_at_step + 1:
            Path(marker).touch()
            wait_for_file(hold_until)
        return (x,)

    return TrainStep(step_fn=_relu_regression_step(w), batches=batches, variables=[w])


def wait_for_file(path) -> None:
    """Holds the calling job until the test creates ``path`` (None: no hold)."""
    import time
    from pathlib import Path

    while path is not None and not Path(path).exists():
        time.sleep(0.01)


def meet_peers(folder, peers=2, at_step=2, deadline_s=120):
    """For a batch source: at its call ``at_step`` (the probe's is call 0: the run loop's, never
    held), note this job in ``folder`` and wait until ``peers`` jobs have (at most ``deadline_s``).
    Tests that assert admission packed trials then see them overlap whatever the machine's speed,
    and with few steps (issue 57: 400-1,000 steps made the overlap likely, not certain); where
    admission ran one at a time, the deadline passes and the test's check of what was recorded
    fails, as it should."""
    import time
    import uuid
    from pathlib import Path

    calls = {"n": 0}

    def arrived() -> None:
        calls["n"] += 1
        if calls["n"] != at_step + 1:
            return
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / uuid.uuid4().hex).touch()
        deadline = time.monotonic() + deadline_s
        while len(list(Path(folder).iterdir())) < peers and time.monotonic() < deadline:
            time.sleep(0.01)

    return arrived


def batches_meeting_peers(folder, peers=2, input_dim=32, classes=4, batch_size=32, seed=0, **_):
    """A data function (``data: {kind: function}``): random (x, y) batches whose source waits for
    its peers (``meet_peers``)."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((batch_size, input_dim)).astype("float32"))
    y = tf.constant(rng.integers(0, classes, batch_size).astype("int32"))
    arrived = meet_peers(folder, peers)

    def batches():
        arrived()
        return (x, y)

    return batches
