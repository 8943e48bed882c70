"""The scheduling plan S_j of each workload (seed 000 §III-A "Scheduling Plan",
§III-C, §III-D): data only, so the runtime just executes it and plans can be
diffed, replayed and drawn.

Every event is anchored the way the seed anchors it: ``(trigger, delta t)``, the
event starts ``delta_s`` seconds after the trigger op ends (``trigger_op`` None:
after the iteration starts). ``start_s`` is the predicted start within the
iteration that runs it; it is informative, the anchor is normative.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class SwapEvent:
    """A Swap-Out (device -> host copy, then release) or Swap-In (host -> device prefetch)."""

    job: str
    tensor: str
    kind: str                    # "swap_out" | "swap_in"
    trigger_op: str | None
    delta_s: float
    start_s: float
    duration_s: float
    size_bytes: int
    release_after_op: str | None = None   # swap_out: the device copy is dropped after this access
    serves_op: str | None = None          # swap_in: the access it prefetches for
    cross_iteration: bool = False         # out in one iteration, in for the next (updated parameters/slots, §IV-C)
    iteration_shift: int = 0              # iterations between this event's start and its serves_op /
                                          # release_after_op (1: that op runs in the next iteration)


@dataclass
class RecomputeEvent:
    """§IV-D: drop ``target`` after ``release_after_op`` and re-run ``ops`` (in order,
    right before ``before_op``) to regenerate it. ``trigger_op`` is the op after which
    the re-run starts (the step before ``before_op``)."""

    job: str
    target: str
    release_after_op: str
    before_op: str
    trigger_op: str | None
    ops: list[str]
    size_bytes: int
    time_s: float
    msps: float                 # memory saving per second (Capuchin, seed 003 §4.3)


@dataclass
class ReleaseEvent:
    """Drop the device copy of ``tensor`` after ``after_op`` ends.
    reason: "last_use" (activity analysis), "swap" or "recompute"."""

    job: str
    tensor: str
    after_op: str
    reason: str


@dataclass
class JobPlan:
    name: str
    swap_outs: list[SwapEvent] = field(default_factory=list)
    swap_ins: list[SwapEvent] = field(default_factory=list)
    recomputes: list[RecomputeEvent] = field(default_factory=list)
    releases: list[ReleaseEvent] = field(default_factory=list)      # swap / recompute releases
    last_use: dict[str, list[str]] = field(default_factory=dict)    # activity analysis: op -> tensors
                                                                     # released after it (Algorithm 3 line 2)
    vanilla_peak_bytes: int = 0
    planned_peak_bytes: int = 0
    iteration_s: float = 0.0          # predicted, without recomputation
    planned_iteration_s: float = 0.0  # with recomputation re-runs
    start_offset_s: float = 0.0
    max_swapping_rate: float = 1.0
    swapped_bytes_per_iteration: int = 0
    graph_fingerprint: str = ""       # JobGraph.fingerprint() of the graph planned for
    graph_ops: int = 0                # its number of ops (for the message when a graph differs)
    order_only: bool = False          # no events, yet run in plan order: it lowers the peak (Note [Free-running steps])
    step_order: str = "plan"          # "plan": ops chained in plan order; "free": on the executor's threads
                                      # (Note [Free-order plans] in peak_analysis)
    unchained_runs: list[list[str]] = field(default_factory=list)   # [first op, last op]: runs of plan order
                                      # whose ops run free, chained as a whole (Note [Unchained runs])

    @property
    def changes_step(self) -> bool:
        """Whether the job runs a rewritten step (events, or the plan's order alone)."""
        return bool(self.swap_outs or self.swap_ins or self.recomputes or self.order_only)

    @property
    def msr(self) -> float:
        v = self.vanilla_peak_bytes
        return (v - self.planned_peak_bytes) / v if v else 0.0

    def rewrites_like(self, other: "JobPlan") -> bool:
        """Whether ``other`` rewrites the job's step into the same graph:
        every field a rewrite reads is equal (the predictions are left out),
        so a re-plan may reuse the step the last one built. Field by field,
        the events first: two plans' events usually differ, and the whole
        plan as one JSON text took 70 ms for a ResNet50 job."""
        return all(getattr(self, f) == getattr(other, f) for f in _REWRITTEN_FROM)


# JobPlan fields that predict and do not steer the rewrite (rewrites_like leaves them out)
_PREDICTIONS = ("vanilla_peak_bytes", "planned_peak_bytes", "iteration_s", "planned_iteration_s",
                "swapped_bytes_per_iteration")
_FIRST = ("swap_outs", "swap_ins", "recomputes", "unchained_runs", "step_order", "order_only")
_REWRITTEN_FROM = _FIRST + tuple(f.name for f in fields(JobPlan) if f.name not in _PREDICTIONS + _FIRST)


@dataclass
class Plan:
    """All jobs' plans plus the pool-level prediction (the jobs' footprints summed by ``peak_model``)."""

    jobs: dict[str, JobPlan]
    pool_vanilla_peak_bytes: int
    pool_planned_peak_bytes: int
    pool_bytes: int | None = None              # the budget planned for (None: minimise)
    bandwidth_bytes_per_s: float = 0.0
    horizon_s: float = 0.0
    sum_of_job_peaks_bytes: int = 0            # the paper's MP = sum MP_j, a phase-free upper bound
    iterations: int = 0
    planning_s: float = 0.0
    stop_reason: str = ""
    peak_model: str = "timeline"               # how the jobs' peaks were assumed to overlap (config.PlanPeaks)
    version: int = 2                           # 2: JobPlan.graph_fingerprint / graph_ops
    representatives: int = 0                   # identical jobs planned as this many (0: jointly; Note [Identical
                                               # jobs planned by representatives] in scheduler.identical_jobs)
    # jobs of one graph planned on the fastest of their tables, op by op: how much slower the slowest job's table
    # is (None: each on its own; Note [Jobs of one graph planned on their fastest latencies])
    latency_spread: float | None = None

    def refusal(self, job: str, fingerprint: str, ops: int) -> str | None:
        """Why this plan cannot run ``job`` whose traced graph has
        ``fingerprint`` and ``ops`` ops (None: it can)."""
        jp = self.jobs.get(job)
        if jp is None:
            return f"the plan has no job {job!r} (it plans {', '.join(self.jobs) or 'no job'})"
        if not jp.graph_fingerprint:
            return f"job {job!r}: the plan records no graph fingerprint (made by plan version {self.version})"
        if jp.graph_fingerprint != fingerprint:
            return (f"job {job!r}: the plan was made for a graph of {jp.graph_ops} ops (fingerprint "
                    f"{jp.graph_fingerprint[:12]}), this run traced {ops} ops ({fingerprint[:12]}): the model, "
                    "batch size, input shape or optimizer changed")
        return None

    @property
    def budget_met(self) -> bool:
        return self.pool_bytes is None or self.pool_planned_peak_bytes <= self.pool_bytes

    @property
    def msr(self) -> float:
        """Predicted memory saving ratio of the pool: (VMP - EMP) / VMP."""
        v = self.pool_vanilla_peak_bytes
        return (v - self.pool_planned_peak_bytes) / v if v else 0.0

    def events(self, job: str) -> list[SwapEvent | RecomputeEvent]:
        jp = self.jobs[job]
        return [*jp.swap_outs, *jp.swap_ins, *jp.recomputes]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["budget_met"] = self.budget_met
        d["msr"] = self.msr
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        jobs = {}
        for name, jd in d["jobs"].items():
            jd = dict(jd)
            jobs[name] = JobPlan(
                swap_outs=[SwapEvent(**e) for e in jd.pop("swap_outs")],
                swap_ins=[SwapEvent(**e) for e in jd.pop("swap_ins")],
                recomputes=[RecomputeEvent(**e) for e in jd.pop("recomputes")],
                releases=[ReleaseEvent(**e) for e in jd.pop("releases")],
                **jd)
        rest = {k: v for k, v in d.items() if k not in ("jobs", "budget_met", "msr")}
        return cls(jobs=jobs, **rest)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))
