"""One `tensile run` of a config document in a fresh process (one device
pool per process), for the benchmarks that compare runs: writes
OUT/config.yaml, logs the console to OUT/console.log, returns results.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def run_config(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    with open(out / "console.log", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "tensile_tf", "run", str(cfg), "--out", str(out)],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    results = out / "results.json"
    if not results.exists():
        raise SystemExit(f"{out}: tensile run exited {proc.returncode} without results.json; see {out / 'console.log'}")
    return json.loads(results.read_text())
