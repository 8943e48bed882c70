"""The search driver: an Optuna ask/tell loop that keeps the device pool full.

Lifecycle of one trial, in order:

1. ``JobHost.run`` asks ``SearchDriver.job_source`` for a job whenever no job waits and a
   concurrency slot is free. The driver asks the study for a trial (``study.ask`` with the
   space's distributions; enqueued trials first), unless ``n_trials`` trials already count or
   ``max_concurrent`` of its own trials are in flight.
2. The trial's job is ``base_job`` with each dotted param set (``trial_job_spec``). A param set
   that makes no valid job is told FAIL at once and the driver asks again.
3. The host probes the job (P and T measured, or predicted from a measured trial of the same
   model at another batch size) and admits it when the Salus condition holds, so trials of
   different sizes pack the pool.
4. While it trains, ``on_step`` (the job's thread) hands the objective metric so far to the
   reporter thread every ``report_every`` steps; the reporter calls ``trial.report`` and
   ``trial.should_prune`` and raises the trial's prune flag, which the next ``on_step`` answers
   with False (host status ``stopped``). Job threads never wait on the study's storage.
5. When the job has ended and released its memory, the driver tells the study: COMPLETE with the
   objective value, PRUNED, or FAIL (failed, rejected, or a non-finite objective), and records
   the job's facts in the trial's ``tensile_job`` user attr. Failed trials never stop the
   search. A trial that ran out of memory beside other trials (admitted, or built before their
   admission: Note [Neighbours before their admission] in trials.py) failed through packing, not
   through its params: it is failed as interrupted and re-queued (at most MAX_OOM_RETRIES times;
   see ``_packing_oom``), and the retry runs alone: it starts once this driver's other trials
   have ended, and no trial starts beside it (``job_source``), so packing never loses a trial to
   memory it would have had alone. results.json counts the retries.

The host calls ``on_end`` once for every job that reached a final status, including jobs failed
or rejected while probed and jobs never admitted; a sweep of the host's states (on every progress
update and job_source call) is a second, idempotent path to the same ``_finish``.

The pieces: trials.py (``TrialRun``, ``SearchResult``, the space), reporter.py (the reporter
thread); this module re-exports their public names. Which thread runs what, and the hand-offs
between them: Note [Threads and hand-offs] in tensile_tf/runtime/threads.py (T4, H10, H13).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from tensile_tf.config.schema import JobSpec
from tensile_tf.runtime import JobHost, JobRecord, JobState, JobStatus
from tensile_tf.runtime.core_meter import CoreAdmission, CoreMeter, thread_cpu_clock
from tensile_tf.jobs.job import Job
from tensile_tf.search import storage as st
from tensile_tf.search.config import trial_job_spec
from tensile_tf.search.objective import metric_function
from tensile_tf.search.reporter import Reporter
from tensile_tf.search.results import TrialFacts
from tensile_tf.search.trials import (MAX_OOM_RETRIES, OOM_RETRIES_ATTR, SearchResult, TrialRun, normalize_space,
                                      trial_steps, trials_beside)

_ENDED = (JobStatus.finished, JobStatus.stopped, JobStatus.failed, JobStatus.rejected, JobStatus.interrupted)


class SearchDriver:
    """Runs trials of one study on a JobHost; see the module docstring.

    Use ``run_search`` unless you need the pieces (``job_source`` for a host you run yourself)."""

    def __init__(self, study: optuna.Study, base_job: JobSpec | Mapping[str, Any],
                 space: Mapping[str, Any], *, n_trials: int | None, host: JobHost,
                 metric: str = "final_loss", report_every: int | None = None,
                 max_concurrent: int | None = None, grace_s: float = st.DEFAULT_GRACE_S,
                 heartbeat_s: float = st.HEARTBEAT_S, exclusive_storage: bool = False,
                 on_event: Callable[[str, "SearchDriver", TrialRun | None], None] | None = None,
                 log: Callable[[str], None] | None = None, failures_dir: "Path | None" = None,
                 admit_by_cores: bool = True):
        if n_trials is not None and n_trials < 1:
            raise ValueError(f"n_trials must be at least 1 (got {n_trials})")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1 (got {max_concurrent})")
        if report_every is not None and report_every < 1:
            raise ValueError(f"report_every must be at least 1 (got {report_every})")
        self.study = study
        self.base_job = base_job
        self.base_name = (base_job.name if isinstance(base_job, JobSpec) else base_job.get("name")) or "trial"
        self.distributions, self.decoders = normalize_space(space)
        self.n_trials = n_trials
        self.host = host
        self.metric_name = metric
        self.metric = metric_function(metric)
        self.report_every = report_every
        self.max_concurrent = max_concurrent
        self.grace_s = grace_s
        self.heartbeat_s = heartbeat_s
        self.exclusive_storage = exclusive_storage
        self.failures_dir = failures_dir   # where a failed trial's whole traceback is kept (None: nowhere)
        self.on_event = on_event
        self._log_fn, self.me = log, st.this_worker()
        self.runs: list[TrialRun] = []
        self._by_job: dict[str, TrialRun] = {}
        self._lock = threading.RLock()
        self._reporter = Reporter(self, heartbeat_s)
        self._last_recovery = 0.0
        self._wall0 = time.time()
        self.requeued: list[int] = []
        self._exhausted = False
        self._alone: TrialRun | None = None   # a packing-OOM retry, run alone
        # Note [Admitting by the cores] in core_meter.py; this thread runs the run loop (Note [Plans only for idle cores])
        self.cores = CoreAdmission(CoreMeter(loop_cpu=thread_cpu_clock()), log=self._log) if admit_by_cores else None

    # ---------------------------------------------------------- helpers

    def _log(self, message: str) -> None:
        if self._log_fn is not None:
            self._log_fn(message)

    def _event(self, kind: str, run: TrialRun | None = None) -> None:
        if self.on_event is not None:
            self.on_event(kind, self, run)

    @property
    def in_flight(self) -> list[TrialRun]:
        with self._lock:   # H13 in runtime/threads.py: a copy, never ``runs`` walked while it grows
            return [r for r in self.runs if r.told is None]

    def _add_run(self, run: TrialRun) -> None:
        with self._lock:
            self.runs.append(run)

    def _recover(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_recovery < self.grace_s / 2:
            return
        self._last_recovery = now
        found = st.recover_interrupted_trials(self.study, grace_s=self.grace_s, me=self.me,
                                              exclusive=self.exclusive_storage)
        if found:
            self.requeued += found
            self._log(f"re-queued interrupted trial(s) {', '.join(map(str, found))}")

    def _heartbeat(self) -> None:
        now = time.time()
        for run in self.in_flight:
            with self._lock:
                if run.told is None:
                    try:
                        run.trial.set_user_attr(st.HEARTBEAT_ATTR, now)
                    except Exception:  # noqa: BLE001 - told or failed by another worker meanwhile
                        pass

    # -------------------------------------------------------- job source

    def job_source(self) -> Job | None:
        """For ``JobHost.run(job_source=...)``: the next trial's job, or None."""
        self.sweep()
        if self._exhausted:
            return None
        alone = self._alone
        if alone is not None and alone.told is None:
            # a packing-OOM retry: it starts when the others have ended, and runs alone
            if alone.issued or any(r is not alone for r in self.in_flight):
                return None
            alone.issue(self.host.clock.now())
            return alone.job
        if self.max_concurrent is not None and len(self.in_flight) >= self.max_concurrent:
            return None
        issued = sum(1 for r in self.in_flight if r.issued)
        if self.cores is not None and not self.cores.allows(issued, trial_steps(self.runs)):
            return None
        self._recover()
        while True:
            if self.n_trials is not None and st.counted_trials(self.study) >= self.n_trials:
                self._exhausted = not self.in_flight
                return None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                trial = self.study.ask(self.distributions)
            trial.set_user_attr(st.WORKER_ATTR, self.me)
            trial.set_user_attr(st.HEARTBEAT_ATTR, time.time())
            params = {k: self.decoders.get(k, lambda v: v)(v) for k, v in trial.params.items()}
            name = self._job_name(trial.number)
            try:
                spec = trial_job_spec(self.base_job, params, name)
            except (ValidationError, ValueError) as e:
                run = TrialRun(trial=trial, job=None, params=params)  # type: ignore[arg-type]
                self._add_run(run)
                msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
                self._tell(run, TrialState.FAIL, facts=TrialFacts(status="invalid", error=f"invalid job: {msg}",
                                                                error_type="ValidationError"))
                continue
            run = TrialRun(trial=trial, job=None, params=params,  # type: ignore[arg-type]
                           retry_of=trial.user_attrs.get(st.RETRY_ATTR))
            run.job = dataclasses.replace(Job.from_spec(spec), on_step=self._on_step_for(run),
                                          on_end=self._on_end)
            self._add_run(run)
            self._by_job[name] = run
            self._event("asked", run)
            if trial.user_attrs.get(OOM_RETRIES_ATTR):
                self._alone = run
                if any(r is not run for r in self.in_flight):
                    return None   # held until the others end
            run.issue(self.host.clock.now())
            return run.job

    def _busy_for_a_plan(self, running: int, newcomers: int = 0) -> str | None:
        """Note [Plans only for idle cores] in tensile_tf/runtime/planning.py (the host asks)."""
        return self.cores.busy_for_a_plan(running, newcomers, trial_steps(self.runs))

    def _started(self, run: TrialRun) -> None:
        """The host started the trial's job (a progress update saw it running)."""
        if not run.started and self.cores is not None:
            self.cores.started(running=sum(1 for r in self.in_flight if r.started and r is not run))
        run.started = True

    def _job_name(self, number: int) -> str:
        name, taken, k = f"{self.base_name}-{number}", {s.name for s in self.host.states}, 1
        while name in taken:
            name, k = f"{self.base_name}-{number}-{k}", k + 1
        return name

    def _on_step_for(self, run: TrialRun) -> Callable[[JobState], bool]:
        batch = run.job.spec.batch_size if run.job and run.job.spec else None

        def on_step(state: JobState) -> bool:
            if run.prune.is_set():   # raised by the reporter thread
                return False
            if self.metric_name.startswith("val_"):
                # validation metrics change only when the job validates: report each validation
                if state.validation and state.validation[-1].step == state.steps_done:
                    value = self.metric(state.records, batch, state.validation)
                    if math.isfinite(value):
                        self._reporter.put(run, state.steps_done, value)
            elif self.report_every and state.steps_done % self.report_every == 0:
                value = self.metric(state.records, batch)
                if math.isfinite(value):
                    self._reporter.put(run, state.steps_done, value)
            return True

        return on_step

    def _on_end(self, state: JobState) -> None:
        run = self._by_job.get(state.name)
        if run is not None:
            self._finish(run, state)

    def sweep(self) -> None:
        """Tells the study about trials whose jobs ended without on_end
        (failed or rejected while probed, or rejected when the run ended)."""
        states = {s.name: s for s in self.host.states}
        for run in self.in_flight:
            state = states.get(run.job.name)
            if state is None:
                continue
            run.state = state
            if state.status in _ENDED and state.rt.train is None and state.rt.job_stream is None:
                self._finish(run, state)

    # ---------------------------------------------------------- telling

    def _finish(self, run: TrialRun, state: JobState) -> None:
        if run.told is not None:
            return
        t = time.perf_counter()
        self._finish_untimed(run, state)   # never raises: _tell logs what the study refused
        run.tell_s += time.perf_counter() - t

    def _finish_untimed(self, run: TrialRun, state: JobState) -> None:
        run.state = state
        self._reporter.flush(run)
        facts = self._facts(state)
        if state.status == JobStatus.finished:
            value = self.metric(state.records, run.job.spec.batch_size, state.validation)
            if math.isfinite(value):
                self._tell(run, TrialState.COMPLETE, value=value, facts=facts)
            else:
                facts.error = f"objective {self.metric_name} is {value}"
                self._tell(run, TrialState.FAIL, facts=facts)
        elif state.status == JobStatus.stopped:
            self._tell(run, TrialState.PRUNED, facts=facts)
        elif state.status == JobStatus.interrupted:
            # The run was stopped (Ctrl-C, SIGTERM): nothing about the params;
            # failed as interrupted and re-queued, so --resume runs it again.
            reason = f"this worker was {state.error or 'interrupted'}"
            self._tell(run, TrialState.FAIL, facts=facts, interrupted=reason)
        elif self._packing_oom(run, state):
            retries = run.trial.user_attrs.get(OOM_RETRIES_ATTR, 0) + 1
            reason = (f"ran out of pool memory beside other trials (packing, not its params); "
                      f"re-queued (retry {retries} of {MAX_OOM_RETRIES})")
            facts.error = f"{reason}: {state.error}"
            self._tell(run, TrialState.FAIL, facts=facts, interrupted=reason,
                       retry_attrs={OOM_RETRIES_ATTR: retries})
        else:
            self._tell(run, TrialState.FAIL, facts=facts)

    def _packing_oom(self, run: TrialRun, state: JobState) -> bool:
        """Did the job run out of memory while other jobs held pool memory beside it
        (``trials_beside``: admitted, or built and probed before their admission)?

        Admission lets trials in on measured or predicted P and T; when their
        temporaries peak together (free-running jobs under ``salus``), one
        can run out of memory although it fits alone. Such a failure says
        nothing about the trial's params: re-queue it, a bounded number of
        times (MAX_OOM_RETRIES), rather than fail the point.
        """
        if state.status != JobStatus.failed or state.error_type != "ResourceExhaustedError":
            return False
        if run.trial.user_attrs.get(OOM_RETRIES_ATTR, 0) >= MAX_OOM_RETRIES:
            return False
        if state.admitted_at_s is None or state.ended_at_s is None:
            return False
        return bool(trials_beside(state, self.host.states))

    def _facts(self, state: JobState) -> TrialFacts:
        """The job's record (the results.json schema) plus wall-clock times."""
        def at(t):
            return None if t is None else self._wall0 + t

        if state.traceback and self.failures_dir is not None and state.traceback_path is None:
            try:
                self.failures_dir.mkdir(parents=True, exist_ok=True)
                path = self.failures_dir / f"{state.name}.txt"
                path.write_text(f"job {state.name!r} {state.status.value}: {state.error}\n\n{state.traceback}")
                state.traceback_path = str(path.relative_to(self.failures_dir.parent))  # beside results.json
            except OSError as e:
                self._log(f"{state.name}: could not keep its traceback ({e})")
        return TrialFacts.of(JobRecord.of(state), started_at=at(state.admitted_at_s), ended_at=at(state.ended_at_s))

    def _tell(self, run: TrialRun, trial_state: TrialState, *, value: float | None = None,
              facts: TrialFacts, interrupted: str | None = None,
              retry_attrs: dict[str, Any] | None = None) -> None:
        """Tells the study; ``interrupted``: fail the trial as interrupted
        (it does not count toward n_trials) and enqueue a retry of its params."""
        with self._lock:
            if run.told is not None:
                return
            run.told = trial_state
            run.value = value
            try:
                run.trial.set_user_attr(st.JOB_ATTR, facts.to_attrs())
                if interrupted is not None:
                    run.trial.set_user_attr(st.INTERRUPTED_ATTR, interrupted)
                    self.study.enqueue_trial(run.trial.params,
                                             user_attrs={st.RETRY_ATTR: run.number, **(retry_attrs or {})})
                    self.requeued.append(run.number)
                self.study.tell(run.trial, value if trial_state == TrialState.COMPLETE else None,
                                state=trial_state, skip_if_finished=True)
            except RuntimeError as e:
                # GridSampler.after_trial calls study.stop(), which Optuna refuses
                # outside study.optimize; the state was stored before that.
                if "Study.stop" not in str(e):
                    self._log(f"trial {run.number}: could not tell the study {trial_state.name}: {e}")
            except Exception as e:  # noqa: BLE001 - e.g. another worker failed it as interrupted
                self._log(f"trial {run.number}: could not tell the study {trial_state.name}: {e}")
        self._event("told", run)

    # -------------------------------------------------------------- run

    def run(self) -> SearchResult:
        """Runs trials until n_trials count in the study (or the source of
        trials is exhausted); returns this driver's trials."""
        t0 = time.perf_counter()
        self._recover(force=True)
        previous = self.host.progress
        self.host.progress = _SweepingProgress(self, previous)
        self._reporter.start()
        self._wall0 = time.time()
        result = None
        try:
            result = self.host.run(job_source=self.job_source, jobs_at_most=self.max_concurrent,
                                   busy_for_a_plan=self._busy_for_a_plan if self.cores is not None else None)
            self.sweep()
        except BaseException as e:
            self._abandon(f"this worker stopped: {type(e).__name__}")
            raise
        finally:
            self._reporter.stop()
            self.host.progress = previous
        return SearchResult(study=self.study, trials=list(self.runs), host_result=result,
                            wall_s=time.perf_counter() - t0, requeued=list(self.requeued),
                            cores=self.cores)

    def _abandon(self, reason: str) -> None:
        """Fails and re-queues this driver's unfinished trials (Ctrl-C, a crash)."""
        for run in self.in_flight:
            with self._lock:
                run.told = TrialState.FAIL
                try:
                    run.trial.set_user_attr(st.INTERRUPTED_ATTR, reason)
                    self.study.tell(run.trial, state=TrialState.FAIL, skip_if_finished=True)
                    self.study.enqueue_trial(run.trial.params, user_attrs={st.RETRY_ATTR: run.number})
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass


class _SweepingProgress:
    """Wraps the host's progress sink: forwards, then sweeps the driver
    (the host reports every state change from its main thread)."""

    def __init__(self, driver: SearchDriver, inner):
        self.driver = driver
        self.inner = inner

    def update(self, state: JobState, pool: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner.update(state, pool)
        run = self.driver._by_job.get(state.name)  # noqa: SLF001
        if run is not None:
            run.state = state
            if state.status == JobStatus.running:
                self.driver._started(run)  # noqa: SLF001
            if run.told is None and state.status in _ENDED and state.rt.train is None \
                    and state.rt.job_stream is None:
                self.driver._finish(run, state)  # noqa: SLF001
            self.driver._event("progress", run)  # noqa: SLF001


def run_search(study: optuna.Study, base_job: JobSpec | Mapping[str, Any], space: Mapping[str, Any], *,
               n_trials: int | None, host: JobHost | None = None, pool_bytes: int | str | None = None,
               metric: str = "final_loss", report_every: int | None = None,
               max_concurrent: int | None = None, **kwargs: Any) -> SearchResult:
    """Runs a search on the shared pool with your own Optuna study.

    >>> study = optuna.create_study(sampler=optuna.samplers.TPESampler(constant_liar=True),
    ...                             pruner=optuna.pruners.MedianPruner())
    >>> run_search(study, {"model": {"builder": "tensile_tf.jobs.zoo:mlp"}, "input_shape": [64], "steps": 100},
    ...            {"batch_size": optuna.distributions.IntDistribution(16, 256, log=True),
    ...             "optimizer.learning_rate": {"type": "float", "low": 1e-4, "high": 0.1, "log": True}},
    ...            n_trials=20, report_every=10)

    ``n_trials`` counts every trial in the study (resumed or from other
    workers) but interrupted ones; None runs until the sampler's source ends
    (only sensible with enqueued trials or a grid). The study's pruner acts
    on values reported every ``report_every`` steps (None: no reports, no
    pruning). The study's direction decides what ``metric`` optimises.
    """
    if host is None:
        host = JobHost(pool_bytes)
    if n_trials is None and not isinstance(study.sampler, optuna.samplers.GridSampler):
        raise ValueError("run_search: give n_trials (None runs forever with this sampler)")
    if n_trials is None:
        n_trials = len(study.sampler._all_grids)  # noqa: SLF001 - the grid's size
    driver = SearchDriver(study, base_job, space, n_trials=n_trials, host=host, metric=metric,
                          report_every=report_every, max_concurrent=max_concurrent, **kwargs)
    return driver.run()


__all__ = ["MAX_OOM_RETRIES", "OOM_RETRIES_ATTR", "SearchDriver", "SearchResult", "TrialRun", "normalize_space",
           "run_search", "trials_beside"]
