"""Note [Profiles of one job's steps] (tensile_tf/tf/profile_events.py): two jobs
whose raw ``tf.function`` steps run ops of the same names (``MatMul``, ``Sum``),
both recorded in one profile, one after the other. Each job's latency table
holds only its own steps' events; the control, every event by node name (the
reading before the note), sums both jobs' into one."""
import shutil
import tempfile
from types import SimpleNamespace as NS

import pytest
import tensorflow as tf

from tensile_tf.tf.capture import _latencies_from_xspace, _load_xspace, capture_job_graph
from tensile_tf.tf.pool import JobStream
from tensile_tf.tf.profile_events import bind_node_names, op_durations


def _job(name: str, n: int):
    w = tf.Variable(tf.ones((n, n)))

    @tf.function
    def raw(x):
        return tf.reduce_sum(tf.matmul(x, w))

    stream = JobStream(name)
    step = stream.step_function(raw)
    x = tf.ones((n, n))
    step(x)                       # traced and warm
    return stream, step, x, capture_job_graph(name, step, (x,))


@pytest.fixture(scope="module")
def profile():
    small, big = _job("small", 32), _job("big", 512)
    logdir = tempfile.mkdtemp(prefix="tensile_test_profile_")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            small[1](small[2])
            big[1](big[2])
        finally:
            tf.profiler.experimental.stop()
        xs = _load_xspace(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    yield xs, small[3], big[3]
    small[0].release()
    big[0].release()


def _matmul(events: dict) -> list[int]:
    return [d for node, ds in events.items() if node.rsplit("/", 1)[-1] == "MatMul" for d in ds]


def test_each_jobs_table_holds_only_its_own_steps_events(profile):
    xs, small, big = profile
    assert bind_node_names(small) != bind_node_names(big)          # the bind ops are named per stream
    everyone = op_durations(xs)                                     # the control: by node name alone
    mine, theirs = op_durations(xs, bind_node_names(small)), op_durations(xs, bind_node_names(big))
    assert len(_matmul(everyone)) == 2                              # both jobs' MatMul, under one name
    assert len(_matmul(mine)) == 1 and len(_matmul(theirs)) == 1
    assert sorted(_matmul(mine) + _matmul(theirs)) == sorted(_matmul(everyone))
    # the latency table of each job is made of its own events
    table = _latencies_from_xspace([xs], small, 1)
    matmul = next(o.name for o in small.ops if o.op_type == "MatMul")
    assert table.seconds[matmul] == pytest.approx(_matmul(mine)[0] * 1e-12)


def _event(meta, start, duration, step=None):
    """A hand-made XSpace event (metadata 1: Process, 2/4: bind ops of a/b, 3: MatMul)."""
    return NS(metadata_id=meta, offset_ps=start, duration_ps=duration,
              stats=[NS(metadata_id=1, int64_value=step)] if step is not None else [])


def _profile(events) -> NS:
    """An XSpace of one host thread holding ``events``."""
    plane = NS(name="/host:CPU", stat_metadata={1: NS(name="id")},
               event_metadata={1: NS(name="ExecutorState::Process"), 2: NS(name="TensileBindStep_a:TensileBindStep"),
                                3: NS(name="MatMul:MatMul"), 4: NS(name="TensileBindStep_b:TensileBindStep")},
               lines=[NS(name="tf_Compute/1", events=events)])
    return NS(planes=[plane])


def test_an_op_after_a_nested_process_event_belongs_to_the_outer_one():
    """A call run inline opens a Process event inside its caller's on the same thread: the caller's
    ops after it ended are still the caller's step's (the innermost event open at the op)."""
    xs = _profile([_event(1, 0, 100, step=7), _event(2, 5, 1), _event(1, 10, 10, step=7), _event(3, 50, 30),
                   _event(1, 200, 100, step=9), _event(4, 205, 1), _event(3, 250, 40)])
    assert op_durations(xs, {"TensileBindStep_a"})["MatMul"] == [30]
    assert op_durations(xs, {"TensileBindStep_b"})["MatMul"] == [40]
    assert sorted(op_durations(xs)["MatMul"]) == [30, 40]        # the control: by node name alone


def test_an_op_after_its_threads_last_written_process_event_is_that_steps():
    """A profile can stop before the executor writes the Process event its last op ran in (the
    caller had its outputs first): that op is the step's of the thread's last written event, where
    before it belonged to no step and the job's table lost it (a loaded machine, 3 profiles in 30)."""
    xs = _profile([_event(1, 0, 10, step=7), _event(2, 2, 1), _event(1, 20, 10, step=9), _event(4, 22, 1),
                   _event(3, 40, 300)])      # b's MatMul, its Process event never written
    assert op_durations(xs, {"TensileBindStep_b"})["MatMul"] == [300]
    assert "MatMul" not in op_durations(xs, {"TensileBindStep_a"})
