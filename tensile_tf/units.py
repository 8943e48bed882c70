"""Byte sizes as users write them and read them; pure (no TensorFlow).

``human_bytes`` prints sizes the way the C++ pool's messages do
(``HumanBytes`` in tf_plugin/allocator/stream_aware_pool.cc: "512 B",
"1.5 MiB"), so a size reads the same in an OOM error, a table and a plot.
"""
from __future__ import annotations

from pydantic import ByteSize, TypeAdapter, ValidationError

_BYTES = TypeAdapter(ByteSize)
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def parse_bytes(value: int | str, *, what: str = "size") -> int:
    """'8GiB', '512MB', '1_000_000' or an int -> bytes; ValueError says what is wrong."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a byte size; write a number of bytes or a size such as '512MiB'")
    try:
        n = int(_BYTES.validate_python(value))
    except ValidationError:
        raise ValueError(
            f"{what}: cannot read {value!r} as a byte size; write an integer number of bytes "
            "or a number with a unit such as '512MiB' or '8GiB'"
        ) from None
    if n <= 0:
        raise ValueError(f"{what}: {value!r} must be a positive number of bytes")
    return n


def human_bytes(nbytes: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if nbytes is None:
        return "-"
    v, unit = float(nbytes), 0
    while abs(v) >= 1024.0 and unit < len(_UNITS) - 1:
        v /= 1024.0
        unit += 1
    return f"{int(nbytes)} B" if unit == 0 else f"{v:.1f} {_UNITS[unit]}"
