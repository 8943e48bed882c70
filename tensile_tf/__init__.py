"""tensile-tf: concurrent TensorFlow training jobs on one shared device pool.

``import tensile_tf`` imports TensorFlow and installs the device pool as the
allocator of TensorFlow's CPU device (see ``tf_plugin``); do it first, before
``import tensorflow`` (Note [oneDNN's graph rewrites are off] in
``tf_plugin/_loader.py``) and at the latest before any TensorFlow op.
"""
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tf_plugin  # noqa: E402,F401  (loads TensorFlow the plugin's way, before any module of ours imports it)
from tensile_tf.memory import (  # noqa: E402
    JobStream,
    configure_pool,
    parse_bytes,
    pool_stats,
    pool_trace,
    reset_pool_peak,
    sync_pool,
)

__all__ = [
    "JobStream",
    "configure_pool",
    "parse_bytes",
    "pool_stats",
    "pool_trace",
    "reset_pool_peak",
    "sync_pool",
]
