"""The order a planned step runs its ops in (Note [Plan order] in
tensile_tf/tf/rewrite/rewriter.py): ``executor_order`` orders a captured
graph's ops as the chained step will run them.

Note [Freeing successors first]
``executor_order`` runs depth first: the op that became ready last runs
next. When one op makes several ready at once, which runs first decides
what the chained step holds. A layer's output gradient makes both its
filter gradient (the last reader of the layer's input activation) and its
input gradient ready; taking the input gradient first carried the backward
pass down to the first layer while every filter gradient waited on the
stack, each holding its activation and output gradient. ResNet50 (64x64,
batch 16) in plan order held 88.8 MiB of such activations at its peak,
none of them recomputable within four ops, and its plan on the 110 MiB/s
link peaked at 371 MiB (5.9% MSR). Of the ops one op makes ready, the one
that frees most (inputs it is the last unfinished reader of, less what it
allocates) now runs first; ties keep the graph's order. The same capture
then plans to 334.6 MiB and measures 333-336 (15.1%). A filter gradient
larger than its input activation (conv5's 9 MiB kernels at 64x64) still
waits: it allocates more than it frees.
"""
from __future__ import annotations

from typing import Sequence

from tensile_tf.tf.rewrite.graph_edit import bypassed_identity_n
from tensile_tf.scheduler.job_graph import JobGraph


_LAZY_OPS = frozenset({"ReadVariableOp", "Const", "Identity", "NoOp", "Placeholder"})


def executor_order(graph: JobGraph, step_fn, args: Sequence) -> JobGraph:
    """The JobGraph with its ops in the order the planned step will run them
    (Note [Plan order] in tensile_tf/tf/rewrite/rewriter.py). Depth first over the traced
    GraphDef (data and control edges): the op that became ready last runs
    next, so an optimizer update runs as soon as its gradient exists (in
    creation order all of backprop precedes all of the optimizer and every
    gradient piles up); of the ops one op makes ready, the one that frees
    most runs first (Note [Freeing successors first]). Variable reads and
    other trivial ops run just before their first consumer: a read run early
    keeps an alias of the variable's buffer alive, and the optimizer's
    in-place update must then copy it."""
    fg = step_fn.get_concrete_function(*args).graph
    gdef = fg.as_graph_def()
    nodes = list(gdef.node)
    index = {n.name: k for k, n in enumerate(nodes)}
    by_name = {n.name: n for n in nodes}
    bypassed = bypassed_identity_n(nodes, {t.op.name for t in fg.outputs})

    def source(i: str) -> str:
        """The node an input comes from, through the IdentityN nodes the
        rewrite bypasses (Note [No gradient barrier] in tensile_tf/tf/rewrite/rewriter.py)."""
        for _ in range(64):
            name, _, out = i.lstrip("^").partition(":")
            if i.startswith("^") or name not in bypassed:
                return name
            i = by_name[name].input[int(out) if out else 0]
        return i.lstrip("^").split(":")[0]

    preds: list[set[int]] = []
    succ: list[list[int]] = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        srcs = {index[name] for name in map(source, n.input) if name in index}
        preds.append(srcs)
        for j in srcs:
            succ[j].append(k)
    lazy = [n.op in _LAZY_OPS for n in nodes]
    done = [False] * len(nodes)
    rank: dict[str, int] = {}
    # Note [Freeing successors first]: what running an op frees and allocates
    ops = {o.name: o for o in graph.ops}
    readers = {t: len(info.consumers) for t, info in graph.tensors.items()}

    def net_freed(k: int) -> int:
        """Bytes node k frees (inputs it is the last unfinished reader of) less the bytes it allocates."""
        o = ops.get(nodes[k].name)
        if o is None:
            return 0
        tensors = graph.tensors
        freed = sum(tensors[t].size_bytes for t in set(o.inputs)
                    if readers.get(t) == 1 and not tensors[t].persistent and not tensors[t].view_of)
        return freed - sum(tensors[t].size_bytes for t in o.outputs if not tensors[t].view_of)
    missing = [len([p for p in preds[k] if not lazy[p]]) for k in range(len(nodes))]
    ready = [k for k in reversed(range(len(nodes))) if missing[k] == 0 and not lazy[k]]

    def emit(k: int) -> None:
        """Runs k after whatever it still waits for (lazy predecessors, and
        anything they wait for, e.g. a node-group barrier's leaves), depth
        first, predecessors before successors."""
        stack = [(k, False)]
        while stack:
            x, expanded = stack.pop()
            if done[x]:
                continue
            if not expanded:
                stack.append((x, True))
                stack.extend((p, False) for p in preds[x] if not done[p])
                continue
            done[x] = True
            rank[nodes[x].name] = len(rank)
            if nodes[x].name in ops:
                for t in set(ops[nodes[x].name].inputs):
                    readers[t] = readers.get(t, 0) - 1
            if not lazy[x]:
                now_ready = []
                for j in succ[x]:
                    if not lazy[j]:
                        missing[j] -= 1
                        if missing[j] == 0 and not done[j]:
                            now_ready.append(j)
                # the one that frees most runs next (stable: else the first successor, as before)
                now_ready.sort(key=net_freed, reverse=True)
                ready.extend(reversed(now_ready))

    while ready:
        k = ready.pop()
        if not done[k]:
            emit(k)
    for k in range(len(nodes)):
        if not done[k]:
            emit(k)
    unranked = len(rank)  # ops the GraphDef lacks keep their relative order, after the rest
    order = sorted(range(len(graph.ops)), key=lambda k: (rank.get(graph.ops[k].name, unranked), k))
    return JobGraph(graph.name, [graph.ops[k] for k in order], graph.tensors)
