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
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable

SATURATED = 0.9      # share of the cores above which no other trial is started beside running ones
MIN_WINDOW_S = 0.15  # the shortest window a share is read over (the run loop asks every 0.1 s)


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
                 cpu: Callable[[], float] = time.process_time, wall: Callable[[], float] = time.perf_counter):
        self.cores = cores or usable_cores()
        self.min_window_s = min_window_s
        self._cpu, self._wall = cpu, wall
        self._readings: deque[tuple[float, float]] = deque()   # (wall, cpu), oldest first
        self._since = -float("inf")   # wall time of the last admission
        self._per_job: float | None = None   # Note [Starts not held by the window]

    def _read(self) -> tuple[float, float]:
        now = (self._wall(), self._cpu())
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

    def busy_share(self) -> float | None:
        """The process's CPU time over wall time and cores, over the window
        (None: no window of ``min_window_s`` since the last admission yet)."""
        wall, cpu = self._read()
        while len(self._readings) > 1 and wall - self._readings[1][0] >= self.min_window_s:
            self._readings.popleft()   # a newer reading is old enough: the window slides
        start = self._readings[0]
        if wall - start[0] < self.min_window_s or start[0] < self._since:
            return None
        return (cpu - start[1]) / (wall - start[0]) / self.cores

    def predicted_share(self, running: int) -> float | None:
        """The share ``running`` jobs would keep busy at the last measured
        share per job; None before one was measured."""
        return None if self._per_job is None else self._per_job * running

    def saturated(self) -> bool | None:
        """True: the cores are busy (share >= SATURATED); None: not known yet."""
        share = self.busy_share()
        return None if share is None else share >= SATURATED


class CoreAdmission:
    """The search driver's rule (Note [Admitting by the cores]): whether
    another trial may start now, and how often one was put off."""

    def __init__(self, meter: CoreMeter | None = None, log: Callable[[str], None] | None = None):
        self.meter = meter or CoreMeter()
        self.log = log
        self.waits = 0           # times a start was put off because the cores were busy
        self.predicted_starts = 0   # starts allowed on a predicted share (Note [Starts not held by the window])
        self._waiting = False

    def allows(self, running: int) -> bool:
        """``running``: how many trials of the driver run. False: put the next one off."""
        if not running:
            self._waiting = False
            return True
        share = self.meter.busy_share()
        predicted = share is None   # the newest trial joined too recently to tell: Note [Starts not held by the window]
        if predicted:
            share = self.meter.predicted_share(running)
        busy = share is None or share >= SATURATED   # None: nothing measured yet
        if busy and share is not None and not self._waiting:
            self.waits += 1
            if self.log is not None:
                how = ("predicted from the share per trial measured last" if predicted
                       else f"used over the last {self.meter.min_window_s:.2f} s or more")
                self.log(f"the next trial waits: the cores are busy ({share * self.meter.cores:.1f} of "
                         f"{self.meter.cores} {how})")
        self._waiting = busy and share is not None
        self.predicted_starts += int(predicted and not busy)
        return not busy

    def started(self, running: int = 0) -> None:
        """A trial started beside ``running`` others: the next decision reads a window after it."""
        self.meter.admitted(running)


__all__ = ["MIN_WINDOW_S", "SATURATED", "CoreAdmission", "CoreMeter", "usable_cores"]
