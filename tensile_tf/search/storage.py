"""Where a study lives, and what happens to trials whose process died.

Default: an embedded SQLite study in the output directory
(``sqlite:///DIR/study.db``), one process. Scale-out: any Optuna storage URL
(``--storage postgresql://user@host/db``); every process that runs the same
config against it joins the same study and packs its own trials into its own
pool.

Note [Interrupted trials]
~~~~~~~~~~~~~~~~~~~~~~~~~
Rationale: a killed worker leaves its trials RUNNING in the study forever.
They would count toward ``n_trials`` and hide their grid points, yet hold no
result.

Approach: interrupted trials are *failed and re-queued*. Each trial carries
the user attrs ``tensile_worker`` (host name and pid) and
``tensile_heartbeat`` (Unix time, refreshed every ``HEARTBEAT_S`` by its
worker). A RUNNING trial is interrupted when its worker ran on this machine
and that pid is gone (detected at once: the ``--resume`` case; on the
default SQLite study, which has one worker, also a RUNNING trial without
attrs: its process died between ``ask`` and writing them), or when its
heartbeat is older than ``grace_s`` (a dead worker on another machine). It
is marked FAIL with ``tensile_interrupted`` (the reason), and a copy with the
same params is enqueued (``tensile_retry_of``), so the point runs again;
interrupted trials do not count toward ``n_trials``. Re-queuing rather than
only failing keeps a grid search complete and the trial count honest.

Implementation: ``recover_interrupted_trials`` runs when a worker starts and
every ``grace_s / 2`` while it runs. Setting FAIL is the claim: if two
workers find the same stale trial, only the one whose state change succeeds
enqueues the retry. Heartbeats are user attrs rather than Optuna's RDB
heartbeat, so they work on every storage and need no ``study.optimize``.

Limitations: a paused (not dead) worker older than ``grace_s`` loses its
trials to the retry; when it wakes, its tell fails and it logs that. Clocks of
the machines must agree to well under ``grace_s``. A pid reused by an
unrelated process hides a dead local worker until its heartbeat goes stale.
"""
from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

HEARTBEAT_S = 10.0          # how often a worker refreshes its trials' heartbeats
DEFAULT_GRACE_S = 120.0     # a heartbeat older than this marks a trial interrupted

WORKER_ATTR = "tensile_worker"
HEARTBEAT_ATTR = "tensile_heartbeat"
INTERRUPTED_ATTR = "tensile_interrupted"
RETRY_ATTR = "tensile_retry_of"
OOM_RETRIES_ATTR = "tensile_oom_retries"   # a packing-OOM retry: how many so far (it runs alone)
JOB_ATTR = "tensile_job"
SPACE_ATTR = "tensile_search"   # study user attr: what the study searches (checked on resume)


class SearchStorageError(RuntimeError):
    """The study cannot be created, found or continued; the message says what to do."""


def this_worker() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def default_storage_url(out_dir: str | Path) -> str:
    return f"sqlite:///{Path(out_dir).resolve() / 'study.db'}"


def redact(url: str) -> str:
    """The storage URL without its password, for logs and results.json."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, _, where = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{where}" if ":" in creds else url


def make_storage(url: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """An Optuna storage for the URL. SQLite waits for locks instead of
    failing at once (trials of one process and workers on one file write
    concurrently); server databases re-check pooled connections.

    Workers started together on an empty database race to create Optuna's
    tables, and the losers fail with a duplicate-key error; the tables exist
    by then, so try again after a short random pause.
    """
    if url.startswith("sqlite:"):
        make = lambda: optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})  # noqa: E731
    elif url.startswith(("postgresql", "mysql")):
        make = lambda: optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})  # noqa: E731
    else:
        return optuna.storages.get_storage(url)
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return make()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))
    raise AssertionError("unreachable")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def interrupted_reason(trial: optuna.trial.FrozenTrial, *, now: float, grace_s: float,
                       me: dict[str, Any], exclusive: bool = False) -> str | None:
    """Why a RUNNING trial is interrupted, or None if it may still be running.

    ``exclusive``: this process is the study's only worker (the default
    SQLite study), so a RUNNING trial without a worker attr was asked by a
    process killed before it could write one."""
    if trial.state != TrialState.RUNNING:
        return None
    worker = trial.user_attrs.get(WORKER_ATTR)
    if not isinstance(worker, dict):
        if exclusive:
            return "its worker was killed as it asked for the trial"
        return None  # not (yet) a tensile trial: leave it to whoever runs it
    if worker == me:
        return None
    if worker.get("host") == me["host"] and not _pid_alive(int(worker.get("pid", -1))):
        return f"worker pid {worker.get('pid')} on {worker.get('host')} is gone"
    beat = trial.user_attrs.get(HEARTBEAT_ATTR)
    if isinstance(beat, (int, float)) and now - beat > grace_s:
        return f"no heartbeat for {now - beat:.0f} s (worker {worker.get('host')}:{worker.get('pid')})"
    return None


def recover_interrupted_trials(study: optuna.Study, *, grace_s: float = DEFAULT_GRACE_S,
                               me: dict[str, Any] | None = None, exclusive: bool = False) -> list[int]:
    """Fails and re-queues interrupted trials (Note [Interrupted trials]);
    returns the numbers of the trials it re-queued."""
    me = me or this_worker()
    now = time.time()
    storage = study._storage  # noqa: SLF001 - the study's own storage, for per-trial writes
    requeued = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = interrupted_reason(trial, now=now, grace_s=grace_s, me=me, exclusive=exclusive)
        if reason is None:
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, INTERRUPTED_ATTR, reason)  # noqa: SLF001
            claimed = storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)  # noqa: SLF001
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker claimed it first
        if not claimed:
            continue
        study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number})
        requeued.append(trial.number)
    return requeued


def counted_trials(study: optuna.Study) -> int:
    """Trials that count toward n_trials: asked (running or finished), not
    waiting in the queue and not interrupted."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state != TrialState.WAITING and INTERRUPTED_ATTR not in t.user_attrs)


def search_fingerprint(description: dict[str, Any]) -> str:
    return json.dumps(description, sort_keys=True, default=str)


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    return any(s.study_name == name for s in storage.get_all_studies())


def open_study(*, storage_url: str, study_name: str, direction: str, sampler_factory, pruner,
               fingerprint: str | None, must_exist: bool | None) -> optuna.Study:
    """Creates or loads the study. ``must_exist``: True (resume: it must be
    there), False (a fresh search: it must not be), None (join or create:
    shared storage). ``sampler_factory(existing_trials)`` makes the sampler
    (see samplers.effective_seed). A loaded study must search what this
    config searches."""
    try:
        storage = make_storage(storage_url)
    except Exception as e:  # noqa: BLE001 - driver import errors, bad URLs, refused connections
        raise SearchStorageError(f"cannot open study storage {redact(storage_url)}: {e}") from None
    exists = study_exists(storage, study_name)
    if must_exist is True and not exists:
        raise SearchStorageError(f"nothing to resume: {redact(storage_url)} has no study {study_name!r}; "
                                 "run without --resume to start it")
    if must_exist is False and exists:
        n = len(optuna.load_study(study_name=study_name, storage=storage).trials)
        raise SearchStorageError(
            f"{redact(storage_url)} already holds study {study_name!r} ({n} trials); pass --resume to "
            "continue it, or choose another --out (or search.study_name)")
    existing = len(storage.get_all_trials(storage.get_study_id_from_name(study_name), deepcopy=False)) \
        if exists else 0
    study = optuna.create_study(storage=storage, study_name=study_name, direction=direction,
                                sampler=sampler_factory(existing), pruner=pruner, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise SearchStorageError(f"study {study_name!r} was created to {study.direction.name.lower()}, "
                                 f"but the config says {direction}; use another study_name")
    if fingerprint is not None:
        stored = study.user_attrs.get(SPACE_ATTR)
        if stored is None:
            study.set_user_attr(SPACE_ATTR, fingerprint)
        elif stored != fingerprint:
            raise SearchStorageError(
                f"study {study_name!r} in {redact(storage_url)} was started with a different base job, "
                "space or objective than this config; its trials would not be comparable. Use the "
                "original config, or another --out / study_name")
    return study
