"""What a step holds beyond its sequential footprint while several inter-op
threads run it, from the footprints observed in real steps.

The planner's footprint (Eq. 1, ``peak_analysis``) runs a job's ops one after
another in executor order. TensorFlow's executor runs every ready op on a pool
of inter-op threads, so while a long op runs, ops after it already run on the
other threads (their outputs and scratch are resident earlier than the
sequential footprint says), and ops the sequential order leaves waiting (a
ResNet's Conv2DBackpropFilters, each holding an activation and a gradient) run
sooner and free their inputs sooner. ``observed_concurrency_bytes`` takes the
bytes the job really held while each op allocated, in a few traced steps
(``tensile_tf.pipeline.measure_step_memory``), and returns per op the
largest difference from the sequential footprint; the capture stores it as
the op's ``concurrent_bytes`` (Note [Concurrent scratch] in
tensile_tf/tf/step_memory.py), and the vanilla footprint is the executor's (Note
[Free-running steps] in peak_analysis).

Note [Observed, not simulated]
Which ops meet on the threads depends on their latencies and on the
executor's queues, and varies from step to step. The node-group CNN
(configs/nodegroup.yaml) peaks at 62 MiB in some steps and at 89 MiB in
others: a Conv2DBackpropFilter with 23.6 MiB of scratch and its sibling
Conv2DBackpropInput start together, and when the sibling ends first its
consumer MaxPoolGrad (16 + 8 MiB) runs beside the filter's scratch. Two
simulations of the executor were tried on the profiled latencies and
dropped: list scheduling in executor order, and per-thread queues with work
stealing (Eigen's pool), each with latencies jittered by 5-20%. Each one got
one model right and another wrong: the CNN's overlap was found in 3 of 5
captures, and VGG16's Adam updates were made to overlap one another where
its steps never do (725-742 MiB predicted, 663 measured in 40 of 40 steps).
The executor's own record of a few steps has neither problem, so the capture
traces STEPS steps (benchmarks/RESULTS.md, Issue 15) and keeps each op's
largest difference: the pool must hold the worst step.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import UniformLatency
from tensile_tf.scheduler.peak_analysis import JobFootprint


def sequential_activation_footprint(graph: JobGraph) -> list[int]:
    """Per op of ``graph.ops``, the non-persistent bytes the sequential
    footprint holds while it runs (tensors, scratch, less forwarded bytes)."""
    tas = TensorAccessSequence(graph, UniformLatency())
    persistent = int(tas.size[tas.persistent].sum())
    return [int(b) - persistent for b in JobFootprint(tas).base]


def observed_concurrency_bytes(graph: JobGraph, observed_steps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Per op, the most non-persistent bytes the job held while the op ran in
    any observed step, less the sequential footprint at that op (only where
    they differ). ``observed_steps``: per step, op name -> the most bytes the
    step had allocated (and not yet freed) at any of that op's allocations.
    An op with no allocation of its own in a step (it forwards a buffer, or
    allocates nothing) takes the difference of the last op observed before
    it, but is held to no more than that op held."""
    sequential = sequential_activation_footprint(graph)
    delta = [None] * len(graph.ops)
    for step in observed_steps:
        carried, last_held = 0, None
        for k, o in enumerate(graph.ops):
            held = step.get(o.name)
            if held is not None:
                carried, last_held = int(held) - sequential[k], int(held)
                d = carried
            else:   # nothing allocated since the last observation: no more than it held then
                d = carried if last_held is None else min(carried, last_held - sequential[k])
            delta[k] = d if delta[k] is None else max(delta[k], d)
    return {o.name: d for o, d in zip(graph.ops, delta) if d}
