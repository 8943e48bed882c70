"""A search driver's bookkeeping of its trials: ``TrialRun`` (one trial handed
to the host), ``SearchResult``, and the search space in Optuna's terms
(``normalize_space``). No TensorFlow: the runtime's records are only named.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState
from pydantic import TypeAdapter, ValidationError

from tensile_tf.search import storage as st
from tensile_tf.search.config import CategoricalParam, ParamSpec

if TYPE_CHECKING:
    from tensile_tf.jobs.job import Job
    from tensile_tf.runtime import JobState, RunResult

# A trial that runs out of memory beside others is re-queued at most this often.
MAX_OOM_RETRIES = 2
OOM_RETRIES_ATTR = st.OOM_RETRIES_ATTR

_PARAM = TypeAdapter(ParamSpec)


@dataclass
class TrialRun:
    """One trial this driver handed to the host.

    Threads (Note [Threads and hand-offs] in tensile_tf/runtime/threads.py,
    H10): ``prune`` is raised by the reporter thread and read by the trial's
    ``on_step`` on its job thread; ``pending_reports`` and ``told`` change
    under the driver's lock."""

    trial: optuna.Trial
    job: "Job"
    params: dict[str, Any]
    retry_of: int | None = None
    issued: bool = False              # its job was handed to the host
    started: bool = False             # the host started it (admitted, training)
    state: "JobState | None" = None
    prune: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    pending_reports: int = 0
    told: TrialState | None = None
    value: float | None = None
    tell_s: float = 0.0               # the driver's bookkeeping when the trial ended (facts, tell)
    issued_at: float | None = None    # run-clock seconds when its job was handed to the host

    @property
    def number(self) -> int:
        return self.trial.number

    def issue(self, now: float) -> None:
        self.issued, self.issued_at = True, now

    @property
    def prune_requested(self) -> bool:
        """The study's pruner asked to stop this trial (the reporter raised ``prune``)."""
        return self.prune.is_set()


def trial_steps(runs: list[TrialRun], ended: int = 8) -> list:
    """What Note [Admitting by marginal throughput] (tensile_tf/runtime/core_meter.py)
    reads of a driver's trials: those in flight and the last ``ended`` that ended."""
    from tensile_tf.runtime.core_meter import TrialSteps

    issued = [r for r in runs if r.issued_at is not None]
    chosen = [r for r in issued if r.told is not None][-ended:] + [r for r in issued if r.told is None]
    return [TrialSteps(r.job.name, r.issued_at, r.state.admitted_at_s if r.state else None,
                       r.state.ended_at_s if r.state else None, r.state.records if r.state else ())
            for r in chosen]


@dataclass
class SearchResult:
    study: optuna.Study
    trials: list[TrialRun]            # this driver's trials, in ask order
    host_result: "RunResult | None"
    wall_s: float
    requeued: list[int] = field(default_factory=list)  # interrupted trials found and re-queued
    cores: Any = None     # the driver's core_meter.CoreAdmission (None: off)

    @property
    def core_waits(self) -> int:
        """Trial starts put off because the cores were busy (Note [Admitting by the cores])."""
        return self.cores.waits if self.cores is not None else 0

    @property
    def core_gains(self) -> dict[int, float]:
        """Trials at once -> measured throughput over one fewer, from the starts
        beside running trials (Note [Admitting by marginal throughput])."""
        gain = self.cores.gain if self.cores is not None else None
        return {} if gain is None else {k: round(gain.gain(k), 3) for k in sorted(gain.slowdowns)}

    @property
    def time_breakdown(self) -> dict[str, float]:
        """Seconds per phase summed over this driver's trials, and the
        driver's own ``tell`` (Note [Where a trial's time goes] in
        tensile_tf/runtime/job_times.py)."""
        from tensile_tf.runtime.job_times import phase_totals

        totals = phase_totals([t.state.times.to_dict() for t in self.trials if t.state is not None])
        return totals | {"tell": round(sum(t.tell_s for t in self.trials), 6)}

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            key = t.told.name if t.told is not None else "RUNNING"
            out[key] = out.get(key, 0) + 1
        return out


def normalize_space(space: Mapping[str, Any]) -> tuple[dict[str, BaseDistribution], dict[str, Callable]]:
    """Space entries (Optuna distributions, ParamSpec models or plain dicts
    like ``{"type": "float", "low": 1e-4, "high": 0.1, "log": True}``) ->
    (distributions, decoders for values that are stored encoded)."""
    dists: dict[str, BaseDistribution] = {}
    decoders: dict[str, Callable] = {}
    for name, entry in space.items():
        if isinstance(entry, BaseDistribution):
            dists[name] = entry
            continue
        try:
            param = entry if hasattr(entry, "distribution") else _PARAM.validate_python(entry)
        except ValidationError as e:
            raise ValueError(f"search space entry {name!r}: {e.errors()[0]['msg']}") from None
        dists[name] = param.distribution()
        if isinstance(param, CategoricalParam) and param.encoded:
            decoders[name] = param.decode
    return dists, decoders


def trials_beside(state: JobState, states: Sequence[JobState]) -> list[JobState]:
    """The other jobs of ``states`` that held pool memory while ``state`` was admitted (from its
    arrival where it never was): each from its build (its arrival plus its wait for the run loop)
    or its admission, until it ended.

    Note [Neighbours before their admission]
    A trial is built, traced, probed (one unplanned training step) and, under the planner,
    captured before it is admitted, all on the pool, beside the running trials. Counting only
    admitted neighbours, a trial that ran out of memory beside a newcomer's probe was judged
    alone and failed for its params: in 2 of 6 io-mem searches (48 MiB pool, planned) a trial
    was lost that way, and what held the pool when its failure was recorded (Note [What held the
    pool] in tensile_tf/runtime/failures.py) named a trial not yet admitted beside it. Such a
    trial is now re-queued as any packing failure is, and its retry runs alone."""
    start = state.admitted_at_s if state.admitted_at_s is not None else (state.arrived_at_s or 0.0)
    end = state.ended_at_s if state.ended_at_s is not None else math.inf

    def since(o: JobState) -> float | None:
        built = o.arrived_at_s + o.times.arrival_wait if o.arrived_at_s is not None and o.times.build > 0 else None
        return min((t for t in (built, o.admitted_at_s) if t is not None), default=None)

    return [o for o in states if o is not state and (t := since(o)) is not None and t < end
            and (o.ended_at_s is None or o.ended_at_s > start)]
