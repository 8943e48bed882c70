"""What a run shows on the console while it trains and after: a progress bar per job
(``RichProgress``) and the summary table (``summary_table``). Shared by the ``tensile run``
command (tensile_tf/cli/run.py) and Keras users' ``fit_concurrently`` (tensile_tf/concurrent_fit.py),
so the library never imports the command line."""
from __future__ import annotations

from typing import Any

#: the width of output that is not a terminal (a file, a CI log): wide enough that no table is cut
FILE_WIDTH = 400


def wide_console(file=None):
    """A rich Console at least 120 columns wide on a terminal, and FILE_WIDTH where the output is a
    file or a CI log (issue 57: a summary table written to a log was cut to 80 columns)."""
    from rich.console import Console

    probe = Console(file=file)
    return Console(file=file, width=max(probe.width, 120) if probe.is_terminal else FILE_WIDTH)


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
        done = state.progress   # one frozen snapshot its job thread replaced (Note [Record apart from runtime])
        median = done.median_step_s
        self.progress.update(
            self.tasks[state.name], completed=done.steps_done,
            loss=f"{done.last_loss:.4f}" if done.last_loss is not None else "-",
            rate=f"{1 / median:.1f}" if median else "-", mem=human_bytes(job_mem),
            status=state.status.value)

    def note(self, text: str) -> None:
        """A line above the bars (a re-plan, Note [Re-planning on events])."""
        self.progress.console.print(text)


def summary_table(result, console) -> None:
    """The run's summary: a row per job, the plans made, a cut trace, each job's error."""
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
