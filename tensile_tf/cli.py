"""The ``tensile`` command (also ``python -m tensile_tf``).

    tensile run CONFIG [--out DIR]      train the config's jobs concurrently
    tensile run CONFIG --compare-vanilla  the same, unplanned then planned, and compare
    tensile validate CONFIG             check a config without running it
    tensile plan CONFIG [--out DIR]     trace and plan the jobs (TENSILE), write plan.json
    tensile search CONFIG [--out DIR] [--storage URL] [--resume]
                                        hyperparameter search, trials packed into the pool
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _is_search_config(path: str) -> bool:
    """A config with a top-level ``search:`` section (for ``tensile search``)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # load_config reports it with its location
    return isinstance(data, dict) and "search" in data and "jobs" not in data


class UserError(Exception):
    """A mistake in what the user asked for (config, arguments, paths): the
    command says what and where and exits 2, without a traceback."""


def _load_checked(path: str):
    """The config after the checks that need no runtime (YAML, schema,
    names, sizes), and its key locations; UserError if any fails."""
    from tensile_tf.config import ConfigError, config_from_data, read_yaml
    from tensile_tf.validation import check_config, raise_problems

    try:
        data, marks = read_yaml(path)
        cfg = config_from_data(data, source=path, marks=marks)
        raise_problems(check_config(cfg, references=False), source=path, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None
    return cfg, marks


def _check_references(cfg, path: str, marks, *, install_pool: bool = True) -> None:
    """The modules, names and arguments the config refers to (they import
    Keras, so the runtime is installed first: with the config's pool when
    ``install_pool``, else with whatever pool the process has, for
    validating, which trains nothing)."""
    from tensile_tf.config import ConfigError
    from tensile_tf.validation import config_reference_problems, raise_problems

    _install(cfg.pool if install_pool else None)
    try:
        raise_problems(config_reference_problems(cfg), source=path, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None


def _install(pool: int | None) -> None:
    """The runtime with the config's pool (None: the process's), before any
    TensorFlow op; a machine or environment that cannot host it (e.g.
    TF_CPU_ALLOCATOR_USE_BFC set) is the user's to fix."""
    import tensile_tf
    from tf_plugin._loader import PluginLoadError

    try:
        tensile_tf.install(pool)
        from tensile_tf.memory import create_devices

        create_devices()   # now, with the GPU probe's messages kept off the console
    except PluginLoadError as e:
        raise UserError(str(e)) from None
    except (ValueError, RuntimeError) as e:  # TENSILE_POOL_BYTES unreadable; a pool of another size exists
        raise UserError(str(e)) from None


def check_output_dir(out: Path, what: str = "--out") -> Path:
    """Makes sure results can be written to ``out`` before anything trains."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{what} {out}: is a file, not a folder; name a folder for the results")
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".tensile-write-check-"):
            pass   # a name of its own: workers sharing one folder do not race
    except OSError as e:
        raise UserError(f"{what} {out}: cannot write there ({e.strerror}); name a folder you can write to") from None
    return out


def _cmd_validate(args) -> int:
    from tensile_tf.config import ConfigError

    if _is_search_config(args.config):
        from tensile_tf.search.config import load_search_config

        from tensile_tf.config import read_yaml
        from tensile_tf.validation import check_search, raise_problems

        try:
            scfg = load_search_config(args.config)
            marks = read_yaml(args.config)[1]
            raise_problems(check_search(scfg, references=False), source=args.config, marks=marks)
            _install(None)
            raise_problems(check_search(scfg), source=args.config, marks=marks)
        except ConfigError as e:
            raise UserError(str(e)) from None
        s = scfg.search
        print(f"{args.config}: valid search: pool {scfg.pool} bytes, study {s.study_name!r}, "
              f"{s.sampler.name.value} sampler, {len(s.space)} parameters "
              f"({', '.join(s.space)}), n_trials {s.total_trials}")
        return 0
    cfg, marks = _load_checked(args.config)
    _check_references(cfg, args.config, marks, install_pool=False)
    print(f"{args.config}: valid: pool {cfg.pool} bytes, {len(cfg.jobs)} jobs "
          f"({', '.join(j.name for j in cfg.jobs)}); every reference resolves and every size fits")
    return 0


class RichProgress:
    """One bar per job: steps, loss, steps/s, the job's pool bytes, status."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:>8}"), TextColumn("{task.fields[rate]:>6} st/s"),
            TextColumn("{task.fields[mem]:>10}"), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), console=console, transient=False)
        self.tasks: dict[str, Any] = {}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, state, pool: dict[str, Any]) -> None:
        from tensile_tf.units import human_bytes

        if state.name not in self.tasks:
            self.tasks[state.name] = self.progress.add_task(
                state.name, total=state.job.steps, loss="-", rate="-", mem="-", status="")
        job_mem = pool["jobs"].get(state.name, {}).get("current", 0)
        median = state.median_step_s
        self.progress.update(
            self.tasks[state.name], completed=state.steps_done,
            loss=f"{state.last_loss:.4f}" if state.last_loss is not None else "-",
            rate=f"{1 / median:.1f}" if median else "-", mem=human_bytes(job_mem),
            status=state.status.value)

    def note(self, text: str) -> None:
        """A line above the bars (a re-plan, Note [Re-planning on events])."""
        self.progress.console.print(text)


def _summary_table(result, console) -> None:
    from rich.table import Table

    from tensile_tf.units import human_bytes

    table = Table(title=f"pool {human_bytes(result.capacity)}: peak {human_bytes(result.pool.peak)}, "
                        f"{result.pool.run_ooms} OOMs, "
                        + (f"{result.pool.run_stitched} stitched, " if result.pool.run_stitched else "")
                        + f"wall {result.wall_s:.1f} s, "
                        f"at most {result.most_jobs_running} of {len(result.jobs)} jobs at once")
    for col in ("job", "status", "steps", "median step", "peak (training)", "predicted peak", "persistent",
                "temporary", "final loss"):
        table.add_column(col, no_wrap=True)
    for s in result.jobs:
        predicted = f"{human_bytes(s.plan.predicted_planned_peak_bytes)} (plan)" if s.plan is not None else "-"
        table.add_row(
            s.name, s.status.value, f"{s.steps_done}/{s.job.steps}",
            f"{s.median_step_s * 1e3:.1f} ms" if s.median_step_s else "-", human_bytes(s.training_peak_bytes),
            predicted, human_bytes(s.persistent_bytes), human_bytes(s.temporary_bytes),
            f"{s.last_loss:.4f}" if s.last_loss is not None else "-")
    console.print(table)
    if result.planner is not None:
        # Every plan made (a re-plan replaces a job's plan; its last is in the table above).
        console.print(f"planner: {len(result.planner.plans)} plan(s) (swap-outs / recomputations per step; "
                      "predicted pool peak vanilla -> planned): "
                      + ", ".join(f"{sum(p.swap_outs.values())}/{sum(p.recomputes.values())}; "
                                  f"{human_bytes(p.predicted_pool_vanilla_peak_bytes)} -> "
                                  f"{human_bytes(p.predicted_pool_planned_peak_bytes)}" for p in result.planner.plans)
                      + f"; measured training peak {human_bytes(result.pool.training_peak)}")
    if result.trace.events_dropped:
        console.print(f"trace: the pool's event ring kept the last {result.trace.events_kept} of "
                      f"{result.trace.events_in_run} events (from {result.trace.kept_from_s or 0:.1f} s); the "
                      "per-job memory series covers the whole run; set TENSILE_POOL_TRACE_EVENTS="
                      f"{result.trace.events_in_run} to keep every event", soft_wrap=True)
    for s in result.jobs:
        if s.error:
            console.print(f"[red]{s.name} {s.status.value}[/red]: {s.error}", soft_wrap=True)


def _make_host(cfg, *, planner, progress=None, record_weights: bool = False, saved_plan=None, model_dir=None):
    """The JobHost for a config: the one place run, plan, compare and search
    turn a config's run: section into a runtime."""
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs import Job

    host = JobHost.from_config(cfg.pool, cfg.run, planner=planner, progress=progress,
                               record_weights=record_weights, saved_plan=saved_plan, model_dir=model_dir)
    for spec in cfg.jobs:
        host.submit(Job.from_spec(spec))
    return host


def _run_host(cfg, console, *, planner, record_weights: bool = False, saved_plan=None, out_dir=None):
    """Runs the config's jobs; Ctrl-C or SIGTERM stops them at a step
    boundary (Note [Stopping on a signal] in tensile_tf.runtime.interrupts)."""
    from tensile_tf.runtime.interrupts import StopOnSignals

    with RichProgress(console) as progress:
        host = _make_host(cfg, planner=planner, progress=progress, record_weights=record_weights,
                          saved_plan=saved_plan, model_dir=Path(out_dir) / "models" if out_dir else None)
        with StopOnSignals(host.request_stop, say=lambda line: console.print(f"[yellow]{line}[/yellow]")):
            return host.run()


def _cmd_run(args) -> int:
    from tensile_tf.config import PlannerKind

    cfg, marks = _load_checked(args.config)
    out_dir = check_output_dir(Path(args.out) if args.out else Path(cfg.run.out_dir),
                               "--out" if args.out else "run.out_dir")
    saved_plan = None
    if args.plan:
        from tensile_tf.runtime.planning import SavedPlan

        try:
            saved_plan = SavedPlan.load(args.plan)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{args.plan}: cannot read the plan ({e}); write one with "
                            f"`tensile plan {args.config}`") from None
    _check_references(cfg, args.config, marks)   # installs the runtime with the config's pool
    from rich.console import Console

    from tensile_tf.reports import write_outputs
    from tensile_tf.runtime import SavedPlanMismatch

    console = Console(width=max(Console().width, 120))
    if args.compare_vanilla:
        return _compare_vanilla(cfg, console, out_dir)
    planner = PlannerKind.tensile if saved_plan is not None else cfg.run.planner
    try:
        result = _run_host(cfg, console, planner=planner, saved_plan=saved_plan, out_dir=out_dir)
    except SavedPlanMismatch as e:
        raise UserError(f"refusing the plan {args.plan}: {e}") from None
    _summary_table(result, console)
    paths = write_outputs(result, out_dir)
    console.print(f"wrote {paths['results']}, {paths['trace']}, {paths['memory']}")
    return _run_exit_code(result, console)


def _run_exit_code(result, console) -> int:
    """0: every job finished; 130: interrupted; 1: a job failed, was
    rejected or stopped (named here)."""
    from tensile_tf.runtime import JobStatus
    from tensile_tf.runtime.interrupts import EXIT_INTERRUPTED

    if result.interrupted is not None:
        console.print(f"[yellow]interrupted[/yellow] ({result.interrupted}): the results of what ran are written")
        return EXIT_INTERRUPTED
    unfinished = [s for s in result.jobs if s.status != JobStatus.finished]
    if unfinished:
        console.print(f"[red]{len(unfinished)} of {len(result.jobs)} jobs did not finish[/red]: "
                      + ", ".join(f"{s.name} ({s.status.value})" for s in unfinished), soft_wrap=True)
        return 1
    return 0


def _compare_vanilla(cfg, console, out_dir: Path) -> int:
    """Runs the config unplanned, then with the TENSILE planner, in this
    process with deterministic ops; reports peaks, MSR, time ratio, swaps,
    recomputation, late swap-ins and whether losses and weights matched bit
    for bit (tensile_tf.compare)."""
    from tensile_tf.compare import compare_runs, format_comparison
    from tensile_tf.config import PlannerKind
    from tensile_tf.determinism import enable_deterministic_training
    from tensile_tf.reports import write_outputs

    enable_deterministic_training()  # both runs: same kernels, same Grappler rewrites
    results = {}
    for mode, planner in (("vanilla", PlannerKind.none), ("planned", PlannerKind.tensile)):
        console.rule(f"{mode} run")
        results[mode] = _run_host(cfg, console, planner=planner, record_weights=True, out_dir=out_dir / mode)
        _summary_table(results[mode], console)
        write_outputs(results[mode], out_dir / mode)
        if results[mode].interrupted is not None:
            console.print(f"wrote the {mode} run's outputs in {out_dir / mode}; no comparison (interrupted)")
            return _run_exit_code(results[mode], console)
    comparison = compare_runs(results["vanilla"], results["planned"])
    console.print(format_comparison(comparison), soft_wrap=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"schema_version": _schema_version(), **comparison.to_dict()}
    (out_dir / "compare.json").write_text(json.dumps(document, indent=2))
    console.print(f"wrote {out_dir / 'compare.json'} and the runs' outputs in {out_dir / 'vanilla'}, "
                  f"{out_dir / 'planned'}")
    return 0 if comparison.all_match else 1


def _schema_version() -> int:
    from tensile_tf.runtime.records import SCHEMA_VERSION

    return SCHEMA_VERSION


def _cmd_plan(args) -> int:
    """Probes and plans the config's jobs exactly as `tensile run` with
    `planner: tensile` does at its start (JobHost.plan_only), without training."""
    from tensile_tf.config import PlannerKind
    from tensile_tf.units import parse_bytes

    cfg, marks = _load_checked(args.config)
    run = cfg.run
    try:
        if args.budget:
            run = run.model_copy(update={"plan_budget": parse_bytes(args.budget, what="--budget")})
        if args.bandwidth:
            run = run.model_copy(update={"swap_bandwidth": parse_bytes(args.bandwidth, what="--bandwidth")})
    except ValueError as e:
        raise UserError(str(e)) from None
    out = check_output_dir(Path(args.out) if args.out else Path(cfg.run.out_dir),
                           "--out" if args.out else "run.out_dir")
    _check_references(cfg, args.config, marks)
    cfg = cfg.model_copy(update={"run": run})
    from tensile_tf.reports import format_plan_summary

    host = _make_host(cfg, planner=PlannerKind.tensile)
    plan = host.plan_only()
    for s in host.states:
        if s.error or s.plan_error:
            print(f"{s.name}: {s.status.value}: {s.error or s.plan_error}", file=sys.stderr)
    if plan is None:
        print("tensile plan: no job could be planned (see above)", file=sys.stderr)
        return 1
    print(format_plan_summary(plan))
    (out / "plan.json").write_text(plan.to_json())
    print(f"wrote {out / 'plan.json'} (run it with `tensile run {args.config} --plan {out / 'plan.json'}`)")
    return 0


def _cmd_calibrate(args) -> int:
    """Measures op latencies on this machine and caches the learned
    cold-start predictor (tensile_tf/calibration.py)."""
    from tensile_tf.units import parse_bytes

    try:
        pool = parse_bytes(args.pool, what="--pool")
    except ValueError as e:
        raise UserError(str(e)) from None
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else None
    _install(pool)
    from tensile_tf.calibration import CALIBRATION_MODELS, calibrate

    if names:
        unknown = [n for n in names if n not in CALIBRATION_MODELS]
        if unknown or len(names) < 2:
            raise UserError(f"--models {args.models}: " + (f"unknown {unknown}; " if unknown else "")
                            + f"name at least two of {', '.join(CALIBRATION_MODELS)}")
    predictor, rows, path = calibrate(names, path=Path(args.cache) if args.cache else None, repeats=args.repeats)
    print(f"{'held-out model':<22} {'ops':>5} {'learned error':>14} {'bytes-touched error':>20}")
    for r in rows:
        print(f"{r.model:<22} {r.ops:>5} {r.learned_error:>14.1%} {r.bytes_touched_error:>20.1%}")
    print("(error: summed |predicted - measured| op seconds over the measured step; each model predicted "
          "by a predictor fitted without it)")
    print(f"wrote {path}: fitted on {len(predictor.trained_on)} models, {predictor.samples} ops; cold starts use it")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the jobs of a YAML config concurrently in one process")
    run.add_argument("config")
    run.add_argument("--out", help="output directory (default: the config's run.out_dir)")
    run.add_argument("--compare-vanilla", action="store_true",
                     help="run the config unplanned, then planned (TENSILE), with deterministic ops; report "
                          "peaks, MSR, time ratio, swaps, recomputation, late swap-ins, bit-for-bit match; "
                          "writes compare.json")
    run.add_argument("--plan", help="run this plan.json (from `tensile plan`) instead of planning afresh; refused "
                     "if it was made for other graphs")
    run.set_defaults(func=_cmd_run)
    validate = sub.add_parser("validate", help="check a YAML config without running it")
    validate.add_argument("config")
    validate.set_defaults(func=_cmd_validate)
    plan = sub.add_parser("plan", help="trace the config's jobs and plan swaps/recomputation without training")
    plan.add_argument("config")
    plan.add_argument("--out", help="output directory for plan.json (default: the config's run.out_dir)")
    plan.add_argument("--budget", help="most bytes the jobs may use together, e.g. 512MiB (default: the config's "
                      "run.plan_budget, else the pool less its 10%% headroom, as `tensile run` plans)")
    plan.add_argument("--bandwidth", help="swap link bandwidth per second, e.g. 12GiB (default: PCIe 3 x16)")
    plan.set_defaults(func=_cmd_plan)
    calibrate = sub.add_parser("calibrate", help="measure op latencies on this machine and fit the cold-start "
                               "latency predictor (cached; used when a job's first step does not fit)")
    calibrate.add_argument("--models", help="comma-separated calibration models (default: all)")
    calibrate.add_argument("--cache", help="where to write the predictor (default: the user cache directory, "
                           "or $TENSILE_LATENCY_PREDICTOR)")
    calibrate.add_argument("--repeats", type=int, default=3, help="profiled steps per model (default 3)")
    calibrate.add_argument("--pool", default="2GiB", help="device pool for the measurements (default 2GiB)")
    calibrate.set_defaults(func=_cmd_calibrate)
    from tensile_tf.search.cli import add_search_parser

    add_search_parser(sub)
    for command in sub.choices.values():  # `tensile run X --debug` as well as `tensile --debug run X`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of any error")
    return parser


EXIT_USAGE = 2   # a bad config, argument or path (argparse uses 2 too)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 every job finished; 1 a job failed or was rejected (or
    an internal error); 2 a bad config or usage; 130 interrupted. A user's
    mistake prints what, where and what to do, never a traceback (``--debug``
    shows one for any error)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        if getattr(args, "debug", False):
            raise
        print(f"tensile {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        from tensile_tf.runtime.interrupts import EXIT_INTERRUPTED

        print(f"tensile {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, and how to see more
        if getattr(args, "debug", False):
            raise
        print(f"tensile {args.command}: internal error: {type(e).__name__}: {e}\n"
              f"  run it again with --debug for the traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
