"""Notes [Input data on the host] and [Just-in-time batches]
(tensile_tf/jobs/job.py): a YAML job's synthetic batches stay in host memory and the
pool holds the batch a step reads (and the next with ``data.prefetch``), however
many batches the job cycles through."""
import numpy as np
import pytest

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tensile_tf.config.schema import JobSpec  # noqa: E402
from tensile_tf.jobs.job import HostBatches, synthetic_batches  # noqa: E402
from tensile_tf.tf.pool import JobStream  # noqa: E402

MiB = 2**20


@pytest.mark.parametrize("prefetch, device_batches", [(False, 1), (True, 2)])
def test_the_pool_holds_the_steps_batch_while_the_host_holds_all_six(prefetch, device_batches):
    spec = JobSpec.model_validate({"name": "host-data", "model": {"builder": "tensile_tf.jobs.zoo:mlp"},
                                   "input_shape": [1024], "batch_size": 256, "steps": 9,
                                   "data": {"num_batches": 6, "prefetch": prefetch}})
    assert spec.data.device_batches == device_batches
    batches = synthetic_batches(spec, (1024,), 10)
    assert isinstance(batches, HostBatches) and len(batches.host) == 6
    x_bytes = 256 * 1024 * 4                    # 1 MiB of float32 per batch, and 1 KiB of labels
    stream = JobStream("host-data")
    seen = []
    try:
        with stream.eager_scope():
            for _ in range(9):                  # the job thread keeps only the batch it steps on
                batch = batches()
                seen.append(batch[0].numpy()[0, :4].copy())
                held = stream.stats()["current"]
                assert device_batches * x_bytes <= held < (device_batches + 1) * x_bytes, held / MiB
        # the values cycle through the six host batches in order; the first is the seed's first draw
        for k, first in enumerate(seen):
            np.testing.assert_array_equal(first, batches.host[k % 6][0][0, :4])
        first_draw = np.random.default_rng(spec.seed).standard_normal((256, 1024), dtype=np.float32)
        np.testing.assert_array_equal(batches.host[0][0], first_draw)
    finally:
        del batch
        stream.release()


def test_one_device_batch_when_asked():
    host = [(np.full((4, 2), k, np.float32),) for k in range(3)]
    batches = HostBatches(host, device_batches=1)
    assert [float(batches()[0].numpy()[0, 0]) for _ in range(5)] == [0.0, 1.0, 2.0, 0.0, 1.0]


def test_a_steps_dataset_is_iterated_as_it_is_with_tf_datas_autotuning_off():
    # Note [No autotuning thread per job] (tensile_tf/jobs/datasets.py): the same batches, in order
    import tensorflow as tf

    from tensile_tf.jobs.job import TrainStep

    dataset = tf.data.Dataset.range(10).map(lambda i: (i * 2, i), num_parallel_calls=tf.data.AUTOTUNE).batch(3)
    assert dataset.options().autotune.enabled is None   # the control: tf.data's default (on)
    step = TrainStep(step_fn=lambda *batch: 0.0, batches=dataset)
    got = [tuple(int(t[0]) for t in step.next_batch()) for _ in range(5)]   # past its end: iterated again
    assert step._iterator._dataset.options().autotune.enabled is False
    assert got == [(0, 0), (6, 3), (12, 6), (18, 9), (0, 0)]
