"""What a job's teardown does with the memory it held: the collection that frees it and the
wait for what comes back late (``JobLifecycle.teardown`` in probing.py calls them).

Note [Teardown without a full collection]
A job's Keras model, optimizer and traced functions hold reference cycles,
so its pool bytes return only after a garbage collection. A full
collection walks every object Python tracks; with TensorFlow and Keras
loaded that took 0.25 s per teardown on a 2-core machine, on the run loop's
thread, while no other job could be built or started: 3.0 s of a 12.2 s
search of 12 trials waiting on data (issue 43). ``JobHost.run`` therefore
collects once and freezes what exists when it starts (``gc.freeze``:
modules, TensorFlow's registries, jobs handed over already built), and a
teardown's collection walks only what was made since: 0.02-0.05 s. If the
job's bytes are still held after it (a cycle older than the run, e.g. a
``TrainStep`` built before it and handed over), the teardown unfreezes and
collects everything, so nothing is ever left held that a full collection
would free; the rest of the run then collects in full, as before (freezing
again would freeze the running jobs' cycles, and each of their teardowns
would need the full collection anyway). If even the full collection frees
none of the job's bytes, no old cycle held them (something else does, and
the teardown reports them as leaked): the run freezes again and goes on as
before. (2 of 6 packed searches of 12 trials waiting on data spent 2.9 and
5.2 s tearing down against 0.4 s, as teardowns do once they collect in
full; what held the bytes that sent them there was not caught, issue 43.)
The run unfreezes at its end.

Note [Late frees are not leaks]
A job's last tensors can come back to the pool a little after its teardown
collected: an op still finishing on TensorFlow's threads, a transfer the
swap channel drains, a reference another thread drops. One run recorded
16,360,960 B as a job's ``leaked_bytes`` that a second run saw freed about
1.5 s after the job ended (issue 57). So where bytes are still held after
the collection, the teardown waits up to LATE_FREE_WAIT_S for the stream to
reach zero (polling every few milliseconds), and counts as leaked only what
is held then; ``late_free_s`` in the job's record says how long it waited.

Note [Bytes the caller keeps]
A job handed over built (``Job.from_keras``, ``Job.from_train_step``) trains
a model its caller still holds after the job ends: KerasTuner keeps each
trial's model until it has scored and saved the trial, and whoever called
``from_keras`` keeps the model it trained. What the model keeps stays in the
job's stream: the optimizer's slots and metrics' variables its first step
made, the tensors Keras keeps for its metrics and compiled functions.
Measured: every packed KerasTuner trial waited the whole LATE_FREE_WAIT_S for
them (``late_free_s`` 5.0 in 4 of 4 trials of a worker in
tests/search/test_packed_workers.py, against about 0.1 s of training each),
then collected in full and counted them as leaked; the variables alone
explained 4,100 of its 8,448 bytes. So a teardown takes weak references to the
handed-over step's model and optimizer before it lets go of them
(``CallerObjects``): where one is still alive after the collection, its caller
holds it, and what the stream holds is the caller's (``kept_by_caller_bytes``
in the job's record), neither waited for nor counted as leaked. Where the
caller dropped them, the teardown waits and counts leaks as for any job.
"""
from __future__ import annotations

import contextlib
import gc
import time
import weakref
from typing import Any, Callable


class CallerObjects:
    """Weak references to a handed-over job's model and optimizer (Note [Bytes the caller keeps])."""

    def __init__(self, train: Any):
        self._refs = []
        for obj in (getattr(train, "model", None), getattr(train, "optimizer", None)):
            try:
                self._refs.append(weakref.ref(obj))
            except TypeError:   # None, or not weakly referenceable: not the caller's to keep
                continue

    def hold(self) -> bool:
        """Whether someone other than the job still holds the model or the optimizer."""
        return any(ref() is not None for ref in self._refs)


@contextlib.contextmanager
def objects_before_the_run_frozen():
    """Note [Teardown without a full collection]: for one ``JobHost.run``."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


#: Note [Late frees are not leaks]: how long a teardown waits for a job's last bytes
LATE_FREE_WAIT_S = 5.0
_sleep = time.sleep     # between polls (a test releases its held bytes here)


def wait_for_late_frees(still_held: Callable[[], bool], limit_s: float | None = None) -> float:
    """Note [Late frees are not leaks]: waits while ``still_held()``, at most ``limit_s``
    (LATE_FREE_WAIT_S); returns the seconds waited (0.0 where nothing was held)."""
    limit_s = LATE_FREE_WAIT_S if limit_s is None else limit_s
    if not still_held():
        return 0.0
    t0 = time.monotonic()
    while still_held() and time.monotonic() - t0 < limit_s:
        _sleep(0.005)
    return time.monotonic() - t0


def collect_garbage(still_held: Callable[[], bool]) -> None:
    """A teardown's collection (Note [Teardown without a full collection]):
    what was made since the run began; everything, if ``still_held()``
    says the job's bytes are still held then (a cycle older than the run)."""
    gc.collect()
    if still_held() and gc.get_freeze_count():
        gc.unfreeze()   # for the rest of the run: freezing again would freeze the running jobs' cycles too
        gc.collect()
        if still_held():
            gc.freeze()   # the full collection freed none of it (held elsewhere, not by an old cycle): as before
