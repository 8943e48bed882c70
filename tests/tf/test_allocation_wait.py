"""Note [Waiting for frees] (tf_plugin/allocator/tf_pool_allocator.cc): an op
kernel's allocation that does not fit waits for other jobs' frees, within
a bound, instead of failing at once. Synchronised on what the pool records
(how many allocations wait), never on timing."""
import pytest

from tests.conftest import last_json_line, run_python

SCRIPT = """
import json, threading, time
import tensile_tf
tensile_tf.install("64MiB")
import tensorflow as tf
import tf_plugin
from tensile_tf.tf.pool import JobStream, allocation_wait, pool_stats

plugin = tf_plugin._plugin
N = 40 * 2**20 // 4          # 40 MiB of float32: two do not fit 64 MiB


def scenario(k, wait_ms, free):
    holder, asker = JobStream(f"holder{k}"), JobStream(f"asker{k}")
    with holder.eager_scope():
        held = [tf.fill([N], 1.0)]
    out = {}

    def ask():
        try:
            with asker.eager_scope():
                out["sum"] = float(tf.reduce_sum(tf.fill([N], 2.0)))
        except tf.errors.ResourceExhaustedError:
            out["error"] = "ResourceExhaustedError"

    before, ooms_before = plugin.allocation_wait_stats(), pool_stats()["num_ooms"]
    with allocation_wait(wait_ms):
        t = threading.Thread(target=ask)
        t.start()
        if free:
            deadline = time.monotonic() + 60
            while plugin.allocation_wait_stats()["waiting"] == 0 and time.monotonic() < deadline:
                time.sleep(0.001)     # polls what the pool records: the asker is waiting
            held.clear()              # the holder frees its 40 MiB
        t.join()
    held.clear()
    stats = plugin.allocation_wait_stats()
    return {"out": out, "waits": stats["waits"] - before["waits"], "served": stats["served"] - before["served"],
            "waiting": stats["waiting"], "ooms": pool_stats()["num_ooms"] - ooms_before}


# one process, the three settings in turn (each scenario frees what it held)
print(json.dumps({"off": scenario(0, 0, False), "bounded": scenario(1, 50, False),
                  "served": scenario(2, 60_000, True)}))
"""


@pytest.fixture(scope="module")
def scenarios():
    return last_json_line(run_python(SCRIPT))


def test_an_allocation_that_does_not_fit_is_served_once_another_job_frees(scenarios):
    r = scenarios["served"]
    assert r["out"] == {"sum": 2.0 * 40 * 2**20 // 4}, r
    assert r["waits"] == 1 and r["served"] == 1 and r["waiting"] == 0 and r["ooms"] == 0, r


def test_without_a_free_the_wait_ends_in_an_out_of_memory_error(scenarios):
    r = scenarios["bounded"]
    assert r["out"] == {"error": "ResourceExhaustedError"}, r
    assert r["waits"] == 1 and r["served"] == 0 and r["ooms"] == 1, r


def test_with_waiting_off_it_fails_at_once(scenarios):
    r = scenarios["off"]
    assert r["out"] == {"error": "ResourceExhaustedError"} and r["waits"] == 0 and r["ooms"] == 1, r
