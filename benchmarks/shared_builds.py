"""Jobs built once for several runs of benchmarks/plan_execution_reference.py in one process.

Note [Builds shared by runs of one job]
Building a job (the model, its optimizer, tracing the step and its probe
step) was most of a run: the Transformer family's 8 runs took 116 s in one
process, and under cProfile tracing the step with Keras' Adam took 8-11 s of
a 17 s planned run. Runs of the same job (same model, shapes, batch,
optimizer and seed: ``build_key``) in one ``--variants`` process therefore
build it once: the job's variables (model and optimizer, slots and
iteration included) are read right after its probe step, and every later
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


# Note [Builds shared by runs of one job]: build_key -> {"job": the built job, "values": its variables' values
# after the probe step, "runs_left": later runs that use it}; set by main() for keys used by several variants
SHARED_BUILDS: dict[tuple, dict] = {}


def build_key(args, j: int) -> tuple:
    """What a job's build depends on (Note [Builds shared by runs of one job])."""
    return (args.model, args.input_shape, args.batch, args.optimizer, args.model_args, args.recompute_segments,
            args.grappler_memory, j)


def job_variables(job: dict) -> list:
    return list(job["model"].variables) + list(job["opt"].variables)


def job_for_run(args, j: int, tag: str, build) -> dict:
    """Job ``j`` of a run: built now, or the shared build with its values set back to
    what they were after its probe step (Note [Builds shared by runs of one job]);
    ``build(args, name, seed, stream_name)`` builds a job."""
    shared = SHARED_BUILDS.get(build_key(args, j))
    if shared is None:
        return build(args, f"job{j}", j, f"{tag}job{j}")
    if "job" not in shared:
        shared["job"] = build(args, f"job{j}", j, f"shared{len(SHARED_BUILDS)}.{tag}job{j}")
        # copies: an array that aliases a variable's pool buffer (numpy() on the CPU) would keep it in the pool
        # after the step writes the variable (copy on write) or a plan swaps it out
        shared["values"] = [v.numpy().copy() for v in job_variables(shared["job"])]
    else:
        with shared["job"]["stream"].eager_scope():
            for v, x in zip(job_variables(shared["job"]), shared["values"]):
                v.assign(x)
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
