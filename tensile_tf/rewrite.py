"""Plan execution by graph rewrite: a job's traced train step plus its
``JobPlan`` -> a new step function that runs the plan's swaps and
recomputations and computes exactly what the original computes (seed 000
§III-B "Executor", §III-C, §IV-C/D).

Phases, top to bottom (``apply_plan``):

1. Read the traced step's GraphDef (DESIGN.md route 2: GraphDef edit +
   re-import with the captured variable handles fed explicitly); bypass the
   optimizer's gradient ``IdentityN`` (Note [No gradient barrier]) and chain
   the ops in plan order (Note [Plan order]).
2. Activation swaps: ``TensileSwapOut`` reads the tensor (data edge), started
   after its trigger op (control edge); each ``TensileSwapIn`` reads the
   swap-out's handle, is started by its trigger op (control edge), and every
   consumer after its gap now reads the swap-in's output instead. The device
   copy is freed by TensorFlow's refcounting once the accesses before the gap
   and the swap-out are done (Note [Release by rewiring] in
   tf_plugin/swap/swap_ops.cc); consumers of a view of the tensor read the
   view made again from the swap-in (Note [Views made again]). A
   ``TensileSwapCheck`` after the op the plan puts right before the consumer
   counts late swap-ins.
3. Variable swaps (parameters, optimizer slots, other state), within an
   iteration or across iterations: see Note [Variable swaps].
4. Recomputation: the chain's ops are cloned; their inputs from outside the
   chain pass through a ``TensileRecomputeGate`` started by the trigger op;
   every consumer of the target (or of a view of it) from ``before_op`` on
   reads the clone.
5. Re-import the edited GraphDef into a fresh ``tf.function`` with the same
   inputs, captured variable handles fed explicitly.

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
tensile_tf/scheduler/unchained_runs.py). ``tensile_tf.execution.executor_order``
picks the order close to the one TF's executor would pick anyway.

Every added control edge is checked for cycles first; an anchor that would
close a cycle is dropped (counted in the report) and correctness still holds
through the data edges. Events the runtime cannot carry out (constants,
function outputs, tensors of unsupported dtype) are skipped and listed.

Note [Swap-ins for recomputation]
A recomputation's clones read the tensors they need from outside their chain
(through the gate, phase 4), and the planner may swap such a tensor out
after its forward uses and back in for the recomputation: the swap-in then
serves a recompute step (``op@recompute[target]`` in the Tensor Access
Sequence), not a graph op. The rewrite used to skip those swaps, out and in
("serves an op the graph lacks"), so the tensor stayed on the device the whole
gap while the plan counted it off: the Transformer (64x128, batch 16) at half
its peak on the 110 MiB/s link kept its first Softmax (1 MiB), planned for
15.4 MiB and measured 18.3. Now such a swap-in is placed at its
recomputation's ``before_op`` (the chain runs right before it), the gate
reads the swap-in's output instead of the tensor, and later graph consumers
read it as after any swap-in. A variable's swap-in that serves a
recomputation (a recomputed convolution reads its kernel) had its gap skipped
the same way (ResNet50 64x64, batch 16, half its peak on the capped link: 4
such gaps); the gate now reads the variable through a fresh read after the
swap-in (Note [Reads that outlive a variable gap]). A recomputation that runs
after a swap-in of its input but is not the one it serves reads that swap-in
too (``_swap_in_read_by``), as the graph's consumers there do: the
Transformer's second attention Softmax, rebuilt from the swapped query
projection, read the query itself and held its 0.5 MiB across the gap.

Note [Views made again]
A view (a Reshape, ExpandDims... that returns its input's buffer, Note
[Views] in tensile_tf/scheduler/job_graph.py) pins its owner's buffer for as
long as anything may still read it. Keras's Dense on a sequence reads its
input through Tensordot's Reshape, and the kernel's gradient reads that view
again in the backward pass, so an owner swapped out between the forward and
the backward reads freed nothing until the view's last reader had run. Since
the plan order runs each kernel gradient first (Note [Freeing successors
first] in tensile_tf/execution.py), the view's last read comes before the
owner's last read (its ReluGrad or layer-norm gradient), no view took the
buffer (Note [View takes the buffer]), and the Transformer's FFN activations
(3 MiB each at batch 48) could not leave the device: the 3x batch planned for
17.2 MiB reached 18.7. The planner now counts a view's reads as its owner's
(Note [Views read as their owner] in tensile_tf/scheduler/access_sequence.py),
and every consumer of such a view after a swap-in or a recomputation of the
owner reads the view op run again on the new value (``_view_again``, a clone
without the original's control inputs: a stateless view's value depends on
its data inputs only), so the original view's last reader is before the gap.

Note [Variable swaps]
A resource variable's buffer leaves the pool through ``TensileVarSwapOut``:
it copies the buffer to the host store and leaves the variable holding an
empty tensor, so the pool chunk is freed (once no read aliases it);
``TensileVarSwapIn`` allocates a fresh pool buffer, copies the host copy back
and puts it in the variable. Both act on the variable itself, under its lock,
so every reader sees either the whole value or an empty tensor, which no
reader can be given: each resource op of the variable after the gap has a
control edge from the swap-in, and the swap-out has control edges from every
access before the gap. Across iterations (the gap runs from the optimizer's
update to the first read of the next step): if the plan starts the swap-out
before the variable's first access of the step, the pair runs at the start
of the step (out, then in, before the first read); otherwise the swap-out
runs after the step's last access and the variable stays on the host between
steps, so ``PlannedStep.restore()`` must bring such variables back before
anyone reads them outside the step (the host does this when a job ends or
its plan is replaced). Every variable gap copies the variable out again, even where the plan
reuses the host copy (the ops support reuse: copy=false / keep_host).

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
``tensile_tf.execution.executor_order`` orders through it, so each update
runs once its own gradient exists: the empty plan peaks at 323 MiB. An
``IdentityN`` the step returns, or that something waits on as a whole
(control input, or with control inputs of its own), stays.

Note [Reads that outlive a variable gap]
A ``ReadVariableOp``'s output aliases the variable's buffer, and TensorFlow's
gradients read it where the forward pass did: a convolution's
Conv2DBackpropInput reads the kernel through the forward Conv2D's read. The
capture counts that read as an access of the variable (``capture.py``: reads
alias their variable), so the planner may plan a gap between the forward and
the backward use, with a swap-in before the backward one. The old read still
pins the buffer across the gap, and the swap-in brings a second copy that
nothing reads: ResNet50 (64x64, batch 16) at half its peak held 42 MiB of
conv5 kernels twice, 237 MiB measured for 196 MiB predicted. So every graph
op after a variable swap-in (up to the next one) that reads the variable
through a read made before the swap-in reads a new ``ReadVariableOp`` run
after the swap-in. Its value is the same bytes unless the variable is written
between the two reads; a consumer with a write in between keeps its old read
(the gap is then not carried out, listed in the report as skipped). The new
read gets a control edge to each later write, so it precedes them also
without the plan-order chain.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tensorflow as tf

from tensile_tf.scheduler.access_sequence import TensorAccessSequence, parse_recompute_step_name
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import UniformLatency
from tensile_tf.scheduler.plan import JobPlan, RecomputeEvent, SwapEvent
from tf_plugin import swap as _swap
from tf_plugin.tf_internals import exempt_from_automatic_control_deps

ALIAS_OPS = frozenset({"Identity", "IdentityN"})
_PREFIX = "tensile"
REWRITE_PREFIX = _PREFIX   # the name scope a rewritten step's ops are imported under
_TENSILE_OPS = frozenset({"TensileSwapOut", "TensileSwapIn", "TensileSwapCheck", "TensileVarSwapOut",
                          "TensileVarSwapIn", "TensileRecomputeGate"})


@dataclass
class RewriteReport:
    """What the rewrite carried out, and what it could not (with reasons)."""

    job: str
    activation_swap_outs: int = 0
    activation_swap_ins: int = 0
    variable_swap_outs: int = 0
    variable_swap_ins: int = 0
    recomputes: int = 0
    recomputed_ops: int = 0
    swapped_bytes_per_step: int = 0       # planned bytes over the link per step (out + in)
    rewired_edges: int = 0
    views_made_again: int = 0             # view ops cloned onto a swapped-in or recomputed owner (Note [Views made again])
    order_edges: int = 0                  # control edges chaining the ops in plan order (Note [Plan order])
    unchained_ops: int = 0                # ops in runs that wait as a whole, not one by one (Note [Unchained runs])
    run_barriers: int = 0                 # NoOps between two runs of several ops (Note [Unchained runs])
    dropped_anchors: int = 0              # control edges left out because they would close a cycle
    restore_needed: list[str] = field(default_factory=list)   # variables kept on the host between steps
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (event, reason)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def bypassed_identity_n(nodes: Sequence[Any], outputs: set[str]) -> set[str]:
    """The IdentityN nodes of a GraphDef that the rewrite removes (Note [No
    gradient barrier]): all but those the step returns (``outputs``: node
    names), those with control inputs and those something waits on as a
    whole (a control edge from them). ``executor_order`` orders through
    exactly these, so plan order and the rewritten step agree."""
    waited_on = {i[1:] for n in nodes for i in n.input if i.startswith("^")}
    return {n.name for n in nodes if n.op == "IdentityN" and n.name not in outputs and n.name not in waited_on
            and not any(i.startswith("^") for i in n.input)}


def _split_input(s: str) -> tuple[str, int, bool]:
    """'node:1' -> ('node', 1, False); '^node' -> ('node', 0, True)."""
    if s.startswith("^"):
        return s[1:], 0, True
    name, _, idx = s.partition(":")
    return name, int(idx) if idx else 0, False


def _tname(node: str, idx: int) -> str:
    return f"{node}:{idx}"


class _GraphEdit:
    """A mutable GraphDef with producer/consumer lookups and cycle-safe edges.

    Cycle checks use a topological rank of every node (every edge goes from a
    lower to a higher rank): an edge that goes up in rank cannot close a
    cycle, and otherwise only nodes ranked below the edge's source can lie on
    a path back to it. After an edge that goes down in rank, its head (and
    what the head reaches below the tail's rank) moves up just above the
    tail (``_ranked_edge``); the ranks are recomputed from scratch only when
    the floats between two ranks run out. On a step chained in plan order
    (Note [Plan order]) a plain search would walk the rest of the chain for
    every anchor, quadratic in the graph (minutes on DenseNet121)."""

    def __init__(self, gdef: tf.compat.v1.GraphDef):
        self.gdef = gdef
        self.nodes = {n.name: n for n in gdef.node}
        self.succ: dict[str, set[str]] = defaultdict(set)
        for n in gdef.node:
            for s in n.input:
                src, _, _ = _split_input(s)
                self.succ[src].add(n.name)
        self._rank: dict[str, float] | None = None
        self._fresh = 0.0
        self.rank_rebuilds = 0  # times the ranks were computed from scratch

    def canonical(self, node: str, idx: int) -> tuple[str, int]:
        """Follows Identity/IdentityN aliases back to the producing output."""
        seen = 0
        while node in self.nodes and self.nodes[node].op in ALIAS_OPS and seen < 64:
            n = self.nodes[node]
            data = [i for i in n.input if not i.startswith("^")]
            src = data[idx if n.op == "IdentityN" else 0]
            node, idx, _ = _split_input(src)
            seen += 1
        return node, idx

    def _ranks(self) -> dict[str, float]:
        """Topological ranks (Kahn's algorithm), recomputed when invalidated."""
        if self._rank is None:
            self.rank_rebuilds += 1
            preds = {name: {_split_input(i)[0] for i in n.input} & self.nodes.keys()
                     for name, n in self.nodes.items()}
            succ: dict[str, list[str]] = defaultdict(list)
            for name, p in preds.items():
                for x in p:
                    succ[x].append(name)
            missing = {name: len(p) for name, p in preds.items()}
            ready = [name for name, k in missing.items() if k == 0]
            rank: dict[str, float] = {}
            while ready:
                x = ready.pop()
                rank[x] = float(len(rank))
                for y in succ.get(x, ()):
                    missing[y] -= 1
                    if missing[y] == 0:
                        ready.append(y)
            for name in self.nodes:      # on a cycle (a broken graph): ranked last
                rank.setdefault(name, float(len(rank)))
            self._rank = rank
        return self._rank

    def _forward(self, src: str, bound: float, target: str | None = None) -> tuple[bool, set[str]]:
        """Nodes reachable from src through nodes ranked below ``bound``
        (src included); whether ``target`` was met on the way."""
        rank = self._ranks()
        stack, seen = [src], {src}
        while stack:
            for nxt in self.succ.get(stack.pop(), ()):
                if nxt == target:
                    return True, seen
                if nxt not in seen and rank.get(nxt, float("inf")) < bound:
                    seen.add(nxt)
                    stack.append(nxt)
        return False, seen

    def reaches(self, src: str, dst: str) -> bool:
        if src == dst:
            return True
        rank = self._ranks()
        if rank.get(src, -1.0) > rank.get(dst, float("inf")):
            return False
        return self._forward(src, rank.get(dst, float("inf")), dst)[0]

    def _ranked_edge(self, src: str, dst: str) -> None:
        """Keeps the ranks topological after the edge src -> dst was added
        (which closed no cycle): dst and whatever it reaches below src's rank
        move, in their order, into the gap between src and the lowest rank
        they lead to outside themselves (above src: the search stopped there)."""
        rank = self._rank
        if rank is None or rank.get(src, -1.0) < rank.get(dst, -1.0):
            return
        hi = rank.get(src, -1.0)
        if not self.succ.get(dst):
            rank[dst] = hi + self._fresh_step()  # nothing depends on dst yet
            return
        moved = self._forward(dst, hi)[1]
        ceiling = min((rank.get(y, float("inf")) for x in moved for y in self.succ.get(x, ()) if y not in moved),
                      default=float("inf"))
        step = (min(ceiling, hi + 1.0) - hi) / (len(moved) + 1)
        if step < 1e-9:
            self._rank = None  # no room left between floats: recompute them all
            return
        for k, x in enumerate(sorted(moved, key=rank.__getitem__), start=1):
            rank[x] = hi + k * step

    def add_node(self, name: str, op: str, inputs: Sequence[str], attrs: dict[str, Any]) -> Any:
        n = self.gdef.node.add()
        n.name, n.op = name, op
        for i in inputs:
            n.input.append(i)
            self.succ[_split_input(i)[0]].add(name)
        for k, v in attrs.items():
            n.attr[k].CopyFrom(v)
        self.nodes[name] = n
        if self._rank is not None:
            self._rank[name] = max((self._rank.get(_split_input(i)[0], -1.0) for i in inputs),
                                   default=-1.0) + self._fresh_step()
        return n

    def _fresh_step(self) -> float:
        """How far above its highest predecessor a new node is ranked: in
        (0.25, 0.75), different for every node (golden-ratio sequence), so
        that new nodes rarely tie with others."""
        self._fresh = (self._fresh + 0.6180339887498949) % 1.0
        return 0.25 + 0.5 * self._fresh

    def add_control(self, src: str, dst: str, *, check: bool = True) -> bool:
        """Adds src -> dst unless it would close a cycle (False then).
        ``check=False``: the caller knows it cannot (the plan-order chain)."""
        if src not in self.nodes or dst not in self.nodes:
            return False
        if check and self.reaches(dst, src):
            return False
        n = self.nodes[dst]
        if f"^{src}" not in n.input:
            n.input.append(f"^{src}")
            self.succ[src].add(dst)
            self._ranked_edge(src, dst)
        return True

    def remove_nodes(self, names: set[str]) -> None:
        """Removes nodes nothing reads any more (their own inputs stay)."""
        kept = [n for n in self.gdef.node if n.name not in names]
        del self.gdef.node[:]
        self.gdef.node.extend(kept)
        self.nodes = {n.name: n for n in self.gdef.node}
        for name in names:
            self.succ.pop(name, None)
        for targets in self.succ.values():
            targets.difference_update(names)
        self._rank = None

    def set_input(self, node: str, k: int, value: str) -> None:
        n = self.nodes[node]
        old = _split_input(n.input[k])[0]
        n.input[k] = value
        src = _split_input(value)[0]
        self.succ[src].add(node)
        if not any(_split_input(i)[0] == old for i in n.input):
            self.succ[old].discard(node)
        self._ranked_edge(src, node)


def _attr(**kw) -> dict[str, Any]:
    out = {}
    for k, v in kw.items():
        a = tf.compat.v1.AttrValue()
        if isinstance(v, bool):
            a.b = v
        elif isinstance(v, int):
            a.i = v
        elif isinstance(v, float):
            a.f = v
        elif isinstance(v, str):
            a.s = v.encode()
        elif isinstance(v, tf.DType):
            a.type = v.as_datatype_enum
        elif isinstance(v, tf.TensorShape):
            a.shape.CopyFrom(v.as_proto())
        elif isinstance(v, list):  # list of dtypes
            a.list.type.extend(t.as_datatype_enum for t in v)
        else:
            raise TypeError(f"attr {k}: unsupported {type(v)}")
        out[k] = a
    return out


class _Rewriter:
    def __init__(self, cf, graph: JobGraph, job_plan: JobPlan, delta_scale: float, check_lateness: bool,
                 enforce_order: bool = True):
        self.cf = cf
        self.fg = cf.graph
        self.graph = graph
        self.plan = job_plan
        self.delta_scale = delta_scale
        self.check_lateness = check_lateness
        self.edit = _GraphEdit(self.fg.as_graph_def())
        self.pos = {o.name: k for k, o in enumerate(graph.ops)}
        self.report = RewriteReport(job_plan.name)
        self._uid = 0
        self._bypass_identity_n()
        if enforce_order:
            self._chain()
        self.clone_of: dict[str, str] = {}   # recomputation clone node -> the node it copies
        self.outputs = {self.edit.canonical(*_split_input(t.name)[:2]) for t in self.fg.outputs}
        self._consumers: dict[tuple[str, int], list[tuple[int, str, int]]] | None = None
        # Note [Views made again]: owner -> its views whose reads the planner counted as the owner's
        tas = TensorAccessSequence(graph, UniformLatency())
        self.views_read_as: dict[str, list[str]] = defaultdict(list)
        for v, owner in sorted(tas.read_as_owner.items()):
            self.views_read_as[tas.tensor_names[owner]].append(tas.tensor_names[v])
        # Note [Swap-ins for recomputation]: (tensor, target, before_op) -> the swap-in the gate reads
        self.swap_in_for_recompute: dict[tuple[str, str, str], str] = {}
        # tensor -> (first position, end position, swap-in): the graph consumers each swap-in serves
        self.swap_in_spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        # variables: key "var:<name>" -> internal resource placeholder node
        vars_by_handle = {id(v.handle): v for v in self.fg.variables}
        self.var_placeholders: dict[str, list[str]] = defaultdict(list)  # a variable may be captured twice
        for ext, internal in self.fg.captures:
            v = vars_by_handle.get(id(ext))
            if v is not None:
                self.var_placeholders["var:" + v.name.split(":")[0]].append(internal.op.name)
        self.resource_nodes: dict[str, list[str]] = defaultdict(list)
        for n in self.edit.gdef.node:
            for s in n.input:
                src, _, ctrl = _split_input(s)
                if not ctrl and self.edit.nodes.get(src) is not None and self.edit.nodes[src].op == "Placeholder":
                    self.resource_nodes[src].append(n.name)

    def _bypass_identity_n(self) -> None:
        """Note [No gradient barrier]: consumers of an IdentityN read its
        inputs directly and the IdentityN goes."""
        gone = []
        for name in sorted(bypassed_identity_n(self.edit.gdef.node, {t.op.name for t in self.fg.outputs})):
            n = self.edit.nodes[name]
            consumers = self.edit.succ.get(name, set())
            data = list(n.input)
            for c in list(consumers):
                for k, i in enumerate(self.edit.nodes[c].input):
                    src, idx, _ = _split_input(i)
                    if src == name:
                        self.edit.set_input(c, k, data[idx])
            gone.append(name)
        if gone:
            self.edit.remove_nodes(set(gone))

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

    # -- helpers -------------------------------------------------------------
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

    def _recompute_served(self, ev: SwapEvent) -> RecomputeEvent | None:
        """The recomputation whose step a swap-in serves (Note [Swap-ins for
        recomputation]): the plan's recomputation of that target that runs
        that op, the first whose ``before_op`` comes after the swap-in's
        trigger; None when it serves a graph op or no such recomputation."""
        parsed = parse_recompute_step_name(ev.serves_op or "")
        if parsed is None:
            return None
        op, target = parsed
        found = sorted((r for r in self.plan.recomputes
                        if r.target == target and op in r.ops and r.before_op in self.pos),
                       key=lambda r: self.pos[r.before_op])
        after = self.pos.get(ev.trigger_op, -1)
        return next((r for r in found if self.pos[r.before_op] > after), found[-1] if found else None)

    def _served_position(self, ev: SwapEvent) -> int | None:
        """Where in plan order the access a swap-in serves runs: its op, or a
        recomputation's ``before_op`` (Note [Swap-ins for recomputation])."""
        q = self.pos.get(ev.serves_op)
        if q is not None:
            return q
        rec = self._recompute_served(ev)
        return self.pos[rec.before_op] if rec is not None else None

    def _tensor_of(self, key: str) -> tf.Tensor | None:
        try:
            return self.fg.get_tensor_by_name(key)
        except (KeyError, ValueError):
            return None

    # -- activations -------------------------------------------------------------
    def _out_position(self, ev: SwapEvent) -> int:
        """Where a swap-out starts: its trigger op (else its release point; -1
        if neither is in the graph).

        Note [Host copies serve several gaps]: the planner may give a tensor one
        swap-out and swap-ins for several gaps, the earlier gaps reusing the
        host copy (swap_scheduling: no second swap-out while the version is
        current). The swap-out event then carries the release point of the
        gap it was scheduled for, which may be a later gap than the first
        swap-in's. A swap-in can read any swap-out that has started before it;
        the release happens by rewiring (consumers from the first swap-in on
        read swap-ins), so pairing goes by where the swap-out starts."""
        for op in (ev.trigger_op, ev.release_after_op):
            if op in self.pos:
                return self.pos[op]
        return -1

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

    def _view_again(self, view: str, owner: str, value: str, made: dict[str, str]) -> str | None:
        """``view`` made again from ``value`` in place of its owner (Note
        [Views made again]): its op cloned with the owner's input (or that of
        a view of the owner it reads, made again first) replaced. ``made``
        caches the views made from ``value``; None if the view's op reads
        neither."""
        if view in made:
            return made[view]
        vnode, vidx = self.edit.canonical(*_split_input(view)[:2])
        orig = self.edit.nodes.get(vnode)
        if orig is None:
            return None
        own = self.edit.canonical(*_split_input(owner)[:2])
        inner = {self.edit.canonical(*_split_input(v)[:2]): v for v in self.views_read_as.get(owner, ()) if v != view}
        inputs, replaced = [], False
        for s in orig.input:
            src, sidx, ctrl = _split_input(s)
            if ctrl:
                continue
            c = self.edit.canonical(src, sidx)
            new = value if c == own else (self._view_again(inner[c], owner, value, made) if c in inner else None)
            replaced |= new is not None
            inputs.append(new if new is not None else s)
        if not replaced:
            made[view] = None
            return None
        clone = self._name("view", view)
        n = self.edit.add_node(clone, orig.op, inputs, {})
        self.clone_of[clone] = vnode
        for k, v in orig.attr.items():
            n.attr[k].CopyFrom(v)
        n.device = orig.device
        made[view] = _tname(clone, vidx)
        self.report.views_made_again += 1
        return made[view]

    def _rewire_views(self, owner: str, value: str, lo: int, hi: int) -> None:
        """Consumers at plan positions [lo, hi) of the views of ``owner`` read
        them made again from ``value`` (Note [Views made again])."""
        made: dict[str, str] = {}
        for view in self.views_read_as.get(owner, ()):
            edges = [e for e in self._consumer_edges(*self.edit.canonical(*_split_input(view)[:2])) if lo <= e[0] < hi]
            again = self._view_again(view, owner, value, made) if edges else None
            if again is None:
                continue
            for _, cname, k in edges:
                self.edit.set_input(cname, k, again)
                self.report.rewired_edges += 1

    def _group_gaps(self, tensor: str, outs: list[SwapEvent], ins: list[SwapEvent]):
        """Pairs each swap-in with the swap-out whose host copy it reads
        (Note [Host copies serve several gaps])."""
        def at(e: SwapEvent) -> int:
            q = self._served_position(e)
            return (q if q is not None else -1) + e.iteration_shift * len(self.pos)

        ins = sorted(ins, key=at)
        outs = sorted(outs, key=self._out_position)
        groups: list[tuple[SwapEvent | None, list[SwapEvent]]] = []
        for ev in ins:
            q = self._served_position(ev)
            best = None
            for o in outs:
                r = self._out_position(o)
                if r >= 0 and q is not None and (r < q or ev.cross_iteration):
                    best = o
            if groups and groups[-1][0] is best:
                groups[-1][1].append(ev)
            else:
                groups.append((best, [ev]))
        return groups

    def activation_swaps(self, tensor: str, outs: list[SwapEvent], ins: list[SwapEvent]) -> None:
        node, idx = _split_input(tensor)[:2]
        t = self._tensor_of(tensor)
        why = None
        if node not in self.edit.nodes or t is None:
            why = "tensor not in the traced graph"
        elif (node, idx) in self.outputs:
            why = "the step returns it"
        elif t.dtype in (tf.string, tf.resource, tf.variant):
            why = f"dtype {t.dtype.name} cannot be swapped"
        elif any(ev.cross_iteration for ev in ins):
            why = "an activation cannot be swapped across iterations"
        elif any(self._served_position(ev) is None for ev in ins):
            why = "swap-in serves an op the graph lacks"
        if why:
            self.report.skipped += [(f"swap {tensor}", why)]
            return
        edges = self._consumer_edges(node, idx)
        for out_ev, group in self._group_gaps(tensor, outs, ins):
            if out_ev is None:
                self.report.skipped += [(f"swap-in {tensor}@{e.serves_op}", "no swap-out to read from")
                                        for e in group]
                continue
            so = self._name("swap_out", tensor)
            self.edit.add_node(so, "TensileSwapOut", [tensor], _attr(
                T=t.dtype, num_swap_ins=len(group), delta_s=self._delta(out_ev), label=f"{self.plan.name}:{tensor}"))
            self._anchor(out_ev.trigger_op, so)
            self.report.activation_swap_outs += 1
            self.report.swapped_bytes_per_step += out_ev.size_bytes
            bounds = [self._served_position(e) for e in group] + [len(self.pos)]
            for j, ev in enumerate(group):
                si = self._name("swap_in", tensor)
                event = f"{self.plan.name}:{tensor}@{ev.serves_op}"
                self.edit.add_node(si, "TensileSwapIn", [so], _attr(
                    T=t.dtype, shape=t.shape, delta_s=self._delta(ev), label=f"{self.plan.name}:{tensor}",
                    event=event if self.check_lateness else ""))
                self._anchor(ev.trigger_op, si)
                rec = self._recompute_served(ev)
                read_as = _tname(*self.edit.canonical(node, idx))
                if rec is not None:
                    self.swap_in_for_recompute[(read_as, rec.target, rec.before_op)] = si
                self.swap_in_spans[read_as].append((bounds[j], bounds[j + 1], si))
                for p, cname, k in edges:
                    if bounds[j] <= p < bounds[j + 1]:
                        self.edit.set_input(cname, k, _tname(si, 0))
                        self.report.rewired_edges += 1
                self._rewire_views(tensor, _tname(si, 0), bounds[j], bounds[j + 1])
                if self.check_lateness:
                    q = bounds[j]
                    before = self.graph.ops[q - 1].name if q > 0 else None
                    if before in self.edit.nodes:
                        chk = self._name("swap_check", tensor)
                        self.edit.add_node(chk, "TensileSwapCheck", [f"^{before}"], _attr(event=event))
                self.report.activation_swap_ins += 1
                self.report.swapped_bytes_per_step += ev.size_bytes

    # -- variables ---------------------------------------------------------------
    def variable_swaps(self, tensor: str, outs: list[SwapEvent], ins: list[SwapEvent]) -> None:
        phs = self.var_placeholders.get(tensor)
        if not phs:
            self.report.skipped += [(f"swap {tensor}", "no captured variable handle for it")]
            return
        ph = phs[0]
        res_nodes = [n for p in phs for n in self.resource_nodes.get(p, [])]
        if any(n not in self.pos for n in res_nodes):
            self.report.skipped += [(f"swap {tensor}", "a resource op of the variable is not in the job graph")]
            return
        acc = self._accesses(tensor)
        groups = self._group_gaps(tensor, outs, ins)
        served = sorted({q for q in map(self._served_position, ins) if q is not None})
        for out_ev, group in groups:
            for ev in group:
                q = self._served_position(ev)
                if q is None:
                    self.report.skipped += [(f"swap-in {tensor}@{ev.serves_op}", "serves an op the graph lacks")]
                    continue
                before_q = [a for a in acc if a < q]
                cross = ev.cross_iteration or not before_q
                vo = self._name("var_swap_out", tensor)
                # Always copy: reusing a host copy is only safe while no write came
                # in between, which the pairing here cannot prove for every plan.
                copy = True
                self.edit.add_node(vo, "TensileVarSwapOut", [ph], _attr(
                    copy=copy, delta_s=self._delta(out_ev) if out_ev else 0.0, label=f"{self.plan.name}:{tensor}"))
                trig_out = out_ev.trigger_op if out_ev else None
                early_out = cross and (trig_out is None or self.pos.get(trig_out, 1 << 30) < q)
                # Out late in the step, in early in the next: no edge between the two
                # within one step (steps of a job run one after another).
                late_out = cross and not early_out
                vi = self._name("var_swap_in", tensor)
                self.edit.add_node(vi, "TensileVarSwapIn", [ph] + ([] if late_out else [f"^{vo}"]), _attr(
                    keep_host=False, delta_s=self._delta(ev), label=f"{self.plan.name}:{tensor}"))
                if late_out:
                    pre = acc                       # after the step's last access; back next step
                    self.report.restore_needed.append(tensor)
                elif cross:
                    pre = []                        # at the start of the step, before the first access
                else:
                    pre = before_q
                ok = True
                for a in pre:
                    ok &= self.edit.add_control(self.graph.ops[a].name, vo)
                for n in res_nodes:
                    if self.pos[n] >= q or cross:
                        ok &= self.edit.add_control(vi, n)
                if not ok:
                    raise RuntimeError(f"job '{self.plan.name}': swapping {tensor} around {ev.serves_op} would "
                                       "close a cycle in the step graph (plan and graph disagree on op order)")
                self._anchor(trig_out if copy else None, vo)
                self._anchor(ev.trigger_op, vi)
                upto = next((p for p in served if p > q), len(self.pos))
                self._read_again(tensor, vi, res_nodes, q, upto)
                rec = self._recompute_served(ev)
                if rec is not None:
                    self._read_again_for_recompute(tensor, vi, res_nodes, q, rec)
                self.report.variable_swap_outs += 1
                self.report.variable_swap_ins += 1
                self.report.swapped_bytes_per_step += 2 * ev.size_bytes

    def _read_again(self, tensor: str, vi: str, res_nodes: list[str], q: int, upto: int) -> None:
        """Note [Reads that outlive a variable gap]: the graph ops at positions
        q..upto-1 that read the variable through a read made before q read a
        fresh read after the swap-in ``vi`` instead, where no write to the
        variable comes between the two reads."""
        writes = [self.pos[o] for o in self.graph.tensors[tensor].updated_by if o in self.pos]
        for r in res_nodes:
            node = self.edit.nodes[r]
            if node.op != "ReadVariableOp" or self.pos[r] >= q:
                continue
            again = None
            for p, cname, k in self._consumer_edges(r, 0):
                if not q <= p < upto:
                    continue
                if any(self.pos[r] < w < p for w in writes):
                    self.report.skipped.append((f"read {tensor} again for {cname}",
                                                "the variable is written between the two reads"))
                    continue
                if again is None:
                    again = self._name("var_read_again", tensor)
                    self.edit.add_node(again, "ReadVariableOp", [node.input[0], f"^{vi}"],
                                       {"dtype": node.attr["dtype"]})
                    for w in writes:   # reads before the writes after it, also with no plan-order chain
                        if w >= p:
                            self.edit.add_control(again, self.graph.ops[w].name)
                self.edit.set_input(cname, k, _tname(again, 0))
                self.report.rewired_edges += 1

    def _read_again_for_recompute(self, tensor: str, vi: str, res_nodes: list[str], q: int,
                                  rec: RecomputeEvent) -> None:
        """Note [Swap-ins for recomputation] for a variable: the recomputation
        ``rec`` (run right before plan position q) reads the variable through a
        fresh read after the swap-in ``vi``, not through a read made before
        the gap, which would pin the old buffer (Note [Reads that outlive a
        variable gap])."""
        writes = [self.pos[o] for o in self.graph.tensors[tensor].updated_by if o in self.pos]
        for r in res_nodes:
            node = self.edit.nodes[r]
            if node.op != "ReadVariableOp" or self.pos[r] >= q:
                continue
            if any(self.pos[r] < w < q for w in writes):
                self.report.skipped.append((f"read {tensor} again for the recomputation of {rec.target}",
                                            "the variable is written between the two reads"))
                continue
            again = self._name("var_read_again", tensor)
            self.edit.add_node(again, "ReadVariableOp", [node.input[0], f"^{vi}"], {"dtype": node.attr["dtype"]})
            for w in writes:
                if w >= q:
                    self.edit.add_control(again, self.graph.ops[w].name)
            self.swap_in_for_recompute[(_tname(r, 0), rec.target, rec.before_op)] = again

    # -- recomputation -------------------------------------------------------------
    def _dtype(self, tensor: str) -> tf.DType:
        """A tensor's dtype; a clone's output (an earlier recomputation feeding
        this one) has its original's."""
        node, idx, _ = _split_input(tensor)
        while node in self.clone_of:
            node = self.clone_of[node]
        return self.fg.get_tensor_by_name(_tname(node, idx)).dtype

    def _swap_in_read_by(self, x: str, ev: RecomputeEvent) -> str | None:
        """The swap-in of ``x`` that recomputation ``ev`` reads: the one that
        serves it, else the one whose span of graph consumers holds its
        ``before_op`` (Note [Swap-ins for recomputation]: a recomputation
        that runs after another one's swap-in reads that swap-in, as the
        graph's own consumers there do; reading ``x`` itself kept its
        buffer on the device across the whole gap)."""
        si = self.swap_in_for_recompute.get((x, ev.target, ev.before_op))
        if si is None and ev.before_op in self.pos:
            at = self.pos[ev.before_op]
            si = next((s for lo, hi, s in self.swap_in_spans.get(x, ()) if lo <= at < hi), None)
        return si

    def _read_for_recompute(self, x: str, ev: RecomputeEvent) -> str:
        """What a recomputation's gate reads for its outside input ``x``: the
        swap-in that serves it (Note [Swap-ins for recomputation]), or, for a
        view of a swapped owner, the view made again from the owner's swap-in
        (Note [Views made again]); else ``x`` itself."""
        si = self._swap_in_read_by(x, ev)
        if si:
            return _tname(si, 0)
        for owner, views in self.views_read_as.items():
            for view in views:
                if _tname(*self.edit.canonical(*_split_input(view)[:2])) != x:
                    continue
                read_as = _tname(*self.edit.canonical(*_split_input(owner)[:2]))
                si = self._swap_in_read_by(read_as, ev)
                again = self._view_again(view, owner, _tname(si, 0), {}) if si else None
                if again:
                    return again
        return x

    def recompute(self, ev: RecomputeEvent) -> None:
        node, idx = _split_input(ev.target)[:2]
        bad = [o for o in ev.ops if o not in self.edit.nodes]
        if bad or ev.before_op not in self.pos or node not in self.edit.nodes:
            self.report.skipped.append((f"recompute {ev.target}", f"ops not in the graph: {bad or ev.before_op}"))
            return
        if (node, idx) in self.outputs:
            self.report.skipped.append((f"recompute {ev.target}", "the step returns it"))
            return
        chain = set(ev.ops)
        clone = {o: self._name("recompute", o) for o in ev.ops}
        external: list[str] = []
        for o in ev.ops:
            for s in self.edit.nodes[o].input:
                src, sidx, ctrl = _split_input(s)
                if ctrl:
                    continue
                c = self.edit.canonical(src, sidx)
                if c[0] not in chain and _tname(*c) not in external:
                    external.append(_tname(*c))
        gate = self._name("recompute_gate", ev.target)
        dtypes = [self._dtype(x) for x in external]
        gate_inputs = [self._read_for_recompute(x, ev) for x in external]
        self.edit.add_node(gate, "TensileRecomputeGate", gate_inputs, _attr(T=dtypes))
        self._anchor(ev.trigger_op, gate)
        for o in ev.ops:
            orig = self.edit.nodes[o]
            new_inputs = []
            for s in orig.input:
                src, sidx, ctrl = _split_input(s)
                if ctrl:
                    continue  # a stateless op's value depends on its data inputs only
                c = self.edit.canonical(src, sidx)
                new_inputs.append(_tname(clone[c[0]], c[1]) if c[0] in chain else
                                  _tname(gate, external.index(_tname(*c))))
            n = self.edit.add_node(clone[o], orig.op, new_inputs, {})
            self.clone_of[clone[o]] = o
            for k, v in orig.attr.items():
                n.attr[k].CopyFrom(v)
            n.device = orig.device
        q = self.pos[ev.before_op]
        target = _tname(clone[node], idx)
        for p, name, k in self._consumer_edges(node, idx):
            if p >= q:
                self.edit.set_input(name, k, target)
                self.report.rewired_edges += 1
        self._rewire_views(ev.target, target, q, len(self.pos))
        self.report.recomputes += 1
        self.report.recomputed_ops += len(ev.ops)

    # -- all -------------------------------------------------------------------------
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


@dataclass
class PlannedStep:
    """A job's train step with a plan applied. Call it like the original step.

    ``restore()`` brings variables the plan keeps on the host between steps
    back into the pool (before reading weights outside the step, replacing
    the plan, or ending the job); ``evict()`` moves them out, so that the
    first planned step starts the way every later one does (without it, the
    first step runs with them still in the pool, at a higher peak)."""

    fn: Callable
    job_plan: JobPlan
    report: RewriteReport
    graph_def: Any = field(repr=False, default=None)
    _restore_fn: Callable | None = field(repr=False, default=None)
    _evict_fn: Callable | None = field(repr=False, default=None)

    def __call__(self, *args):
        return self.fn(*args)

    def evict(self) -> None:
        if self._evict_fn is not None:
            self._evict_fn()

    def restore(self) -> None:
        if self._restore_fn is not None:
            self._restore_fn()
        _swap.drain_swap_channel()


def _import_as_function(gdef, cf, name: str) -> Callable:
    fg = cf.graph
    cap_names = {internal.op.name for _, internal in fg.captures}
    args = [t for t in fg.inputs if t.op.name not in cap_names]
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in args]
    returns = [t.name for t in fg.outputs]
    captures = list(fg.captures)
    structure = cf.structured_outputs

    def planned(*xs):
        g = tf.compat.v1.get_default_graph()
        input_map = {ph.name: x for ph, x in zip(args, xs)}
        for ext, internal in captures:
            input_map[internal.name] = g.capture(ext)
        outs = tf.graph_util.import_graph_def(gdef, input_map=input_map, return_elements=returns,
                                              name=_PREFIX)
        return tf.nest.pack_sequence_as(structure, outs, expand_composites=True) if returns else None

    planned.__name__ = f"planned_{name}".replace("-", "_").replace(".", "_")
    return tf.function(planned, input_signature=specs, jit_compile=False, autograph=False)


def apply_plan(step_fn, example_args: Sequence, job_plan: JobPlan, graph: JobGraph, *,
               delta_scale: float = 1.0, check_lateness: bool = True,
               enforce_order: bool | None = None) -> PlannedStep:
    """Rewrites ``step_fn`` (a tf.function, traced with ``example_args``) so it
    executes ``job_plan``; ``graph`` is the JobGraph the plan was made from.
    ``enforce_order``: chain the ops in plan order (Note [Plan order]); by
    default as the plan says (``JobPlan.step_order``).

    ``delta_scale`` scales the plan's delta t (0: start each transfer as soon
    as its trigger op ends)."""
    # Note [Automatic control dependencies]: tf.function chains the stateful
    # ops it traces in program order. The re-imported step is traced inside a
    # tf.function, so every swap op would wait for the one created before it
    # (a swap-in for an unrelated swap-out, a lateness probe for its own
    # swap-in). The rewrite orders its ops with explicit edges, so they join
    # TF's order-insensitive must-run ops.
    exempt_from_automatic_control_deps(_TENSILE_OPS)
    if enforce_order is None:
        enforce_order = job_plan.step_order == "plan"
    cf = step_fn.get_concrete_function(*example_args)
    rw = _Rewriter(cf, graph, job_plan, delta_scale, check_lateness, enforce_order)
    gdef = rw.run()
    fn = _import_as_function(gdef, cf, job_plan.name)
    restore_fn = evict_fn = None
    if rw.report.restore_needed:
        handles = []
        vars_by_handle = {id(v.handle): v for v in cf.graph.variables}
        wanted = set(rw.report.restore_needed)
        seen = set()
        for ext, _ in cf.graph.captures:
            v = vars_by_handle.get(id(ext))
            if v is not None and "var:" + v.name.split(":")[0] in wanted and id(ext) not in seen:
                seen.add(id(ext))
                handles.append(ext)

        def restore():
            for h in handles:
                _swap.ops.tensile_var_swap_in(h)

        def evict():
            for h in handles:
                _swap.ops.tensile_var_swap_out(h, label=f"{job_plan.name}:evict")

        restore_fn = tf.function(restore, autograph=False)
        evict_fn = tf.function(evict, autograph=False)
    return PlannedStep(fn, job_plan, rw.report, gdef, restore_fn, evict_fn)
