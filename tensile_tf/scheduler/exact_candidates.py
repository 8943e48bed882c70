"""The candidate events of the exact planner (``scheduler.exact_planner``),
read off the same Tensor Access Sequence and footprint the greedy planner
plans on, and the check that a greedy plan lies inside the exact model.

Note [The exact model's candidates]
Every event the greedy planner (Algorithm 3) can book, the exact model can
choose, with the same rounding of transfers to steps (Note [op-granular
footprint] in peak_analysis):

* **Host copies.** One optional swap-out per *version* of a swappable tensor
  (the value its last write made: TGA, or an optimizer update for
  parameters and slots): it starts after that write ends and ends before the
  next write starts. Each gap of that version may reuse it, which is the
  greedy planner's reused host copy (§III-C).
* **Gaps.** One optional swap-in per gap (p, q) between two accesses (the
  wrap-around gap of a persistent tensor is (last - n, first)); it ends
  before step q starts. The tensor is absent while step k runs, for k
  strictly inside the gap, exactly when the version's swap-out has ended by
  the start of k and the gap's swap-in starts no earlier than the end of k:
  the greedy planner's ``release_step`` / ``in_step`` rule. A transfer takes
  time, so the step right after a write and the step right before the
  access a swap-in serves are never away (the model counts time in ticks,
  and a tick-rounded transfer could otherwise take none).
* **Recomputations.** Per activation and gap (p, q), the chain of ops that
  rebuilds it before q (``recompute.recompute_chain``, up to ``max_chain``
  ops); the tensor is then absent on every step inside the gap, the re-run
  holds the bytes live across the step boundary before q, its ops' scratch
  and its chain's intermediates, and the chain's inputs must stay on the
  device there (no swap of them over q). At most one re-run block per op.

What the exact model leaves out, each a way a greedy plan can fall outside
it (``check_plan`` says which, per plan): two recomputations before one op,
a tensor released after another recomputation's re-run read it last (its
gap starts at a re-run step, which the unplanned step lacks), and the time a recomputation adds to the step: the exact model keeps the
unplanned step's op times for its transfers (the re-runs' time is its
second objective), while the greedy planner moves every later op by the
re-run's latency. On a link fast enough that no transfer waits (the
unlimited link) this changes nothing.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from tensile_tf.scheduler.recompute import recompute_chain
from tensile_tf.scheduler.state import JobState

_EPS = 1e-12


@dataclass
class HostCopy:
    """One optional swap-out: version ``w`` (unrolled step of its write; None: never written) of tensor ``i``."""

    j: int
    i: int
    w: int | None
    lo_s: float           # earliest start (the write's end)
    hi_s: float           # latest end (the next write's start)
    dur_s: float


@dataclass
class Gap:
    """One gap (p, q) of tensor ``i`` (unrolled steps) whose version is ``copy``."""

    j: int
    i: int
    p: int
    q: int
    copy: int                        # index into ExactCandidates.copies
    size: int
    dur_s: float
    freed: dict[int, int] = field(default_factory=dict)   # local step -> 1/0 (a view holds the buffer)
    away_from: int = 0               # the first and last unrolled steps a swap can hold it away
    away_to: int = -1


@dataclass
class Rerun:
    """One recomputation: tensor ``i`` dropped after p and rebuilt right before q."""

    j: int
    i: int
    p: int
    q: int
    ops: list[str]
    time_s: float
    size: int
    base_bytes: int                  # footprint of the re-run block before any absence
    inputs: list[int]                # tensors the chain reads that must stay on the device


@dataclass
class ExactCandidates:
    copies: list[HostCopy]
    gaps: list[Gap]
    reruns: list[Rerun]
    floors: list[int]                # per job: its peak with every candidate taken (a lower bound)
    removable: list[np.ndarray]      # per job, per step: bytes some candidate can take off


def _gaps_of(tas, i: int) -> list[tuple[int, int]]:
    A = tas.acc[i]
    out = [(A[c], A[c + 1]) for c in range(len(A) - 1) if A[c + 1] - A[c] > 1]
    if tas.persistent[i] and A and A[0] + tas.n - A[-1] > 1:
        out.append((A[-1] - tas.n, A[0]))
    return out


def _next_write(tas, i: int, w: int | None) -> int | None:
    """The unrolled step of the first write after unrolled step ``w``."""
    ws = tas.writes[i]
    if not ws or w is None:
        return None
    q, r = divmod(w, tas.n)
    pos = bisect_right(ws, r)
    return ws[pos] + q * tas.n if pos < len(ws) else ws[0] + (q + 1) * tas.n


def collect_candidates(jobs: list[JobState], bandwidth: float, *, recompute: bool = True,
                       max_chain: int = 4) -> ExactCandidates:
    """Every candidate event of every job, on their unplanned (vanilla) sequences."""
    copies: list[HostCopy] = []
    gaps: list[Gap] = []
    reruns: list[Rerun] = []
    floors: list[int] = []
    removable: list[np.ndarray] = []
    for js in jobs:
        tas, fp = js.tas, js.fp
        n = tas.n
        rem = np.zeros(n, dtype=np.int64)
        by_version: dict[tuple[int, int | None], int] = {}
        for i in np.flatnonzero(tas.swappable).tolist():
            size = int(tas.size[i])
            for p, q in _gaps_of(tas, i):
                w = tas.last_write_le(i, p)
                key = (i, w)
                if key not in by_version:
                    nxt = _next_write(tas, i, w)
                    lo = tas.end_u(w) if w is not None else tas.start_u(p)
                    hi = tas.start_u(nxt) if nxt is not None else tas.start_u(q)
                    by_version[key] = len(copies)
                    copies.append(HostCopy(js.j, i, w, lo, hi, size / bandwidth))
                else:
                    c = copies[by_version[key]]
                    if w is None:
                        c.lo_s, c.hi_s = min(c.lo_s, tas.start_u(p)), max(c.hi_s, tas.start_u(q))
                freed = {}
                for u in range(p + 1, q):
                    k = u % n
                    freed[k] = int(fp._freed_by_absence(i, k, k + 1)[0])
                    rem[k] += size * freed[k]
                # a transfer takes time: a copy of a write made at p is not done before p ends, and a
                # swap-in counts from the step it starts in, which is before q (Note [op-granular footprint])
                first = p + 2 if w == p else p + 1
                gaps.append(Gap(js.j, i, p, q, by_version[key], size, size / bandwidth, freed, first, q - 2))
        if recompute:
            reruns.extend(_reruns(js, max_chain))
        floors.append(int((fp.base - rem).max()) if n else 0)
        removable.append(rem)
    return ExactCandidates(copies, gaps, reruns, floors, removable)


def _reruns(js: JobState, max_chain: int) -> list[Rerun]:
    tas, fp = js.tas, js.fp
    out = []
    for i in range(len(tas.tensor_names)):
        if tas.kind[i] != "activation" or tas.size[i] <= 0 or tas.persistent[i]:
            continue
        if i in tas.handed_over or i in tas.view_spans:
            continue
        A = tas.acc[i]
        for c in range(len(A) - 1):
            p, q = A[c], A[c + 1]
            if q - p < 2 or not tas.is_original[q]:
                continue
            ops = recompute_chain(js, i, p, q, max_chain)
            if not ops:
                continue
            chain_out: set[str] = set()
            transient = 0
            temps = []
            ins: list[int] = []
            for name in ops:
                op = tas.ops_by_name[name]
                temps.append(op.temp_bytes)
                for o in op.outputs:
                    if o != tas.tensor_names[i]:
                        transient += int(tas.size[tas.tindex[o]])
                for x in op.inputs:
                    if x not in chain_out:
                        ins.append(tas.tindex[x])
                chain_out.update(op.outputs)
            # live across the boundary q-1 -> q: every tensor with first <= q-1 and last >= q
            live = (tas.first <= q - 1) & (tas.last >= q)
            across = int(tas.size[live].sum())
            size = int(tas.size[i])
            # before the target's own op the target is still away; with it, it is back
            block = max(across - size + transient + max(temps[:-1] or [0]), across + transient + temps[-1])
            out.append(Rerun(js.j, i, p, q, ops, float(sum(tas.latency[tas.step_index[o]] for o in ops)),
                             size, block, sorted(set(ins))))
    return out


@dataclass
class PlanCheck:
    """Whether a greedy plan is a point of the exact model: its absences
    follow from its transfer times, its footprint is base less those
    absences, and no two transfers share a lane at once."""

    agrees: bool
    problems: list[str]
    outside_model: list[str]          # what the plan uses that the exact model leaves out


def check_plan(planner, lanes: int = 1) -> PlanCheck:
    """Checks the greedy ``planner``'s current state (after ``plan()``) on its own sequences."""
    problems: list[str] = []
    outside: list[str] = []
    transfers: list[tuple[str, float, float, str]] = []   # (lane, global start, end, what)
    for js in planner.jobs:
        tas, fp = js.tas, js.fp
        n = tas.n
        F = fp.base.astype(np.int64).copy()
        if js.recomputes:
            outside.append(f"{js.name}: recomputation moves later ops (the exact model keeps op times)")
            befores = [ev.before_op for ev in js.recomputes]
            if len(set(befores)) < len(befores):
                outside.append(f"{js.name}: two recomputations before one op")
            if any(ev.release_after_op not in tas.ops_by_name for ev in js.recomputes):
                outside.append(f"{js.name}: a recomputation released after another's re-run")
        for ev in js.recomputes:
            i = tas.tindex[ev.target]
            r = tas.recompute_target_step[ev.target + "@" + ev.before_op]
            lo = tas.step_index[ev.release_after_op] + 1
            F[lo:r] -= int(tas.size[i]) * fp._freed_by_absence(i, lo, r)
        for d in js.decisions:
            name = tas.tensor_names[d.i]
            out_end = (d.out_start + d.out_dur) if d.out_start is not None else None
            if out_end is None:   # a reused host copy: the copy's end, as booked for the version
                w = d.version
                rel = js.host_copies.get((d.i, w % n) if w is not None else (d.i, -1), 0.0)
                out_end = (tas.end_u(w) if w is not None else tas.start_u(d.p)) + rel
            else:
                w = tas.last_write_le(d.i, d.p)
                lo = tas.end_u(w) if w is not None else tas.start_u(d.p)
                if d.out_start < lo - 1e-9:
                    problems.append(f"{js.name}/{name}: swap-out starts before its write ends")
                transfers.append(("out", js.offset_s + d.out_start, js.offset_s + out_end, f"{js.name}/{name} out"))
            in_end = d.in_start + d.in_dur
            if in_end > tas.start_u(d.q) + 1e-9:
                problems.append(f"{js.name}/{name}: swap-in ends after step {d.q} starts")
            transfers.append(("in", js.offset_s + d.in_start, js.offset_s + in_end, f"{js.name}/{name} in"))
            # the greedy planner's own rounding of transfers to steps (Note [op-granular footprint])
            for u in range(max(d.p, tas.step_done_by_u(out_end)) + 1, tas.step_at_u(d.in_start)):
                k = u % n
                F[k] -= int(tas.size[d.i]) * int(fp._freed_by_absence(d.i, k, k + 1)[0])
        if not np.array_equal(F, fp.F):
            k = int(np.flatnonzero(F != fp.F)[0])
            problems.append(f"{js.name}: footprint at step {tas.step_names[k]} is {int(fp.F[k])} B in the plan, "
                            f"{int(F[k])} B by the exact model's rule")
    problems += _lane_overlaps(transfers, planner.timeline.periods, lanes)
    return PlanCheck(not problems, problems, outside)


def _lane_overlaps(transfers, periods, lanes: int) -> list[str]:
    """Transfers on one lane that overlap, folded onto the common period
    (the exact model's circle; jobs of one period only)."""
    T = max(periods)
    if max(periods) - min(periods) > 1e-9 * T:
        return []          # the greedy channel checks repetitions over its horizon; no common circle to fold onto
    out = []
    for lane in (("out", "in"),) if lanes == 1 else (("out",), ("in",)):
        iv = sorted(((s % T, s % T + (e - s), what) for kind, s, e, what in transfers if kind in lane))
        iv += [(s + T, e + T, what) for s, e, what in iv]
        iv.sort()
        for a, b in zip(iv, iv[1:]):
            if b[0] < a[1] - 1e-9 * T:
                out.append(f"lane {'/'.join(lane)}: {a[2]} and {b[2]} overlap")
                break
    return out
