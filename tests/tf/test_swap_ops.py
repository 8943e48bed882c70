"""Swap ops on their own: host store bound, bandwidth cap, late swap-ins,
the channel's lanes (one, or one per direction)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_plugin import swap


@pytest.fixture(autouse=True)
def _restore_settings():
    yield
    swap.configure_host_store(16 << 30)
    swap.configure_host_cache(2 << 30)
    swap.set_swap_bandwidth(0)
    swap.drain_swap_channel()
    swap.set_swap_lanes(1)
    swap.set_swap_combined_bandwidth(0)


def _roundtrip(n, event=""):
    @tf.function
    def f(x):
        if event:
            # First in program order, so tf.function's automatic control
            # dependencies run it before the swap-in completes: a late probe.
            swap.ops.tensile_swap_check(event=event)
        h = swap.ops.tensile_swap_out(x * 1.0, label="t")
        y = swap.ops.tensile_swap_in(h, T=tf.float32, shape=[n], label="t", event=event)
        return y + 0.0
    return f


def test_swap_roundtrip_is_exact_and_frees_host_copy():
    x = tf.random.stateless_normal([4096], seed=[1, 2])
    before = swap.host_store_stats()
    y = _roundtrip(4096)(x)
    assert np.array_equal(x.numpy(), y.numpy())
    after = swap.host_store_stats()
    assert after["current"] == before["current"]
    assert after["allocated"] - before["allocated"] == 4096 * 4


def test_host_buffers_are_reused_by_later_swap_outs_of_the_same_size():
    """Policy 5 of host_store.h: a freed host copy's buffer serves the next
    swap-out of its size class; with the cache off every swap-out allocates."""
    n = 100_000  # 400,000 bytes: size class 401,408 (98 pages)
    f = _roundtrip(n)
    x = tf.random.stateless_normal([n], seed=[1, 2])
    f(x)
    before = swap.host_store_stats()
    for _ in range(3):
        assert np.array_equal(f(x).numpy(), x.numpy())
    after = swap.host_store_stats()
    assert after["cache_hits"] - before["cache_hits"] == 3
    assert after["cache_misses"] == before["cache_misses"]
    assert after["cached"] >= 401_408 and after["current"] == before["current"]

    swap.configure_host_cache(0)  # frees what is cached; nothing is kept from now on
    assert swap.host_store_stats()["cached"] == 0
    f(x)
    off = swap.host_store_stats()
    assert (off["cache_hits"], off["cache_misses"], off["cached"]) == (
        after["cache_hits"], after["cache_misses"] + 1, 0)


def test_transfer_log_records_each_transfer_in_order():
    n = 4096
    f = _roundtrip(n)
    f(tf.ones([n]))
    swap.drain_swap_channel()
    swap.set_swap_log_capacity(8)
    try:
        f(tf.ones([n]))
        swap.drain_swap_channel()
        log = swap.swap_channel_log()
        assert [r["kind"] for r in log] == ["swap_out", "swap_in"]
        for r in log:
            assert r["bytes"] == n * 4
            assert r["submitted_ns"] <= r["not_before_ns"] <= r["start_ns"] <= r["end_ns"]
        assert log[0]["end_ns"] <= log[1]["start_ns"]  # one link: the swap-in after the swap-out
    finally:
        swap.set_swap_log_capacity(0)
    assert swap.swap_channel_log() == []


def test_host_store_is_bounded_with_a_clear_error():
    swap.configure_host_store(1024)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="host store out of memory"):
        _roundtrip(4096)(tf.ones([4096]))
    assert swap.host_store_stats()["num_rejected"] >= 1


def test_bandwidth_cap_is_honoured():
    n = 256 * 1024  # 1 MiB out and 1 MiB in
    f = _roundtrip(n)
    f(tf.ones([n]))  # trace outside the timing
    cap = 10 * 2**20
    swap.drain_swap_channel()     # nothing an earlier test queued is logged as this test's
    swap.set_swap_bandwidth(cap)  # 10 MiB/s: >= 0.1 s for each MiB
    swap.set_swap_log_capacity(16)
    y = f(tf.ones([n]))
    assert float(tf.reduce_sum(y)) == n
    # what the channel recorded: each transfer held the one link for its bytes at the cap,
    # one after the other (a loaded machine only makes them longer)
    log = swap.swap_channel_log()
    assert [(t["kind"], t["bytes"]) for t in log] == [("swap_out", 4 * n), ("swap_in", 4 * n)], log
    for t in log:
        assert t["end_ns"] - t["start_ns"] >= 0.99e9 * t["bytes"] / cap, t
    assert log[1]["start_ns"] >= log[0]["end_ns"], log
    swap.set_swap_log_capacity(0)


def test_late_swap_in_waits_and_is_counted():
    n = 256 * 1024
    f = _roundtrip(n, event="late-test")
    x = tf.random.stateless_normal([n], seed=[1, 2])
    f(x)
    swap.set_swap_bandwidth(20 * 2**20)
    swap.reset_swap_stats()
    y = f(x)  # the consumer must wait for the slow link and read the real data
    assert np.array_equal(x.numpy(), y.numpy())
    stats = swap.swap_channel_stats()
    assert stats["checked_swap_ins"] == 1 and stats["late_swap_ins"] == 1


def test_variable_swap_leaves_and_reenters_the_pool():
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    v = tf.Variable(tf.random.stateless_normal([512, 512], seed=[1, 2]))
    value = v.numpy()

    @tf.function
    def out():
        swap.ops.tensile_var_swap_out(v.handle)

    @tf.function
    def back():
        swap.ops.tensile_var_swap_in(v.handle)

    before = tensile_tf.pool_stats()["current"]
    out()
    swap.drain_swap_channel()
    assert tensile_tf.pool_stats()["current"] <= before - 512 * 512 * 4
    assert swap.host_store_stats()["current"] >= 512 * 512 * 4
    back()
    swap.drain_swap_channel()
    assert np.array_equal(v.numpy(), value)


def _out_beside_in(n):
    """A swap-out of x beside a swap-in of the copy behind h: no edge between
    the two, so both are submitted as soon as the step starts (a graph of
    its own: tf.function would chain the two stateful ops in program order)."""
    def f(x, h):
        hx = swap.ops.tensile_swap_out(x * 1.0, label="beside:out")
        y = swap.ops.tensile_swap_in(h, T=tf.float32, shape=[n], label="beside:in")
        return hx, y + 0.0
    return tf.compat.v1.wrap_function(f, [tf.TensorSpec([n], tf.float32), tf.TensorSpec([], tf.int64)])


@tf.function
def _out_only(x):
    return swap.ops.tensile_swap_out(x * 1.0, label="first:out")


@pytest.mark.parametrize("lanes", [2, 1])
def test_a_lane_per_direction_runs_a_swap_out_beside_a_swap_in(lanes):
    """Policy 2 of swap_channel.h, by the channel's own log: on two lanes the
    swap-out runs on lane 0 while the swap-in runs on lane 1; on one lane
    (the control) one waits for the other. Certain by construction: both
    are due at once and each holds its lane for 0.5 s (1 MiB at 2 MiB/s
    a lane; on two lanes 4 MiB/s each way, capped at 4 MiB/s both ways:
    policy 3), so on two lanes they overlap unless the executor submitted
    them 0.5 s apart."""
    n = 256 * 1024
    a = tf.random.stateless_normal([n], seed=[1, 2])
    b = tf.random.stateless_normal([n], seed=[3, 4])
    f = _out_beside_in(n)
    swap.set_swap_lanes(lanes)
    swap.drain_swap_channel()
    h = _out_only(a)          # a's host copy, for the swap-in; unlimited link
    hb = _out_only(b)
    f(b, hb)                  # traced, outside the log (and b's copy read back)
    swap.drain_swap_channel()
    if lanes == 2:
        swap.set_swap_bandwidth(4 * 2**20)
        swap.set_swap_combined_bandwidth(4 * 2**20)
    else:
        swap.set_swap_bandwidth(2 * 2**20)
    assert swap.swap_channel_stats()["lane_bytes_per_s"] == 2 * 2**20
    assert swap.swap_channel_stats()["lanes"] == lanes == swap.swap_lanes()
    swap.set_swap_log_capacity(16)
    try:
        hx, y = f(b, h)
        swap.drain_swap_channel()
        log = swap.swap_channel_log()
    finally:
        swap.set_swap_log_capacity(0)
        swap.set_swap_bandwidth(0)
    assert np.array_equal(y.numpy(), a.numpy())
    (out,) = [r for r in log if r["kind"] == "swap_out"]
    (back,) = [r for r in log if r["kind"] == "swap_in"]
    assert out["bytes"] == back["bytes"] == 4 * n
    for r in (out, back):
        assert r["end_ns"] - r["start_ns"] >= 0.99e9 * r["bytes"] / (2 * 2**20), r
    overlap_ns = min(out["end_ns"], back["end_ns"]) - max(out["start_ns"], back["start_ns"])
    if lanes == 2:
        assert (out["lane"], back["lane"]) == (0, 1)
        assert overlap_ns > 0, log
    else:
        assert (out["lane"], back["lane"]) == (0, 0)
        assert overlap_ns <= 0, log
    assert np.array_equal(_roundtrip_in(n)(hx).numpy(), b.numpy())   # b's host copy read back: nothing left over


def _roundtrip_in(n):
    @tf.function
    def g(h):
        return swap.ops.tensile_swap_in(h, T=tf.float32, shape=[n], label="beside:back") + 0.0
    return g
