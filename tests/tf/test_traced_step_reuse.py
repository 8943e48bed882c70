"""Note [Reusing a finished job's traced step] (tensile_tf/runtime/traced_step_reuse.py):
a job like an ended one (but for name, seed, length, learning rate and batch
size) trains the ended job's traced step from its own initial values, bit for
bit what its own trace trains; a step is traced once for every batch size
unless its code needs one (Note [One trace for every batch size]); parked
steps give their memory back when a job needs it."""
import numpy as np
import pytest
import tensorflow as tf

import tensile_tf
from tensile_tf.config.schema import JobSpec
from tensile_tf.jobs.job import Job
from tensile_tf.runtime import JobHost, JobRecord, JobStatus
from tensile_tf.runtime.traced_step_reuse import PARKED_PREFIX, batch_size_traced, reuse_key, trace_step
from tests.conftest import last_json_line, run_python


def spec(name, seed, lr, batch=64, **kw):
    return JobSpec.model_validate(dict(
        name=name, model={"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [128, 64]}}, input_shape=[64],
        batch_size=batch, optimizer={"name": "adam", "learning_rate": lr}, seed=seed, steps=kw.pop("steps", 6),
        data={"kind": "digits", "validation_split": 0.2}, **kw))


JOBS = [spec("a", 1, 1e-3), spec("b", 2, 3e-3), spec("c", 3, 1e-2, batch=32), spec("d", 4, 1e-2, steps=4)]


def _run(reuse: bool):
    host = JobHost(concurrency=1, record_weights=True, reuse_traced_steps=reuse)
    states = [host.submit(Job.from_spec(s)) for s in JOBS]
    host.run()
    return host, {s.name: s for s in states}


@pytest.fixture(scope="module")
def runs():
    return _run(True), _run(False)


def test_a_job_like_an_ended_one_trains_its_traced_step_bit_for_bit(runs):
    (host, reused), (_, own) = runs
    # each differs from the job before it in seed, learning rate, length or batch size only
    # (c at batch 32 trains the step traced for every batch size: Note [One trace for every batch size])
    assert [reused[n].traced_step_from for n in "abcd"] == [None, "a", "b", "c"]
    assert all(s.traced_step_from is None for s in own.values())   # each traced for its own batch's shapes
    assert host.shelf.taken == 3
    for name in "abcd":
        mine, theirs = reused[name], own[name]
        assert mine.status == theirs.status == JobStatus.finished, (name, mine.error)
        assert [r.loss for r in mine.records] == [r.loss for r in theirs.records], name
        assert mine.weights_digest == theirs.weights_digest, name
        assert [v.loss for v in mine.validation] == [v.loss for v in theirs.validation], name   # the validator too
        assert mine.leaked_bytes == 0
    assert JobRecord.of(reused["b"]).traced_step_from == "a"   # results.json says whose step it trained
    # the run's end dropped every parked step and gave its bytes back
    assert not [n for n in tensile_tf.pool_stats()["jobs"] if n.startswith(PARKED_PREFIX)]


def test_what_a_step_compiles_in_keeps_jobs_apart():
    base = spec("x", 1, 1e-3)
    same = [base.model_copy(update=u) for u in ({"name": "y"}, {"seed": 7}, {"steps": 3})]
    assert all(reuse_key(s) == reuse_key(base) for s in same)
    assert reuse_key(spec("y", 1, 5e-2)) == reuse_key(base)   # the learning rate is a variable the step reads
    other = JobSpec.model_validate({**base.model_dump(), "optimizer": {"name": "adam", "args": {"beta_1": 0.5}}})
    assert reuse_key(other) != reuse_key(base)   # beta_1 is a constant in the traced graph
    assert reuse_key(spec("y", 1, 1e-3, batch=32)) == reuse_key(base)   # checked against the parked trace's
    factory = JobSpec.model_validate({"name": "f", "model": {"train_step_factory": "tests.job_factories:dense_regression"},
                                      "steps": 2})
    assert reuse_key(factory) is None   # what a user's own step captures is theirs


def test_a_step_is_traced_once_for_every_batch_size_unless_its_code_needs_one():
    w = tf.Variable(tf.ones([4, 2]))
    free = tf.function(lambda x, y: tf.reduce_mean(tf.matmul(x, w)) + tf.reduce_mean(y))

    def needs_a_size(x, y):   # Python arithmetic on the batch size: no trace without one
        return tf.reduce_mean(tf.matmul(x, w)) * (x.shape[0] // 2) + tf.reduce_mean(y)

    fixed = tf.function(needs_a_size)
    batch = (np.ones([8, 4], np.float32), np.zeros([8], np.float32))
    for step in (free, fixed):
        trace_step(step, batch, any_batch=True)
        step(np.ones([3, 4], np.float32), np.zeros([3], np.float32))
    assert batch_size_traced(free.get_concrete_function(*batch)) is None
    assert free.experimental_get_tracing_count() == 1   # batch 3 ran the batch-free trace
    assert batch_size_traced(fixed.get_concrete_function(*batch)) == 8   # parked: taken only at batch 8
    assert fixed.experimental_get_tracing_count() == 2   # batch 8, then batch 3: each its own trace
    exact = tf.function(lambda x, y: tf.reduce_mean(x) + tf.reduce_mean(y))
    trace_step(exact, batch, any_batch=False)
    assert batch_size_traced(exact.get_concrete_function(*batch)) == 8


MAKE_ROOM_SCRIPT = """
    import json
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    from tensile_tf.config.schema import JobSpec
    from tensile_tf.jobs.job import Job
    from tensile_tf.runtime import JobHost
    def spec(name, hidden, steps):
        return JobSpec.model_validate(dict(name=name, model={{"builder": "tensile_tf.jobs.zoo:mlp",
            "args": {{"hidden": hidden}}}}, input_shape=[784], batch_size=64, steps=steps, seed=1))
    host = JobHost(pool_bytes="{pool}", concurrency=1, admission="sum")
    states = [host.submit(Job.from_spec(spec("small", [1024, 1024], 3))),
              host.submit(Job.from_spec(spec("large", [1536, 1536], 3)))]
    result = host.run()
    print(json.dumps({{"jobs": [dict(name=s.name, status=s.status.value, error=s.error, P=s.persistent_bytes,
                                    T=s.temporary_bytes, leaked=s.leaked_bytes) for s in states],
                      "evicted": host.shelf.evicted, "ooms": result.pool.run_ooms, "current": result.pool.current}}))
"""


def test_a_parked_step_gives_its_memory_to_a_job_that_needs_it():
    # "small" parks ~22 MiB when it ends; "large" (~44 MiB of variables and slots, and its
    # activations) fits the 64 MiB pool only once the parked step is dropped.
    proc = run_python(MAKE_ROOM_SCRIPT.format(pool="64MiB"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json_line(proc)
    jobs = {j["name"]: j for j in out["jobs"]}
    assert jobs["small"]["status"] == jobs["large"]["status"] == "finished", out
    small, large = jobs["small"], jobs["large"]
    assert small["P"] + large["P"] + large["T"] > 64 * 2**20, out   # "large" never fits beside the parked step
    # dropped once to make room for "large", once ("large"'s own) at the run's end
    assert out["evicted"] == 2 and out["current"] == 0 and all(j["leaked"] == 0 for j in jobs.values()), out


def planned_spec(name, seed, lr, batch=128):
    return JobSpec.model_validate(dict(
        name=name, model={"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [512, 512]}}, input_shape=[784],
        batch_size=batch, optimizer={"name": "adam", "learning_rate": lr}, seed=seed, steps=4))


def _run_planned(specs, reuse: bool):
    # 4 MiB for jobs of ~8 MiB of variables and slots and ~4 MiB of activations: every plan swaps
    host = JobHost(concurrency=1, record_weights=True, reuse_traced_steps=reuse, planner="tensile",
                   plan_budget="4MiB", swap_bandwidth="1TiB")
    states = [host.submit(Job.from_spec(s)) for s in specs]
    host.run()
    return host, {s.name: s for s in states}


def test_under_a_planner_a_job_takes_over_the_unplanned_step_and_is_planned_as_its_own():
    """Note [Reuse under a planner]: the parked step is the one plans are made from; the job that
    takes it over is captured and planned from it, and trains bit for bit what its own trace and
    plan train (control: reuse off)."""
    specs = [planned_spec("a", 1, 1e-3), planned_spec("b", 2, 3e-3), planned_spec("c", 3, 1e-2, batch=64)]
    host, reused = _run_planned(specs, reuse=True)
    _, own = _run_planned(specs[:2], reuse=False)
    # c's batch differs: with a planner a step is traced for its own batch, so c traces its own
    assert [reused[n].traced_step_from for n in "abc"] == [None, "a", None]
    assert host.shelf.taken == 1 and own["b"].traced_step_from is None
    # Note [Captures kept with the step]: b is planned from a's capture, not profiled again, so its
    # plan at the same budget is a's; without reuse it is captured itself
    assert [reused[n].captured_from for n in "abc"] == [None, "a", None] and own["b"].captured_from is None
    # (their first plans: a later one follows drifted latencies)
    assert reused["b"].plan_history[0].swap_outs == reused["a"].plan_history[0].swap_outs
    for name in "abc":
        s = reused[name]
        assert s.status == JobStatus.finished and s.leaked_bytes == 0, (name, s.error)
        # the plan b ran is its own, made from the step it took over: it swaps
        assert s.plan_history[-1].swap_outs > 0 and s.plan_history[-1].budget_bytes == 4 << 20, s.plan_history
    for name in "ab":
        assert [r.loss for r in reused[name].records] == [r.loss for r in own[name].records], name
        assert reused[name].weights_digest == own[name].weights_digest, name
    assert not [n for n in tensile_tf.pool_stats()["jobs"] if n.startswith(PARKED_PREFIX)]
