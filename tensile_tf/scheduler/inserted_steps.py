"""Recompute steps inserted into a sequence already built (issue 56).

Note [Recompute steps inserted into a built sequence]
Each recomputation round builds the changed job's sequence again
(Note [Sequences built once per recomputation set] in
scheduler.planner_rebuilds): its op loop walks all of ResNet50's 9,891
ops and their 30,000 accesses, 40-60 ms, to insert a few dozen steps.
The job's sequence without recomputations, built with the same
latencies, already has every op's step, latency, scratch and accesses.
With recomputations inserted, op q's step moves by the steps inserted
before it, and that is all that happens to it; so the accesses are the
unplanned sequence's, each step index moved, plus the inserted steps'
own reads and their targets' writes, put in order. The accesses are
taken from before views were read as their owners (``acc_before_views``),
and the sequence then works out views, residencies and the filter as any
build does. The sequence is the op loop's (``tests/scheduler/test_fast_paths.py``
builds both for the recomputations real plans chose).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from tensile_tf.scheduler.access_sequence import TensorAccessSequence
    from tensile_tf.scheduler.job_graph import JobGraph
    from tensile_tf.scheduler.latency import LatencyModel


def can_insert_into(like: "TensorAccessSequence | None", graph: "JobGraph", latencies: "LatencyModel") -> bool:
    """Whether ``like`` is this graph's sequence without recomputations, timed by ``latencies``."""
    return (like is not None and not like.recompute_target_step and like.graph.ops is graph.ops
            and like.graph.tensors is graph.tensors and like._latencies is latencies   # noqa: SLF001
            and like.n == len(graph.ops))


def _insert(a: list[int], k: int) -> None:
    """Step k into the sorted access list ``a``, once (a step touches a tensor once)."""
    pos = bisect_left(a, k)
    if pos == len(a) or a[pos] != k:
        a.insert(pos, k)


def steps_inserted_into(like: "TensorAccessSequence", inserts: Mapping[str, Sequence],
                        step_name, target_steps: dict[str, int]) -> tuple:
    """The Note: (step names, step ops, latencies, scratch, concurrent bytes, acc, writes) of
    ``like`` with the recompute events ``inserts`` (before-op name -> events, in order) inserted;
    ``target_steps`` gets each target's step, keyed as the op loop keys it."""
    graph, ops_by_name, ti = like.graph, like.ops_by_name, like.tindex
    latency_s = like._latencies.latency_s   # noqa: SLF001
    at = sorted((like.step_index[op], op) for op in inserts if op in like.step_index)
    step_names: list[str] = []
    step_op: list[str] = []
    lat_parts: list = []
    temp_parts: list = []
    conc_parts: list = []
    chains: list[tuple[int, list[int], int | None]] = []     # (new step, its reads, the target it writes)
    shift = np.zeros(like.n, dtype=np.int64)
    done = 0
    for q, op_name in at:
        step_names += like.step_names[done:q]
        step_op += like.step_op[done:q]
        lat_parts.append(like.latency[done:q])
        temp_parts.append(like.temp[done:q])
        conc_parts.append(like.concurrent[done:q])
        done = q
        for ev in inserts[op_name]:
            chain_out: set[str] = set()
            transient = 0
            for rop_name in ev.ops:
                for o in ops_by_name[rop_name].outputs:
                    if o != ev.target:
                        transient += graph.tensors[o].size_bytes
                chain_out.update(ops_by_name[rop_name].outputs)
            lat, temp = [], []
            for rop_name in ev.ops:
                rop = ops_by_name[rop_name]
                k = len(step_names)
                step_names.append(step_name(rop_name, ev.target))
                step_op.append(rop_name)
                lat.append(max(0.0, float(latency_s(rop))))
                temp.append(rop.temp_bytes + transient)   # intermediates and side outputs live while the chain runs
                writes = ev.target in rop.outputs
                chains.append((k, [ti[t] for t in rop.inputs if t not in chain_out], ti[ev.target] if writes else None))
                if writes:
                    target_steps[ev.target + "@" + op_name] = k
            lat_parts.append(np.asarray(lat, dtype=np.float64))
            temp_parts.append(np.asarray(temp, dtype=np.int64))
            conc_parts.append(np.zeros(len(lat), dtype=np.int64))
        shift[q:] = len(step_names) - q
    step_names += like.step_names[done:]
    step_op += like.step_op[done:]
    lat_parts.append(like.latency[done:])
    temp_parts.append(like.temp[done:])
    conc_parts.append(like.concurrent[done:])
    moved = (np.arange(like.n, dtype=np.int64) + shift).tolist() if at else None
    acc, writes = like.acc.unpacked(moved), like.writes.unpacked(moved)
    for owner, steps in like.acc_before_views.items():
        acc[owner] = [moved[k] for k in steps] if moved is not None else steps[:]
    for k, reads, target in chains:
        for i in reads:
            _insert(acc[i], k)
        if target is not None:
            _insert(acc[target], k)
            _insert(writes[target], k)
    return (step_names, step_op, np.concatenate(lat_parts), np.concatenate(temp_parts),
            np.concatenate(conc_parts), acc, writes)
