"""Recomputation Scheduling (seed 000 §IV-D), choosing targets by MSPS (Capuchin,
seed 003 §4.3-4.5: memory saving per second of recomputation).

Used only when swapping alone cannot bring the peak under the budget. As the
seed requires, only accesses that were never released are candidates: a
tensor with no swap and no other recomputation. A target resident at the peak
in the gap (p, q) between two of its accesses is dropped after p and rebuilt
right before q by re-running its producer. The producer's inputs must be on
the device at q (and unchanged since the original run); an input that is not is
rebuilt too, recursively up to ``max_chain`` ops (Capuchin's lineage-based
recomputation, §4.4). Stateful ops (random numbers, variable writes) are never
re-run. Intermediates of a chain are transient: they are counted while the
chain runs.

Note [Recomputations that pin a larger one]. MSPS ranks a cheap rebuild
first, and a rebuild keeps its inputs on the device until it runs: on the
small CNN the 1 MiB pooled tensor (one MaxPool to rebuild) outranks the 4
MiB ReLU output it is pooled from (conv, squeeze, bias, ReLU), and once
the pooled tensor is rebuilt from it the ReLU output is read by a
recomputation step, no longer a candidate (only an original op's access is
one). So a candidate whose rerun reads a larger candidate of the same round
is ranked after every candidate that does not (``_pinning_after_pinned``);
the round's rule that no pick reads another's target then drops it if the
larger one is picked. With Note [Recomputation first] (planner_passes) this
took the small CNN b64, minimised, from 30.15 to 26.15 MiB; either alone
left it at 30.13-30.15.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from tensile_tf.scheduler.peak_analysis import PeakAnalysis
from tensile_tf.scheduler.plan import RecomputeEvent
from tensile_tf.scheduler.state import JobState


def msps(size_bytes: int, time_s: float) -> float:
    """Eq. 4: MSPS = memory saving / recomputation time."""
    return size_bytes / time_s if time_s > 0 else float("inf")


def _resident_for_rerun(js: JobState, x: int, q: int, since: int) -> bool:
    """Tensor x is on the device right before step q, with the value it had at step ``since``."""
    tas, fp = js.tas, js.fp
    if tas.size[x] == 0:
        return True
    if not (tas.first[x] <= q - 1 and tas.last[x] >= q):
        return False
    if fp.is_absent(x, q - 1) or fp.is_absent(x, q):
        return False
    w = tas.writes[x]
    pos = bisect_left(w, since + 1)
    return not (pos < len(w) and w[pos] < q)


def recompute_chain(js: JobState, i: int, p: int, q: int, max_chain: int = 4,
                    limit_hits: list[int] | None = None) -> list[str] | None:
    """Ops (execution order) that rebuild tensor i before step q, or None if impossible.
    ``limit_hits[0]`` counts the calls that ``max_chain`` cut short (Note [Chain limits tried] in
    scheduler.planner_passes: where none was, a longer limit plans the same)."""
    tas = js.tas
    ops: list[str] = []
    seen: set[str] = set()

    def build(t: int, depth: int) -> bool:
        prod_name = tas.producer_of[tas.tensor_names[t]]
        if prod_name is None:
            return False
        if depth > max_chain:
            if limit_hits is not None:
                limit_hits[0] += 1
            return False
        op = tas.ops_by_name[prod_name]
        if op.stateful or op.updates:
            return False
        if prod_name in seen:
            return True
        since = tas.step_index[prod_name]
        for name in op.inputs:
            x = tas.tindex[name]
            if _resident_for_rerun(js, x, q, since):
                continue
            if tas.persistent[x] or not build(x, depth + 1):
                return False
        seen.add(prod_name)
        ops.append(prod_name)
        return True

    if not build(i, 1):
        return None
    if len(ops) > max_chain:
        if limit_hits is not None:
            limit_hits[0] += 1
        return None
    order = {name: tas.step_index[name] for name in ops}
    return sorted(ops, key=order.__getitem__)


def recomputation_scheduling(jobs: Sequence[JobState], peak: PeakAnalysis, need_bytes: int, *,
                             max_chain: int = 4, limit_hits: list[int] | None = None) -> dict[int, list[RecomputeEvent]]:
    """Picks recomputation events for tensors resident at the pool peak, highest
    MSPS first, until about ``need_bytes`` are saved. Picks never depend on each
    other (no pick's target is another pick's input). Returns job -> new events;
    the planner inserts them and re-checks the whole plan."""
    cands = []
    for j, i in ((j, int(i)) for j, idx in peak.mpt.items() for i in idx):
        js = jobs[j]
        tas = js.tas
        if tas.kind[i] != "activation" or tas.size[i] <= 0 or i in js.no_recompute:
            continue
        if i in js.swapped_out or i in js.fp.absences:      # only never-released accesses
            continue
        m = peak.job_steps[j]
        A = tas.acc[i]
        pos = bisect_left(A, m)
        if pos == 0 or pos >= len(A) or A[pos] == m:
            continue
        p, q = A[pos - 1], A[pos]
        if not tas.is_original[q]:
            continue
        ops = recompute_chain(js, i, p, q, max_chain, limit_hits)
        if not ops:
            js.no_recompute.add(i)
            continue
        time_s = float(sum(tas.latency[tas.step_index[o]] for o in ops))
        size = int(tas.size[i])
        ev = RecomputeEvent(js.name, tas.tensor_names[i], tas.step_names[p], tas.step_names[q],
                            tas.step_names[q - 1] if q > 0 else None, ops, size, time_s, msps(size, time_s))
        cands.append((ev.msps, j, i, ev))
    cands = _pinning_after_pinned(jobs, sorted(cands, key=lambda c: (-c[0], c[1], c[2])))
    picked: dict[int, list[RecomputeEvent]] = {}
    targets: dict[int, set[str]] = {}
    inputs: dict[int, set[str]] = {}
    saved = 0
    for _, j, i, ev in cands:
        if saved >= need_bytes:
            break
        tas = jobs[j].tas
        ins = {x for o in ev.ops for x in tas.ops_by_name[o].inputs}
        if ev.target in inputs.get(j, set()) or ins & targets.get(j, set()):
            continue
        picked.setdefault(j, []).append(ev)
        targets.setdefault(j, set()).add(ev.target)
        inputs.setdefault(j, set()).update(ins)
        saved += ev.size_bytes
    return picked


def _pinning_after_pinned(jobs: Sequence[JobState], cands: list) -> list:
    """Note [Recomputations that pin a larger one]: a candidate whose rerun
    reads a larger candidate of the same round moves after it."""
    by_target = {(j, ev.target): ev.size_bytes for _, j, _, ev in cands}
    first, later = [], []
    for c in cands:
        _, j, _, ev = c
        ops = jobs[j].tas.ops_by_name
        pins = any(by_target.get((j, x), 0) > ev.size_bytes for o in ev.ops for x in ops[o].inputs)
        (later if pins else first).append(c)
    return first + later
