"""Job graph: the static compute graph G_j(V, E) of one training step (seed 000
§III-A "Job").

Ops (V) are listed in execution order, which is a topological order of the step
(TENSILE executes "the operators in topological order", §IV-A). Tensors (E)
carry byte sizes, their producer (whose execution is the tensor's TGA) and their
consumers (TUAs). The optimizer's operators are part of the graph, so the
variables it reads and updates in place (parameters and slots such as Adam's m
and v) are tensors too: they live across iterations and are what the seed's
cross-iteration swaps move (§IV-C, Fig. 1).

Tensor kinds:

* ``activation``: produced inside the step, freed after its last use.
* ``input``: a model input (placeholder TGA, §III-A); held by the caller for the
  whole step, never swapped.
* ``parameter`` / ``slot``: resource variables the optimizer updates in place.
* ``state``: other persistent variables (step counters, BN moving statistics),
  named ``var:NAME`` (``VARIABLE_PREFIX``) like every variable, and the step's
  graph constants, named after their op. Note [Constants stay]: a constant
  lives in its op's kernel, so no runtime can drop or swap it; the planner
  never picks one (before, ResNet50's capped-link plan held 795 swaps of
  shape constants, 8 KiB in all, that the rewrite then skipped).

Note [Views]. Some ops return a view of an input's buffer, not a new one
(TensorFlow's Reshape, Squeeze, ExpandDims, Identity...): a Transformer's
dense layers reshape every activation, and counting both the activation and
its reshape put the predicted peak 18% above the measured one. A view's
``view_of`` names the tensor whose buffer it shares (followed to the owner):
the footprint gives it no bytes and keeps the owner resident until the view's
last access (``TensorAccessSequence``). The capture finds views in the pool's
trace (``tensile_tf.pipeline.measure_step_memory``).

This module is pure: no TensorFlow. ``tensile_tf.tf.capture`` builds JobGraphs
from traced ``tf.function`` steps; tests build them by hand with GraphBuilder.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

TENSOR_KINDS = ("activation", "input", "parameter", "slot", "state")
#: Bytes the job holds in the pool beside its step's tensors (its data
#: source's other batches), measured by the capture: an ``input`` no op reads
#: (Note [Data held beside the step] in tensile_tf/tf/step_memory.py).
HELD_BESIDE_STEP = "held:data beside the step"
PERSISTENT_KINDS = frozenset({"input", "parameter", "slot", "state"})
UPDATED_KINDS = frozenset({"parameter", "slot", "state"})
#: How a captured variable's tensor is named: ``var:`` + the variable's name, and ``#k`` after the
#: k-th other variable of that name (``variable_keys`` in tensile_tf/tf/capture.py).
VARIABLE_PREFIX = "var:"


@dataclass
class TensorInfo:
    """One tensor: ``size_bytes`` on the device, who makes it and who reads it."""

    name: str
    size_bytes: int
    kind: str = "activation"
    producer: str | None = None          # op whose execution is the TGA; None: exists at step start
    consumers: list[str] = field(default_factory=list)   # ops that read it (TUAs), execution order
    updated_by: list[str] = field(default_factory=list)  # ops that write it in place (optimizer)
    view_of: str | None = None           # a view of that tensor's buffer (Note [Views]): no bytes of its own

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT_KINDS


@dataclass
class OpNode:
    """One operator. ``inputs`` are read (TUA), ``outputs`` produced (TGA),
    ``updates`` written in place (a TUA that makes a new version of the tensor,
    §IV-B item 2: "we logically treat the updated parameter as a new tensor")."""

    name: str
    op_type: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    updates: list[str] = field(default_factory=list)
    temp_bytes: int = 0          # scratch memory held only while the op runs
    stateful: bool = False       # random / side-effecting: never re-run by recomputation
    forwarded_bytes: int = 0     # output bytes held in the buffer of an input it reads last (no new memory)
    concurrent_bytes: int = 0    # what the executor's other threads hold beyond (< 0: below) the sequential footprint


@dataclass
class JobGraph:
    """A job's step: ops in execution order and the tensors they touch."""

    name: str
    ops: list[OpNode]
    tensors: dict[str, TensorInfo]

    def __post_init__(self) -> None:
        self.validate()

    @property
    def inputs(self) -> list[str]:
        return [t.name for t in self.tensors.values() if t.kind == "input"]

    @property
    def updated_variables(self) -> list[str]:
        """Parameters and optimizer slots written by the optimizer (cross-iteration swap candidates)."""
        return [t.name for t in self.tensors.values() if t.kind in ("parameter", "slot") and t.updated_by]

    def op(self, name: str) -> OpNode:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"job '{self.name}': no op named {name!r}")

    def total_bytes(self, kinds: Iterable[str] = TENSOR_KINDS) -> int:
        ks = set(kinds)
        return sum(t.size_bytes for t in self.tensors.values() if t.kind in ks)

    def validate(self) -> None:
        """Raises ValueError naming the job and the first inconsistency found."""
        where = f"job graph '{self.name}'"
        seen_ops: set[str] = set()
        produced: set[str] = set()
        for o in self.ops:
            if o.name in seen_ops:
                raise ValueError(f"{where}: op {o.name!r} appears twice")
            seen_ops.add(o.name)
            for t in (*o.inputs, *o.updates):
                info = self.tensors.get(t)
                if info is None:
                    raise ValueError(f"{where}: op {o.name!r} reads unknown tensor {t!r}")
                if info.producer is not None and info.producer not in produced and info.producer != o.name:
                    raise ValueError(
                        f"{where}: op {o.name!r} reads {t!r} before its producer {info.producer!r} runs; "
                        "ops must be in execution (topological) order")
            for t in o.outputs:
                info = self.tensors.get(t)
                if info is None:
                    raise ValueError(f"{where}: op {o.name!r} produces unknown tensor {t!r}")
                if info.producer != o.name:
                    raise ValueError(f"{where}: tensor {t!r} says its producer is {info.producer!r}, not {o.name!r}")
            produced.update(o.outputs)
            produced.add(o.name)
        for t in self.tensors.values():
            if t.kind not in TENSOR_KINDS:
                raise ValueError(f"{where}: tensor {t.name!r} has kind {t.kind!r}; expected one of {TENSOR_KINDS}")
            if t.size_bytes < 0:
                raise ValueError(f"{where}: tensor {t.name!r} has negative size {t.size_bytes}")
            if t.kind == "activation" and t.producer is None:
                raise ValueError(f"{where}: activation {t.name!r} has no producer; mark it 'input' or 'state'")
            if t.producer is not None and t.producer not in seen_ops:
                raise ValueError(f"{where}: tensor {t.name!r} names producer {t.producer!r}, which is not an op")

    def structure_signature(self) -> tuple:
        """Note [Structures kept with the graph]: a cheap check that the
        graph is as it was when something built from it was kept."""
        ops, tensors = self.ops, self.tensors
        return (id(ops), id(tensors), len(ops), len(tensors),
                sum(o.temp_bytes for o in ops), sum(o.forwarded_bytes for o in ops),
                sum(o.concurrent_bytes for o in ops), sum(t.size_bytes for t in tensors.values()),
                sum(1 for t in tensors.values() if t.view_of))

    def kept(self, what: str, build):
        """Note [Structures kept with the graph]: ``build()``'s result, kept on
        the graph under ``what`` while ``structure_signature`` holds.

        Note [Structures kept with the graph]
        A re-plan plans the same captured graphs again with new latencies,
        but each Planner built each job's access sequence (0.1 s for a
        ResNet50 step) and fingerprint (0.05 s) afresh: most of a re-plan of
        four such jobs. Both depend only on the graph, so they are kept on
        the graph object, checked by its structure signature (the lists'
        identities and lengths, and sums of every byte count the capture's
        memory passes write in place: tensile_tf/tf/step_memory.py), and
        every later plan shares them (a sequence is retimed, its structure
        never written)."""
        sig = self.structure_signature()
        found = self.__dict__.get("_kept", {}).get(what)
        if found is not None and found[0] == sig:
            return found[1]
        made = build()
        self.__dict__.setdefault("_kept", {})[what] = (sig, made)
        return made

    def fingerprint(self) -> str:
        """sha256 (hex) over what a plan refers to: ops (name, type, what they
        read, write and update) in order, and tensors (name, size, kind). A
        plan made for one fingerprint is refused by a graph of another."""
        return self.kept("fingerprint", self._fingerprint)

    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        for o in self.ops:
            h.update(repr((o.name, o.op_type, o.inputs, o.outputs, o.updates)).encode())
        for t in sorted(self.tensors.values(), key=lambda t: t.name):
            if t.name == HELD_BESIDE_STEP:   # measured, run to run; no plan refers to it
                continue
            h.update(repr((t.name, t.size_bytes, t.kind)).encode())
        return h.hexdigest()

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ops": [asdict(o) for o in self.ops],
                "tensors": [asdict(t) for t in self.tensors.values()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "JobGraph":
        return cls(name=d["name"], ops=[OpNode(**o) for o in d["ops"]],
                   tensors={t["name"]: TensorInfo(**t) for t in d["tensors"]})


class GraphBuilder:
    """Builds a JobGraph op by op, in execution order (for tests and adapters).

    >>> b = GraphBuilder("mlp")
    >>> b.tensor("x", 400, kind="input"); b.tensor("w", 100, kind="parameter")
    >>> b.op("fc", inputs=["x", "w"], outputs={"h": 200})
    >>> b.op("apply_w", inputs=["h"], updates=["w"])
    >>> g = b.build()
    """

    def __init__(self, name: str):
        self.name = name
        self._ops: list[OpNode] = []
        self._tensors: dict[str, TensorInfo] = {}

    def tensor(self, name: str, size_bytes: int, kind: str = "state") -> "GraphBuilder":
        if name in self._tensors:
            raise ValueError(f"job graph '{self.name}': tensor {name!r} declared twice")
        self._tensors[name] = TensorInfo(name, int(size_bytes), kind)
        return self

    def op(self, name: str, *, inputs: Iterable[str] = (), outputs: dict[str, int] | None = None,
           updates: Iterable[str] = (), op_type: str = "", temp_bytes: int = 0,
           stateful: bool = False) -> "GraphBuilder":
        outs = dict(outputs or {})
        node = OpNode(name, op_type or name, list(dict.fromkeys(inputs)), list(outs), list(dict.fromkeys(updates)),
                      int(temp_bytes), stateful)
        for t, size in outs.items():
            self.tensor(t, size, "activation")
            self._tensors[t].producer = name
        for t in node.inputs:
            if t not in self._tensors:
                raise ValueError(f"job graph '{self.name}': op {name!r} reads undeclared tensor {t!r}")
            if name not in self._tensors[t].consumers:
                self._tensors[t].consumers.append(name)
        for t in node.updates:
            if t not in self._tensors:
                raise ValueError(f"job graph '{self.name}': op {name!r} updates undeclared tensor {t!r}")
            self._tensors[t].updated_by.append(name)
        self._ops.append(node)
        return self

    def build(self) -> JobGraph:
        return JobGraph(self.name, list(self._ops), dict(self._tensors))
