"""What the pool's event trace of real steps adds to a job's captured graph,
and the order TensorFlow's executor runs its ops in (``executor_order``).

``measure_step_memory`` runs a step a few times with the pool's trace on and
reads, per op, the bytes the graph alone does not show; ``apply_step_memory``
writes them into the ``JobGraph`` the planner plans from.

Note [Scratch memory]
Some kernels allocate large buffers that are neither inputs nor outputs:
TensorFlow's CPU convolution backprops build im2col-style patch buffers of
about kernel_h * kernel_w times the input activation. They decide the peak of
every convolutional network on this CPU and no plan can swap them.
``measure_step_memory`` reads them from the pool's event trace of a step
(an allocation freed by the op that made it) and stores them as each op's
``temp_bytes``, so the planner's footprint (and its predicted peak) counts
them, as §IV-B counts every allocation the step makes.

Note [Buffer forwarding]
TensorFlow's elementwise kernels (Relu, ReluGrad, Add, Mul, RealDiv, AddN...)
write their output into an input's buffer when nothing else will read that
input. The graph counts the output as a new tensor beside its input at that
op (9 MiB twice at ResNet50's predicted peak, 96x96 batch 16). The same
trace shows it: an output the op never allocated, of the size of a
non-persistent input the op reads last, is that input's buffer.
``measure_step_memory`` records its bytes as the op's ``forwarded_bytes``,
which the footprint takes off at that op.

Note [Concurrent scratch]
The executor runs ready ops on several inter-op threads, so while an op runs
the pool also holds what ops beside it allocated: their scratch, and outputs
the sequential footprint counts only later; and ops the sequential order
leaves waiting run sooner and free their inputs sooner. ``measure_step_memory``
records, per traced step, the bytes the job held at each op's allocations;
``tensile_tf.scheduler.concurrency.observed_concurrency_bytes`` turns them
into each op's ``concurrent_bytes``, the worst traced step's difference from
the sequential footprint (Note [Observed, not simulated] there). It replaced a
structural rule (an op's siblings, ops reading a common activation, run beside
it) that missed the node-group CNN's peak by 15% and over-predicted
InceptionV3 by 19% (benchmarks/RESULTS.md, Issue 15).

Note [Scratch that meets] (in tensile_tf/tf/unplanned_peaks.py) bounds what the traced steps miss.

Note [Data held beside the step]
A job holds more than its step's tensors between steps: the batches its
data source keeps in the pool (a YAML job's synthetic data was
``data.num_batches`` batches, now the next batch where ``data.prefetch``
asks for it, Note [Input data on the host] in jobs.py; a ``tf.data`` pipeline holds its arrays and
prefetched elements), all but the one the step reads. The graph counts
parameters, slots and that one batch, so these bytes were missing from every
prediction: -2.7% for the quickstart's CNN, -8.9% for its Transformer, -20%
for its MLP (three extra 0.4 MiB batches beside 5 MiB). ``measure_step_memory``
reads the job's pool bytes once each traced step has ended (only on a job's
own stream: a step run on the default stream, as the benchmarks do, shares
it with everything else the process holds), and
``apply_step_memory`` adds what exceeds the graph's persistent tensors as one
tensor, ``HELD_BESIDE_STEP``: an input (held all step, never swapped, Algorithm
2's filter) that no op reads, so the footprint, the budget and admission
count it, and a plan refers to nothing of it (``JobGraph.fingerprint`` skips
it).

Note [Data held elsewhere]
The other way round: a batch that a ``tf.data`` pipeline makes (a
``function`` or dataset data source) is allocated by the pipeline's own
threads, on the pool's ``default`` stream, not on the job's, and the step
reads it there. The graph counted it as the job's input all the same, so a
plan's predicted peak held one batch more than the job's stream ever holds,
while admission counted it again among the bytes held outside the jobs
(issue 58: an MLP at batch 2048 planned 21.7 MB of temporaries against 15.2
measured, the 6.4 MB batch twice, and a search that packed two trials
unplanned packed one planned). So where the job's stream holds less between
steps than the graph's persistent tensors, the inputs it does not hold
(largest first, each within the shortfall) are sized 0, the bytes of the
job's memory they are (``inputs_held_elsewhere``), and
``StepMemory.held_elsewhere`` names them with the bytes they had. Inputs are never swapped or
recomputed (Algorithm 2's filter), so nothing a plan does refers to their
size. On a CPU a batch made by ``tf.constant`` from a NumPy array can be
held elsewhere too: measured (issue 57), an 8 MiB float32 array NumPy owns
at an address 48 past a multiple of 64 came to no pool bytes (nor host
fallback), shared no memory with the array, while one at 0, 16 or 32 past,
or any view, came to 8 MiB of the job's stream. Where the heap puts an array
decides it, so such an input is held elsewhere in one process and not in the
next; the capture says which it was.

Note [Memory of the step as planned]
The buffers an op allocates depend on the graph TensorFlow runs, and
Grappler rewrites the free-running step and the step chained in plan order
(Note [Plan order] in tensile_tf/tf/rewrite/rewriter.py) differently: its remapper fuses
a convolution with its bias add (one buffer, allocated by the fused op under
the BiasAdd's name) where no control edge is in the way, and the chain puts
control edges on both. So in the free step's trace ResNet50's convolutions
allocate nothing and their outputs read as views of a same-sized input (Note
[Views] in tensile_tf/scheduler/job_graph.py): no bytes of their own. The
chained step allocates each convolution's output and writes the bias add
into it. The planner, taking a convolution's output for free, recomputed the
bias add from it and counted its megabyte off; the planned step kept both
(ResNet50 64x64, batch 16, half its peak on the 110 MiB/s link: planned
356.2 MiB, measured 394.1, about 1 MiB more per convolution). So a
plan-order capture (``capture_for_planning`` with ``step_order`` "plan" or
"auto") reads scratch, forwarded bytes and views from the chained step's
trace (an empty plan's rewrite, whose op names carry the rewrite's prefix),
as it measures its latencies there (Note [Latency time base] in
tensile_tf/scheduler/latency.py); the free step still gives what the
executor's threads hold beside each op (Note [Concurrent scratch]) and what
the job holds between steps. Where the chained step runs out of memory, the
free step's trace stands.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import tf_plugin
from tensile_tf.tf.pool import ops_of_traced_names
from tensile_tf.tf.capture import snapshot_variables
from tensile_tf.tf.unplanned_peaks import UnplannedPeaks, inter_op_threads, scratch_that_meets, unplanned_peaks
from tensile_tf.scheduler.concurrency import observed_concurrency_bytes
from tensile_tf.scheduler.job_graph import HELD_BESIDE_STEP, JobGraph, TensorInfo


def _size_matches(a: int, b: int) -> bool:
    return abs(a - b) <= max(256, b // 100)   # the pool rounds requests up to its chunk granularity


@dataclass
class StepMemory:
    """What the pool's trace of a few steps says beyond the graph's tensors."""

    scratch: dict[str, int]      # op -> bytes it allocated and freed while it ran (Note [Scratch memory])
    forwarded: dict[str, int]    # op -> output bytes held in a dying input's buffer (Note [Buffer forwarding])
    views: dict[str, str]        # tensor -> the tensor whose buffer it shares (Note [Views] in job_graph)
    held: list[dict[str, int]]   # per step: op -> most bytes the step held at its allocations (Note [Concurrent scratch])
    between_steps_bytes: int | None = None   # the job's pool bytes between two steps (Note [Data held beside the step])
    threads: int = 1             # the inter-op threads the steps ran on (Note [Scratch that meets])
    # inputs the job's stream does not hold, with their bytes (Note [Data held elsewhere])
    held_elsewhere: dict[str, int] | None = None


# Steps traced for Note [Concurrent scratch]: the node-group CNN's steps meet
# their worse overlap in 11 to 18 of 30 steps, in runs (12 calm steps in a
# row were seen), so up to TRACED_STEPS steps are traced, fewer when they take
# longer than TRACED_SECONDS together (at least MIN_TRACED_STEPS).
TRACED_STEPS = 16
MIN_TRACED_STEPS = 2
TRACED_SECONDS = 2.0


# One reader of the pool's event trace at a time: a capture clears it before each traced step
# (Note [Captures from training steps] in tensile_tf/runtime/training_capture.py traces from a job's thread)
POOL_TRACE = threading.Lock()


def traced_step(run, *, blocking: bool = True) -> tuple[list[dict], dict[int, int]] | None:
    """Runs ``run()`` with the pool's trace cleared before it; returns its trace and each
    stream's bytes once it ended, or None (it ran untraced) when another reader held the
    trace and ``blocking`` is False."""
    if not POOL_TRACE.acquire(blocking=blocking):
        run()
        return None
    try:
        pool = tf_plugin.device_pool()
        pool.clear_trace()
        run()
        return pool.trace(), {j["stream"]: j["current"] for j in pool.stats()["jobs"].values()}
    finally:
        POOL_TRACE.release()


def measure_step_memory(step_fn, args: Sequence, graph: JobGraph, *, steps: int = TRACED_STEPS,
                        run_fn=None, op_name_prefix: str = "") -> StepMemory:
    """Each op's scratch and forwarded bytes, the tensors that are views,
    and what each traced step held at each op's allocations, from the pool's
    trace of up to ``steps`` steps. The variables are restored afterwards.
    ``run_fn``: the function traced instead of ``step_fn`` (a rewrite of it
    that updates the same variables, whose op names carry ``op_name_prefix``;
    Note [Memory of the step as planned]). It runs once untraced first (a
    function's first run also allocates what later runs reuse)."""
    restore = snapshot_variables(step_fn.get_concrete_function(*args).graph)
    run_fn = run_fn or step_fn
    traced = []
    try:
        run_fn(*args)
        began = time.perf_counter()
        while len(traced) < max(1, steps):
            traced.append(traced_step(lambda: run_fn(*args)))
            if len(traced) >= MIN_TRACED_STEPS and time.perf_counter() - began > TRACED_SECONDS:
                break
    finally:
        restore()  # also when a step fails (out of memory)
    return step_memory_of(traced, graph, op_name_prefix)


def step_memory_of(traced: Sequence[tuple[list[dict], dict[int, int]]], graph: JobGraph,
                   op_name_prefix: str = "") -> StepMemory:
    """The StepMemory of traced steps (``traced_step``'s results, the first one's buffers)."""
    traces = [t for t, _ in traced]
    ops_of = ops_of_traced_names(graph.ops, {ev["op"] for tr in traces for ev in tr if ev["kind"] == "alloc"},
                                  op_name_prefix)
    scratch, forwarded, views = _buffers(traces[0], graph, ops_of)
    stream = _job_stream(traces[0], ops_of)
    # the default stream holds whatever the process made outside jobs: only a job's own stream tells
    own = stream is not None and stream != tf_plugin.DEFAULT_STREAM
    held_between = [b[stream] for _, b in traced if stream in b] if own else []
    return StepMemory(scratch, forwarded, views, [_held_at_allocations(tr, ops_of, graph) for tr in traces],
                      min(held_between) if held_between else None, threads=inter_op_threads())


def _job_stream(trace: list[dict], ops_of: dict[str, list]) -> int | None:
    """The stream most of the step's allocations by the graph's ops came from
    (others' jobs may run beside it)."""
    streams = [ev["stream"] for ev in trace if ev["kind"] == "alloc" and ev["op"] in ops_of]
    return max(set(streams), key=streams.count) if streams else None


def _held_at_allocations(trace: list[dict], ops_of: dict[str, list], graph: JobGraph) -> dict[str, int]:
    """Op -> the most bytes the job's pool use had grown by since the step
    began, at any of the op's allocations. Only the job's own stream counts
    (others may run beside it); an allocation by an op the graph does not
    know (a Grappler rewrite) counts for the op the trace saw before it; one
    under a truncated name that stands for several ops counts for the one
    of them that runs (``_Namesakes``)."""
    stream = _job_stream(trace, ops_of)
    if stream is None:
        return {}
    namesakes = {name: _Namesakes(ops, graph) for name, ops in ops_of.items() if len(ops) > 1}
    held = 0
    current: list = []
    out: dict[str, int] = {}
    for ev in trace:
        if ev["stream"] != stream:
            continue
        if ev["kind"] == "alloc":
            held += ev["bytes"]
            if ev["op"] in namesakes:
                running, _ = namesakes[ev["op"]].allocation(ev["bytes"])
                current = [running] if running is not None else ops_of[ev["op"]]
            else:
                current = ops_of.get(ev["op"], current)
            for o in current:
                out[o.name] = max(out.get(o.name, 0), held)
        elif ev["kind"] == "free":
            # also buffers made before the step: an optimizer update that
            # copies a variable frees the old buffer (held counts the change)
            held -= ev["bytes"]
    return out


def _buffers(trace: list[dict], graph: JobGraph, ops_of: dict[str, list]
             ) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
    """Scratch bytes per op, forwarded bytes per op and views, from one step's trace."""
    live: dict[int, list] = {}
    allocs: dict[str, list[list]] = {}       # traced op name -> [[bytes, freed within the step]]
    for ev in trace:
        if ev["kind"] == "alloc" and ev["op"]:
            entry = [ev["bytes"], False]
            allocs.setdefault(ev["op"], []).append(entry)
            live[ev["offset"]] = entry
        elif ev["kind"] == "free" and ev["offset"] in live:
            live.pop(ev["offset"])[1] = True
    last_use: dict[str, str] = {t: o.name for o in graph.ops for t in o.inputs}   # tensor -> its last reader
    scratch: dict[str, int] = {}
    forwarded: dict[str, int] = {}
    unallocated: dict[str, list[str]] = {}   # op -> its outputs no allocation of its own matched
    for name, entries in allocs.items():
        ops = ops_of.get(name)
        if not ops:
            continue
        if len(ops) > 1:
            _scratch_of_namesakes(entries, ops, graph, scratch)
            continue
        outputs = [(t, graph.tensors[t].size_bytes) for o in ops for t in o.outputs]
        for size, was_freed in sorted(entries, key=lambda a: -a[0]):
            match = next((i for i, (_, b) in enumerate(outputs) if _size_matches(size, b)), None)
            if match is not None:
                outputs.pop(match)   # one of the op's outputs, counted as a tensor already
            elif was_freed:
                scratch[ops[0].name] = scratch.get(ops[0].name, 0) + size
        unallocated[ops[0].name] = [t for t, _ in outputs]
    # An op that allocated nothing never shows up in the trace: all its outputs are unallocated.
    traced = {o.name for name in allocs for o in ops_of.get(name, ())}
    for op in graph.ops:
        if op.name not in traced:
            unallocated[op.name] = list(op.outputs)
    # Note [Buffer forwarding]: an output the op never allocated, of the size
    # of an input whose last reader the op is, lives in that input's buffer;
    # of the size of an input read later too, it is a view of it (Note [Views]).
    views: dict[str, str] = {}
    for op in graph.ops:                       # in order: a view's input may be a view already
        outs = unallocated.get(op.name)
        if not outs:
            continue
        candidates = list(dict.fromkeys(op.inputs))
        for t in outs:
            size = graph.tensors[t].size_bytes
            fits = [d for d in candidates if size > 0 and _size_matches(graph.tensors[d].size_bytes, size)]
            # an input this op reads last before one read later: TensorFlow
            # forwards only into a buffer nothing else will read (ResNet50's
            # residual Add writes into its batch norm's output, not into the
            # shortcut, which the backward pass reads again)
            donor = next((d for d in fits if last_use.get(d) == op.name and not graph.tensors[d].persistent),
                         fits[0] if fits else None)
            if donor is None:
                continue
            candidates.remove(donor)
            if last_use.get(donor) == op.name and not graph.tensors[donor].persistent:
                forwarded[op.name] = forwarded.get(op.name, 0) + size
            else:
                views[t] = views.get(donor, donor)
    return scratch, forwarded, views


class _Namesakes:
    """Which of the ops one truncated traced name stands for made each of
    the name's allocations (Note [Truncated op names]: ResNet50's sixteen
    ".../_2_conv_1/convolution/Conv2DBackpropFilter" ops). ``ops``: in plan
    order, the order they run in. An allocation of the size of an output of
    one of them not seen yet is that op's output, and that op (the first
    such one; the ones before it made no allocation of their own) runs from
    then on; any other allocation is the running op's (None before the
    first output: the name's ops, undecided)."""

    def __init__(self, ops: list, graph: JobGraph):
        self.ops = ops
        self._pending = [[graph.tensors[t].size_bytes for t in o.outputs] for o in ops]
        self._first = 0
        self.running = None

    def allocation(self, size: int) -> tuple:
        """(the op that made an allocation of ``size`` bytes or None, whether it is that op's output)."""
        hit = next((k for k in range(self._first, len(self.ops))
                    if any(_size_matches(size, b) for b in self._pending[k])), None)
        if hit is None:
            return self.running, False
        outs = self._pending[hit]
        outs.pop(next(i for i, b in enumerate(outs) if _size_matches(size, b)))
        self._first, self.running = hit if outs else hit + 1, self.ops[hit]
        return self.running, True


def _scratch_of_namesakes(entries: list[list], ops: list, graph: JobGraph, scratch: dict[str, int]) -> None:
    """Scratch bytes of ops that one truncated traced name stands for.
    ``entries``: the name's allocations in trace order, ``[bytes, freed]``.
    An allocation freed within the step that is no output is the scratch of
    the op that runs (``_Namesakes``). Sharing the bytes out evenly, as
    before, put 1.4 MiB of scratch on each of ResNet50's sixteen filter
    gradients and missed its peak at half its size by the largest one's
    21 MiB."""
    who = _Namesakes(ops, graph)
    for size, was_freed in entries:
        running, is_output = who.allocation(size)
        if was_freed and not is_output:
            for o in ([running] if running is not None else ops):
                scratch[o.name] = scratch.get(o.name, 0) + (size if running is not None else size // len(ops))


def inputs_held_elsewhere(graph: JobGraph, shortfall: int) -> dict[str, int]:
    """Note [Data held elsewhere]: the graph's inputs that make up ``shortfall`` (what its
    persistent tensors count beyond what the job's stream holds), sized 0 in ``graph``;
    name -> the bytes they had."""
    inputs = sorted((t for t in graph.tensors.values() if t.kind == "input" and not t.view_of
                     and t.name != HELD_BESIDE_STEP and t.size_bytes > 0),
                    key=lambda t: (-t.size_bytes, t.name))
    elsewhere: dict[str, int] = {}
    for t in inputs:
        if t.size_bytes <= shortfall or _size_matches(shortfall, t.size_bytes):
            elsewhere[t.name] = t.size_bytes
            shortfall -= t.size_bytes
            t.size_bytes = 0
    return elsewhere


def apply_step_memory(graph: JobGraph, memory: StepMemory) -> UnplannedPeaks:
    """Writes what ``measure_step_memory`` found into the graph: scratch,
    forwarded bytes, views, then each op's ``concurrent_bytes``: the worst
    traced step's, or scratch that may meet it on the executor's threads,
    whichever is larger (Note [Scratch that meets]). Returns what the
    predicted unplanned peak is made of."""
    for o in graph.ops:
        o.temp_bytes = memory.scratch.get(o.name, o.temp_bytes)
        o.forwarded_bytes = memory.forwarded.get(o.name, 0)
    for t, owner in memory.views.items():
        graph.tensors[t].view_of = owner
    if memory.between_steps_bytes is not None:
        held = memory.between_steps_bytes - sum(t.size_bytes for t in graph.tensors.values()
                                                if t.persistent and not t.view_of)
        if held > 0:   # Note [Data held beside the step]
            graph.tensors[HELD_BESIDE_STEP] = TensorInfo(HELD_BESIDE_STEP, held, kind="input")
        elif held < 0:
            memory.held_elsewhere = inputs_held_elsewhere(graph, -held)
    observed = observed_concurrency_bytes(graph, memory.held)
    meets = scratch_that_meets(graph, memory.threads)
    scratch = {o.name: o.temp_bytes for o in graph.ops}
    for o in graph.ops:
        beside = sum(scratch[j] for j in meets.get(o.name, ()))
        o.concurrent_bytes = max(observed.get(o.name, 0), beside) if beside else observed.get(o.name, 0)
    peaks = unplanned_peaks(graph, memory.held, observed, meets, memory.threads)
    peaks.inputs_held_elsewhere = dict(memory.held_elsewhere or {})
    return peaks
