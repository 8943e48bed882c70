"""The search reporter thread (thread T4 of Note [Threads and hand-offs] in
tensile_tf/runtime/threads.py): the one thread that writes a driver's
intermediate values and heartbeats to the study, so that job threads never
wait on the study's storage."""
from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensile_tf.search.driver import SearchDriver
    from tensile_tf.search.trials import TrialRun


class Reporter(threading.Thread):
    """Writes intermediate values (and asks the pruner) and heartbeats.

    Hand-offs (H10): a trial's ``on_step`` (its job thread) ``put``s values
    on the queue, counted in ``pending_reports`` under the driver's lock; the
    reporter writes them, raises the trial's ``prune`` event when the pruner
    says so, and counts them off. Per-trial writes hold the driver's lock, so
    nothing is written to a trial after it has been told, and ``flush`` (the
    run loop, before it tells) waits until the trial's values are written.
    """

    def __init__(self, driver: "SearchDriver", heartbeat_s: float):
        super().__init__(name="tensile-search-reporter", daemon=True)
        self.driver = driver
        self.heartbeat_s = heartbeat_s
        self.items: queue.Queue = queue.Queue()
        self.idle = threading.Condition(driver._lock)  # noqa: SLF001
        self._halt = threading.Event()
        self._last_beat = time.monotonic()

    def put(self, run: "TrialRun", step: int, value: float) -> None:
        with self.idle:
            run.pending_reports += 1
        self.items.put((run, step, value))

    def flush(self, run: "TrialRun") -> None:
        """Waits until every value queued for run has been written."""
        with self.idle:
            self.idle.wait_for(lambda: run.pending_reports == 0 or not self.is_alive(), timeout=60)

    def stop(self) -> None:
        self._halt.set()
        self.items.put(None)
        self.join(timeout=30)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                item = self.items.get(timeout=min(1.0, self.heartbeat_s))
            except queue.Empty:
                item = None
            if item is not None:
                self._report(*item)
            if time.monotonic() - self._last_beat >= self.heartbeat_s:
                self._last_beat = time.monotonic()
                self.driver._heartbeat()  # noqa: SLF001

    def _report(self, run: "TrialRun", step: int, value: float) -> None:
        try:
            with self.idle:
                if run.told is None:
                    run.trial.report(value, step)
                    if run.trial.should_prune():
                        run.prune.set()
        except Exception as e:  # noqa: BLE001 - a storage hiccup must not kill the reporter
            self.driver._log(f"trial {run.number}: could not report step {step}: {e}")  # noqa: SLF001
        finally:
            with self.idle:
                run.pending_reports -= 1
                self.idle.notify_all()
