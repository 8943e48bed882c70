"""The predicted unplanned peak is the worst free-running step's, not the
traced steps' (Note [Scratch that meets] in tensile_tf/tf/unplanned_peaks.py).

The quickstart's resnet-c peaks at 48.1 MiB in most steps and at 68.6-72.6
in the few where two of its 27 MiB filter gradients run at once on the
inter-op threads; its traced steps rarely show that. Which steps meet it
depends on the machine's load, so the test asserts what holds for any
interleaving: the prediction is at least every step the test measures
(within 10%) and at least every traced step it was made from, and it names
the spread it was made from."""
from tensile_tf.config.schema import load_config
from tensile_tf.jobs.job import Job
from tensile_tf.pipeline import JobToPlan, capture_for_planning
from tensile_tf.scheduler import GraphBuilder, JobFootprint, Planner, TensorAccessSequence, UniformLatency
from tensile_tf.tf.pool import JobStream
from tensile_tf.tf.step_memory import (MIN_TRACED_STEPS, StepMemory, apply_step_memory, inter_op_threads,
                                       scratch_that_meets)
from tests.conftest import REPO_ROOT

MEASURED_STEPS = 24


def two_filter_gradients():
    """`filter` (100 B scratch) and `input_grad` read x; `filter2` (50 B)
    reads input_grad's output, as a ResNet's next layer down does."""
    b = GraphBuilder("job")
    b.tensor("w", 8, "parameter")
    b.op("x_op", outputs={"x": 4})
    b.op("filter", inputs=["x"], outputs={"gw": 8}, temp_bytes=100)
    b.op("input_grad", inputs=["x"], outputs={"gi": 10})
    b.op("filter2", inputs=["gi"], outputs={"gw2": 8}, temp_bytes=50)
    b.op("pool_grad", inputs=["gi"], outputs={"gp": 40})
    b.op("update", inputs=["gw", "gw2", "gp"], updates=["w"])
    return b.build()


def test_scratch_meets_only_ops_that_neither_precede_nor_follow():
    g = two_filter_gradients()
    assert scratch_that_meets(g, 1) == {}    # one thread: one op at a time
    meets = scratch_that_meets(g, 2)
    # x_op precedes every op and update follows every op; input_grad precedes filter2
    assert meets == {"filter": ["filter2"], "input_grad": ["filter"], "filter2": ["filter"], "pool_grad": ["filter"]}
    assert scratch_that_meets(g, 4)["pool_grad"] == ["filter", "filter2"]


def test_the_prediction_adds_the_scratch_the_traced_steps_did_not_show():
    g = two_filter_gradients()
    calm = {"x_op": 4, "filter": 112, "input_grad": 22, "filter2": 76, "pool_grad": 66}   # the sequential footprint
    peaks = apply_step_memory(g, StepMemory({}, {}, {}, [calm, calm], threads=2))
    # filter2 (76) beside filter's 100 B of scratch, plus the parameter w
    assert (peaks.predicted, peaks.at_op, peaks.scratch_beside) == (8 + 76 + 100, "filter2", ["filter"])
    assert peaks.observed == [8 + 112, 8 + 112]
    assert "120 B over 2 observed steps" in peaks.describe()
    # the traced steps decide where they show more than scratch that may meet
    g = two_filter_gradients()
    worse = dict(calm, filter2=76 + 150)
    peaks = apply_step_memory(g, StepMemory({}, {}, {}, [calm, worse], threads=2))
    assert (peaks.predicted, peaks.scratch_beside) == (8 + 76 + 150, [])
    assert peaks.observed == [8 + 112, 8 + 76 + 150]


def test_predicted_unplanned_peak_covers_every_measured_step():
    spec = next(s for s in load_config(REPO_ROOT / "configs" / "quickstart.yaml").jobs if s.name == "resnet-c")
    stream = JobStream("resnet-c-worst-step")
    try:
        with stream.eager_scope():
            train = Job.from_spec(spec).build()
            fn = stream.step_function(train.step_fn)
            fn(*train.next_batch())   # traces, creates the optimizer's slots
            measured = []
            for _ in range(MEASURED_STEPS):
                batch = train.next_batch()
                stream.reset_peak()
                fn(*batch)
                measured.append(stream.stats()["peak"])
            captured = capture_for_planning(JobToPlan("resnet-c", fn, batch, optimizer=train.optimizer))
        plan = Planner([captured.planner_job], pool_bytes=None, max_iterations=0).plan()
        predicted = plan.jobs["resnet-c"].vanilla_peak_bytes
        peaks = captured.unplanned_peaks
        info = (predicted, peaks.to_dict(), measured)
        assert peaks.predicted == predicted, info
        # the goal: the prediction covers the worst step (within 10%), whichever steps met
        assert predicted >= 0.9 * max(measured), info
        # and every traced step it was made from; the spread is kept and said
        assert len(peaks.observed) >= MIN_TRACED_STEPS and max(peaks.observed) <= predicted, info
        assert f"over {len(peaks.observed)} observed steps" in peaks.describe(), peaks.describe()
        if inter_op_threads() >= 2:
            # two filter gradients' scratch may meet (the graph says so, not the timing)
            assert "Conv2DBackpropFilter" in peaks.at_op, info
            assert peaks.scratch_beside and "Conv2DBackpropFilter" in peaks.scratch_beside[0], info
            # what the bound adds comes from the graph: the op's sequential footprint plus the scratch
            # beside it (which traced steps met is the scheduler's business, not asserted on)
            scratch = {o.name: o.temp_bytes for o in captured.graph.ops}
            fp = JobFootprint(TensorAccessSequence(captured.graph, UniformLatency()))
            k = [o.name for o in captured.graph.ops].index(peaks.at_op)
            assert predicted >= int(fp.base[k]) + scratch[peaks.scratch_beside[0]], info
    finally:
        del train, fn, captured
        import gc

        gc.collect()
        stream.release()
