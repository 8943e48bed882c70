"""Admission control: which jobs may run together in the pool (seed 002,
Salus §2.2).

A job's memory is persistent P (variables, optimizer slots: held for the
job's whole life) plus temporary T (activations: come and go within a step).
Salus's *safety condition* admits a set of jobs when

    sum(P_j) + max(T_j)  <=  room

because only one job's temporaries need to be resident at a time when steps
are interleaved at iteration granularity. ``sum`` (``sum(P) + sum(T)``) is safe
for free-running jobs whose temporaries may peak together; ``none`` admits up
to the concurrency limit. ``room`` is the pool less the bytes held outside
every job, less POOL_HEADROOM when jobs share it.

``predict`` answers (P, T) for a job before it is probed, from a measured job
of the same signature scaled by batch size; a plan's needs replace the
measured ones once a job is planned.

Note [Needs at least what the steps held]
A running job's needs are predictions: its probe's measurement, or its
plan's predicted peak, made from a capture of a few steps. Its steps can
hold more: on the memory-bound io-mem search of issue 58 with a busy loop
beside it, a trial planned alone with no swaps was predicted at 19.6 MiB and
its steps held 21.9 MiB (the executor's threads held more beside each op
than in its captured steps: Note [Concurrent scratch] in
tensile_tf/tf/step_memory.py); a second trial was admitted beside it on the
prediction, a third built beside both, and the first two ran out of memory
(two runs in seven under load: 4-5 pool OOMs, 2-4 trials re-queued; with
this note, none in ten). So ``predict`` counts a running job's T as at least
what its steps under the plan they run now have held above its P
(``StepsHeld``: the highest step peak since its last plan switch, or of its
unplanned steps); a plan that holds what it predicts changes nothing. Steps
of an earlier plan do not count: a tighter plan's steps are judged on their
own.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tensile_tf.config.schema import Admission
from tensile_tf.runtime.records import JobState
from tensile_tf.runtime.work_outside_steps import admitted_temporary_bytes

# Share of the pool that plans and admission leave free when jobs share it:
# the planner's peak prediction is within ~10-15% of what the pool measures.
# (It was also the fragmentation reserve, when replayed runs needed arenas
# 1.06-1.47x their peak bytes; with Note [Stitched allocations] they need
# 1.01x, benchmarks/RESULTS.md, issue 20, eleventh session.) A job alone may
# use it all.
POOL_HEADROOM = 0.10


def salus_safety_condition(needs: Sequence[tuple[int, int]], room: int) -> bool:
    """Seed 002 §2.2: sum of persistent bytes plus the largest temporary
    bytes fits ``room``. ``needs``: (P, T) per job."""
    if not needs:
        return True
    return sum(p for p, _ in needs) + max(t for _, t in needs) <= room


def sum_condition(needs: Sequence[tuple[int, int]], room: int) -> bool:
    """Every job's P and T at once: safe when temporaries may peak together."""
    return sum(p + t for p, t in needs) <= room


def shared_room(capacity: int, held_outside_jobs: int, jobs: int) -> int:
    """The bytes jobs may use: the pool less what no job holds, less
    POOL_HEADROOM when more than one job shares it."""
    room = capacity - held_outside_jobs
    return int(room * (1 - POOL_HEADROOM)) if jobs > 1 else room


class AdmissionControl:
    """Applies the configured condition to the host's jobs."""

    def __init__(self, capacity: int, policy: Admission, concurrency: int | None):
        self.capacity = capacity
        self.policy = policy
        self.concurrency = concurrency
        self.jobs_at_most: int | None = None   # the run's job source's own limit (JobHost.run), if any
        self.plan_budget: int | None = None    # run.plan_budget, with the planner on: the cap on the jobs' bytes
        # the job source's rule, if it has one: why no plan should fit one more job in beside so many
        # running and so many starting (JobHost.run; Note [Plans only for idle cores] in planning.py)
        self.busy_for_a_plan: Callable[[int, int], str | None] | None = None
        self._measured_by_signature: dict[str, tuple[int, int, int]] = {}
        self.held_by_its_steps = StepsHeld()   # Note [Needs at least what the steps held]
        # Frees what the host keeps only while no job needs it (parked steps: Note [Reusing a
        # finished job's traced step] in traced_step_reuse.py), but what the job asking would take
        # over (Note [Steps kept for the jobs that wait]); returns the bytes freed.
        self.make_room: Callable[[JobState], int] | None = None
        # the pool bytes held outside the jobs that a job would take over as its own (a parked step)
        self.kept_for: Callable[[JobState], int] | None = None

    def has_room(self, running: int) -> bool:
        return self.concurrency is None or running < self.concurrency

    def fits(self, state: JobState, alongside: Sequence[JobState], held_outside_jobs: int) -> bool:
        """Whether ``state`` may run beside ``alongside``."""
        group = [s for s in alongside if s is not state] + [state]
        if self.concurrency is not None and len(group) > self.concurrency:
            return False
        if self.policy == Admission.none:
            return True
        needs = [self.predict(s) or (0, 0) for s in group]
        condition = salus_safety_condition if self.policy == Admission.salus else sum_condition
        # a parked step the job takes over is its own P, counted in its needs already
        held_outside_jobs -= self.kept_for(state) if self.kept_for is not None else 0
        if condition(needs, shared_room(self.capacity, held_outside_jobs, len(group))):
            return True
        freed = self.make_room(state) if self.make_room is not None else 0
        return freed > 0 and condition(needs, shared_room(self.capacity, held_outside_jobs - freed, len(group)))

    def holds_the_limit_unplanned(self, state: JobState, alongside: Sequence[JobState],
                                  held_outside_jobs: int) -> str | None:
        """Note [Captures a plan needs] in planning.py: why ``state`` needs no capture now (the pool,
        and ``plan_budget`` where one is set, holds the jobs beside it, ``state`` and as many more
        like it as the concurrency limit lets in, all as they run now; or no plan is to fit another
        job in beside them: Note [Plans only for idle cores]), or None: it may need a plan."""
        group = [s for s in alongside if s is not state] + [state]
        held = self._holds_the_limit(state, group, held_outside_jobs)
        busy = self.plans_held_for_cores(len(group) - 1, newcomers=1) if held is None else None
        return held if busy is None else f"not captured: no plan is to fit another job in beside it: {busy}"

    def plans_held_for_cores(self, running: int, newcomers: int = 0) -> str | None:
        """Note [Plans only for idle cores] in planning.py: why no plan should fit one more job in
        beside ``running`` jobs and ``newcomers`` starting (the job source's rule), or None."""
        return self.busy_for_a_plan(running, newcomers) if self.busy_for_a_plan is not None else None

    def _holds_the_limit(self, state: JobState, group: list[JobState], held_outside_jobs: int) -> str | None:
        limits = [n for n in (self.concurrency, self.jobs_at_most) if n is not None]
        limit = min(limits) if limits else None
        mine = self.predict(state)
        if limit is None or self.policy == Admission.none or len(group) > limit or mine is None:
            return None
        needs = [self.predict(s) or (0, 0) for s in group[:-1]] + [mine] * (limit - len(group) + 1)
        condition = salus_safety_condition if self.policy == Admission.salus else sum_condition
        held_outside_jobs -= self.kept_for(state) if self.kept_for is not None else 0
        room = shared_room(self.capacity, held_outside_jobs, len(needs))
        if not condition(needs, min(room, self.plan_budget) if self.plan_budget is not None else room):
            return None
        return (f"not captured: the pool holds it unplanned beside the {len(group) - 1} running job(s) "
                f"and {limit - len(group)} more like it, up to the {limit} jobs that may run at once")

    def never_fits(self, state: JobState) -> bool:
        return (state.persistent_bytes or 0) + admitted_temporary_bytes(state, state.temporary_bytes or 0) \
            > self.capacity

    def remember(self, state: JobState) -> None:
        """Keeps a vanilla job's measurement for jobs of the same signature."""
        sig = _signature(state)
        if sig is not None and state.measured and not state.cold_planned:
            self._measured_by_signature[sig] = (state.job.spec.batch_size, state.persistent_bytes,
                                                admitted_temporary_bytes(state, state.temporary_bytes))

    def _held_above(self, state: JobState, persistent_bytes: int | None) -> int:
        """What the job's steps under its current plan held above ``persistent_bytes``."""
        return max(0, self.held_by_its_steps(state) - (persistent_bytes or 0))

    def predict(self, state: JobState) -> tuple[int, int] | None:
        """(P, T): planned, measured, else scaled from a measured job of the
        same signature. Temporary memory scales with the batch; persistent
        memory is taken as the larger of the two (synthetic batches grow with
        it too), so the prediction errs on the safe side. A planned job with a
        plan switch pending counts the larger of its needs and the switch's."""
        # A switch offered and not yet applied (Note [Threads and hand-offs], H3):
        # peek first, then planned_needs, which the job thread writes before it settles.
        switch = state.rt.switch.peek()
        planned = state.planned_needs
        if planned is not None:
            if switch is not None:   # the larger of the two until the job has switched
                planned = tuple(max(a, b) for a, b in zip(planned, switch.needs))
            # Note [Work outside the steps, inside the allowance]: its validation batch's bytes too
            return planned[0], admitted_temporary_bytes(state, max(planned[1], self._held_above(state, planned[0])))
        if state.measured:
            p_bytes = state.persistent_bytes
            return p_bytes, admitted_temporary_bytes(state, max(state.temporary_bytes, self._held_above(state, p_bytes)))
        sig = _signature(state)
        ref = self._measured_by_signature.get(sig) if sig else None
        if ref is None:
            # a Python job's own estimate, e.g. from a Keras model's shapes (keras_fit.estimated_needs)
            estimate = getattr(state.job, "estimate_needs", None)
            return estimate() if estimate is not None else None
        batch, p, t = ref
        scale = state.job.spec.batch_size / batch
        return int(p * max(1.0, scale)), int(t * scale)


class StepsHeld:
    """Note [Needs at least what the steps held]: per job, the highest step peak of its steps under
    the plan its next step runs (None: its unplanned steps), its probe step left out; read on from
    where the last call stopped (the job thread appends its records; the run loop reads them)."""

    def __init__(self):
        self._seen: dict[tuple[str, int], tuple[int, int | None, int]] = {}   # (job, build) -> (read up to, plan, peak)

    def __call__(self, state: JobState) -> int:
        records, key = state.records, (state.name, state.attempts)   # a job built again starts its records over
        upto, plan, peak = self._seen.get(key, (1, None, 0))
        n = len(records)
        for record in records[upto:n]:
            if record.plan != plan:
                plan, peak = record.plan, 0
            peak = max(peak, record.peak_bytes)
        self._seen[key] = (n, plan, peak)
        return peak if plan == state.plan_number else 0


def _signature(state: JobState) -> str | None:
    """What makes two YAML jobs' memory comparable: all but batch size and scalars."""
    spec = state.job.spec
    if spec is None:
        return None
    return spec.model_dump_json(include={"model", "input_shape", "classes", "data", "loss"}) + spec.optimizer.name
