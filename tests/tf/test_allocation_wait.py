"""Note [Waiting for frees] (tf_plugin/allocator/tf_pool_allocator.cc): an op
kernel's allocation that does not fit waits for other jobs' frees, within
a bound, instead of failing at once. Synchronised on what the pool records
(how many allocations wait), never on timing."""
from tests.conftest import last_json_line, run_python

SCRIPT = """
import json, threading, time
import tensile_tf
tensile_tf.install("64MiB")
import tensorflow as tf
import tf_plugin
from tensile_tf.tf.pool import JobStream, allocation_wait, pool_stats

plugin = tf_plugin._plugin
holder, asker = JobStream("holder"), JobStream("asker")
N = 40 * 2**20 // 4          # 40 MiB of float32: two do not fit 64 MiB
with holder.eager_scope():
    held = [tf.fill([N], 1.0)]
out = {{}}

def ask():
    try:
        with asker.eager_scope():
            out["sum"] = float(tf.reduce_sum(tf.fill([N], 2.0)))
    except tf.errors.ResourceExhaustedError as e:
        out["error"] = "ResourceExhaustedError"

ooms_before = pool_stats()["num_ooms"]
with allocation_wait({wait_ms}):
    t = threading.Thread(target=ask)
    t.start()
    if {free}:
        deadline = time.monotonic() + 60
        while plugin.allocation_wait_stats()["waiting"] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)     # polls what the pool records: the asker is waiting
        held.clear()              # the holder frees its 40 MiB
    t.join()
stats = plugin.allocation_wait_stats()
print(json.dumps({{"out": out, "waits": stats["waits"], "served": stats["served"], "waiting": stats["waiting"],
                  "ooms": pool_stats()["num_ooms"] - ooms_before}}))
"""


def test_an_allocation_that_does_not_fit_is_served_once_another_job_frees():
    r = last_json_line(run_python(SCRIPT.format(wait_ms=60_000, free=True)))
    assert r["out"] == {"sum": 2.0 * 40 * 2**20 // 4}, r
    assert r["waits"] == 1 and r["served"] == 1 and r["waiting"] == 0 and r["ooms"] == 0, r


def test_without_a_free_the_wait_ends_in_an_out_of_memory_error():
    r = last_json_line(run_python(SCRIPT.format(wait_ms=50, free=False)))
    assert r["out"] == {"error": "ResourceExhaustedError"}, r
    assert r["waits"] == 1 and r["served"] == 0 and r["ooms"] == 1, r


def test_with_waiting_off_it_fails_at_once():
    r = last_json_line(run_python(SCRIPT.format(wait_ms=0, free=False)))
    assert r["out"] == {"error": "ResourceExhaustedError"} and r["waits"] == 0 and r["ooms"] == 1, r
