"""The greedy planner against the exact planner (issue 55): how far its plans
are from the best plan there is, on the saved captures of small zoo models.

    PYTHONPATH=. python benchmarks/exact_gap_bench.py [--time-limit 30] [--jobs 1,2] [--json OUT]

Pure (no TensorFlow): it plans the files in benchmarks/captures/ (regenerate
them with benchmarks/captures/capture.py). Per case (capture x jobs x link x
mode) it prints the greedy plan's predicted pool peak, the exact planner's
best plan and its proven lower bound, the gap, both planning times, and
whether the greedy plan passed the exact model's check (Note [The exact
planner] in tensile_tf/scheduler/exact_planner.py):

* minimise: gap = greedy peak / exact bound - 1 (0 where the exact plan is
  proven optimal and the greedy one equals it);
* a budget (50% or 80% of the unplanned peak): whether each met it, and the
  step time each plan's recomputations add.

Links: "unlimited" (1e15 B/s), "110MiB/s" (benchmarks' capped link, one
lane), "h200-pcie5" (Note [Links named for a device]: its share of each
job's peak per step, two lanes at min(each way, combined / 2)) and
"h200-1lane" (the same link with the seed's one lane, at the each-way rate).
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.captures.capture import CAPTURES, load_capture  # noqa: E402
from tensile_tf.config.device_links import DEVICE_LINKS, device_link_bandwidth  # noqa: E402
from tensile_tf.scheduler import JobGraph, Planner, PlannerJob  # noqa: E402
from tensile_tf.scheduler.exact_candidates import check_plan  # noqa: E402
from tensile_tf.scheduler.exact_planner import ExactPlanner  # noqa: E402

MODES = {"minimise": None, "50%": 0.5, "80%": 0.8}
MiB = 2**20


def links(graph: JobGraph, lat, k: int) -> dict[str, tuple[float, int]]:
    """link name -> (bytes per second of a lane, lanes)."""
    probe = Planner([PlannerJob(graph, lat)], max_iterations=0)
    plan = probe.plan()
    dev = DEVICE_LINKS["h200-pcie5"]
    each_way = device_link_bandwidth(dev, [plan.pool_vanilla_peak_bytes] * k, [probe.jobs[0].tas.period_s] * k)
    return {"unlimited": (1e15, 1), "110MiB/s": (110 * MiB, 1),
            "h200-pcie5": (each_way * min(1.0, (getattr(dev, "both_ways", None) or 2.0) / 2), 2),
            "h200-1lane": (each_way, 1)}   # the same link as the seed plans it: one lane at the each-way rate


def greedy_planner(jobs, budget, bw, lanes, k) -> Planner:
    kw = {}
    if "link_lanes" in inspect.signature(Planner).parameters:
        kw["link_lanes"] = lanes
    elif lanes != 1:
        raise SystemExit("this commit's greedy planner has one lane only")
    return Planner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bw, coincident_peaks=k > 1, **kw)


def case(stem: str, k: int, link: str, bw: float, lanes: int, mode: str, time_limit: float) -> dict:
    graph, lat = load_capture(ROOT / "benchmarks" / "captures" / f"{stem}.json")
    graphs = [graph] if k == 1 else [JobGraph(f"{graph.name}-{i}", graph.ops, graph.tensors) for i in range(k)]
    jobs = [PlannerJob(g, lat) for g in graphs]
    vanilla = Planner(jobs, coincident_peaks=k > 1, max_iterations=0).plan().pool_vanilla_peak_bytes
    frac = MODES[mode]
    budget = None if frac is None else int(vanilla * frac)
    greedy = greedy_planner(jobs, budget, bw, lanes, k)
    t0 = time.perf_counter()
    gp = greedy.plan()
    greedy_s = time.perf_counter() - t0
    check = check_plan(greedy, lanes)
    exact = ExactPlanner(jobs, pool_bytes=budget, bandwidth_bytes_per_s=bw, lanes=lanes, coincident_peaks=k > 1,
                         time_limit_s=time_limit).solve(hint=greedy)
    row = {"capture": stem, "jobs": k, "link": link, "lanes": lanes, "mode": mode, "budget": budget,
           "vanilla": vanilla, "greedy_peak": gp.pool_planned_peak_bytes, "greedy_met": gp.budget_met,
           "greedy_s": greedy_s, "greedy_recompute_s": sum(j.planned_iteration_s - j.iteration_s for j in gp.jobs.values()),
           "greedy_stop": gp.stop_reason, "check": check.agrees, "check_problems": check.problems[:3],
           "outside_model": check.outside_model, "exact_status": exact.status, "exact_peak": exact.plan_peak_bytes,
           "exact_model_peak": exact.peak_bytes, "exact_bound": exact.bound_bytes, "exact_s": exact.solve_s,
           "exact_recompute_s": exact.recompute_s, "exact_vars": exact.variables}
    if budget is None:
        ref = exact.bound_bytes
        row["gap"] = gp.pool_planned_peak_bytes / ref - 1 if ref else 0.0
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--captures", default=",".join(c[0] for c in CAPTURES))
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--links", default="unlimited,110MiB/s,h200-pcie5,h200-1lane")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT seconds per solve")
    ap.add_argument("--json", help="append one JSON line per case here")
    a = ap.parse_args()
    rows = []
    print(f"{'capture':18} {'jobs':>4} {'link':11} {'mode':9} {'greedy MiB':>10} {'exact MiB':>9} {'bound':>8} "
          f"{'gap':>7} {'greedy s':>8} {'exact s':>8} status   check")
    for stem in a.captures.split(","):
        for k in (int(x) for x in a.jobs.split(",")):
            graph, lat = load_capture(ROOT / "benchmarks" / "captures" / f"{stem}.json")
            for link, (bw, lanes) in links(graph, lat, k).items():
                if link not in a.links.split(","):
                    continue
                for mode in a.modes.split(","):
                    r = case(stem, k, link, bw, lanes, mode, a.time_limit)
                    rows.append(r)
                    gap = f"{r['gap']:+.1%}" if "gap" in r else ("met" if r["greedy_met"] else "MISSED")
                    ex = f"{r['exact_peak'] / MiB:9.2f}" if r["exact_peak"] is not None else f"{'-':>9}"
                    print(f"{stem:18} {k:4} {link:11} {mode:9} {r['greedy_peak'] / MiB:10.2f} {ex} "
                          f"{r['exact_bound'] / MiB:8.2f} {gap:>7} {r['greedy_s']:8.3f} {r['exact_s']:8.2f} "
                          f"{r['exact_status']:8} {'ok' if r['check'] else 'DISAGREES'}"
                          f"{' (outside: ' + '; '.join(r['outside_model']) + ')' if r['outside_model'] else ''}",
                          flush=True)
                    if a.json:
                        with open(a.json, "a") as f:
                            f.write(json.dumps(r) + "\n")
    gaps = [r["gap"] for r in rows if "gap" in r]
    if gaps:
        print(f"\nminimise: {len(gaps)} cases, gap median {statistics.median(gaps):+.2%}, worst {max(gaps):+.2%}; "
              f"proven optimal {sum(r['exact_status'] == 'optimal' for r in rows if 'gap' in r)}")
    budgeted = [r for r in rows if "gap" not in r]
    if budgeted:
        print(f"budgets: {len(budgeted)} cases; greedy met {sum(r['greedy_met'] for r in budgeted)}, "
              f"exact proved feasible {sum(r['exact_status'] in ('optimal', 'feasible') for r in budgeted)}, "
              f"missed where exact met: {sum((not r['greedy_met']) and r['exact_status'] in ('optimal', 'feasible') for r in budgeted)}")
    print(f"greedy plans the exact model's check disagreed with: {sum(not r['check'] for r in rows)}")


if __name__ == "__main__":
    main()
