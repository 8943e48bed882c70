"""The zoo's first name, kept so YAML files written before the layout of
issue 40 (``builder: "tensile_tf.zoo:mlp"``) keep working; the models live in
``tensile_tf.jobs.zoo``."""
from tensile_tf.jobs.zoo import *  # noqa: F401,F403
