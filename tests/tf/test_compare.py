"""Note [Honest comparison] (tensile_tf/reports/compare.py): both runs are measured
over the same training window, and a saving is credited to a plan only when
the plan changed the step and the saving exceeds vanilla's own spread."""
from types import SimpleNamespace

from tensile_tf.reports.compare import compare_runs, format_comparison
from tensile_tf.runtime.records import JobState, JobStatus, PlanRecord, PoolRecord, RunResult, StepRecord, TraceCoverage

MiB = 2**20


def _state(name, peaks, plan=None):
    job = SimpleNamespace(name=name, steps=len(peaks), spec=None)
    s = JobState(job=job, status=JobStatus.finished, steps_done=len(peaks), plan=plan, weights_digest="w")
    s.records = [StepRecord(i, float(i), 0.01, 1.0, p) for i, p in enumerate(peaks)]
    return s


def _plan(swaps):
    return PlanRecord(budget_bytes=1, budget_met=True, predicted_vanilla_peak_bytes=50 * MiB,
                      predicted_planned_peak_bytes=30 * MiB, predicted_msr=0.4, swap_outs=swaps, swap_ins=swaps,
                      recomputes=0, planning_s=0.1, cold_start=False)


def _run(*states):
    pool = PoolRecord(capacity=1 << 30, peak=60 * MiB, training_peak=60 * MiB, current=0, start_current=0, run_ooms=0, stats={})
    return RunResult(capacity=1 << 30, pool=pool, jobs=list(states), samples=[], pool_events=[], started_at=0.0,
                     wall_s=1.0, trace_origin_ns=0, trace=TraceCoverage(0, 0, None, 0))


def test_a_plan_that_changes_nothing_is_never_credited():
    # Step 0 (the probe) peaks high in vanilla only: outside the window.
    vanilla = _state("cnn-a", [55 * MiB, 40 * MiB, 40 * MiB, 41 * MiB])
    planned = _state("cnn-a", [33 * MiB, 30 * MiB, 30 * MiB, 30 * MiB], plan=_plan(0))
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    assert job.vanilla_peak_bytes == 41 * MiB and job.planned_peak_bytes == 30 * MiB
    assert job.msr > 0.25 and job.credited_msr == 0.0
    assert "not credited to the plan: the plan does not change its step" in \
        format_comparison(compare_runs(_run(vanilla), _run(planned)))


def test_a_saving_within_vanillas_spread_is_noise():
    vanilla = _state("j", [9 * MiB, 40 * MiB, 30 * MiB, 34 * MiB])   # spread 10 MiB over steps 1-3
    planned = _state("j", [9 * MiB, 33 * MiB, 33 * MiB, 33 * MiB], plan=_plan(3))
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    assert job.vanilla_spread_bytes == 10 * MiB
    assert job.msr > 0 and job.credited_msr == 0.0


def test_a_real_saving_is_credited():
    vanilla = _state("j", [9 * MiB, 40 * MiB, 40 * MiB, 41 * MiB])
    planned = _state("j", [9 * MiB, 25 * MiB, 25 * MiB, 25 * MiB], plan=_plan(3))
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    assert job.credited_msr == job.msr == (41 - 25) / 41


def test_the_window_is_the_same_steps_in_both_runs():
    vanilla = _state("j", [1, 10 * MiB, 10 * MiB, 50 * MiB])   # step 3 never ran in the planned run
    planned = _state("j", [1, 8 * MiB, 8 * MiB], plan=_plan(1))
    planned.status = JobStatus.failed
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    assert job.window_steps == 3 and job.vanilla_peak_bytes == 10 * MiB
    assert not job.losses_match
