"""End-to-end: the tensile command as a user runs it."""
import json
import os
import textwrap


from tests.conftest import REPO_ROOT
from tests.forkserver import run_fresh

SMALL_CONFIG = """
pool: 256MiB
run: {out_dir: unused}
jobs:
  - name: cnn
    model: {builder: "tensile_tf.jobs.zoo:small_cnn", args: {filters: [8, 16]}}
    input_shape: [16, 16, 3]
    batch_size: 16
    steps: 6
    seed: 1
  - name: mlp
    model: {builder: "tensile_tf.jobs.zoo:mlp", args: {hidden: [64]}}
    input_shape: [32]
    batch_size: 32
    optimizer: {name: sgd, learning_rate: 0.01}
    steps: 10
  - name: flaky
    model: {train_step_factory: "tests.job_factories:dense_regression", args: {fail_at_step: 3}}
    steps: 10
  - name: unbuildable
    model: {builder: "tests.fixture_modules.builders:raises_when_built"}
    input_shape: [8]
    steps: 2
"""


def tensile(*args, timeout=600, env=None):
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"} | (env or {})
    env["PYTHONPATH"] = str(REPO_ROOT)
    # a fresh interpreter's run, forked from one that imported TensorFlow (Note [Children forked from one import])
    return run_fresh(["-m", "tensile_tf", *map(str, args)], env=env, cwd=REPO_ROOT, timeout=timeout)


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_run_writes_results_trace_and_memory_picture(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG)
    out = tmp_path / "out"
    # A pool event ring far smaller than the run's events: results.json and the
    # console say what was dropped and how to keep it (Note [Trace coverage]).
    proc = tensile("run", str(cfg), "--out", str(out), env={"TENSILE_POOL_TRACE_EVENTS": "2000"})
    assert proc.returncode == 1, proc.stderr[-3000:]   # flaky failed: not every job finished
    assert "2 of 4 jobs did not finish" in proc.stdout and "flaky (failed)" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["schema_version"] == 3
    cov = results["trace"]
    assert cov["events_kept"] <= 2000 < cov["events_in_run"]
    assert cov["events_dropped"] == cov["events_in_run"] - cov["events_kept"] > 0
    assert f"TENSILE_POOL_TRACE_EVENTS={cov['events_in_run']}" in proc.stdout
    jobs = {j["name"]: j for j in results["jobs"]}
    assert jobs["cnn"]["status"] == "finished" and jobs["cnn"]["steps"] == 6
    assert len(jobs["cnn"]["step_peak_bytes"]) == 6
    assert jobs["cnn"]["training_peak_pool_bytes"] == max(jobs["cnn"]["step_peak_bytes"][1:])
    assert jobs["mlp"]["status"] == "finished" and jobs["mlp"]["steps"] == 10
    assert jobs["flaky"]["status"] == "failed" and "injected failure" in jobs["flaky"]["error"]
    # a builder that raises fails only that job, and its whole traceback is kept (path in results.json)
    assert jobs["unbuildable"]["status"] == "failed"
    assert "the builder failed on purpose" in jobs["unbuildable"]["error"]
    kept = (out / jobs["unbuildable"]["traceback_path"]).read_text()
    assert "Traceback (most recent call last)" in kept and "raises_when_built" in kept
    for j in jobs.values():
        assert j["leaked_bytes"] == 0
        assert (j["peak_pool_bytes"] > 0) == (j["name"] != "unbuildable")   # it never held a byte
    assert isinstance(jobs["cnn"]["final_loss"], float) and jobs["cnn"]["median_step_s"] > 0
    assert results["pool"]["capacity"] == 256 * 2**20
    assert results["pool"]["peak"] >= max(j["peak_pool_bytes"] for j in jobs.values())
    trace = json.loads((out / "trace.json").read_text())
    assert trace["metadata"]["pool_events_dropped"] == cov["events_dropped"]
    # The sampled per-job series covers the whole run, from its first step to its last.
    sampled = [e["ts"] for e in trace["traceEvents"] if e.get("name") == "pool bytes by job"]
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert min(sampled) <= min(e["ts"] for e in steps)
    assert max(sampled) >= max(e["ts"] + e["dur"] for e in steps)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "step 0" in names and "pool bytes by job" in names
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cnn" in proc.stdout and "finished" in proc.stdout  # the summary table


TWO_JOBS = SMALL_CONFIG.split("  - name: flaky")[0]


def test_plan_json_is_the_plan_that_runs(tmp_path):
    """`tensile plan` probes and plans as `tensile run` does; `tensile run
    --plan plan.json` runs that very plan (its prediction is the file's)."""
    cfg = write(tmp_path, TWO_JOBS)
    out = tmp_path / "plan"
    proc = tensile("plan", str(cfg), "--out", str(out), "--budget", "512KiB")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vanilla peak" in proc.stdout and "planned peak" in proc.stdout and "(predicted)" in proc.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert set(plan["jobs"]) == {"cnn", "mlp"} and plan["pool_bytes"] == 512 * 2**10
    assert plan["pool_planned_peak_bytes"] < plan["pool_vanilla_peak_bytes"]  # it had to plan something
    for job in plan["jobs"].values():
        assert len(job["graph_fingerprint"]) == 64 and job["graph_ops"] > 0
    run_out = tmp_path / "run"
    proc = tensile("run", str(cfg), "--out", str(run_out), "--plan", str(out / "plan.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((run_out / "results.json").read_text())
    for job in results["jobs"]:
        planned = plan["jobs"][job["name"]]
        assert job["status"] == "finished"
        assert job["plan"]["source"] == str(out / "plan.json")
        assert job["plan"]["predicted_vanilla_peak_bytes"] == planned["vanilla_peak_bytes"]
        assert job["plan"]["predicted_planned_peak_bytes"] == planned["planned_peak_bytes"]
        assert job["plan"]["swap_outs"] == len(planned["swap_outs"])
        assert job["plan"]["recomputes"] == len(planned["recomputes"])
    # A plan made for other graphs is refused before training, with the reason.
    other = write(tmp_path, TWO_JOBS.replace("batch_size: 16", "batch_size: 8"), name="other.yaml")
    proc = tensile("run", str(other), "--out", str(tmp_path / "other"), "--plan", str(out / "plan.json"))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "refusing the plan" in proc.stderr and "job 'cnn': the plan was made for a graph of" in proc.stderr
    assert "tensile plan CONFIG" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "other" / "results.json").exists()
