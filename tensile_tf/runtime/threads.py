"""Every thread the runtime starts, what each owns, and every hand-off
between them; the hand-off primitives (``Handoff``, ``StopRequest``,
``StepGate``, ``RunLoopInbox``) live here.

Note [Threads and hand-offs]
============================
Jobs train at once in ONE process: TensorFlow releases the GIL while a step
runs, so a thread per job is what makes them concurrent. Everything else the
runtime does happens on the main thread. A field of a JobState has one owner
at a time; ownership moves only at the hand-offs listed below.

Threads
-------
T1 main thread: the run loop (``JobHost.run``, run_loop.py) and its
   collaborators (arrivals.py, probing.py, planning.py, ``Replanner`` in
   replanning.py, outcome.py). It builds, traces, probes, plans, re-plans,
   admits and tears down every job (TensorFlow tracing is serial, here), calls
   the progress sink and each job's ``on_end``, and, under a search, the
   driver's ``job_source`` and its tells. It owns the host's own fields
   (``_threads``, ``_most_running``, the waiting line in arrivals.py) and
   every field of a job that is not running: pending, queued, or ended and
   joined. Python runs signal handlers on this thread, between bytecodes; the
   handler only calls ``StopRequest.request`` (interrupts.py).
T2 job threads, ``job-NAME`` (``JobThread``, job_thread.py), one per admitted
   job, from ``JobHost._start`` until the run loop has joined it after its end
   came through the inbox. While it runs it owns its job's training fields:
   ``steps_done``, ``records``, ``progress``, ``peak_bytes``, its runtime's
   ``rt.first_batch`` / ``rt.batch_specs`` / ``rt.sample_inputs``,
   ``rt.step_fn``, ``rt.planned_step``, ``rt.training_capture`` (H14) and the whole ``rt.latency_monitor``
   (its ``drift_checks``), ``plan``, ``planned_needs``, ``validation``,
   ``checkpoints``, ``model_path``, ``weights_digest``, the final ``status``
   / ``error`` and ``ended_at_s`` (Note [Record apart from runtime] in
   job_runtime.py: the record's fields and the TensorFlow side apart). It runs the job's
   ``on_step``, the pipeline's ``after_step`` / ``on_end`` hooks and the
   profiled steps of Note [Latency drift].
T3 the memory sampler, ``tensile-memory-sampler`` (``MemorySampler``,
   outcome.py), for the length of one ``run()``: owns its list of samples.
T4 the search reporter, ``tensile-search-reporter`` (search/reporter.py),
   while a ``SearchDriver`` runs: writes intermediate values and heartbeats
   to the study.
T5 instantiation workers, ``tensile-instantiate_N`` (at most four, a
   ``ThreadPoolExecutor`` in tensile_tf/tf/rewrite/planned_step.py): each
   instantiates a re-plan's new step without running it, inside the job's
   stream scope, and writes only that PlannedStep's ``instantiate_s`` /
   ``instantiate_error`` (Note [Instantiated off the job's thread]; read
   after its Future is done, H3). A plan-table step (``run.plan_steps:
   table``) is one function for all its plans: a lock lets one worker
   instantiate it and the others wait (``PlanTableStep.instantiate``); the
   table itself is written by the job's own thread before each call of a
   plan's step (``TableCall``), and its next step reads it (Note [Plans
   read at run time] in tf_plugin/swap/plan_table.h, policy 1).
T5b the background worker, ``tensile-background`` (one thread, a
   ``ThreadPoolExecutor`` in tensile_tf/tf/rewrite/planned_step.py), with
   ``run.plan_steps: table_then_rewrite`` (the default) only: after a
   step's own instantiation it builds the job's plan-table step, or
   rewrites a plan the job runs on its table and instantiates the result,
   in the job's stream scope (Note [Table first, rewritten when ready] in
   tensile_tf/tf/rewrite/table_then_rewrite.py). It writes only its
   ``TableThenRewritten``'s ``rewritten`` and ``rewrite_error`` (under that
   object's lock, which the job's thread takes before it reads them at a
   step boundary), and the process's table of plan-table steps and of why
   one was not built (under its lock in plan_table.py). No job waits for
   it; it instantiates in a job's stream only under
   ``JobRuntime.background_scope``, whose lock the job's teardown takes
   (``end_background_work``), so nothing lands in a released stream; the
   scope reads the job's time left from its ``progress`` snapshot (H11)
   and starts no work for a job about to end (Note [Background work for a
   job about to end] in runtime/replan_timing.py).
T6 KerasTuner slots, ``kt-slot-N`` (``PackedTuner.search``,
   tensile_tf/search/packed_tuner.py), one per concurrent trial while a
   packed KerasTuner search runs: each asks the oracle for a trial, builds
   its model and hands its fit to the run loop (H12), then waits for the
   fit's end.
Not started by the runtime, but sharing its data: TensorFlow's inter-op and
intra-op threads run each step's ops (a job's allocations are attributed to
its stream by the step's graph and, for eager work, by a thread-local stream
that ``JobStream.eager_scope`` sets on the calling thread only); the swap
channel's C++ copy threads, one per lane (two with ``run.link_lanes: 2``, each with its
own queue under the channel's one mutex; Note [A lane per direction] in
tensile_tf/scheduler/swap_scheduling.py, tf_plugin/swap/swap_channel.h); the node-group
CounterBarriers that pace job threads' ops against each other in C++
(tf_plugin/nodegroup/counter_barrier.h); the allocator's wait for frees
(Note [Waiting for frees], its own mutex); tf.data's own threads of a job's
pipeline (a Keras job's prefetch, Note [The prefetch tf.data would add] in
tensile_tf/jobs/datasets.py), whose batches are on the pool's default stream; the stderr pump of
tf_plugin/_loader.py, only while TensorFlow imports; and, where TensorFlow is loaded, the exact
planner's child interpreter (a process, not a thread, kept for later solves: Note [CP-SAT
beside TensorFlow] in tensile_tf/scheduler/exact_planner.py, Note [One solver child per process]
in tensile_tf/scheduler/solver_child.py).

Hand-offs (and why each is safe)
--------------------------------
H1 Start, T1 -> T2. Everything the run loop wrote into a JobState (build,
   probe, plan, ``latency_monitor``, ``status = running``, ``admitted_at_s``)
   is written before ``Thread.start``, which happens-before the thread runs.
H2 End, T2 -> T1. A job thread's last act is ``RunLoopInbox.job_ended``
   (a ``queue.Queue``), after its final writes; the run loop takes it off the
   inbox and joins the thread before it reads the record or tears it down.
   After the join the JobState is the run loop's again. The run loop's notion
   of "running" is its own thread table, never the status a job thread
   writes: a job that has just written ``finished`` still holds its pool
   bytes until the run loop tears it down, so admission must count it.
H3 Plan switch, T1 -> T2: ``JobState.rt.switch``, a ``Handoff`` (Note [Hot
   swap] in replanning.py). ``Replanner.replan`` ``offer``s a StepSwitch; the
   job thread ``take``s it at its next step boundary (``take_switch``)
   once its new step is instantiated (a worker thread does that, Note
   [Instantiated off the job's thread]; ``ready`` reads the worker's
   Future, which orders its writes before the take), applies it and
   ``settle``s. The lock makes take and offer atomic: a switch
   is applied at most once, and an offer that replaces one not yet taken gets
   the replaced one back (it is never applied: its ``switched_at_step`` stays
   None). ``pending`` is true from the offer until the taker has settled, so
   the run loop starts a newcomer planned on arrival only once every running
   job *runs* the joint plan (Note [Joint re-plan on arrival]), and admission
   holds a job at the larger of its needs and the switch's (``predict`` in
   admission.py reads ``peek()`` first, then ``planned_needs``: if nothing is
   pending, the taker wrote ``planned_needs`` before it settled).
   The latency monitor's new baseline travels in the switch too, so the
   monitor is touched by its job thread alone.
H4 Re-plan request, T2 -> T1: ``RunLoopInbox.ask_replan`` (the same queue
   as H2): a job's latency monitor asks; the run loop decides (Note [Latency
   drift]).
H5 Stop, any thread or the signal handler -> all: ``StopRequest``. Only the
   first request's reason is kept (a non-blocking claim, so it is safe in a
   signal handler), and the event is set after the reason is written. Job
   threads read it at step boundaries, in ``StepGate`` and while waiting for
   their ``start_offset_s``.
H6 Parking, T1 -> T2: ``StepGate`` (a Condition). The run loop closes it and
   waits until every named job thread is parked at a step boundary or gone;
   they wait while it is closed (Note [Joint re-plan on arrival]).
H7 Node-group schedule, T1 <-> T2: ``NodeGroupCoordinator`` (nodegroup.py)
   guards its tables with its own lock; job threads call ``step_ended`` and
   ``job_ended`` (their ``on_end``), the run loop ``job(s)_started`` and
   ``job_ended`` at teardown; a trace-time ``graph_transform`` may run on any
   thread. The C++ pipeline it installs schedules into is thread-safe.
H8 The profiler, T1 <-> T2: ``_PROFILER`` in tensile_tf/tf/capture.py, one
   profiler per process. The run loop's capture waits for it; a job thread's
   profiled step only tries it and runs unprofiled when it is taken. The
   profile records every job's ops while it runs; each job's table keeps only
   the events of its own steps (Note [Profiles of one job's steps] in
   tensile_tf/tf/profile_events.py).
H9 Memory samples, T3 -> T1: the sampler starts after the run's clock was
   restarted (the clock is never restarted while it runs), reads the pool's
   counters (C++, locked) and appends to its own list; the run loop reads the
   list after ``stop()`` has joined it.
H10 Search, T2 -> T4 -> T2 and T1: a trial's ``on_step`` (T2) queues values
   for the reporter and counts them under the driver's lock; the reporter
   (T4) raises the trial's ``prune`` event, which the next ``on_step``
   answers; the run loop (T1) tells the study under the same lock, after
   ``flush`` waited for the trial's queued values.
H11 Snapshots read without a lock: the run loop reads a running job's
   ``progress`` (progress lines, whether a re-plan would come too late: a
   frozen ``JobProgress`` the job thread replaces whole after each step,
   Note [Record apart from runtime] in job_runtime.py), the slice of its
   ``records`` up to a step already run (a re-plan's "before" step times:
   an append-only list of frozen ``StepRecord``s), its ``plan`` (which jobs a re-plan may change,
   and what they ran before it: a reference the job thread replaces only in
   ``take_switch``), its ``status`` (progress lines only, see H2), and a
   search driver reads ``admitted_at_s`` / ``ended_at_s`` of other jobs (its
   packing check, after the job in question ended). A job thread's latency
   monitor replaces ``captured.planner_job.latencies`` whole; a re-plan on
   the run loop reads whichever table is current. Each such read sees one
   whole value and tolerates it being a step old. This rests on CPython's GIL
   (Python 3.11 here: one attribute or list operation is atomic and seen in
   program order); a free-threaded build would need these to become
   hand-offs too.
H12 Packed fits, T6 <-> T1: ``_PackedFits`` (packed_tuner.py), one
   Condition guarding every field: the queue of fits, the counts, the ended
   fits, and the first error a slot raised (``failed``; several slots may
   fail at once). A slot queues a fit and waits for its end; the run loop's
   ``job_source`` takes fits off the queue and the job's ``on_end`` posts
   its end. The search re-raises the error after joining every slot.
H13 A search's trials, T1 -> T4: the driver's ``runs`` list grows on the run
   loop (``job_source``) under the driver's lock, and ``in_flight`` copies
   the trials not told yet under the same lock, so the reporter's heartbeat
   never walks the list while it grows.
H14 A capture from training steps, T2 -> T1: ``RunLoopInbox.capture_ready``
   (Note [Captures from training steps] in training_capture.py). The job
   thread alone owns ``rt.training_capture`` and the capture it builds; it
   puts the finished ``CaptureReady`` in the inbox, drops its reference and
   never touches the capture again; the run loop sets ``rt.captured`` from
   it (before a departure the same burst holds, which the thread posted after).
   Its traced steps take the pool's trace under ``POOL_TRACE``
   (tensile_tf/tf/step_memory.py), as the run loop's captures do, and only
   try it: a step that finds it taken runs untraced.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import TYPE_CHECKING, Callable, Generic, Sequence, TypeVar, Union

if TYPE_CHECKING:
    from tensile_tf.runtime.records import JobState
    from tensile_tf.runtime.replanning import ReplanRequest
    from tensile_tf.runtime.training_capture import CaptureReady

T = TypeVar("T")


class Handoff(Generic[T]):
    """A one-slot mailbox from one thread (``offer``) to another (``take``,
    then ``settle`` once what it took is applied). Note [Threads and
    hand-offs], H3.

    A newer offer replaces one not yet taken and returns it. Counters say
    what happened: ``offered``, ``taken``, ``replaced``, ``dropped``
    (offered = taken + replaced + dropped + whatever is still waiting).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: T | None = None     # offered, not taken yet
        self._in_hand: T | None = None     # taken, not settled yet
        self.offered = 0
        self.taken = 0
        self.replaced = 0
        self.dropped = 0

    def offer(self, item: T) -> T | None:
        """Puts ``item`` in the slot; returns the item it replaced (never to
        be taken), or None."""
        if item is None:
            raise ValueError("Handoff.offer: None is what 'nothing waits' reads as")
        with self._lock:
            replaced, self._waiting = self._waiting, item
            self.offered += 1
            if replaced is not None:
                self.replaced += 1
            return replaced

    def take(self, ready: Callable[[T], bool] | None = None) -> T | None:
        """The item waiting (now in hand until ``settle``), or None; an item
        for which ``ready`` says False stays waiting and None is returned."""
        with self._lock:
            item = self._waiting
            if item is None or (ready is not None and not ready(item)):
                return None
            self._waiting, self._in_hand = None, item
            self.taken += 1
            return item

    def settle(self) -> None:
        """The taker has applied (or given up on) what it took."""
        with self._lock:
            self._in_hand = None

    def clear(self) -> T | None:
        """Drops the item waiting, if any, and returns it (the owner of both
        ends, once the taker thread is gone: teardown)."""
        with self._lock:
            item, self._waiting, self._in_hand = self._waiting, None, None
            if item is not None:
                self.dropped += 1
            return item

    def peek(self) -> T | None:
        """What the taker will run once settled: the item waiting, else the
        one in hand, else None."""
        with self._lock:
            return self._waiting if self._waiting is not None else self._in_hand

    @property
    def pending(self) -> bool:
        """Offered and not yet settled (waiting, or being applied)."""
        return self.peek() is not None


class StopRequest:
    """The run's stop flag and its reason (Note [Threads and hand-offs], H5).
    ``request`` is safe from a signal handler: it never blocks. Quacks like
    the ``threading.Event`` job threads and ``StepGate`` wait on."""

    def __init__(self) -> None:
        self._claim = threading.Lock()   # acquired once, never released: the first request wins
        self._event = threading.Event()
        self._reason: str | None = None

    def request(self, reason: str) -> None:
        if self._claim.acquire(blocking=False):
            self._reason = reason
            self._event.set()   # after the reason: whoever sees the event sees the reason

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    @property
    def reason(self) -> str | None:
        """The first request's reason (None: no stop was requested)."""
        return self._reason if self._event.is_set() else None


class StepGate:
    """Parks job threads at their next step boundary (Note [Joint re-plan on
    arrival] in replanning.py; Note [Threads and hand-offs], H6)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._closed = False
        self._parked: set[str] = set()
        self._gone: set[str] = set()   # one gate per run: job names are unique in it

    def at_boundary(self, name: str, stop) -> None:
        """A job thread, before a step: waits while the gate is closed."""
        with self._cv:
            if not self._closed:
                return
            self._parked.add(name)
            self._cv.notify_all()
            while self._closed and not stop.is_set():
                self._cv.wait(0.1)
            self._parked.discard(name)

    @property
    def is_closed(self) -> bool:
        with self._cv:
            return self._closed

    def leave(self, name: str) -> None:
        """A job thread that steps no more (its job ended)."""
        with self._cv:
            self._gone.add(name)
            self._cv.notify_all()

    @contextlib.contextmanager
    def closed(self, names: Sequence[str], stop):
        """Parks the named jobs' threads; yields once every one is parked or gone."""
        with self._cv:
            self._closed = True
            while not stop.is_set() and not all(n in self._parked or n in self._gone for n in names):
                self._cv.wait(0.1)
        try:
            yield
        finally:
            with self._cv:
                self._closed = False
                self._cv.notify_all()


class RunLoopInbox:
    """What job threads tell the run loop (Note [Threads and hand-offs], H2,
    H4 and H14): a job ended, its latency monitor asks for a re-plan, or its
    capture from training steps is ready."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Union["JobState", "ReplanRequest", "CaptureReady"]] = queue.Queue()

    def job_ended(self, state: "JobState") -> None:
        """A job thread's last act: nothing it writes after this."""
        self._queue.put(state)

    def ask_replan(self, request: "ReplanRequest") -> None:
        self._queue.put(request)

    def capture_ready(self, ready: "CaptureReady") -> None:
        """H14: a capture from training steps, the job thread's no more."""
        self._queue.put(ready)

    def drain(self) -> list[Union["JobState", "ReplanRequest", "CaptureReady"]]:
        """Every message waiting now, without waiting for more (Note [One re-plan per burst] in
        runtime/replan_timing.py)."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def next(self, timeout: float) -> Union["JobState", "ReplanRequest", None]:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


__all__ = ["Handoff", "RunLoopInbox", "StepGate", "StopRequest"]
