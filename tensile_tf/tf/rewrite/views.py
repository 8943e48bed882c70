"""Views of a swapped or recomputed tensor made again from what replaces it.

Note [Views made again]
A view (a Reshape, ExpandDims... that returns its input's buffer, Note
[Views] in tensile_tf/scheduler/job_graph.py) pins its owner's buffer for as
long as anything may still read it. Keras's Dense on a sequence reads its
input through Tensordot's Reshape, and the kernel's gradient reads that view
again in the backward pass, so an owner swapped out between the forward and
the backward reads freed nothing until the view's last reader had run. Since
the plan order runs each kernel gradient first (Note [Freeing successors
first] in tensile_tf/tf/executor_order.py), the view's last read comes before the
owner's last read (its ReluGrad or layer-norm gradient), no view took the
buffer (Note [View takes the buffer]), and the Transformer's FFN activations
(3 MiB each at batch 48) could not leave the device: the 3x batch planned for
17.2 MiB reached 18.7. The planner now counts a view's reads as its owner's
(Note [Views read as their owner] in tensile_tf/scheduler/access_sequence.py),
and every consumer of such a view after a swap-in or a recomputation of the
owner reads the view op run again on the new value (``_view_again``, a clone
without the original's control inputs: a stateless view's value depends on
its data inputs only), so the original view's last reader is before the gap.
"""
from __future__ import annotations



from tensile_tf.tf.rewrite.graph_edit import _split_input, _tname


class ViewRewrites:
    """The rewriter's phase for views (a mixin of ``_Rewriter``)."""

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
