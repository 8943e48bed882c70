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
    except (OSError, yaml.YAMLError):
        return False  # load_config reports it with its location
    return isinstance(data, dict) and "search" in data and "jobs" not in data


def _cmd_validate(args) -> int:
    from tensile_tf.config import ConfigError, load_config

    if _is_search_config(args.config):
        from tensile_tf.search.config import load_search_config

        try:
            scfg = load_search_config(args.config)
        except ConfigError as e:
            print(e, file=sys.stderr)
            return 2
        s = scfg.search
        print(f"{args.config}: valid search: pool {scfg.pool} bytes, study {s.study_name!r}, "
              f"{s.sampler.name.value} sampler, {len(s.space)} parameters "
              f"({', '.join(s.space)}), n_trials {s.total_trials}")
        return 0
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"{args.config}: valid: pool {cfg.pool} bytes, {len(cfg.jobs)} jobs "
          f"({', '.join(j.name for j in cfg.jobs)})")
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
        from tf_plugin import human_bytes

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


def _summary_table(result, console) -> None:
    from rich.table import Table

    from tf_plugin import human_bytes

    table = Table(title=f"pool {human_bytes(result.capacity)}: peak {human_bytes(result.pool['peak'])}, "
                        f"{result.pool['run_ooms']} OOMs, wall {result.wall_s:.1f} s")
    for col in ("job", "status", "steps", "median step", "peak pool", "persistent", "temporary", "final loss"):
        table.add_column(col, no_wrap=True)
    for s in result.jobs:
        table.add_row(
            s.name, s.status.value, f"{s.steps_done}/{s.job.steps}",
            f"{s.median_step_s * 1e3:.1f} ms" if s.median_step_s else "-", human_bytes(s.peak_bytes),
            human_bytes(s.persistent_bytes) if s.persistent_bytes is not None else "-",
            human_bytes(s.temporary_bytes) if s.temporary_bytes is not None else "-",
            f"{s.last_loss:.4f}" if s.last_loss is not None else "-")
    console.print(table)
    for s in result.jobs:
        if s.error:
            console.print(f"[red]{s.name} {s.status.value}[/red]: {s.error}", soft_wrap=True)


def _run_host(cfg, console, *, planner: str, record_weights: bool = False):
    from tensile_tf.host import JobHost
    from tensile_tf.jobs import Job

    with RichProgress(console) as progress:
        host = JobHost(cfg.pool, concurrency=cfg.run.concurrency, admission=cfg.run.admission,
                       progress=progress, pipeline=cfg.run.pipeline, split_size=cfg.run.split_size,
                       barrier_timeout_s=cfg.run.barrier_timeout_s, planner=planner,
                       swap_bandwidth=cfg.run.swap_bandwidth, plan_budget=cfg.run.plan_budget,
                       plan_peaks=cfg.run.plan_peaks, record_weights=record_weights)
        for spec in cfg.jobs:
            host.submit(Job.from_spec(spec))
        return host.run()


def _cmd_run(args) -> int:
    from tensile_tf.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    import tensile_tf  # noqa: F401  (installs the pool before any TF op)
    from rich.console import Console

    from tensile_tf.host import JobStatus
    from tensile_tf.reports import write_outputs

    console = Console(width=max(Console().width, 120))
    out_dir = Path(args.out or cfg.run.out_dir)
    if args.compare_vanilla:
        return _compare_vanilla(cfg, console, out_dir)
    result = _run_host(cfg, console, planner=cfg.run.planner)
    _summary_table(result, console)
    paths = write_outputs(result, out_dir)
    console.print(f"wrote {paths['results']}, {paths['trace']}, {paths['memory']}")
    failed = [s for s in result.jobs if s.status != JobStatus.finished]
    return 1 if failed and len(failed) == len(result.jobs) else 0


def _compare_vanilla(cfg, console, out_dir: Path) -> int:
    """Runs the config unplanned, then with the TENSILE planner, in this
    process with deterministic ops; reports peaks, MSR, time ratio, swaps,
    recomputation, late swap-ins and whether losses and weights matched bit
    for bit (tensile_tf.compare)."""
    from tensile_tf.compare import compare_runs, format_comparison
    from tensile_tf.determinism import enable_deterministic_training
    from tensile_tf.reports import write_outputs

    enable_deterministic_training()  # both runs: same kernels, same Grappler rewrites
    results = {}
    for mode in ("vanilla", "planned"):
        console.rule(f"{mode} run")
        results[mode] = _run_host(cfg, console, planner="tensile" if mode == "planned" else "none",
                                  record_weights=True)
        _summary_table(results[mode], console)
        write_outputs(results[mode], out_dir / mode)
    comparison = compare_runs(results["vanilla"], results["planned"])
    console.print(format_comparison(comparison), soft_wrap=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(comparison, indent=2))
    console.print(f"wrote {out_dir / 'compare.json'} and the runs' outputs in {out_dir / 'vanilla'}, "
                  f"{out_dir / 'planned'}")
    return 0 if comparison["all_match"] else 1


def _cmd_plan(args) -> int:
    from tensile_tf.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    import tensile_tf  # noqa: F401  (installs the pool before any TF op)
    from types import SimpleNamespace

    import tensorflow as tf

    from tensile_tf.jobs import build_train_step
    from tensile_tf.memory import parse_bytes
    from tensile_tf.planning import format_plan_summary, plan_jobs

    jobs = []
    for spec in cfg.jobs:
        train = build_train_step(spec)
        jobs.append(SimpleNamespace(
            name=spec.name, step_fn=tf.function(train.step_fn, jit_compile=False),
            example_args=train.next_batch(), optimizer=train.optimizer,
            max_swapping_rate=spec.max_swapping_rate, start_offset_s=spec.start_offset_s, train=train))
    budget = parse_bytes(args.budget, what="--budget") if args.budget else cfg.pool
    bandwidth = parse_bytes(args.bandwidth, what="--bandwidth") if args.bandwidth else None
    plan = plan_jobs(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bandwidth)
    print(format_plan_summary(plan))
    out = Path(args.out or cfg.run.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(plan.to_json())
    print(f"wrote {out / 'plan.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the jobs of a YAML config concurrently in one process")
    run.add_argument("config")
    run.add_argument("--out", help="output directory (default: the config's run.out_dir)")
    run.add_argument("--compare-vanilla", action="store_true",
                     help="run the config unplanned, then planned (TENSILE), with deterministic ops; report "
                          "peaks, MSR, time ratio, swaps, recomputation, late swap-ins, bit-for-bit match; "
                          "writes compare.json")
    run.set_defaults(func=_cmd_run)
    validate = sub.add_parser("validate", help="check a YAML config without running it")
    validate.add_argument("config")
    validate.set_defaults(func=_cmd_validate)
    plan = sub.add_parser("plan", help="trace the config's jobs and plan swaps/recomputation without training")
    plan.add_argument("config")
    plan.add_argument("--out", help="output directory for plan.json (default: the config's run.out_dir)")
    plan.add_argument("--budget", help="memory budget to plan for, e.g. 512MiB (default: the config's pool)")
    plan.add_argument("--bandwidth", help="swap link bandwidth per second, e.g. 12GiB (default: PCIe 3 x16)")
    plan.set_defaults(func=_cmd_plan)
    from tensile_tf.search.cli import add_search_parser

    add_search_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
