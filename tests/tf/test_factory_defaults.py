"""Issue 57: a train_step_factory's own ``batch_size`` default stands unless
the job sets one (the config's default of 32 used to replace it), and an
out-of-memory's advice names the key that sets the job's batch size, or none."""
from types import SimpleNamespace

from tensile_tf.config.schema import JobSpec
from tensile_tf.jobs.job import batch_size_key, build_train_step
from tensile_tf.runtime.failures import oom_remedy

HOG = "tests.job_factories:activation_hog"      # batch_size=1024 by default


def _spec(**fields):
    return JobSpec.model_validate({"name": "j", "steps": 1, **fields})


def test_a_factory_keeps_its_batch_size_default_unless_the_job_sets_one():
    kept = build_train_step(_spec(model={"train_step_factory": HOG, "args": {"width": 128}}))
    assert kept.batches[0][0].shape[0] == 1024
    set_ = build_train_step(_spec(model={"train_step_factory": HOG, "args": {"width": 128}}, batch_size=8))
    assert set_.batches[0][0].shape[0] == 8


def test_out_of_memory_advice_names_the_key_that_sets_the_batch_size():
    def remedy(spec):
        return oom_remedy(SimpleNamespace(job=SimpleNamespace(spec=spec), plan=None))

    builder = _spec(model={"builder": "tensile_tf.jobs.zoo:mlp"}, input_shape=[4], batch_size=64)
    assert batch_size_key(builder) == ("batch_size", 64) and "`batch_size:` (now 64)" in remedy(builder)
    factory = _spec(model={"train_step_factory": HOG})
    assert batch_size_key(factory) is None and "batch_size" not in remedy(factory)
    in_args = _spec(model={"train_step_factory": HOG, "args": {"batch_size": 256}})
    assert "`model.args.batch_size:` (now 256)" in remedy(in_args)
    assert "`batch_size:` (now 16)" in remedy(_spec(model={"train_step_factory": HOG}, batch_size=16))


def test_an_out_of_memory_names_who_held_the_pool_largest_first():
    """Note [What held the pool] (runtime/failures.py), from the pool's per-stream counters."""
    from tensile_tf.runtime.failures import pool_holders

    jobs = {f"j{i}": {"current": i * 2**20} for i in range(9)}
    jobs.update({"default": {"current": 3 * 2**19}, "parked:j9": {"current": 5 * 2**20}})
    held = pool_holders(jobs)
    assert held.startswith("held then: j8 8.0 MiB, j7 7.0 MiB, j6 6.0 MiB, parked:j9 5.0 MiB, j5 5.0 MiB")
    assert held.endswith("and 4 more")              # j4, j3, j2, j1 and outside every job; j0 holds nothing
    assert "outside every job 1.5 MiB" in pool_holders({"default": {"current": 3 * 2**19}, "a": {"current": 0}})
    assert pool_holders({"a": {"current": 0}}) == ""
