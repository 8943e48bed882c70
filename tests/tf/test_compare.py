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


# Note [Plan segments] (tensile_tf/runtime/plan_segments.py): a re-planned job's
# steps ran under several plans; each is compared over its own steps.

def _numbered_plan(number, reason, swaps, predicted_msr=0.4):
    plan = _plan(swaps)
    plan.plan_number, plan.reason, plan.predicted_msr = number, reason, predicted_msr
    plan.rewrite = {"activation_swap_outs": swaps, "activation_swap_ins": swaps}
    return plan


def _segmented(name, steps, history):
    """steps: (peak MiB, seconds, plan number or None) per step, from step 0."""
    s = JobState(job=SimpleNamespace(name=name, steps=len(steps), spec=None), status=JobStatus.finished,
                 steps_done=len(steps), weights_digest="w")
    s.records = [StepRecord(i, float(i), sec, 1.0, int(mib * MiB), plan) for i, (mib, sec, plan) in enumerate(steps)]
    for plan in history:
        s.run_plan(plan)
    return s


def _three_plans():
    """`j` ran plan 0 (swaps) on steps 1-4, plan 1 (leaves the step as it is)
    on 5-8 and plan 2 (swaps) on 9-11; its probe, step 0, ran unplanned."""
    history = [_numbered_plan(0, "start", 3, 0.31), _numbered_plan(1, "departure of j0", 0, 0.22),
               _numbered_plan(2, "latency drift of j", 1, 0.13)]
    vanilla = _segmented("j", [(55, 0.5, None)] + [(40, 0.01, None), (40, 0.01, None), (41, 0.01, None),
                                                    (40, 0.01, None)] + [(40, 0.01, None)] * 4
                         + [(30, 0.01, None), (40, 0.01, None), (35, 0.01, None)], [])
    planned = _segmented("j", [(33, 0.5, None)] + [(25, 0.02, 0)] * 4 + [(30, 0.01, 1)] * 4 + [(33, 0.015, 2)] * 3,
                         history)
    return vanilla, planned


def test_each_plan_is_compared_over_its_own_steps_and_credited_by_its_own_plan():
    vanilla, planned = _three_plans()
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    first, second, third = job.segments
    assert [(s.plan, s.reason, s.first_step, s.last_step, s.steps) for s in job.segments] == [
        (0, "start", 1, 4, 4), (1, "departure of j0", 5, 8, 4), (2, "latency drift of j", 9, 11, 3)]
    # plan 0: vanilla 41 MiB over steps 1-4 (its own spread 1 MiB, the whole window's 11 MiB: the floor),
    # planned 25 MiB, twice as slow: credited
    assert (first.vanilla_peak_bytes, first.vanilla_spread_bytes, first.planned_peak_bytes) == \
        (41 * MiB, 11 * MiB, 25 * MiB)
    assert first.msr == first.credited_msr == (41 - 25) / 41 and first.time_ratio == 2.0
    assert (first.swap_outs, first.swap_ins, first.changes_step, first.predicted_msr) == (3, 3, True, 0.31)
    # plan 1 saves 10 MiB (vanilla moved 0 over steps 5-8) and leaves the step as it is: not its saving
    assert second.msr == 0.25 and second.credited_msr == 0.0 and not second.changes_step
    assert second.time_ratio == 1.0 and second.swap_outs == 0
    # plan 2 saves 7 MiB where vanilla itself moved 10 MiB over steps 9-11: noise
    assert second.vanilla_spread_bytes == third.vanilla_spread_bytes == 11 * MiB   # the window's, at least
    assert third.msr == (40 - 33) / 40 and third.credited_msr == 0.0 and third.changes_step
    assert abs(third.time_ratio - 1.5) < 1e-9
    # the whole window belongs to no one plan: plan 1 ran some of it without changing the step
    assert job.plans_run == 3 and not job.plan_changes_step
    assert job.msr == (41 - 33) / 41 and job.credited_msr == 0.0


def test_the_text_names_the_plan_of_each_figure():
    vanilla, planned = _three_plans()
    text = format_comparison(compare_runs(_run(vanilla), _run(planned)))
    job_row = next(line for line in text.splitlines() if line.startswith("j "))
    assert "13.0%" not in job_row and "1 swap" not in job_row   # the last plan's prediction is not the run's
    assert "j: the whole run's 19.5% difference is not credited: plan 1 (departure of j0) does not change its step" \
        in text
    assert "j: ran 3 plans" in text
    assert "    plan 0 (start), steps 1-4: time ratio 2.00, MSR 39.0% (credited);" in text
    assert ("    plan 1 (departure of j0), steps 5-8: time ratio 1.00, MSR 25.0% (not credited to plan 1: "
            "the plan does not change its step);") in text
    assert ("    plan 2 (latency drift of j), steps 9-11: time ratio 1.50, MSR 17.5% (not credited to plan 2: "
            "within vanilla's own step-to-step spread);") in text
    assert "swap-outs 1, swap-ins 1, recomputed ops 0" in text.split("plan 2 (latency drift of j)")[1]


def test_two_plans_that_both_change_the_step_share_the_whole_runs_credit():
    history = [_numbered_plan(0, "start", 4), _numbered_plan(1, "departure of j0", 2)]
    vanilla = _segmented("j", [(9, 0.1, None)] + [(40, 0.01, None)] * 6, [])
    planned = _segmented("j", [(9, 0.1, None)] + [(20, 0.02, 0)] * 2 + [(30, 0.01, 1)] * 4, history)
    planned.steps_done = 5    # steps 5 and 6 are outside the window (vanilla's, too)
    planned.status = JobStatus.failed
    job, = compare_runs(_run(vanilla), _run(planned)).jobs
    assert [(s.plan, s.first_step, s.last_step) for s in job.segments] == [(0, 1, 2), (1, 3, 4)]
    assert job.plan_changes_step and job.credited_msr == job.msr == 0.25
    assert [s.credited_msr for s in job.segments] == [0.5, 0.25]


def test_a_single_plan_is_named_when_not_credited():
    plan = _numbered_plan(0, "start", 0)
    vanilla = _segmented("j", [(55, 0.1, None)] + [(40, 0.01, None)] * 3, [])
    planned = _segmented("j", [(33, 0.1, None)] + [(30, 0.01, 0)] * 3, [plan])
    text = format_comparison(compare_runs(_run(vanilla), _run(planned)))
    assert "j: the 25.0% difference is not credited to plan 0 (start): the plan does not change its step" in text
    assert "j: steps 1-3 ran plan 0 (start)" in text and "ran 1 plans" not in text


def test_results_json_lists_each_jobs_plan_segments():
    from tensile_tf.runtime.records import JobRecord

    _, planned = _three_plans()
    segments = JobRecord.of(planned).to_dict()["plan_segments"]
    assert [(s["plan"], s["reason"], s["first_step"], s["last_step"], s["steps"]) for s in segments] == [
        (None, "unplanned", 0, 0, 1), (0, "start", 1, 4, 4), (1, "departure of j0", 5, 8, 4),
        (2, "latency drift of j", 9, 11, 3)]
    probe, first, second, third = segments
    assert probe["training_peak_bytes"] is None and probe["median_step_s"] == 0.5   # step 0 is outside the window
    assert first["training_peak_bytes"] == 25 * MiB and first["median_step_s"] == 0.02
    assert (first["swap_outs"], first["swap_ins"], first["recomputes"], first["changes_step"]) == (3, 3, 0, True)
    assert second["changes_step"] is False and third["predicted_planned_peak_bytes"] == 30 * MiB


def test_a_step_records_the_plan_of_this_build_only():
    s = JobState(job=SimpleNamespace(name="j", steps=3, spec=None), attempts=1)
    assert s.plan_number is None
    s.run_plan(_numbered_plan(0, "start", 1))
    s.run_plan(_numbered_plan(2, "departure of j0", 0))   # a plan that leaves the step as it is still counts
    assert s.plan_number == 2 and [p.plan_number for p in s.plan_history] == [0, 2]
    s.attempts += 1   # torn down and rebuilt: its next probe runs unplanned until it is planned again
    assert s.plan_number is None
