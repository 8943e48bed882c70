"""What a job's predicted unplanned (free-running) peak is made of: the
traced steps' spread, and the scratch of ops that may meet on the
executor's threads (``apply_step_memory`` in tensile_tf/tf/step_memory.py
writes both into the graph).

Note [Scratch that meets]
The traced steps show what a job's steps usually hold, not the worst step
it will run. On 2 cores the quickstart's resnet-c (four 27 MiB filter
gradients, Note [Scratch memory] in tensile_tf/tf/step_memory.py) peaked at 48.1 MiB in nearly every step
alone and was predicted 48.1 in four captures of four, but in 3-6% of its
steps beside the other jobs two filter gradients ran at once on the two
inter-op threads and it peaked at 68.6 or 72.6 (27 of 450 steps above 60
MiB, in each of two runs; 1 in 40-60 steps alone, which 16 traced steps
mostly miss). Tracing dozens of steps would catch it now and then, not
surely. So the capture bounds it instead: at most ``inter_op_threads()``
ops of a step run at once, so beside any op up to that many less one
other ops that neither precede nor follow it (data edges; control edges
only order more) may hold their scratch (``scratch_that_meets``); each op's
``concurrent_bytes`` is the larger of that and what the traced steps
observed (Note [Concurrent scratch] in tensile_tf/tf/step_memory.py). Scratch is what no plan can move and
what decides these peaks; outputs and inputs held longer beside an op stay
observed only. resnet-c is then predicted 72.6 MiB, its worst measured step;
the quickstart's other jobs keep their predictions (cnn-a's two 22.4 MiB
gradient ops of one layer already meet in every traced step; the MLP and
the Transformer allocate no scratch). With one inter-op thread nothing is
added. ``UnplannedPeaks`` keeps what the prediction is made of: each traced
step's own peak (the spread ``tensile plan`` prints) and the op whose
scratch the worst step adds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.concurrency import observed_concurrency_bytes
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import UniformLatency
from tensile_tf.scheduler.peak_analysis import JobFootprint


@dataclass
class UnplannedPeaks:
    """What a job's predicted unplanned (free-running) peak is made of
    (Note [Scratch that meets]), in bytes."""

    predicted: int               # the prediction: max of JobFootprint.free_running
    observed: list[int] = field(default_factory=list)   # per traced free step: the peak its own concurrency gives
    threads: int = 1             # inter-op threads it was predicted for
    at_op: str | None = None     # the op at the predicted peak
    scratch_beside: list[str] = field(default_factory=list)   # ops whose scratch meets it there (empty: observed)
    # inputs the job's stream does not hold, not counted (Note [Data held elsewhere] in tensile_tf/tf/step_memory.py)
    inputs_held_elsewhere: dict[str, int] = field(default_factory=dict)

    @property
    def observed_range(self) -> tuple[int, int] | None:
        return (min(self.observed), max(self.observed)) if self.observed else None

    def describe(self) -> str:
        """One line: the prediction, the traced steps' spread and what the worst step adds."""
        from tf_plugin import human_bytes

        text = f"unplanned peak {human_bytes(self.predicted)}"
        rng = self.observed_range
        if rng is not None:
            lo, hi = human_bytes(rng[0]), human_bytes(rng[1])
            if lo == hi:
                spread = lo
            elif lo.split()[-1] == hi.split()[-1]:
                spread = f"{lo.rsplit(' ', 1)[0]}-{hi}"
            else:
                spread = f"{lo}-{hi}"
            text += f" ({spread} over {len(self.observed)} observed steps"
            if self.scratch_beside:
                text += (f"; worst step: {_short(self.at_op)} beside the scratch of "
                         + ", ".join(map(_short, self.scratch_beside)) + f", on {self.threads} inter-op threads")
            text += ")"
        return text

    def to_dict(self) -> dict:
        rng = self.observed_range
        return {"predicted_bytes": self.predicted, "observed_steps": len(self.observed),
                "observed_min_bytes": rng[0] if rng else None, "observed_max_bytes": rng[1] if rng else None,
                "inter_op_threads": self.threads, "at_op": self.at_op, "scratch_beside": list(self.scratch_beside),
                "inputs_held_elsewhere_bytes": sum(self.inputs_held_elsewhere.values())}


def _short(op_name: str | None) -> str:
    """An op's name as a line can show it: its last three scopes."""
    return "/".join((op_name or "").split("/")[-3:])


def inter_op_threads() -> int:
    """The inter-op threads TensorFlow runs ops on: as set, else its default,
    one per core this process may run on (Note [Scratch that meets])."""
    import tensorflow as tf

    n = tf.config.threading.get_inter_op_parallelism_threads()
    if n <= 0:
        n = int(os.environ.get("TF_NUM_INTEROP_THREADS", "0") or 0)
    if n <= 0:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n)


def _op_index_ancestors(graph: JobGraph) -> list[int]:
    """Per op (index in ``graph.ops``), a bit set of the ops it waits for
    through data edges (its inputs' producers, and theirs)."""
    index = {o.name: k for k, o in enumerate(graph.ops)}
    anc = [0] * len(graph.ops)
    for k, o in enumerate(graph.ops):
        a = 0
        for t in set(o.inputs) | set(o.updates):
            p = graph.tensors[t].producer
            j = index.get(p) if p is not None else None
            if j is not None and j != k:
                a |= anc[j] | (1 << j)
        anc[k] = a
    return anc


def scratch_that_meets(graph: JobGraph, threads: int) -> dict[str, list[str]]:
    """Note [Scratch that meets]: per op, the ops (at most ``threads`` - 1,
    largest scratch first) that neither precede nor follow it, so that they
    may run beside it on the executor's threads holding their scratch; only
    ops that have some."""
    if threads <= 1:
        return {}
    ops = graph.ops
    with_scratch = sorted((k for k, o in enumerate(ops) if o.temp_bytes > 0), key=lambda k: (-ops[k].temp_bytes, k))
    if not with_scratch:
        return {}
    anc = _op_index_ancestors(graph)
    out: dict[str, list[str]] = {}
    for k, o in enumerate(ops):
        beside: list[str] = []
        for j in with_scratch:
            if j == k or (anc[k] >> j) & 1 or (anc[j] >> k) & 1:
                continue
            beside.append(ops[j].name)
            if len(beside) >= threads - 1:
                break
        if beside:
            out[o.name] = beside
    return out


def unplanned_peaks(graph: JobGraph, observed_steps: Sequence[dict[str, int]], observed: dict[str, int],
                    meets: dict[str, list[str]], threads: int) -> UnplannedPeaks:
    """The predicted unplanned peak of ``graph`` (its ops' ``concurrent_bytes``
    written), each observed step's own peak (that step's concurrency on the
    sequential footprint; their largest is the peak the observed
    concurrency, ``observed``, gives) and the op and scratch the
    prediction's peak adds."""
    fp = JobFootprint(TensorAccessSequence(graph, UniformLatency()))
    if not len(fp.base):
        return UnplannedPeaks(0, threads=threads)
    names = [o.name for o in graph.ops]
    per_step = []
    for step in observed_steps:
        delta = observed_concurrency_bytes(graph, [step])
        per_step.append(int(max(b + delta.get(n, 0) for b, n in zip(fp.base, names))))
    k = int(fp.free_running.argmax())
    predicted = int(fp.free_running[k])
    added = meets.get(names[k], []) if graph.ops[k].concurrent_bytes > observed.get(names[k], 0) else []
    return UnplannedPeaks(predicted, per_step, threads, names[k], list(added))


def graph_needs(name: str, step_fn, args: Sequence, optimizer=None) -> tuple[int, int] | None:
    """(persistent, temporary) bytes of the unplanned step predicted from its traced graph alone,
    without running it: the graph's parameters, optimizer state and inputs, and its step's own
    tensors at their peak; static shapes, dynamic ones and kernels' scratch counted 0 (the CNN of
    tests/tf/test_small_pool.py: 129.7 MiB predicted, 132.4 MiB measured alone). A plain Python
    ``step_fn`` is traced as a ``tf.function``; the custom gradients that trace registers are
    forgotten after it (they would hold the variables: Note [Custom gradients keep traced jobs alive]
    in tf_plugin/tf_internals.py). None where the graph cannot be traced or captured. Issue 58:
    what a job refused for a pool too small is told it needs, and what a ``TrainStep`` job is
    admitted on before its first step measures it (``Job.from_train_step``)."""
    import tensorflow as tf

    from tensile_tf.tf.capture import capture_job_graph
    from tf_plugin.tf_internals import custom_gradient_names, forget_custom_gradients

    registered_before = custom_gradient_names()
    try:
        if not hasattr(step_fn, "get_concrete_function"):
            step_fn = tf.function(step_fn, jit_compile=False)
        return footprint_needs(capture_job_graph(name, step_fn, args, optimizer=optimizer, measure_dynamic=False))
    except Exception:  # noqa: BLE001 - a prediction only: without it the job is measured, as before
        return None
    finally:
        forget_custom_gradients(custom_gradient_names() - registered_before)


def footprint_needs(graph: JobGraph) -> tuple[int, int]:
    """(persistent, temporary) bytes of a captured graph's unplanned step, in plan order."""
    from tensile_tf.scheduler.job_graph import PERSISTENT_KINDS

    peak = JobFootprint(TensorAccessSequence(graph, UniformLatency())).vanilla_peak
    persistent = min(graph.total_bytes(PERSISTENT_KINDS), peak)
    return int(persistent), int(peak - persistent)
