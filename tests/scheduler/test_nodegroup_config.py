"""run.pipeline / run.split_size in the YAML configuration."""
import pytest

from tensile_tf.config.schema import ConfigError, config_from_data

JOB = {"name": "a", "model": {"builder": "tensile_tf.jobs.zoo:mlp"}, "steps": 2}


def test_split_size_accepts_sizes_and_auto():
    cfg = config_from_data({"pool": "1GiB", "run": {"pipeline": "nodegroup", "split_size": "16MiB"}, "jobs": [JOB]})
    assert cfg.run.pipeline == "nodegroup" and cfg.run.split_size == 16 << 20
    cfg = config_from_data({"pool": "1GiB", "run": {"pipeline": "nodegroup"}, "jobs": [JOB]})
    assert cfg.run.split_size == "auto" and cfg.run.barrier_timeout_s == 60


def test_bad_split_size_is_located():
    with pytest.raises(ConfigError, match=r"run\.split_size: .*cannot read 'lots'"):
        config_from_data({"pool": "1GiB", "run": {"pipeline": "nodegroup", "split_size": "lots"}, "jobs": [JOB]})
    with pytest.raises(ConfigError, match=r"run\.pipeline"):
        config_from_data({"pool": "1GiB", "run": {"pipeline": "waterwave"}, "jobs": [JOB]})
