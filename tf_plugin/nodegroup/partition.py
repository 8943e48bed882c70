"""Graph partition into node groups (Waterwave, seed 004 §4.3-4.4).

A job's step graph is cut into *continuous node groups*: consecutive runs of
nodes in BFS depth order whose net (de)allocation is about ``split_size``
bytes. A group whose net is positive is an *allocation node group* (ANG), one
whose net is negative or zero a *deallocation node group* (DNG). The groups of
one job run strictly in sequence: the pipeline puts a CounterBarrier between
consecutive groups, with control edges from the group's *leaf nodes* (no
successor inside the group) to the barrier and from the barrier to the next
group's *root nodes* (no predecessor inside the group).

Pure: no TensorFlow. ``tf_plugin.nodegroup.rewrite`` turns a traced FuncGraph
into ``GraphNode``s and inserts the barriers; tests build graphs by hand.

Note [Depth is the longest path, not the shortest]
The seed says "BFS to obtain the depth of each node". With the BFS
(shortest-path) distance from the sources, a node can have a smaller depth
than one of its own predecessors, so cutting the depth order into contiguous
groups could put a consumer in an earlier group than its producer; the
barrier between them would then wait on itself and the step would hang. We
take the depth level by level as Kahn's topological BFS does: a node's depth
is one more than the largest depth of its predecessors (data and control).
Every edge then goes from a smaller depth to a larger one, so every edge goes
forward in the (depth, node id) order and contiguous groups are always safe.
Cycles (v1 loops: NextIteration back edges) are removed first by DFS, as the
seed's footnote 4 says; TF2 functional control flow (While, If, Case) is one
node already, which is how the seed treats a control-flow construct.

Note [Nodes TensorFlow merges stay in one group]
TensorFlow may merge two nodes of the step into one after the barriers are
in: oneDNN's layout pass (on by default on x86 CPUs with AVX-512) turns
Conv2D + BiasAdd into one _MklConv2DWithBias node, Conv2DBackpropFilter +
BiasAddGrad into one node, Pad into the Conv2D it feeds, and moves both
nodes' control edges onto the merged node. It checks only that the two
nodes' *incoming* control edges are equal (e.g. none: neither is a group's
root). If the two were in different groups, the merged node would wait for
the barrier after the earlier group while that barrier waits for it: a
cycle, and the step fails to instantiate ("N nodes in a cycle"). A node
therefore names the nodes it may be merged with (``GraphNode.fuse_with``,
filled by ``tf_plugin.nodegroup.rewrite`` from the op types) and the
partition treats each such set as one unit: depth is taken on the graph with
every set contracted to one node, and no group boundary falls inside a set.
A set whose contraction would close a cycle (a path leaves one member and
comes back into another) cannot be merged by TensorFlow either and is left
apart.

Note [Net (de)allocation of a node]
A node allocates the bytes of its outputs when it runs and frees every input
tensor whose last consumer it is (in the depth order), and outputs nobody
reads. Tensors the step returns (``live_out``) are never freed inside the
step; persistent tensors (variables, step inputs) are not outputs of any node
and so never counted. Per-op sizes come from static shapes (the capture of
the traced graph) or from measured allocations (``alloc_bytes`` overrides,
e.g. summed from the pool's trace for one step).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

ANG = "ANG"
DNG = "DNG"


@dataclass(frozen=True)
class GraphNode:
    """One node of a job's step graph.

    ``preds``: names of nodes it depends on (data and control edges).
    ``inputs``: tensors it reads; ``outputs``: (tensor, bytes) it produces.
    ``node_id``: creation order (ties in depth are broken by it).
    ``fuse_with``: nodes TensorFlow may merge with this one; they share its
    group (Note [Nodes TensorFlow merges stay in one group]).
    """

    name: str
    node_id: int
    preds: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[tuple[str, int], ...] = ()
    fuse_with: tuple[str, ...] = ()


@dataclass
class NodeGroup:
    """A continuous run of nodes of one job (seed 004 §4.3 "NodeGroup")."""

    index: int
    kind: str                       # ANG or DNG
    nodes: list[str]
    roots: list[str]                # no predecessor inside the group
    leaves: list[str]               # no successor inside the group
    net_bytes: int                  # allocated - freed while the group runs
    start_bytes: int                # the job's temporary bytes before the group
    peak_bytes: int                 # the job's temporary bytes at most, during the group

    @property
    def end_bytes(self) -> int:
        return self.start_bytes + self.net_bytes

    def to_dict(self) -> dict:
        return {"index": self.index, "kind": self.kind, "num_nodes": len(self.nodes),
                "net_bytes": self.net_bytes, "start_bytes": self.start_bytes,
                "peak_bytes": self.peak_bytes}


@dataclass
class Partition:
    """A job's step cut into node groups."""

    job: str
    split_size: int
    groups: list[NodeGroup]
    persistent_bytes: int = 0        # variables etc., held for the whole run
    dropped_back_edges: list[tuple[str, str]] = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_ang(self) -> int:
        """Groups up to and including the one where the job's memory peaks.

        Algorithm 1 assumes "a series of continuous ANGs followed by a series
        of continuous DNGs" (§4.3). Real graphs wobble (a small DNG between
        ANGs of the forward pass), so the allocating phase is everything up
        to the peak; ``kind`` still tells each group's own sign.
        """
        if not self.groups:
            return 0
        best = max(range(len(self.groups)), key=lambda i: (self.groups[i].peak_bytes, -i))
        return best + 1

    @property
    def temporary_peak_bytes(self) -> int:
        return max((g.peak_bytes for g in self.groups), default=0)

    @property
    def peak_bytes(self) -> int:
        """peakMem of Algorithm 1: persistent plus temporary peak."""
        return self.persistent_bytes + self.temporary_peak_bytes

    def group_of(self) -> dict[str, int]:
        return {n: g.index for g in self.groups for n in g.nodes}

    def summary(self) -> str:
        kinds = "".join("A" if g.kind == ANG else "D" for g in self.groups)
        return (f"job {self.job!r}: {self.num_groups} node groups ({kinds}), split "
                f"{_mib(self.split_size)}, temporary peak {_mib(self.temporary_peak_bytes)}, "
                f"{self.num_ang} in the allocating phase")

    def to_dict(self) -> dict:
        return {"job": self.job, "split_size": self.split_size, "persistent_bytes": self.persistent_bytes,
                "num_ang": self.num_ang, "groups": [g.to_dict() for g in self.groups]}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def remove_cycles(nodes: Sequence[GraphNode]) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """Predecessor lists with DFS back edges removed; returns (preds, dropped edges)."""
    names = {n.name for n in nodes}
    preds = {n.name: [p for p in dict.fromkeys(n.preds) if p in names and p != n.name] for n in nodes}
    succs: dict[str, list[str]] = {n.name: [] for n in nodes}
    for n in nodes:
        for p in preds[n.name]:
            succs[p].append(n.name)
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n.name: WHITE for n in nodes}
    dropped: list[tuple[str, str]] = []
    for start in sorted(nodes, key=lambda n: n.node_id):
        if color[start.name] != WHITE:
            continue
        stack = [(start.name, iter(succs[start.name]))]
        color[start.name] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = BLACK
                stack.pop()
            elif color[nxt] == GREY:
                dropped.append((node, nxt))
            elif color[nxt] == WHITE:
                color[nxt] = GREY
                stack.append((nxt, iter(succs[nxt])))
    for src, dst in dropped:
        preds[dst].remove(src)
    return preds, dropped


def _longest_path_depths(names: Sequence[str], preds: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Kahn's topological BFS: depth = 1 + the largest depth of a predecessor.
    Nodes on a cycle get no depth."""
    succs: dict[str, list[str]] = {n: [] for n in names}
    indeg = {n: 0 for n in names}
    for name in names:
        for p in preds[name]:
            succs[p].append(name)
            indeg[name] += 1
    depth: dict[str, int] = {}
    frontier = [n for n in names if indeg[n] == 0]
    level = 0
    while frontier:
        nxt = []
        for name in frontier:
            depth[name] = level
            for s in succs[name]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    nxt.append(s)
        frontier = nxt
        level += 1
    return depth


def fusion_units(nodes: Sequence[GraphNode],
                 preds: Mapping[str, list[str]]) -> tuple[dict[str, str], dict[str, int]]:
    """Each node's unit (Note [Nodes TensorFlow merges stay in one group]):
    the representative of its ``fuse_with`` set, itself when it has none or
    when contracting its set would close a cycle; and each unit's depth on
    the contracted graph."""
    names = {n.name for n in nodes}
    parent = {n.name: n.name for n in nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in nodes:
        for other in n.fuse_with:
            if other in names:
                a, b = find(n.name), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    unit = {n.name: find(n.name) for n in nodes}
    while True:
        depth = _longest_path_depths(*_contracted(unit, preds))
        sizes = Counter(unit.values())
        merged_cyclic = {r for r in sizes if r not in depth and sizes[r] > 1}
        if not merged_cyclic:
            return unit, depth
        for name, r in unit.items():  # undo those merges, keep the rest
            if r in merged_cyclic:
                unit[name] = name


def _contracted(unit: Mapping[str, str], preds: Mapping[str, list[str]]) -> tuple[list[str], dict[str, set[str]]]:
    """The graph with every fusion unit contracted to its representative."""
    reps = sorted(set(unit.values()))
    unit_preds: dict[str, set[str]] = {r: set() for r in reps}
    for name, ps in preds.items():
        for p in ps:
            if unit[p] != unit[name]:
                unit_preds[unit[name]].add(unit[p])
    return reps, unit_preds


def depth_order(nodes: Sequence[GraphNode]) -> tuple[list[GraphNode], dict[str, int], dict[str, list[str]],
                                                     list[tuple[str, str]]]:
    """Nodes in (depth, node_id) order; see Note [Depth is the longest path].
    Nodes of one fusion unit (Note [Nodes TensorFlow merges stay in one
    group]) are consecutive: the order is by the unit's depth on the
    contracted graph, then each node's own depth."""
    order, depth, preds, dropped, _ = _ordered(nodes)
    return order, depth, preds, dropped


def _ordered(nodes: Sequence[GraphNode]):
    preds, dropped = remove_cycles(nodes)
    depth = _longest_path_depths([n.name for n in nodes], preds)
    assert len(depth) == len(nodes), "cycle left after remove_cycles"
    unit, unit_depth = fusion_units(nodes, preds)
    first_id: dict[str, int] = {}
    for n in nodes:
        r = unit[n.name]
        first_id[r] = min(first_id.get(r, n.node_id), n.node_id)
    # Without fusion units this is the plain (depth, node_id) order.
    order = sorted(nodes, key=lambda n: (unit_depth[unit[n.name]], first_id[unit[n.name]], depth[n.name], n.node_id))
    return order, depth, preds, dropped, unit


def node_deltas(order: Sequence[GraphNode], *, live_out: Iterable[str] = (),
                alloc_bytes: Mapping[str, int] | None = None) -> list[tuple[int, int]]:
    """(allocated, freed) bytes per node in ``order``; Note [Net (de)allocation].

    ``alloc_bytes[node]`` replaces the node's summed output bytes (measured
    sizes); its outputs are then freed in proportion to their static sizes.
    """
    live_out = set(live_out)
    position = {n.name: i for i, n in enumerate(order)}
    size: dict[str, int] = {}
    producer: dict[str, int] = {}
    for i, n in enumerate(order):
        static = sum(b for _, b in n.outputs)
        measured = None if alloc_bytes is None else alloc_bytes.get(n.name)
        for t, b in n.outputs:
            if measured is not None:
                b = measured * b // static if static else measured // max(1, len(n.outputs))
            size[t] = b
            producer[t] = i
    last_use = dict(producer)
    for i, n in enumerate(order):
        for t in n.inputs:
            if t in producer and position[n.name] > last_use[t]:
                last_use[t] = position[n.name]
    out = []
    freed_at: dict[int, int] = {}
    for t, i in last_use.items():
        if t not in live_out:
            freed_at[i] = freed_at.get(i, 0) + size[t]
    for i, n in enumerate(order):
        allocated = sum(size[t] for t, _ in n.outputs)
        out.append((allocated, freed_at.get(i, 0)))
    return out


def partition_graph(job: str, nodes: Sequence[GraphNode], split_size: int, *,
                    live_out: Iterable[str] = (), persistent_bytes: int = 0,
                    alloc_bytes: Mapping[str, int] | None = None,
                    max_groups: int | None = None) -> Partition:
    """Cuts a job's graph into continuous node groups of about ``split_size``
    net (de)allocation bytes (seed 004 §4.4).

    Starting at the first depth, nodes join the current group until the
    absolute value of the group's net (de)allocation reaches ``split_size``;
    the last group takes what is left. ``max_groups`` caps the count (the
    last group then absorbs the rest).
    """
    if split_size <= 0:
        raise ValueError(f"split_size must be a positive number of bytes, got {split_size}")
    order, _, preds, dropped, unit = _ordered(nodes)
    deltas = node_deltas(order, live_out=live_out, alloc_bytes=alloc_bytes)
    groups: list[NodeGroup] = []
    members: list[str] = []
    current = 0           # the job's temporary bytes
    start = 0
    net = 0
    peak = 0

    def close() -> None:
        nonlocal members, start, net, peak
        if not members:
            return
        groups.append(NodeGroup(len(groups), ANG if net > 0 else DNG, members, [], [], net, start, peak))
        members, start, net, peak = [], current, 0, current

    for i, (node, (allocated, freed)) in enumerate(zip(order, deltas)):
        members.append(node.name)
        peak = max(peak, current + allocated)   # outputs exist before inputs are freed
        current += allocated - freed
        net += allocated - freed
        inside_unit = i + 1 < len(order) and unit[order[i + 1].name] == unit[node.name]
        if abs(net) >= split_size and not inside_unit and (max_groups is None or len(groups) < max_groups - 1):
            close()
    close()
    _roots_and_leaves(groups, preds)
    return Partition(job, split_size, groups, persistent_bytes, dropped)


def _roots_and_leaves(groups: list[NodeGroup], preds: Mapping[str, list[str]]) -> None:
    group_of = {n: g.index for g in groups for n in g.nodes}
    has_inner_succ: set[str] = set()
    for g in groups:
        for n in g.nodes:
            inner = [p for p in preds[n] if group_of.get(p) == g.index]
            if not inner:
                g.roots.append(n)
            has_inner_succ.update(inner)
    for g in groups:
        g.leaves = [n for n in g.nodes if n not in has_inner_succ]


def auto_split_size(nodes: Sequence[GraphNode], *, live_out: Iterable[str] = (),
                    target_groups: int = 8, minimum: int = 1 << 20) -> int:
    """``split_size: auto``: about ``target_groups`` groups per job, half of
    them allocating, so the temporary peak divided by ``target_groups / 2``
    (the seed cuts Tacotron2 into eight groups); at least ``minimum`` bytes so
    tiny graphs are not cut into noise."""
    order, *_ = depth_order(nodes)
    current = peak = 0
    for allocated, freed in node_deltas(order, live_out=live_out):
        peak = max(peak, current + allocated)
        current += allocated - freed
    return max(minimum, peak // max(1, target_groups // 2))


#: Note [Split size tuning] (tensile_tf/runtime/nodegroup.py)
SPLIT_MIN_GAIN = 0.05   # a split other than the static rule's must peak this much lower
SPLIT_TIE = 0.01        # candidates this close to the lowest peak peaked alike


def tuned_split(static_split: int, measured_peaks: Mapping[int, int]) -> int:
    """Note [Split size tuning] in tensile_tf/runtime/nodegroup.py: of the
    candidate splits whose step peaks were measured alone, the smallest
    within SPLIT_TIE of the lowest peak; the static rule's split unless that
    one peaked at least SPLIT_MIN_GAIN lower than it."""
    if not measured_peaks:
        return static_split
    lowest = min(measured_peaks.values())
    best = min(s for s, p in measured_peaks.items() if p <= (1 + SPLIT_TIE) * lowest)
    static_peak = measured_peaks.get(static_split)
    if static_peak is not None and not measured_peaks[best] < (1 - SPLIT_MIN_GAIN) * static_peak:
        return static_split
    return best
