"""``run.plan_steps: table_then_rewrite``: a new plan runs on the job's
plan-table step from its next step, and on its own rewritten step once that
is built and instantiated in the background.

Note [Table first, rewritten when ready]
The two plan steps each pay for one of a re-plan's two costs. A rewritten
step is the fastest step a plan has (its unchained runs, no slots), but a
new one takes a rewrite (0.7-0.9 s of Python per ResNet50 step) and an
instantiation (3-5 s, mostly Grappler) before the job can switch: seconds of
stale plan. The plan-table step switches at the next step (a table write),
but runs every op chained, with its slots and ticks: +15% a step on
ResNet50 (Note [Plans read at run time] in tf_plugin/swap/plan_table.h). So
this mode takes both, in order:

  1. The job's first plan is rewritten as in ``rewrite`` mode; its
     PlannedStep's ``background`` builds the job's plan-table step and
     instantiates it on the background worker (one thread,
     ``tensile-background`` in planned_step.py), after the step itself is
     instantiated. No job waits for it.
  2. A later plan the table carries (swaps only, plan order) is a
     ``TableThenRewritten`` step: its first call writes the table and runs
     the table step, at once (nothing to rewrite or instantiate). Its
     ``background`` rewrites the plan into its own step and instantiates it
     on the worker, in the job's stream scope.
  3. At the first step boundary after that, the job's thread moves to the
     rewritten step, as a re-plan's switch does (``take_switch``): the table
     plan's host-side variables back (``restore``), the rewritten plan's out
     (``evict``). Both steps run the same plan, so what trains and what the
     plan predicts are the same; ``RewriteReport.plan_table`` says how many
     steps ran on the table first.
  4. A plan the table cannot carry, or a job whose table step is not built
     yet, is rewritten as in ``rewrite`` mode (``plan_table`` says why). A
     run with ``run.replan: false`` runs as ``rewrite`` (run_loop.py): no
     plan would ever use a table step.
  5. A background rewrite whose plan is no longer the job's newest (a later
     plan was made for the job meanwhile) is dropped before it starts, or
     before it instantiates: a burst of re-plans rewrites only the last.
  6. Background work belongs to its job: it runs in the job's stream only
     under ``JobRuntime.background_scope``, whose lock the job's teardown
     takes (it waits for the work under way, and none starts after), and
     while it waits in the queue it holds its job weakly. (Held strongly, a
     queued table build kept a taken-over step's model alive past its
     probe's teardown: 2.7 MB counted as leaked, tests/tf/test_traced_step_reuse.py.)
     The teardown also drops the table step kept beside the job's traced
     step: its kernels' constants are in the job's stream.
  7. No background work starts for a job that ends before it would be
     done (Note [Background work for a job about to end] in
     tensile_tf/runtime/replan_timing.py): a table step not built says why
     in the next plan's ``plan_table`` ("rewritten: its plan-table step was
     not built: ..."), a rewrite not done leaves the job on its table
     ("table; not rewritten: ...").

So a re-plan takes effect from the job's next step, as with ``table``, and
the steps after the switch cost what the rewritten plan costs, as with
``rewrite``: the table step's price is paid only for the steps the
background work takes (4-6 s of it for a ResNet50 step on two cores).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, ContextManager

from tensile_tf.scheduler.plan import JobPlan
from tensile_tf.tf.rewrite.plan_table import PlanTableStep, TableRows, forget_table_step, table_step_for
from tensile_tf.tf.rewrite.planned_step import PlannedStep


class TableThenRewritten:
    """Note [Table first, rewritten when ready], steps 2, 3 and 5: the
    plan's table step until its rewritten step is ready, then that."""

    def __init__(self, table_step: PlanTableStep, table_planned: PlannedStep, rewrite: Callable[[], PlannedStep]):
        self.table_step = table_step          # a plan-table step's fn: ``plan_table`` stats read it
        self.table_planned = table_planned
        self.current = table_planned
        self.rewritten: PlannedStep | None = None
        self.calls = 0
        self.rewrite_error: str | None = None   # why the background rewrite left the job on its table
        self._failure_said = False              # ... said in its plan records (the job thread's)
        self._rewrite = rewrite
        self.plan_records: list[dict] = []    # plan records' ``rewrite`` dicts, brought up to date at the move
        self._lock = threading.Lock()        # the worker publishes ``rewritten``, the job thread reads it
        self._superseded = False
        previous = getattr(table_step, "newest_table_then_rewritten", lambda: None)()
        if previous is not None:
            previous.supersede()
        table_step.newest_table_then_rewritten = weakref.ref(self)

    @property
    def needs_instantiation(self) -> bool:
        return not self.table_step.instantiated

    def instantiate(self) -> None:
        self.table_step.instantiate()

    def supersede(self) -> None:
        """Step 5: a later plan was made for this job; its rewrite is not needed."""
        with self._lock:
            self._superseded = True

    def rewrite_in_background(self, scope: Callable[[], ContextManager]) -> None:
        """The background worker's part: the plan rewritten and instantiated (steps 2 and 5)."""
        with self._lock:
            if self._superseded:
                return
        try:
            with scope():   # the whole rewrite: the job's teardown waits for it, and none starts after
                step = self._rewrite()
                with self._lock:
                    if self._superseded:
                        return
                step.fn.instantiate()
        except Exception as e:  # noqa: BLE001 - the job stays on its table step (a step that did not
            with self._lock:      # instantiate would on the job's thread)
                self.rewrite_error = _reason(e)
            return
        with self._lock:
            self.rewritten = step

    def __call__(self, *args):
        """One step, on the job's thread: moves to the rewritten step at this
        boundary if it is ready (step 3)."""
        if self.current is self.table_planned:
            with self._lock:
                ready, failed = self.rewritten, self.rewrite_error
            if failed is not None and ready is None and not self._failure_said:   # the job stays on the table
                self._failure_said = True
                said = f"table; not rewritten: {failed}"
                self.table_planned.report.plan_table = said
                for record in self.plan_records:
                    record.update(plan_table=said)
            if ready is not None:
                self.table_planned.restore()
                ready.evict()
                self.current = ready
                said = f"table for {self.calls} step{'s' if self.calls != 1 else ''}, then rewritten"
                self.table_planned.report.plan_table = said
                for record in self.plan_records:   # the job's own PlanRecord (its thread's, H3 in threads.py)
                    record.update(ready.report.to_dict(), plan_table=said)
        self.calls += 1
        return self.current.fn(*args)

    def restore(self) -> None:
        self.current.restore()

    def evict(self) -> None:
        self.current.evict()


def table_then_rewritten_step(table_step: PlanTableStep, job_plan: JobPlan, encoded: TableRows,
                              rewrite: Callable[[], PlannedStep]) -> PlannedStep:
    """The job's step under ``encoded``'s plan (Note [Table first, rewritten
    when ready], step 2); ``rewrite()`` makes its rewritten step (called on
    the background worker)."""
    on_table = table_step.planned_step(job_plan, encoded)
    on_table.report.plan_table = "table, rewritten in the background"
    fn = TableThenRewritten(table_step, on_table, rewrite)
    step = PlannedStep(fn, on_table.job_plan, on_table.report, on_table.graph_def, fn.restore, fn.evict)
    step.background = fn.rewrite_in_background
    return step


def build_table_in_background(captured) -> Callable[[Callable[[], ContextManager]], None]:
    """Step 1: the background work that builds the plan-table step of the
    ``captured`` job's traced step and instantiates it in the job's stream
    scope. It holds the job weakly while it waits in the queue; one the
    job's teardown came before is not kept."""
    job = weakref.ref(captured)

    def work(scope: Callable[[], ContextManager]) -> None:
        c = job()
        if c is None:
            return
        try:
            with scope():   # the whole build: the job's teardown waits for it, and none starts after
                table_step_for(c.job.step_fn, c.job.example_args, c.graph, c.job.name,
                               c.planner_job.latencies)[0].instantiate()
        except Exception as e:  # noqa: BLE001 - later plans are rewritten, as in rewrite mode; they say why
            forget_table_step(c.job.step_fn, f"its plan-table step was not built: {_reason(e)}")
    return work


def _reason(e: Exception) -> str:
    """An exception as a record's reason (the runtime's BackgroundWorkAbandoned is said as it is)."""
    return str(e) if getattr(e, "said_plainly", False) else f"{type(e).__name__}: {e}"


def stage(step: Any) -> str:
    """Which step a ``table_then_rewrite`` job runs now: "table" or "rewritten"
    (tests, benchmarks); "" for any other step."""
    fn = getattr(step, "fn", None)
    if not isinstance(fn, TableThenRewritten):
        return ""
    return "table" if fn.current is fn.table_planned else "rewritten"
