"""The device pool as seen from Python: capacity, the pool object, and the op
that attributes a job's step to its stream."""
from __future__ import annotations

import re

import tensorflow as tf

from tf_plugin._loader import load_plugin

_plugin = load_plugin()
_ops = tf.load_op_library(str(_plugin.__file__))


def configure_plugin(**settings) -> None:
    """Hands the plugin its settings, all in one call (tf_plugin/plugin_settings.h; resolved by
    tensile_tf/tf/plugin_settings.py); only before TensorFlow's first op."""
    try:
        _plugin.configure_plugin(**settings)
    except RuntimeError as e:  # std::logic_error from C++
        raise RuntimeError(f"tf_plugin: {e}") from None


def plugin_settings() -> dict:
    """The settings the plugin holds (configure_plugin's, else its defaults)."""
    return dict(_plugin.plugin_settings())


def device_pool_capacity() -> int:
    """Capacity in bytes the device pool has, or will be created with."""
    return _plugin.device_pool_capacity()


def device_pool():
    """The StreamAwarePool serving TensorFlow's CPU device.

    Creating the first tensor creates the pool; this forces that if needed.
    """
    pool = _plugin.device_pool()
    if pool is None:
        # Building the context builds the CPU device, whose allocator is ours.
        tf.constant(0)
        pool = _plugin.device_pool()
    if pool is None:
        raise RuntimeError(
            "tf_plugin: TensorFlow did not take the tensile pool as its CPU allocator; "
            "is TF_CPU_ALLOCATOR_USE_BFC set, or was a GPU allocator visitor installed?"
        )
    return pool


def bind_step_op(stream: int, job: str = ""):
    """Runs the TensileBindStep op: inside a tf.function, binds the step to `stream`. Its node is
    named for the job (``bind_step_node_name``): a profile tells the job's steps apart by it."""
    return _ops.tensile_bind_step(stream=int(stream), name=bind_step_node_name(job))


def bind_step_node_name(job: str) -> str:
    """Note [Profiles of one job's steps] in tensile_tf/tf/profile_events.py: named for the job, not its
    stream, so that a job's graph (and a plan saved for it) is the same in every run of its config."""
    return "TensileBindStep_" + re.sub(r"[^A-Za-z0-9_.\-]", "_", job) if job else "TensileBindStep"
