"""tf_plugin: the runtime TensorFlow sees.

The plugin library's allocator factory makes the device StreamAwarePool the
allocator of TensorFlow's CPU device (DESIGN.md, "Facts about TF internals").
It must be loaded before TensorFlow creates its devices: before any op,
variable, ``list_logical_devices()`` or tracing.

Loading is explicit and happens once: ``tf_plugin.load()``, or the first use
of anything that needs the library (``device_pool()``, ``StreamAwarePool``,
``human_bytes``, ...: this package's attributes are resolved lazily, PEP 562).
Importing the package alone imports neither TensorFlow nor the library, so the
pure parts (``tf_plugin.nodegroup.partition`` and ``.schedule``) import on a
machine without TensorFlow. ``tensile_tf``'s runtime modules load it for you.

This package knows nothing of planning; see ``tensile_tf.scheduler``.
"""
from __future__ import annotations

from typing import Any

# Names the compiled library defines; resolved on first use.
_LIBRARY_NAMES = frozenset({
    "StreamAwarePool", "PoolOutOfMemory", "MIN_CHUNK_BYTES", "DEFAULT_STREAM", "SYNCED", "human_bytes",
})
# Names of tf_plugin.device (needs the loaded library and TensorFlow).
_DEVICE_NAMES = frozenset({"bind_step_op", "configure_plugin", "device_pool", "device_pool_capacity", "plugin_settings"})


def load():
    """Imports TensorFlow and loads the plugin library (once); returns the
    library module. Raises ``PluginLoadError`` with the remedy when it cannot
    (TensorFlow created its devices already, library missing or built against
    another TensorFlow, ``TF_CPU_ALLOCATOR_USE_BFC`` set)."""
    from tf_plugin._loader import load_plugin

    return load_plugin()


def is_loaded() -> bool:
    """Whether the plugin library is loaded in this process."""
    import sys

    from tf_plugin._loader import LIBRARY_NAME

    return f"tf_plugin.{LIBRARY_NAME}" in sys.modules


def __getattr__(name: str) -> Any:
    if name == "_plugin":
        return load()
    if name in _LIBRARY_NAMES:
        return getattr(load(), name)
    if name in _DEVICE_NAMES:
        from tf_plugin import device

        return getattr(device, name)
    raise AttributeError(f"module 'tf_plugin' has no attribute {name!r}")


__all__ = sorted(_LIBRARY_NAMES | _DEVICE_NAMES | {"load", "is_loaded"})
