"""The search: section: schema, located errors, params -> job specs."""
import re

import pytest

from tensile_tf.config.schema import ConfigError, JobSpec
from tensile_tf.search.config import (
    CategoricalParam,
    decode_params,
    grid_search_space,
    load_search_config,
    search_config_from_data,
    set_path,
    trial_job_spec,
)
from tests.search.conftest import write_yaml

GOOD = """
    pool: 256MiB
    run: {out_dir: runs/x}
    search:
      sampler: {name: random, seed: 3}
      n_trials: 5
      max_concurrent: 2
      objective: {metric: best_loss, direction: minimize}
      pruning: {enabled: true, n_startup_trials: 2, n_warmup_steps: 5, interval_steps: 5}
      base_job:
        model: {builder: "tensile_tf.jobs.zoo:mlp"}
        input_shape: [16]
        steps: 20
      space:
        batch_size: {type: int, low: 8, high: 64, log: true}
        optimizer.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
        model.args.hidden: {type: categorical, choices: [[16], [32, 16]]}
"""


def test_good_config_and_params_to_job(tmp_path):
    cfg = load_search_config(write_yaml(tmp_path / "s.yaml", GOOD))
    s = cfg.search
    assert cfg.pool == 256 * 2**20 and s.total_trials == 5 and s.sampler.name.value == "random"
    hidden = s.space["model.args.hidden"]
    assert isinstance(hidden, CategoricalParam) and hidden.encoded
    assert hidden.optuna_choices() == ["[16]", "[32, 16]"]   # Optuna stores scalars only
    params = decode_params(s.space, {"batch_size": 16, "optimizer.learning_rate": 0.01,
                                     "model.args.hidden": "[32, 16]"})
    spec = trial_job_spec(s.base_job, params, "trial-3")
    assert isinstance(spec, JobSpec) and spec.name == "trial-3"
    assert spec.batch_size == 16 and spec.optimizer.learning_rate == 0.01
    assert spec.model.args == {"hidden": [32, 16]} and spec.model.builder == "tensile_tf.jobs.zoo:mlp"
    assert s.base_job.batch_size == 32  # the base is not modified


def test_set_path_creates_mappings_and_refuses_scalars():
    data = {"model": {"builder": "m:f"}, "steps": 3}
    set_path(data, "model.args.filters", 8)
    assert data["model"]["args"] == {"filters": 8}
    with pytest.raises(ValueError, match="steps is a int"):
        set_path(data, "steps.x", 1)


def test_grid_space_and_size():
    cfg = search_config_from_data({
        "pool": "64MiB",
        "search": {"sampler": "grid",
                   "base_job": {"model": {"builder": "tensile_tf.jobs.zoo:mlp"}, "input_shape": [4], "steps": 2},
                   "space": {"batch_size": {"type": "int", "low": 8, "high": 32, "step": 8},
                             "optimizer.learning_rate": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
                             "optimizer.name": {"type": "categorical", "choices": ["adam", "sgd"]}}}})
    grid = grid_search_space(cfg.search.space)
    assert grid["batch_size"] == [8, 16, 24, 32]
    assert grid["optimizer.learning_rate"] == [0.1, 0.2, 0.3]
    assert cfg.search.total_trials == 4 * 3 * 2


def _errors(tmp_path, text):
    with pytest.raises(ConfigError) as e:
        load_search_config(write_yaml(tmp_path / "bad.yaml", text))
    return str(e.value)


def test_errors_name_file_line_and_column(tmp_path):
    msg = _errors(tmp_path, """
        pool: 256MiB
        search:
          sampler: random
          n_trials: 4
          objective: {metric: accuracy}
          base_job:
            model: {builder: "tensile_tf.jobs.zoo:mlp"}
            steps: 20
          space:
            batch_size: {type: int, low: 64, high: 8}
            optimizer.learning_rate: {type: float, lowe: 0.1, high: 0.2}
            dropout: {type: normal, low: 0, high: 1}
    """)
    path = str(tmp_path / "bad.yaml")
    assert f"{path}:5:15: search.objective.metric:" in msg               # not a known metric
    assert re.search(rf"{re.escape(path)}:10:\d+: search\.space\.batch_size: .*low \(64\) must not exceed high",
                     msg), msg
    assert f"{path}:11:44: search.space.optimizer.learning_rate.lowe: unknown key" in msg
    assert f"{path}:12:5: search.space.dropout" in msg and "type: categorical" in msg


def test_params_are_checked_against_the_job_schema(tmp_path):
    msg = _errors(tmp_path, """
        pool: 256MiB
        search:
          sampler: random
          n_trials: 4
          base_job:
            model: {builder: "tensile_tf.jobs.zoo:mlp"}
            steps: 20
          space:
            batch_size: {type: int, low: 0, high: 8}
            optimizer.lr: {type: float, low: 0.1, high: 0.2}
    """)
    path = str(tmp_path / "bad.yaml")
    assert f"{path}:9:5: search.space.batch_size: value 0 makes an invalid job (batch_size:" in msg
    assert f"{path}:10:5: search.space.optimizer.lr: value 0.1 makes an invalid job " \
           "(optimizer.lr: the job spec has no such key)" in msg


def test_sampler_specific_errors(tmp_path):
    base = """
        pool: 256MiB
        search:
          sampler: {sampler}
          {n_trials}
          base_job:
            model: {{builder: "tensile_tf.jobs.zoo:mlp"}}
            steps: 20
          space:
            optimizer.learning_rate: {{type: float, low: 1.0e-3, high: 1.0e-1, log: true}}
    """
    msg = _errors(tmp_path, base.format(sampler="tpe", n_trials=""))
    assert "sampler 'tpe' needs n_trials" in msg and ":3:" in msg
    msg = _errors(tmp_path, base.format(sampler="grid", n_trials=""))
    assert "grid search needs a finite set" in msg
    msg = _errors(tmp_path, base.format(sampler="bayes", n_trials="n_trials: 3"))
    assert "search.sampler.name" in msg and ":3:3:" in msg


def test_run_config_is_refused_with_advice(tmp_path):
    msg = _errors(tmp_path, "pool: 1GiB\njobs: [{name: a, model: {builder: 'a:b'}, steps: 1}]\n")
    assert "tensile run" in msg
