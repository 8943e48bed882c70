"""The rewriter: one job's traced step and its plan -> the edited GraphDef.
It reads the step, bypasses the gradient barrier, chains the ops in plan order
(phase 1), then hands each event to its phase: activation swaps, variable
swaps, recomputation and views each live in their own module, as mixins of
``_Rewriter``.

Note [Plan order]
The planner predicts the footprint of one op order (``graph.ops``); TF's
dataflow executor may run ready ops in another, and the swap anchors and
release points only match the prediction in the plan's order. So, as
TENSILE's Executor "executes each operator node in the graph by topological
order" (§III-B), the rewrite chains the graph's ops with control edges in plan
order (``enforce_order``). Each op still uses intra-op threads; inter-op
parallelism between graph ops is given up: little on a chain model, but
InceptionV3's step (batch 48, 2 cores) takes 1.4-1.5x as long chained as
unchained, so a plan can instead
leave its ops free and be planned for that (Note [Free-order plans] in
tensile_tf/scheduler/peak_analysis.py). A plan-order plan chains runs of
ops, not single ops, where its footprint has slack for any order inside a
run (``JobPlan.unchained_runs``, Note [Unchained runs] in
tensile_tf/scheduler/unchained_runs.py). ``tensile_tf.pipeline.executor_order``
picks the order close to the one TF's executor would pick anyway.

Every added control edge is checked for cycles first; an anchor that would
close a cycle is dropped (counted in the report) and correctness still holds
through the data edges. Events the runtime cannot carry out (constants,
function outputs, tensors of unsupported dtype) are skipped and listed.

Note [No gradient barrier]
Keras 3's optimizers pass every gradient through one ``IdentityN`` before
the first update (``adam/IdentityN``), so in plan order no update can start
before the last gradient exists and every gradient is live at once.
Grappler drops that node from the free-running step, so the chained step
held what the unplanned one never does: InceptionV3 (75x75, batch 16) with
an empty plan peaked at 391 MiB against 327 unplanned, 95.5 MiB of
gradients live at the peak against 7.9. The capture already reads through
an ``IdentityN`` (an alias, ``capture.py``); the rewrite now points each
consumer of one at its inputs and removes it, and
``tensile_tf.pipeline.executor_order`` orders through it, so each update
runs once its own gradient exists: the empty plan peaks at 323 MiB. An
``IdentityN`` the step returns, or that something waits on as a whole
(control input, or with control inputs of its own), stays.
"""
from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import UniformLatency
from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.tf.capture import variable_keys
from tensile_tf.tf.rewrite.activation_swaps import ActivationSwaps
from tensile_tf.tf.rewrite.graph_edit import _PREFIX, RewriteReport, _GraphEdit, _split_input, bypassed_identity_n
from tensile_tf.tf.rewrite.recomputation import Recomputation
from tensile_tf.tf.rewrite.variable_swaps import VariableSwaps
from tensile_tf.tf.rewrite.views import ViewRewrites


@dataclass
class _StepBase:
    """What every rewrite of one traced step starts from, whatever the plan.

    Note [One base per traced step]
    A re-plan rewrites the same traced steps again and again. Reading the
    step's GraphDef, bypassing its gradient barrier (Note [No gradient
    barrier]), indexing its views and its variables' placeholders do not
    depend on the plan: about 0.15 s of each ResNet50 rewrite (14,461
    nodes). They are done once per traced step and kept beside it (weakly:
    the base goes with the step), and each rewrite edits a copy."""

    graph: JobGraph
    gdef: bytes          # serialized: each rewrite parses its own copy to edit
    views_read_as: dict[str, list[str]]
    var_placeholders: dict[str, list[str]]
    resource_nodes: dict[str, list[str]]


_BASES: "weakref.WeakKeyDictionary[Any, _StepBase]" = weakref.WeakKeyDictionary()


def _step_base(cf, graph: JobGraph) -> _StepBase:
    """The traced step's base for ``graph`` (Note [One base per traced step])."""
    base = _BASES.get(cf)
    if base is not None and base.graph is graph:
        return base
    fg = cf.graph
    edit = _GraphEdit(fg.as_graph_def())
    _bypass_identity_n(edit, {t.op.name for t in fg.outputs})
    tas = TensorAccessSequence(graph, UniformLatency())
    views_read_as: dict[str, list[str]] = defaultdict(list)
    for v, owner in sorted(tas.read_as_owner.items()):
        views_read_as[tas.tensor_names[owner]].append(tas.tensor_names[v])
    var_keys = variable_keys(fg)
    var_placeholders: dict[str, list[str]] = defaultdict(list)
    for ext, internal in fg.captures:
        if id(ext) in var_keys:
            var_placeholders[var_keys[id(ext)]].append(internal.op.name)
    resource_nodes: dict[str, list[str]] = defaultdict(list)
    for n in edit.gdef.node:
        for s in n.input:
            src, _, ctrl = _split_input(s)
            if not ctrl and edit.nodes.get(src) is not None and edit.nodes[src].op == "Placeholder":
                resource_nodes[src].append(n.name)
    base = _StepBase(graph, edit.gdef.SerializeToString(), dict(views_read_as), dict(var_placeholders),
                     dict(resource_nodes))
    _BASES[cf] = base
    return base


def _bypass_identity_n(edit: _GraphEdit, returned: set[str]) -> None:
    """Note [No gradient barrier]: consumers of an IdentityN read its
    inputs directly and the IdentityN goes."""
    gone = []
    for name in sorted(bypassed_identity_n(edit.gdef.node, returned)):
        n = edit.nodes[name]
        consumers = edit.succ.get(name, set())
        data = list(n.input)
        for c in list(consumers):
            for k, i in enumerate(edit.nodes[c].input):
                src, idx, _ = _split_input(i)
                if src == name:
                    edit.set_input(c, k, data[idx])
        gone.append(name)
    if gone:
        edit.remove_nodes(set(gone))


class _Rewriter(ActivationSwaps, VariableSwaps, Recomputation, ViewRewrites):
    def __init__(self, cf, graph: JobGraph, job_plan: JobPlan, delta_scale: float, check_lateness: bool,
                 enforce_order: bool = True):
        self.cf = cf
        self.fg = cf.graph
        self.graph = graph
        self.plan = job_plan
        self.delta_scale = delta_scale
        self.check_lateness = check_lateness
        base = _step_base(cf, graph)
        self.edit = _GraphEdit(tf.compat.v1.GraphDef.FromString(base.gdef))
        self.pos = {o.name: k for k, o in enumerate(graph.ops)}
        self.report = RewriteReport(job_plan.name)
        self._uid = 0
        if enforce_order:
            self._chain()
        self.clone_of: dict[str, str] = {}   # recomputation clone node -> the node it copies
        self.outputs = {self.edit.canonical(*_split_input(t.name)[:2]) for t in self.fg.outputs}
        self._consumers: dict[tuple[str, int], list[tuple[int, str, int]]] | None = None
        # Note [Views made again]: owner -> its views whose reads the planner counted as the owner's
        self.views_read_as = defaultdict(list, {k: list(v) for k, v in base.views_read_as.items()})
        # Note [Swap-ins for recomputation]: (tensor, target, before_op) -> the swap-in the gate reads
        self.swap_in_for_recompute: dict[tuple[str, str, str], str] = {}
        # tensor -> (first position, end position, swap-in): the graph consumers each swap-in serves
        self.swap_in_spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        # variables: key "var:<name>[#k]" (capture.variable_keys) -> internal resource placeholder nodes (a variable may be captured twice)
        self.var_placeholders = defaultdict(list, {k: list(v) for k, v in base.var_placeholders.items()})
        self.resource_nodes = defaultdict(list, {k: list(v) for k, v in base.resource_nodes.items()})

    def _chain(self) -> None:
        """Note [Plan order]: every op waits for the one before it in plan
        order, except inside the plan's unchained runs (Note [Unchained runs]
        in tensile_tf/scheduler/unchained_runs.py), which wait as a whole:
        every op of a run after every op of the block before it."""
        blocks: list[list[str]] = []
        run_of = {}
        for r, (first, last) in enumerate(self.plan.unchained_runs):
            a, b = self.pos.get(first), self.pos.get(last)
            if a is None or b is None:
                continue
            for o in self.graph.ops[a:b + 1]:
                run_of[o.name] = r
        current = None
        for o in self.graph.ops:
            if o.name not in self.edit.nodes:
                continue
            r = run_of.get(o.name)
            if r is None or r != current:
                blocks.append([])
            blocks[-1].append(o.name)
            current = r
        for before, after in zip(blocks, blocks[1:]):
            if len(before) > 1 and len(after) > 1:
                barrier = self._name("run_barrier", after[0])
                self.edit.add_node(barrier, "NoOp", [f"^{x}" for x in before], {})
                self.report.order_edges += len(before)
                self.report.run_barriers += 1
                before = [barrier]
            for x in before:
                for y in after:
                    if self.edit.add_control(x, y, check=False):
                        self.report.order_edges += 1
        self.report.unchained_ops = sum(len(b) for b in blocks if len(b) > 1)

    def _name(self, kind: str, what: str) -> str:
        self._uid += 1
        safe = what.replace(":", "_").replace("/", "_")[-60:]
        return f"{_PREFIX}/{kind}_{self._uid}_{safe}"

    def _delta(self, ev) -> float:
        return float(max(0.0, ev.delta_s * self.delta_scale))

    def _anchor(self, trigger: str | None, node: str) -> None:
        if trigger is None or trigger not in self.edit.nodes:
            return
        if not self.edit.add_control(trigger, node):
            self.report.dropped_anchors += 1

    def _accesses(self, tensor: str) -> list[int]:
        info = self.graph.tensors[tensor]
        ops = [*info.consumers, *info.updated_by] + ([info.producer] if info.producer else [])
        return sorted({self.pos[o] for o in ops if o in self.pos})

    def _tensor_of(self, key: str) -> tf.Tensor | None:
        try:
            return self.fg.get_tensor_by_name(key)
        except (KeyError, ValueError):
            return None

    def _consumer_edges(self, node: str, idx: int) -> list[tuple[int, str, int]]:
        """The graph ops' data edges that read output ``idx`` of ``node``
        (through aliases): (position, consumer, input index). Indexed once;
        rewiring only moves an edge away from the tensor it read (to a swap-in
        or a clone), so each indexed edge is checked again when used."""
        if self._consumers is None:
            self._consumers = defaultdict(list)
            for n in self.edit.gdef.node:
                if n.name not in self.pos:
                    continue
                for k, s in enumerate(n.input):
                    src, sidx, ctrl = _split_input(s)
                    if not ctrl:
                        self._consumers[self.edit.canonical(src, sidx)].append((self.pos[n.name], n.name, k))
        return [(p, name, k) for p, name, k in self._consumers.get((node, idx), ())
                if self.edit.canonical(*_split_input(self.edit.nodes[name].input[k])[:2]) == (node, idx)]

    def run(self) -> tf.compat.v1.GraphDef:
        outs, ins = defaultdict(list), defaultdict(list)
        for e in self.plan.swap_outs:
            outs[e.tensor].append(e)
        for e in self.plan.swap_ins:
            ins[e.tensor].append(e)
        for tensor in sorted(set(ins) | set(outs)):
            info = self.graph.tensors.get(tensor)
            if info is None:
                self.report.skipped.append((f"swap {tensor}", "not in the job graph"))
            elif tensor.startswith("var:"):
                self.variable_swaps(tensor, outs[tensor], ins[tensor])
            elif info.kind == "activation":
                self.activation_swaps(tensor, outs[tensor], ins[tensor])
            else:
                self.report.skipped.append((f"swap {tensor}", f"{info.kind} tensor without a variable "
                                            "(constants live in their op kernel)"))
        for ev in self.plan.recomputes:
            self.recompute(ev)
        return self.edit.gdef
