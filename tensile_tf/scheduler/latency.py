"""Operator latencies: the second half of a Tensor Access Sequence (seed 000 §IV-A).

The planner asks a ``LatencyModel`` for each op's predicted seconds. The
usual source is a ``LatencyTable`` measured in a profiled step (with the
seed's EWMA correction, §IV-E). Before a job's step has ever run (its vanilla
step does not fit the pool, so it cannot be profiled) the planner uses
``ColdStartLatency``: the seed predicts cold-start latencies with an MLP over
op features (§IV-A); this is the simplest model of that kind, one that needs
no training data: each op streams its tensors at a fixed rate.

Note [Latency time base]
The planner lays a step's ops end to end (a Tensor Access Sequence's times)
and places every transfer by those seconds: the channel's transfers are
planned against them, and a swap-in starts its trigger op's end plus delta t
seconds. So the table must add up to the time the planned step takes.
tf.profiler times each op from its start to its end on the executor's
threads; on two cores the executor runs two ops side by side and each takes
longer than alone, so one free-running step's op times add up to far more
than the step took: Transformer 64x128, batch 48, 193 ms of op time in
steps of 90-108 ms. Planned on those, the 3x batch's swap-ins came late
(230 of 420 in 10 steps) and its step took 195 ms against 110 unplanned.
Two corrections, both measured, not modelled:
* A table is put on its step's wall time (``LatencyTable.on_wall_time``):
  scaled down so that its ops add up to the profiled steps' median wall
  time, where they add up to more.
* A step planned in plan order (Note [Plan order] in tensile_tf/tf/rewrite/rewriter.py)
  runs its ops one after another, slower than free (130 ms on that row) and
  faster than the op times' sum. Its latencies are measured on the step
  chained in plan order (``execution.measure_plan_order_latencies``: an
  empty plan's rewrite, profiled): ops that run alone, adding up to the
  chained step's time (135-140 ms there). Free-order plans keep the free
  step's table on its wall time.
A running job's profiled steps (Note [Latency drift]) are put on their wall
time too; a planned job's profiled step runs its plan, in its order.
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
    # How the measured step ran its ops: "free" on the executor's threads, or
    # "plan" chained in plan order (Note [Latency time base]; a running job's
    # check compares tables of the same order, Note [Latency drift]).
    step_order: str = "free"

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
        return LatencyTable(new, dict(self.by_type), self.default_s, self.source, self.step_order)

    def change_rate(self, other: "LatencyTable", graph: JobGraph) -> float:
        """§IV-E: |s' - s| / s over the summed op latencies; re-plan above a threshold."""
        s, s2 = self.total_s(graph), other.total_s(graph)
        return abs(s2 - s) / s if s > 0 else float("inf")

    def on_wall_time(self, graph: JobGraph, wall_s: float) -> "LatencyTable":
        """Note [Latency time base]: the table scaled down so that the step's
        ops add up to ``wall_s``, the step's measured wall time, where they add
        up to more (ops that ran side by side on the executor's threads). A
        table that adds up to no more than the wall time is returned as it is."""
        if not wall_s > 0:
            raise ValueError(f"a step's wall time must be > 0 s, got {wall_s!r}")
        total = self.total_s(graph)
        if total <= wall_s:
            return self
        k = wall_s / total
        return LatencyTable({n: s * k for n, s in self.seconds.items()}, {t: s * k for t, s in self.by_type.items()},
                            self.default_s * k, f"{self.source}, x{k:.2f} to the step's wall time", self.step_order)

    def to_json(self) -> str:
        return json.dumps({"seconds": self.seconds, "by_type": self.by_type,
                           "default_s": self.default_s, "source": self.source, "step_order": self.step_order})

    @classmethod
    def from_json(cls, text: str) -> "LatencyTable":
        d = json.loads(text)
        return cls(d["seconds"], d.get("by_type", {}), d.get("default_s", 1e-6), d.get("source", "measured"),
                   d.get("step_order", "free"))


# Op types whose time is dominated by arithmetic rather than by moving their tensors.
COMPUTE_BOUND_OP_PREFIXES = ("Conv", "DepthwiseConv", "MatMul", "BatchMatMul", "_FusedMatMul", "_FusedConv",
                             "Einsum", "AvgPool", "MaxPool")


@dataclass
class ColdStartLatency:
    """Predicted seconds for an op that was never measured (§IV-A cold start):
    ``overhead_s`` plus the bytes it reads, writes and updates over
    ``bytes_per_s``, times ``compute_factor`` for compute-bound op types
    (convolutions, matmuls, pooling). A rough guess by design, biased low:
    the planner starts a swap-in so many predicted seconds before its
    consumer, so ops guessed slower than they run bring tensors back early
    and raise the real peak above the plan's (measured: +35% on a deep MLP
    with 4 GB/s and factor 8), while ops guessed faster only make swap-ins
    late, which costs time, not memory. Measured latencies replace these
    once the job has run."""

    graph: JobGraph
    bytes_per_s: float = 25e9
    overhead_s: float = 5e-6
    compute_factor: float = 2.0
    source: str = "cold-start (bytes touched)"

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0 or self.overhead_s < 0 or self.compute_factor <= 0:
            raise ValueError("ColdStartLatency: bytes_per_s and compute_factor must be > 0, overhead_s >= 0")

    def latency_s(self, op: OpNode) -> float:
        size = self.graph.tensors
        touched = sum(size[t].size_bytes for t in (*op.inputs, *op.outputs, *op.updates) if t in size)
        factor = self.compute_factor if op.op_type.startswith(COMPUTE_BOUND_OP_PREFIXES) else 1.0
        return self.overhead_s + factor * touched / self.bytes_per_s


@dataclass
class UniformLatency:
    """Every op takes ``seconds``: for tests and for shape-only dry runs."""

    seconds: float = 1e-3

    def latency_s(self, op: OpNode) -> float:
        return self.seconds
