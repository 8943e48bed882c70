"""Activation swaps: ``TensileSwapOut`` after the trigger op, ``TensileSwapIn``
before the gap's next reader, every later consumer rewired to the swap-in
(phase 2 of ``apply_plan``, Note [Release by rewiring] in
tf_plugin/swap/swap_ops.cc).
"""
from __future__ import annotations


import tensorflow as tf

from tensile_tf.scheduler.plan import RecomputeEvent, SwapEvent
from tensile_tf.tf.rewrite.graph_edit import _attr, _split_input, _tname
from tensile_tf.scheduler.access_sequence import parse_recompute_step_name


class ActivationSwaps:
    """The rewriter's phase for activation swaps (a mixin of ``_Rewriter``)."""

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
