"""Where a job's wall time went, phase by phase (results.json ``jobs[*].times``,
a search trial's ``job.times``).

Note [Where a trial's time goes]
A job's life in the host, in order, and the phase each stretch is counted in
(``JobTimes``; seconds, measured with ``time.perf_counter`` by the thread
that does the work):

  arrival_wait   it arrived (``job_source``, ``arrive_at_s``) and waited for
                 the run loop to start building it (the run loop was building,
                 probing or tearing down another job)
  build          model, optimizer and data, under its own pool stream
  trace          its step traced once (``get_concrete_function``)
  probe_step     its first step, run by the run loop to measure P and T. It is
                 a training step (``steps_done`` counts it, its loss is
                 recorded), run before admission
  capture        with the planner on: its graph and op latencies captured
  admission_wait measured, waiting for room beside the running jobs
  data           its later batches, fetched in its own thread (a loader that
                 waits on storage shows here)
  steps          its later steps, in its own thread: the step functions alone
  between_steps  the rest of its thread's time: records, hooks (Keras
                 callbacks, on_step), validation, checkpoints, parks at a
                 step boundary (Note [Joint re-plan on arrival]), the end's
                 validation, save and weights digest
  end_wait       its thread ended; the run loop had not yet taken the end
                 off its inbox (it was busy with another job)
  teardown       references dropped, garbage collected, its stream checked
                 and released

A search adds its own bookkeeping (``tell``: the study told, the trial's facts
stored; search/driver.py). Phases that did not happen stay 0. A job built
twice (queued after its probe, rebuilt later) adds both builds up. The
phases of one job are disjoint; other jobs run during them, so they show
where *this* job waited and what it cost the run loop, not how the cores
were shared. ``benchmarks/search_bench.py`` prints the totals beside the
same trials run under Optuna's own threads.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import Iterator

PHASES = ("arrival_wait", "build", "trace", "probe_step", "capture", "admission_wait", "data", "steps",
          "between_steps", "end_wait", "teardown")


@dataclass
class JobTimes:
    """Seconds per phase of Note [Where a trial's time goes]."""

    arrival_wait: float = 0.0
    build: float = 0.0
    trace: float = 0.0
    probe_step: float = 0.0
    capture: float = 0.0
    admission_wait: float = 0.0
    data: float = 0.0
    steps: float = 0.0
    between_steps: float = 0.0
    end_wait: float = 0.0
    teardown: float = 0.0

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Adds the block's wall time to ``phase``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, phase, getattr(self, phase) + time.perf_counter() - t)

    def add(self, phase: str, seconds: float) -> None:
        setattr(self, phase, getattr(self, phase) + max(0.0, seconds))

    def __post_init__(self) -> None:
        self._waiting: tuple[str, float] | None = None   # not a field: never serialised

    def wait_begins(self, phase: str) -> None:
        """A wait (arrival_wait, admission_wait, end_wait) starts now; ``wait_ends`` counts it."""
        self._waiting = (phase, time.perf_counter())

    def wait_ends(self) -> None:
        if self._waiting is not None:
            phase, t = self._waiting
            self._waiting = None
            self.add(phase, time.perf_counter() - t)

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in asdict(self).items()}


assert PHASES == tuple(f.name for f in fields(JobTimes))


def phase_totals(times: list[dict[str, float]]) -> dict[str, float]:
    """Each phase summed over several jobs' ``times`` dicts (missing phases: 0)."""
    out = {p: 0.0 for p in PHASES}
    for t in times:
        for k, v in (t or {}).items():
            out[k] = out.get(k, 0.0) + (v or 0.0)
    return {k: round(v, 6) for k, v in out.items()}


__all__ = ["PHASES", "JobTimes", "phase_totals"]
