"""Issue 16 benchmark: the first iterations of a cold-started job (seed 000
§V-B, Table II, "first iteration EOR": TENSILE 1.25-1.47, Capuchin's passive
mode 5.8-10.2; the issue's goal <= 1.15).

A job whose unplanned step does not fit the pool is planned cold: from its
traced graph, with predicted op latencies (the learned predictor when
``tensile calibrate`` has cached one, else bytes touched), and its planned
step is its first (Note [Cold-start planning]). Its latency monitor then
profiles it (step FIRST_CHECK_STEP), replaces the prediction with what it
measured, and a change past run.replan_threshold re-plans it (Note
[Latency drift]). Each job runs twice, in fresh ``tensile run`` processes:
unplanned in a pool large enough, and planned cold in a pool its unplanned
step does not fit.

    PYTHONPATH=. python benchmarks/cold_start_bench.py [--out runs/cold_start] [--steps 30] \
        [--allocation-wait-ms 0] [--cold-pools cnn=112MiB]

Ratios, each against the same job's unplanned run (EOR = time with the plan
/ time without):
* first iteration: step 0 / unplanned step 0 (both include TensorFlow's
  one-time work of a function's first call);
* cold plan: median of steps 1 .. the switch to the re-plan / unplanned median;
* after the re-plan on measured latencies: median after the switch / unplanned median.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tensile_run import run_config

JOBS = {
    # name: (job spec, roomy pool, cold pool: below the unplanned peak)
    "deep-mlp": (dict(model={"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [256] * 12}}, input_shape=[64],
                      batch_size=8192, optimizer={"name": "adam", "learning_rate": 0.001}), "512MiB", "100MiB"),
    "cnn": (dict(model={"builder": "tensile_tf.jobs.zoo:small_cnn", "args": {"filters": [32, 64]}},
                 input_shape=[32, 32, 3], batch_size=256, optimizer={"name": "adam", "learning_rate": 0.001}),
            "512MiB", "128MiB"),
}


def run(out: Path, name: str, spec: dict, pool: str, planner: str, steps: int, wait_ms: int | None) -> dict:
    settings = {"out_dir": str(out), "planner": planner, "admission": "none"}
    if wait_ms is not None:
        settings["allocation_wait_ms"] = wait_ms
    return run_config({"pool": pool, "run": settings, "jobs": [dict(spec, name=name, steps=steps, seed=1)]}, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/cold_start")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--cold-pools", default="", help="JOB=POOL,... : other pools for the cold runs (e.g. cnn=96MiB)")
    ap.add_argument("--allocation-wait-ms", type=int, default=None,
                    help="run.allocation_wait_ms for both runs (0: an allocation that does not fit fails at once, "
                         "as on a device without the pool's waits; Note [Waiting for frees])")
    args = ap.parse_args()
    cold_pools = dict(item.split("=") for item in args.cold_pools.split(",") if item)
    from tensile_tf.tf.calibration import predictor_path

    cache = predictor_path()
    print(f"cold-start latencies: {'learned (' + str(cache) + ')' if cache.exists() else 'bytes touched (no cache)'}")
    print("\n| job | pools (unplanned / cold) | cold plan | first iteration EOR | cold plan EOR | "
          "EOR after re-plan (switched at) | planning |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.jobs.split(","):
        spec, roomy, small = JOBS[name]
        small = cold_pools.get(name, small)
        vanilla = run(Path(args.out) / name / "unplanned", name, spec, roomy, "none", args.steps, args.allocation_wait_ms)
        cold = run(Path(args.out) / name / "cold", name, spec, small, "tensile", args.steps, args.allocation_wait_ms)
        (v,), (c,) = vanilla["jobs"], cold["jobs"]
        if v["status"] != "finished" or c["status"] != "finished":
            print(f"| {name} | {roomy} / {small} | unplanned {v['status']}, cold {c['status']}: "
                  f"{(c['error'] or v['error'] or '')[:120]} | | | | |")
            continue
        plan = c["plan"]
        vs, cs = v["step_seconds"], c["step_seconds"]
        v_median = statistics.median(vs[1:])
        switched = sorted(x["switched_at_step"] for r in cold["planner"]["replans"] if r["error"] is None
                          for x in r["jobs"] if x["switched_at_step"] is not None)
        k = switched[0] if switched else len(cs)
        cold_eor = statistics.median(cs[1:k]) / v_median if k > 1 else None
        after = statistics.median(cs[k:]) / v_median if k < len(cs) else None
        first_planning = cold["planner"]["plans"][0]["planning_s"] if cold["planner"]["plans"] else 0.0
        print(f"| {name} | {roomy} / {small} | {'cold' if plan['cold_start'] else 'NOT cold'}, "
              f"{plan['swap_outs']} swaps, {plan['recomputes']} recomputations (last plan) | "
              f"{cs[0] / vs[0]:.2f} ({cs[0]:.2f} s / {vs[0]:.2f} s) | "
              f"{'-' if cold_eor is None else f'{cold_eor:.2f}'} | "
              f"{'-' if after is None else f'{after:.2f}'} ({k if switched else 'no re-plan'}) | "
              f"{first_planning * 1e3:.0f} ms |")
        print(f"  {name}: unplanned median step {v_median * 1e3:.0f} ms; peaks unplanned "
              f"{v['training_peak_pool_bytes'] / 2**20:.0f} MiB, cold {c['training_peak_pool_bytes'] / 2**20:.0f} MiB; "
              f"losses identical: {v['losses'] == c['losses']}", flush=True)


if __name__ == "__main__":
    main()
