"""Variable swaps: parameters, optimizer slots and other state moved to the
host within an iteration or across iterations (phase 3 of ``apply_plan``).

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


import tensorflow as tf

from tensile_tf.scheduler.plan import RecomputeEvent, SwapEvent
from tensile_tf.tf.rewrite.graph_edit import _attr, _split_input, _tname


class VariableSwaps:
    """The rewriter's phase for variable swaps (a mixin of ``_Rewriter``)."""

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

    def _dtype(self, tensor: str) -> tf.DType:
        """A tensor's dtype; a clone's output (an earlier recomputation feeding
        this one) has its original's."""
        node, idx, _ = _split_input(tensor)
        while node in self.clone_of:
            node = self.clone_of[node]
        return self.fg.get_tensor_by_name(_tname(node, idx)).dtype
