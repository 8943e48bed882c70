"""Operator latencies: the second half of a Tensor Access Sequence (seed 000 §IV-A).

The planner asks a ``LatencyModel`` for each op's predicted seconds. Today the
source is a ``LatencyTable`` measured in a profiled step; the seed's cold-start
MLP predictor (§IV-A) and its EWMA correction while jobs run (§IV-E) plug in
behind the same protocol.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

from tensile_tf.scheduler.job_graph import JobGraph, OpNode


@runtime_checkable
class LatencyModel(Protocol):
    """Predicts one op's execution time in seconds. Must be >= 0 and cheap."""

    def latency_s(self, op: OpNode) -> float: ...


@dataclass
class LatencyTable:
    """Measured per-op seconds, keyed by op name.

    Ops missing from the table get the median of measured ops of the same
    ``op_type`` if any were measured, else ``default_s``: a missing entry is a
    guess, never an error, because TF fuses or elides some graph nodes at run
    time (Grappler) and they then never show up in a profile.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    by_type: dict[str, float] = field(default_factory=dict)   # op_type -> median seconds
    default_s: float = 1e-6
    source: str = "measured"

    def latency_s(self, op: OpNode) -> float:
        s = self.seconds.get(op.name)
        if s is not None:
            return s
        return self.by_type.get(op.op_type, self.default_s)

    @classmethod
    def from_measurements(cls, seconds: Mapping[str, float], op_types: Mapping[str, str] | None = None,
                          *, default_s: float = 1e-6, source: str = "measured") -> "LatencyTable":
        """``op_types`` (name -> type) lets unmeasured ops of a measured type borrow its median."""
        for name, s in seconds.items():
            if not s >= 0:
                raise ValueError(f"latency of op {name!r} is {s!r}; latencies are seconds >= 0")
        per_type: dict[str, list[float]] = {}
        for name, s in seconds.items():
            t = (op_types or {}).get(name)
            if t:
                per_type.setdefault(t, []).append(s)
        return cls(dict(seconds), {t: statistics.median(v) for t, v in per_type.items()}, default_s, source)

    def covered(self, graph: JobGraph) -> float:
        """Fraction of the graph's ops with a measured entry."""
        return sum(o.name in self.seconds for o in graph.ops) / max(1, len(graph.ops))

    def total_s(self, graph: JobGraph) -> float:
        return sum(self.latency_s(o) for o in graph.ops)

    def ewma_update(self, measured: Mapping[str, float], alpha: float = 0.3) -> "LatencyTable":
        """§IV-E: corrects latencies with an exponentially weighted moving average."""
        if not 0 < alpha <= 1:
            raise ValueError(f"EWMA alpha must be in (0, 1], got {alpha}")
        new = dict(self.seconds)
        for name, s in measured.items():
            new[name] = s if name not in new else (1 - alpha) * new[name] + alpha * s
        return LatencyTable(new, dict(self.by_type), self.default_s, self.source)

    def change_rate(self, other: "LatencyTable", graph: JobGraph) -> float:
        """§IV-E: |s' - s| / s over the summed op latencies; re-plan above a threshold."""
        s, s2 = self.total_s(graph), other.total_s(graph)
        return abs(s2 - s) / s if s > 0 else float("inf")

    def to_json(self) -> str:
        return json.dumps({"seconds": self.seconds, "by_type": self.by_type,
                           "default_s": self.default_s, "source": self.source})

    @classmethod
    def from_json(cls, text: str) -> "LatencyTable":
        d = json.loads(text)
        return cls(d["seconds"], d.get("by_type", {}), d.get("default_s", 1e-6), d.get("source", "measured"))


@dataclass
class UniformLatency:
    """Every op takes ``seconds``: for tests and for shape-only dry runs."""

    seconds: float = 1e-3

    def latency_s(self, op: OpNode) -> float:
        return self.seconds
