"""The example configs in configs/ run as shipped, shortened (fewer steps,
earlier arrivals): a user who copies one gets a run that finishes."""
import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import tensile

REPO = Path(__file__).resolve().parents[2]


def _shortened(name: str, tmp_path: Path, steps: dict[str, int], **job_updates) -> Path:
    doc = yaml.safe_load((REPO / "configs" / name).read_text())
    for job in doc["jobs"]:
        job["steps"] = steps[job["name"]]
        job.update(job_updates.get(job["name"], {}))
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("name, steps, updates", [
    ("digits.yaml", {"mlp": 40, "cnn": 40}, {"mlp": {"validate_every": 20}, "cnn": {"validate_every": 20}}),
    ("arrivals.yaml", {"long": 60, "late": 10}, {"late": {"arrive_at_s": 0.01}}),
])
def test_example_config_runs_shortened(tmp_path, name, steps, updates):
    cfg = _shortened(name, tmp_path, steps, **updates)
    out = tmp_path / "out"
    proc = tensile("run", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [j["status"] for j in results["jobs"]] == ["finished"] * len(steps)
    if name == "digits.yaml":
        assert all(j["validation"][-1]["metrics"]["accuracy"] > 0.3 for j in results["jobs"]), results["jobs"]
        assert all((out / j["model_path"]).exists() for j in results["jobs"])
    else:
        assert any(r["reason"] == "arrival of late" and r["error"] is None for r in results["planner"]["replans"])
