"""What a run leaves: the memory sampler over it and the RunResult built at
its end (the run loop calls these; records.py defines what they fill).

``RunWindow`` marks the run's start in the pool's terms (its trace origin,
the counters before it, the peak of probing and planning), ``MemorySampler``
samples the pool from the start to the end (thread T3 of Note [Threads and
hand-offs] in threads.py), and ``run_result`` turns the host's jobs, the
window and the samples into the RunResult.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tf_plugin
from tensile_tf.config import environment
from tensile_tf.runtime.job_thread import RunClock
from tensile_tf.runtime.records import (
    MemorySample,
    PlannerRecord,
    PlanSummary,
    PoolRecord,
    RunResult,
    SwapLinkRecord,
    TraceCoverage,
)
from tensile_tf.tf import plugin_settings
from tensile_tf.tf.pool import pool_stats
from tensile_tf.runtime.traced_step_reuse import PARKED_PREFIX

if TYPE_CHECKING:
    from tensile_tf.runtime.run_loop import JobHost


def held_outside_jobs() -> int:
    """Pool bytes held outside every job: eager tensors, stray state, and the
    steps parked for the next job of their graph (Note [Reusing a finished
    job's traced step] in traced_step_reuse.py)."""
    return sum(j.get("current", 0) for name, j in pool_stats()["jobs"].items()
               if name == "default" or name.startswith(PARKED_PREFIX))


def outside_jobs(stats: dict[str, Any], job_names: set[str]) -> dict[str, dict[str, int]]:
    """PoolRecord.outside_jobs: each stream of the pool no job of the run owns, with what it held."""
    return {name: {"peak_bytes": int(j.get("peak", 0)), "bytes_at_end": int(j.get("current", 0))}
            for name, j in stats["jobs"].items() if name not in job_names}


@dataclass
class RunWindow:
    """The run's start, in the pool's terms."""

    started_at: float        # wall clock
    before: dict[str, Any]   # the pool's counters at the start
    origin_ns: int           # steady-clock ns: pool event times count from here
    start_peak: int = 0      # the pool's peak while the start's jobs were probed and planned

    @classmethod
    def open(cls, clock: RunClock, *, planner: bool, swap_bandwidth: int | None, lanes: int = 1,
             combined_bytes_per_s: float | None = None) -> "RunWindow":
        """Restarts the run's clock and the pool's peak (and, planning, the
        swap link's bandwidth, lanes, combined cap and counters)."""
        started_at, before = time.time(), pool_stats()
        clock.restart()
        tf_plugin.device_pool().reset_peak()
        if planner:
            from tf_plugin import swap

            # Note [Lanes of a device link] in tensile_tf/config/device_links.py
            swap.configure_swap_link(swap_bandwidth, lanes, combined_bytes_per_s)
            swap.reset_swap_stats()
        return cls(started_at, before, time.monotonic_ns())

    def training_starts(self) -> None:
        """Peaks from here on are the training's (probing and planning ran vanilla steps)."""
        pool = tf_plugin.device_pool()
        self.start_peak = pool.stats()["peak"]
        pool.reset_peak()


class MemorySampler:
    """Samples the pool every ``interval_s`` in a thread of its own, from
    ``start()`` to ``stop()``: the first sample before any job's first step,
    the last after every job ended. Its samples are its own until ``stop()``
    has joined it (Note [Threads and hand-offs], H9)."""

    def __init__(self, clock: RunClock, interval_s: float):
        self.clock = clock
        self.interval_s = interval_s
        self._samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="tensile-memory-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[MemorySample]:
        """Takes a last sample, joins the thread; returns every sample."""
        self._stop.set()
        self._thread.join()
        return self._samples

    def _sample(self) -> None:
        pool = tf_plugin.device_pool()
        samples = self._samples
        stopped = False
        while not stopped:
            stopped = self._stop.wait(self.interval_s) if samples else False
            s = pool.stats()
            samples.append(MemorySample(self.clock.now(), s["current"],
                                        {name: j["current"] for name, j in s["jobs"].items()}))


def run_result(host: "JobHost", window: RunWindow, samples: list[MemorySample]) -> RunResult:
    """The RunResult of ``host``'s run (every job thread joined)."""
    wall = host.clock.now()
    stats, before = pool_stats(), window.before
    events = tf_plugin.device_pool().trace()
    in_run = stats["trace_recorded"] - before["trace_recorded"]
    kept = [e for e in events if e["time_ns"] >= window.origin_ns]
    coverage = TraceCoverage(events_in_run=in_run, events_kept=len(kept),
                             kept_from_s=(kept[0]["time_ns"] - window.origin_ns) / 1e9 if kept else None,
                             samples=len(samples))
    pool_record = PoolRecord(
        capacity=host.capacity, peak=max(stats["peak"], window.start_peak), training_peak=stats["peak"],
        current=stats["current"], start_current=before["current"], run_ooms=stats["num_ooms"] - before["num_ooms"],
        stats={k: v for k, v in stats.items() if k != "jobs"},
        run_stitched=stats["num_stitched"] - before["num_stitched"],
        outside_jobs=outside_jobs(stats, {s.name for s in host.states}),
        nodegroup=host.pipeline.summary() if host.pipeline is not None else None)
    planner = None
    if host.planning is not None:
        from tf_plugin import swap

        link = host.planning.settings
        planner = PlannerRecord([PlanSummary.of(p) for p in host.plans],
                                SwapLinkRecord.of(link.swap_bandwidth, swap.swap_stats(), link.device_link,
                                                  link.link_lanes),
                                host.replanner.finish(host.states) if host.replanner is not None else [],
                                [c for s in host.states for c in s.drift_checks])
    return RunResult(capacity=host.capacity, pool=pool_record, jobs=list(host.states), samples=samples,
                     pool_events=kept, started_at=window.started_at, wall_s=wall,
                     trace_origin_ns=window.origin_ns, trace=coverage, most_jobs_running=host.most_running,
                     interrupted=host.stop.reason, planner=planner, plans=list(host.plans),
                     settings={"run": host.run_spec.model_dump(mode="json"), "pool_bytes": host.capacity,
                               "environment": environment.in_effect(),
                               "plugin": dataclasses.asdict(plugin_settings.in_effect())})
