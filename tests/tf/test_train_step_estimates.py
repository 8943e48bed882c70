"""Issue 58 item 5: a handed-over TrainStep job is admitted on needs predicted
from its traced graph (``graph_needs``), so it starts beside running jobs as a
Keras job does. Two TrainStep jobs whose batches meet at their third step
(``meet_peers``, held on files); the second arrives (the host's job source)
once the first holds there: with the prediction both train at once; the
control without it waits for the running job to end. (Jobs submitted before
the run are all measured alone at its start and need no prediction.)"""
import os
import tempfile

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
from tensile_tf.jobs.job import Job
from tensile_tf.runtime import JobHost, JobStatus
from tests import job_factories


def _two_jobs(predicted: bool, deadline_s: float):
    folder = tempfile.mkdtemp()
    host = JobHost()
    jobs = [Job.from_train_step(name, job_factories.dense_regression(width=128, seed=seed, meet_folder=folder,
                                                                      meet_deadline_s=deadline_s), steps=6)
            for seed, name in enumerate(("first", "second"))]
    if not predicted:
        jobs[1].estimate_needs = None     # the control: a TrainStep job as it was, with no prediction
    first = host.submit(jobs[0])
    arrived = []

    def source():     # the second arrives once the first holds at its third step, beside it
        if arrived or not os.listdir(folder):
            return None
        arrived.append(jobs[1])
        return jobs[1]

    result = host.run(job_source=source)
    second = next(s for s in host.states if s.name == "second")
    return result, (first, second), jobs[1].estimate_needs() if predicted else None


def test_a_train_step_job_predicted_from_its_graph_starts_beside_a_running_one():
    result, (first, second), (p, t) = _two_jobs(predicted=True, deadline_s=120)
    assert [s.status for s in (first, second)] == [JobStatus.finished] * 2
    assert [s.steps_done for s in (first, second)] == [6, 6]
    # the second was probed and ran while the first held at its third step: admission let both run
    assert result.most_jobs_running == 2
    # a prediction, then the measurement: the graph's two weights (64x128, 128x1 floats) are in P,
    # and the step's tensors in T; the peak it predicted covers the one its probe measured
    assert p >= (64 * 128 + 128) * 4 and t > 0
    assert p + t >= second.persistent_bytes + second.temporary_bytes, (p, t, second.persistent_bytes,
                                                                         second.temporary_bytes)
    # the batch the prediction traced with was the job's first, not one taken from its steps
    assert second.steps_done == 6 and len(second.records) == 6


def test_without_the_prediction_a_train_step_job_waits_for_the_running_one():
    # the control: the same jobs, the second without a prediction; the first's hold passes its
    # (short) deadline alone, and only then does the second start
    result, (first, second), _ = _two_jobs(predicted=False, deadline_s=2)
    assert [s.status for s in (first, second)] == [JobStatus.finished] * 2
    assert result.most_jobs_running == 1
