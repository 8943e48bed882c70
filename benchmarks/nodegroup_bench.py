"""Issue 6 benchmark: memory sharing efficiency of the node-group pipeline
(seed 004 §5.2, Table 1).

Sharing efficiency = the largest batch each of N identical concurrent jobs
reaches in a pool of capacity C, divided by the largest batch one job reaches
alone in C. Batches are found by doubling, then binary search. Modes:

* ``sole``: one job alone in C (the denominator);
* ``sole_barriers``: one job alone in C with its node-group barriers (per
  ``--split``): alone it pairs with nobody, but the barriers still make its
  groups run in order, which can lower its own peak; this tells that effect
  apart from the sharing between jobs;
* ``static``: static split, one job alone in C / N (what each job gets);
* ``free``: N jobs free-running in one shared pool of C;
* ``nodegroup``: N jobs in C with the node-group pipeline (``split_size``);
* ``hybrid``: the node-group pipeline plus the TENSILE planner (``planner:
  tensile``; the plan is made on the step with its barriers; a job whose
  vanilla first step does not fit is planned cold, Note [Cold-start planning]
  in tensile_tf/runtime/planning.py).

Every trial is a fresh interpreter (its own pool) that trains ``--steps``
steps of each job; a trial succeeds when every job finishes and all N jobs
trained at the same time (Note [Concurrent trials]).

Note [Concurrent trials]. With ``admission: none`` a job whose first step
does not fit beside the others is queued and retried when one ends, so two
jobs that each need almost the whole pool finish one after the other. Until
the eighth session such a trial counted as a success: 2 Transformer jobs at
batch 56 in 64 MiB (each alone needs 62.4 of the 64 MiB) "passed" when the
second started after the first ended. Now the child reports the run's
``most_jobs_running`` (results.json), and a trial of N jobs succeeds only
when that is N.

Note [Edge batches are races]. A job's inter-op threads order its kernels
differently run to run, so its peak and the pool's fragmentation move: one
small CNN job alone in 120 MiB passed at batch 54 in 1 of 3 trials, and its
"largest batch" came out 51, 54 and 57 on one day (benchmarks/RESULTS.md,
ninth session). One trial per batch thus puts about +-5% into every ratio,
the sole denominator included. ``--repeats N`` counts a batch as trainable
only when all N trials pass.

Note [Checking an edge]. A search is the way to find a row's largest batch,
but it costs a trial per halving, and at the final commit a row only needs
to show that its claimed batch still trains and the batch above it still
does not. ``--check B [B ...]`` runs every repeat at each listed batch (no
search, no early stop) and prints how many passed; the row reads "B passed
k of R". A check proves a lower bound (all repeats passed) or, for the sole
denominator, an upper bound (a repeat failed); it is not a search, so
RESULTS.md says which one a cell is.

    PYTHONPATH=. python benchmarks/nodegroup_bench.py --model transformer --pool 160MiB --jobs 2 4 \\
        [--split 4MiB 16MiB auto] [--repeats 3] [--json out.json]
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

MODELS = {
    # name: (JobSpec model, input shape, optimizer); reduced resolution for a 2-core CPU.
    "resnet50": ({"application": "ResNet50"}, [32, 32, 3], "sgd"),
    "inceptionv3": ({"application": "InceptionV3"}, [75, 75, 3], "sgd"),
    "small_cnn": ({"builder": "tensile_tf.jobs.zoo:small_cnn", "args": {"filters": [32, 64]}}, [64, 64, 3], "sgd"),
    "transformer": ({"builder": "tensile_tf.jobs.zoo:transformer_encoder",
                     "args": {"heads": 4, "layers_count": 2, "ff_dim": 256}}, [64, 128], "adam"),
}

CHILD = """
import json, sys
import tensile_tf
tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tensile_tf.config.schema import JobSpec
from tensile_tf.runtime import JobHost
from tensile_tf.jobs.job import Job
host = JobHost({pool!r}, admission="none", pipeline={pipeline!r}, split_size={split!r}, barrier_timeout_s=300,
               planner={planner!r})
for i in range({jobs}):
    host.submit(Job.from_spec(JobSpec.model_validate(dict(name=f"j{{i}}", model={model!r},
        input_shape={shape!r}, batch_size={batch}, steps={steps}, seed=i, data={{"num_batches": {num_batches}}},
        optimizer={{"name": {opt!r}, "learning_rate": 0.001}}))))
r = host.run()
# Note [Concurrent trials]: the most jobs the host had training at one time.
print(json.dumps({{"finished": all(s.status.value == "finished" for s in r.jobs), "together": r.most_jobs_running,
                  "peak": r.pool.peak, "errors": [(s.error or "")[:200] for s in r.jobs if s.error]}}))
"""


def trial(model: str, pool: str, jobs: int, batch: int, pipeline: str, split: str, steps: int,
          planner: str = "none", num_batches: int = 4) -> dict:
    spec, shape, opt = MODELS[model]
    code = CHILD.format(pool=pool, pipeline=pipeline, split=split, jobs=jobs, model=spec, shape=shape,
                        batch=batch, steps=steps, opt=opt, planner=planner, num_batches=num_batches)
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    out = {"ok": False, "error": proc.stderr[-300:]}
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            out = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    out["seconds"] = time.perf_counter() - t
    # Note [Concurrent trials]
    out["ok"] = bool(out.get("finished")) and out.get("together", 0) == jobs
    return out


def max_batch(fn, start: int, log, resolution: int = 16) -> int:
    """Largest b with fn(b) true: doubling from `start`, then binary search
    down to 1/`resolution` of the batch (0: to one sample)."""
    lo, hi = 0, None
    b = start
    while hi is None:
        if fn(b):
            lo, b = b, b * 2
        else:
            hi = b
        if b > 4096:
            return lo
    while hi - lo > max(1, lo // resolution if resolution else 1):  # 16: 1/16 of the batch (6%)
        mid = (lo + hi) // 2
        if fn(mid):
            lo = mid
        else:
            hi = mid
    return lo


def parse_bytes(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--pool", required=True, help="capacity C, e.g. 160MiB")
    ap.add_argument("--jobs", type=int, nargs="+", default=[2])
    ap.add_argument("--split", nargs="+", default=["auto"], help="split_size values for the nodegroup mode")
    ap.add_argument("--modes", nargs="+", default=["sole", "static", "free", "nodegroup", "hybrid"],
                    choices=["sole", "sole_barriers", "static", "free", "nodegroup", "hybrid"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--num-batches", type=int, default=4,
                    help="distinct synthetic batches each job keeps in the pool and cycles through (data.num_batches); "
                         "they count in its persistent bytes")
    ap.add_argument("--start", type=int, default=8, help="first batch tried")
    ap.add_argument("--repeats", type=int, default=1,
                    help="trials per batch; a batch counts as trainable only when every one passes "
                         "(Note [Edge batches are races])")
    ap.add_argument("--resolution", type=int, default=16,
                    help="stop the binary search within 1/N of the batch (default 16, 6%%; 0: to one sample)")
    ap.add_argument("--check", type=int, nargs="+", metavar="BATCH",
                    help="instead of searching, run every repeat at each of these batches and report how many "
                         "passed (Note [Checking an edge])")
    ap.add_argument("--json", help="append results (one JSON object per line) here")
    args = ap.parse_args()
    cap = parse_bytes(args.pool)
    trials: list[dict] = []

    def search(label, jobs, pool, pipeline, split, planner="none"):
        def ok(b, stop_at_failure=True):
            passed = True
            for attempt in range(1, args.repeats + 1):  # Note [Edge batches are races]
                r = trial(args.model, pool, jobs, b, pipeline, split, args.steps, planner, args.num_batches)
                trials.append({"label": label, "batch": b, "attempt": attempt, **r})
                why = "" if r["ok"] else ("  not concurrent: at most %d of %d jobs at once" % (r.get("together", 0), jobs)
                                          if r.get("finished") else
                                          f"  {(r.get('errors') or [r.get('error', '')])[0][:120]!r}")
                tag = f" [{attempt}/{args.repeats}]" if args.repeats > 1 else ""
                print(f"  {label:<24} batch {b:>5}{tag}: {'ok ' if r['ok'] else 'no '} ({r['seconds']:.0f} s){why}",
                      flush=True)
                if not r["ok"]:
                    passed = False
                    if stop_at_failure:
                        return False
            return passed
        if args.check:  # Note [Checking an edge]
            passing = [b for b in args.check if ok(b, stop_at_failure=False)]
            for b in args.check:
                k = sum(1 for t in trials if t["label"] == label and t["batch"] == b and t["ok"])
                print(f"  {label:<24} batch {b:>5}: passed {k} of {args.repeats}", flush=True)
            return max(passing, default=0)
        return max_batch(ok, args.start, None, args.resolution)

    results = {"model": args.model, "pool": args.pool, "steps": args.steps, "num_batches": args.num_batches,
               "repeats": args.repeats,
               "modes": {}}
    sole = None
    if "sole" in args.modes:
        sole = search("sole", 1, args.pool, "none", "auto")
        results["modes"]["sole"] = sole
        print(f"{args.model}: sole max batch in {args.pool}: {sole}", flush=True)
    if "sole_barriers" in args.modes:
        for split in args.split:
            best = search(f"sole+barriers[{split}]", 1, args.pool, "nodegroup", split)
            results["modes"][f"sole_barriers[{split}]"] = best
            print(f"{args.model}: sole max batch with barriers[{split}] in {args.pool}: {best}", flush=True)
    for n in args.jobs:
        row = {}
        if "static" in args.modes:
            row["static"] = search(f"static C/{n}", 1, str(cap // n), "none", "auto")
        if "free" in args.modes:
            row["free"] = search(f"free x{n}", n, args.pool, "none", "auto")
        if "nodegroup" in args.modes:
            for split in args.split:
                row[f"nodegroup[{split}]"] = search(f"nodegroup[{split}] x{n}", n, args.pool, "nodegroup", split)
        if "hybrid" in args.modes:
            for split in args.split:
                row[f"hybrid[{split}]"] = search(f"hybrid[{split}] x{n}", n, args.pool, "nodegroup", split, "tensile")
        results["modes"][f"x{n}"] = row
        if sole:
            eff = {k: (f"{v / sole:.1%}" if isinstance(v, int) else v) for k, v in row.items()}
            print(f"{args.model} x{n}: max batch {row}; efficiency vs sole {sole}: {eff}", flush=True)
    results["trials"] = trials
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
