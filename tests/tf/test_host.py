"""JobHost: concurrency, failure isolation, memory return, admission."""

import dataclasses

import numpy as np
import pytest

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tensile_tf.config.schema import JobSpec
from tensile_tf.runtime import JobHost, JobStatus
from tensile_tf.runtime.job_runtime import JobProgress
from tensile_tf.runtime.records import JobRecord
from tensile_tf.jobs.job import Job
from tests import job_factories
from tests.conftest import last_json_line, run_python


def spec(name, **kw):
    base = dict(name=name, model={"train_step_factory": "tests.job_factories:dense_regression",
                                  "args": kw.pop("args", {})}, steps=kw.pop("steps", 8))
    base.update(kw)
    return JobSpec.model_validate(base)


def test_jobs_run_concurrently_and_failures_stay_isolated():
    host = JobHost()
    ok = host.submit(Job.from_spec(spec("ok", steps=12)))
    boom = host.submit(Job.from_spec(spec("boom", steps=12, args={"fail_at_step": 4})))
    nan = host.submit(Job.from_spec(spec("nan", steps=12, args={"nan_at_step": 5})))
    user = host.submit(Job.from_train_step("user", job_factories.dense_regression(width=128), steps=6))
    result = host.run()

    assert ok.status == JobStatus.finished and ok.steps_done == 12
    assert user.status == JobStatus.finished and user.steps_done == 6
    assert boom.status == JobStatus.failed and "injected failure" in boom.error
    assert boom.steps_done == 4 and boom.error_type == "InvalidArgumentError"
    assert nan.status == JobStatus.failed and nan.error_type == "NonFiniteLoss"
    assert "loss became nan at step 5" in nan.error
    # Every job's pool memory came back, failed ones included.
    for s in (ok, boom, nan):
        assert s.leaked_bytes == 0, (s.name, s.leaked_bytes)
        assert s.persistent_bytes > 0 and s.temporary_bytes > 0 and s.peak_bytes > s.persistent_bytes
    assert all(name in ("default",) or not name.startswith(("ok", "boom", "nan"))
               for name in tensile_tf.pool_stats()["jobs"])
    # Admission let all four train at once (what the host recorded, not timing).
    assert result.most_jobs_running == 4
    assert np.isfinite([r.loss for r in ok.records]).all()
    assert result.samples and result.pool.run_ooms == 0
    # Note [Record apart from runtime]: an ended job keeps no TensorFlow object (each had a traced step, a
    # stream and a saved sample while it ran), its progress snapshot is its last step's, its records are frozen
    for s in (ok, boom, nan, user):
        rt = s.rt
        assert (rt.train, rt.step_fn, rt.job_stream, rt.first_batch, rt.batch_specs, rt.sample_inputs,
                rt.planned_step, rt.latency_monitor, rt.captured) == (None,) * 9 and not rt.custom_gradients, s.name
        assert s.progress == JobProgress(s.steps_done, s.last_loss, s.median_step_s) and s.progress.steps_done > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        ok.records[0].loss = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobRecord.of(ok).steps = 0


def test_duplicate_job_names_are_refused():
    host = JobHost()
    host.submit(Job.from_spec(spec("dup")))
    with pytest.raises(ValueError, match="already submitted"):
        host.submit(Job.from_spec(spec("dup")))


def test_a_run_that_never_replans_builds_no_plan_table_step():
    # Note [Table first, rewritten when ready]: the default plan step builds a table step only for re-plans
    assert JobHost(planner="tensile").planning.settings.plan_steps == "table_then_rewrite"
    assert JobHost(planner="tensile", replan=False).planning.settings.plan_steps == "rewrite"
    assert JobHost(planner="tensile", replan=False, plan_steps="table").planning.settings.plan_steps == "table"


def test_pool_size_mismatch_is_explained():
    with pytest.raises(RuntimeError, match="already exists"):
        JobHost(pool_bytes="1GiB")


ADMISSION_SCRIPT = """
    import json
    import tensorflow as tf
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs.job import Job
    from tensile_tf.config.schema import JobSpec
    def spec(name, batch, steps):
        return JobSpec.model_validate(dict(name=name, steps=steps, model=dict(
            train_step_factory="tests.job_factories:activation_hog", args=dict(batch_size=batch, width=4096))))
    host = JobHost(pool_bytes="{pool}", admission="{admission}")
    states = [host.submit(Job.from_spec(spec(n, b, 6))) for n, b in {jobs}]
    result = host.run()
    print(json.dumps({{"jobs": [dict(name=s.name, status=s.status.value, error=s.error, admitted=s.admitted_at_s,
                                    ended=s.ended_at_s, leaked=s.leaked_bytes, P=s.persistent_bytes,
                                    T=s.temporary_bytes) for s in states],
                      "ooms": result.pool.run_ooms, "peak": result.pool.peak,
                      "most_running": result.most_jobs_running}}))
"""


def test_admission_queues_jobs_the_pool_cannot_hold_at_once():
    # Each job holds ~17 MiB (its input batch and weights) and peaks ~17 MiB more
    # in a step (measured: P and T below). A 56 MiB pool holds one job at a time
    # under admission "sum" (P1 + P2 + T1 + T2 ~ 69 MiB > 56 MiB).
    proc = run_python(ADMISSION_SCRIPT.format(pool="56MiB", admission="sum",
                                              jobs=[("first", 1024), ("second", 1024), ("third", 1024)]))
    out = last_json_line(proc)
    jobs = {j["name"]: j for j in out["jobs"]}
    assert all(j["status"] == "finished" for j in jobs.values()), jobs
    assert out["ooms"] == 0
    # Queued, not crashed: each later job was admitted only after an earlier one ended.
    order = sorted(jobs.values(), key=lambda j: j["admitted"])
    for before, after in zip(order, order[1:]):
        assert after["admitted"] >= before["ended"] - 1e-6, (before, after)
    assert all(j["leaked"] == 0 for j in jobs.values())
    assert out["most_running"] == 1
    assert all(j["P"] + j["T"] <= 56 * 2**20 < 2 * (j["P"] + j["T"]) for j in jobs.values())


def test_job_that_can_never_fit_is_rejected_while_others_run():
    proc = run_python(ADMISSION_SCRIPT.format(pool="64MiB", admission="salus",
                                              jobs=[("small", 128), ("huge", 4096)]))
    out = last_json_line(proc)
    jobs = {j["name"]: j for j in out["jobs"]}
    assert jobs["small"]["status"] == "finished"
    assert jobs["huge"]["status"] == "rejected"
    assert "out of memory" in jobs["huge"]["error"] or "more than the pool" in jobs["huge"]["error"]
    assert jobs["huge"]["leaked"] == 0


def test_out_of_memory_mid_run_fails_only_that_job_and_returns_its_memory():
    proc = run_python("""
        import json
        import tensorflow as tf
        import tensile_tf
        tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
        from tensile_tf.runtime import JobHost
        from tensile_tf.jobs.job import Job
        from tests import job_factories
        host = JobHost(pool_bytes="48MiB", admission="none")
        steady = host.submit(Job.from_train_step("steady", job_factories.dense_regression(), steps=40))
        grows = host.submit(Job.from_train_step("grows", job_factories.growing_batch(grow_at_step=3), steps=40))
        result = host.run()
        print(json.dumps({s.name: dict(status=s.status.value, steps=s.steps_done, error=s.error,
                                       type=s.error_type, leaked=s.leaked_bytes) for s in (steady, grows)}
                         | {"ooms": result.pool.run_ooms, "current": result.pool.current}))
    """)
    out = last_json_line(proc)
    assert out["steady"]["status"] == "finished" and out["steady"]["steps"] == 40
    assert out["grows"]["status"] == "failed" and out["grows"]["type"] == "ResourceExhaustedError"
    assert out["grows"]["steps"] == 3
    assert "pool 'device' out of memory: job 'grows'" in out["grows"]["error"]
    assert out["grows"]["leaked"] == 0 and out["steady"]["leaked"] == 0
    assert out["ooms"] >= 1


def test_yaml_job_with_a_tf_data_pipeline_from_a_user_function():
    job = JobSpec.model_validate(dict(
        name="tfdata", model={"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [16]}}, input_shape=[32],
        data={"kind": "function", "function": "tests.job_factories:regression_dataset"}, batch_size=16,
        steps=12))
    host = JobHost()
    state = host.submit(Job.from_spec(job))
    host.run()
    assert state.status == JobStatus.finished and state.steps_done == 12  # 8 batches per pass: repeats
    assert state.leaked_bytes == 0
    assert len({round(r.loss, 6) for r in state.records}) > 1
