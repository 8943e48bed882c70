"""How busy the process keeps the machine's cores, for admission.

Note [Admitting by the cores]
Packing trials pays while they leave the cores idle (waiting on data, on
per-step Python): another trial then trains in the gaps. When the trials
already keep every core busy, another one only shares the same cores and
adds its build, its trace and the threads' contention: 4 compute-bound CNN
trials at once ran 282 trials/hour where one at a time ran 373 (issue 43).
The runtime sees the difference: the process's CPU time (every thread's,
``time.process_time``) over wall time, divided by the cores it may run on.

``CoreMeter.busy_share()`` is that share over a sliding window: from the
newest reading at least ``min_window_s`` old that was taken after the last
admission (``admitted``), to now; None while no such reading exists (the
newest admission is too recent to tell). A search driver with core
admission on (``SearchDriver(admit_by_cores=True)``, the default) starts
another trial beside running ones only when the share is known and below
SATURATED (0.9): with the cores saturated it waits for a trial to end, and
with no trial running it always starts one, so packing never runs fewer
trials at once than one at a time. A departure does not restart the
window: the share then still counts the departed trial's work for up to
``min_window_s``, which errs on the side of waiting. Each wait for busy
cores is counted once, however many times the driver is asked during it
(``SearchResult.core_waits``), and the decision reads the readings only,
never a timer: tests drive it with their own clock.

Note [Starts not held by the window]
Waiting for a fresh window after every start held each start for at
least ``min_window_s`` (two of the run loop's 0.1 s polls) even with the
cores nearly idle: on the search that waits on data, 4 trials took about
0.6 s to start and packing ran 4067 trials/hour against 4478-4550 without
core admission (issue 43). So at each start the meter keeps the share per
trial that the window before it measured (``CoreMeter.admitted(running)``:
that share over the trials then running), and while the new window is too
young the share is predicted: that per-trial share times the trials
running now (``predicted_share``). A prediction below SATURATED starts
the next trial at once; one at or above it waits, as a measured share
does. The first start beside one trial still waits for a window: nothing
is known of a trial's share before one was measured.

Note [Admitting by marginal throughput]
The busy share cannot tell trials that saturate the cores with work from
trials that keep them busy waiting: TensorFlow's pool threads spin
between small ops, so 2 MLP trials of the search that is bound by per-op
overhead keep 0.91 of 2 cores busy, as 1-2 compute-bound CNN trials do
(0.94-0.98). Yet a third and fourth MLP trial add throughput (4 at once:
1751 trials/hour against 1519-1633 held at 2-3), and a third CNN trial
only contention (4 at once: 1081 against 1117 one at a time), issue 43.
What tells them apart is how much a start slows the trials already
running: when k trials train and one more starts, each of them takes
rho times as long a step; k + 1 trials then do (k + 1) / (k rho) of the
work k did (the newcomer taken to run like the others). Saturated cores
give rho >= (k + 1) / k, no gain; cores kept busy by waits give less.
``MarginalGain`` measures rho at every start beside running trials: for
each trial that trained throughout, its median step time over its last
``WINDOW_STEPS`` steps before the newcomer was handed to the host against
the ``WINDOW_STEPS`` after its first ``SETTLE_STEPS`` once the newcomer
trains (the newcomer's build, trace and probe left out; steps across
another start or end left out; at least ``MIN_STEPS`` on each side). With
the busy share at or above SATURATED, a start to k + 1 trials is refused
once the median rho of at least REFUSE_AFTER earlier starts to k + 1, or
to fewer trials, gives a gain below GAIN_MARGIN (gains only shrink as
trials are added; one start's rho moved by up to 1.5x on the MLP search,
so one measurement refuses nothing), allowed at once when as many gained,
and otherwise allowed one start at a time: no other start at a saturated
share is made until that one's rho is measured (or cannot be: another
trial started or ended too soon). The decision reads the
runtime's step records, never a timer: tests give it their own.
"""
from __future__ import annotations

import bisect
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

SATURATED = 0.9      # share of the cores above which no other trial is started beside running ones
MIN_WINDOW_S = 0.15  # the shortest window a share is read over (the run loop asks every 0.1 s)
GAIN_MARGIN = 0.03   # a start beside saturated cores must add this share of throughput (Note [Admitting by marginal throughput])
WINDOW_STEPS = 8     # steps each side of a start whose median step time is compared
MIN_STEPS = 2        # fewer steps on either side: that trial tells nothing of the start
SETTLE_STEPS = 2     # steps after the newcomer began training left out (its first steps' transients)
REFUSE_AFTER = 2     # starts to a level measured before a gain below the margin refuses it


def thread_cpu_clock() -> Callable[[], float]:
    """The CPU time of the calling thread, readable from any thread (0 where the platform has no
    per-thread clock)."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return lambda: 0.0
    return lambda: time.clock_gettime(clock)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CoreMeter:
    """Note [Admitting by the cores]. ``cpu`` and ``wall`` are the clocks
    (seconds); each ``busy_share()`` call takes a reading, so it must be
    called now and then (the search driver's ``job_source``, which the run
    loop asks every 0.1 s while jobs run)."""

    def __init__(self, cores: int | None = None, *, min_window_s: float = MIN_WINDOW_S,
                 cpu: Callable[[], float] = time.process_time, wall: Callable[[], float] = time.perf_counter,
                 loop_cpu: Callable[[], float] = lambda: 0.0):
        self.cores = cores or usable_cores()
        self.min_window_s = min_window_s
        # loop_cpu: the CPU time of the thread that sets jobs up, left out of the training share
        # (Note [Plans only for idle cores] in planning.py; ``thread_cpu_clock``)
        self._cpu, self._wall, self._loop_cpu = cpu, wall, loop_cpu
        self._readings: deque[tuple[float, float, float]] = deque()   # (wall, cpu, loop cpu), oldest first
        self._since = -float("inf")   # wall time of the last admission
        self._per_job: float | None = None   # Note [Starts not held by the window]

    def _read(self) -> tuple[float, float, float]:
        now = (self._wall(), self._cpu(), self._loop_cpu())
        self._readings.append(now)
        return now

    def admitted(self, running: int = 0) -> None:
        """A job started beside ``running`` others: shares are read over
        windows that begin after it; the window before it, if long enough,
        gives the share per running job (Note [Starts not held by the window])."""
        share = self.busy_share() if running > 0 else None
        if share is not None:
            self._per_job = share / running
        self._since = self._read()[0]
        while len(self._readings) > 1:
            self._readings.popleft()

    def busy_share(self, training_only: bool = False) -> float | None:
        """The process's CPU time over wall time and cores, over the window
        (None: no window of ``min_window_s`` since the last admission yet);
        ``training_only``: less the CPU time of the thread that sets jobs up."""
        wall, cpu, loop = self._read()
        while len(self._readings) > 1 and wall - self._readings[1][0] >= self.min_window_s:
            self._readings.popleft()   # a newer reading is old enough: the window slides
        start = self._readings[0]
        if wall - start[0] < self.min_window_s or start[0] < self._since:
            return None
        used = cpu - start[1] - (loop - start[2] if training_only else 0.0)
        return used / (wall - start[0]) / self.cores

    def predicted_share(self, running: int) -> float | None:
        """The share ``running`` jobs would keep busy at the last measured
        share per job; None before one was measured."""
        return None if self._per_job is None else self._per_job * running

    def saturated(self) -> bool | None:
        """True: the cores are busy (share >= SATURATED); None: not known yet."""
        share = self.busy_share()
        return None if share is None else share >= SATURATED


@dataclass
class TrialSteps:
    """What ``MarginalGain`` reads of a trial (run-clock seconds): when it was
    handed to the host, when it began training, when it ended, and its
    steps as ``(start_s, duration_s)`` records in start order (StepRecord)."""

    name: str
    issued_at: float
    admitted_at: float | None
    ended_at: float | None
    steps: Sequence   # objects with start_s and duration_s, oldest first


def _window(steps: Sequence, start: float, end: float) -> list[float]:
    """Durations of the steps that began at or after ``start`` and ended by ``end``."""
    first = bisect.bisect_left(steps, start, key=lambda r: r.start_s)
    out = []
    for r in steps[first:]:
        if r.start_s + r.duration_s > end:
            break
        out.append(r.duration_s)
    return out


class MarginalGain:
    """Note [Admitting by marginal throughput]: the slowdown each start beside
    running trials caused them, by the number of trials it made."""

    def __init__(self, margin: float = GAIN_MARGIN):
        self.margin = margin
        self.slowdowns: dict[int, list[float]] = {}   # trials training after a start -> median rho, per start
        self._settled: set[str] = set()   # newcomers measured, or that cannot be
        self.pending = False              # a start's slowdown is still being measured

    def update(self, trials: Sequence[TrialSteps]) -> None:
        events = sorted(t for tr in trials for t in (tr.issued_at, tr.admitted_at, tr.ended_at) if t is not None)
        self.pending = False
        for new in trials:
            if new.name in self._settled:
                continue
            if new.admitted_at is None:   # handed to the host, not training yet: its start is still to measure
                self.pending = self.pending or new.ended_at is None
                continue
            others = [t for t in trials if t is not new and t.admitted_at is not None and t.admitted_at < new.issued_at
                      and (t.ended_at is None or t.ended_at > new.admitted_at)]
            last = max((e for e in events if e < new.issued_at), default=-float("inf"))
            after = [e for e in events if e > new.admitted_at]
            closes = min(after, default=float("inf"))
            rhos, waiting = [], False
            for other in others:
                before = _window(other.steps, max(last, other.admitted_at), new.issued_at)[-WINDOW_STEPS:]
                since = _window(other.steps, new.admitted_at, closes)[SETTLE_STEPS:SETTLE_STEPS + WINDOW_STEPS]
                if len(since) < WINDOW_STEPS and not after:
                    waiting = True   # still training into its window
                elif len(before) >= MIN_STEPS and len(since) >= MIN_STEPS:
                    rhos.append(statistics.median(since) / statistics.median(before))
            if waiting:
                self.pending = True
                continue
            self._settled.add(new.name)
            if rhos:
                self.slowdowns.setdefault(len(others) + 1, []).append(statistics.median(rhos))

    def gain(self, trials: int) -> float | None:
        """Measured throughput of ``trials`` at once over one fewer (None: never measured)."""
        rhos = self.slowdowns.get(trials)
        return trials / ((trials - 1) * statistics.median(rhos)) if rhos else None

    def _refused(self, trials: int) -> bool:
        gain = self.gain(trials)
        return gain is not None and gain < 1 + self.margin and len(self.slowdowns[trials]) >= REFUSE_AFTER

    def gained(self, trials: int) -> bool:
        """Starts to ``trials`` at once gained the margin, measured REFUSE_AFTER times or more."""
        rhos = self.slowdowns.get(trials, [])
        return len(rhos) >= REFUSE_AFTER and self.gain(trials) >= 1 + self.margin

    def allows(self, running: int) -> bool:
        """May a start make ``running + 1`` trials beside saturated cores? Not
        if starts to this many or fewer gained less than the margin, measured
        REFUSE_AFTER times or more (gains only shrink as trials are added);
        yes if they gained as often; else one start at a time, each measured."""
        if any(self._refused(k) for k in range(2, running + 2)):
            return False
        return not self.pending or self.gained(running + 1)


class CoreAdmission:
    """The search driver's rule (Note [Admitting by the cores]): whether
    another trial may start now, and how often one was put off."""

    def __init__(self, meter: CoreMeter | None = None, log: Callable[[str], None] | None = None):
        self.meter = meter or CoreMeter()
        self.gain = MarginalGain()
        self.log = log
        self.waits = 0           # times a start was put off because the cores were busy
        self.predicted_starts = 0   # starts allowed on a predicted share (Note [Starts not held by the window])
        self.gain_starts = 0     # starts beside busy cores on their measured gain (Note [Admitting by marginal throughput])
        self._waiting = False

    def allows(self, running: int, trials: Sequence[TrialSteps] = ()) -> bool:
        """``running``: how many trials of the driver run; ``trials``: theirs and
        those that ended lately, for the gain. False: put the next one off."""
        if not running:
            self._waiting = False
            return True
        share, predicted = self._share(running, trials)
        busy = share is None or share >= SATURATED   # None: nothing measured yet
        if busy and share is not None and self.gain.allows(running):
            busy = False   # Note [Admitting by marginal throughput]: starts to running + 1 gained, or are explored
            self.gain_starts += 1
        if busy and share is not None and not self._waiting:
            self.waits += 1
            if self.log is not None:
                how = ("predicted from the share per trial measured last" if predicted
                       else f"used over the last {self.meter.min_window_s:.2f} s or more")
                gain = self.gain.gain(running + 1)
                why = ("" if gain is None else
                       f"; starts to {running + 1} trials gained {gain - 1:+.0%} throughput")
                self.log(f"the next trial waits: the cores are busy ({share * self.meter.cores:.1f} of "
                         f"{self.meter.cores} {how}{why})")
        self._waiting = busy and share is not None
        self.predicted_starts += int(predicted and not busy)
        return not busy

    def _share(self, running: int, trials: Sequence[TrialSteps], training_only: bool = False) -> tuple[float | None, bool]:
        """The share of the cores ``running`` trials keep busy, and whether it is predicted (the
        newest trial joined too recently to tell: Note [Starts not held by the window]); the
        gains measured on ``trials`` brought up to date."""
        self.gain.update(trials)
        share = self.meter.busy_share(training_only)
        if share is None:
            return self.meter.predicted_share(running), True
        return share, False

    def busy_for_a_plan(self, running: int, newcomers: int = 0, trials: Sequence[TrialSteps] = ()) -> str | None:
        """Note [Plans only for idle cores] in tensile_tf/runtime/planning.py: why no plan should fit
        one more trial beside the ``running`` ones and ``newcomers`` starting beside them (the cores
        busy, as measured over the running trials and predicted for the newcomers at as much a trial,
        or not measured yet; and no start to that many trials plus one measured to add throughput),
        or None: one more adds throughput."""
        if not running:
            return "nothing is measured yet of how busy trials keep the cores" if newcomers else None
        share, _ = self._share(running, trials, training_only=True)   # the run loop's setting up left out
        if share is None:
            return "nothing is measured yet of how busy the running trials keep the cores"
        share, at_once = share * (running + newcomers) / running, running + newcomers + 1
        if share < SATURATED or self.gain.gained(at_once):
            return None
        return (f"the running trials keep the cores busy (at least {SATURATED:.0%} of their time"
                f"{' with the newcomer' if newcomers else ''}) and no start to {at_once} trials was measured "
                "to add throughput")

    def started(self, running: int = 0) -> None:
        """A trial started beside ``running`` others: the next decision reads a window after it."""
        self.meter.admitted(running)


__all__ = ["GAIN_MARGIN", "MIN_WINDOW_S", "SATURATED", "CoreAdmission", "CoreMeter", "MarginalGain", "TrialSteps",
           "thread_cpu_clock", "usable_cores"]
