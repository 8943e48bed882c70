"""The swap link's ceiling, the lowest pool peak any swap-only plan could reach,
and the floor under every plan.

Issue 19 asks every capped-link MSR to be read as a share of the physical
limit. Two limits, both upper bounds on what swapping alone can take off the
peak (recomputation can pass them):

* **Link bound, bandwidth x period** (``bandwidth_bound_bytes``): every byte
  kept off the device at the peak went out and came back within one
  iteration over the one link, so at most ``bandwidth * T / 2`` bytes are
  absent at any moment. With a lane per direction (Note [A lane per
  direction] in tensile_tf/scheduler/swap_scheduling.py) the outs have a
  lane of their own: every byte absent at an instant went out within the
  period before it, so at most ``bandwidth * T``. It ignores *when* the
  link is free.

* **Deadline-aware link bound** (``swap_link_bound``): a tensor absent
  while step k runs was swapped out after its last write before k and
  before k starts, and is swapped back after k ends and before its next
  access. With the link moving ``bandwidth`` bytes a second, the tensors
  whose out-window is at most rho long fit their outs into the rho seconds
  before k only if their bytes are at most ``bandwidth * rho``; likewise the
  ins after k. Relaxing each tensor to a fraction, the most bytes absent at
  step k (``A(k)``) is at most the smallest of three maxima: over the out
  side's nested constraints, over the in side's, and the bandwidth x period
  bound. Each side is one lane's: on one lane both sides use the same link
  (each bound alone still holds), on two the out lane's and the in lane's.
  The out side's maximum has the closed form of a nested (laminar) family:

      OutCap(k) = min over rho in {0} + {r_i}: bandwidth * rho + sum of s_i with r_i > rho

  (the min-cut of the bipartite flow from tensors to link time). The pool
  peak of any swap-only plan is at least ``max_k (F(k) - A(k))``, F the
  planned-order footprint, unswappable bytes and scratch included.

And one floor under every plan, swaps and recomputation on any link
(``working_set_floor``): at each step a job holds at least what the step
reads and writes, its scratch, and every tensor no plan moves. A batch whose
floor is above the pool trains under no method; the batch-multiplier runs
report it beside each method's measured peak.

The link bounds are per job's own time axis; for several jobs sharing one
link each pool grid point gathers every job's resident tensors into one sum,
with one link (its lanes). ``bandwidth`` is a lane's rate: the each-way
rate, at most the combined cap over the lanes (``lane_bandwidth``). The
floor holds whatever the jobs' alignment (Note [Floor
whatever the alignment]). This module plans nothing;
benchmarks/baseline_suite.py reports a plan's MSR as a share of both.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.peak_analysis import JobFootprint, PoolTimeline
from tensile_tf.scheduler.planner import PlannerJob
from tensile_tf.scheduler.swap_channel import lane_bandwidth


@dataclass
class LinkBound:
    """What the link allows: peaks in bytes (predicted vanilla = free-running)."""

    vanilla_peak_bytes: int
    bandwidth_bound_peak_bytes: int      # vanilla peak - bandwidth * T / 2 (two lanes: bandwidth * T)
    deadline_bound_peak_bytes: int       # max over the pool grid of F - A
    bound_step: dict[str, str]           # job -> the step where the deadline bound binds
    lanes: int = 1                       # the link's lanes (Note [A lane per direction])

    def msr(self, peak: int) -> float:
        return (self.vanilla_peak_bytes - peak) / self.vanilla_peak_bytes

    @property
    def bandwidth_bound_msr(self) -> float:
        return self.msr(self.bandwidth_bound_peak_bytes)

    @property
    def deadline_bound_msr(self) -> float:
        return self.msr(self.deadline_bound_peak_bytes)


def nested_capacity(window_s: np.ndarray, size: np.ndarray, bandwidth: float) -> float:
    """The most bytes of tensors (fractions allowed) whose transfers fit, when a
    tensor with window w must move within the w seconds next to one shared
    instant: min over rho in {0, w_i} of bandwidth * rho + bytes with w > rho."""
    if len(size) == 0:
        return 0.0
    order = np.argsort(window_s, kind="stable")
    w, s = window_s[order], size[order].astype(np.float64)
    beyond = s.sum() - np.cumsum(s)            # bytes with window > w[k] (ties: counted as <=)
    # ties: for rho = w[k], every tensor with window <= w[k] is inside; take the last of each tie run
    last_of_run = np.append(w[1:] != w[:-1], True)
    cuts = bandwidth * w[last_of_run] + beyond[last_of_run]
    return float(min(s.sum(), cuts.min()))


def _windows(tas: TensorAccessSequence, k: int, idx: np.ndarray, k_start: float,
             k_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the resident swappable tensors ``idx`` of step k not accessed at k:
    (their indices, out-window seconds before ``k_start``, in-window seconds
    after ``k_end``), both instants within step k (the pool grid segment)."""
    n, T = tas.n, tas.period_s
    keep, outs, ins = [], [], []
    for i in idx.tolist():
        A = tas.acc[i]
        pos = bisect_right(A, k)
        if pos and A[pos - 1] == k:
            continue                              # read or written by step k itself
        nxt = A[pos] if pos < len(A) else (A[0] + n if tas.persistent[i] else None)
        if nxt is None:
            continue
        w = tas.last_write_le(i, k)
        out_from = tas.end_u(w) if w is not None else k_start - T   # never written: any time in the last period
        keep.append(i)
        outs.append(max(0.0, k_start - out_from))
        ins.append(max(0.0, tas.start_u(nxt) - k_end))
    return np.asarray(keep, dtype=np.int64), np.asarray(outs), np.asarray(ins)


def swap_link_bound(jobs: Sequence[PlannerJob], bandwidth_bytes_per_s: float, *,
                    horizon_iterations: float = 2.0, lanes: int = 1,
                    combined_bytes_per_s: float | None = None) -> LinkBound:
    """Both link bounds for these jobs planned together (module docstring), on
    a link of ``lanes`` lanes at ``bandwidth_bytes_per_s`` each way (at most
    ``combined_bytes_per_s`` both ways together), as the planner's channel."""
    if lanes not in (1, 2):
        raise ValueError(f"swap link lanes must be 1 or 2, got {lanes!r}")
    rate = lane_bandwidth(bandwidth_bytes_per_s, lanes, combined_bytes_per_s)
    seqs = [TensorAccessSequence(pj.graph, pj.latencies) for pj in jobs]
    fps = [JobFootprint(s) for s in seqs]
    timeline = PoolTimeline(seqs, [pj.start_offset_s for pj in jobs], horizon_iterations)
    vanilla = int(timeline.pool_footprint([f.free_running for f in fps]).max())
    pool = timeline.pool_footprint([f.base for f in fps])
    period = max(s.period_s for s in seqs)
    period_link = rate * period / 2 if lanes == 1 else rate * period   # bytes absent at once, at most
    best, where = 0, {}
    seen: set[tuple[int, ...]] = set()
    for g in np.argsort(-pool, kind="stable").tolist():
        if pool[g] <= best:
            break                                  # A >= 0: no later point can bind higher
        steps = tuple(int(idx[g]) for idx in timeline.idx)
        if steps in seen:
            continue
        seen.add(steps)
        # the segment's ends, in each job's local time: every job's outs end before the
        # segment starts and its ins begin after it ends, whichever step each job runs
        seg = (float(timeline.grid[g]), float(timeline.grid[g + 1]) if g + 1 < len(timeline.grid) else None)
        sizes, outs, ins = [], [], []
        for s, f, k, off in zip(seqs, fps, steps, timeline.offsets):
            if k >= s.n:
                continue
            t0 = s.start_u(k) + (seg[0] - off - s.start_u(k)) % s.period_s
            t0 = min(max(t0, s.start_u(k)), s.end_u(k))
            t1 = s.end_u(k) if seg[1] is None else min(s.end_u(k), t0 + seg[1] - seg[0])
            res = f.resident_at(k)
            i, o, w = _windows(s, k, res[s.swappable[res]], t0, t1)
            sizes.append(s.size[i])
            outs.append(o)
            ins.append(w)
        size = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
        o, w = (np.concatenate(x) if x else np.zeros(0) for x in (outs, ins))
        absent = min(nested_capacity(o, size, rate), nested_capacity(w, size, rate), period_link)
        low = int(pool[g] - absent)
        if low > best:
            best = low
            where = {s.job: s.step_names[k] for s, k in zip(seqs, steps) if k < s.n}
    return LinkBound(vanilla, int(max(vanilla - period_link, 0)), best, where, lanes)


def working_set_floor(jobs: Sequence[PlannerJob]) -> int:
    """The lowest pool peak any plan (swaps and recomputation, any link)
    could reach: at every step a job holds at least what the step reads and
    writes (a view's owner counts for the view), its scratch, and every
    tensor no plan moves (model inputs, graph constants, what is held beside
    the step) while it lives. A batch whose floor is above the pool trains
    under no method. Several jobs: Note [Floor whatever the alignment]."""
    seqs = [TensorAccessSequence(pj.graph, pj.latencies) for pj in jobs]
    floors = []
    for s in seqs:
        n = s.n
        touched = np.zeros(n, dtype=np.int64)
        owner = {t: s.tindex[info.view_of] for t, info in s.graph.tensors.items() if info.view_of in s.tindex}
        for i, steps in enumerate(s.acc):
            held = s.tindex.get(owner.get(s.tensor_names[i], ""), i)   # a view's access holds its owner's buffer
            for k in set(steps):
                if 0 <= k < n:
                    touched[k] += int(s.size[held])
        fixed = np.zeros(n + 1, dtype=np.int64)
        stay = ~s.swappable & (s.last >= 0)
        np.add.at(fixed, s.first[stay], s.size[stay])
        np.add.at(fixed, s.last[stay] + 1, -s.size[stay])
        resident_fixed = np.cumsum(fixed[:-1])
        # a fixed tensor the step also touches counts once
        both = np.zeros(n, dtype=np.int64)
        for i in np.flatnonzero(stay).tolist():
            for k in set(s.acc[i]):
                if 0 <= k < n:
                    both[k] += int(s.size[i])
        floors.append(touched + resident_fixed - both + s.temp)
    # Note [Floor whatever the alignment]: a plan that recomputes lengthens
    # its job's step, so where the jobs' steps meet on the pool's time axis
    # moves, and the floor summed on the unplanned grid is no bound (the
    # property test found two jobs where a recompute moved job0's peak off
    # job1's: 9 bytes planned under a 10-byte grid floor). What holds for
    # every alignment: while one job runs its floor's largest step, every
    # other job runs some step, so holds at least its smallest floor
    # (nothing before it starts, if it starts later: start_offset_s > 0).
    lowest = [int(f.min()) if len(f) and pj.start_offset_s <= 0 else 0 for pj, f in zip(jobs, floors)]
    return max((int(f.max(initial=0)) + sum(lowest) - low for f, low in zip(floors, lowest)), default=0)


def unplanned_peak_and_period(job: PlannerJob) -> tuple[int, float]:
    """One job's predicted unplanned step: its peak bytes (free-running, scratch
    included) and its step time, from the capture (what a device link is
    resolved against, Note [Links named for a device] in
    tensile_tf/config/device_links.py)."""
    tas = TensorAccessSequence(job.graph, job.latencies)
    return int(JobFootprint(tas).free_running.max()), float(tas.period_s)
