"""The node-group pipeline inside the JobHost (``run.pipeline: nodegroup``).

The host calls four hooks, in this order over a job's life:

1. ``graph_transform(name, stream)`` when it builds the job: the returned
   callable partitions the traced step (``split_size`` bytes, or ``auto``) and
   inserts the barrier ops. The job's probe step runs outside any schedule
   (its barriers pass straight through).
2. ``job_started(state)`` (``jobs_started`` for the jobs a run starts
   with, Note [Jobs that start together join one schedule]) / 3.
   ``job_ended(state)``: the set of running jobs changed. The coordinator re-runs Algorithm 1 over the running jobs and
   installs the result as a new schedule version; each job moves to it at its
   next iteration. An ended or failed job first leaves the pipeline, which
   releases every barrier it takes part in.
4. ``step_ended(stream, peak)`` after each step: a step run paired
   calibrates the job, and the jobs are paired again once every one has
   one (Note [Overlap after measuring]).
5. ``summary()`` for results.json.

With ``split_size: auto`` the host also tunes each job's split when it
builds it (Note [Split size tuning]): ``split_candidates``, then
``choose_split`` with the peaks the job measured alone with each one's
barriers.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from tf_plugin.nodegroup import install_schedule, device_pipeline
from tf_plugin.nodegroup.partition import Partition, auto_split_size, partition_graph, tuned_split
from tf_plugin.nodegroup.rewrite import graph_nodes, insert_barriers
from tf_plugin.nodegroup.schedule import JobProfile, PairSchedule, schedule_pairs


@dataclass
class _JobEntry:
    name: str
    stream: int
    partition: Partition
    persistent_bytes: int = 0
    measured_temporary_bytes: int = 0     # its probe step's (Note [Calibrating the partition's sizes])
    paired_temporary_bytes: int = 0       # the most of its steps run paired (Note [Overlap after measuring])
    paired_steps: int = 0

    @property
    def temporary_bytes(self) -> int:
        return max(self.measured_temporary_bytes, self.paired_temporary_bytes)

    def profile(self) -> JobProfile:
        """Algorithm 1's view of the job, sizes scaled to the measured peak."""
        p = self.partition
        est = p.temporary_peak_bytes
        measured = self.temporary_bytes
        scale = measured / est if est > 0 and measured > 0 else 1.0
        g = p.groups
        return JobProfile(self.stream, self.name, p.num_ang, self.persistent_bytes,
                          tuple(int(x.start_bytes * scale) for x in g), tuple(int(x.peak_bytes * scale) for x in g),
                          tuple(int(x.end_bytes * scale) for x in g))


# Note [Calibrating the partition's sizes]
# The partition counts the static sizes of op outputs; the pool also serves
# op scratch memory, inputs and kernel-internal buffers the graph does not
# show, so the measured temporary peak of the probe step is larger (1.5x on a
# small CNN). The group boundaries stay where the static sizes put them, but
# Algorithm 1 sees every group's bytes scaled by measured / estimated peak, so
# its p and predicted peak are in the pool's real bytes.


# Note [Fragmentation reserve]
# Pairing forces the paired groups to run together: with p large, both jobs'
# allocating phases advance in lockstep, so their peaks coincide by design.
# The pool is a best-fit arena without compaction; with two jobs' tensors
# interleaved, a transformer pair at 88% of the pool failed with 7 MiB free
# in 63 chunks (none of 768 KiB). Algorithm 1 therefore plans for
# capacity * (1 - fragmentation_reserve) (default 15%): p drops until the
# predicted peak leaves that much free.


# Note [Jobs that start together join one schedule]
# A job moves to a new schedule version at its next iteration. The jobs of a
# run's start used to join one by one, each installing a version: the first
# started its step under a version that held it alone (so it ran free, at its
# unbarriered peak) while the others were joining, and that step then ran
# beside their paired ones. Four small CNN jobs at batch 55 in 120 MiB: the
# first job's step ran out of memory asking 27.5 MiB with 26.9 MiB free.
# Jobs that start together now join in one call, so the first version any of
# them runs already pairs them all.


# Note [Overlap after measuring]
# Algorithm 1 overlaps p groups of neighbouring jobs where the calibrated
# profiles leave room, and the probe that calibrates them runs alone. Paired,
# a Transformer job's step peaks about 3 MiB above its probe (21.8 -> 24.9
# MiB at batch 22), and four jobs interleave their tensors in the pool. Four
# Transformer jobs in 64 MiB were paired with p = 4 at batch 22 (predicted
# 50 MiB for a 54.4 MiB limit) and ran out of memory in their first paired
# steps, while at batch 36-38, where only p = 0 fits, they trained
# (benchmarks/RESULTS.md, Issue 20, thirteenth session). So a schedule made
# before every one of its jobs has run a step paired overlaps nothing beyond
# the seed's pairing (``max_p=0``: the least memory Algorithm 1 offers); each
# step a job runs paired reports its stream's peak (``step_ended``), and once
# every job has one the jobs are paired again with each job's temporary bytes
# the larger of its probe's and its paired steps', p free. A paired step that
# peaks more than PAIRED_PEAK_MARGIN above what its job was last paired with
# pairs them again. Every re-pairing is a new version, entered at the old
# version's barrier (Note [Hand-over at the old barrier] in
# tf_plugin/nodegroup/counter_barrier.h), so no iteration runs unpaired.
PAIRED_PEAK_MARGIN = 0.02


# Note [Split size tuning]
# No one split size suits every model: on the small CNN, groups of 1-4 MiB
# let one job alone train a 56-58 batch where the static rule (temporary
# peak / 4) allowed 44, because the barriers keep TensorFlow's executor from
# starting backward work while forward activations are live; on the
# Transformer the same fine split lowered the 2-job batch from 52 to 32
# (benchmarks/RESULTS.md, Issue 6). So ``auto`` measures: the host traces
# the job's step with each of SPLIT_FACTORS times the static rule's split,
# runs each once alone (variables restored afterwards) and keeps the split
# whose step peaked lowest on the job's stream. On the Transformer (batch
# 40, 64 MiB pool) every candidate peaked at 39.5 or 40.8 MiB, which of the
# two changing from run to run and not with the split; chosen on 2% the two
# jobs of one run took splits of 10 and 20 MiB, and two jobs then trained
# batch 40 where the static rule's split trained 52 (benchmarks/RESULTS.md,
# Issue 20, seventh session). So a split other than the static rule's must
# peak at least SPLIT_MIN_GAIN lower to be chosen (``tuned_split`` and its
# constants are in tf_plugin/nodegroup/partition.py). Among the candidates
# within SPLIT_TIE of the lowest peak, the smallest split wins: alone they
# peak alike, but paired a finer split holds its job's peak down. Four small
# CNN jobs at batch 63 in 120 MiB (hybrid, fourteenth session): three jobs
# took 1.5 MiB splits and peaked at 100.4 MiB paired; the fourth, whose 1.5,
# 6 and 12 MiB candidates had all peaked at 99.17 MiB alone, took 12 MiB
# (the larger split won ties then) and peaked at 108.3, which put the pool
# at 119.9 of its 120 MiB. One run of a candidate is not its peak: the same
# jobs' candidates of 12 MiB and more peaked at 95.1-95.2 MiB in some runs
# and 102.5-111.0 in others (which op meets MaxPoolGrad's 31.5 MiB output is
# a race), while 1.5 MiB peaked at 94.5-94.6 in all of them; a static split
# that came out low by chance stayed and its paired steps peaked high. So
# each candidate runs SPLIT_PROBE_RUNS times and counts with its highest
# peak. The candidates' measured peaks go to
# results.json (``pool.nodegroup.split_tuning``). The candidates run
# unpaired, so a job that arrives while others train keeps the static rule
# (recorded as ``skipped``). Measured with repeats (twelfth session): two
# small CNN jobs train batch 66 tuned against 60 static (sole 65); the
# Transformer keeps the static split and is unchanged (49). The candidates
# run smallest first, and the first that runs out of memory alone ends the
# tuning: a larger split peaks alike or higher alone (``stopped`` in
# results.json says which). A job whose unplanned step does not fit the
# pool alone, which a plan must make fit (configs/hybrid.yaml: two
# Transformer encoders of 75.8 MiB unplanned in 64 MiB), ran all five
# candidates out of memory, traced and run twice each: 15-17 s a job, half
# of the shortened example's run, for the static rule's split.
SPLIT_FACTORS = (1 / 16, 1 / 4, 1 / 2, 1, 2)
SPLIT_PROBE_RUNS = 2
MIN_SPLIT_BYTES = 64 << 10


class NodeGroupCoordinator:
    """Partitions each job's step, pairs the running jobs (Algorithm 1) and
    keeps the C++ pipeline's schedule current."""

    def __init__(self, capacity: int, split_size: int | str = "auto", *, timeout_s: float = 60.0,
                 target_groups: int = 8, fragmentation_reserve: float = 0.15, pipeline=None):
        if split_size != "auto" and (not isinstance(split_size, int) or split_size <= 0):
            raise ValueError(f"split_size must be a positive byte count or 'auto', got {split_size!r}")
        self.capacity = capacity
        # Note [Fragmentation reserve]: Algorithm 1 plans for capacity * (1 - reserve).
        self.mem_limit = int(capacity * (1.0 - fragmentation_reserve))
        self.split_size = split_size
        self.target_groups = target_groups
        self.pipeline = pipeline or device_pipeline()
        self.pipeline.set_timeout(float(timeout_s))
        self._lock = threading.Lock()
        self._jobs: dict[int, _JobEntry] = {}
        self._running: set[int] = set()
        self.schedules: list[dict[str, Any]] = []
        self.partitions: dict[str, dict[str, Any]] = {}  # by job name, kept after the job ends
        self.split_tuning: dict[str, dict[str, Any]] = {}  # by job name (Note [Split size tuning])
        self._traced: dict[tuple[int, int], Partition] = {}  # (stream, split) -> the partition traced with it
        self.last_schedule: PairSchedule | None = None
        # Note [Overlap after measuring]: whether the installed schedule waits for paired steps, and
        # the temporary bytes each job was last paired with
        self._overlap_capped = False
        self._paired_with: dict[int, int] = {}

    # -------------------------------------------------------------- hooks

    def graph_transform(self, name: str, stream: int, split: int | None = None) -> Callable:
        """The trace-time transform of a job's step: partitions it into node
        groups of ``split`` bytes (default: ``split_size``, or the static
        rule's for ``auto``) and inserts the barriers."""
        def transform(fg) -> None:
            nodes, live_out = graph_nodes(fg)
            size = split if split is not None else self.split_size if self.split_size != "auto" else \
                auto_split_size(nodes, live_out=live_out, target_groups=self.target_groups)
            part = partition_graph(name, nodes, size, live_out=live_out)
            insert_barriers(fg, part, stream)
            with self._lock:
                self._traced[(stream, size)] = part
                self._jobs[stream] = _JobEntry(name, stream, part)
                self.partitions[name] = part.to_dict()
        return transform

    @property
    def tunes_split(self) -> bool:
        """Whether jobs' splits are measured (Note [Split size tuning])."""
        return self.split_size == "auto"

    def split_candidates(self, stream: int) -> tuple[int, list[int]]:
        """(the static rule's split the job was traced with, every candidate
        split to measure, that one included)."""
        with self._lock:
            base = self._jobs[stream].partition.split_size
        return base, sorted({max(MIN_SPLIT_BYTES, int(base * f)) for f in SPLIT_FACTORS} | {base})

    def choose_split(self, name: str, stream: int, base: int, peaks: dict[int, int | None]) -> int:
        """Note [Split size tuning]: ``tuned_split`` of the measured step
        peaks (``None``: that candidate failed). Its partition becomes the
        job's."""
        chosen = tuned_split(base, {s: p for s, p in peaks.items() if p is not None})
        with self._lock:
            part = self._traced[(stream, chosen)]
            self._jobs[stream] = _JobEntry(name, stream, part)
            self.partitions[name] = part.to_dict()
            self.split_tuning[name] = {"static_rule_split": base, "chosen_split": chosen,
                                       "measured_peak_bytes": {str(s): p for s, p in sorted(peaks.items())}}
            for key in [k for k in self._traced if k[0] == stream]:
                del self._traced[key]
        return chosen

    def note_split_tuning(self, name: str, **fields: Any) -> None:
        """Adds ``fields`` to the job's ``split_tuning`` record (results.json)."""
        with self._lock:
            self.split_tuning.setdefault(name, {}).update(fields)

    def job_started(self, name: str, stream: int, persistent_bytes: int | None,
                    temporary_bytes: int | None = None) -> None:
        """``persistent_bytes`` / ``temporary_bytes``: what the probe step measured.
        The measured temporary peak calibrates the partition's static estimate
        (Note [Calibrating the partition's sizes])."""
        self.jobs_started([(name, stream, persistent_bytes, temporary_bytes)])

    def jobs_started(self, jobs: list[tuple[str, int, int | None, int | None]]) -> None:
        """Several jobs start at once (name, stream, persistent and temporary
        bytes each, as ``job_started``): one schedule holds them all (Note
        [Jobs that start together join one schedule])."""
        with self._lock:
            joined = False
            for name, stream, persistent_bytes, temporary_bytes in jobs:
                entry = self._jobs.get(stream)
                if entry is None or entry.name != name or stream in self._running:
                    continue  # never traced with barriers (e.g. built before the pipeline existed), or joined
                entry.persistent_bytes = int(persistent_bytes or 0)
                entry.measured_temporary_bytes = int(temporary_bytes or 0)
                self._running.add(stream)
                joined = True
            if joined:
                self._reschedule_locked()

    def job_ended(self, name: str, stream: int | None) -> None:
        """The job leaves: its barriers are released at once, then the rest re-pair."""
        if stream is None:
            return
        with self._lock:
            # Under the lock: a concurrent re-pairing must not install a
            # version that still lists this job after it left (its partners
            # would wait for it until they time out).
            self.pipeline.leave(stream)
            for key in [k for k in self._traced if k[0] == stream]:
                del self._traced[key]
            entry = self._jobs.get(stream)
            if entry is None or entry.name != name:
                return
            del self._jobs[stream]
            if stream in self._running:
                self._running.discard(stream)
                self._reschedule_locked()

    def step_ended(self, stream: int, step_peak_bytes: int) -> None:
        """A job's step ended with its stream at ``step_peak_bytes`` at most:
        a paired step calibrates the job (Note [Overlap after measuring])."""
        with self._lock:
            entry = self._jobs.get(stream)
            if entry is None or stream not in self._running or len(self._running) < 2:
                return
            temporary = max(0, int(step_peak_bytes) - entry.persistent_bytes)
            entry.paired_steps += 1
            entry.paired_temporary_bytes = max(entry.paired_temporary_bytes, temporary)
            if not all(self._jobs[s].paired_steps > 0 for s in self._running):
                return
            if self._overlap_capped or temporary > (1 + PAIRED_PEAK_MARGIN) * self._paired_with.get(stream, 0):
                self._reschedule_locked()

    # ---------------------------------------------------------- schedule

    def _reschedule_locked(self) -> None:
        entries = [self._jobs[s] for s in sorted(self._running)]
        profiles = [e.profile() for e in entries]
        measured = all(e.paired_steps > 0 for e in entries)
        if len(profiles) < 2:
            # Alone, a job has nobody to pace; an empty schedule lets it run free.
            sched = schedule_pairs([], self.mem_limit, 1)
        else:
            split = max(e.partition.split_size for e in entries)
            sched = schedule_pairs(profiles, self.mem_limit, split, max_p=None if measured else 0)
        version = install_schedule(sched, self.pipeline)
        self.last_schedule = sched
        self._overlap_capped = len(profiles) >= 2 and not measured
        self._paired_with = {e.stream: e.temporary_bytes for e in entries}
        self.schedules.append({"version": version, "jobs": [e.name for e in entries], "p": sched.p,
                               "num_pairs": sched.num_pairs, "predicted_peak_bytes": sched.predicted_peak_bytes,
                               "fits": sched.fits, "overlap_capped": self._overlap_capped,
                               "temporary_bytes": {e.name: e.temporary_bytes for e in entries}})

    def summary(self) -> dict[str, Any]:
        with self._lock:
            parts = dict(self.partitions)
            schedules = list(self.schedules)
        stats = self.pipeline.stats()
        stats.pop("barriers", None)
        return {"split_size": self.split_size, "split_tuning": dict(self.split_tuning), "partitions": parts,
                "schedules": schedules, "runtime": stats}
