"""Mutable planning state shared by the phases of Algorithm 3 (one ``JobState``
per job). Pure data plus small helpers; the algorithms live in their own modules."""
from __future__ import annotations

from dataclasses import dataclass, field

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import LatencyModel
from tensile_tf.scheduler.peak_analysis import JobFootprint
from tensile_tf.scheduler.plan import RecomputeEvent


@dataclass
class SwapDecision:
    """One scheduled swap of tensor ``i`` of job ``j`` over the unrolled gap (p, q):
    released after access p, back on the device before access q. ``out_start`` is
    None when an earlier swap-out's host copy of the same version is reused (§III-C:
    a swapped-in tensor stays in host memory, saving a second swap-out)."""

    j: int
    i: int
    p: int
    q: int
    m: int                       # the peak step it was scheduled for
    out_start: float | None
    out_dur: float
    in_start: float
    in_dur: float
    release_step: int
    in_step: int
    absent: list[tuple[int, int]] = field(default_factory=list)
    out_tag: int = -1
    in_tag: int = -1
    version: int | None = None   # unrolled step of the write whose data the host copy holds
    names: tuple = ()            # (p, q, m) as (step name, iteration shift): survives step renumbering


@dataclass
class JobState:
    j: int
    graph: JobGraph
    latencies: LatencyModel
    offset_s: float
    max_swapping_rate: float
    tas: TensorAccessSequence
    fp: JobFootprint
    vanilla_tas: TensorAccessSequence
    vanilla_peak: int
    decisions: list[SwapDecision] = field(default_factory=list)
    recomputes: list[RecomputeEvent] = field(default_factory=list)
    swapped_out: set[int] = field(default_factory=set)          # SON: tensors with a swap-out
    host_copies: dict[tuple[int, int], float] = field(default_factory=dict)  # (tensor, version % n) -> out end - version end
    no_recompute: set[int] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.graph.name
