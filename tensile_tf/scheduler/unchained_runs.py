"""Runs of a planned step whose ops may leave the plan-order chain: where the
footprint has slack, the plan's peak holds whatever order they run in.

Note [Unchained runs]
A plan-order plan chains every graph op after the one before it (Note [Plan
order] in tensile_tf/tf/rewrite/rewriter.py), so that the step holds what the planner
predicted. The chain costs inter-op parallelism: the Transformer's 3x batch
(48 x 64 x 128, unlimited link, 2 cores) runs 1.35x as long chained as
unchained with no events at all, and its plan's time ratio was at the goal's
edge (median 1.495 over six runs). Yet the chain only matters where the
step is near its peak: a run of consecutive steps [a, b] can run its ops in
any order (all at once, in the worst case) and still hold at most

    U(a, b) = bytes of every tensor the plan keeps on the device at any step
              of [a, c]  +  the scratch of every op of [a, c]

where c is the first graph op after b (the recomputations and swap-ins its
ops trigger, counted from the steps after them, may start before the run
ends), and scratch is counted without the bytes an op forwards into its
output buffer (Note [Buffer forwarding] in tensile_tf/tf/step_memory.py: an op
that is not its input's last reader in the order it runs in gets no
buffer to forward into). So ``unchained_runs`` cuts the plan order greedily
into maximal runs whose U stays at or under the plan's own predicted peak,
and the rewrite chains the runs, not the ops: every op of a run waits for
every op of the run before it (a NoOp barrier between two runs of several
ops, plain control edges where one of them is one op), and inside a run the
executor's threads order the ops. The prediction stays an upper bound, so
the plan reports the peak it reported chained.

Where the jobs of a plan share the pool, each job's runs are cut at its own
peak and then the pool is checked as a whole: every job's run bounds (U over
each step's run), summed as the plan sums the jobs' footprints (the sum of
their peaks, or their time-aligned sum; Note [Coincident peaks] in
peak_analysis), must stay at or under the plan's predicted pool peak, else
the plan keeps its full chains.

On the Transformer 3x plan (a saved capture, 1471 steps, planned 17.12 MiB):
70 runs, 1449 steps in runs of two or more, 101 of the step's 116 ms of op
time; the steps near the peak stay chained one by one (22 runs of one op).
"""
from __future__ import annotations

import bisect
import heapq
from typing import Sequence

import numpy as np

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.peak_analysis import JobFootprint, PoolTimeline


def _raw_scratch(tas: TensorAccessSequence) -> np.ndarray:
    """Each step's scratch with no credit for forwarding (module docstring);
    kept on the sequence, whose retimed copies share its structure."""
    kept = tas.__dict__.get("_raw_scratch")
    if kept is None or len(kept) != tas.n:
        kept = np.fromiter((max(0, int(tas.ops_by_name[o].temp_bytes)) for o in tas.step_op),
                           dtype=np.int64, count=tas.n)
        tas.__dict__["_raw_scratch"] = kept
    return kept


def residency_intervals(tas: TensorAccessSequence, fp: JobFootprint) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps at which the footprint counts each tensor's bytes, as
    inclusive intervals (tensor, first step, last step): its lifetime, less
    the steps the plan takes it off where that frees its buffer (a view that
    still holds the buffer keeps it counted: Note [Views] and Note [View
    takes the buffer]). A tensor with no absence is one interval; only the
    plan's few absent tensors are split."""
    alive = np.flatnonzero(tas.last >= 0)
    absent = np.asarray(sorted(i for i, lst in fp.absences.items() if lst), dtype=np.int64)
    whole = np.setdiff1d(alive, absent, assume_unique=True)
    ts, los, his = [whole], [tas.first[whole].astype(np.int64)], [tas.last[whole].astype(np.int64)]
    for i in absent.tolist():
        lo, hi = int(tas.first[i]), int(tas.last[i])
        if hi < lo:
            continue
        on = np.ones(hi - lo + 1, dtype=bool)
        for a, b in fp.absences[i]:
            freed = fp._freed_by_absence(i, a, b).astype(bool)
            ks = np.arange(a, b)[freed]
            ks = ks[(ks >= lo) & (ks <= hi)]
            on[ks - lo] = False
        edges = np.diff(np.concatenate([[0], on.astype(np.int8), [0]]))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
        ts.append(np.full(len(starts), i, dtype=np.int64))
        los.append(starts + lo)
        his.append(ends + lo)
    return np.concatenate(ts), np.concatenate(los), np.concatenate(his)


def run_bounds(tas: TensorAccessSequence, fp: JobFootprint, limit: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Greedy maximal runs [a, b] of steps whose bound U (module docstring) is
    at most ``limit``, and each step's bound. A run grows by one graph op and
    the recomputation steps after it (their clones start when it ends). A
    unit whose U alone passes ``limit`` is a run of one, chained as the plan
    predicted: its bound is its planned footprint.

    Note [Runs from residency intervals]
    A run over steps [a, d] holds every tensor with a residency interval
    (``residency_intervals``) meeting [a, d]: those resident at a, and those
    with an interval starting in (a, d]. Growing the run to d' adds only the
    intervals starting in (d, d'] (any other interval meeting them also
    meets d), and what arrives for the step after it (swap-ins and rebuilds
    counted from there) is only the intervals starting exactly there of
    tensors made earlier. So each run start asks for what is resident once,
    and each interval is looked at when a run reaches its start: on four
    ResNet50 jobs (about 10,000 steps each) the pass went from about 3 s,
    which asked for every step's resident set, to a small fraction of that.

    Note [Sums of plain intervals]
    A tensor the plan never takes off has one interval, from its first
    step: no run meets it twice, and nothing of it arrives from before a
    step. So the bytes of those intervals and the steps' scratch are prefix
    sums, and only an absent tensor's intervals are looked at one by one.
    Between two units an absent tensor's interval touches (starts in, or
    arrives right after), a run grows by prefix sums alone, so its furthest
    unit within the limit is a bisection. The runs and bounds are the
    step-by-step oracle's (tests/scheduler/test_unchained_runs.py); four
    ResNet50 jobs' bounds: 0.31 s -> 0.15 s."""
    n = tas.n
    bound = fp.F.astype(np.int64).copy()
    if n == 0:
        return [], bound
    scratch = _raw_scratch(tas)
    original = np.asarray(tas.is_original, dtype=bool)
    units, k = [], 0
    while k < n:                                   # [first step, last step] of each unit
        e = k
        while e + 1 < n and not original[e + 1]:
            e += 1
        units.append((k, e))
        k = e + 1
    t, lo, hi = residency_intervals(tas, fp)
    by_start = np.argsort(lo, kind="stable")
    t, lo, hi = t[by_start], lo[by_start], hi[by_start]
    t_list = t.tolist()
    size_arr = np.asarray(tas.size, dtype=np.int64)
    size = size_arr.tolist()
    first = tas.first.tolist()
    held_in = [-1] * len(size)                     # the run that holds each tensor
    # Note [Sums of plain intervals]: the intervals of tensors with no absence start at the tensor's first
    # step, one per tensor, so no run meets one twice and none arrives from before; their bytes (and the
    # steps' scratch) are prefix sums. Only an absent tensor's intervals are looked at one by one.
    absent = np.zeros(len(size), dtype=bool)
    absent[[i for i, lst in fp.absences.items() if lst]] = True
    special = absent[t] if len(t) else np.zeros(0, dtype=bool)
    plain_bytes = np.zeros(n + 2, dtype=np.int64)
    np.add.at(plain_bytes, lo[~special], size_arr[t[~special]])
    plain_bytes[:n] += scratch
    prefix = np.concatenate([[0], np.cumsum(plain_bytes)]).tolist()   # prefix[k]: plain bytes starting before k
    s_t, s_lo = t[special].tolist(), lo[special]
    special_starting = np.searchsorted(s_lo, np.arange(n + 2), side="left").tolist()

    def starts(c: int, d: int, run: int, new: set[int]) -> int:
        """Bytes of the tensors with an interval starting in [c, d] that the
        run does not hold yet (absent ones added to ``new``), their steps' scratch included."""
        added = prefix[d + 1] - prefix[c]
        for j in range(special_starting[c], special_starting[d + 1]):
            i = s_t[j]
            if held_in[i] != run and i not in new:
                new.add(i)
                added += size[i]
        return added

    def arriving(k: int, run: int, new: set[int]) -> int:
        """Bytes resident at step k that its run may hold before k starts
        (swap-ins and rebuilds counted from k), not held yet and not made by k."""
        if k >= n:
            return 0
        added = 0
        for j in range(special_starting[k], special_starting[k + 1]):
            i = s_t[j]
            if first[i] < k and held_in[i] != run and i not in new:
                added += size[i]
        return added

    # Note [Sums of plain intervals]: a unit is special where an absent tensor's interval starts in it
    # or right after it (what arrives for the next step); next_special[x]: the first special unit >= x
    ua = np.fromiter((a for a, _ in units), dtype=np.int64, count=len(units))
    ue = np.fromiter((e for _, e in units), dtype=np.int64, count=len(units))
    starts_special = np.asarray(special_starting, dtype=np.int64)
    special_unit = starts_special[ue + 1] > starts_special[ua]
    arrives = np.zeros(n + 2, dtype=bool)
    if len(s_t):
        late = np.asarray(first, dtype=np.int64)[np.asarray(s_t, dtype=np.int64)] < s_lo
        arrives[s_lo[late]] = True
    special_unit |= arrives[ue + 1]
    idx = np.where(special_unit, np.arange(len(units)), len(units))
    next_special = (np.minimum.accumulate(idx[::-1])[::-1].tolist() if len(units) else []) + [len(units)]
    unit_prefix = [0, *np.asarray(prefix, dtype=np.int64)[ue + 1].tolist()]   # [x]: plain bytes of units 0..x-1

    # Note [Runs from residency intervals]: what is resident at each run start, swept once over the
    # intervals by start (a tensor's intervals never overlap, so it has at most one open at a time);
    # only a tensor with several intervals can come back inside a run that holds it already
    lo_list, hi_list = lo.tolist(), hi.tolist()
    split = set(np.flatnonzero(np.bincount(t, minlength=len(size)) > 1).tolist()) if len(t) else set()
    open_ends: list[tuple[int, int]] = []           # heap of (last step, interval) begun before the run start
    open_bytes, open_split, nxt = 0, {}, 0          # open_split: tensor -> its open interval (split tensors)
    runs: list[tuple[int, int]] = []
    u = 0
    while u < len(units):
        a, b = units[u]
        run = u
        while nxt < len(lo_list) and lo_list[nxt] < a:
            if hi_list[nxt] >= a:
                heapq.heappush(open_ends, (hi_list[nxt], nxt))
                open_bytes += size[t_list[nxt]]
                if t_list[nxt] in split:
                    open_split[t_list[nxt]] = nxt
            nxt += 1
        while open_ends and open_ends[0][0] < a:
            _, j = heapq.heappop(open_ends)
            open_bytes -= size[t_list[j]]
            if open_split.get(t_list[j]) == j:
                del open_split[t_list[j]]
        total = open_bytes                          # resident at a, from an interval begun before it
        for i in open_split:
            held_in[i] = run
        first_unit: set[int] = set()
        total += starts(a, b, run, first_unit)
        for i in first_unit:
            held_in[i] = run
        v = u
        while v + 1 < len(units):
            # Note [Sums of plain intervals]: up to the next unit an absent tensor's interval touches,
            # the run grows by plain bytes alone, and the furthest unit within the limit is a bisection
            plain_end = next_special[v + 1]
            if plain_end > v + 1:
                # the largest w in [v, plain_end - 1] with the plain units v+1..w within the limit
                w = bisect.bisect_right(unit_prefix, limit - total + unit_prefix[v + 1], v + 2, plain_end + 1) - 2
                if w > v:
                    total, v, b = total + unit_prefix[w + 1] - unit_prefix[v + 1], w, units[w][1]
                if w < plain_end - 1 or v + 1 >= len(units):
                    break   # the next plain unit passes the limit, or none is left
            c, d = units[v + 1]
            new: set[int] = set()
            more = starts(c, d, run, new)
            if total + more + arriving(d + 1, run, new) > limit:
                break
            for i in new:
                held_in[i] = run
            total, v, b = total + more, v + 1, d
        if v > u:
            bound[a:b + 1] = np.maximum(bound[a:b + 1], total + arriving(b + 1, run, set()))
        runs.append((a, b))
        u = v + 1
    return runs, bound


def named_runs(tas: TensorAccessSequence, runs: Sequence[tuple[int, int]]) -> list[list[str]]:
    """The runs of two or more graph ops among ``runs`` (steps [a, b]), as
    [first op, last op] (``JobPlan.unchained_runs``)."""
    named = []
    for a, b in runs:
        ops = [tas.step_names[k] for k in range(a, b + 1) if tas.is_original[k]]
        if len(ops) > 1:
            named.append([ops[0], ops[-1]])
    return named


def unchained_runs(tases: Sequence[TensorAccessSequence], fps: Sequence[JobFootprint], ordered: Sequence[bool],
                   timeline: PoolTimeline, pool_limit: int) -> list[list[list[str]]] | None:
    """Each job's runs of two or more graph ops, as [first op, last op] in
    plan order, cut at the job's own planned peak (none for a job that does
    not run in plan order: it holds its free-running footprint); None when
    the jobs' bounds, summed as ``timeline`` sums footprints, would pass
    ``pool_limit`` (module docstring)."""
    per_job, held = [], []
    for tas, fp, chained in zip(tases, fps, ordered):
        if not chained:
            per_job.append([])
            held.append(fp.free_running)
            continue
        runs, bound = run_bounds(tas, fp, int(fp.F.max(initial=0)))
        held.append(bound)
        per_job.append(named_runs(tas, runs))
    if len(tases) > 1 and timeline.pool_peak(held) > pool_limit:
        return None
    return per_job
