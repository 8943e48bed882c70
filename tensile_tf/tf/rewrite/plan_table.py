"""The plan-table step: a job's step rewritten once, with swap slots that
read their plan at run time, so that a re-plan which only moves swaps is a
table write (Note [Plans read at run time] in tf_plugin/swap/plan_table.h,
the spec of the slots and ticks; ``run.plan_steps: table``).

``_SlotBuilder`` places the slots and ticks: the step chained in plan
order (every op: a table step has no unchained runs, Note [Unchained
runs]), ticks after the longest ops (Note [Fewer ticks]), activation slots
at every gap of the largest tensors the planner may swap (``MAX_SLOTS``),
variable slots at every gap of such variables and at their two across
iterations.
``encode`` turns a ``JobPlan`` into the table's rows, with the rewrite's
own rules (the pairing of swap-ins with the swap-out whose host copy they
read, the early and late variable swaps, anchors that would close a cycle
left out), or says why the table cannot carry it: then the plan is
rewritten as before (``pipeline.plan_captured``).
"""
from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.job_graph import VARIABLE_PREFIX, JobGraph
from tensile_tf.scheduler.latency import LatencyModel, UniformLatency
from tensile_tf.scheduler.plan import JobPlan, SwapEvent
from tensile_tf.tf.rewrite.activation_swaps import ActivationSwaps
from tensile_tf.tf.rewrite.graph_edit import RewriteReport, _attr, _split_input, _tname
from tensile_tf.tf.rewrite.planned_step import PlannedStep, _ImportedStep, variable_handles
from tensile_tf.tf.rewrite.rewriter import _Rewriter
from tf_plugin import swap as _swap

# Slots go to the largest swappable tensors, every gap of each, until about
# this many: the planner swaps the largest first (every swap in four
# ResNet50 jobs' plans: >= 4 MiB); a plan that swaps a smaller one is
# rewritten instead. Small models get a slot at every gap. Each slot is two
# kernels every step runs, active or not: ResNet50 64x64 (batch 16) gets 536
# slot pairs at 1024 against 2082 at 4096, its first step 4.4-4.6 s against
# 6.6-7.0 s, later steps within the spread of the rewritten plan's, and four
# such jobs' re-plans are all still carried by their tables (issue 43,
# twenty-ninth session); at 512 a momentum swap of the same plan had no slot.
MAX_SLOTS = 1024

# Ticks go after the ops that take longest, this many (and the first op):
# a plan's trigger op between two ticks becomes the tick before it, its
# delta t lengthened by the predicted time in between (Note [Fewer ticks]).
MAX_TICKS = 1024

_UNSWAPPABLE = (tf.string, tf.resource, tf.variant)


@dataclass(frozen=True)
class Slot:
    """One swap slot. ``kind``: "activation"; "variable" (a gap within the
    step); "variable_early" (out and in at the step's start) or
    "variable_late" (out after the step's last access, in at the next
    step's start), the two across iterations. ``serves``: the plan position
    of the access after the gap (the step's first access across
    iterations); ``chain``: an activation's slots share one."""

    index: int
    kind: str
    tensor: str
    serves: int
    chain: int = -1


class _SlotBuilder(_Rewriter):
    """Places ticks and slots into the step chained in plan order."""

    def __init__(self, cf, graph: JobGraph, name: str, table: str, max_slots: int, ticked: list[int]):
        super().__init__(cf, graph, JobPlan(name, step_order="plan"), 1.0, False, enforce_order=True)
        self.table = table
        self.max_slots = max_slots
        # only ops of the step's own graph (not those inlined from a call's body) can be ticked
        self.ticked = [k for k in ticked if graph.ops[k].name in self.edit.nodes]
        self.slots: list[Slot] = []
        self._chains = itertools.count()

    def build(self) -> tf.compat.v1.GraphDef:
        for k in self.ticked:
            op = self.graph.ops[k]
            self.edit.add_node(self._name("tick", str(k)), "TensileOpTick", [f"^{op.name}"],
                               _attr(table=self.table, index=k))
        tas = TensorAccessSequence(self.graph, UniformLatency())
        largest = sorted((i for i in range(len(tas.tensor_names)) if tas.swappable[i]),
                         key=lambda i: (-int(tas.size[i]), tas.tensor_names[i]))
        slots = 0
        for i in largest:
            if slots >= self.max_slots:
                break
            slots += len(tas.acc[i]) + 1
            tensor = tas.tensor_names[i]
            if tensor.startswith(VARIABLE_PREFIX):
                self._variable_slots(tensor)
            elif tas.kind[i] == "activation":
                self._activation_slots(tensor, sorted(a for a in tas.acc[i] if a < len(self.pos)))
        return self.edit.gdef

    def _slot(self, kind: str, tensor: str, serves: int, chain: int = -1) -> Slot:
        slot = Slot(len(self.slots), kind, tensor, serves, chain)
        self.slots.append(slot)
        return slot

    def _activation_slots(self, tensor: str, acc: list[int]) -> None:
        """activation_swaps' structure for every gap with an op inside it,
        each slot reading the version the one before it passed on."""
        node, idx = _split_input(tensor)[:2]
        t = self._tensor_of(tensor)
        if node not in self.edit.nodes or t is None or (node, idx) in self.outputs or t.dtype in _UNSWAPPABLE:
            return
        gaps = acc[1:]   # every gap: the planner weighs even one op's footprint
        if not gaps:
            return
        edges = self._consumer_edges(node, idx)
        chain, current = next(self._chains), tensor
        label = f"{self.plan.name}:{tensor}"
        for j, q in enumerate(gaps):
            slot = self._slot("activation", tensor, q, chain)
            common = dict(T=t.dtype, table=self.table, slot=slot.index, chain=chain, label=label)
            so = self._name("slot_out", tensor)
            self.edit.add_node(so, "TensileSwapSlotOut", [current], _attr(**common))
            si = self._name("slot_in", tensor)
            self.edit.add_node(si, "TensileSwapSlotIn", [so], _attr(shape=t.shape, **common))
            hi = gaps[j + 1] if j + 1 < len(gaps) else len(self.pos)
            for p, cname, k in edges:
                if q <= p < hi:
                    self.edit.set_input(cname, k, _tname(si, 0))
            self._rewire_views(tensor, _tname(si, 0), q, hi)
            current = _tname(si, 0)

    def _variable_slots(self, tensor: str) -> None:
        """variable_swaps' structure, for every gap within the step and for
        both ways across iterations."""
        phs = self.var_placeholders.get(tensor)
        if not phs:
            return
        ph = phs[0]
        res_nodes = [n for p in phs for n in self.resource_nodes.get(p, [])]
        acc = self._accesses(tensor)
        if not acc or any(n not in self.pos for n in res_nodes):
            return
        label = f"{self.plan.name}:{tensor}"
        within = acc[1:]

        def pair(kind: str, serves: int, out_after: list[int], in_after_out: bool, reads: list[str]) -> str:
            slot = self._slot(kind, tensor, serves)
            vo, vi = self._name("var_slot_out", tensor), self._name("var_slot_in", tensor)
            attrs = _attr(table=self.table, slot=slot.index, label=label)
            self.edit.add_node(vo, "TensileVarSlotOut", [ph], attrs)
            self.edit.add_node(vi, "TensileVarSlotIn", [ph] + ([f"^{vo}"] if in_after_out else []), attrs)
            for a in out_after:
                self.edit.add_control(self.graph.ops[a].name, vo, check=False)
            for n in reads:
                self.edit.add_control(vi, n, check=False)
            return vi

        pair("variable_early", acc[0], [], True, res_nodes)
        pair("variable_late", acc[0], acc, False, res_nodes)
        for j, q in enumerate(within):
            vi = pair("variable", q, [a for a in acc if a < q], True, [n for n in res_nodes if self.pos[n] >= q])
            self._read_again(tensor, vi, res_nodes, q, within[j + 1] if j + 1 < len(within) else len(self.pos))


class _Pairing(ActivationSwaps):
    """The rewrite's pairing of swap-ins with swap-outs (``_group_gaps``),
    on plan positions alone."""

    def __init__(self, pos: dict[str, int], plan: JobPlan):
        self.pos, self.plan = pos, plan


@dataclass
class TableRows:
    """A plan encoded for the table, with the report its rewrite would give."""

    rows: list[tuple]
    report: RewriteReport
    restore: list[str] = field(default_factory=list)   # variables the plan keeps on the host between steps


class PlanTableStep:
    """One job's plan-table step: the imported function, its slots and its
    table (named uniquely in the process)."""

    _made = itertools.count()

    def __init__(self, step_fn, example_args, graph: JobGraph, name: str, latencies: LatencyModel, *,
                 max_slots: int = MAX_SLOTS, max_ticks: int = MAX_TICKS):
        cf = step_fn.get_concrete_function(*example_args)
        self.table = f"{name}#{next(self._made)}"
        builder = _SlotBuilder(cf, graph, name, self.table, max_slots, ticked_ops(graph, latencies, max_ticks))
        self.graph_def = builder.build()
        self.ticked = builder.ticked
        self.base_report = builder.report
        self.slots = builder.slots
        self.pos = builder.pos
        self.graph = graph
        self.name = name
        devices = [getattr(x, "device", "") for x in tf.nest.flatten(example_args, expand_composites=True)]
        self.fn = _ImportedStep(self.graph_def, builder.edit.nodes, cf, f"{name}_table", devices)
        self.by_gap = {(s.kind, s.tensor, s.serves): s for s in self.slots}
        self._first_access = {s.tensor: s.serves for s in self.slots if s.kind == "variable_early"}
        self._cf = cf
        self._generations = itertools.count(1)
        self._written = 0
        self._write_lock = threading.Lock()
        self._instantiated = threading.Event()
        self._instantiate_lock = threading.Lock()
        weakref.finalize(self, _swap.forget_plan_table, self.table)   # the C++ table goes with its step

    # -- encoding ----------------------------------------------------------------
    def encode(self, job_plan: JobPlan, latencies: LatencyModel) -> TableRows | str:
        """The plan as table rows, or why the table cannot carry it;
        ``latencies``: the job's now, which time a trigger between two
        ticks (Note [Fewer ticks])."""
        if job_plan.step_order != "plan":
            return "a free-order plan (the table step runs in plan order)"
        if job_plan.recomputes:
            return "the plan recomputes (the table carries swaps alone)"
        rows: list[tuple | None] = [None] * len(self.slots)
        report = RewriteReport(job_plan.name, order_edges=self.base_report.order_edges)
        restore: list[str] = []
        pairing = _Pairing(self.pos, job_plan)
        outs, ins = defaultdict(list), defaultdict(list)
        for e in job_plan.swap_outs:
            outs[e.tensor].append(e)
        for e in job_plan.swap_ins:
            ins[e.tensor].append(e)

        ends = list(itertools.accumulate(latencies.latency_s(o) for o in self.graph.ops))

        def tick(op: str | None, before: int | None) -> tuple[int, float]:
            """The tick a trigger op maps to, and the seconds from its end to the op's end."""
            k = self.pos.get(op) if op is not None else None
            if k is None or (before is not None and k >= before):
                if op is not None:
                    report.dropped_anchors += 1   # as the rewrite drops an anchor that would close a cycle
                return -1, 0.0
            j = bisect.bisect_right(self.ticked, k) - 1
            if j < 0:   # no tick at or before it: at the slot's own start (it runs after its input exists)
                return -1, 0.0
            t = self.ticked[j]
            return t, ends[k] - ends[t]

        def put(slot: Slot | None, row: tuple, what: str) -> str | None:
            if slot is None:
                return f"{what}: no slot at that gap"
            if rows[slot.index] is not None:
                return f"{what}: two swaps in one slot"
            rows[slot.index] = row
            return None

        for tensor in sorted(set(outs) | set(ins)):
            groups = pairing._group_gaps(tensor, outs[tensor], ins[tensor])
            variable = tensor.startswith(VARIABLE_PREFIX)
            for out_ev, group in groups:
                if not variable and (out_ev is None or any(e.cross_iteration for e in group)):
                    return f"swap of {tensor}: no swap-out in the step to read from"
                for k, ev in enumerate(group):
                    q = self.pos.get(ev.serves_op or "")
                    if q is None:
                        return f"swap-in of {tensor}: serves {ev.serves_op}, which the step lacks"
                    why = (self._put_variable(tensor, out_ev, ev, q, tick, put, report, restore) if variable
                           else self._put_activation(tensor, out_ev, ev, q, k, len(group), tick, put, report))
                    if why:
                        return why
        report.restore_needed = restore
        inactive = (False, True, 1, -1, 0.0, -1, 0.0)
        return TableRows([r if r is not None else inactive for r in rows], report, restore)

    def _put_activation(self, tensor: str, out_ev: SwapEvent, ev: SwapEvent, q: int, k: int, reads: int,
                        tick, put, report: RewriteReport) -> str | None:
        first = k == 0
        (out_tick, out_after), (in_tick, in_after) = tick(out_ev.trigger_op if first else None, q), tick(ev.trigger_op, q)
        row = (True, first, reads if first else 0, out_tick, out_after + max(0.0, out_ev.delta_s) if first else 0.0,
               in_tick, in_after + max(0.0, ev.delta_s))
        why = put(self.by_gap.get(("activation", tensor, q)), row, f"swap of {tensor} before {ev.serves_op}")
        if why is None:
            report.activation_swap_outs += int(first)
            report.activation_swap_ins += 1
            report.swapped_bytes_per_step += ev.size_bytes + (out_ev.size_bytes if first else 0)
        return why

    def _put_variable(self, tensor: str, out_ev: SwapEvent | None, ev: SwapEvent, q: int, tick, put,
                      report: RewriteReport, restore: list[str]) -> str | None:
        """variable_swaps' three cases: within the step, early, late. The
        two across iterations sit before the step's first access: their
        ticks must come before it (a later tick waits on the reads that wait
        on the slot), whatever access the plan's swap-in names."""
        first = self._first_access.get(tensor, q)
        cross = ev.cross_iteration or q <= first
        bound = first if cross else q
        trig_out = out_ev.trigger_op if out_ev else None
        early = cross and (trig_out is None or self.pos.get(trig_out, 1 << 30) < bound)
        delta_out = max(0.0, out_ev.delta_s) if out_ev else 0.0
        if not cross:
            kind, (out_tick, out_after) = "variable", tick(trig_out, q)
        elif early:
            kind, (out_tick, out_after) = "variable_early", tick(trig_out, bound)
        else:
            kind, (out_tick, out_after) = "variable_late", tick(trig_out, None)
            restore.append(tensor)
        in_tick, in_after = tick(ev.trigger_op, bound)
        row = (True, True, 1, out_tick, out_after + delta_out, in_tick, in_after + max(0.0, ev.delta_s))
        why = put(self.by_gap.get((kind, tensor, q if kind == "variable" else first)), row,
                  f"swap of {tensor} before {ev.serves_op}")
        if why is None:
            report.variable_swap_outs += 1
            report.variable_swap_ins += 1
            report.swapped_bytes_per_step += 2 * ev.size_bytes
        return why

    # -- running -----------------------------------------------------------------
    def planned_step(self, job_plan: JobPlan, encoded: TableRows) -> PlannedStep:
        """The job's step under ``job_plan``: the shared function, with the
        table written before its first call. ``restore()`` brings back the
        variables this plan's late slots leave on the host (a no-op for
        those in the pool) and drops what an unfinished step held."""
        handles = variable_handles(self._cf, encoded.restore)
        label = f"{job_plan.name}:evict"

        def evict():
            for h in handles:
                _swap.ops.tensile_var_swap_out(h, label=label)

        def restore():
            for h in handles:
                _swap.ops.tensile_var_swap_in(h)
            _swap.drop_plan_table_step(self.table)

        call = TableCall(self, encoded.rows, next(self._generations))
        return PlannedStep(call, job_plan, encoded.report, self.graph_def, restore, evict if handles else None)

    def write(self, rows: list[tuple], generation: int) -> None:
        with self._write_lock:
            if self._written != generation:
                _swap.set_plan_table(self.table, rows, generation)
                self._written = generation

    @property
    def instantiated(self) -> bool:
        return self._instantiated.is_set()

    def instantiate(self) -> None:
        with self._instantiate_lock:
            if not self._instantiated.is_set():
                self.fn.instantiate()
                self._instantiated.set()

    def stats(self) -> dict[str, Any]:
        return _swap.plan_table_stats(self.table)


class TableCall:
    """A plan's call of the shared table step: writes its rows into the
    table first, if the table holds another plan."""

    def __init__(self, table_step: PlanTableStep, rows: list[tuple], generation: int):
        self.table_step, self.rows, self.generation = table_step, rows, generation

    @property
    def needs_instantiation(self) -> bool:
        return not self.table_step._instantiated.is_set()   # noqa: SLF001 - its own step

    def instantiate(self) -> None:
        self.table_step.instantiate()

    def __call__(self, *args):
        self.table_step.write(self.rows, self.generation)
        out = self.table_step.fn(*args)
        self.table_step._instantiated.set()   # noqa: SLF001 - a call instantiates it too
        return out


def ticked_ops(graph: JobGraph, latencies: LatencyModel, max_ticks: int = MAX_TICKS) -> list[int]:
    """Note [Fewer ticks]: the plan positions a tick follows, the first op
    and the ``max_ticks`` ops that take longest.

    Note [Fewer ticks]
    A tick after every op (9,881 on a ResNet50 step) made most of the
    table step's extra nodes. A plan's trigger op k that has no tick of its
    own maps to the tick before it, t, and its delta t grows by the ops'
    predicted time from t's end to k's end: the plan times its transfers by
    the same predictions (seed 000 §III-C's trigger plus delta). The ops
    between are the step's shortest, so little of the time is guessed."""
    lat = [latencies.latency_s(o) for o in graph.ops]
    longest = sorted(range(len(lat)), key=lambda k: (-lat[k], k))[:max_ticks]
    return sorted(set(longest) | ({0} if lat else set()))


_TABLE_STEPS: "weakref.WeakKeyDictionary[Any, PlanTableStep]" = weakref.WeakKeyDictionary()
_TABLE_STEPS_LOCK = threading.Lock()   # the run loop and the background worker (table_then_rewrite.py)


_NOT_BUILT: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()   # step fn -> why no table step


def forget_table_step(step_fn, why: str = "") -> None:
    """Drops the plan-table step kept beside ``step_fn`` (a step parked for another job:
    Note [Reuse under a planner] in tensile_tf/runtime/traced_step_reuse.py); ``why``: why it
    was not built, for the next plan's record (``why_no_table_step``)."""
    with _TABLE_STEPS_LOCK:
        _TABLE_STEPS.pop(step_fn, None)
        _NOT_BUILT.pop(step_fn, None)
        if why:
            _NOT_BUILT[step_fn] = why


def why_no_table_step(step_fn) -> str:
    """Why ``step_fn`` has no ready plan-table step (Note [Table first, rewritten when ready])."""
    with _TABLE_STEPS_LOCK:
        return _NOT_BUILT.get(step_fn, "its plan-table step is being built")


def table_step_for(step_fn, example_args, graph: JobGraph, name: str,
                   latencies: LatencyModel) -> tuple[PlanTableStep, bool]:
    """The job's plan-table step for this traced step and graph, built on
    first use (kept beside the step function, weakly). Returns it and
    whether it was built now."""
    with _TABLE_STEPS_LOCK:
        found = _TABLE_STEPS.get(step_fn)
    if found is not None and found.graph is graph:
        return found, False
    made = PlanTableStep(step_fn, example_args, graph, name, latencies)
    with _TABLE_STEPS_LOCK:
        _TABLE_STEPS[step_fn] = made
    return made, True


def ready_table_step(step_fn, graph: JobGraph) -> PlanTableStep | None:
    """The plan-table step kept beside ``step_fn`` for ``graph`` if it is
    built and instantiated, else None (Note [Table first, rewritten when
    ready] in table_then_rewrite.py: it is built in the background)."""
    with _TABLE_STEPS_LOCK:
        found = _TABLE_STEPS.get(step_fn)
    return found if found is not None and found.graph is graph and found.instantiated else None
