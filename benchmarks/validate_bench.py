"""How long ``tensile validate`` takes on a config of many jobs (issue 57 item 6: 50,000 jobs in
under 10 s). Generates mlp jobs in block style (8 lines a job, the issue's kind of config),
runs ``tensile validate`` in a fresh process each time, and prints each run's wall time.

    PYTHONPATH=. python benchmarks/validate_bench.py --jobs 50000 --repeats 2
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_config(path: Path, jobs: int) -> int:
    """A config of ``jobs`` mlp jobs; its number of lines."""
    lines = ["pool: 4GiB", "jobs:"]
    for i in range(jobs):
        lines += [f"  - name: job{i}", "    model:", "      builder: tensile_tf.jobs.zoo:mlp", "    input_shape:",
                  "      - 784", "    batch_size: 32", "    steps: 10", f"    seed: {i}"]
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"jobs{args.jobs}.yaml"
        n = write_config(path, args.jobs)
        print(f"{args.jobs} jobs, {n} lines")
        for r in range(args.repeats):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", "import sys; from tensile_tf.cli import main; sys.exit(main())",
                                   "validate", str(path)],
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            if done.returncode != 0:
                print(done.stdout + done.stderr)
                return done.returncode
            print(f"run {r + 1}: {seconds:.2f} s  ({done.stdout.strip()[-60:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
