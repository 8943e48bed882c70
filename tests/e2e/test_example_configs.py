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
    # admission decides at the probes which jobs wait: a few steps each show it
    ("quickstart.yaml", {"cnn-a": 6, "mlp-b": 6, "resnet-c": 4, "transformer-d": 4}, {}),
    ("digits.yaml", {"mlp": 40, "cnn": 40}, {"mlp": {"validate_every": 20}, "cnn": {"validate_every": 20}}),
    ("arrivals.yaml", {"long": 30, "late": 10}, {"late": {"arrive_at_s": 0.01}}),
    ("planner.yaml", {"encoder-a": 8, "encoder-b": 8}, {}),
    ("hybrid.yaml", {"encoder-a": 4, "encoder-b": 4}, {}),
    ("nodegroup.yaml", {"cnn-a": 4, "cnn-b": 4}, {}),
    # three keras.applications models at 96x96: 90 s on 2 cores even shortened (made for bigger machines)
    pytest.param("large_models.yaml", {"resnet50": 2, "inception-v3": 2, "densenet121": 2}, {},
                 marks=pytest.mark.slow),
])
def test_example_config_runs_shortened(tmp_path, name, steps, updates):
    cfg = _shortened(name, tmp_path, steps, **updates)
    out = tmp_path / "out"
    proc = tensile("run", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    jobs = results["jobs"]
    assert [j["status"] for j in jobs] == ["finished"] * len(steps)
    assert all((out / j["model_path"]).exists() for j in jobs)
    if name == "quickstart.yaml":
        # the point of the quickstart: the pool holds three of the four, so one waits for another to end
        waited = [j for j in jobs if j["admitted_at_s"] >= min(o["ended_at_s"] for o in jobs if o is not j)]
        assert waited, [(j["name"], j["admitted_at_s"], j["ended_at_s"]) for j in jobs]
        # and the summary says how many trained at once (what results.json records)
        most = results["most_jobs_running"]
        words = " ".join(proc.stdout.split())   # rich may wrap the table's title
        assert 1 <= most < len(jobs) and f"at most {most} of {len(jobs)} jobs at once" in words, proc.stdout[-2000:]
    elif name == "digits.yaml":
        assert all(j["validation"][-1]["metrics"]["accuracy"] > 0.3 for j in jobs), jobs
    elif name == "arrivals.yaml":
        replans = results["planner"]["replans"]
        late = next(j for j in jobs if j["name"] == "late")
        assert any(r["reason"] == "arrival of late" and r["error"] is None for r in replans), (
            [(r["reason"], r["error"], r["budget_bytes"]) for r in replans], late["waits"])
    elif name in ("planner.yaml", "hybrid.yaml"):
        # both trained together under one plan that moves tensors (the pool holds them only so)
        start = results["planner"]["plans"][0]
        assert start["budget_met"] and sum(start["swap_outs"].values()) + sum(start["recomputes"].values()) > 0, start
        assert all(j["admitted_at_s"] < min(o["ended_at_s"] for o in jobs) for j in jobs)
    if name in ("nodegroup.yaml", "hybrid.yaml"):
        # the two jobs' node groups were paired, and their barriers made one wait for the other
        pipeline = results["pool"]["nodegroup"]
        assert any(s["num_pairs"] > 0 and len(s["jobs"]) == 2 for s in pipeline["schedules"]), pipeline["schedules"]
        assert pipeline["runtime"]["waits"] > 0 and pipeline["runtime"]["timeouts"] == 0, pipeline["runtime"]
    if name == "hybrid.yaml":
        # Note [Split size tuning]: neither encoder's unplanned step fits the pool alone, so the smallest
        # candidate split runs out of memory and ends the tuning; each keeps the static rule's split
        for job, tuning in results["pool"]["nodegroup"]["split_tuning"].items():
            assert "ran out of memory alone" in tuning.get("stopped", ""), (job, tuning)
            assert list(tuning["measured_peak_bytes"].values()) == [None], (job, tuning)
            assert tuning["chosen_split"] == tuning["static_rule_split"], (job, tuning)
