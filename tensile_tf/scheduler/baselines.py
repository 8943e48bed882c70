"""Other memory planners as policies on the same access sequences (issue 19's
baseline suite): vDNN and Capuchin. Each is a ``Planner`` whose loop (its
policy) is replaced; everything else is shared with TENSILE: the Tensor
Access Sequences and footprints (§IV-A/B), the one swap channel (the link),
``Plan``, the graph rewrite and the swap ops. The channel is the planner's
(``Planner(link_lanes=...)``): a baseline books the same lanes at the same
rates as TENSILE in the same row (Note [A lane per direction] in
tensile_tf/scheduler/swap_scheduling.py). So a difference between their
measured rows is a difference of policy only.

``VDNNPlanner`` (vDNN, Rhu et al., MICRO 2016, "vDNN_all"): every layer's
input feature map is swapped out right after its forward use and prefetched
one layer ahead of its backward use: its swap-in is issued when the backward
pass reaches the previous offloaded layer (the last layer's, when the op
before its own backward use starts). The policy is static: it ignores
the budget and does not look at where the peak is.

``CapuchinPlanner`` (seed 003 §4.3-4.5): one measured execution (passive
mode) gives the peak and the tensors resident in it; candidates (accessed
more than once, resident at the peak) are ranked by their swap FreeTime,
``FT = SwapInStartTime - SwapOutEndTime`` over the gap around the peak.
Tensors whose swap hides fully (FT >= 0) are evicted first, largest FT
first, until the required reduction (vanilla peak - budget) is met; each
swap-out starts at its evicted-access, each swap-in at its in-trigger (the
last access before the ideal SwapInStartTime; later when the link is busy:
a swap cannot start before the one ahead of it ends). If that is not
enough, recomputation by MSPS (Memory Saving Per Second, Eq. in §4.3;
``recompute.recomputation_scheduling``) covers the rest. Unlike TENSILE
(Algorithm 3) the peak is analysed once, not after every round.

Both stop after one pass (``iterations`` 1) with a ``stop_reason`` naming
the policy.
"""
from __future__ import annotations

from bisect import bisect_left

from tensile_tf.scheduler.peak_analysis import gpu_memory_peak_analysis
from tensile_tf.scheduler.planner import UNPLANNED_FITS, Planner
from tensile_tf.scheduler.recompute import recomputation_scheduling
from tensile_tf.scheduler.state import JobState, SwapDecision
from tensile_tf.scheduler.swap_channel import IN, OUT, SwapChannel
from tensile_tf.scheduler.swap_scheduling import find_gap

#: Op types that are "layers" in vDNN's sense when they read a parameter:
#: their other inputs are the layer's input feature maps.
LAYER_OP_TYPES = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2",
                            "BatchMatMulV3", "Einsum"})


def swap_in_gap(channel: SwapChannel, js: JobState, i: int, p: int, q: int,
                in_trigger_s: float) -> SwapDecision | None:
    """Tensor i swapped out as soon as the link allows after its access p
    (the evicted-access) and swapped in as soon as the link allows after
    ``in_trigger_s`` (unrolled seconds). A swap-in that cannot end before
    access q is still issued before q (the step waits for it there): these
    policies do not require a swap to hide. The link time is reserved where
    the link can carry it. None when it saves nothing (the tensor
    would be back before it left)."""
    tas = js.tas
    size = int(tas.size[i])
    d = channel.duration(size)
    if d <= 0 or q - p < 2:
        return None
    out_start = channel.earliest(js.j, tas.end_u(p), tas.start_u(q), d, direction=OUT)
    if out_start is None:
        return None
    out_end = out_start + d
    release_step = max(p, tas.step_done_by_u(out_end))
    if release_step >= q - 1:
        return None
    out_tag = channel.reserve(js.j, out_start, d, direction=OUT)
    in_slot = channel.earliest(js.j, max(out_end, in_trigger_s), out_end + 4 * tas.period_s, d,
                              direction=IN)
    # a copy the link delivers late is still issued before its consumer (which waits for it):
    # issued after the consumer, the rewrite's trigger edge and the data edge would form a cycle
    in_start = min(in_slot, tas.start_u(q - 1)) if in_slot is not None else None
    in_step = tas.step_at_u(in_start) if in_start is not None else -1
    if in_step <= release_step + 1:   # absent over [release_step + 1, in_step): nothing saved
        channel.release(out_tag)
        return None
    in_tag = channel.reserve(js.j, in_slot, d, direction=IN)
    w = tas.last_write_le(i, p)
    m = release_step + 1   # the first step it is off the device for
    dec = SwapDecision(js.j, i, p, q, m, out_start, d, in_start, d, release_step, in_step,
                       out_tag=out_tag, in_tag=in_tag, version=w,
                       names=(tas.unrolled_name(p), tas.unrolled_name(q), tas.unrolled_name(m)))
    dec.absent = js.fp.add_absence(i, release_step + 1, in_step)
    js.swapped_out.add(i)
    js.decisions.append(dec)
    return dec


class _PolicyPlanner(Planner):
    """A planner whose loop is one pass of a fixed policy."""

    policy = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bottleneck_restarts = 0   # Note [Bottleneck first] is TENSILE's, not the baseline's policy
        self.keep_plans_without_gain = True   # Note [Never above unplanned]: a policy's plan is what is measured
        self.drop_idle_swaps = False          # Note [Transfers that lower no peak] is TENSILE's, not the policy's
        self.chain_limits = self.chain_limits[:1]   # Note [Chain limits tried] is TENSILE's, not the policy's
        self.max_chain = self.chain_limits[0]
        self.recompute_first_passes = False   # Note [Recomputation first] is TENSILE's, not the policy's

    def _loop(self) -> None:
        self.iterations = 1
        budget = self.pool_bytes
        if budget is not None and self.stop_at_budget and self._vanilla_pool_peak <= budget:
            self.stop_reason = UNPLANNED_FITS
            return
        self._policy(budget)
        peak = self._pool_peak()
        met = budget is not None and peak <= budget
        self.stop_reason = f"{self.policy}: one pass" + ("; budget met" if met else "")

    def _policy(self, budget: int | None) -> None:
        raise NotImplementedError

    def _replay_swap(self, js: JobState, dec: SwapDecision) -> SwapDecision | None:
        """Re-issues a decision with this policy after the sequences were
        rebuilt (recomputation added steps)."""
        try:
            p, q = js.tas.unrolled_index(dec.names[0]), js.tas.unrolled_index(dec.names[1])
        except KeyError:
            return None
        return self._issue(js, dec.i, p, q)

    def _issue(self, js: JobState, i: int, p: int, q: int) -> SwapDecision | None:
        raise NotImplementedError


class VDNNPlanner(_PolicyPlanner):
    """vDNN_all (module docstring)."""

    policy = "vDNN"

    def _layer_inputs(self, js: JobState) -> list[tuple[int, int, int]]:
        """(tensor, forward access p, backward access q) of every layer input
        feature map, in the order their backward accesses come."""
        tas = js.tas
        out = []
        for op in js.graph.ops:
            if op.op_type not in LAYER_OP_TYPES:
                continue
            if not any(tas.kind[tas.tindex[t]] == "parameter" for t in op.inputs):
                continue
            at = tas.step_index[op.name]
            for t in op.inputs:
                i = tas.tindex[t]
                if tas.kind[i] != "activation" or tas.size[i] == 0 or not tas.swappable[i]:
                    continue
                A = tas.acc[i]
                k = bisect_left(A, at)
                # out after its last forward use, in for its first backward use: the longest gap from here
                gaps = [(tas.start_u(A[g + 1]) - tas.end_u(A[g]), A[g], A[g + 1]) for g in range(k, len(A) - 1)]
                if gaps:
                    _, p, q = max(gaps)
                    out.append((i, p, q))
        seen: set[int] = set()
        unique = []
        for i, p, q in sorted(out, key=lambda x: x[2]):
            if i not in seen:
                seen.add(i)
                unique.append((i, p, q))
        return unique

    def _triggers(self, js: JobState) -> dict[int, float]:
        """Tensor -> when its prefetch is issued: when the backward pass
        reaches the previous offloaded layer (the one whose backward access
        comes just before this one's); the first one in backward order, when
        the op before its own backward use starts."""
        tas = js.tas
        triggers = {}
        prev_q = None
        for i, p, q in self._layer_inputs(js):
            ahead = prev_q if prev_q is not None and p < prev_q < q else q - 1
            triggers[i] = tas.start_u(ahead) if ahead > p else tas.end_u(p)
            prev_q = q
        return triggers

    def _policy(self, budget: int | None) -> None:
        for js in self.jobs:
            for i, p, q in self._layer_inputs(js):
                dec = self._issue(js, i, p, q)
                if dec is not None:
                    self.order.append(dec)

    def _issue(self, js: JobState, i: int, p: int, q: int) -> SwapDecision | None:
        triggers = self._trigger_cache.get(js.j)
        if triggers is None:
            triggers = self._trigger_cache[js.j] = self._triggers(js)
        return swap_in_gap(self.channel, js, i, p, q, triggers.get(i, js.tas.end_u(p)))

    def _init_state(self) -> None:
        self._trigger_cache: dict[int, dict[int, float]] = {}
        super()._init_state()

    def _rebuild(self, retime=None, restructure=()) -> None:
        self._trigger_cache = {}   # the sequences' times change
        super()._rebuild(retime=retime, restructure=restructure)


class CapuchinPlanner(_PolicyPlanner):
    """Capuchin's policy (module docstring)."""

    policy = "Capuchin"

    @staticmethod
    def _in_trigger(js: JobState, q: int, ideal_s: float) -> float:
        """The start of the last access (of any tensor, i.e. the last step)
        that begins no later than the ideal SwapInStartTime (§4.4: traverse
        back from the back-access)."""
        tas = js.tas
        k = max(0, min(q - 1, tas.step_at_u(max(ideal_s, 0.0))))
        while k > 0 and tas.start_u(k) > ideal_s:
            k -= 1
        return tas.start_u(k)

    def _issue(self, js: JobState, i: int, p: int, q: int) -> SwapDecision | None:
        tas = js.tas
        d = self.channel.duration(int(tas.size[i]))
        return swap_in_gap(self.channel, js, i, p, q, self._in_trigger(js, q, tas.start_u(q) - d))

    def _policy(self, budget: int | None) -> None:
        pa = gpu_memory_peak_analysis([js.fp for js in self.jobs], self.timeline)   # passive mode, once
        need = pa.peak_bytes - budget if budget is not None else None
        ranked = []
        for j, idx in pa.mpt.items():
            js = self.jobs[j]
            tas = js.tas
            m = pa.job_steps[j]
            for i in idx[tas.swappable[idx]].tolist():
                if tas.persistent[i]:
                    continue   # Capuchin's candidates are the step's intermediate results
                gap = find_gap(js, i, m)
                if gap is None:
                    continue
                p, q = gap
                d = self.channel.duration(int(tas.size[i]))
                free_time = (tas.start_u(q) - d) - (tas.end_u(p) + d)   # FT = SwapInStartTime - SwapOutEndTime
                ranked.append((free_time, int(tas.size[i]), j, i, p, q))
        ranked.sort(key=lambda r: (-r[0], -r[1], r[2], r[3]))
        saved = 0
        for free_time, size, j, i, p, q in ranked:
            if need is not None and saved >= need:
                break
            if free_time < 0:
                break   # the rest cannot hide: recomputation is compared for them below
            dec = self._issue(self.jobs[j], i, p, q)
            if dec is not None:
                self.order.append(dec)
                saved += size
        if need is not None and saved < need and self.enable_recompute:
            picked = recomputation_scheduling(self.jobs, pa, need - saved, max_chain=self.max_chain)
            if picked:
                for j, evs in picked.items():
                    self.jobs[j].recomputes.extend(evs)
                self._rebuild(restructure=list(picked))


#: Planner classes by strategy name (``tensile`` is Algorithm 3).
STRATEGIES: dict[str, type[Planner]] = {"tensile": Planner, "vdnn": VDNNPlanner, "capuchin": CapuchinPlanner}
