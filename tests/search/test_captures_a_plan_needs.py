"""Note [Captures a plan needs] (tensile_tf/runtime/planning.py): with the planner on, a trial the
pool holds unplanned, beside the running ones and as many more like it as may run at once, is not
captured, planned or re-planned, and its step is traced for every batch size, so a later trial of
another batch size takes it over. The control is the same search where the search's limit lets in
more trials than the pool holds unplanned: every trial is captured and planned.

One interpreter, one 48 MiB pool, two searches of the same three trials (an MLP 512 x 2 at
batches 256, 512 and 256, about 10 MiB each unplanned), in that order: one at a time (so which
trial's step is parked when the next one builds does not depend on the machine), then at most 6 at
once (the pool does not hold 6: each trial is captured). The first trial is traced for its own
batch (nothing predicts its needs yet); the second, predicted from the first, for every batch size;
the third takes that step over."""
from types import SimpleNamespace

import pytest

from tensile_tf.config.schema import Admission
from tensile_tf.runtime.admission import AdmissionControl
from tests.conftest import last_json_line, run_python

SEARCHES = """
    import json
    import tensile_tf
    tensile_tf.install(48 * 2**20)  # the pool becomes TensorFlow's allocator: before any TF op
    import optuna
    from tensile_tf.runtime import JobHost
    from tensile_tf.search.driver import SearchDriver

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = [{"batch_size": 256, "optimizer.learning_rate": 1e-3}, {"batch_size": 512, "optimizer.learning_rate": 1e-3},
              {"batch_size": 256, "optimizer.learning_rate": 2e-3}]
    base = {"name": "t", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [512, 512]}},
            "input_shape": [784], "batch_size": 256, "classes": 10, "optimizer": {"name": "adam"}, "steps": 4,
            "seed": 1, "data": {"num_batches": 2}}
    out = {}
    for at_once in (1, 6):
        host = JobHost(admission="sum", planner="tensile", swap_bandwidth="1TiB")
        study = optuna.create_study()
        for t in trials:
            study.enqueue_trial(t)
        space = {k: optuna.distributions.CategoricalDistribution(sorted({t[k] for t in trials})) for k in trials[0]}
        SearchDriver(study, base, space, n_trials=3, host=host, max_concurrent=at_once, admit_by_cores=False).run()
        batch = {s.name: s.job.spec.batch_size for s in host.states}
        out[at_once] = {
            "replans": len(host.replanner.records),
            "trials": [dict(
                key=f"{s.job.spec.batch_size} {s.job.spec.optimizer.learning_rate}", status=s.status.value,
                error=s.error, deferred=s.plan_deferred, plans=len(s.plan_history),
                captured=s.name in host.planning.unplanned_peaks,   # its capture's (or the one it took over)
                taken_from_batch=batch.get(s.traced_step_from), batch=s.job.spec.batch_size,
                P=s.persistent_bytes, T=s.temporary_bytes, losses=[r.loss for r in s.records])
                for s in host.states]}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def searches():
    proc = run_python(SEARCHES, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json_line(proc)
    return out["1"], out["6"]


def test_trials_the_pool_holds_are_not_captured_and_share_one_trace_across_batch_sizes(searches):
    held, control = searches
    assert all(t["status"] == "finished" for t in [*held["trials"], *control["trials"]]), (held, control)
    assert [t["batch"] for t in held["trials"]] == [256, 512, 256], held
    # the pool holds one of these trials (and not six), by their measured needs
    assert max(t["P"] + t["T"] for t in control["trials"]) <= 48 * 2**20 < 6 * min(t["P"] + t["T"]
                                                                                  for t in control["trials"])
    for t in held["trials"]:
        assert t["deferred"] and "up to the 1 jobs that may run at once" in t["deferred"], t
        assert t["plans"] == 0 and not t["captured"], t
    assert held["replans"] == 0, held
    # the third trial took over the second's step, traced for every batch size
    assert [t["taken_from_batch"] for t in held["trials"]] == [None, None, 512], held
    # the control: where the limit lets in more trials than the pool holds, each trial is captured and planned
    for t in control["trials"]:
        assert t["deferred"] is None and t["plans"] >= 1 and t["captured"], t
    # neither the deferral nor the shared trace changes what a trial computes
    losses = {t["key"]: t["losses"] for t in control["trials"]}
    assert {t["key"]: t["losses"] for t in held["trials"]} == losses


def _job(p, t):
    return SimpleNamespace(rt=SimpleNamespace(switch=SimpleNamespace(peek=lambda: None)), planned_needs=(p, t),
                           outside_steps_need_bytes=0)


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
