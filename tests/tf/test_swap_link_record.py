"""results.json's planner.swap says what the emulated link ran at and what the planner planned for."""
def test_an_unset_link_says_what_the_planner_planned_for():
    """Issue 57 (a setting with two meanings): unset, the emulated link is unlimited (null) and
    the planner plans for 12 GiB/s; results.json's planner.swap says both."""
    from tensile_tf.runtime.records import SwapLinkRecord
    from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S

    unset = SwapLinkRecord.of(None, {})
    assert unset.bandwidth_bytes_per_s is None and unset.planned_bytes_per_s == DEFAULT_BANDWIDTH_BYTES_PER_S
    assert SwapLinkRecord.of(2**30, {}).planned_bytes_per_s == 2**30
