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


def set_swap_lanes(lanes: int) -> None:
    """1: one transfer at a time in either direction (the seed's link); 2: a
    lane per direction, each with its own thread and cap (swap_channel.h)."""
    _plugin.set_swap_lanes(int(lanes))


def swap_lanes() -> int:
    return _plugin.swap_lanes()


def set_swap_combined_bandwidth(bytes_per_s: float | None) -> None:
    """Caps both directions together (bytes/s; None or 0: no cap): a lane
    moves at most min(each way, combined / lanes)."""
    _plugin.set_swap_combined_bandwidth(float(bytes_per_s or 0))


def configure_swap_link(bytes_per_s: float | None, lanes: int, combined_bytes_per_s: float | None) -> None:
    """The run's swap link in one call, from wherever the run settles it (the run's start, and a
    link named for a device at its first plan): each lane's cap (None or 0: unlimited), the lanes,
    and the cap on both directions together (None: none)."""
    set_swap_bandwidth(bytes_per_s or 0)
    set_swap_lanes(lanes)
    set_swap_combined_bandwidth(combined_bytes_per_s)


def swap_channel_stats() -> dict[str, Any]:
    return _plugin.swap_channel_stats()


def set_swap_log_capacity(capacity: int) -> None:
    """Keeps the last ``capacity`` finished transfers for ``swap_channel_log`` (0: off)."""
    _plugin.set_swap_log_capacity(int(capacity))


def swap_channel_log() -> list[dict[str, Any]]:
    """The logged transfers, oldest first: kind, lane, bytes, and the steady-clock
    ns at which each was submitted, due (trigger + delta t), started, ended."""
    return _plugin.swap_channel_log()


def reset_swap_stats() -> None:
    """Zeroes the channel's counters and sets the host store's peak to its current bytes."""
    _plugin.reset_swap_channel_stats()
    _plugin.host_store_reset_peak()


def drain_swap_channel() -> None:
    """Waits until every submitted transfer is done."""
    _plugin.drain_swap_channel()


def set_plan_table(table: str, rows: list[tuple], generation: int) -> None:
    """Writes a plan into a plan-table step's table (Note [Plans read at run
    time] in tf_plugin/swap/plan_table.h): one row per slot, (active,
    copy_out, host_reads, out_tick, out_delta_s, in_tick, in_delta_s); the
    table's next step reads it."""
    _plugin.set_plan_table(table, rows, int(generation))


def plan_table_stats(table: str) -> dict[str, Any]:
    """The table's plan generation, the one its last step read, and its
    slots' runs by what they did (swap_outs, swap_ins, host_reuses, passed)."""
    return _plugin.plan_table_stats(table)


def drop_plan_table_step(table: str) -> int:
    """Drops what the table's last step holds (a failed step's tensors)."""
    return _plugin.drop_plan_table_step(table)


def forget_plan_table(table: str) -> bool:
    """Forgets the table's name (its plan-table step is gone); the table is
    freed once no kernel of that step holds it. False if it was unknown."""
    return _plugin.forget_plan_table(table)


def plan_tables_known() -> int:
    """How many plan tables the process knows by name."""
    return _plugin.plan_tables_known()


def swap_stats() -> dict[str, Any]:
    """Both: {"channel": ..., "host": ...}."""
    return {"channel": swap_channel_stats(), "host": host_store_stats()}
