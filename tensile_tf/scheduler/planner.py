"""Complete Scheduling Algorithm (seed 000 §IV-E/F, Algorithm 3).

Phases, top to bottom:

1. Tensor Access Sequence per job (§IV-A, ``access_sequence``).
2. Activity analysis: every tensor is released after its last access (line 2);
   this is the vanilla footprint, what TensorFlow's refcounting already does.
3. Loop (lines 3-23): GPU Memory Peak Analysis over all jobs (Algorithm 1,
   ``peak_analysis``), then Swap Scheduling (Algorithm 2, ``swap_scheduling``)
   while it keeps succeeding, then Recomputation Scheduling (§IV-D,
   ``recompute``) while the pool peak is above the budget.
4. Stop when no swap and no recomputation succeeds, or the budget is met
   (``stop_at_budget``), or by the seed's rule (line 4): after 100 iterations,
   when the peak fell by less than 0.05 % over the last 3 iterations.
5. Bottleneck restarts (not in the seed; Note [Bottleneck first]): while the
   budget is missed, plan again from scratch with the steps where earlier
   passes ended serving first; keep the lowest peak.
6. Reverse delete (not in the seed; Note [Transfers that lower no peak]):
   drop every swap whose absence the final plan's peak no longer needs.
7. Chain limits (not in the seed; Note [Chain limits tried]): phases 3-6
   once per longest recomputation chain in ``max_chain``; the best plan kept.
8. Minimise mode (no budget; Note [Minimise mode]): swaps and recomputation
   until nothing lowers the peak, phases 3-7 aimed at a series of targets.

Phases 5-8, their Notes and the loop's recomputation round: ``scheduler.planner_passes``.

Note [Never above unplanned]. A planned step runs its ops in plan order
(Note [Free-running steps] in peak_analysis), which on a branchy graph can
peak above the free-running step: InceptionV3 64x64 b16 in plan order peaks
12.5% above its unplanned step, and on the 110 MiB/s link the swaps the
planner found took back less than that (measured -13.0% MSR). When the best
plan's predicted pool peak is not below the unplanned steps' predicted peak,
the planner returns no events (``NO_GAIN``): the jobs run unplanned, never
worse. The baselines of ``scheduler.baselines`` keep their plans: what a
policy does is what is measured.

Re-planning (§IV-E) reuses the previous state: the structure is kept, times rebuilt from the
new latencies, the previous swap decisions replayed on the channel in their order, then the
loop continues. Jobs of one graph are planned afresh by representatives (scheduler.identical_jobs).
"""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.identical_jobs import copied_unchained_runs, plan_alike_jobs
from tensile_tf.scheduler.job_graph import JobGraph
from tensile_tf.scheduler.latency import LatencyModel
from tensile_tf.scheduler.peak_analysis import JobFootprint, PoolTimeline, gpu_memory_peak_analysis
from tensile_tf.scheduler.plan import JobPlan, Plan, ReleaseEvent, SwapEvent
from tensile_tf.scheduler.planner_passes import FITS_UNPLANNED, UNPLANNED_FITS, UNPLANNED_FITS_IN_ORDER, PlannerPasses
from tensile_tf.scheduler.planner_rebuilds import PlannerRebuilds
from tensile_tf.scheduler.state import JobState, SwapDecision
from tensile_tf.scheduler.swap_channel import SwapChannel
from tensile_tf.scheduler.swap_scheduling import swap_scheduling
from tensile_tf.scheduler.unchained_runs import unchained_runs

#: PCIe 3.0 x16 as seen by cudaMemcpyAsync from pinned memory, ~12 GiB/s.
DEFAULT_BANDWIDTH_BYTES_PER_S = 12 * 2**30

# Plan.stop_reason when no plan found peaks below the unplanned steps (Note [Never above unplanned]).
NO_GAIN = "no plan peaks below the unplanned steps: none is applied"
#: How a planned step runs its ops: chained in plan order, or free on the
#: executor's threads (Note [Free-order plans] in peak_analysis).
STEP_ORDERS = ("plan", "free")


@contextlib.contextmanager
def collections_paused():
    """No garbage collection while the planner runs (and, in the runtime, while the steps are
    rewritten: Note [Re-plans users do not feel] in tensile_tf/runtime/replanning.py). The planner
    makes no cycles worth collecting, and a collection over everything a run holds took 1.7-2.8 s;
    while planning 8 ResNet50 jobs, collections over the planner's own state took 26% of its time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def plan_in_step_order(planner_cls: type["Planner"], jobs: Sequence["PlannerJob"], step_order: str,
                       **kwargs) -> Plan:
    """A plan for ``step_order`` "plan" or "free", or "auto": the free-order
    plan when it meets the budget by swaps alone, else the plan-order one
    (Note [Free-order plans] in peak_analysis). ``kwargs`` go to the planner."""
    if step_order not in (*STEP_ORDERS, "auto"):
        raise ValueError(f"step_order {step_order!r}: choose one of {', '.join(STEP_ORDERS)}, auto")
    plan = planner_cls(jobs, step_order="free" if step_order == "auto" else step_order, **kwargs).plan()
    if step_order == "auto" and (not plan.budget_met or any(jp.recomputes for jp in plan.jobs.values())
                                 or any(pj.unplanned_step_ran_out and not plan.jobs[pj.graph.name].changes_step
                                        for pj in jobs)):   # a free plan with no events leaves it as it ran out
        plan = planner_cls(jobs, step_order="plan", **kwargs).plan()
    return plan


@dataclass
class PlannerJob:
    """One job handed to the planner."""

    graph: JobGraph
    latencies: LatencyModel
    start_offset_s: float = 0.0
    max_swapping_rate: float = 1.0
    # its unplanned step ran out of memory where it is planned (a cold start): a measurement above the
    # prediction, so it runs in plan order even where its predicted unplanned peak fits (Note [Free-running steps])
    unplanned_step_ran_out: bool = False


class Planner(PlannerPasses, PlannerRebuilds):
    """Algorithm 3 over several jobs sharing one pool and one swap channel.

    ``pool_bytes``: the budget for the pool peak (None: minimise it with swaps and,
    unless ``enable_recompute=False``, recomputation: Note [Minimise mode] in planner_passes).
    """

    # Note [Identical jobs planned by representatives] in scheduler.identical_jobs: from this many
    # identical jobs (0: never), planned as this many representatives
    representatives_from = 6
    representatives = 2
    alike_latencies_within, latency_spread = 0.2, None   # Note [Jobs of one graph planned on their fastest latencies]

    def __init__(self, jobs: Sequence[PlannerJob], *, pool_bytes: int | None = None,
                 bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
                 horizon_iterations: float = 2.0, stop_at_budget: bool = True,
                 enable_recompute: bool = True, max_chain: int | Sequence[int] = (4, 6),
                 max_iterations: int = 100_000,
                 coincident_peaks: bool = False, peaking_jobs: int | None = None,
                 unplanned_peaking_jobs: int | None = None,
                 bottleneck_restarts: int = 3, step_order: str = "plan", drop_idle_swaps: bool = True,
                 unchain: bool = True, link_lanes: int = 1, combined_bytes_per_s: float | None = None):
        if not jobs:
            raise ValueError("planner: no jobs to plan")
        if step_order not in STEP_ORDERS:
            raise ValueError(f"planner: step_order must be one of {', '.join(STEP_ORDERS)}, got {step_order!r} "
                             "(Note [Free-order plans] in tensile_tf.scheduler.peak_analysis)")
        names = [pj.graph.name for pj in jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"planner: job names must be unique, got {names}")
        for pj in jobs:
            if not 0 < pj.max_swapping_rate <= 1:
                raise ValueError(f"job '{pj.graph.name}': max_swapping_rate must be in (0, 1], "
                                 f"got {pj.max_swapping_rate}")
            if pj.start_offset_s < 0:
                raise ValueError(f"job '{pj.graph.name}': start_offset_s must be >= 0")
        if pool_bytes is not None and pool_bytes <= 0:
            raise ValueError(f"planner: pool_bytes must be > 0, got {pool_bytes}")
        self.specs = list(jobs)
        self.pool_bytes = pool_bytes
        self.bandwidth = float(bandwidth_bytes_per_s)
        self.link = {"lanes": link_lanes, "combined_bytes_per_s": combined_bytes_per_s}   # Note [A lane per direction]
        self.horizon_iterations = horizon_iterations
        self.stop_at_budget = stop_at_budget
        self.enable_recompute = enable_recompute
        # Note [Chain limits tried]: one plan per limit, the best kept
        self.chain_limits = (max_chain,) if isinstance(max_chain, int) else tuple(max_chain)
        if not self.chain_limits or min(self.chain_limits) < 1:
            raise ValueError(f"planner: max_chain must be one or more chain lengths >= 1, got {max_chain!r}")
        self.max_chain = self.chain_limits[0]
        self.recompute_rounds = 0
        self.chain_limit_hits = [0]   # Note [Chain limits tried] in planner_passes
        self.pass_costs: dict[int, tuple[int, float, int]] = {}   # chain limit -> _pass_cost of its pass
        self.max_iterations = max_iterations
        self.coincident_peaks = coincident_peaks  # Note [Coincident peaks] in peak_analysis
        self.peaking_jobs = peaking_jobs          # Note [Paired peaks] in peak_analysis
        # Note [Paired peaks]: the peaks that meet while no job runs a plan
        self.unplanned_peaking_jobs = unplanned_peaking_jobs if unplanned_peaking_jobs is not None else peaking_jobs
        self.bottleneck_restarts = bottleneck_restarts   # Note [Bottleneck first]
        self.planned_by_representatives, self.representative_planner = 0, None   # scheduler.identical_jobs
        self.drop_idle_swaps = drop_idle_swaps           # Note [Transfers that lower no peak]
        self.unchain = unchain                           # Note [Unchained runs] in scheduler.unchained_runs
        self.dropped_swaps = 0
        self.recompute_first = False
        self.step_order = step_order                      # Note [Free-order plans] in peak_analysis
        self.bottlenecks: list[dict[int, int]] = []       # job -> step, served first in this order
        self.keep_plans_without_gain = False               # Note [Never above unplanned]
        self.peak_model = ("paired" if peaking_jobs else "coincident") if coincident_peaks else "timeline"
        self.jobs: list[JobState] = []
        self.order: list[SwapDecision] = []
        self.iterations = 0
        self.stop_reason = ""
        self._vanilla_pool_peak = 0
        self._unplanned_pool_peak = 0
        self._sum_job_peaks = 0

    # -- state -----------------------------------------------------------------
    def _init_state(self) -> None:
        # jobs sharing one op list share the structure, as do this planner's passes and later plans
        cache: dict[int, TensorAccessSequence] = self.__dict__.setdefault("_structures", {})
        self.jobs = []
        for j, pj in enumerate(self.specs):
            base = cache.get(id(pj.graph.ops))
            if base is None:     # kept apart: each pass gets a copy (structure shared, never written)
                base = cache[id(pj.graph.ops)] = pj.graph.kept(   # Note [Structures kept with the graph]
                    "sequence", lambda: TensorAccessSequence(pj.graph, pj.latencies))
            tas = base.retimed(pj.latencies)
            tas.job, tas.graph = pj.graph.name, pj.graph
            fp = JobFootprint(tas, self.step_order == "free")
            self.jobs.append(JobState(j, pj.graph, pj.latencies, pj.start_offset_s, pj.max_swapping_rate,
                                      tas, fp, tas, fp.vanilla_peak))
        self.order = []
        self.representative_planner = None      # the state copies no representatives' plans
        self._new_timeline()
        self._set_vanilla_pool_peaks([js.tas for js in self.jobs], [js.fp.free_running for js in self.jobs])
        self._sum_job_peaks = sum(js.vanilla_peak for js in self.jobs)

    def _set_vanilla_pool_peaks(self, tases, free_running) -> None:
        """The unplanned steps' predicted pool peak (MSR's reference), and the
        one that decides whether they fit unplanned (Note [Paired peaks])."""
        offsets = [js.offset_s for js in self.jobs]
        peaks = {}
        for k in {self.peaking_jobs, self.unplanned_peaking_jobs}:
            peaks[k] = PoolTimeline(tases, offsets, self.horizon_iterations, coincident_peaks=self.coincident_peaks,
                                    peaking_jobs=k).pool_peak(free_running)
        self._vanilla_pool_peak = peaks[self.peaking_jobs]
        self._unplanned_pool_peak = peaks[self.unplanned_peaking_jobs]

    def _new_timeline(self, channel: bool = True) -> None:
        """The timeline of the jobs' current sequences, and (``channel``) an empty swap link over it."""
        self.timeline = PoolTimeline([js.tas for js in self.jobs], [js.offset_s for js in self.jobs],
                                     self.horizon_iterations, coincident_peaks=self.coincident_peaks,
                                     peaking_jobs=self.peaking_jobs)
        if not channel:
            return
        self.channel = SwapChannel(self.bandwidth, self.timeline.horizon_s, self.timeline.offsets,
                                   self.timeline.periods, **self.link)

    def _pool_peak(self) -> int:
        return self.timeline.pool_peak([js.fp.F for js in self.jobs])

    # -- Algorithm 3 -------------------------------------------------------------
    def plan(self) -> Plan:
        """A full plan from scratch: one pass per chain limit (Note [Chain
        limits tried] in scheduler.planner_passes), the best kept."""
        t0 = time.perf_counter()
        with collections_paused():
            own_loop, self.planned_by_representatives = type(self)._loop is Planner._loop, 0   # a policy's loop aims at nothing
            # Note [Identical jobs planned by representatives] in scheduler.identical_jobs
            if own_loop and (reps := plan_alike_jobs(self)):
                self.planned_by_representatives = reps
            elif self.pool_bytes is None and own_loop:
                self._plan_minimised()     # Note [Minimise mode] in scheduler.planner_passes
            else:
                self._plan_each_chain_limit()
            return self._make_plan_with_gain(t0)

    def _make_plan_with_gain(self, t0: float) -> Plan:
        """The plan, or none when it peaks no lower than the unplanned steps (Note [Never above unplanned])."""
        plan = self._make_plan(time.perf_counter() - t0)
        has_events = any(jp.swap_outs or jp.swap_ins or jp.recomputes for jp in plan.jobs.values())
        if self.keep_plans_without_gain or not has_events \
                or plan.pool_planned_peak_bytes < plan.pool_vanilla_peak_bytes:
            return plan
        iterations = self.iterations
        self.bottlenecks = []
        self._init_state()
        self.stop_reason, self.iterations = NO_GAIN, iterations
        return self._make_plan(time.perf_counter() - t0)

    def replan(self, latencies: Mapping[str, LatencyModel] | None = None, *,
               pool_bytes: int | None | str = "same") -> Plan:
        """§IV-E: a new plan after latencies changed (or a new budget), warm-started from the previous decisions."""
        if not self.jobs:
            return self.plan()
        with collections_paused():
            return self._replan(latencies, pool_bytes)

    def _replan(self, latencies: Mapping[str, LatencyModel] | None, pool_bytes: int | None | str) -> Plan:
        t0 = time.perf_counter()
        self.planned_by_representatives, self.representative_planner = 0, None   # each job re-planned as itself
        if pool_bytes != "same":
            self.pool_bytes = pool_bytes  # type: ignore[assignment]
        index = {x.name: x.j for x in self.jobs}
        for name, lat in (latencies or {}).items():
            if name not in index:
                raise KeyError(f"replan: no job named {name!r}; jobs are {list(index)}")
            self.specs[index[name]].latencies = lat
        if type(self)._loop is Planner._loop and (reps := plan_alike_jobs(self)):   # scheduler.identical_jobs
            self.planned_by_representatives = reps      # planned afresh, not warm-started
            return self._make_plan_with_gain(t0)
        # each job on its own table (a job planned on the fastest of its graph's tables too)
        retime = {js.j: self.specs[js.j].latencies for js in self.jobs if js.latencies is not self.specs[js.j].latencies}
        for j, lat in retime.items():
            self.jobs[j].latencies = lat
        if retime:
            for js in self.jobs:
                if js.j in retime:
                    js.vanilla_tas = js.vanilla_tas.retimed(js.latencies)
                    js.vanilla_peak = JobFootprint(js.vanilla_tas).vanilla_peak
            self._set_vanilla_pool_peaks([js.vanilla_tas for js in self.jobs],
                                         [JobFootprint(js.vanilla_tas).free_running for js in self.jobs])
        self._rebuild(retime=retime)
        self._loop()
        self._drop_swaps_that_lower_no_peak()
        return self._make_plan_with_gain(t0)

    def _loop(self) -> None:
        budget = self.pool_bytes
        # Note [Minimise mode] in planner_passes: no budget, the loop aims at minimise_target (None: under the
        # peak) until it is met, then one byte under the peak each round, until nothing lowers the peak
        minimise = budget is None
        target = self.minimise_target if minimise else budget
        chase = minimise and target is None
        swap_ok = True
        rec_ok = self.enable_recompute
        failures: set = set()
        history: list[int] = []
        it = 0
        self.stop_reason = self._minimised_reason() if minimise else "no swap or recomputation succeeded"
        if budget is not None and self.stop_at_budget and self._unplanned_pool_peak <= budget:
            # Note [Free-running steps]: nothing to plan; a job whose unplanned step ran out runs in plan order
            ran_out = any(pj.unplanned_step_ran_out for pj in self.specs)
            self.stop_reason = UNPLANNED_FITS_IN_ORDER if ran_out else UNPLANNED_FITS
            swap_ok = rec_ok = False
        while swap_ok or rec_ok:
            pa = gpu_memory_peak_analysis([js.fp for js in self.jobs], self.timeline)
            history.append(pa.peak_bytes)
            if not minimise and self.stop_at_budget and pa.peak_bytes <= budget:
                self.stop_reason = "budget met"
                break
            if minimise and (chase or pa.peak_bytes <= target):
                chase, target = True, pa.peak_bytes - 1
            if not chase and it > 100 and len(history) > 3 and history[-4] - history[-1] < 0.0005 * history[-4]:
                self.stop_reason = "stopping rule: peak fell < 0.05% over 3 iterations after 100"
                break
            if it >= self.max_iterations:
                self.stop_reason = f"max_iterations={self.max_iterations}"
                break
            need = pa.peak_bytes - target if (minimise or self.stop_at_budget) else None
            # Note [Recomputation first]: a pass may recompute before it swaps
            if rec_ok and pa.peak_bytes > target and (self.recompute_first or not swap_ok):
                step = int(chase * self.minimise_recompute_step * pa.peak_bytes)   # Note [Minimise mode]
                lowered = self._recompute_round(pa, max(pa.peak_bytes - target, step))
                rec_ok = lowered is not None
                if chase and lowered:     # a new peak, and new steps: every swap is tried again
                    swap_ok, failures = True, set()
            elif swap_ok:
                decs = swap_scheduling(self.jobs, self.channel, pa, need_bytes=need, failures=failures)
                if decs:
                    self.order.extend(decs)
                    failures = self._share_failures_forgotten(failures) if minimise else failures
                    rec_ok = rec_ok or (self.recompute_first and self.enable_recompute)   # a new peak to try
                else:
                    swap_ok = False
            else:
                break
            it += 1
        self.iterations = it

    # -- output ------------------------------------------------------------------
    def _runs_its_plan(self, js) -> bool:
        """Whether the job's planned footprint ``fp.F`` is what it will hold (else its free-running
        vanilla one). Note [Free-running steps]: a job runs in plan order if its plan has events, if
        its unplanned step ran out of memory (a cold start), or if order alone lowers its peak and the
        unplanned steps do not fit the budget. A free-order plan's ``F`` is free-running already."""
        if self.step_order == "free":
            return True
        if js.decisions or js.recomputes or self.specs[js.j].unplanned_step_ran_out:
            return True
        return self.stop_reason not in FITS_UNPLANNED and js.fp.peak < js.vanilla_peak

    def _make_plan(self, seconds: float) -> Plan:
        ordered = {js.j: self._runs_its_plan(js) for js in self.jobs}
        pool_peak = self.timeline.pool_peak([js.fp.F if ordered[js.j] else js.fp.free_running for js in self.jobs])
        if self.pool_bytes is not None and pool_peak > self.pool_bytes and self.stop_reason not in FITS_UNPLANNED \
                and not all(ordered.values()):
            # Note [Free-running steps]: the loop met the budget with every step in plan order.
            all_ordered = self._pool_peak()
            if all_ordered < pool_peak:
                ordered = dict.fromkeys(ordered, True)
                pool_peak = all_ordered
        jobs = {}
        fingerprints: dict[tuple[int, int], str] = {}    # jobs that share one graph's ops share its fingerprint
        for js in self.jobs:
            tas = js.tas
            same = (id(js.graph.ops), id(js.graph.tensors))
            if same not in fingerprints:
                fingerprints[same] = js.graph.fingerprint()
            n = tas.n
            jp = JobPlan(js.name, vanilla_peak_bytes=js.vanilla_peak,
                         planned_peak_bytes=js.fp.peak if ordered[js.j] else js.vanilla_peak,
                         order_only=ordered[js.j] and not (js.decisions or js.recomputes) and self.step_order == "plan",
                         step_order=self.step_order,
                         iteration_s=js.vanilla_tas.period_s, planned_iteration_s=tas.period_s,
                         start_offset_s=js.offset_s, max_swapping_rate=js.max_swapping_rate,
                         graph_fingerprint=fingerprints[same], graph_ops=len(js.graph.ops))
            jp.last_use = dict(tas.last_use_map())    # read only: the lists are shared with the sequence's cache
            moved = 0
            for dec in js.decisions:
                name = tas.tensor_names[dec.i]
                size = int(tas.size[dec.i])
                cross = dec.p < 0 or dec.q >= n
                rel_name = tas.step_names[dec.release_step % n]
                if dec.out_start is not None:
                    trig, delta, it = tas.trigger_of(dec.out_start)
                    jp.swap_outs.append(SwapEvent(js.name, name, "swap_out", trig, delta,
                                                  dec.out_start - it * tas.period_s, dec.out_dur, size,
                                                  release_after_op=rel_name, cross_iteration=cross,
                                                  iteration_shift=dec.release_step // n - it))
                    moved += size
                trig, delta, it = tas.trigger_of(dec.in_start)
                jp.swap_ins.append(SwapEvent(js.name, name, "swap_in", trig, delta,
                                             dec.in_start - it * tas.period_s, dec.in_dur, size,
                                             serves_op=tas.step_names[dec.q % n], cross_iteration=cross,
                                             iteration_shift=dec.q // n - it))
                jp.releases.append(ReleaseEvent(js.name, name, rel_name, "swap"))
                moved += size
            for ev in js.recomputes:
                jp.recomputes.append(ev)
                jp.releases.append(ReleaseEvent(js.name, ev.target, ev.release_after_op, "recompute"))
            jp.swap_outs.sort(key=lambda e: e.start_s)
            jp.swap_ins.sort(key=lambda e: e.start_s)
            jp.swapped_bytes_per_iteration = moved
            jobs[js.name] = jp
        if self.unchain and self.step_order == "plan":     # Note [Unchained runs]
            if self.representative_planner is not None:   # Note [Identical jobs planned by representatives]
                runs = copied_unchained_runs(self, jobs, ordered, pool_peak)
            else:
                runs = unchained_runs([js.tas for js in self.jobs], [js.fp for js in self.jobs],
                                      [ordered[js.j] for js in self.jobs], self.timeline, pool_peak)
            for js, r in zip(self.jobs, runs or ()):
                jobs[js.name].unchained_runs = r
        vanilla_peak = self._vanilla_pool_peak
        if self.stop_reason in FITS_UNPLANNED:   # Note [Paired peaks]: judged, and predicted, with the unplanned k
            vanilla_peak = pool_peak = self._unplanned_pool_peak
        return Plan(jobs=jobs, pool_vanilla_peak_bytes=vanilla_peak, pool_planned_peak_bytes=pool_peak,
                    pool_bytes=self.pool_bytes, bandwidth_bytes_per_s=self.bandwidth,
                    horizon_s=self.timeline.horizon_s, sum_of_job_peaks_bytes=self._sum_job_peaks,
                    iterations=self.iterations, planning_s=seconds, stop_reason=self.stop_reason,
                    peak_model=self.peak_model, representatives=self.planned_by_representatives,
                    latency_spread=self.latency_spread if self.planned_by_representatives else None)


def plan_graphs(jobs: Sequence[PlannerJob], **kwargs) -> Plan:
    """One-shot: ``Planner(jobs, **kwargs).plan()``."""
    return Planner(jobs, **kwargs).plan()


def pool_footprint_curve(planner: Planner, *, vanilla: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(grid seconds, pool bytes) of the planner's current state, for plots and tests."""
    fs = [js.fp.free_running if vanilla else js.fp.F for js in planner.jobs]
    return planner.timeline.grid.copy(), planner.timeline.pool_footprint(fs)
