"""The search driver from Python with the user's own Optuna study, in the
test process's pool: failures and pruning are told with their state and
never stop the search."""
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from tensile_tf.runtime import JobHost
from tensile_tf.search import run_search
from tensile_tf.search.storage import INTERRUPTED_ATTR, JOB_ATTR, RETRY_ATTR, recover_interrupted_trials

optuna.logging.set_verbosity(optuna.logging.WARNING)

DENSE = {"model": {"train_step_factory": "tests.job_factories:dense_regression", "args": {"width": 32}},
         "steps": 30, "name": "dense"}


def test_failed_and_invalid_trials_are_told_and_the_search_goes_on():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = {"model.args.fail_at_step": CategoricalDistribution([None, 5]),
             "model.args.nan_at_step": CategoricalDistribution([None, 7]),
             "batch_size": CategoricalDistribution([16, 0])}
    study.enqueue_trial({"model.args.fail_at_step": 5, "model.args.nan_at_step": None, "batch_size": 16})
    study.enqueue_trial({"model.args.fail_at_step": None, "model.args.nan_at_step": 7, "batch_size": 16})
    study.enqueue_trial({"model.args.fail_at_step": None, "model.args.nan_at_step": None, "batch_size": 0})
    study.enqueue_trial({"model.args.fail_at_step": None, "model.args.nan_at_step": None, "batch_size": 16})
    result = run_search(study, DENSE, space, n_trials=6, host=JobHost(), max_concurrent=3)

    trials = study.get_trials()
    assert len(trials) == 6 and len(result.trials) == 6
    assert all(t.state.is_finished() for t in trials)
    boom, nan, invalid, ok = trials[:4]
    assert boom.state == TrialState.FAIL and "injected failure" in boom.user_attrs[JOB_ATTR]["error"]
    assert boom.user_attrs[JOB_ATTR]["steps"] == 5 and boom.user_attrs[JOB_ATTR]["status"] == "failed"
    assert nan.state == TrialState.FAIL and nan.user_attrs[JOB_ATTR]["error_type"] == "NonFiniteLoss"
    assert invalid.state == TrialState.FAIL and "invalid job" in invalid.user_attrs[JOB_ATTR]["error"]
    assert ok.state == TrialState.COMPLETE and math.isfinite(ok.value)
    facts = ok.user_attrs[JOB_ATTR]
    assert facts["steps"] == 30 and facts["peak_pool_bytes"] > 0 and facts["leaked_bytes"] == 0
    assert facts["started_at"] <= facts["ended_at"]
    # The random trials after the queue ran too, whatever they drew.
    assert result.counts.get("RUNNING", 0) == 0


def test_median_pruner_prunes_trials_that_lag_the_completed_ones():
    study = optuna.create_study(
        sampler=optuna.samplers.RandomSampler(seed=1),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=10, interval_steps=1))
    base = {"model": {"train_step_factory": "tests.search.factories:sgd_regression"}, "steps": 400,
            "batch_size": 32}
    space = {"model.args.learning_rate": FloatDistribution(1e-5, 0.1, log=True)}
    for lr in (0.05, 0.04, 1e-5, 2e-5):   # two fast learners complete, then two that barely learn
        study.enqueue_trial({"model.args.learning_rate": lr})
    result = run_search(study, base, space, n_trials=4, host=JobHost(), report_every=5, max_concurrent=1,
                        metric="final_loss")
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED], states
    for t in study.get_trials()[2:]:
        facts = t.user_attrs[JOB_ATTR]
        assert facts["status"] == "stopped" and facts["steps"] < 400
        assert max(t.intermediate_values) >= 10   # not pruned before the warmup (10 steps)
    done = study.get_trials()[0]
    assert sorted(done.intermediate_values) == list(range(5, 401, 5))
    assert [r.told for r in result.trials][2:] == [TrialState.PRUNED, TrialState.PRUNED]


def test_bad_arguments_are_refused():
    study = optuna.create_study()
    with pytest.raises(ValueError, match="give n_trials"):
        run_search(study, DENSE, {"batch_size": {"type": "int", "low": 8, "high": 16}}, n_trials=None,
                   host=JobHost())
    with pytest.raises(ValueError, match="search space entry 'batch_size'"):
        run_search(study, DENSE, {"batch_size": {"type": "int", "low": "x", "high": 16}}, n_trials=2,
                   host=JobHost())



def test_a_trial_out_of_memory_beside_others_is_requeued_not_failed():
    """Packing OOMs (a trial that fits alone, OOM while others trained) are
    re-queued a bounded number of times; an OOM alone is the trial's own."""
    from types import SimpleNamespace

    from tensile_tf.runtime import JobState, JobStatus
    from tensile_tf.jobs.job import Job
    from tensile_tf.search.driver import MAX_OOM_RETRIES, SearchDriver, TrialRun
    from tensile_tf.search.storage import INTERRUPTED_ATTR, RETRY_ATTR, counted_trials

    study = optuna.create_study()
    space = {"batch_size": CategoricalDistribution([16, 32])}

    def ended(name, status, error_type, start, end):
        s = JobState(job=Job(name=name, build=lambda: None, steps=10), status=status, error_type=error_type,
                     error="OOM when allocating tensor (pool 'device' out of memory)")
        s.admitted_at_s, s.ended_at_s = start, end
        return s

    other = ended("other", JobStatus.finished, None, 0.0, 10.0)
    host = SimpleNamespace(states=[other], progress=None)
    driver = SearchDriver(study, DENSE, space, n_trials=2, host=host)
    trial = study.ask(driver.distributions)
    run = TrialRun(trial=trial, job=Job(name="t", build=lambda: None, steps=10), params=trial.params)
    driver.runs.append(run)
    state = ended("t", JobStatus.failed, "ResourceExhaustedError", 2.0, 4.0)
    host.states.append(state)
    alone = ended("alone", JobStatus.failed, "ResourceExhaustedError", 20.0, 21.0)
    assert driver._packing_oom(run, state) and not driver._packing_oom(run, alone)
    assert not driver._packing_oom(run, ended("t2", JobStatus.failed, "InvalidArgumentError", 2.0, 4.0))
    # Note [Neighbours before their admission]: a trial built and probed beside it, never admitted,
    # held pool memory too; one that only arrived and waited held none (the control)
    probing = ended("probing", JobStatus.failed, "ResourceExhaustedError", None, 26.0)
    probing.arrived_at_s, probing.times.arrival_wait, probing.times.build = 19.0, 0.5, 1.0
    host.states.append(probing)
    assert driver._packing_oom(run, alone)
    probing.times.build = 0.0
    assert not driver._packing_oom(run, alone)
    host.states.remove(probing)

    driver._finish(run, state)
    told = study.trials[0]
    assert told.state == TrialState.FAIL and "packing, not its params" in told.user_attrs[INTERRUPTED_ATTR]
    retry = study.get_trials(states=(TrialState.WAITING,))
    assert len(retry) == 1 and retry[0].system_attrs["fixed_params"] == told.params
    assert retry[0].user_attrs[RETRY_ATTR] == 0
    assert counted_trials(study) == 0 and driver.requeued == [0]
    # The retry carries its count; at the limit an OOM is an ordinary failure.
    again = study.ask(driver.distributions)
    assert again.user_attrs["tensile_oom_retries"] == 1
    again.set_user_attr("tensile_oom_retries", MAX_OOM_RETRIES)
    last = TrialRun(trial=again, job=Job(name="t3", build=lambda: None, steps=10), params=again.params)
    assert not driver._packing_oom(last, state)


def test_a_packing_oom_retry_starts_after_the_others_and_runs_alone():
    """The re-queued trial is held until this driver's other trials have
    ended; while it runs, no trial starts beside it."""
    from types import SimpleNamespace

    from tensile_tf.jobs.job import Job
    from tensile_tf.search.driver import SearchDriver, TrialRun
    from tensile_tf.search.storage import OOM_RETRIES_ATTR, RETRY_ATTR

    study = optuna.create_study()
    space = {"batch_size": CategoricalDistribution([16, 32])}
    host = SimpleNamespace(states=[], progress=None, clock=SimpleNamespace(now=lambda: 0.0))
    driver = SearchDriver(study, DENSE, space, n_trials=4, host=host,
                          admit_by_cores=False)   # the alone rule only (test_core_admission.py: the cores')
    other_trial = study.ask(driver.distributions)
    other = TrialRun(trial=other_trial, job=Job(name="other", build=lambda: None, steps=10),
                     params=other_trial.params, issued=True)
    driver.runs.append(other)
    study.enqueue_trial({"batch_size": 32}, user_attrs={RETRY_ATTR: 0, OOM_RETRIES_ATTR: 1})

    assert driver.job_source() is None          # the retry is asked, and held: `other` still trains
    held = driver._alone
    assert held is not None and not held.issued and held.params == {"batch_size": 32}
    assert driver.job_source() is None
    other.told = TrialState.COMPLETE            # `other` ended
    job = driver.job_source()
    assert job is held.job and held.issued      # now it starts, alone
    assert driver.job_source() is None          # nothing beside it, though n_trials and slots allow more
    held.told = TrialState.COMPLETE
    nxt = driver.job_source()
    assert nxt is not None and nxt is not held.job


def test_a_trial_asked_by_a_killed_worker_is_failed_and_retried_with_fresh_parameters():
    # Note [Interrupted trials]: a worker killed between asking for a trial and
    # writing its worker attribute leaves a RUNNING trial without parameters
    # (seen once in test_killed_search_resumes_without_losing_finished_trials
    # under load); the only worker of the study fails it and queues a retry
    # that samples its own parameters.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    orphan = study.ask()                       # RUNNING, no params, no worker attr
    assert recover_interrupted_trials(study, exclusive=False) == []   # someone else's trial, maybe
    assert recover_interrupted_trials(study, exclusive=True) == [orphan.number]
    failed = study.trials[orphan.number]
    assert failed.state == TrialState.FAIL and "killed as it asked" in failed.user_attrs[INTERRUPTED_ATTR]
    retry = study.ask()
    assert retry.user_attrs[RETRY_ATTR] == orphan.number
    assert 0.0 <= retry.suggest_float("lr", 0.0, 1.0) <= 1.0 and retry.params   # sampled, not copied
