"""Op durations read from a ``tf.profiler`` XSpace, for the job whose steps were profiled.

Note [Profiles of one job's steps]. The profiler records every thread's ops,
and several jobs train at once in one process: while one job's step is
profiled (its capture, or a drift check of its latency monitor) the others'
steps run too, and an op event names only its node and type
(``MatMul:MatMul``). Summed by node name, two jobs with same-named ops (raw
``tf.function`` steps, or two trials of one Keras model, whose layers name
their ops alike) fed one job's latency table with the other's time. An op
event runs inside its executor's ``ExecutorState::Process`` event on the
same thread, whose ``id`` stat is the step id of the function run, shared by
the functions that run calls. Each job's step starts with its bind op,
whose node is named for the job (``tf_plugin.device.bind_step_node_name``; the
job's name, not its stream, so that a plan saved for the job's graph fits the
same job in the next run),
so the step ids of the job's steps are those of the Process events that ran
its bind op, and only the op events inside Process events of those ids (the
innermost one open at the event) are the job's. The executor ends a Process event after the
step's caller has its outputs, so a profile can stop before the last one is written: on a loaded
machine the big job's MatMul in test_profile_attribution ran 3 ms inside a Process event the
profile never held (3 profiles in 30). An op after the last written Process event of its thread
is that event's step's (the thread's last; another job's step run next on the same thread and
cut off too would be miscounted: a profile's last few ops at most; 0 in 30 since). Where the
graph has no bind op (a step not made by
``JobStream.step_function``), or the profile holds none of its events,
every event counts, as before.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

PROCESS = "ExecutorState::Process"
BIND_OP_TYPE = "TensileBindStep"


def bind_node_names(graph) -> set[str]:
    """The names of the graph's bind ops (Note [Profiles of one job's steps]); empty without a graph."""
    return {o.name for o in graph.ops if o.op_type == BIND_OP_TYPE} if graph is not None else set()


def _is_bind(node: str, binds: set[str]) -> bool:
    return node in binds or any(node.endswith("/" + b) for b in binds)


def op_durations(xs, binds: set[str] = frozenset()) -> dict[str, list[int]]:
    """Node name -> the durations (ps) of its op events on the host's TensorFlow threads; with
    ``binds``, only the events of the steps that ran one of those bind ops."""
    everyone: dict[str, list[int]] = defaultdict(list)
    by_step: dict[int, list[tuple[str, int]]] = defaultdict(list)    # step id -> (node, duration) of its ops
    for plane in xs.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        id_stat = next((k for k, m in plane.stat_metadata.items() if m.name == "id"), None)
        for line in plane.lines:
            if not line.name.startswith("tf_"):
                continue
            steps, ops = [], []        # (start, end, step id) of Process events; (offset, node, duration) of ops
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                if name == PROCESS:
                    sid = next((st.int64_value for st in ev.stats if st.metadata_id == id_stat), None)
                    steps.append((ev.offset_ps, ev.offset_ps + ev.duration_ps, sid))
                    continue
                node, sep, _ = name.rpartition(":")
                if sep:
                    ops.append((ev.offset_ps, node, ev.duration_ps))
            steps.sort()
            starts = [st[0] for st in steps]
            for offset, node, duration in ops:
                everyone[node].append(duration)
                last = k = bisect_right(starts, offset) - 1
                while k >= 0 and steps[k][1] < offset:    # the innermost Process event still open
                    k -= 1
                if k < 0 and last == len(steps) - 1:      # after the line's last written Process event: its step's
                    k = last
                if k >= 0 and steps[k][2] is not None:
                    by_step[steps[k][2]].append((node, duration))
    mine = [sid for sid, evs in by_step.items() if binds and any(_is_bind(n, binds) for n, _ in evs)]
    if not mine:
        return dict(everyone)
    kept: dict[str, list[int]] = defaultdict(list)
    for sid in mine:
        for node, duration in by_step[sid]:
            kept[node].append(duration)
    return dict(kept)
