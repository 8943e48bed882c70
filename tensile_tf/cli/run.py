"""``tensile run CONFIG [--out DIR] [--plan plan.json] [--compare-vanilla]``:
train the config's jobs concurrently, with a progress bar per job and a
summary table; ``--compare-vanilla`` runs it unplanned then planned and
compares (Note [Honest comparison] in tensile_tf/reports/compare.py)."""
from __future__ import annotations

import json
from pathlib import Path

from tensile_tf.cli.common import UserError, check_output_dir, check_references, load_checked, schema_version
from tensile_tf.reports.console import RichProgress, summary_table


def make_host(cfg, *, planner, progress=None, record_weights: bool = False, saved_plan=None, model_dir=None):
    """The JobHost for a config: the one place run, plan, compare and search
    turn a config's run: section into a runtime."""
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs.job import Job

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
        host = make_host(cfg, planner=planner, progress=progress, record_weights=record_weights,
                          saved_plan=saved_plan, model_dir=Path(out_dir) / "models" if out_dir else None)
        with StopOnSignals(host.request_stop, say=lambda line: console.print(f"[yellow]{line}[/yellow]")):
            return host.run()


def cmd_run(args) -> int:
    from tensile_tf.config.schema import PlannerKind

    cfg, marks = load_checked(args.config)
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
    check_references(cfg, args.config, marks)   # installs the runtime with the config's pool
    from tensile_tf.reports.console import wide_console
    from tensile_tf.reports.outputs import write_outputs
    from tensile_tf.runtime import SavedPlanMismatch

    console = wide_console()
    if args.compare_vanilla:
        return _compare_vanilla(cfg, console, out_dir)
    planner = PlannerKind.tensile if saved_plan is not None else cfg.run.planner
    try:
        result = _run_host(cfg, console, planner=planner, saved_plan=saved_plan, out_dir=out_dir)
    except SavedPlanMismatch as e:
        raise UserError(f"refusing the plan {args.plan}: {e}") from None
    summary_table(result, console)
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
    for bit (tensile_tf.reports.compare)."""
    from tensile_tf.reports.compare import compare_runs, format_comparison
    from tensile_tf.config.schema import PlannerKind
    from tensile_tf.tf.determinism import enable_deterministic_training
    from tensile_tf.reports.outputs import write_outputs

    enable_deterministic_training()  # both runs: same kernels, same Grappler rewrites
    results = {}
    for mode, planner in (("vanilla", PlannerKind.none), ("planned", PlannerKind.tensile)):
        console.rule(f"{mode} run")
        results[mode] = _run_host(cfg, console, planner=planner, record_weights=True, out_dir=out_dir / mode)
        summary_table(results[mode], console)
        write_outputs(results[mode], out_dir / mode)
        if results[mode].interrupted is not None:
            console.print(f"wrote the {mode} run's outputs in {out_dir / mode}; no comparison (interrupted)")
            return _run_exit_code(results[mode], console)
    comparison = compare_runs(results["vanilla"], results["planned"])
    console.print(format_comparison(comparison), soft_wrap=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"schema_version": schema_version(), **comparison.to_dict()}
    (out_dir / "compare.json").write_text(json.dumps(document, indent=2))
    console.print(f"wrote {out_dir / 'compare.json'} and the runs' outputs in {out_dir / 'vanilla'}, "
                  f"{out_dir / 'planned'}")
    return 0 if comparison.all_match else 1
