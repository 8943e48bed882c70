"""The TensorFlow side of the node-group pipeline: read a traced step's
FuncGraph as ``GraphNode``s for the partition, and insert one
``TensileNodeGroupBarrier`` op per group boundary.

Runs as a FuncGraph transform right after tracing (``tensile_tf.tf.pool``
``JobStream.step_function(graph_transform=...)``), so the step is traced once
and the barriers are in the function TensorFlow instantiates. Only control
edges are added: the step computes exactly what it computed before.

Note [Which nodes are grouped]
Placeholders, constants and variable handles allocate nothing per step and
have no inputs; they stay outside every group and run whenever TensorFlow
likes. So do *constant-only* ops (stateless, fed by constants alone, e.g. the
``zeros`` initializer of an optimizer slot created in the first trace): the
first trace of a step that creates variables lifts those initializers out of
the graph, which a control edge from a barrier (hence from the step's inputs)
would make impossible; Grappler folds them anyway. The TensileBindStep op stays outside too: barrier 0 depends on it, so
the step is bound to its job before any group runs. Ops that on the CPU
device hand out their input's buffer (ReadVariableOp of a resource variable,
Identity, Reshape, ...) are grouped nodes that allocate nothing; their
readers read the underlying tensor (it lives until they finish). Function
calls and functional control flow (While, If, Case) are one node each, the
seed's rule for control flow; their outputs are their allocation.

Nodes that oneDNN's layout pass merges after the barriers are in
(``ONEDNN_MERGED_CHAINS``, ``ONEDNN_MERGED_SIBLINGS``) name each other in
``GraphNode.fuse_with`` so the partition keeps them in one group (Note [Nodes
TensorFlow merges stay in one group] in partition.py). Producers are looked
through forwarding ops: Grappler may remove an Identity between the two
before oneDNN's pass runs.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_plugin.nodegroup.partition import GraphNode, Partition

SOURCE_OPS = frozenset({"Placeholder", "Const", "VarHandleOp", "TensileBindStep"})
# Ops whose output shares the input's buffer (first input) on the CPU device.
FORWARDING_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "Reshape", "Squeeze",
                            "ExpandDims", "EnsureShape", "PreventGradient"})
BARRIER_OP = "TensileNodeGroupBarrier"
# oneDNN's layout pass (tensorflow/core/graph/mkl_layout_pass.cc): producer ->
# consumer pairs it merges into one node (Conv2D + BiasAdd, Pad + Conv2D, and
# the Transpose + op + Transpose eliminations), and the sibling pair it merges
# when both read the same gradient (Conv2DBackpropFilter input 2, BiasAddGrad
# input 0).
ONEDNN_MERGED_CHAINS = frozenset({
    ("Conv2D", "BiasAdd"), ("Pad", "Conv2D"), ("Pad", "_FusedConv2D"),
    ("Transpose", "Conv2D"), ("Conv2D", "Transpose"), ("Transpose", "Conv3D"), ("Conv3D", "Transpose"),
    ("Transpose", "MaxPool3D"), ("MaxPool3D", "Transpose")})
ONEDNN_MERGED_SIBLINGS = (("Conv2DBackpropFilter", 2), ("BiasAddGrad", 0))

_ops = None


def _plugin_ops():
    global _ops
    if _ops is None:
        from tf_plugin import _plugin
        _ops = tf.load_op_library(str(_plugin.__file__))
    return _ops


def _static_bytes(t: tf.Tensor) -> int:
    if t.dtype in (tf.resource, tf.variant, tf.string):
        return 0
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return 0  # dynamic: not counted (partition by measured sizes instead)
    return int(shape.num_elements()) * t.dtype.size


def _constant_only(op, constant: set[str]) -> bool:
    try:
        if op.op_def.is_stateful:
            return False
    except Exception:  # noqa: BLE001 - no OpDef: treat as stateful
        return False
    return all(t.op.name in constant for t in op.inputs) and \
        all(c.type in SOURCE_OPS or c.name in constant for c in op.control_inputs)


def graph_nodes(fg) -> tuple[list[GraphNode], list[str]]:
    """The FuncGraph's grouped nodes (Note [Which nodes are grouped]) and the
    tensors the step returns (never freed inside it)."""
    canonical: dict[str, str | None] = {}   # graph tensor -> tensor it shares a buffer with (None: persistent)
    nodes: list[GraphNode] = []
    grouped: set[str] = set()
    constant: set[str] = set()   # Const and constant-only ops
    for op in fg.get_operations():
        if op.type in SOURCE_OPS or op.type == BARRIER_OP or _constant_only(op, constant):
            if op.type == "Const" or op.type not in SOURCE_OPS and op.type != BARRIER_OP:
                constant.add(op.name)
            for t in op.outputs:
                canonical[t.name] = None
            continue
        grouped.add(op.name)
        reads = [canonical.get(t.name) for t in op.inputs]
        preds = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
        outputs: list[tuple[str, int]] = []
        if op.type == "ReadVariableOp":
            for t in op.outputs:
                canonical[t.name] = None
        elif op.type in FORWARDING_OPS:
            srcs = reads if op.type == "IdentityN" else reads[:1] * len(op.outputs)
            for t, src in zip(op.outputs, srcs):
                canonical[t.name] = src
        else:
            for t in op.outputs:
                canonical[t.name] = t.name
                outputs.append((t.name, _static_bytes(t)))
        nodes.append(GraphNode(op.name, op._id, tuple(preds),  # noqa: SLF001
                               tuple(dict.fromkeys(r for r in reads if r is not None)), tuple(outputs)))
    fuse = _onednn_merges(fg, grouped, canonical)
    nodes = [GraphNode(n.name, n.node_id, tuple(p for p in dict.fromkeys(n.preds) if p in grouped),
                       n.inputs, n.outputs, tuple(sorted(fuse.get(n.name, ())))) for n in nodes]
    live_out = [canonical[t.name] for t in fg.outputs if canonical.get(t.name)]
    return nodes, live_out


def _onednn_merges(fg, grouped: set[str], canonical: dict[str, str | None]) -> dict[str, set[str]]:
    """For each grouped node, the grouped nodes oneDNN's layout pass may merge it with."""
    def producer(t) -> str:
        src = canonical.get(t.name) or t.name
        return src.rsplit(":", 1)[0]

    fuse: dict[str, set[str]] = {}

    def link(a: str, b: str) -> None:
        if a in grouped and b in grouped and a != b:
            fuse.setdefault(a, set()).add(b)
            fuse.setdefault(b, set()).add(a)

    readers: dict[tuple[str, str], list[str]] = {}   # (op type, tensor read) -> readers
    sibling_input = dict(ONEDNN_MERGED_SIBLINGS)
    types = {op.name: op.type for op in fg.get_operations()}
    for op in fg.get_operations():
        if op.name not in grouped:
            continue
        for t in op.inputs:
            src = producer(t)
            if (types.get(src), op.type) in ONEDNN_MERGED_CHAINS:
                link(src, op.name)
        k = sibling_input.get(op.type)
        if k is not None and k < len(op.inputs):
            readers.setdefault((op.type, canonical.get(op.inputs[k].name) or op.inputs[k].name), []).append(op.name)
    (a_type, _), (b_type, _) = ONEDNN_MERGED_SIBLINGS
    for (kind, tensor), names in readers.items():
        if kind == a_type:
            for a in names:
                for b in readers.get((b_type, tensor), ()):
                    link(a, b)
    return fuse


def barrier_op(job: int, boundary: int, num_groups: int):
    """Creates a TensileNodeGroupBarrier op in the current graph."""
    return _plugin_ops().tensile_node_group_barrier(job=int(job), boundary=int(boundary),
                                                    num_groups=int(num_groups))


def insert_barriers(fg, partition: Partition, job: int) -> list[Any]:
    """Adds the boundary ops of ``partition`` to ``fg`` for pool stream ``job``:
    boundary b gets control inputs from the leaves of group b-1 (boundary 0:
    from the TensileBindStep op) and control outputs to the roots of group b.
    Returns the ops (also added to the function's control outputs)."""
    by_name = {op.name: op for op in fg.get_operations()}
    binds = [op for op in by_name.values() if op.type == "TensileBindStep"]
    n = partition.num_groups
    made = []
    with fg.as_default():
        for b in range(n + 1):
            op = barrier_op(job, b, n)
            op = getattr(op, "op", op)
            before = [by_name[x] for x in partition.groups[b - 1].leaves] if b > 0 else binds
            if before:
                op._add_control_inputs(before)  # noqa: SLF001
            if b < n:
                for root in partition.groups[b].roots:
                    by_name[root]._add_control_input(op)  # noqa: SLF001
            made.append(op)
    fg.control_outputs.extend(made)
    return made
