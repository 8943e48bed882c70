"""Tensor Access Sequence generation (seed 000 §IV-A, §III-A "Workload").

A workload W_j is the sequence of tensor accesses <a_j^1, a_j^2, ...> in the
topological (execution) order of its graph; each access has the latency of its
operator, so every access gets a predicted start and end time within one
iteration. An op's execution is the TGA of its outputs and a TUA of its inputs
(an in-place optimizer update is a TUA that writes a new version).

Recomputation (§IV-D) adds re-run ops to the sequence. They are inserted as
extra *steps* right before the op they serve, so a sequence is a list of steps:
the graph's ops plus recompute steps. Step indices, not op indices, are what the
rest of the planner uses; ``step_index`` maps names back.

Times are seconds from the start of the iteration; the sequence repeats with
period ``period_s``. "Unrolled" step indices k (possibly negative or >= n) mean
step k mod n of iteration floor(k / n), which is how cross-iteration intervals
(after the optimizer's update, before the next iteration's first use) are written.

Note [Views read as their owner]
A view (Note [Views] in job_graph) reads its owner's buffer, so each read of
it is an access of the owner: the owner's gaps lie between the reads of
either, and the owner away in a gap frees the buffer, because the rewrite
makes the view again from the swapped-in or recomputed owner for the reads
after the gap (Note [Views made again] in tensile_tf/tf/rewrite/views.py). Before,
a view read late pinned the buffer and the owner's absence freed nothing
while the view lived (``view_spans``). That is still so where the view's op
is stateful (the rewrite does not clone it), and the view that outlives its
owner and every other view still takes the buffer (Note [View takes the
buffer]). Measured on the Transformer encoder (64x128, batch 48, Adam,
planned for 17.2 MiB in plan order): each FFN's ReLU output (3 MiB) stayed
on the device through the attention's backward pass, since the kernel
gradient reading it through Tensordot's Reshape runs before its ReluGrad;
the plan reached 18.7 MiB. Counting the Reshape's reads as the ReLU's, the
same capture plans to 17.1 MiB, swapping 117 MiB a step instead of 129.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tensile_tf.scheduler.inserted_steps import can_insert_into, steps_inserted_into
from tensile_tf.scheduler.job_graph import VARIABLE_PREFIX, JobGraph
from tensile_tf.scheduler.latency import LatencyModel
from tensile_tf.scheduler.step_lists import StepLists


@dataclass(frozen=True)
class TensorAccess:
    """One access of a tensor: its TGA ("TGA"), a read ("TUA"), or an in-place update ("UPDATE")."""

    job: str
    tensor: str
    step: int
    op: str
    kind: str
    start_s: float
    end_s: float


def recompute_step_name(op: str, target: str) -> str:
    return f"{op}@recompute[{target}]"


def parse_recompute_step_name(name: str) -> tuple[str, str] | None:
    """(op, target) of a step named by ``recompute_step_name``; None for a graph op."""
    op, sep, rest = name.partition("@recompute[")
    return (op, rest[:-1]) if sep and rest.endswith("]") else None


def _re_creatable(ops_by_name: dict, view) -> bool:
    """Whether the rewrite can make ``view`` again from its owner's swapped-in
    or recomputed value (Note [Views read as their owner]): its op is a
    stateless graph op."""
    op = ops_by_name.get(view.producer) if view.producer else None
    return op is not None and not op.stateful


def _starts(end: np.ndarray) -> np.ndarray:
    """Each step starts exactly when the one before it ends (``end - latency``
    can round a hair past it, and a transfer timed at an op's end then lands in
    that op instead of the next)."""
    return np.concatenate(([0.0], end[:-1])) if len(end) else np.zeros(0)


class _TensorSide:
    """What a sequence reads of its graph alone, whatever its latencies and
    recomputations: kept on the graph (Note [Structures kept with the graph]),
    shared by every sequence built from it and never written.

    Note [One build of the tensor side]
    A planner builds a sequence for each set of recomputations it tries
    (Note [Sequences built once per recomputation set] in
    scheduler.planner_rebuilds): 25 builds of ResNet50's 9,891 steps and
    11,747 tensors for 16 jobs at 60%, 91 ms each. A sixth of that was the
    tensors' names, sizes and kinds read again, and most of the op loop
    looking up each access's tensor by name. Both are the graph's, so they
    are read once; each op's reads, updates and outputs are kept as tensor
    indices. The sequences are the same (``tests/scheduler/test_fast_paths.py``)."""

    def __init__(self, graph: JobGraph):
        self.names = list(graph.tensors)
        self.tindex = ti = {t: i for i, t in enumerate(self.names)}
        nt = len(self.names)
        self.infos = infos = [graph.tensors[t] for t in self.names]
        self.size = np.fromiter((t.size_bytes for t in infos), dtype=np.int64, count=nt)
        self.kind = [t.kind for t in infos]
        self.persistent = np.fromiter((t.persistent for t in infos), dtype=bool, count=nt)
        self.producer_of = {t.name: t.producer for t in infos}
        self.ops_by_name = {o.name: o for o in graph.ops}
        self.op_touches = [(tuple(ti[t] for t in o.inputs), tuple(ti[t] for t in o.updates),
                            tuple(ti[t] for t in o.outputs)) for o in graph.ops]
        #: Note [Constants stay] in job_graph: a graph constant lives in its op's kernel
        constant = np.fromiter((k == "state" and not t.startswith(VARIABLE_PREFIX)
                                for k, t in zip(self.kind, self.names)), dtype=bool, count=nt)
        self.may_swap = (np.array(self.kind, dtype=object) != "input") & ~constant


class TensorAccessSequence:
    """The Tensor Access Sequence of one job, stored as flat arrays for speed.

    Per step: ``step_names``, ``step_op`` (the graph op it runs), ``latency``,
    ``start``, ``end`` (seconds), ``temp`` (scratch bytes while it runs).
    Per tensor (index i into ``tensor_names``): ``size``, ``kind``, ``acc[i]``
    (sorted steps that access it), ``writes[i]`` (steps that create a new
    version: TGA or update; both ``StepLists``, Note [Access lists kept flat]), ``first``/``last`` (vanilla residency, inclusive
    steps; whole iteration for persistent tensors).

    Note [Access kinds worked out when asked]
    Each build kept a list of access kinds per tensor beside ``acc``: a third
    of the 35,000 lists a ResNet50 sequence makes, and a plan of 16 such jobs
    keeps about a dozen builds, whose 400,000 young lists the first garbage
    collection after the plan walks (0.11-0.2 s of a 2.7-3.3 s plan). Only
    the access views (``accesses``) read the kinds, and ``writes`` and the
    ops decide them, so ``acc_kind`` works them out when first asked. The
    kinds are the ones the build recorded (``tests/scheduler/test_fast_paths.py``).
    """

    def __init__(self, graph: JobGraph, latencies: LatencyModel, recomputes: Sequence = (),
                 like: "TensorAccessSequence | None" = None):
        self.job = graph.name
        self.graph = graph
        self._structure_cache: dict = {}   # what the structure alone decides, shared by ``retimed`` copies
        inserts: dict[str, list] = {}
        for ev in recomputes:
            inserts.setdefault(ev.before_op, []).append(ev)

        # Note [One build of the tensor side]: ``like``, a sequence of the same graph, shares its own
        side = like._tensor_side if like is not None and like.graph.ops is graph.ops \
            and like.graph.tensors is graph.tensors else graph.kept("tensor_side", lambda: _TensorSide(graph))
        self._tensor_side = side
        names = self.tensor_names = side.names
        self.tindex = ti = side.tindex
        nt = len(names)
        infos = side.infos
        self.size = side.size.copy()          # views are given their bytes below
        self.kind = side.kind
        self.persistent = side.persistent
        self.producer_of = side.producer_of
        self.ops_by_name = side.ops_by_name

        self.recompute_target_step: dict[str, int] = {}
        if inserts and can_insert_into(like, graph, latencies):   # Note [Recompute steps inserted into a built sequence]
            steps = steps_inserted_into(like, inserts, recompute_step_name, self.recompute_target_step)
        else:
            steps = self._op_loop(graph, latencies, inserts, side)
        step_names, step_op, latency, temp, concurrent, acc, writes = steps

        n = len(step_names)
        self.n = n
        self.step_names = step_names
        self.step_op = step_op
        self.step_index = {s: k for k, s in enumerate(step_names)}
        self.is_original = np.array([s == o for s, o in zip(step_names, step_op)], dtype=bool)
        self.latency = latency
        self.end = np.cumsum(self.latency) if n else np.zeros(0)
        self.start = _starts(self.end)
        self.period_s = float(self.end[-1]) if n else 0.0
        self.temp = temp
        self.concurrent = concurrent
        first = np.array([(w[0] if w else a[0]) if a else 0 for a, w in zip(acc, writes)], dtype=np.int64)
        last = np.array([a[-1] if a else -1 for a in acc], dtype=np.int64)
        first[self.persistent], last[self.persistent] = 0, n - 1
        # Note [Views] in job_graph: a view has no bytes; its owner stays until
        # the view's last access, and an absence of the owner frees nothing
        # while a view is live (``view_spans``: owner -> inclusive step ranges).
        # Note [View takes the buffer]: the view that outlives its activation
        # owner and every other view holds the buffer alone after that, so from
        # then on the bytes are the view's (``handed_over``: view -> owner).
        # Note [Views read as their owner]: the other views of an activation
        # read its buffer, so their reads are the owner's accesses
        # (``read_as_owner``: view -> owner), which a swap or recomputation of
        # the owner serves (the rewrite re-creates the view from it).
        self.view_spans: dict[int, list[tuple[int, int]]] = {}
        self.handed_over: dict[int, int] = {}
        self.read_as_owner: dict[int, int] = {}
        #: an owner's accesses before its views' reads were added (Note [Recompute steps inserted into a built sequence])
        self.acc_before_views: dict[int, list[int]] = {}
        views_of: dict[int, list[int]] = {}
        for i, info in enumerate(infos):
            owner = ti.get(info.view_of) if info.view_of else None
            if owner is not None:
                self.size[i] = 0
                if last[i] >= 0:
                    views_of.setdefault(owner, []).append(i)
        for owner, views in views_of.items():
            heir = max(views, key=lambda v: (last[v], v))
            held_until = max([last[owner], *(last[v] for v in views if v != heir)])
            if self.kind[owner] == "activation" and last[heir] > held_until and last[owner] >= 0:
                self.handed_over[heir] = owner
                self.size[heir] = infos[owner].size_bytes
                first[heir] = held_until + 1
                views = [v for v in views if v != heir]
            for v in views:
                last[owner] = max(last[owner], last[v])
                if self.kind[owner] == "activation" and _re_creatable(self.ops_by_name, infos[v]):
                    self.read_as_owner[v] = owner
                    self.acc_before_views.setdefault(owner, acc[owner][:])
                    acc[owner][:] = sorted({*acc[owner], *acc[v]})   # the view's reads: reads of the owner
                else:
                    self.view_spans.setdefault(owner, []).append((int(first[v]), int(last[v])))
        self.first, self.last = first, last
        self.acc, self.writes = StepLists(acc), StepLists(writes)    # Note [Access lists kept flat]
        self._start_l = self.start.tolist()
        self._end_l = self.end.tolist()
        self._latencies = latencies
        n_acc = self.acc.lengths()
        #: Algorithm 2's filter: not a model input, not a constant, not empty, and another access to
        #: serve (TAT length > 1)
        self.swappable = side.may_swap & (self.size > 0) & (self.persistent | (n_acc > 1)) & (n_acc > 0)

    def _op_loop(self, graph: JobGraph, latencies: LatencyModel, inserts: dict, side: _TensorSide) -> tuple:
        """(step names, step ops, latencies, scratch, concurrent bytes, acc, writes): the graph's
        ops in order, each one's recompute steps right before it, each access recorded."""
        step_names: list[str] = []
        step_op: list[str] = []
        lat: list[float] = []
        temp: list[float] = []
        concurrent: dict[int, int] = {}   # step -> the op's concurrent_bytes (Note [Free-running steps])
        ti, nt = side.tindex, len(side.names)
        acc: list[list[int]] = [[] for _ in range(nt)]
        writes: list[list[int]] = [[] for _ in range(nt)]

        def touch(i: int, k: int, kind: str) -> None:     # Note [Access kinds worked out when asked]
            if not acc[i] or acc[i][-1] != k:
                acc[i].append(k)
            if kind != "TUA" and (not writes[i] or writes[i][-1] != k):
                writes[i].append(k)

        latency_s = latencies.latency_s
        for op, (reads, updates, outputs) in zip(graph.ops, side.op_touches):
            if inserts:
                for ev in inserts.get(op.name, ()):
                    chain_out: set[str] = set()
                    transient = 0
                    for rop_name in ev.ops:
                        rop = self.ops_by_name[rop_name]
                        for o in rop.outputs:
                            if o != ev.target:
                                transient += graph.tensors[o].size_bytes
                        chain_out.update(rop.outputs)
                    first_chain = len(step_names)
                    for rop_name in ev.ops:
                        rop = self.ops_by_name[rop_name]
                        k = len(step_names)
                        step_names.append(recompute_step_name(rop_name, ev.target))
                        step_op.append(rop_name)
                        lat.append(max(0.0, float(latency_s(rop))))
                        temp.append(rop.temp_bytes)
                        for t in rop.inputs:
                            if t not in chain_out:
                                touch(ti[t], k, "TUA")
                        if ev.target in rop.outputs:
                            touch(ti[ev.target], k, "TGA")
                            self.recompute_target_step[ev.target + "@" + op.name] = k
                    # intermediates and side outputs of the chain live while the chain runs
                    for k in range(first_chain, len(step_names)):
                        temp[k] += transient
            k = len(step_names)
            step_names.append(op.name)
            step_op.append(op.name)
            lat.append(max(0.0, float(latency_s(op))))
            temp.append(op.temp_bytes - op.forwarded_bytes)   # Note [Buffer forwarding] in tensile_tf/tf/step_memory.py
            concurrent[k] = op.concurrent_bytes
            for i in reads:              # ``touch(i, k, "TUA")``, inlined: most accesses are reads
                a = acc[i]
                if not a or a[-1] != k:
                    a.append(k)
            for i in updates:
                touch(i, k, "UPDATE")
            for i in outputs:
                touch(i, k, "TGA")
        n = len(step_names)
        conc = np.zeros(n, dtype=np.int64)
        for k, b in concurrent.items():
            conc[k] = b
        return (step_names, step_op, np.asarray(lat, dtype=np.float64), np.asarray(temp, dtype=np.int64), conc,
                acc, writes)

    def last_use_map(self) -> dict[str, list[str]]:
        """Activity analysis (Algorithm 3 line 2): step name -> activations released after it.
        Cached; shared by ``retimed`` copies, whose structure is the same (made before or after)."""
        cached = self._structure_cache.get("last_use")
        if cached is None:
            cached = {}
            names, steps = self.tensor_names, self.step_names
            for i in np.flatnonzero(~self.persistent & (self.size > 0) & (self.last >= 0)).tolist():
                cached.setdefault(steps[self.last[i]], []).append(names[i])
            self._structure_cache["last_use"] = cached
        return cached

    @property
    def acc_kind(self) -> list[list[str]]:
        """Note [Access kinds worked out when asked]: per tensor, the kind of each of its
        accesses (``acc[i]``): "TGA" where its step's op outputs it (a recompute step its
        target), "UPDATE" where the op updates it in place, else a read ("TUA"). Cached; shared by
        ``retimed`` copies."""
        cached = self._structure_cache.get("acc_kind")
        if cached is None:
            ops, targets = self.ops_by_name, {k: t for t, k in self.recompute_target_step.items()}
            names = self.tensor_names
            cached = []
            for i, (a, w) in enumerate(zip(self.acc, self.writes)):
                written = set(w)
                kinds = []
                for k in a:
                    if k not in written:
                        kinds.append("TUA")
                    elif k in targets:
                        kinds.append("TGA")
                    else:
                        kinds.append("TGA" if names[i] in ops[self.step_op[k]].outputs else "UPDATE")
                cached.append(kinds)
            self._structure_cache["acc_kind"] = cached
        return cached

    # -- access view (§III-C) -------------------------------------------------
    def accesses(self) -> list[TensorAccess]:
        """All accesses in execution order (built on demand; the arrays are the fast path)."""
        out = []
        for i, t in enumerate(self.tensor_names):
            for k, kind in zip(self.acc[i], self.acc_kind[i]):
                out.append(TensorAccess(self.job, t, k, self.step_names[k], kind,
                                        self._start_l[k], self._end_l[k]))
        out.sort(key=lambda a: (a.step, a.kind != "TUA"))
        return out

    def accesses_of(self, tensor: str) -> list[TensorAccess]:
        """TAT[tensor] of Algorithm 2: one tensor's accesses sorted by time."""
        i = self.tindex[tensor]
        return [TensorAccess(self.job, tensor, k, self.step_names[k], kind, self._start_l[k], self._end_l[k])
                for k, kind in zip(self.acc[i], self.acc_kind[i])]

    # -- unrolled time helpers ------------------------------------------------
    def unrolled_name(self, k: int) -> tuple[str, int]:
        q, r = divmod(k, self.n)
        return self.step_names[r], q

    def unrolled_index(self, name: tuple[str, int]) -> int:
        return self.step_index[name[0]] + name[1] * self.n

    def retimed(self, latencies: LatencyModel) -> "TensorAccessSequence":
        """The same sequence with new latencies (§IV-E re-planning): structure shared, times rebuilt."""
        new = object.__new__(TensorAccessSequence)
        new.__dict__.update(self.__dict__)
        if latencies is self._latencies:
            return new
        new._latencies = latencies
        lat = np.fromiter((max(0.0, float(latencies.latency_s(self.ops_by_name[o]))) for o in self.step_op),
                          dtype=np.float64, count=self.n)
        new.latency = lat
        new.end = np.cumsum(lat)
        new.start = _starts(new.end)
        new.period_s = float(new.end[-1]) if self.n else 0.0
        new._start_l = new.start.tolist()
        new._end_l = new.end.tolist()
        return new

    def start_u(self, k: int) -> float:
        q, r = divmod(k, self.n)
        return self._start_l[r] + q * self.period_s

    def end_u(self, k: int) -> float:
        q, r = divmod(k, self.n)
        return self._end_l[r] + q * self.period_s

    def step_at_u(self, t: float) -> int:
        """The unrolled step running at time t (the last one started at or before t)."""
        T = self.period_s
        q = math.floor(t / T) if T > 0 else 0
        r = bisect_right(self._start_l, t - q * T) - 1
        return max(r, 0) + q * self.n

    def step_done_by_u(self, t: float) -> int:
        """The first unrolled step whose end is at or after t (a transfer ending at t is complete after it)."""
        T = self.period_s
        q = math.floor(t / T) if T > 0 else 0
        r = bisect_left(self._end_l, t - q * T - 1e-12)
        if r >= self.n:
            r, q = 0, q + 1
        return r + q * self.n

    def trigger_of(self, t: float) -> tuple[str | None, float, int]:
        """(trigger op, delta t, iteration shift) of an event starting at unrolled time t (§III-D):
        the last graph op that ends at or before t, and the seconds after its end."""
        T = self.period_s
        q = math.floor(t / T) if T > 0 else 0
        tl = t - q * T
        k = bisect_right(self._end_l, tl + 1e-12) - 1
        while k >= 0 and not self.is_original[k]:
            k -= 1
        if k < 0:
            return None, tl, q
        return self.step_names[k], max(0.0, tl - self._end_l[k]), q

    def time_of_trigger(self, trigger: str | None, delta: float, shift: int) -> float:
        base = 0.0 if trigger is None else self._end_l[self.step_index[trigger]]
        return base + delta + shift * self.period_s

    def last_write_le(self, i: int, k: int) -> int | None:
        """Unrolled step of the last write of tensor i at or before unrolled step k (None: never written)."""
        w = self.writes[i]
        if not w:
            return None
        q, r = divmod(k, self.n)
        j = bisect_right(w, r) - 1
        if j >= 0:
            return w[j] + q * self.n
        return w[-1] + (q - 1) * self.n
