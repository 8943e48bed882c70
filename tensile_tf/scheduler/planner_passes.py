"""The passes around Algorithm 3 that are not in the seed: chain limits
tried, bottleneck restarts, reverse delete and minimise mode (phases 5-8
in ``scheduler.planner``'s docstring), and the loop's recomputation round.

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
longer chain would plan the same, and so does a pass in which the limit cut
no chain short (``recompute_chain``'s ``limit_hits``): every rebuild it
looked for was found, or failed for another reason, within the limit, so a
longer one finds the same. Re-planning (§IV-E) keeps the chosen limit.
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

Note [Restarts that serve nothing new]. A restart serves the best pass's
bottlenecks and the newest peak's step, then runs the loop from there. The
loop is deterministic: started from the same swaps on a fresh state, it books
the same decisions and ends at the same peak. Where serving the new step
booked nothing (every tensor resident there was taken, or the link had no
room), the swaps a restart starts from are those the best pass started from,
so it would end where that pass ended and the restarts stop there
(``restarts_skipped``). 8 ResNet50 jobs at 60% on the saved capture: the
second restart of each pass repeated the first round for round; 104 s
became 73.5 s, the same plan (5,401 swaps, 27 recomputations, 2037.8 MiB).

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
whose host copy serves another kept gap stays. Each is asked without a
change: the peak were its absence put back, read only at the grid points
its steps cover (``PoolTimeline.pool_peak_if_added``); a swap taken out
releases its link time and the others stay where they are booked, so the
plan is the state whose peak was checked. In minimise mode the decisions
left are then scheduled again on a fresh channel, kept where that lowers
the peak (the channel's freed time lets a swap leave sooner or come back
later; without it 3 of the 192 cases of ``exact_gap_bench.py``
minimised up to 1.1% higher). (The pass used to do that in every mode and
undo itself where the peak rose: one or two replays of every swap, and a
full sum of the pool per decision asked. Saved capture ``bench_resnet50_b16`` at 60%: 8 jobs'
re-plan 7.7-8.2 s -> 5.4-5.7 s, 4,328 swaps kept against 4,600, the plans'
peaks equal or within 0.01%.) A fast link loses nothing to it (the
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

Note [Minimise mode]. With no budget (``pool_bytes=None``) the loop used to
swap until the first round booked nothing and never recompute: ResNet50
64x64 b16 at 110 MiB/s (a saved capture) ended at 361.3 MiB after 2
iterations, where a budget of half its unplanned peak planned 314.6. Now
the loop aims at a target. Until ``minimise_target`` is met it runs as with
that budget; once met (or with no target) it chases: each round aims one
byte under the peak with swaps, then recomputation, and a recomputation
that lowers the peak lets every swap be tried again (new peak, new steps);
it stops only when no swap and no recomputation of any job lowers the peak
(``stop_reason`` "minimised: ..."), not by the seed's 0.05% rule. A
chasing recomputation round aims 1% of the peak lower (each round rebuilds
the sequences: on that capture 65 rounds one at a time took 31.8 s, 12 at
1% 4.8 s, same peak, 295.5 MiB). Swaps that failed for a job whose share
is capped (``max_swapping_rate``) are tried again once others are booked.
The greedy's end depends on how much each round aims at (a budget swaps
several tensors a round, the chase one), so ``_plan_minimised`` plans
passes aimed at a series, chasing from the start, then target 0 (as an
unreachable budget), then a bisection of targets below the best peak, and
keeps the lowest ``_pass_cost``. A pass aimed at b is the budgeted plan at b
until it meets b and from there only lowers the peak, so it peaks no higher
than the plan at budget b (435 of 435 sampled captures and budgets). For
budgets the series did not aim at it is measured, not guaranteed: over 250
random captures, 40-60 budgets each, 6 captures had a budget whose plan
peaked lower (by 0.1-5%: two jobs whose recomputations move each other's
peaks, or capped shares, where a batch succeeds and each part alone
fails). Passes after the first run while passes x ops of all jobs stay
under ``minimise_series_steps``: ResNet50 (9891 ops) plans the chase alone.
Baselines keep their one pass (a policy's loop aims at no target).

Note [Recomputation first]. Algorithm 3 swaps while swaps succeed and
recomputes only after; a swap booked first can take away what the best
recomputation needed. On the small CNN b64 capture (minimised, any link) the
swaps took the first pooled tensor off the device over conv2's backward, so
rebuilding conv2's 4 MiB ReLU output (conv, squeeze, bias, ReLU) no longer
fit a chain, and the loop recomputed the 1 MiB pooled tensor after it
instead: 30.15 MiB, against 27.15 proven optimal by the exact planner
(scheduler.exact_planner). A pass that recomputes first (each round tries
recomputation, then swaps once none is left, and recomputation again after
each booked swap) plans 26.15 there (two reruns: outside the exact model),
and on the saved captures lowers the residual net b8 at 110 MiB/s from
33.24 to 31.24 MiB and meets the small CNN b16's 50% budget the
swap-first pass missed by 3%. It costs step time (recomputation is not
free where swaps overlap compute), so it is a second pass, never the only
one: a budgeted plan tries it at each chain limit whose swap-first pass
missed the budget (per limit: with limits 2 and 4, a pass at 4 that met the
budget once kept the cheaper recomputing pass at 2 from being planned, and
the plan kept cost more than planning at 2 alone, 57.35 s against 57.10 at
the same peak, a case the property test found), and minimise mode aims it at each target the swap-first pass
missed (``aimed`` in ``_plan_minimised``); ``_pass_cost`` picks, so it is
kept only where it peaks lower, or as low in less time. Re-planning keeps
the order of the pass kept (``recompute_first`` in ``_PASS_STATE``).
"""
from __future__ import annotations

from tensile_tf.scheduler.peak_analysis import PeakAnalysis, gpu_memory_peak_analysis
from tensile_tf.scheduler.recompute import recomputation_scheduling
from tensile_tf.scheduler.swap_scheduling import swap_scheduling

# Plan.stop_reason when the unplanned (free-running) steps fit the budget already; the second when they do
# as predicted and a job whose unplanned step ran out runs in plan order (Note [Cold-start planning]).
UNPLANNED_FITS = "budget met by the unplanned steps"
UNPLANNED_FITS_IN_ORDER = "budget met by the unplanned steps, those that ran out in plan order"
FITS_UNPLANNED = (UNPLANNED_FITS, UNPLANNED_FITS_IN_ORDER)
# how Plan.stop_reason starts where the loop minimised (no budget) and no candidate was left
MINIMISED = "minimised"


class PlannerPasses:
    """Chain limits, bottleneck restarts and reverse delete, over a ``Planner``'s state."""

    # what one pass of plan() leaves behind (Note [Chain limits tried])
    _PASS_STATE = ("jobs", "order", "timeline", "channel", "bottlenecks", "stop_reason", "iterations",
                   "dropped_swaps", "max_chain", "recompute_rounds", "recompute_first")
    # Note [Minimise mode]: what the loop aims at without a budget (None: under the peak); the series of targets
    minimise_target: int | None = None
    minimise_bisections = 6           # targets bisected after the chase and target 0
    minimise_tolerance = 0.005        # ... until the interval is this fraction of the best peak
    minimise_series_steps = 4000      # passes after the first while passes x steps of all jobs stay under this
    minimise_recompute_step = 0.01    # a chasing recomputation round aims this fraction of the peak lower
    minimise_targets: tuple | list = ()   # ... the targets the last minimise-mode plan aimed at, in order
    recompute_first_passes = True     # Note [Recomputation first]: passes that recompute before they swap
    skip_uncut_chain_limits = True    # Note [Chain limits tried]: no longer limit after a pass no limit cut
    skip_restarts_that_serve_nothing_new = True   # Note [Restarts that serve nothing new]
    restarts_skipped = 0              # ... how many restarts it left out

    def _plan_each_chain_limit(self) -> None:
        """Note [Chain limits tried]: one pass per chain limit, the best
        pass's state kept (``_pass_cost``)."""
        best = None
        self.pass_costs = {}
        swap_first_peaks: dict[int, int] = {}     # limit -> its swap-first pass's peak
        for recompute_first in (False, True):
            self.recompute_first = recompute_first
            for limit in self.chain_limits:
                if recompute_first and not self._recompute_first_helps(
                        self._swap_first_peak(swap_first_peaks, limit), self.pool_bytes):
                    continue     # Note [Recomputation first]: only at limits whose swap-first pass missed
                self.max_chain = limit
                self._plan_pass()
                key = self._pass_cost()
                if not recompute_first:
                    swap_first_peaks[limit] = key[0]
                self.pass_costs[limit] = min(self.pass_costs.get(limit, key), key)
                if best is None or key < best[0]:
                    best = (key, {a: getattr(self, a) for a in self._PASS_STATE})
                if not self._longer_limit_may_differ():
                    break
        for a, v in best[1].items():
            setattr(self, a, v)

    @staticmethod
    def _swap_first_peak(peaks: dict[int, int], limit: int) -> int:
        """The swap-first peak at ``limit``: its own pass's, or where no pass was planned at it (Note
        [Chain limits tried]: it would plan as the longest shorter limit planned) that one's."""
        planned = [k for k in peaks if k <= limit]
        return peaks[max(planned)] if planned else peaks[min(peaks)]

    def _longer_limit_may_differ(self) -> bool:
        """Note [Chain limits tried]: whether the pass just planned could differ at a longer chain
        limit: it tried recomputation and the limit cut a chain short (or cuts are not counted)."""
        return self.recompute_rounds > 0 and (self.chain_limit_hits[0] > 0 or not self.skip_uncut_chain_limits)

    def _recompute_first_helps(self, peak: int, target: int | None) -> bool:
        """Note [Recomputation first]: whether a pass that recomputes first is planned after the
        swap-first passes reached ``peak`` aiming at ``target`` (None: minimise mode's chase)."""
        return (self.enable_recompute and self.recompute_first_passes and self.max_iterations > 0
                and (target is None or peak > target))

    def _minimised_reason(self) -> str:
        """Plan.stop_reason of a minimise-mode loop that ran out of candidates (Note [Minimise mode])."""
        tools = "swap or recomputation" if self.enable_recompute else "swap"
        return f"{MINIMISED}: no {tools} of any job lowers the peak further"

    def _share_failures_forgotten(self, failures: set) -> set:
        """Note [Minimise mode]: the swaps that failed for a job whose share
        of swapped tensors is capped (``max_swapping_rate`` < 1) are tried
        again once other swaps were booked: its share may allow them now."""
        capped = {js.j for js in self.jobs if js.max_swapping_rate < 1}
        return {f for f in failures if f[0] not in capped} if capped else failures

    def _plan_minimised(self) -> None:
        """Note [Minimise mode]: per chain limit, passes aimed at a series of
        targets: none (chase from the start), 0, then a bisection; the pass
        with the lowest ``_pass_cost`` kept, as in Note [Chain limits tried]."""
        best = None
        self.pass_costs = {}
        self.minimise_targets = []   # every target a pass aimed at (None: the chase), in order
        steps = sum(len(pj.graph.ops) for pj in self.specs)
        for limit in self.chain_limits:
            self.max_chain = limit
            limit_best, recomputed = None, False
            more = self.minimise_series_steps // max(1, steps) - 1      # passes after the first

            def aimed(target):
                """The pass aimed at ``target``, and where it misses it (or chases), the pass that
                recomputes first (Note [Recomputation first]), as a budget of ``target`` plans."""
                nonlocal best, limit_best, recomputed, more
                self.minimise_targets.append(target)
                peak = None
                for self.recompute_first in (False, True):
                    if self.recompute_first and (more <= 0 or not self._recompute_first_helps(peak, target)):
                        break
                    self.minimise_target, more = target, more - 1
                    self._plan_pass()
                    recomputed = recomputed or self._longer_limit_may_differ()
                    key = self._pass_cost()
                    limit_best = min(limit_best or key, key)
                    if best is None or key < best[0]:
                        best = (key, {a: getattr(self, a) for a in (*self._PASS_STATE, "minimise_target")})
                    peak = key[0] if peak is None else min(peak, key[0])
                return peak

            lo, hi = 0, aimed(None)
            if more > 0:
                aimed(0)
            for _ in range(self.minimise_bisections):
                target = (lo + hi) // 2
                if more <= 0 or target <= lo or hi - lo <= self.minimise_tolerance * hi:
                    break
                peak = aimed(target)
                lo, hi = (lo, peak) if peak <= target else (target, hi)
            self.pass_costs[limit] = limit_best
            if not recomputed:
                break
        for a, v in best[1].items():
            setattr(self, a, v)

    def _recompute_round(self, pa, need: int) -> bool | None:
        """Recomputations for about ``need`` bytes at the peak: True when they lowered
        the pool peak, False when they did not (the first is not tried again), None
        when there was none to try."""
        self.recompute_rounds += 1
        picked = recomputation_scheduling(self.jobs, pa, need, max_chain=self.max_chain,
                                          limit_hits=self.chain_limit_hits)
        if not picked:
            return None
        before = pa.peak_bytes
        attempts = [picked]
        first_only = {j: evs[:1] for j, evs in list(picked.items())[:1]}
        if sum(len(v) for v in picked.values()) > 1:
            attempts.append(first_only)
        kept = self._planning_state()
        for batch in attempts:
            for j, evs in batch.items():
                self.jobs[j].recomputes = self.jobs[j].recomputes + evs
            self._rebuild(restructure=list(batch))
            if self._pool_peak() < before:
                return True
            self._restore_planning_state(kept)   # the state before, swaps the rebuild could not replay included
        for j, evs in first_only.items():
            self.jobs[j].no_recompute.add(self.jobs[j].tas.tindex[evs[0].target])
        return False

    _JOB_STATE = ("tas", "fp", "decisions", "swapped_out", "host_copies", "recomputes")

    def _planning_state(self) -> tuple:
        """What ``_rebuild`` replaces (it makes new objects and never writes the old ones): kept by
        reference, so an attempt undone costs nothing (a second rebuild used to put it back)."""
        return ([{a: getattr(js, a) for a in self._JOB_STATE} for js in self.jobs],
                self.order, self.timeline, self.channel)

    def _restore_planning_state(self, state: tuple) -> None:
        jobs, self.order, self.timeline, self.channel = state
        for js, kept in zip(self.jobs, jobs):
            for a, v in kept.items():
                setattr(js, a, v)

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
        self.chain_limit_hits = [0]   # Note [Chain limits tried]: recomputations the chain limit cut short
        self._init_state()
        self._loop()
        kept = ("jobs", "order", "timeline", "channel", "stop_reason", "iterations")
        best, best_peak, state = [], self._pool_peak(), {a: getattr(self, a) for a in kept}
        best_served: tuple = ()     # Note [Restarts that serve nothing new]: what the best pass's loop started from
        # max_iterations=0 asks for the unplanned steps' figures: no restart books swaps either
        for _ in range(self.bottleneck_restarts if self.max_iterations > 0 else 0):
            if (self.pool_bytes is not None and best_peak <= self.pool_bytes) or self.stop_reason in FITS_UNPLANNED:
                break
            steps = gpu_memory_peak_analysis([js.fp for js in self.jobs], self.timeline, with_tensors=False).job_steps
            if steps in self.bottlenecks:
                break
            self.bottlenecks = best + [steps]
            self._init_state()
            self._serve_bottlenecks()
            served = self._served_decisions()
            if served == best_served and self.skip_restarts_that_serve_nothing_new:
                self.restarts_skipped += 1
                break      # the loop would start where the best pass's started, and end where it ended
            self._loop()
            if self._pool_peak() >= best_peak:
                break
            best, best_peak, state = list(self.bottlenecks), self._pool_peak(), {a: getattr(self, a) for a in kept}
            best_served = served
        if self.bottlenecks != best:       # the last restart brought no lower peak: back to the best pass, as kept
            self.bottlenecks = best
            for a, v in state.items():
                setattr(self, a, v)
        self._drop_swaps_that_lower_no_peak()

    def _served_decisions(self) -> tuple:
        """Note [Restarts that serve nothing new]: the swaps booked so far, as the loop reads them."""
        return tuple((d.j, d.i, d.p, d.q, d.out_start, d.in_start, d.version) for d in self.order)

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
        copies_reused = {self._host_copy_key(d) for d in self.order if d.out_start is None}
        idle = set()
        for dec in sorted(self.order, key=lambda d: -int(self.jobs[d.j].tas.size[d.i])):
            if dec.out_start is not None and self._host_copy_key(dec) in copies_reused:
                continue   # its host copy serves another gap
            fp = self.jobs[dec.j].fp
            steps, delta = fp.absence_delta(dec.i, dec.absent)
            peak = self.timeline.pool_peak_if_added([js.fp.F for js in self.jobs], dec.j, steps, delta)
            if peak is not None:          # asked without a change: only a swap taken out is written
                if peak <= limit:
                    fp.remove_absence(dec.i, dec.absent)
                    idle.add(id(dec))
                continue
            fp.remove_absence(dec.i, dec.absent)
            if self._pool_peak() <= limit:
                idle.add(id(dec))
                continue
            for a, b in dec.absent:
                fp.add_absence(dec.i, a, b)
        if not idle:
            return
        self._take_out_swaps(idle)
        if self.pool_bytes is None:        # minimise mode: scheduled again, the rest may hold a lower peak
            kept, peak = self._planning_state(), self._pool_peak()
            self._rebuild()
            if self._pool_peak() >= peak:
                self._restore_planning_state(kept)

    def _take_out_swaps(self, idle: set[int]) -> None:
        """Note [Transfers that lower no peak]: the decisions ``idle`` (their ids), whose absences
        are off the footprints already, taken out of the plan: their link time released, the rest
        left where they are booked (the state whose peak was checked)."""
        dropped = [d for d in self.order if id(d) in idle]
        self.order = [d for d in self.order if id(d) not in idle]
        for dec in dropped:
            for tag in (dec.out_tag, dec.in_tag):
                if tag >= 0:
                    self.channel.release(tag)
        for j in {d.j for d in dropped}:
            js = self.jobs[j]
            js.decisions = [d for d in js.decisions if id(d) not in idle]
            js.swapped_out = {d.i for d in js.decisions if d.out_start is not None}
            for d in dropped:
                if d.j == j and d.out_start is not None:
                    js.host_copies.pop(self._host_copy_key(d)[1:], None)
        self.dropped_swaps = len(dropped)

    def _host_copy_key(self, d) -> tuple[int, int, int]:
        """(job, tensor, version % n): the host copy a swap-out makes and a later swap of that
        version's data reuses (``JobState.host_copies`` keys it without the job)."""
        return (d.j, d.i, d.version % self.jobs[d.j].tas.n if d.version is not None else -1)
