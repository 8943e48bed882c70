"""GPU Memory Peak Analysis (seed 000 §IV-B, Algorithm 1), over all jobs at once.

The seed simulates Eq. 1 (MF_j^k, the footprint after access k) per job and
then adds the per-job peaks (MP = sum MP_j). That sum assumes every job peaks at
the same instant. ``PoolTimeline`` also has the *time-aligned sum*: job j
starts at ``offset_j`` and repeats its iteration with period T_j, and the peak
is the maximum of the sum of all jobs' footprints over a horizon. When the
peaks do coincide (Fig. 3: two jobs whose peaks meet) this equals the seed's
sum; when they don't, it is lower and the planner does less work, but only
jobs that keep those offsets reach it: jobs that run free are planned by the
seed's sum (Note [Coincident peaks]), the node-group pipeline by its own rule
(Note [Paired peaks]).

Note [Coincident peaks]. The time-aligned sum only holds if the jobs keep the
offsets and step times the plan assumed, and jobs that run free side by side
do not: their threads share the cores and their phases wander from step to
step. ``PoolTimeline(coincident_peaks=True)`` is the seed's own rule instead:
the pool peak is the sum of the job peaks (MP = sum MP_j), each job analysed
at its own peak step, so the prediction holds for any alignment. It is the
default for free-running jobs (``config.PlanPeaks.for_pipeline``); the
time-aligned rule is ``run.plan_peaks: timeline``. Measured
(benchmarks/RESULTS.md, Issue 19, twenty-first session): two VGG16 jobs on the
110 MiB/s link peak in Adam's update, 64 MiB spikes a few milliseconds wide.
Time-aligned plans, made from captures whose two latency tables put those
spikes a little apart, predicted 1095.9 and 1141.6 MiB; their steps peaked at
1104.6-1199.7 and 1133.2-1174.0 as the update phases met or missed, the same
plan 95 MiB apart from one step to the next, and the 12-64 MiB of variables a
step they swapped bought nothing at the steps where the phases met. Planned
for the sum of the peaks, the same row predicted 1199.1 and 1192.5 and peaked
at most at 1199.2 and 1192.7. On saved two-job captures of the Transformer,
ResNet50 and DenseNet121 the two rules' plans reach the same sum of job peaks
(within 2%): what the time-aligned rule saves beyond it is a bet on alignment.
(Earlier, on two Transformer jobs, the sum rule did not close the gap between
predicted and measured two-job peaks; the error there was each job's own
peak, which roughly doubled beside the other: 8.5 MiB alone, 15-18 MiB in
pairs, for a plan of 8-14.)

Note [Paired peaks]. Under the node-group pipeline (seed 004, Algorithm 1)
the jobs do not run freely side by side: only the two node groups of the
current pair run, and the pipeline lays the jobs out so that each one runs its
allocating groups and then at once its freeing groups; a job that is not in
the running pair holds about its floor (its footprint between iterations:
parameters, slots, inputs). ``PoolTimeline(coincident_peaks=True,
peaking_jobs=k)`` plans for that: the pool peak is the sum of every job's
floor plus the k largest peaks above a floor, each job analysed at its own
peak step (the others at their floor step). Two k's, both measured
(benchmarks/RESULTS.md, Issue 20, eighth session):
- Whether the unplanned steps fit the budget: k = UNPLANNED_PAIRED_PEAKING_JOBS
  = 1. Unplanned node-group jobs peak at every floor plus one job's peak:
  small CNN x2 at batch 48, 104.6 MiB for 2 x 5.5 + (94.9 - 5.5) = 100.4
  (two peaks: about 195); x4 at batch 40, 112.1 for about 108; Transformer x4
  at batch 36, 61.2 for about 58. With k = 2 for this test too (two jobs: the coincident
  rule), the hybrid planned two small CNN jobs at batch 48 for 191.9 MiB
  against a 90 MiB budget, applied eleven small swaps per job ("no swap or
  recomputation succeeded") and both failed where the pipeline alone
  trained batch 50.
- What a plan makes room for: k = PAIRED_PEAKING_JOBS = 2. Planning for one
  peak, two Transformer jobs (64 MiB) trained batch 84 together; for two
  peaks, 96 (why planned steps need that room was not analysed).
With four jobs k = 2 also stops asking each job to fit a quarter of what the
floors leave, which no swap plan can reach.

Note [Free-running steps]. A planned step runs its ops one after another in
plan order (Note [Plan order] in tensile_tf/tf/rewrite/rewriter.py); an unplanned step
runs free on the executor's inter-op threads, which holds more at some ops
(ops beside it) and less at others (ops the order leaves waiting run sooner
and free their inputs). ``JobFootprint.base`` is the first: the planner
plans on it. ``JobFootprint.free_running`` adds each op's
``concurrent_bytes`` (observed in traced steps, Note [Concurrent scratch] in
tensile_tf/tf/step_memory.py) and is the vanilla footprint: the predicted vanilla
peak, MSR's reference, and what a job whose plan changes nothing holds. A
plan with no events still runs its job in plan order when that lowers the
job's peak, or when its unplanned step was seen to run out of memory where
it is planned (``PlannerJob.unplanned_step_ran_out``, a cold start: the cold
capture cannot see the concurrency) (``JobPlan.order_only``): on the node-group CNN the free-running
step peaks at 89 MiB in some steps and the ordered one at 60. The planner's
loop judges the budget on every job's ordered footprint, so when letting
its event-free jobs run free would put the pool back above a budget the loop
met, every job runs in plan order (seen: two MLPs planned for 80 MiB, one
with five swaps and one without, 86.3 MiB with the second free-running vs
76-78 MiB ordered; the plan reported "budget met" but missed it).

Note [Free-order plans]. Plan order costs inter-op parallelism, and on
InceptionV3 that is most of a planned step's extra time: 75x75, batch 48, 2
cores, the unplanned step took 0.97-1.07 s, the same step re-imported with no
events 1.38-1.53 s chained in plan order and 0.99-1.15 s unchained
(benchmarks/RESULTS.md, Issue 19, tenth session). A plan made with
``Planner(step_order="free")`` is applied without the plan-order chain
(``JobPlan.step_order``; the swap and recompute anchors stay, so every
transfer still starts after its trigger op and every consumer still reads
the swapped-in or recomputed tensor). Its footprint starts from the
free-running one (``base`` plus each op's observed ``concurrent_bytes``) and
the plan's absences come off that, so the prediction carries what the
executor's threads add beside each op, as the vanilla prediction does; swaps
cannot take that concurrency off. Swap anchors fire earlier or later on free
threads than in plan order, which the model does not see. Measured (largest
batch in a 326 MiB pool, planned for 85% of it): InceptionV3 at 2-4x its
batch peaked 209-267 MiB at time ratios 0.89-1.27 free, against 275-278 MiB
at 1.53-1.72 in plan order. The Transformer's free-order plan at 2x could
not meet its budget (its observed concurrency is more than swaps remove) and
peaked 22.9 MiB in a 20.3 MiB pool; in plan order 17.4. On the capped link
(110 MiB/s) InceptionV3's free-order plan, 80 MiB of swaps a step and 89
recomputed ops, predicted 4.7% below the unplanned peak and measured 19%
above it: its trigger ops, free of the chain, run as soon as their inputs
exist, so transfers and recomputations start far earlier than planned. Hence
"auto" (``plan_in_step_order``): the free-order plan when it meets the budget
by swaps alone, else the plan-order one. The default stays "plan": its peak
lands where predicted.

Note [op-granular footprint]. A job's footprint is held per step (op): F[k] is
the bytes resident while step k runs: every live tensor, the step's outputs
and scratch. A tensor lives from its TGA step to its last access step
(activity analysis, Algorithm 3 line 2); persistent tensors (inputs,
parameters, slots) live for the whole iteration. Plan events remove bytes over
half-open step ranges ("absences"). The rounding is conservative: a swap-in
counts from the step during which it *starts* (its destination buffer is
allocated then; the seed counts it at its end, §IV-B item 3), and a swap-out
frees only after the step during which it *ends* (§IV-B item 4).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.incremental_pool_sum import IncrementalPoolSum


class JobFootprint:
    """MF_j^k (Eq. 1) for every step k of one job, vanilla and with the plan's absences.
    ``free_order``: the planned step runs free on the executor's threads, so
    the plan's footprint ``F`` starts from the free-running one (Note
    [Free-order plans])."""

    def __init__(self, tas: TensorAccessSequence, free_order: bool = False):
        self.tas = tas
        n = tas.n
        diff = np.zeros(n + 1, dtype=np.int64)
        alive = tas.last >= 0
        np.add.at(diff, tas.first[alive], tas.size[alive])
        np.add.at(diff, tas.last[alive] + 1, -tas.size[alive])
        self.base = np.cumsum(diff[:-1]) + tas.temp
        #: Note [Free-running steps]: the unplanned step on the executor's threads
        self.free_running = self.base + tas.concurrent
        self.F = (self.free_running if free_order else self.base).copy()
        self.absences: dict[int, list[tuple[int, int]]] = {}
        self._abs_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add_absence(self, i: int, lo_u: int, hi_u: int) -> list[tuple[int, int]]:
        """Tensor i is not on the device over unrolled steps [lo_u, hi_u); returns the local ranges."""
        ranges = self._local_ranges(i, lo_u, hi_u)
        size = int(self.tas.size[i])
        plain = self._frees_every_step(i)
        for a, b in ranges:
            if b > a:
                self.F[a:b] -= size if plain else size * self._freed_by_absence(i, a, b)
        self.absences.setdefault(i, []).extend(r for r in ranges if r[1] > r[0])
        self._abs_arrays = None
        return ranges

    def add_absences(self, absences: Sequence[tuple[int, int, int]]) -> list[list[tuple[int, int]]]:
        """``add_absence(i, lo_u, hi_u)`` for each of ``absences``, in order, the same ``F`` and
        ``absences``: the buffers every step of theirs frees summed in one pass (a plan's copies
        add thousands, Note [Identical jobs planned by representatives])."""
        diff = np.zeros(self.tas.n + 1, dtype=np.int64)
        out = []
        for i, lo_u, hi_u in absences:
            ranges = self._local_ranges(i, lo_u, hi_u)
            if not self._frees_every_step(i):
                out.append(self.add_absence(i, lo_u, hi_u))
                continue
            size = int(self.tas.size[i])
            for a, b in ranges:
                if b > a:
                    diff[a] -= size
                    diff[b] += size
            self.absences.setdefault(i, []).extend(r for r in ranges if r[1] > r[0])
            out.append(ranges)
        self.F += np.cumsum(diff[:-1])
        self._abs_arrays = None
        return out

    def _local_ranges(self, i: int, lo_u: int, hi_u: int) -> list[tuple[int, int]]:
        """The local step ranges of an absence over unrolled steps [lo_u, hi_u) (two where it wraps)."""
        n = self.tas.n
        if hi_u - lo_u >= n:
            raise ValueError(f"absence of {self.tas.tensor_names[i]!r} spans a whole iteration")
        q = lo_u // n
        lo, hi = lo_u - q * n, hi_u - q * n
        return [(lo, hi)] if hi <= n else [(lo, n), (0, hi - n)]

    def remove_absence(self, i: int, ranges: list[tuple[int, int]]) -> None:
        size = int(self.tas.size[i])
        lst = self.absences.get(i, [])
        plain = self._frees_every_step(i)
        for a, b in ranges:
            if b > a:
                self.F[a:b] += size if plain else size * self._freed_by_absence(i, a, b)
                lst.remove((a, b))
        self._abs_arrays = None

    def absence_delta(self, i: int, ranges: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray | int]:
        """(steps, bytes): what ``remove_absence(i, ranges)`` would add to ``F`` at which local
        steps, sorted, nothing changed; the bytes one int where they are the same at every step
        (the tensor's size: ``_frees_every_step``)."""
        size = int(self.tas.size[i])
        parts = sorted((a, b) for a, b in ranges if b > a)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        steps = np.arange(*parts[0]) if len(parts) == 1 else np.concatenate([np.arange(a, b) for a, b in parts])
        if self._frees_every_step(i):
            return steps, size
        return steps, np.concatenate([size * self._freed_by_absence(i, a, b) for a, b in parts])

    def _frees_every_step(self, i: int) -> bool:
        """Whether tensor i's absence frees its buffer at every step (no view of it, none it took
        over): ``_freed_by_absence`` all ones, not made."""
        return i not in self.tas.handed_over and not self.tas.view_spans.get(i)

    def _freed_by_absence(self, i: int, a: int, b: int) -> np.ndarray:
        """1 for the steps of [a, b) where tensor i's absence frees its
        buffer, 0 where a view of it holds the buffer (Note [Views]) or, for a
        view that takes its owner's buffer, before it does (Note [View takes
        the buffer] in access_sequence)."""
        freed = np.ones(b - a, dtype=np.int64)
        if i in self.tas.handed_over:
            freed[:max(0, min(b, int(self.tas.first[i])) - a)] = 0
        for first, last in self.tas.view_spans.get(i, ()):
            lo, hi = max(first, a), min(last + 1, b)
            if hi > lo:
                freed[lo - a:hi - a] = 0
        return freed

    def is_absent(self, i: int, k: int) -> bool:
        k %= self.tas.n
        return any(a <= k < b for a, b in self.absences.get(i, ()))

    def resident_at(self, k: int) -> np.ndarray:
        """Indices of tensors on the device while step k runs (in_gpu_tensors of Algorithm 1)."""
        tas = self.tas
        idx = np.flatnonzero((tas.first <= k) & (tas.last >= k))
        if self.absences:
            if self._abs_arrays is None:
                rows = [(i, a, b) for i, lst in self.absences.items() for a, b in lst]
                arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
                self._abs_arrays = (arr[:, 0], arr[:, 1], arr[:, 2])
            t, lo, hi = self._abs_arrays
            gone = t[(lo <= k) & (k < hi)]
            if len(gone):
                idx = idx[~np.isin(idx, gone)]
        return idx

    @property
    def vanilla_peak(self) -> int:
        """The unplanned step's peak (Note [Free-running steps])."""
        return int(self.free_running.max()) if self.tas.n else 0

    @property
    def ordered_peak(self) -> int:
        """The peak of the step run one op at a time in plan order, without events."""
        return int(self.base.max()) if self.tas.n else 0

    @property
    def peak(self) -> int:
        return int(self.F.max()) if self.tas.n else 0



#: Note [Paired peaks]: how many jobs' peaks above their floors a plan for the node-group pipeline
#: makes room for, and how many meet while no job runs a plan (whether the pipeline needs one).
PAIRED_PEAKING_JOBS = 2
UNPLANNED_PAIRED_PEAKING_JOBS = 1

class PoolTimeline:
    """The global time axis of all jobs (Algorithm 1's time_axis, merged across jobs).

    Grid points are every step start of every job over [0, horizon_s]; on each
    grid segment each job runs exactly one step (or has not started yet). The
    pool footprint on a segment is the sum of the running steps' F values.

    Note [Jobs that run alike share their grid index]
    Jobs whose steps start at the same times (one start array: copies of one
    sequence, Note [Identical jobs planned by representatives]) with the same
    period and offset run the same step at every grid point, so their repeats
    are worked out, merged into the grid and indexed once, and they share one
    index array (``IncrementalPoolSum`` inverts it once too). 16 ResNet50
    jobs: three timelines a plan, each sorting 16 copies of the same times.
    The grid and every job's index are what they were.
    """

    def __init__(self, seqs: Sequence[TensorAccessSequence], offsets: Sequence[float],
                 horizon_iterations: float = 2.0, *, coincident_peaks: bool = False,
                 peaking_jobs: int | None = None):
        self.coincident_peaks = coincident_peaks  # Note [Coincident peaks]
        if peaking_jobs is not None and (not coincident_peaks or peaking_jobs < 1):
            raise ValueError("peaking_jobs needs coincident_peaks and must be >= 1")
        self.peaking_jobs = peaking_jobs  # Note [Paired peaks]: None = every job
        if len(seqs) != len(offsets):
            raise ValueError("one start offset per job")
        periods = [s.period_s for s in seqs]
        if any(p <= 0 for p in periods):
            bad = [s.job for s in seqs if s.period_s <= 0]
            raise ValueError(f"jobs {bad} have zero predicted iteration time; check the latency table")
        self.offsets = [float(o) for o in offsets]
        self.periods = periods
        self.horizon_s = self.horizon(self.offsets, periods, horizon_iterations)
        # Note [Jobs that run alike share their grid index]
        alike = [(id(s.start), s.period_s, s.n, o) for s, o in zip(seqs, self.offsets)]
        times: dict[tuple, np.ndarray] = {}
        for s, o, key in zip(seqs, self.offsets, alike):
            if key not in times:
                reps = max(1, math.ceil((self.horizon_s - o) / s.period_s) + 1)
                times[key] = (o + np.arange(reps)[:, None] * s.period_s + s.start[None, :]).ravel()
        grid = np.unique(np.concatenate([*times.values(), [0.0]]))
        self.grid = grid[grid <= self.horizon_s]
        local_of: dict[tuple, np.ndarray] = {}
        for key, t in times.items():
            flat = np.searchsorted(t, self.grid, side="right") - 1
            local_of[key] = np.where(flat >= 0, flat % key[2], key[2])  # n: the padding slot, 0 bytes
        #: per job, the local step it runs at each grid point (one array for jobs that run alike: read only)
        self.idx: list[np.ndarray] = [local_of[key] for key in alike]
        self.ns = [s.n for s in seqs]

    @staticmethod
    def horizon(offsets: Sequence[float], periods: Sequence[float], iterations: float) -> float:
        """Seconds the timeline spans: the last start plus ``iterations`` of the longest period."""
        return max(offsets) + iterations * max(periods)

    def pool_footprint(self, footprints: Sequence[np.ndarray]) -> np.ndarray:
        """The time-aligned sum of the jobs' footprints on the grid (Note [Incremental pool footprint]
        in scheduler.incremental_pool_sum: kept, and updated by what changed since it was last asked)."""
        return self.pool_sum.footprint(footprints)

    @property
    def pool_sum(self) -> IncrementalPoolSum:
        kept = self.__dict__.get("_pool_sum")
        if kept is None:
            kept = self.__dict__["_pool_sum"] = IncrementalPoolSum(self.idx, self.ns)
        return kept

    def pool_peak(self, footprints: Sequence[np.ndarray]) -> int:
        """The pool peak the plan must bring under its budget: the largest
        time-aligned sum, or with coincident peaks the sum of the job peaks
        (with ``peaking_jobs``: of the largest ones above every job's floor)."""
        if self.coincident_peaks:
            return sum(int(footprints[j][k]) for j, k in self.peak_steps(footprints).items())
        return self.pool_sum.peak(footprints)

    def pool_peak_if_added(self, footprints: Sequence[np.ndarray], j: int, steps: np.ndarray,
                           delta: np.ndarray | int) -> int | None:
        """``pool_peak`` were job j's footprint ``delta`` >= 0 higher at its local ``steps``,
        nothing changed (IncrementalPoolSum.peak_if_added); None with coincident peaks (their
        sum of job peaks is not asked this way)."""
        if self.coincident_peaks:
            return None
        return self.pool_sum.peak_if_added(footprints, j, steps, delta)

    def peak_steps(self, footprints: Sequence[np.ndarray]) -> dict[int, int]:
        """Coincident peaks: the step each job is at when the pool peaks: its
        own peak step, or with ``peaking_jobs`` (Note [Paired peaks]) its floor
        step unless it is one of the ``peaking_jobs`` largest above a floor."""
        live = [j for j, F in enumerate(footprints) if len(F)]
        steps = {j: int(np.argmax(footprints[j])) for j in live}
        if self.peaking_jobs is not None and len(live) > self.peaking_jobs:
            floor = {j: int(np.argmin(footprints[j])) for j in live}
            excess = sorted(live, key=lambda j: (-(int(footprints[j][steps[j]]) - int(footprints[j][floor[j]])), j))
            for j in excess[self.peaking_jobs:]:
                steps[j] = floor[j]
        return steps


@dataclass
class PeakAnalysis:
    """Algorithm 1's outputs for the pool: MP, MPTensor, LUA, MPTime, plus per-job peaks."""

    peak_bytes: int
    peak_time_s: float
    job_steps: dict[int, int]                    # job index -> step running at the peak
    mpt: dict[int, np.ndarray]                   # job index -> tensor indices resident at the peak
    last_access_step: dict[int, int]             # LUA: per job, the last step finished before the peak
    job_peaks: list[int]                         # MP_j: each job's own peak
    job_bytes_at_peak: list[int] = field(default_factory=list)


def gpu_memory_peak_analysis(footprints: Sequence[JobFootprint], timeline: PoolTimeline,
                             *, with_tensors: bool = True) -> PeakAnalysis:
    """Algorithm 1 (GPU_Memory_Peak_Analysis) on the time-aligned sum of all jobs.

    Returns the pool peak, its time, the step each job runs then, and the
    tensors resident at that moment (MPTensor), which Algorithm 2 tries to swap.
    """
    steps: dict[int, int] = {}
    at_peak: list[int] = []
    if timeline.coincident_peaks:  # Note [Coincident peaks], Note [Paired peaks]
        peak_time = 0.0
        steps = timeline.peak_steps([f.F for f in footprints])
        at_peak = [int(f.F[steps[j]]) if j in steps else 0 for j, f in enumerate(footprints)]
        peak_bytes = sum(at_peak)
    else:
        fs = [f.F for f in footprints]
        seg = timeline.pool_sum.argmax(fs)     # Note [Incremental pool footprint]
        peak_bytes, peak_time = timeline.pool_sum.peak(fs), float(timeline.grid[seg])
        for j, (f, idx) in enumerate(zip(footprints, timeline.idx)):
            k = int(idx[seg])
            if k < f.tas.n:
                steps[j] = k
                at_peak.append(int(f.F[k]))
            else:
                at_peak.append(0)
    mpt: dict[int, np.ndarray] = {}
    if with_tensors:
        for j, k in steps.items():
            mpt[j] = footprints[j].resident_at(k)
    return PeakAnalysis(
        peak_bytes=peak_bytes, peak_time_s=peak_time, job_steps=steps, mpt=mpt,
        last_access_step={j: k - 1 for j, k in steps.items()},
        job_peaks=[f.peak for f in footprints], job_bytes_at_peak=at_peak)
