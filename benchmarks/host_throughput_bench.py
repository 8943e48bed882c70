"""Issue 3 benchmark: aggregate throughput and pool peak of N concurrent jobs
in one process (spatial sharing), against the same jobs one after another
(temporal sharing) and against N processes with a pool of capacity/N each
(static partitioning).

    python benchmarks/host_throughput_bench.py [--config configs/quickstart.yaml]
        [--pool 128MiB] [--steps-scale 0.25]

Each mode runs in fresh interpreters (one device pool per process). Throughput
is total training steps of all jobs divided by the wall time of the mode.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import tensorflow as tf
import tensile_tf
tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tensile_tf.config.schema import load_config
from tensile_tf.runtime import JobHost
from tensile_tf.jobs.job import Job
cfg = load_config({config!r})
names = {names!r}
host = JobHost({pool!r}, concurrency={concurrency!r}, admission={admission!r})
for spec in cfg.jobs:
    if spec.name in names:
        host.submit(Job.from_spec(spec.model_copy(update={{"steps": max(2, int(spec.total_steps * {scale!r}))}})))
t = time.perf_counter()
r = host.run()
print(json.dumps({{"wall_s": time.perf_counter() - t, "peak": r.pool.peak,
                  "jobs": [{{"name": s.name, "status": s.status.value, "steps": s.steps_done,
                            "error": (s.error or "")[:160]}} for s in r.jobs]}}))
"""


def child(config, names, pool, concurrency, scale, admission="salus"):
    code = CHILD.format(config=str(config), names=list(names), pool=pool, concurrency=concurrency, scale=scale,
                        admission=admission)
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"}
    env["PYTHONPATH"] = str(REPO)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def result(proc):
    out, _ = proc.communicate()
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    raise RuntimeError(f"child produced no result (rc={proc.returncode})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    ap.add_argument("--pool", default="128MiB", help="pool capacity C shared by all jobs")
    ap.add_argument("--steps-scale", type=float, default=0.25, help="fraction of each job's configured steps")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from tensile_tf.config.schema import load_config
    from tensile_tf.tf.pool import parse_bytes

    cfg = load_config(args.config)
    names = [j.name for j in cfg.jobs]
    n = len(names)
    capacity = parse_bytes(args.pool)
    rows = []

    for admission in ("salus", "sum"):
        t = time.perf_counter()
        spatial = result(child(args.config, names, capacity, None, args.steps_scale, admission))
        rows.append((f"concurrent ({admission}), pool C", time.perf_counter() - t, spatial["peak"],
                     spatial["jobs"]))

    t = time.perf_counter()
    temporal = result(child(args.config, names, capacity, 1, args.steps_scale))
    rows.append(("one after another, pool C", time.perf_counter() - t, temporal["peak"], temporal["jobs"]))

    t = time.perf_counter()
    procs = [child(args.config, [name], capacity // n, None, args.steps_scale) for name in names]
    static = [result(p) for p in procs]
    rows.append((f"{n} processes, pool C/{n} each", time.perf_counter() - t, max(s["peak"] for s in static),
                 [j for s in static for j in s["jobs"]]))

    print(f"pool C = {args.pool}, {n} jobs ({', '.join(names)}), steps x{args.steps_scale}")
    print(f"{'mode':<30} {'wall s':>8} {'steps':>7} {'steps/s':>8} {'peak MiB':>9}  failed jobs")
    for mode, wall, peak, jobs in rows:
        steps = sum(j["steps"] for j in jobs)
        failed = [f"{j['name']} ({j['error'][:60]})" for j in jobs if j["status"] != "finished"]
        print(f"{mode:<30} {wall:>8.1f} {steps:>7} {steps / wall:>8.1f} {peak / 2**20:>9.1f}  "
              f"{'; '.join(failed) or '-'}")


if __name__ == "__main__":
    main()
