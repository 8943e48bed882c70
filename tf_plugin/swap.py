"""The swap runtime from Python: the swap ops (for graph rewrites), and the
host store's and swap channel's settings and stats (tf_plugin/swap/*.h).

Stats use the pool's vocabulary (bytes): the host store reports
``capacity``, ``current``, ``peak``, ``allocated``, ``freed``; the channel
reports transfers and bytes by direction, link busy seconds and late swap-ins.
This module knows nothing of plans; ``tensile_tf.tf.rewrite`` applies them.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_plugin._loader import load_plugin

_plugin = load_plugin()
ops = tf.load_op_library(str(_plugin.__file__))


def configure_host_store(capacity_bytes: int) -> None:
    """Sets the host store's capacity (bytes held outside the pool at once)."""
    _plugin.configure_host_store(int(capacity_bytes))


def configure_host_cache(limit_bytes: int) -> None:
    """Caps the host store's cache of freed buffers kept for reuse (0: none)."""
    _plugin.configure_host_cache(int(limit_bytes))


def host_store_stats() -> dict[str, Any]:
    return _plugin.host_store_stats()


def release_stream_host_copies(stream: int) -> int:
    """Drops activation copies a job left behind (after a failed step); returns bytes."""
    return _plugin.host_store_release_stream(int(stream))


def set_swap_bandwidth(bytes_per_s: float) -> None:
    """Caps the swap link (bytes/s; 0: unlimited) to emulate a GPU's link."""
    _plugin.set_swap_bandwidth(float(bytes_per_s))


def swap_bandwidth() -> float:
    return _plugin.swap_bandwidth()


def swap_channel_stats() -> dict[str, Any]:
    return _plugin.swap_channel_stats()


def set_swap_log_capacity(capacity: int) -> None:
    """Keeps the last ``capacity`` finished transfers for ``swap_channel_log`` (0: off)."""
    _plugin.set_swap_log_capacity(int(capacity))


def swap_channel_log() -> list[dict[str, Any]]:
    """The logged transfers, oldest first: kind, bytes, and the steady-clock
    ns at which each was submitted, due (trigger + delta t), started, ended."""
    return _plugin.swap_channel_log()


def reset_swap_stats() -> None:
    """Zeroes the channel's counters and sets the host store's peak to its current bytes."""
    _plugin.reset_swap_channel_stats()
    _plugin.host_store_reset_peak()


def drain_swap_channel() -> None:
    """Waits until every submitted transfer is done."""
    _plugin.drain_swap_channel()


def swap_stats() -> dict[str, Any]:
    """Both: {"channel": ..., "host": ...}."""
    return {"channel": swap_channel_stats(), "host": host_store_stats()}
