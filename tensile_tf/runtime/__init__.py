"""The runtime: jobs of one process training at once on the device pool.

Files in the order a run goes through them:

* ``threads.py``   Note [Threads and hand-offs]: every thread, what it owns, every hand-off
* ``run_loop.py``  JobHost: submit, probe, admit, start, watch, tear down (reads in one sitting)
* ``arrivals.py``  the waiting line: arrivals, admission of waiting jobs, joint plans on arrival
* ``probing.py``   build a job, run its first step, measure P and T; teardown
* ``admission.py`` the Salus safety condition (seed 002 §2.2) and the other policies
* ``planning.py``  TENSILE in the host: capture, joint plan, cold start, saved plans
* ``nodegroup.py`` the Waterwave node-group pipeline's coordinator (seed 004)
* ``replanning.py`` re-plans while jobs run, plan switches at step boundaries, latency drift
* ``job_thread.py`` a job's steps and training thread
* ``outcome.py``   the memory sampler and the RunResult
* ``failures.py``  how a job's failure is recorded
* ``records.py``   the typed records and the results.json schema
* ``job_runtime.py`` Note [Record apart from runtime]: a job's TensorFlow side, and its progress snapshot
* ``replan_records.py`` the re-plan and drift-check records (``records.py`` re-exports them)
* ``plan_segments.py`` Note [Plan segments]: a job's steps, plan by plan
* ``job_times.py`` Note [Where a trial's time goes]: each job's wall time, phase by phase

Importing it loads TensorFlow and the plugin (``tensile_tf.tf.pool``).
"""
import tf_plugin

tf_plugin.load()  # before any module here imports TensorFlow itself: the pool must be its allocator

from tensile_tf.runtime.admission import POOL_HEADROOM, AdmissionControl, salus_safety_condition
from tensile_tf.runtime.failures import NonFiniteLoss, summarize_error
from tensile_tf.runtime.job_thread import variables_digest
from tensile_tf.runtime.planning import COLD_START_HEADROOM, SavedPlan, SavedPlanMismatch
from tensile_tf.runtime.records import JobRecord, JobState, JobStatus, MemorySample, PlanRecord, RunResult, StepRecord
from tensile_tf.runtime.run_loop import JobHost, ProgressSink

__all__ = [
    "COLD_START_HEADROOM", "POOL_HEADROOM", "AdmissionControl", "JobHost", "JobRecord", "JobState", "JobStatus",
    "MemorySample", "NonFiniteLoss", "PlanRecord", "ProgressSink", "RunResult", "SavedPlan", "SavedPlanMismatch",
    "StepRecord", "salus_safety_condition", "summarize_error", "variables_digest",
]
