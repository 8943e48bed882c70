"""Issue 16 benchmark: how long a re-plan of four ResNet50-size jobs takes in
the host (Note [Re-planning on events]): the planner, and separately the
rewrite and retrace of every job's step, which the run loop does while the
jobs keep training (they switch at their next step boundary).

    PYTHONPATH=. python benchmarks/replan_time_bench.py [--jobs 4] [--budget 0.65] [--repeats 3]

Four ResNet50 jobs (keras.applications, 64x64, batch 16, Adam: the planner
benchmark's model) are probed, captured and planned as at the start of
``tensile run``; then the running-job re-plan (``Replanner.replan``, the
call a departure or a latency drift makes) runs ``--repeats`` times for
``--budget`` x the jobs' predicted combined vanilla peak. The jobs do not
train here: the numbers are the re-plan's own.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensile_tf

tensile_tf.install(os.environ.get("TENSILE_POOL_BYTES", "6GiB"))  # before any TF op

from tensile_tf.config.schema import JobSpec  # noqa: E402
from tensile_tf.jobs.job import Job  # noqa: E402
from tensile_tf.runtime import JobHost  # noqa: E402
from tensile_tf.runtime.replanning import take_switch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--budget", type=float, default=0.65, help="share of the predicted combined vanilla peak")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    host = JobHost(planner="tensile", admission="none")
    for i in range(args.jobs):
        host.submit(Job.from_spec(JobSpec.model_validate(dict(
            name=f"resnet50-{i}", model={"application": "ResNet50"}, input_shape=[64, 64, 3], batch_size=16,
            steps=4, seed=i, optimizer={"name": "adam", "learning_rate": 0.001}))))
    host.clock.restart()
    admitted = host._probe_start(deque(), deque())  # noqa: SLF001 - the run's own start, without training
    start = host.plans[-1]
    print(f"{len(admitted)} jobs probed and planned; predicted combined vanilla peak "
          f"{start.pool_vanilla_peak_bytes / 2**20:.0f} MiB, {sum(len(s.captured.graph.ops) for s in admitted)} ops")
    host.planning.settings.plan_budget = int(start.pool_vanilla_peak_bytes * args.budget)
    planner_s, rewrite_s = [], []
    for k in range(args.repeats):
        record = host.replanner.replan(admitted, f"benchmark re-plan {k}")
        if record.error:
            raise SystemExit(f"re-plan failed: {record.error}")
        plan = host.plans[-1]
        planner_s.append(record.planning_s)
        rewrite_s.append(record.rewrite_s)
        swaps = sum(j.swaps_after for j in record.jobs)
        recomputes = sum(j.recomputes_after for j in record.jobs)
        print(f"re-plan {k}: budget {record.budget_bytes / 2**20:.0f} MiB "
              f"({'met' if plan.budget_met else 'NOT met'}, predicted {plan.pool_planned_peak_bytes / 2**20:.0f} MiB), "
              f"{swaps} swaps, {recomputes} recomputations; planner {record.planning_s * 1e3:.0f} ms, "
              f"rewrite+retrace {record.rewrite_s:.2f} s")
        for s in admitted:   # take the switch as a job thread would, so the next re-plan starts from it
            with s.job_stream.eager_scope():
                take_switch(s)
    print(f"\nmedian over {args.repeats}: planner {statistics.median(planner_s) * 1e3:.0f} ms "
          f"(goal < 200 ms), rewrite+retrace of {len(admitted)} steps {statistics.median(rewrite_s):.2f} s")
    for s in host.states:
        host.lifecycle.teardown(s)


if __name__ == "__main__":
    main()
