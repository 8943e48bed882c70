"""Issue 58 item 1: a search with the planner on packs trials the pool holds only when they are
planned, and a trial still takes over a finished trial's traced step (Note [Reuse under a planner]
in tensile_tf/runtime/traced_step_reuse.py), training bit for bit what it trains unplanned.

The same grid of three trials runs twice in a fresh interpreter's pool, 100 MiB, admission "sum":
with the planner, and without it (the control). Each trial needs ~47-60 MiB unplanned, more than
half of the 90 MiB admission leaves two jobs, so two fit only planned. The first trial waits at its
third batch for the second to arrive (``held_batches``), so they meet whatever the machine's speed; without the planner
the second cannot start beside the first, the wait runs out (3 s) and the first trains on alone.

A re-plan's switch is taken at a step boundary (Note [Hot swap] in tensile_tf/runtime/replanning.py),
and a trial waiting for its peer inside its step would hold the joint plan back: so a trial also
stops waiting while a switch is offered (``held_batches``), and waits again after its next step."""
import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tensile_tf.runtime.admission import shared_room, sum_condition
from tests.conftest import last_json_line, run_python

POOL = 100 * 2**20
RATES = [1e-3, 2e-3, 3e-3]


HOSTS: list = []   # the host of the search running now: held_batches reads its offered switches


def held_batches(folder, input_dim=784, classes=10, batch_size=32, seed=0, deadline_s=120, at_call=2, **_):
    """A data function: random (x, y) batches; from call ``at_call`` on (the probe's is call 0), each
    call notes this trial in ``folder`` once and waits until two trials have, or a re-plan offers a
    switch (taken at the step boundary after this step), at most ``deadline_s`` in all."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((batch_size, input_dim)).astype("float32"))
    y = tf.constant(rng.integers(0, classes, batch_size).astype("int32"))
    calls, deadline = {"n": 0}, [None]

    def offered() -> bool:
        return any(st.rt.switch.pending for st in HOSTS[-1].states)

    def batches():
        calls["n"] += 1
        if calls["n"] > at_call:
            Path(folder).mkdir(parents=True, exist_ok=True)
            if deadline[0] is None:
                (Path(folder) / uuid.uuid4().hex).touch()
                deadline[0] = time.monotonic() + deadline_s
            while len(list(Path(folder).iterdir())) < 2 and not offered() and time.monotonic() < deadline[0]:
                time.sleep(0.01)
        return (x, y)

    return batches


SEARCHES = """
    import json
    import tensile_tf
    tensile_tf.install(100 * 2**20)  # the pool becomes TensorFlow's allocator: before any TF op
    import optuna
    from tensile_tf.runtime import JobHost
    from tensile_tf.search.driver import SearchDriver
    from tests.search import test_planned_search as here

    import time
    from tensile_tf.runtime.core_meter import CoreMeter

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = {}
    for planner, deadline_s, busy in (("tensile", 120, False), (None, 3, False), ("tensile", 3, True)):
        peers = TMP + f"/peers-{planner}-{busy}"
        base = {"name": "t", "model": {"builder": "tensile_tf.jobs.zoo:mlp", "args": {"hidden": [1024, 1024, 1024]}},
                "input_shape": [784], "batch_size": 2048, "classes": 10, "optimizer": {"name": "sgd"}, "steps": 6,
                "seed": 1, "data": {"kind": "function", "function": "tests.search.test_planned_search:held_batches",
                                    "args": {"folder": peers, "deadline_s": deadline_s, "input_dim": 784,
                                             "classes": 10}}}
        settings = {"planner": planner, "swap_bandwidth": "1TiB"} if planner else {}
        host = JobHost(admission="sum", record_weights=True, **settings)
        here.HOSTS.append(host)
        study = optuna.create_study(sampler=optuna.samplers.GridSampler({"optimizer.learning_rate": here.RATES}))
        space = {"optimizer.learning_rate": optuna.distributions.CategoricalDistribution(here.RATES)}
        driver = SearchDriver(study, base, space, n_trials=3, host=host, max_concurrent=2, admit_by_cores=busy)
        if busy:   # a meter that reads the cores busy whenever a trial runs (the CPU clock at twice the wall's)
            driver.cores.meter = CoreMeter(2, cpu=lambda: 2 * time.perf_counter())
            # the driver's rule for plans in beside running trials; a trial starting is captured as beside
            # idle cores (a capture put off for busy cores: test_captures_a_plan_needs.py)
            rule = driver._busy_for_a_plan
            driver._busy_for_a_plan = lambda running, newcomers=0, rule=rule: None if newcomers else rule(running)
        driver.run()
        out[str(planner) + (" busy" if busy else "")] = {
            "most_running": host.most_running, "explored": driver.cores.gain_starts if busy else None,
            "replans": [(r.reason, r.error) for r in host.replanner.records] if host.replanner else [],
            "trials": {str(s.job.spec.optimizer.learning_rate): dict(
                status=s.status.value, error=s.error, P=s.persistent_bytes, T=s.temporary_bytes, waits=s.waits,
                plans=[(p.reason, p.swap_outs) for p in s.plan_history], taken_from=s.traced_step_from,
                deferred=s.plan_deferred,
                digest=s.weights_digest, losses=[r.loss for r in s.records], leaked=s.leaked_bytes)
                for s in host.states}}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planned_search")
    proc = run_python(SEARCHES.replace("TMP", json.dumps(str(tmp))), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json_line(proc)
    return out["tensile"], out["None"], out["tensile busy"]


def test_trials_that_fit_only_planned_run_at_once_and_train_bit_for_bit(searches):
    planned, unplanned, _ = searches
    with_plan, without = planned["trials"], unplanned["trials"]
    why = {r: (t["status"], t["error"], t["waits"], t["plans"], t["taken_from"]) for r, t in with_plan.items()}
    assert all(t["status"] == "finished" for t in [*with_plan.values(), *without.values()]), why
    assert planned["most_running"] == 2, why                 # planned: two at once
    # unplanned, admission's rule admits no two trials (by the measured P + T of the control's trials)
    needs = sorted(((t["P"], t["T"]) for t in without.values()), key=sum)
    assert not sum_condition(needs[:2], shared_room(POOL, 0, 2)), needs
    assert unplanned["most_running"] == 1                    # the control: one at a time
    arrivals = [r for r in planned["replans"] if r[0].startswith("arrival of")]
    assert arrivals and all(error is None for _, error in arrivals), planned["replans"]
    assert any(swaps > 0 for t in with_plan.values() for _, swaps in t["plans"]), why
    # a trial after the first two took over a finished trial's step, planned as its own
    assert any(t["taken_from"] is not None for t in with_plan.values()), why
    assert len(with_plan) == len(without) == len(RATES)
    for rate, mine in with_plan.items():   # the plans and the reuse change nothing the trials compute
        assert mine["digest"] == without[rate]["digest"] and mine["losses"] == without[rate]["losses"], rate
        assert mine["leaked"] == 0


def test_no_plan_fits_a_trial_in_beside_busy_cores(searches):
    """Note [Plans only for idle cores] (tensile_tf/runtime/planning.py): the same search with the
    planner, its driver's core meter reading the cores busy whenever a trial runs. The driver still
    hands a second trial over on the chance that it adds throughput, but no plan fits it in beside
    the first (captured: the test's rule puts captures off for nothing): it waits for the first to
    end, as without a planner, asked again while it waits, and nothing is re-planned on an arrival.
    The control is the planned search above: the same trials, no core meter, two at once."""
    planned, unplanned, busy = searches
    trials = list(busy["trials"].values())
    assert all(t["status"] == "finished" for t in trials), trials
    assert busy["explored"] >= 1, busy   # the driver started trials beside busy cores
    assert busy["most_running"] == 1 and planned["most_running"] == 2, (busy, planned)
    assert not [r for r in busy["replans"] if r[0].startswith("arrival of")], busy["replans"]
    held = [w["why"] for t in trials for w in t["waits"] if "no plan fits it in" in w["why"]]
    assert held and all("keep the cores busy" in why and "asked again" in why for why in held), trials
    assert not any("no plan fits it in" in w["why"] for t in planned["trials"].values() for w in t["waits"])
    for rate, mine in busy["trials"].items():   # it computes what the unplanned control computes
        assert mine["digest"] == unplanned["trials"][rate]["digest"], rate
        assert mine["losses"] == unplanned["trials"][rate]["losses"] and mine["leaked"] == 0, rate
