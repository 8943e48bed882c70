"""examples/keras_digits.py, shortened: two compiled Keras models trained at once by
tensile_tf.fit_concurrently, with their callbacks, in a fresh interpreter as a user runs it."""
import json
import os

from tests.conftest import REPO_ROOT
from tests.forkserver import run_fresh


def test_keras_example_runs_shortened(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"} | {"PYTHONPATH": str(REPO_ROOT)}
    proc = run_fresh(["examples/keras_digits.py", "--epochs", "2", "--out", str(tmp_path)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert {j["name"]: j["status"] for j in results["jobs"]} == {"mlp": "finished", "cnn": "finished"}
    # 1437 training examples (80% of 1797) in batches of 64: 23 steps an epoch, as fit's (the last of 29)
    assert all(j["steps"] == j["steps_requested"] == 46 for j in results["jobs"])
    assert results["most_jobs_running"] == 2
    for name in ("mlp", "cnn"):
        assert (tmp_path / f"{name}.keras").stat().st_size > 0   # ModelCheckpoint ran at fit's epoch ends
        assert f"{name}: 2 epochs, val_accuracy" in proc.stdout   # the History fit would return
    assert (tmp_path / "memory.png").exists() and (tmp_path / "trace.json").exists()


def test_keras_tuner_example_runs_shortened_and_resumes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"} | {"PYTHONPATH": str(REPO_ROOT)}

    def search(trials: int) -> str:
        proc = run_fresh(["examples/keras_tuner_digits.py", "--trials", str(trials), "--epochs", "1",
                          "--out", str(tmp_path)], env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    assert "trials run here 2, retried alone 0" in search(2)
    # KerasTuner's project directory kept the two finished trials: the resumed search runs one more
    assert "trials run here 1, retried alone 0" in search(3)
    assert len(list((tmp_path / "digits").glob("trial_*/trial.json"))) == 3
