"""The TENSILE planner in the host, end to end: `tensile run --compare-vanilla`
runs a config unplanned and planned (deterministic ops, same seeds) in one
process and must report identical losses and weights; with a pool too small
for both jobs at once unplanned, the planned run swaps and runs them
together."""
import json

from tests.e2e.test_cli import tensile, write

TWO_MLPS = """
pool: {pool}
run: {{out_dir: unused, admission: sum}}
jobs:
  - name: mlp-a
    model: {{builder: "tensile_tf.zoo:mlp", args: {{hidden: [1024, 1024, 1024]}}}}
    input_shape: [784]
    batch_size: 256
    optimizer: {{name: adam, learning_rate: 0.001}}
    steps: 5
    seed: 1
  - name: mlp-b
    model: {{builder: "tensile_tf.zoo:mlp", args: {{hidden: [1024, 1024, 1024]}}}}
    input_shape: [784]
    batch_size: 256
    optimizer: {{name: adam, learning_rate: 0.002}}
    steps: 5
    seed: 2
"""


def _compare(tmp_path, pool):
    cfg = write(tmp_path, TWO_MLPS.format(pool=pool))
    out = tmp_path / "out"
    proc = tensile("run", str(cfg), "--out", str(out), "--compare-vanilla")
    compare = json.loads((out / "compare.json").read_text()) if (out / "compare.json").exists() else None
    assert compare is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {mode: json.loads((out / mode / "results.json").read_text()) for mode in ("vanilla", "planned")}
    return proc, compare, runs


def test_compare_vanilla_with_room_to_spare_changes_nothing(tmp_path):
    proc, compare, runs = _compare(tmp_path, "256MiB")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "training identical bit for bit: yes" in proc.stdout
    assert compare["all_match"]
    for job in compare["jobs"]:
        assert job["losses_match"] and job["weights_match"]
        assert job["vanilla_status"] == job["planned_status"] == "finished"
        assert job["swapped_bytes_per_step"] == 0  # the budget is met without a swap
    planned = {j["name"]: j for j in runs["planned"]["jobs"]}
    assert all(j["plan"]["budget_met"] and j["plan"]["swap_outs"] == 0 for j in planned.values())
    assert runs["planned"]["planner"]["plans"][0]["jobs"] == ["mlp-a", "mlp-b"]  # planned together


def test_plan_lets_jobs_share_a_pool_they_cannot_share_unplanned(tmp_path):
    # Each job needs ~50 MiB (P ~36 MiB with Adam, T ~15 MiB); admission `sum`
    # runs them one after the other in 100 MiB unplanned.
    proc, compare, runs = _compare(tmp_path, "100MiB")
    vanilla = {j["name"]: j for j in runs["vanilla"]["jobs"]}
    planned = {j["name"]: j for j in runs["planned"]["jobs"]}
    assert vanilla["mlp-b"]["admitted_at_s"] >= vanilla["mlp-a"]["ended_at_s"]  # serial unplanned
    assert planned["mlp-a"]["plan"]["swap_outs"] + planned["mlp-b"]["plan"]["swap_outs"] > 0
    assert planned["mlp-b"]["admitted_at_s"] < planned["mlp-a"]["ended_at_s"]  # together planned
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert compare["all_match"], proc.stdout[-3000:]
    assert compare["pool"]["swapped_bytes"] > 0
    assert runs["planned"]["planner"]["swap"]["host"]["current"] == 0  # every host copy came back
    assert all(j["leaked_bytes"] == 0 for j in planned.values())
