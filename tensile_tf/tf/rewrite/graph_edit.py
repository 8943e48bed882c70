"""The GraphDef editing every rewrite phase uses: nodes by name, their
inputs read through aliases (``canonical``), control edges added only where
they cannot close a cycle (``add_control`` ranks the graph), nodes removed
and inputs rewired; the name scope and the ops the rewrite adds.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import tensorflow as tf


ALIAS_OPS = frozenset({"Identity", "IdentityN"})
_PREFIX = "tensile"
REWRITE_PREFIX = _PREFIX   # the name scope a rewritten step's ops are imported under
_TENSILE_OPS = frozenset({"TensileSwapOut", "TensileSwapIn", "TensileSwapCheck", "TensileVarSwapOut",
                          "TensileVarSwapIn", "TensileRecomputeGate", "TensileOpTick", "TensileSwapSlotOut",
                          "TensileSwapSlotIn", "TensileVarSlotOut", "TensileVarSlotIn"})


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
    plan_table: str = ""                  # run.plan_steps table: "table" (carried by it), or why it was rewritten
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
