"""Issue 16 benchmark (seed 000 §V, dynamic workloads): jobs arrive at
staggered times (``arrive_at_s``) into a pool where they fit together only
when planned. The same config runs twice, each in a fresh ``tensile run``:

* one-shot: ``run.replan: false``. Each job is planned once, alone, for
  what the running jobs leave when it is admitted; a job that does not fit
  waits for one to end.
* controller: ``run.replan: true`` (the default). Arrivals are planned
  together with the running jobs (Note [Joint re-plan on arrival]),
  departures relax the others, drift re-plans (Note [Latency drift]).

    PYTHONPATH=. python benchmarks/dynamic_workload_bench.py \\
        [--config benchmarks/configs/dynamic_workload.yaml] [--out runs/dynamic]

Prints, per mode: makespan (wall), pool peak against capacity, OOMs,
re-plans, the profiling share of the training time; per job: arrival,
wait, completion time (end - arrival), median step, the controller's
completion time over one-shot's; and the planned swap-outs and
recomputations per step of the running jobs over time (every plan and
re-plan). Each number is read from the run's results.json.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from tensile_run import REPO, run_config
MODES = {"one-shot": False, "controller": True}


def run_mode(config: Path, out: Path, replan: bool) -> dict:
    doc = yaml.safe_load(config.read_text())
    doc.setdefault("run", {})["replan"] = replan
    return run_config(doc, out)


def swaps_over_time(results: dict) -> list[tuple[float, str, dict[str, tuple[int, int]]]]:
    """(time, event, {job: (swap-outs, recomputations)}) for every plan the run applied."""
    current: dict[str, tuple[int, int]] = {}
    events = []
    jobs = sorted(results["jobs"], key=lambda j: j["admitted_at_s"] if j["admitted_at_s"] is not None else 1e9)
    replans = sorted(results["planner"]["replans"], key=lambda r: r["at_s"])
    timeline = [(j["admitted_at_s"], "admit", j) for j in jobs if j["admitted_at_s"] is not None]
    timeline += [(j["ended_at_s"], "end", j) for j in jobs if j["ended_at_s"] is not None and j["admitted_at_s"] is not None]
    timeline += [(r["at_s"], "replan", r) for r in replans if r["error"] is None]
    first_plan = {}
    for r in replans:   # a job's plan before its first re-plan is the one it was admitted with
        for j in r["jobs"]:
            first_plan.setdefault(j["name"], (j["swaps_before"], j["recomputes_before"]))
    for t, kind, item in sorted(timeline, key=lambda x: x[0]):
        if kind == "admit":
            plan = item["plan"] or {}
            current[item["name"]] = first_plan.get(item["name"], (plan.get("swap_outs", 0), plan.get("recomputes", 0)))
            events.append((t, f"admit {item['name']}", dict(current)))
        elif kind == "end":
            current.pop(item["name"], None)
            events.append((t, f"end {item['name']}", dict(current)))
        else:
            for j in item["jobs"]:
                if j["name"] in current:
                    current[j["name"]] = (j["swaps_after"], j["recomputes_after"])
            events.append((t, f"re-plan: {item['reason']}", dict(current)))
    return events


def profiling_share(results: dict, *, cold_first: bool = True) -> float | None:
    """Extra time of the profiled steps (over each job's median) / all training
    time; ``cold_first`` False leaves out each cold-started job's first check
    (taken at once, whatever it costs: Note [Latency drift])."""
    cold = {j["name"] for j in results["jobs"] if j["plan"] and j["plan"]["cold_start"]}
    checks, seen = [], set()
    for c in results["planner"]["drift_checks"]:
        first_of_cold = c["job"] in cold and c["job"] not in seen
        seen.add(c["job"])
        if cold_first or not first_of_cold:
            checks.append(c)
    total = sum(sum(j["step_seconds"][1:]) for j in results["jobs"])
    extra = sum(max(0.0, c["profiled_step_s"] - (c["median_step_s"] or c["profiled_step_s"])) for c in checks)
    return extra / total if total else None


def cold_start_ratios(results: dict) -> list[tuple[str, float, float | None, float | None]]:
    """Per cold-started job (planned from its graph with predicted latencies):
    (name, step 0 / median of steps 1.., median before / after its first
    re-plan on measured latencies (its drift check), the step of that re-plan)."""
    out = []
    for j in results["jobs"]:
        if not (j["plan"] and j["plan"]["cold_start"]) or len(j["step_seconds"]) < 3:
            continue
        steps = j["step_seconds"]
        first = steps[0] / statistics.median(steps[1:])
        switched = [x["switched_at_step"] for r in results["planner"]["replans"] if r["error"] is None
                    for x in r["jobs"] if x["name"] == j["name"] and x["switched_at_step"] is not None]
        before_after = None
        if switched and 1 < switched[0] < len(steps) - 1:
            k = switched[0]
            before_after = statistics.median(steps[1:k]) / statistics.median(steps[k:])
        out.append((j["name"], first, before_after, switched[0] if switched else None))
    return out


def replans_never_switched_in(results: dict) -> list[dict]:
    """Re-plans that made a plan no job switched to: finished after the jobs they were for had
    ended, or replaced before they switched (issue 56: zero in a run of short jobs)."""
    return [r for r in results["planner"]["replans"] if r["error"] is None and not r.get("skipped")
            and r.get("newcomer") is None and r["jobs"] and all(j["switched_at_step"] is None for j in r["jobs"])]


def mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "benchmarks/configs/dynamic_workload.yaml"))
    ap.add_argument("--out", default="runs/dynamic")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: one-shot,controller")
    args = ap.parse_args()
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = run_mode(Path(args.config), Path(args.out) / mode, MODES[mode])
        print(f"{mode}: done, {runs[mode]['status']}", flush=True)

    print("\n| mode | makespan | pool peak / capacity | OOMs | jobs finished | re-plans | never switched in | "
          "not started (jobs about to end) | profiling share (without cold-started jobs' first checks) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, r in runs.items():
        pool = r["pool"]
        finished = sum(j["status"] == "finished" for j in r["jobs"])
        share, warm = profiling_share(r), profiling_share(r, cold_first=False)
        replans = r["planner"]["replans"]
        failed = sum(x["error"] is not None for x in replans)
        print(f"| {mode} | {r['wall_s']:.1f} s | {mib(pool['peak'])} / {mib(pool['capacity'])} "
              f"({pool['peak'] / pool['capacity']:.0%}) | {pool['run_ooms']} | {finished}/{len(r['jobs'])} | "
              f"{len(replans)}{f' ({failed} failed)' if failed else ''} | {len(replans_never_switched_in(r))} | "
              f"{sum(bool(x.get('skipped')) for x in replans)} | "
              f"{'-' if share is None else f'{share:.2%} ({warm:.2%})'} |")

    names = [j["name"] for j in next(iter(runs.values()))["jobs"]]
    print("\n| job | mode | arrived | waited | completion (end - arrival) | median step | status |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    completion = {}
    for name in names:
        for mode, r in runs.items():
            j = next(x for x in r["jobs"] if x["name"] == name)
            arrived = j["arrived_at_s"] or 0.0
            done = j["ended_at_s"] - arrived if j["ended_at_s"] is not None else None
            completion[(name, mode)] = done
            wait = j["admitted_at_s"] - arrived if j["admitted_at_s"] is not None else None
            step = j["median_step_s"]
            print(f"| {name} | {mode} | {arrived:.1f} s | {'-' if wait is None else f'{wait:.1f} s'} | "
                  f"{'-' if done is None else f'{done:.1f} s'} | {'-' if step is None else f'{step * 1e3:.0f} ms'} | "
                  f"{j['status']} |")
    if set(MODES) <= set(runs):
        print("\nper-job completion time, controller / one-shot:")
        for name in names:
            a, b = completion[(name, "controller")], completion[(name, "one-shot")]
            print(f"  {name}: {'-' if not (a and b) else f'{a / b:.2f}'}")
        print(f"makespan, controller / one-shot: {runs['controller']['wall_s'] / runs['one-shot']['wall_s']:.2f}")

    for mode, r in runs.items():
        for name, first, before_after, at in cold_start_ratios(r):
            print(f"\ncold-started {name} ({mode}): step 0 / median later step {first:.2f} (step 0 includes "
                  f"TensorFlow's one-time work); cold plan's median step / after its re-plan on measured "
                  f"latencies (step {at}): {'-' if before_after is None else f'{before_after:.2f}'}")
        vanilla_first = [j["step_seconds"][0] / statistics.median(j["step_seconds"][1:]) for j in r["jobs"]
                         if not (j["plan"] and j["plan"]["cold_start"]) and len(j["step_seconds"]) > 2]
        if vanilla_first:
            print(f"  ({mode}: jobs probed unplanned, step 0 / median later step: "
                  + ", ".join(f"{x:.2f}" for x in vanilla_first) + ")")

    for mode, r in runs.items():
        print(f"\nplanned swap-outs / recomputations per step of the running jobs over time ({mode}):")
        for t, what, jobs in swaps_over_time(r):
            state = ", ".join(f"{n} {s}/{c}" for n, (s, c) in jobs.items()) or "-"
            print(f"  {t:7.1f} s  {what:<45} {state}")
        for x in r["planner"]["replans"]:
            print(f"  re-plan at {x['at_s']:.1f} s ({x['reason']}): planner {x['planning_s'] * 1e3:.0f} ms, "
                  f"rewrite+retrace {x['rewrite_s']:.2f} s, paused {x.get('paused_s', 0.0):.2f} s"
                  + (f", FAILED: {x['error']}" if x["error"] else "")
                  + (f", NOT STARTED: {x['skipped']}" if x.get("skipped") else "")
                  + (f"; events: {len(x['events'])}" if len(x.get("events") or ()) > 1 else "")
                  + ("; never switched in" if x in replans_never_switched_in(r) else ""))


if __name__ == "__main__":
    main()
