"""``tensile search CONFIG [--out DIR] [--storage URL] [--resume]``.

Runs a hyperparameter search whose trials train concurrently on this
process's device pool, as many at once as admission control allows. Wire it
into the ``tensile`` parser with ``add_search_parser(subparsers)``.

Exit status: 0 when the study has at least one COMPLETE trial, 1 when it has
none, 2 for a bad configuration or storage.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_search_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "search", help="hyperparameter search: trials train concurrently in the shared pool",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML with pool, run and search sections")
    p.add_argument("--out", help="output directory (default: the config's run.out_dir); the default "
                                 "study lives here as study.db")
    p.add_argument("--storage", help="Optuna storage URL shared by several workers, e.g. "
                                     "postgresql://user:pass@host:5432/db (default: sqlite in --out)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted study; its finished trials are kept and its "
                        "interrupted ones re-queued")
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="a trial whose worker sent no heartbeat for this long is re-queued "
                        "(default 120)")
    p.set_defaults(func=cmd_search)
    return p


class SearchProgress:
    """One bar for the study: trials done of n_trials; this worker's running
    and queued trials; counts by state; the best value so far. Logs a line
    per finished trial."""

    def __init__(self, console, n_trials: int, metric: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.metric = metric
        self.progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
            TextColumn("running {task.fields[running]} · queued {task.fields[queued]} · "
                       "[green]{task.fields[complete]} ok[/] [yellow]{task.fields[pruned]} pruned[/] "
                       "[red]{task.fields[failed]} failed[/] · best {task.fields[best]}"),
            TimeElapsedColumn(), console=console, transient=False)
        self.task = self.progress.add_task("trials", total=n_trials, running=0, queued=0, complete=0,
                                           pruned=0, failed=0, best="-")
        self._study_counts: dict[str, Any] = {}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def refresh_study(self, study) -> None:
        from optuna.trial import TrialState

        from tensile_tf.search.results import best_trial
        from tensile_tf.search.storage import INTERRUPTED_ATTR

        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state.is_finished() and INTERRUPTED_ATTR not in t.user_attrs]
        best = best_trial(study)
        self._study_counts = dict(
            done=len(done),
            complete=sum(t.state == TrialState.COMPLETE for t in done),
            pruned=sum(t.state == TrialState.PRUNED for t in done),
            failed=sum(t.state == TrialState.FAIL for t in done),
            best=f"{best.value:.4g} (#{best.number})" if best is not None else "-")

    def on_event(self, kind: str, driver, run) -> None:
        from tensile_tf.runtime import JobStatus

        if kind == "told":
            self.refresh_study(driver.study)
            self._log_trial(run)
        in_flight = driver.in_flight
        running = sum(1 for r in in_flight if r.state is not None and r.state.status == JobStatus.running)
        c = self._study_counts
        self.progress.update(self.task, completed=c.get("done", 0), running=running,
                             queued=len(in_flight) - running, complete=c.get("complete", 0),
                             pruned=c.get("pruned", 0), failed=c.get("failed", 0), best=c.get("best", "-"))

    def _log_trial(self, run) -> None:
        from tf_plugin import human_bytes

        params = " ".join(f"{k}={_fmt(v)}" for k, v in run.params.items())
        state = run.told.name
        color = {"COMPLETE": "green", "PRUNED": "yellow"}.get(state, "red")
        line = f"trial {run.number} [{color}]{state}[/]"
        if run.value is not None:
            line += f" {self.metric}={run.value:.4g}"
        line += f"  {params}"
        s = run.state
        if s is not None:
            line += f"  ({s.steps_done} steps, peak {human_bytes(s.peak_bytes)})"
            if s.error:
                line += f": {s.error[:160]}"
        self.progress.console.print(line, soft_wrap=True, highlight=False)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _final_table(study, metric: str, console) -> None:
    """The study's trials (every worker's), one row each, from their TrialRecords."""
    from rich.table import Table

    from tensile_tf.search.results import TrialRecord, best_trial
    from tf_plugin import human_bytes

    trials = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    names = sorted({k for t in trials for k in t.params})
    best = best_trial(study)
    table = Table(title=f"study {study.study_name}: {metric} ({study.direction.name.lower()}), {len(trials)} trials")
    for col in ("#", "state", "value", *names, "steps", "peak pool", "error"):
        table.add_column(col, no_wrap=col != "error", overflow="fold")
    for t in trials:
        style = "bold green" if best is not None and t.number == best.number else None
        table.add_row(str(t.number), t.state, _fmt(t.value) if t.value is not None else "-",
                      *[_fmt(t.params.get(n, "-")) for n in names], str(t.job.steps or "-"),
                      human_bytes(t.job.peak_pool_bytes) if t.job.peak_pool_bytes else "-",
                      (t.job.error or t.interrupted or "")[:80], style=style)
    console.print(table)
    if best is not None:
        console.print(f"best: trial {best.number} {metric}={best.value:.6g}  " +
                      "  ".join(f"{k}={_fmt(v)}" for k, v in best.params.items()), highlight=False)
    else:
        console.print("[red]no trial completed[/red]: see the errors above")


def study_has_best(study) -> bool:
    from tensile_tf.search.results import best_trial

    return best_trial(study) is not None


def cmd_search(args) -> int:
    from tensile_tf.cli.common import UserError, check_output_dir, install_runtime
    from tensile_tf.config.schema import ConfigError, read_yaml
    from tensile_tf.search.config import load_search_config
    from tensile_tf.config.validation import check_search, raise_problems

    try:
        cfg = load_search_config(args.config)
        marks = read_yaml(args.config)[1]
        raise_problems(check_search(cfg, references=False), source=args.config, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None
    out_dir = check_output_dir(Path(args.out) if args.out else Path(cfg.run.out_dir),
                               "--out" if args.out else "run.out_dir")
    install_runtime(cfg.pool)  # the pool before any TensorFlow op
    try:  # what the trials' jobs refer to resolves (tensile_tf.config.validation), before any trial runs
        raise_problems(check_search(cfg), source=args.config, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None
    import optuna
    from tensile_tf.reports.console import wide_console
    from tensile_tf.runtime import JobHost
    from tensile_tf.search import storage as st
    from tensile_tf.search.driver import SearchDriver
    from tensile_tf.search.results import results_dict, write_search_outputs
    from tensile_tf.search.samplers import make_pruner, make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress says what its INFO lines say
    from tensile_tf.runtime.interrupts import EXIT_INTERRUPTED, StopOnSignals

    search = cfg.search
    shared = args.storage is not None
    storage_url = args.storage or st.default_storage_url(out_dir)
    worker = f"{st.this_worker()['host']}:{st.this_worker()['pid']}" if shared else None
    fingerprint = st.search_fingerprint({
        "base_job": search.base_job.model_dump(mode="json"),
        "space": {k: v.model_dump(mode="json") for k, v in search.space.items()},
        "objective": search.objective.model_dump(mode="json")})
    try:
        study = st.open_study(
            storage_url=storage_url, study_name=search.study_name,
            direction=search.objective.direction,
            sampler_factory=lambda existing: make_sampler(search.sampler, search.space,
                                                          existing_trials=existing, worker=worker),
            pruner=make_pruner(search.pruning), fingerprint=fingerprint,
            must_exist=True if args.resume else (None if shared else False))
    except st.SearchStorageError as e:
        raise UserError(str(e)) from None

    console = wide_console()
    n_trials = search.total_trials
    console.print(f"study {search.study_name!r} in {st.redact(storage_url)}: {search.sampler.name.value} "
                  f"sampler, {n_trials} trials, objective {search.objective.metric.value} "
                  f"({search.objective.direction}), pool {cfg.pool / 2**20:.0f} MiB", highlight=False)
    host = JobHost.from_config(cfg.pool, cfg.run)
    with SearchProgress(console, n_trials, search.objective.metric.value) as progress:
        progress.refresh_study(study)
        driver = SearchDriver(
            study, search.base_job, search.space, n_trials=n_trials, host=host,
            metric=search.objective.metric.value,
            report_every=search.pruning.interval_steps if search.pruning.enabled else None,
            max_concurrent=search.max_concurrent, admit_by_cores=search.admit_by_cores, on_event=progress.on_event,
            grace_s=args.grace or st.DEFAULT_GRACE_S, exclusive_storage=not shared,
            log=lambda m: progress.progress.console.print(m, highlight=False),
            failures_dir=out_dir / "failures")
        with StopOnSignals(host.request_stop, say=lambda line: console.print(f"[yellow]{line}[/yellow]")) as signals:
            result = driver.run()
    if result.requeued:
        console.print(f"re-queued interrupted trials: {', '.join(map(str, result.requeued))}")
    results = results_dict(study, storage_url=storage_url, metric=search.objective.metric.value,
                           n_trials=n_trials, capacity=host.capacity, result=result)
    _final_table(study, search.objective.metric.value, console)
    paths = write_search_outputs(results, out_dir, study)
    console.print("wrote " + ", ".join(str(p) for p in paths.values())
                  + " (open the study in optuna-dashboard: `optuna-dashboard " + st.redact(storage_url) + "`)",
                  highlight=False)
    if signals.received is not None:   # also a signal that came after the last trial ended
        console.print(f"[yellow]interrupted[/yellow] (stopped by {signals.received}): the running trials are "
                      f"re-queued; continue with `tensile search {args.config} --out {out_dir} --resume`",
                      highlight=False)
        return EXIT_INTERRUPTED
    failed = [r.number for r in result.trials if r.told is not None and r.told.name == "FAIL"
              and r.number not in result.requeued]
    if failed:
        console.print(f"[red]{len(failed)} trial(s) failed[/red]: {', '.join(map(str, failed))} "
                      "(their errors are in the table above and in results.json)", highlight=False)
        return 1
    return 0 if study_has_best(study) else 1
