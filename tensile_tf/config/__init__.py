"""What a user writes: the YAML schema (``schema``: strict pydantic models of
``pool``, ``run`` and ``jobs``, read with their line and column) and every
check that can be made before anything trains (``validation``: references
import, sizes fit, exit code 2 with ``file:line:column: key: what; what to
do``). Pure: imports neither TensorFlow nor the plugin.

The hyperparameter search's own schema (search space, sampler, objective)
is ``tensile_tf.search.config``; it extends a job of this schema."""
from tensile_tf.config.schema import ConfigError, JobSpec, RunConfig, RunSpec, config_from_data, load_config, read_yaml

__all__ = ["ConfigError", "JobSpec", "RunConfig", "RunSpec", "config_from_data", "load_config", "read_yaml"]
