"""Honest numbers: the planner's *predicted* vanilla peak of a job (what
`tensile plan` prints and results.json labels as a prediction) is within 10%
of the peak the job's training steps measure in the pool, through the real
path (probe, capture with scratch bytes and executor order, plan, run).

The two models are jobs of configs/quickstart.yaml (cnn-a: predicted 13.1
MiB by a model without measured scratch, 55.3 MiB measured; Note [Scratch
memory] in tensile_tf/tf/step_memory.py). Each job runs alone (concurrency 1) with
one inter-op thread, so the executor runs one op at a time and the measured
peak does not depend on how the machine's load interleaves kernels. With
TensorFlow's default threads a step's peak depends on which ops met on the
threads in that step (Note [Concurrent scratch] in tensile_tf/tf/step_memory.py,
Note [Observed, not simulated] in tensile_tf/scheduler/concurrency.py: the
node-group CNN's steps peak at 62 or 89 MiB); the prediction is the worst
traced step's, which a short window may not meet, so that case is measured by
benchmarks/prediction_accuracy_bench.py and recorded in benchmarks/RESULTS.md."""
import pytest

from tests.conftest import last_json_line, run_python

SCRIPT = """
import json, sys
import tensile_tf
tensile_tf.install("512MiB")
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)  # before TensorFlow's context exists
from tensile_tf.config.schema import load_config
from tensile_tf.runtime import JobHost
from tensile_tf.jobs.job import Job
cfg = load_config("configs/quickstart.yaml")
host = JobHost(concurrency=1, planner="tensile")
for spec in cfg.jobs:
    if spec.name == sys.argv[1]:
        host.submit(Job.from_spec(spec.model_copy(update={"steps": 5})))
r = host.run()
s = r.jobs[0]
print(json.dumps({"status": s.status.value, "error": s.error, "plan_error": s.plan_error,
                  "changes_step": s.plan.changes_step if s.plan else None,
                  "predicted": s.plan.predicted_vanilla_peak_bytes if s.plan else None,
                  "measured": s.training_peak_bytes, "steps": [rec.peak_bytes for rec in s.records]}))
"""


@pytest.mark.parametrize("job", ["cnn-a", "transformer-d"])
def test_predicted_vanilla_peak_is_within_ten_percent_of_the_measured_one(job):
    out = last_json_line(run_python(f"import sys; sys.argv = ['x', {job!r}]\n" + SCRIPT))
    assert out["status"] == "finished", out
    assert out["changes_step"] is False, out   # a roomy pool: the plan leaves the step as it is
    predicted, measured = out["predicted"], out["measured"]
    assert abs(predicted - measured) <= 0.10 * measured, out
