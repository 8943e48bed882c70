"""The planner's rebuilds: after new latencies or new recomputations, the
sequences, footprints, timeline and link are made again and every swap
decision replayed (seed 000 §IV-E's warm start), or only the changed jobs'.

``PlannerRebuilds`` is a mixin of ``scheduler.planner.Planner`` (its state:
``jobs``, ``order``, ``timeline``, ``channel``, ``horizon_iterations``).

Note [Rebuilds of the jobs that changed]. A recomputation round inserts
re-run steps into one job's sequence, which moves that job's later ops, and
the planner used to rebuild every job and replay every swap decision of
every job on a fresh link, twice when the round was undone. With many jobs
that was all of the planning time: 16 ResNet50 jobs (64x64, batch 16) at
60% of their unplanned peak spent 99.7% of it in recomputation rounds, 66%
replaying swaps, 30% making sequences again (py-spy, saved capture
``bench_resnet50_b16``). The other jobs' sequences, footprints and
transfers do not depend on the changed job's steps: they share only the
link. So a round now makes new sequences for the jobs it changed, copies
the link without those jobs' transfers (``SwapChannel.without``) and
replays only their decisions, in their order; the others keep their
transfers where they are. The horizon (two iterations of the longest job)
may grow with the changed job's step: each kept transfer then gets the
repeats the new horizon adds, and where one of those would overlap another
transfer every job is replayed as before. An undone round restores the
state it kept by reference (``PlannerPasses._planning_state``). Replaying
the changed jobs after the others' transfers is not the full replay's order,
so a plan may differ; on the 96 saved zoo cases of
``benchmarks/exact_gap_bench.py`` every peak is the same, and 4 ResNet50
jobs minimised plan the same 853.6 MiB in 18.4 s instead of 61.3.

Note [Sequences built once per recomputation set]. Each recomputation
round builds the changed job's sequence again (0.1-0.2 s for ResNet50's
9,891 ops), and most builds repeat one made before: an undone round is
tried again from another restart or chain limit, and identical jobs (a
search's trials, the benchmark's copies) pick the same rebuilds in turn. A
sequence depends only on the graph, the latencies and the recomputations,
so the planner keeps the last ``recompute_structures_kept`` builds by
(graph, recomputations), checked against the latencies they were built
with, and each job gets a copy that shares the structure
(``TensorAccessSequence.retimed``) with its own name. 8 ResNet50 jobs at
60%: 73.5 s became 49.7 s, the same plan.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.latency import LatencyModel
from tensile_tf.scheduler.peak_analysis import JobFootprint, PoolTimeline
from tensile_tf.scheduler.state import JobState, SwapDecision
from tensile_tf.scheduler.swap_scheduling import scheduling_swap


class PlannerRebuilds:
    """Rebuilds of a ``Planner``'s state (module docstring)."""

    recompute_structures_kept = 64     # Note [Sequences built once per recomputation set] (0: none kept)
    recompute_structures_reused = 0    # ... how many builds a kept one saved

    def _rebuild(self, retime: Mapping[int, LatencyModel] | None = None, restructure: Sequence[int] = ()) -> None:
        """Rebuilds sequences (new latencies or new recompute steps), footprints,
        timeline and channel, then replays every swap decision in its original order
        (only the restructured jobs' where the others keep their link time: Note [Rebuilds of the jobs that changed])."""
        tases: dict[int, TensorAccessSequence] = {}
        if restructure and not retime and self._rebuild_changed_jobs(restructure, tases):
            return
        for js in self.jobs:
            if js.j in restructure:
                js.tas = tases.get(js.j) or self._sequence_with_recomputes(js)
            elif retime and js.j in retime:
                js.tas = js.tas.retimed(js.latencies)
            self._restart_job(js)
        self._new_timeline()
        self._replay_swaps(set(range(len(self.jobs))))

    def _sequence_with_recomputes(self, js: JobState) -> TensorAccessSequence:
        """Note [Sequences built once per recomputation set]: the job's sequence with its recomputations,
        its structure shared with every earlier build for the same graph, latencies and recomputations."""
        cache: OrderedDict = self.__dict__.setdefault("_recompute_structures", OrderedDict())
        key = (id(js.graph.ops), id(js.graph.tensors), tuple((ev.target, ev.release_after_op, ev.before_op, tuple(ev.ops))
                                       for ev in js.recomputes))
        kept = cache.get(key)
        if kept is not None and kept[0] is js.latencies and kept[1] is js.graph.ops and kept[3] is js.graph.tensors:
            cache.move_to_end(key)
            self.recompute_structures_reused += 1
        else:
            built = TensorAccessSequence(js.graph, js.latencies, js.recomputes, like=js.vanilla_tas)
            kept = (js.latencies, js.graph.ops, built, js.graph.tensors)
            if self.recompute_structures_kept > 0:
                cache[key] = kept
                if len(cache) > self.recompute_structures_kept:
                    cache.popitem(last=False)
        tas = kept[2].retimed(js.latencies)     # a copy: its own name and graph, the structure shared
        tas.job, tas.graph = js.graph.name, js.graph
        return tas

    def _restart_job(self, js: JobState) -> None:
        """The job's footprint from its sequence and recomputations, no swap booked yet."""
        fp = JobFootprint(js.tas, self.step_order == "free")
        for ev in js.recomputes:
            i = js.tas.tindex[ev.target]
            r = js.tas.recompute_target_step[ev.target + "@" + ev.before_op]
            fp.add_absence(i, js.tas.step_index[ev.release_after_op] + 1, r)
        js.fp = fp
        js.decisions, js.swapped_out, js.host_copies = [], set(), {}

    def _replay_swaps(self, jobs: set[int]) -> None:
        """The swap decisions of ``jobs`` scheduled again in their original order (the others' kept)."""
        old, self.order = self.order, []
        for dec in old:
            new = dec if dec.j not in jobs else self._replay_swap(self.jobs[dec.j], dec)
            if new is not None:
                self.order.append(new)

    def _rebuild_changed_jobs(self, restructure: Sequence[int], tases: dict) -> bool:
        """Note [Rebuilds of the jobs that changed]: new sequences for the jobs whose recomputations
        changed (into ``tases``), their swaps replayed on a copy of the channel that keeps every other
        job's transfers; False (nothing else changed) where the others' transfers do not fit the new
        horizon's repeats."""
        changed = set(restructure)
        for j in changed:
            tases[j] = self._sequence_with_recomputes(self.jobs[j])
        periods = [tases[js.j].period_s if js.j in changed else js.tas.period_s for js in self.jobs]
        horizon = PoolTimeline.horizon([js.offset_s for js in self.jobs], periods, self.horizon_iterations)
        dropped = {t for d in self.order if d.j in changed for t in (d.out_tag, d.in_tag) if t >= 0}
        channel = self.channel.without(dropped, periods, horizon)
        if channel is None:
            return False
        self.channel = channel
        for j in changed:
            self.jobs[j].tas = tases[j]
            self._restart_job(self.jobs[j])
        self._new_timeline(channel=False)
        self._replay_swaps(changed)
        return True

    def _replay_swap(self, js: JobState, dec: SwapDecision) -> SwapDecision | None:
        """One earlier swap decision, scheduled again on the rebuilt sequences."""
        try:
            m = js.tas.unrolled_index(dec.names[2])
        except KeyError:
            return None
        # the gap is looked up again: a recompute step may now read the tensor inside the old one
        return scheduling_swap(self.jobs, self.channel, js, dec.i, m % js.tas.n)
