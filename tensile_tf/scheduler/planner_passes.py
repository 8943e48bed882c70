"""The passes around Algorithm 3 that are not in the seed: chain limits
tried, bottleneck restarts and reverse delete (phases 5-7 in
``scheduler.planner``'s docstring).

``PlannerPasses`` is a mixin of ``scheduler.planner.Planner``: its methods
drive the planner's own state (``_init_state``, ``_loop``, ``_rebuild``,
``_pool_peak``, ``jobs``, ``order``, ``timeline``, ``channel``) and set what
one pass leaves behind (``_PASS_STATE``).

Note [Chain limits tried]. Recomputation rebuilds a target from what is
on the device, recursively up to ``max_chain`` ops (``recompute``). Which
limit plans best depends on the graph, and not monotonically: greedy MSPS
with longer chains picks long rebuilds early that crowd out better picks
later. On saved captures at half their peak on the 110 MiB/s link: the
Transformer encoder b16 plans 14.66 MiB with chains of 4 and 14.17 with 6
(it rebuilds both FFN ReLUs from the attention output, whose own inputs
Algorithm 3 swapped first; Capuchin's policy rebuilds them with 4 ops
because it swaps less); ResNet50 64x64 b16 plans 334.6 MiB with 4, 340.5
with 5, 337.4 with 6. So the planner plans once per limit (4 and 6 by
default) and keeps the best (``_pass_cost``): the lowest predicted peak,
every peak within the budget counting as the budget, then the shortest
planned iteration, then the fewest bytes swapped. A pass that tried no
recomputation (the budget met by swaps, or no budget) ends the trials, as a
longer chain would plan the same. Re-planning (§IV-E) keeps the chosen limit.
The baselines plan with one limit, the first (``scheduler.baselines``).

Note [Bottleneck first]. Algorithm 2 serves whichever step is the pool peak
now, and the swaps it books there take link time that a later peak may have
needed more. On a slow link that decides the result: ResNet50 64x64 b16 at
110 MiB/s peaks last at the end of its backward pass (conv1's filter
gradient), where every resident tensor must be back within the Adam phase
that follows (150 ms: 16.6 MiB of swap-ins at most); the first pass had
spent that window on swap-outs of parameters it took off earlier peaks, and
ended at 4.2% MSR with the link 55% busy. Planning again with that step
served first reaches 5.3%, against a deadline-aware ceiling of 6.1%
(``scheduler.link_bound``). Restarts stop when one brings no lower peak
(``bottleneck_restarts`` at most); on a fast link the budget is met in the
first pass and nothing changes.

Note [Transfers that lower no peak]. Algorithm 3 books swaps for the pool
peak of each round and recomputes only once swaps stop succeeding; a swap
booked for an early round's peak stays booked after later swaps and the
recomputations have lowered that step below the final peak. On the capped
link every such transfer costs step time and buys nothing. ResNet50 64x64
b16, half its peak at 110 MiB/s (a saved capture): 129 of 201 swap
decisions were idle, 102 MiB of a step's 113.9 MiB link capacity carried
57 MiB of transfers that lowered no peak; the Transformer encoder b16 at
the same link, 15 of 85 (5.75 -> 4.21 MiB a step). So once the plan is
final, each swap (largest tensor first) is taken out where the pool peak
stays at or below the final peak (or the budget, where it was met); a swap
whose host copy serves another kept gap stays. The decisions left are
scheduled again on a fresh channel (``_rebuild``), and if the peak then
rose after all, the pass is undone. A fast link loses nothing to it (the
Transformer's 3x batch, unlimited link: none is idle). Only plan-order
plans are pruned: their footprint is the step as it runs (peaks within 1
MiB of the prediction on ResNet50, DenseNet121 and VGG16 at 3-4x their
batch). A free-order plan's footprint misses where the executor's threads
fire its anchors (Note [Free-order plans] in peak_analysis), and the swaps
the model calls idle were what held its measured peak down: InceptionV3 at
3-4x its batch (``auto``, free order), pruned to its 277 MiB budget, peaked
at 293-306 MiB where the unpruned plan had peaked at 202-225. The baselines
keep their passes (``scheduler.baselines``): what a policy books is what it
runs.
"""
from __future__ import annotations

from tensile_tf.scheduler.peak_analysis import PeakAnalysis, gpu_memory_peak_analysis
from tensile_tf.scheduler.swap_scheduling import swap_scheduling

# Plan.stop_reason when the unplanned (free-running) steps fit the budget already; the second when they do
# as predicted and a job whose unplanned step ran out runs in plan order (Note [Cold-start planning]).
UNPLANNED_FITS = "budget met by the unplanned steps"
UNPLANNED_FITS_IN_ORDER = "budget met by the unplanned steps, those that ran out in plan order"
FITS_UNPLANNED = (UNPLANNED_FITS, UNPLANNED_FITS_IN_ORDER)


class PlannerPasses:
    """Chain limits, bottleneck restarts and reverse delete, over a ``Planner``'s state."""

    # what one pass of plan() leaves behind (Note [Chain limits tried])
    _PASS_STATE = ("jobs", "order", "timeline", "channel", "bottlenecks", "stop_reason", "iterations",
                   "dropped_swaps", "max_chain", "recompute_rounds")

    def _plan_each_chain_limit(self) -> None:
        """Note [Chain limits tried]: one pass per chain limit, the best
        pass's state kept (``_pass_cost``)."""
        best = None
        self.pass_costs = {}
        for limit in self.chain_limits:
            self.max_chain = limit
            self._plan_pass()
            key = self.pass_costs[limit] = self._pass_cost()
            if best is None or key < best[0]:
                best = (key, {a: getattr(self, a) for a in self._PASS_STATE})
            if not self.recompute_rounds:
                break            # no recomputation was tried: a longer chain changes nothing
        for a, v in best[1].items():
            setattr(self, a, v)

    def _pass_cost(self) -> tuple[int, float, int]:
        """Note [Chain limits tried]: how one pass's plan ranks: the predicted
        pool peak (any peak within the budget counts as the budget), then the
        planned iteration seconds, then the bytes swapped."""
        peak = self._pool_peak()
        if self.pool_bytes is not None and self.stop_at_budget:
            peak = max(peak, self.pool_bytes)
        seconds = sum(float(js.tas.period_s) for js in self.jobs)
        return peak, seconds, sum(int(self.jobs[d.j].tas.size[d.i]) for d in self.order)

    def _plan_pass(self) -> None:
        """Algorithm 3, the bottleneck restarts and reverse delete, at one chain limit
        (Note [Bottleneck first], Note [Transfers that lower no peak])."""
        self.bottlenecks = []
        self.recompute_rounds = 0
        self._init_state()
        self._loop()
        best, best_peak = [], self._pool_peak()
        for _ in range(self.bottleneck_restarts):
            if self.pool_bytes is None or best_peak <= self.pool_bytes or self.stop_reason in FITS_UNPLANNED:
                break
            steps = gpu_memory_peak_analysis([js.fp for js in self.jobs], self.timeline, with_tensors=False).job_steps
            if steps in self.bottlenecks:
                break
            self.bottlenecks = best + [steps]
            self._init_state()
            self._serve_bottlenecks()
            self._loop()
            if self._pool_peak() >= best_peak:
                break
            best, best_peak = list(self.bottlenecks), self._pool_peak()
        if self.bottlenecks != best:       # the last restart brought no lower peak: back to the best pass
            self.bottlenecks = best
            self._init_state()
            self._serve_bottlenecks()
            self._loop()
        self._drop_swaps_that_lower_no_peak()

    def _serve_bottlenecks(self) -> None:
        """Note [Bottleneck first]: Algorithm 2 at each remembered step, in order, before the loop."""
        for steps in self.bottlenecks:
            fps = [js.fp for js in self.jobs]
            pa = PeakAnalysis(self._pool_peak(), 0.0, dict(steps), {j: fps[j].resident_at(k) for j, k in steps.items()},
                              {j: k - 1 for j, k in steps.items()}, [f.peak for f in fps])
            self.order.extend(swap_scheduling(self.jobs, self.channel, pa))

    def _drop_swaps_that_lower_no_peak(self) -> None:
        """Note [Transfers that lower no peak]: the reverse-delete pass over
        the final plan's swap decisions."""
        self.dropped_swaps = 0
        if not self.drop_idle_swaps or not self.order or self.step_order != "plan":
            return
        limit = self._pool_peak()
        if self.pool_bytes is not None and self.stop_at_budget and limit <= self.pool_bytes:
            limit = self.pool_bytes
        copies_reused = {(d.j, d.i, d.version) for d in self.order if d.out_start is None}
        idle = set()
        for dec in sorted(self.order, key=lambda d: -int(self.jobs[d.j].tas.size[d.i])):
            if dec.out_start is not None and (dec.j, dec.i, dec.version) in copies_reused:
                continue   # its host copy serves another gap
            fp = self.jobs[dec.j].fp
            fp.remove_absence(dec.i, dec.absent)
            if self._pool_peak() <= limit:
                idle.add(id(dec))
                continue
            for a, b in dec.absent:
                fp.add_absence(dec.i, a, b)
        if not idle:
            return
        full = self.order
        self.order = [d for d in full if id(d) not in idle]
        self._rebuild()
        if self._pool_peak() > limit:   # scheduled again, the rest did not hold the peak: keep every swap
            self.order = full
            self._rebuild()
            return
        self.dropped_swaps = len(full) - len(self.order)
