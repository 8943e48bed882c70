"""Plans executed inside TensorFlow: training computes bit for bit what it
computes unplanned, and the pool's measured peak drops.

Each run is a fresh process (tests/tf/plan_execution_reference.py): its own
device pool, deterministic ops, fixed seeds; the vanilla and the planned run
start from the same weights and see the same batches.

Tolerance (stated): for the MLP, whose footprint is all tensors the planner
sees, the measured planned peak is within 15 % of the planner's prediction (with
swap-ins, whose buffers come a little later in some steps than the prediction
counts: the worst step within 15 % of it, the best no more than 15 % above).
Convolutional steps also hold kernel scratch buffers and run in a different
order unplanned, so for them only "below vanilla" is asserted.
"""
import math

import pytest

from tests.conftest import REPO_ROOT, last_json_line, run_python

SCRIPT = REPO_ROOT / "tests" / "tf" / "plan_execution_reference.py"
MODELS = {
    "mlp": ["--model", "mlp", "--input-shape", "784", "--batch", "32"],
    "small_cnn": ["--model", "small_cnn", "--input-shape", "32x32x3", "--batch", "16"],
    "residual_net": ["--model", "residual_net", "--input-shape", "32x32x3", "--batch", "16"],
    # attention, layer norm, Adam: with Grappler's graph-dependent rewrites on, even an empty plan
    # changed its weights (Note [Graph-dependent Grappler rewrites] in tensile_tf.tf.determinism)
    "transformer_encoder": ["--model", "transformer_encoder", "--input-shape", "32x64", "--batch", "8"],
}


def _run(args):
    code = f"import runpy, sys; sys.argv = {[str(SCRIPT), *args]!r}; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    proc = run_python(code, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json_line(proc)


@pytest.fixture(scope="module", params=list(MODELS))
def runs(request):
    common = [*MODELS[request.param], "--steps", "4"]
    vanilla = _run(common)
    planned = _run([*common, "--planned", "--budget-frac", "0.6"])
    return request.param, vanilla, planned


def test_planned_training_is_bit_for_bit(runs):
    _, vanilla, planned = runs
    v, p = vanilla["jobs"]["job0"], planned["jobs"]["job0"]
    assert p["losses"] == v["losses"]
    assert p["weights_sha256"] == v["weights_sha256"]
    report = p["report"]
    assert report["activation_swap_outs"] + report["variable_swap_outs"] + report["recomputes"] > 0
    assert planned["swap"]["channel"]["pending"] == 0
    assert planned["swap"]["host"]["current"] == 0  # every host copy freed after restore


def test_measured_peak_drops_below_vanilla(runs):
    name, vanilla, planned = runs
    steady_planned = max(planned["peaks"][1:])
    assert steady_planned < min(vanilla["peaks"]), (name, vanilla["peaks"], planned["peaks"])


def test_a_planned_step_leaves_its_slack_runs_unchained(runs):
    """Note [Unchained runs]: the rewrite chains runs of ops, not every op,
    where the plan's footprint has slack; training stays bit for bit (above)."""
    name, _, planned = runs
    report = planned["jobs"]["job0"]["report"]
    assert report["unchained_ops"] > 0 and report["order_edges"] > 0, (name, report)


def test_a_chained_plan_has_no_unchained_run_and_trains_the_same():
    common = [*MODELS["mlp"], "--steps", "3", "--planned", "--budget-frac", "0.6"]
    unchained, chained = _run(common), _run([*common, "--chained"])
    assert chained["jobs"]["job0"]["report"]["unchained_ops"] == chained["jobs"]["job0"]["report"]["run_barriers"] == 0
    assert unchained["jobs"]["job0"]["report"]["unchained_ops"] > 0
    assert chained["jobs"]["job0"]["losses"] == unchained["jobs"]["job0"]["losses"]
    assert chained["jobs"]["job0"]["weights_sha256"] == unchained["jobs"]["job0"]["weights_sha256"]


def test_a_paired_vanilla_twin_trains_what_the_unplanned_run_trains():
    """Note [Paired vanilla steps] in benchmarks/baseline_suite.py: the twin
    stepped beside the planned job is the unplanned run, in the same process."""
    common = [*MODELS["mlp"], "--steps", "3"]
    vanilla = _run(common)
    paired = _run([*common, "--planned", "--budget-frac", "0.6", "--paired-vanilla"])
    twin, planned, alone = paired["paired_vanilla"]["jobs"]["job0"], paired["jobs"]["job0"], vanilla["jobs"]["job0"]
    assert twin["losses"] == alone["losses"] == planned["losses"]
    assert twin["weights_sha256"] == alone["weights_sha256"] == planned["weights_sha256"]
    assert len(paired["paired_vanilla"]["step_s"]) == len(paired["step_s"]) == 3
    # each job's peak is its own: the twin's is the unplanned run's (not it plus the planned job's bytes,
    # 60-70% of it more), above the plan's. A free-running step's peak moves with how the executor's two
    # threads interleave (Note [Concurrent scratch] in tensile_tf/pipeline.py): seen 7% apart (one
    # 0.4 MB layer) between the two processes' steps with both cores loaded.
    twin_peak, alone_peak = max(paired["paired_vanilla"]["peaks"][1:]), max(vanilla["peaks"][1:])
    assert abs(twin_peak - alone_peak) <= 0.15 * alone_peak, (paired["paired_vanilla"]["peaks"], vanilla["peaks"])
    assert max(paired["peaks"][1:]) < min(paired["paired_vanilla"]["peaks"]), (paired["peaks"],
                                                                             paired["paired_vanilla"]["peaks"])


def test_mlp_peak_matches_prediction():
    # A planned step peaks as predicted when the swap channel's thread keeps up
    # with the plan; when other work on the machine holds that thread back, a
    # swapped-out tensor stays a little longer (seen once in five runs on two
    # loaded cores: +18%; on two busy loops, in 3 of 10 runs every training
    # step +17 to +32%, at this commit and the one before). So the best of the
    # training steps must be near the prediction (35%) and below every
    # unplanned step, and every one must stay within a bound a late channel keeps.
    common = [*MODELS["mlp"], "--steps", "5", "--planned", "--budget-frac", "0.6"]
    planned = _run(common)
    predicted = planned["plan"]["pool_planned_peak"]
    training = planned["peaks"][1:]
    assert abs(min(training) - predicted) <= 0.35 * predicted, (training, predicted)
    assert max(training) <= 1.5 * predicted, (training, predicted)
    # the plan swaps Adam's slots across iterations, and training still matches vanilla
    assert planned["jobs"]["job0"]["cross_iteration_slot_swaps"] > 0
    vanilla = _run([*MODELS["mlp"], "--steps", "5"])
    assert min(training) < min(vanilla["peaks"][1:]), (training, vanilla["peaks"])
    assert planned["jobs"]["job0"]["weights_sha256"] == vanilla["jobs"]["job0"]["weights_sha256"]
    assert planned["jobs"]["job0"]["losses"] == vanilla["jobs"]["job0"]["losses"]
    assert all(math.isfinite(x) for x in planned["jobs"]["job0"]["loss_values"])


def test_two_concurrent_planned_jobs_peak_as_planned():
    """Two Transformer jobs planned together and run at once in one pool: each
    job's and the pool's measured peaks are near the plan's prediction (it was 70 %
    above while the swap ops queued on the inter-op thread pool behind the
    other job's compute, Note [Swap ops run inline] in swap_ops.cc), and each
    job trains bit for bit as it does unplanned beside the other."""
    common = ["--model", "transformer_encoder", "--input-shape", "64x128", "--batch", "16", "--jobs", "2",
              "--steps", "4"]
    vanilla = _run(common)
    planned = _run([*common, "--planned", "--budget-frac", "0.5"])
    predicted = planned["plan"]["pool_planned_peak"]
    measured = max(planned["peaks"][1:])
    # Each job's own stream peaks as its plan predicts (within 20%). The pool
    # also holds memory outside both job streams while they run (3.3 of 21.8
    # MiB in one run, not yet attributed: issue 15's closing note), so the
    # pool is held to 30%.
    for job, peaks in planned["job_peaks"].items():
        job_predicted = planned["jobs"][job]["plan_planned_peak"]
        assert max(peaks[1:]) <= 1.2 * job_predicted, (job, peaks, job_predicted)
    assert measured <= 1.3 * predicted, (measured, predicted, planned["peaks"])
    assert measured < 0.7 * min(vanilla["peaks"][1:]), (measured, vanilla["peaks"])
    for job in ("job0", "job1"):
        assert planned["jobs"][job]["losses"] == vanilla["jobs"][job]["losses"]
        assert planned["jobs"][job]["weights_sha256"] == vanilla["jobs"][job]["weights_sha256"]
    # the steps after the first swap out into host buffers the first one left behind
    assert planned["swap"]["host"]["cache_hits"] > planned["swap"]["host"]["cache_misses"]


def test_swap_ins_reusing_one_host_copy_release_the_tensor_as_planned():
    """A residual CNN whose block inputs are read in the forward pass and
    again, apart, in backprop: the planner swaps some out once and back in
    for several backward reads, the earlier ones reusing the host copy (Note
    [Host copies serve several gaps] in tensile_tf/tf/rewrite/activation_swaps.py). Pairing by the
    swap-out's release point skipped those swap-ins and a deep MLP's planned
    peak stayed at 105 MiB for a predicted 45 MiB. (That MLP no longer
    reuses a copy: since Note [Freeing successors first] in
    tensile_tf.pipeline its two backward reads of a ReLU output run side by
    side, and one swap-in serves both.)"""
    common = ["--model", "residual_net", "--input-shape", "32x32x3", "--batch", "16", "--steps", "4"]
    planned = _run([*common, "--planned", "--budget-frac", "0.3"])
    job = planned["jobs"]["job0"]
    report = job["report"]
    assert report["activation_swap_ins"] > report["activation_swap_outs"] > 0   # host copies reused
    assert job["skipped"] == 0, job["skipped"]                                   # every swap-in carried out
    # Measured 31.6 MiB in every step for 31.55 predicted on a quiet machine; a
    # swap channel held back by other work keeps tensors longer (+21% seen
    # under two busy loops for the MLP this test used before).
    predicted, peaks = planned["plan"]["pool_planned_peak"], planned["peaks"]
    assert min(peaks) <= 1.1 * predicted, (peaks, predicted)
    assert max(peaks) <= 1.3 * predicted, (peaks, predicted)
    vanilla = _run(common)
    assert max(peaks) < 0.8 * min(vanilla["peaks"]), (peaks, vanilla["peaks"])   # 31.6 against 49-52 MiB
    assert job["losses"] == vanilla["jobs"]["job0"]["losses"]
    assert job["weights_sha256"] == vanilla["jobs"]["job0"]["weights_sha256"]


@pytest.fixture(scope="module")
def mlp_vanilla():
    return _run([*MODELS["mlp"], "--steps", "3"])


@pytest.mark.parametrize("strategy", ["vdnn", "capuchin"])
def test_a_baseline_policy_rewrites_the_step_and_trains_bit_for_bit(mlp_vanilla, strategy):
    # Issue 19's baselines (tensile_tf/scheduler/baselines.py) run through the same rewrite and
    # swap ops as TENSILE's plans: the step really changes, what it computes does not
    planned = _run([*MODELS["mlp"], "--steps", "3", "--planned", "--budget-frac", "0.6", "--strategy", strategy])
    assert planned["plan"]["strategy"] == strategy and planned["plan"]["stop_reason"].lower().startswith(strategy)
    p, v = planned["jobs"]["job0"], mlp_vanilla["jobs"]["job0"]
    assert p["report"]["activation_swap_outs"] > 0 and p["report"]["swapped_bytes_per_step"] > 0, p["report"]
    assert planned["swap"]["channel"]["pending"] == 0
    assert p["losses"] == v["losses"] and p["weights_sha256"] == v["weights_sha256"]


@pytest.mark.parametrize("step_order", ["plan", "free"])
def test_a_free_order_plan_runs_without_the_plan_order_chain_and_trains_bit_for_bit(mlp_vanilla, step_order):
    # Note [Free-order plans]: the rewrite leaves the ops to the executor's threads (no chain
    # edges) while its swaps still run, and what the step computes does not change
    planned = _run([*MODELS["mlp"], "--steps", "3", "--planned", "--budget-frac", "0.6", "--step-order", step_order])
    p, v = planned["jobs"]["job0"], mlp_vanilla["jobs"]["job0"]
    assert planned["plan"]["step_order"] == step_order
    assert (p["report"]["order_edges"] > 0) == (step_order == "plan"), p["report"]
    assert p["report"]["activation_swap_outs"] + p["report"]["variable_swap_outs"] > 0, p["report"]
    assert planned["swap"]["channel"]["pending"] == 0 and planned["swap"]["host"]["current"] == 0
    assert p["losses"] == v["losses"] and p["weights_sha256"] == v["weights_sha256"]


def test_gradient_checkpointing_baseline_recomputes_and_trains_the_same_model(mlp_vanilla):
    # Issue 19's tf.recompute_grad baseline (sqrt(n) segments of a chain model's layers): the
    # traced step gains the recomputation's ops; it changes the arithmetic's order a little, so
    # the losses match to float32 rounding rather than to the bit
    checkpointed = _run([*MODELS["mlp"], "--steps", "3", "--recompute-segments", "0"])
    assert checkpointed["step_graph_ops"] > mlp_vanilla["step_graph_ops"], (
        checkpointed["step_graph_ops"], mlp_vanilla["step_graph_ops"])
    v, c = mlp_vanilla["jobs"]["job0"]["loss_values"], checkpointed["jobs"]["job0"]["loss_values"]
    assert len(c) == 3 and all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(v, c)), (v, c)


def test_a_view_that_took_its_owners_buffer_is_swapped_and_training_stays_bit_for_bit():
    # Note [View takes the buffer] (tensile_tf/scheduler/access_sequence.py): a Keras Dense layer on
    # a sequence reads its input through Tensordot's Reshape, a view that outlives the layer-norm
    # output it shares a buffer with; a tight budget makes the plan swap such views
    common = [*MODELS["transformer_encoder"], "--batch", "16", "--steps", "3"]
    vanilla = _run(common)
    planned = _run([*common, "--planned", "--budget-frac", "0.4"])
    p, v = planned["jobs"]["job0"], vanilla["jobs"]["job0"]
    assert p["view_swaps"] > 0, p
    assert p["losses"] == v["losses"] and p["weights_sha256"] == v["weights_sha256"]
    assert max(planned["peaks"][1:]) < min(vanilla["peaks"]), (planned["peaks"], vanilla["peaks"])
