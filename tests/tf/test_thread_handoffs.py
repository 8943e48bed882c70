"""Note [Threads and hand-offs] (tensile_tf/runtime/threads.py): the hand-offs
between the run loop and the job threads, driven from two real threads and
ordered by events and barriers only (no sleeps, no timing).

* ``Handoff`` itself: offers and takes racing from two threads lose and
  duplicate nothing, and the same race is caught when the lock is removed.
* A plan switch through a real ``JobThread`` and the real ``take_switch``:
  offered by this (the main) thread while the job trains, it takes effect at
  the next step boundary, exactly once; an offer replaced before it was
  taken is never applied; training is bit for bit what it is without one.
* While the job thread applies a switch, the run loop still sees it pending
  (a newcomer planned on arrival waits for it) and admission counts the
  larger of the two plans' needs.
"""
import contextlib
import sys
import threading

import pytest

from tensile_tf.config.schema import Admission
from tensile_tf.jobs.job import Job
from tensile_tf.runtime.admission import AdmissionControl
from tensile_tf.runtime.job_thread import JobThread, RunClock
from tensile_tf.runtime.outcome import held_outside_jobs
from tensile_tf.runtime.probing import JobLifecycle
from tensile_tf.runtime.records import JobReplan, JobState, JobStatus, PlanRecord
from tensile_tf.runtime.replanning import StepSwitch
from tensile_tf.runtime.threads import Handoff, RunLoopInbox, StepGate, StopRequest
from tests import job_factories

BOUND_S = 120   # only how long a broken hand-off may hang the test; nothing waits for it to pass


# ------------------------------------------------------------- Handoff


class _CallingSlot(Handoff):
    """A Handoff whose slot is read and written through a call, where
    CPython may switch threads (as it may at any line added to offer or
    take): the race the lock must close is then open to the scheduler."""

    @property
    def _waiting(self):
        return self.__dict__["_slot"]

    @_waiting.setter
    def _waiting(self, item):
        self.__dict__["_slot"] = item


class _CallingSlotWithoutLock(_CallingSlot):
    def __init__(self):
        super().__init__()
        self._lock = contextlib.nullcontext()


@contextlib.contextmanager
def _switch_threads_often():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _race(box: Handoff, rounds: int = 100, per_round: int = 100) -> dict:
    """The offering thread offers 0, 1, 2, ... and keeps what each offer
    replaced; the taking thread takes (and settles) as often; a barrier
    starts each round on both at once. Every item must end up exactly once
    in `replaced` or `taken`."""
    barrier = threading.Barrier(2)
    replaced, taken = [], []

    def offering():
        item = 0
        for _ in range(rounds):
            barrier.wait()
            for _ in range(per_round):
                old = box.offer(item)
                item += 1
                if old is not None:
                    replaced.append(old)

    def taking():
        for _ in range(rounds):
            barrier.wait()
            for _ in range(per_round):
                item = box.take()
                if item is not None:
                    taken.append(item)
                    box.settle()

    threads = [threading.Thread(target=offering), threading.Thread(target=taking)]
    with _switch_threads_often():
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND_S)
    last = box.take()
    if last is not None:
        taken.append(last)
        box.settle()
    seen = replaced + taken
    return {"offered": rounds * per_round, "seen": seen, "duplicated": len(seen) - len(set(seen)),
            "lost": rounds * per_round - len(set(seen)), "taken": taken, "replaced": replaced}


@pytest.mark.parametrize("box_type", [Handoff, _CallingSlot])
def test_offers_and_takes_racing_from_two_threads_lose_and_duplicate_nothing(box_type):
    box = box_type()
    out = _race(box)
    assert out["duplicated"] == 0 and out["lost"] == 0, {k: out[k] for k in ("duplicated", "lost")}
    assert sorted(out["seen"]) == list(range(out["offered"]))
    assert out["taken"] == sorted(out["taken"])           # taken in the order offered
    assert (box.offered, box.taken, box.replaced) == (out["offered"], len(out["taken"]), len(out["replaced"]))
    assert not box.pending


def test_the_race_catches_a_handoff_without_its_lock():
    # The test above has teeth: the same race, the lock removed, loses or
    # duplicates items (caught on the first try in 30 of 30 runs here; up to
    # 20 tries are allowed).
    for _ in range(20):
        out = _race(_CallingSlotWithoutLock())
        if out["duplicated"] or out["lost"]:
            return
    pytest.fail("20 races of a Handoff without its lock lost and duplicated nothing")


def test_an_item_taken_stays_pending_until_the_taker_settles():
    box = Handoff()
    assert box.offer("a") is None and box.pending and box.peek() == "a"
    assert box.offer("b") == "a"                 # replaced, never to be taken
    assert box.take() == "b" and box.take() is None
    assert box.pending and box.peek() == "b"     # being applied
    box.offer("c")
    assert box.peek() == "c"                     # what runs once the taker is done
    box.settle()
    assert box.pending and box.take() == "c"
    box.settle()
    assert not box.pending and box.peek() is None
    assert (box.offered, box.taken, box.replaced) == (3, 2, 1)
    with pytest.raises(ValueError):
        box.offer(None)


def test_the_first_stop_request_wins_and_its_reason_is_seen_with_the_flag():
    stop, barrier = StopRequest(), threading.Barrier(2)
    assert stop.reason is None and not stop.is_set()

    def request(reason):
        barrier.wait()
        stop.request(reason)

    threads = [threading.Thread(target=request, args=(r,)) for r in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    assert stop.is_set() and stop.reason in ("first", "second")
    kept = stop.reason
    stop.request("third")
    assert stop.reason == kept


# ------------------------------------------- a plan switch, real job thread


class _RecordingStep:
    """Stands in for a rewrite.PlannedStep: runs the job's own step (a plan
    never changes what a step computes) and counts what the job thread asks
    of it. ``evict`` may be held (``hold``) to stop the thread mid-switch."""

    def __init__(self, fn, hold: threading.Event | None = None, applying: threading.Event | None = None,
                 instantiated: threading.Event | None = None):
        self.fn = fn
        self.calls = self.evicts = self.restores = self.waits = 0
        self.hold, self.applying = hold, applying
        self.instantiated = instantiated   # None: ready from the start (Note [Instantiated off the job's thread])
        self.instantiate_s = self.instantiate_error = None

    @property
    def ready(self) -> bool:
        return self.instantiated is None or self.instantiated.is_set()

    def wait_ready(self):
        self.waits += 1
        if self.instantiated is not None:
            assert self.instantiated.wait(BOUND_S)
        self.instantiate_s = 0.5

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)

    def evict(self):
        self.evicts += 1
        if self.applying is not None:
            self.applying.set()
            assert self.hold.wait(BOUND_S)

    def restore(self):
        self.restores += 1


def _switch(step, name: str, needs: tuple[int, int], when_ready: bool = True) -> StepSwitch:
    record = PlanRecord(budget_bytes=1, budget_met=True, predicted_vanilla_peak_bytes=2,
                        predicted_planned_peak_bytes=1, predicted_msr=0.0, swap_outs=1, swap_ins=1,
                        recomputes=0, planning_s=0.0, cold_start=False, source="re-planned")
    return StepSwitch(step, record, needs, JobReplan(name, 2, 1, 0, 1, 0, 0, None), when_ready=when_ready)


def _start(name: str, steps: int, on_step=None):
    """A built job (the real build: its own stream, traced step) trained in a
    real JobThread. Returns (state, thread, inbox, lifecycle)."""
    state = JobState(job=Job.from_train_step(name, job_factories.dense_regression(seed=3), steps=steps))
    state.job.on_step = on_step
    clock = RunClock()
    lifecycle = JobLifecycle([state], clock, AdmissionControl(1 << 40, Admission.none, None), held_outside_jobs,
                             pipeline=None, planning=None)
    assert lifecycle.build(state), state.error
    state.status = JobStatus.running
    inbox = RunLoopInbox()
    thread = JobThread(state, clock, inbox, record_weights=False, stop=StopRequest(), gate=StepGate())
    return state, thread, inbox, lifecycle


def _finish(state, thread, inbox):
    """What the run loop does when a job ends (H2), but the teardown."""
    assert inbox.next(BOUND_S) is state     # the thread's last act
    thread.join()
    assert state.status == JobStatus.finished, state.error
    return [r.loss for r in state.records]


def test_a_switch_offered_while_the_job_trains_is_taken_once_at_the_next_step_boundary():
    steps, at = 8, 3
    reached, offered = threading.Event(), threading.Event()

    def on_step(state):   # the job thread, after each step
        if state.steps_done == at:
            reached.set()
            assert offered.wait(BOUND_S)   # held here until the main thread has offered
        return True

    state, thread, inbox, lifecycle = _start("handoff-switch", steps, on_step)
    own_step = state.rt.step_fn
    replaced_step, new_step = _RecordingStep(own_step), _RecordingStep(own_step)
    first, second = _switch(replaced_step, state.name, (1, 1)), _switch(new_step, state.name, (2, 2))
    thread.start()
    assert reached.wait(BOUND_S)
    # The main thread, as Replanner.replan does: two re-plans before the job's next boundary.
    assert state.rt.switch.offer(first) is None
    assert state.rt.switch.offer(second) is first   # replaced before it was taken
    assert state.rt.pending_switch is second
    offered.set()
    losses = _finish(state, thread, inbox)

    assert second.replan.switched_at_step == at          # the first step on the new plan
    assert first.replan.switched_at_step is None         # never switched
    assert replaced_step.calls == replaced_step.evicts == 0
    assert new_step.calls == steps - at and new_step.evicts == 1
    assert new_step.restores == 1   # not at the switch (nothing was planned before it); at the job's end
    assert state.plan is second.record and state.planned_needs == (2, 2)
    assert (state.rt.switch.offered, state.rt.switch.taken, state.rt.switch.replaced) == (2, 1, 1)
    assert not state.rt.switch.pending
    lifecycle.teardown(state)

    # Bit for bit what the same job trains without a switch.
    plain, thread, inbox, lifecycle = _start("handoff-plain", steps)
    thread.start()
    assert _finish(plain, thread, inbox) == losses
    lifecycle.teardown(plain)


def test_a_switch_being_applied_is_still_pending_and_admission_counts_both_plans():
    steps, at = 6, 2
    reached, offered = threading.Event(), threading.Event()
    applying, hold = threading.Event(), threading.Event()
    after_switch, checked = threading.Event(), threading.Event()

    def on_step(state):
        if state.steps_done == at:
            reached.set()
            assert offered.wait(BOUND_S)
        if state.steps_done == at + 1:   # the first step on the new plan ran
            after_switch.set()
            assert checked.wait(BOUND_S)
        return True

    state, thread, inbox, lifecycle = _start("handoff-applying", steps, on_step)
    state.planned_needs = (10, 20)   # the plan it runs, as admission sees it
    admission = AdmissionControl(1 << 40, Admission.salus, None)
    admission.held_by_its_steps = lambda s: 0   # the needs here are made up (Note [Needs at least what the steps held])
    switch = _switch(_RecordingStep(state.rt.step_fn, hold=hold, applying=applying), state.name, (5, 30))
    thread.start()
    assert reached.wait(BOUND_S)
    state.rt.switch.offer(switch)
    assert admission.predict(state) == (10, 30)   # the larger of the two until it has switched
    offered.set()
    assert applying.wait(BOUND_S)                 # the job thread took it and is applying it
    try:
        assert state.rt.switch.take() is None        # taken: nobody else gets it
        assert state.rt.switch.pending and state.rt.pending_switch is switch   # a newcomer still waits
        assert admission.predict(state) == (10, 30)
    finally:
        hold.set()
    assert after_switch.wait(BOUND_S)
    try:
        assert not state.rt.switch.pending
        assert state.planned_needs == (5, 30) and admission.predict(state) == (5, 30)
        assert switch.replan.switched_at_step == at
    finally:
        checked.set()
    _finish(state, thread, inbox)
    lifecycle.teardown(state)


@pytest.mark.parametrize("when_ready", [True, False], ids=["replan_switch-ready", "replan_switch-next_step"])
def test_a_switch_whose_step_is_being_instantiated_waits_as_run_replan_switch_says(when_ready):
    # Note [Instantiated off the job's thread]: 'ready' trains on the old step until the new one is
    # instantiated and switches at the boundary after; 'next_step' switches at once, waiting there.
    steps, at, instantiated_after = 7, 2, 4
    reached, offered, instantiated = threading.Event(), threading.Event(), threading.Event()

    def on_step(state):
        if state.steps_done == at:
            reached.set()
            assert offered.wait(BOUND_S)
            if not when_ready:
                threading.Timer(0.0, instantiated.set).start()   # finishes while the job thread waits
        if state.steps_done == instantiated_after:
            instantiated.set()   # the worker is done: the job thread sees it at its next boundary
        return True

    state, thread, inbox, lifecycle = _start(f"handoff-instantiating-{when_ready}", steps, on_step)
    new_step = _RecordingStep(state.rt.step_fn, instantiated=instantiated)
    switch = _switch(new_step, state.name, (1, 1), when_ready=when_ready)
    thread.start()
    assert reached.wait(BOUND_S)
    state.rt.switch.offer(switch)
    offered.set()
    _finish(state, thread, inbox)
    switched = instantiated_after if when_ready else at
    assert switch.replan.switched_at_step == switched
    assert new_step.calls == steps - switched and new_step.evicts == 1 and new_step.waits == 1
    assert switch.replan.instantiate_s == 0.5   # the worker's figure, recorded at the switch
    assert state.rt.switch.taken == 1 and not state.rt.switch.pending
    lifecycle.teardown(state)
