"""Trains one zoo model for a few steps, vanilla or with a TENSILE plan, in a
fresh process (its own device pool), and prints JSON (last line): losses (as
hex of their float32 bytes), a digest of every variable (model and optimizer),
the pool's measured peak per step, and for a planned run the plan's
predictions, the rewrite report and the swap stats. The harness the suite
(tests/tf/test_plan_execution.py) and the benchmarks (plan_execution_bench.py,
baseline_suite.py) share.

Several runs in one process: ``--variants '[["--model", "mlp"], ["--model",
"mlp", "--planned"]]'`` runs each argument list in turn in this process and
prints one JSON line per run (``"variant": k`` first). Each run builds its
jobs afresh from their seeds, on streams of its own, and releases them after;
its peaks count only what the pool held above what it held before the run
began (Note [Runs that share a process]). Options that set the process up
(``--graph-dependent-rewrites``, ``--grappler-off``, ``--grappler-memory``)
must be the same in every variant.

Note [Runs that share a process]
A fresh interpreter per run cost the suite about 8 s of imports, plugin
loading and tracing each (26 runs in test_plan_execution.py alone). Runs
in one process start from the same state a fresh one does where it matters:
weights and batches come from the run's seeds (keras.utils.set_random_seed,
numpy's generator), the swap channel's bandwidth and stats are set and reset
per run, deterministic ops and Grappler's settings are process-wide and equal
for every run, and each run's jobs get streams of their own (so the pool's
per-stream counters never mix runs). What an earlier run leaves in the pool
(Keras' and tf.function's caches) stays there through the later run's steps,
so a run's pool peaks are measured above the bytes held when it began. The
paired-vanilla twin (Note [Paired vanilla steps] in
benchmarks/baseline_suite.py) showed first that a job built second in a
process trains bit for bit what a fresh process trains."""
import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_builds import held_by_kept_jobs, job_for_run, release_job, share_builds  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp")
parser.add_argument("--input-shape", default="784")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--planned", action="store_true")
parser.add_argument("--budget-frac", type=float, default=0.0, help="budget = frac * the predicted unplanned peak, free-running or in plan order, the lower (0: minimise)")
parser.add_argument("--no-recompute", action="store_true")
parser.add_argument("--bandwidth", type=float, default=0.0, help="swap link cap, bytes/s (0: unlimited)")
parser.add_argument("--jobs", type=int, default=1)
parser.add_argument("--optimizer", default="adam")
parser.add_argument("--model-args", default="{}", help="JSON keyword arguments for a zoo model")
parser.add_argument("--cold", action="store_true", help="plan from the traced graph alone (cold start)")
parser.add_argument("--plan-peaks", choices=["timeline", "coincident"], default="coincident",
                    help="the jobs' peak model (config.PlanPeaks; default, as `tensile run` without the node-group "
                         "pipeline: coincident, Note [Coincident peaks])")
parser.add_argument("--coincident-peaks", dest="plan_peaks", action="store_const", const="coincident",
                    help="the same as --plan-peaks coincident (the default)")
parser.add_argument("--capture-only", action="store_true",
                    help="capture and plan, then train with the original step (isolates the capture's side effects)")
parser.add_argument("--empty-plan", action="store_true", help="apply a plan without events (order + re-import only)")
parser.add_argument("--graph-dependent-rewrites", action="store_true",
                    help="leave Grappler's graph-dependent rewrites on (Note [Graph-dependent Grappler rewrites])")
parser.add_argument("--trace-json", default="",
                    help="write the pool's event trace of the timed steps here (with each job's stream id and step start times)")
parser.add_argument("--grappler-off", default="", help="comma-separated Grappler optimizers to turn off")
parser.add_argument("--grappler-memory", default="",
                    help="run the unplanned step under Grappler's memory optimizer in this mode (RECOMPUTATION_HEURISTICS, "
                         "HEURISTICS, or MANUAL: every forward op carries a recompute hint), recomputing for TF2's "
                         "gradient_tape/ ops (a baseline of benchmarks/baseline_suite.py)")
parser.add_argument("--recompute-segments", type=int, default=-1,
                    help="gradient checkpointing: the unplanned step with tf.recompute_grad over this many consecutive "
                         "segments of a chain model's layers (0: sqrt(layers); -1: off; a baseline of "
                         "benchmarks/baseline_suite.py)")
parser.add_argument("--save-capture", default="",
                    help="write each captured job's graph and measured latencies here as JSON (DIR/JOB.graph.json, "
                         "DIR/JOB.latency.json), to plan them again without TensorFlow")
parser.add_argument("--budget-bytes", type=int, default=0,
                    help="plan for this many pool bytes (instead of --budget-frac); the batch-multiplier runs of "
                         "benchmarks/baseline_suite.py fix the pool this way")
parser.add_argument("--strategy", default="tensile",
                    help="the planner's policy: tensile, or a baseline of tensile_tf.scheduler.baselines (vdnn, capuchin)")
parser.add_argument("--step-order", default="plan", choices=("plan", "free", "auto"),
                    help="run planned steps chained in plan order, or free on the executor's threads, or free when "
                         "that plan meets the budget "
                         "(Note [Free-order plans] in tensile_tf.scheduler.peak_analysis)")
parser.add_argument("--chained", action="store_true",
                    help="chain every planned op in plan order (no unchained runs, Note [Unchained runs])")
parser.add_argument("--variants", default="",
                    help="a JSON list of argument lists: run each in this process, one JSON line each "
                         "(Note [Runs that share a process])")
parser.add_argument("--paired-vanilla", action="store_true",
                    help="with --planned and one job: also build the job's unplanned twin (same seed: same weights and "
                         "batches) and run its step right after each planned step, in this process; its steps' times, "
                         "peaks, losses and weights are in the output's 'paired_vanilla' (Note [Paired vanilla steps] "
                         "in benchmarks/baseline_suite.py)")
parser.add_argument("--plan-steps", default="rewrite", choices=("rewrite", "table", "table_then_rewrite"),
                    help="run.plan_steps (docs/planner.md): rewrite each plan, run plans that only swap on the job's "
                         "plan-table step, or on it until the plan's rewritten step is built in the background")
parser.add_argument("--link-lanes", type=int, default=1, choices=(1, 2),
                    help="the swap link's lanes, planner and channel: 1 (one transfer at a time) or 2 (one per "
                         "direction; Note [A lane per direction] in tensile_tf/scheduler/swap_scheduling.py)")
parser.add_argument("--combined-bandwidth", type=float, default=0.0, help="with 2 lanes: both directions' cap, "
                    "bytes/s (0: none)")
parser.add_argument("--replan-budget-frac", type=float, default=0.0,
                    help="after half the steps, re-plan the jobs for this share of the predicted unplanned peak and "
                         "switch each job to its new step, as a re-plan of running jobs does")
PROCESS_WIDE = ("graph_dependent_rewrites", "grappler_off", "grappler_memory")


def parse(argv: list[str]) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.paired_vanilla and not (args.planned and args.jobs == 1):
        parser.error("--paired-vanilla needs --planned and --jobs 1")
    return args


def set_up_process(args: argparse.Namespace) -> None:
    """What every run of this process shares: the pool as TensorFlow's
    allocator (before any op), deterministic ops, Grappler's settings."""
    global tf, keras, np, tf_plugin, zoo, supervised_train_step, JobStream, swap, stage, wait_for_background
    import tensile_tf  # first: its defaults, oneDNN's graph rewrites off, must precede TensorFlow
    import tensorflow as tf

    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    import keras
    import numpy as np

    import tf_plugin
    from tensile_tf.jobs import zoo
    from tensile_tf.jobs.job import supervised_train_step
    from tensile_tf.tf.determinism import enable_deterministic_training
    from tensile_tf.tf.pool import JobStream
    from tensile_tf.tf.rewrite.planned_step import wait_for_background
    from tensile_tf.tf.rewrite.table_then_rewrite import stage
    from tf_plugin import swap

    if args.graph_dependent_rewrites:
        tf.config.experimental.enable_op_determinism()
    else:
        enable_deterministic_training()
    if args.grappler_off:
        # "name" turns an optimizer off; "disable_meta_optimizer" turns Grappler off altogether
        tf.config.optimizer.set_experimental_options({k: k == "disable_meta_optimizer"
                                                      for k in args.grappler_off.split(",")})
    if args.grappler_memory:
        from tf_plugin.tf_internals import set_memory_optimizer

        set_memory_optimizer(args.grappler_memory, "gradient_tape/")


def checkpointed_forward(args, model, segments: int):
    """The model's forward pass as ``segments`` consecutive segments of its
    layers (0: sqrt(layers)), each under tf.recompute_grad: only segment
    boundaries are kept for the backward pass, the rest is recomputed
    (gradient checkpointing). Only for a chain of layers (each reads the
    previous one's output): exits with a message otherwise."""
    import math

    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    for prev, layer in zip(layers, layers[1:]):
        if layer.input is not prev.output:
            raise SystemExit(f"--recompute-segments: {args.model} is not a chain of layers "
                             f"({layer.name} does not read {prev.name}'s output)")
    k = segments or max(1, round(math.sqrt(len(layers))))
    size = math.ceil(len(layers) / k)

    def segment(chunk):
        def run(h):
            for layer in chunk:
                h = layer(h, training=True)
            return h
        return tf.recompute_grad(run)

    parts = [segment(layers[i:i + size]) for i in range(0, len(layers), size)]

    def forward(x):
        for part in parts:
            x = part(x)
        return x

    return forward


def build(args, name: str, seed: int, stream_name: str):
    shape = tuple(int(s) for s in args.input_shape.split("x"))
    stream = JobStream(stream_name)
    with stream.eager_scope():
        keras.utils.set_random_seed(seed)
        if hasattr(zoo, args.model):
            model = getattr(zoo, args.model)(shape, 10, **json.loads(args.model_args))
        else:
            model = getattr(keras.applications, args.model)(weights=None, input_shape=shape, classes=10)
        opt = keras.optimizers.get({"class_name": args.optimizer, "config": {"learning_rate": 1e-3}})
        hints = None
        if args.grappler_memory == "MANUAL":
            from tf_plugin.tf_internals import mark_for_recomputation

            hints = mark_for_recomputation
        lossf = keras.losses.SparseCategoricalCrossentropy()
        if args.recompute_segments < 0:
            train_step = supervised_train_step(model, opt, lossf)
        else:
            forward = checkpointed_forward(args, model, args.recompute_segments)

            def train_step(x, y):   # supervised_train_step's arithmetic, through the checkpointed forward pass
                with tf.GradientTape() as tape:
                    loss = lossf(y, forward(x))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss
        step = stream.step_function(train_step, graph_transform=hints)
        rng = np.random.default_rng(seed)
        batches = [(tf.constant(rng.standard_normal((args.batch, *shape)).astype("float32")),
                    tf.constant(rng.integers(0, 10, args.batch).astype("int32"))) for _ in range(3)]
        step(*batches[0])  # the probe step: builds the optimizer's slots
    return {"name": name, "stream": stream, "model": model, "opt": opt, "step": step, "batches": batches}


def plan_jobs(args, jobs: list[dict], out: dict) -> None:
    """Captures and plans the jobs together, puts each one's step to run in
    ``job["run"]`` and the plan's figures in ``out``."""
    from tensile_tf.pipeline import JobToPlan, capture_cold, capture_for_planning, plan_captured
    from tensile_tf.scheduler import Planner
    from tensile_tf.scheduler.link_bound import swap_link_bound, working_set_floor

    to_plan = [JobToPlan(j["name"], j["step"], j["batches"][0], j["opt"]) for j in jobs]
    t0 = time.perf_counter()
    captured = []
    for job, j in zip(to_plan, jobs):
        # in the job's scope, as the runtime captures (tensile_tf/runtime/planning.py): the variables the
        # capture restores stay the job's, so Note [Data held beside the step] sees what the job holds
        with j["stream"].eager_scope():
            captured.append(capture_cold(job) if args.cold else capture_for_planning(job, step_order=args.step_order))
    budget = None
    coincident = args.plan_peaks == "coincident"   # Note [Coincident peaks]
    if args.budget_frac:  # of the predicted vanilla pool peak (a plan with no events)
        vanilla = Planner([c.planner_job for c in captured], max_iterations=0, coincident_peaks=coincident).plan()
        # of the lower of the free-running and the in-order peak, so that
        # meeting it takes events (Note [Free-running steps])
        budget = int(min(vanilla.pool_vanilla_peak_bytes, vanilla.pool_planned_peak_bytes) * args.budget_frac)
    if args.budget_bytes:
        budget = args.budget_bytes
    if args.save_capture:
        os.makedirs(args.save_capture, exist_ok=True)
        for c in captured:
            with open(os.path.join(args.save_capture, f"{c.job.name}.graph.json"), "w") as f:
                json.dump(c.graph.to_dict(), f)
            with open(os.path.join(args.save_capture, f"{c.job.name}.latency.json"), "w") as f:
                f.write(c.planner_job.latencies.to_json())
    if args.empty_plan:
        budget = 1 << 50  # met by the vanilla order: no events
    def planned(budget, current=None):
        return plan_captured(captured, pool_bytes=budget, enable_recompute=not args.no_recompute,
                             bandwidth_bytes_per_s=args.bandwidth or None,
                             coincident_peaks=coincident, strategy=args.strategy,
                             step_order=args.step_order, unchain=not args.chained, current=current,
                             plan_steps=args.plan_steps, link_lanes=args.link_lanes,
                             combined_bytes_per_s=args.combined_bandwidth or None)

    plan, steps = planned(budget)
    if args.replan_budget_frac:   # run() re-plans with it after half the steps
        out["replan_with"] = lambda: planned(int(budget / args.budget_frac * args.replan_budget_frac),
                                             {j["name"]: j["run"] for j in jobs if j["run"] is not j["step"]})
    for j in jobs:
        if plan.jobs[j["name"]].changes_step or args.empty_plan:
            with j["stream"].eager_scope():
                steps[j["name"]].evict()  # the first planned step starts as every later one
            steps[j["name"]].instantiate_in_background(j["stream"].eager_scope)   # and any background work
    wait_for_background()   # Note [Table first, rewritten when ready]: a re-plan finds the table step built
    out["planning_s"] = time.perf_counter() - t0
    out["plan"] = {"strategy": args.strategy, "peak_model": plan.peak_model,
                   "step_order": next(iter(plan.jobs.values())).step_order,
                   "pool_vanilla_peak": plan.pool_vanilla_peak_bytes,
                   "pool_planned_peak": plan.pool_planned_peak_bytes,
                   "iteration_s": max(jp.iteration_s for jp in plan.jobs.values()),
                   "swapped_bytes_per_iteration": sum(jp.swapped_bytes_per_iteration for jp in plan.jobs.values()),
                   "budget": budget, "budget_met": plan.budget_met, "stop_reason": plan.stop_reason}
    # the lowest peak any plan could reach (a step's own tensors, scratch and what no plan moves)
    out["plan"]["working_set_floor"] = working_set_floor([c.planner_job for c in captured])
    if args.bandwidth:   # the swap link's ceilings for this capture (tensile_tf.scheduler.link_bound)
        bound = swap_link_bound([c.planner_job for c in captured], args.bandwidth, lanes=args.link_lanes,
                                combined_bytes_per_s=args.combined_bandwidth or None)
        out["plan"]["link_bound"] = {"vanilla_peak": bound.vanilla_peak_bytes,
                                     "bandwidth_bound_peak": bound.bandwidth_bound_peak_bytes,
                                     "deadline_bound_peak": bound.deadline_bound_peak_bytes,
                                     "deadline_bound_msr": bound.deadline_bound_msr, "binds_at": bound.bound_step}
    graph_of = {c.job.name: c.graph for c in captured}
    for j in jobs:
        jp = plan.jobs[j["name"]]
        # a plan that changes nothing is not applied, as the runtime does (tensile_tf/runtime/planning.py)
        j["run"] = steps[j["name"]] if (jp.changes_step or args.empty_plan) and not args.capture_only else j["step"]
        out["jobs"][j["name"]] = {"plan_vanilla_peak": jp.vanilla_peak_bytes, "plan_planned_peak": jp.planned_peak_bytes,
                                  "report": {k: v for k, v in steps[j["name"]].report.to_dict().items()
                                             if k not in ("skipped", "restore_needed")},
                                  "skipped": len(steps[j["name"]].report.skipped),
                                  # Note [View takes the buffer]: swaps of a view that outlived its owner
                                  "view_swaps": sum(1 for e in jp.swap_outs
                                                    if graph_of[j["name"]].tensors[e.tensor].view_of),
                                  "cross_iteration_slot_swaps": sum(
                                      1 for e in jp.swap_ins if e.cross_iteration and e.tensor.startswith("var:")
                                      and ("momentum" in e.tensor or "velocity" in e.tensor))}


def replan(jobs: list[dict], out: dict) -> None:
    """Re-plans the jobs (``--replan-budget-frac``) and switches each to its new step, as
    ``take_switch`` does: the old plan's host-side variables back, the new plan's out."""
    plan, steps = out.pop("replan_with")()
    out["replan"] = {}
    for j in jobs:
        jp, old = plan.jobs[j["name"]], j["run"]
        new = steps[j["name"]] if jp.changes_step else j["step"]
        with j["stream"].eager_scope():
            if j["run"] is not j["step"]:
                j["run"].restore()
            if new is not j["step"]:
                new.evict()
        j["run"] = new
        report = steps[j["name"]].report
        out["replan"][j["name"]] = {"plan_table": report.plan_table, "swaps": len(jp.swap_ins),
                                    "same_function": getattr(getattr(new, "fn", None), "table_step", 0) is getattr(
                                        getattr(old, "fn", None), "table_step", 1),
                                    "activation_swap_ins": report.activation_swap_ins,
                                    "variable_swap_ins": report.variable_swap_ins}


def trained(j) -> dict:
    weights = j["model"].weights + list(j["opt"].variables)
    return {"losses": [np.asarray(x.numpy()).tobytes().hex() for x in j["losses"]],
            "loss_values": [float(np.mean(x.numpy())) for x in j["losses"]],
            "weights_sha256": hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in weights)).hexdigest()}


def run(args: argparse.Namespace, tag: str = "") -> dict:
    """One run: build the jobs, plan them if asked, train ``args.steps``
    steps, and return what the run measured (the JSON a test reads)."""
    import threading

    pool = tf_plugin.device_pool()
    swap.configure_swap_link(args.bandwidth, args.link_lanes, args.combined_bandwidth)
    # Note [Runs that share a process]; Note [Builds shared by runs of one job] in benchmarks/shared_builds.py
    held_before = pool.stats()["current"] - held_by_kept_jobs(args)
    jobs = [job_for_run(args, j, tag, build) for j in range(args.jobs)]
    # the plan tables an earlier run in this process left (none: each goes with its step)
    out = {"model": args.model, "planned": args.planned, "jobs": {}, "plan_tables_known": swap.plan_tables_known()}
    if args.planned:
        plan_jobs(args, jobs, out)
    else:
        for j in jobs:
            j["run"] = j["step"]
    twin = build(args, "vanilla", 0, f"{tag}vanilla") if args.paired_vanilla else None   # job0's twin: seed 0 as job0
    twin_times, twin_peaks = [], []
    swap.reset_swap_stats()
    if args.trace_json:
        swap.set_swap_log_capacity(1 << 16)
    peaks, times = [], []
    job_peaks = {j["name"]: [] for j in jobs}
    step_starts, stages = [], []
    for i in range(args.steps):
        if args.trace_json and i == 0:
            pool.clear_trace()
            pool.set_trace_enabled(True)
        # the twin's tensors sit in the pool while job0 steps: its held bytes are not job0's peak
        twin_held = twin["stream"].stats().get("current", 0) if twin else 0
        pool.reset_peak()
        for j in jobs:
            j["stream"].reset_peak()
        if i == args.steps // 2 and "replan_with" in out:
            replan(jobs, out)
        if i == args.steps // 2 + 1 and "replan" in out:   # one step on the table, then its rewrite, waited for
            [j["run"].start_background(j["stream"].eager_scope) for j in jobs if hasattr(j["run"], "start_background")]
            wait_for_background()
        t0 = time.perf_counter()
        step_starts.append(time.monotonic_ns())
        if len(jobs) == 1:
            with jobs[0]["stream"].eager_scope():
                jobs[0].setdefault("losses", []).append(jobs[0]["run"](*jobs[0]["batches"][i % 3]))
        else:
            def one(j):
                with j["stream"].eager_scope():
                    j.setdefault("losses", []).append(j["run"](*j["batches"][i % 3]))
            threads = [threading.Thread(target=one, args=(j,)) for j in jobs]
            [t.start() for t in threads]
            [t.join() for t in threads]
        times.append(time.perf_counter() - t0)
        stages.append([stage(j["run"]) for j in jobs])   # Note [Table first, rewritten when ready]
        peaks.append(pool.stats()["peak"] - twin_held - held_before)
        for j in jobs:
            job_peaks[j["name"]].append(j["stream"].stats()["peak"])
        if twin:   # right after, so the machine's drift meets both (Note [Paired vanilla steps])
            swap.drain_swap_channel()   # transfers still in flight would move the planned job's bytes under the twin's step
            planned_held = pool.stats()["current"] - twin_held
            pool.reset_peak()
            t0 = time.perf_counter()
            with twin["stream"].eager_scope():
                twin.setdefault("losses", []).append(twin["step"](*twin["batches"][i % 3]))
            twin_times.append(time.perf_counter() - t0)
            twin_peaks.append(pool.stats()["peak"] - planned_held)
    if args.trace_json:
        with open(args.trace_json, "w") as f:
            json.dump({"streams": {j["name"]: j["stream"].stream for j in jobs}, "events": pool.trace(),
                       "transfers": swap.swap_channel_log(), "step_starts_ns": step_starts}, f)
        pool.set_trace_enabled(False)
    for j in jobs:
        if j["run"] is not j["step"]:
            with j["stream"].eager_scope():
                j["run"].restore()
        out["jobs"].setdefault(j["name"], {}).update(trained(j))
    if twin:   # shaped as an unplanned run's output, its job named as job0
        out["paired_vanilla"] = {"jobs": {jobs[0]["name"]: trained(twin)}, "step_s": twin_times, "peaks": twin_peaks}
    out["plan_table"] = {j["name"]: j["run"].fn.table_step.stats() for j in jobs
                         if hasattr(getattr(j["run"], "fn", None), "table_step")}
    out["step_graph_ops"] = len(jobs[0]["step"].get_concrete_function(*jobs[0]["batches"][0]).graph.get_operations())
    out["peaks"] = peaks
    out["stages"] = stages
    out["final_plan_table"] = {j["name"]: getattr(getattr(j["run"], "report", None), "plan_table", None) for j in jobs}
    out["job_peaks"] = job_peaks
    out["step_s"] = times
    out["swap"] = swap.swap_stats()
    for k, j in enumerate(jobs):
        release_job(args, k, j)
    if twin:
        twin["stream"].release()
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    first = parse(argv)
    if not first.variants:
        set_up_process(first)
        print(json.dumps(run(first)))
        return
    variants = [parse(v) for v in json.loads(first.variants)]
    for k, v in enumerate(variants):
        differ = [o for o in PROCESS_WIDE if getattr(v, o) != getattr(first, o)]
        if differ:
            parser.error(f"--variants: variant {k} sets {differ} unlike the process (Note [Runs that share a process])")
    set_up_process(first)
    import gc

    share_builds(variants)   # Note [Builds shared by runs of one job] in benchmarks/shared_builds.py
    for k, v in enumerate(variants):
        print(json.dumps({"variant": k, **run(v, tag=f"v{k}.")}), flush=True)
        gc.collect()


if __name__ == "__main__":
    main()
