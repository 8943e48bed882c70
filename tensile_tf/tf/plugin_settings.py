"""The C++ plugin's settings, resolved once and handed over in one call.

Note [One call into the plugin]. The plugin (tf_plugin/plugin_settings.h)
runs with the device pool's capacity, stitching and event ring, the swap
link's cap and copy threads' priority, and the host store's sizes. Each was
read where it was used (issue 57): the pool's size by Python and again by
C++, the swap link's cap, the host store's sizes and the threads' priority
by C++ alone, documented nowhere. Now ``PluginSettings.from_environment``
reads them from the environment variables of docs/configuration.md's table
(``tensile_tf.config.environment``: a variable set but unreadable is an
error that names it), a config's ``pool:`` replaces the capacity
(``configure_pool``), and ``hand_to_plugin`` gives the whole object to C++
in one call, before TensorFlow's first op creates the pool. C++ reads no
environment variable for them. ``in_effect()`` reads back what C++ holds:
results.json's ``settings.plugin``. The swap link's cap here is the one
before a run sets its own (``run.swap_bandwidth``: docs/planner.md).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tensile_tf.units import parse_bytes


@dataclass(frozen=True)
class PluginSettings:
    """tf_plugin/plugin_settings.h's struct, field for field, with its defaults."""

    pool_bytes: int = 4 << 30
    pool_stitch: bool = True
    pool_trace_events: int = 1 << 16
    swap_bandwidth_bytes_per_s: float = 0.0     # 0: unlimited
    swap_thread_nice: int = -10                 # 0 or more: the process's own
    host_bytes: int = 16 << 30
    host_cache_bytes: int = 2 << 30             # 0: no cache

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "PluginSettings":
        """The defaults, with each variable that is set (an unreadable one raises ValueError naming it)."""
        environ = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        for field_name, (variable, parse) in _VARIABLES.items():
            raw = environ.get(variable)
            if raw is not None and raw.strip() != "":
                try:
                    given[field_name] = parse(raw.strip())
                except ValueError as e:
                    said = str(e).removeprefix(f"{variable}: ")
                    raise ValueError(f"{variable}={raw!r}: {said}") from None
        return cls(**given)


def _stitch(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("use 1 (stitch large requests from free pieces, the default) or 0 (never; the pool "
                         "fails them as before)")
    return raw == "1"


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError("use a whole number above 0")
    return value


def _bandwidth(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError("use bytes per second (0: unlimited)")
    return value


def _bytes(variable: str, *, zero: bool = False) -> Callable[[str], int]:
    """A size as ``parse_bytes`` reads it; ``zero``: 0 too (none)."""
    def parse(raw: str) -> int:
        return 0 if zero and raw == "0" else parse_bytes(raw, what=variable)
    return parse


#: Each field's environment variable (rows of tensile_tf.config.environment.ENVIRONMENT) and its parser.
_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "pool_bytes": ("TENSILE_POOL_BYTES", _bytes("TENSILE_POOL_BYTES")),
    "pool_stitch": ("TENSILE_POOL_STITCH", _stitch),
    "pool_trace_events": ("TENSILE_POOL_TRACE_EVENTS", _positive_int),
    "swap_bandwidth_bytes_per_s": ("TENSILE_SWAP_BANDWIDTH", _bandwidth),
    "swap_thread_nice": ("TENSILE_SWAP_THREAD_NICE", int),
    "host_bytes": ("TENSILE_HOST_BYTES", _bytes("TENSILE_HOST_BYTES")),
    "host_cache_bytes": ("TENSILE_HOST_CACHE_BYTES", _bytes("TENSILE_HOST_CACHE_BYTES", zero=True)),
}
VARIABLES = {field_name: variable for field_name, (variable, _) in _VARIABLES.items()}


def hand_to_plugin(settings: PluginSettings) -> None:
    """The one call (Note [One call into the plugin]); only before the pool exists."""
    from tf_plugin.device import configure_plugin

    configure_plugin(**dataclasses.asdict(settings))


def in_effect() -> PluginSettings:
    """What the plugin holds now."""
    from tf_plugin.device import plugin_settings

    return PluginSettings(**plugin_settings())
