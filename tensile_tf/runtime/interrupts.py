"""Ctrl-C and SIGTERM during a run: stop at a step boundary, keep the results.

Note [Stopping on a signal]
A user who presses Ctrl-C (or a scheduler that sends SIGTERM) wants the run
to end soon and everything it did so far written out. Raising
KeyboardInterrupt wherever the main thread happens to be would abandon the
job threads mid-step, leave their pool memory and barriers behind, and write
nothing. So the first signal only *asks* the run to stop
(``JobHost.request_stop``): job threads end ``interrupted`` at their next
step boundary, the run loop tears them down as it tears down any job, and
the command writes results.json, trace.json and memory.png with status
``interrupted`` and exits 130. A second Ctrl-C is the escape hatch: it raises
KeyboardInterrupt at once (nothing more is written). Python runs signal
handlers in the main thread between bytecodes, so the handler only sets a
flag (an Event) and prints one line.
"""
from __future__ import annotations

import signal
import sys
from typing import Callable

EXIT_INTERRUPTED = 130   # what shells report for a process ended by SIGINT (128 + 2)


class StopOnSignals:
    """Context manager: while active, SIGINT and SIGTERM call
    ``request_stop(reason)`` once; a second SIGINT raises KeyboardInterrupt.
    ``received`` is the first signal's name (None: none came)."""

    def __init__(self, request_stop: Callable[[str], None], *, say: Callable[[str], None] | None = None):
        self.request_stop = request_stop
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = name
            self.request_stop(f"stopped by {name}")   # first: the line below may fail
            try:
                self.say(f"{name}: stopping every job at its next step boundary and writing the results "
                         "(Ctrl-C again to abort without them)")
            except RuntimeError:  # the signal came in the middle of a write to the same stream
                pass

    def __enter__(self) -> "StopOnSignals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
