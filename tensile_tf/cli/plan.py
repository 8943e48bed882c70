"""``tensile plan CONFIG [--out DIR] [--budget B] [--bandwidth B]``: probe,
capture and plan the jobs exactly as ``tensile run`` with ``planner: tensile``
does at its start, print the predicted peaks, write plan.json."""
from __future__ import annotations

import sys
from pathlib import Path

from tensile_tf.cli.common import UserError, check_output_dir, check_references, load_checked
from tensile_tf.cli.run import make_host


def cmd_plan(args) -> int:
    """Probes and plans the config's jobs exactly as `tensile run` with
    `planner: tensile` does at its start (JobHost.plan_only), without training."""
    from tensile_tf.config.device_links import parse_swap_link
    from tensile_tf.config.schema import PlannerKind
    from tensile_tf.units import parse_bytes

    cfg, marks = load_checked(args.config)
    run = cfg.run
    try:
        if args.budget:
            run = run.model_copy(update={"plan_budget": parse_bytes(args.budget, what="--budget")})
        if args.bandwidth:
            run = run.model_copy(update={"swap_bandwidth": parse_swap_link(args.bandwidth, "--bandwidth")})
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.budget:
        from tensile_tf.runtime.admission import POOL_HEADROOM

        cap = int(cfg.pool * (1 - POOL_HEADROOM))
        if run.plan_budget > cap:     # start_budget takes the smaller: say so rather than plan for less in silence
            print(f"tensile plan: --budget {args.budget} is above the pool less its {POOL_HEADROOM:.0%} headroom; "
                  f"planning for {cap} bytes (raise `pool:` to plan for more)", file=sys.stderr)
    out = check_output_dir(Path(args.out) if args.out else Path(cfg.run.out_dir),
                           "--out" if args.out else "run.out_dir")
    check_references(cfg, args.config, marks)
    cfg = cfg.model_copy(update={"run": run})
    from tensile_tf.reports.outputs import format_plan_summary, format_unplanned_peaks

    host = make_host(cfg, planner=PlannerKind.tensile)
    plan = host.plan_only()
    for s in host.states:
        if s.error or s.plan_error:
            print(f"{s.name}: {s.status.value}: {s.error or s.plan_error}", file=sys.stderr)
    if plan is None:
        print("tensile plan: no job could be planned (see above)", file=sys.stderr)
        return 1
    print(format_plan_summary(plan))
    print(format_unplanned_peaks(plan, host.planning.unplanned_peaks))
    (out / "plan.json").write_text(plan.to_json())
    print(f"wrote {out / 'plan.json'} (run it with `tensile run {args.config} --plan {out / 'plan.json'}`)")
    return 0
