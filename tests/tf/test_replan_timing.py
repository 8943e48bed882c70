"""Note [Re-plans for jobs about to end] (runtime/replan_timing.py): a
re-plan for running jobs is not started when every job it is for ends
before it could switch, and the record says why; an arrival's re-plan and
jobs with steps to go are planned as before. The decision reads what the
runtime recorded (earlier re-plans, measured steps), so the cases are made
of records, not of timing. Note [One re-plan per burst]: a burst of events
gets one re-plan (against the control of one event at a time)."""
from types import SimpleNamespace

from tensile_tf.runtime.job_runtime import JobProgress
from tensile_tf.runtime.replan_records import JobReplan, ReplanRecord
from tensile_tf.runtime.records import JobStatus
from tensile_tf.runtime.replan_timing import burst_reasons, ends_before_switch, expected_replan_s
from tensile_tf.runtime.replanning import Replanner, ReplanRequest
from tensile_tf.runtime.threads import RunLoopInbox


def _job(name, steps, done, median, peak=100):
    plan = SimpleNamespace(predicted_planned_peak_bytes=peak, swap_outs=1, recomputes=0)
    return SimpleNamespace(name=name, job=SimpleNamespace(steps=steps), steps_done=done, median_step_s=median,
                           plan=plan, records=[], progress=JobProgress(done, None, median),
                           rt=SimpleNamespace(captured=None))


def _replan(planning_s, rewrite_s, instantiate_s, plan=1):
    job = JobReplan("x", 1, 1, 1, 1, 0, 0, 0.1, instantiate_s=instantiate_s)
    return ReplanRecord(at_s=0.0, reason="r", budget_bytes=1, planning_s=planning_s, rewrite_s=rewrite_s,
                        predicted_peak_sum_before_bytes=1, predicted_peak_sum_after_bytes=1, jobs=[job], plan=plan)


def test_the_expected_time_is_the_median_of_the_earlier_replans_else_the_last_plans():
    plans = [SimpleNamespace(planning_s=0.4)]
    assert expected_replan_s([], plans) == 0.4
    assert expected_replan_s([], []) is None
    records = [_replan(0.5, 1.0, 2.0), _replan(0.5, 0.5, None), _replan(1.0, 3.0, 4.0), _replan(9.0, 9.0, 9.0, plan=None)]
    assert expected_replan_s(records, plans) == 3.5      # 3.5, 1.0, 8.0: the failed one left out


def test_a_replan_comes_too_late_only_when_every_job_ends_first():
    assert ends_before_switch([_job("a", 10, 9, 0.2), _job("b", 6, 6, 0.5)], 1.0).startswith("every job")
    assert ends_before_switch([_job("a", 10, 9, 0.2), _job("b", 20, 6, 0.5)], 1.0) is None   # b runs 7 s more
    assert ends_before_switch([_job("a", 10, 9, None)], 1.0) is None      # no measured step: not known
    assert ends_before_switch([_job("a", 10, 9, 0.2)], None) is None      # no plan made yet


def test_the_replanner_records_a_skipped_replan_and_plans_nothing():
    planned = []
    planning = SimpleNamespace(plans=[SimpleNamespace(planning_s=2.0)],
                               start_budget=lambda *a: planned.append(a) or 0)
    replanner = Replanner(planning, now=lambda: 7.0, held_outside_jobs=lambda: 0)
    record = replanner.replan([_job("a", 10, 9, 0.5)], "departure of b")
    assert record.skipped and "a in 0.50 s" in record.skipped and record.plan is None and not record.jobs
    assert replanner.records == [record] and not planned          # the planner was never asked
    # the control: a job with 10 s to go is re-planned (the fake planning has no planner: it fails after the budget)
    record = replanner.replan([_job("a", 30, 10, 0.5)], "departure of b")
    assert record.skipped is None and planned and record.error


def _burst_replanner(planned):
    planning = SimpleNamespace(plans=[], start_budget=lambda *a: planned.append(a) or 0,
                               settings=SimpleNamespace(plan_peaks=None))
    return Replanner(planning, now=lambda: 3.0, held_outside_jobs=lambda: 0)


def test_a_burst_of_departures_and_drifts_gets_one_replan():
    """Note [One re-plan per burst]: three events served at once make one re-plan naming them all;
    the control, the same events served one by one, makes three."""
    running = [_job("a", 30, 5, 0.5), _job("b", 30, 5, 0.5)]
    for s in running:
        s.status, s.rt.captured = JobStatus.running, object()
    gone = [_job("x", 10, 10, 0.5), _job("y", 10, 10, 0.5), _job("z", 10, 10, None)]
    gone[2].plan = None                                    # an unplanned job's departure relaxes nothing
    drift = [ReplanRequest("a", "latency drift of a (+30% vs its plan)"),
             ReplanRequest("x", "latency drift of x (+25% vs its plan)")]   # x has ended: no re-plan for it
    planned = []
    replanner = _burst_replanner(planned)
    record = replanner.on_events(gone, drift, running, waiting=0, others_need=0)
    assert record.events == ["departure of x", "departure of y", "latency drift of a (+30% vs its plan)"]
    assert record.reason == "; ".join(record.events) and replanner.records == [record] and len(planned) == 1
    # control: one event at a time
    planned, one_by_one = [], _burst_replanner([])
    one_by_one.planning.start_budget = lambda *a: planned.append(a) or 0
    for d in gone:
        one_by_one.on_events([d], [], running, waiting=0, others_need=0)
    for r in drift:
        one_by_one.on_events([], [r], running, waiting=0, others_need=0)
    assert [r.events for r in one_by_one.records] == [[e] for e in record.events] and len(planned) == 3
    # a waiting job gets the freed memory first; jobs whose plans neither swap nor recompute are not relaxed,
    # nor re-planned for a drift (their peaks do not follow their latencies), unless peaks are read off timelines
    assert replanner.on_events(gone, drift, running, waiting=1, others_need=0) is None
    for s in running:
        s.plan = SimpleNamespace(predicted_planned_peak_bytes=100, swap_outs=0, recomputes=0)
    assert burst_reasons(gone, drift, running) == []
    assert burst_reasons(gone, drift, running, peaks_follow_timing=True) == ["latency drift of a (+30% vs its plan)"]
    running[1].plan.recomputes = 1     # control: one plan that recomputes, and the drift asks again
    assert burst_reasons(gone, drift, running) == ["departure of x", "departure of y",
                                                   "latency drift of a (+30% vs its plan)"]


def test_the_inbox_hands_over_every_waiting_message_at_once():
    inbox = RunLoopInbox()
    assert inbox.drain() == []
    ended, request = SimpleNamespace(name="x"), ReplanRequest("a", "drift")
    inbox.job_ended(ended)
    inbox.ask_replan(request)
    inbox.job_ended(ended)
    assert inbox.next(0.0) is ended and inbox.drain() == [request, ended] and inbox.drain() == []
    assert inbox.next(0.0) is None


def test_background_work_is_not_started_for_a_job_that_ends_before_it_would_be_done():
    """Note [Background work for a job about to end]: the scope the background worker runs a job's
    work in reads the job's time left against its step's instantiation time."""
    import contextlib

    import pytest

    from tensile_tf.runtime.job_runtime import BackgroundWorkAbandoned, JobRuntime
    from tensile_tf.runtime.replan_timing import background_scope_for

    stream = SimpleNamespace(eager_scope=contextlib.nullcontext)
    step = SimpleNamespace(instantiate_s=None)

    def job(steps, done, median):
        s = _job("a", steps, done, median)
        s.rt = JobRuntime(job_stream=stream)
        return s

    ending, running, unmeasured = job(10, 7, 0.2), job(40, 7, 0.2), job(10, 7, None)
    with background_scope_for(ending, step)():      # the instantiation itself: its time not known yet
        pass
    step.instantiate_s = 1.5
    with pytest.raises(BackgroundWorkAbandoned, match=r"the job ends in 0\.60 s, before the work would be done "
                                                      r"\(at least 1\.50 s\)"):
        with background_scope_for(ending, step)():
            pass
    for s in (running, unmeasured):                 # the controls: 6.6 s left; no measured step
        with background_scope_for(s, step)():
            pass
    running.rt.end_background_work()
    with pytest.raises(BackgroundWorkAbandoned, match="torn down"):
        with background_scope_for(running, step)():
            pass


def test_a_table_step_not_built_and_a_rewrite_not_done_say_why():
    """The plan-table step's build abandoned: the next plan's record says why; a later plan's
    background rewrite abandoned: the job stays on its table step and its records say so."""
    from tensile_tf.runtime.job_runtime import BackgroundWorkAbandoned
    from tensile_tf.tf.rewrite.graph_edit import RewriteReport
    from tensile_tf.tf.rewrite.plan_table import forget_table_step, why_no_table_step
    from tensile_tf.tf.rewrite.planned_step import PlannedStep
    from tensile_tf.tf.rewrite.table_then_rewrite import TableThenRewritten, build_table_in_background

    def abandoned():
        raise BackgroundWorkAbandoned("the job ends in 0.10 s, before the work would be done (at least 2.00 s)")

    class Captured:    # held weakly by the queued work, as the runtime's capture is
        job = SimpleNamespace(step_fn=lambda: None)

    captured = Captured()
    assert why_no_table_step(captured.job.step_fn) == "its plan-table step is being built"
    build_table_in_background(captured)(abandoned)
    assert why_no_table_step(captured.job.step_fn) == ("its plan-table step was not built: the job ends in 0.10 s, "
                                                       "before the work would be done (at least 2.00 s)")
    forget_table_step(captured.job.step_fn)
    assert why_no_table_step(captured.job.step_fn) == "its plan-table step is being built"

    on_table = PlannedStep(lambda *a: "on the table", None, RewriteReport("a"))
    fn = TableThenRewritten(SimpleNamespace(instantiated=True), on_table, lambda: None)
    record = {"plan_table": "table, rewritten in the background"}
    fn.plan_records.append(record)
    fn.rewrite_in_background(abandoned)
    assert fn() == "on the table" and fn.current is on_table and fn.rewritten is None
    assert record["plan_table"] == on_table.report.plan_table == (
        "table; not rewritten: the job ends in 0.10 s, before the work would be done (at least 2.00 s)")


def _host_serving_a_burst(refill):
    """What ``JobHost._serve_burst`` reads: a job `x` ended; its job source ``refill``s the pool
    (its newcomer planned together with the running jobs on arrival) or has nothing to give."""
    from tensile_tf.runtime.run_loop import JobHost

    asked = []
    replanner = SimpleNamespace(records=[], on_events=lambda departed, requests, *rest: asked.append(
        ([d.name for d in departed], [r.job for r in requests])))

    def pull(job_source):
        if job_source() is not None:   # admit_waiting's joint plan on arrival, recorded
            replanner.records.append(SimpleNamespace(newcomer="y", error=None))

    host = SimpleNamespace(_job_ended=lambda ended: None, replanner=replanner, stopping=False, _pull_jobs=pull,
                           arrivals=SimpleNamespace(waiting=[], outside_replan_need=lambda running: 0),
                           running=lambda: [], note_replan=lambda record: None)
    ended, drift = SimpleNamespace(name="x"), ReplanRequest("a", "latency drift of a")
    JobHost._serve_burst(host, [ended, drift], lambda: refill)
    return asked


def test_a_departure_refilled_by_a_joint_plan_asks_no_replan_of_its_own():
    """Note [One re-plan per burst]: the trial that refills a departure is planned together with the
    running jobs on arrival, which re-plans them for the pool as it now is: the departure asks for
    nothing more (its drift requests still do). Control: a job source with nothing to give."""
    assert _host_serving_a_burst(refill=object()) == [([], ["a"])]
    assert _host_serving_a_burst(refill=None) == [(["x"], ["a"])]


def test_a_newcomer_measured_too_big_is_planned_together_at_once():
    """Note [Joint re-plan on arrival]: a newcomer predicted to fit, probed, and measured too big
    beside the running jobs is planned together with them at once, not at the next event (with a
    search refilling each departure before its re-plan, such trials waited 5-9 s a search for
    admission). Control: with nothing running it just waits."""
    from tensile_tf.runtime.arrivals import Arrivals
    from tensile_tf.runtime.probing import ProbeOutcome

    def admit(running):
        newcomer = SimpleNamespace(name="n", awaiting_switches=False, measured=False)

        def probe(state, active):
            state.measured = True          # its probe step ran: P and T measured, too big to start
            return ProbeOutcome.queued

        host = SimpleNamespace(running=lambda: running, held_outside_jobs=lambda: 0, report=lambda s: None,
                               notify_end=lambda s: None, lifecycle=SimpleNamespace(probe=probe),
                               admission=SimpleNamespace(has_room=lambda n: True, predict=lambda s: (1, 1),
                                                         fits=lambda *a: True))
        line, joint = Arrivals(host), []
        line.plan_arrival = lambda state, active: joint.append((state.name, [s.name for s in active]))
        line.waiting.append(newcomer)
        line.admit_waiting()
        return joint, [s.name for s in line.waiting]

    assert admit([SimpleNamespace(name="a", awaiting_switches=False)]) == ([("n", ["a"])], ["n"])
    assert admit([]) == ([], ["n"])


def test_a_job_captured_from_its_training_steps_is_one_a_joint_plan_may_change():
    """Note [Captures from training steps]: a running job captured by its own thread runs its own
    step, no plan, and joins the re-plans from then on; a job captured and never planned for another
    reason (its plan failed) stays outside them, as before; its own step relaxes nothing."""
    a, b = _job("a", 30, 5, 0.5), _job("b", 30, 5, 0.5)
    for s in (a, b):
        s.status, s.rt.captured, s.captured_at_step = JobStatus.running, object(), None
    b.plan = None
    assert Replanner.replannable([a, b]) == [a]
    b.captured_at_step = 7
    assert Replanner.replannable([a, b]) == [a, b]
    a.plan.swap_outs = 0
    assert burst_reasons([_job("x", 10, 10, 0.5)], [], [a, b]) == []


def test_a_capture_ready_is_adopted_before_the_end_its_thread_posted_after():
    """H14 in Note [Threads and hand-offs]: the run loop adopts a capture from training steps before
    it tears down the job, so the capture is parked with its step (Note [Captures kept with the step])."""
    from tensile_tf.runtime.run_loop import JobHost
    from tensile_tf.runtime.training_capture import CaptureReady

    served = []
    host = SimpleNamespace(_job_ended=lambda ended: served.append(("ended", ended.name)), replanner=None,
                           stopping=False, arrivals=SimpleNamespace(adopt_capture=lambda r: served.append(
                               ("adopted", r.job))))
    inbox = RunLoopInbox()
    inbox.capture_ready(CaptureReady("x", object(), 9))
    inbox.job_ended(SimpleNamespace(name="x"))
    JobHost._serve_burst(host, [inbox.next(0.0), *inbox.drain()], None)
    assert served == [("adopted", "x"), ("ended", "x")]


def test_a_newcomer_captured_at_its_probe_is_planned_together_from_that_capture():
    """Note [A capture kept for the joint plan] in runtime/arrivals.py: a newcomer its probe built and
    captured is planned together with the running jobs from that capture, not built again and
    captured cold; where no joint plan is made it is torn down, capture and all (the control)."""
    from tensile_tf.runtime.arrivals import Arrivals

    def plan_arrival(joint_error, busy=None):
        calls = []
        running = SimpleNamespace(name="a", status=JobStatus.running, plan=object(), awaiting_switches=False,
                                  rt=SimpleNamespace(captured=object(), switch=SimpleNamespace(pending=False)))
        probed = object()
        newcomer = SimpleNamespace(name="n", job=SimpleNamespace(rebuildable=True), status=JobStatus.queued,
                                   awaiting_switches=False, rt=SimpleNamespace(train=object(), captured=probed))
        record = SimpleNamespace(error=joint_error)
        planning = SimpleNamespace(capture_taken=lambda s: calls.append("taken") or False,
                                   capture_cold=lambda s: calls.append("cold") or True)
        replanner = SimpleNamespace(on_arrival=lambda s, active, need: calls.append(("joint", s.rt.captured)) or record)
        host = SimpleNamespace(replanner=replanner, pipeline=None, planning=planning, stopping=False,
                               note_replan=lambda r: None, note_wait=lambda s, why: calls.append("wait"),
                               admission=SimpleNamespace(predict=lambda s: None, plans_held_for_cores=lambda n: busy),
                               lifecycle=SimpleNamespace(teardown=lambda s: calls.append("teardown"),
                                                         build=lambda s: calls.append("build") or True))
        line = Arrivals(host)
        line.start_jointly_planned = lambda state, active: calls.append("start")
        line.plan_arrival(newcomer, [running])
        return calls, probed, newcomer.rt.captured, newcomer.held_for_cores, line.joint_tried

    calls, probed, kept, held, tried = plan_arrival(None)
    assert calls == [("joint", probed), "start"] and kept is probed and not held
    calls, probed, kept, held, tried = plan_arrival("the joint plan predicts more than the budget")
    assert calls == [("joint", probed), "wait", "teardown"] and kept is None and not held
    # Note [Plans only for idle cores] (planning.py): the job source's rule says the cores are busy: no
    # joint plan; it waits as without a planner, held to be asked again (not tried for this event)
    calls, probed, kept, held, tried = plan_arrival(None, busy="the running trials keep the cores busy")
    assert calls == ["wait", "teardown"] and kept is None and held and "n" not in tried


def test_a_newcomer_probed_already_starts_on_the_joint_plan_without_a_second_probe():
    """Note [A capture kept for the joint plan]: its probe step was its first training step, so it
    starts once the running jobs switched, not probed again on its first batch (which trained it
    twice on that batch: 2-4 of 12 io-mem trials' scores moved). Control: one never probed is."""
    from tensile_tf.runtime.arrivals import Arrivals
    from tensile_tf.runtime.probing import ProbeOutcome

    def start(steps_done):
        calls = []
        state = SimpleNamespace(name="n", steps_done=steps_done, awaiting_switches=True)
        host = SimpleNamespace(lifecycle=SimpleNamespace(probe=lambda s, a, hold: calls.append("probe") or
                                                         ProbeOutcome.hold),
                               start_job=lambda s: calls.append("start"), report=lambda s: None,
                               notify_end=lambda s: None)
        line = Arrivals(host)
        line.waiting.append(state)
        line.start_jointly_planned(state, [SimpleNamespace(rt=SimpleNamespace(switch=SimpleNamespace(pending=False)))])
        return calls

    assert start(1) == ["start"]
    assert start(0) == ["probe", "start"]
