"""Note [Captures a plan needs] (tensile_tf/runtime/planning.py): with the planner on, a trial the
pool holds unplanned, beside the running ones and as many more like it as may run at once, is not
captured, planned or re-planned, and its step is traced for every batch size, so a later trial of
another batch size takes it over. Where the search's limit lets in more trials than the pool holds
unplanned, each trial is captured; one that fits when it starts is captured from its own training
steps (Note [Captures from training steps] in tensile_tf/runtime/training_capture.py): no capture
time on the run loop, no plan, the same losses. The control turns that off: each trial is then
captured on the run loop before it starts, and planned.

One interpreter, one 64 MiB pool, three searches of the same three trials (an MLP 512 x 2 at
batches 256, 512 and 256, about 15 MiB each unplanned (the pool holds three at once), 42 steps: enough for a capture from training
steps and as many again), in that order: one at a time (so which trial's step is parked when the next one builds does
not depend on the machine), then at most 6 at once (the pool does not hold 6: each trial is
captured), then the same with captures from training steps off. The first trial is traced for its
own batch (nothing predicts its needs yet); the second, predicted from the first, for every batch
size; the third takes that step over."""
from types import SimpleNamespace

import pytest

from tensile_tf.config.schema import Admission
from tensile_tf.runtime.admission import AdmissionControl
from tests.conftest import last_json_line, run_python

SEARCHES = """
    import json
    import tensile_tf
    tensile_tf.install(64 * 2**20)  # the pool becomes TensorFlow's allocator: before any TF op
    import optuna
    from tensile_tf.runtime import JobHost
    from tensile_tf.search.driver import SearchDriver

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = [{"batch_size": 256, "optimizer.learning_rate": 1e-3}, {"batch_size": 512, "optimizer.learning_rate": 1e-3},
              {"batch_size": 256, "optimizer.learning_rate": 2e-3}]
    base = {"name": "t", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [512, 512]}},
            "input_shape": [784], "batch_size": 256, "classes": 10, "optimizer": {"name": "adam"}, "steps": 42,
            "seed": 1, "data": {"num_batches": 2}}
    out = {}
    for at_once, in_training in ((1, True), (6, True), (6, False)):
        host = JobHost(admission="sum", planner="tensile", swap_bandwidth="1TiB")
        host.planning.settings.capture_in_training = in_training
        study = optuna.create_study()
        for t in trials:
            study.enqueue_trial(t)
        space = {k: optuna.distributions.CategoricalDistribution(sorted({t[k] for t in trials})) for k in trials[0]}
        SearchDriver(study, base, space, n_trials=3, host=host, max_concurrent=at_once, admit_by_cores=False).run()
        batch = {s.name: s.job.spec.batch_size for s in host.states}
        out[f"{at_once} {in_training}"] = {
            "replans": len(host.replanner.records),
            "trials": [dict(
                key=f"{s.job.spec.batch_size} {s.job.spec.optimizer.learning_rate}", status=s.status.value,
                error=s.error, deferred=s.plan_deferred, plans=len(s.plan_history),
                captured=s.name in host.planning.unplanned_peaks,   # its capture's (or the one it took over)
                taken_from_batch=batch.get(s.traced_step_from), batch=s.job.spec.batch_size,
                P=s.persistent_bytes, T=s.temporary_bytes, losses=[r.loss for r in s.records],
                captured_at_step=s.captured_at_step, plan_error=s.plan_error, captured_from=s.captured_from,
                predicted=getattr(host.planning.unplanned_peaks.get(s.name), "predicted", None),
                traced_steps=len(getattr(host.planning.unplanned_peaks.get(s.name), "observed", [])))
                for s in host.states]}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def searches():
    proc = run_python(SEARCHES, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json_line(proc)
    return out["1 True"], out["6 True"], out["6 False"]


def test_trials_the_pool_holds_are_not_captured_and_share_one_trace_across_batch_sizes(searches):
    held, in_training, control = searches
    assert all(t["status"] == "finished" for t in [*held["trials"], *in_training["trials"], *control["trials"]]), \
        (held, in_training, control)
    assert [t["batch"] for t in held["trials"]] == [256, 512, 256], held
    # the pool holds one of these trials (and not six), by their measured needs
    assert max(t["P"] + t["T"] for t in control["trials"]) <= 64 * 2**20 < 6 * min(t["P"] + t["T"]
                                                                                  for t in control["trials"])
    for t in held["trials"]:
        assert t["deferred"] and "up to the 1 jobs that may run at once" in t["deferred"], t
        assert t["plans"] == 0 and not t["captured"] and t["captured_at_step"] is None, t
    assert held["replans"] == 0, held
    # the third trial took over the second's step, traced for every batch size
    assert [t["taken_from_batch"] for t in held["trials"]] == [None, None, 512], held
    # neither the deferral nor the shared trace changes what a trial computes
    losses = {t["key"]: t["losses"] for t in control["trials"]}
    assert {t["key"]: t["losses"] for t in held["trials"]} == losses


def test_a_trial_that_fits_when_it_starts_is_captured_from_its_training_steps(searches):
    """Each trial fits beside the running ones when it starts: its thread captures it from its own
    steps (one untraced, at least two traced, three profiled, after its probe step), nothing is
    restored, and it computes what the control computes; the control (captures from training steps
    off) captures each trial on the run loop and plans it."""
    _, in_training, control = searches
    # the three trials' captures overlap: one that found the profiler taken by another's for more than
    # PATIENCE_STEPS steps (seen once, under two busy loops) trains on uncaptured, and says so
    waited = [t for t in in_training["trials"] if t["plan_error"] and "trace was taken for" in t["plan_error"]]
    for t in waited:
        assert t["deferred"] is None and not t["captured"] and t["plans"] == 0, t
    # one that waited for room (admission counts what the running trials' steps held: Note [Needs at
    # least what the steps held]) may take over an ended trial's step with its capture instead
    took = [t for t in in_training["trials"] if t["captured_from"] is not None]
    for t in took:
        assert t["captured"] and t["captured_at_step"] is None and t["taken_from_batch"] == t["batch"], t
    own = [t for t in in_training["trials"] if t not in waited and t not in took]
    assert len(own) >= 2, in_training
    for t in own:
        assert t["deferred"] is None and t["plan_error"] is None, t
        assert t["captured"] and t["captured_at_step"] is not None and 1 + 1 + 2 + 3 <= t["captured_at_step"] <= 42, t
        assert t["plans"] == 0 and t["traced_steps"] >= 2, t
    for t in control["trials"]:
        assert t["deferred"] is None and t["plans"] >= 1 and t["captured"] and t["captured_at_step"] is None, t
    # the capture from training steps predicts the step the run loop's capture of it predicts, within
    # what the executor's threads held beside each op in the traced steps (Note [Concurrent scratch] in
    # tensile_tf/tf/step_memory.py: it follows their interleaving; 10.5% apart once, under the suite's load)
    control_peak = {t["batch"]: t["predicted"] for t in control["trials"]}
    for t in own:
        assert abs(t["predicted"] - control_peak[t["batch"]]) <= 0.3 * control_peak[t["batch"]], (t, control_peak)
    # a training step measured is a training step: the same losses, bit for bit
    assert {t["key"]: t["losses"] for t in in_training["trials"]} == {t["key"]: t["losses"] for t in control["trials"]}


def _job(p, t):
    return SimpleNamespace(rt=SimpleNamespace(switch=SimpleNamespace(peek=lambda: None)), planned_needs=(p, t),
                           outside_steps_need_bytes=0, name=f"{p} {t}", attempts=1, records=[], plan_number=None)


@pytest.mark.parametrize("policy", [Admission.sum, Admission.salus])
def test_the_pool_holds_the_limit_only_with_room_for_as_many_more_like_the_job(policy):
    mib = 2**20
    running, newcomer = [_job(30 * mib, 10 * mib)], _job(20 * mib, 10 * mib)
    room = 100 * mib / 0.9   # admission's room for several jobs: the pool less POOL_HEADROOM
    admission = AdmissionControl(int(room) + 1, policy, concurrency=2)
    assert admission.holds_the_limit_unplanned(newcomer, running, 0)   # 40 + 30 MiB (salus: 30 + 20 + 10)
    admission.concurrency = 4    # two more like it: 40 + 3 x 30 = 130 MiB (salus: 90 + 10)
    assert admission.holds_the_limit_unplanned(newcomer, running, 0) is None if policy == Admission.sum \
        else admission.holds_the_limit_unplanned(newcomer, running, 0)
    admission.jobs_at_most = 2   # the job source's own limit, below the host's
    assert "up to the 2 jobs" in admission.holds_the_limit_unplanned(newcomer, running, 0)
    assert admission.holds_the_limit_unplanned(newcomer, running, 50 * mib) is None   # bytes outside the jobs
    admission.concurrency = admission.jobs_at_most = None   # no limit: any number may come
    assert admission.holds_the_limit_unplanned(newcomer, running, 0) is None
    # Note [Plans only for idle cores] (planning.py): the job source's rule says no plan is to fit
    # another job in beside the running one and the newcomer: no capture either; its control
    admission.busy_for_a_plan = lambda n, new: f"{n} running and {new} starting keep the cores busy"
    assert admission.holds_the_limit_unplanned(newcomer, running, 0) == \
        "not captured: no plan is to fit another job in beside it: 1 running and 1 starting keep the cores busy"
    admission.busy_for_a_plan = lambda n, new: None
    assert admission.holds_the_limit_unplanned(newcomer, running, 0) is None


def test_a_running_jobs_needs_are_at_least_what_its_steps_under_its_plan_held():
    """Note [Needs at least what the steps held] (tensile_tf/runtime/admission.py): a job whose
    steps hold more than its plan (or its probe) predicted is admitted on what they held, counted
    over the steps of the plan it runs now (its probe step and an earlier plan's steps left out)."""
    from tensile_tf.runtime.records import StepRecord

    mib = 2**20
    state = SimpleNamespace(name="j", attempts=1, rt=SimpleNamespace(switch=SimpleNamespace(peek=lambda: None)),
                            planned_needs=(10 * mib, 5 * mib), outside_steps_need_bytes=0, records=[], plan_number=3)
    admission = AdmissionControl(1 << 40, Admission.sum, None)
    step = lambda i, peak, plan: StepRecord(i, float(i), 0.1, 1.0, peak * mib, plan)  # noqa: E731
    assert admission.predict(state) == (10 * mib, 5 * mib)          # no step yet: the plan's prediction
    state.records += [step(0, 40, None), step(1, 30, 2), step(2, 14, 3), step(3, 13, 3)]
    assert admission.predict(state) == (10 * mib, 5 * mib)          # under plan 3 it held what it predicted
    state.records.append(step(4, 18, 3))                             # a step held 18 MiB: 8 above its P
    assert admission.predict(state) == (10 * mib, 8 * mib)
    state.plan_number = 4                                            # switched: the new plan's steps count
    assert admission.predict(state) == (10 * mib, 5 * mib)
    state.records.append(step(5, 16, 4))
    assert admission.predict(state) == (10 * mib, 6 * mib)
    # an unplanned job: its measured T, or more where its steps held more
    plain = SimpleNamespace(name="u", attempts=1, rt=state.rt, planned_needs=None, outside_steps_need_bytes=0,
                            measured=True, persistent_bytes=10 * mib, temporary_bytes=5 * mib, plan_number=None,
                            records=[step(0, 50, None), step(1, 14, None), step(2, 17, None)])
    assert admission.predict(plain) == (10 * mib, 7 * mib)
    plain.attempts, plain.records = 2, [step(0, 50, None)]               # built again: its new steps only
    assert admission.predict(plain) == (10 * mib, 5 * mib)
