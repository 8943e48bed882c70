"""Issue 58 item 6: packed KerasTuner workers of KerasTuner's own chief (Note [Packed workers of
KerasTuner's chief] in tensile_tf/search/packed_tuner.py).

A chief process serves the oracle of a random search of 4 trials; one packed worker (2 trials at
once, its own pool) runs them. The worker's trials hold at their second batch on files: both are
held at once (two trials of one worker running together), and the test then kills the worker. A
worker started again with the same KERASTUNER_TUNER_ID is handed the two trials it was running and
trains them, then the rest: every trial completes, none lost (the chief's oracle wrote each trial's
status as it ended)."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    import tensile_tf
    tensile_tf.install("256MiB")  # the pool becomes TensorFlow's allocator: before any TF op
    import keras
    from tensile_tf.search.packed_tuner import PackedRandomSearch

    rng = np.random.default_rng(0)
    X = rng.normal(size=(128, 16)).astype(np.float32)
    Y = X[:, :4].argmax(axis=1).astype(np.int32)
    HOLD = os.environ.get("HOLD_FOLDER")

    def build(hp):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(hp.Int("units", 8, 64, step=8), activation="relu"),
                                  keras.layers.Dense(4, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-3, 1e-1, sampling="log")),
                      loss="sparse_categorical_crossentropy", jit_compile=False)
        return model

    class Held(keras.callbacks.Callback):
        # a trial notes itself in HOLD_FOLDER at its second batch and waits there (until killed)
        def on_train_batch_end(self, batch, logs=None):
            if HOLD and batch == 1 and not getattr(self, "done", False):
                self.done = True
                (Path(HOLD) / f"trial-{os.getpid()}-{time.monotonic_ns()}").touch()
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    time.sleep(0.05)

    tuner = PackedRandomSearch(build, objective="val_loss", max_trials=4, seed=1, directory=sys.argv[1],
                               project_name="dist", concurrent_trials=2)
    tuner.search(X, Y, epochs=2, batch_size=32, validation_split=0.25, shuffle=False, callbacks=[Held()], verbose=0)
    if os.environ["KERASTUNER_TUNER_ID"] != "chief":
        print(json.dumps({"packing": tuner.packing, "most_running": tuner.last_run.most_jobs_running,
                          "jobs": [(j.late_free_s, j.kept_by_caller_bytes, j.leaked_bytes) for j in tuner.last_run.jobs]}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, tuner_id: str, port: int, **env) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
               "KERASTUNER_TUNER_ID": tuner_id, "KERASTUNER_ORACLE_IP": "127.0.0.1",
               "KERASTUNER_ORACLE_PORT": str(port), **env}
    environ.pop("TENSILE_POOL_BYTES", None)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "kt")], cwd=REPO_ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _oracle_trials(tmp_path: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"]
            for p in (tmp_path / "kt" / "dist").glob("trial_*/trial.json")}


def test_a_packed_worker_of_keras_tuners_chief_runs_its_trials_and_a_killed_ones_are_not_lost(tmp_path):
    port, hold = _free_port(), tmp_path / "held"
    hold.mkdir()
    chief = _start(tmp_path, "chief", port)
    worker = _start(tmp_path, "tuner0", port, HOLD_FOLDER=str(hold))
    try:
        deadline = time.monotonic() + 180
        while len(list(hold.iterdir())) < 2 and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        held = len(list(hold.iterdir()))
        assert held == 2, (held, worker.poll(), worker.stderr.read()[-3000:] if worker.poll() is not None else "")
        running = [t for t, status in _oracle_trials(tmp_path).items() if status == "RUNNING"]
        worker.send_signal(signal.SIGKILL)   # mid-trial: both of its trials held at their second batch
        worker.wait(timeout=30)
        again = _start(tmp_path, "tuner0", port)   # the same tuner id: the chief hands it the same trials
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0, err[-3000:]
        assert chief.poll() in (None, 0), chief.stderr.read()[-3000:]   # (it exits once idle: up to 20 s more)
    finally:
        for proc in (chief, worker):
            if proc.poll() is None:
                proc.kill()
    result = json.loads(out.strip().splitlines()[-1])
    statuses = _oracle_trials(tmp_path)
    assert len(statuses) == 4 and set(statuses.values()) == {"COMPLETED"}, statuses   # none lost
    assert result["packing"]["trials"] == 4 and result["most_running"] == 2, result   # two at once, packed
    # Note [Bytes the caller keeps]: KerasTuner holds each trial's model after its job ends; its bytes
    # are the caller's, neither waited for (up to 5 s a trial, before) nor counted as leaked
    assert all(kept > 0 and leaked == 0 and late < 5.0 for late, kept, leaked in result["jobs"]), result
    # the trials the killed worker was running were handed to the worker started again, and completed
    assert len(running) == 2 and all(statuses[t] == "COMPLETED" for t in running), (running, statuses)
