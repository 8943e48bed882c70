"""tf_plugin: the runtime TensorFlow sees.

Importing this package imports TensorFlow and at once loads the plugin
library, whose allocator factory makes the device StreamAwarePool the
allocator of TensorFlow's CPU device (DESIGN.md, "Facts about TF internals").
It must therefore happen before TensorFlow creates its devices: before any op,
variable, ``list_logical_devices()`` or tracing. ``import tensile_tf`` does it
for you.

This package knows nothing of planning; see ``tensile_tf.scheduler``.
"""
from tf_plugin._loader import load_plugin

_plugin = load_plugin()

StreamAwarePool = _plugin.StreamAwarePool
PoolOutOfMemory = _plugin.PoolOutOfMemory
MIN_CHUNK_BYTES = _plugin.MIN_CHUNK_BYTES
DEFAULT_STREAM = _plugin.DEFAULT_STREAM
SYNCED = _plugin.SYNCED
human_bytes = _plugin.human_bytes

from tf_plugin.device import (  # noqa: E402  (needs the loaded plugin)
    bind_step_op,
    configure_device_pool,
    device_pool,
    device_pool_capacity,
)

__all__ = [
    "StreamAwarePool",
    "PoolOutOfMemory",
    "MIN_CHUNK_BYTES",
    "DEFAULT_STREAM",
    "SYNCED",
    "human_bytes",
    "bind_step_op",
    "configure_device_pool",
    "device_pool",
    "device_pool_capacity",
]
