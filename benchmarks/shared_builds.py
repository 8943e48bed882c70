"""Jobs built once for several runs of benchmarks/plan_execution_reference.py in one process.

Note [Builds shared by runs of one job]
Building a job (the model, its optimizer, tracing the step and its probe
step) was most of a run: the Transformer family's 8 runs took 116 s in one
process, and under cProfile tracing the step with Keras' Adam took 8-11 s of
a 17 s planned run. Runs of the same job (same model, shapes, batch,
optimizer and seed: ``build_key``) in one ``--variants`` process therefore
build it once: the variables its step reads (model and optimizer, slots
and iteration included) are copied to the host right after its probe step
(``snapshot_variables``, as a capture keeps them), and every later
run of it assigns those values back before it starts, so it starts where a
fresh build starts. It trains the same traced step, which is what the
runtime does when a job takes over a finished one's step (Note [Reusing a
finished job's traced step] in tensile_tf/runtime/traced_step_reuse.py);
each run still captures, plans and rewrites its own steps. Its peaks are
measured above what the pool held before the run less what the kept job
holds, the bytes its fresh build would have added. After each run the
plan-table step made from its step is dropped (its C++ table with it, as
when a fresh build's run ends); the job's stream is released after the last
run that uses it.
"""
from collections import Counter

# Note [Builds shared by runs of one job]: build_key -> {"job": the built job, "restore": sets the variables its
# step reads back to their values after the probe step, "runs_left": later runs that use it}; set by share_builds()
SHARED_BUILDS: dict[tuple, dict] = {}


def share_builds(variants) -> None:
    """Marks the jobs that more than one of the process's runs (``variants``, parsed) build."""
    uses = Counter(build_key(v, j) for v in variants for j in range(v.jobs))
    SHARED_BUILDS.update({key: {"runs_left": n} for key, n in uses.items() if n > 1})


def build_key(args, j: int) -> tuple:
    """What a job's build depends on (Note [Builds shared by runs of one job])."""
    return (args.model, args.input_shape, args.batch, args.optimizer, args.model_args, args.recompute_segments,
            args.grappler_memory, j)


def held_by_kept_jobs(args) -> int:
    """Pool bytes the run's jobs built by an earlier run hold already (what their fresh builds would add)."""
    kept = (SHARED_BUILDS.get(build_key(args, j), {}).get("job") for j in range(args.jobs))
    return sum(job["stream"].stats()["current"] for job in kept if job is not None)


def job_for_run(args, j: int, tag: str, build) -> dict:
    """Job ``j`` of a run: built now, or the shared build with its values set back to
    what they were after its probe step (Note [Builds shared by runs of one job]);
    ``build(args, name, seed, stream_name)`` builds a job."""
    shared = SHARED_BUILDS.get(build_key(args, j))
    if shared is None:
        return build(args, f"job{j}", j, f"{tag}job{j}")
    if "job" not in shared:
        from tensile_tf.tf.capture import snapshot_variables

        job = shared["job"] = build(args, f"job{j}", j, f"shared{len(SHARED_BUILDS)}.{tag}job{j}")
        # host copies of what the step reads (copies in the pool would stay there after a plan swaps them out)
        shared["restore"] = snapshot_variables(job["step"].get_concrete_function(*job["batches"][0]).graph)
    else:
        with shared["job"]["stream"].eager_scope():
            shared["restore"]()
    shared["runs_left"] -= 1
    return dict(shared["job"])   # the run's own dict: its step to run and its losses


def release_job(args, j: int, job: dict) -> None:
    """The job's stream released, unless a later run shares its build; then only the plan-table
    step made from its step is dropped, as for a step parked for another job (Note [Reuse under a
    planner] in tensile_tf/runtime/traced_step_reuse.py): the run's plans, its tables with them."""
    shared = SHARED_BUILDS.get(build_key(args, j))
    if shared is None or shared["runs_left"] == 0:
        job["stream"].release()
        SHARED_BUILDS.pop(build_key(args, j), None)
    else:
        from tensile_tf.tf.rewrite.plan_table import forget_table_step

        forget_table_step(job["step"])
