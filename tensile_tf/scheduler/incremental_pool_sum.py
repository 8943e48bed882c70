"""The pool footprint kept up to date by each decision's delta (issue 56).

Note [Incremental pool footprint]. Algorithm 1 sums every job's footprint
over the whole timeline before each decision: a gather of every job's
``F`` at every grid point (the grid has a point at each step start of each
job's repeats), J gathers of J x n x repeats points for J jobs of n steps.
A swap or a recomputation changes one job's ``F`` over the steps its
tensor is away, a few hundred of n. ``IncrementalPoolSum`` keeps the sum
and the ``F`` each job had when it was last summed; asked again, it finds
the steps whose bytes changed (one vectorised compare per job, O(n)) and
adds their deltas at the grid points those steps cover (an inverse index
of the timeline: per job, the grid points of each local step), so a
decision costs the points it touches, not the grid. The pool peak is kept
per block of ``BLOCK`` grid points (the block maxima are a two-level
segment tree): only the blocks a delta touched are taken again. A job
whose ``F`` has another length (a new sequence) or whose steps mostly
changed is summed again whole. Diffing the arrays instead of hooking every
writer of ``F`` keeps it correct whoever changes a footprint, undone
rounds that put old arrays back included. Checked against the full sum on
random absences, added and removed (``tests/scheduler/test_incremental_pool_sum.py``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: grid points per block of the kept maxima
BLOCK = 512


class IncrementalPoolSum:
    """The time-aligned sum of J footprints on one timeline's grid, updated by deltas.

    ``idx[j][g]``: the local step job j runs at grid point g (``n_j``: not started, 0 bytes)."""

    def __init__(self, idx: Sequence[np.ndarray], ns: Sequence[int], *, block: int = BLOCK):
        self.idx = list(idx)
        self.ns = list(ns)
        self.points = len(self.idx[0]) if self.idx else 0
        # inverse index: the grid points of local step k are order[j][bounds[j][k]:bounds[j][k + 1]]
        inverse: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # jobs that share an index share its inverse
        for ix, n in zip(self.idx, self.ns):
            if id(ix) not in inverse:
                o = np.argsort(ix, kind="stable")
                inverse[id(ix)] = (o, np.searchsorted(ix[o], np.arange(n + 2)))
        self.order = [inverse[id(ix)][0] for ix in self.idx]
        self.bounds = [inverse[id(ix)][1] for ix in self.idx]
        self.block = block
        blocks = -(-self.points // block) if self.points else 0
        self._total = np.zeros(blocks * block, dtype=np.int64)
        self._block_max = np.zeros(blocks, dtype=np.int64)
        self._summed: list[np.ndarray | None] = [None] * len(self.idx)

    def _add_whole(self, j: int, delta: np.ndarray) -> None:
        self._total[:self.points] += np.append(delta, 0)[self.idx[j]]

    def _points(self, j: int, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The grid points of job j's local steps ``steps`` (sorted), and how many each step has."""
        lo, hi = self.bounds[j][steps], self.bounds[j][steps + 1]
        counts = hi - lo
        if len(steps) and int(steps[-1]) - int(steps[0]) + 1 == len(steps):   # one run of steps: one slice
            return self.order[j][int(lo[0]):int(hi[-1])], counts
        total = int(counts.sum())
        run_start = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        return self.order[j][run_start + np.arange(total)], counts

    def _add_steps(self, j: int, steps: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Adds delta[s] at every grid point of local step steps[s]; returns the points touched."""
        points, counts = self._points(j, steps)
        if len(points):
            self._total[points] += np.repeat(delta, counts)
        return points

    def sync(self, footprints: Sequence[np.ndarray]) -> None:
        """Brings the sum up to ``footprints`` (one array of n_j bytes per job)."""
        if len(footprints) != len(self.idx):
            raise ValueError(f"incremental pool sum: {len(footprints)} footprints for {len(self.idx)} jobs")
        touched: list[np.ndarray] = []
        whole = False
        for j, F in enumerate(footprints):
            old = self._summed[j]
            if len(F) != self.ns[j]:
                raise ValueError(f"incremental pool sum: job {j}'s footprint has {len(F)} steps, "
                                 f"the timeline {self.ns[j]}")
            if old is None:
                self._add_whole(j, np.asarray(F, dtype=np.int64))
                whole = True
            else:
                steps = np.flatnonzero(F != old)
                if not len(steps):
                    continue
                if len(steps) * 4 > len(F):
                    self._add_whole(j, F - old)
                    whole = True
                else:
                    touched.append(self._add_steps(j, steps, F[steps] - old[steps]))
            self._summed[j] = np.array(F, dtype=np.int64, copy=True)
        blocks = self._total.reshape(-1, self.block) if len(self._block_max) else None
        if blocks is None:
            return
        if whole:
            self._block_max = blocks.max(axis=1)
        elif touched:
            b = np.unique(np.concatenate(touched) // self.block)
            self._block_max[b] = blocks[b].max(axis=1)

    def footprint(self, footprints: Sequence[np.ndarray]) -> np.ndarray:
        """The pool footprint on the grid (a copy the caller may keep)."""
        self.sync(footprints)
        return self._total[:self.points].copy()

    def peak(self, footprints: Sequence[np.ndarray]) -> int:
        self.sync(footprints)
        return int(self._block_max.max()) if len(self._block_max) else 0

    def peak_if_added(self, footprints: Sequence[np.ndarray], j: int, steps: np.ndarray,
                      delta: np.ndarray | int) -> int:
        """Note [Transfers that lower no peak] in scheduler.planner_passes: the peak were job j's
        footprint ``delta[s]`` >= 0 bytes higher at its local steps ``steps[s]`` (sorted), nothing
        changed: only the points those steps cover are read. ``delta`` an int: that many at each."""
        self.sync(footprints)
        peak = int(self._block_max.max()) if len(self._block_max) else 0
        points, counts = self._points(j, steps)
        if not len(points):
            return peak
        if isinstance(delta, (int, np.integer)):
            return max(peak, int(self._total[points].max()) + int(delta))
        return max(peak, int((self._total[points] + np.repeat(delta, counts)).max()))

    def argmax(self, footprints: Sequence[np.ndarray]) -> int:
        """The first grid point where the pool peaks."""
        self.sync(footprints)
        b, w = int(np.argmax(self._block_max)), self.block
        return b * w + int(np.argmax(self._total[b * w:(b + 1) * w]))
