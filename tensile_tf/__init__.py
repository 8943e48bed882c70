"""tensile-tf: concurrent TensorFlow training jobs on one shared device pool.

Importing ``tensile_tf`` imports neither TensorFlow nor the plugin: the
planner (``tensile_tf.scheduler``) and the config (``tensile_tf.config.schema``) are
pure and import on a machine without TensorFlow. It only sets two
environment defaults TensorFlow reads once, at its own import, so import
``tensile_tf`` before ``tensorflow`` (Note [oneDNN's graph rewrites are off]
in ``tf_plugin/_loader.py``).

The device pool becomes TensorFlow's CPU allocator when the plugin loads:
explicitly with ``tensile_tf.install(pool_bytes)``, or on first runtime use
(``tensile_tf.runtime``, ``pool_stats()``, ``JobStream``, ...). Either must
come before TensorFlow's first op, variable or tf.function call.
"""
from __future__ import annotations

import os as _os
from typing import Any

from tensile_tf.units import human_bytes, parse_bytes

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # Note [oneDNN's graph rewrites are off]

# The pool API lives in tensile_tf.tf.pool (it loads TensorFlow and the plugin).
_MEMORY_NAMES = frozenset({"JobStream", "configure_pool", "pool_stats", "pool_trace", "reset_pool_peak", "sync_pool"})


def install(pool_bytes: int | str | None = None) -> None:
    """Loads TensorFlow and the plugin, making the device pool TensorFlow's
    CPU allocator; with ``pool_bytes`` ('2GiB' or bytes), sizes the pool
    (else ``TENSILE_POOL_BYTES`` or the default). Call it before TensorFlow's
    first op; TensorFlow's own settings (threads, ...) can still be made
    after it. Calling it again is harmless."""
    from tensile_tf.tf import pool as memory

    if pool_bytes is not None:
        memory.ensure_pool(pool_bytes)


# Keras users' entry points (tensile_tf/concurrent_fit.py): they load TensorFlow.
_KERAS_NAMES = frozenset({"KerasFit", "fit_concurrently"})


def __getattr__(name: str) -> Any:
    if name in _KERAS_NAMES:
        from tensile_tf import concurrent_fit

        return getattr(concurrent_fit, name)
    if name in _MEMORY_NAMES:
        from tensile_tf.tf import pool as memory

        return getattr(memory, name)
    raise AttributeError(f"module 'tensile_tf' has no attribute {name!r}")


__all__ = ["JobStream", "KerasFit", "configure_pool", "fit_concurrently", "human_bytes", "install", "parse_bytes",
           "pool_stats", "pool_trace", "reset_pool_peak", "sync_pool"]
