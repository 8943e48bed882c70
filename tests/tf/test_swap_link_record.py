"""results.json's planner.swap says what the emulated link ran at and what the planner planned for."""
def test_an_unset_link_says_what_the_planner_planned_for():
    """A record of a link in bytes per second plans for the same bandwidth; SwapLinkRecord keeps
    planning at 12 GiB/s where a link was recorded without one."""
    from tensile_tf.runtime.records import SwapLinkRecord
    from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S

    unset = SwapLinkRecord.of(None, {})
    assert unset.bandwidth_bytes_per_s is None and unset.planned_bytes_per_s == DEFAULT_BANDWIDTH_BYTES_PER_S
    assert SwapLinkRecord.of(2**30, {}).planned_bytes_per_s == 2**30


def test_an_unset_link_runs_at_what_the_planner_plans_for():
    """Issue 57 (a setting with two meanings): unset, ``run.swap_bandwidth`` is 12 GiB/s for the
    emulated link and for the planner alike."""
    from tensile_tf.runtime import JobHost
    from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S

    host = JobHost(planner="tensile")
    assert host.swap_bandwidth == DEFAULT_BANDWIDTH_BYTES_PER_S
    assert host.planning.settings.swap_bandwidth == DEFAULT_BANDWIDTH_BYTES_PER_S
    named = JobHost(planner="tensile", swap_bandwidth="h200-pcie5")
    assert named.swap_bandwidth is None and named.device_link == "h200-pcie5"   # resolved at the first plan
