"""Note [Incremental pool footprint] (scheduler/incremental_pool_sum.py): the
pool footprint kept and updated by deltas equals the full sum of every job's
footprint, on random jobs, offsets and absences added, removed and put back."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensile_tf.scheduler.access_sequence import TensorAccessSequence
from tensile_tf.scheduler.incremental_pool_sum import IncrementalPoolSum
from tensile_tf.scheduler.peak_analysis import JobFootprint, PoolTimeline, gpu_memory_peak_analysis
from tensile_tf.scheduler import UniformLatency
from tests.scheduler.graphs import recompute_graph
from tests.scheduler.test_planner_properties import scenarios


def full_sum(timeline: PoolTimeline, fs) -> np.ndarray:
    """The sum as Algorithm 1 takes it: every job's footprint gathered at every grid point."""
    total = np.zeros(len(timeline.grid), dtype=np.int64)
    for F, idx in zip(fs, timeline.idx):
        total += np.append(F, 0)[idx]
    return total


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_incremental_sum_equals_the_full_sum_on_random_absences(scenario, data):
    jobs, _, _ = scenario
    tases = [TensorAccessSequence(pj.graph, pj.latencies) for pj in jobs]
    fps = [JobFootprint(t) for t in tases]
    timeline = PoolTimeline(tases, [pj.start_offset_s for pj in jobs])
    small = IncrementalPoolSum(timeline.idx, timeline.ns, block=3)   # many blocks even on a small grid
    added = []
    checked = 0
    for _ in range(data.draw(st.integers(1, 12))):
        j = data.draw(st.integers(0, len(jobs) - 1))
        fp, n = fps[j], tases[j].n
        action = data.draw(st.sampled_from(["add", "add", "remove", "restart"]))
        if action == "remove" and added:
            jj, i, ranges = added.pop(data.draw(st.integers(0, len(added) - 1)))
            fps[jj].remove_absence(i, ranges)
        elif action == "restart":        # a rebuild's new footprint object, as an undone round puts back
            fps[j] = JobFootprint(tases[j])
            added = [a for a in added if a[0] != j]
        elif n > 1:
            i = data.draw(st.integers(0, len(tases[j].tensor_names) - 1))
            lo = data.draw(st.integers(0, n - 1))
            hi = data.draw(st.integers(lo + 1, lo + n - 1))
            added.append((j, i, fp.add_absence(i, lo, hi)))
        fs = [f.F for f in fps]
        want = full_sum(timeline, fs)
        assert np.array_equal(timeline.pool_footprint(fs), want)
        assert np.array_equal(small.footprint(fs), want)
        assert timeline.pool_peak(fs) == small.peak(fs) == int(want.max())
        assert small.argmax(fs) == int(np.argmax(want))
        pa = gpu_memory_peak_analysis(fps, timeline)
        assert pa.peak_bytes == int(want.max()) and pa.peak_time_s == float(timeline.grid[np.argmax(want)])
        checked += 1
    assert checked > 0


def test_a_footprint_of_another_length_is_refused():
    tases = [TensorAccessSequence(recompute_graph(), UniformLatency(1.0))]
    timeline = PoolTimeline(tases, [0.0] * len(tases))
    fs = [JobFootprint(t).F for t in tases]
    fs[0] = np.append(fs[0], 7)
    try:
        timeline.pool_peak(fs)
    except ValueError as e:
        assert "footprint has" in str(e)
    else:
        raise AssertionError("a footprint one step longer than its sequence was summed")
