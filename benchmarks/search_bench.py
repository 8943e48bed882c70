"""Trials finished per hour for a small search, three ways, same trials:

  packed      tensile's SearchDriver: trials run concurrently on one pool,
              as many as admission "sum" allows (sum of P + T fits; safe for
              free-running jobs), at most --jobs
  packed-planned  packed with the planner on (issue 58): a trial that does not fit beside the
              running ones is planned together with them (Note [Joint re-plan on arrival])
  packed-nocores  packed without core admission (Note [Admitting by the cores]
              in tensile_tf/runtime/core_meter.py: no trial starts beside
              running ones while they keep the cores busy)
  packed-salus  the same with Salus admission (sum P + max T): packs more,
              but free-running trials' temporaries can peak together; a
              trial that runs out of memory beside others is re-queued
  sequential  the same driver, one trial at a time (max_concurrent=1)
  optuna      Optuna's own study.optimize(n_jobs=--jobs): threads that each
              build and train a trial, with no admission control, on the
              same pool ("full": the whole space, may run out of memory)
  optuna-cap  the same threads with the batch sizes cut to those whose
              peak fits pool / n_jobs (the per-trial limit that avoids OOM
              without admission control; a smaller search space)

Every mode runs in its own process with its own pool of --pool bytes and
evaluates the same list of trials (enqueued in the same order; optuna-cap
drops the ones above its limit). A trial is finished when COMPLETE.

    PYTHONPATH=. python benchmarks/search_bench.py --json /tmp/search_bench.json
    PYTHONPATH=. python benchmarks/search_bench.py --mode packed     # one mode, prints JSON
    SEARCH_BENCH_MODEL=mlp PYTHONPATH=. python benchmarks/search_bench.py --pool 256MiB   # the MLP trials
    SEARCH_BENCH_MODEL=io PYTHONPATH=. python benchmarks/search_bench.py --pool 256MiB    # trials waiting on data
    SEARCH_BENCH_MODEL=io-mem PYTHONPATH=. python benchmarks/search_bench.py --pool 48MiB --jobs 4 \
        --modes packed-planned,packed,optuna,sequential    # memory-bound: fit two unplanned, four planned
    SEARCH_BENCH_PREFETCH=1 ...   # io-mem: the loader prepares one batch ahead while the step runs
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODELS = {
    # compute-bound on 2 cores: a step at batch 1024 keeps both cores busy
    "cnn": ({"name": "cnn", "model": {"builder": "tensile_tf.jobs.zoo:small_cnn", "args": {"filters": [16, 32]}},
             "input_shape": [32, 32, 3], "classes": 10, "optimizer": {"name": "adam"},
             "data": {"num_batches": 2}, "steps": 30, "seed": 1}, [32, 128, 512, 1024]),
    # overhead-bound: milliseconds a step, much of it per-step Python and dispatch
    "mlp": ({"name": "mlp", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [256, 256]}},
             "input_shape": [784], "classes": 10, "optimizer": {"name": "adam"},
             "data": {"num_batches": 2}, "steps": 300, "seed": 1}, [32, 128, 512, 2048]),
    # stalled on data: each batch arrives 20 ms after it is asked for (benchmarks/search_bench_data.py),
    # the cores idle meanwhile, as with a loader on network storage
    "io": ({"name": "io", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [128]}},
            "input_shape": [64], "classes": 10, "optimizer": {"name": "adam"},
            "data": {"kind": "function", "function": "benchmarks.search_bench_data:digits_with_latency",
                     "args": {"latency_ms": 20}}, "steps": 100, "seed": 1}, [16, 32, 64, 128]),
    # memory-bound and stalled on data (issue 58): a deep MLP (12 x 256, batch 1024, SGD: few
    # persistent bytes, 0.25 MiB batches) whose activations a plan moves out (`tensile plan`: 20.2
    # MiB unplanned, 3.5 MiB planned alone), each batch 200 ms late, as from a slow loader; a 48 MiB
    # pool holds two unplanned, four planned
    "io-mem": ({"name": "iomem", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [256] * 12}},
                "input_shape": [64], "classes": 10, "optimizer": {"name": "sgd"},
                "data": {"kind": "function", "function": "benchmarks.search_bench_data:wide_with_latency",
                         "args": {"latency_ms": 200, "input_dim": 64,
                                  "prefetch": int(os.environ.get("SEARCH_BENCH_PREFETCH", "0"))}},
                "steps": 30, "seed": 1}, [1024]),
}
MODEL = os.environ.get("SEARCH_BENCH_MODEL", "cnn")
BASE_JOB, BATCHES = MODELS[MODEL]
# SGD on the wide random batches diverges (non-finite loss) at 3e-3 and above
RATES = [1e-4, 3e-4, 1e-3] if MODEL == "io-mem" else [3e-4, 3e-3, 1e-2]


def trial_params(n: int) -> list[dict]:
    """n trials cycling through every (batch, lr) pair, big and small mixed."""
    grid = list(itertools.product(BATCHES, RATES))
    order = [grid[(i * 5) % len(grid)] for i in range(len(grid))]
    return [{"batch_size": b, "optimizer.learning_rate": lr} for b, lr in itertools.islice(itertools.cycle(order), n)]


def space():
    from optuna.distributions import CategoricalDistribution

    return {"batch_size": CategoricalDistribution(BATCHES), "optimizer.learning_rate": CategoricalDistribution(RATES)}


def run_mode(mode: str, pool: str, jobs: int, n_trials: int, cap_batch: int | None) -> dict:
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    tensile_tf.configure_pool(tensile_tf.parse_bytes(pool))
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    params = trial_params(n_trials)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    t0, c0 = time.perf_counter(), time.process_time()
    requeued = 0
    extra: dict = {}
    if mode in ("packed", "packed-planned", "packed-salus", "packed-nocores", "sequential"):
        from tensile_tf.runtime import JobHost
        from tensile_tf.search import run_search

        for p in params:
            study.enqueue_trial(p)
        planner = {"planner": "tensile"} if mode == "packed-planned" else {}
        host = JobHost(admission="salus" if mode == "packed-salus" else "sum", **planner)
        result = run_search(study, BASE_JOB, space(), n_trials=len(params), host=host,
                            max_concurrent=1 if mode == "sequential" else jobs,
                            admit_by_cores=mode != "packed-nocores")
        requeued = len(result.requeued)
        extra = {"time_breakdown": result.time_breakdown, "core_waits": result.core_waits,
                 "core_gains": result.core_gains,
                 "most_at_once": result.host_result.most_jobs_running,
                 # trials that trained an ended trial's traced step (Note [Reusing a finished job's traced step])
                 "traced_steps_reused": sum(s.traced_step_from is not None for s in host.states),
                 "replans": len(host.replanner.records) if host.replanner is not None else 0,
                 # what asked for each re-plan (arrival, departure, latency drift) and how it ended
                 "replan_kinds": dict(Counter(_replan_kind(r) for r in host.replanner.records))
                 if host.replanner is not None else {},
                 # trials the planner did not capture: the pool held them (Note [Captures a plan needs])
                 "plans_deferred": sum(s.plan_deferred is not None for s in host.states),
                 # why a trial failed (a lost trial is a goal's failure: the reason is part of the figure)
                 "errors": sorted({f"{s.status.value} ({s.error_type}), admitted {s.admitted_at_s is not None}, beside "
                                   f"{_beside(s, host.states)} trial(s): {_error_line(s.error)}"
                                   for s in host.states if s.error})[:4]}
    else:
        import tensorflow as tf

        from tensile_tf.jobs.job import build_train_step
        from tensile_tf.search.config import trial_job_spec
        from tensile_tf.search.objective import metric_value
        from tensile_tf.runtime import StepRecord

        if mode == "optuna-cap":
            params = [p for p in params if p["batch_size"] <= cap_batch]
        for p in params:
            study.enqueue_trial(p)
        errors: list[str] = []
        # the same phases as Note [Where a trial's time goes], summed over the threads' trials
        phases = {"build": 0.0, "first_step": 0.0, "data": 0.0, "steps": 0.0}

        def objective(trial):
            p = {k: trial.suggest_categorical(k, d.choices) for k, d in space().items()}
            spec = trial_job_spec(BASE_JOB, p, f"t{trial.number}")
            try:
                t = time.perf_counter()
                train = build_train_step(spec)
                step = tf.function(train.step_fn, jit_compile=False)
                phases["build"] += time.perf_counter() - t
                records = []
                for i in range(spec.total_steps):
                    t = time.perf_counter()
                    batch = train.next_batch()
                    t1 = time.perf_counter()
                    loss = float(tf.reduce_mean(step(*batch)))
                    records.append(StepRecord(i, 0.0, time.perf_counter() - t1, loss))
                    phases["data"] += t1 - t
                    phases["first_step" if i == 0 else "steps"] += time.perf_counter() - t1
                return metric_value("final_loss", records, spec.batch_size)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                raise

        study.optimize(objective, n_trials=len(params), n_jobs=jobs, catch=(Exception,))
        extra = {"time_breakdown": {k: round(v, 6) for k, v in phases.items()}}
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = tensile_tf.pool_stats()
    trials = study.get_trials()
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if requeued:  # retried trials: count each point once
        trials = [t for t in trials if "tensile_interrupted" not in t.user_attrs]
    out = {"mode": mode, "pool": pool, "jobs": jobs, "trials": len(trials), "complete": len(done),
           "failed": sum(t.state == optuna.trial.TrialState.FAIL for t in trials),
           "wall_s": wall, "trials_per_hour": len(done) / wall * 3600, "pool_peak": stats["peak"],
           # every thread's CPU time: the share of the usable cores kept busy, and what a finished trial cost
           "cpu_s": cpu, "cores_busy": cpu / wall / len(os.sched_getaffinity(0)),
           "cpu_s_per_trial": cpu / max(1, len(done)),
           "pool_ooms": stats.get("num_ooms"), "requeued": requeued,
           "batches_run": sorted({t.params.get("batch_size") for t in done}),
           # each enqueued trial's objective, in enqueue order: equal across modes where packing computes alike
           "values": [t.value for t in sorted(trials, key=lambda t: t.number)],
           # and its parameters: a re-queued trial runs again under a later number
           "scores": [[json.dumps(t.params, sort_keys=True), t.value] for t in sorted(trials, key=lambda t: t.number)],
           **extra}
    if mode.startswith("optuna"):
        out["errors"] = sorted(set(errors))[:4]
    return out


def measure_peaks(pool: str) -> dict[int, int]:
    """Each batch size's P + T on the pool, as the host measures them (one probe each)."""
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    tensile_tf.configure_pool(tensile_tf.parse_bytes(pool))
    from tensile_tf.config.schema import JobSpec
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs.job import Job

    host = JobHost(concurrency=1)
    states = [host.submit(Job.from_spec(JobSpec.model_validate({**BASE_JOB, "name": f"b{b}", "batch_size": b,
                                                                "steps": 1}))) for b in BATCHES]
    host.run()
    return {b: (s.persistent_bytes or 0) + (s.temporary_bytes or 0) for b, s in zip(BATCHES, states)}


def _error_line(error: str) -> str:
    """An error's first 200 characters, and who held the pool at the failed allocation and when
    the failure was recorded (Note [What held the pool] in tensile_tf/runtime/failures.py)."""
    line = str(error).splitlines()[0]
    parts = [line[:200]]
    at = line.find("; held by ")
    if at > 200:
        parts.append(line[at + 2:].split(")")[0])
    then = line.rfind("(held then: ")
    if then > 200:
        parts.append(line[then:])
    return " ... ".join(parts)


def _replan_kind(record) -> str:
    """``arrival``, ``departure``, ``latency drift`` (the events that asked), with how it ended."""
    kinds = sorted({e.split(" of ")[0] for e in (record.events or [record.reason])})
    ended = "skipped" if record.skipped else "failed" if record.error else "made"
    return f"{'+'.join(kinds)} {ended}"


def _beside(s, states) -> int:
    """How many other trials held pool memory while trial ``s`` was admitted: the search driver's
    own count (Note [Neighbours before their admission] in tensile_tf/search/trials.py)."""
    from tensile_tf.search.trials import trials_beside

    return len(trials_beside(s, states))


def _parse_bytes(text: str) -> int:
    """'640MiB' -> bytes, without importing TensorFlow into the parent."""
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "B": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def _child(args: list[str], timeout_s: float | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TENSILE_POOL_BYTES", None)
    try:
        proc = subprocess.run([sys.executable, __file__, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:   # a mode that hangs (Optuna's threads on a full pool) is reported
        return {"mode": args[1], "crashed": True, "rc": f"timed out after {timeout_s:.0f} s",
                "stderr": (e.stderr or b"")[-1500:].decode(errors="replace") if isinstance(e.stderr, bytes)
                else (e.stderr or "")[-1500:]}
    for line in reversed(proc.stdout.splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {"mode": args, "crashed": True, "rc": proc.returncode, "stderr": proc.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["packed", "packed-planned", "packed-salus", "packed-nocores", "sequential",
                                        "optuna", "optuna-cap", "peaks"])
    ap.add_argument("--pool", default="640MiB")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--cap-batch", type=int, default=None, help="optuna-cap: largest batch size run")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--mode-timeout", type=float, default=900.0, help="seconds a mode may run before it is reported hung")
    ap.add_argument("--modes", default="packed,packed-nocores,packed-salus,sequential,optuna,optuna-cap",
                    help="the modes to run, in order (without --mode)")
    args = ap.parse_args()
    if args.mode == "peaks":
        print(json.dumps({str(k): v for k, v in measure_peaks(args.pool).items()}))
        return
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.pool, args.jobs, args.trials, args.cap_batch)))
        return

    common = ["--pool", args.pool, "--jobs", str(args.jobs), "--trials", str(args.trials)]
    peaks = {int(k): v for k, v in _child(["--mode", "peaks", "--pool", args.pool]).items()
             if k.isdigit()}
    capacity = _parse_bytes(args.pool)
    fitting = [b for b in BATCHES if peaks.get(b, capacity) <= capacity / args.jobs]
    cap = max(fitting) if fitting else min(BATCHES)
    results = {"peaks": peaks, "cap_batch": cap, "modes": []}
    for mode in args.modes.split(","):
        extra = ["--cap-batch", str(cap)] if mode == "optuna-cap" else []
        r = _child(["--mode", mode, *common, *extra], timeout_s=args.mode_timeout)
        results["modes"].append(r)
        print(json.dumps(r), flush=True)
    print(f"\npool {args.pool}, {args.trials} trials of {BASE_JOB['name']} (steps {BASE_JOB['steps']}), "
          f"jobs {args.jobs}; P+T by batch: " + ", ".join(f"{b}: {v / 2**20:.0f} MiB" for b, v in peaks.items()))
    print(f"{'mode':<12} {'complete':>8} {'failed':>6} {'wall s':>8} {'trials/h':>9} {'pool peak':>10} {'OOMs':>5} "
          f"{'re-queued':>9} {'cores busy':>10} {'CPU s/trial':>11}")
    for r in results["modes"]:
        if r.get("crashed"):
            print(f"{str(r['mode']):<12} crashed rc={r['rc']}: {r['stderr'][-300:]}")
            continue
        print(f"{r['mode']:<12} {r['complete']:>8} {r['failed']:>6} {r['wall_s']:>8.1f} "
              f"{r['trials_per_hour']:>9.0f} {r['pool_peak'] / 2**20:>7.0f} MiB {r['pool_ooms']!s:>5} "
              f"{r.get('requeued', 0):>9} {r['cores_busy']:>10.0%} {r['cpu_s_per_trial']:>11.2f}")
    reference = next((r for r in results["modes"] if r.get("mode") == "sequential" and not r.get("crashed")), None)
    if reference is not None:   # every trial's score against its one-at-a-time run
        for r in results["modes"]:
            if not r.get("crashed") and r is not reference and not r["mode"].startswith("optuna"):
                # by parameters (every trial has the same seed): a re-queued trial ran under a later number
                seen: dict[str, set] = {}
                for params, value in reference["scores"]:
                    if value is not None:
                        seen.setdefault(params, set()).add(value)
                both = [(params, value) for params, value in r["scores"] if value is not None and params in seen]
                r["scores_equal"] = sum(value in seen[params] for params, value in both)
                print(f"  {r['mode']:<14} scores equal to sequential's: {r['scores_equal']} of the "
                      f"{len(both)} both completed")
    print("\nwhere the trials' time went (seconds summed over trials; Note [Where a trial's time goes]):")
    for r in results["modes"]:
        if r.get("time_breakdown"):
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["time_breakdown"].items() if v >= 0.05)
            more = (f"; most at once {r['most_at_once']}, core waits {r['core_waits']}, gains by trials at once "
                    f"{r.get('core_gains')}, traced steps reused {r.get('traced_steps_reused')}") if "core_waits" in r else ""
            print(f"  {r['mode']:<14} {parts}{more}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
