"""KerasTuner trials packed into the pool: several trials of one oracle train at once as jobs.

    from tensile_tf.search.packed_tuner import PackedRandomSearch
    tuner = PackedRandomSearch(build_model, objective="val_loss", max_trials=12, seed=1,
                               directory="runs/kt", project_name="digits",
                               concurrent_trials=4, pool="512MiB")
    tuner.search(x, y, epochs=10, batch_size=64, validation_split=0.2)
    tuner.get_best_models()[0]; tuner.results_summary()

Note [Packed KerasTuner trials]
KerasTuner's own ``search`` runs one trial at a time: create a trial from the oracle, build
the model, ``model.fit``, report, end the trial. A packed tuner runs ``concurrent_trials``
such loops at once, one thread each with its own tuner id (the oracle hands each id its own
trial, as it does to distributed workers), while the calling thread runs one JobHost whose
jobs are the trials' fits. Everything else is KerasTuner's own code: the trial's callbacks
(deep-copied per execution, TensorBoard folders per trial, its best-epoch checkpoint that
``get_best_models`` loads), the metrics it reports, retries and the project directory, so
``results_summary``, ``get_best_hyperparameters`` and resuming with ``overwrite=False`` (the
oracle sends trials that were running when the search stopped back for retry) work as users
expect. The one change: the model a trial builds gets a ``fit`` that trains it as a job in the
pool (``Job.from_keras``, Note [fit's loop in a job]) and returns fit's History once the job
has ended. Jobs are admitted by their measured memory (``admission``, default ``salus``) and
planned like every job (``planner``).

A trial whose job runs out of pool memory beside others is run again alone: its thread waits
until no other trial's job runs and holds new ones back until it has ended (counted in
``packing["retried_alone"]``; a trial that fails alone too is KerasTuner's failed trial).
Builds run one at a time, and without KerasTuner's ``keras.backend.clear_session()`` between
trials (it would reset Keras' global state under trials still training), so a hypermodel that
seeds itself builds the same model as in a sequential search.

Note [A trial of its own]
``create_trial`` returns the oracle's own Trial object, and KerasTuner's trial loop marks it
``COMPLETED`` (``BaseTuner._try_run_and_update_trial``) before ``end_trial`` scores it, outside
the oracle's lock. One at a time that is harmless; with another slot inside ``create_trial``
meanwhile, the oracle's display sorted the completed trials by score and met that one's
``None`` (``TypeError: '<' not supported between instances of 'float' and 'NoneType'``, seen
once in the suite). So each slot runs a copy (``Trial.from_state``, the round trip a
distributed worker's trial makes), and ``end_trial`` copies status and message back into the
oracle's trial under its lock and scores it there, as it does for a distributed worker.
The copy is made with the trial's own id: ``Trial(...)`` without one draws an id from Python's
global ``random``, which a hypermodel that seeds itself (``keras.utils.set_random_seed``) reads
next for its initializers' seeds; ``Trial.from_state``, made while another slot built, gave a
packed trial other initial weights than the sequential search's (val_loss 1.27 against 1.46,
twice in five runs).

Note [Packed workers of KerasTuner's chief]
KerasTuner's distributed mode (``KERASTUNER_TUNER_ID``, ``KERASTUNER_ORACLE_IP``,
``KERASTUNER_ORACLE_PORT``): the process whose tuner id holds "chief" serves the oracle
(KerasTuner's own ``search``, which trains nothing), and every other process's tuner talks to it
through KerasTuner's ``OracleClient``. A packed tuner is such a worker as it is: each slot asks the
chief's oracle for a trial under its own tuner id (``tuner0-packed1``), so one worker runs
``concurrent_trials`` trials of the chief's search at once, in its own pool. A worker killed
mid-trial leaves its trials running in the chief's oracle under their slots' ids; a worker
started again with the same ``KERASTUNER_TUNER_ID`` is handed the same trials (``create_trial``
returns a tuner id's ongoing trial) and trains them from the start, so none is lost
(tests/search/test_packed_workers.py).

Note [A slot the oracle keeps waiting]
An oracle answers ``IDLE`` when it cannot hand out a trial until running ones end (Hyperband
between rounds, or with its last bracket's trials running). KerasTuner's own loop asks again at
once; one at a time it never meets the case, but a packed slot did, and its busy loop on the
oracle's lock took the interpreter from the trials still training: a Hyperband search (23
trials, 2 at once) ran its last 9-epoch trial in 18 s against 3 s alone (median step 19 ms
against 3 ms), the search 46.6 s against 28.7 s with one slot. So a slot told ``IDLE`` waits
until a trial of this tuner ends (``on_trial_end``), at most ``IDLE_WAIT_S`` (the trials it
waits on may be another worker's, Note [Packed workers of KerasTuner's chief]), then asks again.

Note [Promotions wait for their round]
KerasTuner's Hyperband promotes a trial to the next round once more of the round before have
completed than the next round throws out, the best of those completed so far; and starts a new
bracket when no bracket has a trial to hand out. One at a time every trial asked for before has
ended when the next is asked for; packed, a slot asks while others train, and the best of fewer
trials may be another trial, a bracket may start early (seen: 22 of 23 trials equal to the
sequential search's, the 23rd a continuation the sequential search did not run; then, with
promotions waiting, 23 of 23 trained alike but one promotion recorded the next bracket's number,
which KerasTuner takes from the bracket started last). So a packed Hyperband's oracle answers
``IDLE`` (Note [A slot the oracle keeps waiting]) instead of a promotion while a trial of the
round it promotes from still runs, and instead of a new bracket while any trial runs. Each answer
is then the one the sequential search gets: the same trials, ids and hyperparameters; round 0's
trials and a round's promotions still run side by side.

Note [A trial's model given back]
On a memory-bound search (benchmarks/keras_tuner_bench.py --model io-mem: a 30 MiB pool, 2.8 MiB
of weights a trial) two packed workers of KerasTuner's chief ran out of memory in 7 of 16 trials
and the chief stopped the search at its limit of 3 failures in a row: the pool held 4 to 7 ended
trials' weights at once (streams ``released-N``). Two things kept them. The host's record of
each ended job kept the Job, whose hooks and closures reach its model, for the whole run, which
for a packed search is the whole search: an ended job's record now keeps ``Job.as_ended()``,
which reaches no model (measured after: 0 of 7 models alive after a 6-trial search, 7 of 7
before). And KerasTuner holds a trial's model until it has scored and saved the trial, so the
teardown leaves the model's bytes in the pool as the caller's (Note [Bytes the caller keeps] in
tensile_tf/runtime/teardown_memory.py); a Keras model is a web of reference cycles, freed only
by Python's cyclic collector once KerasTuner lets go of it, whenever that runs. So when a trial
has ended (``on_trial_end``), a slot whose trial's job left at least
``KEPT_BYTES_WORTH_A_COLLECTION`` of the pool to the caller collects (``gc.collect``, about 0.1 to
0.3 s of the interpreter) and the bytes go back to the pool then. A smaller model is left to
Python's own collections: on the digits search (a 256 MiB pool, under 1 MiB a trial) a collection
each trial would cost more than the bytes are worth.

KerasTuner private names used (keras-tuner 1.4): ``Tuner._build_hypermodel`` (build under
the tuner's distribution scope), ``BaseTuner._try_run_and_update_trial`` (run, report and
mark the trial), ``Oracle.create_trial(tuner_id)`` semantics per tuner id, ``keras_tuner.src.distribute.utils``
(which process is the chief), ``HyperbandOracle.populate_space``, its ``_brackets`` (rounds of
``{"past_id", "id"}``) and ``_increment_bracket_num`` (Note [Promotions wait for their round]).
"""
from __future__ import annotations

import gc
import threading
from typing import Any, Callable

import keras_tuner
from keras_tuner.src.engine import trial as trial_module

from tensile_tf.jobs.job import Job

IDLE_WAIT_S = 0.5   # Note [A slot the oracle keeps waiting]: the longest a slot waits before asking again
KEPT_BYTES_WORTH_A_COLLECTION = 0.01   # Note [A trial's model given back]: a share of the pool


class _PackedFits:
    """The hand-off between trial threads (submit a fit, wait for its end) and the host's
    run loop (``job_source``, ``on_end``)."""

    def __init__(self, slots: int):
        self.cond = threading.Condition()
        self.queue: list[Job] = []
        self.in_flight = 0
        self.slots_running = slots
        self.alone = 0              # trials waiting to run alone, or running alone
        self.held = 0               # trials waiting while one runs alone
        self.ended: dict[str, Any] = {}
        self.error: BaseException | None = None   # the first exception a slot raised (search() re-raises it)

    # trial threads
    def fit(self, job: Job, *, alone: bool) -> Any:
        job.on_end = self.on_end
        with self.cond:
            if alone:
                self.alone += 1
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.in_flight == 0 and not self.queue)
            else:   # while a trial runs alone, others wait
                self.held += 1
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.alone == 0)
                self.held -= 1
            self.queue.append(job)
            self.cond.notify_all()
            self.cond.wait_for(lambda: job.name in self.ended)
            if alone:
                self.alone -= 1
                self.cond.notify_all()
            return self.ended.pop(job.name)

    def waiting(self, what: Callable[["_PackedFits"], bool], timeout_s: float = 60) -> bool:
        """Waits until ``what(self)`` holds (the counts above), for tests and the search's own checks."""
        with self.cond:
            return self.cond.wait_for(lambda: what(self), timeout=timeout_s)

    def failed(self, error: BaseException) -> None:
        """A slot's exception: the first one is kept (several slots may fail at once)."""
        with self.cond:
            self.error = self.error or error

    def slot_done(self) -> None:
        with self.cond:
            self.slots_running -= 1
            self.cond.notify_all()

    # the host's run loop
    def job_source(self) -> Job | None:
        with self.cond:
            # Nothing runs: wait for a trial thread to submit, or for all of them to finish.
            self.cond.wait_for(lambda: self.queue or self.in_flight > 0 or self.slots_running == 0)
            if not self.queue:
                return None
            self.in_flight += 1
            return self.queue.pop(0)

    def on_end(self, state: Any) -> None:
        with self.cond:
            self.in_flight -= 1
            self.ended[state.name] = state
            self.cond.notify_all()


class PackedSearch:
    """Mixin for a KerasTuner tuner class: ``search`` runs ``concurrent_trials`` trials at
    once in the device pool (Note [Packed KerasTuner trials])."""

    def __init__(self, *args: Any, concurrent_trials: int = 2, pool: int | str | None = None,
                 admission: str = "salus", **kwargs: Any):
        run_keys = {"planner", "swap_bandwidth", "plan_budget", "allocation_wait_ms", "pipeline"}
        self.run_settings = {k: kwargs.pop(k) for k in list(kwargs) if k in run_keys}
        self.run_settings["admission"] = admission
        super().__init__(*args, **kwargs)
        if concurrent_trials < 1:
            raise ValueError(f"concurrent_trials must be at least 1, got {concurrent_trials}")
        self.concurrent_trials, self.pool = concurrent_trials, pool
        self.packing = {"trials": 0, "retried_alone": 0, "jobs": 0}
        self.last_run = None   # the host's RunResult of the last search
        self._build_lock, self._end_lock = threading.Lock(), threading.Lock()
        self._fits: _PackedFits | None = None
        self._local = threading.local()
        self._trials_ended = threading.Condition()   # Note [A slot the oracle keeps waiting]
        self.trials_ended = 0
        if isinstance(self.oracle, keras_tuner.oracles.HyperbandOracle):   # Note [Promotions wait for their round]
            self.oracle.populate_space = _promoting_whole_rounds(self.oracle, self.oracle.populate_space)

    # -- KerasTuner hooks -------------------------------------------------------------
    def _try_build(self, hp):
        with self._build_lock:   # one at a time; no clear_session (module docstring)
            model = self._build_hypermodel(hp)
        trial = getattr(self._local, "trial", None)
        if trial is not None and self._fits is not None:   # a search's trial (not get_best_models)
            model.fit = lambda *a, **kw: self._fit_in_pool(trial, model, *a, **kw)
        return model

    def on_trial_end(self, trial):
        with self._end_lock:   # the oracle and the tuner's file, one trial at a time
            super().on_trial_end(trial)
        with self._trials_ended:
            self.trials_ended += 1
            self._trials_ended.notify_all()

    # -- the search ---------------------------------------------------------------------
    def search(self, *fit_args: Any, **fit_kwargs: Any) -> None:
        from keras_tuner.src.distribute import utils as dist_utils

        from tensile_tf.runtime import JobHost

        if dist_utils.is_chief_oracle():   # Note [Packed workers of KerasTuner's chief]: it serves the oracle
            return super().search(*fit_args, **fit_kwargs)
        fit_kwargs.pop("verbose", None)
        self.on_search_begin()
        fits = self._fits = _PackedFits(self.concurrent_trials)
        host = JobHost(pool_bytes=self.pool, concurrency=self.concurrent_trials, **self.run_settings)
        self._capacity = host.capacity
        slots = [threading.Thread(target=self._slot, args=(k, fits, fit_args, fit_kwargs), daemon=True,
                                  name=f"kt-slot-{k}") for k in range(self.concurrent_trials)]
        for t in slots:
            t.start()
        try:
            self.last_run = host.run(job_source=fits.job_source)   # until every slot has finished
        finally:
            for t in slots:
                t.join()
        self._fits = None
        if fits.error is not None:
            raise fits.error
        self.on_search_end()

    def _slot(self, k: int, fits: _PackedFits, fit_args: tuple, fit_kwargs: dict) -> None:
        tuner_id = f"{self.tuner_id}-packed{k}"
        try:
            while True:
                self.pre_create_trial()
                ended = self.trials_ended
                trial = self.oracle.create_trial(tuner_id)
                if trial.status == trial_module.TrialStatus.STOPPED:
                    break
                if trial.status == trial_module.TrialStatus.IDLE:   # Note [A slot the oracle keeps waiting]
                    with self._trials_ended:
                        self._trials_ended.wait_for(lambda: self.trials_ended > ended, timeout=IDLE_WAIT_S)
                    continue
                trial = _own_copy(trial)   # Note [A trial of its own]
                self._local.trial = trial
                self._count("trials")
                self._local.kept_bytes = 0
                self.on_trial_begin(trial)
                self._try_run_and_update_trial(trial, *fit_args, **fit_kwargs)
                self.on_trial_end(trial)
                if self._local.kept_bytes >= KEPT_BYTES_WORTH_A_COLLECTION * self._capacity:
                    gc.collect()   # Note [A trial's model given back]
        except BaseException as e:  # noqa: BLE001 - re-raised by search(), after every slot has ended
            fits.failed(e)
            _release_oracle_lock(self.oracle)
        finally:
            fits.slot_done()

    def _fit_in_pool(self, trial, model, x=None, y=None, *, verbose=None, **fit_kwargs):
        from tensile_tf.runtime import JobStatus

        base = f"trial-{trial.trial_id}"
        for alone in (False, True):
            job = Job.from_keras(f"{base}-{self._count('jobs')}", model, x, y, **fit_kwargs)
            state = self._fits.fit(job, alone=alone)
            self._local.kept_bytes = max(getattr(self._local, "kept_bytes", 0), state.kept_by_caller_bytes)
            if state.status in (JobStatus.finished, JobStatus.stopped):
                return job.history
            out_of_memory = state.error_type == "ResourceExhaustedError" or state.status == JobStatus.rejected
            if alone or not out_of_memory:
                raise keras_tuner.errors.FailedTrialError(f"{job.name} {state.status.value}: {state.error}")
            self._count("retried_alone")
        raise AssertionError("unreachable")

    def _count(self, key: str) -> int:
        with self._end_lock:
            self.packing[key] += 1
            return self.packing[key]


def _own_copy(trial: Any) -> Any:
    """Note [A trial of its own]: the trial's state in a new Trial, drawing no random id."""
    copy = trial_module.Trial(trial.hyperparameters.copy(), trial_id=trial.trial_id)
    copy.set_state(trial.get_state())
    return copy


class _Wait(Exception):
    """Note [Promotions wait for their round]: the oracle's answer would depend on running trials."""


def _promoting_whole_rounds(oracle: Any, populate_space: Callable[[str], dict]) -> Callable[[str], dict]:
    """Note [Promotions wait for their round]: ``populate_space`` answering ``IDLE`` instead of a
    promotion from a round whose trials are not all done, or of a new bracket while trials run."""
    done = (trial_module.TrialStatus.COMPLETED, trial_module.TrialStatus.FAILED, trial_module.TrialStatus.INVALID)
    increment_bracket = oracle._increment_bracket_num

    def next_bracket() -> None:   # called before the new bracket changes anything
        if oracle.ongoing_trials:
            raise _Wait
        increment_bracket()

    oracle._increment_bracket_num = next_bracket

    def populate(trial_id: str) -> dict:
        try:
            answer = populate_space(trial_id)
        except _Wait:
            return {"status": "IDLE"}
        values = answer.get("values") or {}
        if answer.get("status") != "RUNNING" or values.get("tuner/trial_id") is None:
            return answer
        rounds = next(b["rounds"] for b in oracle._brackets
                      if any(info["id"] == trial_id for r in b["rounds"] for info in r))
        promoted_to = next(k for k, r in enumerate(rounds) if any(info["id"] == trial_id for info in r))
        if all(oracle.trials[info["id"]].status in done for info in rounds[promoted_to - 1]):
            return answer
        rounds[promoted_to].pop()   # the promotion populate_space recorded, undone
        return {"status": "IDLE"}

    return populate


def _release_oracle_lock(oracle: Any) -> None:
    """KerasTuner's ``synchronized`` (keras_tuner/src/engine/oracle.py) releases the
    oracle's lock only when the call returns: an oracle call that raised on this
    thread leaves it held, and every other slot's next oracle call would wait forever
    (seen once: a packed search hung under load). Releases it if this thread holds it."""
    from keras_tuner.src.engine import oracle as kt_oracle

    if kt_oracle.THREADS[oracle] == threading.current_thread().name:
        kt_oracle.THREADS[oracle] = None
        kt_oracle.LOCKS[oracle].release()


def _packed(tuner_class: type) -> type:
    return type(f"Packed{tuner_class.__name__}", (PackedSearch, tuner_class),
                {"__doc__": f"{tuner_class.__name__} with trials packed into the pool "
                            "(Note [Packed KerasTuner trials] in tensile_tf/search/packed_tuner.py)."})


PackedTuner = _packed(keras_tuner.Tuner)
PackedRandomSearch = _packed(keras_tuner.RandomSearch)
PackedBayesianOptimization = _packed(keras_tuner.BayesianOptimization)
PackedHyperband = _packed(keras_tuner.Hyperband)
