"""Recomputation: a chain of ops cloned before the op that needs its target
again, its inputs gated by ``TensileRecomputeGate`` on the trigger op
(phase 4 of ``apply_plan``).

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
"""
from __future__ import annotations



from tensile_tf.scheduler.plan import RecomputeEvent
from tensile_tf.tf.rewrite.graph_edit import _attr, _split_input, _tname


class Recomputation:
    """The rewriter's phase for recomputation (a mixin of ``_Rewriter``)."""

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
