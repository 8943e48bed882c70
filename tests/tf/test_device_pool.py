"""TensorFlow integration: the device pool serves every CPU tensor."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tests.conftest import REPO_ROOT, last_json_line, run_python


def test_tensorflow_cpu_device_allocates_from_the_pool():
    before = tensile_tf.pool_stats()
    x = tf.random.stateless_normal([256, 256], seed=[1, 2])
    y = tf.matmul(x, x)
    after = tensile_tf.pool_stats()
    assert after["num_allocs"] > before["num_allocs"]
    assert after["current"] >= before["current"] + 2 * 256 * 256 * 4
    info = tf.config.experimental.get_memory_info("CPU:0")
    assert info["current"] == tensile_tf.pool_stats()["current"]
    assert info["peak"] >= info["current"] > 0
    del x, y


def test_stats_have_the_documented_keys():
    s = tensile_tf.pool_stats()
    for key in ("capacity", "current", "peak", "allocated", "freed", "num_ooms", "jobs",
                "largest_free_chunk", "fragmentation", "num_syncs", "num_allocs", "num_frees"):
        assert key in s
    assert s["capacity"] == 3 * 1024**3  # TENSILE_POOL_BYTES from conftest, parsed from "3GiB"


def test_keras_training_step_is_attributed_to_its_job():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.01)
    x = tf.random.stateless_normal([64, 32], seed=[1, 2])
    y = tf.random.stateless_normal([64, 1], seed=[1, 2])

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with tensile_tf.JobStream("attributed-mlp") as job:
        f = job.step_function(step)
        f(x, y)  # first call traces and creates optimizer state
        before = job.stats()["allocated"]
        for _ in range(3):
            f(x, y)
        stats = job.stats()
        # Each step allocates at least its activations (64x64 floats) in the job's stream.
        assert stats["allocated"] - before >= 3 * 64 * 64 * 4
        # The peak held a step's activations on top of what stays (they were freed since).
        assert stats["peak"] >= stats["current"] + 64 * 64 * 4
        events = [e for e in tensile_tf.pool_trace() if e["stream"] == job.stream and e["kind"] == "alloc"]
        ops = {e["op"] for e in events}
        assert any("MatMul" in op or "dense" in op for op in ops), ops
    # Released: the name is gone from the report.
    assert "attributed-mlp" not in tensile_tf.pool_stats()["jobs"]


def test_training_losses_and_weights_match_tensorflows_own_allocator():
    script = str(REPO_ROOT / "tests" / "tf" / "train_reference.py")
    with_pool = run_python(f"import runpy, sys; sys.argv=['x','--pool']; runpy.run_path({script!r}, run_name='__main__')")
    without = run_python(f"import runpy, sys; sys.argv=['x']; runpy.run_path({script!r}, run_name='__main__')")
    a, b = last_json_line(with_pool), last_json_line(without)
    assert a["losses"] == b["losses"]
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["pool"]["num_allocs"] > 100 and a["pool"]["peak"] > 0
    assert np.isfinite(a["losses"]).all()


def test_over_capacity_batch_raises_resource_exhausted_then_smaller_batch_trains():
    proc = run_python("""
        import json
        import tensorflow as tf
        import tensile_tf
        tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
        tensile_tf.configure_pool("48MiB")
        import keras
        model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.01)
        job = tensile_tf.JobStream("too-big")
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            g = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(g, model.trainable_variables))
            return loss
        f = job.step_function(step, reduce_retracing=True)
        out = {}
        try:
            f(tf.zeros([16384, 512]), tf.zeros([16384, 1]))
        except tf.errors.ResourceExhaustedError as e:
            out["error"] = str(e)
        out["after_oom"] = tensile_tf.pool_stats()
        out["loss"] = float(f(tf.ones([32, 512]), tf.ones([32, 1])))
        print(json.dumps(out))
    """)
    out = last_json_line(proc)
    assert "error" in out, out
    msg = out["error"]
    assert "OOM when allocating" in msg and "pool 'device' out of memory" in msg
    assert "raise the pool capacity" in msg and "largest" in msg
    assert out["after_oom"]["num_ooms"] >= 1
    assert np.isfinite(out["loss"])


def test_importing_after_tensorflow_created_devices_raises_clear_error():
    proc = run_python("""
        import tensorflow as tf
        tf.constant(1.0)
        try:
            import tensile_tf
            tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
        except ImportError as e:
            print("ERROR:", e)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERROR:" in proc.stdout
    assert "already created its devices" in proc.stdout and "tensile_tf.install()" in proc.stdout


def test_bfc_environment_variable_is_refused():
    proc = run_python("""
        try:
            import tensile_tf
            tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
        except ImportError as e:
            print("ERROR:", e)
    """, env={"TF_CPU_ALLOCATOR_USE_BFC": "1"})
    assert "TF_CPU_ALLOCATOR_USE_BFC is set" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_capacity_cannot_change_once_the_pool_exists():
    with pytest.raises(RuntimeError, match="already exists"):
        tensile_tf.configure_pool("1GiB")


def test_bad_capacity_string_is_explained():
    with pytest.raises(ValueError, match="cannot read 'lots' as a byte size"):
        tensile_tf.parse_bytes("lots", what="pool capacity")


def test_eager_allocations_inside_a_job_scope_are_attributed_to_the_job():
    with tensile_tf.JobStream("eager-job") as job:
        with job.eager_scope():
            v = tf.Variable(tf.zeros([128, 128]))
        assert job.stats()["current"] >= 128 * 128 * 4
        del v
        assert job.stats()["current"] == 0


def test_a_long_op_name_keeps_its_head_and_tail_in_the_trace():
    # Note [Truncated op names]: sibling ops differ at the end of their names.
    scope = "a_scope_name_long_enough_that_the_trace_must_cut_it/inner_scope/"

    @tf.function
    def two_ops(x):
        with tf.name_scope(scope):
            return tf.identity(tf.add(x, 1.0, name="first_sibling")), tf.multiply(x, 3.0, name="second_sibling")

    tensile_tf.tf.pool.device_pool().clear_trace()
    two_ops(tf.ones([128, 128]))
    traced = {e["op"] for e in tensile_tf.pool_trace() if e["kind"] == "alloc" and "~" in e["op"]}
    graph_ops = [op.name for op in two_ops.get_concrete_function(tf.ones([128, 128])).graph.get_operations()]
    first = next(n for n in graph_ops if n.endswith("first_sibling"))
    second = next(n for n in graph_ops if n.endswith("second_sibling"))
    assert len(first) > tensile_tf.tf.pool.TRACED_OP_NAME_BYTES
    assert all(len(t) == tensile_tf.tf.pool.TRACED_OP_NAME_BYTES for t in traced), traced
    assert [t for t in traced if tensile_tf.tf.pool.traced_op_matches(t, first)] != []
    assert [t for t in traced if tensile_tf.tf.pool.traced_op_matches(t, second)] != []
    assert {tensile_tf.tf.pool.traced_op_name(first), tensile_tf.tf.pool.traced_op_name(second)} <= traced
    assert not any(tensile_tf.tf.pool.traced_op_matches(t, first) and tensile_tf.tf.pool.traced_op_matches(t, second)
                   for t in traced)
