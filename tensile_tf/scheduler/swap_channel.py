"""The swap channel: the host<->device link all jobs share, as per lane a
sorted set of busy intervals over the planning horizon (seed 000 §IV-C: no two
transfers overlap on a lane at any of their repetitions; lanes: Note [A lane per
direction] in tensile_tf/scheduler/swap_scheduling.py).

Note [Walks along a busy lane]
``earliest`` and ``latest`` move a transfer past each busy interval it
meets and then check every repeat again. On a saturated link the intervals
sit back to back with gaps shorter than the transfer, and each one cost a
bisection and a check of every repeat: 6 ResNet50 jobs at 60% of their
unplanned peak (saved capture ``bench_resnet50_b16``) made 5.59 million
conflict checks for 104,718 searches. A conflict now walks on along the
same lane, in one loop, to the first gap after it (before it, for
``latest``) that holds the transfer: every start it skips overlaps that
lane's intervals in that repeat, so the search returns the same time.
0.64 million checks, 16.2 s -> 9.4 s, the same 2,104 swaps and peak.
(A decision already booked over a gap is now found by tensor too:
``_booked_in_gap`` in swap_scheduling.py, not a scan of every decision.)

Note [Calls on the hot path]
On a saturated link a search checks about ten starts, each every repeat:
16 ResNet50 jobs at 60% (as two representatives, Note [Identical jobs
planned by representatives] in scheduler.identical_jobs) made 180,000
calls of ``_bases`` and 249,000 of the conflict check for 47,000
searches, a third of the searches' time in the calls themselves. So
``earliest`` and ``latest`` work the repeats and the conflict check out
inline (the same arithmetic, in the same order, so the same floats;
``_place`` and ``is_free`` call it once a repeat, ``_free_position``),
and the swap-in moved to its trigger's end asks ``is_free``
instead of a ``latest`` search whose answer was only compared with its
upper end (a conflict moves ``latest`` more than eps below it). Plans are
the same (``tests/scheduler/test_fast_paths.py``; the planner benchmark's
captures, bit for bit).
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Sequence

import numpy as np

_EPS = 1e-12

#: A transfer's direction: device to host (a swap-out) or host to device (a swap-in).
OUT, IN = "out", "in"


def lane_bandwidth(bandwidth_bytes_per_s: float, lanes: int = 1, combined_bytes_per_s: float | None = None) -> float:
    """The bytes per second a lane is booked at (Note [A lane per direction]):
    the each-way rate, at most the combined cap shared by the lanes."""
    if combined_bytes_per_s is None:
        return float(bandwidth_bytes_per_s)
    return min(float(bandwidth_bytes_per_s), float(combined_bytes_per_s) / lanes)


class _Lane:
    """One lane's busy intervals, sorted by start: (start, end, reservation tag)."""

    __slots__ = ("starts", "ends", "tags")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.tags: list[int] = []


class SwapChannel:
    """The host<->device link, shared by all jobs: per lane a sorted set of
    busy intervals in global seconds over the planning horizon.

    A job's event at local (unrolled) time tau repeats at offset_j + k*T_j + tau
    for every iteration k that reaches into [0, horizon_s]; all repetitions must
    be free. ``bandwidth_bytes_per_s`` (each way) turns bytes into transfer
    seconds. ``lanes`` 1: the seed's one transfer at a time in either
    direction; 2: a lane per direction, Note [A lane per direction].
    """

    def __init__(self, bandwidth_bytes_per_s: float, horizon_s: float,
                 offsets: Sequence[float], periods: Sequence[float], *, lanes: int = 1,
                 combined_bytes_per_s: float | None = None):
        if not bandwidth_bytes_per_s > 0:
            raise ValueError(f"swap bandwidth must be > 0 bytes/s, got {bandwidth_bytes_per_s!r}")
        if lanes not in (1, 2):
            raise ValueError(f"swap link lanes must be 1 or 2, got {lanes!r}")
        if combined_bytes_per_s is not None and not combined_bytes_per_s > 0:
            raise ValueError(f"combined swap bandwidth must be > 0 bytes/s, got {combined_bytes_per_s!r}")
        self.bandwidth = float(bandwidth_bytes_per_s)
        self.lanes = lanes
        self.combined = None if combined_bytes_per_s is None else float(combined_bytes_per_s)
        self.lane_bandwidth = lane_bandwidth(self.bandwidth, lanes, self.combined)
        self.horizon_s = float(horizon_s)
        self.offsets = list(offsets)
        self.periods = list(periods)
        self._lanes = [_Lane() for _ in range(lanes)]
        self._tag = 0
        self.reserved: dict[int, list[float]] = {}
        self._lane_of: dict[int, int] = {}
        self._booked: dict[int, tuple[int, float, float]] = {}    # tag -> (job, local start, seconds)

    def duration(self, size_bytes: int) -> float:
        return size_bytes / self.lane_bandwidth

    def lane(self, direction: str) -> int:
        """The lane a transfer of ``direction`` ("out": device to host, "in")
        books: 0 for both on one lane; 0 out and 1 in on two."""
        if direction not in (OUT, IN):
            raise ValueError(f"swap direction must be {OUT!r} or {IN!r}, got {direction!r}")
        return 1 if self.lanes == 2 and direction == IN else 0

    def _bases(self, j: int, tau: float, d: float) -> range:
        o, T = self.offsets[j], self.periods[j]
        k_lo = math.ceil((-o - tau - d) / T)
        k_hi = math.floor((self.horizon_s - o - tau) / T)
        return range(k_lo, max(k_lo, k_hi) + 1)

    def earliest(self, j: int, lo: float, hi: float, d: float, *, direction: str) -> float | None:
        """The earliest tau in [lo, hi] at which a transfer of d seconds is free in every repetition."""
        lane = self._lanes[self.lane(direction)]
        starts, ends = lane.starts, lane.ends
        n = len(starts)
        tau = lo
        o, T, horizon = self.offsets[j], self.periods[j], self.horizon_s
        eps, ceil, floor, bisect = _EPS, math.ceil, math.floor, bisect_left   # Note [Calls on the hot path]
        while tau <= hi + eps:
            k = ceil((-o - tau - d) / T)      # ``_bases`` and the conflict check inline
            k_hi = max(k, floor((horizon - o - tau) / T))
            while k <= k_hi:
                base = o + k * T
                g0 = base + tau
                c = bisect(starts, g0 + d - eps) - 1
                if c >= 0 and ends[c] > g0 + eps:   # Note [Walks along a busy lane]: on to the first gap that fits
                    e = ends[c]
                    c += 1
                    while c < n and starts[c] < e + d - eps:
                        e = ends[c]
                        c += 1
                    tau = e - base
                    break
                k += 1
            else:
                return tau
        return None

    def latest(self, j: int, lo: float, hi: float, d: float, *, direction: str) -> float | None:
        """The latest tau in [lo, hi] at which a transfer of d seconds is free in every repetition."""
        lane = self._lanes[self.lane(direction)]
        starts, ends = lane.starts, lane.ends
        tau = hi
        o, T, horizon = self.offsets[j], self.periods[j], self.horizon_s
        eps, ceil, floor, bisect = _EPS, math.ceil, math.floor, bisect_left   # as in ``earliest``
        while tau >= lo - eps:
            k = ceil((-o - tau - d) / T)
            k_hi = max(k, floor((horizon - o - tau) / T))
            while k <= k_hi:
                base = o + k * T
                g0 = base + tau
                c = bisect(starts, g0 + d - eps) - 1
                if c >= 0 and ends[c] > g0 + eps:   # Note [Walks along a busy lane]: back to the first gap that fits
                    s = starts[c]
                    while c > 0 and ends[c - 1] > s - d + eps:
                        c -= 1
                        s = starts[c]
                    tau = s - d - base
                    break
                k += 1
            else:
                return tau
        return None

    @staticmethod
    def _free_position(lane: _Lane, g0: float, d: float) -> int:
        """Where a transfer of d seconds from global g0 would go in ``lane`` (the bisection of its
        end less eps), or -1 where the interval before that position overlaps it (the conflict
        check ``earliest`` and ``latest`` work out inline: Note [Calls on the hot path])."""
        pos = bisect_left(lane.starts, g0 + d - _EPS)
        return -1 if pos > 0 and lane.ends[pos - 1] > g0 + _EPS else pos

    def is_free(self, j: int, tau: float, d: float, *, direction: str) -> bool:
        """Whether a transfer of d seconds at tau is free in every repetition: ``latest(j, lo, tau, d)``
        is tau exactly then (a conflict moves ``latest`` below tau - eps), without its walk."""
        lane = self._lanes[self.lane(direction)]
        o, T = self.offsets[j], self.periods[j]
        return all(self._free_position(lane, o + k * T + tau, d) >= 0 for k in self._bases(j, tau, d))

    def reserve(self, j: int, tau: float, d: float, *, direction: str) -> int:
        self._tag += 1
        tag = self._tag
        li = self.lane(direction)
        starts = self._place(self._lanes[li], j, tau, d, tag)
        if starts is None:
            raise RuntimeError("swap channel: reserving an overlapping transfer (planner bug)")
        self.reserved[tag] = starts
        self._lane_of[tag] = li
        self._booked[tag] = (j, tau, d)
        return tag

    def reserve_many(self, bookings: Sequence[tuple[int, float, float, str]]) -> list[int]:
        """``reserve`` for each (job, tau, seconds, direction) of ``bookings``
        on a link with nothing booked yet, every lane sorted once instead of
        one insertion per repeat; raises as ``reserve`` does where two
        transfers (or repeats) would overlap. The repeats are worked out as
        arrays (``_bases`` and the starts, the same float operations in the
        same order, so the same starts: 28,000 bookings of 16 ResNet50 jobs)."""
        if self._booked:
            raise RuntimeError("swap channel: reserve_many books an empty link only")
        if not bookings:
            return []
        nb = len(bookings)
        jobs, taus, secs, directions = zip(*bookings)
        lane_of = np.fromiter((self.lane(x) for x in directions), dtype=np.int64, count=nb)
        j = np.fromiter(jobs, dtype=np.int64, count=nb)
        tau, d = np.array(taus, dtype=np.float64), np.array(secs, dtype=np.float64)
        o, T = np.array(self.offsets, dtype=np.float64)[j], np.array(self.periods, dtype=np.float64)[j]
        k_lo = np.ceil((-o - tau - d) / T)
        counts = (np.maximum(k_lo, np.floor((self.horizon_s - o - tau) / T)) - k_lo + 1).astype(np.int64)
        of = np.repeat(np.arange(nb), counts)
        first = np.cumsum(counts) - counts
        k = k_lo[of] + (np.arange(int(counts.sum())) - first[of])
        g0 = o[of] + k * T[of] + tau[of]
        end = g0 + d[of]
        tags = list(range(self._tag + 1, self._tag + 1 + nb))
        self._tag += nb
        tag = np.asarray(tags, dtype=np.int64)[of]
        starts = g0.tolist()
        for b, (t, a, jj, tt, dd) in enumerate(zip(tags, first.tolist(), jobs, taus, secs)):
            self.reserved[t] = starts[a:a + int(counts[b])]
            self._lane_of[t], self._booked[t] = int(lane_of[b]), (jj, tt, dd)
        for li, lane in enumerate(self._lanes):
            mine = np.flatnonzero(lane_of[of] == li)
            ranked = mine[np.lexsort((tag[mine], end[mine], g0[mine]))]   # as tuples (start, end, tag) sort
            s_, e_ = g0[ranked], end[ranked]
            if len(ranked) > 1 and bool(np.any(e_[:-1] > s_[1:] + _EPS)):
                raise RuntimeError("swap channel: reserving an overlapping transfer (planner bug)")
            lane.starts, lane.ends, lane.tags = s_.tolist(), e_.tolist(), tag[ranked].tolist()
        return tags

    @staticmethod
    def _drop(lane: _Lane, g0: float, tag: int) -> None:
        pos = bisect_left(lane.starts, g0)
        while lane.tags[pos] != tag:
            pos += 1
        del lane.starts[pos], lane.ends[pos], lane.tags[pos]

    def release(self, tag: int) -> None:
        self._booked.pop(tag, None)
        lane = self._lanes[self._lane_of.pop(tag, 0)]
        for g0 in self.reserved.pop(tag, ()):
            self._drop(lane, g0, tag)

    def without(self, tags: set[int], periods: Sequence[float], horizon_s: float) -> "SwapChannel | None":
        """A copy of this channel less the reservations ``tags``, for jobs now repeating with
        ``periods`` over ``horizon_s`` (Note [Rebuilds of the jobs that changed] in
        scheduler.planner): a kept reservation of a job whose period is unchanged gets the repeats
        a longer horizon adds, and drops those a shorter one ends before; None where an added
        repeat would overlap another transfer (the caller replays every job instead)."""
        new = SwapChannel(self.bandwidth, horizon_s, self.offsets, periods, lanes=self.lanes,
                          combined_bytes_per_s=self.combined)
        new._tag = self._tag
        same_horizon = horizon_s == self.horizon_s
        for li, (old, lane) in enumerate(zip(self._lanes, new._lanes)):
            keep = [k for k, tag in enumerate(old.tags) if tag not in tags]
            if same_horizon:
                lane.starts = [old.starts[k] for k in keep]
                lane.ends = [old.ends[k] for k in keep]
                lane.tags = [old.tags[k] for k in keep]
        placed: list[list[tuple[float, float, int]]] = [[] for _ in new._lanes]
        for tag, (j, tau, d) in self._booked.items():
            if tag in tags:
                continue
            if self.periods[j] != periods[j]:
                raise ValueError(f"swap channel: job {j}'s period changed, so must its reservations")
            new._booked[tag] = (j, tau, d)
            li = new._lane_of[tag] = self._lane_of[tag]
            if same_horizon:
                new.reserved[tag] = self.reserved[tag]
                continue
            starts = new.reserved[tag] = [new.offsets[j] + k * new.periods[j] + tau for k in new._bases(j, tau, d)]
            placed[li].extend((g0, g0 + d, tag) for g0 in starts)
        if same_horizon:
            return new
        for lane, ivs in zip(new._lanes, placed):     # sorted once, not inserted one by one
            ivs.sort()
            if any(e > s + _EPS for (_, e, _), (s, _, _) in zip(ivs, ivs[1:])):
                return None
            lane.starts = [iv[0] for iv in ivs]
            lane.ends = [iv[1] for iv in ivs]
            lane.tags = [iv[2] for iv in ivs]
        return new

    def _place(self, lane: _Lane, j: int, tau: float, d: float, tag: int) -> list[float] | None:
        """Every repeat of job j's transfer at local tau on ``lane``, tagged ``tag``: their global
        starts, or None (nothing placed) where one would overlap another transfer."""
        starts_at = []
        starts, ends, tags = lane.starts, lane.ends, lane.tags
        o, T, eps = self.offsets[j], self.periods[j], _EPS
        k_lo = math.ceil((-o - tau - d) / T)      # ``_bases`` and ``_free_position`` inline (Note [Calls on the hot path])
        for k in range(k_lo, max(k_lo, math.floor((self.horizon_s - o - tau) / T)) + 1):
            g0 = o + k * T + tau
            pos = bisect_left(starts, g0 + d - eps)
            if pos > 0 and ends[pos - 1] > g0 + eps:
                for s in starts_at:
                    self._drop(lane, s, tag)
                return None
            pos = bisect_right(starts, g0, 0, pos) if d > _EPS else bisect_right(starts, g0)   # g0 < g0 + d - eps
            starts.insert(pos, g0)
            ends.insert(pos, g0 + d)
            tags.insert(pos, tag)
            starts_at.append(g0)
        return starts_at

    def lane_of(self, tag: int) -> int:
        """The lane a reservation (a SwapDecision's out_tag or in_tag) booked."""
        return self._lane_of[tag]

    def busy_intervals(self, lane: int | None = None) -> list[tuple[float, float]]:
        """The busy (start, end) intervals of one lane, by start; ``lane``
        None: every lane's (one lane: that lane's, as the seed's link)."""
        if lane is not None:
            return list(zip(self._lanes[lane].starts, self._lanes[lane].ends))
        return sorted(iv for ln in self._lanes for iv in zip(ln.starts, ln.ends))

    def utilisation(self) -> float:
        """The share of the horizon the lanes are busy, averaged over the lanes."""
        busy = sum(e - s for ln in self._lanes for s, e in zip(ln.starts, ln.ends))
        return busy / (self.horizon_s * self.lanes) if self.horizon_s else 0.0
