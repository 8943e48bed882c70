"""Pairing node groups across jobs: Waterwave's scheduling algorithm
(seed 004 §4.4, Algorithm 1), generalised to N jobs and to jobs that come and
go between iterations.

The output is two *streams* of node groups, ``av`` and ``dv``; the groups at
the same index form a *node group pair* and run side by side, and pair i+1
starts only when pair i has finished (a CounterBarrier sits between them).
Pure: no TensorFlow, no threads.

Algorithm 1, as the seed gives it:

1. sort the jobs ("descending order of their node groups' sizes");
2. ``p = (mem_limit - f_peakMem) / split_size - 1``: how many ANGs of the
   second job run beside the first job's ANGs ("minus one because we want a
   DNG to finish first so that the memory is freed for the next ANG");
3. the first job's ANGs fill ``av`` from 0; the second job's first ``p``
   ANGs go to ``dv`` ending where the first job's ANGs end (``offset``);
   every other ANG goes to ``av`` after them;
4. DNGs go to ``dv`` from ``f_numANG`` on, except the last job's, which take
   free places in ``av`` first (``idx2 > idx1``) for parallelism.

Note [What the generalisation changes]
* Memory other jobs hold for good (their persistent bytes) is taken off
  ``mem_limit`` before ``p`` is computed: with N jobs the pool holds every
  job's parameters, not only the first's.
* A placement never goes before the job's previous group (its groups must
  run in order) nor onto an occupied place; for two equal jobs this never
  triggers and the output is the seed's. Without it, jobs of unequal length
  (e.g. a short first job and a long last one) would get a DNG scheduled
  before their own last ANG.
* ``p`` is clamped to [0, min(numANG of both jobs)], then lowered while the
  schedule's predicted peak (``predict_peak``) exceeds ``mem_limit``: the
  seed's formula assumes groups of exactly ``split_size``; real groups vary.
* Pairs left empty are dropped.
* Jobs arriving or leaving: the schedule is a pure function of the current
  job set; the runtime installs a new one as a new *version*, and each job
  switches to it at the start of its next iteration (see counter_barrier.h).
* With ``p = 0`` the seed packs every job's ANGs into ``av`` back to back,
  so job k allocates while job k-1 only starts to free. Where the jobs free
  in more groups than they allocate in, the DNGs queue in ``dv`` and the
  levels pile up (``test_four_jobs_are_staggered_where_the_seeds_packing_piles_up``:
  118 packed, 58 staggered). Where even ``p = 0`` does not fit, Note
  [Staggering N jobs] delays each later job's ANGs.
* Iterations form a ring: pair 0 of a job's next iteration waits for the last
  pair of the current one (the runtime's CounterBarrier 0 wraps around), so
  the predicted peak of one iteration holds in steady state.

Note [Staggering N jobs]
Algorithm 1 staggers two jobs by one number, ``p``. For N jobs each job k
after the first gets its own delay: ``av`` leaves that many places empty
before job k's first ANG, so its allocating groups run beside later DNGs of
the jobs before it (the ones that free more). The delays are chosen in
Algorithm 1's order, greedily: job k takes the fewest empty places for which
the predicted peak of jobs 0..k fits ``mem_limit``, or, where none fits, the
delay with the lowest predicted peak. An empty place beside an empty place is
dropped by the compaction, so a delay only ever pairs ANGs with later DNGs.
The price is pairs: a delayed job's groups run beside fewer groups of other
jobs, so the jobs overlap less in time. Schedules that fit at ``p = 0`` are
unchanged (the seed's, for two equal jobs), and a stagger that would not
predict less than the packing is not used. No schedule goes below one job's
own peak plus every job's persistent bytes: four small CNN jobs at batch 55
in 120 MiB predict 127.3 MiB packed and 122.8 staggered, that floor
(benchmarks/RESULTS.md, Issue 20, twelfth session: four jobs by node groups
alone train at that ceiling).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

from tf_plugin.nodegroup.partition import Partition


@dataclass(frozen=True)
class NodeGroupRef:
    """{node group id, job_id}: one unique node group (Algorithm 1)."""

    job_id: int
    group: int


@dataclass(frozen=True)
class JobProfile:
    """What Algorithm 1 knows of a job: its groups and its memory."""

    job_id: int
    name: str
    num_ang: int
    persistent_bytes: int
    start_bytes: tuple[int, ...]    # per group: temporary bytes before it
    peak_bytes: tuple[int, ...]     # per group: temporary bytes at most during it
    end_bytes: tuple[int, ...]      # per group: temporary bytes after it

    @property
    def num_groups(self) -> int:
        return len(self.peak_bytes)

    @property
    def peak_mem(self) -> int:
        """peakMem: persistent plus the temporary peak."""
        return self.persistent_bytes + max(self.peak_bytes, default=0)

    @classmethod
    def from_partition(cls, job_id: int, partition: Partition) -> "JobProfile":
        g = partition.groups
        return cls(job_id, partition.job, partition.num_ang, partition.persistent_bytes,
                   tuple(x.start_bytes for x in g), tuple(x.peak_bytes for x in g),
                   tuple(x.end_bytes for x in g))

    @classmethod
    def uniform(cls, job_id: int, name: str, num_ang: int, num_dng: int, split_size: int,
                persistent_bytes: int = 0) -> "JobProfile":
        """A job whose ANGs each allocate and whose DNGs each free ``split_size``."""
        levels = [split_size * (i + 1) for i in range(num_ang)]
        top = levels[-1] if levels else 0
        levels += [max(0, top - split_size * (i + 1)) for i in range(num_dng)]
        starts = [0] + levels[:-1]
        return cls(job_id, name, num_ang, persistent_bytes, tuple(starts),
                   tuple(max(s, e) for s, e in zip(starts, levels)), tuple(levels))


@dataclass
class PairSchedule:
    """Two streams of node groups; ``pairs[i] = (av[i], dv[i])``."""

    av: list[NodeGroupRef | None]
    dv: list[NodeGroupRef | None]
    order: list[int]                 # job ids, Algorithm 1's order
    names: dict[int, str]
    p: int                           # ANGs of the second job beside the first's
    p_formula: int                   # p as the seed's line 4 gives it (before clamping)
    split_size: int
    mem_limit: int
    predicted_peak_bytes: int
    pair_of_group: dict[int, list[int]] = field(default_factory=dict)

    @property
    def num_pairs(self) -> int:
        return len(self.av)

    @property
    def fits(self) -> bool:
        return self.predicted_peak_bytes <= self.mem_limit

    def pairs(self) -> list[tuple[NodeGroupRef | None, NodeGroupRef | None]]:
        return list(zip(self.av, self.dv))

    def validate(self) -> None:
        """Raises ValueError unless every job's groups appear once each, in order."""
        seen: dict[int, list[tuple[int, int]]] = {}
        for i, pair in enumerate(self.pairs()):
            if pair[0] is None and pair[1] is None:
                raise ValueError(f"pair {i} is empty")
            for ref in pair:
                if ref is not None:
                    seen.setdefault(ref.job_id, []).append((i, ref.group))
            if pair[0] and pair[1] and pair[0].job_id == pair[1].job_id:
                raise ValueError(f"pair {i} holds two groups of job {pair[0].job_id}")
        for job, places in seen.items():
            groups = [g for _, g in places]
            if groups != list(range(len(groups))):
                raise ValueError(f"job {job}: groups scheduled as {groups}, not 0..{len(groups) - 1} in order")
            if [i for i, _ in places] != self.pair_of_group.get(job):
                raise ValueError(f"job {job}: pair_of_group disagrees with the streams")

    def to_dict(self) -> dict:
        def ref(r):
            return None if r is None else [r.job_id, r.group]
        return {"av": [ref(r) for r in self.av], "dv": [ref(r) for r in self.dv], "order": self.order,
                "names": {str(k): v for k, v in self.names.items()}, "p": self.p, "p_formula": self.p_formula,
                "split_size": self.split_size, "mem_limit": self.mem_limit,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "pair_of_group": {str(k): v for k, v in self.pair_of_group.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def render(self) -> str:
        """The two streams as text, one pair per line: ``  3  a.2 | b.0``."""
        def cell(r):
            return "-" if r is None else f"{self.names.get(r.job_id, r.job_id)}.{r.group}"
        return "\n".join(f"{i:3d}  {cell(a):>12} | {cell(d)}" for i, (a, d) in enumerate(self.pairs()))


def _order(jobs: Sequence[JobProfile]) -> list[JobProfile]:
    # "descending order of their node groups' sizes": more groups first, then
    # the larger peak, then the smaller id (stable across re-plans).
    return sorted(jobs, key=lambda j: (-j.num_groups, -j.peak_mem, j.job_id))


def _build_streams(order: Sequence[JobProfile], p: int, delays: Sequence[int] = ()
                   ) -> tuple[dict[int, NodeGroupRef], dict[int, NodeGroupRef]]:
    """Algorithm 1's lines 5-21; ``delays[k]``: places ``av`` leaves empty
    before job k's first ANG (Note [Staggering N jobs])."""
    av: dict[int, NodeGroupRef] = {}
    dv: dict[int, NodeGroupRef] = {}
    first = order[0]
    offset = first.num_ang - p
    idx1, idx2 = 0, first.num_ang
    for k, job in enumerate(order):
        last = -1  # pair of the job's previous group
        idx1 += delays[k] if k < len(delays) else 0

        def put(stream: dict[int, NodeGroupRef], idx: int, group: int) -> int:
            nonlocal last
            idx = max(idx, last + 1)
            while idx in stream:
                idx += 1
            stream[idx] = NodeGroupRef(job.job_id, group)
            last = idx
            return idx + 1

        i = 0
        if k == 1:  # isSecondJob: its first p ANGs run beside the first job's ANGs
            for i in range(p):
                offset = put(dv, offset, i)
            i = p
        for g in range(i, job.num_ang):
            idx1 = put(av, idx1, g)
        is_last = k == len(order) - 1
        for g in range(job.num_ang, job.num_groups):
            if is_last and idx2 > idx1:
                idx1 = put(av, idx1, g)
            else:
                idx2 = put(dv, idx2, g)
    return av, dv


def _compact(av: dict[int, NodeGroupRef], dv: dict[int, NodeGroupRef]) -> tuple[list, list]:
    used = sorted(set(av) | set(dv))
    return [av.get(i) for i in used], [dv.get(i) for i in used]


def predict_peak(av: Sequence[NodeGroupRef | None], dv: Sequence[NodeGroupRef | None],
                 jobs: Sequence[JobProfile]) -> int:
    """Pool bytes at most while the pairs run in sequence: every job's
    persistent bytes, plus for each pair the peak of the groups running in it
    and the level the other jobs are at (0 before their first group)."""
    by_id = {j.job_id: j for j in jobs}
    level = {j.job_id: 0 for j in jobs}
    persistent = sum(j.persistent_bytes for j in jobs)
    peak = persistent
    for a, d in zip(av, dv):
        active = {r.job_id: r.group for r in (a, d) if r is not None}
        total = persistent
        for job_id, j in by_id.items():
            total += j.peak_bytes[active[job_id]] if job_id in active else level[job_id]
        peak = max(peak, total)
        for job_id, g in active.items():
            level[job_id] = by_id[job_id].end_bytes[g]
    return peak


def stagger_delays(order: Sequence[JobProfile], mem_limit: int) -> list[int]:
    """Note [Staggering N jobs]: for each job after the first, in order, the
    fewest empty ``av`` places before its first ANG that keep the predicted
    peak of the jobs placed so far within ``mem_limit``; where no delay fits,
    the one with the lowest predicted peak (the smallest among equals)."""
    delays = [0] * len(order)
    horizon = sum(j.num_groups for j in order)   # a longer delay only adds empty pairs
    for k in range(1, len(order)):
        placed = order[:k + 1]
        best = None
        for d in range(horizon + 1):
            delays[k] = d
            peak = predict_peak(*_compact(*_build_streams(placed, 0, delays[:k + 1])), placed)
            if best is None or peak < best[0]:
                best = (peak, d)
            if peak <= mem_limit:
                break
        delays[k] = best[1]
    return delays


def schedule_pairs(jobs: Sequence[JobProfile], mem_limit: int, split_size: int, *,
                   adjust_p: bool = True, max_p: int | None = None) -> PairSchedule:
    """Algorithm 1 (see the module docstring and Note [What the generalisation changes]).
    ``max_p``: at most this much overlap (the host's Note [Overlap after measuring])."""
    if split_size <= 0:
        raise ValueError(f"split_size must be positive, got {split_size}")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"job ids must be unique, got {ids}")
    jobs = [j for j in jobs if j.num_groups > 0]
    names = {j.job_id: j.name for j in jobs}
    if not jobs:
        return PairSchedule([], [], [], names, 0, 0, split_size, mem_limit, 0, {})
    order = _order(jobs)
    first = order[0]
    others_persistent = sum(j.persistent_bytes for j in order[1:])
    p_formula = (mem_limit - others_persistent - first.peak_mem) // split_size - 1
    p = 0
    if len(order) > 1:
        p = max(0, min(p_formula, order[1].num_ang, first.num_ang))
        if max_p is not None:
            p = min(p, max(0, max_p))
    while True:
        av, dv = _compact(*_build_streams(order, p))
        peak = predict_peak(av, dv, order)
        if not adjust_p or p == 0 or peak <= mem_limit:
            break
        p -= 1
    if adjust_p and p == 0 and peak > mem_limit and len(order) > 1:
        # Note [Staggering N jobs]
        staggered = _compact(*_build_streams(order, 0, stagger_delays(order, mem_limit)))
        staggered_peak = predict_peak(*staggered, order)
        if staggered_peak < peak:
            (av, dv), peak = staggered, staggered_peak
    pair_of_group: dict[int, list[int]] = {j.job_id: [] for j in order}
    for i, (a, d) in enumerate(zip(av, dv)):
        for r in (a, d):
            if r is not None:
                pair_of_group[r.job_id].append(i)
    sched = PairSchedule(av, dv, [j.job_id for j in order], names, p, p_formula, split_size,
                         mem_limit, peak, pair_of_group)
    sched.validate()
    return sched
