"""`tensile search` end to end, each run in its own process and pool: a grid,
a random and a TPE search (the search quickstart, shortened), each drawing
Optuna's plots, and a search killed mid-way then resumed."""
import json
import math
import signal
import sqlite3
import subprocess
import time

import pytest

from tests.conftest import REPO_ROOT
from tests.search.conftest import cli_env, explain, run_search_cli, search_cmd, write_yaml


def test_grid_search_runs_every_point_once_with_trials_packed(tmp_path):
    config = write_yaml(tmp_path / "grid.yaml", """
        pool: 256MiB
        run: {out_dir: unused}
        search:
          study_name: grid
          sampler: {name: grid, seed: 0}
          max_concurrent: 4
          admit_by_cores: false   # packed however busy the cores: the test asserts what admission allows
          objective: {metric: final_loss, direction: minimize}
          base_job:
            model: {train_step_factory: "tests.job_factories:dense_regression", args: {meet_folder: "PEERS"}}
            steps: 40
          space:
            batch_size: {type: categorical, choices: [16, 64]}
            seed: {type: categorical, choices: [0, 1]}
    """.replace("PEERS", str(tmp_path / "peers")))
    out = tmp_path / "out"
    proc = run_search_cli(config, "--out", out)
    assert proc.returncode == 0, explain(proc)
    results = json.loads((out / "results.json").read_text())
    trials = results["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 4, explain(proc)
    points = sorted((t["params"]["batch_size"], t["params"]["seed"]) for t in trials)
    assert points == [(16, 0), (16, 1), (64, 0), (64, 1)]
    for t in trials:
        assert t["job"]["steps"] == 40 and t["job"]["peak_pool_bytes"] > 0 and math.isfinite(t["value"])
        assert t["job"]["error"] is None and t["worker"]["pid"] == results["worker"]["pid"]
    best = min(trials, key=lambda t: t["value"])
    assert results["best"] == {"number": best["number"], "value": best["value"], "params": best["params"]}
    assert results["counts"] == {"COMPLETE": 4} and results["study"]["n_trials"] == 4
    assert results["schema_version"] == 3   # the runtime's results.json schema (records.SCHEMA_VERSION)
    # Admission packed the trials: the host held them all at once (what it recorded, not timing: one
    # model at two batch sizes is predicted from the first measured trial, and each trial waits at its
    # third step until two have arrived, tests.job_factories.meet_peers; issue 57: two widths were two
    # models, predicted only once measured, and 400 steps made the overlap likely, not certain).
    assert results["worker"]["most_trials_running"] >= 2, (results["worker"], explain(proc))
    # Note [Where a trial's time goes]: every phase a trial went through was measured, and the
    # worker's breakdown is their sum over the trials (plus the driver's tells)
    for t in trials:
        times = t["job"]["times"]
        assert all(times[p] > 0 for p in ("build", "trace", "probe_step", "steps", "teardown")), times
        assert times["capture"] == 0   # no planner
    breakdown = results["worker"]["time_breakdown"]
    assert breakdown["tell"] > 0 and results["worker"]["core_waits"] == 0
    assert breakdown["steps"] == pytest.approx(sum(t["job"]["times"]["steps"] for t in trials), abs=1e-5)
    assert (out / "study.db").exists()
    # Optuna's own plots; two searched parameters: a contour too
    for png in ("objective.png", "params.png", "importances.png", "parallel_coordinates.png", "contour.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", results["plots_skipped"]
    assert f"best: trial {best['number']}" in proc.stdout


def test_random_search_of_a_keras_model_stays_in_the_space(tmp_path):
    config = write_yaml(tmp_path / "random.yaml", """
        pool: 512MiB
        search:
          study_name: rand
          sampler: {name: random, seed: 7}
          n_trials: 4
          max_concurrent: 3
          admit_by_cores: false
          objective: {metric: best_loss, direction: minimize}
          base_job:
            model: {builder: "tensile_tf.jobs.zoo:mlp", args: {hidden: [32]}}
            input_shape: [32]
            classes: 4
            data: {kind: function, function: "tests.job_factories:batches_meeting_peers", args: {folder: "PEERS"}}
            optimizer: {name: sgd}
            steps: 60
          space:
            batch_size: {type: int, low: 8, high: 128, log: true}
            optimizer.learning_rate: {type: float, low: 1.0e-3, high: 0.3, log: true}
    """.replace("PEERS", str(tmp_path / "peers")))
    out = tmp_path / "out"
    proc = run_search_cli(config, "--out", out)
    assert proc.returncode == 0, explain(proc)
    results = json.loads((out / "results.json").read_text())
    trials = results["trials"]
    assert len(trials) == 4 and all(t["state"] == "COMPLETE" for t in trials), explain(proc)
    for t in trials:
        assert 8 <= t["params"]["batch_size"] <= 128 and isinstance(t["params"]["batch_size"], int)
        assert 1e-3 <= t["params"]["optimizer.learning_rate"] <= 0.3
    assert len({t["params"]["batch_size"] for t in trials}) > 1  # packs trials of different sizes
    assert 8 <= results["best"]["params"]["batch_size"] <= 128
    # Admission packed the trials: the host held them all at once (what it recorded; one model at
    # several batch sizes is predicted from the first measured trial, and each trial waits at its
    # third step until two have arrived: tests.job_factories.meet_peers, not the steps' length).
    assert results["worker"]["most_trials_running"] >= 2, (results["worker"], explain(proc))
    assert results["worker"]["trials_run"] == 4 and results["worker"]["trials_per_hour"] > 0
    _assert_optuna_plots(out, results)


def _assert_optuna_plots(out, results):
    """Optuna's own plots of a finished two-parameter search, each a PNG."""
    assert results["plots_skipped"] == {}, results["plots_skipped"]
    for png in ("objective.png", "params.png", "importances.png", "parallel_coordinates.png", "contour.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_the_tpe_search_quickstart_runs_shortened_and_draws_optunas_plots(tmp_path):
    import yaml

    doc = yaml.safe_load((REPO_ROOT / "configs" / "search_quickstart.yaml").read_text())
    search = doc["search"]
    search.update(n_trials=5, max_concurrent=3, admit_by_cores=False)
    search["sampler"]["n_startup_trials"] = 3
    search["pruning"].update(n_startup_trials=2, n_warmup_steps=20)
    search["base_job"].update(steps=60, validate_every=30)
    config = tmp_path / "search_quickstart.yaml"
    config.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = run_search_cli(config, "--out", out)
    assert proc.returncode == 0, explain(proc)
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["metric"] == "val_loss" and results["study"]["direction"] == "minimize"
    assert len(results["trials"]) == 5 and results["counts"].get("COMPLETE", 0) >= 2, explain(proc)
    assert results["worker"]["most_trials_running"] >= 2, (results["worker"], explain(proc))
    _assert_optuna_plots(out, results)


RESUME = """
    pool: 256MiB
    search:
      study_name: resumable
      sampler: {name: random, seed: 3}
      n_trials: 7
      max_concurrent: 1   # a held trial mid-step parks the probe of the next one
      objective: {metric: final_loss}
      base_job:
        model: {train_step_factory: "tests.search.factories:held_sgd_regression", args: {hold_dir: "HOLD_DIR"}}
        steps: 40
      space:
        model.args.learning_rate: {type: float, low: 1.0e-3, high: 5.0e-2, log: true}
        batch_size: {type: int, low: 16, high: 64}
"""


def _complete(db) -> dict:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
            return dict(c.execute("SELECT t.number, v.value FROM trials t JOIN trial_values v "
                                  "ON v.trial_id = t.trial_id WHERE t.state = 'COMPLETE'").fetchall())
    except sqlite3.Error:
        return {}


def test_killed_search_resumes_without_losing_finished_trials(tmp_path):
    """SIGKILL while two trials have finished and the third is held mid-run
    (tests.search.factories:held_sgd_regression: what the trials did, not
    how long they took); the resumed search keeps the finished ones and runs
    the killed one again with its parameters."""
    hold = tmp_path / "hold"
    hold.mkdir()
    config = write_yaml(tmp_path / "resume.yaml", RESUME.replace("HOLD_DIR", str(hold)))
    out = tmp_path / "out"
    proc = subprocess.Popen(search_cmd(config, "--out", out), cwd=REPO_ROOT, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    db = out / "study.db"
    deadline = time.time() + 300
    try:
        while not (hold / "held-2").exists():
            assert proc.poll() is None, f"search ended before it was killed:\n{proc.stdout.read()[-4000:]}"
            assert time.time() < deadline, "the third trial never reached its hold"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    before = _complete(db)
    assert len(before) == 2, before   # the two free trials finished; the held one had not
    with sqlite3.connect(db) as c:
        running = [n for (n,) in c.execute("SELECT number FROM trials WHERE state = 'RUNNING'")]
    assert running == [2], running
    (hold / "release").touch()

    again = run_search_cli(config, "--out", out)          # without --resume: refused
    assert again.returncode == 2 and "--resume" in again.stderr, explain(again)

    resumed = run_search_cli(config, "--out", out, "--resume")
    assert resumed.returncode == 0, explain(resumed)
    results = json.loads((out / "results.json").read_text())
    by_number = {t["number"]: t for t in results["trials"]}
    for number, value in before.items():   # finished trials kept as they were
        assert by_number[number]["state"] == "COMPLETE" and by_number[number]["value"] == value
    interrupted = [t for t in results["trials"] if t["interrupted"]]
    assert sorted(t["number"] for t in interrupted) == sorted(running)
    for t in interrupted:
        assert t["state"] == "FAIL" and "is gone" in t["interrupted"], t
        retry = [r for r in results["trials"] if r["retry_of"] == t["number"]]
        assert len(retry) == 1 and retry[0]["state"] == "COMPLETE", (t, retry, explain(resumed))
        assert t["params"] and retry[0]["params"] == t["params"], (t, retry)   # the same parameters again
    counted = [t for t in results["trials"] if not t["interrupted"]]
    assert len(counted) == 7 and all(t["state"] == "COMPLETE" for t in counted)
    assert sorted(results["worker"]["requeued"]) == sorted(running)


def test_a_search_on_real_data_judges_trials_by_their_validation(tmp_path):
    # scikit-learn's bundled digits, 20% held out: each trial's value is its
    # last validation accuracy, reported at each validation for pruning.
    config = write_yaml(tmp_path / "digits.yaml", """
        pool: 256MiB
        run: {out_dir: unused}
        search:
          study_name: digits
          sampler: {name: grid, seed: 0}
          objective: {metric: val_accuracy}
          base_job:
            model: {builder: "tensile_tf.jobs.zoo:mlp", args: {hidden: [32]}}
            input_shape: [64]
            data: {kind: digits, validation_split: 0.2}
            batch_size: 64
            steps: 40
            validate_every: 20
            metrics: [accuracy]
          space:
            optimizer.learning_rate: {type: categorical, choices: [0.0001, 0.01]}
    """)
    out = tmp_path / "out"
    proc = run_search_cli(config, "--out", out)
    assert proc.returncode == 0, explain(proc)
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["direction"] == "maximize" and results["study"]["metric"] == "val_accuracy"
    trials = {t["params"]["optimizer.learning_rate"]: t for t in results["trials"]}
    for t in trials.values():
        last = t["job"]["validation"][-1]
        assert t["value"] == last["metrics"]["accuracy"] and last["step"] == 40
        assert sorted(int(k) for k in t["intermediate_values"]) == [20]   # reported for pruning; 40 is the value
    assert trials[0.01]["value"] > trials[0.0001]["value"]   # 40 steps at 1e-4 barely move
    assert results["best"]["params"] == {"optimizer.learning_rate": 0.01}
